//! The socket state machine and what the shim remembers about each owned socket.
//!
//! States (each change goes through [`Socket::set_state`], which traces `A => B`):
//!
//! ```text
//!   Created --connect--> Connecting --> Tcp (kernel TCP, its cause recorded)
//!      |                     \--------> Rdma (a stream of the engine; see `api::connect`)
//!      \--listen--> Listening --accept--> (new socket, Tcp or Rdma)
//!   any --last fd closed--> Closed
//! ```
//!
//! A socket is shared by every fd that refers to it (dup, dup2, fork); the connection ends
//! when the last of them is closed.

use crate::engine::{Listener, Stream};
use crate::stats::{self, Cause, Detail, Fallback, Path, SlotHandle};
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex};

/// What carries an RDMA-engaged socket: the program's fd is then a doorbell (docs/DESIGN.md).
#[derive(Clone)]
pub enum Attachment {
    /// A connection over RDMA.
    Stream(Arc<Stream>),
    /// A dual (kernel TCP + rdma_cm) listener.
    Listener(Arc<Listener>),
    /// A connection over RDMA that another process owns and relays to this one.
    Relayed(Arc<crate::engine::relay::Relayed>),
    /// A stream another process owns, whose A this image got across `exec` on an fd of 3 or
    /// more: taken over (or relayed) on first use (`api::inherit`).
    Passed(Arc<crate::engine::ipc::Passed>),
}

/// Where a socket is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum SocketState {
    /// Made by `socket()`, neither connected nor listening.
    Created = 0,
    /// `connect()` in progress (the RDMA attempt or the kernel TCP connect).
    Connecting = 1,
    /// A kernel TCP listener (and, with RDMA, an rdma_cm listener too).
    Listening = 2,
    /// Carried by kernel TCP.
    Tcp = 3,
    /// Carried by RDMA.
    Rdma = 4,
    /// Every fd referring to it is closed.
    Closed = 5,
}

/// A mutex that a fork child can reclaim: a thread of the parent may have held it at the fork,
/// and that thread does not exist in the child.
struct ForkMutex<T>(std::cell::UnsafeCell<Mutex<T>>);

// SAFETY: all access goes through the inner Mutex, except `reclaim`, whose contract excludes
// concurrent access.
unsafe impl<T: Send> Sync for ForkMutex<T> {}

impl<T> ForkMutex<T> {
    fn new(v: T) -> Self {
        ForkMutex(std::cell::UnsafeCell::new(Mutex::new(v)))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, T> {
        // SAFETY: shared access to the Mutex, which synchronises itself.
        unsafe { &*self.0.get() }
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Replaces a held lock by a free one with the same contents.
    ///
    /// # Safety
    /// Only in a fork child before it runs anything else: no other thread may exist.
    unsafe fn reclaim(&self) {
        let p = self.0.get();
        if matches!((*p).try_lock(), Err(std::sync::TryLockError::WouldBlock)) {
            // The value is moved out of the held mutex and into a fresh one: neither lost nor
            // dropped twice.
            let v = std::ptr::read(p)
                .into_inner()
                .unwrap_or_else(|e| e.into_inner());
            std::ptr::write(p, Mutex::new(v));
        }
    }
}

impl SocketState {
    fn from_u32(v: u32) -> SocketState {
        match v {
            0 => SocketState::Created,
            1 => SocketState::Connecting,
            2 => SocketState::Listening,
            3 => SocketState::Tcp,
            4 => SocketState::Rdma,
            _ => SocketState::Closed,
        }
    }
}

/// How a nonblocking connect that is still in progress will be counted.
#[derive(Clone, Copy, Debug)]
pub struct Pending {
    /// Path it will count on.
    pub path: Path,
    /// Why it is on that path.
    pub cause: Cause,
    /// Raw destination address.
    pub peer: [u8; 28],
}

/// An owned socket. Lives in type-stable memory (see [`crate::fdtable`]).
pub struct Socket {
    refs: AtomicUsize,
    fds: TableRefs,
    state: AtomicU32,
    path: AtomicU32,
    slot: AtomicU64,
    attached: ForkMutex<Option<Attachment>>,
    /// A kernel TCP connect in progress, counted once it is known to have succeeded.
    pending: ForkMutex<Option<Pending>>,
    /// The program's epoll registrations of this socket: (epoll fd, event), kept so they can
    /// be moved when the fd's file is replaced by a doorbell.
    epoll: ForkMutex<Vec<(i32, libc::epoll_event)>>,
    /// `accept` must wait even if the listener's file is nonblocking: the program expects
    /// blocking, but the file is shared with processes that need it nonblocking.
    blocking_accept: std::sync::atomic::AtomicBool,
    /// The program polled this socket or put it in an epoll set: its doorbell must follow
    /// every readiness change (see `Stream::watch`).
    watched: std::sync::atomic::AtomicBool,
    /// A listener on kernel TCP only: why not RDMA too, as a [`Fallback`] (u32::MAX: none)
    /// in the low half and its [`Detail`]'s first word in the high half;
    /// the connections it accepts are counted with it.
    tcp_only: AtomicU64,
    /// A listener's `listen` backlog (0 before `listen`), for listening again on RDMA.
    backlog: AtomicI32,
    /// What the shim knows of the socket without asking the kernel ([`Known`]'s bits): a
    /// connect skips the syscalls that would tell it (each one costs, where the clock and
    /// syscalls are slow: 130 a connection on a link, measured 2026-11-28).
    known: AtomicU32,
    /// Link in the free stack while recycled.
    pub(crate) next_free: AtomicPtr<Socket>,
}

/// Facts about a program's socket that the shim learnt as the program made it, and keeps
/// while the program changes nothing that would falsify them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Known(u32);

impl Known {
    /// An AF_INET socket (for AF_INET6 the kernel still says: `IPV6_V6ONLY` may change).
    pub const INET4: Known = Known(1);
    /// Not bound by the program.
    pub const UNBOUND: Known = Known(4);
    /// The system's defaults for every option an RDMA stream mirrors (timeouts, keepalive,
    /// user timeout, linger): nothing to read from the socket.
    pub const DEFAULT_OPTS: Known = Known(8);
    /// A stdio stream (`fdopen`) reads and writes it inside libc, out of the hooks' sight: it
    /// stays on kernel TCP.
    pub const STDIO: Known = Known(16);

    /// Whether every bit of `k` is known.
    pub fn has(self, k: Known) -> bool {
        self.0 & k.0 == k.0
    }
}

impl std::ops::BitOr for Known {
    type Output = Known;
    fn bitor(self, o: Known) -> Known {
        Known(self.0 | o.0)
    }
}

impl Socket {
    pub(crate) fn empty() -> Socket {
        Socket {
            refs: AtomicUsize::new(0),
            fds: TableRefs::new(),
            state: AtomicU32::new(SocketState::Closed as u32),
            path: AtomicU32::new(Path::Passthrough as u32),
            slot: AtomicU64::new(0),
            attached: ForkMutex::new(None),
            pending: ForkMutex::new(None),
            epoll: ForkMutex::new(Vec::new()),
            blocking_accept: std::sync::atomic::AtomicBool::new(false),
            watched: std::sync::atomic::AtomicBool::new(false),
            tcp_only: AtomicU64::new(u32::MAX as u64),
            backlog: AtomicI32::new(0),
            known: AtomicU32::new(0),
            next_free: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    pub(crate) fn reset(&self) {
        self.fds.reset();
        *self.attached.lock() = None;
        *self.pending.lock() = None;
        self.epoll.lock().clear();
        self.state.store(SocketState::Created as u32, Relaxed);
        self.path.store(Path::Passthrough as u32, Relaxed);
        self.slot.store(0, Relaxed);
        self.blocking_accept.store(false, Relaxed);
        self.watched.store(false, Relaxed);
        self.tcp_only.store(u32::MAX as u64, Relaxed);
        self.backlog.store(0, Relaxed);
        self.known.store(0, Relaxed);
    }

    /// In a fork child (single-threaded, in the `pthread_atfork` handler): a lock that a
    /// thread of the parent held at the fork is replaced by a fresh one with the same
    /// contents, so the child can use the socket.
    pub(crate) fn after_fork_child(&self) {
        // SAFETY: called only from the fork child handler, before anything else runs.
        unsafe {
            self.attached.reclaim();
            self.pending.reclaim();
            self.epoll.reclaim();
        }
        // A listener's B is its owner's alone. The holders of A learn that the owner went
        // (exited, exec'd) from A's hang-up, and take the listener over at their next
        // accept; a copy kept here would keep A quiet, and a worker asleep on it in
        // epoll_wait would sleep on while connections queue in the kernel (haproxy's worker,
        // whose master re-execs itself).
        if let Some(Attachment::Listener(l)) = self.attached.lock().as_ref() {
            l.bell().forget_shim_in_child();
        }
    }

    pub(crate) fn publish(&self) {
        self.refs.store(1, Release);
    }

    /// Increment-if-not-zero: fails while the socket is free or being recycled.
    pub(crate) fn try_acquire(&self) -> bool {
        let mut r = self.refs.load(Relaxed);
        loop {
            if r == 0 {
                return false;
            }
            match self.refs.compare_exchange_weak(r, r + 1, Acquire, Relaxed) {
                Ok(_) => return true,
                Err(now) => r = now,
            }
        }
    }

    pub(crate) fn acquire(&self) {
        self.refs.fetch_add(1, Relaxed);
    }

    /// Drops one reference; true when it was the last (the caller recycles the memory).
    pub(crate) fn release(&self) -> bool {
        self.refs.fetch_sub(1, Release) == 1 && {
            std::sync::atomic::fence(Acquire);
            true
        }
    }

    pub(crate) fn fds_add(&self) {
        self.fds.add();
    }

    /// One fd referring to this socket was closed; ends the connection after the last.
    pub fn fd_closed(&self) {
        if self.fds.sub() {
            self.set_state(SocketState::Closed);
            stats::close_conn(SlotHandle(self.slot.swap(0, AcqRel)));
            let a = self.attached.lock().take();
            match a {
                Some(Attachment::Stream(s)) => crate::engine::stream_detached(s),
                Some(Attachment::Listener(l)) => crate::engine::listener_detached(l),
                // The program's fd was the only copy here: closing it lets the owner see
                // the last holder go.
                Some(Attachment::Relayed(_) | Attachment::Passed(_)) | None => {}
            }
        }
    }

    /// Remembers a connect in progress (counted by [`take_pending`](Self::take_pending)'s caller).
    pub fn set_pending(&self, p: Pending) {
        *self.pending.lock() = Some(p);
    }

    /// The connect in progress, if any, now resolved (success or failure).
    pub fn take_pending(&self) -> Option<Pending> {
        if self.state() != SocketState::Connecting {
            return None;
        }
        self.pending.lock().take()
    }

    /// Records a successful `epoll_ctl` on this socket.
    pub fn note_epoll(&self, epfd: i32, op: i32, ev: Option<libc::epoll_event>) {
        let mut regs = self.epoll.lock();
        regs.retain(|(e, _)| *e != epfd);
        if op != libc::EPOLL_CTL_DEL {
            if let Some(ev) = ev {
                regs.push((epfd, ev));
            }
        }
    }

    /// The program's epoll registrations of this socket.
    pub fn epoll_regs(&self) -> Vec<(i32, libc::epoll_event)> {
        self.epoll.lock().clone()
    }

    /// What carries this socket, if RDMA is engaged.
    pub fn attachment(&self) -> Option<Attachment> {
        self.attached.lock().clone()
    }

    /// The RDMA stream carrying this socket, if any.
    pub fn stream(&self) -> Option<Arc<Stream>> {
        match self.attachment()? {
            Attachment::Stream(s) => Some(s),
            Attachment::Listener(_) | Attachment::Relayed(_) | Attachment::Passed(_) => None,
        }
    }

    /// Forgets what carried this socket in this process, without ending it (its owner, in
    /// another process, still runs it).
    pub fn detach_quietly(&self) {
        let old = self.attached.lock().take();
        drop(old);
    }

    /// See the field `blocking_accept`.
    pub fn set_blocking_accept(&self, on: bool) {
        self.blocking_accept.store(on, Relaxed);
    }

    /// See the field `blocking_accept`.
    pub fn blocking_accept(&self) -> bool {
        self.blocking_accept.load(Relaxed)
    }

    /// Engages RDMA for this socket.
    pub fn attach(&self, a: Attachment) {
        if let Attachment::Stream(st) = &a {
            if self.watched.load(Acquire) || !self.epoll.lock().is_empty() {
                st.watch();
            }
        }
        *self.attached.lock() = Some(a);
    }

    /// The program polls this socket, or registered it with epoll (sticky): its stream's
    /// doorbell follows every change from now on. One load once marked.
    #[inline]
    pub fn mark_watched(&self) {
        if !self.watched.load(Relaxed) {
            self.mark_watched_slow();
        }
    }

    #[cold]
    fn mark_watched_slow(&self) {
        self.watched.store(true, Release);
        if let Some(st) = self.stream() {
            // Only the owner drives a stream; a fork child's copy was brought up to date
            // (and marked) by its parent before the fork.
            if st.owner().pid == crate::sys::raw::pid() {
                st.watch();
            }
        }
    }

    /// What the shim knows of this socket ([`Known`]).
    pub fn known(&self) -> Known {
        Known(self.known.load(Acquire))
    }

    /// Records what the shim knows of a socket it has just seen made.
    pub fn set_known(&self, k: Known) {
        self.known.store(k.0, Release);
    }

    /// Learnt `k` about the socket later in its life.
    pub fn note_known(&self, k: Known) {
        self.known.fetch_or(k.0, AcqRel);
    }

    /// The program changed what `k`'s bits say (a bind, or a socket option a stream mirrors):
    /// they are no longer known.
    pub fn forget_known(&self, k: Known) {
        if self.known.load(Relaxed) & k.0 != 0 {
            self.known.fetch_and(!k.0, AcqRel);
        }
    }

    /// Current state.
    pub fn state(&self) -> SocketState {
        SocketState::from_u32(self.state.load(Acquire))
    }

    /// Moves to `to`, tracing the change.
    pub fn set_state(&self, to: SocketState) {
        let from = SocketState::from_u32(self.state.swap(to as u32, AcqRel));
        log::trace!("socket {:p}: {from:?} => {to:?}", self);
    }

    /// Moves from `from` to `to` only if the socket is in `from`; true if it moved.
    pub fn transition(&self, from: SocketState, to: SocketState) -> bool {
        let moved = self
            .state
            .compare_exchange(from as u32, to as u32, AcqRel, Acquire)
            .is_ok();
        if moved {
            log::trace!("socket {:p}: {from:?} => {to:?}", self);
        }
        moved
    }

    /// The transport carrying this socket's bytes.
    pub fn path(&self) -> Path {
        match self.path.load(Relaxed) {
            0 => Path::Rdma,
            1 => Path::Tcp,
            _ => Path::Passthrough,
        }
    }

    /// Records that the socket is now a connection on `path` (counted once).
    pub fn established(
        &self,
        fd: i32,
        state: SocketState,
        path: Path,
        cause: Cause,
        local: &[u8],
        peer: &[u8],
    ) {
        self.path.store(path as u32, Relaxed);
        self.set_state(state);
        let h = stats::open_conn(fd, path, cause, local, peer);
        self.slot.store(h.0, Release);
    }

    /// Records that this listener is on kernel TCP only, and why.
    pub fn set_tcp_only(&self, why: Cause) {
        let reason = why.reason.map_or(u32::MAX, |r| r as u32);
        let (detail, _) = why.detail.encode(); // a listener's failures come with no event
        self.tcp_only
            .store((detail as u64) << 32 | reason as u64, Relaxed);
    }

    /// Records that the socket now listens at `fd` (its kernel TCP only reason set first),
    /// for `rsock stat`.
    pub fn listening(&self, fd: i32, local: &[u8]) {
        let h = stats::open_listener(fd, self.tcp_only(), local);
        stats::close_conn(SlotHandle(self.slot.swap(h.0, AcqRel)));
    }

    /// A listening socket that lost its RDMA side (a credential change): on kernel TCP only
    /// from now on, for what it accepts and for `rsock stat`.
    pub fn lost_rdma(&self, why: Cause) {
        self.set_tcp_only(why);
        stats::set_tcp_only(SlotHandle(self.slot.load(Acquire)), why);
    }

    /// A listener's `listen` backlog, as the program last gave it (0: not listening).
    pub fn backlog(&self) -> i32 {
        self.backlog.load(Relaxed)
    }

    /// Records the backlog of the program's `listen`.
    pub fn set_backlog(&self, backlog: i32) {
        self.backlog.store(backlog, Relaxed);
    }

    /// Why this listener is on kernel TCP only, if it is.
    pub fn tcp_only(&self) -> Option<Cause> {
        let w = self.tcp_only.load(Relaxed);
        let reason = Fallback::ALL.get(w as u32 as usize).copied()?;
        Some(Cause::new(reason, Detail::decode((w >> 32) as u32, 0)))
    }

    /// Counts bytes sent by a successful call returning `n`.
    #[inline]
    pub fn sent(&self, n: isize) {
        if n > 0 {
            stats::add_tx(self.path(), SlotHandle(self.slot.load(Relaxed)), n as usize);
        }
    }

    /// Counts bytes received by a successful call returning `n`.
    #[inline]
    pub fn received(&self, n: isize) {
        if n > 0 {
            stats::add_rx(self.path(), SlotHandle(self.slot.load(Relaxed)), n as usize);
        }
    }

    /// Tells `rsock stat` the connection now lives at `fd`.
    pub fn moved_to(&self, fd: i32) {
        stats::set_fd(SlotHandle(self.slot.load(Relaxed)), fd);
    }
}

/// Tracks table references (how many fds of the table name a socket) so it learns when its last fd is gone.
pub(crate) struct TableRefs(AtomicUsize);

impl TableRefs {
    pub(crate) const fn new() -> Self {
        TableRefs(AtomicUsize::new(0))
    }
    pub(crate) fn add(&self) {
        self.0.fetch_add(1, AcqRel);
    }
    /// True when this was the last fd.
    pub(crate) fn sub(&self) -> bool {
        self.0.fetch_sub(1, AcqRel) == 1
    }
    pub(crate) fn reset(&self) {
        self.0.store(0, Relaxed);
    }
}
