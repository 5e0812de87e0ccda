//! A stream's part in moving one end of its connection between processes (PROTOCOL.md §11,
//! docs/DESIGN.md "Processes"): as the old owner it sends MIGRATE and exports its state; as
//! the staying peer it swaps its old QP for the one its resume made. The orchestration
//! (ipc, listeners, threads) is in `engine/takeover.rs`.

use super::{Port, QueuePair, Region, Stream};
use crate::engine::handover_state::Exported;
use crate::engine::ipc::Owner;
use crate::proto::{self, Hello};
use crate::rdma::{self, Pd, QpCaps};
use libc::c_int;
use std::sync::Arc;
use std::time::Instant;

impl<P: Port> Stream<P> {
    /// Old owner: starts handing the stream to a taker listening on `port` (MIGRATE goes out
    /// now), who has until `deadline` to ask for the state. Refused (EBUSY) while this
    /// process's program is in a call on it, while it is relayed to another process, while
    /// it moves already, or once it is closed, dead or finished both ways.
    pub(in crate::engine) fn start_move(&self, port: u16, deadline: Instant) -> Result<(), c_int> {
        let mut g = self.lock();
        let inner = &mut *g;
        // A link's stream does not move to another queue pair (PROTOCOL.md §14): the taker
        // relays it instead, at once (EBUSY would have it ask again).
        if inner.rc.as_ref().is_some_and(|q| q.is_shared()) {
            return Err(libc::EOPNOTSUPP);
        }
        let busy = self.life().phase != super::Phase::Open
            || inner.proto.is_broken()
            || inner.closed_at.is_some()
            || !inner.relays.is_empty()
            || self.calls_in_progress() > 0;
        if busy || inner.proto.start_migration(port).is_err() {
            return Err(libc::EBUSY);
        }
        self.advance(super::Event::StartMove);
        inner.move_deadline = Some(deadline);
        self.pump(inner);
        Ok(())
    }

    /// Old owner: if the taker's time is up (`now` past the deadline) and it never asked for
    /// the state, the stream — which can send nothing after MIGRATE — is reset, rather than
    /// left waiting for ever (one the program still holds is served here again until it
    /// closes it). True if so.
    pub(in crate::engine) fn expire_move(&self, now: Instant) -> bool {
        {
            let mut inner = self.lock();
            if inner.move_deadline.is_none_or(|d| d > now) || self.life().moved() {
                return false; // not yet, or exported in time
            }
            inner.move_deadline = None;
            self.advance(super::Event::MoveExpired); // none if closed meanwhile
        }
        self.on_fatal("the process taking it over never finished");
        true
    }

    /// Old owner: how far the peer's bytes have arrived (the export waits for its resume
    /// point).
    pub(in crate::engine) fn received_end(&self) -> u64 {
        self.lock().proto.counters().rx_received_end
    }

    /// Old owner: the state a taker continues from (what A shows with the protocol's
    /// positions, the unread ring bytes and the queued unsent bytes), and the stream is `to`'s
    /// from now on: nothing here moves its doorbell or posts again, and the engine tears its
    /// QP down. `None` if the stream cannot be exported: reset, or no move under way (a
    /// taker asking after its deadline: the stream was reset here then, and the program
    /// here told so).
    pub(in crate::engine) fn export(&self, to: Owner) -> Option<Exported> {
        let mut g = self.lock();
        g.move_deadline?; // no move started, or it expired
        let inner = &mut *g;
        let handover = inner.proto.handover()?;
        let ring = inner.ring.as_slice();
        let send = inner.send.as_slice();
        let state = Exported {
            handover,
            shown: inner.shown,
            unread: inner.proto.readable_ranges().map(|r| &ring[r]).concat(),
            unsent: inner.proto.unsent_ranges().map(|r| &send[r]).concat(),
        };
        self.advance(super::Event::Move);
        inner.proto.handle_failure(proto::Failure::Reset);
        inner.closed_at = Some(Instant::now());
        self.set_owner(to);
        Some(state)
    }

    /// Staying peer: the old QP is quiet (everything posted on it completed).
    pub(in crate::engine) fn quiesced(&self) -> bool {
        self.lock().proto.ready_to_resume()
    }
}

impl Stream {
    /// Staying peer: what a new QP for the resume needs — the connection's PD (its ring and
    /// send buffer stay registered there), the old QP's queue sizes, and the resume hello.
    /// The old QP's rdma_cm events are ignored from now (its id's token is cleared).
    pub(in crate::engine) fn resume_parts(&self) -> Option<(Arc<Pd>, QpCaps, Hello)> {
        let mut g = self.lock();
        let inner = &mut *g;
        // A link stream's end does not move this way (PROTOCOL.md §14).
        let rc = inner.rc.as_mut()?.own_mut()?;
        rc.id_mut().set_token(0);
        let mr = inner.ring.own()?.mr();
        let hello = inner
            .proto
            .resume_hello(mr.iova(), mr.rkey().unwrap_or(0), self.conn_id);
        Some((rc.pd().clone(), rc.caps(), hello))
    }

    /// Staying peer: continues on `rc`, whose accept hello is `accept`; returns the old QP
    /// (drop it outside any lock) and the old QP number.
    pub(in crate::engine) fn finish_resume(
        &self,
        rc: rdma::RcQp,
        accept: &Hello,
    ) -> Result<(Option<super::StreamQp>, u32), String> {
        let mut g = self.lock();
        let inner = &mut *g;
        if accept.conn_id != self.conn_id {
            return Err("the taker answered for another connection".into());
        }
        inner.proto.resume(accept).map_err(|e| e.to_string())?;
        let old_qp = self.qp_num();
        self.qp_num
            .store(rc.qp_num(), std::sync::atomic::Ordering::Release);
        let old = inner.rc.replace(super::StreamQp::Own(rc));
        inner.recvs_owed = 0;
        inner.resume_scheduled = false;
        self.pump(inner);
        Ok((old, old_qp))
    }
}
