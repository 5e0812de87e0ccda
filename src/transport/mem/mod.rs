//! An in-memory transport: a [`Pair`] of connections whose work requests are executed by
//! copying between `Vec<u8>` buffers, one explicit step at a time.
//!
//! It models what the protocol relies on from an RC queue pair: writes on one QP land in order,
//! a WRITE_WITH_IMM consumes one posted receive (none posted = RNR, reported as a fault rather
//! than retried) and its receive completion reports the write's length (`byte_len`), a non-inline payload is read from the send buffer when it is delivered (so
//! early reuse of send-buffer space corrupts the stream, as on hardware), and a signaled
//! completion arrives only after delivery. Receive completions, send completions and deliveries
//! are separate queues, so a test chooses any interleaving.
//!
//! It also checks what real hardware would not: every written byte must lie in ring space the
//! receiver has granted ([`Fault::OutsideGrant`]). It does not model latency, loss (RC has
//! none) or multiple QPs.

mod handover;

use std::collections::VecDeque;

use crate::proto::wire::{Hello, HelloKind, Imm};
use crate::proto::{Config, Conn, Event, ProtocolError, ReadError, Write, WriteError};

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

#[derive(Debug, Clone, Copy, Hash)]
enum Completion {
    Ok(crate::proto::WrId),
    Err,
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
    next_ring: Option<(Vec<u8>, u32, Vec<bool>)>,
    /// A bigger send buffer waiting for the old one to drain.
    next_send: Option<Vec<u8>>,
    config: Config,
    posted_recvs: u32,
    /// Receive completions: the immediate and the length of the write that carried it.
    recv_cq: VecDeque<(u32, u32)>,
    send_cq: VecDeque<Completion>,
    /// Writes posted and not yet delivered (the wire towards the peer).
    wire: VecDeque<InFlight>,
    /// Work requests posted and not yet retired by a completion handed to the core.
    outstanding: u64,
    posted: u64,
    /// Shadow of which ring bytes the peer may write, maintained from the credits on the wire.
    granted: Vec<bool>,
    grant_cursor: usize,
    fail_next: bool,
    /// Every event the connection reported, in order.
    pub events: Vec<Event>,
}

impl Endpoint {
    fn new(config: Config, conn: Conn, ring_rkey: u32) -> Endpoint {
        Endpoint {
            conn,
            send_buf: vec![0; config.send_buf_size as usize],
            ring: vec![0; config.ring_size as usize],
            ring_rkey,
            next_ring: None,
            next_send: None,
            posted_recvs: config.recv_credits,
            recv_cq: VecDeque::new(),
            send_cq: VecDeque::new(),
            wire: VecDeque::new(),
            outstanding: 0,
            posted: 0,
            granted: vec![true; config.ring_size as usize],
            grant_cursor: 0,
            fail_next: false,
            events: Vec::new(),
            config,
        }
    }

    /// The config this end was built with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Writes posted and not yet delivered.
    pub fn in_flight(&self) -> usize {
        self.wire.len()
    }

    /// Receive completions not yet handed to the connection.
    pub fn pending_recvs(&self) -> usize {
        self.recv_cq.len()
    }

    /// Send completions not yet handed to the connection.
    pub fn pending_completions(&self) -> usize {
        self.send_cq.len()
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
            self.next_ring = Some((vec![0; size as usize], rkey, vec![true; size as usize]));
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
                for pos in returned..copy.to {
                    let i = (pos % u64::from(copy.new_size)) as usize;
                    assert!(granted[i], "peer wrote a moved byte of the new ring");
                    granted[i] = false;
                }
                self.grant_cursor = (returned % u64::from(copy.new_size)) as usize;
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
    pub fn new(config_a: Config, config_b: Config) -> Pair {
        let req = config_a
            .hello(HelloKind::Connect, RING_ADDR[0], RKEY[0], CONN_ID)
            .to_bytes();
        let rep = config_b
            .hello(HelloKind::Accept, RING_ADDR[1], RKEY[1], CONN_ID)
            .to_bytes();
        let a_peer = Hello::parse_kind(&rep, HelloKind::Accept).expect("accept parses");
        let b_peer = Hello::parse_kind(&req, HelloKind::Connect).expect("connect parses");
        let a = Conn::new(&config_a, &a_peer).expect("config A");
        let b = Conn::new(&config_b, &b_peer).expect("config B");
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
            ep.posted += 1;
            ep.outstanding += 1;
            if ep.outstanding > u64::from(ep.config.send_queue_depth) {
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

    /// Makes the next write posted by `from` fail: it and everything behind it complete in
    /// error and nothing reaches the peer (an RC QP in the error state).
    pub fn fail_next_delivery(&mut self, from: Side) {
        self.ep_mut(from).fail_next = true;
    }

    /// Breaks the connection as a lost link would: every write in flight either way completes
    /// in error, later writes fail, and both connections hear of the disconnect.
    pub fn disconnect(&mut self) {
        for ep in [&mut self.a, &mut self.b] {
            ep.fail_next = true;
            for _ in ep.wire.drain(..) {
                ep.send_cq.push_back(Completion::Err);
            }
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
        if src.fail_next {
            src.send_cq.push_back(Completion::Err);
            for _ in src.wire.drain(..) {
                src.send_cq.push_back(Completion::Err);
            }
            return Ok(true);
        }
        let w = f.write;
        let remote_end = w.remote_offset as usize + w.len as usize;
        // The write names its ring by rkey: the current one or one offered to grow into.
        let (ring, granted) = match &mut dst.next_ring {
            Some((ring, rkey, granted)) if *rkey == w.rkey => (ring, granted),
            _ if w.rkey == dst.ring_rkey => (&mut dst.ring, &mut dst.granted),
            _ if w.len == 0 => (&mut dst.ring, &mut dst.granted), // a control: no access
            _ => {
                return Err(Fault::OutOfBounds {
                    side: from,
                    write: w,
                })
            }
        };
        if w.len > 0 && remote_end > ring.len() {
            return Err(Fault::OutOfBounds {
                side: from,
                write: w,
            });
        }
        if w.len > 0 {
            let range = w.remote_offset as usize..remote_end;
            if check {
                if !granted[range.clone()].iter().all(|&g| g) {
                    return Err(Fault::OutsideGrant {
                        side: from,
                        write: w,
                    });
                }
                granted[range.clone()].fill(false);
            }
            match &f.inline_payload {
                Some(p) => ring[range].copy_from_slice(p),
                None => {
                    let local = w.local_offset as usize..w.local_offset as usize + w.len as usize;
                    ring[range].copy_from_slice(&src.send_buf[local]);
                }
            }
        }
        if let Some(imm) = w.imm {
            if dst.posted_recvs == 0 {
                return Err(Fault::Rnr { side: from.peer() });
            }
            dst.posted_recvs -= 1;
            dst.recv_cq.push_back((imm, w.len));
            // Credits returned by `from` re-grant the oldest consumed bytes of its own ring.
            if let (true, Ok(Imm::Credit { bytes, .. })) = (check, Imm::decode(imm)) {
                for _ in 0..bytes {
                    let i = src.grant_cursor;
                    if src.granted[i] {
                        return Err(Fault::DoubleGrant { side: from });
                    }
                    src.granted[i] = true;
                    src.grant_cursor = (i + 1) % src.granted.len();
                }
            }
        }
        if w.signaled {
            src.send_cq.push_back(Completion::Ok(w.wr_id));
        }
        Ok(true)
    }

    /// Hands `side`'s oldest receive completion to its connection and reposts the receive.
    pub fn recv(&mut self, side: Side) -> Result<bool, Fault> {
        let ep = self.ep_mut(side);
        let Some((imm, byte_len)) = ep.recv_cq.pop_front() else {
            return Ok(false);
        };
        let r = ep.conn.handle_imm(imm, byte_len);
        ep.posted_recvs += 1;
        ep.drain_events();
        r.map(|()| true)
            .map_err(|error| Fault::Protocol { side, error })
    }

    /// Hands `side`'s oldest send completion to its connection.
    pub fn complete(&mut self, side: Side) -> bool {
        let ep = self.ep_mut(side);
        let Some(c) = ep.send_cq.pop_front() else {
            return false;
        };
        match c {
            Completion::Ok(id) => {
                ep.conn
                    .handle_send_complete(id)
                    .expect("completion for a posted WR");
                ep.outstanding = ep.posted - (id.0 + 1).min(ep.posted);
            }
            Completion::Err => ep.conn.handle_send_error(),
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
        ep.posted_recvs = ep.posted_recvs.saturating_sub(1);
        ep.recv_cq.push_back((imm, byte_len));
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
    /// Skipped for a direction once either end is reset or failed.
    pub fn check_invariants(&self) -> Result<(), String> {
        for from in [Side::A, Side::B] {
            let (x, y) = (self.ep(from), self.ep(from.peer()));
            if x.conn.error().is_some() || y.conn.error().is_some() {
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
            let travelling = y
                .wire
                .iter()
                .filter_map(|f| f.write.imm)
                .chain(x.recv_cq.iter().map(|&(imm, _)| imm));
            for imm in travelling {
                if let Ok(Imm::Credit { wrs, bytes }) = Imm::decode(imm) {
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
                + y.recv_cq.len() as u64;
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
            if u64::from(y.posted_recvs) + y.recv_cq.len() as u64
                != u64::from(y.config.recv_credits)
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
