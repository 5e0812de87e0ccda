//! Setting links up (rdma_cm, a hello of kind Link, both ends), and the streams on them:
//! a connector's OPEN and its answer, an acceptor's ACCEPT or REFUSE.

use super::parts::{
    connector_stream, stream_local, stream_params, stream_slots, MAX_STREAMS, STREAM_RECVS,
    STREAM_SENDS,
};
use super::{answer, Link, Opening, Slab, State};
use crate::engine::setup::OptsSocket;
use crate::engine::stream::fresh_bell;
use crate::engine::{lock, Engine, Stream};
use crate::proto::link::imm::StreamId;
use crate::proto::link::Mux;
use crate::proto::wire::{FLAG_LINK_GRANTS, FLAG_LINK_GROW, FLAG_LINK_PORTS, FLAG_TAKES_REDIRECT};
use crate::proto::{self, Conn, Hello, HelloKind, Params, Redirect};
use crate::rdma::{self, Access, ConnParam, EventKind, Pd, QpCaps};
use crate::stats::{Cause, Fallback};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// The link's queues: every stream's share, a probe's slot each, and stream 0's.
const LINK_RQ: u32 = STREAM_RECVS * (MAX_STREAMS as u32 + 1);
const LINK_SQ: u32 = (STREAM_SENDS + 1) * (MAX_STREAMS as u32 + 1);

/// Most links a process keeps to one destination whose listener has branches (its
/// connects spread over them, as the owner picks branches in turn) ...
const BRANCH_LINKS: usize = 4;
/// ... and every how many connects to it another is made, until there are that many.
const SPREAD_AFTER: u32 = 8;

/// Destinations the links of this process reach, and those whose peer refused a link.
#[derive(Default)]
pub struct LinkHints {
    to: HashMap<SocketAddr, Vec<Weak<Link>>>,
    refused: HashSet<SocketAddr>,
    /// Connects to a destination reached through branches (for [`BRANCH_LINKS`]).
    turns: HashMap<SocketAddr, u32>,
}

/// Which link a connect takes.
enum Pick {
    /// This one.
    Use(Arc<Link>),
    /// A new one; if that cannot be made, this one (if any).
    Make(Option<Arc<Link>>),
}

impl LinkHints {
    /// `link` carries no more new streams to `dest`.
    fn forget(&mut self, dest: SocketAddr, link: &Arc<Link>) {
        if let Some(links) = self.to.get_mut(&dest) {
            links.retain(|l| !std::ptr::eq(l.as_ptr(), Arc::as_ptr(link)));
        }
    }

    /// A link to `dest` with room for a stream. Links to branches are taken in turn, and
    /// another is made every [`SPREAD_AFTER`] connects while there are fewer than
    /// [`BRANCH_LINKS`]: one link would take all of a client's connections to one worker.
    fn pick(&mut self, dest: SocketAddr) -> Pick {
        let Some(links) = self.to.get_mut(&dest) else {
            return Pick::Make(None);
        };
        links.retain(|l| l.upgrade().is_some_and(|l| !l.is_failed()));
        let roomy: Vec<Arc<Link>> = links
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|l| l.has_room())
            .collect();
        match roomy.first() {
            None => Pick::Make(None),
            Some(l) if l.branch.is_none() => Pick::Use(l.clone()),
            Some(_) => {
                let turn = self.turns.entry(dest).or_insert(0);
                *turn = turn.wrapping_add(1);
                let l = roomy[*turn as usize % roomy.len()].clone();
                if links.len() < BRANCH_LINKS && turn.is_multiple_of(SPREAD_AFTER) {
                    Pick::Make(Some(l))
                } else {
                    Pick::Use(l)
                }
            }
        }
    }
}

/// What a connect over a link came to.
pub enum Outcome {
    /// The stream, on a link.
    Stream(Arc<Stream>),
    /// Not over a link: connect with rdma_cm as before (links off, the peer does not take
    /// links, or did not take this stream).
    NotHere,
    /// Not over a link: the branch the link reaches did not take it (PROTOCOL.md §15):
    /// connect with rdma_cm, saying so to the destination's owner.
    SentBack(u64),
    /// The peer is unreachable or refused: fall back to TCP for this reason.
    Fail(Cause),
}

/// Connects to `dest` over a link, setting one up if none reaches it yet.
pub fn connect(engine: &'static Engine, dest: SocketAddr, opts: OptsSocket) -> Outcome {
    // A program that bound its socket wants its own address; a link stream has the link's.
    if !engine.cfg.links || opts.bound().is_some() {
        return Outcome::NotHere;
    }
    let deadline = Instant::now() + Duration::from_millis(engine.cfg.connect_timeout_ms as u64);
    // The stream's local address: fixed at the first try (it may bind the program's socket).
    let mut local = None;
    let mut tries = 0;
    loop {
        let link = match pick_or_make(engine, dest, deadline) {
            Ok(l) => l,
            Err(done) => return done,
        };
        let by = match link.branch {
            Some(_) => crate::engine::setup::branch_deadline(deadline),
            None => deadline,
        };
        match open_stream(engine, &link, dest, opts, &mut local, by) {
            Ok(s) => {
                if link.branch.is_some() {
                    crate::stats::count_branch(false);
                }
                return Outcome::Stream(s);
            }
            // Connectors that picked the link at once took its last room: the next pick
            // finds it full and makes another (before, this connect went to rdma_cm, a
            // queue pair of its own: most of them, with 16 threads connecting).
            Err(NotOpened::Full) if link.branch.is_none() && tries < FULL_RETRIES => {
                tries += 1;
                log::debug!("rdma link to {dest}: full since it was picked: another link");
            }
            Err(why) => {
                match why {
                    NotOpened::Full => log::info!("rdma link to {dest}: full: rdma_cm instead"),
                    NotOpened::Other(c) => log::info!(
                        "rdma link to {dest}: stream not opened ({c:?}): rdma_cm instead"
                    ),
                }
                return match link.branch {
                    // The branch did not take it (its program busy, or gone): the next
                    // connect asks the owner again, which sends it to another branch.
                    Some(b) => {
                        lock(&engine.link_hints).forget(dest, &link);
                        Outcome::SentBack(b)
                    }
                    None => Outcome::NotHere,
                };
            }
        }
    }
}

/// Times a connect picks a link again after the one it picked filled up.
const FULL_RETRIES: u32 = 2;

/// The link a connect to `dest` takes — one with room, or a new one — or, if none, what the
/// connect comes to.
fn pick_or_make(
    engine: &'static Engine,
    dest: SocketAddr,
    deadline: Instant,
) -> Result<Arc<Link>, Outcome> {
    // One link is made at a time: connectors to the same destination wait for it.
    let _making = lock(&engine.link_making);
    let pick = {
        let mut h = lock(&engine.link_hints);
        if h.refused.contains(&dest) {
            return Err(Outcome::NotHere);
        }
        h.pick(dest)
    };
    match pick {
        Pick::Use(l) => Ok(l),
        Pick::Make(have) => match (make_link(engine, dest, deadline), have) {
            (Ok(l), _) => Ok(l),
            (Err(_), Some(l)) => Ok(l),
            // A link needs more memory and device objects than a connection of its own (a
            // slab of each kind), which may still fit: rdma_cm, as without links.
            (Err(NoLink::Fail(c)), None) if c.reason == Some(Fallback::Resources) => {
                log::info!("rdma link to {dest}: no resources for a link: rdma_cm instead");
                Err(Outcome::NotHere)
            }
            (Err(NoLink::Fail(c)), None) => Err(Outcome::Fail(c)),
            (Err(NoLink::NotTaken), None) => {
                lock(&engine.link_hints).refused.insert(dest);
                Err(Outcome::NotHere)
            }
            (Err(NoLink::NotNow(branch)), None) => Err(Outcome::SentBack(branch)),
        },
    }
}

/// Why a stream was not opened on a link.
enum NotOpened {
    /// The link has no stream id or slot left.
    Full,
    /// Refused, timed out, or the link failed.
    Other(Cause),
}

/// Why no link carries a connect.
enum NoLink {
    /// The peer does not take links (an older rsock, or links off there): not to links.
    NotTaken,
    /// Not this time (the branch a redirect named, this id, did not take the link): rdma_cm
    /// now, naming the branch to the owner; a link again next time.
    NotNow(u64),
    /// RDMA does not reach the peer.
    Fail(Cause),
}

/// How a link setup to a destination's listener ended.
enum Made {
    Link(Arc<Link>),
    /// The listener's owner sent it to a branch (PROTOCOL.md §15).
    Redirected(Redirect),
}

/// Sets a link up to `dest` — to the branch its listener's owner sends it to, if it does.
/// A branch that does not take it leaves this connect to rdma_cm (a link to the owner
/// could carry none of the listener's streams).
fn make_link(
    engine: &'static Engine,
    dest: SocketAddr,
    deadline: Instant,
) -> Result<Arc<Link>, NoLink> {
    let follow = engine.cfg.redirect;
    match link_attempt(engine, dest, None, follow, deadline)? {
        Made::Link(l) => Ok(l),
        Made::Redirected(r) => match link_attempt(
            engine,
            dest,
            Some(r),
            false,
            crate::engine::setup::branch_deadline(deadline),
        ) {
            Ok(Made::Link(l)) => Ok(l),
            _ => Err(NoLink::NotNow(r.branch)),
        },
    }
}

/// One link setup of [`make_link`]: to `dest`, or to the branch `to_branch` names, saying
/// whether it follows a redirect.
fn link_attempt(
    engine: &'static Engine,
    dest: SocketAddr,
    to_branch: Option<Redirect>,
    follow: bool,
    deadline: Instant,
) -> Result<Made, NoLink> {
    let target = to_branch.map_or(dest, |r| SocketAddr::new(dest.ip(), r.port));
    let fail = |e: rdma::Error| {
        log::info!("rdma link to {target}: {e}");
        NoLink::Fail(crate::engine::setup::cause_of(&e))
    };
    let token = engine.token();
    let left = deadline.saturating_duration_since(Instant::now());
    let (id, dev) = rdma::resolve(None, target, token, left).map_err(fail)?;
    let d = engine.dev(&dev).map_err(fail)?;
    let mem = memory(&dev).map_err(fail)?;
    let mut rc = rdma::RcQp::new(id, &mem.pd, link_caps(engine)).map_err(|(e, _)| fail(e))?;
    let caps = rc.caps();
    let params = stream_params(engine, &caps, true);
    rc.post_recvs(0, params.recv_credits).map_err(fail)?;
    let conn_id = crate::sys::unix::random_u64();
    let mr = mem.rings.first().mr();
    let mut hello = params.hello(
        HelloKind::Link,
        mr.iova() + u64::from(mem.control_ring.offset),
        mr.rkey().unwrap_or(0),
        conn_id,
    );
    hello.flags |= FLAG_LINK_GROW;
    if engine.cfg.link_grants > 0 {
        hello.flags |= FLAG_LINK_GRANTS;
    }
    if follow {
        hello.flags |= FLAG_TAKES_REDIRECT;
    }
    if let Some(r) = to_branch {
        hello.kind = HelloKind::BranchLink;
        hello.branch = Some(r.branch);
    }
    let bytes = hello.to_bytes();
    let param = ConnParam {
        private_data: &bytes[..hello.encoded_len()],
        ..ConnParam::default()
    };
    let left = deadline.saturating_duration_since(Instant::now());
    let ev = rdma::connect_event(&mut rc, &param, left).map_err(fail)?;
    let peer = match ev.kind {
        EventKind::Established => {
            Hello::parse_kind(ev.private_data(), HelloKind::Accept).map_err(|e| {
                log::info!("rdma link to {target}: the peer's answer: {e}");
                NoLink::NotTaken
            })?
        }
        EventKind::Rejected if follow => match Redirect::parse(ev.private_data()) {
            Some(r) => {
                log::debug!("rdma link to {dest}: redirected to port {}", r.port);
                return Ok(Made::Redirected(r));
            }
            None => return Err(refused(target, &ev)),
        },
        EventKind::Rejected => return Err(refused(target, &ev)),
        _ => {
            log::info!("rdma link to {target}: {}", ev.name());
            return Err(NoLink::Fail(Cause::from(Fallback::Unreachable)));
        }
    };
    drop(ev);
    let conn =
        Conn::on_link(&params, &peer, StreamId::CONTROL, StreamId::CONTROL).map_err(|e| {
            log::info!("rdma link to {target}: the peer's hello: {e}");
            NoLink::NotTaken
        })?;
    rc.id_mut().migrate(&engine.ch).map_err(fail)?;
    let local = rc.id().local_addr().unwrap_or(dest);
    let link = build(
        engine,
        d,
        rc,
        conn,
        &params,
        mem,
        token,
        dest,
        local,
        target,
        (0, 0, peer.flags, to_branch.map(|r| r.branch)),
    )
    .ok_or(NoLink::NotTaken)?;
    let mut h = lock(&engine.link_hints);
    h.to.entry(dest).or_default().push(Arc::downgrade(&link));
    log::info!("rdma link {local} -> {target}: up (qp {})", link.qpn);
    Ok(Made::Link(link))
}

/// A link request `target` rejected: an rsock peer said no (an older one, or one with links
/// off): not to links, for good. A reject without its word is the destination's kernel
/// (nobody listens there, now): the connect goes on as without links, and a later one
/// tries again.
fn refused(target: SocketAddr, ev: &rdma::CmEvent) -> NoLink {
    match Hello::parse(ev.private_data()) {
        Err(proto::HelloError::Rejected(_)) => {
            log::info!("rdma link to {target}: the peer does not take links");
            NoLink::NotTaken
        }
        _ => {
            log::info!("rdma link to {target}: refused (no rsock listener there)");
            NoLink::Fail(Cause::from(Fallback::Rejected))
        }
    }
}

/// A link's memory: its protection domain, and the first slab of its rings and of its send
/// buffers (only rings are the peer's to write), with stream 0's slots taken.
pub(super) struct Memory {
    pub(super) pd: Arc<Pd>,
    pub(super) rings: Slab,
    sends: Slab,
    pub(super) control_ring: proto::link::Slot,
    control_send: proto::link::Slot,
}

pub(super) fn memory(dev: &Arc<rdma::Device>) -> rdma::Result<Memory> {
    let pd = Pd::new(dev)?;
    let (rings, control_ring) = Slab::new(&pd, Access::RemoteWrite)?;
    let (sends, control_send) = Slab::new(&pd, Access::LocalRead)?;
    Ok(Memory {
        pd,
        rings,
        sends,
        control_ring,
        control_send,
    })
}

pub(super) fn link_caps(engine: &Engine) -> QpCaps {
    QpCaps {
        max_send_wr: LINK_SQ,
        max_recv_wr: LINK_RQ,
        max_send_sge: 1,
        max_inline_data: engine.cfg.max_inline,
    }
}

/// The link, registered with the engine.
#[allow(clippy::too_many_arguments)]
pub(super) fn build(
    engine: &'static Engine,
    dev: Arc<crate::engine::Dev>,
    rc: rdma::RcQp,
    control: Conn,
    params: &Params,
    mem: Memory,
    token: u64,
    dest: SocketAddr,
    local: SocketAddr,
    peer: SocketAddr,
    (listener, grant_pool, peer_flags, branch): (u64, u32, u16, Option<u64>),
) -> Option<Arc<Link>> {
    let caps = rc.caps();
    // A probe's slot per stream stays out of the shares.
    let sq = caps.max_send_wr.saturating_sub(u32::from(MAX_STREAMS) + 1);
    let mut mux = Mux::new(control, params, caps.max_recv_wr, sq, MAX_STREAMS)?;
    let _ = mux.receives_to_post(); // stream 0's, posted before the handshake
    let link = Arc::new(Link {
        token,
        dev,
        qpn: rc.qp_num(),
        dest,
        local,
        peer,
        listener,
        grant_pool,
        // Only an accept hello says it (a connector's never does).
        peer_shows_ports: peer_flags & FLAG_LINK_PORTS != 0,
        peer_grows: peer_flags & FLAG_LINK_GROW != 0,
        branch,
        st: Mutex::new(State {
            rc,
            mux,
            rings: mem.rings,
            sends: mem.sends,
            control_ring: mem.control_ring,
            control_send: mem.control_send,
            members: HashMap::new(),
            opening: HashMap::new(),
            granted: HashMap::new(),
            answers: HashMap::new(),
            opened: 0,
            sleepers: HashMap::new(),
            quarantine: Vec::new(),
        }),
        failed: AtomicBool::new(false),
        closes_held: AtomicBool::new(false),
        idle_since: Mutex::new(None),
    });
    lock(&engine.links).insert(&link);
    // An OPEN may come at any time: someone hears the link's completions while it lives.
    link.dev.link_up();
    crate::stats::count_link(false);
    engine.ensure_helper();
    Some(link)
}

/// Connector: opens a stream to `dest` on `link` and waits for the answer.
fn open_stream(
    engine: &'static Engine,
    link: &Arc<Link>,
    dest: SocketAddr,
    opts: OptsSocket,
    local: &mut Option<(SocketAddr, u16)>,
    deadline: Instant,
) -> Result<Arc<Stream>, NotOpened> {
    let bell = fresh_bell().map_err(|e| {
        log::info!("rdma link to {}: doorbell: {e}", link.peer);
        NotOpened::Other(Cause::errno(
            Fallback::Resources,
            e.raw_os_error().unwrap_or(0),
        ))
    })?;
    let (local, from_port) = *local.get_or_insert_with(|| stream_local(link, &opts));
    let bell = match super::grant::open(
        engine,
        link,
        dest,
        &opts,
        (bell, (local, from_port)),
        deadline,
    ) {
        Ok(r) => return r.map_err(NotOpened::Other),
        Err(bell) => bell, // no grant to take: open and wait for the answer
    };
    let token = engine.token();
    let conn_id = crate::sys::unix::random_u64();
    let mine = {
        let mut st = link.lock();
        // Failed or closed since the hint found it: `fail` answers only the openings it
        // finds under this lock.
        if link.is_failed() {
            return Err(NotOpened::Other(Cause::from(Fallback::Resources)));
        }
        let (params, slots) = stream_slots(engine, link, &mut st);
        let (ring, send) = match slots {
            (Some(r), Some(s)) => (r, s),
            unused => {
                log::info!(
                    "rdma link to {}: no slot for a stream ({})",
                    link.peer,
                    st.describe()
                );
                drop(st);
                drop(unused); // a slot goes back to the link, which takes its lock
                return Err(NotOpened::Full);
            }
        };
        let at = ring.ring_at();
        st.opened += 1;
        let mine = match st.mux.open(params, at, conn_id, (dest, from_port)) {
            Ok(id) => id,
            Err(e) => {
                log::info!(
                    "rdma link to {}: no stream id ({e:?}; {})",
                    link.peer,
                    st.describe()
                );
                drop(st);
                drop((ring, send));
                return Err(NotOpened::Full);
            }
        };
        let (mut ring, mut send) = (ring, send);
        ring.id = Some(mine);
        send.id = Some(mine);
        st.opening.insert(
            mine.get(),
            Opening {
                ring,
                send,
                local,
                opts,
                token,
                conn_id,
                bell,
            },
        );
        link.pump(&mut st);
        log::debug!(
            "rdma link to {}: OPEN of stream {} to {dest}",
            link.peer,
            mine.get()
        );
        mine
    };
    answer::wait(engine, link, conn_id, mine, deadline).map_err(NotOpened::Other)
}

/// Connector, on the poller: our OPEN of `mine` was accepted, `conn` its connection: the
/// stream is made here, before the link's next completion (the peer may write at once).
pub(super) fn on_opened(link: &Arc<Link>, engine: &Engine, mine: StreamId, conn: Conn) {
    let opening = link.lock().opening.remove(&mine.get());
    log::debug!(
        "rdma link to {}: stream {} accepted{}",
        link.peer,
        mine.get(),
        if opening.is_some() {
            ""
        } else {
            " after its connector gave up"
        }
    );
    let Some(o) = opening else {
        // The connector gave up: close what the peer opened.
        let mut st = link.lock();
        st.mux.close(mine);
        link.pump(&mut st);
        return;
    };
    let conn_id = o.conn_id;
    let r = connector_stream(link, engine, mine, conn, o);
    link.lock().answer(conn_id, r);
}
