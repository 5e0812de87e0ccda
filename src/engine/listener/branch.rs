//! Branches: a process that accepts from a listener another process owns (a prefork worker,
//! a listener received with `SCM_RIGHTS`) listens on an rdma_cm port of its own, and the
//! owner sends the RDMA clients that follow redirects there (PROTOCOL.md §15). Each such
//! connection is then set up once, in the process that serves it: no take-over.
//!
//! - The owner's side ([`Branches`], [`Listener::redirect`]): the branches registered over
//!   ipc, picked in turn for each connect request whose hello says the client follows
//!   redirects; a reject of reason `Redirect` names the branch's port and id.
//! - The branch's side: a [`Listener`] of this process with no kernel half whose connect
//!   requests (branch hellos naming it, nothing else) wait unanswered until the program
//!   accepts ([`Listener::branch_take`]): a request still waiting when the branch closes or
//!   the process exits is refused, and its client connects to the owner instead — nothing
//!   is lost with the branch. The program's fds of the listener become the branch's A,
//!   readable while a request or a stream waits here or the owner's doorbell rang (the
//!   owner's queue takes kernel TCP peers and every client that does not follow
//!   redirects).

use super::{Accepted, Listener, Waiting};
use crate::engine::link::Link;
use crate::engine::tags::TAG_BRANCH_RANG;
use crate::engine::{ipc, lock, Engine};
use crate::proto::link::record::Open;
use crate::proto::{Hello, HelloKind, Redirect};
use crate::rdma;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A process accepting from this listener through its own rdma_cm port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct BranchRef {
    pid: i32,
    port: u16,
    id: u64,
    /// A client said the branch sent it back (its program busy): no one is redirected
    /// there until then, or until its process asks the owner for a connection.
    busy_until: Option<Instant>,
}

/// How long a branch that sent a client back gets no redirects, unless its process comes
/// for a connection of the owner's queue first (it is free then).
const BUSY_FOR: Duration = Duration::from_secs(1);

/// The owner's list of a listener's branches.
#[derive(Default)]
pub struct Branches {
    list: Mutex<Vec<BranchRef>>,
    next: AtomicUsize,
}

impl Branches {
    /// Registers (or, `port` 0, withdraws) process `pid`'s branch `id`.
    pub(in crate::engine) fn set(&self, pid: i32, port: u16, id: u64) {
        let mut l = lock(&self.list);
        // One branch per process and listener: a new one replaces the old.
        l.retain(|b| b.pid != pid || (port == 0 && b.id != id));
        if port != 0 {
            l.push(BranchRef {
                pid,
                port,
                id,
                busy_until: None,
            });
        }
    }

    /// A client says branch `id` did not take it (PROTOCOL.md §15, `FLAG_SENT_BACK`).
    fn set_busy(&self, id: u64, now: Instant) {
        let mut l = lock(&self.list);
        if let Some(b) = l.iter_mut().find(|b| b.id == id) {
            log::debug!("branch {id:#x} (pid {}) sent a client back: busy", b.pid);
            b.busy_until = Some(now + BUSY_FOR);
        }
    }

    /// Process `pid` asks for a connection of the owner's queue: its branch is free.
    pub(in crate::engine) fn set_free(&self, pid: i32) {
        let mut l = lock(&self.list);
        for b in l.iter_mut().filter(|b| b.pid == pid) {
            b.busy_until = None;
        }
    }

    /// The next branch in turn whose process is alive and that is not busy (a process that
    /// is gone is dropped; one that closed its branch withdrew it). None if every branch is
    /// busy: the owner takes the client.
    fn pick(&self, now: Instant) -> Option<BranchRef> {
        let mut l = lock(&self.list);
        let mut tries = l.len();
        while tries > 0 && !l.is_empty() {
            tries -= 1;
            let i = self.next.fetch_add(1, Relaxed) % l.len();
            let b = l[i];
            if !crate::sys::raw::process_exists(b.pid) {
                l.remove(i);
                continue;
            }
            match b.busy_until {
                Some(t) if t > now => continue,
                Some(_) => l[i].busy_until = None,
                None => {}
            }
            return Some(b);
        }
        None
    }
}

impl Listener {
    /// Whether this is a branch of another process's listener.
    pub(in crate::engine) fn is_branch(&self) -> bool {
        self.branch_id != 0
    }

    /// A connect request as it arrives on the rdma_cm listener, before it is queued: on a
    /// listener with branches, a client that follows redirects is sent to the next branch;
    /// on a branch, anything but a branch hello naming it is refused (the port may be one a
    /// stale redirect names). `None`: answered here.
    pub(super) fn redirect(&self, inc: rdma::Incoming) -> Option<rdma::Incoming> {
        let hello = Hello::parse(inc.event.private_data()).ok();
        let now = Instant::now();
        if let Some(b) = hello.and_then(|h| h.sent_back_by()) {
            self.branches.set_busy(b, now);
        }
        if self.is_branch() {
            let ours = hello.is_some_and(|h| h.branch == Some(self.branch_id));
            if ours {
                return Some(inc);
            }
            crate::engine::setup::refuse_request(inc, "not a branch hello for this branch");
            return None;
        }
        // A connect, or a link (whose streams then go to the branch).
        let follows = hello.is_some_and(|h| {
            matches!(h.kind, HelloKind::Connect | HelloKind::Link)
                && h.flags & crate::proto::wire::FLAG_TAKES_REDIRECT != 0
        });
        if !follows {
            return Some(inc);
        }
        let Some(b) = self.branches.pick(now) else {
            return Some(inc); // no free branch (yet, or any more): the owner's, as before
        };
        let mut id = inc.id;
        log::debug!(
            "redirecting rdma connection from {:?} to pid {}'s branch on port {}",
            id.peer_addr(),
            b.pid,
            b.port
        );
        let r = Redirect {
            port: b.port,
            branch: b.id,
        };
        let _ = id.reject(&r.to_bytes());
        None
    }

    /// A branch (helper): connect requests came; A rings for the program.
    pub(super) fn requests_came(&self) {
        WAITING.store(true, Relaxed);
        self.ring_if_deferred();
    }

    /// A branch (whoever polls the link): a link's OPEN waits, as a connect request does,
    /// for the program's accept; A rings. The helper is woken if it was not looking at
    /// waiting requests (it sends back those the program does not take in time).
    pub(in crate::engine) fn defer_open(&self, engine: &Engine, link: Arc<Link>, open: Open) {
        let mut d = lock(&self.deferred);
        if d.len() >= super::MAX_DEFERRED {
            drop(d);
            return Waiting::Open(link, open).refuse("too many connect requests waiting");
        }
        d.push_back((std::time::Instant::now(), Waiting::Open(link, open)));
        engine.deferred.fetch_add(1, Relaxed);
        drop(d);
        if !WAITING.swap(true, Relaxed) {
            engine.wake();
        }
        self.ring_if_deferred();
    }

    /// A branch: makes A readable while connect requests wait for the program.
    pub(super) fn ring_if_deferred(&self) {
        let _q = lock(&self.queue);
        if !lock(&self.deferred).is_empty() {
            self.bell.set_readable(true);
        }
    }

    /// A branch (helper): the owner's doorbell rang, its queue may hold a connection.
    pub(in crate::engine) fn owner_rang(&self) {
        let mut q = lock(&self.queue);
        q.owner_rang = true;
        self.bell.set_readable(true);
    }

    /// A branch: whether the owner's doorbell rang since this was last asked.
    pub fn take_owner_rang(&self) -> bool {
        std::mem::take(&mut lock(&self.queue).owner_rang)
    }

    /// A branch: the owner's queue may hold more (a connection was just taken from it).
    pub fn owner_may_have_more(&self) {
        self.owner_rang();
    }

    /// A branch, for the program's accept: the next stream set up here; else the next
    /// connect request or link OPEN waiting here, answered now, on this thread. The stream
    /// is the program's at once (a connect's writes wait for the connection to be
    /// established), so none can be left queued for an accept that gave up on it.
    pub fn branch_take(&self, engine: &'static Engine) -> Option<Accepted> {
        loop {
            if let Some(a) = lock(&self.queue).items.pop_front() {
                return Some(a);
            }
            let (came, w) = lock(&self.deferred).pop_front()?;
            engine.deferred.fetch_sub(1, Relaxed);
            log::debug!(
                "branch {:#x}: answering a request that waited {} us",
                self.branch_id,
                came.elapsed().as_micros()
            );
            self.answer(engine, w); // then taken from the queue, above
        }
    }

    /// A branch (helper): the requests its program has not accepted that waited longer
    /// than [`SEND_BACK_AFTER`] are refused, and their clients connect to the owner, whose
    /// queue any process accepting from the listener takes from (this one is busy). Whether
    /// requests still wait here.
    pub(in crate::engine) fn send_back_stale(&self, engine: &Engine) -> bool {
        let mut d = lock(&self.deferred);
        let mut stale = Vec::new();
        while d
            .front()
            .is_some_and(|(at, _)| at.elapsed() >= SEND_BACK_AFTER)
        {
            stale.extend(d.pop_front().map(|(_, w)| w));
        }
        let left = !d.is_empty();
        log::trace!(
            "branch {:#x}: {} waiting, {} stale",
            self.branch_id,
            d.len(),
            stale.len()
        );
        drop(d);
        engine.deferred.fetch_sub(stale.len(), Relaxed);
        for w in stale {
            w.refuse("the branch's program did not accept it in time");
        }
        left
    }

    /// A branch, for the program's blocking accept, once links came in here: waits (up to
    /// a second) on its A and on their device, whose OPENs this thread then handles itself
    /// rather than a thread hop later — as a listener's accept does. `false` at once
    /// without links (the caller waits on A alone, outside the shim).
    pub fn wait_on_links(&self, engine: &Engine) -> bool {
        // (A statement of its own: a match on it would hold the links' lock while it waits.)
        let dev = lock(&engine.links).dev_of_listener(self.token);
        let Some(dev) = dev else {
            return false;
        };
        self.wait_on_link(engine, &dev, false, || self.has_work());
        true
    }

    /// A branch: whether something waits here — a stream, a request — or the owner's
    /// doorbell rang since it was last asked.
    fn has_work(&self) -> bool {
        self.has_work_in(&lock(&self.queue))
    }

    fn has_work_in(&self, q: &super::Queue) -> bool {
        !q.items.is_empty() || q.owner_rang || !lock(&self.deferred).is_empty()
    }

    /// A branch: A stops being readable if nothing waits here (under the queue lock, which
    /// every ring takes).
    pub fn settle(&self) {
        let q = lock(&self.queue);
        if !self.has_work_in(&q) {
            self.bell.set_readable(false);
        }
    }
}

/// The branches this process made, by the listener they are branches of (its owner's pid
/// and nonce, its token); `None`: none could be made there, and none is tried again.
pub type Made = HashMap<(i32, u64, u64), Option<Arc<Listener>>>;

/// Most destinations whose redirect a process remembers.
const MAX_REDIRECTS: usize = 1024;

/// Whether connect requests may wait at this process's branches (the helper then looks
/// often enough to send back the stale ones). Set where a request is queued, cleared by the
/// helper's look.
static WAITING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// How long a connect request waits at a branch for its program to accept before it is sent
/// back to the owner.
pub const SEND_BACK_AFTER: std::time::Duration = std::time::Duration::from_millis(50);

/// Connects that go where a redirect sent the last one before the owner is asked again.
const HINT_USES: u32 = 8;

impl Engine {
    /// This process's branch of `l` (a listener another process owns), made at the first
    /// call: `true` with a branch just made, whose A the program's fds must become.
    /// `nonblock`: the program's listener file flag, which A takes.
    pub fn branch_of(
        &'static self,
        l: &Arc<Listener>,
        nonblock: bool,
    ) -> Option<(Arc<Listener>, bool)> {
        let key = (l.owner.pid, l.owner.nonce, l.token);
        if let Some(made) = lock(&self.branches).get(&key) {
            return made.clone().map(|b| (b, false));
        }
        let made = self.make_branch(l, nonblock);
        lock(&self.branches).insert(key, made.clone());
        made.map(|b| (b, true))
    }

    fn make_branch(&'static self, l: &Arc<Listener>, nonblock: bool) -> Option<Arc<Listener>> {
        // This process's copy of the owner's A: the proof for ipc, and what rings.
        let owners_a = l.bell().app_fd();
        let local = crate::sys::sockaddr::local_of(l.tcp_fd)?;
        let (_, v6only) = crate::sys::sockaddr::family_of(l.tcp_fd)?;
        if owners_a < 0 {
            return None;
        }
        let afonly = crate::addr::listen_afonly(local, v6only);
        let token = self.token();
        let any_port = SocketAddr::new(local.ip(), 0);
        let rl = match rdma::CmListener::bind_afonly(any_port, afonly, 4096, token) {
            Ok(rl) => rl,
            Err(e) => {
                log::info!("listener on {local}: no branch here: {e}");
                return None;
            }
        };
        let port = rl.id().local_addr().map_or(0, |a| a.port());
        let id = crate::sys::unix::random_u64() & ipc::BRANCH_ID_MASK | 1;
        let b = Listener::branch(self, rl, token, l.sizes, nonblock, id, local.port()).ok()?;
        let req = ipc::Request::Branch {
            token: l.token,
            port,
            id,
            taker: self.owner,
        };
        let mut owner = l.owner;
        match ipc::call(&mut owner, &req, owners_a) {
            Ok((ipc::Reply::Done, _)) => {}
            other => {
                log::info!(
                    "listener on {local}: pid {} took no branch: {other:?}",
                    l.owner.pid
                );
                b.close(self);
                return None;
            }
        }
        let edge = (libc::EPOLLIN | libc::EPOLLET) as u32;
        if let Err(e) = self.epoll_ctl(libc::EPOLL_CTL_ADD, owners_a, edge, TAG_BRANCH_RANG | token)
        {
            log::warn!("listener on {local}: cannot watch its owner's doorbell: {e}");
        }
        log::info!(
            "listener on {local}: branch {id:#x} on rdma_cm port {port}, pid {} redirects to it",
            l.owner.pid
        );
        Some(b)
    }

    /// The program let go of `l` (a listener another process owns), or this process is
    /// about to change its credentials: its branch here, if any, is withdrawn from the
    /// owner and closed — requests waiting on it are refused, and their clients connect to
    /// the owner instead. Whether there was one.
    pub fn close_branch_of(&'static self, l: &Listener) -> bool {
        let key = (l.owner.pid, l.owner.nonce, l.token);
        let Some(b) = lock(&self.branches).remove(&key).flatten() else {
            return false;
        };
        let owners_a = l.bell().app_fd();
        self.unwatch(owners_a);
        let req = ipc::Request::Branch {
            token: l.token,
            port: 0,
            id: b.branch_id,
            taker: self.owner,
        };
        let mut owner = l.owner;
        let _ = ipc::call(&mut owner, &req, owners_a);
        b.close(self);
        true
    }

    /// Owner: process `caller` asks to be (`port` nonzero) or no longer be a branch of `l`.
    pub(in crate::engine) fn set_branch(
        &self,
        l: &Listener,
        caller: ipc::Owner,
        port: u16,
        id: u64,
    ) {
        l.branches.set(caller.pid, port, id);
        l.served_elsewhere();
    }

    /// Helper: how soon it must look again at requests waiting at branches (ms), if any do.
    pub(in crate::engine) fn branch_requests_due(&self) -> Option<i32> {
        WAITING
            .load(Relaxed)
            .then_some(SEND_BACK_AFTER.as_millis() as i32 / 5)
    }

    /// Helper: sends the stale requests of every branch back to their owners.
    pub(in crate::engine) fn send_back_stale_requests(&self) {
        // Cleared first: a request that comes meanwhile sets it again (`defer_open` runs on
        // any thread).
        if !WAITING.swap(false, Relaxed) {
            return;
        }
        let branches: Vec<Arc<Listener>> = lock(&self.listeners)
            .values()
            .filter(|l| l.is_branch())
            .cloned()
            .collect();
        let mut left = false;
        for b in branches {
            left |= b.send_back_stale(self);
        }
        if left {
            WAITING.store(true, Relaxed);
        }
    }

    /// Where the last connect to `dest` was redirected, for the next few connects: then
    /// the owner is asked again, so that one client's connections spread over the branches
    /// as the owner picks them in turn.
    pub(in crate::engine) fn redirect_hint(&self, dest: SocketAddr) -> Option<Redirect> {
        let mut m = lock(&self.redirects);
        let (r, uses) = m.get_mut(&dest)?;
        *uses += 1;
        let r = *r;
        if *uses >= HINT_USES {
            m.remove(&dest);
        }
        Some(r)
    }

    pub(in crate::engine) fn remember_redirect(&self, dest: SocketAddr, r: Redirect) {
        let mut m = lock(&self.redirects);
        if m.len() >= MAX_REDIRECTS {
            m.clear();
        }
        m.insert(dest, (r, 0));
    }

    pub(in crate::engine) fn forget_redirect(&self, dest: SocketAddr) {
        lock(&self.redirects).remove(&dest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ports(b: &Branches) -> Vec<u16> {
        lock(&b.list).iter().map(|r| r.port).collect()
    }

    #[test]
    fn a_process_has_one_branch_and_withdraws_only_its_own() {
        let b = Branches::default();
        let me = crate::sys::raw::getpid();
        b.set(me, 1000, 7);
        b.set(me, 1001, 8); // a new branch of the same process replaces the old
        assert_eq!(ports(&b), [1001]);
        b.set(me, 0, 7); // withdrawing a branch it no longer has changes nothing
        assert_eq!(ports(&b), [1001]);
        b.set(me, 0, 8);
        assert!(ports(&b).is_empty());
    }

    /// This process's branch on port 1000 (id 1) and its parent's on port 2000 (id 2):
    /// two live processes.
    fn two_branches() -> (Branches, i32) {
        let b = Branches::default();
        let parent = unsafe { libc::getppid() };
        b.set(crate::sys::raw::getpid(), 1000, 1);
        b.set(parent, 2000, 2);
        (b, parent)
    }

    #[test]
    fn branches_are_picked_in_turn_and_gone_processes_dropped() {
        let (b, _) = two_branches();
        let now = Instant::now();
        let first: Vec<u16> = (0..4).map(|_| b.pick(now).unwrap().port).collect();
        assert_eq!(first, [1000, 2000, 1000, 2000]);
        // No process has pid i32::MAX (the kernel's pid_max is at most 2^22).
        b.set(i32::MAX, 3000, 3);
        let seen: Vec<u16> = (0..6).map(|_| b.pick(now).unwrap().port).collect();
        assert!(!seen.contains(&3000), "{seen:?}");
        assert_eq!(ports(&b).len(), 2);
        let none = Branches::default();
        assert!(none.pick(now).is_none());
    }

    #[test]
    fn a_branch_that_sent_a_client_back_is_skipped_until_free_or_a_while_passed() {
        let (b, parent) = two_branches();
        let now = Instant::now();
        b.set_busy(2, now);
        b.set_busy(99, now); // not one of ours: nothing changes
        let seen: Vec<u16> = (0..4).map(|_| b.pick(now).unwrap().port).collect();
        assert_eq!(seen, [1000; 4]);
        // Every branch busy: the owner keeps the client.
        b.set_busy(1, now);
        assert!(b.pick(now).is_none());
        // Its process came for a connection of the owner's queue: free again.
        b.set_free(parent);
        assert_eq!(b.pick(now).map(|r| r.port), Some(2000));
        // Or the time passed.
        let later = now + BUSY_FOR + Duration::from_millis(1);
        let seen: Vec<u16> = (0..4).map(|_| b.pick(later).unwrap().port).collect();
        assert!(seen.contains(&1000) && seen.contains(&2000), "{seen:?}");
    }
}
