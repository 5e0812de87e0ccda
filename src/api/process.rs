//! Process events: fork (and a fork made with the raw `syscall`), exec, `_exit`, and a
//! seccomp filter being installed (`syscall`, `prctl`). Before an exec the shim hands the
//! sockets that survive it over to the new image (`inherit::before_exec`) and names them in
//! its environment.

#![allow(clippy::missing_safety_doc)] // each fn has its libc namesake's contract

use super::inherit;
use super::ownership::keep_errno;
use crate::engine;
use crate::fdtable;
use crate::guard;
use crate::init;
use crate::sys::process;
use crate::sys::raw;
use crate::sys::real;
use libc::{c_int, pid_t};

/// `_exit`/`_Exit`: bytes the shim still holds for RDMA streams are delivered first (see
/// [`engine::drain_at_exit`]; `exit` does the same through `atexit`), then the process ends.
pub unsafe fn exit_now(status: c_int) -> ! {
    engine::drain_at_exit_from_any_context();
    process::exit_group(status)
}

/// `execve` and the other exec calls a program makes: RDMA sockets that survive the exec are
/// first turned into kernel sockets the new image can use without the shim, or named to it
/// (`inherit::passed_at_exec`) in its environment.
pub unsafe fn execve(
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
) -> c_int {
    with_exec_env(envp, |e| real::execve(path, argv, e))
}

pub unsafe fn execv(path: *const libc::c_char, argv: *const *const libc::c_char) -> c_int {
    with_exec_env(process::environ(), |e| real::execve(path, argv, e))
}

pub unsafe fn execvp(file: *const libc::c_char, argv: *const *const libc::c_char) -> c_int {
    with_exec_env(process::environ(), |e| real::execvpe(file, argv, e))
}

pub unsafe fn execvpe(
    file: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
) -> c_int {
    with_exec_env(envp, |e| real::execvpe(file, argv, e))
}

pub unsafe fn fexecve(
    fd: c_int,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
) -> c_int {
    with_exec_env(envp, |e| real::fexecve(fd, argv, e))
}

/// Prepares the sockets for the exec ([`inherit::before_exec`]) and calls `exec` with
/// `envp`, plus `RSOCK_PASSED_FDS=...` when sockets are passed on (replacing any it had).
/// Those need the shim in the new image: a program that cleans its children's environment
/// (Postfix's master) gets `LD_PRELOAD` and this process's `RSOCK_*` settings put back.
/// A vfork child, or a process that never owned a socket, execs with `envp` as it is.
unsafe fn with_exec_env(
    envp: *const *const libc::c_char,
    exec: impl FnOnce(*const *const libc::c_char) -> c_int,
) -> c_int {
    if fdtable::high_water() == 0 {
        return exec(envp);
    }
    let handoff = match guard::enter() {
        Some(_g) => keep_errno(inherit::before_exec),
        None => inherit::ExecHandOff::default(),
    };
    if (handoff.passed.is_empty() && handoff.relayed.is_empty()) || envp.is_null() {
        return exec(envp);
    }
    // Passed streams need the shim in the new image; relay ends work without it (the
    // addresses are only answered where it is).
    let add_shim = !handoff.passed.is_empty();
    let mut added = Vec::new();
    if add_shim {
        let list: Vec<String> = handoff.passed.iter().map(|fd| fd.to_string()).collect();
        added.push(format!("{}={}\0", inherit::PASSED_FDS, list.join(",")));
    }
    if !handoff.relayed.is_empty() {
        added.push(format!(
            "{}={}\0",
            inherit::RELAYED_FDS,
            handoff.relayed.join(",")
        ));
    }
    let ours = [
        format!("{}=", inherit::PASSED_FDS),
        format!("{}=", inherit::RELAYED_FDS),
    ];
    let mut env: Vec<*const libc::c_char> = Vec::new();
    let mut names: Vec<Vec<u8>> = Vec::new();
    let mut preload = None;
    let mut p = envp;
    while !(*p).is_null() {
        let var = std::ffi::CStr::from_ptr(*p).to_bytes();
        let name = var.split(|&b| b == b'=').next().unwrap_or(var);
        if name == b"LD_PRELOAD" && add_shim {
            preload = Some(var[name.len()..].strip_prefix(b"=").unwrap_or(b"").to_vec());
        } else if !ours.iter().any(|o| var.starts_with(o.as_bytes())) {
            env.push(*p);
        }
        names.push(name.to_vec());
        p = p.add(1);
    }
    if add_shim {
        added.push(with_shim(preload));
        for (k, v) in std::env::vars_os() {
            let k = k.to_string_lossy();
            if k.starts_with("RSOCK_")
                && k != inherit::PASSED_FDS
                && k != inherit::RELAYED_FDS
                && !names.contains(&k.as_bytes().to_vec())
            {
                added.push(format!("{k}={}\0", v.to_string_lossy()));
            }
        }
    }
    env.extend(added.iter().map(|v| v.as_ptr().cast()));
    env.push(std::ptr::null());
    exec(env.as_ptr()) // on failure `added` and `env` are dropped here
}

/// `LD_PRELOAD=...` for an exec'd image, NUL-terminated: `had` (the value the program gave
/// it, if any) with this library added unless it is there already.
fn with_shim(had: Option<Vec<u8>>) -> String {
    let had = had.map(|v| String::from_utf8_lossy(&v).into_owned());
    let me = own_path();
    match (had, me) {
        (Some(h), Some(me)) if !h.split([':', ' ']).any(|x| x == me) && !h.is_empty() => {
            format!("LD_PRELOAD={me}:{h}\0")
        }
        (Some(h), _) if !h.is_empty() => format!("LD_PRELOAD={h}\0"),
        (_, Some(me)) => format!("LD_PRELOAD={me}\0"),
        _ => "LD_PRELOAD=\0".to_string(),
    }
}

/// The path this library was loaded from.
pub(super) fn own_path() -> Option<String> {
    crate::sys::dl::this_object()?.path
}

/// The child's state is reset by the `pthread_atfork` handler registered at start-up, which
/// also covers forks made inside libraries; this hook only has to forward.
#[inline]
pub unsafe fn fork() -> pid_t {
    // A daemon that dropped root and now forks its workers: they inherit its listeners as
    // dual ones (see `creds.rs`).
    super::creds::relisten_if_pending();
    // Connections a child gave back as it exited: the new child asks this process for them.
    super::inherit::reattach_given_back();
    real::fork()
}

/// `syscall(2)`: passed to the kernel as it is, except a fork made with it — `clone` or
/// `clone3` without `CLONE_VM`/`CLONE_THREAD` and without a new stack, or `fork` — which gets
/// the fork handlers glibc's `fork` would have run (see `init::around_raw_fork`), a
/// credential change, which gets the shim's preparations (`creds.rs`), and the fd calls of
/// `fds::by_syscall`, which keep the fd table true. The shim's own `syscall` calls come here
/// too: nothing on their path locks, allocates or resolves.
pub unsafe fn syscall(
    n: libc::c_long,
    a1: libc::c_long,
    a2: libc::c_long,
    a3: libc::c_long,
    a4: libc::c_long,
    a5: libc::c_long,
    a6: libc::c_long,
) -> libc::c_long {
    let args = [a1, a2, a3, a4, a5, a6];
    if installs_seccomp(n, a1) {
        init::seal("syscall(seccomp)");
    }
    if super::creds::changes_credentials(n, a1, a2) {
        super::creds::before_change();
    }
    if let Some(r) = super::fds::by_syscall(n, args, || raw::syscall6(n, args)) {
        return r;
    }
    if raw_fork(n, a1, a2) {
        init::around_raw_fork(|| raw::syscall6(n, args))
    } else {
        raw::syscall6(n, args)
    }
}

/// Whether `syscall(n, a1, ...)` installs a seccomp filter (or strict mode).
fn installs_seccomp(n: libc::c_long, a1: libc::c_long) -> bool {
    let mode = a1 as libc::c_uint;
    match n {
        libc::SYS_seccomp => {
            mode == libc::SECCOMP_SET_MODE_FILTER || mode == libc::SECCOMP_SET_MODE_STRICT
        }
        libc::SYS_prctl => a1 == libc::PR_SET_SECCOMP as libc::c_long,
        _ => false,
    }
}

/// `prctl(2)`: passed to the kernel, after [`init::seal`] when it installs a seccomp filter,
/// and after the shim's preparations when it installs new credentials (`creds.rs`).
pub unsafe fn prctl(
    option: c_int,
    a2: libc::c_ulong,
    a3: libc::c_ulong,
    a4: libc::c_ulong,
    a5: libc::c_ulong,
) -> c_int {
    if option == libc::PR_SET_SECCOMP {
        init::seal("prctl(PR_SET_SECCOMP)");
    }
    if super::creds::prctl_changes_credentials(option, a2) {
        super::creds::before_change();
    }
    let args = [
        option as libc::c_long,
        a2 as _,
        a3 as _,
        a4 as _,
        a5 as _,
        0,
    ];
    raw::syscall6(libc::SYS_prctl, args) as c_int
}

/// Whether `syscall(n, a1, a2, ...)` makes a new process that does not share the caller's
/// memory and goes on on the caller's stack (a fork).
unsafe fn raw_fork(n: libc::c_long, a1: libc::c_long, a2: libc::c_long) -> bool {
    let no_share = |flags: u64| flags & (libc::CLONE_VM | libc::CLONE_THREAD) as u64 == 0;
    match n {
        libc::SYS_fork => true,
        libc::SYS_clone => no_share(a1 as u64) && a2 == 0,
        libc::SYS_clone3 => {
            // struct clone_args: flags at 0, stack at 40; the size (a2) covers both.
            let args = a1 as *const u64;
            !args.is_null() && a2 >= 48 && no_share(*args) && *args.add(5) == 0
        }
        _ => false,
    }
}
