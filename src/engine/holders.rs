//! Who holds an RDMA socket: the program's fds and calls in this process, copies of its A in
//! other processes, relay ends. When the last one lets go: the close (graceful, or a reset
//! for `SO_LINGER` 0); the helper then tears the stream down (`tend.rs`).

use super::stream::Event;
use super::tags::TAG_HOLD;
use super::{get, lock, Engine, Listener, Stream};
use libc::c_int;
use std::sync::atomic::Ordering::*;
use std::sync::Arc;

/// This process's last fd of an RDMA stream is closed. The owner lets the connection finish
/// in the background (or resets it, for `SO_LINGER` with a zero timeout) once no other
/// process holds it either; any other process only drops its own copy of the doorbell (what
/// the owner watches to learn that the last holder is gone).
pub fn stream_detached(s: Arc<Stream>) {
    let Some(_g) = crate::guard::enter() else {
        return;
    };
    // Only the owner's own threads make calls on it (a fork child's copy of the counter may
    // show a parent thread's call, which never ends there).
    if !(s.owner().is_me() && s.defer_close()) {
        stream_fd_closed(&s);
    }
}

/// This process's last fd of a dual listener is closed. Like a kernel listener, it lives
/// while any process holds it (prefork masters often close theirs after forking the
/// workers); another process only drops its copies.
pub fn listener_detached(l: Arc<Listener>) {
    let Some(_g) = crate::guard::enter() else {
        return;
    };
    // `get` only for the owner: another process has nothing of its own to close.
    match l.owner.is_me().then(get).flatten() {
        Some(engine) => {
            l.release_app();
            if l.bell().peer_holds() {
                engine.watch_hold(l.bell().shim_fd(), l.token);
            } else {
                l.close(engine);
            }
        }
        None => {
            // Its branch here (before A goes: the helper watches this copy of it).
            if let Some(engine) = super::existing() {
                engine.close_branch_of(&l); // (never an engine made for it: a fork child's close)
            }
            // This process's copies: A, and the kernel listener it would take over.
            l.bell().release_app();
            crate::sys::raw::close(l.tcp_fd);
        }
    }
}

/// The program's last fd of `s` is closed and no call of it is in progress (call inside
/// the reentrancy guard).
fn stream_fd_closed(s: &Arc<Stream>) {
    match s.owner().is_me().then(get).flatten() {
        Some(engine) => {
            s.release_app();
            s.advance(Event::LetGo);
            engine.settle_holders(s);
        }
        // A copy inherited from the owner: its locks are never taken here (a parent
        // thread may have held one at the fork), and nothing else uses its doorbell. A
        // stream this process handed over keeps its options fd until now.
        None => {
            s.bell().release_app();
            if s.life().moved() && s.advance(Event::LetGo).is_some() {
                s.close_opts_once();
            }
            // Given back here by a taker that exited, while the program's fds still named
            // this copy: the program lets go of the one it has now.
            // (`existing`: never an engine made for it, and none of a parent's copy.)
            if let Some(back) = super::existing().and_then(|e| e.given_back(s)) {
                stream_fd_closed(&back);
            }
        }
    }
}

/// A program call on a stream, from start to end (see [`Stream::defer_close`]); create and
/// drop it inside the reentrancy guard.
pub struct Call<'a>(&'a Arc<Stream>);

impl<'a> Call<'a> {
    /// The call starts.
    pub fn begin(s: &'a Arc<Stream>) -> Call<'a> {
        s.call_begins();
        Call(s)
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        if self.0.call_ends() {
            stream_fd_closed(self.0);
        }
        self.0.after_call();
    }
}

impl Engine {
    /// The owner's program has no fd of `s` any more: finish it if no other process holds it
    /// either, else watch for the last holder to go (helper: `on_hold_event`, and its pass
    /// over the streams it tends: the last holder's bytes may be taken in by a completion,
    /// raising no event).
    pub(super) fn settle_holders(&'static self, s: &Arc<Stream>) {
        if !s.held() {
            self.close_unheld(s);
        } else if !s.hold_watched.swap(true, AcqRel) {
            self.tend(s);
            self.watch_hold(s.bell().shim_fd(), s.token);
        }
    }

    /// Watches `fd` (a doorbell's or relay's B) for changes that matter to `token`'s stream.
    pub(super) fn watch_hold(&self, fd: c_int, token: u64) {
        let ev = (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET) as u32;
        if let Err(e) = self.epoll_ctl(libc::EPOLL_CTL_ADD, fd, ev, TAG_HOLD | token) {
            log::warn!("watching a holder of stream {token}: {e}");
        }
    }

    /// Nobody holds `s` any more: the graceful (or lingering-zero) close, once.
    pub(super) fn close_unheld(&'static self, s: &Arc<Stream>) {
        if s.advance(Event::Close).is_none() {
            return; // closing already, or handed over
        }
        if s.hold_watched.load(Acquire) {
            self.unwatch(s.bell().shim_fd());
        }
        for fd in s.relay_fds() {
            self.unwatch(fd);
        }
        s.app_closed(s.resets_on_close());
        self.retire(s.clone());
    }

    /// Helper: something changed on a holder of stream `token`.
    pub(super) fn on_hold_event(&'static self, token: u64) {
        let l = lock(&self.listeners).get(&token).cloned();
        if let Some(l) = l {
            if !l.bell().peer_holds() {
                self.unwatch(l.bell().shim_fd());
                l.close(self); // the last process holding it let go
            }
            return;
        }
        let Some(s) = lock(&self.streams_by_token).get(&token).cloned() else {
            return;
        };
        s.on_hold_event();
        if !s.life().program && !s.held() {
            self.close_unheld(&s);
        }
    }
}
