//! The program's own waits — the poll/ppoll/select/pselect/epoll_wait/epoll_pwait hooks —
//! while the process has RDMA streams (docs/DESIGN.md, "Waiting").
//!
//! A doorbell moves only when a completion is handled, and the helper thread does not
//! listen for completions of streams that are merely polled. So a wait that would block
//! first polls the completion queues itself (for the process's spin budget), then sleeps on
//! the program's fds *and* every device's completion channel in one `ppoll`: a completion
//! wakes this thread, which handles it (ringing the doorbells it concerns) and tries the
//! program's wait again without blocking. No thread hop, and the helper stays asleep.
//! select's fd sets cannot take the channels (they may exceed `FD_SETSIZE`), so select and
//! pselect keep the helper listening while they sleep instead.

use super::stream::Asleep;
use super::{get, Dev, Engine};
use crate::sys::raw::{errno, set_errno};
use crate::sys::real;
use libc::{c_int, pollfd, sigset_t};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A nonblocking try of the program's wait: `Some` if anything is ready (or it failed).
pub trait Probe: FnMut() -> Option<c_int> {}
impl<F: FnMut() -> Option<c_int>> Probe for F {}

/// Every pass of a spin polls the CQs; the program's wait (a syscall) is tried after a pass
/// that handled completions, and every this many passes for its other fds.
const PROBE_EVERY: u32 = 16;

/// A zero-timeout wait: completions that landed since the last call are handled first, so
/// a program that only ever polls with timeout 0 still sees its streams move.
pub fn before_nonblocking_wait() {
    if let (Some(e), Some(_g)) = (get(), crate::guard::enter()) {
        e.progress_devices(false);
    }
}

/// The start of a wait that may block: tries it, then polls the CQs for the spin budget,
/// trying it as it goes. `Ok`: nothing yet, time to sleep (the engine and its devices).
/// `Err(Some(r))`: the program's answer. `Err(None)`: the shim cannot take part (no engine,
/// or this thread is already inside the shim): make the real call.
fn spin_first(probe: &mut impl Probe) -> Result<(&'static Engine, Vec<Arc<Dev>>), Option<c_int>> {
    if let Some(r) = probe() {
        return Err(Some(r));
    }
    let (Some(e), Some(_g)) = (get(), crate::guard::enter()) else {
        return Err(None);
    };
    let devs = e.devices();
    match spin(e, &devs, probe) {
        Some(r) => Err(Some(r)),
        None => Ok((e, devs)),
    }
}

/// Polls the CQs for the spin budget, probing as it goes: the probe's answer, if any.
/// A spin that runs out does not probe again: both callers arm and then wait on the
/// program's fds themselves, which answers at once for anything ready by then (a probe here
/// was one more syscall per wait, seen in the two-host bed's trace).
fn spin(e: &'static Engine, devs: &[Arc<Dev>], probe: &mut impl Probe) -> Option<c_int> {
    let mut spin = e.poll_budget.spin();
    for pass in 1u32.. {
        let handled: usize = devs.iter().map(|d| e.progress(d)).sum();
        if handled > 0 || pass % PROBE_EVERY == 0 {
            if let Some(r) = probe() {
                return Some(r);
            }
        }
        if !spin.go_on() {
            return None;
        }
        std::hint::spin_loop();
    }
    None
}

/// poll/ppoll/epoll_wait/epoll_pwait that would block: `fds` is what the program waits on
/// (its pollfds, or its epoll fd), `timeout_ms` < 0 for no limit, `mask` as ppoll's.
/// `block` is the real call, for when the shim cannot take part (no engine, or this thread
/// is already inside the shim). Returns what the program's call returns.
///
/// # Safety
/// `mask` is null or a valid sigset.
pub unsafe fn sleep_with_channels(
    fds: &[pollfd],
    timeout_ms: c_int,
    mask: *const sigset_t,
    mut probe: impl Probe,
    block: impl FnOnce() -> c_int,
) -> c_int {
    let (e, devs) = match spin_first(&mut probe) {
        Ok(x) => x,
        Err(Some(r)) => return r,
        Err(None) => return block(),
    };
    let mut set: Vec<pollfd> = fds.to_vec();
    set.extend(devs.iter().map(|d| pollfd {
        fd: d.dev.comp_fd(),
        events: libc::POLLIN,
        revents: 0,
    }));
    // One clock read to start (in the test bed the clock is a syscall): the first sleep
    // takes the program's timeout whole, later ones what is left of it.
    let slept_from = Instant::now();
    let deadline = (timeout_ms >= 0).then(|| slept_from + ms(timeout_ms));
    let mut first = true;
    let r = loop {
        // Counted before arming (see `Engine::rearm_if_listened`), until the wait ends.
        let asleep: Vec<Asleep<'_, Dev>> = devs.iter().map(|d| Asleep::new(&**d)).collect();
        // Arming polls the CQs once more (a completion that landed before the arm raises
        // no event); what that rings is in `set` as the program's own fds are, so ppoll
        // returns at once for it: no probe before sleeping.
        {
            let _g = crate::guard::enter();
            devs.iter().for_each(|d| e.sleep_armed(d));
        }
        let ts = match deadline {
            None => None,
            Some(_) if first => Some(timespec(ms(timeout_ms))),
            Some(d) => match d.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => Some(timespec(left)),
                // The program's call writes its results (poll's revents) even when it
                // times out: the last try is the real call.
                _ => break probe().unwrap_or(0),
            },
        };
        first = false;
        set.iter_mut().for_each(|p| p.revents = 0);
        // The guard is not held while sleeping: a signal handler of the program may use its
        // sockets meanwhile, as it could during the real call.
        let n = real::ppoll(
            set.as_mut_ptr(),
            set.len() as libc::nfds_t,
            ts.as_ref()
                .map_or(std::ptr::null(), |t| t as *const libc::timespec),
            mask,
        );
        drop(asleep);
        if n < 0 {
            break -1; // EINTR (poll and epoll are never restarted) or the program's error
        }
        {
            let _g = crate::guard::enter();
            // One event per device: each armed CQ raises one, and another pending event
            // keeps the channel readable for the next ppoll (reading on to EAGAIN cost a
            // syscall per wake-up).
            for (d, p) in devs.iter().zip(&set[fds.len()..]) {
                if p.revents & libc::POLLIN != 0 {
                    e.on_cq_event(d, 1);
                }
            }
        }
        if let Some(r) = probe() {
            break r;
        }
    };
    e.poll_budget.slept(slept_from.elapsed(), e.spin_max());
    r
}

/// select/pselect that would block: spin, then `block` (the real call) while the helper
/// listens for completions, so that it rings the doorbells the program waits on.
pub fn spin_then(mut probe: impl Probe, block: impl FnOnce() -> c_int) -> c_int {
    let (e, devs) = match spin_first(&mut probe) {
        Ok(x) => x,
        Err(Some(r)) => return r,
        Err(None) => return block(),
    };
    {
        let _g = crate::guard::enter(); // arming goes through libibverbs
        e.ensure_helper();
        devs.iter().for_each(|d| d.demand_up());
    }
    if let Some(r) = probe() {
        devs.iter().for_each(|d| d.demand_down());
        return r;
    }
    let slept_from = Instant::now();
    let r = block();
    let err = errno();
    devs.iter().for_each(|d| d.demand_down());
    e.poll_budget.slept(slept_from.elapsed(), e.spin_max());
    set_errno(err);
    r
}

fn ms(v: c_int) -> Duration {
    Duration::from_millis(v.max(0) as u64)
}

fn timespec(d: Duration) -> libc::timespec {
    libc::timespec {
        tv_sec: d.as_secs() as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    }
}
