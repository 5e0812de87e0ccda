//! Exec hand-over: before `exec`, the owned sockets that survive it are made usable by the
//! new image (relayed, given back, or named to it in `RSOCK_PASSED_FDS`); in the new image,
//! before `main`, the streams and listeners so named are registered, and each is taken over,
//! relayed or accepted through on its first use.

use super::listeners::{to_kernel_listener, track_foreign_listener};
use super::streams::{adopt, as_stream, attach_rdma, dead_end, give_back, point_fds_at};
use crate::api::ownership::{share, track};
use crate::engine::ipc::{self, Reply, Request};
use crate::fdtable;
use crate::socket::{Attachment, Socket};
use crate::sys::fcntl::fd_flags;
use crate::sys::{raw, unix};
use libc::c_int;
use std::sync::Arc;

/// Before `main` of an image that a process exec'd while it held RDMA streams another
/// process owns on fds of 3 or more (named in `RSOCK_PASSED_FDS` by the exec hooks: systemd
/// `Accept=yes` and inetd-style servers pass the connection on fd 3): each such fd that is
/// still that stream's A is registered, to be taken over (or relayed) on first use — not
/// before, since a program that only inherited it must not take it from the process that
/// uses it. No thread, no device, no request: a getsockname per fd.
pub fn passed_at_exec() {
    let passed = std::env::var_os(PASSED_FDS);
    let relayed = std::env::var_os(RELAYED_FDS);
    if passed.is_none() && relayed.is_none() {
        return;
    }
    let Some(_g) = crate::guard::enter() else {
        return;
    };
    if !crate::init::enabled() {
        return;
    }
    if let Some(list) = relayed {
        relayed_at_exec(&list.to_string_lossy());
    }
    let Some(list) = passed else { return };
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

/// The environment variable that says, for an exec'd image, which of its fds are relay ends
/// of RDMA streams and what their addresses are: `FD|DEV|INO|LOCAL|PEER`, comma-separated.
pub const RELAYED_FDS: &str = "RSOCK_RELAYED_FDS";

/// The relay ends of this process that survive an exec, described for the new image
/// ([`RELAYED_FDS`]).
fn relayed_entries() -> Vec<String> {
    (0..fdtable::high_water() as c_int)
        .filter(|&fd| fdtable::owns(fd) && !fd_flags(fd).1)
        .filter_map(|fd| match fdtable::get(fd)?.attachment()? {
            Attachment::Relayed(r) => {
                let (dev, ino) = unix::file_identity(fd)?;
                Some(format!("{fd}|{dev}|{ino}|{}|{}", r.local, r.peer))
            }
            _ => None,
        })
        .collect()
}

/// In an exec'd image, before `main`: the relay ends named in [`RELAYED_FDS`] that are
/// still the same files answer `getpeername`, `getsockname` and options as the connection
/// they carry. Without this a program that reads its peer's address from the socket on its
/// stdin saw an `AF_UNIX` socket (sshd, which re-execs itself per connection, logged
/// "from  port 0", and `from=` in authorized_keys or `Match Address` could not match).
fn relayed_at_exec(list: &str) {
    for entry in list.split(',') {
        let f: Vec<&str> = entry.split('|').collect();
        let [fd, dev, ino, local, peer] = f[..] else {
            continue;
        };
        let (Ok(fd), Ok(dev), Ok(ino), Ok(local), Ok(peer)) = (
            fd.parse::<c_int>(),
            dev.parse::<u64>(),
            ino.parse::<u64>(),
            local.parse::<std::net::SocketAddr>(),
            peer.parse::<std::net::SocketAddr>(),
        ) else {
            continue;
        };
        if fdtable::owns(fd) || unix::file_identity(fd) != Some((dev, ino)) {
            continue; // closed, or another file by now
        }
        let relayed = crate::engine::relay::Relayed {
            local,
            peer,
            opts_fd: crate::engine::opts_socket(&peer),
        };
        track(fd, |s| s.attach(Attachment::Relayed(Arc::new(relayed))));
        log::debug!("fd {fd}: relay end of a stream from {peer}, passed at exec");
    }
}

/// What an exec hands the new image besides the fds themselves: the streams it takes over
/// or accepts through on first use ([`PASSED_FDS`]), and the relay ends' addresses
/// ([`RELAYED_FDS`]).
#[derive(Default)]
pub struct ExecHandOff {
    pub passed: Vec<c_int>,
    pub relayed: Vec<String>,
}

/// First use of a stream this image got across `exec` ([`passed_at_exec`]): its owner says
/// what it is, then it is taken over, or relayed, or — if the owner is gone or does not
/// know it — a dead end, as a connection whose process vanished looks.
pub(super) fn use_passed(s: &Socket, p: &ipc::Passed) -> Attachment {
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

/// Before `exec`: owned fds that survive it must be usable by the new image. Streams owned
/// elsewhere on stdio are adopted (relayed: no shim needed); a stream this process took
/// over goes back where it came from and is relayed; its own listeners become the kernel
/// listener they wrap. Streams owned elsewhere on other fds, and listeners owned elsewhere,
/// are left as they are and returned: the new image (given the shim by `with_exec_env`)
/// takes them over, or accepts through the owner, on first use ([`passed_at_exec`]). A
/// stream this process made itself cannot outlive its engine (logged).
pub(in crate::api) fn before_exec() -> ExecHandOff {
    let mut passed = Vec::new();
    if fdtable::high_water() == 0 || raw::in_vfork_child() {
        // nothing owned; or a vfork child, which must not change its parent's memory
        return ExecHandOff::default();
    }
    // This process's branches go with its image: their owners stop redirecting to them, and
    // a listener that survives the exec is the owner's A again (named, for the new image).
    if let Some(e) = crate::engine::existing() {
        for fd in 0..fdtable::high_water() as c_int {
            if let Some(s) = fdtable::get(fd) {
                if let Some(Attachment::Listener(l)) = s.attachment() {
                    if !l.owner.is_me() {
                        super::listeners::unbranch(&s, &l, e);
                    }
                }
            }
        }
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
    ExecHandOff {
        passed,
        relayed: relayed_entries(),
    }
}
