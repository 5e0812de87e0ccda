//! Dual listen: a kernel TCP listener and an rdma_cm listener on the same address and port,
//! feeding one accept queue in arrival order.
//!
//! The program's listening fd becomes a doorbell's A, readable while the queue is not empty;
//! the kernel listener lives on as a shim-internal fd. The helper thread takes connections
//! from both as they arrive (TCP ones with `accept4`, RDMA ones after their handshake), up to
//! the backlog; `accept()` pops the queue.
//!
//! RDMA connect requests beyond the backlog wait in a deferred queue, unanswered, until
//! `accept()` makes room — as a kernel listener drops the SYNs of a full queue and the
//! client's retries get in later. Refusing them instead would send a burst of clients larger
//! than the backlog to kernel TCP for their lifetime.

use super::error::Error;
use super::stream::Stream;
use super::tags::{TAG_LISTEN_RDMA, TAG_LISTEN_TCP};
use super::{lock, Engine};
use crate::proto::link::record::{Open, RefuseReason};
use crate::rdma;
use crate::readiness::Doorbell;
use crate::sys::{fcntl, real};
use libc::c_int;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod branch;
mod opens;
pub use branch::{Branches, Made};

/// Most connect requests a listener keeps unanswered while its accept queue is full; more
/// are refused (the client falls back to TCP, counted as `resources`). Each holds an
/// rdma_cm id and its event channel's fd.
const MAX_DEFERRED: usize = 4096;

/// An rdma_cm listener made by [`Listener::prepare`], waiting for [`Listener::start`].
pub struct RdmaListen {
    rl: rdma::CmListener,
    token: u64,
    sizes: super::BufSizes,
}

/// A connection request waiting for room in the accept queue, or at a branch for its
/// program's accept.
// Most are connect requests, kept inline as before (boxing would allocate one each).
#[allow(clippy::large_enum_variant)]
pub(super) enum Waiting {
    /// An rdma_cm connect request, unanswered.
    Request(rdma::Incoming),
    /// A link's OPEN at a branch (`branch.rs`), unanswered.
    Open(Arc<super::link::Link>, Open),
}

impl Waiting {
    /// Refuses it: its client connects elsewhere (the owner, or kernel TCP).
    fn refuse(self, why: &str) {
        match self {
            Waiting::Request(inc) => super::setup::refuse_request(inc, why),
            Waiting::Open(link, open) => {
                log::info!("refusing a stream on rdma link from {}: {why}", link.peer);
                super::link::refuse_open(&link, &open, RefuseReason::NotMine)
            }
        }
    }
}

/// A connection waiting for `accept()`.
pub enum Accepted {
    /// A kernel TCP connection (a peer without rsock): its fd.
    Tcp(c_int),
    /// An RDMA stream.
    Rdma(Arc<Stream>),
}

/// See the module doc.
pub struct Listener {
    /// Names it in the owner's engine (and in ipc requests).
    pub token: u64,
    /// The process whose engine runs it; others accept through it (`ipc`).
    pub owner: super::ipc::Owner,
    /// Buffer sizes of the connections it accepts (config, or the rule that matched).
    pub(super) sizes: super::BufSizes,
    /// None for a listener another process owns and this one received ([`Listener::foreign`]).
    rdma: Mutex<Option<rdma::CmListener>>,
    /// The rdma_cm listener's event channel (its id lives in that file); -1 if none here.
    pub rdma_fd: c_int,
    /// The kernel listening socket (shim-internal fd, nonblocking).
    pub tcp_fd: c_int,
    bell: Doorbell,
    queue: Mutex<Queue>,
    /// Accepted RDMA connections whose handshake is not finished yet.
    pending: AtomicUsize,
    /// Connect requests not answered yet: the queue was full when they came (module doc).
    /// Each with when it came (a branch sends one back to the owner once it waited long).
    deferred: Mutex<VecDeque<(std::time::Instant, Waiting)>>,
    backlog: usize,
    nonblocking: AtomicBool,
    /// Another process has accepted through it (`ipc` Accept).
    served_elsewhere: AtomicBool,
    /// Nonzero for a branch (`branch.rs`): this process's own rdma_cm listener for a
    /// listener another process owns, taking only the clients redirected to it, and
    /// answering each when the program accepts.
    pub(super) branch_id: u64,
    /// A branch: the port of the listener it is a branch of, which its streams show as
    /// their local port (their rdma_cm port is the branch's own).
    shown_port: u16,
    /// The branches of this listener (other processes accepting from it), for redirects.
    pub(super) branches: branch::Branches,
    /// Messages that carried it to another process (`SCM_RIGHTS`), and the descriptions it
    /// gave (each receiver asks once, and gets its copy of the kernel listener then).
    sent: AtomicUsize,
    described: AtomicUsize,
}

/// How many listeners this process owns and has not closed (for the exit hand-off, read
/// from `_exit`, which takes no lock).
pub(super) static OWNED: AtomicUsize = AtomicUsize::new(0);

struct Queue {
    items: VecDeque<Accepted>,
    shown_readable: bool,
    /// A branch: the owner's queue may hold connections (its doorbell rang since this
    /// process last found it empty).
    owner_rang: bool,
    tcp_armed: bool,
    closed: bool,
}

impl Queue {
    fn new(owner_rang: bool, tcp_armed: bool, closed: bool) -> Queue {
        Queue {
            items: VecDeque::new(),
            shown_readable: false,
            owner_rang,
            tcp_armed,
            closed,
        }
    }
}

impl Listener {
    /// The fields every kind of listener sets; the rest start empty (a branch sets its own).
    #[allow(clippy::too_many_arguments)]
    fn base(
        token: u64,
        owner: super::ipc::Owner,
        sizes: super::BufSizes,
        rl: Option<rdma::CmListener>,
        tcp_fd: c_int,
        bell: Doorbell,
        backlog: usize,
        nonblock: bool,
        queue: Queue,
    ) -> Listener {
        Listener {
            token,
            owner,
            sizes,
            rdma_fd: rl.as_ref().map_or(-1, |rl| rl.fd()),
            rdma: Mutex::new(rl),
            tcp_fd,
            bell,
            queue: Mutex::new(queue),
            pending: AtomicUsize::new(0),
            deferred: Mutex::new(VecDeque::new()),
            backlog,
            nonblocking: AtomicBool::new(nonblock),
            served_elsewhere: AtomicBool::new(false),
            branch_id: 0,
            shown_port: 0,
            branches: Default::default(),
            sent: AtomicUsize::new(0),
            described: AtomicUsize::new(0),
        }
    }

    /// First half of a dual listen, before the kernel socket listens: an rdma_cm listener on
    /// the same address and port, so that it is there as soon as the kernel one is visible.
    /// `afonly`: for an IPv6 wildcard, the socket's `IPV6_V6ONLY` (`crate::addr::listen_afonly`).
    pub fn prepare(
        engine: &'static Engine,
        addr: SocketAddr,
        afonly: Option<bool>,
        backlog: c_int,
        sizes: super::BufSizes,
    ) -> Result<RdmaListen, Error> {
        let token = engine.token();
        let rl = rdma::CmListener::bind_afonly(addr, afonly, backlog.clamp(1, 4096), token)
            .map_err(|e| Error::new(None, e))?;
        Ok(RdmaListen { rl, token, sizes })
    }

    /// Second half of a dual listen, once the kernel socket listens: makes the program's
    /// `fd` the doorbell and starts feeding the accept queue. On error nothing changed.
    pub fn start(
        engine: &'static Engine,
        fd: c_int,
        prepared: RdmaListen,
        backlog: c_int,
    ) -> Result<Arc<Listener>, Error> {
        let RdmaListen { rl, token, sizes } = prepared;
        let backlog = backlog.clamp(1, 4096) as usize;
        // The program's fd, which it gave us in listen().
        let (nonblock, cloexec) = fcntl::fd_flags(fd);
        let bell = Doorbell::new(nonblock).map_err(|e| Error::new(None, e))?;
        bell.set_writable(false); // a listening socket never polls writable
        let tcp_fd = fcntl::dup_hidden(fd); // the listening socket; we own the copy
        if tcp_fd < 0 {
            return Err(Error::at("dup")(std::io::Error::last_os_error()));
        }
        let l = Arc::new(Listener::base(
            token,
            engine.owner,
            sizes,
            Some(rl),
            tcp_fd,
            bell,
            backlog,
            nonblock,
            Queue::new(false, true, false),
        ));
        // A says whose listener it is, for a process that receives it with SCM_RIGHTS.
        let _ = crate::sys::unix::bind_abstract(
            l.bell.app_fd(),
            &super::ipc::stream_name(&engine.owner, token),
        );
        if let Err(e) = l.bell.install_at(fd, cloexec) {
            crate::sys::raw::close(tcp_fd);
            return Err(Error::at("installing the doorbell")(e));
        }
        // The kernel listener's file is ours alone now: nonblocking for the helper.
        fcntl::set_only_nonblock(tcp_fd);
        lock(&engine.listeners).insert(token, l.clone());
        OWNED.fetch_add(1, Relaxed);
        let watched = engine
            .watch(l.rdma_fd, TAG_LISTEN_RDMA | token)
            .and_then(|_| engine.watch_oneshot(tcp_fd, TAG_LISTEN_TCP | token));
        if let Err(e) = watched {
            log::error!("listener on fd {fd}: cannot watch its fds: {e}");
        }
        engine.ensure_helper();
        Ok(l)
    }

    /// A listener `owner` runs, whose A this process received with `SCM_RIGHTS` (an acceptor
    /// handing its listener to a worker, a seamless reload): `app` is a private fd of that A,
    /// `tcp_fd` the kernel listener the owner sent with its description. Accepts go through
    /// the owner (`api::inherit::accept`), as a prefork worker's do.
    pub fn foreign(
        owner: super::ipc::Owner,
        token: u64,
        sizes: super::BufSizes,
        app: c_int,
        tcp_fd: c_int,
    ) -> Arc<Listener> {
        Arc::new(Listener::base(
            token,
            owner,
            sizes,
            None,
            tcp_fd,
            Doorbell::from_fds(app, -1),
            libc::SOMAXCONN as usize,
            false,
            Queue::new(false, false, true),
        ))
    }

    /// A branch (`branch.rs`) of a listener another process owns: `rl` is this process's
    /// rdma_cm listener on an ephemeral port, watched by the helper; the doorbell is new,
    /// its A not installed anywhere yet. Never counted as an owned listener: nothing of it
    /// is handed on at exit (its clients, unanswered, go back to the owner).
    pub(super) fn branch(
        engine: &'static Engine,
        rl: rdma::CmListener,
        token: u64,
        sizes: super::BufSizes,
        nonblock: bool,
        id: u64,
        shown_port: u16,
    ) -> Result<Arc<Listener>, Error> {
        let bell = Doorbell::new(nonblock).map_err(|e| Error::new(None, e))?;
        bell.set_writable(false);
        let l = Arc::new(Listener {
            branch_id: id,
            shown_port,
            ..Listener::base(
                token,
                engine.owner,
                sizes,
                Some(rl),
                -1,
                bell,
                libc::SOMAXCONN as usize,
                nonblock,
                // The owner's queue may hold connections already.
                Queue::new(true, true, false),
            )
        });
        // The owner's queue may hold connections that rang its doorbell before the program's
        // fds became this A: the program looks once (at worst, an accept that says EAGAIN).
        l.bell.set_readable(true);
        lock(&engine.listeners).insert(token, l.clone());
        if let Err(e) = engine.watch(l.rdma_fd, TAG_LISTEN_RDMA | token) {
            lock(&engine.listeners).remove(&token);
            return Err(Error::new(None, e));
        }
        engine.ensure_helper();
        Ok(l)
    }

    /// The accept queue's bound (the program's backlog, clamped).
    pub fn backlog(&self) -> c_int {
        self.backlog as c_int
    }

    /// The doorbell whose A the program holds.
    pub fn bell(&self) -> &Doorbell {
        &self.bell
    }

    /// Records the program's `O_NONBLOCK`.
    pub fn set_nonblocking(&self, on: bool) {
        self.nonblocking.store(on, Relaxed);
    }

    pub(super) fn has_room(&self) -> bool {
        if self.is_branch() {
            return false; // a branch answers a request when its program accepts
        }
        lock(&self.queue).items.len() + self.pending.load(Relaxed) < self.backlog
    }

    /// Whether a link's stream may be queued: as many as the backlog and the connect
    /// requests deferred beyond it may be (a link's OPEN is answered at once, so it is not
    /// deferred; the accept queue holds it instead).
    pub(super) fn has_room_for_link_stream(&self) -> bool {
        lock(&self.queue).items.len() + self.pending.load(Relaxed) < self.backlog + MAX_DEFERRED
    }

    /// Answers what waited: a connect request is accepted as a stream that joins this
    /// listener's queue once established; a link's OPEN as a stream queued at once.
    fn answer(&self, engine: &'static Engine, w: Waiting) {
        match w {
            Waiting::Request(inc) => self.accept_request(engine, inc),
            Waiting::Open(link, open) => {
                super::link::accept_waiting_open(&link, engine, self, open)
            }
        }
    }

    fn accept_request(&self, engine: &'static Engine, inc: rdma::Incoming) {
        // A link (engine/link.rs) carries this listener's streams, accepted as it opens them.
        if super::link::is_link_request(inc.event.private_data()) {
            return super::link::accept_link(engine, (self.token, self.is_branch()), inc);
        }
        if self.is_branch() {
            // On the program's accepting thread: the stream is its at once (writes wait for
            // the connection to be established), and none is left queued here for an accept
            // that gave up on it — a program may stop watching the listener after an accept
            // (nginx's accept_mutex), and a kernel listener would have given the connection
            // to another process.
            let at = Some((self.branch_id, self.shown_port));
            if let Some(s) = super::setup::accept_request(engine, self.sizes, inc, at, |_| {}) {
                self.push_stream(s);
            }
            return;
        }
        super::setup::accept_request(engine, self.sizes, inc, None, |s| {
            s.pending_for.store(self.token, Relaxed);
            self.pending.fetch_add(1, Relaxed);
        });
    }

    /// Queues `s` for `accept()` (a stream a link's peer opened).
    pub(super) fn push_stream(&self, s: Arc<Stream>) {
        self.push(Accepted::Rdma(s));
    }

    fn push(&self, a: Accepted) {
        let mut q = lock(&self.queue);
        if q.closed {
            drop(q);
            discard(a);
            return;
        }
        q.items.push_back(a);
        // A token per connection, as a kernel listener wakes a waiter per connection: with
        // EPOLLEXCLUSIVE each token wakes another worker while the first is busy.
        q.shown_readable = true;
        self.bell.set_readable(true);
    }

    /// Helper thread: connect requests on the rdma_cm listener, answered in arrival order
    /// while the accept queue has room, deferred after that.
    pub(super) fn on_rdma_ready(self: &Arc<Self>, engine: &'static Engine) {
        loop {
            let next = match lock(&self.rdma).as_ref() {
                Some(rl) => rl.next_request(Some(Duration::ZERO), &super::setup::no_room()),
                None => return,
            };
            match next {
                Ok(Some(inc)) => {
                    let Some(inc) = self.redirect(inc) else {
                        continue;
                    };
                    // A link to a branch is set up at once: its OPENs are what wait here.
                    if self.is_branch() && super::link::is_link_request(inc.event.private_data()) {
                        super::link::accept_link(engine, (self.token, true), inc);
                        continue;
                    }
                    let mut d = lock(&self.deferred);
                    if d.len() < MAX_DEFERRED {
                        d.push_back((std::time::Instant::now(), Waiting::Request(inc)));
                        engine.deferred.fetch_add(1, Relaxed);
                    } else {
                        drop(d);
                        super::setup::refuse_request(inc, "too many connect requests waiting");
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    log::warn!("rdma listener: {e}");
                    break;
                }
            }
        }
        if self.is_branch() {
            return self.requests_came(); // answered when the program accepts
        }
        self.admit_deferred(engine);
    }

    /// Answers deferred connect requests while the accept queue has room (helper thread).
    pub(super) fn admit_deferred(self: &Arc<Self>, engine: &'static Engine) {
        if self.is_branch() {
            return; // a branch answers a request when its program accepts
        }
        while self.has_room() {
            let Some((_, w)) = lock(&self.deferred).pop_front() else {
                return;
            };
            engine.deferred.fetch_sub(1, Relaxed);
            self.answer(engine, w);
        }
        let waiting = lock(&self.deferred).len();
        if waiting > 0 {
            log::debug!("accept queue full: {waiting} rdma connect requests wait for accept()");
        }
    }

    /// Helper thread: kernel TCP connections waiting on the internal listener.
    pub(super) fn on_tcp_ready(&self, engine: &Engine) {
        loop {
            if !self.has_room() {
                lock(&self.queue).tcp_armed = false; // re-armed by accept()
                return;
            }
            // SAFETY: accept4 on our nonblocking listener; no address wanted.
            let fd = unsafe {
                real::accept4(
                    self.tcp_fd,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_CLOEXEC,
                )
            };
            if fd < 0 {
                break; // EAGAIN (or an aborted connection): wait for the next readiness
            }
            self.push(Accepted::Tcp(fd));
        }
        engine.rearm_oneshot(self.tcp_fd, TAG_LISTEN_TCP | self.token);
    }

    /// The program's `accept()`: the next connection, waiting unless nonblocking.
    pub fn accept(&self, engine: &Engine) -> Result<Accepted, c_int> {
        let mut spin = true;
        loop {
            if let Some(a) = self.try_pop(engine) {
                return Ok(a);
            }
            if self.nonblocking.load(Relaxed) {
                return Err(libc::EAGAIN);
            }
            let link_dev = lock(&engine.links).dev_of_listener(self.token);
            match link_dev {
                Some(dev) => {
                    let queued = || !lock(&self.queue).items.is_empty();
                    self.wait_on_link(engine, &dev, std::mem::take(&mut spin), queued)
                }
                None => {
                    crate::sys::unix::wait(self.bell.app_fd(), libc::POLLIN, 1000);
                }
            }
        }
    }

    /// `accept()`'s wait while links came in on this listener: their streams arrive as
    /// OPENs on the link's queue pair, which this thread polls for the spin budget and then
    /// sleeps on, beside the doorbell. An OPEN handled by the helper instead would reach
    /// the program one thread hop later, on every connection. `spin` only on an accept's
    /// first wait: a wake-up for another stream's completion (a fork child's relayed
    /// stream, say) must not cost a spin each time.
    /// `done`: what ends the wait (a stream queued; at a branch, anything for the program).
    fn wait_on_link(
        &self,
        engine: &Engine,
        dev: &Arc<super::Dev>,
        spin: bool,
        done: impl Fn() -> bool,
    ) {
        let mut budget = engine.poll_budget.spin();
        while spin && !done() && budget.go_on() {
            engine.progress(dev);
            std::hint::spin_loop();
        }
        if !done() {
            super::link::sleep_on_device(engine, dev, self.bell.app_fd(), 1000, done);
        }
    }

    /// The next queued connection, if any (this process's `accept`, or another's over ipc).
    pub(super) fn try_pop(&self, engine: &Engine) -> Option<Accepted> {
        let mut q = lock(&self.queue);
        let a = q.items.pop_front()?;
        if q.items.is_empty() && q.shown_readable {
            q.shown_readable = false;
            self.bell.set_readable(false);
        }
        if !q.tcp_armed {
            q.tcp_armed = true;
            engine.rearm_oneshot(self.tcp_fd, TAG_LISTEN_TCP | self.token);
        }
        drop(q);
        if engine.deferred.load(Relaxed) > 0 {
            engine.wake(); // room for a deferred request: the helper answers it
        }
        Some(a)
    }

    /// Drops the doorbell's own fd of A under the queue lock (its readiness changes take it).
    pub(super) fn release_app(&self) {
        let _q = lock(&self.queue);
        self.bell.release_app();
    }

    /// Another process accepted through it: noted for [`shared`](Self::shared).
    pub(super) fn served_elsewhere(&self) {
        self.served_elsewhere.store(true, Relaxed);
    }

    /// The program sent it to another process (`SCM_RIGHTS`).
    pub fn sent_away(&self) {
        self.sent.fetch_add(1, Relaxed);
    }

    /// A receiver got its description (and its copy of the kernel listener).
    pub(super) fn described(&self) {
        self.described.fetch_add(1, Relaxed);
    }

    /// Sent to a process that has not asked for its description yet: without it, that
    /// process cannot take the listener over once this one is gone.
    pub(super) fn awaits_description(&self) -> bool {
        self.described.load(Relaxed) < self.sent.load(Relaxed) && self.bell.peer_holds()
    }

    /// Whether other processes use it: they accepted through it, or they hold it while this
    /// process's program does not.
    pub(super) fn shared(&self) -> bool {
        self.served_elsewhere.load(Relaxed) || (self.bell.app_fd() < 0 && self.bell.peer_holds())
    }

    /// Connections waiting for `accept()`.
    pub(super) fn queued(&self) -> usize {
        lock(&self.queue).items.len()
    }

    /// This process is about to exit while others use the listener: it takes no more
    /// connections in — the kernel listener keeps them for whoever accepts next, and its
    /// rdma_cm listener goes (the port is free for the next owner; RDMA clients meanwhile
    /// fall back) — while the queue it has is accepted through it.
    pub(super) fn stop_feeding(&self, engine: &Engine) {
        if lock(&self.rdma).is_some() {
            engine.unwatch(self.rdma_fd);
        }
        engine.unwatch(self.tcp_fd);
        lock(&self.queue).tcp_armed = true; // so that no accept re-arms it
        drop(lock(&self.rdma).take());
        let deferred: Vec<_> = lock(&self.deferred).drain(..).collect();
        engine.deferred.fetch_sub(deferred.len(), Relaxed);
        for (_, w) in deferred {
            w.refuse("listener's owner exiting");
        }
    }

    /// No process holds the listener any more: stop both halves and drop the queue.
    pub fn close(&self, engine: &Engine) {
        if lock(&self.rdma).is_some() {
            engine.unwatch(self.rdma_fd); // (after stop_feeding the number may be another's)
        }
        // The rdma_cm id goes now, not with the last reference: before a credential change
        // this is the last moment the kernel lets this process destroy it.
        drop(lock(&self.rdma).take());
        engine.unwatch(self.tcp_fd);
        if lock(&engine.listeners).remove(&self.token).is_some() && !self.is_branch() {
            OWNED.fetch_sub(1, Relaxed);
        }
        // Links that came in here open no stream any more: they say GOODBYE, which voids
        // the streams granted to their peers (a connect takes none of them from now on).
        let links = lock(&engine.links).of_listener(self.token);
        for l in links {
            l.goodbye();
        }
        let items: Vec<Accepted> = {
            let mut q = lock(&self.queue);
            q.closed = true;
            self.bell.release_app(); // under the lock its readiness changes take
            q.items.drain(..).collect()
        };
        items.into_iter().for_each(discard);
        let deferred: Vec<_> = lock(&self.deferred).drain(..).collect();
        engine.deferred.fetch_sub(deferred.len(), Relaxed);
        for (_, w) in deferred {
            w.refuse("listener closed");
        }
        if self.tcp_fd >= 0 {
            crate::sys::raw::close(self.tcp_fd);
        }
    }
}

/// Gets rid of a connection nobody will accept.
fn discard(a: Accepted) {
    match a {
        Accepted::Tcp(fd) => crate::sys::raw::close(fd),
        Accepted::Rdma(s) => {
            if let Some(e) = super::get() {
                s.app_closed(true);
                e.retire(s);
            }
        }
    }
}

/// The listener an accepted stream not yet established waits for, taken: `None` if it was
/// not pending, `Some(None)` if its listener has closed since.
fn pending_listener(engine: &Engine, s: &Stream) -> Option<Option<Arc<Listener>>> {
    match s.pending_for.swap(0, Relaxed) {
        0 => None,
        token => Some(lock(&engine.listeners).get(&token).cloned()),
    }
}

/// An accepted stream's ESTABLISHED event: queue it for `accept()` (or, its listener closed
/// in the meantime, discard it as the closed queue would).
pub(super) fn established(engine: &Engine, s: &Arc<Stream>) {
    match pending_listener(engine, s) {
        Some(Some(l)) => {
            l.pending.fetch_sub(1, Relaxed);
            l.push(Accepted::Rdma(s.clone()));
        }
        Some(None) => discard(Accepted::Rdma(s.clone())),
        None => {}
    }
}

/// An accepted stream failed before ESTABLISHED: forget it.
pub(super) fn abandon_pending(engine: &'static Engine, s: &Arc<Stream>) {
    if let Some(l) = pending_listener(engine, s) {
        if let Some(l) = l {
            l.pending.fetch_sub(1, Relaxed);
        }
        s.app_closed(true);
        engine.retire(s.clone());
    }
}
