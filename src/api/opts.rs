//! Socket options, addresses, ioctl, fcntl and shutdown.
//!
//! For an RDMA socket the program's fd is a doorbell, so these are answered by the shim:
//! options live on a kernel TCP socket kept for the purpose (the program's original socket, or
//! a fresh one for an accepted stream), which validates and remembers them exactly as the
//! kernel would; the few that describe the connection (SO_ERROR, TCP_INFO, addresses,
//! FIONREAD) come from the stream. A dual listener answers from its kernel listener.

#![allow(clippy::missing_safety_doc)] // each fn has its libc namesake's contract

use super::ownership::share;
use crate::engine::Stream;
use crate::fdtable;
use crate::socket::{Attachment, Known};
use crate::sys::raw::set_errno;
use crate::sys::real;
use crate::sys::sockaddr as saddr;
use libc::{c_int, c_ulong, c_void, sockaddr, socklen_t};

/// The RDMA attachment of `fd`, if it has one (no lookup cost beyond the table for others).
fn attached(fd: c_int) -> Option<Attachment> {
    if !fdtable::owns(fd) {
        return None;
    }
    super::inherit::here(&*fdtable::get(fd)?)
}

/// As [`attached`], but a stream another process owns is not adopted: for calls that only
/// read its fixed facts (addresses, the options socket), never its state.
fn viewed(fd: c_int) -> Option<Attachment> {
    if !fdtable::owns(fd) {
        return None;
    }
    let s = fdtable::get(fd)?;
    match s.attachment()? {
        // Known only by its name: its facts come with its first use.
        Attachment::Passed(_) => super::inherit::here(&s),
        a => Some(a),
    }
}

/// Where the options of an attached socket live.
fn opts_fd(a: &Attachment) -> c_int {
    match a {
        Attachment::Stream(s) => s.opts_fd,
        Attachment::Listener(l) => l.tcp_fd,
        Attachment::Relayed(r) => r.opts_fd,
        Attachment::Passed(_) => -1, // not used yet: `viewed` and `attached` resolve it
    }
}

#[inline]
pub unsafe fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    if level == libc::SOL_SOCKET && name == libc::SO_ERROR && fdtable::owns(fd) {
        return so_error(fd, val, len);
    }
    let Some(a) = viewed(fd) else {
        return real::getsockopt(fd, level, name, val, len);
    };
    if let Attachment::Stream(s) = &a {
        match (level, name) {
            (libc::SOL_SOCKET, libc::SO_ERROR) => return put_int(val, len, 0),
            (libc::IPPROTO_TCP, libc::TCP_INFO) if s.owner().is_me() => {
                return put_bytes(val, len, &tcp_info(s))
            }
            _ => {}
        }
    }
    real::getsockopt(opts_fd(&a), level, name, val, len)
}

#[inline]
pub unsafe fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    let Some(a) = viewed(fd) else {
        let r = real::setsockopt(fd, level, name, val, len);
        if r == 0 && mirrored(level, name) {
            // Before connect: the stream it becomes must read its options.
            if let Some(s) = fdtable::get(fd) {
                s.forget_known(Known::DEFAULT_OPTS);
            }
        }
        return r;
    };
    let r = real::setsockopt(opts_fd(&a), level, name, val, len);
    // Only the owner's copy is ever locked (a fork child's may have been locked by a
    // parent thread at the fork); a child's option reaches the shared options socket.
    if let (0, Attachment::Stream(s)) = (r, &a) {
        if mirrored(level, name) && s.owner().is_me() {
            let _g = crate::guard::enter();
            s.option_set(level, name);
        }
    }
    r
}

/// The options a stream follows itself (engine/stream/options.rs).
fn mirrored(level: c_int, name: c_int) -> bool {
    match level {
        libc::SOL_SOCKET => matches!(
            name,
            libc::SO_RCVTIMEO | libc::SO_SNDTIMEO | libc::SO_KEEPALIVE | libc::SO_LINGER
        ),
        libc::IPPROTO_TCP => matches!(
            name,
            libc::TCP_KEEPIDLE | libc::TCP_KEEPINTVL | libc::TCP_KEEPCNT | libc::TCP_USER_TIMEOUT
        ),
        _ => false,
    }
}

#[inline]
pub unsafe fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    match viewed(fd) {
        None => real::getsockname(fd, addr, len),
        Some(Attachment::Listener(l)) => real::getsockname(l.tcp_fd, addr, len),
        Some(Attachment::Stream(s)) => put_addr(&s.local, addr, len),
        Some(Attachment::Relayed(r)) => put_addr(&r.local, addr, len),
        Some(Attachment::Passed(_)) => real::getsockname(fd, addr, len),
    }
}

/// SO_ERROR on an owned socket: 0 for an RDMA stream; for kernel TCP the kernel's answer,
/// which also settles a connect in progress (how nonblocking connects are usually checked).
#[cold]
unsafe fn so_error(fd: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int {
    let Some(s) = fdtable::get(fd) else {
        return real::getsockopt(fd, libc::SOL_SOCKET, libc::SO_ERROR, val, len);
    };
    if matches!(
        super::inherit::here(&s),
        Some(Attachment::Stream(_) | Attachment::Relayed(_))
    ) {
        return put_int(val, len, 0);
    }
    let r = real::getsockopt(fd, libc::SOL_SOCKET, libc::SO_ERROR, val, len);
    if r == 0
        && s.state() == crate::socket::SocketState::Connecting
        && !val.is_null()
        && *len as usize >= 4
    {
        let e = crate::sys::raw::errno();
        let err = *(val as *const c_int);
        if err != 0 {
            super::connect::pending_failed(&s, err);
        } else if connected(fd) {
            super::connect::resolve_pending(&s, fd, true);
        }
        set_errno(e);
    }
    r
}

/// Whether a kernel socket has a peer (its connect completed).
unsafe fn connected(fd: c_int) -> bool {
    let mut a = [0u8; 28];
    let mut l = a.len() as socklen_t;
    real::getpeername(fd, a.as_mut_ptr().cast(), &mut l) == 0
}

#[inline]
pub unsafe fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    match viewed(fd) {
        None if fdtable::owns(fd) => {
            let r = real::getpeername(fd, addr, len);
            if r == 0 {
                if let Some(s) = fdtable::get(fd) {
                    super::connect::resolve_pending(&s, fd, true);
                }
            }
            r
        }
        None => real::getpeername(fd, addr, len),
        Some(Attachment::Listener(l)) => real::getpeername(l.tcp_fd, addr, len),
        Some(Attachment::Stream(s)) => put_addr(&s.peer, addr, len),
        Some(Attachment::Relayed(r)) => put_addr(&r.peer, addr, len),
        Some(Attachment::Passed(_)) => real::getpeername(fd, addr, len),
    }
}

#[inline]
pub unsafe fn ioctl(fd: c_int, req: c_ulong, arg: usize) -> c_int {
    let Some(a) = attached(fd) else {
        return real::ioctl(fd, req, arg);
    };
    match (req, &a) {
        // Flags of the program's fd itself (Python's `set_inheritable`), not of the socket.
        (libc::FIOCLEX | libc::FIONCLEX, _) => real::ioctl(fd, req, arg),
        (libc::FIONBIO, _) => {
            let r = real::ioctl(fd, req, arg);
            if r == 0 && arg != 0 {
                set_nonblocking(&a, *(arg as *const c_int) != 0);
            }
            r
        }
        (libc::FIONREAD, Attachment::Stream(s)) => put_plain_int(arg, s.readable_bytes()),
        (libc::TIOCOUTQ, Attachment::Stream(s)) => put_plain_int(arg, s.unsent_bytes()),
        // A relay end is a real stream socket: its queues are the ones the program sees.
        (libc::FIONREAD | libc::TIOCOUTQ, Attachment::Relayed(_)) => real::ioctl(fd, req, arg),
        _ => real::ioctl(opts_fd(&a), req, arg),
    }
}

fn set_nonblocking(a: &Attachment, on: bool) {
    match a {
        Attachment::Stream(s) => s.set_nonblocking(on),
        Attachment::Listener(l) => l.set_nonblocking(on),
        Attachment::Relayed(_) | Attachment::Passed(_) => {} // a file flag of the fd's own file
    }
}

fn fcntl_impl(
    fd: c_int,
    cmd: c_int,
    arg: usize,
    f: unsafe fn(c_int, c_int, usize) -> c_int,
) -> c_int {
    if !fdtable::owns(fd) {
        // SAFETY: forwarding the caller's arguments unchanged.
        return unsafe { f(fd, cmd, arg) };
    }
    let s = fdtable::get(fd);
    // SAFETY: as above.
    let r = unsafe { f(fd, cmd, arg) };
    let Some(s) = s else { return r };
    if r >= 0 && (cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC) {
        share(&s, r);
    } else if r >= 0 && cmd == libc::F_SETFL {
        if let Some(a) = s.attachment() {
            set_nonblocking(&a, arg as c_int & libc::O_NONBLOCK != 0);
        }
        if arg as c_int & libc::O_ASYNC != 0 {
            s.mark_watched(); // SIGIO comes from the doorbell's readiness
        }
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

#[inline]
pub unsafe fn shutdown(fd: c_int, how: c_int) -> c_int {
    match attached(fd) {
        None => real::shutdown(fd, how),
        Some(Attachment::Listener(l)) => real::shutdown(l.tcp_fd, how),
        Some(Attachment::Relayed(_) | Attachment::Passed(_)) => real::shutdown(fd, how), // the owner relays the FIN
        Some(Attachment::Stream(s)) => {
            if !matches!(how, libc::SHUT_RD | libc::SHUT_WR | libc::SHUT_RDWR) {
                set_errno(libc::EINVAL);
                return -1;
            }
            let _g = crate::guard::enter();
            if how != libc::SHUT_WR {
                s.shutdown_read();
            }
            if how != libc::SHUT_RD {
                s.shutdown_write();
            }
            0
        }
    }
}

/// Writes an int option value the way the kernel does (truncating to `*len`).
unsafe fn put_int(val: *mut c_void, len: *mut socklen_t, v: c_int) -> c_int {
    put_bytes(val, len, &v.to_ne_bytes())
}

unsafe fn put_bytes(val: *mut c_void, len: *mut socklen_t, bytes: &[u8]) -> c_int {
    if len.is_null() || (val.is_null() && *len > 0) {
        set_errno(libc::EFAULT);
        return -1;
    }
    let n = (*len as usize).min(bytes.len());
    std::ptr::copy_nonoverlapping(bytes.as_ptr(), val.cast::<u8>(), n);
    *len = n as socklen_t;
    0
}

unsafe fn put_plain_int(arg: usize, v: usize) -> c_int {
    if arg == 0 {
        set_errno(libc::EFAULT);
        return -1;
    }
    *(arg as *mut c_int) = v.min(c_int::MAX as usize) as c_int;
    0
}

unsafe fn put_addr(a: &std::net::SocketAddr, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    if len.is_null() {
        set_errno(libc::EFAULT);
        return -1;
    }
    saddr::write(a, addr, len);
    0
}

/// A plausible `struct tcp_info` (kernel layout, 208 bytes) for an RDMA stream: state
/// ESTABLISHED, MSS and window from the protocol's geometry, bytes from its counters.
/// Fields with no RDMA meaning (retransmits, congestion) are zero.
fn tcp_info(s: &Stream) -> [u8; 208] {
    let c = s.counters();
    let mut b = [0u8; 208];
    let mut put32 = |off: usize, v: u32| b[off..off + 4].copy_from_slice(&v.to_ne_bytes());
    const MSS: u32 = 4096;
    put32(8, 200_000); // tcpi_rto (µs), as the kernel's minimum
    put32(16, MSS); // tcpi_snd_mss
    put32(20, MSS); // tcpi_rcv_mss
    put32(68, 65536); // tcpi_pmtu
    put32(
        72,
        (c.rx_granted_end - c.rx_consumed).min(u32::MAX as u64) as u32,
    ); // rcv_ssthresh
    put32(76, 20); // tcpi_rtt (µs): unknown; a fabric-scale value
    put32(80, 10); // tcpi_rttvar
    put32(84, u32::MAX >> 1); // snd_ssthresh: "infinite"
    put32(
        88,
        ((c.tx_granted_end - c.tx_acked) / MSS as u64)
            .max(1)
            .min(u32::MAX as u64) as u32,
    ); // snd_cwnd
    put32(92, MSS); // tcpi_advmss
    put32(100, 0); // tcpi_total_retrans
    b[0] = 1; // TCP_ESTABLISHED
    let put64 =
        |b: &mut [u8; 208], off: usize, v: u64| b[off..off + 8].copy_from_slice(&v.to_ne_bytes());
    put64(&mut b, 120, c.tx_acked); // tcpi_bytes_acked
    put64(&mut b, 128, c.rx_received_end); // tcpi_bytes_received
    put64(&mut b, 200, c.tx_posted); // tcpi_bytes_sent
    b
}
