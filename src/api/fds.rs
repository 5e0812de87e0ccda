//! Fd lifetime: close, close_range, closefrom, dup, dup2, dup3 and fclose (and those made
//! through `syscall`). The fd table follows the
//! program's fds — an owned socket's fd leaves the table when it is closed, and a copy joins
//! it — and a connection ends with its last fd.

#![allow(clippy::missing_safety_doc)] // each fn has its libc namesake's contract

use super::inherit;
use super::ownership::{keep_errno, share};
use crate::fdtable::{self, SockRef};
use crate::guard;
use crate::sys::fileio;
use crate::sys::raw;
use crate::sys::real;
use libc::{c_int, c_uint};

/// Forgets `fd` if owned; the connection ends with its last fd.
#[inline]
fn forget(fd: c_int) {
    if let Some(s) = take(fd) {
        s.fd_closed();
    }
}

/// Takes `fd` out of the table (its socket's close is the caller's to run).
fn take(fd: c_int) -> Option<SockRef> {
    // A vfork child shares its parent's memory: the table is the parent's, not its own.
    if !fdtable::owns(fd) || raw::in_vfork_child() {
        return None;
    }
    fdtable::remove(fd)
}

#[inline]
pub unsafe fn close(fd: c_int) -> c_int {
    closing(fd, || real::close(fd))
}

/// Runs `close`, the real call that closes `fd`. The fd leaves the table first: once
/// closed, the number may be reused by another thread at once. The socket's own close
/// comes after the real one, so that when the engine asks whether any fd still holds the
/// doorbell, the program's is already gone: a listener then releases its port before close
/// returns (iperf3 -s re-listens at once).
#[inline] // into close and fclose: for an fd the shim does not own, a load and a jump
fn closing(fd: c_int, close: impl FnOnce() -> c_int) -> c_int {
    let s = take(fd);
    let r = close();
    if let Some(s) = s {
        keep_errno(|| s.fd_closed());
    }
    r
}

#[inline]
pub unsafe fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    close_range_by(first, last, flags, || real::close_range(first, last, flags))
}

/// `closefrom`: glibc's calls its own `close_range` inside libc, where no hook sees it.
#[inline]
pub unsafe fn closefrom(low: c_int) {
    close_range_by(low.max(0) as c_uint, c_uint::MAX, 0, || {
        real::closefrom(low);
        0
    });
}

/// `close_range`, made by `call`.
fn close_range_by(
    first: c_uint,
    last: c_uint,
    flags: c_int,
    call: impl FnOnce() -> c_int,
) -> c_int {
    let r = call();
    if r == 0 && flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 {
        let end = (last as usize).saturating_add(1).min(fdtable::high_water());
        if end <= first as usize || raw::in_vfork_child() {
            return r; // nothing owned in range; or a vfork child (see `forget`)
        }
        for fd in (first as usize)..end {
            forget(fd as c_int);
        }
    }
    r
}

#[inline]
pub unsafe fn dup(fd: c_int) -> c_int {
    dup_by(fd, || real::dup(fd))
}

/// `dup` (or `fcntl`'s `F_DUPFD`), made by `call`.
fn dup_by(fd: c_int, call: impl FnOnce() -> c_int) -> c_int {
    let Some(s) = fdtable::get(fd) else {
        return call();
    };
    let new = call();
    if new >= 0 {
        share(&s, new);
    }
    new
}

/// A `FILE` made with `fdopen` on a socket closes its fd inside libc, where no hook sees it:
/// forget the fd first (the number may be reused at once).
#[inline]
pub unsafe fn fclose(stream: *mut libc::FILE) -> c_int {
    if !stream.is_null() {
        let fd = fileio::fileno(stream);
        if fd >= 0 && fdtable::owns(fd) {
            return closing(fd, || real::fclose(stream));
        }
    }
    real::fclose(stream)
}

/// dup2/dup3 onto `new`: the kernel closed whatever `new` was, so forget it too.
fn duped_onto(old: c_int, new: c_int) {
    match fdtable::get(old) {
        Some(s) => {
            share(&s, new);
            if (0..=2).contains(&new) && !raw::in_vfork_child() && !guard::active() {
                keep_errno(|| inherit::onto_stdio(&s));
            }
        }
        None => forget(new),
    }
}

#[inline]
pub unsafe fn dup2(old: c_int, new: c_int) -> c_int {
    dup2_by(old, new, || real::dup2(old, new))
}

/// `dup2` or `dup3` (which refuses `old == new`), made by `call`.
fn dup2_by(old: c_int, new: c_int, call: impl FnOnce() -> c_int) -> c_int {
    let r = call();
    if r >= 0 && old != new {
        duped_onto(old, new);
    }
    r
}

#[inline]
pub unsafe fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    dup2_by(old, new, || real::dup3(old, new, flags))
}

/// The fd system calls made through `syscall(2)` rather than their libc functions get the
/// same bookkeeping: libuv (Node.js, BIND's named and dig) closes with `syscall(SYS_close)`
/// to skip libc's cancellation point, and until 2026-11-29 such a close left the stream
/// open — no end sent, the queue pair kept — and the fd's number, reused, still looked like
/// the stream's. `call` makes the system call. None: not one of those.
pub(super) fn by_syscall(
    n: libc::c_long,
    a: [libc::c_long; 6],
    call: impl FnOnce() -> libc::c_long,
) -> Option<libc::c_long> {
    let (fd, new, arg) = (a[0] as c_int, a[1] as c_int, a[2] as c_int);
    let dupfd = new == libc::F_DUPFD || new == libc::F_DUPFD_CLOEXEC;
    let fd_call = matches!(
        n,
        libc::SYS_close | libc::SYS_close_range | libc::SYS_dup | libc::SYS_dup2 | libc::SYS_dup3
    ) || (n == libc::SYS_fcntl && dupfd);
    if !fd_call {
        return None;
    }
    let r = match n {
        libc::SYS_close => closing(fd, || call() as c_int),
        libc::SYS_close_range => {
            close_range_by(fd as c_uint, new as c_uint, arg, || call() as c_int)
        }
        libc::SYS_dup2 | libc::SYS_dup3 => dup2_by(fd, new, || call() as c_int),
        libc::SYS_dup | libc::SYS_fcntl => dup_by(fd, || call() as c_int),
        _ => return None,
    };
    Some(r as libc::c_long)
}
