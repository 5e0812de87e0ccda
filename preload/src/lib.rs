//! librsock.so: the exported libc symbols, and nothing else.
//!
//! Each hook forwards to its namesake in `rsock_core::api`, which holds all the logic. The
//! variadic `fcntl`/`fcntl64`/`ioctl` take their optional argument as one machine word: on
//! x86_64 SysV it arrives in the same register whether the caller passed an int or a pointer
//! (C-variadic definitions are not stable Rust).

#![allow(clippy::missing_safety_doc)]

use libc::{c_int, c_uint, c_ulong, c_void, fd_set, iovec, msghdr, nfds_t, off64_t, off_t, pid_t};
use libc::{epoll_event, pollfd, sigset_t, size_t, sockaddr, socklen_t, ssize_t, timespec, timeval};
use rsock_core::api;

/// Resolves every real libc function before `main`, so that no hook entered later (from a
/// signal handler, say) has to call `dlsym`. Hooks that run earlier resolve on their own.
extern "C" fn resolve_real_functions() {
    rsock_core::sys::real::resolve_all();
}

#[used]
#[link_section = ".init_array"]
static RESOLVE_AT_LOAD: extern "C" fn() = resolve_real_functions;

macro_rules! hooks {
    ($( fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty; )*) => {
        $(
            #[no_mangle]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                api::$name($($arg),*)
            }
        )*
    };
}

hooks! {
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
    fn dup(fd: c_int) -> c_int;
    fn dup2(old: c_int, new: c_int) -> c_int;
    fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int;
    fn fcntl(fd: c_int, cmd: c_int, arg: usize) -> c_int;
    fn fcntl64(fd: c_int, cmd: c_int, arg: usize) -> c_int;
    fn ioctl(fd: c_int, req: c_ulong, arg: usize) -> c_int;
    fn poll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int;
    fn ppoll(fds: *mut pollfd, n: nfds_t, ts: *const timespec, mask: *const sigset_t) -> c_int;
    fn select(n: c_int, r: *mut fd_set, w: *mut fd_set, e: *mut fd_set, tv: *mut timeval) -> c_int;
    fn pselect(n: c_int, r: *mut fd_set, w: *mut fd_set, e: *mut fd_set, ts: *const timespec, mask: *const sigset_t) -> c_int;
    fn epoll_create(size: c_int) -> c_int;
    fn epoll_create1(flags: c_int) -> c_int;
    fn epoll_ctl(epfd: c_int, op: c_int, fd: c_int, ev: *mut epoll_event) -> c_int;
    fn epoll_wait(epfd: c_int, ev: *mut epoll_event, max: c_int, timeout: c_int) -> c_int;
    fn epoll_pwait(epfd: c_int, ev: *mut epoll_event, max: c_int, timeout: c_int, mask: *const sigset_t) -> c_int;
    fn sendfile(out_fd: c_int, in_fd: c_int, off: *mut off_t, n: size_t) -> ssize_t;
    fn sendfile64(out_fd: c_int, in_fd: c_int, off: *mut off64_t, n: size_t) -> ssize_t;
    fn fork() -> pid_t;
    fn fclose(stream: *mut libc::FILE) -> c_int;
    fn splice(fd_in: c_int, off_in: *mut off64_t, fd_out: c_int, off_out: *mut off64_t, len: size_t, flags: c_uint) -> ssize_t;
    fn __read_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t) -> ssize_t;
    fn __recv_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t, flags: c_int) -> ssize_t;
    fn __recvfrom_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t, flags: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> ssize_t;
    fn __poll_chk(fds: *mut pollfd, n: nfds_t, timeout: c_int, fdslen: size_t) -> c_int;
}
