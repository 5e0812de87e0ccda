//! `poll(2)` straight to the kernel, for waits that must stay async-signal-safe: no `dlsym`
//! to find the real `poll`, no lock, no allocation.

use libc::{c_int, c_long, c_short};

/// Waits up to `ms` for `fd` to report any of `events`, by the raw system call; returns what
/// the call returned (the number of fds ready, 0 on time-out, -1 with errno set on error).
pub fn poll_one_raw(fd: c_int, events: c_short, ms: c_int) -> c_long {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one pollfd on the stack; poll(2) is async-signal-safe.
    unsafe { libc::syscall(libc::SYS_poll, &mut p as *mut libc::pollfd, 1, ms) }
}
