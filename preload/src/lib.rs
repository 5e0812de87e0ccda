//! librsock.so: the exported libc symbols, and nothing else.
//!
//! Each hook forwards to its namesake in `rsock_core::api`, which holds all the logic. The
//! variadic `fcntl`/`fcntl64`/`ioctl` take their optional argument as one machine word: on
//! x86_64 SysV it arrives in the same register whether the caller passed an int or a pointer
//! (C-variadic definitions are not stable Rust).

#![allow(clippy::missing_safety_doc)]

use libc::{
    c_int, c_long, c_uint, c_ulong, c_void, fd_set, iovec, msghdr, nfds_t, off64_t, off_t, pid_t,
};
use libc::{
    epoll_event, pollfd, sigset_t, size_t, sockaddr, socklen_t, ssize_t, timespec, timeval,
};
use rsock_core::api;

/// Resolves every real libc function before `main`, so that no hook entered later (from a
/// signal handler, say) has to call `dlsym`. Hooks that run earlier resolve on their own.
/// Then registers the streams an exec passed to this image (`RSOCK_PASSED_FDS`): before
/// `main`, since a plain `read` of an fd the shim does not know would see the bare doorbell.
extern "C" fn resolve_real_functions() {
    rsock_core::sys::real::resolve_all();
    rsock_core::sys::real::dprintf_fn();
    api::passed_at_exec();
}

#[used]
#[link_section = ".init_array"]
static RESOLVE_AT_LOAD: extern "C" fn() = resolve_real_functions;

/// The marker that makes a second copy of librsock.so in one process inert
/// (`rsock_core::init`): the loader binds this name, like every hook, to the copy it loaded
/// first, and each copy compares that copy with itself. Its value is never read.
#[no_mangle]
#[used]
pub static rsock_shim_instance: u8 = 0;

macro_rules! hooks {
    ($( fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty $(, variadic $var:ty)?; )*) => {
        $(
            #[no_mangle]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                api::$name($($arg),*)
            }
        )*
    };
}

rsock_core::with_hooked_functions!(hooks);

/// `_exit` (and `_Exit`, its alias): RDMA streams' queued bytes are delivered before the
/// process ends, as the kernel would deliver a TCP socket's.
#[no_mangle]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    api::exit_now(status)
}

#[no_mangle]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    api::exit_now(status)
}

/// `syscall(2)`, variadic in C: the six words it may take, as the x86_64 SysV convention
/// passes them. Never forwarded to libc's (the kernel is called directly), so it has no
/// real function to resolve.
#[no_mangle]
pub unsafe extern "C" fn syscall(
    n: c_long,
    a1: c_long,
    a2: c_long,
    a3: c_long,
    a4: c_long,
    a5: c_long,
    a6: c_long,
) -> c_long {
    api::syscall(n, a1, a2, a3, a4, a5, a6)
}

/// `prctl(2)`, variadic in C: the four words after the option. Passed to the kernel
/// directly, like [`syscall`]; the shim watches for a seccomp filter being installed.
#[no_mangle]
pub unsafe extern "C" fn prctl(
    option: c_int,
    a2: c_ulong,
    a3: c_ulong,
    a4: c_ulong,
    a5: c_ulong,
) -> c_int {
    api::prctl(option, a2, a3, a4, a5)
}

/// `dprintf`, variadic in C, which libc formats and writes inside itself, where no hooked
/// `write` sees it: `api::dprintf_target` first readies the fd (an RDMA stream's fds then
/// carry its bytes), then the call goes on to libc's `dprintf` exactly as the program made
/// it. The trampoline keeps every argument register across the preparation — the six
/// integer ones, %al (how many vector registers a variadic call uses) and %xmm0-7 — and the
/// stack as it was, so arguments passed on the stack stay where libc's expects them.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dprintf() {
    core::arch::naked_asm!(
        // Entry: %rsp = 8 mod 16. Seven pushes and 128 bytes leave it 0 mod 16 for the call.
        "push rdi",
        "push rsi",
        "push rdx",
        "push rcx",
        "push r8",
        "push r9",
        "push rax",
        "sub rsp, 128",
        "movdqu [rsp], xmm0",
        "movdqu [rsp + 16], xmm1",
        "movdqu [rsp + 32], xmm2",
        "movdqu [rsp + 48], xmm3",
        "movdqu [rsp + 64], xmm4",
        "movdqu [rsp + 80], xmm5",
        "movdqu [rsp + 96], xmm6",
        "movdqu [rsp + 112], xmm7",
        "call {target}", // %edi: the fd, untouched
        "mov r11, rax",
        "movdqu xmm0, [rsp]",
        "movdqu xmm1, [rsp + 16]",
        "movdqu xmm2, [rsp + 32]",
        "movdqu xmm3, [rsp + 48]",
        "movdqu xmm4, [rsp + 64]",
        "movdqu xmm5, [rsp + 80]",
        "movdqu xmm6, [rsp + 96]",
        "movdqu xmm7, [rsp + 112]",
        "add rsp, 128",
        "pop rax",
        "pop r9",
        "pop r8",
        "pop rcx",
        "pop rdx",
        "pop rsi",
        "pop rdi",
        "jmp r11",
        target = sym api::dprintf_target,
    )
}
