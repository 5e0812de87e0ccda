//! A dual listener (kernel TCP and rdma_cm on one address and port): making its rdma_cm
//! half, swapping the kernel listener's file for the listener's doorbell, taking the next
//! connection from either side, and owning the kernel sockets it accepts. Used by `listen`
//! and by listeners this process takes over (`inherit`).

use super::connect::{buf_sizes, no_engine_reason};
use super::ownership::{keep_errno, local_addr, swap_file, track};
use crate::config::Config;
use crate::engine::{self, Accepted, Listener};
use crate::fdtable;
use crate::guard;
use crate::init;
use crate::rules::{Action, Role};
use crate::socket::{Attachment, SocketState};
use crate::stats::{Cause, Fallback, Path};
use crate::sys::raw::set_errno;
use crate::sys::sockaddr as saddr;
use crate::sys::{fcntl, real};
use libc::{c_int, sockaddr, socklen_t};
use std::net::SocketAddr;

/// Second half of a dual listen on the listening kernel socket `fd`: its file is replaced by
/// the listener's doorbell (epoll registrations carried over).
pub(in crate::api) fn start_dual(
    s: &crate::socket::Socket,
    fd: c_int,
    engine: &'static engine::Engine,
    local: SocketAddr,
    rl: engine::RdmaListen,
    backlog: c_int,
) {
    keep_errno(|| {
        let started = swap_file(s, fd, || Listener::start(engine, fd, rl, backlog));
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
pub(in crate::api) fn rdma_listen(
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
pub(in crate::api) fn track_accepted(nfd: c_int, tcp_only: Option<Cause>) {
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
            s.established(nfd, SocketState::Tcp, Path::Tcp, cause, &local, peer)
        });
    });
}

/// `accept4` on a dual listener: the next connection from either side.
pub(in crate::api) unsafe fn accept_dual(
    l: &Listener,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    let Some(engine) = engine::get() else {
        set_errno(libc::EINVAL);
        return -1;
    };
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
        Ok(a) => give_accepted(engine, a, l.tcp_fd, addr, len, flags),
    }
}

/// The program's fd for `a`, a connection this process accepted, with the flags `accept4`
/// was asked for; an RDMA stream takes the options of `listening` (a kernel listener).
pub(in crate::api) unsafe fn give_accepted(
    engine: &'static engine::Engine,
    a: Accepted,
    listening: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    let nonblock = flags & libc::SOCK_NONBLOCK != 0;
    let cloexec = flags & libc::SOCK_CLOEXEC != 0;
    match a {
        Accepted::Tcp(nfd) => {
            // The helper accepted it close-on-exec and blocking: give it the asked flags.
            if nonblock {
                fcntl::set_only_nonblock(nfd);
            }
            if !cloexec {
                fcntl::set_cloexec(nfd, false);
            }
            if !len.is_null() && real::getpeername(nfd, addr, len) != 0 {
                *len = 0;
            }
            track_accepted(nfd, None);
            nfd
        }
        Accepted::Rdma(stream) => {
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
            stream.inherit_options(listening);
            saddr::write(&stream.peer, addr, len);
            let (local, _) = saddr::encode(&stream.local);
            let (peer, _) = saddr::encode(&stream.peer);
            if (nfd as u32 as usize) < fdtable::MAX_FDS {
                track(nfd, |s| {
                    s.attach(Attachment::Stream(stream.clone()));
                    s.established(
                        nfd,
                        SocketState::Rdma,
                        Path::Rdma,
                        Cause::NONE,
                        &local,
                        &peer,
                    );
                });
            }
            nfd
        }
    }
}
