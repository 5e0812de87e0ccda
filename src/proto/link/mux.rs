//! One end of a link's data plane: stream 0, the stream table and the link's queues
//! (PROTOCOL.md §14). Each stream's [`Conn`] is the driver's (the engine keeps it in the
//! stream the program holds); the mux says which stream a completion is for, makes the
//! `Conn` of a stream the peer opened or accepted, and keeps the link's queues shared
//! fairly: every stream has a share of the receive queue (its `recv_credits`) and of the
//! send queue (its `send_queue_depth`), the queue pair holds the sum, and a stream that
//! would not fit is refused. A stream can so hold no more of either queue than its share:
//! one bulk stream delays another's small message by at most its own share of the send
//! queue, and one stream's unread bytes never take another's receives.
//!
//! The driver's loop: post the receives [`Mux::receives_to_post`] says (first: a stream's
//! share must be posted before the OPEN or ACCEPT that announces it leaves), post stream 0's
//! [`Mux::poll_control_write`] and the streams' own writes tagged with [`tag`], and hand
//! the completions over in the CQ's order: each receive to [`Mux::handle_imm`] (and to the
//! stream it names), each send completion to [`Mux::handle_send_complete`]. After a
//! completion of stream 0, take the events ([`Mux::poll_event`]) before the next
//! completion: an ACCEPT opens its stream before the peer's first bytes on it are looked at.
//! Any protocol error fails the whole link.

use super::control::{Control, ControlError, ControlEvent};
use super::imm::{decode, StreamId};
use super::record::{Accept, Grant, Open, RefuseReason, MAX_RECORD_LEN};
use super::streams::NoId;
use crate::proto::wire::{Hello, HelloKind};
use crate::proto::{Conn, Params, ProtocolError, WrId, Write};
use std::collections::VecDeque;
use std::net::SocketAddr;

/// Bits of a work request id below the stream's id: the stream's own id of the request
/// (see [`widen`]). The stream's id takes the 15 bits above; the 5 top bits are the
/// driver's (its flags: a receive, a signaled write, a probe).
pub const WR_STREAM_SHIFT: u32 = 44;
const WR_MASK: u64 = (1 << WR_STREAM_SHIFT) - 1;
const WR_STREAM_MASK: u64 = 0x7fff;
/// The stream id's bits of a work request id.
pub const WR_STREAM_BITS: u64 = WR_STREAM_MASK << WR_STREAM_SHIFT;
/// The driver's bits of a work request id (above the stream id's).
pub const WR_DRIVER_BITS: u64 = !(WR_MASK | WR_STREAM_BITS);

/// Where a stream's receive ring lies, as the peer addresses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingAt {
    /// The memory region's remote key.
    pub rkey: u32,
    /// The ring's byte 0 in that region.
    pub addr: u64,
}

/// The link failed (the peer broke the protocol, or stream 0 did).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MuxError {
    /// Stream 0 or one of its records.
    Control(ControlError),
    /// A stream's connection refused what came.
    Stream(u16, ProtocolError),
    /// An immediate that does not decode, or for a stream that is not open.
    Immediate(u32),
    /// A send completion for no work request of ours.
    Completion(u64),
    /// The peer refused stream `.0`, whose ring it had written into before its answer.
    WroteRefused(u16),
}

/// What the peer said on stream 0, applied to the link, for the driver.
#[derive(Debug)]
pub enum LinkEvent {
    /// The peer asks for a stream: answer with [`Mux::accept`] or [`Mux::refuse`].
    Incoming(Open),
    /// The peer's OPEN took our granted stream `mine`: its connection, the driver's from
    /// now (no answer goes; a stream the driver does not want it closes).
    IncomingGranted {
        /// The OPEN.
        open: Open,
        /// Our id of the stream.
        mine: StreamId,
        /// Its connection (speaking the link's immediates).
        conn: Box<Conn>,
    },
    /// Our OPEN of stream `mine` was accepted: its connection, the driver's from now.
    Opened {
        /// Our id of the stream.
        mine: StreamId,
        /// Its connection (speaking the link's immediates).
        conn: Box<Conn>,
    },
    /// Our OPEN of stream `mine` was refused; the id is free again.
    Refused {
        /// Our id of the stream.
        mine: StreamId,
        /// Why.
        reason: RefuseReason,
    },
    /// The peer sends nothing more for stream `mine` (its CLOSE).
    PeerClosed {
        /// Our id of the stream.
        mine: StreamId,
    },
    /// The peer means to tear the idle link down: no new stream either way.
    Goodbye,
    /// The peer grew its ring of our stream `mine` (its GROW record): the stream's
    /// connection takes it ([`Conn::on_grow_record`]) before the link's next completion.
    Grow {
        /// Our id of the stream.
        mine: StreamId,
        /// The new ring's size.
        size: u32,
        /// Where it lies.
        ring: RingAt,
    },
}

/// One stream's shares of the link's queues.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Share {
    recvs: u32,
    sends: u32,
}

impl Share {
    fn of(p: &Params) -> Share {
        Share {
            recvs: p.recv_credits,
            sends: p.send_queue_depth,
        }
    }
}

/// One end's streams on a link.
#[derive(Debug)]
pub struct Mux {
    control: Conn,
    plane: Control,
    /// Entry `i`: the shares of stream `i + 1`, while its id is taken here.
    shares: Vec<Option<Share>>,
    /// Stream 0's shares and every stream's, summed.
    used: Share,
    /// What the queue pair holds: the most `used` may reach.
    capacity: Share,
    /// Streams we opened and the peer has not answered: their params.
    opening: Vec<(StreamId, Params)>,
    /// Streams we granted and the peer has not taken: their params.
    granted: Vec<(StreamId, Params)>,
    /// OPENs of streams taken on the peer's grants, held until the driver announces them.
    unannounced: Vec<Open>,
    /// Receives for streams we opened that came before the peer's ACCEPT (its stream 0 may
    /// wait for credits while the new stream writes): `(id, imm, byte_len)`, in order,
    /// handed to the connection the ACCEPT makes.
    early: Vec<(StreamId, u32, u32)>,
    /// Receives on the queue pair: posted and not consumed.
    posted: u32,
    events: VecDeque<LinkEvent>,
    failed: Option<MuxError>,
}

impl Mux {
    /// The streams of a link whose stream 0 is `control` (made with [`Conn::on_link`], ids 0,
    /// with `control_params`), on a queue pair whose receive and send queues hold
    /// `rq_capacity` and `sq_capacity` work requests, giving out at most `max_streams` ids.
    /// `None` if stream 0 alone does not fit the queues.
    pub fn new(
        control: Conn,
        control_params: &Params,
        rq_capacity: u32,
        sq_capacity: u32,
        max_streams: u16,
    ) -> Option<Mux> {
        let used = Share::of(control_params);
        if used.recvs > rq_capacity || used.sends > sq_capacity {
            return None;
        }
        Some(Mux {
            control,
            plane: Control::new(max_streams),
            shares: Vec::new(),
            used,
            capacity: Share {
                recvs: rq_capacity,
                sends: sq_capacity,
            },
            opening: Vec::new(),
            granted: Vec::new(),
            unannounced: Vec::new(),
            early: Vec::new(),
            posted: 0,
            events: VecDeque::new(),
            failed: None,
        })
    }

    /// Opens a stream to `dest` with our side `params` (ring at `ring`; `from_port`: our
    /// port for it, or 0): our id of it. Its connection comes with [`LinkEvent::Opened`].
    /// `Exhausted` when no id is left or its shares would not fit the queues.
    pub fn open(
        &mut self,
        params: Params,
        ring: RingAt,
        conn_id: u64,
        (dest, from_port): (SocketAddr, u16),
    ) -> Result<StreamId, NoId> {
        if !self.fits(&params) {
            return Err(NoId::Exhausted);
        }
        let open = open_record(&params, ring, conn_id, (dest, from_port));
        let mine = self.plane.open(open)?;
        // Its receives are posted before the OPEN leaves: the peer may write at once.
        self.take_share(mine, Share::of(&params));
        self.opening.push((mine, params));
        Ok(mine)
    }

    /// Grants the peer a stream with our side `params` (ring at `ring`), which its next OPEN
    /// may take without waiting for an answer: our id of it. `Exhausted` when no id is left
    /// or its shares would not fit the queues.
    pub fn grant(&mut self, params: Params, ring: RingAt) -> Result<StreamId, NoId> {
        if !self.fits(&params) {
            return Err(NoId::Exhausted);
        }
        let grant = Grant {
            acceptor: StreamId::CONTROL,
            recv_credits: params.recv_credits.min(u32::from(u16::MAX)) as u16,
            ring_size: params.ring_size,
            ring_rkey: ring.rkey,
            ring_addr: ring.addr,
        };
        let mine = self.plane.grant(grant)?;
        // Its receives are posted before the GRANT leaves: the peer may write after its OPEN.
        self.take_share(mine, Share::of(&params));
        self.granted.push((mine, params));
        Ok(mine)
    }

    /// Streams we granted that the peer has not taken yet.
    pub fn grants_out(&self) -> usize {
        self.granted.len()
    }

    /// Grants of the peer's not taken yet.
    pub fn grants_held(&self) -> usize {
        self.plane.grants_held()
    }

    /// Whether a grant of the peer's may be taken now ([`open_granted`](Self::open_granted)
    /// would succeed for params that fit).
    pub fn can_open_granted(&self, params: &Params) -> bool {
        self.failed.is_none()
            && self.plane.next_grant().is_some()
            && self.fits(params)
            && self
                .control
                .sends_now(self.control_backlog() + MAX_RECORD_LEN)
    }

    /// Opens a stream to `dest` on the peer's oldest grant, with our side `params` (ring at
    /// `ring`; `from_port` as for [`open`](Self::open)): our id of it and its connection,
    /// open at once. Its OPEN is held until [`announce`](Self::announce): the peer writes as
    /// soon as it has it, so the driver first makes the stream ready for its bytes. `None` unless
    /// [`can_open_granted`](Self::can_open_granted).
    pub fn open_granted(
        &mut self,
        params: Params,
        ring: RingAt,
        conn_id: u64,
        (dest, from_port): (SocketAddr, u16),
    ) -> Option<(StreamId, Conn)> {
        if !self.can_open_granted(&params) {
            return None;
        }
        let open = open_record(&params, ring, conn_id, (dest, from_port));
        let (mine, g, open) = self.plane.open_granted(open).ok()?;
        self.take_share(mine, Share::of(&params));
        self.unannounced.push(open);
        let peer = hello(
            g.ring_addr,
            g.ring_rkey,
            g.ring_size,
            g.recv_credits,
            conn_id,
        );
        match Conn::on_link(&params, &peer, mine, g.acceptor) {
            Ok(conn) => Some((mine, conn)),
            // Not reached: our params fit a link stream, the grant passed the parser.
            Err(_) => {
                self.close(mine);
                None
            }
        }
    }

    /// Queues the OPEN of a stream [`open_granted`](Self::open_granted) made: the position in
    /// stream 0 its last byte has, for [`control_posted`](Self::control_posted) to pass
    /// before the stream writes (its bytes must not overtake its OPEN). `None` if it was
    /// announced already.
    pub fn announce(&mut self, mine: StreamId) -> Option<u64> {
        let i = self.unannounced.iter().position(|o| o.opener == mine)?;
        let open = self.unannounced.swap_remove(i);
        self.plane.send_open(&open);
        Some(self.control.counters().tx_queued + self.plane.queued() as u64)
    }

    /// Record bytes that go out before an OPEN queued now: those queued, the CLOSEs held
    /// back, and the OPENs of streams not announced yet.
    fn control_backlog(&self) -> usize {
        self.plane.queued() + self.plane.lazy_len() + self.unannounced.len() * MAX_RECORD_LEN
    }

    /// How far stream 0 has been handed out in work requests.
    pub fn control_posted(&self) -> u64 {
        self.control.counters().tx_posted
    }

    /// Accepts the peer's `open` with our side `params` (ring at `ring`): our id of the new
    /// stream and its connection, usable at once. With no id to give or no room in the
    /// queues, the OPEN is refused.
    pub fn accept(
        &mut self,
        open: &Open,
        params: Params,
        ring: RingAt,
    ) -> Result<(StreamId, Conn), NoId> {
        let ours = Accept {
            opener: StreamId::CONTROL,
            acceptor: StreamId::CONTROL,
            recv_credits: params.recv_credits.min(u32::from(u16::MAX)) as u16,
            ring_size: params.ring_size,
            ring_rkey: ring.rkey,
            ring_addr: ring.addr,
            conn_id: 0,
        };
        let peer = hello(
            open.ring_addr,
            open.ring_rkey,
            open.ring_size,
            open.recv_credits,
            open.conn_id,
        );
        // A config the connection refuses, or shares that do not fit, are refused before an
        // id is taken.
        if !self.fits(&params)
            || Conn::on_link(&params, &peer, StreamId::CONTROL, open.opener).is_err()
        {
            self.plane.refuse(open.opener, RefuseReason::NoResources);
            return Err(NoId::Exhausted);
        }
        let mine = self.plane.accept(open, ours)?;
        match Conn::on_link(&params, &peer, mine, open.opener) {
            Ok(conn) => {
                self.take_share(mine, Share::of(&params));
                Ok((mine, conn))
            }
            // Not reached: the same config passed above.
            Err(_) => {
                self.plane.close(mine);
                Err(NoId::Exhausted)
            }
        }
    }

    /// Refuses the peer's OPEN of its stream `theirs`.
    pub fn refuse(&mut self, theirs: StreamId, reason: RefuseReason) {
        self.plane.refuse(theirs, reason);
    }

    /// We are done with stream `mine` (its connection finished, or the driver gave it up):
    /// its CLOSE goes out, and its shares return once the peer's CLOSE came too.
    pub fn close(&mut self, mine: StreamId) {
        self.announce(mine); // the peer must know a stream before its CLOSE
        self.plane.close(mine);
        self.free_if_done(mine);
    }

    /// As [`close`](Self::close), the CLOSE held back until the next record or
    /// [`release_closes`](Self::release_closes) ([`Control::close_lazily`]) — unless half the
    /// ids are taken: the peer's ids and slots for our closed streams come back only with it.
    pub fn close_lazily(&mut self, mine: StreamId) {
        self.announce(mine);
        self.plane.close_lazily(mine);
        self.free_if_done(mine);
        let ids = self.plane.streams();
        if ids.in_use() * 2 > usize::from(ids.max()) {
            self.plane.release_lazy();
        }
    }

    /// Announces the bigger ring of our stream `mine` (its connection's
    /// [`Conn::take_grow_record`]): a GROW record, after every record queued before it.
    pub fn grow(&mut self, mine: StreamId, size: u32, ring: RingAt) {
        self.announce(mine); // the peer must know a stream before its GROW
        self.plane.grow(mine, size, ring.rkey, ring.addr);
    }

    /// Says GOODBYE: no new stream on this link from now on, either way (before the link is
    /// closed for want of streams).
    pub fn goodbye(&mut self) {
        self.plane.goodbye();
    }

    /// Whether GOODBYE was sent or received: no new stream either way.
    pub fn closing(&self) -> bool {
        self.plane.streams().saying_goodbye()
    }

    /// Sends the CLOSEs held back; whether there were any.
    pub fn release_closes(&mut self) -> bool {
        self.plane.release_lazy()
    }

    /// Whether CLOSEs are held back.
    pub fn holds_closes(&self) -> bool {
        self.plane.has_lazy()
    }

    /// Receives to post now so that the queue holds every stream's share.
    pub fn receives_to_post(&mut self) -> u32 {
        let n = self.used.recvs.saturating_sub(self.posted);
        self.posted += n;
        n
    }

    /// Stream 0's next work request (tagged): the records queued go into `control_send`,
    /// stream 0's send buffer, first. None while receives are owed
    /// ([`receives_to_post`](Self::receives_to_post)) or the link failed.
    pub fn poll_control_write(&mut self, control_send: &mut [u8]) -> Option<Write> {
        if self.failed.is_some() || self.posted < self.used.recvs {
            return None;
        }
        self.plane.flush(&mut self.control, control_send);
        if let Some(e) = self.plane.error() {
            self.fail(MuxError::Control(e));
            return None;
        }
        self.control.poll_write().map(|w| tag(StreamId::CONTROL, w))
    }

    /// A receive completed with immediate `raw` carrying `byte_len` bytes; `control_ring`
    /// is stream 0's ring. `Some(id)`: it is stream `id`'s, whose connection must now take
    /// `(raw, byte_len)`; `None`: stream 0's, handled (see [`poll_event`]
    /// (Self::poll_event)). Either way the receive is consumed: post what
    /// [`receives_to_post`](Self::receives_to_post) says.
    pub fn handle_imm(
        &mut self,
        raw: u32,
        byte_len: u32,
        control_ring: &[u8],
    ) -> Result<Option<StreamId>, MuxError> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        self.posted = self.posted.saturating_sub(1);
        let Ok((id, _)) = decode(raw) else {
            return Err(self.fail(MuxError::Immediate(raw)));
        };
        if id != StreamId::CONTROL {
            if let Some(share) = self.share(id).filter(|_| self.opening_id(id)) {
                // No more than its receives: the peer had no credit for more.
                let kept = self.early.iter().filter(|e| e.0 == id).count();
                if kept as u32 >= share.recvs {
                    return Err(self.fail(MuxError::Immediate(raw)));
                }
                self.early.push((id, raw, byte_len));
                return Ok(None);
            }
            return match self.plane.streams().accepts_input(id) {
                Ok(()) if self.share(id).is_some() => Ok(Some(id)),
                _ => Err(self.fail(MuxError::Immediate(raw))),
            };
        }
        if let Err(e) = self.control.handle_imm(raw, byte_len) {
            return Err(self.fail(MuxError::Stream(0, e)));
        }
        if let Err(e) = self.plane.receive(&mut self.control, control_ring) {
            return Err(self.fail(MuxError::Control(e)));
        }
        self.take_control_events();
        Ok(None)
    }

    /// A signaled work request `wr_id` (as [`tag`] made it) completed: `Some((id, low))` if
    /// it is stream `id`'s (its connection takes [`widen`]`(low, its retired count)`),
    /// `None` if stream 0's (handled).
    pub fn handle_send_complete(
        &mut self,
        wr_id: u64,
    ) -> Result<Option<(StreamId, WrId)>, MuxError> {
        let (id, own) = untag(wr_id);
        match id {
            Some(StreamId::CONTROL) => {
                let own = widen(own, self.control.counters().wrs_retired);
                match self.control.handle_send_complete(own) {
                    Ok(()) => Ok(None),
                    Err(_) => Err(self.fail(MuxError::Completion(wr_id))),
                }
            }
            Some(id) if self.share(id).is_some() => Ok(Some((id, own))),
            _ => Err(self.fail(MuxError::Completion(wr_id))),
        }
    }

    /// The next thing the peer said on stream 0.
    pub fn poll_event(&mut self) -> Option<LinkEvent> {
        self.events.pop_front()
    }

    /// Fails the link (a stream's connection refused what its peer sent): every stream on
    /// it goes with it. Returns the first failure.
    pub fn fail(&mut self, e: MuxError) -> MuxError {
        *self.failed.get_or_insert(e)
    }

    /// Why the link failed, if it did.
    pub fn error(&self) -> Option<MuxError> {
        self.failed
    }

    /// Whether our id `mine` is taken (opening, open or closing: the peer may still write
    /// into its ring until both CLOSEs passed).
    pub fn holds(&self, mine: StreamId) -> bool {
        self.share(mine).is_some()
    }

    /// Streams whose id is taken here (opening, open or closing; stream 0 aside).
    pub fn streams(&self) -> usize {
        self.shares.iter().flatten().count()
    }

    /// Stream 0's connection (its driver reads nothing from it: the records are the mux's).
    pub fn control(&self) -> &Conn {
        &self.control
    }

    /// Whether a stream with `params` would fit the link's queues now.
    fn fits(&self, p: &Params) -> bool {
        let s = Share::of(p);
        self.used.recvs + s.recvs <= self.capacity.recvs
            && self.used.sends + s.sends <= self.capacity.sends
    }

    fn share(&self, id: StreamId) -> Option<Share> {
        let i = usize::from(id.get()).checked_sub(1)?;
        *self.shares.get(i)?
    }

    fn take_share(&mut self, mine: StreamId, s: Share) {
        let i = usize::from(mine.get()) - 1;
        if self.shares.len() <= i {
            self.shares.resize(i + 1, None);
        }
        if let Some(old) = self.shares[i].replace(s) {
            self.used.recvs -= old.recvs; // not reached: an id is taken once
            self.used.sends -= old.sends;
        }
        self.used.recvs += s.recvs;
        self.used.sends += s.sends;
    }

    /// Returns stream `mine`'s shares once its id is free (both CLOSEs passed, or refused).
    /// Its receives stay posted and count for the next stream's share.
    fn free_if_done(&mut self, mine: StreamId) {
        let granted = self.granted.iter().any(|(id, _)| *id == mine);
        if self.plane.streams().theirs(mine).is_some() || self.opening_id(mine) || granted {
            return;
        }
        let i = usize::from(mine.get()) - 1;
        if let Some(s) = self.shares.get_mut(i).and_then(Option::take) {
            self.used.recvs -= s.recvs;
            self.used.sends -= s.sends;
        }
    }

    /// Stream `mine`'s connection, the peer's side being `peer`; one that cannot be made
    /// (not reached: our params were checked when the stream was opened or granted, the
    /// peer's by the record parser) is closed.
    fn conn_of(
        &mut self,
        params: &Params,
        peer: &Hello,
        mine: StreamId,
        theirs: StreamId,
    ) -> Option<Box<Conn>> {
        match Conn::on_link(params, peer, mine, theirs) {
            Ok(conn) => Some(Box::new(conn)),
            Err(_) => {
                self.plane.close(mine);
                None
            }
        }
    }

    fn opening_id(&self, mine: StreamId) -> bool {
        self.opening.iter().any(|(id, _)| *id == mine)
    }

    /// Applies what stream 0 said (an ACCEPT makes the stream's connection, a REFUSE frees
    /// its shares) and leaves the events for the driver, in order.
    fn take_control_events(&mut self) {
        while let Some(ev) = self.plane.poll_event() {
            let ev = match ev {
                ControlEvent::Accepted(acc) => {
                    let Some(params) = take_params(&mut self.opening, acc.opener) else {
                        continue; // not reached: the stream table checked the ACCEPT
                    };
                    let peer = hello(
                        acc.ring_addr,
                        acc.ring_rkey,
                        acc.ring_size,
                        acc.recv_credits,
                        acc.conn_id,
                    );
                    let mine = acc.opener;
                    let Some(mut conn) = self.conn_of(&params, &peer, mine, acc.acceptor) else {
                        continue;
                    };
                    for (raw, len) in self.take_early(mine) {
                        if let Err(e) = conn.handle_imm(raw, len) {
                            self.fail(MuxError::Stream(mine.get(), e));
                        }
                    }
                    LinkEvent::Opened { mine, conn }
                }
                ControlEvent::Refused { mine, reason } => {
                    if !self.take_early(mine).is_empty() {
                        // It wrote into a stream it refuses: not a peer to trust.
                        self.fail(MuxError::WroteRefused(mine.get()));
                    }
                    self.opening.retain(|(id, _)| *id != mine);
                    self.free_if_done(mine);
                    LinkEvent::Refused { mine, reason }
                }
                ControlEvent::PeerClosed { mine } => {
                    self.free_if_done(mine);
                    LinkEvent::PeerClosed { mine }
                }
                ControlEvent::Incoming(open) => LinkEvent::Incoming(open),
                ControlEvent::IncomingGranted { open, mine } => {
                    let Some(params) = take_params(&mut self.granted, mine) else {
                        continue; // not reached: the stream table checked the grant
                    };
                    let peer = hello(
                        open.ring_addr,
                        open.ring_rkey,
                        open.ring_size,
                        open.recv_credits,
                        open.conn_id,
                    );
                    let Some(conn) = self.conn_of(&params, &peer, mine, open.opener) else {
                        continue;
                    };
                    LinkEvent::IncomingGranted { open, mine, conn }
                }
                ControlEvent::Goodbye => LinkEvent::Goodbye,
                ControlEvent::Grow(g) => LinkEvent::Grow {
                    mine: g.peer,
                    size: g.ring_size,
                    ring: RingAt {
                        rkey: g.ring_rkey,
                        addr: g.ring_addr,
                    },
                },
            };
            self.events.push_back(ev);
        }
    }

    /// The receives kept for stream `mine` before its ACCEPT, in order.
    fn take_early(&mut self, mine: StreamId) -> Vec<(u32, u32)> {
        let mut taken = Vec::new();
        self.early.retain(|&(id, raw, len)| {
            let its = id == mine;
            if its {
                taken.push((raw, len));
            }
            !its
        });
        taken
    }
}

/// The OPEN of a stream to `dest` with our side `params` (ring at `ring`), for
/// [`Mux::open`] and [`Mux::open_granted`] (which names the grant it takes).
fn open_record(
    params: &Params,
    ring: RingAt,
    conn_id: u64,
    (dest, from_port): (SocketAddr, u16),
) -> Open {
    Open {
        opener: StreamId::CONTROL,
        granted: None,
        from_port,
        recv_credits: params.recv_credits.min(u32::from(u16::MAX)) as u16,
        ring_size: params.ring_size,
        ring_rkey: ring.rkey,
        ring_addr: ring.addr,
        conn_id,
        dest,
    }
}

/// Takes stream `mine`'s params out of `list` (the streams opening, or granted).
fn take_params(list: &mut Vec<(StreamId, Params)>, mine: StreamId) -> Option<Params> {
    let i = list.iter().position(|(id, _)| *id == mine)?;
    Some(list.swap_remove(i).1)
}

/// A write of stream `id`, its work request id tagged with the stream's.
pub fn tag(id: StreamId, mut w: Write) -> Write {
    w.wr_id = WrId(u64::from(id.get()) << WR_STREAM_SHIFT | (w.wr_id.0 & WR_MASK));
    w
}

/// The stream a tagged work request id belongs to (`None`: the driver's flag bits are set,
/// or no stream id fits), and the low bits of the stream's own id of it ([`widen`] them).
pub fn untag(wr_id: u64) -> (Option<StreamId>, WrId) {
    let id = (wr_id >> WR_STREAM_SHIFT <= WR_STREAM_MASK)
        .then(|| StreamId::new((wr_id >> WR_STREAM_SHIFT) as u16))
        .flatten();
    (id, WrId(wr_id & WR_MASK))
}

/// A stream's own work request id from its low bits `low` (as [`untag`] gives them): the
/// first id at or after `retired` (the stream's work requests retired so far) with those
/// bits. A stream's signaled writes complete in order and fewer than 2^44 are ever in
/// flight, so this is exact however long the stream lives.
pub fn widen(low: WrId, retired: u64) -> WrId {
    WrId(retired + (low.0.wrapping_sub(retired) & WR_MASK))
}

/// The peer's side of a stream as a hello ([`Conn::on_link`] takes one).
fn hello(ring_addr: u64, rkey: u32, ring_size: u32, recv_credits: u16, conn_id: u64) -> Hello {
    Hello {
        kind: HelloKind::Accept,
        flags: 0,
        ring_addr,
        rkey,
        ring_size,
        recv_credits: u32::from(recv_credits),
        conn_id,
        resume: None,
        branch: None,
    }
}
