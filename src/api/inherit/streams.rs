//! Streams another process owns, made this process's on first use: **taken over** (its end
//! of the connection moves to this process's engine) or else **adopted** (the owner relays it
//! over a fresh socketpair); and the way back — a stream this process took over is given
//! back before an exec or a credential change.

use crate::api::ownership::{swap_file, track};
use crate::engine::ipc::{self, Reply, Request};
use crate::engine::relay::Relayed;
use crate::engine::{Inherited, Stream, TakeError};
use crate::fdtable;
use crate::socket::{Attachment, Socket, SocketState};
use crate::stats::{Cause, Path};
use crate::sys::fcntl::{dup_hidden, fd_flags, set_nonblock};
use crate::sys::raw;
use crate::sys::{real, sockaddr as saddr, unix};
use libc::c_int;
use std::sync::Arc;

/// `dup2` put `s` on stdio: a stream another process owns is relayed now rather than at
/// first use. A server that hands a connection to a child on stdio (inetd style; vsftpd's
/// session process) may take away the means to set a relay up before it reads: vsftpd sets
/// `RLIMIT_NOFILE` to 0 and installs a seccomp filter, after which the request to the owner
/// fails and the connection would hang.
///
/// A stream this process made itself is relayed to its own fds too: stdio's `FILE`s on fds
/// 0–2 (`printf`, `puts`, `perror`) read and write there inside libc, where no hook sees
/// them; and an exec would not keep the stream anyway. One it took over stays as it is:
/// an exec gives that back to the process it came from (`give_back`).
pub(in crate::api) fn onto_stdio(s: &Socket) {
    if let Some(Attachment::Stream(st)) = s.attachment() {
        if !st.owner().is_me() {
            let _ = take_or_adopt(s, &st);
        } else if st.taken_from.get().is_none() {
            relay_for_libc(s);
        }
    }
}

/// Points the program's fds of streams taken back from an exiting taker (a fork child that
/// used them, `Request::Reclaim`) at the streams here — before a fork, so that the next
/// child asks this process for them, not the taker that is gone (the program's own next
/// call finds them anyway, in `take_or_adopt`). One load or two when there are none.
pub(in crate::api) fn reattach_given_back() {
    let Some(e) = crate::engine::existing() else {
        return;
    };
    let back = e.take_given_back();
    if back.is_empty() {
        return;
    }
    let _g = crate::guard::enter();
    for fd in 0..fdtable::high_water().min(fdtable::MAX_FDS) as c_int {
        let Some(sock) = fdtable::get(fd) else {
            continue;
        };
        let Some(Attachment::Stream(st)) = sock.attachment() else {
            continue;
        };
        if let Some(s) = back
            .iter()
            .find(|s| s.token == st.token && !Arc::ptr_eq(s, &st))
        {
            s.set_nonblocking(fd_flags(fd).0);
            sock.attach(Attachment::Stream(s.clone()));
        }
    }
}

/// Makes the inherited stream `st` this process's own (take-over), or else a relayed socket.
pub(super) fn take_or_adopt(s: &Socket, st: &Arc<Stream>) -> Attachment {
    let _g = crate::guard::enter();
    let fds = fdtable::fds_of(s);
    let Some(&first) = fds.first() else {
        return Attachment::Stream(st.clone());
    };
    // Taken back from a fork child that used it and exited: this engine's again.
    if let Some(own) = crate::engine::existing().and_then(|e| e.given_back(st)) {
        log::debug!("fd {first}: rdma stream to {}: given back here", st.peer);
        own.set_nonblocking(fd_flags(first).0);
        let a = Attachment::Stream(own);
        s.attach(a.clone());
        return a;
    }
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

/// Makes the inherited stream `st` a relayed socket in this process: every fd of it now
/// refers to a relay end the owner serves. If the owner cannot serve it (gone, or the
/// stream is closed there), the fds read end of stream and writes fail, as on a dead socket.
pub(super) fn adopt(s: &Socket, st: &Arc<Stream>) -> Attachment {
    let _g = crate::guard::enter();
    let fds = fdtable::fds_of(s);
    let Some(&first) = fds.first() else {
        return Attachment::Stream(st.clone());
    };
    let (nonblock, _) = fd_flags(first);
    let mut owner = st.owner();
    let end = relay_end(&mut owner, st.token, first, st.peer);
    if let Some(a) = end.or_else(dead_end) {
        onto_relay_end(s, &fds, a, nonblock);
    }
    st.bell().release_app(); // this process's copy of the old doorbell
    let relayed = relayed_of(st);
    s.attach(relayed.clone());
    if end.is_some() {
        let (local, _) = saddr::encode(&st.local);
        let (peer, _) = saddr::encode(&st.peer);
        s.established(
            first,
            SocketState::Rdma,
            Path::Rdma,
            Cause::NONE,
            &local,
            &peer,
        );
        log::debug!(
            "fd {first}: rdma stream to {} adopted from pid {} (relayed)",
            st.peer,
            st.owner().pid
        );
    }
    relayed
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
pub(in crate::api) fn relay_for_sending(s: &Socket, fd: c_int) -> Option<c_int> {
    match s.attachment()? {
        Attachment::Stream(st) if st.owner().is_me() => crate::engine::get()?.relay_end(&st),
        Attachment::Stream(st) => relay_end(&mut st.owner(), st.token, fd, st.peer),
        _ => None,
    }
}

/// The program hands `s` (on RDMA) to code inside libc that reads and writes its fds out of
/// the hooks' sight (`api::stdio`): from now on every fd of it carries the stream's bytes as
/// a plain kernel socket — a relay end, served by the owner; by this process's engine for a
/// stream of its own, which the program's fds then no longer hold (the relay does).
pub(in crate::api) fn relay_for_libc(s: &Socket) {
    let a = match s.attachment() {
        Some(Attachment::Stream(st)) if !st.owner().is_me() => {
            adopt(s, &st);
            return;
        }
        Some(Attachment::Passed(_)) => super::here(s),
        a => a,
    };
    let Some(Attachment::Stream(st)) = a else {
        return; // a relay end already, or a listener
    };
    if st.life().released() {
        return; // handed over to another process: nothing here to relay
    }
    let fds = fdtable::fds_of(s);
    let Some(&first) = fds.first() else { return };
    let Some(a) = crate::engine::get().and_then(|e| e.relay_end_for_self(&st)) else {
        log::warn!("fd {first}: rdma stream to {}: no relay for stdio", st.peer);
        return;
    };
    onto_relay_end(s, &fds, a, fd_flags(first).0);
    s.attach(relayed_of(&st));
    log::debug!(
        "fd {first}: rdma stream to {}: relayed to this process's fds (stdio)",
        st.peer
    );
    crate::engine::stream_detached(st);
}

/// Before a credential change (`api::creds`) or an exec (`why`): the stream `st`, which this
/// process took over from `from`, goes back there, and comes back to this process's fds as
/// a relay end (`Request::Reclaim`). If `from` cannot take it, it stays, and breaks with the
/// change.
pub(in crate::api) fn give_back(s: &Socket, st: &Arc<Stream>, from: ipc::Owner, why: &str) {
    let fds = fdtable::fds_of(s);
    let Some(&first) = fds.first() else { return };
    let (nonblock, _) = fd_flags(first);
    let req = Request::Reclaim {
        token: st.token,
        taker: st.owner(),
        exiting: false,
    };
    let mut at = from;
    match ipc::call(&mut at, &req, first) {
        Ok((Reply::Relay(_), Some(a))) => {
            onto_relay_end(s, &fds, a, nonblock);
            s.attach(relayed_of(st));
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

/// Tracks `nfd`, which carries an RDMA stream another process owns: a relay end
/// ([`Reply::Relay`]), or the stream's A ([`Reply::Stream`]), which this process takes over
/// now (or has relayed, where it cannot).
pub(super) fn attach_rdma(nfd: c_int, r: &Reply, ends: ipc::Ends, nonblock: bool) {
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
                on_link: false, // the owner relays a link's stream itself
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
        s.established(nfd, SocketState::Rdma, Path::Rdma, Cause::NONE, &l, &p);
    });
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

/// What a [`Reply::Described`] says, as the [`Reply::Stream`] a worker's accept gets.
pub(super) fn as_stream(r: Reply) -> Reply {
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

/// Makes `fds` (this process's fds of `s`) the relay end `a` (then closed here), with the
/// file status `nonblock` the program had set.
fn onto_relay_end(s: &Socket, fds: &[c_int], a: c_int, nonblock: bool) {
    set_nonblock(a, nonblock);
    point_fds_at(s, fds, a);
    raw::close(a);
}

/// What a socket relayed to this process is, for the stream `st` it carries.
fn relayed_of(st: &Stream) -> Attachment {
    Attachment::Relayed(Arc::new(Relayed {
        local: st.local,
        peer: st.peer,
        opts_fd: dup_hidden(st.opts_fd),
    }))
}

/// One end of a pair whose other end is already closed: reads see end of stream, writes
/// EPIPE — what a dead connection looks like.
pub(super) fn dead_end() -> Option<c_int> {
    let (a, b) = unix::stream_pair().ok()?;
    raw::close(b);
    Some(a)
}

/// Makes each of `fds` (this process's fds of `s`) refer to the file behind `file`, keeping
/// each fd's close-on-exec flag and the program's epoll registrations.
pub(super) fn point_fds_at(s: &Socket, fds: &[c_int], file: c_int) {
    for &fd in fds {
        let flags = if fd_flags(fd).1 { libc::O_CLOEXEC } else { 0 };
        // SAFETY: dup3 onto an fd this process holds for this socket.
        let _ = swap_file(s, fd, || match unsafe { real::dup3(file, fd, flags) } {
            r if r < 0 => Err(std::io::Error::last_os_error()),
            _ => Ok(()),
        });
    }
}
