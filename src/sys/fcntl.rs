//! `fcntl` on an fd through the real libc function: its file flags (`O_NONBLOCK`,
//! `FD_CLOEXEC`) read, set or changed, and private copies of it for the shim's own use; and
//! the flags of the RDMA libraries' fds set by the system call itself.

use crate::sys::{raw, real};
use libc::{c_int, c_long};
use std::io;

/// The file flags of `fd`: (O_NONBLOCK, FD_CLOEXEC).
pub fn fd_flags(fd: c_int) -> (bool, bool) {
    // SAFETY: plain fcntl queries.
    let (fl, fdfl) = unsafe {
        (
            real::fcntl(fd, libc::F_GETFL, 0),
            real::fcntl(fd, libc::F_GETFD, 0),
        )
    };
    (
        fl >= 0 && fl & libc::O_NONBLOCK != 0,
        fdfl >= 0 && fdfl & libc::FD_CLOEXEC != 0,
    )
}

/// Sets (`on`) or clears `O_NONBLOCK` on `fd`'s file.
pub fn set_nonblock(fd: c_int, on: bool) {
    // SAFETY: fcntl on an fd this process holds.
    unsafe {
        let fl = real::fcntl(fd, libc::F_GETFL, 0);
        if fl >= 0 {
            let want = if on {
                fl | libc::O_NONBLOCK
            } else {
                fl & !libc::O_NONBLOCK
            };
            real::fcntl(fd, libc::F_SETFL, want as usize);
        }
    }
}

/// Sets or clears `O_NONBLOCK` on `fd`'s file as [`set_nonblock`] does, but writes the flags
/// only if they change, and says why it failed.
pub fn change_nonblock(fd: c_int, on: bool) -> io::Result<()> {
    change_flag(fd, libc::F_GETFL, libc::F_SETFL, libc::O_NONBLOCK, on)
}

/// Sets or clears `FD_CLOEXEC` on `fd`, writing the fd flags only if they change.
pub fn change_cloexec(fd: c_int, on: bool) -> io::Result<()> {
    change_flag(fd, libc::F_GETFD, libc::F_SETFD, libc::FD_CLOEXEC, on)
}

/// Sets or clears `flag` with the fcntl get/set pair given.
fn change_flag(fd: c_int, get: c_int, set: c_int, flag: c_int, on: bool) -> io::Result<()> {
    // SAFETY: fcntl get/set of int flags on an fd this process holds.
    unsafe {
        let old = real::fcntl(fd, get, 0);
        if old < 0 {
            return Err(io::Error::last_os_error());
        }
        let new = if on { old | flag } else { old & !flag };
        if new != old && real::fcntl(fd, set, new as usize) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Makes the status flags of `fd`'s file `O_RDWR | O_NONBLOCK` in one `F_SETFL`, without
/// reading them first: for a file the shim made or accepted itself, whose flags it knows
/// (`F_SETFL` leaves the access mode as it is).
pub fn set_only_nonblock(fd: c_int) {
    // SAFETY: fcntl on an fd this process holds.
    unsafe {
        real::fcntl(
            fd,
            libc::F_SETFL,
            (libc::O_RDWR | libc::O_NONBLOCK) as usize,
        )
    };
}

/// Sets (`on`) or clears `FD_CLOEXEC` on `fd` in one `F_SETFD`, without reading the fd
/// flags first (it is the only one).
pub fn set_cloexec(fd: c_int, on: bool) {
    let flags = if on { libc::FD_CLOEXEC } else { 0 };
    // SAFETY: fcntl on an fd this process holds.
    unsafe { real::fcntl(fd, libc::F_SETFD, flags as usize) };
}

/// Sets `O_NONBLOCK` and `FD_CLOEXEC` on an fd a library opened for the shim (an rdma_cm
/// event channel's, a completion channel's) by the system call itself
/// (`syscall(SYS_fcntl)`), never a libc `fcntl`: `F_GETFL`, `F_SETFL` with `O_NONBLOCK`
/// added, `F_SETFD` to `FD_CLOEXEC`. On failure, the call that failed
/// (`"fcntl(F_GETFL)"`, ...), with errno set.
pub fn set_nonblock_cloexec_raw(fd: c_int) -> Result<(), &'static str> {
    // SAFETY: fcntl on an fd we own; F_GETFL/F_SETFL/F_SETFD take an int argument.
    unsafe {
        let fcntl = |cmd: c_int, arg: c_long| {
            raw::syscall3(libc::SYS_fcntl, fd as c_long, cmd as c_long, arg)
        };
        let fl = fcntl(libc::F_GETFL, 0);
        if fl < 0 {
            return Err("fcntl(F_GETFL)");
        }
        if fcntl(libc::F_SETFL, fl | libc::O_NONBLOCK as c_long) < 0 {
            return Err("fcntl(F_SETFL)");
        }
        if fcntl(libc::F_SETFD, libc::FD_CLOEXEC as c_long) < 0 {
            return Err("fcntl(F_SETFD)");
        }
    }
    Ok(())
}

/// A copy of `fd` at the lowest free number (`F_DUPFD`, or `F_DUPFD_CLOEXEC` for a
/// close-on-exec one), or -1.
pub fn dup_lowest(fd: c_int, cloexec: bool) -> c_int {
    let cmd = if cloexec {
        libc::F_DUPFD_CLOEXEC
    } else {
        libc::F_DUPFD
    };
    // SAFETY: plain fcntl on an fd this process holds.
    unsafe { real::fcntl(fd, cmd, 0) }
}

/// A private copy of `fd` (close-on-exec, out of the program's way), or -1.
pub fn dup_hidden(fd: c_int) -> c_int {
    match raw::dup_high(fd) {
        n if n >= 0 => n,
        _ => dup_lowest(fd, true), // no high number free
    }
}
