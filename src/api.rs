//! libc-shaped entry points: what each hook in `preload/` calls.
//!
//! Every function has the signature of the libc function it stands in for and keeps its
//! contract, errno included. The first thing each does is look the fd up: an fd the shim does
//! not own goes straight to libc. Lifecycle calls (socket, connect, accept, close, dup, ...)
//! run shim logic only outside the reentrancy guard, so calls made by the shim itself or by
//! librdmacm/libibverbs on its behalf go straight to libc.
//!
//! Today every owned socket is carried by kernel TCP (the RDMA transport is not built yet):
//! data calls forward to libc and count bytes into the stats region.

#![allow(clippy::missing_safety_doc)] // each fn has its libc namesake's contract

use crate::fdtable::{self, SockRef};
use crate::guard;
use crate::init;
use crate::socket::State;
use crate::stats::{Fallback, Path};
use crate::sys::raw::{errno, set_errno};
use crate::sys::real;
use libc::{c_int, c_uint, c_ulong, c_void, fd_set, iovec, msghdr, nfds_t, off64_t, off_t, pid_t};
use libc::{epoll_event, pollfd, sigset_t, size_t, sockaddr, socklen_t, ssize_t, timespec, timeval};

/// Forwards `$call`, counting its result as bytes `$dir` (sent/received) if the shim owns `$fd`.
/// The owned case is out of line so the foreign-fd path stays a load, a test and a jump.
macro_rules! counted {
    ($dir:ident, $fd:expr, $call:expr) => {{
        if fdtable::owns($fd) {
            counted_slow($fd, crate::socket::Socket::$dir, move || $call)
        } else {
            $call
        }
    }};
}

#[cold]
#[inline(never)]
fn counted_slow(fd: c_int, count: fn(&crate::socket::Socket, isize), call: impl FnOnce() -> ssize_t) -> ssize_t {
    match fdtable::get(fd) {
        None => call(),
        Some(s) => {
            let r = call();
            count(&s, r);
            r
        }
    }
}

/// Runs `f` without letting it change errno.
fn keep_errno<T>(f: impl FnOnce() -> T) -> T {
    let e = errno();
    let r = f();
    set_errno(e);
    r
}

// ---- creation and connection -------------------------------------------------------------

fn is_tcp(domain: c_int, ty: c_int, protocol: c_int) -> bool {
    let base = ty & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC);
    (domain == libc::AF_INET || domain == libc::AF_INET6)
        && base == libc::SOCK_STREAM
        && (protocol == 0 || protocol == libc::IPPROTO_TCP)
}

/// Starts owning `fd`, a fresh TCP socket. An fd beyond the table passes through untracked.
fn track(fd: c_int, init: impl FnOnce(&crate::socket::Socket)) {
    if (fd as u32 as usize) < fdtable::MAX_FDS {
        fdtable::insert(fd, SockRef::new_socket(init));
    }
}

#[inline]
pub unsafe fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    let fd = real::socket(domain, ty, protocol);
    if fd >= 0 && is_tcp(domain, ty, protocol) {
        if let Some(_g) = guard::enter() {
            keep_errno(|| init::enabled().then(|| track(fd, |_| {})));
        }
    }
    fd
}

#[inline]
pub unsafe fn socketpair(domain: c_int, ty: c_int, protocol: c_int, sv: *mut c_int) -> c_int {
    real::socketpair(domain, ty, protocol, sv)
}

/// Raw bytes of the socket's own address (for stats), or empty.
fn local_addr(fd: c_int) -> Vec<u8> {
    let mut a = [0u8; 28];
    let mut len = a.len() as socklen_t;
    // SAFETY: a is a valid buffer of len bytes.
    let ok = unsafe { real::getsockname(fd, a.as_mut_ptr().cast(), &mut len) } == 0;
    if ok { a[..(len as usize).min(28)].to_vec() } else { Vec::new() }
}

unsafe fn addr_bytes<'a>(addr: *const sockaddr, len: socklen_t) -> &'a [u8] {
    if addr.is_null() { &[] } else { std::slice::from_raw_parts(addr.cast::<u8>(), len as usize) }
}

/// Why a connection goes to kernel TCP today.
fn fallback_reason() -> Fallback {
    if init::rdma_device_present() { Fallback::NotImplemented } else { Fallback::NoDevice }
}

#[inline]
pub unsafe fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    let Some(s) = fdtable::get(fd) else { return real::connect(fd, addr, len) };
    let Some(_g) = guard::enter() else { return real::connect(fd, addr, len) };
    let family = if addr.is_null() || (len as usize) < 2 { libc::AF_UNSPEC } else { (*addr).sa_family as c_int };
    if family == libc::AF_UNSPEC || !s.transition(State::Created, State::Connecting) {
        return real::connect(fd, addr, len); // disconnect, or a repeat call on a connecting socket
    }
    let reason = keep_errno(fallback_reason);
    let r = real::connect(fd, addr, len);
    let e = errno();
    if r == 0 || e == libc::EINPROGRESS || e == libc::EINTR {
        // EINTR: a blocking connect goes on in the background, like EINPROGRESS.
        let local = local_addr(fd);
        s.established(fd, State::Tcp, Path::Tcp, Some(reason), &local, addr_bytes(addr, len));
        log::debug!("fd {fd}: connect over kernel TCP ({})", reason.name());
    } else {
        s.set_state(State::Created); // failed: the program may retry on the same socket
    }
    set_errno(e);
    r
}

#[inline]
pub unsafe fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    real::bind(fd, addr, len)
}

#[inline]
pub unsafe fn listen(fd: c_int, backlog: c_int) -> c_int {
    let r = real::listen(fd, backlog);
    if r == 0 {
        if let Some(s) = fdtable::get(fd) {
            s.transition(State::Created, State::Listening);
        }
    }
    r
}

/// Owns a socket just accepted on an owned listener.
fn track_accepted(nfd: c_int) {
    let Some(_g) = guard::enter() else { return };
    keep_errno(|| {
        if !init::enabled() {
            return;
        }
        let reason = if init::rdma_device_present() { Fallback::PeerTcp } else { Fallback::NoDevice };
        let mut peer = [0u8; 28];
        let mut plen = peer.len() as socklen_t;
        // SAFETY: peer is a valid buffer of plen bytes.
        let have_peer = unsafe { real::getpeername(nfd, peer.as_mut_ptr().cast(), &mut plen) } == 0;
        let peer = if have_peer { &peer[..(plen as usize).min(28)] } else { &[][..] };
        let local = local_addr(nfd);
        track(nfd, |s| s.established(nfd, State::Tcp, Path::Tcp, Some(reason), &local, peer));
    });
}

#[inline]
pub unsafe fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    if !fdtable::owns(fd) {
        return real::accept(fd, addr, len);
    }
    let nfd = real::accept(fd, addr, len);
    if nfd >= 0 {
        track_accepted(nfd);
    }
    nfd
}

#[inline]
pub unsafe fn accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int {
    if !fdtable::owns(fd) {
        return real::accept4(fd, addr, len, flags);
    }
    let nfd = real::accept4(fd, addr, len, flags);
    if nfd >= 0 {
        track_accepted(nfd);
    }
    nfd
}

#[inline]
pub unsafe fn shutdown(fd: c_int, how: c_int) -> c_int {
    real::shutdown(fd, how)
}

// ---- options and addresses ---------------------------------------------------------------

#[inline]
pub unsafe fn getsockopt(fd: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int {
    real::getsockopt(fd, level, name, val, len)
}

#[inline]
pub unsafe fn setsockopt(fd: c_int, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int {
    real::setsockopt(fd, level, name, val, len)
}

#[inline]
pub unsafe fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    real::getsockname(fd, addr, len)
}

#[inline]
pub unsafe fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    real::getpeername(fd, addr, len)
}

#[inline]
pub unsafe fn ioctl(fd: c_int, req: c_ulong, arg: usize) -> c_int {
    real::ioctl(fd, req, arg)
}

// ---- data --------------------------------------------------------------------------------

#[inline]
pub unsafe fn send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t {
    counted!(sent, fd, real::send(fd, buf, n, flags))
}

#[inline]
pub unsafe fn sendto(fd: c_int, buf: *const c_void, n: size_t, flags: c_int, addr: *const sockaddr, len: socklen_t) -> ssize_t {
    counted!(sent, fd, real::sendto(fd, buf, n, flags, addr, len))
}

#[inline]
pub unsafe fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    counted!(sent, fd, real::sendmsg(fd, msg, flags))
}

#[inline]
pub unsafe fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    counted!(sent, fd, real::write(fd, buf, n))
}

#[inline]
pub unsafe fn writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    counted!(sent, fd, real::writev(fd, iov, cnt))
}

#[inline]
pub unsafe fn sendfile(out_fd: c_int, in_fd: c_int, off: *mut off_t, n: size_t) -> ssize_t {
    counted!(sent, out_fd, real::sendfile(out_fd, in_fd, off, n))
}

#[inline]
pub unsafe fn sendfile64(out_fd: c_int, in_fd: c_int, off: *mut off64_t, n: size_t) -> ssize_t {
    counted!(sent, out_fd, real::sendfile64(out_fd, in_fd, off, n))
}

#[inline]
pub unsafe fn recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t {
    counted!(received, fd, real::recv(fd, buf, n, flags))
}

#[inline]
pub unsafe fn recvfrom(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> ssize_t {
    counted!(received, fd, real::recvfrom(fd, buf, n, flags, addr, len))
}

#[inline]
pub unsafe fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    counted!(received, fd, real::recvmsg(fd, msg, flags))
}

#[inline]
pub unsafe fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    counted!(received, fd, real::read(fd, buf, n))
}

#[inline]
pub unsafe fn readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    counted!(received, fd, real::readv(fd, iov, cnt))
}

#[inline]
pub unsafe fn __read_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t) -> ssize_t {
    counted!(received, fd, real::__read_chk(fd, buf, n, buflen))
}

#[inline]
pub unsafe fn __recv_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t, flags: c_int) -> ssize_t {
    counted!(received, fd, real::__recv_chk(fd, buf, n, buflen, flags))
}

#[inline]
pub unsafe fn __recvfrom_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> ssize_t {
    counted!(received, fd, real::__recvfrom_chk(fd, buf, n, buflen, flags, addr, len))
}

// ---- fd lifetime ---------------------------------------------------------------------------

/// Forgets `fd` if owned; the connection ends with its last fd.
#[inline]
fn forget(fd: c_int) {
    if let Some(s) = fdtable::remove(fd) {
        s.fd_closed();
    }
}

/// Makes `new` refer to the socket behind `old` (after a successful dup of an owned fd).
fn share(old_sock: &SockRef, new: c_int) {
    if let Some(replaced) = fdtable::insert(new, old_sock.clone()) {
        replaced.fd_closed();
    }
    old_sock.moved_to(new);
}

#[inline]
pub unsafe fn close(fd: c_int) -> c_int {
    // Forget first: once closed, the number may be reused by another thread at once.
    forget(fd);
    real::close(fd)
}

#[inline]
pub unsafe fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    let r = real::close_range(first, last, flags);
    if r == 0 && flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 {
        let end = (last as usize).saturating_add(1).min(fdtable::high_water());
        for fd in (first as usize)..end {
            forget(fd as c_int);
        }
    }
    r
}

#[inline]
pub unsafe fn dup(fd: c_int) -> c_int {
    let Some(s) = fdtable::get(fd) else { return real::dup(fd) };
    let new = real::dup(fd);
    if new >= 0 {
        share(&s, new);
    }
    new
}

/// dup2/dup3 onto `new`: the kernel closed whatever `new` was, so forget it too.
fn duped_onto(old: c_int, new: c_int) {
    match fdtable::get(old) {
        Some(s) => share(&s, new),
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

fn fcntl_impl(fd: c_int, cmd: c_int, arg: usize, f: unsafe fn(c_int, c_int, usize) -> c_int) -> c_int {
    let is_dup = cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC;
    let s = if is_dup { fdtable::get(fd) } else { None };
    // SAFETY: forwarding the caller's arguments unchanged.
    let r = unsafe { f(fd, cmd, arg) };
    if let (Some(s), true) = (s, r >= 0) {
        share(&s, r);
    }
    r
}

#[inline]
pub unsafe fn fcntl(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    fcntl_impl(fd, cmd, arg, real::fcntl)
}

#[inline]
pub unsafe fn fcntl64(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    fcntl_impl(fd, cmd, arg, real::fcntl64)
}

/// The child's state is reset by the `pthread_atfork` handler registered at start-up, which
/// also covers forks made inside libraries; this hook only has to forward.
#[inline]
pub unsafe fn fork() -> pid_t {
    real::fork()
}

// ---- readiness -----------------------------------------------------------------------------
// The fd a program holds is always a real kernel fd whose readiness the shim drives, so
// these forward unchanged.

#[inline]
pub unsafe fn poll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int {
    real::poll(fds, n, timeout)
}

#[inline]
pub unsafe fn __poll_chk(fds: *mut pollfd, n: nfds_t, timeout: c_int, fdslen: size_t) -> c_int {
    real::__poll_chk(fds, n, timeout, fdslen)
}

#[inline]
pub unsafe fn ppoll(fds: *mut pollfd, n: nfds_t, ts: *const timespec, mask: *const sigset_t) -> c_int {
    real::ppoll(fds, n, ts, mask)
}

#[inline]
pub unsafe fn select(n: c_int, r: *mut fd_set, w: *mut fd_set, e: *mut fd_set, tv: *mut timeval) -> c_int {
    real::select(n, r, w, e, tv)
}

#[inline]
pub unsafe fn pselect(n: c_int, r: *mut fd_set, w: *mut fd_set, e: *mut fd_set, ts: *const timespec, mask: *const sigset_t) -> c_int {
    real::pselect(n, r, w, e, ts, mask)
}

#[inline]
pub unsafe fn epoll_create(size: c_int) -> c_int {
    real::epoll_create(size)
}

#[inline]
pub unsafe fn epoll_create1(flags: c_int) -> c_int {
    real::epoll_create1(flags)
}

#[inline]
pub unsafe fn epoll_ctl(epfd: c_int, op: c_int, fd: c_int, ev: *mut epoll_event) -> c_int {
    real::epoll_ctl(epfd, op, fd, ev)
}

#[inline]
pub unsafe fn epoll_wait(epfd: c_int, ev: *mut epoll_event, max: c_int, timeout: c_int) -> c_int {
    real::epoll_wait(epfd, ev, max, timeout)
}

#[inline]
pub unsafe fn epoll_pwait(epfd: c_int, ev: *mut epoll_event, max: c_int, timeout: c_int, mask: *const sigset_t) -> c_int {
    real::epoll_pwait(epfd, ev, max, timeout, mask)
}
