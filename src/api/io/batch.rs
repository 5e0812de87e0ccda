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

#[inline]
pub unsafe fn preadv2(fd: c_int, v: *const iovec, cnt: c_int, off: off_t, flags: c_int) -> ssize_t {
    // A stream reads as `readv` does, at no position.
    data_call!(
        received,
        fd,
        real::preadv2(fd, v, cnt, off, flags),
        |st| match rw_flags(off, flags) {
            Ok(f) => recv_rdma(st, iov_mut(v, cnt), f),
            Err(e) => fail(e),
        }
    )
}

#[inline]
pub unsafe fn pwritev2(
    fd: c_int,
    v: *const iovec,
    cnt: c_int,
    off: off_t,
    flags: c_int,
) -> ssize_t {
    // A stream writes as `writev` does (SIGPIPE included), at no position.
    data_call!(
        sent,
        fd,
        real::pwritev2(fd, v, cnt, off, flags),
        |st| match rw_flags(off, flags) {
            Ok(f) => send_rdma(st, iov(v, cnt), f),
            Err(e) => fail(e),
        }
    )
}

/// The name `_FILE_OFFSET_BITS=64` gives `preadv2`: on x86_64 (`off_t` is `off64_t`) glibc
/// makes it the same function.
#[inline]
pub unsafe fn preadv64v2(
    fd: c_int,
    v: *const iovec,
    cnt: c_int,
    off: off64_t,
    flags: c_int,
) -> ssize_t {
    preadv2(fd, v, cnt, off, flags)
}

/// As [`preadv64v2`], for `pwritev2`.
#[inline]
pub unsafe fn pwritev64v2(
    fd: c_int,
    v: *const iovec,
    cnt: c_int,
    off: off64_t,
    flags: c_int,
) -> ssize_t {
    pwritev2(fd, v, cnt, off, flags)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs(n: usize) -> Vec<mmsghdr> {
        // SAFETY: mmsghdr is plain data; all zeros is a valid (empty) value.
        (0..n).map(|_| unsafe { std::mem::zeroed() }).collect()
    }

    #[test]
    fn a_batch_moves_messages_until_one_fails_and_reports_how_many() {
        let mut m = msgs(4);
        let mut calls = 0;
        set_errno(0);
        // SAFETY: a valid vector of 4.
        let n = unsafe {
            each_message(m.as_mut_ptr(), 4, None, |_| {
                calls += 1;
                match calls {
                    1 => (10, false),
                    2 => (20, false),
                    _ => {
                        set_errno(libc::EAGAIN);
                        (-1, false)
                    }
                }
            })
        };
        assert_eq!(n, 2);
        assert_eq!((m[0].msg_len, m[1].msg_len, m[2].msg_len), (10, 20, 0));
        assert_eq!(calls, 3, "the failed message ends the batch");
        assert_eq!(errno(), 0, "its errno is not the batch's");
    }

    #[test]
    fn a_batch_whose_first_message_fails_is_that_failure() {
        let mut m = msgs(2);
        // SAFETY: a valid vector of 2.
        let n = unsafe {
            each_message(m.as_mut_ptr(), 2, None, |_| {
                set_errno(libc::ECONNRESET);
                (-1, false)
            })
        };
        assert_eq!((n, errno()), (-1, libc::ECONNRESET));
    }

    #[test]
    fn a_batch_stops_after_a_message_that_says_so_or_past_its_deadline() {
        let mut m = msgs(3);
        // SAFETY: valid vectors of 3.
        let stopped = unsafe { each_message(m.as_mut_ptr(), 3, None, |_| (1, true)) };
        assert_eq!(stopped, 1);
        let past = Some(now_ns() - 1);
        let late = unsafe { each_message(m.as_mut_ptr(), 3, past, |_| (1, false)) };
        assert_eq!(late, 1, "the first message is always tried");
    }

    #[test]
    fn a_null_vector_is_efault_and_an_empty_one_moves_nothing() {
        // SAFETY: null with a length is refused before any access; 0 messages touch nothing.
        unsafe {
            assert_eq!(
                each_message(std::ptr::null_mut(), 1, None, |_| (1, false)),
                -1
            );
            assert_eq!(errno(), libc::EFAULT);
            assert_eq!(
                each_message(std::ptr::null_mut(), 0, None, |_| (1, false)),
                0
            );
        }
    }

    #[test]
    fn rwf_flags_map_as_a_socket_takes_them() {
        assert_eq!(rw_flags(-1, 0), Ok(0));
        assert_eq!(rw_flags(-1, libc::RWF_NOWAIT), Ok(libc::MSG_DONTWAIT));
        assert_eq!(rw_flags(-1, libc::RWF_HIPRI | libc::RWF_DSYNC), Ok(0));
        assert_eq!(rw_flags(0, 0), Err(libc::ESPIPE));
        assert_eq!(rw_flags(4096, libc::RWF_NOWAIT), Err(libc::ESPIPE));
        assert_eq!(rw_flags(-1, 0x100), Err(libc::EOPNOTSUPP));
    }
}
