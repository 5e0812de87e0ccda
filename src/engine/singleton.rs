//! This process's one engine: made on first use ([`get`]), told apart by pid from the parent's
//! engine a fork child finds in its memory (never touched there), and what a fork does to it.

use super::exit::drain_at_exit_c;
use super::registry::{QpMap, ACTIVE_STREAMS};
use super::tags::{TAG_CM, TAG_IPC, TAG_WAKE};
use super::{active, ipc, lock, spin, stream, takeover, Engine};
use crate::config::Config;
use crate::negcache::NegCache;
use crate::rdma::{self, EventChannel};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, Ordering::*};
use std::sync::{Mutex, Once};
use std::time::Duration;

/// Whether this process's engine (if any) is its own — false in a fork child of a process
/// that had one: the engine there is the parent's.
pub fn is_owner_process() -> bool {
    // SAFETY: engines are leaked, never freed: a non-null pointer stays valid.
    match unsafe { ENGINE.load(Acquire).as_ref() } {
        Some(e) => e.pid == crate::sys::raw::pid(),
        None => true,
    }
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
/// refuses the engine's writes, nor where its helper thread cannot start (haproxy's worker
/// sets `RLIMIT_NPROC` to 0): a dual listener's queue is fed only by the helper, and a
/// closed stream is freed only by it. New connections then take kernel TCP, counted
/// `rdma_unavailable`.
pub fn for_new() -> Option<&'static Engine> {
    get().filter(|e| !e.stale.load(Acquire) && e.ensure_helper())
}

/// This process's engine if it has made one (never makes one).
pub fn existing() -> Option<&'static Engine> {
    // SAFETY: engines are leaked, never freed: a non-null pointer stays valid.
    unsafe { ENGINE.load(Acquire).as_ref() }.filter(|e| e.pid == crate::sys::raw::pid())
}

/// The current process's engine (null before one is made, or its parent's in a fork child).
pub(super) static ENGINE: AtomicPtr<Engine> = AtomicPtr::new(std::ptr::null_mut());
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
        if !crate::rdma::device_present() {
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
/// A process whose children may take its streams over (it has listeners or streams) also
/// leaves them a started instance of the RDMA libraries (`rdma::ffi::prepare_spare`), made
/// at its first such fork: a child that takes a stream over then makes its engine in a few
/// milliseconds instead of about fifty.
pub fn before_fork() {
    if crate::guard::active() {
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
    let stale = e.stale.load(Acquire); // its children could not use the spare's device either
    if e.cfg.takeover && !stale && (active() || !lock(&e.listeners).is_empty()) {
        rdma::ffi::prepare_spare();
    }
    if !active() {
        return;
    }
    e.all_streams().iter().for_each(|s| s.share());
}

/// In a fork child: the parent's streams are not this process's to drive or wait for.
pub fn after_fork_child() {
    super::steps::forked_now();
    ACTIVE_STREAMS.store(0, Relaxed);
    super::listener::OWNED.store(0, Relaxed); // the parent's listeners are not handed on here
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

/// `RSOCK_MAX_PINNED_MB` in bytes: unset, a quarter of physical memory; 0, no limit.
fn pinned_limit(mb: Option<u32>) -> usize {
    match mb {
        Some(0) => usize::MAX,
        Some(mb) => (mb as usize) << 20,
        None => crate::sys::process::physical_memory().map_or(usize::MAX, |bytes| bytes / 4),
    }
}

impl Engine {
    fn new() -> Result<Engine, rdma::Error> {
        let mut steps = super::steps::Steps::start();
        rdma::ffi::lib()?;
        steps.mark("libraries");
        rdma::mr::set_pinned_limit(pinned_limit(Config::get().max_pinned_mb));
        let ch = EventChannel::new()?;
        steps.mark("channel");
        // SAFETY: plain syscalls creating fds we own.
        let (epfd, wake_fd, exit_done_fd) = unsafe {
            (
                crate::sys::raw::hide(crate::sys::real::epoll_create1(libc::EPOLL_CLOEXEC)),
                crate::sys::raw::hide(crate::sys::raw::eventfd()),
                crate::sys::raw::hide(crate::sys::raw::eventfd()),
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
            links: Mutex::new(Default::default()),
            link_hints: Mutex::new(Default::default()),
            link_making: Mutex::new(()),
            streams_by_token: Mutex::new(HashMap::new()),
            accepting: Mutex::new(()),
            listeners: Mutex::new(HashMap::new()),
            branches: Mutex::new(Default::default()),
            redirects: Mutex::new(HashMap::new()),
            deferred: std::sync::atomic::AtomicUsize::new(0),
            devices: Mutex::new(Vec::new()),
            tended: Mutex::new(HashMap::new()),
            moved: Mutex::new(takeover::Moved::default()),
            given_back: Mutex::new(Vec::new()),
            resumes: Mutex::new(takeover::Resumes::default()),
            resume_cv: std::sync::Condvar::new(),
            early: Mutex::new(QpMap::default()),
            epfd,
            wake_fd,
            exit_asked: AtomicBool::new(false),
            stop_helper: AtomicBool::new(false),
            exit_done_fd,
            // Tokens differ between engines (a taker keeps the stream's token), so each
            // starts at a random point.
            next_token: AtomicU64::new((crate::sys::unix::random_u64() >> 16) | 1),
            helper: Once::new(),
            helper_failed: AtomicBool::new(false),
            negcache: NegCache::new(),
            poll_budget: spin::Budget::new(Duration::from_micros(u64::from(Config::get().spin_us))),
        };
        e.watch(wake_fd, TAG_WAKE)?;
        e.watch(e.ch.fd(), TAG_CM)?;
        if let Some(server) = &e.ipc {
            e.watch(server.fd(), TAG_IPC)?;
        }
        crate::sys::process::at_exit(drain_at_exit_c);
        steps.mark("ipc");
        steps.log(format_args!("RDMA engine made"));
        Ok(e)
    }

    /// The process is about to change its credentials, and nothing of this engine is in use
    /// any more (no stream, listener, hand-over or deferred request: a daemon that listened
    /// as root and has not served a connection yet). Stops its helper thread, closes its
    /// own fds and forgets it, so that the next [`get`] makes a new engine — on a new
    /// instance of the RDMA libraries (`rdma::ffi::renew`) and fresh rdma-layer state
    /// (`forklock::renew`) — with the new credentials. False, with nothing done, if
    /// something still uses it (then it is only retired, as before).
    pub fn abandon_for_new_credentials(&'static self) -> bool {
        let idle = lock(&self.streams_by_qp).is_empty()
            && lock(&self.links).is_empty()
            && lock(&self.streams_by_token).is_empty()
            && lock(&self.listeners).is_empty()
            && lock(&self.tended).is_empty()
            && lock(&self.early).is_empty()
            && lock(&self.moved).is_empty()
            && lock(&self.resumes).is_idle()
            && self.deferred.load(Acquire) == 0;
        if !idle {
            return false;
        }
        if self.helper.is_completed() {
            self.stop_helper.store(true, Release);
            self.wake();
            if crate::sys::poll::poll_one_raw_full(self.exit_done_fd, libc::POLLIN, 2000) <= 0 {
                log::warn!(
                    "credentials change: the engine thread did not stop; keeping the engine"
                );
                return false;
            }
        }
        if let Some(server) = &self.ipc {
            server.forget_in_child(); // its requests are refused from now on
        }
        for fd in [self.epfd, self.wake_fd, self.exit_done_fd, self.ch.fd()] {
            crate::sys::raw::close(fd);
        }
        // The old instance's device contexts stay open (a few fds): closing them would take
        // calls into it, which the kernel refuses to the new credentials.
        ENGINE.store(std::ptr::null_mut(), Release);
        crate::forklock::renew();
        rdma::ffi::renew();
        true
    }

    /// The process is about to change its credentials: the engine makes nothing new from now
    /// on (see [`for_new`]). False if it had been retired already.
    pub fn retire_for_new_credentials(&self) -> bool {
        !self.stale.swap(true, AcqRel)
    }
}
