//! The per-thread reentrancy guard.
//!
//! While a thread runs shim logic, every hooked call it makes — the shim's own, or one made
//! by a library the shim calls (librdmacm and libibverbs call socket/connect/read/write/poll/
//! fcntl/ioctl) — must go straight to libc. The flag is a `const`-initialised `Cell` with no
//! destructor, so reading it never allocates and works during thread teardown.

use std::cell::Cell;

thread_local! {
    static IN_SHIM: Cell<bool> = const { Cell::new(false) };
}

/// Proof that this thread is inside the shim; clears the flag when dropped.
#[must_use]
pub struct Guard(());

/// Marks the thread as inside the shim, or `None` if it already is (the call is nested and
/// must be forwarded to libc untouched).
#[inline]
pub fn enter() -> Option<Guard> {
    IN_SHIM.with(|f| {
        if f.replace(true) {
            None
        } else {
            Some(Guard(()))
        }
    })
}

/// Whether the calling thread is already inside the shim.
#[inline]
pub fn active() -> bool {
    IN_SHIM.with(Cell::get)
}

impl Drop for Guard {
    fn drop(&mut self) {
        IN_SHIM.with(|f| f.set(false));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_enter_is_refused_until_outer_guard_drops() {
        assert!(!active());
        let g = enter().expect("first entry");
        assert!(active());
        assert!(enter().is_none());
        drop(g);
        assert!(!active());
        assert!(enter().is_some());
    }

    #[test]
    fn flag_is_per_thread() {
        let _g = enter().unwrap();
        std::thread::spawn(|| assert!(enter().is_some()))
            .join()
            .unwrap();
    }
}
