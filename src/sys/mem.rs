//! Shared mappings of a file: the stats region, mapped by its process and by `rsock` reading
//! or steering it. And private memory a fork child does not get: registered buffers.

use libc::{c_int, c_void};
use std::io;

/// Maps the first `len` bytes of the file `fd`, shared, readable and writable (the mapping
/// outlives `fd`).
pub fn map_shared(fd: c_int, len: usize) -> io::Result<*mut c_void> {
    // SAFETY: a new mapping where the kernel chooses: nothing of ours is replaced.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(p)
}

/// Removes a mapping made by [`map_shared`] or [`map_unforked`].
///
/// # Safety
/// `p` and `len` are such a mapping, which nothing uses any more.
pub unsafe fn unmap(p: *mut c_void, len: usize) {
    libc::munmap(p, len);
}

/// Maps `len` bytes of fresh zeroed memory, private to this process and left out of fork
/// children (`MADV_DONTFORK`). Memory registered with a device is pinned, and the kernel
/// copies every pinned page into a child at fork (it cannot share them copy-on-write): with
/// a link's 4 MiB or thousands of streams' rings, each fork paid that copy. No child may use
/// it anyway (one owner per RDMA object). If the advice fails the memory is still usable.
pub fn map_unforked(len: usize) -> io::Result<*mut u8> {
    // SAFETY: a new mapping where the kernel chooses: nothing of ours is replaced.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: advice on the mapping just made.
    unsafe { libc::madvise(p, len, libc::MADV_DONTFORK) };
    Ok(p.cast())
}
