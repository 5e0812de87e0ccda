//! The listen and accept hooks: `listen` makes a dual listener (kernel TCP and rdma_cm on
//! one address and port, `dual.rs`) or a kernel-only one, and `accept`/`accept4` take the
//! next connection of a dual listener, of one another process owns (`inherit`), or of the
//! kernel.

#![allow(clippy::missing_safety_doc)] // each fn has its libc namesake's contract

use super::dual::{accept_dual, rdma_listen, start_dual, track_accepted};
use super::inherit;
use super::ownership::{keep_errno, local_addr};
use crate::fdtable;
use crate::guard;
use crate::init;
use crate::socket::{Attachment, SocketState};
use crate::stats::Fallback;
use crate::sys::raw::errno;
use crate::sys::real;
use libc::{c_int, sockaddr, socklen_t};

pub unsafe fn listen(fd: c_int, backlog: c_int) -> c_int {
    let Some(s) = fdtable::get(fd).filter(|_| !init::sealed()) else {
        return real::listen(fd, backlog);
    };
    if let Some(Attachment::Listener(l)) = s.attachment() {
        s.set_backlog(backlog);
        return real::listen(l.tcp_fd, backlog); // a new backlog for the kernel side
    }
    if s.state() != SocketState::Created {
        return real::listen(fd, backlog);
    }
    let Some(_g) = guard::enter() else {
        return real::listen(fd, backlog);
    };
    // The rdma_cm side listens first: once the kernel listener is visible, an rsock client
    // must find the RDMA one too (else it falls back to TCP and caches the failure).
    let rdma = keep_errno(|| rdma_listen(fd, backlog));
    let r = real::listen(fd, backlog);
    if r != 0 || !s.transition(SocketState::Created, SocketState::Listening) {
        return r; // the prepared rdma_cm listener is dropped
    }
    s.set_backlog(backlog);
    let bound = keep_errno(|| local_addr(fd)); // before the fd becomes a doorbell
    match rdma {
        Ok((engine, local, rl)) => start_dual(&s, fd, engine, local, rl, backlog),
        Err(why) => s.set_tcp_only(why),
    }
    keep_errno(|| s.listening(fd, &bound));
    r
}

pub unsafe fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    accept4(fd, addr, len, 0)
}

pub unsafe fn accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int {
    if !fdtable::owns(fd) && !inherit::adopt_listener(fd) {
        return if flags == 0 {
            real::accept(fd, addr, len)
        } else {
            real::accept4(fd, addr, len, flags)
        };
    }
    super::creds::relisten_if_pending();
    if let Some(s) = fdtable::get(fd) {
        // A listener passed at exec is known by its name until its first use.
        let a = match s.attachment() {
            Some(Attachment::Passed(_)) => inherit::here(&s),
            a => a,
        };
        let s = fdtable::get(fd).unwrap_or(s);
        match a {
            Some(Attachment::Listener(l)) if l.owner.is_me() => {
                return accept_dual(&l, addr, len, flags)
            }
            Some(Attachment::Listener(l)) => match inherit::accept(&s, &l, fd, addr, len, flags) {
                inherit::Accepted::Done(r) => return r,
                // Its owner is gone and this process took the listener over: accept as the
                // new owner.
                inherit::Accepted::TakenOver => return accept4(fd, addr, len, flags),
            },
            _ => {}
        }
    }
    let listener = fdtable::get(fd);
    let blocking = listener.as_ref().is_some_and(|s| s.blocking_accept());
    // A listener's own reason goes to what it accepts only where it decides for every
    // connection (the address is excluded or ruled out, or a credential change took its
    // rdma_cm side away): one that lost the RDMA half for another reason (SO_REUSEPORT: a sibling listens on RDMA for the port) still accepts
    // only peers that came over TCP.
    let tcp_only = listener.and_then(|s| s.tcp_only()).filter(|w| {
        matches!(w.reason, Some(Fallback::Excluded | Fallback::Rule))
            || w.detail == crate::stats::Detail::CredentialsChanged
    });
    loop {
        let nfd = if flags == 0 {
            real::accept(fd, addr, len)
        } else {
            real::accept4(fd, addr, len, flags)
        };
        if nfd >= 0 {
            track_accepted(nfd, tcp_only);
        } else if blocking && errno() == libc::EAGAIN {
            crate::sys::unix::wait(fd, libc::POLLIN, 1000); // see Socket::blocking_accept
            continue;
        }
        return nfd;
    }
}
