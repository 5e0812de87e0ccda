//! Wire encodings: the hello carried in rdma_cm private data, the reject, and the 32-bit
//! immediate value of every RDMA WRITE_WITH_IMM.
//!
//! Layouts are described in `docs/PROTOCOL.md`, which is the source of truth; the offsets in
//! [`field`] mirror it. All multi-byte fields are big-endian. Parsing never panics and never
//! reads past the slice it is given; semantic limits (ring size, credit counts) are checked here
//! so that a [`Hello`] that parses is safe to build a connection from.
//!
//! This module does no I/O and knows nothing about verbs: the driver copies the bytes into and
//! out of `rdma_conn_param.private_data` and converts `imm_data` with `ntohl`/`htonl`.

use core::fmt;

/// First four bytes of every hello and reject: ASCII "RSCK".
pub const MAGIC: [u8; 4] = *b"RSCK";
/// The only protocol version this build speaks (2 added the connection id, the resume hello
/// and MIGRATE, §11; 3 rings that grow, §12; 4 bursts split only where the receiver's ring
/// wraps, so that a receiver checks each DATA's write length exactly, §4).
pub const VERSION: u8 = 4;
/// Private data an rdma_cm connect request can carry (IB REQ 92 bytes minus the 36-byte CM header).
pub const MAX_REQ_PRIVATE_DATA: usize = 56;
/// Private data an rdma_cm accept can carry (IB REP).
pub const MAX_REP_PRIVATE_DATA: usize = 196;
/// Smallest receive ring a peer may advertise.
pub const MIN_RING_SIZE: u32 = 1;
/// Largest receive ring a peer may advertise (a data burst length must fit in 31 bits).
pub const MAX_RING_SIZE: u32 = 1 << 30;
/// Fewest posted receives a peer may advertise: data needs one more than the control reserve,
/// and the WR return threshold must be at least 2 (PROTOCOL.md §5).
pub const MIN_RECV_CREDITS: u32 = 4;
/// Most posted receives a peer may advertise.
pub const MAX_RECV_CREDITS: u32 = 1 << 16;

/// Hello flag of a link's hellos (kind link, and the accept that answers one): the sender
/// takes GRANT records and OPENs on them (PROTOCOL.md §14). A peer that does not know it
/// ignores it (and grants nothing).
pub const FLAG_LINK_GRANTS: u16 = 1;

/// Hello flag of the accept that answers a link hello: the sender takes OPENs that carry
/// the opener's port for the stream (PROTOCOL.md §14, `from_port`; an older answerer
/// refuses a nonzero one as a reserved byte).
pub const FLAG_LINK_PORTS: u16 = 2;

/// Hello flag of a connect hello: the sender follows a redirect (a reject of reason
/// [`RejectReason::Redirect`], PROTOCOL.md §15) to the branch it names. An older listener
/// ignores it; only a client that sets it is ever redirected.
pub const FLAG_TAKES_REDIRECT: u16 = 4;

/// Hello flag of a connect or link hello: the sender comes from a branch of this listener
/// that did not take it (PROTOCOL.md §15: it sent the request back, or could not be
/// reached), whose id follows at bytes 40..48 ([`Hello::branch`]); the owner redirects no
/// one there for a while. An older listener ignores it (and the 8 bytes).
pub const FLAG_SENT_BACK: u16 = 8;

/// Hello flag of a link's hellos (kind link, and the accept that answers one): the sender
/// takes GROW records and SWITCHED on the link (PROTOCOL.md §14, "Rings that grow on a
/// link"), so the rings of its streams' peers may grow. A peer that does not know it ignores
/// it, and its streams keep their rings.
pub const FLAG_LINK_GROW: u16 = 16;

/// Byte ranges of the fields; see `docs/PROTOCOL.md` §2.
pub mod field {
    use core::ops::Range;
    /// Common header (frozen across versions so that any version can read a reject).
    pub const MAGIC: Range<usize> = 0..4;
    /// Protocol version of the sender.
    pub const VERSION: usize = 4;
    /// Connect, accept or reject.
    pub const KIND: usize = 5;
    /// Optional-feature bits.
    pub const FLAGS: Range<usize> = 6..8;
    /// Length of the whole message.
    pub const LEN: Range<usize> = 8..10;
    /// Length of the common header.
    pub const HEADER_END: usize = 10;
    /// Hello body.
    pub const RESERVED: Range<usize> = 10..12;
    /// Remote key of the ring.
    pub const RKEY: Range<usize> = 12..16;
    /// Virtual address of the ring.
    pub const RING_ADDR: Range<usize> = 16..24;
    /// Ring size in bytes.
    pub const RING_SIZE: Range<usize> = 24..28;
    /// Receives posted for the peer.
    pub const RECV_CREDITS: Range<usize> = 28..32;
    /// Connection id (v2), chosen by the side that first connected.
    pub const CONN_ID: Range<usize> = 32..40;
    /// Resume hello: end of the stream the resuming side posted on the old queue pair.
    pub const SENT_END: Range<usize> = 40..48;
    /// Resume hello: end of the resuming side's ring window granted to the peer's writer.
    pub const GRANTED_END: Range<usize> = 48..56;
    /// Branch hello: the id of the branch it is for (PROTOCOL.md §15).
    pub const BRANCH_ID: Range<usize> = 40..48;
    /// Reject body.
    pub const REASON: Range<usize> = 10..12;
    /// Redirect reject: the branch's rdma_cm port.
    pub const REDIRECT_PORT: Range<usize> = 12..14;
    /// Redirect reject: reserved, 0.
    pub const REDIRECT_RESERVED: Range<usize> = 14..16;
    /// Redirect reject: the branch's id.
    pub const REDIRECT_BRANCH: Range<usize> = 16..24;
}

/// What a hello-shaped message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HelloKind {
    /// Sent by the active side in the connect request.
    Connect,
    /// Sent by the passive side in the accept.
    Accept,
    /// Sent by the active side to continue a connection whose peer moved (PROTOCOL.md §11).
    Resume,
    /// Sent by the active side to set up a link: a queue pair whose stream is the link's
    /// control stream (stream 0), carrying the streams later opened on it (PROTOCOL.md §14).
    Link,
    /// Sent by the active side to a branch it was redirected to (PROTOCOL.md §15): a connect
    /// that names the branch, so that no other listener takes it.
    Branch,
    /// Sent by the active side to set up a link with a branch it was redirected to
    /// (PROTOCOL.md §15): a link hello that names the branch.
    BranchLink,
}

impl HelloKind {
    /// Whether hellos of this kind name a branch ([`Hello::branch`]).
    pub fn names_branch(self) -> bool {
        matches!(self, HelloKind::Branch | HelloKind::BranchLink)
    }

    /// Whether hellos of this kind set a link up.
    pub fn is_link(self) -> bool {
        matches!(self, HelloKind::Link | HelloKind::BranchLink)
    }
}

impl HelloKind {
    fn code(self) -> u8 {
        match self {
            HelloKind::Connect => KIND_CONNECT,
            HelloKind::Accept => KIND_ACCEPT,
            HelloKind::Resume => KIND_RESUME,
            HelloKind::Link => KIND_LINK,
            HelloKind::Branch => KIND_BRANCH,
            HelloKind::BranchLink => KIND_BRANCH_LINK,
        }
    }
}

const KIND_CONNECT: u8 = 1;
const KIND_ACCEPT: u8 = 2;
const KIND_REJECT: u8 = 3;
const KIND_RESUME: u8 = 4;
const KIND_LINK: u8 = 5;
const KIND_BRANCH: u8 = 6;
const KIND_BRANCH_LINK: u8 = 7;

/// Why a hello could not be used. The driver falls back to kernel TCP on any of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HelloError {
    /// Fewer bytes than the fields read so far need.
    Truncated {
        /// Bytes the next field needs.
        needed: usize,
        /// Bytes there were.
        got: usize,
    },
    /// Not an rsock peer.
    BadMagic([u8; 4]),
    /// An rsock peer speaking a version this build does not.
    UnsupportedVersion(u8),
    /// Kind byte is not connect, accept or reject.
    UnknownKind(u8),
    /// The message is a hello of the wrong direction (e.g. an accept where a connect was due).
    UnexpectedKind(HelloKind),
    /// The length field is smaller than the version's fixed part.
    BadLength(u16),
    /// Ring size outside `MIN_RING_SIZE..=MAX_RING_SIZE`.
    BadRingSize(u32),
    /// Ring address plus ring size overflows the address space.
    BadRingAddr(u64),
    /// Receive credits outside `MIN_RECV_CREDITS..=MAX_RECV_CREDITS`.
    BadRecvCredits(u32),
    /// The peer refused us and said why.
    Rejected(Reject),
}

impl fmt::Display for HelloError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HelloError::Truncated { needed, got } => {
                write!(f, "hello truncated: need {needed} bytes, got {got}")
            }
            HelloError::BadMagic(m) => write!(f, "not an rsock peer (magic {m:02x?})"),
            HelloError::UnsupportedVersion(v) => {
                write!(f, "peer speaks rsock version {v}, we speak {VERSION}")
            }
            HelloError::UnknownKind(k) => write!(f, "unknown hello kind {k}"),
            HelloError::UnexpectedKind(k) => write!(f, "unexpected hello kind {k:?}"),
            HelloError::BadLength(l) => write!(f, "hello length field {l} too small"),
            HelloError::BadRingSize(s) => write!(f, "peer ring size {s} out of range"),
            HelloError::BadRingAddr(a) => write!(f, "peer ring address {a:#x} overflows"),
            HelloError::BadRecvCredits(c) => write!(f, "peer receive credits {c} out of range"),
            HelloError::Rejected(r) => {
                write!(
                    f,
                    "peer (version {}) rejected us: {:?}",
                    r.version, r.reason
                )
            }
        }
    }
}

impl std::error::Error for HelloError {}

/// Connection parameters one side announces to the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// Connect (in the request), accept (in the reply) or resume (a request continuing a
    /// connection; `resume` is set exactly for this kind).
    pub kind: HelloKind,
    /// Optional features; none are defined, senders send 0 and receivers ignore unknown bits.
    pub flags: u16,
    /// Virtual address of the sender's receive ring (the peer's RDMA WRITE target base).
    pub ring_addr: u64,
    /// Remote key of the ring's memory region.
    pub rkey: u32,
    /// Ring size in bytes; all of it is granted to the peer at connection start.
    pub ring_size: u32,
    /// Receives the sender has posted: the peer's initial message credits.
    pub recv_credits: u32,
    /// Random id the connecting side chose; the accept echoes it, a resume proves with it
    /// that the resuming side is the connection's peer.
    pub conn_id: u64,
    /// Where a resume continues the connection (kind `Resume` only).
    pub resume: Option<ResumePoint>,
    /// The branch a branch hello is for (kinds `Branch` and `BranchLink`), or that sent the
    /// sender back (kinds `Connect` and `Link` with [`FLAG_SENT_BACK`]).
    pub branch: Option<u64>,
}

/// The resuming side's stream positions, carried by a resume hello (PROTOCOL.md §11).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ResumePoint {
    /// End of the bytes it posted on the old queue pair: the new peer has every byte before
    /// this (its predecessor's ring holds them), and nothing after.
    pub sent_end: u64,
    /// End of its ring window granted to the peer's writer (its credits, exactly).
    pub granted_end: u64,
}

impl Hello {
    /// Encoded length of a connect or accept.
    pub const LEN: usize = 40;
    /// Encoded length of a resume; also the longest hello.
    pub const RESUME_LEN: usize = 56;
    /// Encoded length of a branch hello (and a branch link hello).
    pub const BRANCH_LEN: usize = 48;

    /// Parses and validates a hello of any kind; a reject becomes `Err(Rejected)`.
    ///
    /// Bytes past the length field are ignored: rdma_cm may zero-pad private data.
    pub fn parse(buf: &[u8]) -> Result<Hello, HelloError> {
        let (kind, flags, len) = parse_header(buf)?;
        let kind = match kind {
            KIND_CONNECT => HelloKind::Connect,
            KIND_ACCEPT => HelloKind::Accept,
            KIND_RESUME => HelloKind::Resume,
            KIND_LINK => HelloKind::Link,
            KIND_BRANCH => HelloKind::Branch,
            KIND_BRANCH_LINK => HelloKind::BranchLink,
            KIND_REJECT => return Err(HelloError::Rejected(Reject::parse_body(buf, len)?)),
            other => return Err(HelloError::UnknownKind(other)),
        };
        let names_branch = names_branch(kind, flags);
        let fixed = match kind {
            HelloKind::Resume => Self::RESUME_LEN,
            _ if names_branch => Self::BRANCH_LEN,
            _ => Self::LEN,
        };
        if usize::from(len) < fixed {
            return Err(HelloError::BadLength(len));
        }
        let body = need(buf, usize::from(len))?;
        let hello = Hello {
            kind,
            flags,
            rkey: be_u32(body, field::RKEY),
            ring_addr: be_u64(body, field::RING_ADDR),
            ring_size: be_u32(body, field::RING_SIZE),
            recv_credits: be_u32(body, field::RECV_CREDITS),
            conn_id: be_u64(body, field::CONN_ID),
            resume: (kind == HelloKind::Resume).then(|| ResumePoint {
                sent_end: be_u64(body, field::SENT_END),
                granted_end: be_u64(body, field::GRANTED_END),
            }),
            branch: names_branch.then(|| be_u64(body, field::BRANCH_ID)),
        };
        hello.check()?;
        Ok(hello)
    }

    /// Parses a hello and insists on its kind (the passive side expects `Connect`).
    pub fn parse_kind(buf: &[u8], expected: HelloKind) -> Result<Hello, HelloError> {
        let hello = Self::parse(buf)?;
        if hello.kind != expected {
            return Err(HelloError::UnexpectedKind(hello.kind));
        }
        Ok(hello)
    }

    /// Checks the semantic limits a parsed hello must meet.
    pub fn check(&self) -> Result<(), HelloError> {
        if !(MIN_RING_SIZE..=MAX_RING_SIZE).contains(&self.ring_size) {
            return Err(HelloError::BadRingSize(self.ring_size));
        }
        if self
            .ring_addr
            .checked_add(u64::from(self.ring_size))
            .is_none()
        {
            return Err(HelloError::BadRingAddr(self.ring_addr));
        }
        if !(MIN_RECV_CREDITS..=MAX_RECV_CREDITS).contains(&self.recv_credits) {
            return Err(HelloError::BadRecvCredits(self.recv_credits));
        }
        if (self.kind == HelloKind::Resume) != self.resume.is_some()
            || names_branch(self.kind, self.flags) != self.branch.is_some()
        {
            return Err(HelloError::UnexpectedKind(self.kind));
        }
        Ok(())
    }

    /// The branch that sent the sender back ([`FLAG_SENT_BACK`]), if the hello names one.
    pub fn sent_back_by(&self) -> Option<u64> {
        self.branch.filter(|_| !self.kind.names_branch())
    }

    /// Bytes [`emit`](Self::emit) writes: [`LEN`](Self::LEN), or
    /// [`RESUME_LEN`](Self::RESUME_LEN) for a resume, [`BRANCH_LEN`](Self::BRANCH_LEN) for
    /// a branch hello.
    pub fn encoded_len(&self) -> usize {
        match (self.resume, self.branch) {
            (Some(_), _) => Self::RESUME_LEN,
            (None, Some(_)) => Self::BRANCH_LEN,
            (None, None) => Self::LEN,
        }
    }

    /// Encodes into the first [`encoded_len`](Self::encoded_len) bytes of `buf`; returns
    /// that length.
    ///
    /// # Panics
    /// If `buf` is shorter (a caller bug, never peer input).
    pub fn emit(&self, buf: &mut [u8]) -> usize {
        let len = self.encoded_len();
        let buf = &mut buf[..len];
        emit_header(buf, self.kind.code(), self.flags, len as u16);
        buf[field::RESERVED].fill(0);
        buf[field::RKEY].copy_from_slice(&self.rkey.to_be_bytes());
        buf[field::RING_ADDR].copy_from_slice(&self.ring_addr.to_be_bytes());
        buf[field::RING_SIZE].copy_from_slice(&self.ring_size.to_be_bytes());
        buf[field::RECV_CREDITS].copy_from_slice(&self.recv_credits.to_be_bytes());
        buf[field::CONN_ID].copy_from_slice(&self.conn_id.to_be_bytes());
        if let Some(r) = self.resume {
            buf[field::SENT_END].copy_from_slice(&r.sent_end.to_be_bytes());
            buf[field::GRANTED_END].copy_from_slice(&r.granted_end.to_be_bytes());
        } else if let Some(b) = self.branch {
            buf[field::BRANCH_ID].copy_from_slice(&b.to_be_bytes());
        }
        len
    }

    /// Encodes into a fresh array, zero-padded past [`encoded_len`](Self::encoded_len)
    /// (rdma_cm pads private data the same way).
    pub fn to_bytes(&self) -> [u8; Self::RESUME_LEN] {
        let mut out = [0u8; Self::RESUME_LEN];
        self.emit(&mut out);
        out
    }
}

/// Whether a hello of `kind` with `flags` carries a branch id ([`Hello::branch`]).
pub fn names_branch(kind: HelloKind, flags: u16) -> bool {
    kind.names_branch()
        || (matches!(kind, HelloKind::Connect | HelloKind::Link) && flags & FLAG_SENT_BACK != 0)
}

/// Why the passive side refused a connect request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectReason {
    /// Our version differs; the reject's `version` says which one we speak.
    UnsupportedVersion,
    /// The connect request did not parse or broke a limit.
    BadHello,
    /// No memory or queue resources for another connection.
    NoResources,
    /// Connect to the listener's branch instead (PROTOCOL.md §15): another process that
    /// accepts from the same listener, on its own rdma_cm port.
    Redirect,
    /// A code this build does not know.
    Unknown(u16),
}

impl From<u16> for RejectReason {
    fn from(code: u16) -> Self {
        match code {
            1 => RejectReason::UnsupportedVersion,
            2 => RejectReason::BadHello,
            3 => RejectReason::NoResources,
            4 => RejectReason::Redirect,
            other => RejectReason::Unknown(other),
        }
    }
}

impl From<RejectReason> for u16 {
    fn from(reason: RejectReason) -> u16 {
        match reason {
            RejectReason::UnsupportedVersion => 1,
            RejectReason::BadHello => 2,
            RejectReason::NoResources => 3,
            RejectReason::Redirect => 4,
            RejectReason::Unknown(code) => code,
        }
    }
}

impl RejectReason {
    /// The reason to send back for a connect request that failed to parse.
    pub fn for_error(err: &HelloError) -> RejectReason {
        match err {
            HelloError::UnsupportedVersion(_) => RejectReason::UnsupportedVersion,
            _ => RejectReason::BadHello,
        }
    }
}

/// Private data of an rdma_cm reject. Its layout is frozen across versions, so a peer of any
/// version can tell why it was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reject {
    /// Version the rejecting side speaks.
    pub version: u8,
    /// Why.
    pub reason: RejectReason,
}

impl Reject {
    /// Encoded length.
    pub const LEN: usize = 12;

    /// A reject from this build.
    pub fn new(reason: RejectReason) -> Reject {
        Reject {
            version: VERSION,
            reason,
        }
    }

    /// Parses a reject of any version.
    pub fn parse(buf: &[u8]) -> Result<Reject, HelloError> {
        let magic = need(buf, field::MAGIC.end)?;
        if magic[field::MAGIC] != MAGIC {
            return Err(HelloError::BadMagic(first4(buf)));
        }
        let head = need(buf, field::HEADER_END)?;
        if head[field::KIND] != KIND_REJECT {
            return Err(HelloError::UnknownKind(head[field::KIND]));
        }
        Self::parse_body(buf, be_u16(head, field::LEN))
    }

    fn parse_body(buf: &[u8], len: u16) -> Result<Reject, HelloError> {
        if usize::from(len) < Self::LEN {
            return Err(HelloError::BadLength(len));
        }
        let body = need(buf, usize::from(len))?;
        Ok(Reject {
            version: body[field::VERSION],
            reason: be_u16(body, field::REASON).into(),
        })
    }

    /// Encodes into the first [`Reject::LEN`] bytes of `buf`.
    ///
    /// # Panics
    /// If `buf` is shorter than [`Reject::LEN`].
    pub fn emit(&self, buf: &mut [u8]) -> usize {
        let buf = &mut buf[..Self::LEN];
        emit_header(buf, KIND_REJECT, 0, Self::LEN as u16);
        buf[field::VERSION] = self.version;
        buf[field::REASON].copy_from_slice(&u16::from(self.reason).to_be_bytes());
        Self::LEN
    }

    /// Encodes into a fresh array.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        self.emit(&mut out);
        out
    }
}

/// A reject of reason [`RejectReason::Redirect`]: "connect to branch `branch` on rdma_cm port
/// `port` of the same address instead" (PROTOCOL.md §15). 24 bytes: a reject's 12, then the
/// port, two reserved bytes and the branch id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Redirect {
    /// The branch's rdma_cm port; never 0.
    pub port: u16,
    /// The branch's id, for its hello ([`HelloKind::Branch`]).
    pub branch: u64,
}

impl Redirect {
    /// Encoded length.
    pub const LEN: usize = 24;

    /// The redirect a reject's private data carries, if it is a well-formed one: `None` for
    /// any other reject, and for a redirect with a short length, port 0 or reserved bits.
    pub fn parse(buf: &[u8]) -> Option<Redirect> {
        let r = Reject::parse(buf).ok()?;
        let body = buf.get(..Self::LEN)?;
        let len = be_u16(body, field::LEN);
        let port = be_u16(body, field::REDIRECT_PORT);
        let sound = r.reason == RejectReason::Redirect
            && usize::from(len) >= Self::LEN
            && port != 0
            && be_u16(body, field::REDIRECT_RESERVED) == 0;
        sound.then(|| Redirect {
            port,
            branch: be_u64(body, field::REDIRECT_BRANCH),
        })
    }

    /// Encodes the whole reject.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        Reject::new(RejectReason::Redirect).emit(&mut out);
        out[field::LEN].copy_from_slice(&(Self::LEN as u16).to_be_bytes());
        out[field::REDIRECT_PORT].copy_from_slice(&self.port.to_be_bytes());
        out[field::REDIRECT_BRANCH].copy_from_slice(&self.branch.to_be_bytes());
        out
    }
}

/// Checks magic and version; returns (kind, flags, len).
fn parse_header(buf: &[u8]) -> Result<(u8, u16, u16), HelloError> {
    let magic = need(buf, field::MAGIC.end)?;
    if magic[field::MAGIC] != MAGIC {
        return Err(HelloError::BadMagic(first4(buf)));
    }
    let head = need(buf, field::HEADER_END)?;
    let kind = head[field::KIND];
    // A reject's layout is version-independent: read it before judging the version.
    if kind != KIND_REJECT && head[field::VERSION] != VERSION {
        return Err(HelloError::UnsupportedVersion(head[field::VERSION]));
    }
    Ok((kind, be_u16(head, field::FLAGS), be_u16(head, field::LEN)))
}

fn emit_header(buf: &mut [u8], kind: u8, flags: u16, len: u16) {
    buf[field::MAGIC].copy_from_slice(&MAGIC);
    buf[field::VERSION] = VERSION;
    buf[field::KIND] = kind;
    buf[field::FLAGS].copy_from_slice(&flags.to_be_bytes());
    buf[field::LEN].copy_from_slice(&len.to_be_bytes());
}

/// The first `n` bytes of `buf`, or `Truncated`.
fn need(buf: &[u8], n: usize) -> Result<&[u8], HelloError> {
    buf.get(..n).ok_or(HelloError::Truncated {
        needed: n,
        got: buf.len(),
    })
}

fn first4(buf: &[u8]) -> [u8; 4] {
    let mut m = [0u8; 4];
    for (d, s) in m.iter_mut().zip(buf) {
        *d = *s;
    }
    m
}

// The helpers below are only called on slices `need` has already length-checked.
fn be_u16(buf: &[u8], r: core::ops::Range<usize>) -> u16 {
    let mut b = [0u8; 2];
    b.copy_from_slice(&buf[r]);
    u16::from_be_bytes(b)
}

fn be_u32(buf: &[u8], r: core::ops::Range<usize>) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&buf[r]);
    u32::from_be_bytes(b)
}

fn be_u64(buf: &[u8], r: core::ops::Range<usize>) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&buf[r]);
    u64::from_be_bytes(b)
}

// ---------------------------------------------------------------------------------------------
// Immediate data
// ---------------------------------------------------------------------------------------------

/// Most WR credits one credit message can return.
pub const MAX_CREDIT_WRS: u32 = (1 << 10) - 1;
/// Most ring bytes one credit message can return.
pub const MAX_CREDIT_BYTES: u32 = (1 << 20) - 1;
/// Longest data burst one immediate can announce.
pub const MAX_DATA_LEN: u32 = (1 << 31) - 1;

const IMM_CTRL: u32 = 1 << 31;
const IMM_CREDIT_TAG: u32 = 0b10 << 30;
const IMM_TAG_MASK: u32 = 0b11 << 30;
const CREDIT_WRS_SHIFT: u32 = 20;
const OP_SHIFT: u32 = 24;
const OP_MASK: u32 = 0x3f;
const OP_ARG_MASK: u32 = (1 << 24) - 1;
const OP_FIN: u32 = 1;
const OP_RESET: u32 = 2;
const OP_MIGRATE: u32 = 3;
const OP_GROW_HI: u32 = 4;
const OP_GROW: u32 = 5;
const OP_SWITCHED: u32 = 6;
const PORT_MASK: u32 = 0xffff;
const HALF_SHIFT: u32 = 16;

/// Largest ring a GROW can announce, in 4 KiB pages (16 bits split over the pair).
pub const MAX_GROW_PAGES: u32 = 0xffff;
/// Unit of a grown ring's size.
pub const GROW_PAGE: u32 = 4096;

/// Meaning of one immediate value (host order; verbs carry it big-endian).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Imm {
    /// `len` more bytes of stream have been written into the receiver's ring, ending with this
    /// write. `1..=MAX_DATA_LEN`.
    Data {
        /// Burst length in bytes.
        len: u32,
    },
    /// The receiver returns `wrs` posted receives and `bytes` of ring space. Not both zero.
    Credit {
        /// Posted receives returned.
        wrs: u32,
        /// Ring bytes returned.
        bytes: u32,
    },
    /// The sender will write no more data (half-close).
    Fin,
    /// The sender has abandoned the connection; discard everything.
    Reset,
    /// The sender's end of the connection moves to another process, listening for a resume
    /// on `port` at the sender's address; it sends nothing more on this queue pair
    /// (PROTOCOL.md §11).
    Migrate {
        /// rdma_cm port (TCP port space) of the taker's listener; never 0.
        port: u16,
    },
    /// First half of a ring growth (PROTOCOL.md §12): the high halves of the new ring's rkey
    /// and size. Always directly followed by [`Grow`](Imm::Grow).
    GrowHi {
        /// rkey bits 31..16.
        rkey_hi: u16,
        /// Size in 4 KiB pages, bits 15..8.
        pages_hi: u8,
    },
    /// Second half of a ring growth: the low halves. From the receipt of this, the receiver
    /// of it writes into the new ring only, and answers with [`Switched`](Imm::Switched).
    Grow {
        /// rkey bits 15..0.
        rkey_lo: u16,
        /// Size in 4 KiB pages, bits 7..0.
        pages_lo: u8,
    },
    /// Answer to a GROW: every byte written before this is in the old ring; every later one
    /// goes to the new ring.
    Switched,
}

/// An immediate value that does not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImmError {
    /// A data immediate announcing zero bytes.
    EmptyData,
    /// A credit immediate returning nothing.
    EmptyCredit,
    /// A control opcode this version does not define.
    UnknownOp(u8),
    /// A control immediate with argument bits its opcode does not define.
    ReservedBits(u32),
    /// A link immediate for another stream than the one that got it (the driver hands each
    /// stream only its own).
    OtherStream(u16),
}

impl fmt::Display for ImmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImmError::EmptyData => f.write_str("data immediate with zero length"),
            ImmError::EmptyCredit => f.write_str("credit immediate returning nothing"),
            ImmError::UnknownOp(op) => write!(f, "unknown control opcode {op}"),
            ImmError::ReservedBits(v) => write!(f, "reserved bits set in immediate {v:#010x}"),
            ImmError::OtherStream(id) => write!(f, "immediate for stream {id} of the link"),
        }
    }
}

impl std::error::Error for ImmError {}

impl Imm {
    /// The GROW pair announcing a ring of `pages` 4 KiB pages (`1..=MAX_GROW_PAGES`) under
    /// `rkey`.
    pub fn grow_pair(rkey: u32, pages: u32) -> [Imm; 2] {
        debug_assert!((1..=MAX_GROW_PAGES).contains(&pages));
        [
            Imm::GrowHi {
                rkey_hi: (rkey >> 16) as u16,
                pages_hi: (pages >> 8) as u8,
            },
            Imm::Grow {
                rkey_lo: rkey as u16,
                pages_lo: pages as u8,
            },
        ]
    }

    /// Decodes an immediate value.
    pub fn decode(v: u32) -> Result<Imm, ImmError> {
        if v & IMM_CTRL == 0 {
            return if v == 0 {
                Err(ImmError::EmptyData)
            } else {
                Ok(Imm::Data { len: v })
            };
        }
        if v & IMM_TAG_MASK == IMM_CREDIT_TAG {
            let wrs = (v >> CREDIT_WRS_SHIFT) & MAX_CREDIT_WRS;
            let bytes = v & MAX_CREDIT_BYTES;
            if wrs == 0 && bytes == 0 {
                return Err(ImmError::EmptyCredit);
            }
            return Ok(Imm::Credit { wrs, bytes });
        }
        let arg = v & OP_ARG_MASK;
        match (v >> OP_SHIFT) & OP_MASK {
            OP_FIN | OP_RESET if arg != 0 => Err(ImmError::ReservedBits(v)),
            OP_FIN => Ok(Imm::Fin),
            OP_RESET => Ok(Imm::Reset),
            OP_MIGRATE if arg & !PORT_MASK != 0 || arg == 0 => Err(ImmError::ReservedBits(v)),
            OP_MIGRATE => Ok(Imm::Migrate { port: arg as u16 }),
            OP_GROW_HI => Ok(Imm::GrowHi {
                rkey_hi: arg as u16,
                pages_hi: (arg >> HALF_SHIFT) as u8,
            }),
            OP_GROW => Ok(Imm::Grow {
                rkey_lo: arg as u16,
                pages_lo: (arg >> HALF_SHIFT) as u8,
            }),
            OP_SWITCHED if arg != 0 => Err(ImmError::ReservedBits(v)),
            OP_SWITCHED => Ok(Imm::Switched),
            op => Err(ImmError::UnknownOp(op as u8)),
        }
    }

    /// Encodes; fields beyond their limits are a caller bug and are truncated in release.
    pub fn encode(self) -> u32 {
        match self {
            Imm::Data { len } => {
                debug_assert!((1..=MAX_DATA_LEN).contains(&len));
                len & MAX_DATA_LEN
            }
            Imm::Credit { wrs, bytes } => {
                debug_assert!(wrs <= MAX_CREDIT_WRS && bytes <= MAX_CREDIT_BYTES);
                IMM_CREDIT_TAG
                    | (wrs & MAX_CREDIT_WRS) << CREDIT_WRS_SHIFT
                    | (bytes & MAX_CREDIT_BYTES)
            }
            Imm::Fin => IMM_TAG_MASK | OP_FIN << OP_SHIFT,
            Imm::Reset => IMM_TAG_MASK | OP_RESET << OP_SHIFT,
            Imm::Migrate { port } => {
                debug_assert!(port != 0);
                IMM_TAG_MASK | OP_MIGRATE << OP_SHIFT | u32::from(port)
            }
            Imm::GrowHi { rkey_hi, pages_hi } => {
                IMM_TAG_MASK
                    | OP_GROW_HI << OP_SHIFT
                    | u32::from(pages_hi) << HALF_SHIFT
                    | u32::from(rkey_hi)
            }
            Imm::Grow { rkey_lo, pages_lo } => {
                IMM_TAG_MASK
                    | OP_GROW << OP_SHIFT
                    | u32::from(pages_lo) << HALF_SHIFT
                    | u32::from(rkey_lo)
            }
            Imm::Switched => IMM_TAG_MASK | OP_SWITCHED << OP_SHIFT,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HELLO_BYTES: [u8; 40] = [
        b'R', b'S', b'C', b'K', // magic
        0x04, // version
        0x01, // kind: connect
        0x00, 0x00, // flags
        0x00, 0x28, // len 40
        0x00, 0x00, // reserved
        0xde, 0xad, 0xbe, 0xef, // rkey
        0x00, 0x00, 0x7f, 0x12, 0x34, 0x56, 0x70, 0x00, // ring addr
        0x00, 0x04, 0x00, 0x00, // ring size 256 KiB
        0x00, 0x00, 0x00, 0x80, // recv credits 128
        0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, // conn id
    ];

    const RESUME_BYTES: [u8; 56] = [
        b'R', b'S', b'C', b'K', 0x04, // magic, version
        0x04, // kind: resume
        0x00, 0x00, // flags
        0x00, 0x38, // len 56
        0x00, 0x00, // reserved
        0xde, 0xad, 0xbe, 0xef, // rkey
        0x00, 0x00, 0x7f, 0x12, 0x34, 0x56, 0x70, 0x00, // ring addr
        0x00, 0x04, 0x00, 0x00, // ring size 256 KiB
        0x00, 0x00, 0x00, 0x80, // recv credits 128
        0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, // conn id
        0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x07, // sent end
        0x00, 0x00, 0x00, 0x00, 0x00, 0x0c, 0x00, 0x00, // granted end
    ];

    fn resume() -> Hello {
        Hello {
            kind: HelloKind::Resume,
            resume: Some(ResumePoint {
                sent_end: 0x10_0007,
                granted_end: 0x0c_0000,
            }),
            ..hello()
        }
    }

    fn hello() -> Hello {
        Hello {
            kind: HelloKind::Connect,
            flags: 0,
            ring_addr: 0x7f12_3456_7000,
            rkey: 0xdead_beef,
            ring_size: 256 * 1024,
            recv_credits: 128,
            conn_id: 0x0123_4567_89ab_cdef,
            resume: None,
            branch: None,
        }
    }

    #[test]
    fn hello_deconstruct() {
        assert_eq!(Hello::parse(&HELLO_BYTES), Ok(hello()));
    }

    #[test]
    fn hello_construct_over_poisoned_buffer() {
        let mut buf = [0xa5u8; 48];
        assert_eq!(hello().emit(&mut buf), Hello::LEN);
        assert_eq!(buf[..40], HELLO_BYTES);
        assert_eq!(buf[40..], [0xa5; 8]);
        assert_eq!(hello().to_bytes()[..40], HELLO_BYTES);
    }

    #[test]
    fn branch_hello_golden() {
        let h = Hello {
            kind: HelloKind::Branch,
            flags: FLAG_TAKES_REDIRECT,
            branch: Some(0x1122_3344_5566_7788),
            ..hello()
        };
        let b = h.to_bytes();
        assert_eq!(b[..10], [b'R', b'S', b'C', b'K', 4, 6, 0, 4, 0, 48]);
        assert_eq!(b[10..40], HELLO_BYTES[10..40]);
        assert_eq!(b[40..48], [0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]);
        assert_eq!(b[48..], [0; 8]);
        assert_eq!(Hello::parse(&b), Ok(h));
        // A branch hello must name its branch: 40 bytes of it are a bad length.
        let mut short = b;
        short[9] = 40;
        assert_eq!(Hello::parse(&short), Err(HelloError::BadLength(40)));
    }

    #[test]
    fn branch_link_hello_golden() {
        let h = Hello {
            kind: HelloKind::BranchLink,
            flags: FLAG_LINK_GRANTS | FLAG_TAKES_REDIRECT,
            branch: Some(0x0000_0a0b_0c0d_0e0f),
            ..hello()
        };
        let b = h.to_bytes();
        assert_eq!(b[..10], [b'R', b'S', b'C', b'K', 4, 7, 0, 5, 0, 48]);
        assert_eq!(b[10..40], HELLO_BYTES[10..40]);
        assert_eq!(b[40..48], [0, 0, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f]);
        assert_eq!(Hello::parse(&b), Ok(h));
        assert!(h.kind.is_link() && h.kind.names_branch());
        let mut short = b;
        short[9] = 40;
        assert_eq!(Hello::parse(&short), Err(HelloError::BadLength(40)));
        // A link hello names no branch: its 40 bytes parse without one.
        let link = Hello {
            kind: HelloKind::Link,
            branch: None,
            ..h
        };
        assert_eq!(link.encoded_len(), Hello::LEN);
        assert_eq!(Hello::parse(&link.to_bytes()).map(|h| h.branch), Ok(None));
    }

    #[test]
    fn sent_back_connect_golden() {
        let h = Hello {
            flags: FLAG_SENT_BACK,
            branch: Some(0x0000_0102_0304_0506),
            ..hello()
        };
        let b = h.to_bytes();
        assert_eq!(b[..10], [b'R', b'S', b'C', b'K', 4, 1, 0, 8, 0, 48]);
        assert_eq!(b[10..40], HELLO_BYTES[10..40]);
        assert_eq!(b[40..48], [0, 0, 1, 2, 3, 4, 5, 6]);
        assert_eq!(Hello::parse(&b), Ok(h));
        assert_eq!(h.sent_back_by(), Some(0x0000_0102_0304_0506));
        // A branch hello names the branch it is for, not one that sent it back.
        let branch = Hello {
            kind: HelloKind::Branch,
            flags: 0,
            ..h
        };
        assert_eq!(branch.sent_back_by(), None);
        // The flag promises the id: 40 bytes of it are a bad length ...
        let mut short = b;
        short[9] = 40;
        assert_eq!(Hello::parse(&short), Err(HelloError::BadLength(40)));
        // ... and an accept never carries one.
        let accept = Hello {
            kind: HelloKind::Accept,
            ..h
        };
        assert_eq!(
            accept.check(),
            Err(HelloError::UnexpectedKind(HelloKind::Accept))
        );
    }

    #[test]
    fn redirect_golden_and_strict() {
        let r = Redirect {
            port: 0xc351,
            branch: 0x0102_0304_0506_0708,
        };
        let b = r.to_bytes();
        assert_eq!(
            b,
            [
                b'R', b'S', b'C', b'K', 4, 3, 0, 0, 0, 24, 0, 4, // a reject, reason 4
                0xc3, 0x51, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, // port, reserved, branch
            ]
        );
        assert_eq!(Redirect::parse(&b), Some(r));
        // Any version's reader sees a reject of reason 4.
        assert_eq!(
            Hello::parse(&b),
            Err(HelloError::Rejected(Reject::new(RejectReason::Redirect)))
        );
        let spoil = |i: usize, v: u8| {
            let mut x = b;
            x[i] = v;
            Redirect::parse(&x)
        };
        assert_eq!(spoil(9, 12), None, "length of a plain reject");
        assert_eq!(spoil(11, 3), None, "another reason");
        assert_eq!(spoil(14, 1), None, "reserved bits");
        assert_eq!(Redirect::parse(&b[..20]), None, "truncated");
        let mut no_port = b;
        no_port[12..14].fill(0);
        assert_eq!(Redirect::parse(&no_port), None, "port 0");
        assert_eq!(
            Redirect::parse(&Reject::new(RejectReason::NoResources).to_bytes()),
            None
        );
    }

    #[test]
    fn resume_golden() {
        assert_eq!(Hello::parse(&RESUME_BYTES), Ok(resume()));
        assert_eq!(resume().to_bytes(), RESUME_BYTES);
        assert_eq!(resume().encoded_len(), Hello::RESUME_LEN);
        for n in 0..RESUME_BYTES.len() {
            assert!(Hello::parse(&RESUME_BYTES[..n]).is_err(), "len {n}");
        }
        let mut short = RESUME_BYTES;
        short[9] = 40; // a resume with only a connect's length
        assert_eq!(Hello::parse(&short), Err(HelloError::BadLength(40)));
        let mut odd = resume();
        odd.resume = None;
        assert_eq!(
            odd.check(),
            Err(HelloError::UnexpectedKind(HelloKind::Resume))
        );
    }

    #[test]
    fn hello_fits_connect_request() {
        const { assert!(Hello::RESUME_LEN <= MAX_REQ_PRIVATE_DATA) };
        const { assert!(Reject::LEN <= MAX_REP_PRIVATE_DATA) };
    }

    #[test]
    fn hello_ignores_cm_zero_padding() {
        let mut padded = [0u8; MAX_REQ_PRIVATE_DATA];
        padded[..40].copy_from_slice(&HELLO_BYTES);
        assert_eq!(Hello::parse(&padded), Ok(hello()));
    }

    #[test]
    fn hello_truncated_at_every_length() {
        for n in 0..HELLO_BYTES.len() {
            match Hello::parse(&HELLO_BYTES[..n]) {
                Err(HelloError::Truncated { got, .. }) => assert_eq!(got, n),
                other => panic!("len {n}: {other:?}"),
            }
        }
    }

    #[test]
    fn hello_wrong_magic() {
        let mut b = HELLO_BYTES;
        b[0] = b'G';
        assert_eq!(Hello::parse(&b), Err(HelloError::BadMagic(*b"GSCK")));
        assert_eq!(
            Hello::parse(b"GET / HTTP/1.1\r\n"),
            Err(HelloError::BadMagic(*b"GET "))
        );
    }

    #[test]
    fn hello_unknown_version() {
        let mut b = HELLO_BYTES;
        b[4] = 1; // a version 1 peer is refused (and refuses us) cleanly
        assert_eq!(Hello::parse(&b), Err(HelloError::UnsupportedVersion(1)));
    }

    #[test]
    fn hello_length_field_checked() {
        let mut b = HELLO_BYTES;
        b[9] = 39;
        assert_eq!(Hello::parse(&b), Err(HelloError::BadLength(39)));
        b[9] = 41;
        assert_eq!(
            Hello::parse(&b),
            Err(HelloError::Truncated {
                needed: 41,
                got: 40
            })
        );
    }

    #[test]
    fn hello_limits() {
        let mut h = hello();
        h.ring_size = 0;
        assert_eq!(Hello::parse(&h.to_bytes()), Err(HelloError::BadRingSize(0)));
        h.ring_size = MAX_RING_SIZE + 1;
        assert_eq!(
            Hello::parse(&h.to_bytes()),
            Err(HelloError::BadRingSize(MAX_RING_SIZE + 1))
        );
        h = hello();
        h.ring_addr = u64::MAX - 10;
        assert_eq!(
            Hello::parse(&h.to_bytes()),
            Err(HelloError::BadRingAddr(u64::MAX - 10))
        );
        h = hello();
        h.recv_credits = 2;
        assert_eq!(
            Hello::parse(&h.to_bytes()),
            Err(HelloError::BadRecvCredits(2))
        );
    }

    #[test]
    fn hello_kind_checked() {
        let b = HELLO_BYTES;
        assert_eq!(
            Hello::parse_kind(&b, HelloKind::Accept),
            Err(HelloError::UnexpectedKind(HelloKind::Connect))
        );
        let mut b = HELLO_BYTES;
        b[5] = 9;
        assert_eq!(Hello::parse(&b), Err(HelloError::UnknownKind(9)));
    }

    const REJECT_BYTES: [u8; 12] = [
        b'R', b'S', b'C', b'K', 0x04, 0x03, 0x00, 0x00, 0x00, 0x0c, 0x00, 0x01,
    ];

    #[test]
    fn reject_golden() {
        let r = Reject::new(RejectReason::UnsupportedVersion);
        assert_eq!(r.to_bytes(), REJECT_BYTES);
        assert_eq!(Reject::parse(&REJECT_BYTES), Ok(r));
        assert_eq!(Hello::parse(&REJECT_BYTES), Err(HelloError::Rejected(r)));
    }

    #[test]
    fn reject_from_other_version_still_reads() {
        let mut b = REJECT_BYTES;
        b[4] = 7;
        b[11] = 3;
        let r = Reject {
            version: 7,
            reason: RejectReason::NoResources,
        };
        assert_eq!(Reject::parse(&b), Ok(r));
        assert_eq!(Hello::parse(&b), Err(HelloError::Rejected(r)));
    }

    #[test]
    fn imm_golden() {
        assert_eq!(Imm::Data { len: 1 }.encode(), 0x0000_0001);
        assert_eq!(Imm::Data { len: MAX_DATA_LEN }.encode(), 0x7fff_ffff);
        assert_eq!(Imm::Credit { wrs: 1, bytes: 0 }.encode(), 0x8010_0000);
        assert_eq!(
            Imm::Credit {
                wrs: 0,
                bytes: 4096
            }
            .encode(),
            0x8000_1000
        );
        assert_eq!(
            Imm::Credit {
                wrs: 1023,
                bytes: MAX_CREDIT_BYTES
            }
            .encode(),
            0xbfff_ffff
        );
        assert_eq!(Imm::Fin.encode(), 0xc100_0000);
        assert_eq!(Imm::Reset.encode(), 0xc200_0000);
        assert_eq!(Imm::Migrate { port: 0x1234 }.encode(), 0xc300_1234);
        assert_eq!(
            Imm::grow_pair(0xdead_beef, 0x0140),
            [
                Imm::GrowHi {
                    rkey_hi: 0xdead,
                    pages_hi: 0x01
                },
                Imm::Grow {
                    rkey_lo: 0xbeef,
                    pages_lo: 0x40
                }
            ]
        );
        assert_eq!(Imm::grow_pair(0xdead_beef, 0x0140)[0].encode(), 0xc401_dead);
        assert_eq!(Imm::grow_pair(0xdead_beef, 0x0140)[1].encode(), 0xc540_beef);
        assert_eq!(Imm::Switched.encode(), 0xc600_0000);
    }

    #[test]
    fn imm_round_trip_and_rejects() {
        for imm in [
            Imm::Data { len: 77 },
            Imm::Credit { wrs: 3, bytes: 5 },
            Imm::Credit {
                wrs: 1023,
                bytes: 0,
            },
            Imm::Fin,
            Imm::Reset,
            Imm::Migrate { port: 1 },
            Imm::Migrate { port: u16::MAX },
            Imm::GrowHi {
                rkey_hi: 0,
                pages_hi: 0,
            },
            Imm::Grow {
                rkey_lo: u16::MAX,
                pages_lo: u8::MAX,
            },
            Imm::Switched,
        ] {
            assert_eq!(Imm::decode(imm.encode()), Ok(imm));
        }
        assert_eq!(Imm::decode(0), Err(ImmError::EmptyData));
        assert_eq!(Imm::decode(0x8000_0000), Err(ImmError::EmptyCredit));
        assert_eq!(Imm::decode(0xc000_0000), Err(ImmError::UnknownOp(0)));
        assert_eq!(Imm::decode(0xff00_0000), Err(ImmError::UnknownOp(0x3f)));
        for bad in [
            0xc100_0001,
            0xc200_0100,
            0xc300_0000,
            0xc301_0001,
            0xc600_0001,
        ] {
            assert_eq!(Imm::decode(bad), Err(ImmError::ReservedBits(bad)));
        }
    }
}
