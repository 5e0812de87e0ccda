//! A stream's relays to other processes (docs/DESIGN.md, "Processes"), and whether any
//! process still holds it.

use super::{Port, Stream};
use crate::engine::relay;
use libc::c_int;

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
