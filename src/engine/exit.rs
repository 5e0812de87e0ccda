//! At process exit (`exit`, return from `main`, `_exit`): listeners other processes share are
//! handed on, and every stream delivers what it holds, FIN included, bounded by the linger
//! time — on the exiting thread, or for `_exit` on the helper thread.

use super::{active, existing, ipc, listener, lock, Engine, Listener, Stream};
use std::sync::atomic::Ordering::*;
use std::sync::Arc;
use std::time::Duration;

/// At process exit (`exit`, return from `main`, `_exit`): give every stream a graceful close
/// and wait — bounded by the linger time — until the bytes it holds and its FIN have reached
/// the peer. The kernel keeps delivering a TCP socket's queued bytes after its process is
/// gone; ours live in this process's memory, so the process waits for them instead.
pub fn drain_at_exit() {
    if !has_exit_work() || crate::sys::raw::in_vfork_child() {
        return; // a vfork child's exit must not touch its parent's streams
    }
    // Never made here: a process without an engine of its own has nothing to drain (a fork
    // child that only relayed its parent's streams would pay a whole engine to exit).
    let Some(e) = existing() else { return };
    let Some(_g) = crate::guard::enter() else {
        return;
    }; // inside the shim (a signal handler?)
    e.hand_listeners_on(false);
    drain_streams(e, false);
}

/// Whether this process has streams to drain or listeners to hand on at exit (no lock).
fn has_exit_work() -> bool {
    active() || listener::OWNED.load(Relaxed) != 0
}

/// `_exit`'s drain, async-signal-safe (`_exit` may be called from a signal handler): this
/// thread only sets a flag, rings the helper thread, which drains as [`drain_at_exit`]
/// does, and waits for its answer, bounded by the linger time. No lock, no allocation.
pub fn drain_at_exit_from_any_context() {
    if !has_exit_work() || crate::sys::raw::in_vfork_child() {
        return;
    }
    // This process's own (a fork child's copy is its parent's); `existing` is two atomic
    // loads, nothing that could block or allocate.
    let Some(e) = existing() else {
        return;
    };
    // No helper (so no stream), or this thread is inside the shim — the helper could wait
    // for a lock it holds: nothing to drain that can be drained.
    if !e.helper.is_completed() || crate::guard::active() {
        return;
    }
    e.exit_asked.store(true, Release);
    e.wake();
    let ms = (e.linger().as_millis() + 200) as libc::c_int;
    // The raw system call: async-signal-safe. A signal does not cut the wait short.
    crate::sys::poll::poll_one_raw_full(e.exit_done_fd, libc::POLLIN, ms);
}

/// How long an exiting owner waits for the first, or next, of its queued connections to be
/// accepted through it.
const HAND_ON_IDLE: Duration = Duration::from_secs(2);

impl Engine {
    /// At exit: listeners other processes use stop taking connections in, and the ones
    /// already queued wait — bounded by the linger time — to be accepted through this
    /// process (a kernel listener's queue outlives the process that made it; ours lives in
    /// its memory). `on_helper`: the helper thread waits, so it answers requests itself.
    fn hand_listeners_on(&'static self, on_helper: bool) {
        let shared: Vec<Arc<Listener>> = lock(&self.listeners)
            .values()
            .filter(|l| l.shared())
            .cloned()
            .collect();
        if shared.is_empty() {
            return;
        }
        shared.iter().for_each(|l| l.stop_feeding(self));
        let start = std::time::Instant::now();
        // A listener the program sent away just before exiting (a reload: the new process
        // gets it with SCM_RIGHTS) is the receiver's only once it has asked for its copy of
        // the kernel listener, which dies with this process.
        while shared.iter().any(|l| l.awaits_description()) && start.elapsed() < HAND_ON_IDLE {
            if on_helper {
                self.serve_requests_while_busy();
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let queued = || shared.iter().map(|l| l.queued()).sum::<usize>();
        let (mut left, mut moved_at) = (queued(), start);
        // Up to the linger time, and only while the queue is being taken (the others may be
        // exiting too: a server shutting down).
        while left > 0 && start.elapsed() < self.linger() && moved_at.elapsed() < HAND_ON_IDLE {
            if on_helper {
                self.serve_requests_while_busy();
            }
            std::thread::sleep(Duration::from_millis(1));
            let now = queued();
            if now < left {
                moved_at = std::time::Instant::now();
            }
            left = now;
        }
        log::info!(
            "exit: {} listener(s) handed on to the processes that share them ({left} connection(s) left unaccepted)",
            shared.len()
        );
    }

    /// Helper: `_exit` may have asked for the exit drain; answers once it is done.
    pub(super) fn exit_drain_if_asked(&'static self) {
        if self.exit_asked.swap(false, AcqRel) {
            self.hand_listeners_on(true);
            drain_streams(self, true);
            crate::sys::raw::eventfd_add(self.exit_done_fd);
        }
    }
}

/// Delivers what every stream of `e` holds, FIN included, bounded by the linger time (call
/// inside the reentrancy guard). `on_helper`: the helper thread drains, so it answers other
/// processes' requests here itself.
fn drain_streams(e: &'static Engine, on_helper: bool) {
    give_back_taken(e, on_helper, &e.all_streams());
    let streams: Vec<Arc<Stream>> = e.all_streams();
    let deadline = std::time::Instant::now() + e.linger();
    // A stream the program let go of while another process holds its A (passed with
    // SCM_RIGHTS, or a fork child's that it has yet to use) is that process's to use: it
    // gets the linger to take the stream over before this engine, and the QP, are gone.
    // One the program still held at exit is not waited for (a child that inherited it and
    // never uses it would hold the exit up for nothing).
    let passed = |s: &Arc<Stream>| s.life().held_elsewhere() && s.bell().peer_holds();
    while streams.iter().any(passed) && std::time::Instant::now() < deadline {
        if on_helper {
            e.serve_requests_while_busy();
        }
        e.progress_devices(false);
        std::thread::sleep(Duration::from_millis(1));
    }
    // Relayed streams first take in what their holders already wrote (a fork child that has
    // just exited may have left its last bytes in the relay), as far as the linger allows.
    while streams.iter().any(|s| s.relay_pending()) && std::time::Instant::now() < deadline {
        e.progress_devices(false);
        streams.iter().for_each(|s| s.on_hold_event());
        std::thread::sleep(Duration::from_micros(200));
    }
    for s in streams.iter().filter(|s| !s.life().released()) {
        s.close_for_exit();
    }
    e.wait_for(&streams, deadline, "exit", Stream::flushed);
}

/// Streams this process took over from another (a fork child's use of its parent's
/// connection) go back there if that process's program still holds them: a TCP connection
/// outlives any one of the processes that hold it, and a parent that waits for its child
/// and then reads on would otherwise find the connection gone with the child. The old owner
/// takes each back (`Request::Reclaim`, exiting), asking this engine for it (Take, Export),
/// or answers that its program let go; those close here as before. On the helper (`_exit`)
/// the requests go from another thread, while this one answers them.
fn give_back_taken(e: &'static Engine, on_helper: bool, streams: &[Arc<Stream>]) {
    let back: Vec<(Arc<Stream>, ipc::Owner)> = streams
        .iter()
        .filter(|s| s.owner().is_me() && !s.life().released())
        .filter_map(|s| s.taken_from.get().map(|&from| (s.clone(), from)))
        .collect();
    if back.is_empty() {
        return;
    }
    let ask = move || {
        let _g = crate::guard::enter();
        for (s, from) in back {
            let req = ipc::Request::Reclaim {
                token: s.token,
                taker: e.owner,
                exiting: true,
            };
            // Our copy of A, or B if the program closed its fds (A went with them).
            let proof = match s.bell().app_fd() {
                a if a >= 0 => a,
                _ => s.bell().shim_fd(),
            };
            let mut at = from;
            match ipc::call(&mut at, &req, proof) {
                Ok((ipc::Reply::Done, _)) => log::info!(
                    "exit: rdma stream {} -> {}: given back to pid {}",
                    s.local,
                    s.peer,
                    from.pid
                ),
                r => log::debug!(
                    "exit: rdma stream {} -> {}: not given back to pid {} ({:?})",
                    s.local,
                    s.peer,
                    from.pid,
                    r.map(|x| x.0)
                ),
            }
        }
    };
    if !on_helper {
        ask();
        return;
    }
    match std::thread::Builder::new()
        .name("rsock-exit".into())
        .spawn(ask)
    {
        Ok(t) => {
            while !t.is_finished() {
                e.serve_requests_while_busy();
                std::thread::sleep(Duration::from_millis(1));
            }
            let _ = t.join();
        }
        Err(err) => log::warn!("exit: no thread to give streams back ({err})"),
    }
}

impl Engine {
    /// Before a credential change, after which this process can post nothing more: waits,
    /// up to the linger time, until `streams` (made by this process, still open) have sent
    /// and had acknowledged everything the program wrote to them — bytes it already handed
    /// over (a `sendall` that returned) must not be lost with the old credentials.
    pub fn send_all_before_credential_change(&self, streams: &[Arc<Stream>]) {
        let deadline = std::time::Instant::now() + self.linger();
        self.wait_for(streams, deadline, "credential change", Stream::all_sent);
    }

    /// Progresses the devices until every stream is `done` or `deadline` passes (logged).
    fn wait_for(
        &self,
        streams: &[Arc<Stream>],
        deadline: std::time::Instant,
        why: &str,
        done: impl Fn(&Stream) -> bool,
    ) {
        loop {
            self.progress_devices(false);
            let left = streams.iter().filter(|s| !done(s)).count();
            if left == 0 {
                return;
            }
            if std::time::Instant::now() >= deadline {
                log::warn!(
                    "{why}: {left} RDMA stream(s) still had unacknowledged bytes after {:?}",
                    self.linger()
                );
                return;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

pub(super) extern "C" fn drain_at_exit_c() {
    drain_at_exit();
}
