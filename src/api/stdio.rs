//! Sockets handed to code inside libc that reads and writes their fds where no hook sees it:
//! a `FILE` made with `fdopen` (its reads and writes are libc-internal `read`/`write`),
//! `dprintf` and `vdprintf`. On an RDMA stream those would reach the doorbell — writes
//! lost, reads of its tokens — so first the fds are made to carry the stream's bytes as a
//! plain kernel socket (a relay end, `inherit::relay_for_libc`); a socket not yet connected
//! stays on kernel TCP (`Known::STDIO`, read by `connect`).

#![allow(clippy::missing_safety_doc)] // each fn has its libc namesake's contract

use super::inherit;
use super::ownership::keep_errno;
use crate::fdtable;
use crate::guard;
use crate::socket::{Known, SocketState};
use crate::sys::real;
use libc::{c_char, c_int, c_void};

/// `fd` is about to be read or written inside libc.
#[cold]
fn for_libc_io(fd: c_int) {
    let Some(s) = fdtable::get(fd) else { return };
    let Some(_g) = guard::enter() else { return };
    keep_errno(|| match s.state() {
        SocketState::Created => {
            log::debug!("fd {fd}: a stdio stream reads and writes it: it stays on kernel TCP");
            s.note_known(Known::STDIO);
        }
        SocketState::Rdma => inherit::relay_for_libc(&s),
        _ => {}
    });
}

#[inline]
pub unsafe fn fdopen(fd: c_int, mode: *const c_char) -> *mut libc::FILE {
    if fdtable::owns(fd) {
        for_libc_io(fd);
    }
    real::fdopen(fd, mode)
}

#[inline]
pub unsafe fn vdprintf(fd: c_int, fmt: *const c_char, ap: *mut c_void) -> c_int {
    if fdtable::owns(fd) {
        for_libc_io(fd);
    }
    real::vdprintf(fd, fmt, ap)
}

/// The `dprintf` hook's (a trampoline in `preload/`) preparation: readies `fd` for libc's own
/// writes, and says where the call goes on — libc's `dprintf`, or, should it be missing, a
/// function that fails with ENOSYS (a jump to null would crash the program).
pub unsafe extern "C" fn dprintf_target(fd: c_int) -> *const c_void {
    if fdtable::owns(fd) {
        for_libc_io(fd);
    }
    match real::dprintf_fn() {
        p if p.is_null() => dprintf_missing as *const c_void,
        p => p,
    }
}

extern "C" fn dprintf_missing() -> c_int {
    crate::sys::raw::set_errno(libc::ENOSYS);
    -1
}
