//! `poll(2)` and `ppoll(2)` straight to the kernel, for waits that must stay
//! async-signal-safe (no `dlsym` to find the real `poll`, no lock, no allocation) and the
//! RDMA channels' waits.

use libc::{c_int, c_long, c_short};
use std::time::Duration;

/// Waits up to `ms` for `fd` to report any of `events`, by the raw system call; returns what
/// the call returned (the number of fds ready, 0 on time-out, -1 with errno set on error).
pub fn poll_one_raw(fd: c_int, events: c_short, ms: c_int) -> c_long {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one pollfd on the stack; poll(2) is async-signal-safe.
    unsafe {
        super::raw::syscall3(
            libc::SYS_poll,
            &mut p as *mut libc::pollfd as c_long,
            1,
            ms as c_long,
        )
    }
}

/// Waits up to `left` (`None`: without limit) for `fd` to report any of `events`, by the raw
/// `ppoll` system call with no signal mask; returns what the call returned (as
/// [`poll_one_raw`]).
pub fn ppoll_one_raw(fd: c_int, events: c_short, left: Option<Duration>) -> c_long {
    let mut ts_store;
    let ts: *const libc::timespec = match left {
        None => std::ptr::null(),
        Some(left) => {
            ts_store = libc::timespec {
                tv_sec: left.as_secs() as libc::time_t,
                tv_nsec: left.subsec_nanos() as libc::c_long,
            };
            &mut ts_store
        }
    };
    let mut pfd = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one valid pollfd; ts is null or a valid timespec; no signal mask.
    unsafe {
        super::raw::syscall6(
            libc::SYS_ppoll,
            [
                &mut pfd as *mut libc::pollfd as c_long,
                1,
                ts as c_long,
                0,
                0,
                0,
            ],
        )
    }
}

/// [`poll_one_raw`] for the whole of `ms`: a signal that interrupts it does not end the wait
/// early (the exit drain must not return while the helper still delivers bytes).
pub fn poll_one_raw_full(fd: c_int, events: c_short, ms: c_int) -> c_long {
    let start = monotonic_ms();
    loop {
        let left = i64::from(ms) - (monotonic_ms() - start);
        let r = poll_one_raw(fd, events, left.max(0) as c_int);
        if r >= 0 || left <= 0 || super::raw::errno() != libc::EINTR {
            return r;
        }
    }
}

/// `CLOCK_MONOTONIC` in milliseconds.
fn monotonic_ms() -> i64 {
    monotonic_us() / 1000
}

/// `CLOCK_MONOTONIC` in microseconds (`clock_gettime` is async-signal-safe, and safe in a
/// fork handler: no lock, no allocation).
pub fn monotonic_us() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec * 1_000_000 + ts.tv_nsec / 1000
}

/// Whether `fd` is in select's `set` (null: an empty set); false beyond `FD_SETSIZE`.
///
/// # Safety
/// `set`, if not null, points to a valid `fd_set`.
pub unsafe fn in_fd_set(fd: c_int, set: *const libc::fd_set) -> bool {
    (0..libc::FD_SETSIZE as c_int).contains(&fd) && !set.is_null() && libc::FD_ISSET(fd, set)
}
