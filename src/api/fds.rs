//! Fd lifetime: close, close_range, dup, dup2, dup3 and fclose. The fd table follows the
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
    let r = real::close_range(first, last, flags);
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
    let Some(s) = fdtable::get(fd) else {
        return real::dup(fd);
    };
    let new = real::dup(fd);
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
    let r = real::dup2(old, new);
    if r >= 0 && old != new {
        duped_onto(old, new);
    }
    r
}

#[inline]
pub unsafe fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    let r = real::dup3(old, new, flags);
    if r >= 0 {
        duped_onto(old, new);
    }
    r
}
