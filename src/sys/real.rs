//! The real libc functions, found once with `dlsym(RTLD_NEXT)`.
//!
//! Each function here calls the next definition of the symbol after librsock.so in the
//! lookup order (normally glibc's), never our own hook. The pointers are resolved eagerly
//! by [`resolve_all`] from the shim's constructor, so that a hook first entered from a
//! signal handler never calls `dlsym`; a hook that runs before the constructor (another
//! library's constructor can call `connect`) resolves its own pointer on first use.
//!
//! Calling through a pointer is one relaxed load plus an indirect call: this is the whole
//! cost the shim adds to an fd it does not own, besides the fd-table load.

use libc::{c_int, c_uint, c_ulong, c_void, fd_set, iovec, msghdr, nfds_t, off64_t, off_t, pid_t};
use libc::{
    epoll_event, pollfd, sigset_t, size_t, sockaddr, socklen_t, ssize_t, timespec, timeval,
};
use std::sync::atomic::{AtomicPtr, Ordering};

/// Looks `name` (NUL-terminated) up after our own object and caches it in `slot`.
#[cold]
fn resolve(slot: &AtomicPtr<c_void>, name: &'static str) -> *mut c_void {
    // SAFETY: `name` is a NUL-terminated literal produced by the macro below.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) };
    slot.store(p, Ordering::Relaxed);
    p
}

/// libc's `dprintf`. It is variadic past its format, so it is not in the table below: its
/// hook is a trampoline that jumps here with every argument as the caller left it.
pub fn dprintf_fn() -> *mut c_void {
    static SLOT: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
    match SLOT.load(Ordering::Relaxed) {
        p if p.is_null() => resolve(&SLOT, "dprintf\0"),
        p => p,
    }
}

/// What a libc function returns when it fails: -1, or a null pointer.
trait Failed {
    const FAILED: Self;
}

impl Failed for c_int {
    const FAILED: c_int = -1;
}

impl Failed for () {
    const FAILED: () = ();
}

impl Failed for ssize_t {
    const FAILED: ssize_t = -1;
}

impl Failed for *mut libc::FILE {
    const FAILED: *mut libc::FILE = std::ptr::null_mut();
}

macro_rules! real_functions {
    ($( fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty $(, variadic $var:ty)?; )*) => {
        #[allow(non_upper_case_globals)]
        mod slot {
            use super::*;
            $( pub(super) static $name: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut()); )*
        }

        /// Resolves every real function now (called from the shim's constructor).
        pub fn resolve_all() {
            $( resolve(&slot::$name, concat!(stringify!($name), "\0")); )*
        }

        $(
            /// Calls the real libc function of the same name.
            ///
            /// # Safety
            /// Same contract as the libc function. If libc lacks the symbol, fails with ENOSYS.
            #[inline(always)]
            pub unsafe fn $name($($arg: $ty),*) -> $ret {
                let p = slot::$name.load(Ordering::Relaxed);
                if p.is_null() {
                    return cold::$name($($arg),*);
                }
                real_functions!(@call p, ($($arg: $ty),*), $ret $(, $var)?)
            }
        )*

        /// First calls, made before the constructor resolved everything: kept out of line so
        /// the common path needs no stack frame.
        mod cold {
            use super::*;
            $(
                #[cold]
                #[inline(never)]
                pub(super) unsafe fn $name($($arg: $ty),*) -> $ret {
                    let p = resolve(&slot::$name, concat!(stringify!($name), "\0"));
                    if p.is_null() {
                        *libc::__errno_location() = libc::ENOSYS;
                        return <$ret as Failed>::FAILED;
                    }
                    real_functions!(@call p, ($($arg: $ty),*), $ret $(, $var)?)
                }
            )*
        }
    };
    (@call $p:ident, ($($arg:ident: $ty:ty),*), $ret:ty) => {{
        // SAFETY: `$p` is the address of the libc function with exactly this signature.
        let f: unsafe extern "C" fn($($ty),*) -> $ret = std::mem::transmute($p);
        f($($arg),*)
    }};
    // C-variadic functions (fcntl, ioctl): on x86_64 SysV the optional argument travels in
    // a register whether it is an int or a pointer, so forwarding one machine word is exact.
    (@call $p:ident, ($a:ident: $ta:ty, $b:ident: $tb:ty, $c:ident: $tc:ty), $ret:ty, $var:ty) => {{
        // SAFETY: as above; the callee is variadic after its first two arguments.
        let f: unsafe extern "C" fn($ta, $tb, ...) -> $ret = std::mem::transmute($p);
        f($a, $b, $c)
    }};
}

/// Invokes `$m!` with the signature of every libc function the shim hooks: the one list
/// both the real-function table here and the exported hooks in `preload/` are made from.
/// Variadic functions are marked `, variadic usize` (their optional argument as one word).
#[macro_export]
macro_rules! with_hooked_functions {
    ($m:ident) => {
        $m! {
            fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int;
            fn socketpair(domain: c_int, ty: c_int, protocol: c_int, sv: *mut c_int) -> c_int;
            fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
            fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
            fn listen(fd: c_int, backlog: c_int) -> c_int;
            fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
            fn accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int;
            fn shutdown(fd: c_int, how: c_int) -> c_int;
            fn getsockopt(fd: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int;
            fn setsockopt(fd: c_int, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int;
            fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
            fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
            fn send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t;
            fn sendto(fd: c_int, buf: *const c_void, n: size_t, flags: c_int, addr: *const sockaddr, len: socklen_t) -> ssize_t;
            fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t;
            fn recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t;
            fn recvfrom(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> ssize_t;
            fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t;
            fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t;
            fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t;
            fn readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t;
            fn writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t;
            fn close(fd: c_int) -> c_int;
            fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int;
            fn closefrom(low: c_int) -> ();
            fn dup(fd: c_int) -> c_int;
            fn dup2(old: c_int, new: c_int) -> c_int;
            fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int;
            fn fcntl(fd: c_int, cmd: c_int, arg: usize) -> c_int, variadic usize;
            fn fcntl64(fd: c_int, cmd: c_int, arg: usize) -> c_int, variadic usize;
            fn ioctl(fd: c_int, req: c_ulong, arg: usize) -> c_int, variadic usize;
            fn poll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int;
            fn ppoll(fds: *mut pollfd, n: nfds_t, ts: *const timespec, mask: *const sigset_t) -> c_int;
            fn select(n: c_int, r: *mut fd_set, w: *mut fd_set, e: *mut fd_set, tv: *mut timeval) -> c_int;
            fn pselect(n: c_int, r: *mut fd_set, w: *mut fd_set, e: *mut fd_set, ts: *const timespec, mask: *const sigset_t) -> c_int;
            fn epoll_create(size: c_int) -> c_int;
            fn epoll_create1(flags: c_int) -> c_int;
            fn epoll_ctl(epfd: c_int, op: c_int, fd: c_int, ev: *mut epoll_event) -> c_int;
            fn epoll_wait(epfd: c_int, ev: *mut epoll_event, max: c_int, timeout: c_int) -> c_int;
            fn epoll_pwait(epfd: c_int, ev: *mut epoll_event, max: c_int, timeout: c_int, mask: *const sigset_t) -> c_int;
            fn epoll_pwait2(epfd: c_int, ev: *mut epoll_event, max: c_int, ts: *const timespec, mask: *const sigset_t) -> c_int;
            fn sendfile(out_fd: c_int, in_fd: c_int, off: *mut off_t, n: size_t) -> ssize_t;
            fn sendfile64(out_fd: c_int, in_fd: c_int, off: *mut off64_t, n: size_t) -> ssize_t;
            fn fork() -> pid_t;
            fn execve(path: *const libc::c_char, argv: *const *const libc::c_char, envp: *const *const libc::c_char) -> c_int;
            fn execv(path: *const libc::c_char, argv: *const *const libc::c_char) -> c_int;
            fn execvp(file: *const libc::c_char, argv: *const *const libc::c_char) -> c_int;
            fn execvpe(file: *const libc::c_char, argv: *const *const libc::c_char, envp: *const *const libc::c_char) -> c_int;
            fn fexecve(fd: c_int, argv: *const *const libc::c_char, envp: *const *const libc::c_char) -> c_int;
            fn fclose(stream: *mut libc::FILE) -> c_int;
            fn fdopen(fd: c_int, mode: *const libc::c_char) -> *mut libc::FILE;
            fn vdprintf(fd: c_int, fmt: *const libc::c_char, ap: *mut c_void) -> c_int;
            fn sendmmsg(fd: c_int, msgs: *mut libc::mmsghdr, vlen: c_uint, flags: c_int) -> c_int;
            fn recvmmsg(fd: c_int, msgs: *mut libc::mmsghdr, vlen: c_uint, flags: c_int, timeout: *mut timespec) -> c_int;
            fn preadv2(fd: c_int, iov: *const iovec, cnt: c_int, off: off_t, flags: c_int) -> ssize_t;
            fn pwritev2(fd: c_int, iov: *const iovec, cnt: c_int, off: off_t, flags: c_int) -> ssize_t;
            fn preadv64v2(fd: c_int, iov: *const iovec, cnt: c_int, off: off64_t, flags: c_int) -> ssize_t;
            fn pwritev64v2(fd: c_int, iov: *const iovec, cnt: c_int, off: off64_t, flags: c_int) -> ssize_t;
            fn splice(fd_in: c_int, off_in: *mut off64_t, fd_out: c_int, off_out: *mut off64_t, len: size_t, flags: c_uint) -> ssize_t;
            fn __read_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t) -> ssize_t;
            fn __recv_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t, flags: c_int) -> ssize_t;
            fn __recvfrom_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t, flags: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> ssize_t;
            fn __poll_chk(fds: *mut pollfd, n: nfds_t, timeout: c_int, fdslen: size_t) -> c_int;
            fn setuid(uid: libc::uid_t) -> c_int;
            fn setgid(gid: libc::gid_t) -> c_int;
            fn seteuid(uid: libc::uid_t) -> c_int;
            fn setegid(gid: libc::gid_t) -> c_int;
            fn setreuid(r: libc::uid_t, e: libc::uid_t) -> c_int;
            fn setregid(r: libc::gid_t, e: libc::gid_t) -> c_int;
            fn setresuid(r: libc::uid_t, e: libc::uid_t, s: libc::uid_t) -> c_int;
            fn setresgid(r: libc::gid_t, e: libc::gid_t, s: libc::gid_t) -> c_int;
            fn setgroups(n: size_t, list: *const libc::gid_t) -> c_int;
            fn initgroups(user: *const libc::c_char, group: libc::gid_t) -> c_int;
            fn capset(hdr: *mut c_void, data: *mut c_void) -> c_int;
        }
    };
}

with_hooked_functions!(real_functions);
