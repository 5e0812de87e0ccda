//! Moving one end of a [`Pair`] to a fresh endpoint, as a fork child takes a connection over
//! from its parent (PROTOCOL.md §11), with the same steps the RDMA driver takes: MIGRATE,
//! quiesce, resume hello and accept as real encoded bytes, unread and unsent bytes copied.

use super::{Endpoint, Fault, Pair, Side, CONN_ID, RING_ADDR, RKEY};
use crate::proto::wire::{Hello, HelloKind};
use crate::proto::{Conn, Params};
use core::ops::Range;

impl Pair {
    /// Hands `from`'s end over to a taker built with `config_t` (its `ring_size` must be the
    /// old end's). Drives the pair until the peer has quiesced, then builds the taker from the
    /// old end's export. The returned pair's `a` is the end that stayed (it sent the resume,
    /// so it is the active side of the new queue pair) and `b` the taker.
    pub fn hand_over(mut self, from: Side, port: u16, config_t: Params) -> Result<Pair, Fault> {
        self.ep_mut(from)
            .conn
            .start_migration(port)
            .map_err(Fault::Migrate)?;
        self.complete_hand_over(from, port, config_t)
    }

    /// [`hand_over`](Self::hand_over) after `from`'s `start_migration(port)` was called (and
    /// any steps taken since).
    pub fn complete_hand_over(
        mut self,
        from: Side,
        port: u16,
        config_t: Params,
    ) -> Result<Pair, Fault> {
        self.drive()?;
        let stay = from.peer();
        let (old, mut peer) = match from {
            Side::A => (self.a, self.b),
            Side::B => (self.b, self.a),
        };
        if !old.conn.migration_sent() || peer.conn.peer_moving_to() != Some(port) {
            return Err(Fault::Stalled);
        }
        if !peer.conn.ready_to_resume() || !peer.wire.is_empty() || !old.wire.is_empty() {
            return Err(Fault::Stalled);
        }
        let i = stay as usize;
        let resume = peer
            .conn
            .resume_hello(RING_ADDR[i], peer.ring_rkey, CONN_ID);
        let resume =
            Hello::parse_kind(&resume.to_bytes(), HelloKind::Resume).expect("resume hello parses");
        let state = old.conn.handover().ok_or(Fault::Stalled)?;
        let state = crate::proto::Handover::parse(&state.to_bytes()).expect("handover parses");
        let conn = Conn::from_handover(&config_t, &state, &resume).map_err(Fault::Migrate)?;
        let j = from as usize;
        let mut taker = Endpoint::new(config_t.clone(), conn, RKEY[j]);
        copy(
            &old.ring,
            old.conn.readable_ranges(),
            &mut taker.ring,
            taker.conn.readable_ranges(),
        );
        copy(
            &old.send_buf,
            old.conn.unsent_ranges(),
            &mut taker.send_buf,
            taker.conn.unsent_ranges(),
        );
        // The taker's ring is granted exactly where the old one was.
        taker.granted = old.granted.clone();
        let accept = config_t.hello(HelloKind::Accept, RING_ADDR[j], RKEY[j], CONN_ID);
        let accept = Hello::parse_kind(&accept.to_bytes(), HelloKind::Accept).expect("accept");
        peer.conn.resume(&accept).map_err(Fault::Migrate)?;
        // A new queue pair: fresh receives, nothing outstanding.
        peer.qp = super::Qp::new(peer.config.recv_credits, peer.config.send_queue_depth);
        peer.drain_events();
        Ok(Pair {
            a: peer,
            b: taker,
            check_grants: self.check_grants,
        })
    }
}

/// Copies the bytes at `src_ranges` of `src`, in order, to `dst_ranges` of `dst` (the same
/// total length, split differently when the buffers differ in size).
fn copy(src: &[u8], src_ranges: [Range<usize>; 2], dst: &mut [u8], dst_ranges: [Range<usize>; 2]) {
    let bytes: Vec<u8> = src_ranges
        .into_iter()
        .flat_map(|r| src[r].to_vec())
        .collect();
    let mut at = 0;
    for r in dst_ranges {
        let n = r.len();
        dst[r].copy_from_slice(&bytes[at..at + n]);
        at += n;
    }
    assert_eq!(at, bytes.len(), "hand-over copy lengths");
}
