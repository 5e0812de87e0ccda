//! The progress engine: this process's RDMA streams and listeners, and the helper thread
//! that advances them when no application thread does (docs/DESIGN.md).
//!
//! - [`stream`]: one RDMA-carried TCP stream (protocol + QP + memory + doorbell).
//! - [`listener`]: a dual listener (kernel TCP + rdma_cm on the same address and port).
//! - `setup`: building streams — active connect and passive accept, with the rsock handshake.
//! - `helper`: the thread: rdma_cm events, CQ events, listener fds, teardown of closed streams.
//!
//! One engine per process, made on first use when an RDMA device is present; a forked child
//! gets none and never touches its parent's (the queue pairs are not usable there): it asks
//! the owner over `ipc` instead, and the owner relays (docs/DESIGN.md, "Processes").
//!
//! The engine itself, by job: `singleton` (this process's one engine, and fork), `exit`
//! (the drain at exit), `device` (the devices' CQs and who listens to them), `registry`
//! (streams by QP and by token), `holders` (who holds a socket, and the close once nobody
//! does), `tend` (the helper's pass over the streams by their state), `error` (the engine's
//! error: what failed, its errno and fallback reason), `requests` (other processes'
//! requests), `takeover` (moving a stream between processes).

mod device;
mod error;
mod exit;
mod handover_state;
mod helper;
mod holders;
pub mod ipc;
mod link;
pub mod listener;
mod liveness;
mod peeked;
pub mod program_waits;
mod registry;
pub mod relay;
mod requests;
mod setup;
mod singleton;
mod spin;
mod steps;
pub mod stream;
mod tags;
mod takeover;
mod tend;

use crate::config::Config;
use crate::negcache::NegCache;
use crate::rdma::{EventChannel, Wc};
use libc::c_int;
use registry::QpMap;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, MutexGuard, Once};
use std::time::Duration;

pub use device::Dev;
pub use error::{Error, Why};
pub use exit::{drain_at_exit, drain_at_exit_from_any_context};
pub use holders::{listener_detached, stream_detached, Call};
pub use listener::{Accepted, Listener, RdmaListen};
pub use registry::active;
pub use setup::{opts_socket, BufSizes, OptsSocket};
pub use singleton::{after_fork_child, before_fork, existing, for_new, get, is_owner_process};
pub use stream::Stream;
pub use takeover::{take_over, Inherited, TakeError};

/// See the module doc.
pub struct Engine {
    pid: i32,
    /// Who this engine is to other processes (its ipc address).
    pub owner: ipc::Owner,
    /// Where other processes' requests arrive (none if it could not listen).
    ipc: Option<ipc::Server>,
    /// Set when the process changed its credentials: the kernel refuses this engine's
    /// writes to the verbs and rdma_cm files from then on, so it makes nothing new.
    stale: AtomicBool,
    cfg: &'static Config,
    /// Events of every connected (or accepting) id.
    ch: Arc<EventChannel>,
    streams_by_qp: Mutex<QpMap<Arc<Stream>>>,
    /// Links (engine/link.rs): their streams are routed through them, not by QP.
    links: Mutex<link::Links>,
    /// Destinations the links reach.
    link_hints: Mutex<link::LinkHints>,
    /// Held while a link is set up (connectors to one destination share the first link).
    link_making: Mutex<()>,
    streams_by_token: Mutex<HashMap<u64, Arc<Stream>>>,
    /// Held from an accepted id's move to the engine's event channel until its stream is
    /// registered: the helper waits for it before it calls a cm event's token unknown (a
    /// branch accepts on the program's thread, and the ESTABLISHED event may come first).
    accepting: Mutex<()>,
    listeners: Mutex<HashMap<u64, Arc<Listener>>>,
    /// Branches this process made of listeners other processes own (listener/branch.rs).
    branches: Mutex<listener::Made>,
    /// Destinations whose listener sent our connects to a branch: where the next goes.
    redirects: Mutex<HashMap<std::net::SocketAddr, (crate::proto::Redirect, u32)>>,
    /// Connect requests deferred by all listeners (a full accept queue; listener.rs).
    deferred: std::sync::atomic::AtomicUsize,
    devices: Mutex<Vec<Arc<Dev>>>,
    /// The streams the helper tends, by address: every one the program does not plainly
    /// hold (held elsewhere, moving, closing, moved; `tend.rs`).
    tended: Mutex<HashMap<usize, Arc<Stream>>>,
    /// Streams handed over to another process, by token: requests for them are sent on.
    moved: Mutex<takeover::Moved>,
    /// Streams taken back from an exiting taker for this process's program, whose fds
    /// still name the taker (`api` points them here: [`Engine::take_given_back`]).
    given_back: Mutex<Vec<Arc<Stream>>>,
    /// Streams whose peer moved (token, the taker's port): resumes for the helper to start.
    resumes: Mutex<takeover::Resumes>,
    resume_cv: std::sync::Condvar,
    /// Completions of QPs whose stream is not registered yet (a take-over or resume builds
    /// the QP first), kept in CQ order for it.
    early: Mutex<QpMap<Vec<Wc>>>,
    epfd: c_int,
    wake_fd: c_int,
    /// `_exit` asks the helper to drain (see [`drain_at_exit_from_any_context`]) ...
    exit_asked: AtomicBool,
    /// ... and waits for this eventfd (also the helper's answer to `stop_helper`).
    exit_done_fd: c_int,
    /// Asks the helper to end: the engine is abandoned after a credential change.
    stop_helper: AtomicBool,
    next_token: AtomicU64,
    helper: Once,
    /// The helper thread could not be started (`RLIMIT_NPROC`: haproxy's workers set it
    /// to 0 after their own threads started, to forbid forks).
    helper_failed: AtomicBool,
    /// Destinations that failed RDMA recently.
    pub negcache: NegCache,
    /// How long the poll/select/epoll hooks poll before the real wait (engine/spin.rs).
    poll_budget: spin::Budget,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Engine {
    /// Connects to `dest` over RDMA (blocking, bounded by `RSOCK_CONNECT_TIMEOUT_MS`).
    /// `opts` is a copy of the program's socket, kept for its options.
    pub fn connect(
        &'static self,
        dest: std::net::SocketAddr,
        opts: OptsSocket,
        sizes: BufSizes,
    ) -> Result<Arc<Stream>, crate::stats::Cause> {
        match link::connect(self, dest, opts) {
            link::Outcome::Stream(s) => Ok(s),
            link::Outcome::Fail(cause) => Err(cause),
            link::Outcome::NotHere => setup::connect(self, dest, opts, sizes, None),
            link::Outcome::SentBack(branch) => {
                setup::connect(self, dest, opts, sizes, Some(branch))
            }
        }
    }

    /// Every stream of this process: those on their own queue pair and those on links.
    pub(super) fn all_streams(&self) -> Vec<Arc<Stream>> {
        let mut v: Vec<Arc<Stream>> = lock(&self.streams_by_qp).values().cloned().collect();
        let links = lock(&self.links).all();
        for l in links {
            v.extend(l.members());
        }
        v
    }

    /// How long a closed stream may take to deliver its queued bytes.
    fn linger(&self) -> Duration {
        Duration::from_secs(10)
    }

    /// `RSOCK_SPIN_US`.
    pub(super) fn spin_max(&self) -> Duration {
        Duration::from_micros(u64::from(self.cfg.spin_us))
    }

    /// The negative cache's time-to-live.
    pub fn neg_ttl(&self) -> Duration {
        Duration::from_millis(self.cfg.neg_cache_ms as u64)
    }
}
