//! One RDMA-carried TCP stream: the protocol state machine, its QP and registered memory,
//! and the doorbell that shows its state on the program's fd.
//!
//! Locking: `inner` is held only for short, non-blocking steps. Nobody holds it while polling
//! the CQ (which locks other streams) or while sleeping; completions reach a stream through
//! [`Stream::on_completion`], called by whoever polls its device's CQ, one at a time per device
//! so that a stream sees its completions in CQ order.
//!
//! Here: the stream, what it is made of (`Inner`), and what it answers at once. Beside it, one
//! job a file: `completions.rs` (what the transport tells it), `pump.rs` (posting what the
//! protocol wants after any change), `grow.rs` (buffers that grow), `doorbell.rs` (what the
//! program's fd shows), `relays.rs` (relays to other processes, and who holds it), `io.rs`
//! (recv, send, shutdown), `close.rs` (calls in progress, close, teardown), `port.rs` (the
//! seam: what a stream needs of its QP and of whoever polls its completions), `wait.rs`
//! (spinning and sleeping), `options.rs` (timeouts, keepalive), `handover.rs` (moving
//! between processes), `life.rs` (where it is in its life), `mem.rs`, `tests.rs`,
//! `props.rs`, `life_tests.rs` (the in-memory port and the in-process tests).

mod close;
mod completions;
mod dev_qp;
mod doorbell;
mod grow;
mod handover;
mod io;
mod life;
#[cfg(test)]
mod life_tests;
#[cfg(test)]
mod mem;
mod options;
mod port;
#[cfg(test)]
mod props;
mod pump;
mod relays;
#[cfg(test)]
mod tests;
mod wait;
pub(super) use wait::Asleep;

use super::ipc::Owner;
use super::liveness;
use super::peeked::Peeked;
use super::relay;
use super::spin::Budget;
use super::Dev;
use crate::proto::{self, Readiness};
use crate::readiness::Doorbell;
pub use dev_qp::{LinkEnd, LinkSlot, StreamBuf, StreamQp};
use grow::{buf_sizes, Rate};
use libc::c_int;
use life::Lifecycle;
pub use life::{Event, Life, Phase};
pub use port::{Buf, Port, QueuePair, Region, Written};
use std::mem::ManuallyDrop;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// wr_id bit: the protocol asked for this completion (the verbs layer may signal more).
pub(crate) const PROTO_SIGNALED: u64 = 1 << 62;
/// wr_id of receive WRs (their completions are told apart by the verbs layer's flag).
const RECV_WR: u64 = 0;
/// wr_id of a keepalive probe (a zero-length WRITE the protocol does not account).
pub(crate) const PROBE_WR: u64 = 1 << 61;

pub use crate::proto::Want;

/// An RDMA stream (see the module doc). `P` is where its completions come from: the RDMA
/// device, or the in-memory port of the tests.
pub struct Stream<P: Port = Dev> {
    inner: Mutex<Inner<P>>,
    bell: Doorbell,
    pub(super) dev: Arc<P>,
    /// The QP's number (a resume moves the stream to a new QP).
    qp_num: AtomicU32,
    /// It is a stream of a link (engine/link.rs): its queue pair is shared.
    pub(super) on_link: bool,
    pub token: u64,
    /// The connection's id from the handshake (a resume proves itself with it).
    pub conn_id: u64,
    /// Sizes of the ring and send buffer now (high and low 32 bits; they grow under
    /// load): what a taker registers.
    sizes: AtomicU64,
    /// Local address (rdma_cm's view).
    pub local: SocketAddr,
    /// Peer address.
    pub peer: SocketAddr,
    /// The program's `O_NONBLOCK` (a file flag of A; cached here, updated by the hooks).
    nonblocking: AtomicBool,
    /// An unconnected kernel TCP socket that holds the program's socket options.
    pub opts_fd: c_int,
    /// For an accepted stream not yet established: the listener to queue it on.
    pub(super) pending_for: AtomicU64,
    /// `RSOCK_SPIN_US`: the longest a blocked call polls before sleeping ...
    spin: Duration,
    /// ... and how long it polls now (adapted to how soon waits end).
    budget: Budget,
    /// SO_RCVTIMEO / SO_SNDTIMEO in µs (0: none), mirrored from `opts_fd`.
    timeouts_us: [AtomicU64; 2],
    /// The process whose engine drives this stream (changed by a hand-over; atomics, so
    /// that a fork child reads its copy without a lock).
    owner_pid: AtomicI32,
    owner_nonce: AtomicU64,
    /// The process this one took the stream over from, if it did: the one to give it back to
    /// before a credential change, an exec or this process's exit (`Request::Reclaim`).
    pub taken_from: std::sync::OnceLock<Owner>,
    /// Where it is in its life (stream/life.rs).
    life: Lifecycle,
    /// The options fd is closed (by the teardown, or by the program's last close after a
    /// move, whichever comes to it: exactly once).
    opts_closed: AtomicBool,
    /// The helper watches the doorbell's B for the last other holder of A.
    pub(super) hold_watched: AtomicBool,
    /// Program calls in progress on it, and [`CLOSE_DEFERRED`]: see [`Stream::defer_close`].
    calls: AtomicU32,
    /// Relayed to its own program's fds while program calls were in progress on it: the
    /// relay takes the stream's bytes only once they have ended (see `relay_after_calls`).
    relay_waits: AtomicBool,
    /// Keepalive or a user timeout is on: the helper ticks it (counted in [`TIMED`]).
    timed: AtomicBool,
    /// The program set `SO_LINGER` on with a zero timeout: close resets (see
    /// `resets_on_close`).
    linger_zero: AtomicBool,
    /// Someone may look at the doorbell's A outside the shim's own data calls (the program
    /// polled it or put it in an epoll set, or another process holds it): readiness moves it
    /// on every change. Until then only a thread sleeping in [`wait`](Self::wait) needs it.
    watched: AtomicBool,
    /// Another process may poll A (its holder forked): its completions must be handled
    /// even while this process waits nowhere the shim sees, so the helper listens.
    shared: AtomicBool,
}

/// Watched streams of this process: while there are any, the helper also polls the CQs on
/// a short timer, a safety net for waits the hooks do not see (a raw `epoll_wait` syscall).
pub(super) static WATCHED: AtomicUsize = AtomicUsize::new(0);

/// Streams of this process with keepalive or a user timeout on (the helper then ticks).
pub(super) static TIMED: AtomicUsize = AtomicUsize::new(0);

/// In [`Stream::calls`]: the program closed its last fd while a call was in progress.
const CLOSE_DEFERRED: u32 = 1 << 31;

pub(super) struct Inner<P: Port = Dev> {
    pub(super) rc: Option<P::Qp>,
    pub(super) proto: proto::Conn,
    /// Taken in Drop (after the QP, then recycled): read through `Deref`.
    ring: ManuallyDrop<Buf<P>>,
    send: ManuallyDrop<Buf<P>>,
    /// Bigger memory the protocol asked for (proto/conn/grow.rs), until it takes over.
    next_ring: Option<Buf<P>>,
    next_send: Option<Buf<P>>,
    recvs_owed: u32,
    /// What the doorbell's A shows (it lags the protocol while nobody looks; see `show`).
    pub(super) shown: Readiness,
    /// Program threads sleeping in `wait` on A.
    sleepers: u32,
    /// Counted in the device's demand for the helper (see `Dev::demand_up`).
    demand: bool,
    /// When the program's last fd closed (the stream lingers to deliver queued bytes).
    pub(super) closed_at: Option<Instant>,
    pub(super) draining: bool,
    /// Relays to other processes (docs/DESIGN.md, "Processes").
    relays: Vec<relay::End>,
    /// Bounce buffer of the relays (allocated with the first).
    scratch: Vec<u8>,
    /// What MSG_PEEK showed of the unread head (the ring may change under it).
    peeked: Peeked,
    /// Keepalive and user timeout, as the program set them ...
    live: liveness::Settings,
    /// ... and their clocks.
    timers: liveness::Timers,
    /// Send position a probe in flight follows, and the last one a probe's completion
    /// showed acknowledged (unsignaled writes complete silently).
    probe_covers: u64,
    confirmed: u64,
    /// Bytes the program read and wrote lately (buffers grow for a busy connection).
    read_rate: Rate,
    write_rate: Rate,
    /// The peer moves (MIGRATE): the resume towards its taker has been scheduled.
    resume_scheduled: bool,
    /// Moving to another process ([`Phase::Moving`]): when the taker's time to ask for the
    /// state is up.
    move_deadline: Option<Instant>,
    /// An accepted stream whose connection is not established yet: its writes wait
    /// (`rdma_accept` made our queue pair ready to send before the client's can receive, and
    /// what it dropped would come again only after a retransmission timeout, half a second
    /// on RoCE). See [`Stream::await_peer`].
    awaits_peer: bool,
}

/// Everything a new stream is made of (built by `setup`).
pub(super) struct Parts<P: Port = Dev> {
    pub rc: P::Qp,
    pub proto: proto::Conn,
    pub ring: Buf<P>,
    pub send: Buf<P>,
    pub local: SocketAddr,
    pub peer: SocketAddr,
    pub opts_fd: c_int,
    /// `opts_fd` holds the system's defaults for every option the stream mirrors (a socket
    /// the shim made, or a program's socket that set none of them): nothing to read.
    pub opts_default: bool,
    pub token: u64,
    pub conn_id: u64,
    /// A taker's doorbell (the handed-over B and its own copy of A) and what that A shows;
    /// `None` for a new stream (a new socketpair, writable).
    pub bell: Option<(Doorbell, Readiness)>,
}

impl<P: Port> Drop for Inner<P> {
    fn drop(&mut self) {
        // The QP goes first: once it is destroyed nothing can reach the memory.
        drop(self.rc.take());
        // SAFETY: each taken once, here, and never used again.
        let (ring, send) = unsafe {
            (
                ManuallyDrop::take(&mut self.ring),
                ManuallyDrop::take(&mut self.send),
            )
        };
        // Grown buffers are not what a new connection starts with: not worth keeping.
        let written = Written {
            ring: self.proto.ring_written(),
            send: self.proto.counters().tx_queued,
        };
        P::Qp::recycle(ring, send, !self.proto.buffers_grew(), written);
    }
}

/// A new connection's doorbell and what its A shows (writable). Made before the connection
/// is (the setup's last step that needs fds): running out of fds then is a fallback to TCP,
/// not a connection dropped after the peer saw it established.
pub(super) fn fresh_bell() -> std::io::Result<(Doorbell, Readiness)> {
    Ok((
        Doorbell::new(false)?,
        Readiness {
            writable: true,
            ..Readiness::default()
        },
    ))
}

impl<P: Port> Stream<P> {
    pub(super) fn new(
        p: Parts<P>,
        dev: Arc<P>,
        spin: Duration,
        owner: Owner,
    ) -> std::io::Result<Arc<Stream<P>>> {
        let opts_default = p.opts_default;
        let (bell, shown) = match p.bell {
            Some(b) => b,
            None => fresh_bell()?,
        };
        // A says whose stream it is, for a process that receives it with SCM_RIGHTS (a taken
        // over A keeps its first owner's name: that owner sends callers on).
        let _ = crate::sys::unix::bind_abstract(
            bell.app_fd(),
            &super::ipc::stream_name(&owner, p.token),
        );
        let qp_num = AtomicU32::new(p.rc.qp_num());
        let on_link = p.rc.is_shared();
        let sizes = AtomicU64::new(buf_sizes(&p.ring, &p.send).packed());
        let s = Arc::new(Stream {
            inner: Mutex::new(Inner {
                rc: Some(p.rc),
                proto: p.proto,
                ring: ManuallyDrop::new(p.ring),
                send: ManuallyDrop::new(p.send),
                next_ring: None,
                next_send: None,
                recvs_owed: 0,
                sleepers: 0,
                demand: false,
                shown,
                closed_at: None,
                draining: false,
                relays: Vec::new(),
                scratch: Vec::new(),
                peeked: Peeked::default(),
                live: liveness::Settings::default(),
                timers: liveness::Timers::new(Instant::now()),
                probe_covers: 0,
                confirmed: 0,
                resume_scheduled: false,
                move_deadline: None,
                awaits_peer: false,
                read_rate: Rate::default(),
                write_rate: Rate::default(),
            }),
            bell,
            dev,
            qp_num,
            on_link,
            token: p.token,
            conn_id: p.conn_id,
            sizes,
            local: p.local,
            peer: p.peer,
            nonblocking: AtomicBool::new(false),
            opts_fd: p.opts_fd,
            pending_for: AtomicU64::new(0),
            spin,
            budget: Budget::new(spin),
            timeouts_us: [AtomicU64::new(0), AtomicU64::new(0)],
            owner_pid: AtomicI32::new(owner.pid),
            owner_nonce: AtomicU64::new(owner.nonce),
            taken_from: std::sync::OnceLock::new(),
            life: Lifecycle::new(),
            opts_closed: AtomicBool::new(false),
            calls: AtomicU32::new(0),
            relay_waits: AtomicBool::new(false),
            timed: AtomicBool::new(false),
            linger_zero: AtomicBool::new(false),
            hold_watched: AtomicBool::new(false),
            watched: AtomicBool::new(false),
            shared: AtomicBool::new(false),
        });
        if !opts_default {
            s.load_options();
        }
        s.with(|inner| s.pump(inner));
        Ok(s)
    }

    /// The ring's and the send buffer's sizes now.
    pub fn ends(&self) -> super::ipc::Ends {
        super::ipc::Ends {
            local: self.local,
            peer: self.peer,
        }
    }

    pub fn sizes(&self) -> (u32, u32) {
        let s = super::BufSizes::unpack(self.sizes.load(Acquire));
        (s.ring, s.send)
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Inner<P>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn with<R>(&self, f: impl FnOnce(&mut Inner<P>) -> R) -> R {
        f(&mut self.lock())
    }

    /// The doorbell whose A the program holds.
    pub fn bell(&self) -> &Doorbell {
        &self.bell
    }

    /// Where the stream is in its life.
    pub fn life(&self) -> Life {
        self.life.get()
    }

    /// Moves the stream on by `ev` (stream/life.rs): `Some((from, to))` if it changed.
    pub(in crate::engine) fn advance(&self, ev: Event) -> Option<(Life, Life)> {
        self.life.apply(ev, self.token)
    }

    /// Closes the options fd, once, whoever comes to it first (see `opts_closed`).
    pub(in crate::engine) fn close_opts_once(&self) {
        if !self.opts_closed.swap(true, AcqRel) {
            crate::sys::raw::close(self.opts_fd);
        }
    }

    /// Whether it is a stream of a link (set when made: a fork child may read its copy).
    pub fn is_on_link(&self) -> bool {
        self.on_link
    }

    /// The process whose engine drives this stream.
    pub fn owner(&self) -> Owner {
        Owner {
            pid: self.owner_pid.load(Acquire),
            nonce: self.owner_nonce.load(Acquire),
        }
    }

    /// The stream now belongs to `to` (a hand-over; or, in a holder's copy, news of one).
    pub fn set_owner(&self, to: Owner) {
        self.owner_nonce.store(to.nonce, Release);
        self.owner_pid.store(to.pid, Release);
    }

    /// The current QP's number.
    pub(super) fn qp_num(&self) -> u32 {
        self.qp_num.load(Acquire)
    }

    /// Records the program's `O_NONBLOCK` (from fcntl/ioctl hooks and at install time).
    pub fn set_nonblocking(&self, on: bool) {
        self.nonblocking.store(on, Relaxed);
    }

    /// Whether the program's file is nonblocking.
    pub fn is_nonblocking(&self) -> bool {
        self.nonblocking.load(Relaxed)
    }

    /// Bytes a write could queue now without blocking.
    pub fn writable_bytes(&self) -> usize {
        self.lock().proto.writable()
    }

    /// Bytes ready to read (`FIONREAD`).
    pub fn readable_bytes(&self) -> usize {
        self.lock().proto.readable()
    }

    /// Bytes written by the program and not yet acknowledged (`SIOCOUTQ`).
    pub fn unsent_bytes(&self) -> usize {
        let c = self.lock().proto.counters();
        (c.tx_queued - c.tx_acked) as usize
    }

    /// The protocol's state and failure, for logs.
    pub fn describe(&self) -> String {
        let inner = self.lock();
        let p = &inner.proto;
        format!(
            "state {:?}, failure {:?}, error {:?}, {:?}",
            p.state(),
            p.failure(),
            p.error(),
            p.counters()
        )
    }

    /// Protocol counters (for `TCP_INFO`).
    pub fn counters(&self) -> proto::Counters {
        self.lock().proto.counters()
    }
}
