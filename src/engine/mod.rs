//! The progress engine: this process's RDMA streams and listeners, and the helper thread
//! that advances them when no application thread does (docs/DESIGN.md).
//!
//! - [`stream`]: one RDMA-carried TCP stream (protocol + QP + memory + doorbell).
//! - [`listener`]: a dual listener (kernel TCP + rdma_cm on the same address and port).
//! - `setup`: building streams — active connect and passive accept, with the rsock handshake.
//! - `helper`: the thread: rdma_cm events, CQ events, listener fds, teardown of closed streams.
//!
//! One engine per process, made on first use when an RDMA device is present; a forked child
//! gets none and never touches its parent's (the queue pairs are not usable there): it asks
//! the owner over `ipc` instead, and the owner relays (docs/DESIGN.md, "Processes").

mod helper;
pub mod ipc;
pub mod listener;
mod liveness;
mod peeked;
pub mod relay;
mod setup;
mod spin;
pub mod stream;
mod takeover;
pub mod waits;

use crate::config::Config;
use crate::negcache::NegCache;
use crate::rdma::{self, Device, EventChannel, Wc};
use libc::c_int;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, MutexGuard, Once};
use std::time::Duration;

pub use listener::{Accepted, Listener, RdmaListen};
pub use setup::{opts_socket, BufSizes};
pub use stream::Stream;
pub use takeover::{take_over, Inherited, TakeError};

/// This process's last fd of an RDMA socket is closed. The owner lets the connection finish
/// in the background (or resets it, for `SO_LINGER` with a zero timeout) once no other
/// process holds it either, or stops a listener; any other process only drops its own copy
/// of the doorbell (what the owner watches to learn that the last holder is gone).
pub fn detach(a: crate::socket::Attachment) {
    let Some(_g) = crate::guard::enter() else {
        return;
    };
    // `get` only for the owner: another process has nothing of its own to close.
    match a {
        crate::socket::Attachment::Stream(s) => {
            // Only the owner's own threads make calls on it (a fork child's copy of the
            // counter may show a parent thread's call, which never ends there).
            if !(s.owner().is_me() && s.defer_close()) {
                stream_fd_closed(&s);
            }
        }
        crate::socket::Attachment::Listener(l) => match l.owner.is_me().then(get).flatten() {
            // Like a kernel listener, it lives while any process holds it (prefork masters
            // often close theirs after forking the workers).
            Some(engine) => {
                l.release_app();
                if l.bell().peer_holds() {
                    engine.watch_hold(l.bell().shim_fd(), l.token);
                } else {
                    l.close(engine);
                }
            }
            None => {
                // This process's copies: A, and the kernel listener it would take over.
                l.bell().release_app();
                crate::sys::raw::close(l.tcp_fd);
            }
        },
        // The program's fd was the only copy here: closing it lets the owner see the last
        // holder go.
        crate::socket::Attachment::Relayed(_) | crate::socket::Attachment::Passed(_) => {}
    }
}

/// The program's last fd of `s` is closed and no call of it is in progress (call inside
/// the reentrancy guard).
fn stream_fd_closed(s: &Arc<Stream>) {
    match s.owner().is_me().then(get).flatten() {
        Some(engine) => {
            s.release_app();
            s.app_gone.store(true, Release);
            engine.settle_holders(s);
        }
        // A copy inherited from the owner: its locks are never taken here (a parent
        // thread may have held one at the fork), and nothing else uses its doorbell. A
        // stream this process handed over keeps its options fd until now.
        None => {
            s.bell().release_app();
            if s.moved_away.swap(false, AcqRel) {
                crate::sys::raw::close(s.opts_fd);
            }
        }
    }
}

/// A program call on a stream, from start to end (see [`Stream::defer_close`]); create and
/// drop it inside the reentrancy guard.
pub struct Call<'a>(&'a Arc<Stream>);

impl<'a> Call<'a> {
    /// The call starts.
    pub fn begin(s: &'a Arc<Stream>) -> Call<'a> {
        s.call_begins();
        Call(s)
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        if self.0.call_ends() {
            stream_fd_closed(self.0);
        }
    }
}

/// Whether the program set `SO_LINGER` on with a zero timeout (close means reset).
fn linger_zero(opts_fd: c_int) -> bool {
    let mut l = libc::linger {
        l_onoff: 0,
        l_linger: 0,
    };
    let mut len = std::mem::size_of::<libc::linger>() as libc::socklen_t;
    // SAFETY: valid out-buffer of len bytes.
    let r = unsafe {
        crate::sys::real::getsockopt(
            opts_fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&mut l as *mut libc::linger).cast(),
            &mut len,
        )
    };
    r == 0 && l.l_onoff != 0 && l.l_linger == 0
}

/// A device in use, with the lock that serialises polling its shared CQ (so each stream
/// sees its completions in order).
pub struct Dev {
    pub(crate) dev: Arc<Device>,
    /// Held while polling; it holds the completions buffer (not zeroed on every poll: a
    /// busy waiter polls in a tight loop).
    poll: Mutex<Box<[Wc; POLL_BATCH]>>,
    /// Streams on this device that need their completions handled while no program thread
    /// is in a call on them (see [`Dev::demand_up`]).
    demand: AtomicUsize,
    /// Program threads sleeping on this device's completion channel (a blocked call or a
    /// hooked poll/epoll wait), from before they arm the CQ until before they take an event.
    sleepers: AtomicUsize,
    /// Whether the helper's epoll reports this device's completion events; changed under
    /// `listen_lock` only.
    listening: AtomicBool,
    listen_lock: Mutex<()>,
    /// The helper's epoll fd and this device's tag there.
    epfd: c_int,
    tag: u64,
    wake_fd: c_int,
}

/// Who handles a completion. A program thread blocked in a call on a stream, or in a hooked
/// poll/epoll wait, sleeps on the completion channel itself and handles what it finds; the
/// helper thread is needed only for streams whose completions must be seen while no such
/// wait is in progress: a doorbell another process polls, a relay, or output that waits for
/// the peer's credits. While no stream on a device needs it, the helper's epoll does not
/// report that device's completion events at all, so a waiter's wake-up does not also wake
/// the helper (a context switch and four syscalls per message, measured).
impl Dev {
    /// A stream needs the helper: make sure the helper hears this device's completions.
    /// Takes only `listen_lock` and polls nothing (the helper polls once woken), so a
    /// stream may call it under its own lock.
    pub(crate) fn demand_up(&self) {
        // While there is demand, whoever consumes a completion event re-arms the CQ
        // (`Engine::on_cq_event`); the first demand arms it here.
        if self.demand.fetch_add(1, SeqCst) > 0 && self.listening.load(SeqCst) {
            return;
        }
        let _g = lock(&self.listen_lock);
        if !self.listening.load(SeqCst) {
            self.set_listening(true);
        }
        if let Err(e) = self.dev.arm() {
            log::error!("arming the CQ failed: {e}");
        }
        // Completions that landed before the arm raise no event: the helper polls once.
        crate::sys::raw::eventfd_add(self.wake_fd);
    }

    /// A stream no longer needs the helper (the helper stops listening lazily).
    pub(crate) fn demand_down(&self) {
        self.demand.fetch_sub(1, SeqCst);
    }

    /// A program thread starts or stops sleeping on the completion channel.
    pub(crate) fn sleeping(&self, on: bool) {
        if on {
            self.sleepers.fetch_add(1, SeqCst);
        } else {
            self.sleepers.fetch_sub(1, SeqCst);
        }
    }

    /// Helper, after a completion event: stops listening when no stream needs it
    /// (`demand_up` turns it back on).
    fn stop_listening_if_idle(&self) {
        if self.demand.load(SeqCst) > 0 {
            return;
        }
        let _g = lock(&self.listen_lock);
        // A demand_up that raced with us either made demand non-zero before this check or
        // takes the lock after us and turns listening back on.
        if self.demand.load(SeqCst) == 0 && self.listening.load(SeqCst) {
            self.set_listening(false);
        }
    }

    fn set_listening(&self, on: bool) {
        self.listening.store(on, SeqCst);
        // Off is a removal, not a MOD to no events: the kernel adds EPOLLERR|EPOLLHUP to
        // every mask, so a MOD to 0 leaves the item live and every completion event still
        // woke the helper (a context switch per message, seen in the two-host bed's trace).
        let (op, events) = if on {
            (libc::EPOLL_CTL_ADD, libc::EPOLLIN as u32)
        } else {
            (libc::EPOLL_CTL_DEL, 0)
        };
        let mut ev = libc::epoll_event {
            events,
            u64: self.tag,
        };
        // SAFETY: our epoll fd and the device's channel fd (added when the Dev was made).
        let r = unsafe { crate::sys::real::epoll_ctl(self.epfd, op, self.dev.comp_fd(), &mut ev) };
        if r != 0 {
            log::error!(
                "epoll_ctl(completion channel, {}): errno {}",
                if on { "add" } else { "remove" },
                crate::sys::raw::errno()
            );
        }
    }
}

/// See the module doc.
pub struct Engine {
    pid: i32,
    /// Who this engine is to other processes (its ipc address).
    pub owner: ipc::Owner,
    /// Where other processes' requests arrive (none if it could not listen).
    ipc: Option<ipc::Server>,
    /// Set when the process changed its credentials: the kernel refuses this engine's
    /// writes to the verbs and rdma_cm files from then on, so it makes nothing new.
    stale: AtomicBool,
    cfg: &'static Config,
    /// Events of every connected (or accepting) id.
    ch: Arc<EventChannel>,
    streams_by_qp: Mutex<QpMap<Arc<Stream>>>,
    streams_by_token: Mutex<HashMap<u64, Arc<Stream>>>,
    listeners: Mutex<HashMap<u64, Arc<Listener>>>,
    /// Connect requests deferred by all listeners (a full accept queue; listener.rs).
    deferred: std::sync::atomic::AtomicUsize,
    devices: Mutex<Vec<Arc<Dev>>>,
    closing: Mutex<Vec<Arc<Stream>>>,
    /// Streams whose owner program let go but another process still holds (re-checked by
    /// the helper: the last holder's bytes may be taken in by a completion, not an event).
    held_elsewhere: Mutex<Vec<Arc<Stream>>>,
    /// Streams handed over to another process, by token: requests for them are sent on.
    moved: Mutex<takeover::Moved>,
    /// Streams whose peer moved (token, the taker's port): resumes for the helper to start.
    resumes: Mutex<takeover::Resumes>,
    resume_cv: std::sync::Condvar,
    /// Streams this process is handing over (token, deadline for the taker's export).
    leaving: Mutex<Vec<(u64, std::time::Instant)>>,
    /// Completions of QPs whose stream is not registered yet (a take-over or resume builds
    /// the QP first), kept in CQ order for it.
    early: Mutex<QpMap<Vec<Wc>>>,
    epfd: c_int,
    wake_fd: c_int,
    /// `_exit` asks the helper to drain (see [`drain_at_exit_from_any_context`]) ...
    exit_asked: AtomicBool,
    /// ... and waits for this eventfd.
    exit_done_fd: c_int,
    next_token: AtomicU64,
    helper: Once,
    /// Destinations that failed RDMA recently.
    pub negcache: NegCache,
    /// How long the poll/select/epoll hooks poll before the real wait (engine/spin.rs).
    poll_budget: spin::Budget,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether this process's engine (if any) is its own — false in a fork child of a process
/// that had one: the engine there is the parent's.
pub fn is_owner_process() -> bool {
    // SAFETY: engines are leaked, never freed: a non-null pointer stays valid.
    match unsafe { ENGINE.load(Acquire).as_ref() } {
        Some(e) => e.pid == crate::sys::raw::pid(),
        None => true,
    }
}

/// RDMA streams alive in this process (what makes blocking waits spin first).
static ACTIVE_STREAMS: AtomicUsize = AtomicUsize::new(0);

/// Whether this process has RDMA streams: one relaxed load, for the poll/epoll hooks.
#[inline]
pub fn active() -> bool {
    ACTIVE_STREAMS.load(Relaxed) != 0
}

/// At process exit (`exit`, return from `main`, `_exit`): give every stream a graceful close
/// and wait — bounded by the linger time — until the bytes it holds and its FIN have reached
/// the peer. The kernel keeps delivering a TCP socket's queued bytes after its process is
/// gone; ours live in this process's memory, so the process waits for them instead.
pub fn drain_at_exit() {
    if !has_exit_work() || crate::sys::raw::in_vfork_child() {
        return; // a vfork child's exit must not touch its parent's streams
    }
    let Some(e) = get() else { return };
    let Some(_g) = crate::guard::enter() else {
        return;
    }; // inside the shim (a signal handler?)
    e.hand_listeners_on(false);
    drain_streams(e, false);
}

/// Whether this process has streams to drain or listeners to hand on at exit (no lock).
fn has_exit_work() -> bool {
    active() || listener::OWNED.load(Relaxed) != 0
}

/// `_exit`'s drain, async-signal-safe (`_exit` may be called from a signal handler): this
/// thread only sets a flag, rings the helper thread, which drains as [`drain_at_exit`]
/// does, and waits for its answer, bounded by the linger time. No lock, no allocation.
pub fn drain_at_exit_from_any_context() {
    if !has_exit_work() || crate::sys::raw::in_vfork_child() {
        return;
    }
    // SAFETY: engines are leaked, never freed: a non-null pointer stays valid.
    let Some(e) = (unsafe { ENGINE.load(Acquire).as_ref() }) else {
        return;
    };
    // Not ours (a fork child's copy), no helper (so no stream), or this thread is inside the
    // shim — the helper could wait for a lock it holds: nothing to drain that can be drained.
    if e.pid != crate::sys::raw::pid() || !e.helper.is_completed() || crate::guard::active() {
        return;
    }
    e.exit_asked.store(true, Release);
    e.wake();
    let mut p = libc::pollfd {
        fd: e.exit_done_fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = (e.linger().as_millis() + 200) as libc::c_int;
    // SAFETY: one pollfd on our eventfd; poll(2) is async-signal-safe.
    unsafe { libc::syscall(libc::SYS_poll, &mut p as *mut libc::pollfd, 1, ms) };
}

/// How long an exiting owner waits for the first, or next, of its queued connections to be
/// accepted through it.
const HAND_ON_IDLE: Duration = Duration::from_secs(2);

impl Engine {
    /// At exit: listeners other processes use stop taking connections in, and the ones
    /// already queued wait — bounded by the linger time — to be accepted through this
    /// process (a kernel listener's queue outlives the process that made it; ours lives in
    /// its memory). `on_helper`: the helper thread waits, so it answers requests itself.
    fn hand_listeners_on(&'static self, on_helper: bool) {
        let shared: Vec<Arc<Listener>> = lock(&self.listeners)
            .values()
            .filter(|l| l.shared())
            .cloned()
            .collect();
        if shared.is_empty() {
            return;
        }
        shared.iter().for_each(|l| l.stop_feeding(self));
        let queued = || shared.iter().map(|l| l.queued()).sum::<usize>();
        let start = std::time::Instant::now();
        let (mut left, mut moved_at) = (queued(), start);
        // Up to the linger time, and only while the queue is being taken (the others may be
        // exiting too: a server shutting down).
        while left > 0 && start.elapsed() < self.linger() && moved_at.elapsed() < HAND_ON_IDLE {
            if on_helper {
                self.serve_requests();
            }
            std::thread::sleep(Duration::from_millis(1));
            let now = queued();
            if now < left {
                moved_at = std::time::Instant::now();
            }
            left = now;
        }
        log::info!(
            "exit: {} listener(s) handed on to the processes that share them ({left} connection(s) left unaccepted)",
            shared.len()
        );
    }
}

/// Delivers what every stream of `e` holds, FIN included, bounded by the linger time (call
/// inside the reentrancy guard). `on_helper`: the helper thread drains, so it answers other
/// processes' requests here itself.
fn drain_streams(e: &'static Engine, on_helper: bool) {
    let streams: Vec<Arc<Stream>> = lock(&e.streams_by_qp).values().cloned().collect();
    let deadline = std::time::Instant::now() + e.linger();
    // A stream the program let go of while another process holds its A (passed with
    // SCM_RIGHTS, or a fork child's that it has yet to use) is that process's to use: it
    // gets the linger to take the stream over before this engine, and the QP, are gone.
    // One the program still held at exit is not waited for (a child that inherited it and
    // never uses it would hold the exit up for nothing).
    let passed = |s: &Arc<Stream>| {
        s.app_gone.load(Acquire) && s.bell().peer_holds() && !s.released.load(Acquire)
    };
    while streams.iter().any(passed) && std::time::Instant::now() < deadline {
        if on_helper {
            e.serve_requests();
        }
        e.progress_devices(false);
        std::thread::sleep(Duration::from_millis(1));
    }
    // Relayed streams first take in what their holders already wrote (a fork child that has
    // just exited may have left its last bytes in the relay), as far as the linger allows.
    while streams.iter().any(|s| s.relay_pending()) && std::time::Instant::now() < deadline {
        e.progress_devices(false);
        streams.iter().for_each(|s| s.on_hold_event());
        std::thread::sleep(Duration::from_micros(200));
    }
    for s in &streams {
        s.close_for_exit();
    }
    loop {
        e.progress_devices(false);
        let left = streams.iter().filter(|s| !s.flushed()).count();
        if left == 0 {
            return;
        }
        if std::time::Instant::now() >= deadline {
            log::warn!(
                "exit: {left} RDMA stream(s) still had unacknowledged bytes after {:?}",
                e.linger()
            );
            return;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

extern "C" fn drain_at_exit_c() {
    drain_at_exit();
}

/// This process's engine, if it can do RDMA (made on first call; call inside the guard).
/// The one a fork child finds in its memory is its parent's and is never touched there; the
/// child makes its own on first need, on its own instance of the RDMA libraries
/// (`rdma::ffi::lib` loads one into a new link-map namespace).
pub fn get() -> Option<&'static Engine> {
    let me = crate::sys::raw::pid();
    let p = ENGINE.load(Acquire);
    // SAFETY: engines are leaked, never freed: a non-null pointer stays valid.
    if let Some(e) = unsafe { p.as_ref() } {
        if e.pid == me {
            return Some(e);
        }
    }
    if NO_ENGINE.load(Acquire) == me {
        return None;
    }
    make_engine(me)
}

/// This process's engine for a new connection, listener or take-over: none once the process
/// changed its credentials ([`Engine::retire_for_new_credentials`]), as the kernel then
/// refuses the engine's writes (new connections take kernel TCP, counted
/// `rdma_unavailable`).
pub fn for_new() -> Option<&'static Engine> {
    get().filter(|e| !e.stale.load(Acquire))
}

/// This process's engine if it has made one (never makes one).
pub fn existing() -> Option<&'static Engine> {
    // SAFETY: engines are leaked, never freed: a non-null pointer stays valid.
    unsafe { ENGINE.load(Acquire).as_ref() }.filter(|e| e.pid == crate::sys::raw::pid())
}

/// The current process's engine (null before one is made, or its parent's in a fork child).
static ENGINE: AtomicPtr<Engine> = AtomicPtr::new(std::ptr::null_mut());
/// The pid whose attempt to make an engine failed (it does not try again).
static NO_ENGINE: AtomicI32 = AtomicI32::new(0);
/// The pid making an engine now: a spin lock that a fork child may take over from a parent
/// thread that held it at the fork.
static MAKING: AtomicI32 = AtomicI32::new(0);

#[cold]
fn make_engine(me: i32) -> Option<&'static Engine> {
    loop {
        let holder = MAKING.load(Acquire);
        if holder == me {
            std::thread::sleep(Duration::from_micros(200)); // another thread of ours is at it
        } else if MAKING.compare_exchange(holder, me, AcqRel, Acquire).is_ok() {
            break; // free, or held by the parent before a fork: ours now
        }
    }
    let existing = get_unlocked(me);
    let made = existing.or_else(|| {
        if !crate::init::rdma_device_present() {
            NO_ENGINE.store(me, Release);
            return None;
        }
        match Engine::new() {
            Ok(e) => {
                let e: &'static Engine = Box::leak(Box::new(e));
                ENGINE.store(e as *const Engine as *mut Engine, Release);
                Some(e)
            }
            Err(e) => {
                log::warn!("RDMA unavailable, all connections use kernel TCP: {e}");
                NO_ENGINE.store(me, Release);
                None
            }
        }
    });
    MAKING.store(0, Release);
    made
}

fn get_unlocked(me: i32) -> Option<&'static Engine> {
    // SAFETY: as in `get`.
    unsafe { ENGINE.load(Acquire).as_ref() }.filter(|e| e.pid == me)
}

/// Before a fork, in the parent: every stream's doorbell follows its state from now on (the
/// child may poll the fd it inherits). Skipped in a thread that is inside the shim (a fork
/// from a signal handler): it might hold a stream's lock.
pub fn before_fork() {
    if !active() || crate::guard::active() {
        return;
    }
    // SAFETY: engines are leaked, never freed.
    let Some(e) = (unsafe { ENGINE.load(Acquire).as_ref() }) else {
        return;
    };
    if e.pid != crate::sys::raw::pid() {
        return;
    }
    let Some(_g) = crate::guard::enter() else {
        return;
    };
    let streams: Vec<Arc<Stream>> = lock(&e.streams_by_qp).values().cloned().collect();
    streams.iter().for_each(|s| s.share());
}

/// In a fork child: the parent's streams are not this process's to drive or wait for.
pub fn after_fork_child() {
    ACTIVE_STREAMS.store(0, Relaxed);
    stream::TIMED.store(0, Relaxed); // the parent's timed streams are not ticked here
    stream::WATCHED.store(0, Relaxed);

    // The parent's ipc socket must not answer for it from here: once the parent is gone,
    // callers must be refused, not left waiting on a socket nobody serves.
    // SAFETY: engines are never freed; a plain close of an inherited fd.
    if let Some(e) = unsafe { ENGINE.load(Acquire).as_ref() } {
        if let Some(server) = &e.ipc {
            server.forget_in_child();
        }
    }
}

// Epoll tags of the helper thread: kind in the top byte, index or token below.
/// See [`Engine::hold_qp`].
struct HeldQp(&'static Engine, u32);

impl Drop for HeldQp {
    fn drop(&mut self) {
        lock(&self.0.early).remove(&self.1); // nothing left once routed
    }
}

/// A map keyed by QP number, looked up for every completion. QP numbers are distinct
/// integers the local device hands out (no peer chooses them): a multiply hashes them well
/// enough, where the default SipHash costs more than the rest of a completion's dispatch.
type QpMap<V> = HashMap<u32, V, std::hash::BuildHasherDefault<QpHasher>>;

#[derive(Default)]
struct QpHasher(u64);

impl std::hash::Hasher for QpHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u32(&mut self, v: u32) {
        self.0 = u64::from(v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// Completions taken from a CQ per poll.
const POLL_BATCH: usize = 32;

const TAG_WAKE: u64 = 0;
const TAG_CM: u64 = 1 << 56;
const TAG_DEV: u64 = 2 << 56;
const TAG_LISTEN_RDMA: u64 = 3 << 56;
const TAG_LISTEN_TCP: u64 = 4 << 56;
const TAG_IPC: u64 = 5 << 56;
const TAG_HOLD: u64 = 6 << 56;
const TAG_ASYNC: u64 = 7 << 56;
const TAG_IPC_CONN: u64 = 8 << 56;
const TAG_MASK: u64 = 0xff << 56;

/// `RSOCK_MAX_PINNED_MB` in bytes: unset, a quarter of physical memory; 0, no limit.
fn pinned_limit(mb: Option<u32>) -> usize {
    match mb {
        Some(0) => usize::MAX,
        Some(mb) => (mb as usize) << 20,
        None => {
            // SAFETY: sysconf has no preconditions.
            let (pages, size) = unsafe {
                (
                    libc::sysconf(libc::_SC_PHYS_PAGES),
                    libc::sysconf(libc::_SC_PAGESIZE),
                )
            };
            if pages > 0 && size > 0 {
                (pages as usize).saturating_mul(size as usize) / 4
            } else {
                usize::MAX
            }
        }
    }
}

impl Engine {
    fn new() -> Result<Engine, rdma::Error> {
        rdma::ffi::lib()?;
        rdma::mr::set_pinned_limit(pinned_limit(Config::get().max_pinned_mb));
        let ch = EventChannel::new()?;
        // SAFETY: plain syscalls creating fds we own.
        let (epfd, wake_fd, exit_done_fd) = unsafe {
            (
                crate::sys::raw::hide(crate::sys::real::epoll_create1(libc::EPOLL_CLOEXEC)),
                crate::sys::raw::hide(libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK)),
                crate::sys::raw::hide(libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK)),
            )
        };
        if epfd < 0 || wake_fd < 0 || exit_done_fd < 0 {
            return Err(rdma::Error::last_os("epoll_create1/eventfd"));
        }
        let pid = crate::sys::raw::getpid();
        // A guessable nonce would let a local process squat the name this engine's
        // children ask: without a random one, the engine takes no requests at all.
        let nonce = crate::sys::unix::random_u64();
        let owner = ipc::Owner::mine(pid, nonce);
        let server = match nonce {
            0 => Err(std::io::Error::other("no random nonce from getrandom")),
            _ => ipc::Server::listen(&owner),
        };
        let ipc = server
            .map_err(|e| {
                log::warn!(
                    "no ipc socket ({e}): other processes cannot use this process's RDMA sockets"
                )
            })
            .ok();
        let e = Engine {
            pid,
            owner,
            ipc,
            stale: AtomicBool::new(false),
            cfg: Config::get(),
            ch,
            streams_by_qp: Mutex::new(QpMap::default()),
            streams_by_token: Mutex::new(HashMap::new()),
            listeners: Mutex::new(HashMap::new()),
            deferred: std::sync::atomic::AtomicUsize::new(0),
            devices: Mutex::new(Vec::new()),
            closing: Mutex::new(Vec::new()),
            held_elsewhere: Mutex::new(Vec::new()),
            moved: Mutex::new(takeover::Moved::default()),
            resumes: Mutex::new(takeover::Resumes::default()),
            resume_cv: std::sync::Condvar::new(),
            leaving: Mutex::new(Vec::new()),
            early: Mutex::new(QpMap::default()),
            epfd,
            wake_fd,
            exit_asked: AtomicBool::new(false),
            exit_done_fd,
            // Tokens differ between engines (a taker keeps the stream's token), so each
            // starts at a random point.
            next_token: AtomicU64::new((crate::sys::unix::random_u64() >> 16) | 1),
            helper: Once::new(),
            negcache: NegCache::new(),
            poll_budget: spin::Budget::new(Duration::from_micros(u64::from(Config::get().spin_us))),
        };
        e.watch(wake_fd, TAG_WAKE)?;
        e.watch(e.ch.fd(), TAG_CM)?;
        if let Some(server) = &e.ipc {
            e.watch(server.fd(), TAG_IPC)?;
        }
        // SAFETY: registering a plain extern "C" fn.
        unsafe { libc::atexit(drain_at_exit_c) };
        Ok(e)
    }

    fn watch(&self, fd: c_int, tag: u64) -> Result<(), rdma::Error> {
        self.epoll_ctl(libc::EPOLL_CTL_ADD, fd, libc::EPOLLIN as u32, tag)
    }

    /// Watches `fd` for one readiness report; [`rearm_oneshot`](Self::rearm_oneshot) asks
    /// for the next (a kernel listener must not wake the helper while the queue is full).
    fn watch_oneshot(&self, fd: c_int, tag: u64) -> Result<(), rdma::Error> {
        self.epoll_ctl(
            libc::EPOLL_CTL_ADD,
            fd,
            (libc::EPOLLIN | libc::EPOLLONESHOT) as u32,
            tag,
        )
    }

    fn rearm_oneshot(&self, fd: c_int, tag: u64) {
        if let Err(e) = self.epoll_ctl(
            libc::EPOLL_CTL_MOD,
            fd,
            (libc::EPOLLIN | libc::EPOLLONESHOT) as u32,
            tag,
        ) {
            log::warn!("re-arming a listener: {e}");
        }
    }

    fn epoll_ctl(&self, op: c_int, fd: c_int, events: u32, tag: u64) -> Result<(), rdma::Error> {
        let mut ev = libc::epoll_event { events, u64: tag };
        // SAFETY: valid epoll fd and event.
        if unsafe { crate::sys::real::epoll_ctl(self.epfd, op, fd, &mut ev) } != 0 {
            return Err(rdma::Error::last_os("epoll_ctl"));
        }
        Ok(())
    }

    fn unwatch(&self, fd: c_int) {
        // SAFETY: valid epoll fd; a missing fd just fails.
        unsafe {
            crate::sys::real::epoll_ctl(self.epfd, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut())
        };
    }

    /// A fresh id token (names a cm id, a stream or a listener).
    fn token(&self) -> u64 {
        self.next_token.fetch_add(1, Relaxed) & !TAG_MASK
    }

    /// The engine's entry for `dev`, watched by the helper from now on.
    fn dev(&self, dev: &Arc<Device>) -> Result<Arc<Dev>, rdma::Error> {
        let mut devs = lock(&self.devices);
        if let Some(d) = devs.iter().find(|d| Arc::ptr_eq(&d.dev, dev)) {
            return Ok(d.clone());
        }
        let tag = TAG_DEV | devs.len() as u64;
        let d = Arc::new(Dev {
            dev: dev.clone(),
            // SAFETY: ibv_wc is plain data; all-zero is valid.
            poll: Mutex::new(Box::new(unsafe { std::mem::zeroed() })),
            demand: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            listening: AtomicBool::new(true),
            listen_lock: Mutex::new(()),
            epfd: self.epfd,
            tag,
            wake_fd: self.wake_fd,
        });
        self.watch(dev.comp_fd(), tag)?;
        // Asynchronous events (a QP or the CQ failing, the port going down) end streams.
        match rdma::fd::set_nonblocking(dev.async_fd()) {
            Ok(()) => self.watch(dev.async_fd(), TAG_ASYNC | devs.len() as u64)?,
            Err(e) => log::warn!("device async events unwatched: {e}"),
        }
        dev.arm()?;
        devs.push(d.clone());
        Ok(d)
    }

    /// Registers a new stream for completions and cm events.
    fn register(&self, s: &Arc<Stream>) {
        ACTIVE_STREAMS.fetch_add(1, Relaxed);
        lock(&self.streams_by_token).insert(s.token, s.clone());
        self.route_qp(s, None);
    }

    fn unregister(&self, s: &Stream) {
        if lock(&self.streams_by_qp).remove(&s.qp_num()).is_some() {
            ACTIVE_STREAMS.fetch_sub(1, Relaxed);
        }
        lock(&self.streams_by_token).remove(&s.token);
    }

    /// Polls `d`'s CQ once and hands each completion to its stream. Returns how many; 0 also
    /// when another thread is polling it. Never call with a stream lock held.
    pub fn progress(&self, d: &Dev) -> usize {
        match d.poll.try_lock() {
            Ok(g) => self.poll_locked(d, g),
            Err(_) => 0,
        }
    }

    /// A snapshot of the devices in use.
    fn devices(&self) -> Vec<Arc<Dev>> {
        lock(&self.devices).clone()
    }

    /// Polls every device's CQ once: [`progress`](Self::progress) on each (a try: never
    /// waits for a thread that is polling), or, with `wait`, [`progress_all`]
    /// (Self::progress_all) on each.
    pub(crate) fn progress_devices(&self, wait: bool) {
        for d in &self.devices() {
            if wait {
                self.progress_all(d);
            } else {
                self.progress(d);
            }
        }
    }

    /// As [`progress`](Self::progress), waiting for the poll lock (the helper must not miss
    /// completions that arrived before it re-armed the CQ).
    fn progress_all(&self, d: &Dev) {
        while self.poll_locked(d, lock(&d.poll)) > 0 {}
    }

    fn poll_locked(&self, d: &Dev, mut wcs: MutexGuard<'_, Box<[Wc; POLL_BATCH]>>) -> usize {
        let n = match d.dev.poll(&mut wcs[..]) {
            Ok(n) => n,
            Err(e) => {
                // A CQ that cannot be polled is lost, with every QP posting to it.
                self.fail_device(d, &format!("{e}"));
                0
            }
        };
        for wc in &wcs[..n] {
            let s = lock(&self.streams_by_qp).get(&wc.qp_num()).cloned();
            match s {
                Some(s) => s.on_completion(wc),
                None => match lock(&self.early).get_mut(&wc.qp_num()) {
                    Some(kept) => kept.push(wc.copied()),
                    None => log::trace!("completion for unknown qp {} ignored", wc.qp_num()),
                },
            }
        }
        n
    }

    /// Keeps the completions of QP `qp` from now until its stream is registered with
    /// [`route_qp`](Self::route_qp), which hands them over in order; forgets them when the
    /// returned guard drops without that (the attempt failed). Call as soon as the QP can
    /// receive: without it, whoever polled the CQ in between dropped them as a stranger's
    /// — a client's first message to a server busy accepting others was lost, and both
    /// ends waited forever.
    fn hold_qp(&'static self, qp: u32) -> HeldQp {
        lock(&self.early).insert(qp, Vec::new());
        HeldQp(self, qp)
    }

    /// Routes the completions of `s`'s current QP to it from now on (and no longer those of
    /// `old`, the QP it left, if any), first handing it those kept since
    /// [`hold_qp`](Self::hold_qp): under the device's poll lock, so that they stay in order.
    fn route_qp(&self, s: &Arc<Stream>, old: Option<u32>) {
        let _g = lock(&s.dev.poll);
        let kept = lock(&self.early).remove(&s.qp_num()).unwrap_or_default();
        {
            let mut by_qp = lock(&self.streams_by_qp);
            if let Some(old) = old {
                by_qp.remove(&old);
            }
            by_qp.insert(s.qp_num(), s.clone());
        }
        for wc in &kept {
            s.on_completion(wc);
        }
    }

    /// Helper: reads device `i`'s asynchronous events and ends the streams they concern.
    fn on_async_events(&self, i: usize) {
        let Some(d) = lock(&self.devices).get(i).cloned() else {
            return;
        };
        while let Some(ev) = d.dev.async_event() {
            match ev {
                rdma::AsyncEvent::QpFatal(qpn) => {
                    let s = lock(&self.streams_by_qp).get(&qpn).cloned();
                    if let Some(s) = s {
                        s.on_fatal("its queue pair failed (async event)");
                    }
                }
                rdma::AsyncEvent::DeviceFatal(t) => {
                    self.fail_device(&d, &format!("async event {t} (CQ or device failed)"));
                }
                rdma::AsyncEvent::PortDown => self.fail_device(&d, "the port went down"),
                rdma::AsyncEvent::Other(t) => log::debug!("device async event {t}"),
            }
        }
    }

    /// Ends every stream on `d` (ECONNRESET): its CQ, device or port is gone.
    fn fail_device(&self, d: &Dev, why: &str) {
        log::warn!("rdma device: {why}: its connections are reset");
        let streams: Vec<Arc<Stream>> = lock(&self.streams_by_qp)
            .values()
            .filter(|s| std::ptr::eq(Arc::as_ptr(&s.dev), d))
            .cloned()
            .collect();
        for s in streams {
            s.on_fatal(why);
        }
    }

    /// Connects to `dest` over RDMA (blocking, bounded by `RSOCK_CONNECT_TIMEOUT_MS`).
    /// `opts_fd` is a copy of the program's socket, kept for its options.
    pub fn connect(
        &'static self,
        dest: std::net::SocketAddr,
        opts_fd: c_int,
        sizes: BufSizes,
    ) -> Result<Arc<Stream>, crate::stats::Cause> {
        setup::connect(self, dest, opts_fd, sizes)
    }

    /// A completion-channel event on `d` (whoever saw it: the helper or a blocked caller):
    /// consume and ack it and poll. Re-arming is the caller's: the helper re-arms after every
    /// event, and a thread about to sleep arms first ([`sleep_armed`](Self::sleep_armed)).
    ///
    /// `max` bounds the events read: a thread that armed the CQ once and woke on the channel
    /// takes 1 (all its arm can have raised; a later one stays for the next sleeper), the
    /// helper takes them all.
    pub(crate) fn on_cq_event(&self, d: &Dev, max: usize) {
        let _ = d.dev.take_cq_events(max);
        self.progress_all(d);
        self.rearm_if_listened(d);
    }

    /// After consuming a completion event: while a program thread still sleeps on the
    /// channel, or some stream needs the helper to hear completions, the CQ must stay armed
    /// — the event this thread took was the one report of an arm they count on (one arm,
    /// one event, for every waiter on the device's CQ). Without this a second thread
    /// blocked on another stream slept through its completions (an epoll wait, forever).
    fn rearm_if_listened(&self, d: &Dev) {
        if d.demand.load(SeqCst) > 0 || d.sleepers.load(SeqCst) > 0 {
            self.sleep_armed(d);
        }
    }

    /// Arms `d`'s CQ for the next completion and polls once more: a completion that landed
    /// before the arm raises no event, so it must be picked up now. Call right before
    /// sleeping on the completion channel or on a doorbell the helper rings.
    pub(crate) fn sleep_armed(&self, d: &Dev) {
        if let Err(e) = d.dev.arm() {
            log::error!("arming the CQ failed: {e}");
        }
        self.progress_all(d);
    }

    /// Starts the helper thread (once).
    pub fn ensure_helper(&'static self) {
        self.helper.call_once(|| {
            let r = std::thread::Builder::new()
                .name("rsock-engine".into())
                .spawn(move || helper::run(self));
            if let Err(e) = r {
                log::error!("cannot start the engine thread: {e}; blocking calls will poll");
            }
        });
    }

    /// Helper: answers the deferred connect requests that accept queues have room for now.
    fn admit_deferred(&'static self) {
        if self.deferred.load(Relaxed) == 0 {
            return;
        }
        let all: Vec<Arc<Listener>> = lock(&self.listeners).values().cloned().collect();
        for l in all {
            l.admit_deferred(self);
        }
    }

    /// Wakes the helper thread (to look at the closing list, drain for `_exit`, or answer
    /// deferred connect requests).
    fn wake(&self) {
        crate::sys::raw::eventfd_add(self.wake_fd);
    }

    /// Helper: `_exit` may have asked for the exit drain; answers once it is done.
    fn exit_drain_if_asked(&'static self) {
        if self.exit_asked.swap(false, AcqRel) {
            self.hand_listeners_on(true);
            drain_streams(self, true);
            crate::sys::raw::eventfd_add(self.exit_done_fd);
        }
    }

    /// A stream whose program fds are all closed: the helper finishes and frees it.
    pub fn retire(&'static self, s: Arc<Stream>) {
        lock(&self.closing).push(s);
        self.ensure_helper();
        self.wake();
    }

    /// The owner's program has no fd of `s` any more: finish it if no other process holds it
    /// either, else watch for the last holder to go (helper: `on_hold_event`).
    fn settle_holders(&'static self, s: &Arc<Stream>) {
        if !s.held() {
            self.close_unheld(s);
        } else if !s.hold_watched.swap(true, AcqRel) {
            lock(&self.held_elsewhere).push(s.clone());
            self.watch_hold(s.bell().shim_fd(), s.token);
            self.ensure_helper();
        }
    }

    /// Watches `fd` (a doorbell's or relay's B) for changes that matter to `token`'s stream.
    fn watch_hold(&self, fd: c_int, token: u64) {
        let ev = (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET) as u32;
        if let Err(e) = self.epoll_ctl(libc::EPOLL_CTL_ADD, fd, ev, TAG_HOLD | token) {
            log::warn!("watching a holder of stream {token}: {e}");
        }
    }

    /// Nobody holds `s` any more: the graceful (or lingering-zero) close, once.
    fn close_unheld(&'static self, s: &Arc<Stream>) {
        if s.released.swap(true, AcqRel) {
            return;
        }
        self.unwatch(s.bell().shim_fd());
        for fd in s.relay_fds() {
            self.unwatch(fd);
        }
        s.app_closed(linger_zero(s.opts_fd));
        self.retire(s.clone());
    }

    /// Helper: something changed on a holder of stream `token`.
    fn on_hold_event(&'static self, token: u64) {
        let l = lock(&self.listeners).get(&token).cloned();
        if let Some(l) = l {
            if !l.bell().peer_holds() {
                self.unwatch(l.bell().shim_fd());
                l.close(self); // the last process holding it let go
            }
            return;
        }
        let Some(s) = lock(&self.streams_by_token).get(&token).cloned() else {
            return;
        };
        s.on_hold_event();
        if s.app_gone.load(Acquire) && !s.held() {
            self.close_unheld(&s);
        }
    }

    /// Helper: closes the streams held elsewhere whose last holder has gone.
    fn recheck_holders(&'static self) {
        let list: Vec<Arc<Stream>> = lock(&self.held_elsewhere).clone();
        for s in list {
            if s.released.load(Acquire) || !s.held() {
                self.close_unheld(&s);
                lock(&self.held_elsewhere).retain(|x| !Arc::ptr_eq(x, &s));
            }
        }
    }

    /// The process is about to change its credentials: the engine makes nothing new from now
    /// on (see [`for_new`]). False if it had been retired already.
    pub fn retire_for_new_credentials(&self) -> bool {
        !self.stale.swap(true, AcqRel)
    }

    /// Helper: the ipc socket is readable (see `ipc`).
    fn serve_requests(&'static self) {
        if let Some(server) = &self.ipc {
            let mut watch = |c| {
                if let Err(e) = self.watch(c, TAG_IPC_CONN | c as u64) {
                    log::debug!("ipc: cannot watch a caller: {e}");
                }
            };
            server.on_listener(&mut |req, call| self.answer(req, call), &mut watch);
        }
    }

    /// Helper: a caller whose request was not in yet is readable.
    fn serve_waiting(&'static self, c: c_int) {
        if let Some(server) = &self.ipc {
            server.on_waiting(c, &mut |req, call| self.answer(req, call));
        }
    }

    /// Helper: drops callers that sent nothing in time.
    fn expire_callers(&self) {
        if let Some(server) = self.ipc.as_ref().filter(|s| s.has_waiting()) {
            server.expire(std::time::Instant::now());
        }
    }

    /// Whether callers wait for the helper to read their request.
    fn callers_waiting(&self) -> bool {
        self.ipc.as_ref().is_some_and(|s| s.has_waiting())
    }

    /// One request, from a process that sent `proof` as its fd of the socket asked about.
    /// Whoever does not hold that socket learns nothing (ENOENT, as for a token never
    /// issued), whatever its uid.
    fn answer(
        &'static self,
        req: &ipc::Request,
        call: ipc::Call,
    ) -> Option<(ipc::Reply, Option<c_int>)> {
        let proof = call.proof;
        if let ipc::Request::Reclaim { token, taker } = *req {
            return self.defer_reclaim(token, taker, call);
        }
        Some(self.answer_now(req, proof))
    }

    /// [`answer`](Self::answer) for the requests the helper answers at once.
    fn answer_now(&'static self, req: &ipc::Request, proof: c_int) -> (ipc::Reply, Option<c_int>) {
        let token = req.token();
        let stream = || {
            lock(&self.streams_by_token)
                .get(&token)
                .filter(|s| s.bell().is_this(proof))
                .cloned()
        };
        match *req {
            ipc::Request::Describe { .. } => match stream() {
                Some(s) if !s.released.load(Acquire) => {
                    let (ring, send) = s.sizes();
                    let r = ipc::Reply::Described {
                        token,
                        owner: self.owner,
                        sizes: BufSizes { ring, send }.packed(),
                        ends: s.ends(),
                    };
                    (r, None)
                }
                Some(_) => self.not_here(token, proof),
                None => match self.listener_held(token, proof) {
                    Some(l) => self.describe_listener(&l),
                    None => self.not_here(token, proof),
                },
            },
            ipc::Request::Relay { .. } => match stream() {
                Some(s) if !s.released.load(Acquire) => self.relay(&s),
                _ => self.not_here(token, proof),
            },
            ipc::Request::Take { port, taker, .. } => match stream() {
                Some(s) => self.answer_take(&s, port, taker),
                None => self.not_here(token, proof),
            },
            ipc::Request::Export {
                resume_at, taker, ..
            } => match stream() {
                Some(s) => self.answer_export(&s, resume_at, taker),
                None => self.not_here(token, proof),
            },
            ipc::Request::Reclaim { .. } => (ipc::Reply::Failed(libc::EINVAL), None), // deferred
            ipc::Request::Accept { taker, .. } => match self.listener_held(token, proof) {
                Some(l) => self.accept_for(&l, taker),
                None => (ipc::Reply::Failed(libc::ENOENT), None),
            },
        }
    }

    /// Listener `token`, if `proof` is its A.
    fn listener_held(&self, token: u64, proof: c_int) -> Option<Arc<Listener>> {
        lock(&self.listeners)
            .get(&token)
            .filter(|l| l.bell().is_this(proof))
            .cloned()
    }

    /// [`ipc::Request::Describe`] of a listener (its A was sent to another process): its
    /// facts, and a copy of its kernel listener for the day this process is gone.
    fn describe_listener(&self, l: &Listener) -> (ipc::Reply, Option<c_int>) {
        // SAFETY: F_DUPFD_CLOEXEC on the listener's own fd; the ipc server sends and closes it.
        let tcp = unsafe { crate::sys::real::fcntl(l.tcp_fd, libc::F_DUPFD_CLOEXEC, 0) };
        let local = crate::sys::sockaddr::local_of(l.tcp_fd);
        match (tcp, local) {
            (t, Some(local)) if t >= 0 => {
                let r = ipc::Reply::Listening {
                    token: l.token,
                    owner: self.owner,
                    sizes: l.sizes.packed(),
                    local,
                };
                (r, Some(t))
            }
            (t, _) => {
                crate::sys::raw::close(t);
                (ipc::Reply::Failed(libc::ENOBUFS), None)
            }
        }
    }

    /// [`ipc::Request::Accept`]: the next connection of `l`'s queue, for another process.
    fn accept_for(
        &'static self,
        l: &Arc<Listener>,
        taker: Option<ipc::Owner>,
    ) -> (ipc::Reply, Option<c_int>) {
        l.served_elsewhere(); // another process accepts through it
        match l.try_pop(self) {
            None => (ipc::Reply::Failed(libc::EAGAIN), None),
            Some(Accepted::Tcp(fd)) => {
                let local = crate::sys::sockaddr::local_of(fd);
                let peer = crate::sys::sockaddr::peer_of(fd);
                (ipc::Reply::Tcp { local, peer }, Some(fd))
            }
            Some(Accepted::Rdma(s)) => {
                // Never given to this process's program: the worker takes it over (given
                // A and the facts), or only the relay holds it.
                s.app_gone.store(true, Release);
                if taker.is_some() && self.cfg.takeover {
                    return self.hand_to_worker(&s);
                }
                self.relay_only(&s)
            }
        }
    }

    /// Relays `s`, which no program of this process holds (`app_gone` set), to the caller:
    /// the relay is then its only holder, whose last close ends it — which the helper
    /// rechecks (the end of stream may be read by a completion, raising no event on the
    /// relay end). No relay: it ends now.
    fn relay_only(&'static self, s: &Arc<Stream>) -> (ipc::Reply, Option<c_int>) {
        s.release_app();
        let r = self.relay(s);
        if r.1.is_none() {
            self.close_unheld(s);
        } else {
            self.settle_holders(s);
        }
        r
    }

    /// A relay end of `s`, which this process owns, for a process that cannot use its A.
    pub fn relay_end(&'static self, s: &Arc<Stream>) -> Option<c_int> {
        self.relay(s).1
    }

    /// Starts a relay of `s` and the reply that hands its A over.
    fn relay(&'static self, s: &Arc<Stream>) -> (ipc::Reply, Option<c_int>) {
        match s.start_relay() {
            Ok((a, b)) => {
                self.watch_hold(b, s.token);
                log::debug!(
                    "rdma stream {} -> {}: relayed to another process",
                    s.local,
                    s.peer
                );
                (ipc::Reply::Relay(s.ends()), Some(a))
            }
            Err(e) => {
                log::warn!("rdma stream {}: cannot relay: {e}", s.peer);
                (ipc::Reply::Failed(libc::ENOBUFS), None)
            }
        }
    }

    /// How long a closed stream may take to deliver its queued bytes.
    fn linger(&self) -> Duration {
        Duration::from_secs(10)
    }

    /// The negative cache's time-to-live.
    /// `RSOCK_SPIN_US`.
    pub(super) fn spin_max(&self) -> Duration {
        Duration::from_micros(u64::from(self.cfg.spin_us))
    }

    pub fn neg_ttl(&self) -> Duration {
        Duration::from_millis(self.cfg.neg_cache_ms as u64)
    }
}
