//! Lazy start-up of the shim's machinery, on the first socket it may own.
//!
//! Hooks can run before any constructor (another library's constructor may call `connect`),
//! so nothing here relies on one: config, log and fork handlers are set up on first use, by
//! the first thread that needs them, inside the reentrancy guard.

use crate::config;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Once, OnceLock};

static INIT: Once = Once::new();
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether the shim takes part (RSOCK_ENABLE); initialises everything on first call.
/// Call only inside the reentrancy guard.
pub fn enabled() -> bool {
    INIT.call_once(start);
    ENABLED.load(Ordering::Acquire)
}

fn start() {
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
                                    // SAFETY: registering plain extern "C" fns; they run around every fork().
    unsafe { libc::pthread_atfork(Some(before_fork), None, Some(after_fork_child)) };
    ENABLED.store(cfg.enable, Ordering::Release);
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
    crate::stats::after_fork_child(); // after the fd table: it asks whether sockets came along
    crate::engine::after_fork_child();
}

/// Whether this host has a usable RDMA device: one listed in sysfs and the rdma_cm device
/// node to reach it (a container or namespace may see the first without the second). Read
/// once, without loading libibverbs.
pub fn rdma_device_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| {
        let listed =
            std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some());
        let present = listed && std::path::Path::new("/dev/infiniband/rdma_cm").exists();
        log::info!("RDMA device present: {present}");
        present
    })
}
