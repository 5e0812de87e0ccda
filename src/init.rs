//! Lazy start-up of the shim's machinery, on the first socket it may own.
//!
//! Hooks can run before any constructor (another library's constructor may call `connect`),
//! so nothing here relies on one: config, log and fork handlers are set up on first use, by
//! the first thread that needs them, inside the reentrancy guard.

use crate::config;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;

static INIT: Once = Once::new();
static ENABLED: AtomicBool = AtomicBool::new(false);
/// The fork handlers are registered: a fork made without glibc's `fork` (a raw `clone`
/// through `syscall(2)`) must run them by hand.
static FORK_HANDLERS: AtomicBool = AtomicBool::new(false);

/// The process installed a seccomp filter ([`seal`]).
static SEALED: AtomicBool = AtomicBool::new(false);

/// Whether the shim takes part (RSOCK_ENABLE, and not [`sealed`]); initialises everything
/// on first call. Call only inside the reentrancy guard.
pub fn enabled() -> bool {
    if sealed() {
        return false; // start-up reads files: the filter may forbid that
    }
    INIT.call_once(start);
    ENABLED.load(Ordering::Acquire)
}

/// Whether the process has installed a seccomp filter.
#[inline]
pub fn sealed() -> bool {
    SEALED.load(Ordering::Relaxed)
}

/// The program is about to install a seccomp filter (`how`). A filter allows the calls the
/// program makes, not the shim's: vsftpd's kills the process on any other, and the shim's
/// (opening a stats or log file, an rdma_cm device, a relay socket, `gettid` for a log line)
/// are not in it. So from here the shim stands aside: sockets made from now on are not
/// tracked, received fds are not looked at, no stats region is made, no log line is written.
/// What it tracks already stays as it is (a relayed fd needs nothing from it; an RDMA stream
/// this process owns needs its helper thread, which a filter without `TSYNC` does not cover).
pub fn seal(how: &str) {
    // A vfork child shares its parent's memory: sealing there would seal the parent, which
    // installs no filter. The child is about to exec (a filter it installs goes with it).
    if crate::sys::raw::in_vfork_child() || SEALED.swap(true, Ordering::AcqRel) {
        return;
    }
    if INIT.is_completed() {
        let _g = crate::guard::enter();
        log::info!(
            "{how}: a seccomp filter is being installed: from now on new sockets are the \
             kernel's, with no stats and no log (docs/LIMITATIONS.md)"
        );
    }
    crate::stats::seal();
    log::set_max_level(log::LevelFilter::Off);
}

fn start() {
    if let Some((first, me)) = another_copy_first() {
        // Only the log settings: the first copy reads (and reports on) the rest. None from
        // the environment of a setuid program (see `config::loaded`).
        let secure = crate::sys::raw::secure_execution();
        let env =
            std::env::vars_os().filter(|(k, _)| !secure && k.as_bytes().starts_with(b"RSOCK_"));
        let (cfg, _) = config::Config::parse(env);
        if let Some(path) = &cfg.log_path {
            crate::logger::init(path, cfg.log_level);
        }
        log::warn!(
            "rsock {} in pid {}: librsock.so is loaded twice; the copy loaded first ({first}) \
             serves this process and this copy ({me}) stays inert: its hooks pass every call to libc",
            env!("CARGO_PKG_VERSION"),
            crate::sys::raw::getpid(),
        );
        return; // ENABLED stays false; no fork handlers
    }
    let (cfg, warnings) = config::loaded();
    if let Some(path) = &cfg.log_path {
        crate::logger::init(path, cfg.log_level);
    }
    for w in warnings {
        log::warn!("config: {w}");
    }
    log::info!(
        "rsock {} starting in pid {}: enable={} stats={} ({})",
        env!("CARGO_PKG_VERSION"),
        crate::sys::raw::getpid(),
        cfg.enable,
        cfg.stats,
        cfg.stats_dir.display()
    );
    crate::sys::raw::refresh_pid(); // cached before any vfork child could fill it
    crate::sys::process::at_fork(before_fork, after_fork_child); // they run around every fork()
    FORK_HANDLERS.store(true, Ordering::Release);
    ENABLED.store(cfg.enable, Ordering::Release);
}

/// When librsock.so is loaded twice in one process (`LD_PRELOAD=/a/librsock.so:/b/librsock.so`,
/// or a copy in `LD_PRELOAD` plus `rsock run`'s), the paths of the copy loaded first and of
/// this one, if this is not the first. The program's calls are bound to the first copy's
/// hooks, whose "real" functions (`dlsym(RTLD_NEXT)`) are then the second copy's hooks: the
/// second must pass them to libc untouched, or every socket would be tracked and counted
/// twice. The marker both copies can see is the loader's own: the object that defines the
/// exported instance symbol first. With the shim loaded once (or this code outside it, as in
/// the rsock CLI) there is no other copy.
fn another_copy_first() -> Option<(String, String)> {
    use crate::sys::dl;
    let first = dl::first_definer(dl::INSTANCE_SYMBOL)?;
    let me = dl::this_object()?;
    if first.base == me.base {
        return None;
    }
    let name = |o: dl::Object| o.path.unwrap_or_else(|| format!("{:#x}", o.base));
    Some((name(first), name(me)))
}

/// Runs the fork handlers around `fork`, a raw fork (`clone` without `CLONE_VM`, made with
/// `syscall(2)` as vsftpd does: glibc runs no `pthread_atfork` handler for it), if they are
/// registered: the child then knows it is one, instead of taking itself for its parent.
pub fn around_raw_fork(fork: impl FnOnce() -> libc::c_long) -> libc::c_long {
    if !FORK_HANDLERS.load(Ordering::Acquire) {
        return fork();
    }
    before_fork();
    let r = fork();
    if r == 0 {
        after_fork_child();
    }
    r
}

/// In the parent, before a fork: the child may poll the streams it inherits, so their
/// doorbells must show their state from now on.
extern "C" fn before_fork() {
    crate::engine::before_fork();
}

/// In a forked child: the child gets its own stats region (the parent's mapping is shared),
/// and the locks of the sockets it inherited are made usable (a thread of the parent may
/// have held one at the fork). Everything the engine holds stays the parent's: the child
/// never touches it (docs/DESIGN.md, "Processes").
extern "C" fn after_fork_child() {
    crate::sys::raw::refresh_pid();
    crate::fdtable::after_fork_child();
    crate::stats::after_fork_child(crate::fdtable::high_water() > 0);
    crate::engine::after_fork_child();
}
