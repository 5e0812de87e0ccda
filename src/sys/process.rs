//! What libc does or tells for the process as a whole: functions run at its exit and around
//! its forks, the physical memory of its machine, a signal raised in it, its end
//! (`exit_group`), its environment and name as the C library holds them, its real user,
//! whether another process exists, and which of its fds are open on a device.

use libc::{c_char, c_int, c_long};
use std::ffi::CStr;

/// Registers `f` to run at process exit (`exit`, return from `main`), as `atexit(3)`; false
/// if it could not be registered.
pub fn at_exit(f: extern "C" fn()) -> bool {
    // SAFETY: registering a plain extern "C" fn.
    unsafe { libc::atexit(f) == 0 }
}

/// Registers `prepare` to run before every `fork()` and `child` in the child after it, as
/// `pthread_atfork(3)` (nothing for the parent); false if they could not be registered.
pub fn at_fork(prepare: extern "C" fn(), child: extern "C" fn()) -> bool {
    // SAFETY: registering plain extern "C" fns.
    unsafe {
        libc::pthread_atfork(
            Some(prepare as unsafe extern "C" fn()),
            None,
            Some(child as unsafe extern "C" fn()),
        ) == 0
    }
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

/// Raises `sig` in the calling thread (`raise(3)`).
pub fn raise(sig: c_int) {
    // SAFETY: raising a signal in the calling thread, as the kernel would.
    unsafe { libc::raise(sig) };
}

/// Ends the process at once (`exit_group(2)`): no `atexit` handlers, no stdio flush.
pub fn exit_group(status: c_int) -> ! {
    // SAFETY: exit_group takes no pointers and does not return.
    unsafe {
        super::raw::syscall3(libc::SYS_exit_group, status as c_long, 0, 0);
        libc::abort() // not reached
    }
}

/// The real user id of the process (`getuid(2)`).
pub fn real_uid() -> libc::uid_t {
    // SAFETY: getuid cannot fail.
    unsafe { libc::getuid() }
}

/// Whether the process `pid` exists: `kill(pid, 0)` succeeds, or fails with `EPERM` (a
/// process of another user). Not for pid 0 or -1 (a group, every process).
pub fn exists(pid: c_int) -> bool {
    // SAFETY: signal 0 only checks existence.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// The basename of argv[0] as glibc keeps it (`program_invocation_short_name`), if it has
/// one.
pub fn short_name() -> Option<&'static CStr> {
    extern "C" {
        static program_invocation_short_name: *const c_char;
    }
    // SAFETY: glibc sets this before any constructor runs; it points to a NUL-terminated
    // string in argv[0] (or "" when there is none).
    let p = unsafe { program_invocation_short_name };
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null, NUL-terminated (see above), never freed.
    Some(unsafe { CStr::from_ptr(p) })
}

/// The C library's `environ`: the process's environment, a null-terminated array of
/// `NAME=value` strings.
pub fn environ() -> *const *const c_char {
    extern "C" {
        static environ: *const *const c_char;
    }
    // SAFETY: reading the C library's environment pointer.
    unsafe { environ }
}

/// This process's fds open on a file under `dir` (a prefix such as `/dev/infiniband/`), as
/// `/proc/self/fd` shows them; empty if it cannot be read.
pub fn fds_open_under(dir: &str) -> Vec<(c_int, std::path::PathBuf)> {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| {
            let e = e.ok()?;
            let fd = e.file_name().to_str()?.parse::<c_int>().ok()?;
            let target = std::fs::read_link(e.path()).ok()?;
            target.starts_with(dir).then_some((fd, target))
        })
        .collect()
}
