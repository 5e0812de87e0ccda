//! A process-global mutex that a fork child never has to share with its parent.
//!
//! A `static Mutex` is copied into a fork child in whatever state it had: if a thread of the
//! parent held it at the fork, it stays held in the child, where that thread does not exist,
//! and the child's first `lock` blocks forever. What such a mutex guards in the rdma layer
//! (the device list, the pool of registered memory) is the parent's anyway, and the child
//! must neither use nor free it (DESIGN.md, "Processes").
//!
//! So the lock and its value belong to one process: a [`ProcessMutex`] holds a pointer to a
//! slot made by the process that uses it. A process that finds another process's slot (a
//! fork child finding its parent's) makes a fresh one with a fresh lock and leaks the old
//! one without looking inside it — neither its lock nor its contents, which a parent thread
//! may have been changing at the fork, are ever touched. This needs no `pthread_atfork`
//! discipline, so it also holds for forks the shim's handlers do not see (`_Fork`, a fork
//! from a signal handler), as long as the process id cache is refreshed (`sys::raw::pid`).
//! A process that abandons its RDMA engine after a credential change ([`renew`]) gets fresh
//! slots the same way: what the old engine left in them is of credentials the kernel no
//! longer lets this process use.
//! A `vfork` child shares its parent's memory and its cached pid: it uses the parent's slot,
//! as it uses everything else of the parent's.

use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Bumped by [`renew`]: slots of an earlier generation are left alone, as a parent's are.
static GENERATION: AtomicU32 = AtomicU32::new(0);

/// From now on every [`ProcessMutex`] starts afresh in this process (its engine was
/// abandoned after a credential change; `api/creds.rs`).
pub fn renew() {
    GENERATION.fetch_add(1, Ordering::AcqRel);
}

struct Slot<T> {
    pid: i32,
    generation: u32,
    lock: Mutex<T>,
}

/// A mutex-protected value per process (see the module doc). Slots are never freed: one
/// small allocation per process that uses it.
pub struct ProcessMutex<T> {
    slot: AtomicPtr<Slot<T>>,
    init: fn() -> T,
}

impl<T> ProcessMutex<T> {
    /// A mutex whose value starts as `init()` in each process that locks it.
    pub const fn new(init: fn() -> T) -> Self {
        ProcessMutex {
            slot: AtomicPtr::new(std::ptr::null_mut()),
            init,
        }
    }

    /// This process's value, locked (a poisoned lock is taken over: the shim never panics).
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.lock_as(crate::sys::raw::pid(), GENERATION.load(Ordering::Acquire))
    }

    fn lock_as(&self, me: i32, generation: u32) -> MutexGuard<'_, T> {
        loop {
            let cur = self.slot.load(Ordering::Acquire);
            // SAFETY: slots are leaked, never freed: a non-null pointer stays valid.
            if let Some(s) = unsafe { cur.as_ref() } {
                if s.pid == me && s.generation == generation {
                    return s.lock.lock().unwrap_or_else(|e| e.into_inner());
                }
            }
            // First use in this process, the parent's slot in a fork child, or one of an
            // abandoned engine.
            let fresh = Box::into_raw(Box::new(Slot {
                pid: me,
                generation,
                lock: Mutex::new((self.init)()),
            }));
            if self
                .slot
                .compare_exchange(cur, fresh, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                // Another thread of ours installed one first: use that.
                // SAFETY: `fresh` was never shared.
                drop(unsafe { Box::from_raw(fresh) });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::raw;

    static COUNT: ProcessMutex<Vec<u32>> = ProcessMutex::new(Vec::new);

    #[test]
    fn one_value_per_process() {
        COUNT.lock_as(1, 0).push(7);
        assert_eq!(*COUNT.lock_as(1, 0), [7]);
        // Another process (a fork child) starts from a fresh value, not the parent's.
        assert!(COUNT.lock_as(2, 0).is_empty());
        // So does a new generation of the same process (`renew`).
        COUNT.lock_as(2, 0).push(8);
        assert!(COUNT.lock_as(2, 1).is_empty());
    }

    /// A thread holds the lock across a fork: the child still locks it (a fresh one), and
    /// an alarm turns a hang into a failure instead of a stuck test run.
    #[test]
    fn a_fork_child_is_not_blocked_by_a_lock_held_in_the_parent() {
        static HELD: ProcessMutex<u32> = ProcessMutex::new(|| 0);
        *HELD.lock() = 5;
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let g = HELD.lock();
            tx.send(()).unwrap();
            done_rx.recv().unwrap(); // hold until the fork is over
            drop(g);
        });
        rx.recv().unwrap();
        let child = raw::test_fork(|| {
            raw::refresh_pid(); // what the shim's fork handler does first
            let v = *HELD.lock();
            i32::from(v != 0) // a fresh value, not the parent's 5
        });
        done_tx.send(()).unwrap();
        holder.join().unwrap();
        assert_eq!(
            child,
            Ok(0),
            "the fork child blocked or saw the parent's value"
        );
        assert_eq!(*HELD.lock(), 5, "the parent keeps its value");
    }
}
