//! The control plane of one end of a link: the records it writes into stream 0 and the ones
//! it reads from it, applied to its stream table (PROTOCOL.md §14).
//!
//! The driver owns stream 0's [`Conn`] and memory and lends them: [`Control::flush`] moves
//! queued records into the send buffer, [`Control::receive`] reads what arrived, parses whole
//! records and turns them into [`ControlEvent`]s. What a record means for a program (which
//! listener an OPEN is for, the new stream's `Conn` and ring) is the driver's; this only keeps
//! the ids straight and the peer honest. The driver must call `receive` for each completion
//! of stream 0 before it hands the link's next completion to a stream: an ACCEPT has to
//! open the stream before the peer's first bytes on it are looked at (RC keeps them in that
//! order on the queue pair, and so must the driver).

use super::imm::StreamId;
use super::record::{Accept, Grant, Grow, Open, Record, RecordError, RefuseReason, MAX_RECORD_LEN};
use super::streams::{LinkError, NoId, Streams};
use crate::proto::{Conn, ReadError, WriteError};
use core::fmt;
use std::collections::VecDeque;

/// What the peer said on the control stream, for the driver to act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlEvent {
    /// The peer asks for a stream: answer with [`Control::accept`] or [`Control::refuse`].
    Incoming(Open),
    /// The peer's OPEN took our granted stream `mine`: open at both ends, no answer goes.
    IncomingGranted {
        /// The OPEN (its `granted` is `mine`).
        open: Open,
        /// Our id of the stream.
        mine: StreamId,
    },
    /// Our OPEN was accepted: stream `accept.opener` is open, the peer's ring is
    /// `accept`'s.
    Accepted(Accept),
    /// Our OPEN of stream `mine` was refused; the id is free again.
    Refused {
        /// Our id of the stream.
        mine: StreamId,
        /// Why.
        reason: RefuseReason,
    },
    /// The peer sends nothing more for stream `mine`.
    PeerClosed {
        /// Our id of the stream.
        mine: StreamId,
    },
    /// The peer means to tear the idle link down: no new stream either way.
    Goodbye,
    /// The peer grew its ring of our stream `grow.peer` (its GROW record): the stream's
    /// connection takes it ([`Conn::on_grow_record`]).
    Grow(Grow),
}

/// The peer broke the link's protocol: the link and every stream on it fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlError {
    /// A malformed record.
    Record(RecordError),
    /// A record that does not fit the stream table.
    Link(LinkError),
    /// Stream 0 itself failed (reset or broken).
    Stream,
}

impl fmt::Display for ControlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControlError::Record(e) => write!(f, "control record: {e}"),
            ControlError::Link(e) => write!(f, "control record: {e}"),
            ControlError::Stream => f.write_str("the control stream failed"),
        }
    }
}

impl std::error::Error for ControlError {}

/// One end's control plane.
#[derive(Debug)]
pub struct Control {
    streams: Streams,
    /// Record bytes queued and not yet in stream 0's send buffer.
    out: VecDeque<u8>,
    /// CLOSE records held back ([`close_lazily`](Self::close_lazily)), in the order queued:
    /// they go into `out` before the next record, or when released.
    lazy: Vec<u8>,
    /// Bytes read from stream 0 that do not make a whole record yet.
    partial: Vec<u8>,
    /// The peer's ids of OPENs not answered yet.
    pending: Vec<StreamId>,
    /// Streams the peer granted us, not taken yet, oldest first.
    grants: VecDeque<Grant>,
    events: VecDeque<ControlEvent>,
    failed: Option<ControlError>,
}

impl Control {
    /// A control plane giving out at most `max_streams` ids.
    pub fn new(max_streams: u16) -> Control {
        Control {
            streams: Streams::new(max_streams),
            out: VecDeque::new(),
            lazy: Vec::new(),
            partial: Vec::with_capacity(MAX_RECORD_LEN),
            pending: Vec::new(),
            grants: VecDeque::new(),
            events: VecDeque::new(),
            failed: None,
        }
    }

    /// Opens a stream: takes an id for it and queues the OPEN (`open.opener` is set here).
    pub fn open(&mut self, mut open: Open) -> Result<StreamId, NoId> {
        let mine = self.streams.open()?;
        open.opener = mine;
        self.queue(&Record::Open(open));
        Ok(mine)
    }

    /// Grants the peer a stream ready for it (`grant.acceptor` is set here): our id of it.
    pub fn grant(&mut self, mut grant: Grant) -> Result<StreamId, NoId> {
        let mine = self.streams.grant()?;
        grant.acceptor = mine;
        self.queue(&Record::Grant(grant));
        Ok(mine)
    }

    /// The oldest grant of the peer's, if any and no GOODBYE passed.
    pub fn next_grant(&self) -> Option<&Grant> {
        self.grants
            .front()
            .filter(|_| !self.streams.saying_goodbye())
    }

    /// Grants of the peer's not taken yet.
    pub fn grants_held(&self) -> usize {
        self.grants.len()
    }

    /// Opens a stream on the peer's oldest grant (see [`next_grant`](Self::next_grant)):
    /// takes an id for it, open at once (no answer comes), and the grant. The OPEN that takes
    /// it (`open` with `opener` and `granted` set here) is returned, not queued: the driver
    /// queues it with [`send_open`](Self::send_open) once it is ready for the peer's bytes.
    pub fn open_granted(&mut self, mut open: Open) -> Result<(StreamId, Grant, Open), NoId> {
        let grant = *self.next_grant().ok_or(NoId::Exhausted)?;
        let mine = self.streams.open_granted(grant.acceptor)?;
        self.grants.pop_front();
        open.opener = mine;
        open.granted = Some(grant.acceptor);
        Ok((mine, grant, open))
    }

    /// Queues an OPEN [`open_granted`](Self::open_granted) made.
    pub fn send_open(&mut self, open: &Open) {
        self.queue(&Record::Open(*open));
    }

    /// Bytes of CLOSE records held back: they go with the next record queued.
    pub fn lazy_len(&self) -> usize {
        self.lazy.len()
    }

    /// Accepts the peer's `open` (an [`ControlEvent::Incoming`]) with our side of the stream
    /// in `accept` (its ids and `conn_id` are set here): our id of the new stream. With no id
    /// to give, the OPEN is refused here and the reason returned.
    pub fn accept(&mut self, open: &Open, mut accept: Accept) -> Result<StreamId, NoId> {
        let theirs = open.opener;
        if !self.take_pending(theirs) {
            return Err(NoId::Closing); // not asked, or answered already: nothing to send
        }
        match self.streams.on_open(theirs) {
            Ok(Ok(mine)) => {
                accept.opener = theirs;
                accept.acceptor = mine;
                accept.conn_id = open.conn_id;
                self.queue(&Record::Accept(accept));
                Ok(mine)
            }
            Ok(Err(why)) => {
                let reason = match why {
                    NoId::Exhausted => RefuseReason::NoResources,
                    NoId::Closing => RefuseReason::LinkClosing,
                };
                self.queue(&Record::Refuse {
                    opener: theirs,
                    reason,
                });
                Err(why)
            }
            // Duplicates were refused when the OPEN arrived.
            Err(_) => Err(NoId::Closing),
        }
    }

    /// Refuses the peer's OPEN of its stream `theirs`.
    pub fn refuse(&mut self, theirs: StreamId, reason: RefuseReason) {
        if self.take_pending(theirs) {
            self.queue(&Record::Refuse {
                opener: theirs,
                reason,
            });
        }
    }

    /// Queues a GROW record for our stream `mine` (its connection's
    /// [`Conn::take_grow_record`]): a ring of `size` bytes at `addr` of region `rkey`.
    /// Nothing once we closed the stream (the peer's id may be free after our CLOSE).
    pub fn grow(&mut self, mine: StreamId, size: u32, rkey: u32, addr: u64) {
        if let Some(peer) = self.streams.theirs_before_our_close(mine) {
            self.queue(&Record::Grow(Grow {
                grower: mine,
                peer,
                ring_size: size,
                ring_rkey: rkey,
                ring_addr: addr,
            }));
        }
    }

    /// We are done with stream `mine`: queues its CLOSE (nothing if it is not open here).
    pub fn close(&mut self, mine: StreamId) {
        if let Some(peer) = self.streams.close(mine) {
            self.queue(&Record::Close { closer: mine, peer });
        }
    }

    /// As [`close`](Self::close), but the CLOSE waits for the next record queued (it rides
    /// with the OPEN or ACCEPT of the connection that usually follows: one message, not
    /// two) or for [`release_lazy`](Self::release_lazy). Either way it goes before any record
    /// queued after it, so a later OPEN that takes the id again follows its CLOSE.
    pub fn close_lazily(&mut self, mine: StreamId) {
        if let Some(peer) = self.streams.close(mine) {
            let mut b = [0u8; MAX_RECORD_LEN];
            if let Some(n) = (Record::Close { closer: mine, peer }).write_to(&mut b) {
                self.lazy.extend_from_slice(&b[..n]);
            }
        }
    }

    /// Sends the CLOSEs held back (moves them to the queue); whether there were any.
    pub fn release_lazy(&mut self) -> bool {
        let any = !self.lazy.is_empty();
        self.out.extend(self.lazy.drain(..));
        any
    }

    /// Whether CLOSEs are held back.
    pub fn has_lazy(&self) -> bool {
        !self.lazy.is_empty()
    }

    /// Says GOODBYE: no new stream from now on, either way.
    pub fn goodbye(&mut self) {
        if !self.streams.saying_goodbye() {
            self.streams.say_goodbye();
            self.grants.clear();
            self.queue(&Record::Goodbye);
        }
    }

    /// Moves queued record bytes into stream 0 (as many as its send buffer takes); the
    /// driver then posts what `control.poll_write()` gives. Returns the bytes moved.
    pub fn flush(&mut self, control: &mut Conn, send_buf: &mut [u8]) -> usize {
        let mut moved = 0;
        while !self.out.is_empty() {
            let (a, b) = self.out.as_slices();
            let chunk = if a.is_empty() { b } else { a };
            match control.write(send_buf, chunk) {
                Ok(n) if n > 0 => {
                    self.out.drain(..n);
                    moved += n;
                }
                Ok(_) | Err(WriteError::Blocked) => break,
                Err(_) => {
                    self.fail(ControlError::Stream);
                    break;
                }
            }
        }
        moved
    }

    /// Reads what arrived on stream 0 (its ring is `ring`) and applies every whole record.
    /// An error fails the link: nothing after it is read.
    pub fn receive(&mut self, control: &mut Conn, ring: &[u8]) -> Result<(), ControlError> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        let mut buf = [0u8; 4096];
        loop {
            match control.read(ring, &mut buf) {
                Ok(0) | Err(ReadError::Blocked) => break,
                Ok(n) => {
                    self.partial.extend_from_slice(&buf[..n]);
                    self.apply_whole_records()?;
                }
                Err(ReadError::Reset) => {
                    self.fail(ControlError::Stream);
                    return Err(ControlError::Stream);
                }
            }
        }
        Ok(())
    }

    /// The next thing the peer said, if any.
    pub fn poll_event(&mut self) -> Option<ControlEvent> {
        self.events.pop_front()
    }

    /// The stream table (which ids are open, what the peer calls them).
    pub fn streams(&self) -> &Streams {
        &self.streams
    }

    /// Record bytes queued and not yet flushed into stream 0.
    pub fn queued(&self) -> usize {
        self.out.len()
    }

    /// Why the link failed, if it did.
    pub fn error(&self) -> Option<ControlError> {
        self.failed
    }

    fn apply_whole_records(&mut self) -> Result<(), ControlError> {
        let mut used = 0;
        let result = loop {
            match Record::parse(&self.partial[used..]) {
                Ok(Some((record, n))) => {
                    used += n;
                    if let Err(e) = self.apply(record) {
                        break Err(e);
                    }
                }
                Ok(None) => break Ok(()),
                Err(e) => break Err(ControlError::Record(e)),
            }
        };
        self.partial.drain(..used);
        if let Err(e) = result {
            self.fail(e);
        }
        result
    }

    fn apply(&mut self, record: Record) -> Result<(), ControlError> {
        let link = ControlError::Link;
        match record {
            Record::Open(open) => {
                let theirs = open.opener;
                if self.pending.contains(&theirs) || self.streams.uses_theirs(theirs) {
                    return Err(link(LinkError::DuplicateOpen(theirs.get())));
                }
                if let Some(mine) = open.granted {
                    // A grant holds even across a GOODBYE the OPEN crossed: it was given.
                    self.streams.on_open_granted(theirs, mine).map_err(link)?;
                    self.events
                        .push_back(ControlEvent::IncomingGranted { open, mine });
                    return Ok(());
                }
                self.pending.push(theirs);
                if self.streams.saying_goodbye() {
                    self.refuse(theirs, RefuseReason::LinkClosing);
                } else {
                    self.events.push_back(ControlEvent::Incoming(open));
                }
            }
            Record::Accept(accept) => {
                self.streams
                    .on_accept(accept.opener, accept.acceptor)
                    .map_err(link)?;
                self.events.push_back(ControlEvent::Accepted(accept));
            }
            Record::Refuse { opener, reason } => {
                self.streams.on_refuse(opener).map_err(link)?;
                self.events.push_back(ControlEvent::Refused {
                    mine: opener,
                    reason,
                });
            }
            Record::Close { closer, peer } => {
                self.streams.on_close(closer, peer).map_err(link)?;
                self.events
                    .push_back(ControlEvent::PeerClosed { mine: peer });
            }
            Record::Grow(grow) => {
                // As an immediate for the stream would be: the peer has not closed it.
                self.streams.accepts_input(grow.peer).map_err(link)?;
                if self.streams.theirs(grow.peer) != Some(grow.grower) {
                    return Err(link(LinkError::WrongPeerId {
                        mine: grow.peer.get(),
                        theirs: grow.grower.get(),
                    }));
                }
                self.events.push_back(ControlEvent::Grow(grow));
            }
            Record::Goodbye => {
                self.streams.say_goodbye();
                self.grants.clear();
                self.events.push_back(ControlEvent::Goodbye);
            }
            Record::Grant(grant) => {
                let theirs = grant.acceptor;
                if self.grants.iter().any(|g| g.acceptor == theirs)
                    || self.streams.uses_theirs(theirs)
                {
                    return Err(link(LinkError::DuplicateGrant(theirs.get())));
                }
                if !self.streams.saying_goodbye() {
                    self.grants.push_back(grant);
                }
            }
        }
        Ok(())
    }

    fn take_pending(&mut self, theirs: StreamId) -> bool {
        match self.pending.iter().position(|&p| p == theirs) {
            Some(i) => {
                self.pending.swap_remove(i);
                true
            }
            None => false,
        }
    }

    fn queue(&mut self, record: &Record) {
        self.release_lazy();
        let mut b = [0u8; MAX_RECORD_LEN];
        if let Some(n) = record.write_to(&mut b) {
            self.out.extend(&b[..n]);
        }
    }

    fn fail(&mut self, e: ControlError) {
        if self.failed.is_none() {
            self.failed = Some(e);
        }
    }
}
