//! Credential changes: `setuid` and its family. The kernel lets only the credentials that
//! opened the verbs and rdma_cm files write to them (`ib_safe_file_access`; Soft-RoCE even
//! posts through `write`), and any successful `set*id` call installs new credentials. So
//! before one, what this process's engine drives must go where it can still be driven:
//!
//! - a stream this process took over (a fork child that read its request before dropping
//!   root, as rsyncd's children do) is handed back to the process it came from, which
//!   relays it to this one (`Request::Reclaim`);
//! - a listener it owns keeps only its kernel side: new connections use kernel TCP;
//! - the engine makes nothing new (`engine::for_new`): later connections use kernel TCP.
//!
//! Workers that drop root before they touch a connection (nginx, Apache, gunicorn) have no
//! engine yet when they do: theirs is made afterwards, with the new credentials.

#![allow(clippy::missing_safety_doc)] // each fn has its libc namesake's contract

use super::ownership::keep_errno;
use crate::engine;
use crate::fdtable;
use crate::guard;
use crate::socket::Attachment;
use crate::sys::real;
use libc::{c_int, gid_t, size_t, uid_t};

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
}

fn before_change() {
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
        for fd in 0..fdtable::high_water() as c_int {
            let Some(s) = fdtable::get(fd) else { continue };
            match s.attachment() {
                Some(Attachment::Stream(st)) if st.owner().is_me() => {
                    match st.taken_from.get().copied() {
                        Some(from) => super::inherit::give_back(&s, &st, from, "a credential change"),
                        None => log::warn!(
                            "fd {fd}: rdma stream to {}: this process changes its credentials and made it itself: it cannot be driven afterwards",
                            st.peer
                        ),
                    }
                }
                Some(Attachment::Listener(l)) if l.owner.is_me() => {
                    super::inherit::to_kernel_only(&s, &l, e);
                }
                _ => {}
            }
        }
        if e.retire_for_new_credentials() {
            log::info!("credentials change: new connections of this process use kernel TCP");
        }
    });
}
