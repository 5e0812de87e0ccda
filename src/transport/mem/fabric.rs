//! What an RC queue pair does, once, for both in-memory drivers: the step-by-step protocol
//! [`Pair`](super::Pair) and the stream's `MemPort` (engine/stream/mem.rs). Each end is a
//! [`Qp`]: its completion queue, its posted receives, its state. A driver executes a
//! write with [`Qp::execute`] and owns only the memory the bytes land in ([`Landing`]) and
//! when things happen (one step at a time, or at once).
//!
//! The rules: a write on a QP in the error state is flushed; a write to a peer whose QP is
//! in error or gone fails (retries exceeded) and puts the writer in error; a write must lie
//! inside a ring the peer registered under the rkey it names (a zero-length one names no
//! memory); its bytes land before its immediate, which consumes one posted receive (none:
//! RNR, retries exceeded) and reports the write's length; a signaled write completes only
//! after all that. A disconnect puts the QP in error, flushes its posted receives and tells
//! the peer. A failed write queues its error completion whatever the driver then reports.
//! The send queue holds so many work requests; a polled completion frees its request's slot
//! and those of the unsignaled ones before it ([`Qp::post_send`], [`Qp::poll`]).
//!
//! Beyond hardware, a ring's [`Grants`] check the protocol: each byte written must have been
//! granted by the ring's owner, and its credits give back, oldest first, only bytes written.

use crate::proto::link::imm::Codec;
use crate::proto::wire::Imm;
use std::collections::VecDeque;
use std::hash::{Hash, Hasher};
use std::ops::Range;

/// One write, as the wire sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Wr {
    /// Given back in its completion.
    pub wr_id: u64,
    /// The peer's ring it names.
    pub rkey: u32,
    /// Where in that ring.
    pub offset: u64,
    /// Payload length.
    pub len: u32,
    /// WRITE_WITH_IMM's immediate.
    pub imm: Option<u32>,
    /// Whether it completes when delivered.
    pub signaled: bool,
}

impl From<&crate::proto::Write> for Wr {
    /// The write a connection handed out, as the wire carries it (ring-relative offset).
    fn from(w: &crate::proto::Write) -> Wr {
        Wr {
            wr_id: w.wr_id.0,
            rkey: w.rkey,
            offset: u64::from(w.remote_offset),
            len: w.len,
            imm: w.imm,
            signaled: w.signaled,
        }
    }
}

/// Why a write failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WrError {
    /// Posted on a QP in the error state.
    Flushed,
    /// The peer's QP is in error or gone: no acknowledgement ever came.
    RetryExceeded,
    /// Outside any ring the peer registered under the rkey.
    RemoteAccess,
    /// An immediate found no receive posted (an RC QP retries; the protocol promises none).
    Rnr,
    /// Into ring bytes the receiver had not granted: no hardware checks this, the model
    /// does (see [`Landing::land`]).
    OutsideGrant,
}

/// A completion, in the order the QP's CQ reports them.
#[allow(missing_docs)] // the fields are named for what they hold
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cqe {
    /// A WRITE_WITH_IMM arrived: its immediate and its length (`byte_len`).
    Recv { imm: u32, byte_len: u32 },
    /// A posted receive flushed (the QP went to the error state).
    RecvFlushed,
    /// A signaled write was delivered.
    Sent { wr_id: u64 },
    /// A write failed; it delivered nothing.
    Failed { wr_id: u64, why: WrError },
}

impl Cqe {
    /// Whether it is from the receive queue.
    pub fn is_recv(&self) -> bool {
        matches!(self, Cqe::Recv { .. } | Cqe::RecvFlushed)
    }
}

/// The memory a write lands in: the receiving end's rings, by rkey, and the write's payload
/// (which the driver reads where hardware would: at post or at delivery).
pub trait Landing {
    /// The length of the ring registered under `rkey`, if one is.
    fn ring_len(&self, rkey: u32) -> Option<usize>;
    /// Copies the payload to `at` of ring `rkey` (inside it: checked). False refuses it
    /// ([`WrError::OutsideGrant`]), nothing written.
    fn land(&mut self, rkey: u32, at: Range<usize>) -> bool;
}

/// One end's queue pair. `Clone` and `Hash` for model checkers' snapshots.
#[derive(Debug, Clone, Default)]
pub struct Qp {
    /// Completions not yet polled.
    pub cq: VecDeque<Cqe>,
    /// Receives posted.
    pub recvs: u32,
    /// In the error state: posts flush.
    pub error: bool,
    /// Destroyed: the peer's writes fail.
    pub gone: bool,
    /// The peer disconnected (or its QP went) and this end's driver was not told yet.
    pub tell_disconnect: bool,
    /// Work requests posted and not yet freed by a polled completion, oldest first.
    pub sq: VecDeque<u64>,
    /// How many the send queue holds.
    pub sq_depth: u32,
}

impl Hash for Qp {
    /// Each queue's order, not how the two interleave: a driver that takes them apart (the
    /// Pair) cannot tell, and a model checker then sees the states it always saw.
    fn hash<H: Hasher>(&self, h: &mut H) {
        for recv in [true, false] {
            h.write_usize(self.pending(recv));
            for c in self.cq.iter().filter(|c| c.is_recv() == recv) {
                c.hash(h);
            }
        }
        (self.recvs, self.error, self.gone, self.tell_disconnect).hash(h);
        (&self.sq, self.sq_depth).hash(h);
    }
}

impl Qp {
    /// A connected QP with `recvs` receives posted and a send queue of `sq_depth`.
    pub fn new(recvs: u32, sq_depth: u32) -> Qp {
        Qp {
            recvs,
            sq_depth,
            ..Qp::default()
        }
    }

    /// Posts work request `wr_id` on the send queue: false (refused) if it is full.
    pub fn post_send(&mut self, wr_id: u64) -> bool {
        if self.sq.len() >= self.sq_depth as usize {
            return false;
        }
        self.sq.push_back(wr_id);
        true
    }

    /// A send completion for `wr_id` was polled: its slot and those before it are free
    /// (an RC QP completes in order; unsignaled requests complete silently).
    fn free(&mut self, c: &Cqe) {
        if let Cqe::Sent { wr_id } | Cqe::Failed { wr_id, .. } = *c {
            if let Some(i) = self.sq.iter().position(|&w| w == wr_id) {
                self.sq.drain(..=i);
            }
        }
    }

    /// Polls the oldest completion.
    pub fn poll(&mut self) -> Option<Cqe> {
        let c = self.cq.pop_front()?;
        self.free(&c);
        Some(c)
    }

    /// Executes `wr`, posted on this QP, into `peer` (whose memory is `mem`): by the rules in
    /// the module doc. On an error its completion is queued here, and returned.
    pub fn execute(
        &mut self,
        peer: &mut Qp,
        wr: &Wr,
        mem: &mut impl Landing,
    ) -> Result<(), WrError> {
        let r = self.deliver(peer, wr, mem);
        if let Err(why) = r {
            if why != WrError::Flushed {
                self.error = true;
            }
            self.cq.push_back(Cqe::Failed {
                wr_id: wr.wr_id,
                why,
            });
        }
        r
    }

    fn deliver(&mut self, peer: &mut Qp, wr: &Wr, mem: &mut impl Landing) -> Result<(), WrError> {
        if self.error {
            return Err(WrError::Flushed);
        }
        if peer.gone || peer.error {
            return Err(WrError::RetryExceeded);
        }
        if wr.len > 0 {
            let start = wr.offset as usize;
            let end = start + wr.len as usize;
            match mem.ring_len(wr.rkey) {
                Some(len) if end <= len => {}
                _ => return Err(WrError::RemoteAccess),
            }
            if !mem.land(wr.rkey, start..end) {
                return Err(WrError::OutsideGrant);
            }
        }
        if let Some(imm) = wr.imm {
            if peer.recvs == 0 {
                return Err(WrError::Rnr);
            }
            peer.recvs -= 1;
            peer.cq.push_back(Cqe::Recv {
                imm,
                byte_len: wr.len,
            });
        }
        if wr.signaled {
            self.cq.push_back(Cqe::Sent { wr_id: wr.wr_id });
        }
        Ok(())
    }

    /// A work request posted on this QP in the error state (a drain marker): it flushes.
    pub fn flush(&mut self, wr_id: u64) {
        self.cq.push_back(Cqe::Failed {
            wr_id,
            why: WrError::Flushed,
        });
    }

    /// Disconnects: the error state (the peer is told, once), posted receives flush.
    pub fn disconnect(&mut self, peer: &mut Qp) {
        if !self.error {
            self.error = true;
            peer.tell_disconnect = true;
        }
        for _ in 0..std::mem::take(&mut self.recvs) {
            self.cq.push_back(Cqe::RecvFlushed);
        }
    }

    /// Destroyed: the peer's next write fails, and its connection manager says so.
    pub fn destroy(&mut self, peer: &mut Qp) {
        self.gone = true;
        peer.tell_disconnect = true;
    }

    /// Takes the oldest completion of one queue (receive or send), leaving the other's.
    pub fn take(&mut self, recv: bool) -> Option<Cqe> {
        let i = self.cq.iter().position(|c| c.is_recv() == recv)?;
        let c = self.cq.remove(i)?;
        self.free(&c);
        Some(c)
    }

    /// Completions of one queue not yet taken.
    pub fn pending(&self, recv: bool) -> usize {
        self.cq.iter().filter(|c| c.is_recv() == recv).count()
    }
}

/// Which bytes of one ring its peer may write: granted by the ring's owner and not yet
/// written. A write takes them; the credits the owner returns give them back, oldest
/// first. No hardware keeps this: the model checks the protocol's windows with it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Grants {
    granted: Vec<bool>,
    /// The oldest byte written and not given back.
    cursor: usize,
}

impl Grants {
    /// A new ring's: every byte granted.
    pub fn new(len: usize) -> Grants {
        Grants {
            granted: vec![true; len],
            cursor: 0,
        }
    }

    /// The peer writes `at`: false (nothing taken) if a byte of it was not granted.
    pub fn take(&mut self, at: Range<usize>) -> bool {
        match self.granted.get_mut(at) {
            Some(g) if g.iter().all(|&g| g) => {
                g.fill(false);
                true
            }
            _ => false,
        }
    }

    /// The owner returns credits for `bytes`: the oldest written bytes are the peer's
    /// again. False if one of them was not written (credits returned twice).
    pub fn give_back(&mut self, bytes: u32) -> bool {
        for _ in 0..bytes {
            let i = self.cursor;
            if self.granted[i] {
                return false;
            }
            self.granted[i] = true;
            self.cursor = (i + 1) % self.granted.len();
        }
        true
    }

    /// A ring grown into holds its owner's bytes at stream positions `from..to` (moved
    /// from the old ring, or read): not the peer's until given back, from `from` on. False
    /// if the peer wrote one of them.
    pub fn hold(&mut self, from: u64, to: u64) -> bool {
        let len = self.granted.len() as u64;
        for pos in from..to {
            let i = (pos % len) as usize;
            if !self.granted[i] {
                return false;
            }
            self.granted[i] = false;
        }
        self.cursor = (from % len) as usize;
        true
    }
}

/// The ring bytes an immediate (written by `codec`) gives back: a credit's, else none.
pub fn credit_bytes(imm: u32, codec: Codec) -> u32 {
    match codec.decode(imm) {
        Ok(Imm::Credit { bytes, .. }) => bytes,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One ring of 16 bytes under rkey 1; refuses bytes 12.. (not granted).
    #[derive(Default)]
    struct Ring(Vec<Range<usize>>);

    impl Landing for Ring {
        fn ring_len(&self, rkey: u32) -> Option<usize> {
            (rkey == 1).then_some(16)
        }
        fn land(&mut self, _: u32, at: Range<usize>) -> bool {
            let ok = at.end <= 12;
            if ok {
                self.0.push(at);
            }
            ok
        }
    }

    fn wr(len: u32, imm: Option<u32>) -> Wr {
        Wr {
            wr_id: 9,
            rkey: 1,
            offset: 0,
            len,
            imm,
            signaled: true,
        }
    }

    #[test]
    fn a_write_lands_then_its_immediate_then_it_completes() {
        let (mut a, mut b, mut m) = (Qp::new(1, 4), Qp::new(1, 4), Ring::default());
        assert_eq!(a.execute(&mut b, &wr(4, Some(7)), &mut m), Ok(()));
        assert_eq!(m.0.len(), 1);
        assert_eq!(m.0[0], 0..4);
        assert_eq!(
            b.take(true),
            Some(Cqe::Recv {
                imm: 7,
                byte_len: 4
            })
        );
        assert_eq!(b.recvs, 0);
        assert_eq!(a.take(false), Some(Cqe::Sent { wr_id: 9 }));
        // No receive left: RNR, and the writer's QP is in error from then on.
        assert_eq!(
            a.execute(&mut b, &wr(0, Some(7)), &mut m),
            Err(WrError::Rnr)
        );
        assert_eq!(
            a.execute(&mut b, &wr(0, None), &mut m),
            Err(WrError::Flushed)
        );
        assert_eq!(a.pending(false), 2);
    }

    #[test]
    fn writes_outside_the_ring_or_the_grant_fail() {
        let (mut b, mut m) = (Qp::new(1, 4), Ring::default());
        let bad_key = Wr {
            rkey: 2,
            ..wr(1, None)
        };
        assert_eq!(
            Qp::new(0, 4).execute(&mut b, &bad_key, &mut m),
            Err(WrError::RemoteAccess)
        );
        let past = Wr {
            offset: 14,
            ..wr(4, None)
        };
        assert_eq!(
            Qp::new(0, 4).execute(&mut b, &past, &mut m),
            Err(WrError::RemoteAccess)
        );
        let ungranted = Wr {
            offset: 10,
            ..wr(4, None)
        };
        assert_eq!(
            Qp::new(0, 4).execute(&mut b, &ungranted, &mut m),
            Err(WrError::OutsideGrant)
        );
        // A zero-length write names no memory.
        assert_eq!(
            Qp::new(0, 4).execute(
                &mut b,
                &Wr {
                    rkey: 2,
                    ..wr(0, None)
                },
                &mut m
            ),
            Ok(())
        );
        assert!(m.0.is_empty());
    }

    #[test]
    fn grants_are_taken_by_writes_and_given_back_oldest_first() {
        let mut g = Grants::new(8);
        assert!(g.take(0..6));
        assert!(!g.take(4..8), "two bytes of it were written");
        assert!(g.take(6..8));
        assert!(g.give_back(3));
        assert!(g.take(0..3), "the oldest three came back");
        assert!(!g.take(3..4));
        assert!(g.give_back(5), "3..8");
        assert!(!g.give_back(4), "0..3 are written again, 3 is not");
        assert!(!g.take(8..9), "outside the ring");
        let mut g = Grants::new(4);
        assert!(g.hold(6, 9), "positions 6..9: bytes 2, 3, 0");
        assert!(g.take(1..2) && !g.take(2..3));
        assert!(g.give_back(1), "from position 6: byte 2");
        assert!(g.take(2..3));
    }

    #[test]
    fn the_send_queue_frees_at_a_polled_completion() {
        let (mut a, mut b, mut m) = (Qp::new(0, 2), Qp::new(0, 4), Ring::default());
        let unsignaled = Wr {
            wr_id: 1,
            signaled: false,
            ..wr(0, None)
        };
        assert!(a.post_send(1) && a.post_send(9));
        assert!(!a.post_send(10), "full");
        assert_eq!(a.execute(&mut b, &unsignaled, &mut m), Ok(()));
        assert_eq!(a.execute(&mut b, &wr(0, None), &mut m), Ok(()));
        assert!(!a.post_send(10), "not until its completion is polled");
        assert_eq!(a.poll(), Some(Cqe::Sent { wr_id: 9 }));
        assert!(a.sq.is_empty(), "and the unsignaled one before it");
        assert!(a.post_send(10));
    }

    #[test]
    fn a_disconnect_flushes_receives_and_fails_the_peer_s_writes() {
        let (mut a, mut b, mut m) = (Qp::new(1, 4), Qp::new(2, 4), Ring::default());
        b.disconnect(&mut a);
        assert!(a.tell_disconnect);
        assert_eq!(b.pending(true), 2);
        assert_eq!(b.take(true), Some(Cqe::RecvFlushed));
        assert_eq!(
            a.execute(&mut b, &wr(1, None), &mut m),
            Err(WrError::RetryExceeded)
        );
        assert!(a.error && m.0.is_empty());
        let (mut a, mut b) = (Qp::new(1, 4), Qp::new(1, 4));
        b.destroy(&mut a);
        assert!(a.tell_disconnect);
        assert_eq!(
            a.execute(&mut b, &wr(1, None), &mut m),
            Err(WrError::RetryExceeded)
        );
    }
}
