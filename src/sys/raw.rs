//! Raw syscalls for the shim's own I/O (log file, stats file).
//!
//! These bypass libc's wrappers for calls the shim hooks (`write`, `close`), so the shim's
//! own I/O can never come back into its hooks, whatever the reentrancy guard says. Calls the
//! shim does not hook (`openat`, `fstat`, `mmap`, ...) go through libc directly.

use libc::{c_int, c_long};

/// The calling thread's errno.
#[inline]
pub fn errno() -> c_int {
    // SAFETY: __errno_location always returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// Sets the calling thread's errno.
#[inline]
pub fn set_errno(e: c_int) {
    // SAFETY: as in `errno`.
    unsafe { *libc::__errno_location() = e }
}

/// `write(2)` straight to the kernel; retries on EINTR and short writes. Errno is preserved.
pub fn write_all(fd: c_int, mut buf: &[u8]) -> bool {
    let saved = errno();
    let mut ok = true;
    while !buf.is_empty() {
        // SAFETY: buf is a valid readable slice for its length.
        let n = unsafe { libc::syscall(libc::SYS_write, fd as c_long, buf.as_ptr(), buf.len()) };
        if n < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            ok = false;
            break;
        }
        buf = &buf[n as usize..];
    }
    set_errno(saved);
    ok
}

/// `close(2)` straight to the kernel. Errno is preserved.
pub fn close(fd: c_int) {
    let saved = errno();
    // SAFETY: closing an fd the shim itself opened.
    unsafe { libc::syscall(libc::SYS_close, fd as c_long) };
    set_errno(saved);
}

/// Opens `path` (NUL-terminated) with O_CLOEXEC added; -1 on failure. Errno is preserved.
pub fn open(path: &[u8], flags: c_int, mode: libc::mode_t) -> c_int {
    debug_assert_eq!(path.last(), Some(&0));
    let saved = errno();
    // SAFETY: path is NUL-terminated.
    let fd = unsafe { libc::open(path.as_ptr().cast(), flags | libc::O_CLOEXEC, mode as libc::c_uint) };
    set_errno(saved);
    fd
}

/// Thread id of the caller.
pub fn gettid() -> i64 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) }
}

/// Process id of the caller.
pub fn getpid() -> i32 {
    // SAFETY: getpid has no arguments and cannot fail.
    unsafe { libc::getpid() }
}

/// Wall-clock time as (seconds, nanoseconds) since the epoch.
pub fn realtime() -> (i64, i64) {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    (ts.tv_sec, ts.tv_nsec)
}
