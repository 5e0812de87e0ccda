//! Dual-stack addresses: what rdma_cm is given, and what the program gets back.
//!
//! An AF_INET6 socket reaches IPv4 peers through IPv4-mapped addresses (`::ffff:a.b.c.d`):
//! the JVM does it for every socket, nginx with `ipv6only=off`, Python with
//! `dualstack_ipv6=True`, any server bound to `::` while `IPV6_V6ONLY` is off. rdma_cm only
//! binds and resolves addresses configured on a netdev, and a mapped address is not one, so
//! it is given the plain IPv4 form ([`v4_of`]). Going back, the kernel reports an IPv4 peer
//! on an AF_INET6 socket in the mapped form (sockaddr_in6, flowinfo and scope 0): the shim
//! does the same ([`seen`]), or a program that checks the family of its peer's address (or
//! copies it into a 28-byte buffer it then parses as sockaddr_in6) goes wrong.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV6};

/// `a` with an IPv4-mapped IPv6 address replaced by its IPv4 form (the form rdma_cm, the
/// rules and the negative cache use); other addresses unchanged.
pub fn v4_of(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), v6.port()),
            None => a,
        },
        v4 => v4,
    }
}

/// `a` as the kernel reports it on a socket of the given family: on an AF_INET6 socket an
/// IPv4 address comes back mapped, and no address carries a flow label (the kernel shows
/// one only with `IPV6_FLOWINFO_SEND`, which the RDMA path does not carry).
pub fn seen(a: SocketAddr, v6_socket: bool) -> SocketAddr {
    match a {
        SocketAddr::V4(v4) if v6_socket => {
            SocketAddr::V6(SocketAddrV6::new(v4.ip().to_ipv6_mapped(), v4.port(), 0, 0))
        }
        SocketAddr::V6(v6) => {
            let scope = if v6.ip().to_ipv4_mapped().is_some() {
                0
            } else {
                v6.scope_id()
            };
            SocketAddr::V6(SocketAddrV6::new(*v6.ip(), v6.port(), 0, scope))
        }
        v4 => v4,
    }
}

/// The source and destination rdma_cm resolves for a connect from `src` (the program's
/// bound address, if any) to `dst`: both in IPv4 form when `dst` is IPv4-mapped, a
/// wildcard source following the destination's family (rdma_cm wants one family).
pub fn resolve_pair(src: Option<SocketAddr>, dst: SocketAddr) -> (Option<SocketAddr>, SocketAddr) {
    let dst = v4_of(dst);
    let src = src.map(v4_of).map(|s| match s {
        SocketAddr::V6(v6) if dst.is_ipv4() && v6.ip().is_unspecified() => {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), v6.port())
        }
        s => s,
    });
    (src, dst)
}

/// rdma_cm's `AFONLY` for a listener on `bound` (the program's socket's address): for an
/// AF_INET6 wildcard, the socket's `IPV6_V6ONLY`, so that a v6-only socket gets no IPv4
/// peers and a dual-stack one gets them whatever `net.ipv6.bindv6only` says (rdma_cm's
/// default). `None` where it changes nothing: IPv4, and mapped addresses (bound as IPv4).
pub fn listen_afonly(bound: SocketAddr, v6only: bool) -> Option<bool> {
    match v4_of(bound) {
        SocketAddr::V6(_) => Some(v6only),
        SocketAddr::V4(_) => None,
    }
}

/// Whether a connect to `dst` on a socket of the given family (`v6_socket`, `v6only`) is
/// one the kernel would make: the address family must be the socket's, and a v6-only
/// socket cannot reach an IPv4-mapped address (the kernel says ENETUNREACH). Anything else
/// is left to the kernel, which gives the program its error.
pub fn connect_allowed(v6_socket: bool, v6only: bool, dst: SocketAddr) -> bool {
    match dst {
        SocketAddr::V4(_) => !v6_socket,
        SocketAddr::V6(v6) => v6_socket && !(v6only && v6.ip().to_ipv4_mapped().is_some()),
    }
}

/// `ip` with an IPv4-mapped IPv6 address replaced by its IPv4 form: the rules and
/// `RSOCK_EXCLUDE` match mapped destinations as IPv4.
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Whether the first `prefix` bits of `ip` are `net`'s (families must agree).
pub(crate) fn prefix_match(net: IpAddr, ip: IpAddr, prefix: u8) -> bool {
    use IpAddr::{V4, V6};
    let (a, b, bits) = match (net, ip) {
        (V4(n), V4(i)) => (u32::from(n) as u128, u32::from(i) as u128, 32),
        (V6(n), V6(i)) => (u128::from(n), u128::from(i), 128),
        _ => return false,
    };
    let shift = bits - prefix as u32;
    shift >= bits || (a >> shift) == (b >> shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn mapped_goes_to_rdma_cm_as_ipv4() {
        assert_eq!(v4_of(a("[::ffff:10.77.0.1]:80")), a("10.77.0.1:80"));
        assert_eq!(v4_of(a("10.77.0.1:80")), a("10.77.0.1:80"));
        assert_eq!(v4_of(a("[fd77::1]:80")), a("[fd77::1]:80"));
        assert_eq!(v4_of(a("[::]:80")), a("[::]:80"), "the wildcard stays IPv6");
        // IPv4-compatible (deprecated ::a.b.c.d) is not mapped: the kernel treats it as IPv6.
        assert_eq!(v4_of(a("[::10.77.0.1]:80")), a("[::10.77.0.1]:80"));
    }

    #[test]
    fn program_sees_the_kernels_form() {
        let m = seen(a("10.77.0.1:5000"), true);
        assert_eq!(m, a("[::ffff:10.77.0.1]:5000"));
        let SocketAddr::V6(v6) = m else { panic!() };
        assert_eq!((v6.flowinfo(), v6.scope_id()), (0, 0));
        assert_eq!(seen(a("10.77.0.1:5000"), false), a("10.77.0.1:5000"));
        // A mapped address given with a flow label or scope comes back without them.
        let odd = SocketAddr::V6(SocketAddrV6::new(
            "::ffff:10.77.0.1".parse().unwrap(),
            7,
            0x12345,
            3,
        ));
        assert_eq!(seen(odd, true), a("[::ffff:10.77.0.1]:7"));
        let SocketAddr::V6(v6) = seen(odd, true) else {
            panic!()
        };
        assert_eq!((v6.flowinfo(), v6.scope_id()), (0, 0));
        // Native IPv6 keeps its scope (link-local), not its flow label.
        let ll = SocketAddr::V6(SocketAddrV6::new("fe80::1".parse().unwrap(), 7, 9, 2));
        assert_eq!(seen(ll, true), a("[fe80::1%2]:7"));
    }

    #[test]
    fn the_bytes_are_a_28_byte_sockaddr_in6() {
        let (bytes, len) = crate::sys::sockaddr::encode(&seen(a("10.77.0.1:258"), true));
        assert_eq!(len, 28);
        assert_eq!(
            u16::from_ne_bytes([bytes[0], bytes[1]]) as i32,
            libc::AF_INET6
        );
        assert_eq!(&bytes[2..4], &[1, 2], "port in network order");
        assert_eq!(&bytes[4..8], &[0; 4], "flowinfo");
        assert_eq!(
            &bytes[8..24],
            &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 1]
        );
        assert_eq!(&bytes[24..28], &[0; 4], "scope id");
    }

    #[test]
    fn resolve_pair_keeps_one_family() {
        let d = a("[::ffff:10.77.0.1]:80");
        assert_eq!(resolve_pair(None, d), (None, a("10.77.0.1:80")));
        assert_eq!(
            resolve_pair(Some(a("[::]:5000")), d),
            (Some(a("0.0.0.0:5000")), a("10.77.0.1:80"))
        );
        assert_eq!(
            resolve_pair(Some(a("[::ffff:10.77.0.1]:0")), d),
            (Some(a("10.77.0.1:0")), a("10.77.0.1:80"))
        );
        // Native IPv6 and plain IPv4 pass as they are.
        let v6 = a("[fd77::1]:80");
        assert_eq!(
            resolve_pair(Some(a("[::]:5000")), v6),
            (Some(a("[::]:5000")), v6)
        );
        assert_eq!(resolve_pair(None, a("1.2.3.4:5")), (None, a("1.2.3.4:5")));
    }

    #[test]
    fn afonly_follows_v6only_on_ipv6_only() {
        assert_eq!(listen_afonly(a("[::]:80"), false), Some(false));
        assert_eq!(listen_afonly(a("[::]:80"), true), Some(true));
        assert_eq!(listen_afonly(a("[fd77::1]:80"), false), Some(false));
        assert_eq!(listen_afonly(a("[::ffff:10.77.0.1]:80"), false), None);
        assert_eq!(listen_afonly(a("0.0.0.0:80"), false), None);
    }

    #[test]
    fn connects_the_kernel_would_refuse_stay_with_the_kernel() {
        let m = a("[::ffff:10.77.0.1]:80");
        assert!(connect_allowed(true, false, m));
        assert!(!connect_allowed(true, true, m), "v6only: ENETUNREACH");
        assert!(connect_allowed(true, true, a("[fd77::1]:80")));
        assert!(!connect_allowed(true, false, a("10.77.0.1:80")), "family");
        assert!(!connect_allowed(false, false, m), "family");
        assert!(connect_allowed(false, false, a("10.77.0.1:80")));
    }
}
