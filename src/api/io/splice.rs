//! sendfile and splice: bytes the kernel moves between a file or pipe and a socket without a
//! user buffer. An RDMA stream is not a kernel socket, so for one the shim moves them
//! through a buffer of its own.

use super::{data_call, fail, owned, recv_rdma, send_rdma};
use crate::api::inherit;
use crate::engine::Stream;
use crate::fdtable;
use crate::socket::Socket;
use crate::sys::{fileio, real};
use libc::{c_int, off64_t, off_t, size_t, ssize_t};
use std::io::{IoSlice, IoSliceMut};

#[inline]
pub unsafe fn sendfile(out_fd: c_int, in_fd: c_int, off: *mut off_t, n: size_t) -> ssize_t {
    data_call!(sent, out_fd, real::sendfile(out_fd, in_fd, off, n), |st| {
        sendfile_rdma(st, in_fd, off, n)
    })
}

#[inline]
pub unsafe fn sendfile64(out_fd: c_int, in_fd: c_int, off: *mut off64_t, n: size_t) -> ssize_t {
    data_call!(
        sent,
        out_fd,
        real::sendfile64(out_fd, in_fd, off, n),
        |st| sendfile_rdma(st, in_fd, off, n)
    )
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
            Some(p) => fileio::pread(in_fd, &mut chunk[..want], p),
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
            fileio::lseek(in_fd, -((got - sent) as off_t), libc::SEEK_CUR);
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

/// splice between a pipe and a socket. Kernel TCP: forwarded and counted. An RDMA stream is
/// not a kernel socket, so the bytes go through a buffer: from a stream, peeked, written to
/// the pipe, and consumed only as far as the pipe took them; to a stream, at most what the
/// stream can take without blocking is read from the pipe (all of `len` when blocking).
#[inline]
pub unsafe fn splice(
    fd_in: c_int,
    off_in: *mut off64_t,
    fd_out: c_int,
    off_out: *mut off64_t,
    len: size_t,
    flags: libc::c_uint,
) -> ssize_t {
    if !fdtable::owns(fd_in) && !fdtable::owns(fd_out) {
        return real::splice(fd_in, off_in, fd_out, off_out, len, flags);
    }
    splice_owned(fd_in, off_in, fd_out, off_out, len, flags)
}

#[cold]
#[inline(never)]
unsafe fn splice_owned(
    fd_in: c_int,
    off_in: *mut off64_t,
    fd_out: c_int,
    off_out: *mut off64_t,
    len: size_t,
    flags: libc::c_uint,
) -> ssize_t {
    let (sin, sout) = (fdtable::get(fd_in), fdtable::get(fd_out));
    let (stin, stout) = (
        sin.as_ref().and_then(|s| inherit::stream(s)),
        sout.as_ref().and_then(|s| inherit::stream(s)),
    );
    let r = match (&stin, &stout, crate::guard::enter()) {
        (Some(st), None, Some(_g)) => splice_from_stream(st, fd_out, off_out, len, flags),
        (None, Some(st), Some(_g)) => splice_to_stream(st, fd_in, off_in, len, flags),
        (Some(_), Some(_), _) => fail(libc::EINVAL), // two sockets: the kernel refuses too
        _ => real::splice(fd_in, off_in, fd_out, off_out, len, flags),
    };
    if let Some(s) = &sin {
        s.received(r as isize);
    }
    if let Some(s) = &sout {
        s.sent(r as isize);
    }
    r
}

const SPLICE_CHUNK: usize = 64 * 1024;

unsafe fn splice_from_stream(
    st: &Stream,
    fd_out: c_int,
    off_out: *mut off64_t,
    len: size_t,
    flags: libc::c_uint,
) -> ssize_t {
    let mut chunk = vec![0u8; len.clamp(1, SPLICE_CHUNK)];
    let nb = if flags & libc::SPLICE_F_NONBLOCK != 0 {
        libc::MSG_DONTWAIT
    } else {
        0
    };
    let mut one = [IoSliceMut::new(&mut chunk)];
    let peeked = recv_rdma(st, Some(&mut one), libc::MSG_PEEK | nb);
    if peeked <= 0 {
        return peeked;
    }
    let w = if off_out.is_null() {
        real::write(fd_out, chunk.as_ptr().cast(), peeked as usize)
    } else {
        let w = fileio::pwrite(fd_out, &chunk[..peeked as usize], *off_out);
        if w > 0 {
            *off_out += w as off64_t;
        }
        w
    };
    if w > 0 {
        let mut sink = vec![0u8; w as usize];
        let mut one = [IoSliceMut::new(&mut sink)];
        recv_rdma(st, Some(&mut one), libc::MSG_DONTWAIT); // exactly the bytes peeked above
    }
    w
}

unsafe fn splice_to_stream(
    st: &Stream,
    fd_in: c_int,
    off_in: *mut off64_t,
    len: size_t,
    flags: libc::c_uint,
) -> ssize_t {
    let nonblock = flags & libc::SPLICE_F_NONBLOCK != 0 || st.is_nonblocking();
    let room = if nonblock { st.writable_bytes() } else { len };
    if room == 0 {
        return fail(libc::EAGAIN);
    }
    let mut chunk = vec![0u8; len.min(room).clamp(1, SPLICE_CHUNK)];
    let got = if off_in.is_null() {
        real::read(fd_in, chunk.as_mut_ptr().cast(), chunk.len())
    } else {
        let g = fileio::pread(fd_in, &mut chunk, *off_in);
        if g > 0 {
            *off_in += g as off64_t;
        }
        g
    };
    if got <= 0 {
        return got;
    }
    // Everything read must reach the stream: wait for room even if nonblocking (it was there).
    let bufs = [IoSlice::new(&chunk[..got as usize])];
    send_rdma(st, Some(&bufs), 0)
}
