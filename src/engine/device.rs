//! The RDMA devices in use: polling each one's shared CQ and handing the completions to their
//! streams, arming it, the program threads sleeping on its completion channel, whether the
//! helper listens for its completion events (the streams' demand), and its asynchronous events.

use super::tags::{TAG_ASYNC, TAG_DEV};
use super::{lock, Engine, Stream};
use crate::rdma::{self, Device, Wc};
use libc::c_int;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, MutexGuard};

/// A device in use, with the lock that serialises polling its shared CQ (so each stream
/// sees its completions in order).
pub struct Dev {
    pub(crate) dev: Arc<Device>,
    /// Held while polling; it holds the completions buffer (not zeroed on every poll: a
    /// busy waiter polls in a tight loop).
    pub(super) poll: Mutex<Box<[Wc; POLL_BATCH]>>,
    /// Streams on this device that need their completions handled while no program thread
    /// is in a call on them (see [`Dev::demand_up`]).
    demand: AtomicUsize,
    /// Program threads sleeping on this device's completion channel (a blocked call or a
    /// hooked poll/epoll wait), from before they arm the CQ until before they take an event.
    sleepers: AtomicUsize,
    /// Whether the helper's epoll reports this device's completion events; changed under
    /// `listen_lock` only.
    listening: AtomicBool,
    listen_lock: Mutex<()>,
    /// Links on this device (engine/link.rs): an OPEN may come on one at any time, so
    /// someone must hear its completions — a program thread waiting in the shim, or else
    /// the helper (see [`Dev::link_up`]).
    links: AtomicUsize,
    /// Polls of this CQ by program threads, counted while there are links (a count, not a
    /// clock: reading the time is a syscall where the clock has no vDSO path, such as the
    /// test bed's guests, and a spinning waiter polls in a tight loop) ...
    app_polls: AtomicU64,
    /// ... and the count the helper saw when it last looked: unchanged since, the program
    /// has been quiet for that long.
    helper_saw: AtomicU64,
    /// The helper stopped looking at this device because program threads sleep on its
    /// channel (they hear every completion); the last of them to leave wakes it.
    helper_dozes: AtomicBool,
    /// The helper's epoll fd and this device's tag there.
    epfd: c_int,
    tag: u64,
    wake_fd: c_int,
}

/// Who handles a completion. A program thread blocked in a call on a stream, or in a hooked
/// poll/epoll wait, sleeps on the completion channel itself and handles what it finds; the
/// helper thread is needed only for streams whose completions must be seen while no such
/// wait is in progress: a doorbell another process polls, a relay, or output that waits for
/// the peer's credits. While no stream on a device needs it, the helper's epoll does not
/// report that device's completion events at all, so a waiter's wake-up does not also wake
/// the helper (a context switch and four syscalls per message, measured).
impl Dev {
    /// A stream needs the helper: make sure the helper hears this device's completions.
    /// Takes only `listen_lock` and polls nothing (the helper polls once woken), so a
    /// stream may call it under its own lock.
    pub(crate) fn demand_up(&self) {
        // While there is demand, whoever consumes a completion event re-arms the CQ
        // (`Engine::on_cq_event`); the first demand arms it here.
        if self.demand.fetch_add(1, SeqCst) > 0 && self.listening.load(SeqCst) {
            return;
        }
        self.listen();
    }

    /// The helper listens to this device from now on (armed; woken once to poll what
    /// landed before the arm).
    fn listen(&self) {
        let _g = lock(&self.listen_lock);
        if !self.listening.load(SeqCst) {
            self.set_listening(true);
        }
        if let Err(e) = self.dev.arm() {
            log::error!("arming the CQ failed: {e}");
        }
        // Completions that landed before the arm raise no event: the helper polls once.
        crate::sys::raw::eventfd_add(self.wake_fd);
    }

    /// A stream no longer needs the helper (the helper stops listening lazily).
    pub(crate) fn demand_down(&self) {
        self.demand.fetch_sub(1, SeqCst);
    }

    /// A link is up on this device. Its completions are heard by the program's own waits
    /// while it waits in the shim (a blocked call or a hooked poll/epoll sleeps on the
    /// channel; a spinning one polls), and by the helper only while it does not: the helper
    /// would otherwise wake for every message the program handles itself (a 64 B round trip
    /// on a link took 5x its time so, measured 2026-11-28). The helper stops listening at an
    /// event it finds the program busy, and listens again once the program has not polled
    /// between two of the helper's looks, [`LINK_QUIET`] apart at most
    /// ([`Dev::look_at_links`]): an OPEN to an idle process waits about that long at most.
    pub(crate) fn link_up(&self) {
        self.links.fetch_add(1, SeqCst);
        self.listen(); // from here on as the program's waits allow
    }

    /// A link on this device is gone.
    pub(crate) fn link_down(&self) {
        self.links.fetch_sub(1, SeqCst);
    }

    /// A thread polls this device: stamped if it is a program thread and there are links
    /// (a poll that finds the CQ busy counts too: whoever holds it hands the completions on).
    fn program_polls(&self) {
        if self.links.load(Relaxed) > 0 && !ON_HELPER.with(|h| h.get()) {
            self.app_polls.fetch_add(1, Relaxed);
        }
    }

    /// Helper only: whether a program thread handles this device's completions now: asleep
    /// on its channel, or polled it since the helper last asked.
    fn program_hears(&self) -> bool {
        let polls = self.app_polls.load(Relaxed);
        let polled = self.helper_saw.swap(polls, Relaxed) != polls;
        self.sleepers.load(SeqCst) > 0 || polled
    }

    /// Whether the helper does not listen to a device with links.
    fn deaf_to_links(&self) -> bool {
        self.links.load(SeqCst) > 0 && !self.listening.load(SeqCst)
    }

    /// Helper, at the end of each pass: a device with links whose program went quiet is
    /// listened to again. Returns whether the helper must look again within
    /// [`LINK_QUIET`]: the program polls this device (it may stop at any moment). Program
    /// threads asleep on the channel, and none polling, need no looks: the helper dozes
    /// until the last of them leaves (`sleeping(false)` wakes it). It looked every 2 ms
    /// instead, 500 wake-ups a second for a server whose threads block in `read()` on
    /// idle link streams (1–2% of a CPU, `links.sh links_idle_cpu`).
    pub(super) fn look_at_links(&self) -> bool {
        if !self.deaf_to_links() {
            self.helper_dozes.store(false, SeqCst);
            return false;
        }
        let polls = self.app_polls.load(Relaxed);
        if self.helper_saw.swap(polls, Relaxed) != polls {
            self.helper_dozes.store(false, SeqCst);
            return true;
        }
        // Flag first, then look: a sleeper leaving either sees the flag or is seen gone
        // (both SeqCst).
        self.helper_dozes.store(true, SeqCst);
        if self.sleepers.load(SeqCst) > 0 {
            return false;
        }
        self.helper_dozes.store(false, SeqCst);
        self.listen();
        false
    }

    /// A program thread starts or stops sleeping on the completion channel. The last one
    /// to leave wakes a dozing helper (`look_at_links`).
    pub(crate) fn sleeping(&self, on: bool) {
        if on {
            self.sleepers.fetch_add(1, SeqCst);
        } else if self.sleepers.fetch_sub(1, SeqCst) == 1 && self.helper_dozes.load(SeqCst) {
            self.helper_dozes.store(false, SeqCst);
            crate::sys::raw::eventfd_add(self.wake_fd);
        }
    }

    /// Helper, woken by a completion event: whether to leave it to a program thread asleep
    /// on the channel, which handles every completion it finds (no stream needs the helper
    /// itself). The helper then stops listening: both were woken, and the helper handling
    /// it made two thread hops of one (measured in the two-guest bed: a link's ACCEPT taken
    /// by the helper, which then woke the connector). If that thread leaves without taking
    /// the event, the helper it wakes listens again (`look_at_links`).
    pub(super) fn leave_to_sleepers(&self) -> bool {
        if self.demand.load(SeqCst) > 0 || self.sleepers.load(SeqCst) == 0 {
            return false;
        }
        let _g = lock(&self.listen_lock);
        if self.demand.load(SeqCst) > 0 {
            return false;
        }
        if self.listening.load(SeqCst) {
            self.set_listening(false);
        }
        true
    }

    /// Helper, after a completion event: stops listening when no stream needs it
    /// (`demand_up` turns it back on).
    pub(super) fn stop_listening_if_idle(&self) {
        if self.demand.load(SeqCst) > 0 {
            return;
        }
        // A link's completions need someone: the helper, unless the program hears them
        // (asked once: the answer is "since the last time it was asked").
        if self.links.load(SeqCst) > 0 && !self.program_hears() {
            return;
        }
        let _g = lock(&self.listen_lock);
        // A demand_up that raced with us either made demand non-zero before this check or
        // takes the lock after us and turns listening back on.
        if self.demand.load(SeqCst) == 0 && self.listening.load(SeqCst) {
            self.set_listening(false);
        }
    }

    fn set_listening(&self, on: bool) {
        self.listening.store(on, SeqCst);
        // Off is a removal, not a MOD to no events: the kernel adds EPOLLERR|EPOLLHUP to
        // every mask, so a MOD to 0 leaves the item live and every completion event still
        // woke the helper (a context switch per message, seen in the two-host bed's trace).
        let (op, events) = if on {
            (libc::EPOLL_CTL_ADD, libc::EPOLLIN as u32)
        } else {
            (libc::EPOLL_CTL_DEL, 0)
        };
        let mut ev = libc::epoll_event {
            events,
            u64: self.tag,
        };
        // SAFETY: our epoll fd and the device's channel fd (added when the Dev was made).
        let r = unsafe { crate::sys::real::epoll_ctl(self.epfd, op, self.dev.comp_fd(), &mut ev) };
        if r != 0 {
            log::error!(
                "epoll_ctl(completion channel, {}): errno {}",
                if on { "add" } else { "remove" },
                crate::sys::raw::errno()
            );
        }
    }
}

/// Completions taken from a CQ per poll.
const POLL_BATCH: usize = 32;

/// How often the helper looks whether the program still polls a device with links it does
/// not listen to (two looks with no poll between: it listens again).
pub(super) const LINK_QUIET: std::time::Duration = std::time::Duration::from_millis(2);

thread_local! {
    /// This thread is the helper (its polls are not the program's: `Dev::link_up`).
    static ON_HELPER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Called by the helper thread as it starts.
pub(super) fn this_thread_is_the_helper() {
    ON_HELPER.with(|h| h.set(true));
}

impl Engine {
    /// The engine's entry for `dev`, watched by the helper from now on.
    pub(super) fn dev(&self, dev: &Arc<Device>) -> Result<Arc<Dev>, rdma::Error> {
        let mut devs = lock(&self.devices);
        if let Some(d) = devs.iter().find(|d| Arc::ptr_eq(&d.dev, dev)) {
            return Ok(d.clone());
        }
        let tag = TAG_DEV | devs.len() as u64;
        let d = Arc::new(Dev {
            dev: dev.clone(),
            // SAFETY: ibv_wc is plain data; all-zero is valid.
            poll: Mutex::new(Box::new(unsafe { std::mem::zeroed() })),
            demand: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            listening: AtomicBool::new(true),
            listen_lock: Mutex::new(()),
            links: AtomicUsize::new(0),
            app_polls: AtomicU64::new(0),
            helper_saw: AtomicU64::new(0),
            helper_dozes: AtomicBool::new(false),
            epfd: self.epfd,
            tag,
            wake_fd: self.wake_fd,
        });
        self.watch(dev.comp_fd(), tag)?;
        // Asynchronous events (a QP or the CQ failing, the port going down) end streams.
        match rdma::fd::set_nonblocking(dev.async_fd()) {
            Ok(()) => self.watch(dev.async_fd(), TAG_ASYNC | devs.len() as u64)?,
            Err(e) => log::warn!("device async events unwatched: {e}"),
        }
        dev.arm()?;
        devs.push(d.clone());
        Ok(d)
    }

    /// Polls `d`'s CQ once and hands each completion to its stream. Returns how many; 0 also
    /// when another thread is polling it. Never call with a stream lock held.
    pub fn progress(&self, d: &Dev) -> usize {
        d.program_polls();
        match d.poll.try_lock() {
            Ok(g) => self.poll_locked(d, g),
            Err(_) => 0,
        }
    }

    /// A snapshot of the devices in use.
    pub(super) fn devices(&self) -> Vec<Arc<Dev>> {
        lock(&self.devices).clone()
    }

    /// Polls every device's CQ once: [`progress`](Self::progress) on each (a try: never
    /// waits for a thread that is polling), or, with `wait`, [`progress_all`]
    /// (Self::progress_all) on each.
    pub(crate) fn progress_devices(&self, wait: bool) {
        for d in &self.devices() {
            if wait {
                self.progress_all(d);
            } else {
                self.progress(d);
            }
        }
    }

    /// As [`progress`](Self::progress), waiting for the poll lock (the helper must not miss
    /// completions that arrived before it re-armed the CQ).
    pub(super) fn progress_all(&self, d: &Dev) {
        while self.poll_locked(d, lock(&d.poll)) > 0 {}
    }

    fn poll_locked(&self, d: &Dev, mut wcs: MutexGuard<'_, Box<[Wc; POLL_BATCH]>>) -> usize {
        let n = match d.dev.poll(&mut wcs[..]) {
            Ok(n) => n,
            Err(e) => {
                // A CQ that cannot be polled is lost, with every QP posting to it.
                self.fail_device(d, &format!("{e}"));
                0
            }
        };
        for wc in &wcs[..n] {
            let s = lock(&self.streams_by_qp).get(&wc.qp_num()).cloned();
            match s {
                Some(s) => s.on_completion(wc),
                None => match lock(&self.early).get_mut(&wc.qp_num()) {
                    Some(kept) => kept.push(wc.copied()),
                    None => {
                        // Not under the links' lock: the link may fail and leave the list.
                        let link = lock(&self.links).by_qp(wc.qp_num());
                        match link {
                            Some(l) => l.on_completion(self, wc),
                            None => {
                                log::trace!("completion for unknown qp {} ignored", wc.qp_num())
                            }
                        }
                    }
                },
            }
        }
        n
    }

    /// Helper: reads device `i`'s asynchronous events and ends the streams they concern.
    pub(super) fn on_async_events(&self, i: usize) {
        let Some(d) = lock(&self.devices).get(i).cloned() else {
            return;
        };
        while let Some(ev) = d.dev.async_event() {
            match ev {
                rdma::AsyncEvent::QpFatal(qpn) => {
                    let s = lock(&self.streams_by_qp).get(&qpn).cloned();
                    if let Some(s) = s {
                        s.on_fatal("its queue pair failed (async event)");
                    }
                    let l = lock(&self.links).by_qp(qpn);
                    if let Some(l) = l {
                        l.fail("its queue pair failed (async event)");
                    }
                }
                rdma::AsyncEvent::DeviceFatal(t) => {
                    self.fail_device(&d, &format!("async event {t} (CQ or device failed)"));
                }
                rdma::AsyncEvent::PortDown => self.fail_device(&d, "the port went down"),
                rdma::AsyncEvent::Other(t) => log::debug!("device async event {t}"),
            }
        }
    }

    /// Ends every stream on `d` (ECONNRESET): its CQ, device or port is gone.
    fn fail_device(&self, d: &Dev, why: &str) {
        log::warn!("rdma device: {why}: its connections are reset");
        let streams: Vec<Arc<Stream>> = self
            .all_streams()
            .into_iter()
            .filter(|s| std::ptr::eq(Arc::as_ptr(&s.dev), d))
            .collect();
        for s in streams {
            s.on_fatal(why);
        }
    }

    /// A completion-channel event on `d` (whoever saw it: the helper or a blocked caller):
    /// consume and ack it and poll. Re-arming is the caller's: the helper re-arms after every
    /// event, and a thread about to sleep arms first ([`sleep_armed`](Self::sleep_armed)).
    ///
    /// `max` bounds the events read: a thread that armed the CQ once and woke on the channel
    /// takes 1 (all its arm can have raised; a later one stays for the next sleeper), the
    /// helper takes them all.
    pub(crate) fn on_cq_event(&self, d: &Dev, max: usize) {
        let _ = d.dev.take_cq_events(max);
        self.progress_all(d);
        self.rearm_if_listened(d);
    }

    /// After consuming a completion event: while a program thread still sleeps on the
    /// channel, or some stream needs the helper to hear completions, the CQ must stay armed
    /// — the event this thread took was the one report of an arm they count on (one arm,
    /// one event, for every waiter on the device's CQ). Without this a second thread
    /// blocked on another stream slept through its completions (an epoll wait, forever).
    fn rearm_if_listened(&self, d: &Dev) {
        let links_heard = d.links.load(SeqCst) > 0 && d.listening.load(SeqCst);
        if d.demand.load(SeqCst) > 0 || d.sleepers.load(SeqCst) > 0 || links_heard {
            self.sleep_armed(d);
        }
    }

    /// Arms `d`'s CQ for the next completion and polls once more: a completion that landed
    /// before the arm raises no event, so it must be picked up now. Call right before
    /// sleeping on the completion channel or on a doorbell the helper rings.
    pub(crate) fn sleep_armed(&self, d: &Dev) {
        d.program_polls();
        if let Err(e) = d.dev.arm() {
            log::error!("arming the CQ failed: {e}");
        }
        self.progress_all(d);
    }
}
