//! Making and connecting a TCP socket: `socket` starts owning it, `connect` tries RDMA
//! first and else connects it over kernel TCP (counting why), and a kernel connect still in
//! progress is settled later (`resolve_pending`, `pending_failed`). Also `socketpair` and
//! `bind`.

#![allow(clippy::missing_safety_doc)] // each fn has its libc namesake's contract

use super::ownership::{keep_errno, local_addr, swap_file, track};
use crate::config::Config;
use crate::engine;
use crate::fdtable;
use crate::guard;
use crate::init;
use crate::rules::{Action, Role};
use crate::socket::{Attachment, Known, Pending, SocketState};
use crate::stats::{Cause, Fallback, Path};
use crate::sys::fcntl::{dup_hidden, fd_flags};
use crate::sys::raw::{errno, set_errno};
use crate::sys::real;
use crate::sys::sockaddr as saddr;
use libc::{c_int, sockaddr, socklen_t};
use std::net::SocketAddr;
use std::time::Instant;

fn is_tcp(domain: c_int, ty: c_int, protocol: c_int) -> bool {
    let base = ty & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC);
    (domain == libc::AF_INET || domain == libc::AF_INET6)
        && base == libc::SOCK_STREAM
        && (protocol == 0 || protocol == libc::IPPROTO_TCP)
}

#[inline]
pub unsafe fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    let fd = real::socket(domain, ty, protocol);
    if fd >= 0 && is_tcp(domain, ty, protocol) {
        if let Some(_g) = guard::enter() {
            keep_errno(|| {
                if init::enabled() {
                    let mut known = Known::UNBOUND | Known::DEFAULT_OPTS;
                    if domain == libc::AF_INET {
                        known = known | Known::INET4;
                    }
                    track(fd, |s| s.set_known(known));
                    crate::stats::touch(); // the process shows in `rsock stat` from now on
                }
            });
        }
    }
    fd
}

#[inline]
pub unsafe fn socketpair(domain: c_int, ty: c_int, protocol: c_int, sv: *mut c_int) -> c_int {
    real::socketpair(domain, ty, protocol, sv)
}

unsafe fn addr_bytes<'a>(addr: *const sockaddr, len: socklen_t) -> &'a [u8] {
    if addr.is_null() {
        &[]
    } else {
        std::slice::from_raw_parts(addr.cast::<u8>(), len as usize)
    }
}

/// The buffer sizes a rules decision gives an RDMA connection.
pub(super) fn buf_sizes(d: &crate::rules::Decision) -> engine::BufSizes {
    engine::BufSizes {
        ring: d.ring_size,
        send: d.send_buf,
    }
}

/// Why a connection goes to kernel TCP when no engine could be had.
pub(super) fn no_engine_reason() -> Cause {
    Cause::from(if crate::rdma::device_present() {
        Fallback::RdmaUnavailable
    } else {
        Fallback::NoDevice
    })
}

/// Tries RDMA for a connect to `dest`; on success the program's `fd` is the stream's doorbell.
fn connect_rdma(
    s: &crate::socket::Socket,
    fd: c_int,
    dest: SocketAddr,
    sizes: engine::BufSizes,
    cause: Cause,
) -> Result<(), Cause> {
    // A connect the kernel refuses (the wrong family, or a v6-only socket to an IPv4-mapped
    // address) is the kernel's to answer, with its errno.
    let known = s.known();
    let family = if known.has(Known::INET4) {
        Some((false, false))
    } else {
        saddr::family_of(fd)
    };
    if !family.is_some_and(|(v6, only)| crate::addr::connect_allowed(v6, only, dest)) {
        return Err(Fallback::Unsupported.into());
    }
    let engine = engine::for_new().ok_or_else(no_engine_reason)?;
    if let Some(first) = engine.negcache.failure(&dest, Instant::now) {
        return Err(Cause::new(Fallback::NegativeCache, first));
    }
    // A private copy of the program's socket: it keeps the socket's options.
    let opts_fd = dup_hidden(fd);
    if opts_fd < 0 {
        return Err(Cause::errno(Fallback::Resources, errno()));
    }
    let opts = engine::OptsSocket {
        fd: opts_fd,
        unbound: known.has(Known::UNBOUND),
        default_opts: known.has(Known::DEFAULT_OPTS),
    };
    let stream = match engine.connect(dest, opts, sizes) {
        Ok(st) => st,
        Err(why) => {
            crate::sys::raw::close(opts_fd);
            if why.reason != Some(Fallback::Resources) {
                let (now, ttl) = (Instant::now(), engine.neg_ttl());
                engine.negcache.insert(dest, now, ttl, why.detail);
            }
            return Err(why);
        }
    };
    let (nonblock, cloexec) = fd_flags(fd);
    stream.set_nonblocking(nonblock);
    stream.bell().set_fresh_nonblocking(nonblock); // a new stream's: nobody holds A yet
    let installed = swap_file(s, fd, || stream.bell().install_at(fd, cloexec));
    if let Err(e) = installed {
        log::warn!("fd {fd}: cannot install the RDMA doorbell ({e}); using kernel TCP");
        stream.app_closed(true);
        engine.retire(stream);
        return Err(Cause::errno(
            Fallback::Resources,
            e.raw_os_error().unwrap_or(0),
        ));
    }
    engine.negcache.remove(&dest);
    let (local, _) = saddr::encode(&stream.local);
    let (peer, _) = saddr::encode(&stream.peer);
    s.attach(Attachment::Stream(stream));
    s.established(fd, SocketState::Rdma, Path::Rdma, cause, &local, &peer);
    log::debug!("fd {fd}: connected to {dest} over RDMA");
    Ok(())
}

pub unsafe fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    let Some(s) = fdtable::get(fd).filter(|_| !init::sealed()) else {
        return real::connect(fd, addr, len);
    };
    let Some(_g) = guard::enter() else {
        return real::connect(fd, addr, len);
    };
    if s.state() == SocketState::Rdma {
        set_errno(libc::EISCONN);
        return -1;
    }
    let Some(dest) = saddr::read(addr, len) else {
        return real::connect(fd, addr, len); // AF_UNSPEC disconnect, or a bad address: the kernel says
    };
    if !s.transition(SocketState::Created, SocketState::Connecting) {
        return connect_again(&s, fd, addr, len);
    }
    let decision = Config::get().decide(Role::Client, None, Some(dest));
    let (action, sizes, decided) = (decision.action, buf_sizes(&decision), decision.cause());
    // Passthrough by RSOCK_EXCLUDE is counted as `excluded`; without an engine (no device)
    // on path `tcp`, as every connection there.
    let excluded = decision.exclude.is_some();
    let (path, cause) = if action == Action::Tcp {
        (Path::Tcp, decided) // never tries RDMA, so never starts the engine
    } else if action == Action::Passthrough && engine::get().is_some() {
        (Path::Passthrough, decided)
    } else if excluded {
        (Path::Tcp, decided)
    } else if s.known().has(Known::STDIO) {
        (Path::Tcp, Fallback::Unsupported.into())
    } else {
        match keep_errno(|| connect_rdma(&s, fd, dest, sizes, decided)) {
            Ok(()) => {
                if fd_flags(fd).0 {
                    set_errno(libc::EINPROGRESS); // completes at once: writable, SO_ERROR 0
                    return -1;
                }
                return 0;
            }
            Err(why) => (Path::Tcp, why),
        }
    };
    let r = real::connect(fd, addr, len);
    let e = errno();
    log::debug!(
        "fd {fd}: connect to {dest} over kernel TCP ({})",
        if cause == Cause::NONE {
            "passthrough".to_string()
        } else {
            cause.to_string()
        }
    );
    if r == 0 {
        let local = local_addr(fd);
        s.established(
            fd,
            SocketState::Tcp,
            path,
            cause,
            &local,
            addr_bytes(addr, len),
        );
    } else if e == libc::EINPROGRESS || e == libc::EINTR {
        // Goes on in the background (EINTR: a blocking connect, likewise). Counted once it is
        // known to have succeeded: SO_ERROR 0, a peer name, a connect saying EISCONN, or data.
        let mut peer = [0u8; 28];
        let raw = addr_bytes(addr, len);
        peer[..raw.len().min(28)].copy_from_slice(&raw[..raw.len().min(28)]);
        s.set_pending(Pending { path, cause, peer });
    } else {
        s.set_state(SocketState::Created); // failed: the program may retry on the same socket
        crate::stats::count_connect_failed(e);
    }
    set_errno(e);
    r
}

/// A connect in progress on `s` is now known to have succeeded (`ok`) or failed: count it,
/// or return the socket to `Created`.
pub(super) fn resolve_pending(s: &crate::socket::Socket, fd: c_int, ok: bool) {
    let Some(p) = s.take_pending() else { return };
    if ok {
        let local = local_addr(fd);
        s.established(fd, SocketState::Tcp, p.path, p.cause, &local, &p.peer);
    } else {
        s.set_state(SocketState::Created);
    }
}

/// A connect in progress on `s` failed with `err`: counted as such, the socket back to
/// `Created`.
pub(super) fn pending_failed(s: &crate::socket::Socket, err: c_int) {
    if s.take_pending().is_some() {
        s.set_state(SocketState::Created);
        crate::stats::count_connect_failed(err);
    }
}

/// A repeated connect() on a socket whose kernel connect is in progress.
unsafe fn connect_again(
    s: &crate::socket::Socket,
    fd: c_int,
    addr: *const sockaddr,
    len: socklen_t,
) -> c_int {
    let r = real::connect(fd, addr, len);
    let e = errno();
    if r == 0 || e == libc::EISCONN {
        keep_errno(|| resolve_pending(s, fd, true));
    } else if e != libc::EALREADY && e != libc::EINPROGRESS && e != libc::EINTR {
        pending_failed(s, e);
    }
    set_errno(e);
    r
}

pub unsafe fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    if let Some(s) = fdtable::get(fd) {
        if s.attachment().is_some() {
            set_errno(libc::EINVAL); // already connected or listening
            return -1;
        }
        s.forget_known(Known::UNBOUND);
    }
    real::bind(fd, addr, len)
}
