//! Listeners this process did not make: one another process owns (`accept` goes through
//! the owner's queue until the owner is gone, then this process takes the listener over), a
//! kernel listener inherited from a process without the shim (adopted as a dual listener),
//! and this process's own listeners turned back into kernel ones before an exec or a
//! credential change.

use super::streams::{attach_rdma, point_fds_at};
use crate::api::dual::{give_accepted, rdma_listen, start_dual, track_accepted};
use crate::api::ownership::{local_addr, track};
use crate::engine::ipc::{self, Reply, Request};
use crate::engine::Listener;
use crate::fdtable;
use crate::socket::{Attachment, Socket, SocketState};
use crate::stats::Cause;
use crate::sys::fcntl::{dup_hidden, fd_flags, set_cloexec, set_nonblock};
use crate::sys::raw::{self, set_errno};
use crate::sys::{real, sockaddr as saddr, unix};
use libc::{c_int, sockaddr, socklen_t};
use std::sync::Arc;

/// Held by the thread taking a listener over from its departed owner.
static TAKING_OVER: crate::forklock::ProcessMutex<()> = crate::forklock::ProcessMutex::new(|| ());

/// Whether `s` is still attached to `l` (no other thread took it over meanwhile).
fn still_attached(s: &Socket, l: &Arc<Listener>) -> bool {
    matches!(s.attachment(), Some(Attachment::Listener(now)) if Arc::ptr_eq(&now, l))
}

/// What [`accept`] on a listener another process owns came to.
pub(in crate::api) enum Accepted {
    /// What `accept4` returns (a new fd, or -1 with errno set).
    Done(c_int),
    /// The owner is gone and this process owns the listener now: accept as its owner.
    TakenOver,
}

/// `accept4` on a listener another process owns: the owner hands over the next connection
/// of its queue (a kernel TCP socket, or an RDMA stream it relays). Blocks unless the
/// listener or `flags` say otherwise.
pub(in crate::api) unsafe fn accept(
    s: &Socket,
    l: &Arc<Listener>,
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> Accepted {
    if let Some(done) = accept_via_branch(s, l, fd, addr, len, flags) {
        return Accepted::Done(done);
    }
    let mut drained = false;
    let mut taker = None;
    if crate::config::Config::get().takeover {
        // With an engine here, an RDMA connection is handed over rather than relayed.
        let _g = crate::guard::enter();
        taker = crate::engine::for_new().map(|e| e.owner);
    }
    let req = Request::Accept {
        token: l.token,
        taker,
    };
    let mut owner = l.owner;
    loop {
        match ipc::call(&mut owner, &req, fd) {
            Ok((r, Some(nfd))) => {
                return Accepted::Done(install_accepted(&r, nfd, addr, len, flags))
            }
            Ok((_, None)) => {}
            Err(ipc::CallError::Refused(libc::EAGAIN)) if !drained => {
                // Queue empty: clear our listener fd's readiness (the owner may no longer hold
                // a copy of it to do so), then ask once more — an item pushed meanwhile rang a
                // token we may just have drained.
                drain_tokens(fd);
                drained = true;
            }
            Err(ipc::CallError::Refused(libc::EAGAIN)) => {
                drained = false;
                if fd_flags(fd).0 {
                    set_errno(libc::EAGAIN);
                    return Accepted::Done(-1);
                }
                unix::wait(fd, libc::POLLIN, 1000); // readable: the owner's queue has one
            }
            Err(ipc::CallError::Gone) => {
                // One thread takes it over (each of haproxy's threads accepts with an epoll
                // set of its own, and all woke for the hang-up); the others accept as its
                // new owner.
                let _one = TAKING_OVER.lock();
                if !still_attached(s, l) {
                    return Accepted::TakenOver;
                }
                log::info!(
                    "fd {fd}: listener owner pid {} is gone: taking the listener over",
                    l.owner.pid
                );
                let nonblock = fd_flags(fd).0;
                to_kernel_listener(s, l, false);
                // Its rdma_cm listener lives in a file this process inherited: once every
                // holder lets go, the port is free and RDMA clients are refused at once
                // instead of waiting out their connect timeout.
                raw::close(l.rdma_fd);
                // The program's fds refer to the kernel listener now. With this copy gone
                // the port may be free (this process may be the old listener's last
                // holder): serve RDMA again, as the new owner.
                raw::close(l.tcp_fd);
                let backlog = l.backlog();
                let bound = local_addr(fd);
                match rdma_listen(fd, backlog) {
                    Ok((engine, local, rl)) => {
                        start_dual(s, fd, engine, local, rl, backlog);
                        // The kernel listener's file is nonblocking for the old owner's
                        // helper; the new doorbell blocks as the program's listener did.
                        if let Some(Attachment::Listener(nl)) = s.attachment() {
                            nl.set_nonblocking(nonblock);
                            let _ = nl.bell().set_file_nonblocking(nonblock);
                        }
                    }
                    Err(why) => s.set_tcp_only(why),
                }
                s.listening(fd, &bound);
                return Accepted::TakenOver;
            }
            Err(e) => {
                // The owner is there but did not serve this call (a timeout, a refusal): the
                // listener stays its; the caller sees what a kernel accept could say.
                log::warn!(
                    "fd {fd}: accept through pid {}: {e:?} (errno {})",
                    owner.pid,
                    e.errno()
                );
                if fd_flags(fd).0 {
                    set_errno(libc::EAGAIN);
                    return Accepted::Done(-1);
                }
                unix::wait(fd, libc::POLLIN, 1000);
            }
        }
    }
}

/// `accept4` through this process's branch of `l` (`RSOCK_REDIRECT`; engine
/// listener/branch.rs), made at the first accept: the streams the owner's redirected clients
/// set up here come first, then the owner's queue once its doorbell rang. `None`: no
/// branch here (the owner is asked as before).
unsafe fn accept_via_branch(
    s: &Socket,
    l: &Arc<Listener>,
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> Option<c_int> {
    let (engine, b) = branch_here(s, l, fd)?;
    let owners_a = l.bell().app_fd();
    let taker = Some(engine.owner);
    loop {
        let got = {
            let _g = crate::guard::enter()?;
            b.branch_take(engine)
        };
        if let Some(a) = got {
            crate::stats::count_branch(true);
            return Some(give_accepted(engine, a, l.tcp_fd, addr, len, flags));
        }
        if b.take_owner_rang() {
            drain_tokens(owners_a);
            let mut owner = l.owner;
            let req = Request::Accept {
                token: l.token,
                taker,
            };
            match ipc::call(&mut owner, &req, owners_a) {
                Ok((r, Some(nfd))) => {
                    b.owner_may_have_more();
                    return Some(install_accepted(&r, nfd, addr, len, flags));
                }
                Ok((_, None)) | Err(ipc::CallError::Refused(libc::EAGAIN)) => {}
                Err(ipc::CallError::Gone) => {
                    // The listener becomes this process's own (below, as before).
                    let _g = crate::guard::enter()?;
                    engine.close_branch_of(l);
                    return None;
                }
                Err(e) => log::warn!(
                    "fd {fd}: accept through pid {}: {e:?} (errno {})",
                    owner.pid,
                    e.errno()
                ),
            }
        }
        b.settle();
        if fd_flags(fd).0 {
            set_errno(libc::EAGAIN);
            return Some(-1);
        }
        let waited = {
            let _g = crate::guard::enter()?;
            b.wait_on_links(engine)
        };
        if !waited {
            unix::wait(fd, libc::POLLIN, 1000);
        }
    }
}

/// This process's branch of `l`, which the program holds as `fd` (`RSOCK_REDIRECT`),
/// made at the first call: the program's fds of the listener then become its A.
fn branch_here(
    s: &Socket,
    l: &Arc<Listener>,
    fd: c_int,
) -> Option<(&'static crate::engine::Engine, Arc<Listener>)> {
    let cfg = crate::config::Config::get();
    if !cfg.redirect || !cfg.takeover {
        return None;
    }
    let _g = crate::guard::enter()?;
    let engine = crate::engine::for_new()?;
    let (b, fresh) = engine.branch_of(l, fd_flags(fd).0)?;
    if fresh {
        point_fds_at(s, &fdtable::fds_of(s), b.bell().app_fd());
    }
    Some((engine, b))
}

/// Before a credential change (after which this process could not drive its branch of
/// `l`) or an exec: the branch goes, and the program's fds are the owner's A again.
pub(in crate::api) fn unbranch(
    s: &Socket,
    l: &Arc<Listener>,
    engine: &'static crate::engine::Engine,
) {
    if engine.close_branch_of(l) {
        point_fds_at(s, &fdtable::fds_of(s), l.bell().app_fd());
        log::info!("listener {}: no branch here from now on", l.token);
    }
}

/// The program is about to wait for connections on `fd` (it adds it to an epoll set): if
/// it is a listener another process owns, the branch is made now, so that clients are
/// redirected here before this process's first accept.
pub(in crate::api) fn branch_before_wait(fd: c_int) {
    let Some(s) = fdtable::get(fd) else { return };
    if let Some(Attachment::Listener(l)) = s.attachment() {
        if !l.owner.is_me() {
            let _ = branch_here(&s, &l, fd);
        }
    }
}

/// Gives an fd the owner handed over the flags `accept4` was asked for, fills in the peer's
/// address, and tracks it.
unsafe fn install_accepted(
    r: &Reply,
    nfd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    set_nonblock(nfd, flags & libc::SOCK_NONBLOCK != 0);
    if flags & libc::SOCK_CLOEXEC == 0 {
        set_cloexec(nfd, false); // ipc delivers it close-on-exec
    }
    let (local, peer) = match *r {
        Reply::Tcp { local, peer } => (local, peer),
        Reply::Relay(e) | Reply::Stream { ends: e, .. } => (Some(e.local), Some(e.peer)),
        _ => (None, None),
    };
    if !len.is_null() {
        match &peer {
            Some(p) => saddr::write(p, addr, len),
            None => *len = 0,
        }
    }
    match (r, local, peer) {
        (Reply::Relay(_) | Reply::Stream { .. }, Some(local), Some(peer)) => {
            let ends = ipc::Ends { local, peer };
            attach_rdma(nfd, r, ends, flags & libc::SOCK_NONBLOCK != 0);
        }
        _ => track_accepted(nfd, None),
    }
    nfd
}

/// Reads away the readiness tokens queued on a listener doorbell's A (`fd`).
fn drain_tokens(fd: c_int) {
    let mut buf = [0u8; 64];
    // SAFETY: a valid buffer; a nonblocking receive on the caller's own fd.
    while unsafe { real::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) }
        == buf.len() as isize
    {}
}

/// Tracks `fd`, the A of listener `token` that `owner` runs (received with `SCM_RIGHTS`, or
/// passed at exec), as a listener that accepts through its owner; `tcp_fd` is the kernel
/// listener the owner sent, kept for the day the owner is gone.
pub(super) fn track_foreign_listener(
    fd: c_int,
    owner: ipc::Owner,
    token: u64,
    sizes: u64,
    local: std::net::SocketAddr,
    tcp_fd: c_int,
) {
    let l = Listener::foreign(
        owner,
        token,
        crate::engine::BufSizes::unpack(sizes),
        dup_hidden(fd),
        raw::hide(tcp_fd),
    );
    track(fd, |s| {
        if s.transition(SocketState::Created, SocketState::Listening) {
            s.attach(Attachment::Listener(l));
        }
    });
    log::info!(
        "fd {fd}: pid {}'s listener on {local}: accepting through it",
        owner.pid
    );
}

/// A kernel TCP listener the shim did not see being made — inherited across `exec`
/// (systemd socket activation's fd 3, nginx's binary upgrade, `LISTEN_FDS` services) —
/// becomes this process's own on first `accept` or `epoll_ctl(ADD)`: tracked, and a dual
/// listener as if its `listen()` had been hooked (kernel TCP only where RDMA cannot serve,
/// without asking again). False, at the cost of a getsockopt, for any other fd.
#[cold]
pub(in crate::api) fn adopt_listener(fd: c_int) -> bool {
    if fd < 0 || !crate::init::enabled() {
        return false;
    }
    let Some(_g) = crate::guard::enter() else {
        return false;
    };
    let inet = matches!(
        unix::socket_kind(fd),
        Some((libc::AF_INET | libc::AF_INET6, libc::SOCK_STREAM))
    );
    if !inet || !unix::is_listening(fd) {
        return false;
    }
    track(fd, |_| {});
    let Some(s) = fdtable::get(fd) else {
        return false; // beyond the table: it stays the kernel's
    };
    if !s.transition(SocketState::Created, SocketState::Listening) {
        return true;
    }
    let backlog = libc::SOMAXCONN;
    let bound = local_addr(fd);
    match rdma_listen(fd, backlog) {
        Ok((engine, local, rl)) => {
            log::info!("fd {fd}: an inherited listener on {local}: adopted");
            start_dual(&s, fd, engine, local, rl, backlog);
        }
        Err(why) => s.set_tcp_only(why),
    }
    s.listening(fd, &bound);
    true
}

/// The listener's owner is gone: every fd of it in this process becomes the kernel listener
/// it wraps (inherited), with the file flags the program had.
///
/// The kernel listener's file may be shared with other processes (siblings, or a new owner's
/// helper, which needs it nonblocking): its flags are set to the program's only for an exec'd
/// image (`for_exec`), which has no shim to wait for it; here a blocking `accept` is waited
/// for by the shim instead.
pub(super) fn to_kernel_listener(s: &Socket, l: &Arc<Listener>, for_exec: bool) {
    let _g = crate::guard::enter();
    let fds = fdtable::fds_of(s);
    if let Some(&first) = fds.first() {
        let nonblock = fd_flags(first).0;
        if for_exec {
            set_nonblock(l.tcp_fd, nonblock);
        } else {
            s.set_blocking_accept(!nonblock);
        }
    }
    point_fds_at(s, &fds, l.tcp_fd);
    l.bell().release_app();
    s.detach_quietly();
}

/// Before a credential change: the dual listener `l` keeps only its kernel side (its
/// rdma_cm side could not be driven afterwards); connections already queued for it are
/// refused.
pub(in crate::api) fn to_kernel_only(
    s: &Socket,
    l: &Arc<Listener>,
    engine: &crate::engine::Engine,
) {
    to_kernel_listener(s, l, false);
    l.close(engine);
    s.lost_rdma(Cause::new(
        crate::stats::Fallback::RdmaUnavailable,
        crate::stats::Detail::CredentialsChanged,
    ));
    log::info!(
        "listener {}: kernel TCP only from now on (credential change)",
        l.token
    );
}
