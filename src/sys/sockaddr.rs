//! Conversions between `SocketAddr` and the C socket address structures.

use libc::{sockaddr, sockaddr_in, sockaddr_in6, socklen_t};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// Reads an AF_INET/AF_INET6 address; `None` for other families or a short buffer.
///
/// # Safety
/// `addr` must point to `len` readable bytes (or be null).
pub unsafe fn read(addr: *const sockaddr, len: socklen_t) -> Option<SocketAddr> {
    if addr.is_null() || (len as usize) < 2 {
        return None;
    }
    match (*addr).sa_family as i32 {
        libc::AF_INET if len as usize >= std::mem::size_of::<sockaddr_in>() => {
            let a = &*(addr as *const sockaddr_in);
            let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 if len as usize >= std::mem::size_of::<sockaddr_in6>() => {
            let a = &*(addr as *const sockaddr_in6);
            let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// The C form of `a`, as raw bytes (for the stats region) and length.
pub fn encode(a: &SocketAddr) -> ([u8; 28], socklen_t) {
    let mut out = [0u8; 28];
    let len = match a {
        SocketAddr::V4(v4) => {
            // SAFETY: all-zero is a valid sockaddr_in.
            let mut s: sockaddr_in = unsafe { std::mem::zeroed() };
            s.sin_family = libc::AF_INET as libc::sa_family_t;
            s.sin_port = v4.port().to_be();
            s.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            let n = std::mem::size_of::<sockaddr_in>();
            // SAFETY: copying n bytes of a plain struct into a 28-byte buffer (n = 16).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (&s as *const sockaddr_in).cast::<u8>(),
                    out.as_mut_ptr(),
                    n,
                )
            };
            n
        }
        SocketAddr::V6(v6) => {
            // SAFETY: all-zero is a valid sockaddr_in6.
            let mut s: sockaddr_in6 = unsafe { std::mem::zeroed() };
            s.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            s.sin6_port = v6.port().to_be();
            s.sin6_addr.s6_addr = v6.ip().octets();
            s.sin6_flowinfo = v6.flowinfo();
            s.sin6_scope_id = v6.scope_id();
            let n = std::mem::size_of::<sockaddr_in6>();
            // SAFETY: n = 28 bytes into a 28-byte buffer.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (&s as *const sockaddr_in6).cast::<u8>(),
                    out.as_mut_ptr(),
                    n,
                )
            };
            n
        }
    };
    (out, len as socklen_t)
}

/// Writes `a` to a caller's `(addr, len)` out-parameters the way the kernel does: copies at
/// most `*len` bytes and stores the full length in `*len`. Null pointers are skipped.
///
/// # Safety
/// `addr` must be writable for `*len` bytes, `len` valid (or null).
pub unsafe fn write(a: &SocketAddr, addr: *mut sockaddr, len: *mut socklen_t) {
    if len.is_null() {
        return;
    }
    let (bytes, n) = encode(a);
    if !addr.is_null() {
        let copy = (*len).min(n) as usize;
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr.cast::<u8>(), copy);
    }
    *len = n;
}

/// An unspecified address of `a`'s family with port 0.
pub fn unspecified_like(a: &SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V4(_) => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
        SocketAddr::V6(_) => SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0),
    }
}

/// The local address of socket `fd`, if it is an IP socket.
pub fn local_of(fd: libc::c_int) -> Option<SocketAddr> {
    name_of(fd, super::real::getsockname)
}

/// The peer address of socket `fd`, if it is a connected IP socket.
pub fn peer_of(fd: libc::c_int) -> Option<SocketAddr> {
    name_of(fd, super::real::getpeername)
}

/// The family of socket `fd` as (AF_INET6, `IPV6_V6ONLY`); `None` if it is neither an
/// AF_INET nor an AF_INET6 socket (or not a socket).
pub fn family_of(fd: libc::c_int) -> Option<(bool, bool)> {
    let int_opt = |level, name| super::sockopt::get(fd, level, name, 0 as libc::c_int);
    match int_opt(libc::SOL_SOCKET, libc::SO_DOMAIN)? {
        libc::AF_INET => Some((false, false)),
        libc::AF_INET6 => Some((true, int_opt(libc::IPPROTO_IPV6, libc::IPV6_V6ONLY)? != 0)),
        _ => None,
    }
}

fn name_of(
    fd: libc::c_int,
    f: unsafe fn(libc::c_int, *mut sockaddr, *mut socklen_t) -> libc::c_int,
) -> Option<SocketAddr> {
    let mut a = [0u8; 28];
    let mut len = a.len() as socklen_t;
    // SAFETY: a is a valid buffer of len bytes; the kernel writes at most len.
    unsafe {
        (f(fd, a.as_mut_ptr().cast(), &mut len) == 0)
            .then(|| read(a.as_ptr().cast(), len))
            .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_v4_and_v6() {
        for s in ["10.77.0.1:5201", "[fe80::1%3]:80", "[::ffff:1.2.3.4]:9"] {
            let a: SocketAddr = s.parse().unwrap();
            let (bytes, n) = encode(&a);
            // SAFETY: bytes holds n valid bytes.
            let b = unsafe { read(bytes.as_ptr().cast(), n) }.unwrap();
            assert_eq!(a, b);
            assert_eq!(crate::stats::read::decode_addr(&bytes), Some(a));
        }
    }

    #[test]
    fn short_or_foreign_is_none() {
        let a: SocketAddr = "1.2.3.4:5".parse().unwrap();
        let (bytes, _) = encode(&a);
        // SAFETY: buffers valid for the lengths given.
        unsafe {
            assert!(read(bytes.as_ptr().cast(), 8).is_none());
            assert!(read(std::ptr::null(), 16).is_none());
            let unix = [1u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
            assert!(read(unix.as_ptr().cast(), 16).is_none());
        }
    }

    #[test]
    fn write_truncates_like_the_kernel() {
        let a: SocketAddr = "[::1]:7".parse().unwrap();
        let mut buf = [0xaau8; 8];
        let mut len: socklen_t = 8;
        // SAFETY: buf has len bytes.
        unsafe { write(&a, buf.as_mut_ptr().cast(), &mut len) };
        assert_eq!(len, 28);
        assert_eq!(u16::from_ne_bytes([buf[0], buf[1]]) as i32, libc::AF_INET6);
    }
}
