//! The control messages between processes (docs/DESIGN.md, "Processes"): one request, one
//! reply, each a fixed-size `SOCK_SEQPACKET` message that may carry one fd. Typed on both
//! sides; the byte layout is docs/PROTOCOL.md §13 (golden bytes in the tests below). A
//! message with a non-zero reserved byte, an unknown kind, a wrong length or an out-of-range
//! field is refused as a whole, so whatever decodes re-encodes to the same bytes.

use super::Owner;
use crate::sys::sockaddr;
use libc::c_int;
use std::net::SocketAddr;

/// The first bytes of every message.
pub const MAGIC: [u8; 4] = *b"RSCK";
/// The layout described above.
pub const VERSION: u8 = 1;
/// Encoded size of a [`Request`].
pub const REQUEST_LEN: usize = 40;
/// Encoded size of a [`Reply`].
pub const REPLY_LEN: usize = 104;
/// Buffer sizes a reply may name (the configuration's own bounds).
const MIN_BUF: u32 = 4096;
const MAX_BUF: u32 = 1 << 30;

/// A request to the owner of a stream or listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// Relay the stream over a fresh socketpair; reply [`Reply::Relay`].
    Relay { token: u64 },
    /// The listener's next connection; reply [`Reply::Tcp`], [`Reply::Relay`], or — when
    /// `taker` names the caller's engine — [`Reply::Stream`] for it to take over.
    Accept { token: u64, taker: Option<Owner> },
    /// Start handing the stream to `taker`, whose rdma_cm listener is on `port`; reply
    /// [`Reply::Doorbell`].
    Take { token: u64, port: u16, taker: Owner },
    /// Finish the hand-over at the peer's resume point; reply [`Reply::State`].
    Export {
        token: u64,
        resume_at: u64,
        taker: Owner,
    },
    /// The stream's facts, for a process that received its A with `SCM_RIGHTS`; reply
    /// [`Reply::Described`].
    Describe { token: u64 },
    /// "Take back the stream you handed to me, `taker`, and relay it to me": the caller is
    /// about to change its credentials, after which it could not drive the queue pair;
    /// reply [`Reply::Relay`]. `exiting`: the caller is exiting — take it back, relay
    /// nothing, and only if your program still holds it; reply [`Reply::Done`].
    Reclaim {
        token: u64,
        taker: Owner,
        exiting: bool,
    },
    /// "Send the clients that follow redirects to my branch of the listener: my rdma_cm
    /// listener on `port`, named `id` (48 bits) in their hellos"; `port` 0 withdraws the
    /// branch `id`. Reply [`Reply::Done`].
    Branch {
        token: u64,
        port: u16,
        id: u64,
        taker: Owner,
    },
}

/// The connection a reply describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ends {
    pub local: SocketAddr,
    pub peer: SocketAddr,
}

/// An owner's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    /// Refused, with an errno (EAGAIN: no connection waiting).
    Failed(c_int),
    /// The stream has a new owner: ask there.
    Moved(Owner),
    /// The fd is one end of a relay of the stream.
    Relay(Ends),
    /// The fd is a kernel TCP connection (addresses as far as the kernel gave them).
    Tcp {
        local: Option<SocketAddr>,
        peer: Option<SocketAddr>,
    },
    /// The fd is the doorbell's B; the hand-over has begun.
    Doorbell {
        conn_id: u64,
        sizes: u64,
        ends: Ends,
    },
    /// The fd is a memfd with the hand-over's state.
    State,
    /// The fd is a stream's doorbell A, for the caller to take over from `owner`.
    Stream {
        token: u64,
        owner: Owner,
        sizes: u64,
        ends: Ends,
    },
    /// Done, nothing to say (a [`Request::Branch`]).
    Done,
    /// What [`Reply::Stream`] says, without an fd: the caller has A already.
    Described {
        token: u64,
        owner: Owner,
        sizes: u64,
        ends: Ends,
    },
    /// [`Request::Describe`] of a listener: the fd is its kernel listening socket, bound to
    /// `local`; the caller (holding the listener's A) accepts through `owner`.
    Listening {
        token: u64,
        owner: Owner,
        sizes: u64,
        local: SocketAddr,
    },
}

/// Why bytes are not a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadMsg {
    Length,
    Magic,
    Version,
    Kind,
    Reserved,
    Field,
}

impl Request {
    /// The stream's or listener's token.
    pub fn token(&self) -> u64 {
        match *self {
            Request::Relay { token }
            | Request::Accept { token, .. }
            | Request::Take { token, .. }
            | Request::Export { token, .. }
            | Request::Describe { token }
            | Request::Reclaim { token, .. }
            | Request::Branch { token, .. } => token,
        }
    }

    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        let (op, arg, caller) = match *self {
            Request::Relay { .. } => (1, 0, None),
            Request::Accept { taker, .. } => (2, 0, taker),
            Request::Take { port, taker, .. } => (3, u64::from(port), Some(taker)),
            Request::Export {
                resume_at, taker, ..
            } => (4, resume_at, Some(taker)),
            Request::Describe { .. } => (5, 0, None),
            Request::Reclaim { taker, exiting, .. } => (6, u64::from(exiting), Some(taker)),
            Request::Branch {
                port, id, taker, ..
            } => (
                7,
                u64::from(port) | (id & BRANCH_ID_MASK) << 16,
                Some(taker),
            ),
        };
        header(&mut b, op);
        b[8..16].copy_from_slice(&self.token().to_le_bytes());
        b[16..24].copy_from_slice(&arg.to_le_bytes());
        put_owner(&mut b[24..40], caller);
        b
    }

    pub fn decode(b: &[u8]) -> Result<Request, BadMsg> {
        let op = check_header(b, REQUEST_LEN)?;
        zeros(b, &[6..8, 28..32])?;
        let token = u64_at(b, 8);
        let arg = u64_at(b, 16);
        let caller = get_owner(&b[24..40])?;
        let needs = |o: Option<Owner>| o.ok_or(BadMsg::Field);
        let r = match op {
            1 if arg == 0 && caller.is_none() => Request::Relay { token },
            5 if arg == 0 && caller.is_none() => Request::Describe { token },
            2 if arg == 0 => Request::Accept {
                token,
                taker: caller,
            },
            3 => Request::Take {
                token,
                port: u16::try_from(arg)
                    .ok()
                    .filter(|&p| p != 0)
                    .ok_or(BadMsg::Field)?,
                taker: needs(caller)?,
            },
            6 if arg <= 1 => Request::Reclaim {
                token,
                taker: needs(caller)?,
                exiting: arg == 1,
            },
            4 => Request::Export {
                token,
                resume_at: arg,
                taker: needs(caller)?,
            },
            7 => Request::Branch {
                token,
                port: arg as u16,
                id: arg >> 16,
                taker: needs(caller)?,
            },
            1 | 2 | 5 | 6 => return Err(BadMsg::Field),
            _ => return Err(BadMsg::Kind),
        };
        Ok(r)
    }
}

impl Reply {
    /// Whether an fd travels with this reply.
    pub fn carries_fd(&self) -> bool {
        !matches!(
            self,
            Reply::Failed(_) | Reply::Moved(_) | Reply::Described { .. } | Reply::Done
        )
    }

    pub fn encode(&self) -> [u8; REPLY_LEN] {
        let mut b = [0u8; REPLY_LEN];
        let put_ends = |b: &mut [u8; REPLY_LEN], l: Option<&SocketAddr>, p| {
            put_addr(&mut b[48..76], l);
            put_addr(&mut b[76..104], p);
        };
        let kind = match self {
            Reply::Failed(e) => {
                b[8..12].copy_from_slice(&e.to_le_bytes());
                0
            }
            Reply::Relay(e) => {
                put_ends(&mut b, Some(&e.local), Some(&e.peer));
                1
            }
            Reply::Tcp { local, peer } => {
                put_ends(&mut b, local.as_ref(), peer.as_ref());
                2
            }
            Reply::Doorbell {
                conn_id,
                sizes,
                ends,
            } => {
                b[16..24].copy_from_slice(&conn_id.to_le_bytes());
                b[24..32].copy_from_slice(&sizes.to_le_bytes());
                put_ends(&mut b, Some(&ends.local), Some(&ends.peer));
                3
            }
            Reply::State => 4,
            Reply::Done => 9,
            Reply::Stream {
                token,
                owner,
                sizes,
                ends,
            }
            | Reply::Described {
                token,
                owner,
                sizes,
                ends,
            } => {
                b[16..24].copy_from_slice(&token.to_le_bytes());
                b[24..32].copy_from_slice(&sizes.to_le_bytes());
                put_owner(&mut b[32..48], Some(*owner));
                put_ends(&mut b, Some(&ends.local), Some(&ends.peer));
                if matches!(self, Reply::Stream { .. }) {
                    5
                } else {
                    7
                }
            }
            Reply::Moved(to) => {
                put_owner(&mut b[32..48], Some(*to));
                6
            }
            Reply::Listening {
                token,
                owner,
                sizes,
                local,
            } => {
                b[16..24].copy_from_slice(&token.to_le_bytes());
                b[24..32].copy_from_slice(&sizes.to_le_bytes());
                put_owner(&mut b[32..48], Some(*owner));
                put_addr(&mut b[48..76], Some(local));
                8
            }
        };
        header(&mut b, kind);
        b
    }

    pub fn decode(b: &[u8]) -> Result<Reply, BadMsg> {
        let kind = check_header(b, REPLY_LEN)?;
        zeros(b, &[6..8, 12..16, 36..40])?;
        let id = u64_at(b, 16);
        let sizes = u64_at(b, 24);
        let owner = get_owner(&b[32..48])?;
        let local = get_addr(&b[48..76])?;
        let peer = get_addr(&b[76..104])?;
        let errno = i32::from_le_bytes([b[8], b[9], b[10], b[11]]);
        // The fields a kind uses, as bits of FIELDS: the others must be zero.
        let none_but = |used: u8| {
            let unused: Vec<_> = (0..FIELDS.len())
                .filter(|i| used & (1 << i) == 0)
                .map(|i| FIELDS[i].clone())
                .collect();
            zeros(b, &unused)
        };
        let ends = || match (local, peer) {
            (Some(local), Some(peer)) => Ok(Ends { local, peer }),
            _ => Err(BadMsg::Field),
        };
        let r = match kind {
            0 => {
                none_but(ERRNO)?;
                if !(1..4096).contains(&errno) {
                    return Err(BadMsg::Field);
                }
                Reply::Failed(errno)
            }
            1 => {
                none_but(ENDS)?;
                Reply::Relay(ends()?)
            }
            2 => {
                none_but(ENDS)?;
                Reply::Tcp { local, peer }
            }
            3 => {
                none_but(ID | SIZES | ENDS)?;
                Reply::Doorbell {
                    conn_id: id,
                    sizes: check_sizes(sizes)?,
                    ends: ends()?,
                }
            }
            4 => {
                none_but(0)?;
                Reply::State
            }
            5 | 7 => {
                none_but(ID | SIZES | OWNER | ENDS)?;
                let (token, owner) = (id, owner.ok_or(BadMsg::Field)?);
                let (sizes, ends) = (check_sizes(sizes)?, ends()?);
                if kind == 5 {
                    Reply::Stream {
                        token,
                        owner,
                        sizes,
                        ends,
                    }
                } else {
                    Reply::Described {
                        token,
                        owner,
                        sizes,
                        ends,
                    }
                }
            }
            9 => {
                none_but(0)?;
                Reply::Done
            }
            6 => {
                none_but(OWNER)?;
                Reply::Moved(owner.ok_or(BadMsg::Field)?)
            }
            8 => {
                none_but(ID | SIZES | OWNER | LOCAL)?;
                Reply::Listening {
                    token: id,
                    owner: owner.ok_or(BadMsg::Field)?,
                    sizes: check_sizes(sizes)?,
                    local: local.ok_or(BadMsg::Field)?,
                }
            }
            _ => return Err(BadMsg::Kind),
        };
        Ok(r)
    }
}

/// The bits of a branch id ([`Request::Branch`]): the request's argument holds the port too.
pub const BRANCH_ID_MASK: u64 = (1 << 48) - 1;

/// A reply's fields after the header, and their bits for `none_but` in [`Reply::decode`].
const FIELDS: [std::ops::Range<usize>; 6] = [8..12, 16..24, 24..32, 32..48, 48..76, 76..104];
const ERRNO: u8 = 1;
const ID: u8 = 2;
const SIZES: u8 = 4;
const OWNER: u8 = 8;
const LOCAL: u8 = 16;
const ENDS: u8 = LOCAL | 32;

/// Ring and send buffer sizes packed as `BufSizes::packed` does, each within the bounds a
/// configuration can give.
fn check_sizes(v: u64) -> Result<u64, BadMsg> {
    let ok = |s: u32| (MIN_BUF..=MAX_BUF).contains(&s);
    if ok((v >> 32) as u32) && ok(v as u32) {
        Ok(v)
    } else {
        Err(BadMsg::Field)
    }
}

fn header(b: &mut [u8], kind: u8) {
    b[0..4].copy_from_slice(&MAGIC);
    b[4] = VERSION;
    b[5] = kind;
}

fn check_header(b: &[u8], len: usize) -> Result<u8, BadMsg> {
    if b.len() != len {
        return Err(BadMsg::Length);
    }
    if b[0..4] != MAGIC {
        return Err(BadMsg::Magic);
    }
    if b[4] != VERSION {
        return Err(BadMsg::Version);
    }
    Ok(b[5])
}

fn zeros(b: &[u8], ranges: &[std::ops::Range<usize>]) -> Result<(), BadMsg> {
    for r in ranges {
        if b[r.clone()].iter().any(|&x| x != 0) {
            return Err(BadMsg::Reserved);
        }
    }
    Ok(())
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(x)
}

/// An owner in 16 bytes: pid (4), 4 zero, nonce (8); all zero is none.
fn put_owner(out: &mut [u8], o: Option<Owner>) {
    if let Some(o) = o {
        out[0..4].copy_from_slice(&o.pid.to_le_bytes());
        out[8..16].copy_from_slice(&o.nonce.to_le_bytes());
    }
}

/// An owner field: all zero is none; otherwise the pid must be a pid.
fn get_owner(b: &[u8]) -> Result<Option<Owner>, BadMsg> {
    let pid = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let nonce = u64_at(b, 8);
    match (pid, nonce) {
        (0, 0) => Ok(None),
        (p, _) if p > 0 => Ok(Some(Owner { pid, nonce })),
        _ => Err(BadMsg::Field),
    }
}

fn put_addr(out: &mut [u8], a: Option<&SocketAddr>) {
    if let Some(a) = a {
        let (bytes, len) = sockaddr::encode(a);
        out[..len as usize].copy_from_slice(&bytes[..len as usize]);
    }
}

/// An address field: all zero is none; anything else must be a whole sockaddr_in/in6.
fn get_addr(b: &[u8]) -> Result<Option<SocketAddr>, BadMsg> {
    if b.iter().all(|&x| x == 0) {
        return Ok(None);
    }
    let mut raw = [0u8; 28];
    raw.copy_from_slice(b);
    // SAFETY: a 28-byte buffer holds a sockaddr_in or sockaddr_in6.
    let a = unsafe { sockaddr::read(raw.as_ptr().cast(), 28) }.ok_or(BadMsg::Field)?;
    // Re-encoding must give the same bytes: no stray bytes after a sockaddr_in.
    let mut again = [0u8; 28];
    put_addr(&mut again, Some(&a));
    if again == raw {
        Ok(Some(a))
    } else {
        Err(BadMsg::Field)
    }
}

#[cfg(test)]
mod tests;
