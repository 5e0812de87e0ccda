//! What the transport tells a stream: each completion of its QP, a failed QP, CQ, device or
//! port, and the peer's disconnect.

use super::{Inner, Port, QueuePair, Stream, PROBE_WR, PROTO_SIGNALED};
use crate::proto::{self, Failure, WrId};
use crate::rdma::{self, Wc};
use std::time::Instant;

impl<P: Port> Stream<P> {
    /// Feeds one completion of this stream's QP (called with the device's poll lock held).
    pub(in crate::engine) fn on_completion(&self, wc: &Wc) {
        let mut g = self.lock();
        let inner = &mut *g;
        let Some(rc) = inner.rc.as_mut() else { return };
        if wc.qp_num() != rc.qp_num() {
            return; // the QP this stream left for a new one (a resume) flushing
        }
        // Flushes are expected once the connection is going down, and on the old QP of a
        // peer that moved once everything on it completed (its old owner tears it down).
        let expected_flush = wc.is_flush()
            && (inner.proto.is_finished() || inner.proto.ready_to_resume() || self.life().moved());
        rc.on_completion(wc);
        if wc.is_recv() {
            if !wc.is_ok() {
                if !expected_flush {
                    fail(inner, Failure::Reset, "receive failed", wc);
                }
                return;
            }
            inner.recvs_owed += 1;
            // The peer wrote: its queue pair is ready, whatever became of the CM's last
            // message (a lost RTU is sent again only when our REP is, seconds later).
            inner.awaits_peer = false;
            if inner.live.any() {
                inner.timers.heard(Instant::now());
            }
            let r = match wc.imm() {
                // byte_len: what the peer's write carried, checked against what it announced.
                Some(imm) => inner.proto.handle_imm(imm, wc.byte_len()),
                None => Err(proto::ProtocolError::BadImm(
                    proto::wire::ImmError::UnknownOp(0xff),
                )), // a SEND, not ours
            };
            if let Err(e) = r {
                log::warn!(
                    "rdma stream {} -> {}: protocol error from peer: {e}",
                    self.local,
                    self.peer
                );
                log::info!("rdma stream: protocol error on qp {}", wc.qp_num());
            }
        } else {
            if !wc.is_ok() {
                if expected_flush {
                    return;
                }
                // The peer's NIC stopped answering (its host is gone): as TCP's
                // retransmission timeout, not a reset.
                let f = if wc.status() == rdma_sys::ibv_wc_status::IBV_WC_RETRY_EXC_ERR {
                    Failure::TimedOut
                } else {
                    Failure::Reset
                };
                fail(inner, f, "send failed", wc);
                return;
            }
            let wr_id = rc.own_wr_id(wc.wr_id());
            if inner.live.any() {
                inner.timers.heard(Instant::now());
                if wr_id == PROBE_WR {
                    inner.timers.probe_done();
                    inner.confirmed = inner.confirmed.max(inner.probe_covers);
                }
            }
            if wr_id & PROTO_SIGNALED != 0 && wr_id != rdma::DRAIN_SEND_WR_ID {
                // A link's queue pair keeps only the id's low bits (proto/link/mux.rs).
                let low = WrId(wr_id & !PROTO_SIGNALED);
                let id = crate::proto::link::widen(low, inner.proto.counters().wrs_retired);
                if let Err(e) = inner.proto.handle_send_complete(id) {
                    log::error!("rdma stream {}: completion out of order: {e:?}", self.peer);
                    fail(inner, Failure::Reset, "completion accounting", wc);
                }
            }
        }
        self.pump(inner);
    }

    /// A link stream's peer grew its ring (its GROW record, PROTOCOL.md §14): our writes
    /// go into the new one, after SWITCHED.
    pub(in crate::engine) fn on_grow_record(&self, size: u32, at: crate::proto::link::RingAt) {
        self.with(|inner| {
            if let Err(e) = inner.proto.on_grow_record(size, at.rkey, at.addr) {
                log::warn!(
                    "rdma stream {} -> {}: protocol error from peer: {e}",
                    self.local,
                    self.peer
                );
            }
            self.pump(inner);
        });
    }

    /// An accepted stream not established yet: its writes wait until
    /// [`on_established`](Self::on_established) or the peer's first write. Call before it is
    /// registered (nothing else sees it yet).
    pub(in crate::engine) fn await_peer(&self) {
        self.lock().awaits_peer = true;
    }

    /// The CM says the connection is established: writes held back go out.
    pub(in crate::engine) fn on_established(&self) {
        self.with(|inner| {
            if std::mem::take(&mut inner.awaits_peer) {
                self.pump(inner);
            }
        });
    }

    /// The device says this stream's QP (or its CQ, device or port) failed: reset, as a TCP
    /// connection whose path died; queued bytes stay readable first.
    pub(in crate::engine) fn on_fatal(&self, why: &str) {
        self.with(|inner| {
            if inner.proto.failure().is_none() {
                log::info!(
                    "rdma stream {} -> {}: {why}: ECONNRESET",
                    self.local,
                    self.peer
                );
                inner.proto.handle_failure(Failure::Reset);
                self.show(inner);
            }
        });
    }

    /// A link stream's peer sent its CLOSE (`why`: "the peer closed the stream on the
    /// link"), or its link failed: it gets nothing more. Unless FIN passed both ways (an
    /// orderly end: the program still reads what it has, then the end of stream — the
    /// peer's CLOSE may follow our FIN before our last completions here, or be held back a
    /// while, `Mux::close_lazily`), the stream is reset.
    pub(in crate::engine) fn end_on_link(&self, why: &str) {
        let state = self.lock().proto.state();
        if !matches!(
            state,
            proto::State::Closing | proto::State::Closed | proto::State::Reset
        ) {
            self.on_fatal(why);
        }
    }

    /// The peer's side of the rdma_cm connection `id` went away (null: whichever this stream
    /// has). A queue pair this stream no longer uses (its end moved, §11) is none of its
    /// business: its disconnect may come after the new queue pair is up.
    pub(in crate::engine) fn on_disconnected_of(&self, id: *const libc::c_void) {
        let mut g = self.lock();
        let inner = &mut *g;
        if let Some(rc) = inner.rc.as_mut() {
            if !id.is_null() && !rc.is_conn(id) {
                log::debug!(
                    "rdma stream {} -> {}: a replaced queue pair disconnected",
                    self.local,
                    self.peer
                );
                return;
            }
            rc.set_disconnected();
        }
        // Queued bytes stay readable; then reads fail like a reset TCP connection's.
        log::debug!(
            "rdma stream {} -> {}: peer disconnected (state {:?}, id {id:?}, qp {})",
            self.local,
            self.peer,
            inner.proto.state(),
            self.qp_num()
        );
        inner.proto.handle_disconnect();
        self.show(inner);
    }
}

/// Fails the stream's transport and logs the completion that said so.
fn fail<P: Port>(inner: &mut Inner<P>, f: Failure, what: &str, wc: &Wc) {
    if inner.proto.failure().is_none() {
        log::info!(
            "rdma stream: {what}: {} (qp {})",
            wc.status_str(),
            wc.qp_num()
        );
    }
    inner.proto.handle_failure(f);
}
