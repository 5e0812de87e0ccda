//! The outbound pump: after any change, a stream reposts its receives, runs its relays, posts
//! every write the protocol wants and shows its state; and whether it needs the helper to
//! hear its completions (the device's demand).

use super::{Inner, Port, QueuePair, Region, Stream, RECV_WR};
use crate::engine::relay;
use crate::proto::{self, Failure};
use std::sync::atomic::Ordering::*;

impl<P: Port> Stream<P> {
    /// Reposts owed receives, runs the relays, posts every write the protocol wants, and
    /// shows the new state on the doorbell. Call with `inner` locked after any change.
    pub(super) fn pump(&self, inner: &mut Inner<P>) {
        if self.life().moved() {
            return;
        }
        self.sync_memory(inner);
        if let Some(rc) = inner.rc.as_mut() {
            // Receives stay posted after a protocol-level reset: the peer's writes still in
            // flight must land (and be discarded), not stall its QP in RNR retries.
            if inner.recvs_owed > 0 && inner.proto.failure().is_none() {
                match rc.post_recvs(RECV_WR, inner.recvs_owed) {
                    Ok(()) => inner.recvs_owed = 0,
                    Err(e) => log::error!("rdma stream {}: reposting receives: {e}", self.peer),
                }
            }
        }
        if !inner.relays.is_empty() {
            relay::into_stream(
                &mut inner.relays,
                &mut inner.proto,
                inner.send.as_mut_slice(),
                &mut inner.scratch,
            );
            self.post_all(inner);
            let reset = inner.proto.is_broken();
            if !self.relay_held() {
                relay::out_of_stream(
                    &mut inner.relays,
                    &mut inner.proto,
                    inner.ring.as_slice(),
                    &mut inner.scratch,
                    &mut inner.peeked,
                    reset,
                );
            }
            // A holder's shutdown(SHUT_WR) on a relay end is the stream's FIN (a close is
            // not, while other fds of the stream remain: the last holder's close ends it).
            // Checked on every pump: the end of stream may be read here by a completion.
            let fin = inner.relays.iter_mut().any(|e| e.tx_eof && !e.check_gone());
            if fin
                && matches!(
                    inner.proto.state(),
                    proto::State::Open | proto::State::ReadClosed
                )
            {
                inner.proto.shutdown_write();
            }
        }
        self.post_all(inner);
        while let Some(ev) = inner.proto.poll_event() {
            match ev {
                // The doorbell is level-triggered: `show` below sets it from the protocol's
                // readiness as it is now, which already holds every one of these edges.
                proto::Event::Readable | proto::Event::Writable | proto::Event::Reset => {}
                // The close path (close.rs) frees the QP once `is_finished()` holds; a stream
                // the program still holds keeps it until its close.
                proto::Event::Finished => {}
                proto::Event::PeerMoving { port } => {
                    if !std::mem::replace(&mut inner.resume_scheduled, true) {
                        log::debug!(
                            "rdma stream {} -> {}: peer moves to port {port}",
                            self.local,
                            self.peer
                        );
                        if !self.dev.peer_moving(self.token, port) {
                            inner.proto.handle_failure(Failure::Reset);
                        }
                    }
                }
            }
        }
        if inner.proto.is_finished() || inner.proto.failure().is_some() {
            if let Some(rc) = inner.rc.as_mut() {
                rc.stream_done();
            }
        }
        self.show(inner);
        self.update_demand(inner);
    }

    /// Whether completions must be handled while no program thread is in a call on this
    /// stream, and so the helper must listen for them (see `Dev::demand_up`).
    pub(super) fn update_demand(&self, inner: &mut Inner<P>) {
        let want = inner.proto.failure().is_none()
            && inner.rc.is_some()
            && (self.shared.load(Relaxed)
                || !inner.relays.is_empty()
                || inner.proto.output_pending());
        if want != inner.demand {
            inner.demand = want;
            if want {
                self.dev.demand_up();
            } else {
                self.dev.demand_down();
            }
        }
    }

    /// Posts every write the protocol wants.
    fn post_all(&self, inner: &mut Inner<P>) {
        if inner.awaits_peer {
            return; // the protocol keeps them until the connection is established
        }
        let Some(rc) = inner.rc.as_mut() else { return };
        while let Some(w) = inner.proto.poll_write() {
            if let Err(e) = rc.post(&w, &inner.send) {
                log::warn!("rdma stream {}: post failed: {e}", self.peer);
                if e.errno() == libc::EACCES {
                    // Soft-RoCE and siw post through write() on the verbs fd, which the kernel
                    // refuses to any credentials but the opener's: this process changed its
                    // uid or gid after it took the connection over (rsyncd's children do).
                    log::warn!(
                        "rdma stream {}: this process's credentials changed since its RDMA engine started; its connections cannot send (docs/LIMITATIONS.md)",
                        self.peer
                    );
                }
                // Sending is over; what has arrived is not: a transport failure fails writes
                // but still returns the queued bytes (and end of stream) to reads — needed
                // when the peer sent everything, exited, and our credit return found its QP
                // gone.
                inner.proto.handle_failure(Failure::Reset);
                break;
            }
        }
    }
}
