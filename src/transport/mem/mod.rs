//! An in-memory transport: a [`Pair`] of connections whose work requests are executed by
//! copying between `Vec<u8>` buffers, one explicit step at a time.
//!
//! What an RC queue pair does is [`fabric`]'s, shared with the stream's in-memory port
//! (engine/stream/mem.rs): writes land in order, a WRITE_WITH_IMM consumes one posted
//! receive and reports the write's length, a signaled completion arrives only after
//! delivery, a QP in error flushes. Here, a write that would fail on hardware (RNR, outside
//! the peer's ring) is reported as a [`Fault`] rather than as an error completion, and a
//! non-inline payload is read from the send buffer when it is delivered (so early reuse of
//! send-buffer space corrupts the stream, as on hardware). Deliveries, receive completions
//! and send completions are taken one at a time, so a test chooses any interleaving.
//!
//! It also checks what real hardware would not: every written byte must lie in ring space the
//! receiver has granted ([`Fault::OutsideGrant`]), credits are returned once, the send queue
//! does not overflow. It does not model latency, loss (RC has none) or multiple QPs.

pub mod fabric;
mod handover;

use fabric::{credit_bytes, Cqe, Grants, Landing, Qp, Wr, WrError};

use std::collections::VecDeque;

use crate::proto::link::imm::StreamId;
use crate::proto::wire::{Hello, HelloKind, Imm};
use crate::proto::{Conn, Event, Params, ProtocolError, ReadError, Write, WriteError};

/// One of the two ends of a [`Pair`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The active (connecting) side.
    A,
    /// The passive (accepting) side.
    B,
}

impl Side {
    /// The other end.
    pub fn peer(self) -> Side {
        match self {
            Side::A => Side::B,
            Side::B => Side::A,
        }
    }
}

/// Something that would break on real hardware or violates the protocol's promises. `side` is
/// the end at fault; `write` the offending work request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)] // the fields are named for what they hold
pub enum Fault {
    /// A write outside the local send buffer or the remote ring.
    OutOfBounds { side: Side, write: Write },
    /// A write into ring bytes the receiver has not granted.
    OutsideGrant { side: Side, write: Write },
    /// Credits returned for ring bytes the peer had not written.
    DoubleGrant { side: Side },
    /// A WRITE_WITH_IMM arrived with no receive posted.
    Rnr { side: Side },
    /// More work requests outstanding than the send queue holds.
    SendQueueOverflow { side: Side },
    /// A connection returned a protocol error.
    Protocol { side: Side, error: ProtocolError },
    /// The pair stopped making progress before the test's goal was reached.
    Stalled,
    /// A hand-over step was refused.
    Migrate(crate::proto::MigrateError),
}

#[derive(Debug, Clone, Hash)]
struct InFlight {
    write: Write,
    /// Inline payloads are captured at post time, as `IBV_SEND_INLINE` does.
    inline_payload: Option<Vec<u8>>,
}

/// One end: a connection plus the memory and queues a driver would own.
#[derive(Debug, Clone, Hash)]
pub struct Endpoint {
    /// The protocol state machine under test.
    pub conn: Conn,
    /// Stands in for the registered send buffer.
    pub send_buf: Vec<u8>,
    /// Stands in for the registered receive ring.
    pub ring: Vec<u8>,
    /// The ring's rkey (writes name the ring they target).
    ring_rkey: u32,
    /// A bigger ring offered to the peer and not yet switched to, with its rkey and grant
    /// shadow (conn/grow.rs).
    next_ring: Option<(Vec<u8>, u32, Grants)>,
    /// A bigger send buffer waiting for the old one to drain.
    next_send: Option<Vec<u8>>,
    config: Params,
    /// Its queue pair: completions, posted receives, state.
    qp: Qp,
    /// Writes posted and not yet delivered (the wire towards the peer).
    wire: VecDeque<InFlight>,
    /// Which ring bytes the peer may write, kept from the writes and credits on the wire.
    granted: Grants,
    /// Every event the connection reported, in order.
    pub events: Vec<Event>,
}

impl Endpoint {
    fn new(config: Params, conn: Conn, ring_rkey: u32) -> Endpoint {
        Endpoint {
            conn,
            send_buf: vec![0; config.send_buf_size as usize],
            ring: vec![0; config.ring_size as usize],
            ring_rkey,
            next_ring: None,
            next_send: None,
            qp: Qp::new(config.recv_credits, config.send_queue_depth),
            wire: VecDeque::new(),
            granted: Grants::new(config.ring_size as usize),
            events: Vec::new(),
            config,
        }
    }

    /// The config this end was built with.
    pub fn config(&self) -> &Params {
        &self.config
    }

    /// Writes posted and not yet delivered.
    pub fn in_flight(&self) -> usize {
        self.wire.len()
    }

    /// Receive completions not yet handed to the connection.
    pub fn pending_recvs(&self) -> usize {
        self.qp.pending(true)
    }

    /// Send completions not yet handed to the connection.
    pub fn pending_completions(&self) -> usize {
        self.qp.pending(false)
    }

    fn drain_events(&mut self) {
        self.sync_memory();
        while let Some(ev) = self.conn.poll_event() {
            self.events.push(ev);
        }
    }

    /// What a driver does for buffers that grow: register what the connection asks for,
    /// move unread bytes into a new ring at the switch, swap a drained send buffer.
    fn sync_memory(&mut self) {
        if let Some(size) = self.conn.ring_grow_wanted() {
            let rkey = self.ring_rkey.wrapping_add(0x100);
            self.next_ring = Some((vec![0; size as usize], rkey, Grants::new(size as usize)));
            self.conn.offer_ring(rkey);
        }
        if let Some(copy) = self.conn.take_ring_copy() {
            if let Some((mut ring, rkey, mut granted)) = self.next_ring.take() {
                for (old, new) in copy.pieces() {
                    ring[new].copy_from_slice(&self.ring[old]);
                }
                // Positions returned..received_end of the new ring hold bytes (moved or
                // consumed): they are not the peer's to write until returned again. It
                // must not have written them.
                let c = self.conn.counters();
                let returned = c.rx_granted_end - u64::from(copy.new_size);
                let held = granted.hold(returned, copy.to);
                assert!(held, "peer wrote a moved byte of the new ring");
                self.ring = ring;
                self.ring_rkey = rkey;
                self.granted = granted;
            }
        }
        if self.conn.pending_ring().is_none() {
            self.next_ring = None;
        }
        if let Some(size) = self.conn.send_grow_wanted() {
            self.next_send = Some(vec![0; size as usize]);
            self.conn.offer_send_buf();
        }
        if self.conn.send_buf_size() as usize != self.send_buf.len() {
            if let Some(buf) = self.next_send.take() {
                self.send_buf = buf;
            }
        }
        if self.conn.pending_send_buf().is_none() {
            self.next_send = None;
        }
    }
}

/// Two connected endpoints and the steps that move data between them. `Clone` and `Hash`
/// let a model checker snapshot and deduplicate states.
#[derive(Debug, Clone, Hash)]
pub struct Pair {
    /// The active (connecting) end.
    pub a: Endpoint,
    /// The passive (accepting) end.
    pub b: Endpoint,
    /// Check every written byte against the receiver's grants (O(bytes); off for benchmarks).
    pub check_grants: bool,
}

/// Fake ring addresses and keys for the handshake.
const RING_ADDR: [u64; 2] = [0x1000_0000, 0x2000_0000];
const RKEY: [u32; 2] = [0xa, 0xb];
const CONN_ID: u64 = 0x00c0_ffee;

impl Pair {
    /// Connects A (active) to B (passive), exchanging real encoded hellos.
    ///
    /// # Panics
    /// If either config is invalid.
    pub fn new(config_a: Params, config_b: Params) -> Pair {
        Pair::make(config_a, config_b, None)
    }

    /// As [`new`](Self::new), the two ends being a stream of a link that A calls `ids.0`
    /// and B `ids.1`: the link's immediates, its credit units and burst limit
    /// (`Conn::on_link`).
    ///
    /// # Panics
    /// If either config is invalid for a link.
    pub fn on_link(config_a: Params, config_b: Params, ids: (StreamId, StreamId)) -> Pair {
        Pair::make(config_a, config_b, Some(ids))
    }

    fn make(config_a: Params, config_b: Params, link: Option<(StreamId, StreamId)>) -> Pair {
        let req = config_a
            .hello(HelloKind::Connect, RING_ADDR[0], RKEY[0], CONN_ID)
            .to_bytes();
        let rep = config_b
            .hello(HelloKind::Accept, RING_ADDR[1], RKEY[1], CONN_ID)
            .to_bytes();
        let a_peer = Hello::parse_kind(&rep, HelloKind::Accept).expect("accept parses");
        let b_peer = Hello::parse_kind(&req, HelloKind::Connect).expect("connect parses");
        let conn = |config: &Params, peer: &Hello, swap: bool| match link {
            None => Conn::new(config, peer),
            Some((a, b)) if swap => Conn::on_link(config, peer, b, a),
            Some((a, b)) => Conn::on_link(config, peer, a, b),
        };
        let a = conn(&config_a, &a_peer, false).expect("config A");
        let b = conn(&config_b, &b_peer, true).expect("config B");
        Pair {
            a: Endpoint::new(config_a, a, RKEY[0]),
            b: Endpoint::new(config_b, b, RKEY[1]),
            check_grants: true,
        }
    }

    /// One end.
    pub fn ep(&self, side: Side) -> &Endpoint {
        match side {
            Side::A => &self.a,
            Side::B => &self.b,
        }
    }

    /// One end, mutably.
    pub fn ep_mut(&mut self, side: Side) -> &mut Endpoint {
        match side {
            Side::A => &mut self.a,
            Side::B => &mut self.b,
        }
    }

    fn both(&mut self, from: Side) -> (&mut Endpoint, &mut Endpoint) {
        match from {
            Side::A => (&mut self.a, &mut self.b),
            Side::B => (&mut self.b, &mut self.a),
        }
    }

    // ---- application ----------------------------------------------------------------------

    /// The application on `side` writes `data` (as much as fits).
    pub fn write(&mut self, side: Side, data: &[u8]) -> Result<usize, WriteError> {
        let ep = self.ep_mut(side);
        let r = ep.conn.write(&mut ep.send_buf, data);
        ep.drain_events();
        r
    }

    /// The application on `side` reads into `buf`.
    pub fn read(&mut self, side: Side, buf: &mut [u8]) -> Result<usize, ReadError> {
        let ep = self.ep_mut(side);
        let r = ep.conn.read(&ep.ring, buf);
        ep.drain_events();
        r
    }

    // ---- steps ----------------------------------------------------------------------------

    /// Posts every work request `side` has; returns how many.
    pub fn post(&mut self, side: Side) -> Result<usize, Fault> {
        let ep = self.ep_mut(side);
        let mut n = 0;
        while let Some(w) = ep.conn.poll_write() {
            let local_end = w.local_offset as usize + w.len as usize;
            if local_end > ep.send_buf.len() || (w.inline && w.len > ep.config.max_inline) {
                return Err(Fault::OutOfBounds { side, write: w });
            }
            if !ep.qp.post_send(w.wr_id.0) {
                return Err(Fault::SendQueueOverflow { side });
            }
            let inline_payload = w
                .inline
                .then(|| ep.send_buf[w.local_offset as usize..local_end].to_vec());
            ep.wire.push_back(InFlight {
                write: w,
                inline_payload,
            });
            n += 1;
        }
        ep.drain_events();
        Ok(n)
    }

    /// Puts `from`'s QP in the error state: its next write and everything behind it complete
    /// in error and nothing reaches the peer, whose writes to it fail too (retries exceeded).
    pub fn fail_next_delivery(&mut self, from: Side) {
        self.ep_mut(from).qp.error = true;
    }

    /// Breaks the connection as a lost link would: every write in flight either way completes
    /// in error, later writes fail, posted receives flush, and both connections hear of the
    /// disconnect.
    pub fn disconnect(&mut self) {
        self.a.qp.disconnect(&mut self.b.qp);
        self.b.qp.disconnect(&mut self.a.qp);
        for ep in [&mut self.a, &mut self.b] {
            for f in ep.wire.drain(..) {
                ep.qp.flush(f.write.wr_id.0);
            }
            ep.qp.tell_disconnect = false; // told here
            ep.conn.handle_disconnect();
            ep.drain_events();
        }
    }

    /// Executes the oldest write posted by `from`; returns false if none.
    pub fn deliver(&mut self, from: Side) -> Result<bool, Fault> {
        let check = self.check_grants;
        let (src, dst) = self.both(from);
        let Some(f) = src.wire.pop_front() else {
            return Ok(false);
        };
        let w = f.write;
        let wr = Wr::from(&w);
        let local = w.local_offset as usize..w.local_offset as usize + w.len as usize;
        let mut mem = Rings {
            ring: &mut dst.ring,
            rkey: dst.ring_rkey,
            granted: &mut dst.granted,
            next: &mut dst.next_ring,
            payload: match &f.inline_payload {
                Some(p) => p,
                None => src.send_buf.get(local).unwrap_or_default(),
            },
            check,
        };
        match src.qp.execute(&mut dst.qp, &wr, &mut mem) {
            Ok(()) => {}
            // The QP is in error: this and everything behind it complete flushed.
            Err(WrError::Flushed | WrError::RetryExceeded) => {
                for f in src.wire.drain(..) {
                    src.qp.flush(f.write.wr_id.0);
                }
                return Ok(true);
            }
            Err(WrError::RemoteAccess) => {
                return Err(Fault::OutOfBounds {
                    side: from,
                    write: w,
                })
            }
            Err(WrError::OutsideGrant) => {
                return Err(Fault::OutsideGrant {
                    side: from,
                    write: w,
                })
            }
            Err(WrError::Rnr) => return Err(Fault::Rnr { side: from.peer() }),
        }
        // Credits returned by `from` re-grant the oldest consumed bytes of its own ring (an
        // immediate is read as its receiver reads it: a link stream's names the receiver's id).
        if let (true, Some(imm)) = (check, w.imm) {
            if !src.granted.give_back(credit_bytes(imm, dst.conn.codec())) {
                return Err(Fault::DoubleGrant { side: from });
            }
        }
        Ok(true)
    }

    /// Hands `side`'s oldest receive completion to its connection and reposts the receive.
    pub fn recv(&mut self, side: Side) -> Result<bool, Fault> {
        let ep = self.ep_mut(side);
        let Some(c) = ep.qp.take(true) else {
            return Ok(false);
        };
        let Cqe::Recv { imm, byte_len } = c else {
            return Ok(true); // flushed: no immediate, nothing to repost
        };
        let r = ep.conn.handle_imm(imm, byte_len);
        ep.qp.recvs += 1;
        ep.drain_events();
        r.map(|()| true)
            .map_err(|error| Fault::Protocol { side, error })
    }

    /// Hands `side`'s oldest send completion to its connection.
    pub fn complete(&mut self, side: Side) -> bool {
        let ep = self.ep_mut(side);
        let Some(c) = ep.qp.take(false) else {
            return false;
        };
        match c {
            Cqe::Sent { wr_id } => {
                ep.conn
                    .handle_send_complete(crate::proto::WrId(wr_id))
                    .expect("completion for a posted WR");
            }
            _ => ep.conn.handle_send_error(),
        }
        ep.drain_events();
        true
    }

    /// Pushes a raw immediate into `side`'s receive queue as if the peer had sent it in a
    /// zero-length write (as control messages are).
    pub fn inject_imm(&mut self, side: Side, imm: u32) {
        self.inject_write(side, imm, 0);
    }

    /// Pushes a receive completion into `side`'s queue as if the peer had written `byte_len`
    /// bytes with immediate `imm` (the bytes themselves are not written).
    pub fn inject_write(&mut self, side: Side, imm: u32, byte_len: u32) {
        let ep = self.ep_mut(side);
        ep.qp.recvs = ep.qp.recvs.saturating_sub(1);
        ep.qp.cq.push_back(Cqe::Recv { imm, byte_len });
    }

    /// One round of every step on both sides; returns whether anything happened.
    pub fn step(&mut self) -> Result<bool, Fault> {
        let mut progress = false;
        for side in [Side::A, Side::B] {
            progress |= self.post(side)? > 0;
        }
        for side in [Side::A, Side::B] {
            while self.deliver(side)? {
                progress = true;
            }
        }
        for side in [Side::A, Side::B] {
            while self.recv(side)? {
                progress = true;
            }
            while self.complete(side) {
                progress = true;
            }
        }
        Ok(progress)
    }

    /// Steps until nothing moves (more than 100 000 rounds is [`Fault::Stalled`]).
    pub fn drive(&mut self) -> Result<(), Fault> {
        for _ in 0..100_000 {
            if !self.step()? {
                return Ok(());
            }
        }
        Err(Fault::Stalled)
    }

    // ---- invariants -----------------------------------------------------------------------

    /// Checks exact credit conservation in both directions and the posted-receive count.
    /// Skipped for a direction once either end is reset or failed, or its QP is in error.
    pub fn check_invariants(&self) -> Result<(), String> {
        for from in [Side::A, Side::B] {
            let (x, y) = (self.ep(from), self.ep(from.peer()));
            if x.conn.error().is_some() || y.conn.error().is_some() || x.qp.error || y.qp.error {
                continue;
            }
            if x.conn.state() == crate::proto::State::Reset
                || y.conn.state() == crate::proto::State::Reset
            {
                continue;
            }
            let (cx, cy) = (x.conn.counters(), y.conn.counters());
            // Credits from y to x still travelling: on y's wire or in x's receive queue.
            let mut credit_bytes = 0u64;
            let mut credit_wrs = 0u64;
            let travelling =
                y.wire
                    .iter()
                    .filter_map(|f| f.write.imm)
                    .chain(x.qp.cq.iter().filter_map(|c| match c {
                        Cqe::Recv { imm, .. } => Some(*imm),
                        _ => None,
                    }));
            for imm in travelling {
                if let Ok(Imm::Credit { wrs, bytes }) = x.conn.codec().decode(imm) {
                    credit_bytes += u64::from(bytes);
                    credit_wrs += u64::from(wrs);
                }
            }
            // Between the sender reading GROW and the receiver reading SWITCHED, the sender
            // already counts the bigger ring.
            let regrown = u64::from(cx.tx_peer_ring) - u64::from(cy.rx_ring);
            if cy.rx_granted_end + regrown != cx.tx_granted_end + credit_bytes {
                return Err(format!(
                    "{from:?}->peer bytes: receiver granted to {}, sender holds {} + {} in flight",
                    cy.rx_granted_end, cx.tx_granted_end, credit_bytes
                ));
            }
            let imms_to_y = x.wire.iter().filter(|f| f.write.imm.is_some()).count() as u64
                + y.qp.pending(true) as u64;
            let total =
                u64::from(cx.tx_wr_credits) + imms_to_y + u64::from(cy.rx_wrs_pending) + credit_wrs;
            if total != u64::from(y.config.recv_credits) {
                return Err(format!(
                    "{from:?}->peer WRs: {} credits + {} imms + {} pending + {} returning != {}",
                    cx.tx_wr_credits,
                    imms_to_y,
                    cy.rx_wrs_pending,
                    credit_wrs,
                    y.config.recv_credits
                ));
            }
            if u64::from(y.qp.recvs) + y.qp.pending(true) as u64 != u64::from(y.config.recv_credits)
            {
                return Err(format!("{:?} posted receives out of step", from.peer()));
            }
            if cx.tx_posted > cx.tx_granted_end || cy.rx_received_end > cx.tx_posted {
                return Err(format!(
                    "{from:?} wrote outside its window: {cx:?} / {cy:?}"
                ));
            }
            if cx.tx_acked > cx.tx_posted
                || cx.tx_queued - cx.tx_acked > u64::from(x.conn.send_buf_size())
            {
                return Err(format!("{from:?} send buffer accounting: {cx:?}"));
            }
        }
        Ok(())
    }
}

/// The receiving end's rings as a write lands in them (the current one, or one offered to
/// grow into, by rkey), checked against its grants.
struct Rings<'a> {
    ring: &'a mut Vec<u8>,
    rkey: u32,
    granted: &'a mut Grants,
    next: &'a mut Option<(Vec<u8>, u32, Grants)>,
    payload: &'a [u8],
    check: bool,
}

impl Rings<'_> {
    fn by_key(&mut self, rkey: u32) -> Option<(&mut Vec<u8>, &mut Grants)> {
        match self.next {
            Some((ring, k, granted)) if *k == rkey => Some((ring, granted)),
            _ if rkey == self.rkey => Some((&mut *self.ring, &mut *self.granted)),
            _ => None,
        }
    }
}

impl Landing for Rings<'_> {
    fn ring_len(&self, rkey: u32) -> Option<usize> {
        match &*self.next {
            Some((ring, k, _)) if *k == rkey => Some(ring.len()),
            _ => (rkey == self.rkey).then_some(self.ring.len()),
        }
    }

    fn land(&mut self, rkey: u32, at: core::ops::Range<usize>) -> bool {
        let (check, payload) = (self.check, self.payload);
        let Some((ring, granted)) = self.by_key(rkey) else {
            return false;
        };
        if check && !granted.take(at.clone()) {
            return false;
        }
        ring[at].copy_from_slice(payload);
        true
    }
}
