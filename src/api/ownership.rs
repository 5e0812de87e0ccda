//! The shim's ownership of the program's fds, kept the same way by every room of `api`:
//! starting to own a fresh socket (`track`), giving another fd the same socket (`share`),
//! replacing the file behind an owned fd without losing its epoll registrations
//! (`swap_file`), the address its stats record (`local_addr`) — all of it done without
//! changing errno (`keep_errno`).

use crate::fdtable::{self, SockRef};
use crate::sys::raw::{self, errno, set_errno};
use crate::sys::real;
use libc::{c_int, socklen_t};

/// Runs `f` without letting it change errno.
pub(super) fn keep_errno<T>(f: impl FnOnce() -> T) -> T {
    let e = errno();
    let r = f();
    set_errno(e);
    r
}

/// Starts owning `fd`, a fresh TCP socket. An fd beyond the table passes through untracked.
pub(super) fn track(fd: c_int, init: impl FnOnce(&crate::socket::Socket)) {
    if (fd as u32 as usize) < fdtable::MAX_FDS {
        fdtable::insert(fd, SockRef::new_socket(init));
    }
}

/// Makes `new` refer to the socket behind `old` (after a successful dup of an owned fd).
pub(super) fn share(old_sock: &SockRef, new: c_int) {
    if raw::in_vfork_child() {
        return; // see `fds::forget`
    }
    if let Some(replaced) = fdtable::insert(new, old_sock.clone()) {
        replaced.fd_closed();
    }
    old_sock.moved_to(new);
}

/// Replaces the file behind the program's `fd` with a doorbell's A (`install`), carrying
/// the program's epoll registrations of `fd` over: epoll keys them by file, so they are taken
/// off the old file first and put back, with the same events and data, on the new one.
/// Returns what `install` did.
pub(super) fn swap_file<T>(s: &crate::socket::Socket, fd: c_int, install: impl FnOnce() -> T) -> T {
    let regs = s.epoll_regs();
    for (epfd, _) in &regs {
        // SAFETY: removing fd from an epoll set the program put it in.
        unsafe { real::epoll_ctl(*epfd, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
    }
    let r = install();
    for (epfd, mut ev) in regs {
        // SAFETY: re-adding with the program's own event mask and data.
        if unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
            log::warn!("fd {fd}: could not carry its registration in epoll fd {epfd} over");
        }
    }
    r
}

/// Raw bytes of the socket's own address (for stats), or empty.
pub(super) fn local_addr(fd: c_int) -> Vec<u8> {
    let mut a = [0u8; 28];
    let mut len = a.len() as socklen_t;
    // SAFETY: a is a valid buffer of len bytes.
    let ok = unsafe { real::getsockname(fd, a.as_mut_ptr().cast(), &mut len) } == 0;
    if ok {
        a[..(len as usize).min(28)].to_vec()
    } else {
        Vec::new()
    }
}
