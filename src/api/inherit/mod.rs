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
//!
//! Rooms: `streams` — take-over and adoption of streams; `listeners` — listeners another
//! process owns or the shim did not see made; `exec` — the hand-over across `exec`;
//! `received` — fds received with `SCM_RIGHTS`.

mod exec;
mod listeners;
mod received;
mod streams;

pub use exec::passed_at_exec;
pub(super) use exec::{before_exec, ExecHandOff, PASSED_FDS, RELAYED_FDS};
pub(super) use listeners::{
    accept, adopt_listener, branch_before_wait, to_kernel_only, unbranch, Accepted,
};
pub(super) use received::received_rights;
pub(super) use streams::{
    give_back, onto_stdio, reattach_given_back, relay_for_libc, relay_for_sending,
};

use crate::engine::Stream;
use crate::socket::{Attachment, Socket};
use std::sync::Arc;

/// What carries `s` for this process: its attachment, with a stream owned by another
/// process adopted first (so the answer is never another process's stream).
pub(in crate::api) fn here(s: &Socket) -> Option<Attachment> {
    match s.attachment()? {
        Attachment::Stream(st) if !st.owner().is_me() => Some(streams::take_or_adopt(s, &st)),
        Attachment::Passed(p) => Some(exec::use_passed(s, &p)),
        a => Some(a),
    }
}

/// The stream carrying `s` in this process, if it is one of this process's own.
pub(in crate::api) fn stream(s: &Socket) -> Option<Arc<Stream>> {
    match here(s)? {
        Attachment::Stream(st) => Some(st),
        _ => None,
    }
}
