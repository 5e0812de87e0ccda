//! Credential changes: `setuid` and its family, `capset`, and the `prctl` options and raw
//! system calls that install credentials ([`changes_credentials`]). The kernel lets only
//! the credentials that opened the verbs and rdma_cm files write to them
//! (`ib_safe_file_access` compares the very credentials object; Soft-RoCE even posts
//! through `write`), and each of those calls installs a new one even when no id or
//! capability changes: Dovecot's master drops capabilities with `capset` after it listens,
//! and its next post failed with EACCES. So before one, what this process's engine drives
//! must go where it can still be driven:
//!
//! - a stream this process took over (a fork child that read its request before dropping
//!   root, as rsyncd's children do) is handed back to the process it came from, which
//!   relays it to this one (`Request::Reclaim`);
//! - a listener it owns keeps only its kernel side: new connections use kernel TCP;
//! - the engine makes nothing new (`engine::for_new`): later connections use kernel TCP.
//!
//! Unless nothing of the engine is in use but listeners — a daemon that listens as root and
//! drops root before its first connection (memcached `-u`, tinyproxy, stunnel; not on a
//! privileged port, which rdma_cm refuses to the new credentials):
//! then the engine is abandoned, and at the process's next accept, epoll_ctl, epoll_create
//! or fork ([`relisten_if_pending`]) a new one, made with the new credentials, listens on RDMA
//! again for those listeners. Not at once: daemons change groups, gid and uid in three calls,
//! and an engine made between them would be abandoned again.
//!
//! Workers that drop root before they touch a connection (nginx, Apache, gunicorn) have no
//! engine yet when they do: theirs is made afterwards, with the new credentials.

#![allow(clippy::missing_safety_doc)] // each fn has its libc namesake's contract

use super::ownership::keep_errno;
use crate::engine;
use crate::fdtable;
use crate::guard;
use crate::socket::{Attachment, SocketState};
use crate::stats::{Cause, Detail, Fallback};
use crate::sys::{fcntl, real, sockaddr as saddr};
use libc::{c_int, gid_t, size_t, uid_t};
use std::sync::atomic::{AtomicBool, Ordering::*};

/// Listeners wait to listen on RDMA again, with an engine of the new credentials.
static RELISTEN: AtomicBool = AtomicBool::new(false);

macro_rules! cred_hooks {
    ($( fn $name:ident($($arg:ident: $ty:ty),*); )*) => {
        $(
            pub unsafe fn $name($($arg: $ty),*) -> c_int {
                before_change();
                real::$name($($arg),*)
            }
        )*
    };
}

cred_hooks! {
    fn setuid(uid: uid_t);
    fn setgid(gid: gid_t);
    fn seteuid(uid: uid_t);
    fn setegid(gid: gid_t);
    fn setreuid(r: uid_t, e: uid_t);
    fn setregid(r: gid_t, e: gid_t);
    fn setresuid(r: uid_t, e: uid_t, s: uid_t);
    fn setresgid(r: gid_t, e: gid_t, s: gid_t);
    fn setgroups(n: size_t, list: *const gid_t);
    fn initgroups(user: *const libc::c_char, group: gid_t);
    fn capset(hdr: *mut libc::c_void, data: *mut libc::c_void);
}

/// Whether the system call `n` (with its first two arguments) installs new credentials for
/// the calling thread: the `set*id` family, `capset`, a session keyring joined, and the
/// `prctl` options of [`prctl_changes_credentials`]. Those made through `syscall(2)` change
/// only the calling thread's (glibc's wrappers change every thread's).
pub(super) fn changes_credentials(n: libc::c_long, a1: libc::c_long, a2: libc::c_long) -> bool {
    /// keyctl(2)'s KEYCTL_JOIN_SESSION_KEYRING (pam_keyinit's), which installs credentials.
    const KEYCTL_JOIN_SESSION_KEYRING: libc::c_long = 1;
    match n {
        libc::SYS_setuid
        | libc::SYS_setgid
        | libc::SYS_setreuid
        | libc::SYS_setregid
        | libc::SYS_setresuid
        | libc::SYS_setresgid
        | libc::SYS_setgroups
        | libc::SYS_capset => true,
        libc::SYS_keyctl => a1 == KEYCTL_JOIN_SESSION_KEYRING,
        libc::SYS_prctl => prctl_changes_credentials(a1 as c_int, a2 as libc::c_ulong),
        _ => false,
    }
}

/// Whether `prctl(option, a2, ...)` installs new credentials: the bounding set, the secure
/// bits (`PR_SET_KEEPCAPS` among them) and the ambient set (not its query).
pub(super) fn prctl_changes_credentials(option: c_int, a2: libc::c_ulong) -> bool {
    match option {
        libc::PR_SET_KEEPCAPS | libc::PR_CAPBSET_DROP | libc::PR_SET_SECUREBITS => true,
        libc::PR_CAP_AMBIENT => a2 != libc::PR_CAP_AMBIENT_IS_SET as libc::c_ulong,
        _ => false,
    }
}

/// What a credential change needs done first (see the module's doc). Idempotent: after the
/// engine is abandoned or retired, the next change finds nothing to do.
pub(super) fn before_change() {
    if fdtable::high_water() == 0 {
        return; // the shim never owned an fd here
    }
    let Some(_g) = guard::enter() else {
        return;
    };
    let Some(e) = engine::existing() else {
        return; // nothing was opened with the old credentials
    };
    keep_errno(|| {
        let mut made_here = Vec::new();
        for fd in 0..fdtable::high_water() as c_int {
            let Some(s) = fdtable::get(fd) else { continue };
            match s.attachment() {
                Some(Attachment::Stream(st)) if st.owner().is_me() => {
                    match st.taken_from.get().copied() {
                        Some(from) => {
                            super::inherit::give_back(&s, &st, from, "a credential change")
                        }
                        None => {
                            log::warn!(
                                "fd {fd}: rdma stream to {}: this process changes its credentials and made it itself: it cannot be driven afterwards",
                                st.peer
                            );
                            made_here.push(st.clone());
                        }
                    }
                }
                Some(Attachment::Listener(l)) if l.owner.is_me() => {
                    s.set_backlog(l.backlog());
                    super::inherit::to_kernel_only(&s, &l, e);
                }
                Some(Attachment::Listener(l)) => super::inherit::unbranch(&s, &l, e),
                _ => {}
            }
        }
        // What the program already wrote goes out first (posting needs the old credentials).
        e.send_all_before_credential_change(&made_here);
        let retired = e.retire_for_new_credentials();
        if e.abandon_for_new_credentials() {
            log::info!("credentials change: the RDMA engine is abandoned; listeners use RDMA again, with a new engine, from the next accept, epoll_create, epoll_ctl or fork");
            RELISTEN.store(true, Release);
        } else if retired {
            log::info!("credentials change: new connections of this process use kernel TCP");
        }
    });
}

/// Called by the calls a server makes after it dropped root — accept and epoll_ctl on a
/// socket the shim owns, epoll_create, fork — never on a path a foreign fd takes alone (poll,
/// select and the waits keep their one load): one atomic load unless a credential change
/// left listeners to listen on RDMA again. A daemon that only polls its listener gets RDMA
/// back from its first accept (that first connection is on kernel TCP).
#[inline]
pub(super) fn relisten_if_pending() {
    if RELISTEN.load(Relaxed) {
        relisten();
    }
}

#[cold]
fn relisten() {
    let Some(_g) = guard::enter() else {
        return; // the shim's own call: the program's next one does it
    };
    if !RELISTEN.swap(false, AcqRel) {
        return;
    }
    keep_errno(|| {
        for fd in 0..fdtable::high_water() as c_int {
            let Some(s) = fdtable::get(fd) else { continue };
            let lost = s
                .tcp_only()
                .is_some_and(|w| w.detail == Detail::CredentialsChanged);
            if s.state() != SocketState::Listening || s.attachment().is_some() || !lost {
                continue;
            }
            let backlog = match s.backlog() {
                0 => libc::SOMAXCONN,
                b => b,
            };
            // The kernel listener's file stays nonblocking (an engine thread shared it); the
            // program's view of it is `blocking_accept`.
            let nonblock = fcntl::fd_flags(fd).0 && !s.blocking_accept();
            let bound = super::ownership::local_addr(fd);
            match super::dual::rdma_listen(fd, backlog) {
                Ok((engine, local, rl)) => {
                    s.set_tcp_only(Cause::NONE);
                    super::dual::start_dual(&s, fd, engine, local, rl, backlog);
                    if let Some(Attachment::Listener(l)) = s.attachment() {
                        s.set_blocking_accept(false); // the doorbell blocks as asked
                        l.set_nonblocking(nonblock);
                        let _ = l.bell().set_file_nonblocking(nonblock);
                        log::info!("fd {fd}: listening on {local} over RDMA again, with the new credentials");
                    }
                }
                Err(why) => {
                    // SAFETY: `bound` holds the address getsockname wrote, and its length.
                    let port = unsafe { saddr::read(bound.as_ptr().cast(), bound.len() as _) }
                        .map_or(0, |a| a.port());
                    if port < 1024 {
                        // rdma_cm, like the kernel's TCP, lets only CAP_NET_BIND_SERVICE
                        // listen on a privileged port, and root's was dropped with root.
                        log::info!("fd {fd}: kernel TCP only: port {port} is privileged, and rdma_cm refuses it to this process's new credentials (listen on a port >= 1024, or keep CAP_NET_BIND_SERVICE)");
                    } else {
                        log::info!("fd {fd}: kernel TCP only after the credential change: {why}");
                    }
                    s.set_tcp_only(Cause::new(
                        Fallback::RdmaUnavailable,
                        Detail::CredentialsChanged,
                    ));
                }
            }
            s.listening(fd, &bound);
        }
    });
}
