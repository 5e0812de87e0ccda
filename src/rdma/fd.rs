//! The RDMA channels' fds made nonblocking and waited on by raw syscall (`sys::fcntl`,
//! `sys::poll`), so they never pass through the shim's own hooks.

use std::ffi::c_int;
use std::time::{Duration, Instant};

use super::error::{Error, Result};

/// Sets `O_NONBLOCK` (and `FD_CLOEXEC`) on `fd`
pub fn set_nonblocking(fd: c_int) -> Result<()> {
    crate::sys::fcntl::set_nonblock_cloexec_raw(fd).map_err(Error::last_os)
}

/// Waits until `fd` is readable. `None` waits forever. Returns `Ok(false)` on timeout;
/// EINTR is retried with the remaining time.
pub fn wait_readable(fd: c_int, timeout: Option<Duration>) -> Result<bool> {
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let left = remaining(deadline);
        let n = crate::sys::poll::ppoll_one_raw(fd, libc::POLLIN, left);
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
