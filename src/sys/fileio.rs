//! Calls on the program's files that the shim does not hook: positional reads and writes and
//! seeking (sendfile and splice between a file and an RDMA stream), and a `FILE`'s fd
//! (fclose).

use libc::{c_int, off_t, ssize_t};

/// `pread(2)`: up to `buf.len()` bytes of `fd` at offset `off`, the file offset unchanged.
pub fn pread(fd: c_int, buf: &mut [u8], off: off_t) -> ssize_t {
    // SAFETY: a valid buffer of buf.len() bytes.
    unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), off) }
}

/// `pwrite(2)`: `buf` to `fd` at offset `off`, the file offset unchanged.
pub fn pwrite(fd: c_int, buf: &[u8], off: off_t) -> ssize_t {
    // SAFETY: a valid buffer of buf.len() bytes.
    unsafe { libc::pwrite(fd, buf.as_ptr().cast(), buf.len(), off) }
}

/// `lseek(2)`: moves `fd`'s file offset.
pub fn lseek(fd: c_int, off: off_t, whence: c_int) -> off_t {
    // SAFETY: no pointers.
    unsafe { libc::lseek(fd, off, whence) }
}

/// The fd under a stdio stream (`fileno(3)`).
///
/// # Safety
/// `stream` is a valid, open `FILE`.
pub unsafe fn fileno(stream: *mut libc::FILE) -> c_int {
    libc::fileno(stream)
}
