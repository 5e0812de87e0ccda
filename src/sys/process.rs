//! What libc does or tells for the process as a whole: functions run at its exit, and the
//! physical memory of its machine.

/// Registers `f` to run at process exit (`exit`, return from `main`), as `atexit(3)`; false
/// if it could not be registered.
pub fn at_exit(f: extern "C" fn()) -> bool {
    // SAFETY: registering a plain extern "C" fn.
    unsafe { libc::atexit(f) == 0 }
}

/// The machine's physical memory in bytes (saturating), if `sysconf` knows it.
pub fn physical_memory() -> Option<usize> {
    // SAFETY: sysconf has no preconditions.
    let (pages, size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages > 0 && size > 0 {
        Some((pages as usize).saturating_mul(size as usize))
    } else {
        None
    }
}
