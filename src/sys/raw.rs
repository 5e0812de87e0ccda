//! Raw syscalls for the shim's own I/O (log file, stats file).
//!
//! These bypass libc's wrappers for calls the shim hooks (`write`, `close`), so the shim's
//! own I/O can never come back into its hooks, whatever the reentrancy guard says. Calls the
//! shim does not hook (`openat`, `fstat`, `mmap`, ...) go through libc directly.

use libc::{c_int, c_long};
use std::sync::atomic::{AtomicI32, Ordering::Relaxed};

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
        let n = unsafe {
            syscall3(
                libc::SYS_write,
                fd as c_long,
                buf.as_ptr() as c_long,
                buf.len() as c_long,
            )
        };
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

/// A new nonblocking, close-on-exec eventfd (-1 on failure).
pub fn eventfd() -> c_int {
    // SAFETY: no pointers.
    unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) }
}

/// Adds one to an eventfd (async-signal-safe). Errno is preserved.
pub fn eventfd_add(fd: c_int) {
    write_all(fd, &1u64.to_ne_bytes());
}

/// Takes an eventfd's count (0 if it was zero). Errno is preserved.
pub fn eventfd_take(fd: c_int) -> u64 {
    let saved = errno();
    let mut v = [0u8; 8];
    // SAFETY: 8-byte read into a local buffer.
    let n = unsafe { syscall3(libc::SYS_read, fd as c_long, v.as_mut_ptr() as c_long, 8) };
    set_errno(saved);
    if n == 8 {
        u64::from_ne_bytes(v)
    } else {
        0
    }
}

/// A system call with six arguments straight to the kernel, returning as glibc's
/// `syscall(3)` does: -1 with errno set for an error. Used by the `syscall` hook, so that the
/// shim's own `syscall` calls, which the loader binds to that hook too, never need `dlsym`.
///
/// # Safety
/// As the system call `n` with these arguments.
pub unsafe fn syscall6(n: c_long, a: [c_long; 6]) -> c_long {
    let ret: c_long;
    // SAFETY: the x86_64 Linux system call convention; the kernel clobbers rcx and r11.
    std::arch::asm!(
        "syscall",
        inlateout("rax") n => ret,
        in("rdi") a[0],
        in("rsi") a[1],
        in("rdx") a[2],
        in("r10") a[3],
        in("r8") a[4],
        in("r9") a[5],
        lateout("rcx") _,
        lateout("r11") _,
        options(nostack),
    );
    if (-4095..0).contains(&ret) {
        set_errno(-ret as c_int);
        -1
    } else {
        ret
    }
}

/// [`syscall6`] for a call of at most three arguments.
///
/// # Safety
/// As the system call `n` with these arguments.
pub unsafe fn syscall3(n: c_long, a: c_long, b: c_long, c: c_long) -> c_long {
    syscall6(n, [a, b, c, 0, 0, 0])
}

/// `close(2)` straight to the kernel. Errno is preserved.
pub fn close(fd: c_int) {
    let saved = errno();
    // SAFETY: closing an fd the shim itself opened.
    unsafe { syscall3(libc::SYS_close, fd as c_long, 0, 0) };
    set_errno(saved);
}

/// Opens `path` (NUL-terminated) with O_CLOEXEC added; -1 on failure. Errno is preserved.
pub fn open(path: &[u8], flags: c_int, mode: libc::mode_t) -> c_int {
    debug_assert_eq!(path.last(), Some(&0));
    let saved = errno();
    // SAFETY: path is NUL-terminated.
    let fd = unsafe {
        libc::open(
            path.as_ptr().cast(),
            flags | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    };
    set_errno(saved);
    fd
}

/// Lowest fd number for the shim's own long-lived fds: near the top of the soft
/// `RLIMIT_NOFILE`, so they never take the numbers a program expects `open`/`socket` to
/// return next (programs may rely on getting the lowest free number). Read once (a syscall
/// per fd otherwise); a dup that finds it past a lowered limit reads it again.
fn hidden_fd_base(fresh: bool) -> c_int {
    static BASE: AtomicI32 = AtomicI32::new(0);
    let cached = BASE.load(Relaxed);
    if cached > 0 && !fresh {
        return cached;
    }
    let mut r = libc::rlimit {
        rlim_cur: 1024,
        rlim_max: 1024,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) };
    let cur = r.rlim_cur.min(1 << 20) as c_int;
    let base = (cur - 96).max(cur / 2).max(3);
    BASE.store(base, Relaxed);
    base
}

/// Moves a shim-internal `fd` to a high number (close-on-exec) and returns the new number;
/// returns `fd` unchanged if no high number is free. Errno is preserved.
pub fn hide(fd: c_int) -> c_int {
    if fd < 0 {
        return fd;
    }
    let saved = errno();
    let n = dup_high(fd);
    let out = if n >= 0 {
        close(fd);
        n
    } else {
        fd
    };
    set_errno(saved);
    out
}

/// A close-on-exec copy of `fd` at a high number, or -1.
pub fn dup_high(fd: c_int) -> c_int {
    let dup = |base: c_int| {
        // SAFETY: F_DUPFD_CLOEXEC on an fd of the shim's, straight to the kernel (fcntl is
        // hooked).
        unsafe {
            syscall3(
                libc::SYS_fcntl,
                fd as c_long,
                libc::F_DUPFD_CLOEXEC as c_long,
                base as c_long,
            ) as c_int
        }
    };
    let n = dup(hidden_fd_base(false));
    if n < 0 && errno() == libc::EINVAL {
        return dup(hidden_fd_base(true)); // the program lowered its limit
    }
    n
}

/// Moves an fd that a library opened for the shim, and reads from `field` on every use (an
/// rdma_cm event channel's, a completion channel's, a verbs context's), to a high number
/// (close-on-exec): the low numbers are the program's. A program that closes or `dup2`s
/// over a number it never opened (a fork child putting its connection on fd 3) would
/// otherwise tear down the shim's connections.
///
/// # Safety
/// `field` points at a live fd field that no other thread reads meanwhile, except for
/// calls that may still use the old number until it is closed here.
pub unsafe fn rehome(field: *mut c_int) {
    // SAFETY: valid per the contract.
    let old = unsafe { field.read_volatile() };
    if old < 0 || old >= hidden_fd_base(false) {
        return;
    }
    let saved = errno();
    let n = dup_high(old);
    if n >= 0 {
        // SAFETY: valid per the contract.
        unsafe { field.write_volatile(n) };
        close(old);
    }
    set_errno(saved);
}

/// Thread id of the caller.
/// Whether this process runs in secure-execution mode (setuid/setgid, file capabilities):
/// the loader ignores the caller's `LD_*` there, and the shim its `RSOCK_*`.
pub fn secure_execution() -> bool {
    // SAFETY: getauxval reads the auxiliary vector; no preconditions.
    unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
}

pub fn gettid() -> i64 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { syscall3(libc::SYS_gettid, 0, 0, 0) }
}

/// Process id of the caller (a syscall: glibc does not cache it).
pub fn getpid() -> i32 {
    // SAFETY: getpid has no arguments and cannot fail.
    unsafe { libc::getpid() }
}

/// Whether process `pid` exists (a zombie does, until reaped): `kill(pid, 0)` says ESRCH
/// only for one that does not. EPERM (another user's) means it exists.
pub fn process_exists(pid: i32) -> bool {
    // SAFETY: signal 0 sends nothing; it only checks that the process exists.
    pid > 0 && (unsafe { libc::kill(pid, 0) } == 0 || errno() != libc::ESRCH)
}

static PID: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// Process id, cached for hot paths. [`refresh_pid`] runs at start-up and in every fork
/// child (the shim's `pthread_atfork` handler), so the cache is never filled from a `vfork`
/// child, whose memory — this cache included — is its parent's.
#[inline]
pub fn pid() -> i32 {
    match PID.load(std::sync::atomic::Ordering::Relaxed) {
        0 => refresh_pid(),
        p => p,
    }
}

/// Re-reads the process id into the cache (start-up, fork child).
pub fn refresh_pid() -> i32 {
    let p = getpid();
    PID.store(p, std::sync::atomic::Ordering::Relaxed);
    p
}

/// Whether the caller runs in a child that shares its parent's memory (`vfork`,
/// `posix_spawn`, `clone(CLONE_VM)`): everything the shim holds in memory is the parent's
/// there and must not be changed. A syscall: call it only on paths that would change state.
pub fn in_vfork_child() -> bool {
    let cached = PID.load(std::sync::atomic::Ordering::Relaxed);
    cached != 0 && cached != getpid()
}

/// Whether a blocking call interrupted by a signal handler should go on waiting: true when
/// every installed handler was set with `SA_RESTART`. The kernel decides per signal; which
/// one interrupted us is not known here, so any handler without `SA_RESTART` means `EINTR`
/// (what Python's Ctrl-C needs). Called only after an interruption: 64 `sigaction` queries.
pub fn signals_restart() -> bool {
    // Fault signals (Rust's runtime handles SIGSEGV and SIGBUS for stack overflows) are raised
    // by the faulting thread itself, never while it sleeps in a call: they don't count.
    let synchronous = [
        libc::SIGSEGV,
        libc::SIGBUS,
        libc::SIGILL,
        libc::SIGFPE,
        libc::SIGTRAP,
    ];
    (1..=64).filter(|s| !synchronous.contains(s)).all(|sig| {
        // SAFETY: a query only (null new action); sigaction is plain data.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        let r = unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) };
        r != 0
            || old.sa_sigaction == libc::SIG_DFL
            || old.sa_sigaction == libc::SIG_IGN
            || old.sa_flags & libc::SA_RESTART != 0
    })
}

/// Wall-clock time as (seconds, nanoseconds) since the epoch.
pub fn realtime() -> (i64, i64) {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    (ts.tv_sec, ts.tv_nsec)
}

/// Runs `f` in a fork child and returns its exit status (`Err(signal)` if it was killed).
/// The child has 10 s (`alarm`): a child that hangs fails the test instead of the test run.
#[cfg(test)]
pub fn test_fork(f: impl FnOnce() -> i32) -> Result<i32, i32> {
    // SAFETY: the child runs only `f` and `_exit`s without unwinding or running destructors.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: plain syscalls in the child.
        unsafe {
            libc::alarm(10);
            // A panic must not unwind into the test harness's copy in the child.
            let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(101);
            libc::_exit(code);
        }
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(r, pid, "waitpid");
    if libc::WIFEXITED(status) {
        Ok(libc::WEXITSTATUS(status))
    } else {
        Err(libc::WTERMSIG(status))
    }
}

#[cfg(test)]
mod signal_tests {
    use super::signals_restart;

    extern "C" fn noop(_: libc::c_int) {}

    fn set(sig: libc::c_int, flags: libc::c_int) -> libc::sigaction {
        // SAFETY: installing a no-op handler for a signal nobody sends in this test.
        unsafe {
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = noop as extern "C" fn(libc::c_int) as usize;
            new.sa_flags = flags;
            let mut old: libc::sigaction = std::mem::zeroed();
            assert_eq!(libc::sigaction(sig, &new, &mut old), 0);
            old
        }
    }

    #[test]
    fn a_handler_without_sa_restart_means_eintr() {
        let before = signals_restart();
        let old = set(libc::SIGUSR2, libc::SA_RESTART);
        assert_eq!(signals_restart(), before);
        set(libc::SIGUSR2, 0);
        assert!(!signals_restart());
        // SAFETY: restoring the previous action.
        unsafe { libc::sigaction(libc::SIGUSR2, &old, std::ptr::null_mut()) };
    }
}
