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
//! write only, so nobody can read what the old connection left in it — but the local
//! program could, if the new peer announced bytes it never wrote (the length check in
//! `proto` refuses that, and this is the second wall): both buffers are zeroed when they
//! are put back, so what a connection can ever show its program is zeros or its own peer's
//! bytes, as with fresh memory (`RegBuf::new` allocates zeroed). Zeroing costs about a
//! memset of ring + send buffer (tens of µs for 2 × 256 KiB) at teardown, next to the
//! milliseconds a registration costs at setup.

use std::sync::Arc;

use super::device::Device;
use super::mr::RegBuf;
use super::pd::Pd;
use crate::forklock::ProcessMutex;

/// Most entries kept.
const MAX_ENTRIES: usize = 32;
/// Most bytes kept (rings and send buffers together).
const MAX_BYTES: usize = 16 << 20;

struct Entry {
    ring: RegBuf,
    send: RegBuf,
}

/// What the shelf needs to know of an entry (plain memory stands in for it in tests).
trait Kept {
    /// Ring and send buffer lengths.
    fn lens(&self) -> (usize, usize);
    /// Forgets every byte a past connection left.
    fn scrub(&mut self);
}

impl Kept for Entry {
    fn lens(&self) -> (usize, usize) {
        (self.ring.len(), self.send.len())
    }
    fn scrub(&mut self) {
        // No QP can reach the memory any more (see `give_back`): writing it is safe.
        self.ring.as_mut_slice().fill(0);
        self.send.as_mut_slice().fill(0);
    }
}

/// The kept entries, with room limits; every entry on it holds zeros only.
struct Shelf<E> {
    entries: Vec<E>,
    bytes: usize,
}

impl<E: Kept> Shelf<E> {
    const fn new() -> Self {
        Shelf {
            entries: Vec::new(),
            bytes: 0,
        }
    }

    /// Keeps `e`, zeroed, if there is room; gives it back otherwise.
    fn put(&mut self, mut e: E) -> Option<E> {
        let (r, s) = e.lens();
        if self.entries.len() >= MAX_ENTRIES || self.bytes + r + s > MAX_BYTES {
            return Some(e);
        }
        e.scrub();
        self.bytes += r + s;
        self.entries.push(e);
        None
    }

    /// An entry of these lengths that `fits` (same device), if one is kept.
    fn take(&mut self, lens: (usize, usize), fits: impl Fn(&E) -> bool) -> Option<E> {
        let i = self
            .entries
            .iter()
            .position(|e| e.lens() == lens && fits(e))?;
        let e = self.entries.swap_remove(i);
        self.bytes -= lens.0 + lens.1;
        Some(e)
    }
}

/// This process's shelf: a fork child gets a fresh one (and a fresh lock) and never uses or
/// frees its parent's entries, which belong to the parent's device context.
static POOL: ProcessMutex<Shelf<Entry>> = ProcessMutex::new(Shelf::new);

/// A PD with a ring of `ring_len` and a send buffer of `send_len` bytes registered in it,
/// on `dev`, if a connection that ended left one. Both buffers hold zeros only.
pub fn take(
    dev: &Arc<Device>,
    ring_len: usize,
    send_len: usize,
) -> Option<(Arc<Pd>, RegBuf, RegBuf)> {
    let e = POOL.lock().take((ring_len, send_len), |e| {
        Arc::ptr_eq(e.ring.mr().pd().device(), dev)
    })?;
    Some((e.ring.mr().pd().clone(), e.ring, e.send))
}

/// Frees every entry (their pinned memory is wanted elsewhere).
pub fn clear() {
    let entries = {
        let mut p = POOL.lock();
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
    // Zeroed under the lock: at most 32 entries, at teardown; a full shelf frees it unzeroed.
    let refused = POOL.lock().put(Entry { ring, send });
    drop(refused);
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Mem(Vec<u8>, Vec<u8>);

    impl Kept for Mem {
        fn lens(&self) -> (usize, usize) {
            (self.0.len(), self.1.len())
        }
        fn scrub(&mut self) {
            self.0.fill(0);
            self.1.fill(0);
        }
    }

    #[test]
    fn a_reused_ring_and_send_buffer_hold_only_zeros() {
        let mut shelf = Shelf::new();
        // A connection ends with its last bytes still in both buffers.
        assert!(shelf
            .put(Mem(vec![0xa5; 16384], b"secret".repeat(1000)))
            .is_none());
        assert!(shelf.take((16384, 999), |_| true).is_none(), "sizes differ");
        let again = shelf.take((16384, 6000), |_| true).expect("kept");
        assert!(again.0.iter().all(|&b| b == 0), "ring not cleared");
        assert!(again.1.iter().all(|&b| b == 0), "send buffer not cleared");
        assert_eq!(shelf.bytes, 0);
    }

    #[test]
    fn room_is_bounded() {
        let mut shelf = Shelf::new();
        for _ in 0..MAX_ENTRIES {
            assert!(shelf.put(Mem(vec![1; 8], vec![1; 8])).is_none());
        }
        assert!(shelf.put(Mem(vec![1; 8], vec![1; 8])).is_some());
        let mut big = Shelf::new();
        assert!(big.put(Mem(vec![0; MAX_BYTES], vec![0; 1])).is_some());
    }
}
