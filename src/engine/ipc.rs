//! Requests between processes that share an inherited socket (docs/DESIGN.md, "Processes").
//!
//! Every engine listens on an abstract `SOCK_SEQPACKET` address named after its [`Owner`]
//! (pid and a random nonce, so a reused pid never answers for a dead owner). Another process
//! of the same user that holds one of its sockets — a fork child, or a program exec'd by one —
//! asks it for what only the owner can do, in one request and one reply that may carry an fd:
//!
//! - [`Op::Relay`]: "serve this stream to me": the owner relays it over a fresh socketpair and
//!   sends one end;
//! - [`Op::Accept`]: "the next connection of this listener": a kernel TCP socket, or an RDMA
//!   stream's relay end, with the connection's addresses;
//! - [`Op::Take`] then [`Op::Export`]: "hand this stream's end of the connection to me"
//!   (`engine/takeover.rs`): the owner sends the peer MIGRATE and passes the doorbell's B,
//!   then, once the peer's resume reached the caller, the stream's state and bytes.
//!
//! An owner that handed a stream over answers requests for it with [`MOVED`] and the new
//! owner in the reply's `owner` field: the caller asks there.
//!
//! The helper thread serves requests one at a time; callers wait at most [`CALL_TIMEOUT`].

use crate::sys::unix;
use libc::c_int;
use std::net::SocketAddr;
use std::time::Duration;

/// How long a caller waits for the owner's reply.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The process that owns an RDMA object, and where it takes requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    /// Its process id.
    pub pid: i32,
    /// Random per engine: tells this owner from a later process with the same pid.
    pub nonce: u64,
}

impl Owner {
    /// The abstract socket name the owner listens on.
    pub fn name(&self) -> Vec<u8> {
        format!("rsock.{}.{:016x}", self.pid, self.nonce).into_bytes()
    }

    /// Whether the calling process is this owner.
    pub fn is_me(&self) -> bool {
        self.pid == crate::sys::raw::pid()
    }
}

/// What a request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Op {
    /// Relay the stream with this token to the caller.
    Relay = 1,
    /// Hand the caller the next connection of the listener with this token.
    Accept = 2,
    /// Start handing the stream over to the caller, whose rdma_cm listener is on port `arg`
    /// and whose engine is `owner`: the reply carries the doorbell's B and, in `token`, the
    /// connection id.
    Take = 3,
    /// Finish the hand-over once the stream has received up to position `arg` (the peer's
    /// resume point): the reply carries a memfd with the state and the bytes.
    Export = 4,
}

/// Reply status: the stream has a new owner (in the reply's `owner`), ask there.
pub const MOVED: i32 = -1;

/// What the fd attached to a successful reply is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Carried {
    /// One end of a relay of an RDMA stream (an `AF_UNIX` stream socket).
    Relay = 1,
    /// A kernel TCP socket.
    Tcp = 2,
    /// The doorbell's B ([`Op::Take`]).
    Doorbell = 3,
    /// A memfd with a hand-over's state ([`Op::Export`]).
    State = 4,
    /// A stream's doorbell A, for a prefork worker to take the stream over ([`Op::Accept`]
    /// with the caller's `owner` set): `token`, `owner` and, in `arg`, the ring and send
    /// buffer sizes (high and low 32 bits) describe it.
    Stream = 5,
}

/// One request or reply (fixed layout, native endianness: both ends are one host).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Msg {
    /// Request: an [`Op`]; reply: a [`Carried`] when `status` is 0.
    pub kind: u32,
    /// Reply: 0, or the errno of the failure (EAGAIN: no connection waiting).
    pub status: i32,
    /// The stream's or listener's token in the owner's engine.
    pub token: u64,
    /// The operation's argument (see [`Op`]).
    pub arg: u64,
    /// Request: the caller's engine (zero if it has none); [`MOVED`] reply: the new owner.
    pub owner: Owner,
    /// Reply: the connection's addresses (raw sockaddr, zero-padded).
    pub local: [u8; 28],
    /// See `local`.
    pub peer: [u8; 28],
}

/// Encoded size of a [`Msg`].
pub const MSG_LEN: usize = 96;

const NO_OWNER: Owner = Owner { pid: 0, nonce: 0 };

impl Msg {
    /// A request.
    pub fn request(op: Op, token: u64) -> Msg {
        Msg {
            kind: op as u32,
            token,
            ..Msg::error(0)
        }
    }

    /// A failed reply.
    pub fn error(errno: c_int) -> Msg {
        Msg {
            kind: 0,
            status: errno,
            token: 0,
            arg: 0,
            owner: NO_OWNER,
            local: [0; 28],
            peer: [0; 28],
        }
    }

    /// The reply for a stream handed over to `to`.
    pub fn moved(to: Owner) -> Msg {
        Msg {
            owner: to,
            ..Msg::error(MOVED)
        }
    }

    /// A successful reply carrying an fd of kind `what` for the connection `local`–`peer`.
    pub fn carrying(what: Carried, local: Option<&SocketAddr>, peer: Option<&SocketAddr>) -> Msg {
        let raw = |a: Option<&SocketAddr>| {
            let mut b = [0u8; 28];
            if let Some(a) = a {
                let (bytes, len) = crate::sys::sockaddr::encode(a);
                b[..len as usize].copy_from_slice(&bytes[..len as usize]);
            }
            b
        };
        Msg {
            kind: what as u32,
            local: raw(local),
            peer: raw(peer),
            ..Msg::error(0)
        }
    }

    /// Wire bytes.
    pub fn to_bytes(&self) -> [u8; MSG_LEN] {
        let mut b = [0u8; MSG_LEN];
        b[0..4].copy_from_slice(&self.kind.to_ne_bytes());
        b[4..8].copy_from_slice(&self.status.to_ne_bytes());
        b[8..16].copy_from_slice(&self.token.to_ne_bytes());
        b[16..24].copy_from_slice(&self.arg.to_ne_bytes());
        b[24..28].copy_from_slice(&self.owner.pid.to_ne_bytes());
        b[32..40].copy_from_slice(&self.owner.nonce.to_ne_bytes());
        b[40..68].copy_from_slice(&self.local);
        b[68..96].copy_from_slice(&self.peer);
        b
    }

    /// Parses wire bytes; `None` unless exactly one message.
    pub fn parse(b: &[u8]) -> Option<Msg> {
        if b.len() != MSG_LEN {
            return None;
        }
        let u32_at = |o: usize| u32::from_ne_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[o..o + 8]);
            u64::from_ne_bytes(x)
        };
        let mut local = [0u8; 28];
        local.copy_from_slice(&b[40..68]);
        let mut peer = [0u8; 28];
        peer.copy_from_slice(&b[68..96]);
        Some(Msg {
            kind: u32_at(0),
            status: u32_at(4) as i32,
            token: u64_at(8),
            arg: u64_at(16),
            owner: Owner {
                pid: u32_at(24) as i32,
                nonce: u64_at(32),
            },
            local,
            peer,
        })
    }

    /// The request's operation.
    pub fn op(&self) -> Option<Op> {
        match self.kind {
            1 => Some(Op::Relay),
            2 => Some(Op::Accept),
            3 => Some(Op::Take),
            4 => Some(Op::Export),
            _ => None,
        }
    }

    /// The reply's carried kind.
    pub fn carried(&self) -> Option<Carried> {
        match self.kind {
            1 => Some(Carried::Relay),
            2 => Some(Carried::Tcp),
            3 => Some(Carried::Doorbell),
            4 => Some(Carried::State),
            5 => Some(Carried::Stream),
            _ => None,
        }
    }

    /// The address in `raw`, if any.
    pub fn addr(raw: &[u8; 28]) -> Option<SocketAddr> {
        // SAFETY: a 28-byte buffer holds a sockaddr_in or sockaddr_in6 (or zeros: None).
        unsafe { crate::sys::sockaddr::read(raw.as_ptr().cast(), 28) }
    }
}

/// Asks `owner` for `op` on `token`. Ok: the reply and the fd it carried. Err: an errno —
/// ECONNREFUSED/ENOENT when the owner is gone, the owner's answer otherwise ([`MOVED`] when
/// the stream has a new owner: see [`ask`]).
pub fn call(owner: &Owner, op: Op, token: u64) -> Result<(Msg, Option<c_int>), c_int> {
    ask(owner, &Msg::request(op, token)).map_err(|(e, _)| e)
}

/// As [`call`] with a whole request; an error comes with the owner's reply when there was
/// one (a [`MOVED`] reply names the new owner).
pub fn ask(owner: &Owner, req: &Msg) -> Result<(Msg, Option<c_int>), (c_int, Option<Msg>)> {
    let fd = unix::connect_abstract(&owner.name(), CALL_TIMEOUT)
        .map_err(|e| (e.raw_os_error().unwrap_or(libc::EIO), None))?;
    let result = (|| {
        let os = |e: std::io::Error| (e.raw_os_error().unwrap_or(libc::EIO), None);
        unix::send(fd, &req.to_bytes(), None).map_err(os)?;
        let mut buf = [0u8; MSG_LEN + 1];
        let (n, got) = unix::recv(fd, &mut buf).map_err(|e| match e.raw_os_error() {
            Some(libc::EAGAIN) => (libc::ETIMEDOUT, None), // the receive timeout, not the owner's EAGAIN
            other => (other.unwrap_or(libc::EIO), None),
        })?;
        match Msg::parse(&buf[..n]) {
            Some(m) if m.status == 0 && got.is_some() => Ok((m, got)),
            other => {
                if let Some(g) = got {
                    crate::sys::raw::close(g);
                }
                let errno = other.map_or(libc::EPROTO, |m| {
                    if m.status != 0 {
                        m.status
                    } else {
                        libc::EPROTO
                    }
                });
                Err((errno, other))
            }
        }
    })();
    crate::sys::raw::close(fd);
    result
}

/// Owner side: takes one request from the listening socket `lfd`, answers it with `serve`,
/// and hangs up. Requests from another user are refused.
pub fn serve_one(lfd: c_int, serve: impl FnOnce(&Msg) -> (Msg, Option<c_int>)) -> bool {
    let Some(c) = unix::accept(lfd) else {
        return false;
    };
    let mut buf = [0u8; MSG_LEN + 1];
    // The caller sends its request right after connecting: wait briefly, never block the helper.
    let req = (unix::wait(c, libc::POLLIN, 1000) & libc::POLLIN != 0)
        .then(|| unix::recv(c, &mut buf).ok())
        .flatten()
        .and_then(|(n, fd)| {
            if let Some(fd) = fd {
                crate::sys::raw::close(fd); // requests carry no fd
            }
            Msg::parse(&buf[..n])
        });
    // SAFETY: geteuid cannot fail.
    let same_user = unix::peer_uid(c) == Some(unsafe { libc::geteuid() });
    let (reply, fd) = match req {
        Some(_) if !same_user => (Msg::error(libc::EPERM), None),
        Some(m) => serve(&m),
        None => (Msg::error(libc::EPROTO), None),
    };
    if let Err(e) = unix::send(c, &reply.to_bytes(), fd) {
        log::warn!("ipc: reply not sent: {e}");
    }
    if let Some(fd) = fd {
        crate::sys::raw::close(fd); // the caller has its own copy now
    }
    crate::sys::raw::close(c);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        let a: SocketAddr = "10.1.2.3:4567".parse().unwrap();
        let b: SocketAddr = "[fe80::1]:80".parse().unwrap();
        let m = Msg::carrying(Carried::Relay, Some(&a), Some(&b));
        let p = Msg::parse(&m.to_bytes()).unwrap();
        assert_eq!(p, m);
        assert_eq!(p.carried(), Some(Carried::Relay));
        assert_eq!(Msg::addr(&p.local), Some(a));
        assert_eq!(Msg::addr(&p.peer), Some(b));
        let r = Msg::request(Op::Accept, 0xdead_beef_0000_0001);
        assert_eq!(Msg::parse(&r.to_bytes()).unwrap().op(), Some(Op::Accept));
        assert_eq!(Msg::parse(&r.to_bytes()[..MSG_LEN - 1]), None);
        let to = Owner { pid: 77, nonce: 9 };
        let mut t = Msg::request(Op::Take, 5);
        (t.arg, t.owner) = (4791, to);
        assert_eq!(Msg::parse(&t.to_bytes()), Some(t));
        assert_eq!(Msg::parse(&Msg::moved(to).to_bytes()).unwrap().owner, to);
        assert_eq!(Msg::addr(&[0; 28]), None);
    }

    #[test]
    fn a_call_gets_the_owners_answer_and_fd() {
        let owner = Owner {
            pid: std::process::id() as i32,
            nonce: unix::random_u64(),
        };
        let lfd = unix::listen_abstract(&owner.name()).unwrap();
        let server = std::thread::spawn(move || {
            assert!(unix::wait(lfd, libc::POLLIN, 5000) & libc::POLLIN != 0);
            serve_one(lfd, |m| {
                assert_eq!(m.op(), Some(Op::Relay));
                assert_eq!(m.token, 42);
                let (a, b) = unix::stream_pair().unwrap();
                crate::sys::raw::close(b);
                (Msg::carrying(Carried::Relay, None, None), Some(a))
            });
            lfd
        });
        let (m, fd) = call(&owner, Op::Relay, 42).unwrap();
        assert_eq!(m.carried(), Some(Carried::Relay));
        let fd = fd.unwrap();
        // The pair's other end is closed: the fd we got reads end of stream.
        let mut b = [0u8; 1];
        assert_eq!(unsafe { libc::read(fd, b.as_mut_ptr().cast(), 1) }, 0);
        crate::sys::raw::close(fd);
        let lfd = server.join().unwrap();
        crate::sys::raw::close(lfd);
        // Once the owner's socket is gone, callers learn it at once.
        assert_eq!(call(&owner, Op::Relay, 42).unwrap_err(), libc::ECONNREFUSED);
    }
}
