//! The fd table: which fds the shim owns, indexed by fd number.
//!
//! A flat array of atomic pointers in `.bss` (8 MiB of address space, touched only where fds
//! are owned). Looking up an fd the shim does not own is one bounds check and one atomic load:
//! no lock, no allocation, safe in a signal handler.
//!
//! Sockets live in type-stable memory: an entry is never returned to the allocator, only
//! recycled through a free list once its reference count drops to zero. So a thread that
//! loaded a pointer just before another thread closed the fd can still safely try to take a
//! reference (increment-if-not-zero) and then re-check that the fd still maps to it.

use crate::socket::Socket;
use std::ops::Deref;
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering::*};

/// fds at or above this are never owned (their calls pass straight through).
pub const MAX_FDS: usize = 1 << 20;

static TABLE: [AtomicPtr<Socket>; MAX_FDS] = [const { AtomicPtr::new(ptr::null_mut()) }; MAX_FDS];
/// One past the highest fd ever owned: bounds scans such as `close_range(3, ~0)`.
static HIGH_WATER: AtomicUsize = AtomicUsize::new(0);
/// Recycled sockets: a lock-free stack, so that a `close` from a signal handler never locks.
static FREE: AtomicPtr<Socket> = AtomicPtr::new(ptr::null_mut());

/// A counted reference to an owned socket.
pub struct SockRef(&'static Socket);

/// Whether the shim owns `fd` — the whole fast path for foreign fds.
#[inline(always)]
pub fn owns(fd: i32) -> bool {
    (fd as u32 as usize) < MAX_FDS && !TABLE[fd as u32 as usize].load(Acquire).is_null()
}

/// The socket behind `fd`, if the shim owns it.
#[inline(always)]
pub fn get(fd: i32) -> Option<SockRef> {
    let slot = TABLE.get(fd as u32 as usize)?;
    let p = slot.load(Acquire);
    if p.is_null() {
        return None;
    }
    get_slow(slot, p)
}

#[inline(never)]
fn get_slow(slot: &AtomicPtr<Socket>, p: *mut Socket) -> Option<SockRef> {
    // SAFETY: sockets are never freed (type-stable memory), so `p` is always dereferenceable.
    let s: &'static Socket = unsafe { &*p };
    if !s.try_acquire() {
        return None; // being recycled: the fd was closed under us
    }
    let r = SockRef(s);
    // The fd may have been closed and its socket reused between the load and the acquire.
    (slot.load(Acquire) == p).then_some(r)
}

/// Makes `fd` refer to `sock` (taking over the reference); returns the reference it replaced.
pub fn insert(fd: i32, sock: SockRef) -> Option<SockRef> {
    let Some(slot) = TABLE.get(fd as u32 as usize) else {
        return None; // dropping `sock` releases it: an fd this high passes through
    };
    HIGH_WATER.fetch_max(fd as usize + 1, Relaxed);
    sock.fds_add();
    let p = std::mem::ManuallyDrop::new(sock).0 as *const Socket as *mut Socket;
    let old = slot.swap(p, AcqRel);
    // SAFETY: a non-null table entry always holds one reference.
    (!old.is_null()).then(|| SockRef(unsafe { &*old }))
}

/// Forgets `fd`, returning the table's reference (dropping it may end the connection).
pub fn remove(fd: i32) -> Option<SockRef> {
    let slot = TABLE.get(fd as u32 as usize)?;
    if slot.load(Relaxed).is_null() {
        return None; // foreign fd: read only, no store
    }
    let old = slot.swap(ptr::null_mut(), AcqRel);
    // SAFETY: as in `insert`.
    (!old.is_null()).then(|| SockRef(unsafe { &*old }))
}

/// In a fork child: makes every owned socket's locks usable (see
/// [`Socket::after_fork_child`]). Only loads and the sockets' own reset: no allocation.
pub fn after_fork_child() {
    for slot in &TABLE[..high_water().min(MAX_FDS)] {
        let p = slot.load(Acquire);
        if !p.is_null() {
            // SAFETY: table entries point at never-freed sockets.
            unsafe { &*p }.after_fork_child();
        }
    }
}

/// The fds of this process that refer to `sock` (a scan up to the high-water mark).
pub fn fds_of(sock: &Socket) -> Vec<i32> {
    let want = sock as *const Socket as *mut Socket;
    (0..high_water().min(MAX_FDS))
        .filter(|&i| TABLE[i].load(Acquire) == want)
        .map(|i| i as i32)
        .collect()
}

/// One past the highest fd ever owned.
pub fn high_water() -> usize {
    HIGH_WATER.load(Relaxed)
}

impl SockRef {
    /// A fresh socket with one reference, from the free list or the allocator.
    pub fn new_socket(init: impl FnOnce(&Socket)) -> SockRef {
        let s = pop_free().unwrap_or_else(|| Box::leak(Box::new(Socket::empty())));
        s.reset();
        init(s);
        s.publish(); // refs 0 -> 1: visible to try_acquire from here on
        SockRef(s)
    }
}

impl Deref for SockRef {
    type Target = Socket;
    fn deref(&self) -> &Socket {
        self.0
    }
}

impl Clone for SockRef {
    fn clone(&self) -> SockRef {
        self.0.acquire();
        SockRef(self.0)
    }
}

impl Drop for SockRef {
    fn drop(&mut self) {
        if self.0.release() {
            push_free(self.0);
        }
    }
}

fn push_free(s: &'static Socket) {
    let p = s as *const Socket as *mut Socket;
    let mut head = FREE.load(Relaxed);
    loop {
        s.next_free.store(head, Relaxed);
        match FREE.compare_exchange_weak(head, p, Release, Relaxed) {
            Ok(_) => return,
            Err(now) => head = now,
        }
    }
}

/// Takes the whole stack (no ABA: nobody else can pop what we hold), keeps the first and
/// pushes the rest back.
fn pop_free() -> Option<&'static Socket> {
    let head = FREE.swap(ptr::null_mut(), Acquire);
    if head.is_null() {
        return None;
    }
    // SAFETY: entries on the free stack are leaked, never-freed sockets.
    let first: &'static Socket = unsafe { &*head };
    let mut rest = first.next_free.load(Relaxed);
    while !rest.is_null() {
        // SAFETY: as above.
        let s: &'static Socket = unsafe { &*rest };
        rest = s.next_free.load(Relaxed);
        push_free(s);
    }
    Some(first)
}
