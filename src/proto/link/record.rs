//! Control records of a link (PROTOCOL.md §14, "Control records"): what goes through stream
//! 0 of a link to open, accept, refuse and close the other streams, and to say goodbye.
//!
//! ```text
//! len:16 | kind:8 | flags:8 (0) | body       len = the whole record, header included
//! 1 OPEN 56   2 ACCEPT 36   3 REFUSE 8   4 CLOSE 8   5 GOODBYE 4   6 GRANT 24
//! ```
//!
//! The one flag: an OPEN's bit 0, GRANTED (it takes a stream the answerer granted ahead).
//!
//! The control stream is a byte stream, so [`Record::parse`] is incremental: it judges a
//! header from its 4 bytes alone (a length other than its kind's is refused before any more
//! bytes are waited for) and asks for more only while a record is incomplete. Big-endian,
//! reserved bytes zero, decoding canonical: whatever parses re-encodes to the same bytes.
//! No I/O and no panics on any input.

use core::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::imm::StreamId;
use crate::proto::wire;

/// Bytes of every record's header: `len`, `kind`, `flags`.
pub const HEADER_LEN: usize = 4;
/// The longest record (an OPEN): the most a parser ever needs to see at once.
pub const MAX_RECORD_LEN: usize = OPEN_LEN;
/// Fewest receives a stream may be given: as a lone connection's (PROTOCOL.md §5).
pub const MIN_RECV_CREDITS: u16 = wire::MIN_RECV_CREDITS as u16;
/// Smallest ring of a link stream: one page, the unit its ring bytes are returned in.
pub const MIN_RING_SIZE: u32 = super::imm::CREDIT_UNIT;
/// Largest ring of a link stream: as a lone connection's.
pub const MAX_RING_SIZE: u32 = wire::MAX_RING_SIZE;

const KIND_OPEN: u8 = 1;
const KIND_ACCEPT: u8 = 2;
const KIND_REFUSE: u8 = 3;
const KIND_CLOSE: u8 = 4;
const KIND_GOODBYE: u8 = 5;
const KIND_GRANT: u8 = 6;
const KIND_GROW: u8 = 7;

/// An OPEN's flag: it takes a stream granted ahead (its acceptor id is set).
const FLAG_GRANTED: u8 = 1;

const OPEN_LEN: usize = 56;
const ACCEPT_LEN: usize = 36;
const REFUSE_LEN: usize = 8;
const CLOSE_LEN: usize = 8;
const GOODBYE_LEN: usize = HEADER_LEN;
const GRANT_LEN: usize = 24;
const GROW_LEN: usize = 24;

const FAMILY_V4: u8 = 4;
const FAMILY_V6: u8 = 6;

/// Byte offsets of the fields, from the record's start (PROTOCOL.md §14's tables).
mod at {
    pub const LEN: usize = 0;
    pub const KIND: usize = 2;
    pub const FLAGS: usize = 3;

    pub const OPEN_OPENER: usize = 4;
    pub const OPEN_RECV_CREDITS: usize = 6;
    pub const OPEN_RING_SIZE: usize = 8;
    pub const OPEN_RING_RKEY: usize = 12;
    pub const OPEN_GRANTED: usize = 16; // 2 bytes: the granted id, or 0
    pub const OPEN_PORT_FROM: usize = 18; // 2 bytes: the opener's port for the stream, or 0
    pub const OPEN_RING_ADDR: usize = 20;
    pub const OPEN_CONN_ID: usize = 28;
    pub const OPEN_PORT: usize = 36;
    pub const OPEN_FAMILY: usize = 38;
    pub const OPEN_RESERVED2: usize = 39; // 1 byte
    pub const OPEN_ADDR: usize = 40; // 16 bytes

    pub const ACCEPT_OPENER: usize = 4;
    pub const ACCEPT_ACCEPTOR: usize = 6;
    pub const ACCEPT_RECV_CREDITS: usize = 8;
    pub const ACCEPT_RESERVED: usize = 10; // 2 bytes
    pub const ACCEPT_RING_SIZE: usize = 12;
    pub const ACCEPT_RING_RKEY: usize = 16;
    pub const ACCEPT_RING_ADDR: usize = 20;
    pub const ACCEPT_CONN_ID: usize = 28;

    pub const REFUSE_OPENER: usize = 4;
    pub const REFUSE_REASON: usize = 6;
    pub const REFUSE_RESERVED: usize = 7; // 1 byte

    pub const CLOSE_CLOSER: usize = 4;
    pub const CLOSE_PEER: usize = 6;

    pub const GRANT_ACCEPTOR: usize = 4;
    pub const GRANT_RECV_CREDITS: usize = 6;
    pub const GRANT_RING_SIZE: usize = 8;
    pub const GRANT_RING_RKEY: usize = 12;
    pub const GRANT_RING_ADDR: usize = 16;

    pub const GROW_GROWER: usize = 4;
    pub const GROW_PEER: usize = 6;
    pub const GROW_RING_SIZE: usize = 8;
    pub const GROW_RING_RKEY: usize = 12;
    pub const GROW_RING_ADDR: usize = 16;
}

/// One control record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Record {
    /// The opener asks for a new stream to a destination.
    Open(Open),
    /// The answerer takes the stream an OPEN asked for.
    Accept(Accept),
    /// The answerer does not take the stream an OPEN asked for.
    Refuse {
        /// The opener's id of the stream, from its OPEN.
        opener: StreamId,
        /// Why.
        reason: RefuseReason,
    },
    /// The sender sends nothing more for this stream.
    Close {
        /// The sender's own id of the stream.
        closer: StreamId,
        /// The receiver's id of the stream.
        peer: StreamId,
    },
    /// The sender means to tear the idle link down.
    Goodbye,
    /// The sender has a stream ready for the receiver to open without an answer.
    Grant(Grant),
    /// The sender has a bigger ring for one of its streams (PROTOCOL.md §14, "Rings that
    /// grow on a link"): §12's GROW pair, which a link's immediates have no room for.
    Grow(Grow),
}

/// A GROW: the bigger ring the sender made for a stream, which the receiver writes into from
/// the moment it reads this record (and answers SWITCHED on the stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Grow {
    /// The sender's id of the stream (the ring's owner).
    pub grower: StreamId,
    /// The receiver's id of the stream.
    pub peer: StreamId,
    /// Size of the new ring: whole 4 KiB pages.
    pub ring_size: u32,
    /// Remote key of the memory region the ring is in.
    pub ring_rkey: u32,
    /// Address of the ring's byte 0 in that region.
    pub ring_addr: u64,
}

/// An OPEN: a new stream to `dest`, and where the answerer writes its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Open {
    /// The opener's id of the new stream (not the control stream's).
    pub opener: StreamId,
    /// The answerer's id of a stream it granted ahead, which this OPEN takes (no ACCEPT
    /// follows); `None`: the answerer is asked, and answers ACCEPT or REFUSE.
    pub granted: Option<StreamId>,
    /// The opener's port for the stream (its program's local port: the answerer shows it as
    /// the stream's peer port), or 0: the link's.
    pub from_port: u16,
    /// Receives the opener posted for the stream: the answerer's message credits.
    pub recv_credits: u16,
    /// Size of the opener's receive ring for the stream.
    pub ring_size: u32,
    /// Remote key of the memory region the ring is in.
    pub ring_rkey: u32,
    /// Address of the ring's byte 0 in that region.
    pub ring_addr: u64,
    /// A random id the opener chose; the ACCEPT echoes it.
    pub conn_id: u64,
    /// Where the opener's program connects to. An IPv4-mapped IPv6 address stays IPv6; a V6
    /// address's flow label and scope are not carried (they parse as 0): a scope names an
    /// interface of the opener's host, which means nothing to the answerer.
    pub dest: SocketAddr,
}

/// An ACCEPT: the answerer's id of the stream and where the opener writes its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Accept {
    /// The opener's id of the stream, from its OPEN.
    pub opener: StreamId,
    /// The answerer's id of the stream.
    pub acceptor: StreamId,
    /// Receives the answerer posted for the stream: the opener's message credits.
    pub recv_credits: u16,
    /// Size of the answerer's receive ring for the stream.
    pub ring_size: u32,
    /// Remote key of the memory region the ring is in.
    pub ring_rkey: u32,
    /// Address of the ring's byte 0 in that region.
    pub ring_addr: u64,
    /// The OPEN's `conn_id`, echoed.
    pub conn_id: u64,
}

/// A GRANT: a stream the answerer made ready ahead (its id, ring and receives) for an OPEN
/// to the listener the link came in on; the opener writes into it as soon as it sent the
/// OPEN that takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Grant {
    /// The answerer's id of the stream.
    pub acceptor: StreamId,
    /// Receives the answerer posted for the stream: the opener's message credits.
    pub recv_credits: u16,
    /// Size of the answerer's receive ring for the stream.
    pub ring_size: u32,
    /// Remote key of the memory region the ring is in.
    pub ring_rkey: u32,
    /// Address of the ring's byte 0 in that region.
    pub ring_addr: u64,
}

/// Why an answerer refused an OPEN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RefuseReason {
    /// No listener of the answerer's matches the destination: the opener's hint was stale.
    NotMine,
    /// The matching listener's backlog is full.
    BacklogFull,
    /// A rule refuses the stream.
    Rule,
    /// No memory or queue resources for another stream.
    NoResources,
    /// The link is closing.
    LinkClosing,
}

impl RefuseReason {
    fn code(self) -> u8 {
        match self {
            RefuseReason::NotMine => 1,
            RefuseReason::BacklogFull => 2,
            RefuseReason::Rule => 3,
            RefuseReason::NoResources => 4,
            RefuseReason::LinkClosing => 5,
        }
    }

    fn from_code(code: u8) -> Option<RefuseReason> {
        Some(match code {
            1 => RefuseReason::NotMine,
            2 => RefuseReason::BacklogFull,
            3 => RefuseReason::Rule,
            4 => RefuseReason::NoResources,
            5 => RefuseReason::LinkClosing,
            _ => return None,
        })
    }
}

/// Why bytes of a control stream are not a record. Any of these is a protocol error of the
/// whole link: the stream cannot be resynchronised after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordError {
    /// A kind this version does not define.
    UnknownKind(u8),
    /// A length other than the kind's.
    BadLength {
        /// The header's kind.
        kind: u8,
        /// The header's length.
        len: u16,
    },
    /// A flag or reserved byte that is not zero, at this offset of the record.
    ReservedBits(usize),
    /// A stream id that is 0 (the control stream's) or above [`MAX_STREAM`](super::imm::MAX_STREAM).
    BadStreamId(u16),
    /// Receive credits below [`MIN_RECV_CREDITS`].
    BadRecvCredits(u16),
    /// A ring size outside `MIN_RING_SIZE..=MAX_RING_SIZE`.
    BadRingSize(u32),
    /// A ring address plus ring size that overflows.
    BadRingAddr(u64),
    /// Destination port 0.
    BadPort,
    /// An address family other than 4 or 6.
    BadFamily(u8),
    /// An IPv4 destination whose 12 bytes after the address are not zero.
    BadAddress,
    /// A refusal reason this version does not define.
    BadReason(u8),
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecordError::UnknownKind(k) => write!(f, "unknown link record kind {k}"),
            RecordError::BadLength { kind, len } => {
                write!(f, "link record of kind {kind} with length {len}")
            }
            RecordError::ReservedBits(at) => {
                write!(f, "reserved byte {at} of a link record is not zero")
            }
            RecordError::BadStreamId(id) => write!(f, "bad stream id {id} in a link record"),
            RecordError::BadRecvCredits(c) => write!(f, "stream receive credits {c} too few"),
            RecordError::BadRingSize(s) => write!(f, "stream ring size {s} out of range"),
            RecordError::BadRingAddr(a) => write!(f, "stream ring address {a:#x} overflows"),
            RecordError::BadPort => f.write_str("destination port 0 in an OPEN"),
            RecordError::BadFamily(fam) => write!(f, "unknown address family {fam} in an OPEN"),
            RecordError::BadAddress => f.write_str("IPv4 destination with nonzero padding"),
            RecordError::BadReason(r) => write!(f, "unknown refusal reason {r}"),
        }
    }
}

impl std::error::Error for RecordError {}

impl Record {
    /// Bytes [`write_to`](Self::write_to) writes.
    pub fn encoded_len(&self) -> usize {
        match self {
            Record::Open(_) => OPEN_LEN,
            Record::Accept(_) => ACCEPT_LEN,
            Record::Refuse { .. } => REFUSE_LEN,
            Record::Close { .. } => CLOSE_LEN,
            Record::Goodbye => GOODBYE_LEN,
            Record::Grant(_) => GRANT_LEN,
            Record::Grow(_) => GROW_LEN,
        }
    }

    /// Encodes into the first [`encoded_len`](Self::encoded_len) bytes of `out` and returns
    /// that length, or `None` if `out` is shorter. A record that fails
    /// [`check`](Self::check) encodes to bytes [`parse`](Self::parse) refuses.
    pub fn write_to(&self, out: &mut [u8]) -> Option<usize> {
        let len = self.encoded_len();
        let out = out.get_mut(..len)?;
        // Reserved bytes and an IPv4 address's padding are the zeros left by this fill.
        out.fill(0);
        put(out, at::LEN, &(len as u16).to_be_bytes());
        out[at::KIND] = self.kind();
        match *self {
            Record::Open(o) => {
                put(out, at::OPEN_OPENER, &o.opener.get().to_be_bytes());
                if let Some(g) = o.granted {
                    out[at::FLAGS] = FLAG_GRANTED;
                    put(out, at::OPEN_GRANTED, &g.get().to_be_bytes());
                }
                put(out, at::OPEN_PORT_FROM, &o.from_port.to_be_bytes());
                put(out, at::OPEN_RECV_CREDITS, &o.recv_credits.to_be_bytes());
                put(out, at::OPEN_RING_SIZE, &o.ring_size.to_be_bytes());
                put(out, at::OPEN_RING_RKEY, &o.ring_rkey.to_be_bytes());
                put(out, at::OPEN_RING_ADDR, &o.ring_addr.to_be_bytes());
                put(out, at::OPEN_CONN_ID, &o.conn_id.to_be_bytes());
                put(out, at::OPEN_PORT, &o.dest.port().to_be_bytes());
                match o.dest.ip() {
                    IpAddr::V4(ip) => {
                        out[at::OPEN_FAMILY] = FAMILY_V4;
                        put(out, at::OPEN_ADDR, &ip.octets());
                    }
                    IpAddr::V6(ip) => {
                        out[at::OPEN_FAMILY] = FAMILY_V6;
                        put(out, at::OPEN_ADDR, &ip.octets());
                    }
                }
            }
            Record::Accept(a) => {
                put(out, at::ACCEPT_OPENER, &a.opener.get().to_be_bytes());
                put(out, at::ACCEPT_ACCEPTOR, &a.acceptor.get().to_be_bytes());
                put(out, at::ACCEPT_RECV_CREDITS, &a.recv_credits.to_be_bytes());
                put(out, at::ACCEPT_RING_SIZE, &a.ring_size.to_be_bytes());
                put(out, at::ACCEPT_RING_RKEY, &a.ring_rkey.to_be_bytes());
                put(out, at::ACCEPT_RING_ADDR, &a.ring_addr.to_be_bytes());
                put(out, at::ACCEPT_CONN_ID, &a.conn_id.to_be_bytes());
            }
            Record::Refuse { opener, reason } => {
                put(out, at::REFUSE_OPENER, &opener.get().to_be_bytes());
                out[at::REFUSE_REASON] = reason.code();
            }
            Record::Close { closer, peer } => {
                put(out, at::CLOSE_CLOSER, &closer.get().to_be_bytes());
                put(out, at::CLOSE_PEER, &peer.get().to_be_bytes());
            }
            Record::Goodbye => {}
            Record::Grant(g) => {
                put(out, at::GRANT_ACCEPTOR, &g.acceptor.get().to_be_bytes());
                put(out, at::GRANT_RECV_CREDITS, &g.recv_credits.to_be_bytes());
                put(out, at::GRANT_RING_SIZE, &g.ring_size.to_be_bytes());
                put(out, at::GRANT_RING_RKEY, &g.ring_rkey.to_be_bytes());
                put(out, at::GRANT_RING_ADDR, &g.ring_addr.to_be_bytes());
            }
            Record::Grow(g) => {
                put(out, at::GROW_GROWER, &g.grower.get().to_be_bytes());
                put(out, at::GROW_PEER, &g.peer.get().to_be_bytes());
                put(out, at::GROW_RING_SIZE, &g.ring_size.to_be_bytes());
                put(out, at::GROW_RING_RKEY, &g.ring_rkey.to_be_bytes());
                put(out, at::GROW_RING_ADDR, &g.ring_addr.to_be_bytes());
            }
        }
        Some(len)
    }

    /// The first record of `buf`, the front of a control stream's unread bytes, and the bytes
    /// it takes; `Ok(None)` while `buf` holds only part of one (read more, then call again
    /// with the same front). An error is the peer's: the link is done.
    pub fn parse(buf: &[u8]) -> Result<Option<(Record, usize)>, RecordError> {
        let Some(header) = buf.get(..HEADER_LEN) else {
            return Ok(None);
        };
        let len = u16_at(header, at::LEN);
        let kind = header[at::KIND];
        // The header is judged before waiting for the body, so a peer cannot make us wait
        // for (or buffer) a record longer than any this version defines.
        let expected = kind_len(kind).ok_or(RecordError::UnknownKind(kind))?;
        if usize::from(len) != expected {
            return Err(RecordError::BadLength { kind, len });
        }
        let granted = kind == KIND_OPEN && header[at::FLAGS] == FLAG_GRANTED;
        if !granted {
            check_reserved(header, at::FLAGS, 1)?;
        }
        let Some(rec) = buf.get(..expected) else {
            return Ok(None);
        };
        let record = match kind {
            KIND_OPEN => Record::Open(parse_open(rec, granted)?),
            KIND_ACCEPT => {
                check_reserved(rec, at::ACCEPT_RESERVED, 2)?;
                Record::Accept(Accept {
                    opener: id_at(rec, at::ACCEPT_OPENER)?,
                    acceptor: id_at(rec, at::ACCEPT_ACCEPTOR)?,
                    recv_credits: u16_at(rec, at::ACCEPT_RECV_CREDITS),
                    ring_size: u32_at(rec, at::ACCEPT_RING_SIZE),
                    ring_rkey: u32_at(rec, at::ACCEPT_RING_RKEY),
                    ring_addr: u64_at(rec, at::ACCEPT_RING_ADDR),
                    conn_id: u64_at(rec, at::ACCEPT_CONN_ID),
                })
            }
            KIND_REFUSE => {
                check_reserved(rec, at::REFUSE_RESERVED, 1)?;
                let code = rec[at::REFUSE_REASON];
                Record::Refuse {
                    opener: id_at(rec, at::REFUSE_OPENER)?,
                    reason: RefuseReason::from_code(code).ok_or(RecordError::BadReason(code))?,
                }
            }
            KIND_CLOSE => Record::Close {
                closer: id_at(rec, at::CLOSE_CLOSER)?,
                peer: id_at(rec, at::CLOSE_PEER)?,
            },
            KIND_GOODBYE => Record::Goodbye,
            KIND_GRANT => Record::Grant(Grant {
                acceptor: id_at(rec, at::GRANT_ACCEPTOR)?,
                recv_credits: u16_at(rec, at::GRANT_RECV_CREDITS),
                ring_size: u32_at(rec, at::GRANT_RING_SIZE),
                ring_rkey: u32_at(rec, at::GRANT_RING_RKEY),
                ring_addr: u64_at(rec, at::GRANT_RING_ADDR),
            }),
            KIND_GROW => Record::Grow(Grow {
                grower: id_at(rec, at::GROW_GROWER)?,
                peer: id_at(rec, at::GROW_PEER)?,
                ring_size: u32_at(rec, at::GROW_RING_SIZE),
                ring_rkey: u32_at(rec, at::GROW_RING_RKEY),
                ring_addr: u64_at(rec, at::GROW_RING_ADDR),
            }),
            _ => return Err(RecordError::UnknownKind(kind)),
        };
        record.check()?;
        Ok(Some((record, expected)))
    }

    /// Checks the limits a record must meet: stream ids not the control stream's, receive
    /// credits, ring size and address, destination port.
    pub fn check(&self) -> Result<(), RecordError> {
        match *self {
            Record::Open(o) => {
                check_id(o.opener)?;
                if let Some(g) = o.granted {
                    check_id(g)?;
                }
                check_stream(o.recv_credits, o.ring_size, o.ring_addr)?;
                if o.dest.port() == 0 {
                    return Err(RecordError::BadPort);
                }
                Ok(())
            }
            Record::Accept(a) => {
                check_id(a.opener)?;
                check_id(a.acceptor)?;
                check_stream(a.recv_credits, a.ring_size, a.ring_addr)
            }
            Record::Refuse { opener, .. } => check_id(opener),
            Record::Close { closer, peer } => check_id(closer).and(check_id(peer)),
            Record::Goodbye => Ok(()),
            Record::Grant(g) => {
                check_id(g.acceptor)?;
                check_stream(g.recv_credits, g.ring_size, g.ring_addr)
            }
            Record::Grow(g) => {
                check_id(g.grower)?;
                check_id(g.peer)?;
                if g.ring_size % MIN_RING_SIZE != 0 {
                    return Err(RecordError::BadRingSize(g.ring_size));
                }
                check_stream(MIN_RECV_CREDITS, g.ring_size, g.ring_addr)
            }
        }
    }

    fn kind(&self) -> u8 {
        match self {
            Record::Open(_) => KIND_OPEN,
            Record::Accept(_) => KIND_ACCEPT,
            Record::Refuse { .. } => KIND_REFUSE,
            Record::Close { .. } => KIND_CLOSE,
            Record::Goodbye => KIND_GOODBYE,
            Record::Grant(_) => KIND_GRANT,
            Record::Grow(_) => KIND_GROW,
        }
    }
}

/// The length of every record of `kind`, if it is one.
fn kind_len(kind: u8) -> Option<usize> {
    match kind {
        KIND_OPEN => Some(OPEN_LEN),
        KIND_ACCEPT => Some(ACCEPT_LEN),
        KIND_REFUSE => Some(REFUSE_LEN),
        KIND_CLOSE => Some(CLOSE_LEN),
        KIND_GOODBYE => Some(GOODBYE_LEN),
        KIND_GRANT => Some(GRANT_LEN),
        KIND_GROW => Some(GROW_LEN),
        _ => None,
    }
}

/// An OPEN; `granted`: its GRANTED flag is set (its granted id is then 1..=MAX_STREAM, and
/// 0 otherwise).
fn parse_open(rec: &[u8], granted: bool) -> Result<Open, RecordError> {
    let granted = if granted {
        Some(id_at(rec, at::OPEN_GRANTED)?)
    } else {
        check_reserved(rec, at::OPEN_GRANTED, 2)?;
        None
    };
    check_reserved(rec, at::OPEN_RESERVED2, 1)?;
    let mut octets = [0u8; 16];
    octets.copy_from_slice(&rec[at::OPEN_ADDR..at::OPEN_ADDR + 16]);
    let ip = match rec[at::OPEN_FAMILY] {
        FAMILY_V4 if octets[4..] == [0; 12] => {
            IpAddr::V4(Ipv4Addr::new(octets[0], octets[1], octets[2], octets[3]))
        }
        FAMILY_V4 => return Err(RecordError::BadAddress),
        FAMILY_V6 => IpAddr::V6(Ipv6Addr::from(octets)),
        family => return Err(RecordError::BadFamily(family)),
    };
    Ok(Open {
        opener: id_at(rec, at::OPEN_OPENER)?,
        granted,
        from_port: u16_at(rec, at::OPEN_PORT_FROM),
        recv_credits: u16_at(rec, at::OPEN_RECV_CREDITS),
        ring_size: u32_at(rec, at::OPEN_RING_SIZE),
        ring_rkey: u32_at(rec, at::OPEN_RING_RKEY),
        ring_addr: u64_at(rec, at::OPEN_RING_ADDR),
        conn_id: u64_at(rec, at::OPEN_CONN_ID),
        dest: SocketAddr::new(ip, u16_at(rec, at::OPEN_PORT)),
    })
}

fn check_id(id: StreamId) -> Result<(), RecordError> {
    if id.is_control() {
        return Err(RecordError::BadStreamId(id.get()));
    }
    Ok(())
}

/// The limits on what an OPEN or ACCEPT gives the peer for the stream.
fn check_stream(recv_credits: u16, ring_size: u32, ring_addr: u64) -> Result<(), RecordError> {
    if recv_credits < MIN_RECV_CREDITS {
        return Err(RecordError::BadRecvCredits(recv_credits));
    }
    if !(MIN_RING_SIZE..=MAX_RING_SIZE).contains(&ring_size) {
        return Err(RecordError::BadRingSize(ring_size));
    }
    if ring_addr.checked_add(u64::from(ring_size)).is_none() {
        return Err(RecordError::BadRingAddr(ring_addr));
    }
    Ok(())
}

// The readers below are only handed records whose length `parse` has checked against their
// kind, and offsets from `at` that lie inside it.

fn check_reserved(rec: &[u8], offset: usize, n: usize) -> Result<(), RecordError> {
    match rec[offset..offset + n].iter().position(|&b| b != 0) {
        Some(i) => Err(RecordError::ReservedBits(offset + i)),
        None => Ok(()),
    }
}

/// A stream id of `1..=MAX_STREAM`; 0 is refused by [`Record::check`].
fn id_at(rec: &[u8], offset: usize) -> Result<StreamId, RecordError> {
    let n = u16_at(rec, offset);
    StreamId::new(n).ok_or(RecordError::BadStreamId(n))
}

fn u16_at(rec: &[u8], offset: usize) -> u16 {
    u16::from_be_bytes([rec[offset], rec[offset + 1]])
}

fn u32_at(rec: &[u8], offset: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&rec[offset..offset + 4]);
    u32::from_be_bytes(b)
}

fn u64_at(rec: &[u8], offset: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&rec[offset..offset + 8]);
    u64::from_be_bytes(b)
}

fn put(out: &mut [u8], offset: usize, bytes: &[u8]) {
    out[offset..offset + bytes.len()].copy_from_slice(bytes);
}
