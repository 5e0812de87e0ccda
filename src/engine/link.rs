//! Links (issue #24; docs/DESIGN.md, "Links"; PROTOCOL.md §14): one RC queue pair between
//! this process and a peer process, in a protection domain of its own, carrying many
//! streams. The first connect to a destination sets the link up with rdma_cm (a hello of
//! kind Link, whose stream is the link's control stream); every later connect to it opens
//! a stream with an OPEN record and its ACCEPT — no rdma_cm, no queue pair, no
//! registration. Each stream is an ordinary [`Stream`] whose queue pair is a [`Member`] of
//! the link and whose buffers are slots of the link's two slabs.
//!
//! Here: the link and its driver, a thin loop over [`Mux`] — completions routed to the
//! streams, stream 0's records acted on (an OPEN queued on a listener, an ACCEPT making the
//! connector's stream), the link's failure ending every stream on it. `link/member.rs`: a
//! stream's end of the link and its slots. `link/make.rs`: setting links up, and opening
//! and accepting streams on them.
//!
//! Locking: a stream's lock may be held while taking the link's (a stream posts on the
//! link); never the other way round: the driver lets go of the link before it hands a
//! completion to a stream.

mod accept;
mod answer;
mod grant;
mod make;
mod member;
mod parts;
mod slab;

pub(super) use accept::{
    accept_link, accept_open, accept_waiting_open, is_link_request, refuse_open, OpenTarget,
};
pub(super) use answer::sleep_on_device;
pub use make::{connect, LinkHints, Outcome};
pub use member::{Member, SlotBuf};

use super::stream::{QueuePair, PROBE_WR, PROTO_SIGNALED};
use super::{lock, Dev, Engine, Stream};
use crate::proto::link::imm::StreamId;
use crate::proto::link::record::RefuseReason;
use crate::proto::link::{untag, LinkEvent, Mux, Slot, WR_DRIVER_BITS};
use crate::rdma::{self, RegBuf, Wc};
use crate::stats::{Cause, Fallback};
use slab::Slab;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

/// One link.
pub struct Link {
    /// Names its rdma_cm id (its events: a disconnect fails the link).
    pub(super) token: u64,
    pub(super) dev: Arc<Dev>,
    qpn: u32,
    /// The destination it was made for (a connector's), or the address it was accepted on.
    pub dest: SocketAddr,
    /// This end's and the peer's address (rdma_cm's): every stream on the link has them.
    pub local: SocketAddr,
    pub peer: SocketAddr,
    /// An accepted link's listener (its OPENs are for it), 0 for a connector's.
    listener: u64,
    /// Streams this end keeps granted to the peer (an accepted link whose peer takes
    /// grants: `RSOCK_LINK_GRANTS`), 0 for none.
    grant_pool: u32,
    /// The peer shows the port an OPEN carries as its stream's (a connector's link).
    peer_shows_ports: bool,
    /// The peer takes GROW records: its streams' rings here may grow (PROTOCOL.md §14).
    peer_grows: bool,
    /// A connector's link to a branch of its destination's listener: the branch's id
    /// (PROTOCOL.md §15).
    branch: Option<u64>,
    st: Mutex<State>,
    failed: AtomicBool,
    /// It holds CLOSEs back (counted in [`HOLDING`]).
    closes_held: AtomicBool,
    /// Since when it has carried no stream (the helper's look: `close_if_idle`), and how
    /// many streams it had opened then (one opened since: not idle).
    idle_since: Mutex<Option<(std::time::Instant, u64)>>,
}

/// Links holding CLOSEs back (`Mux::close_lazily`): the helper sends them when it has
/// been quiet for [`CLOSE_HELD`] (no OPEN or ACCEPT came for them to ride with), or every
/// [`LOOK_EVERY_BUSY`] of its busy passes ([`look_after`]).
static HOLDING: AtomicUsize = AtomicUsize::new(0);

/// How long the helper waits, while CLOSEs are held, before it sends them (the peer's ids
/// and slots wait with them).
pub(super) const CLOSE_HELD: Duration = Duration::from_millis(5);

/// The helper looks after the links on a quiet pass, or after this many passes with events
/// if it is never quiet — a pass count, not the clock, which can be a syscall.
pub(super) const LOOK_EVERY_BUSY: u32 = 64;

/// Helper, on a quiet pass (or every [`LOOK_EVERY_BUSY`] busy ones): sends the CLOSEs links
/// hold back, and closes links idle for `RSOCK_LINK_IDLE_MS`.
pub(super) fn look_after(engine: &Engine) {
    let idle_ms = engine.cfg.link_idle_ms;
    if !closes_held() && idle_ms == 0 {
        return;
    }
    let links = lock(&engine.links).all();
    for l in &links {
        l.release_closes();
        if idle_ms > 0 {
            l.close_if_idle(Duration::from_millis(u64::from(idle_ms)));
        }
    }
}

/// What stream 0 said, as the driver acts on it.
enum Said {
    Event(LinkEvent),
    /// The peer's CLOSE, with the stream it closes (if it is still here).
    PeerClosed(Option<Arc<Stream>>),
    /// The peer's GROW, with the stream whose peer ring grew (if it is still here).
    Grew(Option<Arc<Stream>>, u32, crate::proto::link::RingAt),
}

/// What a connector left for the answer to its OPEN: everything its stream is made of.
struct Opening {
    ring: SlotBuf,
    send: SlotBuf,
    /// The stream's local address (the link's, with a port of its own if it has one).
    local: SocketAddr,
    opts: crate::engine::OptsSocket,
    token: u64,
    conn_id: u64,
    bell: (crate::readiness::Doorbell, crate::proto::Readiness),
}

struct State {
    rc: rdma::RcQp,
    mux: Mux,
    rings: Slab,
    sends: Slab,
    /// Stream 0's ring and send buffer.
    control_ring: Slot,
    control_send: Slot,
    /// The streams open here, by our id.
    members: HashMap<u16, Weak<Stream>>,
    opening: HashMap<u16, Opening>,
    /// Streams granted to the peer and not taken yet: their ring and send buffer, by our id.
    granted: HashMap<u16, (SlotBuf, SlotBuf)>,
    /// Answers to OPENs, for their connectors, by the stream's `conn_id` (not its id: a
    /// refused id is free at once, and the next OPEN may take it before the first
    /// connector has looked).
    answers: HashMap<u64, Result<Arc<Stream>, Cause>>,
    /// Connectors asleep on the device's completion channel, by `conn_id`, with the eventfd
    /// that wakes them when another thread handled their answer.
    sleepers: HashMap<u64, libc::c_int>,
    /// Streams opened or accepted on it so far.
    opened: u64,
    /// Slots of streams gone before their id was free (the peer may still write): given
    /// back when it is.
    quarantine: Vec<(StreamId, Slot, bool, u32)>,
}

impl Link {
    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.st)
    }

    /// Whether the link failed (its streams were reset; it takes no new one).
    /// An accepted link's listener (the token its OPENs are for); 0 for a connector's.
    pub(super) fn listener_token(&self) -> u64 {
        self.listener
    }

    pub fn is_failed(&self) -> bool {
        self.failed.load(Acquire)
    }

    /// Whether a new stream fits: an id, and a ring and a send buffer in the slabs.
    pub fn has_room(&self) -> bool {
        let st = self.lock();
        !self.is_failed()
            && !st.mux.closing()
            && st.mux.streams() < usize::from(parts::MAX_STREAMS)
            && st.rings.has_room(parts::STREAM_BUF)
            && st.sends.has_room(parts::STREAM_BUF)
    }

    /// The streams of this link alive now.
    pub(super) fn members(&self) -> Vec<Arc<Stream>> {
        self.lock()
            .members
            .values()
            .filter_map(Weak::upgrade)
            .collect()
    }

    /// One completion of the link's queue pair (the device's poll lock held).
    pub(super) fn on_completion(self: &Arc<Self>, engine: &Engine, wc: &Wc) {
        let mut target = None;
        let mut events = Vec::new();
        {
            let mut g = self.lock();
            let st = &mut *g;
            st.rc.on_completion(wc);
            if !wc.is_ok() {
                drop(g);
                if !self.is_failed() {
                    self.fail(&format!("a work request failed (status {})", wc.status()));
                }
                return;
            }
            let routed = if wc.is_recv() {
                let Some(imm) = wc.imm() else {
                    drop(g);
                    self.fail("a message without an immediate");
                    return;
                };
                let rings = st.rings.first().clone();
                let r =
                    st.mux
                        .handle_imm(imm, wc.byte_len(), control_ring(&rings, st.control_ring));
                let k = st.mux.receives_to_post();
                if let Err(e) = st.rc.post_recvs(0, k) {
                    log::warn!("rdma link to {}: receives: {e}", self.peer);
                }
                r.map(|id| id.map(|id| id.get()))
            } else {
                let wr_id = wc.wr_id();
                let tagged = wr_id & !WR_DRIVER_BITS;
                match untag(tagged).0 {
                    // A stream gone since it posted (its id freed): ours, not the peer's.
                    Some(id) if !id.is_control() && !st.mux.holds(id) => Ok(None),
                    Some(id) if !id.is_control() && wr_id & PROBE_WR != 0 => Ok(Some(id.get())),
                    _ if wr_id & PROTO_SIGNALED != 0 => st
                        .mux
                        .handle_send_complete(tagged)
                        .map(|r| r.map(|(id, _)| id.get())),
                    _ => Ok(None), // the link's own marker
                }
            };
            match routed {
                Ok(Some(id)) => target = st.members.get(&id).and_then(Weak::upgrade),
                Ok(None) => {
                    while let Some(ev) = st.mux.poll_event() {
                        events.push(match ev {
                            // A CLOSE names our id, which an OPEN later in the same burst may
                            // take again: the stream it closes is found now.
                            LinkEvent::PeerClosed { mine } => Said::PeerClosed(
                                st.members.get(&mine.get()).and_then(Weak::upgrade),
                            ),
                            LinkEvent::Grow { mine, size, ring } => Said::Grew(
                                st.members.get(&mine.get()).and_then(Weak::upgrade),
                                size,
                                ring,
                            ),
                            other => Said::Event(other),
                        });
                    }
                }
                Err(e) => {
                    drop(g);
                    self.fail(&format!("protocol error: {e:?}"));
                    return;
                }
            }
            self.pump(st);
        }
        if let Some(s) = target {
            s.on_completion(wc);
        }
        for said in events {
            match said {
                Said::Event(ev) => self.on_event(engine, ev),
                // A stream gone here since has nothing more to write.
                Said::Grew(s, size, ring) => {
                    if let Some(s) = s {
                        s.on_grow_record(size, ring);
                    }
                }
                // The peer is done with the stream: one not finished here is reset.
                Said::PeerClosed(s) => {
                    self.lock().free_quarantined();
                    if let Some(s) = s {
                        s.end_on_link("the peer closed the stream on the link");
                        if let Some(e) = crate::engine::get() {
                            e.reap_now(&s);
                        }
                    }
                }
            }
        }
    }

    /// What stream 0 said, acted on in order (the device's poll lock held, so that a new
    /// stream exists before the link's next completion is looked at).
    fn on_event(self: &Arc<Self>, engine: &Engine, ev: LinkEvent) {
        match ev {
            LinkEvent::Incoming(open) => engine.link_open(self, open),
            LinkEvent::IncomingGranted { open, mine, conn } => {
                grant::on_open_granted(self, engine, open, mine, *conn)
            }
            LinkEvent::Opened { mine, conn } => make::on_opened(self, engine, mine, *conn),
            LinkEvent::Refused { mine, reason } => {
                let mut st = self.lock();
                // Its slots go back when it drops, which takes the lock: after it.
                let opening = st.opening.remove(&mine.get());
                if let Some(o) = &opening {
                    log::info!("rdma link to {}: stream refused ({reason:?})", self.peer);
                    st.answer(o.conn_id, Err(refused(reason)));
                }
                drop(st);
                drop(opening);
            }
            // Taken in `on_completion` (see there).
            LinkEvent::PeerClosed { .. } | LinkEvent::Goodbye | LinkEvent::Grow { .. } => {}
        }
    }

    /// Posts what the link owes: stream 0's receives and records (under its lock). Forgets
    /// the streams whose id is free (both CLOSEs passed: nothing more comes for them).
    fn pump(&self, st: &mut State) {
        let mux = &st.mux;
        st.members
            .retain(|&id, _| StreamId::new(id).is_some_and(|id| mux.holds(id)));
        if self.is_failed() {
            return;
        }
        let k = st.mux.receives_to_post();
        if let Err(e) = st.rc.post_recvs(0, k) {
            log::warn!("rdma link to {}: receives: {e}", self.peer);
        }
        let send = st.control_send;
        let buf = st.sends.first().clone();
        // SAFETY: stream 0's send slot lies inside the first slab and is stream 0's alone; the
        // control plane writes only into its free part (the NIC reads only what was posted).
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(
                buf.as_ptr().add(send.offset as usize),
                send.len as usize,
            )
        };
        while let Some(mut w) = st.mux.poll_control_write(bytes) {
            w.local_offset += send.offset;
            if let Err(e) = QueuePair::post(&mut st.rc, &w, &*buf) {
                log::warn!("rdma link to {}: control post: {e}", self.peer);
                return;
            }
        }
    }

    /// The link failed: every stream on it is reset, and it takes no new one.
    pub(super) fn fail(&self, why: &str) {
        if self.failed.swap(true, AcqRel) {
            return;
        }
        let (members, opening, granted) = {
            let mut st = self.lock();
            let _ = st.rc.disconnect();
            let opening: Vec<(u16, Opening)> = st.opening.drain().collect();
            let granted: Vec<_> = st.granted.drain().collect();
            for (_, o) in &opening {
                st.answer(o.conn_id, Err(refused_failed()));
            }
            let members = st
                .members
                .values()
                .filter_map(Weak::upgrade)
                .collect::<Vec<_>>();
            (members, opening, granted)
        };
        drop((opening, granted)); // slots go back to the link, which takes its lock
        log::info!(
            "rdma link {} -> {}: {why}{}",
            self.local,
            self.peer,
            match members.len() {
                0 => String::new(),
                n => format!(": its {n} stream(s) are reset"),
            }
        );
        for s in members {
            s.end_on_link(&format!("its link failed ({why})"));
        }
        // No new stream finds it; it goes (its queue pair and memory) with its last stream.
        if let Some(e) = crate::engine::get() {
            lock(&e.links).remove(self);
        }
    }
}

/// Why a connect over a link did not happen, for a refused OPEN.
fn refused(reason: RefuseReason) -> Cause {
    match reason {
        RefuseReason::BacklogFull | RefuseReason::NoResources => Cause::from(Fallback::Resources),
        _ => Cause::from(Fallback::Rejected),
    }
}

/// ... and for an OPEN whose link failed before the answer.
fn refused_failed() -> Cause {
    Cause::errno(Fallback::Unreachable, libc::ECONNRESET)
}

/// Stream 0's ring `r` in the ring slab, read only where the protocol says bytes are
/// complete.
fn control_ring(slab: &RegBuf, r: Slot) -> &[u8] {
    // SAFETY: inside the ring slab; the control plane reads only what the protocol gives
    // out as received (the peer writes only the free part).
    unsafe { std::slice::from_raw_parts(slab.as_ptr().add(r.offset as usize), r.len as usize) }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.dev.link_down();
        if *self.closes_held.get_mut() {
            HOLDING.fetch_sub(1, Relaxed);
        }
    }
}

/// Whether any link holds CLOSEs back (the helper then looks every [`CLOSE_HELD`]).
pub(super) fn closes_held() -> bool {
    HOLDING.load(Relaxed) > 0
}

impl Link {
    /// A stream's CLOSE was held back: the helper sends it if nothing takes it along.
    fn holds_closes(&self) {
        if !self.closes_held.swap(true, AcqRel) {
            HOLDING.fetch_add(1, Relaxed);
        }
    }

    /// Helper, on a quiet pass: closes the link once it has carried no stream for `idle`
    /// (`RSOCK_LINK_IDLE_MS`; its queue pair, protection domain and 4 MiB of pinned memory
    /// go). Idle from the first quiet pass that finds it so: a clock read only then.
    pub(super) fn close_if_idle(&self, idle: Duration) {
        let (unused, opened) = {
            let st = self.lock();
            // Streams granted to the peer keep it (the peer may take one at any time, and
            // closes the link itself when it has no use for it), unless GOODBYE voided them.
            let granted = if st.mux.closing() {
                st.mux.grants_out()
            } else {
                0
            };
            let unused =
                st.mux.streams() == granted && st.opening.is_empty() && st.quarantine.is_empty();
            (unused, st.opened)
        };
        let mut since = lock(&self.idle_since);
        match *since {
            // Unused at two looks, and no stream in between.
            Some((t, n)) if unused && n == opened => {
                if std::time::Instant::now().duration_since(t) < idle {
                    return;
                }
                drop(since);
                // Our GOODBYE first: the peer opens no stream on it from now on (one whose
                // OPEN crossed it is refused, and goes through rdma_cm).
                self.goodbye();
                self.fail(&format!("no stream for {} ms: closed", idle.as_millis()));
            }
            _ if unused => *since = Some((std::time::Instant::now(), opened)),
            _ => *since = None,
        }
    }

    /// Says GOODBYE: the peer opens no stream on the link from now on, and takes none of the
    /// streams granted to it (its OPEN that crossed the GOODBYE is still taken, and reset
    /// if nobody listens). The link goes once its streams are done and it is idle.
    pub(super) fn goodbye(&self) {
        let mut st = self.lock();
        st.mux.goodbye();
        self.pump(&mut st);
    }

    /// Helper: sends the CLOSEs held back.
    pub(super) fn release_closes(&self) {
        if !self.closes_held.swap(false, AcqRel) {
            return;
        }
        HOLDING.fetch_sub(1, Relaxed);
        let mut st = self.lock();
        if st.mux.release_closes() {
            self.pump(&mut st);
        }
    }
}

impl State {
    /// The answer to the OPEN of connector `conn_id`, woken if it sleeps.
    fn answer(&mut self, conn_id: u64, r: Result<Arc<Stream>, Cause>) {
        self.answers.insert(conn_id, r);
        if let Some(&fd) = self.sleepers.get(&conn_id) {
            crate::sys::raw::eventfd_add(fd);
        }
    }

    /// The link's queues and stream 0's positions, for a log line.
    fn describe(&self) -> String {
        format!(
            "streams {}, slots {:?} + {:?} bytes (taken, registered), {} quarantined, send queue room {}, receives posted {}, stream 0 {:?}, {} member(s)",
            self.mux.streams(),
            self.rings.usage(),
            self.sends.usage(),
            self.quarantine.len(),
            self.rc.sq_room(),
            self.rc.rq_posted(),
            self.mux.control().counters(),
            self.members.len()
        )
    }

    /// Gives back quarantined slots whose stream's id is free now.
    fn free_quarantined(&mut self) {
        let mut i = 0;
        while i < self.quarantine.len() {
            let (id, slot, ring, dirty) = self.quarantine[i];
            if self.mux.holds(id) {
                i += 1;
                continue;
            }
            self.quarantine.swap_remove(i);
            self.give_back(slot, ring, dirty);
        }
    }

    /// Gives `slot` back to its slab, scrubbed as far as `dirty` (see [`Slab::give_back`]).
    fn give_back(&mut self, slot: Slot, ring: bool, dirty: u32) {
        if ring {
            self.rings.give_back(slot, dirty)
        } else {
            self.sends.give_back(slot, dirty)
        }
    }
}

/// The links of this process, by queue pair number and by destination.
#[derive(Default)]
pub struct Links {
    by_qp: HashMap<u32, Arc<Link>>,
    by_token: HashMap<u64, Arc<Link>>,
}

impl Links {
    pub(super) fn insert(&mut self, l: &Arc<Link>) {
        self.by_qp.insert(l.qpn, l.clone());
        self.by_token.insert(l.token, l.clone());
    }

    pub(super) fn remove(&mut self, l: &Link) {
        self.by_qp.remove(&l.qpn);
        self.by_token.remove(&l.token);
    }

    pub(super) fn by_qp(&self, qpn: u32) -> Option<Arc<Link>> {
        self.by_qp.get(&qpn).cloned()
    }

    pub(super) fn by_token(&self, token: u64) -> Option<Arc<Link>> {
        self.by_token.get(&token).cloned()
    }

    /// The links accepted on listener `token`.
    pub(super) fn of_listener(&self, token: u64) -> Vec<Arc<Link>> {
        let links = self.by_qp.values();
        links.filter(|l| l.listener == token).cloned().collect()
    }

    /// The device of a link accepted on listener `token`, if any: its OPENs come there.
    pub(super) fn dev_of_listener(&self, token: u64) -> Option<Arc<Dev>> {
        self.by_qp
            .values()
            .find(|l| l.listener == token && !l.is_failed())
            .map(|l| l.dev.clone())
    }

    pub(super) fn all(&self) -> Vec<Arc<Link>> {
        self.by_qp.values().cloned().collect()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.by_qp.is_empty()
    }
}
