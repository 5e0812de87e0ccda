//! How a program call waits on a stream: it polls the CQ for its adaptive spin budget
//! (engine/spin.rs), then sleeps on the completion channel and the doorbell's A together
//! (docs/DESIGN.md, "Waiting").

use super::{Port, Stream, Want};
use libc::c_int;
use std::time::{Duration, Instant};

impl<P: Port> Stream<P> {
    /// Polls the CQ until the writes still in flight could no longer make this stream
    /// poll-writable on their own: spins for the spin time (at least 2 ms), then naps, for at
    /// most 50 ms — RC completions come in microseconds on hardware, milliseconds under
    /// emulation. True if anything was processed.
    pub(super) fn settle(&self) -> bool {
        let start = Instant::now();
        let spin_until = start + self.spin.max(Duration::from_millis(2));
        let give_up = start + Duration::from_millis(50);
        let mut any = false;
        for i in 0u32.. {
            any |= self.dev.progress() > 0;
            if !self.lock().proto.completions_could_wake_writer() {
                return any;
            }
            if i % 8 == 7 {
                let now = Instant::now();
                if now >= give_up {
                    self.dev.count_settle_timeout();
                    return any;
                }
                if now >= spin_until {
                    std::thread::sleep(Duration::from_micros(50));
                    continue;
                }
            }
            std::hint::spin_loop();
        }
        any
    }

    /// Whether `want` can proceed without blocking.
    pub(super) fn ready(&self, want: Want) -> bool {
        self.lock().proto.ready(want)
    }

    /// Blocks until `want` may proceed: polls the CQ for the stream's spin budget (see
    /// engine/spin.rs), then sleeps. EAGAIN at the deadline (SO_RCVTIMEO/SNDTIMEO).
    pub(super) fn wait(&self, want: Want, deadline: Option<Instant>) -> Result<(), c_int> {
        let mut spin = self.budget.spin();
        loop {
            self.dev.progress();
            if self.ready(want) {
                return Ok(());
            }
            if !spin.go_on() {
                break;
            }
            std::hint::spin_loop();
        }
        let slept_from = Instant::now();
        let mut late = false;
        let r = self.sleep(want, deadline, &mut late);
        self.budget.slept(slept_from.elapsed(), self.spin);
        self.dev.count_sleep(late);
        r
    }

    /// The sleeping part of [`wait`](Self::wait): on the completion channel (our own
    /// completions wake us directly) and on A (everything else rings it).
    /// `late` is set if it found the stream ready only when its bounded sleep ran out.
    fn sleep(&self, want: Want, deadline: Option<Instant>, late: &mut bool) -> Result<(), c_int> {
        self.dev.ensure_helper();
        let events = if want == Want::Read {
            libc::POLLIN
        } else {
            libc::POLLOUT
        };
        // Bounded sleeps, in case a wake-up is ever missed; doubling, so that an idle waiter
        // wakes a few times, not ten times a second.
        let mut bound = 100;
        loop {
            // Counted before arming: a thread that takes the event this arm raises re-arms
            // for us while we sleep (the arm is the device's, one event for all sleepers).
            let asleep = Asleep::new(&*self.dev);
            let comp_fd = self.dev.arm();
            let mut ms = bound;
            bound = (bound * 2).min(MAX_SLEEP_MS);
            if let Some(d) = deadline {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return if self.ready(want) {
                        Ok(())
                    } else {
                        Err(libc::EAGAIN)
                    };
                }
                ms = ms.min(left.as_millis().max(1) as c_int);
            }
            {
                let mut g = self.lock();
                if g.proto.ready(want) {
                    return Ok(());
                }
                // From here until we wake, A must follow the stream: a completion another
                // thread handles rings it (ours wake us through the channel directly).
                g.sleepers += 1;
                self.show(&mut g);
            }
            // Sleep on our doorbell and on the device's completion channel: a completion wakes
            // this thread directly rather than through the helper thread and the doorbell.
            let mut p = [
                libc::pollfd {
                    fd: self.bell.app_fd(),
                    events,
                    revents: 0,
                },
                libc::pollfd {
                    fd: comp_fd,
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: two valid pollfds.
            let r = unsafe { crate::sys::real::poll(p.as_mut_ptr(), 2, ms) };
            let e = crate::sys::raw::errno();
            drop(asleep);
            // Whether the bound ran out with the stream already ready (another thread
            // handled its completion): then A must have been rung while we slept.
            let ready_unrung = {
                let mut g = self.lock();
                g.sleepers -= 1;
                r == 0 && g.proto.ready(want)
            };
            if r < 0 && e == libc::EINTR && !crate::sys::raw::signals_restart() {
                return Err(libc::EINTR); // a handler ran, as a blocked kernel recv would say
            }
            if p[1].revents & libc::POLLIN != 0 {
                self.dev.woken();
            } else {
                self.dev.progress();
            }
            // Woken for what we wait for (the common case): no arming again for nothing.
            if self.ready(want) {
                if r == 0 && !self.wake_was_coming(&mut p, ready_unrung) {
                    // Ready, yet nothing woke us nor was about to: a lost wake-up that only
                    // the bound saved.
                    *late = true;
                    log::debug!("rdma stream {}: woke by the bound, not an event", self.peer);
                }
                return Ok(());
            }
        }
    }

    /// After a bound ran out with the stream ready: whether a wake-up was on its way, so
    /// that the bound only coincided with it. `p` is the sleep's [A, channel].
    /// - Another thread made the stream ready (`by_other`): it rang A in the same step, so
    ///   A is ready now unless the ring was missed.
    /// - Our own poll of the CQ did: its channel event must follow. A device may make a
    ///   completion pollable before it raises the event (Soft-RoCE raises it from a
    ///   tasklet); an armed CQ raises it within a moment, an unarmed one never (taken here).
    fn wake_was_coming(&self, p: &mut [libc::pollfd; 2], by_other: bool) -> bool {
        let (i, ms) = if by_other {
            (0, 0)
        } else {
            (1, EVENT_GRACE_MS)
        };
        p[i].revents = 0;
        // SAFETY: one valid pollfd.
        let r = unsafe { crate::sys::real::poll(&mut p[i], 1, ms) };
        let coming = r > 0 && p[i].revents & p[i].events != 0;
        if coming && !by_other {
            self.dev.woken();
        }
        coming
    }
}

/// How long [`Stream::wake_was_coming`] waits for a completion event that is late only
/// because the device raises it after making the completion pollable.
const EVENT_GRACE_MS: c_int = 10;

/// A thread counted as sleeping on a port's completion channel (see [`Port::sleeping`]),
/// from before it arms until the guard drops (before it takes an event).
pub(in crate::engine) struct Asleep<'a, P: Port>(&'a P);

impl<'a, P: Port> Asleep<'a, P> {
    pub(in crate::engine) fn new(port: &'a P) -> Self {
        port.sleeping(true);
        Asleep(port)
    }
}

impl<P: Port> Drop for Asleep<'_, P> {
    fn drop(&mut self) {
        self.0.sleeping(false);
    }
}

/// The longest a blocked call sleeps before it looks again by itself (see `Stream::sleep`).
const MAX_SLEEP_MS: c_int = 1600;
