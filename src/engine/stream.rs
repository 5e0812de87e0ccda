//! One RDMA-carried TCP stream: the protocol state machine, its QP and registered memory,
//! and the doorbell that shows its state on the program's fd.
//!
//! Locking: `inner` is held only for short, non-blocking steps. Nobody holds it while polling
//! the CQ (which locks other streams) or while sleeping; completions reach a stream through
//! [`Stream::on_completion`], called by whoever polls its device's CQ, one at a time per device
//! so that a stream sees its completions in CQ order.
//!
//! Here: the stream, its completions and pump, the doorbell, the program's calls, teardown.
//! Beside it: `port.rs` (the seam: what a stream needs of its QP and of whoever polls its
//! completions), `wait.rs` (spinning and sleeping), `options.rs` (timeouts, keepalive),
//! `handover.rs` (moving between processes), `mem.rs`, `tests.rs`, `props.rs` (the
//! in-memory port and the in-process tests).

mod handover;
#[cfg(test)]
mod mem;
mod options;
mod port;
#[cfg(test)]
mod props;
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
use crate::proto::{self, Failure, ReadError, Readiness, WrId, WriteError};
use crate::rdma::{self, Wc};
use crate::readiness::Doorbell;
use libc::c_int;
pub use port::{Buf, Port, QueuePair, Region};
use std::io::{IoSlice, IoSliceMut};
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
const PROBE_WR: u64 = 1 << 61;

pub use crate::proto::Want;

/// An RDMA stream (see the module doc). `P` is where its completions come from: the RDMA
/// device, or the in-memory port of the tests.
pub struct Stream<P: Port = Dev> {
    inner: Mutex<Inner<P>>,
    bell: Doorbell,
    pub(super) dev: Arc<P>,
    /// The QP's number (a resume moves the stream to a new QP).
    qp_num: AtomicU32,
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
    pub(super) pending_for: Mutex<Option<Arc<super::listener::Listener>>>,
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
    /// before a credential change (`Request::Reclaim`).
    pub taken_from: std::sync::OnceLock<Owner>,
    /// The owner's program holds no fd of it any more (or never did: relayed from its
    /// accept queue). The stream lives on while another process holds one.
    pub(super) app_gone: AtomicBool,
    /// The engine's last-holder handling ran (see `Engine::settle_holders`).
    pub(super) released: AtomicBool,
    /// The helper watches the doorbell's B for the last other holder of A.
    pub(super) hold_watched: AtomicBool,
    /// Program calls in progress on it, and [`CLOSE_DEFERRED`]: see [`Stream::defer_close`].
    calls: AtomicU32,
    /// Keepalive or a user timeout is on: the helper ticks it (counted in [`TIMED`]).
    timed: AtomicBool,
    /// Someone may look at the doorbell's A outside the shim's own data calls (the program
    /// polled it or put it in an epoll set, or another process holds it): readiness moves it
    /// on every change. Until then only a thread sleeping in [`wait`](Self::wait) needs it.
    watched: AtomicBool,
    /// Another process may poll A (its holder forked): its completions must be handled
    /// even while this process waits nowhere the shim sees, so the helper listens.
    shared: AtomicBool,
    /// Handed over to another process; its options fd is closed with the program's last fd.
    pub(super) moved_away: AtomicBool,
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
    /// Handed over to another process: nothing here moves the doorbell or posts any more;
    /// the QP only drains before it is freed.
    pub(super) moved: bool,
    /// Bytes the program read and wrote lately (buffers grow for a busy connection).
    read_rate: Rate,
    write_rate: Rate,
    /// The peer moves (MIGRATE): the resume towards its taker has been scheduled.
    resume_scheduled: bool,
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
        P::Qp::recycle(ring, send, !self.proto.buffers_grew());
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
                moved: false,
                resume_scheduled: false,
                read_rate: Rate::default(),
                write_rate: Rate::default(),
            }),
            bell,
            dev,
            qp_num,
            token: p.token,
            conn_id: p.conn_id,
            sizes,
            local: p.local,
            peer: p.peer,
            nonblocking: AtomicBool::new(false),
            opts_fd: p.opts_fd,
            pending_for: Mutex::new(None),
            spin,
            budget: Budget::new(spin),
            timeouts_us: [AtomicU64::new(0), AtomicU64::new(0)],
            owner_pid: AtomicI32::new(owner.pid),
            owner_nonce: AtomicU64::new(owner.nonce),
            taken_from: std::sync::OnceLock::new(),
            app_gone: AtomicBool::new(false),
            calls: AtomicU32::new(0),
            timed: AtomicBool::new(false),
            released: AtomicBool::new(false),
            hold_watched: AtomicBool::new(false),
            watched: AtomicBool::new(false),
            shared: AtomicBool::new(false),
            moved_away: AtomicBool::new(false),
        });
        s.load_options();
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

    /// Program calls in progress in this process.
    pub(super) fn calls_in_progress(&self) -> u32 {
        self.calls.load(Acquire) & !CLOSE_DEFERRED
    }

    /// Records the program's `O_NONBLOCK` (from fcntl/ioctl hooks and at install time).
    pub fn set_nonblocking(&self, on: bool) {
        self.nonblocking.store(on, Relaxed);
    }

    /// A program call (recv, send, ...) starts on this stream.
    pub(super) fn call_begins(&self) {
        self.calls.fetch_add(1, AcqRel);
    }

    /// A program call ends; true if it was the last one and a close waited for it (the
    /// caller now does that close).
    pub(super) fn call_ends(&self) -> bool {
        self.calls.fetch_sub(1, AcqRel) == CLOSE_DEFERRED | 1
    }

    /// The program closed its last fd: true if calls are still in progress (blocked in
    /// another thread), in which case the close happens when the last one ends — as a
    /// kernel socket lives until the calls holding its file return.
    pub(super) fn defer_close(&self) -> bool {
        self.calls.fetch_or(CLOSE_DEFERRED, AcqRel) & !CLOSE_DEFERRED != 0
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

    // ---- completions and the outbound pump -------------------------------------------------

    /// Feeds one completion of this stream's QP (called with the device's poll lock held).
    pub(super) fn on_completion(&self, wc: &Wc) {
        let mut g = self.lock();
        let inner = &mut *g;
        let Some(rc) = inner.rc.as_mut() else { return };
        if wc.qp_num() != rc.qp_num() {
            return; // the QP this stream left for a new one (a resume) flushing
        }
        // Flushes are expected once the connection is going down, and on the old QP of a
        // peer that moved once everything on it completed (its old owner tears it down).
        let expected_flush = wc.is_flush()
            && (inner.proto.is_finished() || inner.proto.ready_to_resume() || inner.moved);
        rc.on_completion(wc);
        if wc.is_recv() {
            if !wc.is_ok() {
                if !expected_flush {
                    fail(inner, Failure::Reset, "receive failed", wc);
                }
                return;
            }
            inner.recvs_owed += 1;
            if inner.live.any() {
                inner.timers.heard(Instant::now());
            }
            let r = match wc.imm() {
                // byte_len: what the peer's write carried, checked against what it announced.
                Some(imm) => inner.proto.handle_imm(imm, wc.byte_len()),
                None => Err(proto::ProtocolError::BadImm(
                    proto::wire::ImmError::UnknownOp(0xff),
                )), // a SEND, not ours
            };
            if let Err(e) = r {
                log::warn!(
                    "rdma stream {} -> {}: protocol error from peer: {e}",
                    self.local,
                    self.peer
                );
                log::info!("rdma stream: protocol error on qp {}", wc.qp_num());
            }
        } else {
            if !wc.is_ok() {
                if expected_flush {
                    return;
                }
                // The peer's NIC stopped answering (its host is gone): as TCP's
                // retransmission timeout, not a reset.
                let f = if wc.status() == rdma_sys::ibv_wc_status::IBV_WC_RETRY_EXC_ERR {
                    Failure::TimedOut
                } else {
                    Failure::Reset
                };
                fail(inner, f, "send failed", wc);
                return;
            }
            if inner.live.any() {
                inner.timers.heard(Instant::now());
                if wc.wr_id() == PROBE_WR {
                    inner.timers.probe_done();
                    inner.confirmed = inner.confirmed.max(inner.probe_covers);
                }
            }
            if wc.wr_id() & PROTO_SIGNALED != 0 && wc.wr_id() != rdma::DRAIN_SEND_WR_ID {
                let id = WrId(wc.wr_id() & !PROTO_SIGNALED);
                if let Err(e) = inner.proto.handle_send_complete(id) {
                    log::error!("rdma stream {}: completion out of order: {e:?}", self.peer);
                    fail(inner, Failure::Reset, "completion accounting", wc);
                }
            }
        }
        self.pump(inner);
    }

    /// Reposts owed receives, runs the relays, posts every write the protocol wants, and
    /// shows the new state on the doorbell. Call with `inner` locked after any change.
    fn pump(&self, inner: &mut Inner<P>) {
        if inner.moved {
            return;
        }
        self.sync_memory(inner);
        if let Some(rc) = inner.rc.as_mut() {
            // Receives stay posted after a protocol-level reset: the peer's writes still in
            // flight must land (and be discarded), not stall its QP in RNR retries.
            if inner.recvs_owed > 0 && inner.proto.failure().is_none() {
                match rc.post_recvs(RECV_WR, inner.recvs_owed) {
                    Ok(()) => inner.recvs_owed = 0,
                    Err(e) => log::error!("rdma stream {}: reposting receives: {e}", self.peer),
                }
            }
        }
        if !inner.relays.is_empty() {
            relay::into_stream(
                &mut inner.relays,
                &mut inner.proto,
                inner.send.as_mut_slice(),
                &mut inner.scratch,
            );
            self.post_all(inner);
            let reset = inner.proto.is_broken();
            relay::out_of_stream(
                &mut inner.relays,
                &mut inner.proto,
                inner.ring.as_slice(),
                &mut inner.scratch,
                &mut inner.peeked,
                reset,
            );
            // A holder's shutdown(SHUT_WR) on a relay end is the stream's FIN (a close is
            // not, while other fds of the stream remain: the last holder's close ends it).
            // Checked on every pump: the end of stream may be read here by a completion.
            let fin = inner.relays.iter_mut().any(|e| e.tx_eof && !e.check_gone());
            if fin
                && matches!(
                    inner.proto.state(),
                    proto::State::Open | proto::State::ReadClosed
                )
            {
                inner.proto.shutdown_write();
            }
        }
        self.post_all(inner);
        while let Some(ev) = inner.proto.poll_event() {
            if let proto::Event::PeerMoving { port } = ev {
                if !std::mem::replace(&mut inner.resume_scheduled, true) {
                    log::debug!(
                        "rdma stream {} -> {}: peer moves to port {port}",
                        self.local,
                        self.peer
                    );
                    if !self.dev.peer_moving(self.token, port) {
                        inner.proto.handle_failure(Failure::Reset);
                    }
                }
            }
        }
        self.show(inner);
        self.update_demand(inner);
    }

    /// Whether completions must be handled while no program thread is in a call on this
    /// stream, and so the helper must listen for them (see `Dev::demand_up`).
    fn update_demand(&self, inner: &mut Inner<P>) {
        let want = inner.proto.failure().is_none()
            && inner.rc.is_some()
            && (self.shared.load(Relaxed)
                || !inner.relays.is_empty()
                || inner.proto.output_pending());
        if want != inner.demand {
            inner.demand = want;
            if want {
                self.dev.demand_up();
            } else {
                self.dev.demand_down();
            }
        }
    }

    /// The program polls A from now on (sticky): bring A up to date and keep it so. The
    /// program's hooked waits handle completions themselves (engine/waits.rs).
    pub fn watch(&self) {
        if !self.watched.swap(true, AcqRel) {
            WATCHED.fetch_add(1, AcqRel);
            self.with(|inner| self.show(inner));
        }
    }

    /// Another process may poll A from now on (a fork): as [`watch`](Self::watch), and the
    /// helper handles completions, since that process's waits are not this one's.
    pub fn share(&self) {
        if !self.shared.swap(true, AcqRel) {
            self.watch();
            self.with(|inner| self.update_demand(inner));
        }
    }

    /// Buffers that grow (proto/conn/grow.rs): registers what the protocol asks for, moves
    /// the unread bytes into a ring the peer switched to, swaps in a drained send buffer,
    /// and frees what it no longer needs. Run before the memory is used after any input.
    fn sync_memory(&self, inner: &mut Inner<P>) {
        let Some(rc) = inner.rc.as_ref() else { return };
        let p = &mut inner.proto;
        if let Some(size) = p.ring_grow_wanted() {
            match rc.alloc(size as usize, true) {
                Ok((buf, rkey)) => {
                    inner.next_ring = Some(buf);
                    p.offer_ring(rkey);
                }
                Err(e) => {
                    log::info!("rdma stream {}: ring stays small: {e}", self.peer);
                    p.decline_ring();
                }
            }
        }
        if let Some(copy) = p.take_ring_copy() {
            let Some(mut new) = inner.next_ring.take() else {
                // Unreachable: the protocol switches only to a ring it was given.
                log::error!("rdma stream {}: switched to a ring it never had", self.peer);
                p.handle_failure(Failure::Reset);
                return;
            };
            for (from, to) in copy.pieces() {
                new.range_mut(to).copy_from_slice(inner.ring.range(from));
            }
            // The old ring: nothing writes it any more (every write before SWITCHED landed).
            drop(std::mem::replace(&mut *inner.ring, new));
            log::debug!("rdma stream {}: ring grew to {}", self.peer, copy.new_size);
            crate::stats::count_growth(true);
        }
        if p.pending_ring().is_none() {
            inner.next_ring = None; // cancelled (a FIN or a move crossed it)
        }
        if let Some(size) = p.send_grow_wanted() {
            match rc.alloc(size as usize, false) {
                Ok((buf, _)) => {
                    inner.next_send = Some(buf);
                    p.offer_send_buf();
                }
                Err(e) => {
                    log::info!("rdma stream {}: send buffer stays small: {e}", self.peer);
                    p.decline_send_buf();
                }
            }
        }
        if p.send_buf_size() as usize != inner.send.len() {
            if let Some(new) = inner.next_send.take() {
                // The old one: every write from it has completed.
                drop(std::mem::replace(&mut *inner.send, new));
                log::debug!(
                    "rdma stream {}: send buffer grew to {}",
                    self.peer,
                    p.send_buf_size()
                );
                crate::stats::count_growth(false);
            }
        }
        if p.pending_send_buf().is_none() {
            inner.next_send = None;
        }
        let sizes = buf_sizes(&*inner.ring, &*inner.send).packed();
        if self.sizes.load(Relaxed) != sizes {
            self.sizes.store(sizes, Release);
        }
    }

    /// Posts every write the protocol wants.
    fn post_all(&self, inner: &mut Inner<P>) {
        let Some(rc) = inner.rc.as_mut() else { return };
        while let Some(w) = inner.proto.poll_write() {
            if let Err(e) = rc.post(&w, &inner.send) {
                log::warn!("rdma stream {}: post failed: {e}", self.peer);
                if e.errno() == libc::EACCES {
                    // Soft-RoCE and siw post through write() on the verbs fd, which the kernel
                    // refuses to any credentials but the opener's: this process changed its
                    // uid or gid after it took the connection over (rsyncd's children do).
                    log::warn!(
                        "rdma stream {}: this process's credentials changed since its RDMA engine started; its connections cannot send (docs/LIMITATIONS.md)",
                        self.peer
                    );
                }
                // Sending is over; what has arrived is not: a transport failure fails writes
                // but still returns the queued bytes (and end of stream) to reads — needed
                // when the peer sent everything, exited, and our credit return found its QP
                // gone.
                inner.proto.handle_failure(Failure::Reset);
                break;
            }
        }
    }

    // ---- other processes (docs/DESIGN.md, "Processes") -------------------------------------

    /// Starts relaying this stream to another process: returns (A, B) of a new socketpair;
    /// A goes to that process, B stays here (the engine watches it).
    pub(super) fn start_relay(&self) -> std::io::Result<(c_int, c_int)> {
        let (a, b) = crate::sys::unix::stream_pair()?;
        let mut g = self.lock();
        let inner = &mut *g;
        if inner.scratch.is_empty() {
            inner.scratch = vec![0; relay::CHUNK];
        }
        inner.relays.push(relay::End::new(b));
        self.pump(inner);
        Ok((a, b))
    }

    /// A relay end or the doorbell's B changed (helper thread): move bytes, and note holders
    /// that went away. A holder's `shutdown(SHUT_WR)` on a relay end is the stream's FIN.
    pub(super) fn on_hold_event(&self) {
        let mut g = self.lock();
        self.pump(&mut g);
    }

    /// Whether any process still holds this stream: the owner's program, another process
    /// with an fd of the doorbell's A (inherited), or a relay end's holder.
    pub(super) fn held(&self) -> bool {
        if !self.app_gone.load(Acquire) || self.bell.peer_holds() {
            return true;
        }
        self.lock().relays.iter_mut().any(|e| !e.check_gone())
    }

    /// Whether a relay end still has holders or unread bytes (its holders' close not yet
    /// taken in).
    pub(super) fn relay_pending(&self) -> bool {
        self.lock().relays.iter_mut().any(|e| !e.check_gone())
    }

    /// The relay ends' fds (B), for the engine's watch list.
    pub(super) fn relay_fds(&self) -> Vec<c_int> {
        self.lock().relays.iter().map(|e| e.fd).collect()
    }

    /// Moves the doorbell to match the protocol state (edges only).
    fn show(&self, inner: &mut Inner<P>) {
        if inner.moved {
            return; // the doorbell is the taker's
        }
        let p = &inner.proto;
        let now = p.readiness();
        // The strongest change goes first: a waiter woken by it must see the whole picture
        // at once (HUP implies RDHUP and IN), as the kernel sets these flags together.
        if now.hangup && !inner.shown.hangup {
            inner.shown.hangup = true;
            inner.shown.read_ended = true;
            log::trace!(
                "rdma stream {}: hang-up shown (state {:?})",
                self.peer,
                p.state()
            );
            self.bell.set_hangup();
        } else if now.read_ended && !inner.shown.read_ended {
            inner.shown.read_ended = true;
            log::trace!(
                "rdma stream {}: end of stream shown (state {:?})",
                self.peer,
                p.state()
            );
            self.bell.set_eof();
        }
        // Readable and writable change with every message: A follows them only while
        // someone can look (each change is a syscall). Hang-up and end of stream above are
        // shown at once — they happen once, and they must also wake a sleeping waiter.
        if inner.sleepers == 0 && !self.watched.load(Relaxed) {
            return;
        }
        if now.readable != inner.shown.readable {
            inner.shown.readable = now.readable;
            self.bell.set_readable(now.readable);
        }
        if now.writable != inner.shown.writable {
            inner.shown.writable = now.writable;
            self.bell.set_writable(now.writable);
        }
    }

    /// The device says this stream's QP (or its CQ, device or port) failed: reset, as a TCP
    /// connection whose path died; queued bytes stay readable first.
    pub(super) fn on_fatal(&self, why: &str) {
        self.with(|inner| {
            if inner.proto.failure().is_none() {
                log::info!(
                    "rdma stream {} -> {}: {why}: ECONNRESET",
                    self.local,
                    self.peer
                );
                inner.proto.handle_failure(Failure::Reset);
                self.show(inner);
            }
        });
    }

    /// The peer's side of the rdma_cm connection `id` went away (null: whichever this stream
    /// has). A queue pair this stream no longer uses (its end moved, §11) is none of its
    /// business: its disconnect may come after the new queue pair is up.
    pub(super) fn on_disconnected_of(&self, id: *const libc::c_void) {
        let mut g = self.lock();
        let inner = &mut *g;
        if let Some(rc) = inner.rc.as_mut() {
            if !id.is_null() && !rc.is_conn(id) {
                log::debug!(
                    "rdma stream {} -> {}: a replaced queue pair disconnected",
                    self.local,
                    self.peer
                );
                return;
            }
            rc.set_disconnected();
        }
        // Queued bytes stay readable; then reads fail like a reset TCP connection's.
        log::debug!(
            "rdma stream {} -> {}: peer disconnected (state {:?}, id {id:?}, qp {})",
            self.local,
            self.peer,
            inner.proto.state(),
            self.qp_num()
        );
        inner.proto.handle_disconnect();
        self.show(inner);
    }

    // ---- the program's calls ---------------------------------------------------------------

    /// `recv`-like: fills `bufs`; honours MSG_PEEK, MSG_WAITALL, MSG_DONTWAIT and the file's
    /// O_NONBLOCK. Ok(0) is end of stream. Err is an errno.
    pub fn recv(
        &self,
        bufs: &mut [IoSliceMut<'_>],
        flags: c_int,
        timeout: Option<Duration>,
    ) -> Result<usize, c_int> {
        let want: usize = bufs.iter().map(|b| b.len()).sum();
        if want == 0 {
            return Ok(0);
        }
        let nonblock = flags & libc::MSG_DONTWAIT != 0 || self.nonblocking.load(Relaxed);
        let peek = flags & libc::MSG_PEEK != 0;
        let waitall = flags & libc::MSG_WAITALL != 0 && !peek && !nonblock;
        let mut done = 0usize;
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            {
                let mut g = self.lock();
                let inner = &mut *g;
                let (proto, ring, peeked) = (&mut inner.proto, &inner.ring, &mut inner.peeked);
                let r = after(bufs, done, |rest| {
                    let r = proto.read_with(peek, |[a, b]| {
                        proto::scatter([ring.range(a), ring.range(b)], rest)
                    });
                    match r {
                        Ok(n) if peek => peeked.after_peek(rest, n),
                        Ok(n) => peeked.after_read(rest, n),
                        Err(_) => {}
                    }
                    r
                });
                match r {
                    Ok(0) => return Ok(done), // EOF
                    Ok(n) => {
                        done += n;
                        if !peek && inner.read_rate.busy(n, inner.ring.len()) {
                            inner.proto.ask_bigger_ring();
                        }
                        self.pump(inner);
                        if !waitall || done == want {
                            return Ok(done);
                        }
                    }
                    Err(ReadError::Blocked) if done > 0 && !waitall => return Ok(done),
                    Err(ReadError::Blocked) => {
                        if let Some(f) = inner.proto.failure() {
                            return if done > 0 {
                                Ok(done)
                            } else {
                                Err(read_errno(f))
                            };
                        }
                        self.show(inner);
                    }
                    Err(ReadError::Reset) => {
                        return if done > 0 {
                            Ok(done)
                        } else {
                            Err(libc::ECONNRESET)
                        };
                    }
                }
            }
            if nonblock {
                // Nobody may have polled the CQ since the data arrived: look once, then retry.
                if self.dev.progress() > 0 && self.ready(Want::Read) {
                    continue;
                }
                return Err(libc::EAGAIN);
            }
            if let Err(e) = self.wait(Want::Read, deadline) {
                return if done > 0 { Ok(done) } else { Err(e) }; // EINTR, or SO_RCVTIMEO's EAGAIN
            }
        }
    }

    /// `send`-like: copies `bufs` into the send buffer and posts it. Blocking callers wait
    /// until everything is queued. Err is an errno (EPIPE: the caller raises SIGPIPE).
    pub fn send(
        &self,
        bufs: &[IoSlice<'_>],
        flags: c_int,
        timeout: Option<Duration>,
    ) -> Result<usize, c_int> {
        let want: usize = bufs.iter().map(|b| b.len()).sum();
        let nonblock = flags & libc::MSG_DONTWAIT != 0 || self.nonblocking.load(Relaxed);
        let mut done = 0usize;
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            {
                let mut g = self.lock();
                let inner = &mut *g;
                if let Some(f) = inner.proto.failure() {
                    if done > 0 {
                        return Ok(done);
                    }
                    // As on TCP: a timed-out connection's error is told once, then EPIPE (a
                    // write on a broken stream, as on a reset TCP one).
                    let first = inner.proto.first_failure_report();
                    return Err(if f == Failure::TimedOut && first {
                        libc::ETIMEDOUT
                    } else {
                        libc::EPIPE
                    });
                }
                if want == 0 {
                    return Ok(0);
                }
                let owned;
                let rest = if done == 0 {
                    bufs
                } else {
                    owned = skip_const(bufs, done);
                    &owned
                };
                let send = &mut inner.send;
                let r = inner.proto.write_with(want - done, |ranges, n| {
                    proto::gather(rest, send.ranges_mut(ranges), n);
                });
                match r {
                    Ok(n) => {
                        done += n;
                        if inner.write_rate.busy(n, inner.send.len()) {
                            inner.proto.ask_bigger_send_buf();
                        }
                        self.pump(inner);
                        if done == want {
                            return Ok(done);
                        }
                    }
                    Err(WriteError::Blocked) => self.show(inner),
                    Err(WriteError::Closed) => {
                        return if done > 0 { Ok(done) } else { Err(libc::EPIPE) }
                    }
                    Err(WriteError::Reset) => {
                        return if done > 0 { Ok(done) } else { Err(libc::EPIPE) }
                    }
                }
            }
            if nonblock {
                // "Full" is final only once the writes already posted have completed (they
                // free send-buffer space within microseconds): settle, bounded, so that a
                // program told EAGAIN is not told writable right after for space that was
                // merely in flight — kernel TCP's EAGAIN likewise means "full".
                if self.settle() && self.ready(Want::Write) {
                    continue;
                }
                return if done > 0 {
                    Ok(done)
                } else {
                    Err(libc::EAGAIN)
                };
            }
            if let Err(e) = self.wait(Want::Write, deadline) {
                return if done > 0 { Ok(done) } else { Err(e) };
            }
        }
    }

    /// `shutdown(SHUT_RD)`: reads return what is queued, then 0 instead of blocking; a
    /// reader blocked in another thread wakes up.
    pub fn shutdown_read(&self) {
        self.with(|inner| {
            inner.proto.shutdown_read();
            self.show(inner);
        });
    }

    /// `shutdown(SHUT_WR)`: FIN after the queued bytes.
    pub fn shutdown_write(&self) {
        self.with(|inner| {
            inner.proto.shutdown_write();
            self.pump(inner);
        });
    }

    /// Drops the doorbell's own fd of A, under the lock every readiness change takes, so that
    /// no change in flight can use the number after it is closed (and maybe reused).
    pub(super) fn release_app(&self) {
        let _g = self.lock();
        self.bell.release_app();
    }

    /// The program's last fd is gone: deliver what is queued (or reset, for SO_LINGER 0),
    /// then let the engine tear the connection down.
    pub fn app_closed(&self, reset: bool) {
        self.with(|inner| {
            self.bell.release_app();
            if reset {
                inner.proto.abort();
            } else {
                inner.proto.close();
            }
            inner.closed_at = Some(Instant::now());
            self.pump(inner);
        });
    }

    /// At process exit: a graceful close for a stream the program never closed (as the
    /// kernel closes a dying process's sockets).
    pub(super) fn close_for_exit(&self) {
        self.with(|inner| {
            if inner.closed_at.is_none() {
                inner.proto.close();
                self.pump(inner);
            }
        });
    }

    /// Whether everything queued, FIN included, has been acknowledged (or can never be).
    pub(super) fn flushed(&self) -> bool {
        let inner = self.lock();
        inner.rc.is_none() || inner.proto.flushed()
    }

    // ---- teardown (driven by the engine) ---------------------------------------------------

    /// Advances a closed stream's teardown; true once its QP and memory can be dropped.
    pub(super) fn reap_step(&self, linger: Duration) -> bool {
        let mut g = self.lock();
        let inner = &mut *g;
        let Some(closed_at) = inner.closed_at else {
            return false;
        };
        let Some(rc) = inner.rc.as_mut() else {
            return true;
        };
        let done = inner.proto.is_finished() || inner.proto.state() == proto::State::Reset;
        if !inner.draining {
            if !done && closed_at.elapsed() < linger {
                return false;
            }
            if !done {
                log::info!(
                    "rdma stream {} -> {}: linger expired, dropping",
                    self.local,
                    self.peer
                );
            }
            let _ = rc.disconnect();
            inner.draining = true;
        }
        let _ = rc.start_drain();
        rc.is_drained() || closed_at.elapsed() > linger + Duration::from_secs(2)
    }

    /// Drops the QP (before the memory it used).
    pub(super) fn destroy(&self) {
        let (rc, relays) = {
            let mut inner = self.lock();
            if std::mem::take(&mut inner.demand) {
                self.dev.demand_down();
            }
            (inner.rc.take(), std::mem::take(&mut inner.relays))
        };
        drop(rc);
        if self.timed.swap(false, AcqRel) {
            TIMED.fetch_sub(1, AcqRel);
        }
        if self.watched.swap(false, AcqRel) {
            WATCHED.fetch_sub(1, AcqRel);
        }
        for e in relays {
            crate::sys::raw::close(e.fd);
        }
        // A moved stream's options fd still answers for the program's fds of it, if the
        // program has any (they close it: `engine::stream_fd_closed`); one the program never
        // held (a prefork master's accept, handed to a worker) has none, and it goes now.
        if !self.lock().moved || self.app_gone.load(Acquire) {
            crate::sys::raw::close(self.opts_fd);
        }
    }
}

/// Fails the stream's transport and logs the completion that said so.
fn fail<P: Port>(inner: &mut Inner<P>, f: Failure, what: &str, wc: &Wc) {
    if inner.proto.failure().is_none() {
        log::info!(
            "rdma stream: {what}: {} (qp {})",
            wc.status_str(),
            wc.qp_num()
        );
    }
    inner.proto.handle_failure(f);
}

/// A read that found nothing left on a broken stream (end of stream is the caller's).
/// Bytes a program moved through one of a stream's buffers lately: a buffer that sees
/// [`BUSY_BUFFERS`] times its size within [`BUSY_WINDOW`] is too small for the connection
/// (with a 16 KiB ring, 4 KiB request/response costs a credit message every second
/// message: 30 % slower in the bed than with 256 KiB, 2026-11-24). The clock is read once
/// per that many bytes, not per call.
#[derive(Default)]
struct Rate {
    since: Option<Instant>,
    bytes: usize,
}

const BUSY_BUFFERS: usize = 4;
const BUSY_WINDOW: Duration = Duration::from_millis(10);

impl Rate {
    /// Counts `n` bytes through a buffer of `size`; true when the connection is busy.
    fn busy(&mut self, n: usize, size: usize) -> bool {
        self.bytes += n;
        if self.bytes < BUSY_BUFFERS * size {
            return false;
        }
        let now = Instant::now();
        let busy = self.since.is_some_and(|t| now - t <= BUSY_WINDOW);
        (self.since, self.bytes) = (Some(now), 0);
        busy
    }
}

fn buf_sizes<B: Region>(ring: &B, send: &B) -> super::BufSizes {
    super::BufSizes {
        ring: ring.len() as u32,
        send: send.len() as u32,
    }
}

fn read_errno(f: Failure) -> c_int {
    match f {
        Failure::TimedOut => libc::ETIMEDOUT,
        Failure::Reset | Failure::PeerGone => libc::ECONNRESET,
    }
}

/// Calls `f` with the part of `bufs` after the first `done` bytes (allocating only when
/// `done` > 0: a MSG_WAITALL read that goes on).
fn after<R>(
    bufs: &mut [IoSliceMut<'_>],
    done: usize,
    f: impl FnOnce(&mut [IoSliceMut<'_>]) -> R,
) -> R {
    if done == 0 {
        f(bufs)
    } else {
        f(&mut skip(bufs, done))
    }
}

/// The part of `bufs` after the first `n` bytes.
fn skip<'a, 'b>(bufs: &'a mut [IoSliceMut<'b>], mut n: usize) -> Vec<IoSliceMut<'a>> {
    let mut out = Vec::with_capacity(bufs.len());
    for b in bufs.iter_mut() {
        if n >= b.len() {
            n -= b.len();
            continue;
        }
        out.push(IoSliceMut::new(&mut b[n..]));
        n = 0;
    }
    out
}

fn skip_const<'a>(bufs: &'a [IoSlice<'_>], mut n: usize) -> Vec<IoSlice<'a>> {
    let mut out = Vec::with_capacity(bufs.len());
    for b in bufs {
        if n >= b.len() {
            n -= b.len();
            continue;
        }
        out.push(IoSlice::new(&b[n..]));
        n = 0;
    }
    out
}
