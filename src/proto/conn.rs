//! The per-connection state machine: a byte stream in each direction over RDMA WRITEs into the
//! peer's receive ring, with exact credit flow control.
//!
//! `Conn` performs no I/O, reads no clock, spawns nothing and holds no registered memory: the
//! driver owns the send buffer and the receive ring and lends them on each call. It does not
//! time out idle peers (RC retries and rdma_cm events do that) and has no keepalive.
//!
//! This file holds the state, lifecycle and output polling; the send path (send buffer, bursts,
//! signaling, completions) is in `conn/send.rs` and the receive path (immediates, reads) in
//! `conn/recv.rs`.

mod grow;
mod migrate;
mod ready;
mod recv;
mod send;

use grow::Growth;
pub use grow::RingCopy;
use migrate::Migration;
pub use migrate::{Handover, MigrateError};
pub use ready::{Failure, Readiness, Want};

use std::collections::VecDeque;

use super::credits::{MsgClass, RxCredits, TxCredits};
use super::link::imm::{Codec, StreamId};
use super::ring::Ring;
use super::wire::{Hello, HelloKind, Imm};
use super::{ConfigError, Params, ProtocolError};

/// Identifies one posted work request; the driver stores it in `wr_id` and hands it back in
/// [`Conn::handle_send_complete`]. Sequential per connection, starting at 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WrId(pub u64);

/// One RDMA WRITE (with or without immediate) to post on the QP, in the order returned.
///
/// `len == 0` with an immediate is a control message; `len == 0` without one is a signaled
/// fence that only exists to produce a completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[must_use]
pub struct Write {
    /// Store in `ibv_send_wr.wr_id`; hand back to `handle_send_complete` if signaled.
    pub wr_id: WrId,
    /// Offset of the payload in the local send buffer.
    pub local_offset: u32,
    /// Payload length in bytes.
    pub len: u32,
    /// Offset in the peer's ring.
    pub remote_offset: u32,
    /// Address of that offset in the peer's ring (`ring_addr` + offset).
    pub remote_addr: u64,
    /// The peer's rkey for that ring (a grown ring has a new one).
    pub rkey: u32,
    /// Immediate value in host order (post it as `htonl(imm)`), making this a WRITE_WITH_IMM.
    pub imm: Option<u32>,
    /// `len <= max_inline`: may be posted with `IBV_SEND_INLINE`.
    pub inline: bool,
    /// Post with `IBV_SEND_SIGNALED`; report its completion to `handle_send_complete`.
    pub signaled: bool,
}

/// Something the application side should learn about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    /// Bytes or end-of-stream became readable: wake readers.
    Readable,
    /// Send-buffer space was freed after a write was short: wake writers.
    Writable,
    /// The connection was reset by the peer or failed: wake everyone, reads and writes fail.
    Reset,
    /// Nothing more will be posted or expected: the driver may disconnect and free memory.
    Finished,
    /// The peer's end moves to a taker listening on `port` at the peer's address: quiesce
    /// this queue pair, then resume there (PROTOCOL.md §11).
    PeerMoving {
        /// rdma_cm port of the taker.
        port: u16,
    },
}

/// Coarse connection state, derived from what has been sent and received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Both directions open.
    Open,
    /// We queued or sent FIN; the peer may still send.
    WriteClosed,
    /// The peer sent FIN; we may still send.
    ReadClosed,
    /// FIN both ways; waiting for our last completions.
    Closing,
    /// FIN both ways and every completion in.
    Closed,
    /// Reset by either side, or failed on a protocol error.
    Reset,
}

/// Counters for diagnostics and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Work requests handed out by `poll_write`.
    pub writes_posted: u64,
    /// Payload bytes in them.
    pub bytes_posted: u64,
    /// Data bursts (DATA immediates) sent.
    pub data_messages: u64,
    /// CREDIT messages sent.
    pub credit_messages: u64,
    /// Work requests flagged signaled.
    pub signaled: u64,
    /// Zero-length fences emitted to get a completion.
    pub fences: u64,
    /// Immediates received.
    pub imms_received: u64,
}

/// Raw accounting positions, for invariant checks in tests and for debugging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Counters {
    /// Stream end the app has written into the send buffer.
    pub tx_queued: u64,
    /// Stream end posted as RDMA writes.
    pub tx_posted: u64,
    /// Stream end whose send-buffer space is reclaimed.
    pub tx_acked: u64,
    /// Stream end the peer has granted.
    pub tx_granted_end: u64,
    /// WR credits at the peer.
    pub tx_wr_credits: u32,
    /// Stream end announced by the peer's data immediates.
    pub rx_received_end: u64,
    /// Stream end consumed by the app.
    pub rx_consumed: u64,
    /// Stream end the peer may write up to.
    pub rx_granted_end: u64,
    /// Immediates received whose WR credit is not yet returned.
    pub rx_wrs_pending: u32,
    /// Work requests handed out.
    pub wrs_posted: u64,
    /// Work requests retired by completions.
    pub wrs_retired: u64,
    /// Size of the peer's ring as the send side knows it.
    pub tx_peer_ring: u32,
    /// Size of the local ring.
    pub rx_ring: u32,
}

/// Stats are history, not state: two connections that differ only in counters behave alike,
/// so a model checker hashing `Conn` should merge them.
impl std::hash::Hash for Stats {
    fn hash<H: std::hash::Hasher>(&self, _: &mut H) {}
}

const EV_READABLE: u8 = 1;
const EV_WRITABLE: u8 = 2;
const EV_RESET: u8 = 4;
const EV_MOVING: u8 = 8;

/// One end of an rsock stream.
///
/// Methods come in four kinds, as in quinn-proto:
/// - getters (`&self`): [`readable`](Self::readable), [`writable`](Self::writable),
///   [`state`](Self::state), [`stats`](Self::stats), [`counters`](Self::counters);
/// - application commands: [`write`](Self::write), [`read`](Self::read),
///   [`peek`](Self::peek), [`consume`](Self::consume), [`shutdown_write`](Self::shutdown_write),
///   [`close`](Self::close), [`abort`](Self::abort);
/// - inputs from the driver: [`handle_imm`](Self::handle_imm),
///   [`handle_send_complete`](Self::handle_send_complete),
///   [`handle_send_error`](Self::handle_send_error), [`handle_disconnect`](Self::handle_disconnect);
/// - outputs: [`poll_write`](Self::poll_write) then [`poll_event`](Self::poll_event).
///
/// Driver loop: hand every receive completion to `handle_imm` and repost one receive for each
/// *before* the next `poll_write` (credits returned there promise those receives); hand every
/// signaled send completion to `handle_send_complete`; then post everything `poll_write`
/// returns, in order, until it returns `None`; then drain `poll_event`. Call `poll_write` again
/// after any application command.
///
/// `Clone` and `Hash` exist for model checking (tests explore every interleaving from a
/// snapshot); a clone shares nothing with the original.
#[derive(Debug, Clone, Hash)]
pub struct Conn {
    // Geometry.
    send_ring: Ring,
    peer_ring: Ring,
    ring: Ring,
    max_inline: u32,
    sq_depth: u32,
    signal_every: u32,
    /// Where the peer's ring is (a GROW moves it).
    peer_ring_addr: u64,
    peer_rkey: u32,

    // Buffers that grow (conn/grow.rs).
    ring_start: u32,
    send_start: u32,
    ring_max: u32,
    send_max: u32,
    ring_growth: Growth,
    send_growth: Growth,
    /// The first half of the peer's GROW pair (rkey and page-count high halves).
    peer_grow_hi: Option<(u16, u8)>,
    /// The peer's ring grew: SWITCHED goes out before anything but credits.
    switch_owed: bool,
    /// Unread bytes the driver must move into the new ring.
    ring_copy: Option<RingCopy>,

    // Send side, as stream positions: acked <= posted <= queued <= acked + send size.
    tx_acked: u64,
    tx_posted: u64,
    tx_queued: u64,
    tx: TxCredits,

    // Send queue.
    next_wr: u64,
    wrs_retired: u64,
    /// Signaled WRs in flight: (wr id, send-buffer position released by its completion).
    signaled: VecDeque<(u64, u64)>,
    unsignaled_wrs: u32,
    unsignaled_bytes: u64,
    /// A writer is waiting for space: the next WR must be signaled.
    need_signal: bool,
    /// Pieces of a planned burst not yet returned by `poll_write`.
    planned: VecDeque<Write>,

    // Receive side.
    rx: RxCredits,

    // Lifecycle.
    write_shut: bool,
    /// `shutdown(SHUT_RD)`: reads end (0) once the queue is empty, as on Linux TCP, where
    /// bytes already queued — or arriving later — are still returned.
    read_shut: bool,
    read_closed: bool,
    fin_sent: bool,
    fin_received: bool,
    reset_queued: bool,
    reset_sent: bool,
    peer_reset: bool,
    failed: Option<ProtocolError>,
    /// The transport failed under the connection (conn/ready.rs).
    transport: Option<Failure>,
    failure_reported: bool,
    finished_reported: bool,
    writer_waiting: bool,
    events: u8,

    // Queue-pair hand-over (conn/migrate.rs).
    migration: Migration,
    /// We sent the connect (or resume) that made this queue pair: a crossing MIGRATE from
    /// the passive end wins over ours.
    active: bool,

    stats: Stats,
    /// How immediates are written: alone on the queue pair, or as a stream of a link.
    codec: Codec,
}

impl Conn {
    /// A stream of a link (docs/DESIGN.md, "Links") that this end calls `mine` and the peer
    /// `theirs`: as [`new`](Self::new), with the link's immediates. Its ring must hold at
    /// least one credit unit. It cannot migrate (a link's immediates have no room for it), and
    /// its ring grows by a GROW record on the link's control stream, which the driver sends
    /// ([`take_grow_record`](Self::take_grow_record)) and hands over
    /// ([`on_grow_record`](Self::on_grow_record)).
    pub fn on_link(
        config: &Params,
        peer: &Hello,
        mine: StreamId,
        theirs: StreamId,
    ) -> Result<Conn, ConfigError> {
        let codec = Codec::Link { mine, theirs };
        if config.ring_size < codec.credit_caps().2 {
            return Err(ConfigError::RingSize(config.ring_size));
        }
        let mut c = Conn::new(config, peer)?;
        c.rx = c.rx.with_caps(codec.credit_caps());
        c.codec = codec;
        Ok(c)
    }

    /// A connection between our `config` and the peer's validated `peer` hello.
    pub fn new(config: &Params, peer: &Hello) -> Result<Conn, ConfigError> {
        config.validate()?;
        peer.check().map_err(ConfigError::Peer)?;
        Ok(Conn {
            send_ring: Ring::new(config.send_buf_size),
            peer_ring: Ring::new(peer.ring_size),
            ring: Ring::new(config.ring_size),
            max_inline: config.max_inline,
            sq_depth: config.send_queue_depth,
            signal_every: (config.send_queue_depth / 2).max(1),
            peer_ring_addr: peer.ring_addr,
            peer_rkey: peer.rkey,
            ring_start: config.ring_size,
            send_start: config.send_buf_size,
            ring_max: config.ring_grow_to,
            send_max: config.send_grow_to,
            ring_growth: Growth::new(config.ring_size, grow::grow_target(config.ring_grow_to)),
            send_growth: Growth::new(config.send_buf_size, config.send_grow_to),
            peer_grow_hi: None,
            switch_owed: false,
            ring_copy: None,
            tx_acked: 0,
            tx_posted: 0,
            tx_queued: 0,
            tx: TxCredits::new(peer.ring_size, peer.recv_credits),
            next_wr: 0,
            wrs_retired: 0,
            signaled: VecDeque::new(),
            unsignaled_wrs: 0,
            unsignaled_bytes: 0,
            need_signal: false,
            planned: VecDeque::with_capacity(2),
            rx: RxCredits::new(config.ring_size, config.recv_credits),
            write_shut: false,
            read_shut: false,
            read_closed: false,
            fin_sent: false,
            fin_received: false,
            reset_queued: false,
            reset_sent: false,
            peer_reset: false,
            failed: None,
            transport: None,
            failure_reported: false,
            finished_reported: false,
            writer_waiting: false,
            events: 0,
            migration: Migration::None,
            active: peer.kind == HelloKind::Accept,
            stats: Stats::default(),
            codec: Codec::Lone,
        })
    }

    // ---- getters ------------------------------------------------------------------------

    /// How this connection's immediates are written.
    pub fn codec(&self) -> Codec {
        self.codec
    }

    /// Bytes that a read would return now (0 also at end of stream; see [`State`]).
    pub fn readable(&self) -> usize {
        if self.is_reset() || self.read_closed {
            return 0;
        }
        self.rx.unread() as usize
    }

    /// True once the peer's FIN has arrived (or reading was shut down) and every byte
    /// before it has been consumed.
    pub fn at_eof(&self) -> bool {
        !self.is_reset() && (self.fin_received || self.read_shut) && self.rx.unread() == 0
    }

    /// The peer's FIN arrived or reading was shut down, bytes may still be queued: poll
    /// reports `POLLRDHUP` from here on, as Linux does.
    pub fn read_ended(&self) -> bool {
        !self.is_reset() && (self.fin_received || self.read_shut)
    }

    /// Both directions are shut (ours by shutdown or close, theirs by FIN or our
    /// `SHUT_RD`): poll reports a hang-up, as Linux does for a TCP socket shut both ways.
    pub fn hung_up(&self) -> bool {
        self.write_shut && (self.fin_received || self.read_shut)
    }

    /// Send-buffer bytes a write would accept now.
    pub fn writable(&self) -> usize {
        if self.is_reset() || self.write_shut || self.send_swap_pending() {
            return 0;
        }
        (u64::from(self.send_ring.size()) - (self.tx_queued - self.tx_acked)) as usize
    }

    /// Whether poll/epoll should report the stream writable: a third of the send buffer
    /// free, as kernel TCP's `sk_stream_is_writeable` (free ≥ queued / 2). The hysteresis
    /// keeps a writer told EAGAIN from being woken for every few bytes a completion frees.
    pub fn poll_writable(&self) -> bool {
        let free = self.writable() as u64;
        free > 0 && free * 3 >= u64::from(self.send_ring.size())
    }

    /// Whether completing the writes already posted could, by itself, make the stream
    /// [`poll_writable`](Self::poll_writable) — what a writer that just hit EAGAIN waits out:
    /// not once it is (unsignaled writes stay in flight until a later signaled one
    /// completes), and only for bytes whose completion will be reported (a signaled write's,
    /// or the fence a waiting writer is owed).
    pub fn completions_could_wake_writer(&self) -> bool {
        if self.is_reset() || self.write_shut || self.poll_writable() {
            return false;
        }
        let reported_end = if self.need_signal && self.unsignaled_wrs > 0 {
            self.tx_posted
        } else {
            self.signaled.back().map_or(self.tx_acked, |&(_, end)| end)
        };
        let coming = reported_end.saturating_sub(self.tx_acked);
        let free = self.writable() as u64 + coming;
        coming > 0 && free * 3 >= u64::from(self.send_ring.size())
    }

    /// Whether something is waiting to be sent that the next [`poll_write`](Self::poll_write)
    /// could not give out (no credits or send-queue room yet): only a completion or a
    /// peer's message can release it, so the driver must keep listening for those even
    /// while no application thread is in a call on this connection.
    pub fn output_pending(&self) -> bool {
        if self.failed.is_some() || self.peer_reset || self.reset_sent || self.transport.is_some() {
            return false;
        }
        if self.migrating() {
            return !self.planned.is_empty() || self.migration_output_pending();
        }
        self.reset_queued
            || !self.planned.is_empty()
            || self.tx_queued > self.tx_posted
            || (self.write_shut && !self.fin_sent)
            || ((self.need_signal || self.send_swap_pending()) && self.unsignaled_wrs > 0)
            || self.switch_owed
            || matches!(self.ring_growth, Growth::Offered { .. })
            || (!(self.fin_sent && self.fin_received)
                && self.rx.update_due(self.credit_bytes_held()))
    }

    /// Whether `len` bytes written now would all go out at the next
    /// [`poll_write`](Self::poll_write)s: nothing is waiting before them, and the peer's
    /// credits and the send queue take them even as two bursts (a write may wrap the send
    /// buffer) after a credit return. A link's control stream asks before an OPEN whose
    /// stream writes at once: its data must not pass the OPEN.
    pub fn sends_now(&self, len: usize) -> bool {
        let len = len as u64;
        let idle = self.failed.is_none()
            && !self.peer_reset
            && !self.reset_sent
            && !self.reset_queued
            && self.transport.is_none()
            && !self.write_shut
            && !self.migrating()
            && !self.switch_owed
            && self.all_posted();
        idle && self.tx.wrs() >= super::credits::CONTROL_RESERVE + 3
            && self.tx.bytes_after(self.tx_posted) >= len
            && self.writable() as u64 >= len
            && self.sq_room(3)
    }

    /// Whether every byte written has been handed out in work requests.
    pub fn all_posted(&self) -> bool {
        self.planned.is_empty() && self.tx_queued == self.tx_posted
    }

    /// Where the peer's ring is now: its address and rkey (a zero-length probe names it).
    pub fn peer_ring(&self) -> (u64, u32) {
        (self.peer_ring_addr, self.peer_rkey)
    }

    /// Coarse state, for the socket layer and logs.
    pub fn state(&self) -> State {
        if self.is_broken() {
            return State::Reset;
        }
        match (self.write_shut, self.fin_received) {
            (false, false) => State::Open,
            (true, false) => State::WriteClosed,
            (false, true) => State::ReadClosed,
            (true, true) if self.is_finished() => State::Closed,
            (true, true) => State::Closing,
        }
    }

    /// How many bytes the peer wrote into the ring, counted from its start: all it announced,
    /// once its FIN came and nothing went wrong; `None` when it may have written more than
    /// it announced (a reset or failure can cut a burst short after its first write).
    pub fn ring_written(&self) -> Option<u64> {
        (self.fin_received && !self.peer_reset && self.failed.is_none())
            .then(|| self.counters().rx_received_end)
    }

    /// True when the driver may disconnect and free the memory: nothing more will be posted
    /// and every posted work request has completed (or the connection is reset).
    pub fn is_finished(&self) -> bool {
        if self.transport.is_some() {
            return true; // nothing more completes but flushes
        }
        if !(self.fin_received || self.reset_sent || self.peer_reset || self.failed.is_some()) {
            return false; // the common case while open, checked on every poll_event
        }
        if self.migrating() && self.failed.is_none() && !self.peer_reset {
            return false; // the taker or the resume still needs this end's memory
        }
        let drained = self.planned.is_empty() && self.wrs_retired == self.next_wr;
        if self.failed.is_some() || self.peer_reset {
            return true;
        }
        if self.reset_sent {
            return drained;
        }
        // The ring must outlive unread bytes the app may still read.
        let unread = !self.read_closed && self.rx.unread() > 0;
        self.fin_sent && self.fin_received && drained && !unread
    }

    /// The protocol error that failed the connection, if any.
    pub fn error(&self) -> Option<ProtocolError> {
        self.failed
    }

    /// Counters since the connection started.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Raw accounting positions (diagnostics, invariant checks).
    pub fn counters(&self) -> Counters {
        Counters {
            tx_queued: self.tx_queued,
            tx_posted: self.tx_posted,
            tx_acked: self.tx_acked,
            tx_granted_end: self.tx.granted_end(),
            tx_wr_credits: self.tx.wrs(),
            rx_received_end: self.rx.received_end(),
            rx_consumed: self.rx.consumed(),
            rx_granted_end: self.rx.granted_end(),
            rx_wrs_pending: self.rx.wrs_pending(),
            wrs_posted: self.next_wr,
            wrs_retired: self.wrs_retired,
            tx_peer_ring: self.peer_ring.size(),
            rx_ring: self.ring.size(),
        }
    }

    fn is_reset(&self) -> bool {
        self.failed.is_some() || self.peer_reset || self.reset_queued
    }

    // ---- application commands (reads and writes are in recv.rs and send.rs) ---------------

    /// `shutdown(SHUT_RD)`: a read finding nothing queued returns end of stream instead of
    /// blocking; nothing is told to the peer. Idempotent.
    pub fn shutdown_read(&mut self) {
        self.read_shut = true;
    }

    /// Half-close (SHUT_WR): queued bytes still go out, then FIN. Later writes fail with
    /// `Closed`. Idempotent.
    pub fn shutdown_write(&mut self) {
        self.write_shut = true;
    }

    /// Application close: like `shutdown_write`, and unread or later-arriving bytes are
    /// discarded. If the peer keeps sending after this, it is reset (as TCP does).
    pub fn close(&mut self) {
        self.write_shut = true;
        self.read_closed = true;
        let unread = self.rx.unread();
        self.rx.consume(unread);
    }

    /// Abortive close (SO_LINGER 0): drop unsent bytes and reset the peer.
    pub fn abort(&mut self) {
        if self.is_reset() {
            return;
        }
        self.reset_queued = true;
        self.write_shut = true;
        self.read_closed = true;
        // Planned pieces already own work request ids; they go out before the RESET.
        self.tx_queued = self.tx_posted;
        self.events |= EV_RESET;
    }

    // ---- inputs (immediates in recv.rs, completions in send.rs) ---------------------------

    /// Processes a failed send completion (flush, retry exceeded, remote access error): the
    /// connection is over.
    pub fn handle_send_error(&mut self) {
        if self.failed.is_none() {
            self.failed = Some(ProtocolError::TransportFailed);
            self.planned.clear();
            self.events |= EV_RESET;
        }
    }

    /// The connection manager reports the peer gone (DISCONNECTED). Harmless once
    /// [`is_finished`](Self::is_finished) or when a hand-over expects it; before that the
    /// transport failed ([`Failure::PeerGone`] after the peer's FIN, else
    /// [`Failure::Reset`]): bytes that arrived stay readable.
    pub fn handle_disconnect(&mut self) {
        if self.is_finished() || self.migration_expects_disconnect() {
            return;
        }
        self.handle_failure(if self.fin_received {
            Failure::PeerGone
        } else {
            Failure::Reset
        });
    }

    // ---- outputs ------------------------------------------------------------------------

    /// The next work request to post, if any; call until `None` (see the type docs).
    pub fn poll_write(&mut self) -> Option<Write> {
        if let Some(w) = self.planned.pop_front() {
            return Some(w);
        }
        if self.failed.is_some() || self.peer_reset || self.reset_sent || self.transport.is_some() {
            return None;
        }
        if self.switch_owed && !self.reset_queued {
            // Only credit returns may overtake SWITCHED (both ends keep making progress).
            return self.switched_write().or_else(|| self.credit_write());
        }
        if let Some(w) = self.migration_write() {
            return w;
        }
        if self.reset_queued {
            if self.tx.allows(MsgClass::Reset) && self.sq_room(1) {
                self.tx.spend_wr();
                self.reset_sent = true;
                return Some(self.control(Imm::Reset, true));
            }
            return None;
        }
        if let Some(w) = self.credit_write() {
            return Some(w);
        }
        if let Some(w) = self.grow_write() {
            return Some(w);
        }
        if let Some(w) = self.plan_burst() {
            return Some(w);
        }
        if self.write_shut
            && !self.fin_sent
            && self.tx_posted == self.tx_queued
            && self.tx.allows(MsgClass::Fin)
            && self.sq_room(1)
        {
            self.tx.spend_wr();
            self.fin_sent = true;
            return Some(self.control(Imm::Fin, true));
        }
        // A completion is owed to a waiting writer, or to `is_finished` once nothing else
        // will be sent: fence the unsignaled tail.
        let done = self.fin_sent && self.fin_received;
        let owed = self.need_signal || done || self.send_swap_pending();
        if owed && self.unsignaled_wrs > 0 && self.sq_room(1) {
            self.stats.fences += 1;
            let w = self.work_request(0, 0, 0, None, true);
            return Some(w);
        }
        None
    }

    fn credit_write(&mut self) -> Option<Write> {
        if self.fin_sent && self.fin_received || !self.sq_room(1) {
            return None;
        }
        let held = self.credit_bytes_held();
        let imm = self.rx.take_update(&mut self.tx, held)?;
        self.stats.credit_messages += 1;
        Some(self.control(imm, false))
    }

    /// The next event for the application side, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        if self.events == 0 && (self.finished_reported || !self.is_finished()) {
            return None;
        }
        if self.events & EV_MOVING != 0 {
            self.events &= !EV_MOVING;
            if let Some(port) = self.peer_moving_to() {
                return Some(Event::PeerMoving { port });
            }
        }
        for (bit, ev) in [
            (EV_RESET, Event::Reset),
            (EV_READABLE, Event::Readable),
            (EV_WRITABLE, Event::Writable),
        ] {
            if self.events & bit != 0 {
                self.events &= !bit;
                return Some(ev);
            }
        }
        if !self.finished_reported && self.is_finished() {
            self.finished_reported = true;
            return Some(Event::Finished);
        }
        None
    }
}
