//! AF_UNIX calls for talking between processes of one program tree: abstract `SOCK_SEQPACKET`
//! sockets (one message per request or reply, no file on disk) that can carry an fd
//! (`SCM_RIGHTS`), and peer credentials. Every call goes to the real libc function.

use super::raw::{errno, hide};
use super::real;
use libc::{c_int, c_void, sockaddr, socklen_t};
use std::io;
use std::time::Duration;

fn last() -> io::Error {
    io::Error::from_raw_os_error(errno())
}

/// `sockaddr_un` for the abstract name `name` (no leading NUL; it is added).
fn abstract_addr(name: &[u8]) -> (libc::sockaddr_un, socklen_t) {
    // SAFETY: sockaddr_un is plain data; all-zero is valid.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let n = name.len().min(a.sun_path.len() - 1);
    for (d, s) in a.sun_path[1..=n].iter_mut().zip(name) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + n;
    (a, len as socklen_t)
}

fn seqpacket(flags: c_int) -> io::Result<c_int> {
    // SAFETY: plain socket(2).
    let fd = unsafe {
        real::socket(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | flags,
            0,
        )
    };
    if fd < 0 {
        return Err(last());
    }
    Ok(hide(fd))
}

/// A nonblocking listening socket at the abstract `name`.
pub fn listen_abstract(name: &[u8]) -> io::Result<c_int> {
    let fd = seqpacket(libc::SOCK_NONBLOCK)?;
    let (a, len) = abstract_addr(name);
    // SAFETY: a is a valid sockaddr_un of len bytes; fd is ours.
    let ok = unsafe {
        real::bind(fd, (&a as *const libc::sockaddr_un).cast::<sockaddr>(), len) == 0
            && real::listen(fd, 64) == 0
    };
    if !ok {
        let e = last();
        super::raw::close(fd);
        return Err(e);
    }
    Ok(fd)
}

/// Binds the unbound TCP socket `fd` to `ip` and an ephemeral port the kernel picks (an
/// IPv4 address as IPv4-mapped on an IPv6 socket): the port, reserved while `fd` stays
/// open. `None` if it cannot be bound.
pub fn bind_ephemeral(fd: c_int, ip: std::net::IpAddr) -> Option<u16> {
    use std::net::{IpAddr, SocketAddr};
    let try_bind = |ip: IpAddr| {
        let (a, len) = super::sockaddr::encode(&SocketAddr::new(ip, 0));
        // SAFETY: a holds a sockaddr of len bytes.
        unsafe { real::bind(fd, a.as_ptr().cast::<sockaddr>(), len) == 0 }
    };
    let bound =
        try_bind(ip) || matches!(ip, IpAddr::V4(v4) if try_bind(IpAddr::V6(v4.to_ipv6_mapped())));
    if !bound {
        return None;
    }
    super::sockaddr::local_of(fd).map(|s| s.port())
}

/// Names the (unnamed) socket `fd` with the abstract `name`.
pub fn bind_abstract(fd: c_int, name: &[u8]) -> io::Result<()> {
    let (a, len) = abstract_addr(name);
    // SAFETY: a is a valid sockaddr_un of len bytes.
    if unsafe { real::bind(fd, (&a as *const libc::sockaddr_un).cast::<sockaddr>(), len) } != 0 {
        return Err(last());
    }
    Ok(())
}

/// The abstract name `fd` is bound to (without the leading NUL), if it is an `AF_UNIX`
/// socket with one.
pub fn abstract_name(fd: c_int) -> Option<Vec<u8>> {
    // SAFETY: sockaddr_un is plain data; getsockname fills at most len bytes.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_un>() as socklen_t;
    // SAFETY: valid out-pointers.
    let r = unsafe { real::getsockname(fd, (&mut a as *mut libc::sockaddr_un).cast(), &mut len) };
    let path_len = (len as usize).checked_sub(std::mem::size_of::<libc::sa_family_t>())?;
    if r != 0
        || a.sun_family != libc::AF_UNIX as libc::sa_family_t
        || path_len < 2
        || a.sun_path[0] != 0
    {
        return None;
    }
    Some(
        a.sun_path[1..path_len.min(a.sun_path.len())]
            .iter()
            .map(|&c| c as u8)
            .collect(),
    )
}

/// A socket connected to the abstract `name`; connecting (a full backlog waits) and each
/// receive time out after `timeout`.
pub fn connect_abstract(name: &[u8], timeout: Duration) -> io::Result<c_int> {
    let fd = seqpacket(0)?;
    let (a, len) = abstract_addr(name);
    let tv = libc::timeval {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_usec: timeout.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: valid sockaddr and option buffers; fd is ours.
    let ok = unsafe {
        for opt in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
            real::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as socklen_t,
            );
        }
        real::connect(fd, (&a as *const libc::sockaddr_un).cast::<sockaddr>(), len) == 0
    };
    if !ok {
        let e = last();
        super::raw::close(fd);
        return Err(e);
    }
    Ok(fd)
}

/// The next connection queued on a listening socket (nonblocking, close-on-exec), or `None`.
pub fn accept_nonblocking(fd: c_int) -> Option<c_int> {
    // SAFETY: accept4 on our listening socket; no address wanted.
    let c = unsafe {
        real::accept4(
            fd,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
        )
    };
    (c >= 0).then(|| hide(c))
}

/// The credentials of the process at the other end of `fd` (for a connection to a
/// listening socket: the process that listened).
pub fn peer_cred(fd: c_int) -> Option<libc::ucred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as socklen_t;
    // SAFETY: valid out-buffer of len bytes.
    let r = unsafe {
        real::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(cred)
}

/// Space for exactly one fd in a control message: a sender of more gets `MSG_CTRUNC`, and
/// the kernel installs none of the rest.
#[repr(C)]
union Cmsg {
    hdr: libc::cmsghdr,
    buf: [u8; 24],
}

/// Sends one message without waiting, with `pass` attached as `SCM_RIGHTS` if given.
pub fn send(fd: c_int, bytes: &[u8], pass: Option<c_int>) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: msghdr and the control buffer are plain data; all-zero is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    let mut cm: Cmsg = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(p) = pass {
        // SAFETY: the control buffer is CMSG_SPACE(4) (24 on x86_64) bytes, room for one
        // cmsghdr + one int; the CMSG macros compute offsets inside it.
        unsafe {
            msg.msg_control = (&mut cm as *mut Cmsg).cast();
            msg.msg_controllen = libc::CMSG_SPACE(4) as usize;
            let h = libc::CMSG_FIRSTHDR(&msg);
            (*h).cmsg_level = libc::SOL_SOCKET;
            (*h).cmsg_type = libc::SCM_RIGHTS;
            (*h).cmsg_len = libc::CMSG_LEN(4) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(h).cast::<c_int>(), p);
        }
    }
    // SAFETY: msg points at valid buffers for the call. A fresh connection always has room
    // for one small message: never waiting is never a loss.
    if unsafe { real::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) } < 0 {
        return Err(last());
    }
    Ok(())
}

/// One received message: its length, the fd it carried (installed close-on-exec), and
/// whether it did not fit (`MSG_TRUNC` or `MSG_CTRUNC`: any fd that came is closed then).
#[derive(Debug)]
pub struct Got {
    pub len: usize,
    pub fd: Option<c_int>,
    pub truncated: bool,
}

/// Receives one message into `buf` (blocking, bounded by the socket's receive timeout).
/// A message that did not fit is an error (`EMSGSIZE`), its fds closed.
pub fn recv_one(fd: c_int, buf: &mut [u8]) -> io::Result<Got> {
    match recv_msg(fd, buf, 0)? {
        g if g.truncated => Err(io::Error::from_raw_os_error(libc::EMSGSIZE)),
        g => Ok(g),
    }
}

/// As [`recv_one`] without waiting (`EAGAIN`: nothing there yet), reporting truncation in
/// [`Got::truncated`]. End of stream (a caller that hung up) is `ECONNRESET`.
pub fn recv_one_nonblocking(fd: c_int, buf: &mut [u8]) -> io::Result<Got> {
    recv_msg(fd, buf, libc::MSG_DONTWAIT)
}

fn recv_msg(fd: c_int, buf: &mut [u8], flags: c_int) -> io::Result<Got> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: as in `send`.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    let mut cm: Cmsg = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = (&mut cm as *mut Cmsg).cast();
    msg.msg_controllen = std::mem::size_of::<Cmsg>();
    // SAFETY: msg points at valid buffers.
    let n = unsafe { real::recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC | flags) };
    if n < 0 {
        return Err(last());
    }
    // SAFETY: the control data the kernel wrote into our buffer.
    let fds: Vec<c_int> = unsafe { super::cmsg::rights(&msg) }.collect();
    // One message carries at most one fd: more is as bad as a truncated one.
    let truncated = msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 || fds.len() > 1;
    let got = match (truncated, fds.as_slice()) {
        (false, &[fd]) => Some(fd),
        _ => {
            fds.iter().for_each(|&f| super::raw::close(f));
            None
        }
    };
    if n == 0 && got.is_none() && !truncated {
        return Err(io::Error::from_raw_os_error(libc::ECONNRESET));
    }
    Ok(Got {
        len: n as usize,
        fd: got,
        truncated,
    })
}

/// An int `SOL_SOCKET` option of `fd`, if it is a socket.
fn socket_int(fd: c_int, opt: c_int) -> Option<c_int> {
    let mut v: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as socklen_t;
    // SAFETY: a valid int out-buffer.
    let r = unsafe {
        real::getsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&mut v as *mut c_int).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(v)
}

/// The address family and socket type of `fd`, if it is a socket.
pub fn socket_kind(fd: c_int) -> Option<(c_int, c_int)> {
    Some((
        socket_int(fd, libc::SO_DOMAIN)?,
        socket_int(fd, libc::SO_TYPE)?,
    ))
}

/// Whether the socket `fd` is listening (`SO_ACCEPTCONN`).
pub fn is_listening(fd: c_int) -> bool {
    socket_int(fd, libc::SO_ACCEPTCONN).is_some_and(|v| v != 0)
}

/// A file's (device, inode).
pub type Identity = (u64, u64);

/// Which file `fd` is: (device, inode). Two fds with the same identity are the same open
/// socket (socket inodes are unique while the socket lives).
pub fn file_identity(fd: c_int) -> Option<Identity> {
    // SAFETY: stat is plain data; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-pointer.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

/// Whether `fd` is a regular file (a memfd is one).
pub fn is_regular_file(fd: c_int) -> bool {
    // SAFETY: as in `file_identity`.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-pointer.
    unsafe { libc::fstat(fd, &mut st) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFREG }
}

/// Waits up to `ms` for `fd` to report any of `events`; the reported events (0 on timeout).
pub fn wait(fd: c_int, events: libc::c_short, ms: c_int) -> libc::c_short {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let r = unsafe { real::poll(&mut p, 1, ms) };
    if r > 0 {
        p.revents
    } else {
        0
    }
}

/// A connected `AF_UNIX` stream pair `(a, b)`, both close-on-exec, `b` nonblocking.
pub fn stream_pair() -> io::Result<(c_int, c_int)> {
    let mut sv = [-1; 2];
    // SAFETY: sv is a valid out-array of two ints.
    if unsafe {
        real::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            sv.as_mut_ptr(),
        )
    } != 0
    {
        return Err(last());
    }
    let b = hide(sv[1]);
    super::fcntl::set_only_nonblock(b);
    Ok((sv[0], b))
}

/// An anonymous memory file (close-on-exec, out of the program's fd range) holding `bytes`,
/// to pass a large blob to another process with `SCM_RIGHTS`.
pub fn memfd_with(bytes: &[u8]) -> io::Result<c_int> {
    // SAFETY: a NUL-terminated name; plain memfd_create(2).
    let fd = unsafe { libc::memfd_create(c"rsock-state".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(last());
    }
    let fd = hide(fd);
    if !super::raw::write_all(fd, bytes) {
        super::raw::close(fd);
        return Err(io::Error::from_raw_os_error(libc::ENOSPC));
    }
    Ok(fd)
}

/// Everything in the file `fd` from offset 0 (a [`memfd_with`] blob); a file of more than
/// `most` bytes is an error (`EFBIG`).
pub fn read_file(fd: c_int, most: usize) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        // SAFETY: a valid buffer; pread(2) on the caller's fd.
        let n = unsafe {
            libc::pread(
                fd,
                buf.as_mut_ptr().cast(),
                buf.len(),
                out.len() as libc::off_t,
            )
        };
        match n {
            0 => return Ok(out),
            n if n > 0 && out.len() + n as usize > most => {
                return Err(io::Error::from_raw_os_error(libc::EFBIG))
            }
            n if n > 0 => out.extend_from_slice(&buf[..n as usize]),
            _ if errno() == libc::EINTR => {}
            _ => return Err(last()),
        }
    }
}

/// A 64-bit unpredictable number (a connection id, a name): see the body.
pub fn random_u64() -> u64 {
    use std::hash::BuildHasher;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    // A keyed hash (SipHash, a PRF) of a counter and the pid under a key drawn once: as
    // unpredictable as a draw without a syscall per value; the pid keeps a fork child's
    // values apart from its parent's.
    static KEY: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let n = COUNT.fetch_add(1, Relaxed);
    KEY.get_or_init(Default::default)
        .hash_one((super::raw::pid(), n))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn request_reply_carries_an_fd_between_sockets() {
        let name = format!("rsock-test.{}.{}", std::process::id(), random_u64());
        let l = listen_abstract(name.as_bytes()).unwrap();
        let c = connect_abstract(name.as_bytes(), Duration::from_secs(2)).unwrap();
        assert_ne!(wait(l, libc::POLLIN, 2000) & libc::POLLIN, 0);
        let s = accept_nonblocking(l).unwrap();
        let cred = peer_cred(c).unwrap();
        assert_eq!(cred.uid, unsafe { libc::geteuid() });
        assert_eq!(cred.pid, std::process::id() as i32);
        let (a, b) = stream_pair().unwrap();
        send(s, b"hello", Some(a)).unwrap();
        let mut buf = [0u8; 16];
        let g = recv_one(c, &mut buf).unwrap();
        assert_eq!(&buf[..g.len], b"hello");
        let got = g.fd.expect("an fd");
        assert_eq!(socket_kind(got), Some((libc::AF_UNIX, libc::SOCK_STREAM)));
        assert_eq!(file_identity(got), file_identity(a));
        assert_ne!(file_identity(got), file_identity(b));
        assert_ne!(
            unsafe { libc::fcntl(got, libc::F_GETFD) } & libc::FD_CLOEXEC,
            0
        );
        // The received fd is the same socket: bytes written to it come out of b.
        assert_eq!(unsafe { libc::write(got, b"x".as_ptr().cast(), 1) }, 1);
        assert_ne!(wait(b, libc::POLLIN, 2000) & libc::POLLIN, 0);
        for fd in [l, c, s, a, b, got] {
            super::super::raw::close(fd);
        }
    }

    #[test]
    fn more_fds_than_room_for_one_is_truncated_and_none_are_installed() {
        let (x, y) = stream_pair().unwrap();
        let (p, q) = stream_pair().unwrap();
        // Two fds in one SCM_RIGHTS message, sent by hand.
        let fds = [p, q];
        let mut iov = libc::iovec {
            iov_base: b"req".as_ptr() as *mut c_void,
            iov_len: 3,
        };
        let mut cbuf = [0u64; 8];
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(8) } as usize;
        unsafe {
            let h = libc::CMSG_FIRSTHDR(&msg);
            (*h).cmsg_level = libc::SOL_SOCKET;
            (*h).cmsg_type = libc::SCM_RIGHTS;
            (*h).cmsg_len = libc::CMSG_LEN(8) as usize;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(h).cast(), 2);
            assert_eq!(libc::sendmsg(x, &msg, 0), 3);
        }
        let mut buf = [0u8; 8];
        let g = recv_one_nonblocking(y, &mut buf).unwrap();
        assert!(g.truncated && g.fd.is_none());
        for sent in [p, q] {
            assert_eq!(copies_of(sent), 1, "no received copy stays open");
        }
        for fd in [x, y, p, q] {
            super::super::raw::close(fd);
        }
    }

    /// How many fds of this process are the file `fd` is.
    pub(crate) fn copies_of(fd: c_int) -> usize {
        let id = file_identity(fd);
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<c_int>().ok())
            .filter(|&n| file_identity(n) == id)
            .count()
    }

    #[test]
    fn connecting_to_a_missing_name_fails_at_once() {
        let e = connect_abstract(b"rsock-test.nobody-listens-here", Duration::from_secs(1))
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ECONNREFUSED));
    }
}
