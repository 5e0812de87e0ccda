//! fd helpers by raw syscall, so they never pass through the shim's own hooks.

use std::ffi::c_int;
use std::time::{Duration, Instant};

use super::error::{Error, Result};

/// Sets `O_NONBLOCK` (and `FD_CLOEXEC`) on `fd`
pub fn set_nonblocking(fd: c_int) -> Result<()> {
    // SAFETY: fcntl on an fd we own; F_GETFL/F_SETFL/F_SETFD take an int argument.
    unsafe {
        let fl = libc::syscall(libc::SYS_fcntl, fd, libc::F_GETFL, 0);
        if fl < 0 {
            return Err(Error::last_os("fcntl(F_GETFL)"));
        }
        if libc::syscall(
            libc::SYS_fcntl,
            fd,
            libc::F_SETFL,
            fl | libc::O_NONBLOCK as libc::c_long,
        ) < 0
        {
            return Err(Error::last_os("fcntl(F_SETFL)"));
        }
        if libc::syscall(libc::SYS_fcntl, fd, libc::F_SETFD, libc::FD_CLOEXEC) < 0 {
            return Err(Error::last_os("fcntl(F_SETFD)"));
        }
    }
    Ok(())
}

/// Waits until `fd` is readable. `None` waits forever. Returns `Ok(false)` on timeout;
/// EINTR is retried with the remaining time.
pub fn wait_readable(fd: c_int, timeout: Option<Duration>) -> Result<bool> {
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let mut ts_store;
        let ts: *const libc::timespec = match deadline {
            None => std::ptr::null(),
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                ts_store = libc::timespec {
                    tv_sec: left.as_secs() as libc::time_t,
                    tv_nsec: left.subsec_nanos() as libc::c_long,
                };
                &mut ts_store
            }
        };
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; ts is null or a valid timespec; no signal mask.
        let n = unsafe {
            libc::syscall(
                libc::SYS_ppoll,
                &mut pfd as *mut libc::pollfd,
                1,
                ts,
                std::ptr::null::<u8>(),
                0,
            )
        };
        if n > 0 {
            return Ok(true);
        }
        if n == 0 {
            return Ok(false);
        }
        let e = Error::last_os("ppoll");
        if e.errno() != libc::EINTR {
            return Err(e);
        }
    }
}

/// Remaining time until `deadline` (`None` = no deadline)
pub fn remaining(deadline: Option<Instant>) -> Option<Duration> {
    deadline.map(|d| d.saturating_duration_since(Instant::now()))
}
