//! A stream's relays to other processes (docs/DESIGN.md, "Processes"), and whether any
//! process still holds it.

use super::{Port, Stream};
use crate::engine::relay;
use libc::c_int;
use std::sync::atomic::Ordering::*;

impl<P: Port> Stream<P> {
    /// Starts relaying this stream to another process: returns (A, B) of a new socketpair;
    /// A goes to that process, B stays here (the engine watches it).
    pub(in crate::engine) fn start_relay(&self) -> std::io::Result<(c_int, c_int)> {
        let (a, b) = crate::sys::unix::stream_pair()?;
        let mut g = self.lock();
        let inner = &mut *g;
        if inner.scratch.is_empty() {
            inner.scratch = vec![0; relay::CHUNK];
        }
        inner.relays.push(relay::End::new(b));
        self.pump(inner);
        Ok((a, b))
    }

    /// The relay about to start goes to this process's own program, whose calls already in
    /// progress on the stream (a read blocked in another thread) keep being served by it: the
    /// relay takes the stream's bytes only once they have ended, so that such a read takes
    /// the next bytes and the relay those after — not the other way round.
    pub(in crate::engine) fn relay_after_calls(&self) {
        if self.calls_in_progress() > 0 {
            self.relay_waits.store(true, Release);
        }
    }

    /// Whether the relays must not take the stream's bytes yet (see `relay_after_calls`).
    pub(super) fn relay_held(&self) -> bool {
        self.relay_waits.load(Acquire) && self.calls_in_progress() > 0
    }

    /// A program call ended: if the relay waited for it, and it was the last, the relay
    /// takes the stream's bytes from now on.
    pub(in crate::engine) fn after_call(&self) {
        if self.relay_waits.load(Acquire)
            && self.calls_in_progress() == 0
            && self.relay_waits.swap(false, AcqRel)
        {
            let mut g = self.lock();
            self.pump(&mut g);
        }
    }

    /// A relay end or the doorbell's B changed (helper thread): move bytes, and note holders
    /// that went away. A holder's `shutdown(SHUT_WR)` on a relay end is the stream's FIN.
    pub(in crate::engine) fn on_hold_event(&self) {
        let mut g = self.lock();
        self.pump(&mut g);
    }

    /// Whether any process still holds this stream: the owner's program, another process
    /// with an fd of the doorbell's A (inherited), or a relay end's holder.
    pub(in crate::engine) fn held(&self) -> bool {
        if self.life().program || self.bell.peer_holds() {
            return true;
        }
        self.lock().relays.iter_mut().any(|e| !e.check_gone())
    }

    /// Whether a relay end still has holders or unread bytes (its holders' close not yet
    /// taken in).
    pub(in crate::engine) fn relay_pending(&self) -> bool {
        self.lock().relays.iter_mut().any(|e| !e.check_gone())
    }

    /// The relay ends' fds (B), for the engine's watch list.
    pub(in crate::engine) fn relay_fds(&self) -> Vec<c_int> {
        self.lock().relays.iter().map(|e| e.fd).collect()
    }
}
