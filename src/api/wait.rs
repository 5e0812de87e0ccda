//! Readiness: poll, select and epoll (and their timed, masked and fortified forms).
//!
//! The fd a program holds is always a real kernel fd whose readiness the shim drives, so
//! these forward. While the process has RDMA streams, a wait first handles completions: a
//! zero timeout polls the CQs once; a wait that would block polls them for the spin budget,
//! then sleeps on the program's fds and the completion channels together (engine::program_waits).

#![allow(clippy::missing_safety_doc)] // each fn has its libc namesake's contract

use super::inherit;
use crate::engine::{self, program_waits};
use crate::fdtable;
use crate::sys::real;
use libc::{c_int, epoll_event, fd_set, nfds_t, pollfd, sigset_t, size_t, timespec, timeval};

/// The owned fds among `fds` are being polled: their doorbells must follow the streams
/// (`Socket::mark_watched`). Only while the process has RDMA streams.
unsafe fn mark_polled(fds: *const pollfd, n: nfds_t) {
    if fds.is_null() || !engine::active() {
        return;
    }
    for p in std::slice::from_raw_parts(fds, n as usize) {
        if fdtable::owns(p.fd) {
            if let Some(s) = fdtable::get(p.fd) {
                s.mark_watched();
            }
        }
    }
}

/// As [`mark_polled`] for select's sets.
unsafe fn mark_selected(n: c_int, sets: [*mut fd_set; 3]) {
    if !engine::active() {
        return;
    }
    for fd in 0..n.clamp(0, libc::FD_SETSIZE as c_int) {
        if fdtable::owns(fd) && sets.iter().any(|s| crate::sys::poll::in_fd_set(fd, *s)) {
            if let Some(s) = fdtable::get(fd) {
                s.mark_watched();
            }
        }
    }
}

/// The program's pollfds as a slice (empty for a null pointer).
unsafe fn pollfds<'a>(fds: *const pollfd, n: nfds_t) -> &'a [pollfd] {
    if fds.is_null() {
        &[]
    } else {
        std::slice::from_raw_parts(fds, n as usize)
    }
}

#[inline]
pub unsafe fn poll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int {
    if !engine::active() {
        return real::poll(fds, n, timeout);
    }
    mark_polled(fds, n);
    if timeout == 0 {
        program_waits::before_nonblocking_wait();
        return real::poll(fds, n, 0);
    }
    program_waits::sleep_with_channels(
        pollfds(fds, n),
        timeout,
        std::ptr::null(),
        || probe(real::poll(fds, n, 0)),
        || real::poll(fds, n, timeout),
    )
}

#[inline]
pub unsafe fn __poll_chk(fds: *mut pollfd, n: nfds_t, timeout: c_int, fdslen: size_t) -> c_int {
    if !engine::active() {
        return real::__poll_chk(fds, n, timeout, fdslen);
    }
    mark_polled(fds, n);
    if timeout == 0 {
        program_waits::before_nonblocking_wait();
        return real::__poll_chk(fds, n, 0, fdslen);
    }
    program_waits::sleep_with_channels(
        pollfds(fds, n),
        timeout,
        std::ptr::null(),
        || probe(real::__poll_chk(fds, n, 0, fdslen)),
        || real::__poll_chk(fds, n, timeout, fdslen),
    )
}

#[inline]
pub unsafe fn ppoll(
    fds: *mut pollfd,
    n: nfds_t,
    ts: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    if !engine::active() {
        return real::ppoll(fds, n, ts, mask);
    }
    mark_polled(fds, n);
    let zero = timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    if is_zero_ts(ts) {
        program_waits::before_nonblocking_wait();
        return real::ppoll(fds, n, &zero, mask);
    }
    program_waits::sleep_with_channels(
        pollfds(fds, n),
        ts_ms(ts),
        mask,
        || probe(real::ppoll(fds, n, &zero, mask)),
        || real::ppoll(fds, n, ts, mask),
    )
}

/// A timespec timeout in ms for poll (rounded up; null: no limit).
unsafe fn ts_ms(ts: *const timespec) -> c_int {
    if ts.is_null() {
        return -1;
    }
    let (sec, nsec): (i64, i64) = ((*ts).tv_sec, (*ts).tv_nsec);
    let ms = sec
        .saturating_mul(1000)
        .saturating_add((nsec + 999_999) / 1_000_000);
    ms.clamp(0, i64::from(c_int::MAX)) as c_int
}

#[inline]
pub unsafe fn select(
    n: c_int,
    r: *mut fd_set,
    w: *mut fd_set,
    e: *mut fd_set,
    tv: *mut timeval,
) -> c_int {
    if !engine::active() {
        return real::select(n, r, w, e, tv);
    }
    mark_selected(n, [r, w, e]);
    if !tv.is_null() && (*tv).tv_sec == 0 && (*tv).tv_usec == 0 {
        program_waits::before_nonblocking_wait();
        return real::select(n, r, w, e, tv);
    }
    let sets = FdSets::save(r, w, e);
    program_waits::spin_then(
        || {
            sets.restore(r, w, e);
            let mut zero = timeval {
                tv_sec: 0,
                tv_usec: 0,
            };
            probe(real::select(n, r, w, e, &mut zero))
        },
        || {
            sets.restore(r, w, e);
            real::select(n, r, w, e, tv)
        },
    )
}

#[inline]
pub unsafe fn pselect(
    n: c_int,
    r: *mut fd_set,
    w: *mut fd_set,
    e: *mut fd_set,
    ts: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    if !engine::active() {
        return real::pselect(n, r, w, e, ts, mask);
    }
    mark_selected(n, [r, w, e]);
    if is_zero_ts(ts) {
        program_waits::before_nonblocking_wait();
        return real::pselect(n, r, w, e, ts, mask);
    }
    let sets = FdSets::save(r, w, e);
    let zero = timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    program_waits::spin_then(
        || {
            sets.restore(r, w, e);
            probe(real::pselect(n, r, w, e, &zero, mask))
        },
        || {
            sets.restore(r, w, e);
            real::pselect(n, r, w, e, ts, mask)
        },
    )
}

/// A non-blocking probe's result: `Some` if anything is ready (or it failed).
fn probe(r: c_int) -> Option<c_int> {
    (r != 0).then_some(r)
}

unsafe fn is_zero_ts(ts: *const timespec) -> bool {
    !ts.is_null() && (*ts).tv_sec == 0 && (*ts).tv_nsec == 0
}

/// Copies of select's in/out fd sets, restored before each try.
struct FdSets([Option<fd_set>; 3]);

impl FdSets {
    unsafe fn save(r: *mut fd_set, w: *mut fd_set, e: *mut fd_set) -> FdSets {
        let copy = |p: *mut fd_set| (!p.is_null()).then(|| *p);
        FdSets([copy(r), copy(w), copy(e)])
    }

    unsafe fn restore(&self, r: *mut fd_set, w: *mut fd_set, e: *mut fd_set) {
        for (p, v) in [r, w, e].into_iter().zip(&self.0) {
            if let Some(v) = v {
                *p = *v;
            }
        }
    }
}

#[inline]
pub unsafe fn epoll_create(size: c_int) -> c_int {
    super::creds::relisten_if_pending();
    real::epoll_create(size)
}

#[inline]
pub unsafe fn epoll_create1(flags: c_int) -> c_int {
    super::creds::relisten_if_pending();
    real::epoll_create1(flags)
}

#[inline]
pub unsafe fn epoll_ctl(epfd: c_int, op: c_int, fd: c_int, ev: *mut epoll_event) -> c_int {
    if fdtable::owns(fd) {
        // A daemon that dropped root registers its listeners: on RDMA again first.
        super::creds::relisten_if_pending();
        if op == libc::EPOLL_CTL_ADD {
            inherit::branch_before_wait(fd); // before the registration: it swaps the file
        }
    } else if op == libc::EPOLL_CTL_ADD {
        inherit::adopt_listener(fd); // before the registration: adopting swaps the file
    }
    let r = real::epoll_ctl(epfd, op, fd, ev);
    if r == 0 && fdtable::owns(fd) {
        if let Some(s) = fdtable::get(fd) {
            s.note_epoll(epfd, op, (!ev.is_null()).then(|| *ev));
            if op != libc::EPOLL_CTL_DEL {
                s.mark_watched();
            }
        }
    }
    r
}

#[inline]
pub unsafe fn epoll_wait(epfd: c_int, ev: *mut epoll_event, max: c_int, timeout: c_int) -> c_int {
    if !engine::active() {
        return real::epoll_wait(epfd, ev, max, timeout);
    }
    if timeout == 0 {
        program_waits::before_nonblocking_wait();
        return real::epoll_wait(epfd, ev, max, 0);
    }
    program_waits::sleep_with_channels(
        &[epoll_pollfd(epfd)],
        timeout,
        std::ptr::null(),
        || probe(real::epoll_wait(epfd, ev, max, 0)),
        || real::epoll_wait(epfd, ev, max, timeout),
    )
}

/// An epoll fd is readable while its ready list is not empty: the program's epoll set, as one
/// fd among the ones a wait sleeps on.
fn epoll_pollfd(epfd: c_int) -> pollfd {
    pollfd {
        fd: epfd,
        events: libc::POLLIN,
        revents: 0,
    }
}

#[inline]
pub unsafe fn epoll_pwait(
    epfd: c_int,
    ev: *mut epoll_event,
    max: c_int,
    timeout: c_int,
    mask: *const sigset_t,
) -> c_int {
    if !engine::active() {
        return real::epoll_pwait(epfd, ev, max, timeout, mask);
    }
    if timeout == 0 {
        program_waits::before_nonblocking_wait();
        return real::epoll_pwait(epfd, ev, max, 0, mask);
    }
    program_waits::sleep_with_channels(
        &[epoll_pollfd(epfd)],
        timeout,
        mask,
        || probe(real::epoll_pwait(epfd, ev, max, 0, mask)),
        || real::epoll_pwait(epfd, ev, max, timeout, mask),
    )
}

/// `epoll_pwait2` (glibc 2.35+): `epoll_pwait` with a timespec timeout (null: no limit).
#[inline]
pub unsafe fn epoll_pwait2(
    epfd: c_int,
    ev: *mut epoll_event,
    max: c_int,
    ts: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    if !engine::active() {
        return real::epoll_pwait2(epfd, ev, max, ts, mask);
    }
    let zero = timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    if is_zero_ts(ts) {
        program_waits::before_nonblocking_wait();
        return real::epoll_pwait2(epfd, ev, max, &zero, mask);
    }
    program_waits::sleep_with_channels(
        &[epoll_pollfd(epfd)],
        ts_ms(ts),
        mask,
        || probe(real::epoll_pwait2(epfd, ev, max, &zero, mask)),
        || real::epoll_pwait2(epfd, ev, max, ts, mask),
    )
}
