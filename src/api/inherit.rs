//! Sockets this process holds but another process's engine owns: inherited across `fork`
//! (a server's accepted connection in its child, a prefork worker's listener), or across
//! `exec` (docs/DESIGN.md, "Processes").
//!
//! Nothing an owner holds — queue pairs, memory, locks — is usable or even touched here.
//! Instead:
//! - a stream is **taken over** on its first use: its end of the connection moves to this
//!   process's engine (a new queue pair, the same doorbell: `engine/takeover.rs`); where that
//!   cannot be, it is **adopted**: the owner relays it over a fresh socketpair whose end
//!   replaces every fd of it in this process (a plain kernel socket from then on);
//! - a listener's `accept` asks the owner for the next connection of its queue; once the
//!   owner is gone (a daemon's parent exited), this process takes the listener over: the
//!   kernel listener it wraps, plus an rdma_cm listener of its own when the port is free;
//! - before `exec`, every RDMA socket that survives it is turned into a kernel socket (a
//!   relay end, or the kernel listener), which the new image needs no shim to use.

use super::listen::{rdma_listen, start_dual, track_accepted};
use super::owned::{local_addr, share, swap_file, track};
use crate::engine::ipc::{self, Reply, Request};
use crate::engine::relay::Relayed;
use crate::engine::{Inherited, Listener, Stream, TakeError};
use crate::fdtable;
use crate::socket::{Attachment, Socket, State};
use crate::stats::{Cause, Path};
use crate::sys::fcntl::{dup_hidden, fd_flags, set_nonblock};
use crate::sys::raw::{self, set_errno};
use crate::sys::{real, sockaddr as saddr, unix};
use libc::{c_int, sockaddr, socklen_t};
use std::sync::Arc;

/// What carries `s` for this process: its attachment, with a stream owned by another
/// process adopted first (so the answer is never another process's stream).
pub(super) fn here(s: &Socket) -> Option<Attachment> {
    match s.attachment()? {
        Attachment::Stream(st) if !st.owner().is_me() => Some(take_or_adopt(s, &st)),
        Attachment::Passed(p) => Some(use_passed(s, &p)),
        a => Some(a),
    }
}

/// First use of a stream this image got across `exec` ([`passed_at_exec`]): its owner says
/// what it is, then it is taken over, or relayed, or — if the owner is gone or does not
/// know it — a dead end, as a connection whose process vanished looks.
fn use_passed(s: &Socket, p: &ipc::Passed) -> Attachment {
    let _g = crate::guard::enter();
    let fds = fdtable::fds_of(s);
    let Some(&first) = fds.first() else {
        return Attachment::Passed(Arc::new(*p));
    };
    let mut at = p.owner;
    let (stream, ends) = match ipc::call(&mut at, &Request::Describe { token: p.token }, first) {
        Ok((r @ Reply::Described { ends, .. }, _)) => (as_stream(r), ends),
        Ok((
            Reply::Listening {
                token,
                owner,
                sizes,
                local,
            },
            Some(tcp_fd),
        )) => {
            track_foreign_listener(first, owner, token, sizes, local, tcp_fd);
            for &fd in &fds[1..] {
                if let Some(n) = fdtable::get(first) {
                    share(&n, fd);
                }
            }
            return fdtable::get(first)
                .and_then(|n| n.attachment())
                .unwrap_or_else(|| Attachment::Passed(Arc::new(*p)));
        }
        other => {
            if let Ok((_, Some(x))) = other {
                raw::close(x);
            }
            log::warn!(
                "fd {first}: rdma socket passed at exec by pid {}: not described ({other:?}): dead",
                p.owner.pid
            );
            if let Some(a) = dead_end() {
                point_fds_at(s, &fds, a);
                raw::close(a);
            }
            s.detach_quietly();
            return Attachment::Passed(Arc::new(*p));
        }
    };
    let nonblock = fd_flags(first).0;
    attach_rdma(first, &stream, ends, nonblock);
    // attach_rdma made a fresh entry for `first`; the program's other fds of the socket, if
    // any, now refer to the same file and follow it.
    for &fd in &fds[1..] {
        if let Some(n) = fdtable::get(first) {
            share(&n, fd);
        }
    }
    fdtable::get(first)
        .and_then(|n| n.attachment())
        .unwrap_or_else(|| Attachment::Passed(Arc::new(*p)))
}

/// Before `main` of an image that a process exec'd while it held RDMA streams another
/// process owns on fds of 3 or more (named in `RSOCK_PASSED_FDS` by the exec hooks: systemd
/// `Accept=yes` and inetd-style servers pass the connection on fd 3): each such fd that is
/// still that stream's A is registered, to be taken over (or relayed) on first use — not
/// before, since a program that only inherited it must not take it from the process that
/// uses it. No thread, no device, no request: a getsockname per fd.
pub fn passed_at_exec() {
    let Some(list) = std::env::var_os(PASSED_FDS) else {
        return;
    };
    let Some(_g) = crate::guard::enter() else {
        return;
    };
    if !crate::init::enabled() {
        return;
    }
    let list = list.to_string_lossy().into_owned();
    for fd in list.split(',').filter_map(|f| f.parse::<c_int>().ok()) {
        let named = unix::abstract_name(fd).and_then(|n| ipc::parse_stream_name(&n));
        if let (Some((owner, token)), false) = (named, fdtable::owns(fd)) {
            let passed = Arc::new(ipc::Passed { owner, token });
            track(fd, |s| s.attach(Attachment::Passed(passed)));
            log::debug!("fd {fd}: rdma stream of pid {} passed at exec", owner.pid);
        }
    }
}

/// The environment variable that names, for an exec'd image, the fds of streams passed to
/// it ([`passed_at_exec`]).
pub const PASSED_FDS: &str = "RSOCK_PASSED_FDS";

/// The stream carrying `s` in this process, if it is one of this process's own.
pub(super) fn stream(s: &Socket) -> Option<Arc<Stream>> {
    match here(s)? {
        Attachment::Stream(st) => Some(st),
        _ => None,
    }
}

/// `dup2` put `s` on stdio: a stream another process owns is relayed now rather than at
/// first use. A server that hands a connection to a child on stdio (inetd style; vsftpd's
/// session process) may take away the means to set a relay up before it reads: vsftpd sets
/// `RLIMIT_NOFILE` to 0 and installs a seccomp filter, after which the request to the owner
/// fails and the connection would hang.
pub(super) fn onto_stdio(s: &Socket) {
    if matches!(s.attachment(), Some(Attachment::Stream(st)) if !st.owner().is_me()) {
        let _ = here(s);
    }
}

/// Makes the inherited stream `st` this process's own (take-over), or else a relayed socket.
fn take_or_adopt(s: &Socket, st: &Arc<Stream>) -> Attachment {
    let _g = crate::guard::enter();
    let fds = fdtable::fds_of(s);
    let Some(&first) = fds.first() else {
        return Attachment::Stream(st.clone());
    };
    // On stdio it is the inetd-style hand-off to a program that is about to exec (or was
    // exec'd): a relay end survives that, an owned stream would not.
    if fds.iter().any(|&fd| fd <= 2) {
        return adopt(s, st);
    }
    let mut facts = Inherited::of(st);
    let taken = take(&mut facts, first);
    if facts.owner != st.owner() {
        st.set_owner(facts.owner); // it had moved on: later requests go there directly
    }
    let Some(own) = taken else {
        return adopt(s, st);
    };
    own.set_nonblocking(fd_flags(first).0);
    st.bell().release_app(); // this process's copy of the owner's hidden A
    let a = Attachment::Stream(own);
    s.attach(a.clone());
    a
}

/// [`crate::engine::take_over`], saying in the log why not when it did not happen.
fn take(facts: &mut Inherited, fd: c_int) -> Option<Arc<Stream>> {
    let peer = facts.peer;
    match crate::engine::take_over(facts, fd) {
        Ok(own) => Some(own),
        Err(TakeError::Refused(why)) => {
            log::debug!("fd {fd}: rdma stream to {peer}: no take-over ({why})");
            None
        }
        Err(TakeError::Lost(why)) => {
            log::warn!("fd {fd}: rdma stream to {peer}: take-over failed: {why}");
            None
        }
    }
}

/// The owner's relay end for stream `token`, which this process holds as `fd`, if the
/// owner serves one. `owner` follows the stream if it moved.
fn relay_end(
    owner: &mut ipc::Owner,
    token: u64,
    fd: c_int,
    peer: std::net::SocketAddr,
) -> Option<c_int> {
    match ipc::call(owner, &Request::Relay { token }, fd) {
        Ok((Reply::Relay(_), end)) => end,
        Ok((r, end)) => {
            if let Some(end) = end {
                raw::close(end);
            }
            log::warn!("fd {fd}: rdma stream to {peer}: no relay (answered {r:?})");
            None
        }
        Err(e) => {
            log::warn!(
                "fd {fd}: rdma stream to {peer} owned by pid {}: no relay ({e:?}, errno {})",
                owner.pid,
                e.errno()
            );
            None
        }
    }
}

/// A relay end of the stream behind `s` (whose fd here is `fd`), for a process that cannot
/// use the stream itself (`api::rights`): served by this process's engine if the stream is
/// its own, else by its owner.
pub(super) fn relay_for_sending(s: &Socket, fd: c_int) -> Option<c_int> {
    match s.attachment()? {
        Attachment::Stream(st) if st.owner().is_me() => crate::engine::get()?.relay_end(&st),
        Attachment::Stream(st) => relay_end(&mut st.owner(), st.token, fd, st.peer),
        _ => None,
    }
}

/// Makes the inherited stream `st` a relayed socket in this process: every fd of it now
/// refers to a relay end the owner serves. If the owner cannot serve it (gone, or the
/// stream is closed there), the fds read end of stream and writes fail, as on a dead socket.
fn adopt(s: &Socket, st: &Arc<Stream>) -> Attachment {
    let _g = crate::guard::enter();
    let fds = fdtable::fds_of(s);
    let Some(&first) = fds.first() else {
        return Attachment::Stream(st.clone());
    };
    let (nonblock, _) = fd_flags(first);
    let mut owner = st.owner();
    let end = relay_end(&mut owner, st.token, first, st.peer);
    let a = end.or_else(dead_end);
    if let Some(a) = a {
        set_nonblock(a, nonblock);
        point_fds_at(s, &fds, a);
        raw::close(a);
    }
    st.bell().release_app(); // this process's copy of the old doorbell
    let relayed = Attachment::Relayed(Arc::new(Relayed {
        local: st.local,
        peer: st.peer,
        opts_fd: dup_hidden(st.opts_fd),
    }));
    s.attach(relayed.clone());
    if end.is_some() {
        let (local, _) = saddr::encode(&st.local);
        let (peer, _) = saddr::encode(&st.peer);
        s.established(first, State::Rdma, Path::Rdma, Cause::NONE, &local, &peer);
        log::debug!(
            "fd {first}: rdma stream to {} adopted from pid {} (relayed)",
            st.peer,
            st.owner().pid
        );
    }
    relayed
}

/// Before a credential change (`api::creds`) or an exec (`why`): the stream `st`, which this
/// process took over from `from`, goes back there, and comes back to this process's fds as
/// a relay end (`Request::Reclaim`). If `from` cannot take it, it stays, and breaks with the
/// change.
pub(super) fn give_back(s: &Socket, st: &Arc<Stream>, from: ipc::Owner, why: &str) {
    let fds = fdtable::fds_of(s);
    let Some(&first) = fds.first() else { return };
    let (nonblock, _) = fd_flags(first);
    let req = Request::Reclaim {
        token: st.token,
        taker: st.owner(),
    };
    let mut at = from;
    match ipc::call(&mut at, &req, first) {
        Ok((Reply::Relay(_), Some(a))) => {
            set_nonblock(a, nonblock);
            point_fds_at(s, &fds, a);
            raw::close(a);
            s.attach(Attachment::Relayed(Arc::new(Relayed {
                local: st.local,
                peer: st.peer,
                opts_fd: dup_hidden(st.opts_fd),
            })));
            log::info!(
                "fd {first}: rdma stream to {}: given back to pid {} before {why} (relayed)",
                st.peer,
                from.pid
            );
        }
        other => {
            if let Ok((_, Some(fd))) = other {
                raw::close(fd);
            }
            log::warn!(
                "fd {first}: rdma stream to {}: pid {} did not take it back ({:?}): it breaks with {why}",
                st.peer,
                from.pid,
                other.map(|r| r.0)
            );
        }
    }
}

/// Before a credential change: the dual listener `l` keeps only its kernel side (its
/// rdma_cm side could not be driven afterwards); connections already queued for it are
/// refused.
pub(super) fn to_kernel_only(s: &Socket, l: &Arc<Listener>, engine: &crate::engine::Engine) {
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

/// One end of a pair whose other end is already closed: reads see end of stream, writes
/// EPIPE — what a dead connection looks like.
fn dead_end() -> Option<c_int> {
    let (a, b) = unix::stream_pair().ok()?;
    raw::close(b);
    Some(a)
}

/// Makes each of `fds` (this process's fds of `s`) refer to the file behind `file`, keeping
/// each fd's close-on-exec flag and the program's epoll registrations.
fn point_fds_at(s: &Socket, fds: &[c_int], file: c_int) {
    for &fd in fds {
        let flags = if fd_flags(fd).1 { libc::O_CLOEXEC } else { 0 };
        // SAFETY: dup3 onto an fd this process holds for this socket.
        let _ = swap_file(s, fd, || match unsafe { real::dup3(file, fd, flags) } {
            r if r < 0 => Err(std::io::Error::last_os_error()),
            _ => Ok(()),
        });
    }
}

/// Reads away the readiness tokens queued on a listener doorbell's A (`fd`).
fn drain_tokens(fd: c_int) {
    let mut buf = [0u8; 64];
    // SAFETY: a valid buffer; a nonblocking receive on the caller's own fd.
    while unsafe { real::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) }
        == buf.len() as isize
    {}
}

/// `accept4` on a listener another process owns: the owner hands over the next connection
/// of its queue (a kernel TCP socket, or an RDMA stream it relays). Blocks unless the
/// listener or `flags` say otherwise.
pub(super) unsafe fn accept(
    s: &Socket,
    l: &Arc<Listener>,
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
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
            Ok((r, Some(nfd))) => return install_accepted(&r, nfd, addr, len, flags),
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
                    return -1;
                }
                unix::wait(fd, libc::POLLIN, 1000); // readable: the owner's queue has one
            }
            Err(ipc::CallError::Gone) => {
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
                return super::listen::accept4(fd, addr, len, flags); // as a listener of this process now
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
                    return -1;
                }
                unix::wait(fd, libc::POLLIN, 1000);
            }
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
        real::fcntl(nfd, libc::F_SETFD, 0); // ipc delivers it close-on-exec
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

/// Tracks `nfd`, which carries an RDMA stream another process owns: a relay end
/// ([`Reply::Relay`]), or the stream's A ([`Reply::Stream`]), which this process takes over
/// now (or has relayed, where it cannot).
fn attach_rdma(nfd: c_int, r: &Reply, ends: ipc::Ends, nonblock: bool) {
    let _g = crate::guard::enter();
    let ipc::Ends { local, peer } = ends;
    let opts_fd = crate::engine::opts_socket(&peer);
    let attachment = match *r {
        Reply::Stream {
            token,
            owner,
            sizes,
            ..
        } => {
            let sizes = crate::engine::BufSizes::unpack(sizes);
            let facts = Inherited {
                token,
                owner,
                local,
                peer,
                ring_size: sizes.ring,
                send_size: sizes.send,
                opts_fd,
            };
            take_accepted(facts, nfd, nonblock)
        }
        _ => None,
    };
    let attachment = attachment.unwrap_or_else(|| {
        Attachment::Relayed(Arc::new(Relayed {
            local,
            peer,
            opts_fd,
        }))
    });
    if let Attachment::Stream(st) = &attachment {
        st.set_nonblocking(nonblock);
        raw::close(opts_fd); // the stream has its own copy
    }
    let (l, _) = saddr::encode(&local);
    let (p, _) = saddr::encode(&peer);
    track(nfd, |s| {
        s.attach(attachment);
        s.established(nfd, State::Rdma, Path::Rdma, Cause::NONE, &l, &p);
    });
}

/// After `recvmsg` on an fd the shim does not own: the fds the message brought
/// (`SCM_RIGHTS`). Any that is the A of an RDMA stream another process owns (its name says
/// whose: [`ipc::stream_name`]) is made this process's — taken over, or relayed — before
/// the program sees it (Node.js `cluster`, acceptor/worker servers). The sender closing its
/// copy then ends nothing: the owner ends a stream only when no process holds its A.
///
/// # Safety
/// `msg` is the message `recvmsg` just filled.
#[cold]
pub(super) unsafe fn received_rights(msg: *const libc::msghdr) {
    let Some(_g) = crate::guard::enter() else {
        return;
    };
    if !crate::init::enabled() {
        return;
    }
    let mut h = libc::CMSG_FIRSTHDR(msg);
    while !h.is_null() {
        if (*h).cmsg_level == libc::SOL_SOCKET && (*h).cmsg_type == libc::SCM_RIGHTS {
            let data = libc::CMSG_DATA(h).cast::<c_int>();
            let count = ((*h).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize) / 4;
            for i in 0..count {
                received(std::ptr::read_unaligned(data.add(i)));
            }
        }
        h = libc::CMSG_NXTHDR(msg, h);
    }
}

fn received(fd: c_int) {
    if fd < 0 || fdtable::owns(fd) {
        return;
    }
    let Some((owner, token)) = unix::abstract_name(fd).and_then(|n| ipc::parse_stream_name(&n))
    else {
        return; // not an rsock stream: the program's own business
    };
    if owner.is_me() {
        // Our own stream came back through a unix socket: another fd of a socket this
        // process already tracks under its first fd; left as the plain A it is.
        log::info!("fd {fd}: received this process's own rdma stream {token:x}: left as is");
        return;
    }
    let mut at = owner;
    match ipc::call(&mut at, &Request::Describe { token }, fd) {
        Ok((r @ Reply::Described { ends, .. }, _)) => {
            log::debug!(
                "fd {fd}: received rdma stream to {} from pid {}",
                ends.peer,
                owner.pid
            );
            attach_rdma(fd, &as_stream(r), ends, fd_flags(fd).0);
        }
        Ok((
            Reply::Listening {
                token,
                owner,
                sizes,
                local,
            },
            Some(tcp_fd),
        )) => track_foreign_listener(fd, owner, token, sizes, local, tcp_fd),
        other => {
            if let Ok((_, Some(x))) = other {
                raw::close(x);
            }
            log::warn!(
                "fd {fd}: received an rdma socket of pid {}, which did not describe it ({other:?}): left as is",
                owner.pid
            );
        }
    }
}

/// Tracks `fd`, the A of listener `token` that `owner` runs (received with `SCM_RIGHTS`, or
/// passed at exec), as a listener that accepts through its owner; `tcp_fd` is the kernel
/// listener the owner sent, kept for the day the owner is gone.
fn track_foreign_listener(
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
        if s.transition(State::Created, State::Listening) {
            s.attach(Attachment::Listener(l));
        }
    });
    log::info!(
        "fd {fd}: pid {}'s listener on {local}: accepting through it",
        owner.pid
    );
}

/// What a [`Reply::Described`] says, as the [`Reply::Stream`] a worker's accept gets.
fn as_stream(r: Reply) -> Reply {
    match r {
        Reply::Described {
            token,
            owner,
            sizes,
            ends,
        } => Reply::Stream {
            token,
            owner,
            sizes,
            ends,
        },
        r => r,
    }
}

/// A prefork worker got an RDMA stream's A (`nfd`) from the listener's owner: takes the
/// stream over, or else makes `nfd` a relay end of it (the owner relays), or a dead end.
/// `None`: relayed (or dead), attach a [`Relayed`].
fn take_accepted(mut facts: Inherited, nfd: c_int, nonblock: bool) -> Option<Attachment> {
    if let Some(own) = take(&mut facts, nfd) {
        return Some(Attachment::Stream(own));
    }
    let relayed = relay_end(&mut facts.owner, facts.token, nfd, facts.peer);
    if let Some(a) = relayed.or_else(dead_end) {
        let cloexec = if fd_flags(nfd).1 { libc::O_CLOEXEC } else { 0 };
        // SAFETY: dup3 onto the fd this accept is about to return.
        unsafe { real::dup3(a, nfd, cloexec) };
        set_nonblock(nfd, nonblock);
        raw::close(a);
    }
    None
}

/// A kernel TCP listener the shim did not see being made — inherited across `exec`
/// (systemd socket activation's fd 3, nginx's binary upgrade, `LISTEN_FDS` services) —
/// becomes this process's own on first `accept` or `epoll_ctl(ADD)`: tracked, and a dual
/// listener as if its `listen()` had been hooked (kernel TCP only where RDMA cannot serve,
/// without asking again). False, at the cost of a getsockopt, for any other fd.
#[cold]
pub(super) fn adopt_listener(fd: c_int) -> bool {
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
    if !s.transition(State::Created, State::Listening) {
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
fn to_kernel_listener(s: &Socket, l: &Arc<Listener>, for_exec: bool) {
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

/// Before `exec`: owned fds that survive it must be usable by the new image. Streams owned
/// elsewhere on stdio are adopted (relayed: no shim needed); a stream this process took
/// over goes back where it came from and is relayed; its own listeners become the kernel
/// listener they wrap. Streams owned elsewhere on other fds, and listeners owned elsewhere,
/// are left as they are and returned: the new image (given the shim by `with_exec_env`)
/// takes them over, or accepts through the owner, on first use ([`passed_at_exec`]). A
/// stream this process made itself cannot outlive its engine (logged).
pub(super) fn before_exec() -> Vec<c_int> {
    let mut passed = Vec::new();
    if fdtable::high_water() == 0 || raw::in_vfork_child() {
        return passed; // nothing owned; or a vfork child, which must not change its parent's memory
    }
    for fd in 0..fdtable::high_water() as c_int {
        if !fdtable::owns(fd) || fd_flags(fd).1 {
            continue; // not ours, or closed by the exec anyway
        }
        let Some(s) = fdtable::get(fd) else { continue };
        match s.attachment() {
            // Taken over from another process (a fork child, or a worker it was passed to):
            // that process takes it back and relays it, which the new image needs no shim
            // for. One this process made itself has nowhere to go.
            Some(Attachment::Stream(st)) if st.owner().is_me() => match st.taken_from.get() {
                Some(&from) => give_back(&s, &st, from, "an exec"),
                None => log::warn!(
                    "fd {fd}: exec with an RDMA stream this process made itself: the new image cannot use it"
                ),
            },
            // Only a stream on stdio is handed to the new image (inetd, sshd, `--sh-exec`
            // style). One on another number is usually an fd leaked into a program that never
            // reads it; adopting it would send it bytes meant for the process that does.
            Some(Attachment::Stream(st)) if fd <= 2 => {
                adopt(&s, &st); // relayed: the new image needs no shim for it
            }
            Some(Attachment::Stream(_) | Attachment::Passed(_)) => passed.push(fd),
            // Another process's (a fork child execs with its parent's listener: Postfix,
            // inetd `wait` services, a binary upgrade): the new image accepts through the
            // owner, whose rdma_cm listener and queue would otherwise take connections that
            // nobody accepts.
            Some(Attachment::Listener(l)) if !l.owner.is_me() => passed.push(fd),
            Some(Attachment::Listener(l)) => to_kernel_listener(&s, &l, true),
            _ => {}
        }
    }
    passed
}
