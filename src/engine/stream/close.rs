//! The end of a stream: the program's calls in progress (a close waits for the last), its
//! close and the exit's, and the teardown the engine drives once it is closed.

use super::{Port, QueuePair, Stream, CLOSE_DEFERRED, TIMED, WATCHED};
use crate::proto;
use std::sync::atomic::Ordering::*;
use std::time::{Duration, Instant};

impl<P: Port> Stream<P> {
    /// Program calls in progress in this process.
    pub(in crate::engine) fn calls_in_progress(&self) -> u32 {
        self.calls.load(Acquire) & !CLOSE_DEFERRED
    }

    /// A program call (recv, send, ...) starts on this stream.
    pub(in crate::engine) fn call_begins(&self) {
        self.calls.fetch_add(1, AcqRel);
    }

    /// A program call ends; true if it was the last one and a close waited for it (the
    /// caller now does that close).
    pub(in crate::engine) fn call_ends(&self) -> bool {
        self.calls.fetch_sub(1, AcqRel) == CLOSE_DEFERRED | 1
    }

    /// The program closed its last fd: true if calls are still in progress (blocked in
    /// another thread), in which case the close happens when the last one ends — as a
    /// kernel socket lives until the calls holding its file return.
    pub(in crate::engine) fn defer_close(&self) -> bool {
        self.calls.fetch_or(CLOSE_DEFERRED, AcqRel) & !CLOSE_DEFERRED != 0
    }

    /// Drops the doorbell's own fd of A, under the lock every readiness change takes, so that
    /// no change in flight can use the number after it is closed (and maybe reused).
    pub(in crate::engine) fn release_app(&self) {
        let _g = self.lock();
        self.bell.release_app();
    }

    /// The program's last fd is gone: deliver what is queued (or reset, for SO_LINGER 0),
    /// then let the engine tear the connection down.
    pub fn app_closed(&self, reset: bool) {
        self.with(|inner| {
            self.bell.release_app();
            if reset {
                inner.proto.abort();
            } else {
                inner.proto.close();
            }
            inner.closed_at = Some(Instant::now());
            self.pump(inner);
        });
    }

    /// At process exit: a graceful close for a stream the program never closed (as the
    /// kernel closes a dying process's sockets).
    pub(in crate::engine) fn close_for_exit(&self) {
        self.with(|inner| {
            if inner.closed_at.is_none() {
                inner.proto.close();
                self.pump(inner);
            }
        });
    }

    /// Whether everything queued, FIN included, has been acknowledged (or can never be).
    pub(in crate::engine) fn flushed(&self) -> bool {
        let inner = self.lock();
        inner.rc.is_none() || inner.proto.flushed()
    }

    /// Everything the program wrote was sent and acknowledged (or there is no QP).
    pub(in crate::engine) fn all_sent(&self) -> bool {
        let inner = self.lock();
        inner.rc.is_none() || inner.proto.all_sent()
    }

    /// Advances a closed stream's teardown at time `now` (a parameter, so that tests move
    /// time on instead of sleeping); true once its QP and memory can be dropped.
    pub(in crate::engine) fn reap_step(&self, linger: Duration, now: Instant) -> bool {
        let mut g = self.lock();
        let inner = &mut *g;
        let Some(closed_at) = inner.closed_at else {
            return false;
        };
        let elapsed = now.saturating_duration_since(closed_at);
        let Some(rc) = inner.rc.as_mut() else {
            return true;
        };
        let done = inner.proto.is_finished() || inner.proto.state() == proto::State::Reset;
        if !inner.draining {
            if !done && elapsed < linger {
                return false;
            }
            if !done {
                log::info!(
                    "rdma stream {} -> {}: linger expired, dropping",
                    self.local,
                    self.peer
                );
            }
            let _ = rc.disconnect();
            inner.draining = true;
        }
        let _ = rc.start_drain();
        rc.is_drained() || elapsed > linger + Duration::from_secs(2)
    }

    /// Drops the QP (before the memory it used).
    pub(in crate::engine) fn destroy(&self) {
        let (rc, relays) = {
            let mut inner = self.lock();
            if std::mem::take(&mut inner.demand) {
                self.dev.demand_down();
            }
            (inner.rc.take(), std::mem::take(&mut inner.relays))
        };
        drop(rc);
        if self.timed.swap(false, AcqRel) {
            TIMED.fetch_sub(1, AcqRel);
        }
        if self.watched.swap(false, AcqRel) {
            WATCHED.fetch_sub(1, AcqRel);
        }
        for e in relays {
            crate::sys::raw::close(e.fd);
        }
        // A moved stream's options fd still answers for the program's fds of it, if the
        // program has any (its last close closes it: `engine::holders::stream_fd_closed`);
        // one the program never held (a prefork master's accept, handed to a worker), or no
        // longer holds, goes now.
        if !self.life().program {
            self.close_opts_once();
        }
    }
}
