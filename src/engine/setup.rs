//! Building streams: registered memory, the QP and the rsock handshake, for both sides.
//!
//! Active: resolve → register → QP + receives → connect with our Connect hello → the peer's
//! Accept hello in the ESTABLISHED event → protocol state → move the id to the engine's
//! channel. Passive (on the helper thread): validate the client's hello → register → QP +
//! receives → accept with our Accept hello; the stream is queued on its listener when
//! ESTABLISHED arrives. A foreign or incompatible peer is refused: a client gets a reject
//! with our Reject message (or none, for a foreign magic) and the program falls back to TCP.

use super::steps::Steps;
use super::stream::{Parts, Stream, StreamBuf, StreamQp};
use super::{lock, Engine};
use crate::proto::wire::{FLAG_SENT_BACK, FLAG_TAKES_REDIRECT};
use crate::proto::{self, Hello, HelloError, HelloKind, Redirect, Reject, RejectReason};
use crate::rdma::{
    self, Access, CmEvent, ConnParam, Device, EventKind, Pd, QpCaps, Reason, RegBuf,
};
use crate::stats::{Cause, Fallback};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(super) use super::error::cause_of;

/// The cause of a connect answered by `ev` with `reason`.
fn cause_of_event(reason: Fallback, ev: &rdma::CmEvent) -> Cause {
    Cause {
        reason: Some(reason),
        ..cause_of(&ev.to_error("rdma_connect"))
    }
}

/// The connection's own PD, its registered ring and send buffer, and the protocol config
/// that describes them.
pub(super) struct Memory {
    pub pd: Arc<Pd>,
    pub ring: RegBuf,
    pub send: RegBuf,
    pub cfg: proto::Params,
}

/// The copy of the program's socket a connect keeps for its options, and what the shim
/// knows of the socket without asking the kernel.
#[derive(Clone, Copy, Debug)]
pub struct OptsSocket {
    pub fd: libc::c_int,
    /// The program did not bind it.
    pub unbound: bool,
    /// It holds the system's defaults for every option a stream mirrors.
    pub default_opts: bool,
}

impl OptsSocket {
    /// The address the program bound the socket to, if any.
    pub(super) fn bound(&self) -> Option<SocketAddr> {
        if self.unbound {
            None
        } else {
            bound_addr(self.fd)
        }
    }
}

/// A connection's buffer sizes in bytes (`RSOCK_RING_SIZE`/`RSOCK_SEND_BUF`, or a rule's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufSizes {
    /// The receive ring.
    pub ring: u32,
    /// The registered send buffer.
    pub send: u32,
}

impl BufSizes {
    /// What a connection growing to these sizes starts with (`RSOCK_BUF_START`).
    pub fn start(self, start: u32) -> BufSizes {
        BufSizes {
            ring: self.ring.min(start),
            send: self.send.min(start),
        }
    }

    /// Ring and send sizes as one word (ring in the high half): one atomic, or one ipc
    /// argument.
    pub fn packed(self) -> u64 {
        u64::from(self.ring) << 32 | u64::from(self.send)
    }

    /// The inverse of [`packed`](Self::packed).
    pub fn unpack(v: u64) -> BufSizes {
        BufSizes {
            ring: (v >> 32) as u32,
            send: v as u32,
        }
    }

    /// Whole pages: a registration of another size would not match its buffer.
    fn pages(self) -> BufSizes {
        BufSizes {
            ring: self.ring.div_ceil(4096) * 4096,
            send: self.send.div_ceil(4096) * 4096,
        }
    }
}

/// Registered memory for a connection that starts with `start` and may grow to `full`.
pub(super) fn memory(
    engine: &Engine,
    dev: &Arc<Device>,
    start: BufSizes,
    full: BufSizes,
) -> Result<Memory, rdma::Error> {
    let c = engine.cfg;
    let (start, full) = (start.pages(), full.pages());
    let (ring_size, send_size) = (start.ring, start.send);
    let (pd, ring, send) = match rdma::pool::take(dev, ring_size as usize, send_size as usize) {
        Some(reused) => reused,
        None => {
            let pd = Pd::new(dev)?;
            let reg = |len: u32, access| {
                RegBuf::new(&pd, len as usize, access).or_else(|e| {
                    // Kept memory of other sizes may be what stands in the way.
                    rdma::pool::clear();
                    RegBuf::new(&pd, len as usize, access).map_err(|_| e)
                })
            };
            let ring = reg(ring_size, Access::RemoteWrite)?;
            let send = reg(send_size, Access::LocalRead)?;
            (pd, ring, send)
        }
    };
    let cfg = proto::Params {
        ring_size,
        recv_credits: c.recv_credits,
        send_buf_size: send_size,
        send_queue_depth: proto::DEFAULT_SEND_QUEUE_DEPTH,
        max_inline: c.max_inline,
        ring_grow_to: full.ring,
        send_grow_to: full.send,
    };
    Ok(Memory {
        pd,
        ring,
        send,
        cfg,
    })
}

/// The QP for `id`, with receives posted for every credit we will announce.
fn queue_pair(id: rdma::CmId, m: &mut Memory) -> Result<rdma::RcQp, rdma::Error> {
    let mut rc = rdma::RcQp::new(id, &m.pd, qp_caps(m)).map_err(|(e, _id)| e)?;
    fit_and_post(&mut rc, m)?;
    Ok(rc)
}

/// The queues a connection with memory `m` asks for: the protocol's send queue and one
/// slot for a keepalive probe, which the protocol does not account.
pub(super) fn qp_caps(m: &Memory) -> QpCaps {
    QpCaps {
        max_send_wr: m.cfg.send_queue_depth + 1,
        max_recv_wr: m.cfg.recv_credits,
        max_send_sge: 1,
        max_inline_data: m.cfg.max_inline,
    }
}

/// Fits the protocol to the queues the device granted and posts the receives for every
/// credit we will announce.
pub(super) fn fit_and_post(rc: &mut rdma::RcQp, m: &mut Memory) -> Result<(), rdma::Error> {
    let caps = rc.caps();
    // The protocol may use only what the device granted.
    m.cfg.send_queue_depth = caps
        .max_send_wr
        .saturating_sub(1)
        .max(1)
        .min(m.cfg.send_queue_depth);
    m.cfg.max_inline = caps.max_inline_data.min(m.cfg.max_inline);
    rc.post_recvs(0, m.cfg.recv_credits)
}

/// The connect hello of an attempt through `via`.
fn connect_hello(m: &Memory, via: Via, conn_id: u64) -> [u8; Hello::RESUME_LEN] {
    let r = m.ring.mr();
    let mut h = m
        .cfg
        .hello(HelloKind::Connect, r.iova(), r.rkey().unwrap_or(0), conn_id);
    match via {
        Via::Dest { follow, sent_back } => {
            if follow {
                h.flags |= FLAG_TAKES_REDIRECT;
            }
            if sent_back.is_some() {
                h.flags |= FLAG_SENT_BACK;
                h.branch = sent_back;
            }
        }
        Via::Branch(r) => {
            h.kind = HelloKind::Branch;
            h.branch = Some(r.branch);
        }
    }
    h.to_bytes()
}

pub(super) fn hello(m: &Memory, kind: HelloKind, conn_id: u64) -> [u8; Hello::RESUME_LEN] {
    let r = m.ring.mr();
    m.cfg
        .hello(kind, r.iova(), r.rkey().unwrap_or(0), conn_id)
        .to_bytes()
}

/// The private data of a reject for want of resources here (memlock, CQ entries, QPs, an
/// event channel): it says nothing against the listener, so the client falls back at once
/// without remembering this server as one that cannot do RDMA.
pub fn no_room() -> [u8; Reject::LEN] {
    Reject::new(RejectReason::NoResources).to_bytes()
}

/// An unconnected kernel TCP socket of `peer`'s family (an AF_INET6 one for a mapped
/// peer, as the listener's): holds the program's socket options.
pub fn opts_socket(peer: &SocketAddr) -> libc::c_int {
    let family = if peer.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain socket(2) through the real function.
    crate::sys::raw::hide(unsafe {
        crate::sys::real::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0)
    })
}

/// Where one attempt of a connect goes.
#[derive(Clone, Copy, Debug)]
enum Via {
    /// To the destination itself; `follow`: the hello says we follow a redirect;
    /// `sent_back`: the branch that did not take this connect, which the hello names.
    Dest {
        follow: bool,
        sent_back: Option<u64>,
    },
    /// To a branch of the destination's listener (PROTOCOL.md §15).
    Branch(Redirect),
}

/// How an attempt failed.
enum Tried {
    /// The destination's owner sent us to a branch.
    Redirected(Redirect),
    Failed(Cause),
}

/// Connects to `dest` over RDMA within the configured time, or says why not.
/// `opts` is a copy of the program's socket (kept for its options).
///
/// A listener that other processes accept from may send the connect to one of them (a
/// branch, PROTOCOL.md §15): the connect goes there, and later connects to `dest` go there
/// first. If the branch does not take it, the connect goes to `dest` again, asking not to
/// be redirected and naming the branch (so that the owner sends no one there for a while);
/// `sent_back`: a branch that did not take this connect on a link already.
pub(super) fn connect(
    engine: &'static Engine,
    dest: SocketAddr,
    opts: OptsSocket,
    sizes: BufSizes,
    mut sent_back: Option<u64>,
) -> Result<Arc<Stream>, Cause> {
    let timeout = Duration::from_millis(engine.cfg.connect_timeout_ms as u64);
    let deadline = Instant::now() + timeout;
    let follow = engine.cfg.redirect;
    let to = |via| {
        let by = match via {
            Via::Branch(_) => branch_deadline(deadline),
            Via::Dest { .. } => deadline,
        };
        attempt(engine, dest, opts, sizes, via, by)
    };
    let hint = (follow && sent_back.is_none()).then(|| engine.redirect_hint(dest));
    if let Some(r) = hint.flatten() {
        match to(Via::Branch(r)) {
            Ok(s) => {
                crate::stats::count_branch(false);
                return Ok(s);
            }
            Err(_) => {
                engine.forget_redirect(dest);
                sent_back = Some(r.branch);
            }
        }
    }
    match to(Via::Dest { follow, sent_back }) {
        Ok(s) => Ok(s),
        Err(Tried::Failed(c)) => Err(c),
        Err(Tried::Redirected(r)) => match to(Via::Branch(r)) {
            Ok(s) => {
                engine.remember_redirect(dest, r);
                crate::stats::count_branch(false);
                Ok(s)
            }
            Err(_) => match to(Via::Dest {
                follow: false,
                sent_back: Some(r.branch),
            }) {
                Ok(s) => Ok(s),
                Err(Tried::Failed(c)) => Err(c),
                Err(Tried::Redirected(_)) => Err(Fallback::BadHandshake.into()),
            },
        },
    }
}

/// How long a connect waits for a branch: half of the time left, so that the owner can
/// still be asked when the branch does not answer (its process stopped, or its helper held
/// up).
pub(super) fn branch_deadline(deadline: Instant) -> Instant {
    let now = Instant::now();
    now + deadline.saturating_duration_since(now) / 2
}

/// One connect of [`connect`], through `via`, by `deadline`.
fn attempt(
    engine: &'static Engine,
    dest: SocketAddr,
    opts: OptsSocket,
    sizes: BufSizes,
    via: Via,
    deadline: Instant,
) -> Result<Arc<Stream>, Tried> {
    let mut steps = Steps::start();
    let timeout = deadline.saturating_duration_since(Instant::now());
    let token = engine.token();
    let target = match via {
        Via::Branch(r) => SocketAddr::new(dest.ip(), r.port),
        Via::Dest { .. } => dest,
    };
    let fail = |e: rdma::Error| {
        log::info!("rdma connect to {target}: {e}");
        Tried::Failed(cause_of(&e))
    };
    // A socket the program bound first keeps its local address (and port, if it chose one).
    let src = opts.bound();
    let (id, dev) = rdma::resolve(src, target, token, timeout).map_err(fail)?;
    steps.mark("resolve");
    let d = engine.dev(&dev).map_err(fail)?;
    let start = sizes.start(engine.cfg.buf_start);
    let mut m = memory(engine, &dev, start, sizes).map_err(fail)?;
    steps.mark("memory");
    let mut rc = queue_pair(id, &mut m).map_err(fail)?;
    steps.mark("qp");
    // The peer may write as soon as it has accepted (a server that speaks first): keep the
    // completions that come before this stream is registered.
    let _early = engine.keep_early(rc.qp_num());
    let bell = super::stream::fresh_bell().map_err(|e| {
        log::info!("rdma connect to {dest}: doorbell: {e}");
        Tried::Failed(Cause::errno(
            Fallback::Resources,
            e.raw_os_error().unwrap_or(0),
        ))
    })?;
    let conn_id = crate::sys::unix::random_u64();
    let ours = connect_hello(&m, via, conn_id);
    rc.connect(&ConnParam {
        private_data: &ours,
        ..ConnParam::default()
    })
    .map_err(fail)?;
    let ch = rc.id().channel().clone();
    let left = deadline.saturating_duration_since(Instant::now());
    let ev = match ch.get_event(Some(left)) {
        Ok(Some(ev)) => ev,
        Ok(None) => {
            log::info!("rdma connect to {target}: no answer in {timeout:?}");
            return Err(Tried::Failed(Cause::errno(
                Fallback::Timeout,
                libc::ETIMEDOUT,
            )));
        }
        Err(e) => return Err(fail(e)),
    };
    steps.mark("handshake");
    if let (Via::Dest { follow: true, .. }, EventKind::Rejected) = (via, ev.kind) {
        if let Some(r) = Redirect::parse(ev.private_data()) {
            log::debug!("rdma connect to {dest}: redirected to port {}", r.port);
            return Err(Tried::Redirected(r));
        }
    }
    let peer = match answer(&ev) {
        Ok(h) => h,
        Err(why) => {
            log::info!("rdma connect to {target}: {why:?} ({})", ev.name());
            return Err(Tried::Failed(cause_of_event(why, &ev)));
        }
    };
    // Both in the program's family (the id was resolved with it): `getsockname` and
    // `getpeername` give them back as the kernel would.
    let local = rc.id().local_addr().unwrap_or(dest);
    let dest = crate::addr::seen(dest, dest.is_ipv6());
    let conn = proto::Conn::new(&m.cfg, &peer).map_err(|e| {
        log::info!("rdma connect to {dest}: peer hello unusable: {e}");
        Tried::Failed(Cause::from(Fallback::BadHandshake))
    })?;
    rc.id_mut().migrate(&engine.ch).map_err(fail)?;
    let parts = Parts {
        rc: StreamQp::Own(rc),
        proto: conn,
        ring: StreamBuf::Own(m.ring),
        send: StreamBuf::Own(m.send),
        local,
        peer: dest,
        opts_fd: opts.fd,
        opts_default: opts.default_opts,
        token,
        conn_id,
        bell: Some(bell),
    };
    let s = Stream::new(parts, d, engine.spin_max(), engine.owner).map_err(|e| {
        log::warn!("rdma connect to {dest}: doorbell: {e}");
        Tried::Failed(Cause::errno(
            Fallback::Resources,
            e.raw_os_error().unwrap_or(0),
        ))
    })?;
    engine.register(&s);
    engine.ensure_helper();
    steps.mark("stream");
    steps.log(format_args!("rdma stream {local} -> {dest}: connected"));
    Ok(s)
}

/// The address `fd` was explicitly bound to, if any.
pub(super) fn bound_addr(fd: libc::c_int) -> Option<SocketAddr> {
    let mut a = [0u8; 28];
    let mut len = a.len() as libc::socklen_t;
    // SAFETY: valid buffer of len bytes.
    let r = unsafe { crate::sys::real::getsockname(fd, a.as_mut_ptr().cast(), &mut len) };
    // SAFETY: the kernel wrote len bytes.
    let addr = if r == 0 {
        unsafe { crate::sys::sockaddr::read(a.as_ptr().cast(), len) }
    } else {
        None
    };
    addr.filter(|a| a.port() != 0 || !a.ip().is_unspecified())
}

/// Reads the server's answer to our connect request.
fn answer(ev: &CmEvent) -> Result<Hello, Fallback> {
    match ev.kind {
        EventKind::Established => {
            Hello::parse_kind(ev.private_data(), HelloKind::Accept).map_err(|e| {
                log::info!("peer accepted with a bad hello: {e}");
                Fallback::BadHandshake
            })
        }
        EventKind::Rejected => match Hello::parse(ev.private_data()) {
            // An rsock peer refused us: it speaks our magic and said why.
            Err(HelloError::Rejected(r)) => {
                log::info!("rsock peer rejected us: {r:?}");
                Err(match r.reason {
                    RejectReason::NoResources => Fallback::Resources,
                    _ => Fallback::BadHandshake,
                })
            }
            // No listener, or a foreign one.
            _ => Err(Fallback::Rejected),
        },
        EventKind::Unreachable
        | EventKind::ConnectError
        | EventKind::AddrError
        | EventKind::RouteError => Err(Fallback::Unreachable),
        _ => Err(Fallback::BadHandshake),
    }
}

/// Refuses a connect request with an rsock "no resources" reject: the client falls back to
/// TCP at once, without remembering this server as one that cannot do RDMA.
pub(super) fn refuse_request(inc: rdma::Incoming, why: &str) {
    let mut id = inc.id;
    log::info!("refusing rdma connection from {:?}: {why}", id.peer_addr());
    let _ = id.reject(&Reject::new(RejectReason::NoResources).to_bytes());
}

/// A connect request on a listener whose accept queue has room for it: accept it as a
/// pending stream with buffers of `sizes`, which `pending` hands to the listener before the
/// stream is registered (its ESTABLISHED event may come at once), or reject it. `branch`:
/// the request came to a branch (its id, and the port its streams show as theirs).
///
/// The stream's writes wait until the connection is established ([`Stream::await_peer`]),
/// so that it can be the program's at once (a branch's accept). Runs on the helper or, at a
/// branch, on the accepting thread: `Engine::accepting` keeps the helper from taking the
/// stream's first cm event for a stranger's.
pub(super) fn accept_request(
    engine: &'static Engine,
    sizes: BufSizes,
    inc: rdma::Incoming,
    branch: Option<(u64, u16)>,
    pending: impl FnOnce(&Arc<Stream>),
) -> Option<Arc<Stream>> {
    let mut steps = Steps::start();
    let rdma::Incoming {
        mut id,
        device,
        event,
    } = inc;
    let from = id.peer_addr();
    let kind = match branch {
        Some(_) => HelloKind::Branch,
        None => HelloKind::Connect,
    };
    let peer = match Hello::parse_kind(event.private_data(), kind) {
        // (A connect to the owner may name the branch that sent it back.)
        Ok(h) if branch.is_none() || h.branch == branch.map(|b| b.0) => h,
        Ok(_) => {
            log::info!("refusing rdma connection from {from:?}: a hello for another branch");
            let _ = id.reject(&Reject::new(RejectReason::BadHello).to_bytes());
            return None;
        }
        Err(e) => {
            log::info!("refusing rdma connection from {from:?}: {e}");
            let data = match e {
                HelloError::BadMagic(_) | HelloError::Truncated { .. } => Vec::new(), // foreign: a plain reject
                e => Reject::new(RejectReason::for_error(&e)).to_bytes().to_vec(),
            };
            let _ = id.reject(&data);
            return None;
        }
    };
    let token = engine.token();
    id.set_token(token);
    // Out of resources here (memlock, CQ entries, QPs) says nothing against the peer's
    // listener: the rsock reject makes the client fall back at once, without remembering
    // this server as one that cannot do RDMA.
    let no_room = no_room();
    let refuse = |e: &rdma::Error| log::warn!("refusing rdma connection from {from:?}: {e}");
    let (d, mut m) = match engine.dev(&device).and_then(|d| {
        let start = sizes.start(engine.cfg.buf_start);
        Ok((d, memory(engine, &device, start, sizes)?))
    }) {
        Ok(x) => x,
        Err(e) => {
            refuse(&e);
            let _ = id.reject(&no_room);
            return None;
        }
    };
    steps.mark("memory");
    let mut rc = match rdma::RcQp::new(id, &m.pd, qp_caps(&m)) {
        Ok(rc) => rc,
        Err((e, mut id)) => {
            refuse(&e);
            let _ = id.reject(&no_room);
            return None;
        }
    };
    // From its move to the engine's channel until the stream is registered (see the doc).
    let accepting = lock(&engine.accepting);
    let built = fit_and_post(&mut rc, &mut m)
        .and_then(|()| rc.id_mut().migrate(&engine.ch))
        .and_then(|()| {
            proto::Conn::new(&m.cfg, &peer)
                .map_err(|_| rdma::Error::new("hello", libc::EPROTO, Reason::BadHandshake))
        });
    let conn = match built {
        Ok(c) => c,
        Err(e) => {
            refuse(&e);
            let _ = rc.reject(&no_room);
            return None;
        }
    };
    steps.mark("qp");
    let conn_id = peer.conn_id;
    let ours = hello(&m, HelloKind::Accept, conn_id);
    // Once accepted the QP can receive — the client may write as soon as it sees the
    // connection established — before this stream is registered: keep what completes.
    let _early = engine.keep_early(rc.qp_num());
    // In the listening socket's family: an IPv4 peer of an AF_INET6 listener is mapped.
    let (local, peer_addr) = (rc.id().local_addr(), rc.id().peer_addr());
    let (Some(mut local), Some(peer_addr)) = (local, peer_addr) else {
        return None;
    };
    if let Some((_, port)) = branch {
        local.set_port(port); // the listener's, as the program knows it
    }
    // The fds the stream needs come before the accept: without them the client falls back.
    let opts_fd = opts_socket(&peer_addr);
    let bell = if opts_fd < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        super::stream::fresh_bell().inspect_err(|_| crate::sys::raw::close(opts_fd))
    };
    let bell = match bell {
        Ok(b) => b,
        Err(e) => {
            log::warn!("refusing rdma connection from {peer_addr}: no fds for the stream: {e}");
            let _ = rc.reject(&no_room);
            return None;
        }
    };
    if let Err(e) = rc.accept(&ConnParam {
        private_data: &ours,
        ..ConnParam::default()
    }) {
        log::warn!("rdma accept from {peer_addr}: {e}");
        // Nobody else holds the copy of the socket made for this stream (the bell closes
        // its own fds on drop).
        crate::sys::raw::close(opts_fd);
        return None;
    }
    steps.mark("accept");
    let parts = Parts {
        rc: StreamQp::Own(rc),
        proto: conn,
        ring: StreamBuf::Own(m.ring),
        send: StreamBuf::Own(m.send),
        local,
        peer: peer_addr,
        opts_fd,
        opts_default: true, // made here; the listener's options come after
        token,
        conn_id,
        bell: Some(bell),
    };
    match Stream::new(parts, d, engine.spin_max(), engine.owner) {
        Ok(s) => {
            s.await_peer();
            pending(&s);
            engine.register(&s);
            drop(accepting);
            steps.mark("stream");
            let (ring, send) = s.sizes();
            steps.log(format_args!(
                "rdma stream {local} <- {peer_addr}: accepted, ring {ring} send buffer {send},"
            ));
            Some(s)
        }
        Err(e) => {
            log::warn!("rdma accept from {peer_addr}: doorbell: {e}");
            crate::sys::raw::close(opts_fd); // the stream that would have owned it was not made
            None
        }
    }
}
