//! Registered memory of connections that ended, kept for new ones.
//!
//! Allocating and registering a ring and a send buffer is a large part of setting a
//! connection up (3.7 of 17 ms per connect at 256 KiB each, measured in the Soft-RoCE
//! guest, 2026-11-24). A connection's PD and its two registrations are therefore put here
//! when the connection is freed and handed to the next connection of the same sizes on the
//! same device.
//!
//! Isolation (see `pd`) holds because an entry is taken only once no QP is left in its PD:
//! the old peer's writes needed the old QP, which is destroyed; the new peer learns the
//! same rkey but can use it through the new QP alone. The ring is registered for remote
//! write only, so nobody can read what the old connection left in it.

use std::sync::{Arc, Mutex};

use super::device::Device;
use super::mr::RegBuf;
use super::pd::Pd;

/// Most entries kept.
const MAX_ENTRIES: usize = 32;
/// Most bytes kept (rings and send buffers together).
const MAX_BYTES: usize = 16 << 20;

struct Entry {
    ring: RegBuf,
    send: RegBuf,
}

struct Pool {
    /// The process that filled it: a fork child finds its parent's entries in its memory
    /// and must never use or free them (they belong to the parent's device context).
    pid: i32,
    entries: Vec<Entry>,
    bytes: usize,
}

static POOL: Mutex<Pool> = Mutex::new(Pool {
    pid: 0,
    entries: Vec::new(),
    bytes: 0,
});

fn pool() -> std::sync::MutexGuard<'static, Pool> {
    let mut p = POOL.lock().unwrap_or_else(|e| e.into_inner());
    let me = crate::sys::raw::pid();
    if p.pid != me {
        // Forget, never drop, what another process put here.
        std::mem::forget(std::mem::take(&mut p.entries));
        p.bytes = 0;
        p.pid = me;
    }
    p
}

/// A PD with a ring of `ring_len` and a send buffer of `send_len` bytes registered in it,
/// on `dev`, if a connection that ended left one.
pub fn take(
    dev: &Arc<Device>,
    ring_len: usize,
    send_len: usize,
) -> Option<(Arc<Pd>, RegBuf, RegBuf)> {
    let mut p = pool();
    let i = p.entries.iter().position(|e| {
        e.ring.len() == ring_len
            && e.send.len() == send_len
            && Arc::ptr_eq(e.ring.mr().pd().device(), dev)
    })?;
    let e = p.entries.swap_remove(i);
    p.bytes -= e.ring.len() + e.send.len();
    Some((e.ring.mr().pd().clone(), e.ring, e.send))
}

/// Frees every entry (their pinned memory is wanted elsewhere).
pub fn clear() {
    let entries = {
        let mut p = pool();
        p.bytes = 0;
        std::mem::take(&mut p.entries)
    };
    drop(entries);
}

/// A freed connection's ring and send buffer: kept if `reusable`, they share a PD that
/// nothing else holds (its QP is destroyed) and the pool has room; freed otherwise (a fork
/// child's copy of its parent's is never freed).
pub fn give_back(ring: RegBuf, send: RegBuf, reusable: bool) {
    let pd = ring.mr().pd();
    // The two registrations are the PD's only holders: no QP can reach the memory.
    if !Arc::ptr_eq(pd, send.mr().pd()) || Arc::strong_count(pd) != 2 {
        return;
    }
    if !pd.device().is_ours() {
        // A fork child's copy of its parent's memory: never used or freed here.
        std::mem::forget((ring, send));
        return;
    }
    if !reusable {
        return;
    }
    let len = ring.len() + send.len();
    let mut p = pool();
    if p.entries.len() < MAX_ENTRIES && p.bytes + len <= MAX_BYTES {
        p.bytes += len;
        p.entries.push(Entry { ring, send });
    }
}
