//! Data calls: read/write, the send/recv family, their vectored and fortified forms; (`batch`)
//! sendmmsg, recvmmsg, preadv2 and pwritev2; and (`splice`) sendfile and splice.
//!
//! A foreign fd costs `fdtable::owns` and a jump to libc. An owned fd on kernel TCP forwards
//! and counts bytes; an owned fd on RDMA is served by its stream.

#![allow(clippy::missing_safety_doc)] // each fn has its libc namesake's contract

mod batch;
mod splice;

pub use batch::{preadv2, preadv64v2, pwritev2, pwritev64v2, recvmmsg, sendmmsg};
pub use splice::{sendfile, sendfile64, splice};

use crate::engine::{self, Stream};
use crate::fdtable;
use crate::guard;
use crate::socket::Socket;
use crate::sys::process;
use crate::sys::raw::set_errno;
use crate::sys::real;
use libc::{c_int, c_void, iovec, msghdr, size_t, sockaddr, socklen_t, ssize_t};
use std::io::{IoSlice, IoSliceMut};

/// Forwards `$call` for a foreign fd; for an owned one, serves it from the RDMA stream
/// (`|$st| $rdma`) or forwards it, and counts the bytes `$dir` (sent/received). The owned
/// case is out of line so the foreign-fd path stays a load, a test and a jump.
macro_rules! data_call {
    ($dir:ident, $fd:expr, $call:expr, |$st:ident| $rdma:expr) => {{
        if fdtable::owns($fd) {
            owned($fd, Socket::$dir, move || $call, move |$st: &Stream| $rdma)
        } else {
            $call
        }
    }};
}
use data_call; // for `splice`

#[cold]
#[inline(never)]
fn owned(
    fd: c_int,
    count: fn(&Socket, isize),
    call: impl FnOnce() -> ssize_t,
    rdma: impl FnOnce(&Stream) -> ssize_t,
) -> ssize_t {
    let Some(s) = fdtable::get(fd) else {
        return call();
    };
    if guard::active() {
        return in_handler(&s, call);
    }
    let r = match super::inherit::stream(&s) {
        Some(st) => match guard::enter() {
            Some(_g) => {
                let _call = engine::Call::begin(&st);
                rdma(&st)
            }
            None => call(),
        },
        None => call(),
    };
    if r > 0 && s.state() == crate::socket::SocketState::Connecting {
        super::connect::resolve_pending(&s, fd, true); // data moved: the connect succeeded
    }
    count(&s, r);
    r
}

/// I/O on a socket of ours from a signal handler that interrupted this thread inside the
/// shim: a kernel socket's call goes through; an RDMA stream cannot be served without the
/// locks the interrupted code may hold, so the call fails with EAGAIN rather than reaching
/// the doorbell (where writes would vanish and reads return its tokens). Takes no lock.
#[cold]
fn in_handler(s: &Socket, call: impl FnOnce() -> ssize_t) -> ssize_t {
    if matches!(s.state(), crate::socket::SocketState::Rdma) {
        set_errno(libc::EAGAIN);
        return -1;
    }
    call()
}

/// The caller's buffer as a slice (EFAULT for a null pointer with a length).
unsafe fn buf_mut<'a>(buf: *mut c_void, n: size_t) -> Option<&'a mut [u8]> {
    if n == 0 {
        Some(&mut [])
    } else if buf.is_null() {
        None
    } else {
        Some(std::slice::from_raw_parts_mut(buf.cast::<u8>(), n))
    }
}

unsafe fn buf<'a>(buf: *const c_void, n: size_t) -> Option<&'a [u8]> {
    if n == 0 {
        Some(&[])
    } else if buf.is_null() {
        None
    } else {
        Some(std::slice::from_raw_parts(buf.cast::<u8>(), n))
    }
}

/// The caller's iovecs (`IoSliceMut` is ABI-compatible with `iovec` on Unix).
unsafe fn iov_mut<'a>(iov: *const iovec, cnt: c_int) -> Option<&'a mut [IoSliceMut<'a>]> {
    match cnt {
        0 => Some(&mut []),
        c if !(0..=libc::UIO_MAXIOV).contains(&c) || iov.is_null() => None,
        c => Some(std::slice::from_raw_parts_mut(
            iov as *mut IoSliceMut<'a>,
            c as usize,
        )),
    }
}

unsafe fn iov<'a>(iov: *const iovec, cnt: c_int) -> Option<&'a [IoSlice<'a>]> {
    match cnt {
        0 => Some(&[]),
        c if !(0..=libc::UIO_MAXIOV).contains(&c) || iov.is_null() => None,
        c => Some(std::slice::from_raw_parts(
            iov as *const IoSlice<'a>,
            c as usize,
        )),
    }
}

fn fail(e: c_int) -> ssize_t {
    set_errno(e);
    -1
}

/// Reads from the stream into `bufs`.
fn recv_rdma(st: &Stream, bufs: Option<&mut [IoSliceMut<'_>]>, flags: c_int) -> ssize_t {
    let Some(bufs) = bufs else {
        return fail(libc::EFAULT);
    };
    if engine::get().is_none() {
        log::debug!("recv: the stream's engine is not this process's: ECONNRESET");
        return fail(libc::ECONNRESET); // a stream of another process's engine
    }
    match st.recv(bufs, flags, st.rcv_timeout()) {
        Ok(n) => n as ssize_t,
        Err(e) => {
            if e != libc::EAGAIN {
                log::debug!("recv from {}: errno {e} ({})", st.peer, st.describe());
            }
            fail(e)
        }
    }
}

/// Writes `bufs` to the stream; EPIPE raises SIGPIPE unless MSG_NOSIGNAL, like the kernel.
fn send_rdma(st: &Stream, bufs: Option<&[IoSlice<'_>]>, flags: c_int) -> ssize_t {
    let Some(bufs) = bufs else {
        return fail(libc::EFAULT);
    };
    if engine::get().is_none() {
        return fail(libc::EPIPE); // a stream of another process's engine
    }
    match st.send(bufs, flags, st.snd_timeout()) {
        Ok(n) => n as ssize_t,
        Err(e) => {
            if e == libc::EPIPE && flags & libc::MSG_NOSIGNAL == 0 {
                process::raise(libc::SIGPIPE);
            }
            fail(e)
        }
    }
}

fn one_mut(b: Option<&mut [u8]>) -> Option<[IoSliceMut<'_>; 1]> {
    b.map(|b| [IoSliceMut::new(b)])
}

fn one(b: Option<&[u8]>) -> Option<[IoSlice<'_>; 1]> {
    b.map(|b| [IoSlice::new(b)])
}

#[inline]
pub unsafe fn send(fd: c_int, b: *const c_void, n: size_t, flags: c_int) -> ssize_t {
    data_call!(sent, fd, real::send(fd, b, n, flags), |st| send_rdma(
        st,
        one(buf(b, n)).as_ref().map(|x| &x[..]),
        flags
    ))
}

#[inline]
pub unsafe fn sendto(
    fd: c_int,
    b: *const c_void,
    n: size_t,
    flags: c_int,
    addr: *const sockaddr,
    len: socklen_t,
) -> ssize_t {
    // A connected stream ignores the address, as TCP does.
    data_call!(sent, fd, real::sendto(fd, b, n, flags, addr, len), |st| {
        send_rdma(st, one(buf(b, n)).as_ref().map(|x| &x[..]), flags)
    })
}

#[inline]
pub unsafe fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    // Only a message that carries fds costs more than a test: they may be rsock streams.
    if !fdtable::owns(fd) && !msg.is_null() && (*msg).msg_controllen > 0 {
        if let Some(r) = super::rights::sending(fd, msg, flags) {
            return r;
        }
    }
    data_call!(sent, fd, real::sendmsg(fd, msg, flags), |st| {
        if msg.is_null() {
            return fail(libc::EFAULT);
        }
        send_rdma(st, iov((*msg).msg_iov, (*msg).msg_iovlen as c_int), flags)
    })
}

#[inline]
pub unsafe fn write(fd: c_int, b: *const c_void, n: size_t) -> ssize_t {
    data_call!(sent, fd, real::write(fd, b, n), |st| send_rdma(
        st,
        one(buf(b, n)).as_ref().map(|x| &x[..]),
        0
    ))
}

#[inline]
pub unsafe fn writev(fd: c_int, v: *const iovec, cnt: c_int) -> ssize_t {
    data_call!(sent, fd, real::writev(fd, v, cnt), |st| send_rdma(
        st,
        iov(v, cnt),
        0
    ))
}

#[inline]
pub unsafe fn recv(fd: c_int, b: *mut c_void, n: size_t, flags: c_int) -> ssize_t {
    data_call!(received, fd, real::recv(fd, b, n, flags), |st| recv_rdma(
        st,
        one_mut(buf_mut(b, n)).as_mut().map(|x| &mut x[..]),
        flags
    ))
}

#[inline]
pub unsafe fn recvfrom(
    fd: c_int,
    b: *mut c_void,
    n: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> ssize_t {
    data_call!(
        received,
        fd,
        real::recvfrom(fd, b, n, flags, addr, len),
        |st| {
            if !addr.is_null() && !len.is_null() {
                *len = 0; // a stream socket reports no source address
            }
            recv_rdma(
                st,
                one_mut(buf_mut(b, n)).as_mut().map(|x| &mut x[..]),
                flags,
            )
        }
    )
}

#[inline]
pub unsafe fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    if !fdtable::owns(fd) {
        let r = real::recvmsg(fd, msg, flags);
        // Only a message that brought fds costs more than a test: they may be rsock streams.
        if r >= 0 && !msg.is_null() && (*msg).msg_controllen > 0 {
            super::ownership::keep_errno(|| super::inherit::received_rights(msg));
        }
        return r;
    }
    data_call!(received, fd, real::recvmsg(fd, msg, flags), |st| {
        if msg.is_null() {
            return fail(libc::EFAULT);
        }
        let m = &mut *msg;
        m.msg_namelen = 0;
        m.msg_controllen = 0;
        m.msg_flags = 0;
        recv_rdma(st, iov_mut(m.msg_iov, m.msg_iovlen as c_int), flags)
    })
}

#[inline]
pub unsafe fn read(fd: c_int, b: *mut c_void, n: size_t) -> ssize_t {
    data_call!(received, fd, real::read(fd, b, n), |st| recv_rdma(
        st,
        one_mut(buf_mut(b, n)).as_mut().map(|x| &mut x[..]),
        0
    ))
}

#[inline]
pub unsafe fn readv(fd: c_int, v: *const iovec, cnt: c_int) -> ssize_t {
    data_call!(received, fd, real::readv(fd, v, cnt), |st| recv_rdma(
        st,
        iov_mut(v, cnt),
        0
    ))
}

// Fortified forms: an oversized request goes to libc's own check, which aborts.

#[inline]
pub unsafe fn __read_chk(fd: c_int, b: *mut c_void, n: size_t, buflen: size_t) -> ssize_t {
    data_call!(received, fd, real::__read_chk(fd, b, n, buflen), |st| {
        if n > buflen {
            return real::__read_chk(fd, b, n, buflen);
        }
        recv_rdma(st, one_mut(buf_mut(b, n)).as_mut().map(|x| &mut x[..]), 0)
    })
}

#[inline]
pub unsafe fn __recv_chk(
    fd: c_int,
    b: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
) -> ssize_t {
    data_call!(
        received,
        fd,
        real::__recv_chk(fd, b, n, buflen, flags),
        |st| {
            if n > buflen {
                return real::__recv_chk(fd, b, n, buflen, flags);
            }
            recv_rdma(
                st,
                one_mut(buf_mut(b, n)).as_mut().map(|x| &mut x[..]),
                flags,
            )
        }
    )
}

#[inline]
pub unsafe fn __recvfrom_chk(
    fd: c_int,
    b: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> ssize_t {
    data_call!(
        received,
        fd,
        real::__recvfrom_chk(fd, b, n, buflen, flags, addr, len),
        |st| {
            if n > buflen {
                return real::__recvfrom_chk(fd, b, n, buflen, flags, addr, len);
            }
            if !addr.is_null() && !len.is_null() {
                *len = 0;
            }
            recv_rdma(
                st,
                one_mut(buf_mut(b, n)).as_mut().map(|x| &mut x[..]),
                flags,
            )
        }
    )
}
