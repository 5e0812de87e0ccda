//! The engine's helper thread: sleeps in `epoll_wait` on the rdma_cm channel, the devices'
//! completion channels and the listeners' fds, and does what no application thread is there
//! to do — ring doorbells for sleeping readers and writers, accept connections for
//! listeners, handle disconnects, and tear down closed streams. Here too: its epoll set (what
//! it watches, under which tag of `tags.rs`) and the eventfd that wakes it.
//!
//! The thread holds the reentrancy guard for its whole life: everything it calls, and
//! everything librdmacm/libibverbs call on its behalf, goes straight to libc.

use super::stream::{TIMED, WATCHED};
use super::tags::*;
use super::{lock, Engine, Listener};
use crate::rdma::{self, EventKind};
use libc::c_int;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn run(engine: &'static Engine) {
    let Some(_guard) = crate::guard::enter() else {
        return;
    };
    super::device::this_thread_is_the_helper();
    // SAFETY: epoll_event is plain data.
    let mut evs: [libc::epoll_event; 64] = unsafe { std::mem::zeroed() };
    let mut next_tick = Instant::now();
    let mut draining = false;
    let mut busy_passes = 0u32;
    let mut look_soon = false;
    loop {
        let timed = TIMED.load(Relaxed) > 0;
        let watched = WATCHED.load(Relaxed) > 0;
        let timeout = if draining {
            // A link stream's slots come back when it is reaped: look soon, or a busy link
            // runs out of them (3 of 400 sequential connections did with 50 ms, measured
            // 2026-11-28).
            if lock(&engine.links).is_empty() {
                50
            } else {
                5
            }
        } else if timed || watched || engine.callers_waiting() {
            TICK_MS
        } else {
            1000
        };
        // A device with links the program polls: back soon to see whether it went quiet.
        let devices = engine.devices();
        let timeout = if look_soon {
            timeout.min(super::device::LINK_QUIET.as_millis() as i32)
        } else {
            timeout
        };
        // A link holding CLOSEs back: back to send them when they have waited long enough.
        let timeout = if super::link::closes_held() {
            timeout.min(super::link::CLOSE_HELD.as_millis() as i32)
        } else {
            timeout
        };
        // Connect requests waiting at a branch: back to send the stale ones to their owner.
        let timeout = match engine.branch_requests_due() {
            Some(ms) => timeout.min(ms),
            None => timeout,
        };
        // SAFETY: valid epoll fd and buffer.
        let n = unsafe {
            crate::sys::real::epoll_wait(engine.epfd, evs.as_mut_ptr(), evs.len() as i32, timeout)
        };
        for ev in &evs[..n.max(0) as usize] {
            let tag = ev.u64;
            match tag & TAG_MASK {
                TAG_WAKE => {
                    crate::sys::raw::eventfd_take(engine.wake_fd);
                    if engine
                        .stop_helper
                        .load(std::sync::atomic::Ordering::Acquire)
                    {
                        // The engine is abandoned (singleton.rs): nothing here may call the
                        // RDMA libraries again.
                        crate::sys::raw::eventfd_add(engine.exit_done_fd);
                        return;
                    }
                    engine.exit_drain_if_asked();
                    engine.admit_deferred();
                    // A device may have just been listened to again (`Dev::demand_up`):
                    // completions from before its CQ was armed raise no event.
                    engine.progress_devices(true);
                }
                TAG_CM => cm_events(engine),
                TAG_DEV => completions(engine, (tag & !TAG_MASK) as usize),
                TAG_LISTEN_RDMA => {
                    with_listener(engine, tag & !TAG_MASK, |l| l.on_rdma_ready(engine))
                }
                TAG_IPC => engine.serve_requests(),
                TAG_IPC_CONN => engine.serve_waiting((tag & !TAG_MASK) as i32),
                TAG_HOLD => engine.on_hold_event(tag & !TAG_MASK),
                TAG_ASYNC => engine.on_async_events((tag & !TAG_MASK) as usize),
                TAG_LISTEN_TCP => {
                    with_listener(engine, tag & !TAG_MASK, |l| l.on_tcp_ready(engine))
                }
                TAG_BRANCH_RANG => with_listener(engine, tag & !TAG_MASK, |b| b.owner_rang()),
                _ => {}
            }
        }
        crate::stats::control::poll(); // within a second of `rsock log`
        if watched {
            // The safety net for polled streams (see `WATCHED`); a try: never waits for a
            // program thread that is polling.
            engine.progress_devices(false);
        }
        // A device listened to again: its wake makes the next pass poll what landed before.
        look_soon = devices
            .iter()
            .fold(false, |soon, d| d.look_at_links() | soon);
        busy_passes = if n > 0 { busy_passes + 1 } else { 0 };
        if n == 0 || busy_passes.is_multiple_of(super::link::LOOK_EVERY_BUSY) {
            super::link::look_after(engine);
        }
        draining = engine.tend_streams();
        engine.expire_callers();
        engine.send_back_stale_requests();
        if timed && Instant::now() >= next_tick {
            // Probe completions are looked at here, whether or not the helper listens to
            // the devices' completion events.
            engine.progress_devices(true);
            let now = Instant::now();
            next_tick = now + Duration::from_millis(TICK_MS as u64);
            engine.all_streams().iter().for_each(|s| s.tick(now));
        }
    }
}

/// How often keepalive and user timeouts are looked at (their resolution).
const TICK_MS: i32 = 250;

fn with_listener(engine: &Engine, token: u64, f: impl FnOnce(&Arc<Listener>)) {
    let l = lock(&engine.listeners).get(&token).cloned();
    if let Some(l) = l {
        f(&l);
    }
}

/// CQ event on device `i`.
fn completions(engine: &Engine, i: usize) {
    let Some(d) = lock(&engine.devices).get(i).cloned() else {
        return;
    };
    if d.leave_to_sleepers() {
        return;
    }
    // Re-armed there while some stream needs its completions seen between calls (a
    // doorbell another process polls, a relay, output waiting for credits).
    engine.on_cq_event(&d, usize::MAX);
    d.stop_listening_if_idle();
}

/// Events of connected and accepting ids: establishment of accepted streams, disconnects.
fn cm_events(engine: &'static Engine) {
    loop {
        let ev = match engine.ch.try_get_event() {
            Ok(Some(ev)) => ev,
            Ok(None) => return,
            Err(e) => {
                log::error!("rdma_cm event channel: {e}");
                return;
            }
        };
        let mut s = lock(&engine.streams_by_token).get(&ev.token).cloned();
        if s.is_none() {
            // An accept on another thread may be registering it (`Engine::accepting`).
            drop(lock(&engine.accepting));
            s = lock(&engine.streams_by_token).get(&ev.token).cloned();
        }
        let Some(s) = s else {
            let link = lock(&engine.links).by_token(ev.token);
            match link {
                Some(l) if ev.kind == EventKind::Disconnected || ev.kind.is_failure() => {
                    engine.progress_all(&l.dev);
                    l.fail(&format!("{} from the peer", ev.name()));
                }
                _ => log::trace!("cm event {} for unknown token {}", ev.name(), ev.token),
            }
            continue;
        };
        match ev.kind {
            EventKind::Established => {
                s.on_established();
                super::listener::established(engine, &s)
            }
            EventKind::Disconnected | EventKind::DeviceRemoval => {
                // Completions that arrived before the disconnect come first.
                engine.progress_all(&s.dev);
                s.on_disconnected_of(ev.id.cast_const().cast());
                super::listener::abandon_pending(engine, &s);
            }
            k if k.is_failure() => {
                log::info!("rdma stream {}: {} while accepting", s.peer, ev.name());
                s.on_disconnected_of(ev.id.cast_const().cast());
                super::listener::abandon_pending(engine, &s);
            }
            _ => log::trace!("cm event {} on {}", ev.name(), s.peer),
        }
    }
}

impl Engine {
    pub(super) fn watch(&self, fd: c_int, tag: u64) -> Result<(), rdma::Error> {
        self.epoll_ctl(libc::EPOLL_CTL_ADD, fd, libc::EPOLLIN as u32, tag)
    }

    /// Watches `fd` for one readiness report; [`rearm_oneshot`](Self::rearm_oneshot) asks
    /// for the next (a kernel listener must not wake the helper while the queue is full).
    pub(super) fn watch_oneshot(&self, fd: c_int, tag: u64) -> Result<(), rdma::Error> {
        self.epoll_ctl(
            libc::EPOLL_CTL_ADD,
            fd,
            (libc::EPOLLIN | libc::EPOLLONESHOT) as u32,
            tag,
        )
    }

    pub(super) fn rearm_oneshot(&self, fd: c_int, tag: u64) {
        if let Err(e) = self.epoll_ctl(
            libc::EPOLL_CTL_MOD,
            fd,
            (libc::EPOLLIN | libc::EPOLLONESHOT) as u32,
            tag,
        ) {
            log::warn!("re-arming a listener: {e}");
        }
    }

    pub(super) fn epoll_ctl(
        &self,
        op: c_int,
        fd: c_int,
        events: u32,
        tag: u64,
    ) -> Result<(), rdma::Error> {
        let mut ev = libc::epoll_event { events, u64: tag };
        // SAFETY: valid epoll fd and event.
        if unsafe { crate::sys::real::epoll_ctl(self.epfd, op, fd, &mut ev) } != 0 {
            return Err(rdma::Error::last_os("epoll_ctl"));
        }
        Ok(())
    }

    pub(super) fn unwatch(&self, fd: c_int) {
        // SAFETY: valid epoll fd; a missing fd just fails.
        unsafe {
            crate::sys::real::epoll_ctl(self.epfd, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut())
        };
    }

    /// Starts the helper thread (once); whether it runs.
    pub fn ensure_helper(&'static self) -> bool {
        self.helper.call_once(|| {
            let r = std::thread::Builder::new()
                .name("rsock-engine".into())
                .spawn(move || run(self));
            if let Err(e) = r {
                self.helper_failed.store(true, Relaxed);
                log::error!("cannot start the engine thread: {e}; new connections use kernel TCP");
            }
        });
        !self.helper_failed.load(Relaxed)
    }

    /// Helper: answers the deferred connect requests that accept queues have room for now.
    fn admit_deferred(&'static self) {
        if self.deferred.load(Relaxed) == 0 {
            return;
        }
        let all: Vec<Arc<Listener>> = lock(&self.listeners).values().cloned().collect();
        for l in all {
            l.admit_deferred(self);
        }
    }

    /// Wakes the helper thread (to tend the streams, drain for `_exit`, or answer
    /// deferred connect requests).
    pub(super) fn wake(&self) {
        crate::sys::raw::eventfd_add(self.wake_fd);
    }
}
