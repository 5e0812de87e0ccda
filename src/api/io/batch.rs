//! The batched and flagged forms of the data calls — `sendmmsg`, `recvmmsg`, `preadv2`,
//! `pwritev2` — for an fd the shim owns: made of the calls they batch, as the kernel makes
//! them for a stream socket, so that an RDMA stream serves them (libc's would reach its
//! doorbell). A foreign fd goes straight to libc.

use super::{data_call, fail, iov, iov_mut, owned, recv_rdma, send_rdma};
use crate::engine::Stream;
use crate::fdtable;
use crate::socket::Socket;
use crate::sys::raw::{errno, set_errno};
use crate::sys::real;
use libc::{c_int, c_uint, iovec, mmsghdr, off64_t, off_t, ssize_t, timespec};

#[inline]
pub unsafe fn sendmmsg(fd: c_int, msgs: *mut mmsghdr, vlen: c_uint, flags: c_int) -> c_int {
    if !fdtable::owns(fd) {
        return real::sendmmsg(fd, msgs, vlen, flags);
    }
    each_message(msgs, vlen, None, |m| {
        (super::sendmsg(fd, &m.msg_hdr, flags), false)
    })
}

#[inline]
pub unsafe fn recvmmsg(
    fd: c_int,
    msgs: *mut mmsghdr,
    vlen: c_uint,
    flags: c_int,
    timeout: *mut timespec,
) -> c_int {
    if !fdtable::owns(fd) {
        return real::recvmmsg(fd, msgs, vlen, flags, timeout);
    }
    let deadline = match timeout.as_ref() {
        None => None,
        Some(t) if t.tv_sec < 0 || !(0..1_000_000_000).contains(&t.tv_nsec) => {
            return fail(libc::EINVAL) as c_int
        }
        Some(t) => Some(now_ns() + t.tv_sec as i128 * 1_000_000_000 + t.tv_nsec as i128),
    };
    // MSG_WAITFORONE: only the first message may wait.
    let mut f = flags & !libc::MSG_WAITFORONE;
    let r = each_message(msgs, vlen, deadline, |m| {
        let r = super::recvmsg(fd, &mut m.msg_hdr, f);
        if flags & libc::MSG_WAITFORONE != 0 {
            f |= libc::MSG_DONTWAIT;
        }
        (r, m.msg_hdr.msg_flags & libc::MSG_OOB != 0)
    });
    if let (Some(t), Some(d)) = (timeout.as_mut(), deadline) {
        let left = (d - now_ns()).max(0);
        t.tv_sec = (left / 1_000_000_000) as libc::time_t;
        t.tv_nsec = (left % 1_000_000_000) as libc::c_long;
    }
    r
}

/// The kernel's loop over a message vector (`do_sendmmsg`/`do_recvmmsg`): `one` moves a
/// message and says whether the batch must stop after it; an error ends the batch, and is
/// the result only if no message moved. At most `UIO_MAXIOV` messages; after `deadline`
/// (CLOCK_MONOTONIC ns) no further one is begun.
unsafe fn each_message(
    msgs: *mut mmsghdr,
    vlen: c_uint,
    deadline: Option<i128>,
    mut one: impl FnMut(&mut mmsghdr) -> (ssize_t, bool),
) -> c_int {
    let vlen = vlen.min(libc::UIO_MAXIOV as c_uint) as usize;
    if vlen > 0 && msgs.is_null() {
        return fail(libc::EFAULT) as c_int;
    }
    let saved = errno();
    let mut done = 0;
    while done < vlen {
        let m = &mut *msgs.add(done);
        let (r, stop) = one(m);
        if r < 0 {
            if done == 0 {
                return -1;
            }
            set_errno(saved); // as the kernel: the messages that moved are the result
            break;
        }
        m.msg_len = r as c_uint;
        done += 1;
        if stop || deadline.is_some_and(|d| now_ns() >= d) {
            break;
        }
    }
    done as c_int
}

fn now_ns() -> i128 {
    crate::sys::poll::monotonic_us() as i128 * 1000
}

/// The `RWF_*` flags a socket accepts (Linux 6.1's: HIPRI, DSYNC, SYNC, NOWAIT, APPEND; and
/// NOAPPEND): the message flags they mean for a stream, or the errno a socket answers with.
fn rw_flags(off: i64, flags: c_int) -> Result<c_int, c_int> {
    const KNOWN: c_int = 0x3f;
    if off != -1 {
        return Err(libc::ESPIPE); // a socket has no file position
    }
    if flags & !KNOWN != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    Ok(if flags & libc::RWF_NOWAIT != 0 {
        libc::MSG_DONTWAIT
    } else {
        0
    })
}

/// `preadv2`-shaped: a stream reads as `readv` does, at no position.
unsafe fn read_flagged(
    fd: c_int,
    v: *const iovec,
    cnt: c_int,
    (off, flags): (i64, c_int),
    libc_call: impl FnOnce() -> ssize_t,
) -> ssize_t {
    data_call!(received, fd, libc_call(), |st| match rw_flags(off, flags) {
        Ok(f) => recv_rdma(st, iov_mut(v, cnt), f),
        Err(e) => fail(e),
    })
}

/// `pwritev2`-shaped: a stream writes as `writev` does (SIGPIPE included), at no position.
unsafe fn write_flagged(
    fd: c_int,
    v: *const iovec,
    cnt: c_int,
    (off, flags): (i64, c_int),
    libc_call: impl FnOnce() -> ssize_t,
) -> ssize_t {
    data_call!(sent, fd, libc_call(), |st| match rw_flags(off, flags) {
        Ok(f) => send_rdma(st, iov(v, cnt), f),
        Err(e) => fail(e),
    })
}

#[inline]
pub unsafe fn preadv2(fd: c_int, v: *const iovec, cnt: c_int, off: off_t, flags: c_int) -> ssize_t {
    read_flagged(fd, v, cnt, (off, flags), || {
        real::preadv2(fd, v, cnt, off, flags)
    })
}

#[inline]
pub unsafe fn preadv64v2(
    fd: c_int,
    v: *const iovec,
    cnt: c_int,
    off: off64_t,
    flags: c_int,
) -> ssize_t {
    read_flagged(fd, v, cnt, (off, flags), || {
        real::preadv64v2(fd, v, cnt, off, flags)
    })
}

#[inline]
pub unsafe fn pwritev2(
    fd: c_int,
    v: *const iovec,
    cnt: c_int,
    off: off_t,
    flags: c_int,
) -> ssize_t {
    write_flagged(fd, v, cnt, (off, flags), || {
        real::pwritev2(fd, v, cnt, off, flags)
    })
}

#[inline]
pub unsafe fn pwritev64v2(
    fd: c_int,
    v: *const iovec,
    cnt: c_int,
    off: off64_t,
    flags: c_int,
) -> ssize_t {
    write_flagged(fd, v, cnt, (off, flags), || {
        real::pwritev64v2(fd, v, cnt, off, flags)
    })
}
