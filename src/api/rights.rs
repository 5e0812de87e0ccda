//! Sending an RDMA stream's fd with `SCM_RIGHTS` to a process without the shim.
//!
//! A stream's fd is its doorbell's A, which only a shim can use: a process that receives it
//! (Node.js `cluster`, an acceptor handing connections to workers) takes it over or has it
//! relayed (`inherit::received_rights`) — if the shim is loaded there. A receiver without
//! it would read doorbell tokens. So before the message goes out, the sender looks at the
//! process at the other end of the unix socket (`SO_PEERCRED`): if its memory map does not
//! show this library, each stream's fd in the message is replaced by a relay end, a plain
//! stream socket the owner feeds (docs/DESIGN.md, "Processes").

use super::inherit;
use crate::fdtable;
use crate::socket::Attachment;
use crate::sys::{cmsg, raw, real, unix};
use libc::{c_int, msghdr, ssize_t};

/// `sendmsg` on a unix socket whose message carries fds (`msg_controllen > 0`): `None` when
/// it goes out as it is (no RDMA stream in it, or a receiver with the shim); else the result
/// of sending it with relay ends in place of the streams.
///
/// # Safety
/// `msg` is the program's message for `sendmsg`.
#[cold]
pub(super) unsafe fn sending(fd: c_int, msg: *const msghdr, flags: c_int) -> Option<ssize_t> {
    if msg.is_null() || (*msg).msg_control.is_null() {
        return None;
    }
    let _g = crate::guard::enter()?;
    if !crate::init::enabled() {
        return None;
    }
    let control =
        std::slice::from_raw_parts((*msg).msg_control.cast::<u8>(), (*msg).msg_controllen);
    let mut copy = control.to_vec();
    let mut m: msghdr = *msg;
    m.msg_control = copy.as_mut_ptr().cast();
    let mut ends = Vec::new();
    let mut checked = None;
    for slot in cmsg::rights_slots(&m) {
        let sent = std::ptr::read_unaligned(slot);
        if sent < 0 || !fdtable::owns(sent) {
            continue;
        }
        let Some(s) = fdtable::get(sent) else {
            continue;
        };
        match s.attachment() {
            Some(Attachment::Stream(_)) => {}
            Some(Attachment::Listener(l)) => {
                // A shim there asks for its description; this process's exit waits for it.
                if *checked.get_or_insert_with(|| receiver_has_shim(fd)) {
                    l.sent_away();
                }
                continue;
            }
            _ => continue,
        }
        if *checked.get_or_insert_with(|| receiver_has_shim(fd)) {
            return None; // it takes the stream over itself
        }
        match inherit::relay_for_sending(&s, sent) {
            Some(end) => {
                std::ptr::write_unaligned(slot, end);
                ends.push(end);
            }
            None => log::warn!(
                "fd {sent}: rdma stream sent to a process without rsock, and no relay: it gets the bare socket"
            ),
        }
    }
    if ends.is_empty() {
        return None;
    }
    let r = real::sendmsg(fd, &m, flags);
    super::ownership::keep_errno(|| {
        ends.iter().for_each(|&e| raw::close(e));
        log::info!(
            "fd {fd}: {} rdma stream(s) sent to a process without rsock as relay ends",
            ends.len()
        );
    });
    Some(r)
}

/// Whether the process at the other end of unix socket `fd` has this library loaded. A
/// socket without a peer process (unconnected), or one this process made with
/// `socketpair` (its peer credentials are its own), counts as having it: nothing better
/// is known, and a shim there is what a fork child has.
fn receiver_has_shim(fd: c_int) -> bool {
    let Some(peer) = unix::peer_cred(fd) else {
        return true;
    };
    if peer.pid <= 0 || peer.pid == raw::pid() {
        return true;
    }
    let Some(me) = super::process::own_path() else {
        return true;
    };
    let path = format!("/proc/{}/maps\0", peer.pid);
    let mfd = raw::open(path.as_bytes(), libc::O_RDONLY, 0);
    if mfd < 0 {
        return false; // another user's process: not readable, so not known to have it
    }
    let maps = unix::read_file(mfd, 16 << 20);
    raw::close(mfd);
    maps.is_ok_and(|m| m.windows(me.len()).any(|w| w == me.as_bytes()))
}
