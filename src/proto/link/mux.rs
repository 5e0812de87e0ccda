//! One end of a link's data plane: stream 0 and the link's streams as [`Conn`]s over one
//! queue pair (PROTOCOL.md §14). Immediates are routed by their stream id, work request ids
//! carry the stream's id in their high bits, streams take turns for the send queue, and
//! the receive queue is kept at the sum of the streams' shares.
//!
//! The driver's loop: post what [`Mux::receives_to_post`] says (before anything else: a
//! stream's share must be posted before the OPEN or ACCEPT that announces it leaves), post
//! what [`Mux::poll_write`] gives, hand each receive completion to [`Mux::handle_imm`] and
//! each send completion to [`Mux::handle_send_complete`], in the CQ's order. Stream 0's
//! records are applied as they arrive, so an ACCEPT opens its stream before the peer's first
//! bytes on it are looked at. Any protocol error fails the whole link.

use super::control::{Control, ControlError, ControlEvent};
use super::imm::{decode, StreamId};
use super::record::{Accept, Open, RefuseReason};
use super::streams::NoId;
use crate::proto::wire::{Hello, HelloKind};
use crate::proto::{Conn, Params, ProtocolError, WrId, Write};
use std::collections::VecDeque;
use std::net::SocketAddr;

/// Bits of a work request id below the stream's id: the stream's own id of the request.
pub const WR_STREAM_SHIFT: u32 = 48;
const WR_MASK: u64 = (1 << WR_STREAM_SHIFT) - 1;

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
}

/// One end's streams on a link.
#[derive(Debug)]
pub struct Mux {
    control: Conn,
    plane: Control,
    /// Entry `i`: stream `i + 1` and its receive share.
    conns: Vec<Option<(Conn, u32)>>,
    /// Streams we opened and the peer has not answered: their params.
    opening: Vec<(StreamId, Params)>,
    /// Round-robin cursor over `conns`.
    turn: usize,
    /// Receives on the queue pair: posted and not consumed.
    posted: u32,
    /// Control stream's receive share.
    control_share: u32,
    /// Work requests the queue pair's send queue holds.
    sq_capacity: u32,
    /// What stream 0 said, applied here, for the driver.
    events: VecDeque<ControlEvent>,
    failed: Option<MuxError>,
}

impl Mux {
    /// The streams of a link whose stream 0 is `control` (made with
    /// [`Conn::on_link`] and ids 0, its receive share `control_share`), on a queue pair
    /// whose send queue holds `sq_capacity` work requests, giving out at most `max_streams`
    /// stream ids.
    pub fn new(control: Conn, control_share: u32, sq_capacity: u32, max_streams: u16) -> Mux {
        Mux {
            control,
            plane: Control::new(max_streams),
            conns: Vec::new(),
            opening: Vec::new(),
            turn: 0,
            posted: 0,
            control_share,
            sq_capacity,
            events: VecDeque::new(),
            failed: None,
        }
    }

    /// Opens a stream to `dest` with our side `params` (ring at `ring`): our id of it. It is
    /// usable once [`ControlEvent::Accepted`] says so.
    pub fn open(
        &mut self,
        params: Params,
        ring: RingAt,
        conn_id: u64,
        dest: SocketAddr,
    ) -> Result<StreamId, NoId> {
        let open = Open {
            opener: StreamId::CONTROL,
            recv_credits: params.recv_credits.min(u32::from(u16::MAX)) as u16,
            ring_size: params.ring_size,
            ring_rkey: ring.rkey,
            ring_addr: ring.addr,
            conn_id,
            dest,
        };
        let mine = self.plane.open(open)?;
        self.opening.push((mine, params));
        Ok(mine)
    }

    /// Accepts the peer's `open` with our side `params` (ring at `ring`): our id of the new
    /// stream, usable at once. With no id to give, the OPEN is refused.
    pub fn accept(&mut self, open: &Open, params: Params, ring: RingAt) -> Result<StreamId, NoId> {
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
        // A config the connection refuses is refused before an id is taken.
        if Conn::on_link(&params, &peer, StreamId::CONTROL, open.opener).is_err() {
            self.plane.refuse(open.opener, RefuseReason::NoResources);
            return Err(NoId::Exhausted);
        }
        let mine = self.plane.accept(open, ours)?;
        match Conn::on_link(&params, &peer, mine, open.opener) {
            Ok(conn) => self.put(mine, conn, params.recv_credits),
            Err(_) => self.plane.close(mine), // not reached: the same config passed above
        }
        Ok(mine)
    }

    /// Refuses the peer's OPEN of its stream `theirs`.
    pub fn refuse(&mut self, theirs: StreamId, reason: RefuseReason) {
        self.plane.refuse(theirs, reason);
    }

    /// We are done with stream `mine` (its connection finished): its CLOSE goes out, and its
    /// connection goes once the peer's CLOSE came too.
    pub fn close(&mut self, mine: StreamId) {
        self.plane.close(mine);
        self.drop_if_free(mine);
    }

    /// Stream `mine`'s connection, while it is open here.
    pub fn conn_mut(&mut self, mine: StreamId) -> Option<&mut Conn> {
        let i = usize::from(mine.get()).checked_sub(1)?;
        self.conns.get_mut(i)?.as_mut().map(|(c, _)| c)
    }

    /// Receives to post now so that the queue holds every stream's share.
    pub fn receives_to_post(&mut self) -> u32 {
        let want = self.shares();
        let n = want.saturating_sub(self.posted);
        self.posted += n;
        n
    }

    /// The next work request to post: stream 0's first (records go out before data, which
    /// may depend on them), then the streams in turn. `control_send` is stream 0's send
    /// buffer. None while receives are owed ([`receives_to_post`](Self::receives_to_post)).
    pub fn poll_write(&mut self, control_send: &mut [u8]) -> Option<Write> {
        if self.failed.is_some() || self.posted < self.shares() {
            return None;
        }
        self.plane.flush(&mut self.control, control_send);
        if let Some(e) = self.plane.error() {
            self.fail(MuxError::Control(e));
            return None;
        }
        // A burst is at most two work requests; the send queue is shared.
        if self.outstanding() + 2 > u64::from(self.sq_capacity) {
            return None;
        }
        if let Some(w) = self.control.poll_write() {
            return Some(tag(StreamId::CONTROL, w));
        }
        let n = self.conns.len();
        for k in 0..n {
            let i = (self.turn + k) % n;
            if let Some((c, _)) = self.conns[i].as_mut() {
                if let Some(w) = c.poll_write() {
                    self.turn = i + 1;
                    let id = StreamId::new(i as u16 + 1)?;
                    return Some(tag(id, w));
                }
            }
        }
        None
    }

    /// A receive completed with immediate `raw` carrying `byte_len` bytes; `control_ring`
    /// is stream 0's ring. The receive is consumed: post what
    /// [`receives_to_post`](Self::receives_to_post) says.
    pub fn handle_imm(
        &mut self,
        raw: u32,
        byte_len: u32,
        control_ring: &[u8],
    ) -> Result<(), MuxError> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        self.posted = self.posted.saturating_sub(1);
        let Ok((id, _)) = decode(raw) else {
            return Err(self.fail(MuxError::Immediate(raw)));
        };
        if id == StreamId::CONTROL {
            if let Err(e) = self.control.handle_imm(raw, byte_len) {
                return Err(self.fail(MuxError::Stream(0, e)));
            }
            if let Err(e) = self.plane.receive(&mut self.control, control_ring) {
                return Err(self.fail(MuxError::Control(e)));
            }
            self.take_control_events();
            return Ok(());
        }
        if self.plane.streams().accepts_input(id).is_err() {
            return Err(self.fail(MuxError::Immediate(raw)));
        }
        let Some(conn) = self.conn_mut(id) else {
            return Err(self.fail(MuxError::Immediate(raw)));
        };
        if let Err(e) = conn.handle_imm(raw, byte_len) {
            return Err(self.fail(MuxError::Stream(id.get(), e)));
        }
        Ok(())
    }

    /// A signaled work request `wr_id` (as [`poll_write`](Self::poll_write) tagged it)
    /// completed.
    pub fn handle_send_complete(&mut self, wr_id: u64) -> Result<(), MuxError> {
        let stream = (wr_id >> WR_STREAM_SHIFT) as u16;
        let own = WrId(wr_id & WR_MASK);
        let conn = match StreamId::new(stream) {
            Some(StreamId::CONTROL) => Some(&mut self.control),
            Some(id) => self.conn_mut(id),
            None => None,
        };
        match conn.map(|c| c.handle_send_complete(own)) {
            Some(Ok(())) => Ok(()),
            _ => Err(self.fail(MuxError::Completion(wr_id))),
        }
    }

    /// The next thing the peer said on stream 0.
    pub fn poll_event(&mut self) -> Option<ControlEvent> {
        self.events.pop_front()
    }

    /// Why the link failed, if it did.
    pub fn error(&self) -> Option<MuxError> {
        self.failed
    }

    /// Streams open or closing here (stream 0 aside).
    pub fn streams(&self) -> usize {
        self.conns.iter().flatten().count()
    }

    /// Stream 0's connection (its driver reads nothing from it: the records are the mux's).
    pub fn control(&self) -> &Conn {
        &self.control
    }

    /// Applies what stream 0 said to the streams (an ACCEPT makes the stream's
    /// connection) and leaves the events for the driver, in order.
    fn take_control_events(&mut self) {
        while let Some(ev) = self.plane.poll_event() {
            match &ev {
                ControlEvent::Accepted(acc) => {
                    if let Some(i) = self.opening.iter().position(|(id, _)| *id == acc.opener) {
                        let (mine, params) = self.opening.swap_remove(i);
                        let peer = hello(
                            acc.ring_addr,
                            acc.ring_rkey,
                            acc.ring_size,
                            acc.recv_credits,
                            acc.conn_id,
                        );
                        match Conn::on_link(&params, &peer, mine, acc.acceptor) {
                            Ok(c) => self.put(mine, c, params.recv_credits),
                            // Our own params were checked when the OPEN went out; the peer's
                            // hello was checked by the record parser.
                            Err(_) => self.plane.close(mine),
                        }
                    }
                }
                ControlEvent::Refused { mine, .. } => {
                    self.opening.retain(|(id, _)| id != mine);
                }
                ControlEvent::PeerClosed { mine } => self.drop_if_free(*mine),
                ControlEvent::Incoming(_) | ControlEvent::Goodbye => {}
            }
            self.events.push_back(ev);
        }
    }

    fn put(&mut self, mine: StreamId, conn: Conn, share: u32) {
        let i = usize::from(mine.get()) - 1;
        if self.conns.len() <= i {
            self.conns.resize_with(i + 1, || None);
        }
        self.conns[i] = Some((conn, share));
    }

    /// Drops stream `mine`'s connection once its id is free (both CLOSEs passed).
    fn drop_if_free(&mut self, mine: StreamId) {
        if self.plane.streams().theirs(mine).is_none() {
            if let Some(slot) = usize::from(mine.get())
                .checked_sub(1)
                .and_then(|i| self.conns.get_mut(i))
            {
                *slot = None;
            }
        }
    }

    fn shares(&self) -> u32 {
        self.control_share + self.conns.iter().flatten().map(|(_, s)| s).sum::<u32>()
    }

    /// Work requests posted and not yet retired, over every stream.
    fn outstanding(&self) -> u64 {
        let of = |c: &Conn| {
            let k = c.counters();
            k.wrs_posted - k.wrs_retired
        };
        of(&self.control) + self.conns.iter().flatten().map(|(c, _)| of(c)).sum::<u64>()
    }

    fn fail(&mut self, e: MuxError) -> MuxError {
        *self.failed.get_or_insert(e)
    }
}

/// A write of stream `id`, its work request id tagged with the stream's.
fn tag(id: StreamId, mut w: Write) -> Write {
    w.wr_id = WrId(u64::from(id.get()) << WR_STREAM_SHIFT | (w.wr_id.0 & WR_MASK));
    w
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
    }
}
