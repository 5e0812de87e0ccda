//! libc-shaped entry points: what each hook in `preload/` calls.
//!
//! Every function has the signature of the libc function it stands in for and keeps its
//! contract, errno included. The first thing each does is look the fd up: an fd the shim does
//! not own goes straight to libc. Lifecycle calls (socket, connect, accept, close, dup, ...)
//! run shim logic only outside the reentrancy guard, so calls made by the shim itself or by
//! librdmacm/libibverbs on its behalf go straight to libc.
//!
//! An owned socket is carried either by kernel TCP (calls forward to libc and count bytes) or
//! by an RDMA stream of the [`engine`](crate::engine) (the program's fd is then a doorbell and
//! calls are served by the stream). Rooms: this file — creation, connection, listening,
//! accepting and fd lifetime; `io` — data calls; `opts` — options, names, ioctl, fcntl,
//! shutdown.

#![allow(clippy::missing_safety_doc)] // each fn has its libc namesake's contract

mod creds;
mod fds;
mod inherit;
mod io;
mod opts;
mod owned;
mod process;
mod rights;
mod wait;

pub use creds::*;
pub use fds::{close, close_range, dup, dup2, dup3, fclose};
pub use inherit::passed_at_exec;
pub use io::*;
pub use opts::*;
pub use process::{execv, execve, execvp, execvpe, exit_now, fexecve, fork, prctl, syscall};
pub use wait::{
    __poll_chk, epoll_create, epoll_create1, epoll_ctl, epoll_pwait, epoll_pwait2, epoll_wait,
    poll, ppoll, pselect, select,
};

use crate::config::Config;
use crate::engine::{self, Accepted, Listener};
use crate::fdtable;
use crate::guard;
use crate::init;
use crate::rules::{Action, Role};
use crate::socket::{Attachment, Pending, State};
use crate::stats::{Cause, Fallback, Path};
use crate::sys::fcntl::fd_flags;
use crate::sys::raw::{errno, set_errno};
use crate::sys::real;
use crate::sys::sockaddr as saddr;
use libc::c_int;
use libc::{sockaddr, socklen_t};
use owned::{keep_errno, local_addr, swap_file, track};
use std::net::SocketAddr;
use std::time::Instant;

// ---- creation and connection -------------------------------------------------------------

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
                    track(fd, |_| {});
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
fn buf_sizes(d: &crate::rules::Decision) -> engine::BufSizes {
    engine::BufSizes {
        ring: d.ring_size,
        send: d.send_buf,
    }
}

/// Why a connection goes to kernel TCP when no engine could be had.
fn no_engine_reason() -> Cause {
    Cause::from(if init::rdma_device_present() {
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
    if !saddr::family_of(fd).is_some_and(|(v6, only)| crate::addr::connect_allowed(v6, only, dest))
    {
        return Err(Fallback::Unsupported.into());
    }
    let engine = engine::for_new().ok_or_else(no_engine_reason)?;
    let now = Instant::now();
    if let Some(first) = engine.negcache.failure(&dest, now) {
        return Err(Cause::new(Fallback::NegativeCache, first));
    }
    // SAFETY: duplicating the program's socket; the copy keeps its options.
    let opts_fd = crate::sys::raw::hide(unsafe { real::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) });
    if opts_fd < 0 {
        return Err(Cause::errno(Fallback::Resources, errno()));
    }
    let stream = match engine.connect(dest, opts_fd, sizes) {
        Ok(st) => st,
        Err(why) => {
            crate::sys::raw::close(opts_fd);
            if why.reason != Some(Fallback::Resources) {
                engine
                    .negcache
                    .insert(dest, now, engine.neg_ttl(), why.detail);
            }
            return Err(why);
        }
    };
    let (nonblock, cloexec) = fd_flags(fd);
    stream.set_nonblocking(nonblock);
    let installed = stream
        .bell()
        .set_file_nonblocking(nonblock)
        .and_then(|_| swap_file(s, fd, || stream.bell().install_at(fd, cloexec)));
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
    s.established(fd, State::Rdma, Path::Rdma, cause, &local, &peer);
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
    if s.state() == State::Rdma {
        set_errno(libc::EISCONN);
        return -1;
    }
    let Some(dest) = saddr::read(addr, len) else {
        return real::connect(fd, addr, len); // AF_UNSPEC disconnect, or a bad address: the kernel says
    };
    if !s.transition(State::Created, State::Connecting) {
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
        s.established(fd, State::Tcp, path, cause, &local, addr_bytes(addr, len));
    } else if e == libc::EINPROGRESS || e == libc::EINTR {
        // Goes on in the background (EINTR: a blocking connect, likewise). Counted once it is
        // known to have succeeded: SO_ERROR 0, a peer name, a connect saying EISCONN, or data.
        let mut peer = [0u8; 28];
        let raw = addr_bytes(addr, len);
        peer[..raw.len().min(28)].copy_from_slice(&raw[..raw.len().min(28)]);
        s.set_pending(Pending { path, cause, peer });
    } else {
        s.set_state(State::Created); // failed: the program may retry on the same socket
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
        s.established(fd, State::Tcp, p.path, p.cause, &local, &p.peer);
    } else {
        s.set_state(State::Created);
    }
}

/// A connect in progress on `s` failed with `err`: counted as such, the socket back to
/// `Created`.
pub(super) fn pending_failed(s: &crate::socket::Socket, err: c_int) {
    if s.take_pending().is_some() {
        s.set_state(State::Created);
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
    if fdtable::get(fd).is_some_and(|s| s.attachment().is_some()) {
        set_errno(libc::EINVAL); // already connected or listening
        return -1;
    }
    real::bind(fd, addr, len)
}

pub unsafe fn listen(fd: c_int, backlog: c_int) -> c_int {
    let Some(s) = fdtable::get(fd).filter(|_| !init::sealed()) else {
        return real::listen(fd, backlog);
    };
    if let Some(Attachment::Listener(l)) = s.attachment() {
        return real::listen(l.tcp_fd, backlog); // a new backlog for the kernel side
    }
    if s.state() != State::Created {
        return real::listen(fd, backlog);
    }
    let Some(_g) = guard::enter() else {
        return real::listen(fd, backlog);
    };
    // The rdma_cm side listens first: once the kernel listener is visible, an rsock client
    // must find the RDMA one too (else it falls back to TCP and caches the failure).
    let rdma = keep_errno(|| rdma_listen(fd, backlog));
    let r = real::listen(fd, backlog);
    if r != 0 || !s.transition(State::Created, State::Listening) {
        return r; // the prepared rdma_cm listener is dropped
    }
    let bound = keep_errno(|| local_addr(fd)); // before the fd becomes a doorbell
    match rdma {
        Ok((engine, local, rl)) => start_dual(&s, fd, engine, local, rl, backlog),
        Err(why) => s.set_tcp_only(why),
    }
    keep_errno(|| s.listening(fd, &bound));
    r
}

/// Second half of a dual listen on the listening kernel socket `fd`: its file is replaced by
/// the listener's doorbell (epoll registrations carried over).
fn start_dual(
    s: &crate::socket::Socket,
    fd: c_int,
    engine: &'static engine::Engine,
    local: SocketAddr,
    rl: engine::RdmaListen,
    backlog: c_int,
) {
    keep_errno(|| {
        let mut started = Err(String::new());
        let _ = swap_file(s, fd, || {
            started = Listener::start(engine, fd, rl, backlog);
            Ok(())
        });
        match started {
            Ok(l) => {
                s.attach(Attachment::Listener(l));
                log::debug!("fd {fd}: listening on {local} over kernel TCP and RDMA");
            }
            Err(e) => {
                log::info!("fd {fd}: listening on {local} over kernel TCP only: {e}");
                s.set_tcp_only(Fallback::RdmaUnavailable.into());
            }
        }
    });
}

/// The rdma_cm half of a dual listener on `fd`'s bound address, or why RDMA cannot serve it
/// (the reason its connections are counted with).
fn rdma_listen(
    fd: c_int,
    backlog: c_int,
) -> Result<(&'static engine::Engine, SocketAddr, engine::RdmaListen), Cause> {
    let mut a = [0u8; 28];
    let mut alen = a.len() as socklen_t;
    // SAFETY: valid buffer of alen bytes.
    let local = unsafe {
        if real::getsockname(fd, a.as_mut_ptr().cast(), &mut alen) != 0 {
            return Err(Fallback::Unsupported.into());
        }
        saddr::read(a.as_ptr().cast(), alen).ok_or(Fallback::Unsupported)?
    };
    let decision = Config::get().decide(Role::Server, Some(local), None);
    if decision.action != Action::Rdma {
        // Counted as `excluded` or `rule` (also a passthrough rule: the listener is on TCP).
        let c = decision.cause();
        let reason = c.reason.unwrap_or(Fallback::Rule);
        return Err(Cause::new(reason, c.detail));
    }
    let engine = engine::for_new().ok_or_else(no_engine_reason)?;
    if local.port() == 0 {
        return Err(Fallback::Unsupported.into()); // unbound: the kernel picks the port at listen
    }
    let (_, v6only) = saddr::family_of(fd).ok_or(Fallback::Unsupported)?;
    let afonly = crate::addr::listen_afonly(local, v6only);
    match Listener::prepare(engine, local, afonly, backlog, buf_sizes(&decision)) {
        Ok(rl) => Ok((engine, local, rl)),
        Err(e) => {
            log::info!("fd {fd}: listening on {local} over kernel TCP only: {e}");
            Err(Fallback::RdmaUnavailable.into())
        }
    }
}

/// Owns a kernel TCP socket just accepted on an owned listener; `tcp_only`: why that
/// listener is on kernel TCP only, if it is.
pub(super) fn track_accepted(nfd: c_int, tcp_only: Option<Cause>) {
    let Some(_g) = guard::enter() else { return };
    keep_errno(|| {
        if !init::enabled() {
            return;
        }
        // A listener inherited from an owner with an engine also gets its TCP peers' way.
        let cause = if let Some(why) = tcp_only {
            why
        } else if !engine::is_owner_process() || engine::get().is_some() {
            Fallback::PeerTcp.into() // an inherited listener's owner had an engine: a plain peer
        } else {
            no_engine_reason()
        };
        let mut peer = [0u8; 28];
        let mut plen = peer.len() as socklen_t;
        // SAFETY: peer is a valid buffer of plen bytes.
        let have_peer = unsafe { real::getpeername(nfd, peer.as_mut_ptr().cast(), &mut plen) } == 0;
        let peer = if have_peer {
            &peer[..(plen as usize).min(28)]
        } else {
            &[][..]
        };
        let local = local_addr(nfd);
        track(nfd, |s| {
            s.established(nfd, State::Tcp, Path::Tcp, cause, &local, peer)
        });
    });
}

/// `accept4` on a dual listener: the next connection from either side.
unsafe fn accept_dual(
    l: &Listener,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    let Some(engine) = engine::get() else {
        set_errno(libc::EINVAL);
        return -1;
    };
    let nonblock = flags & libc::SOCK_NONBLOCK != 0;
    let cloexec = flags & libc::SOCK_CLOEXEC != 0;
    let got = {
        let Some(_g) = guard::enter() else {
            set_errno(libc::EAGAIN);
            return -1;
        };
        l.accept(engine)
    };
    match got {
        Err(e) => {
            set_errno(e);
            -1
        }
        Ok(Accepted::Tcp(nfd)) => {
            // The helper accepted it close-on-exec and blocking: give it the asked flags.
            if nonblock {
                real::fcntl(
                    nfd,
                    libc::F_SETFL,
                    (libc::O_RDWR | libc::O_NONBLOCK) as usize,
                );
            }
            if !cloexec {
                real::fcntl(nfd, libc::F_SETFD, 0);
            }
            if !len.is_null() && real::getpeername(nfd, addr, len) != 0 {
                *len = 0;
            }
            track_accepted(nfd, None);
            nfd
        }
        Ok(Accepted::Rdma(stream)) => {
            let Some(_g) = guard::enter() else { return -1 };
            let nfd = match stream
                .bell()
                .set_file_nonblocking(nonblock)
                .and_then(|_| stream.bell().install_new(cloexec))
            {
                Ok(nfd) => nfd,
                Err(e) => {
                    stream.app_closed(true);
                    engine.retire(stream);
                    set_errno(e.raw_os_error().unwrap_or(libc::EMFILE));
                    return -1;
                }
            };
            stream.set_nonblocking(nonblock);
            stream.inherit_options(l.tcp_fd);
            saddr::write(&stream.peer, addr, len);
            let (local, _) = saddr::encode(&stream.local);
            let (peer, _) = saddr::encode(&stream.peer);
            if (nfd as u32 as usize) < fdtable::MAX_FDS {
                track(nfd, |s| {
                    s.attach(Attachment::Stream(stream.clone()));
                    s.established(nfd, State::Rdma, Path::Rdma, Cause::NONE, &local, &peer);
                });
            }
            nfd
        }
    }
}

pub unsafe fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    accept4(fd, addr, len, 0)
}

pub unsafe fn accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int {
    if !fdtable::owns(fd) && !inherit::adopt_listener(fd) {
        return if flags == 0 {
            real::accept(fd, addr, len)
        } else {
            real::accept4(fd, addr, len, flags)
        };
    }
    if let Some(s) = fdtable::get(fd) {
        // A listener passed at exec is known by its name until its first use.
        let a = match s.attachment() {
            Some(Attachment::Passed(_)) => inherit::here(&s),
            a => a,
        };
        let s = fdtable::get(fd).unwrap_or(s);
        match a {
            Some(Attachment::Listener(l)) if l.owner.is_me() => {
                return accept_dual(&l, addr, len, flags)
            }
            Some(Attachment::Listener(l)) => return inherit::accept(&s, &l, fd, addr, len, flags),
            _ => {}
        }
    }
    let listener = fdtable::get(fd);
    let blocking = listener.as_ref().is_some_and(|s| s.blocking_accept());
    // A listener's own reason goes to what it accepts only where it decides for every
    // connection (the address is excluded or ruled out, or a credential change took its
    // rdma_cm side away): one that lost the RDMA half for another reason (SO_REUSEPORT: a sibling listens on RDMA for the port) still accepts
    // only peers that came over TCP.
    let tcp_only = listener.and_then(|s| s.tcp_only()).filter(|w| {
        matches!(w.reason, Some(Fallback::Excluded | Fallback::Rule))
            || w.detail == crate::stats::Detail::CredentialsChanged
    });
    loop {
        let nfd = if flags == 0 {
            real::accept(fd, addr, len)
        } else {
            real::accept4(fd, addr, len, flags)
        };
        if nfd >= 0 {
            track_accepted(nfd, tcp_only);
        } else if blocking && errno() == libc::EAGAIN {
            crate::sys::unix::wait(fd, libc::POLLIN, 1000); // see Socket::blocking_accept
            continue;
        }
        return nfd;
    }
}
