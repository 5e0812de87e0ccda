//! Data calls: read/write, the send/recv family, their vectored and fortified forms, and
//! sendfile.
//!
//! A foreign fd costs `fdtable::owns` and a jump to libc. An owned fd on kernel TCP forwards
//! and counts bytes; an owned fd on RDMA is served by its stream.

#![allow(clippy::missing_safety_doc)] // each fn has its libc namesake's contract

use crate::engine::{self, Stream};
use crate::fdtable;
use crate::guard;
use crate::socket::Socket;
use crate::sys::raw::set_errno;
use crate::sys::real;
use libc::{c_int, c_void, iovec, msghdr, off64_t, off_t, size_t, sockaddr, socklen_t, ssize_t};
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

#[cold]
#[inline(never)]
fn owned(
    fd: c_int,
    count: fn(&Socket, isize),
    call: impl FnOnce() -> ssize_t,
    rdma: impl FnOnce(&Stream) -> ssize_t,
) -> ssize_t {
    let Some(s) = fdtable::get(fd) else { return call() };
    let r = match s.stream() {
        Some(st) => match guard::enter() {
            Some(_g) => rdma(&st),
            None => call(),
        },
        None => call(),
    };
    count(&s, r);
    r
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
        c if c < 0 || c > libc::UIO_MAXIOV || iov.is_null() => None,
        c => Some(std::slice::from_raw_parts_mut(iov as *mut IoSliceMut<'a>, c as usize)),
    }
}

unsafe fn iov<'a>(iov: *const iovec, cnt: c_int) -> Option<&'a [IoSlice<'a>]> {
    match cnt {
        0 => Some(&[]),
        c if c < 0 || c > libc::UIO_MAXIOV || iov.is_null() => None,
        c => Some(std::slice::from_raw_parts(iov as *const IoSlice<'a>, c as usize)),
    }
}

fn fail(e: c_int) -> ssize_t {
    set_errno(e);
    -1
}

/// Reads from the stream into `bufs`.
fn recv_rdma(st: &Stream, bufs: Option<&mut [IoSliceMut<'_>]>, flags: c_int) -> ssize_t {
    let Some(bufs) = bufs else { return fail(libc::EFAULT) };
    let Some(engine) = engine::get() else { return fail(libc::ECONNRESET) };
    match st.recv(engine, bufs, flags, st.rcv_timeout()) {
        Ok(n) => n as ssize_t,
        Err(e) => fail(e),
    }
}

/// Writes `bufs` to the stream; EPIPE raises SIGPIPE unless MSG_NOSIGNAL, like the kernel.
fn send_rdma(st: &Stream, bufs: Option<&[IoSlice<'_>]>, flags: c_int) -> ssize_t {
    let Some(bufs) = bufs else { return fail(libc::EFAULT) };
    let Some(engine) = engine::get() else { return fail(libc::EPIPE) };
    match st.send(engine, bufs, flags, st.snd_timeout()) {
        Ok(n) => n as ssize_t,
        Err(e) => {
            if e == libc::EPIPE && flags & libc::MSG_NOSIGNAL == 0 {
                // SAFETY: raising a signal in the calling thread, as the kernel would.
                unsafe { libc::raise(libc::SIGPIPE) };
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
    data_call!(sent, fd, real::send(fd, b, n, flags), |st| send_rdma(st, one(buf(b, n)).as_ref().map(|x| &x[..]), flags))
}

#[inline]
pub unsafe fn sendto(fd: c_int, b: *const c_void, n: size_t, flags: c_int, addr: *const sockaddr, len: socklen_t) -> ssize_t {
    // A connected stream ignores the address, as TCP does.
    data_call!(sent, fd, real::sendto(fd, b, n, flags, addr, len), |st| send_rdma(
        st,
        one(buf(b, n)).as_ref().map(|x| &x[..]),
        flags
    ))
}

#[inline]
pub unsafe fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    data_call!(sent, fd, real::sendmsg(fd, msg, flags), |st| {
        if msg.is_null() {
            return fail(libc::EFAULT);
        }
        send_rdma(st, iov((*msg).msg_iov, (*msg).msg_iovlen as c_int), flags)
    })
}

#[inline]
pub unsafe fn write(fd: c_int, b: *const c_void, n: size_t) -> ssize_t {
    data_call!(sent, fd, real::write(fd, b, n), |st| send_rdma(st, one(buf(b, n)).as_ref().map(|x| &x[..]), 0))
}

#[inline]
pub unsafe fn writev(fd: c_int, v: *const iovec, cnt: c_int) -> ssize_t {
    data_call!(sent, fd, real::writev(fd, v, cnt), |st| send_rdma(st, iov(v, cnt), 0))
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
pub unsafe fn recvfrom(fd: c_int, b: *mut c_void, n: size_t, flags: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> ssize_t {
    data_call!(received, fd, real::recvfrom(fd, b, n, flags, addr, len), |st| {
        if !addr.is_null() && !len.is_null() {
            *len = 0; // a stream socket reports no source address
        }
        recv_rdma(st, one_mut(buf_mut(b, n)).as_mut().map(|x| &mut x[..]), flags)
    })
}

#[inline]
pub unsafe fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
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
    data_call!(received, fd, real::read(fd, b, n), |st| recv_rdma(st, one_mut(buf_mut(b, n)).as_mut().map(|x| &mut x[..]), 0))
}

#[inline]
pub unsafe fn readv(fd: c_int, v: *const iovec, cnt: c_int) -> ssize_t {
    data_call!(received, fd, real::readv(fd, v, cnt), |st| recv_rdma(st, iov_mut(v, cnt), 0))
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
pub unsafe fn __recv_chk(fd: c_int, b: *mut c_void, n: size_t, buflen: size_t, flags: c_int) -> ssize_t {
    data_call!(received, fd, real::__recv_chk(fd, b, n, buflen, flags), |st| {
        if n > buflen {
            return real::__recv_chk(fd, b, n, buflen, flags);
        }
        recv_rdma(st, one_mut(buf_mut(b, n)).as_mut().map(|x| &mut x[..]), flags)
    })
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
    data_call!(received, fd, real::__recvfrom_chk(fd, b, n, buflen, flags, addr, len), |st| {
        if n > buflen {
            return real::__recvfrom_chk(fd, b, n, buflen, flags, addr, len);
        }
        if !addr.is_null() && !len.is_null() {
            *len = 0;
        }
        recv_rdma(st, one_mut(buf_mut(b, n)).as_mut().map(|x| &mut x[..]), flags)
    })
}

#[inline]
pub unsafe fn sendfile(out_fd: c_int, in_fd: c_int, off: *mut off_t, n: size_t) -> ssize_t {
    data_call!(sent, out_fd, real::sendfile(out_fd, in_fd, off, n), |st| sendfile_rdma(st, in_fd, off, n))
}

#[inline]
pub unsafe fn sendfile64(out_fd: c_int, in_fd: c_int, off: *mut off64_t, n: size_t) -> ssize_t {
    data_call!(sent, out_fd, real::sendfile64(out_fd, in_fd, off, n), |st| sendfile_rdma(st, in_fd, off, n))
}

/// sendfile into a stream: read the file in chunks and send them. Bytes read but not sent
/// (a nonblocking stream filled up) are given back to the file: its offset, or `*off`, ends
/// exactly after what was sent.
unsafe fn sendfile_rdma(st: &Stream, in_fd: c_int, off: *mut off_t, n: size_t) -> ssize_t {
    let mut chunk = vec![0u8; n.clamp(1, 256 * 1024)];
    let mut pos = if off.is_null() { None } else { Some(*off) };
    let mut total: usize = 0;
    while total < n {
        let want = chunk.len().min(n - total);
        let got = match pos {
            Some(p) => libc::pread(in_fd, chunk.as_mut_ptr().cast(), want, p),
            None => real::read(in_fd, chunk.as_mut_ptr().cast(), want),
        };
        if got <= 0 {
            if got < 0 && total == 0 {
                return -1;
            }
            break;
        }
        let got = got as usize;
        let bufs = [IoSlice::new(&chunk[..got])];
        let sent = send_rdma(st, Some(&bufs), 0);
        let sent = if sent < 0 { 0 } else { sent as usize };
        if sent < got && pos.is_none() {
            libc::lseek(in_fd, -((got - sent) as off_t), libc::SEEK_CUR);
        }
        total += sent;
        if let Some(p) = pos.as_mut() {
            *p += sent as off_t;
        }
        if sent < got {
            if total == 0 {
                return -1; // errno from send_rdma (EAGAIN, EPIPE, ...)
            }
            break;
        }
    }
    if let Some(p) = pos {
        *off = p;
    }
    total as ssize_t
}
