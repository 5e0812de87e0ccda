//! Per-device resources shared by connections: the completion channel and a pool of
//! completion queues ([`super::cq`]; protection domains are per connection, see
//! [`super::pd`]).
//!
//! All QPs of a device post their send and receive completions to the device's CQs, all on
//! one channel, so one poll (or one fd in an epoll set) serves every connection;
//! completions are told apart by [`Wc::qp_num`]. A CQ entry budget is reserved per QP so a
//! CQ can never overflow (an overflow is fatal to every QP on it).

use std::os::fd::RawFd;

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use rdma_sys::{ibv_comp_channel, ibv_context, ibv_cq, ibv_device_attr};

use super::cm::CmId;
use super::cq::CqPool;
use super::error::{Error, Reason, Result};
use super::fd;
use super::ffi::lib;
use super::wc::Wc;
use crate::forklock::ProcessMutex;

/// Entries of each CQ of a device (capped at the device's `max_cqe`): shared by the
/// connections it serves, each reserving its send + receive queue depth (about 130 with the
/// defaults); the pool makes another CQ when none has room (see [`super::cq`]).
pub const DEFAULT_CQ_ENTRIES: u32 = 65536;

/// Limits of a device that callers size things by
#[derive(Clone, Copy, Debug, Default)]
#[non_exhaustive]
pub struct DeviceLimits {
    /// Largest work queue
    pub max_qp_wr: u32,
    /// Largest CQ
    pub max_cqe: u32,
    /// Most scatter/gather entries per WR
    pub max_sge: u32,
    /// Largest MR
    pub max_mr_size: u64,
}

/// A device's completion channel and shared CQ (see the module doc)
pub struct Device {
    /// The process that made it: a fork child never uses its parent's (it makes its own).
    pid: i32,
    ctx: *mut ibv_context,
    channel: *mut ibv_comp_channel,
    /// Taken in Drop: the CQs go before the channel.
    cqs: Option<CqPool>,
    limits: DeviceLimits,
}

// SAFETY: verbs objects are thread-safe (providers lock internally); the struct is
// immutable apart from atomics.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

/// The devices this process opened. Per process (see `forklock`): a fork child never waits
/// for a lock one of its parent's threads held at the fork, nor reads the parent's list.
static OPEN: ProcessMutex<Vec<Weak<Device>>> = ProcessMutex::new(Vec::new);

impl Device {
    /// Whether this process opened it (a fork child's copy of its parent's is not).
    pub fn is_ours(&self) -> bool {
        self.pid == crate::sys::raw::pid()
    }

    /// The shared resources of the device `id` is bound to (after address resolution, or
    /// a connect request's id), created on first use and kept while any `Arc` to them
    /// lives. An id bound to no RDMA device gives [`Reason::NoRdma`].
    pub fn for_id(id: &CmId) -> Result<Arc<Device>> {
        // SAFETY: a non-null `verbs` of a live id is a context librdmacm keeps open.
        unsafe { Device::for_context(id.verbs()) }
    }

    /// [`Self::for_id`] from a raw verbs context.
    ///
    /// # Safety
    /// `ctx` is null or a live verbs context that outlives the returned resources (the
    /// contexts librdmacm opens stay open for the life of the process).
    pub unsafe fn for_context(ctx: *mut ibv_context) -> Result<Arc<Device>> {
        if ctx.is_null() {
            return Err(Error::new("device", libc::ENODEV, Reason::NoRdma));
        }
        let mut open = OPEN.lock();
        open.retain(|w| w.strong_count() > 0);
        let me = crate::sys::raw::pid();
        if let Some(d) = open
            .iter()
            .filter_map(Weak::upgrade)
            .find(|d| d.ctx == ctx && d.pid == me)
        {
            return Ok(d);
        }
        // SAFETY: per this function's contract.
        let d = Arc::new(unsafe { Device::open(ctx, DEFAULT_CQ_ENTRIES) }?);
        open.push(Arc::downgrade(&d));
        Ok(d)
    }

    /// Creates private resources on `ctx` with a CQ of `cq_entries` (not shared through
    /// [`Self::for_id`])
    ///
    /// # Safety
    /// As [`Self::for_context`], and `ctx` must not be null.
    pub unsafe fn open(ctx: *mut ibv_context, cq_entries: u32) -> Result<Device> {
        let lib = lib()?;
        // librdmacm opened the context for an id of ours just now: no queue pair of this
        // process uses it yet, so its fds move while nothing writes to them.
        // SAFETY: a live context (the contract).
        unsafe {
            crate::sys::raw::rehome(std::ptr::addr_of_mut!((*ctx).cmd_fd));
            crate::sys::raw::rehome(std::ptr::addr_of_mut!((*ctx).async_fd));
        }
        // SAFETY: ibv_device_attr is plain data; zero is a valid bit pattern.
        let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: ctx is a live verbs context (owned by librdmacm), attr is writable.
        let ret = unsafe { (lib.ibv_query_device)(ctx, &mut attr) };
        if ret != 0 {
            return Err(Error::from_ret("ibv_query_device", ret));
        }
        let limits = DeviceLimits {
            max_qp_wr: attr.max_qp_wr.max(0) as u32,
            max_cqe: attr.max_cqe.max(0) as u32,
            max_sge: attr.max_sge.max(0) as u32,
            max_mr_size: attr.max_mr_size,
        };
        let cq_entries = cq_entries.min(limits.max_cqe).max(1);
        // Build step by step; `partial` releases what exists if a later step fails.
        let mut d = Device {
            pid: crate::sys::raw::pid(),
            ctx,
            channel: std::ptr::null_mut(),
            cqs: None,
            limits,
        };
        // SAFETY: live context.
        d.channel = unsafe { (lib.ibv_create_comp_channel)(ctx) };
        if d.channel.is_null() {
            return Err(Error::last_lib("ibv_create_comp_channel").with_reason(Reason::Resources));
        }
        // SAFETY: channel is live, and no CQ uses it yet.
        unsafe { crate::sys::raw::rehome(std::ptr::addr_of_mut!((*d.channel).fd)) };
        // SAFETY: channel is live.
        fd::set_nonblocking(unsafe { (*d.channel).fd })?;
        // SAFETY: context and channel live as long as the device.
        d.cqs = Some(unsafe { CqPool::new(ctx, d.channel, cq_entries) }?);
        Ok(d)
    }

    /// The verbs context
    pub fn context(&self) -> *mut ibv_context {
        self.ctx
    }

    /// The CQ pool.
    pub fn cqs(&self) -> &CqPool {
        // Some from `open` until Drop.
        self.cqs.as_ref().expect("CQ pool")
    }

    /// Device limits from `ibv_query_device`
    pub fn limits(&self) -> DeviceLimits {
        self.limits
    }

    /// CQ entries: (reserved by QPs, total over the CQs made)
    pub fn cq_usage(&self) -> (u32, u32) {
        self.cqs().usage()
    }

    /// The completion channel's fd (nonblocking; readable after [`Self::arm`] once a
    /// completion arrives)
    pub fn comp_fd(&self) -> RawFd {
        // SAFETY: channel is live for the life of self.
        unsafe { (*self.channel).fd }
    }

    /// The context's async-event fd (set nonblocking on first use by [`Self::async_event`]
    /// readers; readable when an event waits)
    pub fn async_fd(&self) -> RawFd {
        // SAFETY: live context.
        unsafe { (*self.ctx).async_fd }
    }

    /// The next asynchronous event of the device, if one waits (the fd must be nonblocking:
    /// see [`fd::set_nonblocking`]). Acknowledged before returning.
    pub fn async_event(&self) -> Option<AsyncEvent> {
        let lib = lib().ok()?;
        // `ibv_async_event` with the event type read as a plain integer: a value this build
        // does not know must not become an invalid Rust enum.
        #[repr(C)]
        struct Raw {
            element: *mut std::ffi::c_void,
            event_type: u32,
        }
        let mut raw = Raw {
            element: std::ptr::null_mut(),
            event_type: u32::MAX,
        };
        // SAFETY: live context; `raw` has ibv_async_event's layout (a pointer-sized union,
        // then a C enum).
        if unsafe { (lib.ibv_get_async_event)(self.ctx, (&mut raw as *mut Raw).cast()) } != 0 {
            return None;
        }
        use rdma_sys::ibv_event_type as T;
        let kind = raw.event_type;
        let is = |t: T| kind == t as u32;
        let ev = if is(T::IBV_EVENT_QP_FATAL)
            || is(T::IBV_EVENT_QP_REQ_ERR)
            || is(T::IBV_EVENT_QP_ACCESS_ERR)
            || is(T::IBV_EVENT_PATH_MIG_ERR)
        {
            // SAFETY: for QP events the element is the QP, live until acknowledged.
            AsyncEvent::QpFatal(unsafe { (*raw.element.cast::<rdma_sys::ibv_qp>()).qp_num })
        } else if is(T::IBV_EVENT_CQ_ERR) || is(T::IBV_EVENT_DEVICE_FATAL) {
            AsyncEvent::DeviceFatal(kind)
        } else if is(T::IBV_EVENT_PORT_ERR) {
            AsyncEvent::PortDown
        } else {
            AsyncEvent::Other(kind)
        };
        // SAFETY: the event just got, acknowledged once.
        unsafe { (lib.ibv_ack_async_event)((&mut raw as *mut Raw).cast()) };
        Some(ev)
    }

    /// Polls up to `wcs.len()` completions from the device's CQs; returns how many were
    /// written
    pub fn poll(&self, wcs: &mut [Wc]) -> Result<usize> {
        self.cqs().poll(wcs)
    }

    /// Requests an event on the completion channel for the next completion of any CQ.
    /// Poll once more after arming: a completion that arrived before it raises no event.
    pub fn arm(&self) -> Result<()> {
        self.cqs().arm()
    }

    /// Consumes up to `max` pending completion-channel events without blocking (and acks
    /// them); returns whether there was any. Re-[`arm`](Self::arm) afterwards.
    pub fn take_cq_events(&self, max: usize) -> Result<bool> {
        let lib = lib()?;
        let mut any = false;
        for _ in 0..max {
            let mut cq: *mut ibv_cq = std::ptr::null_mut();
            let mut ctx: *mut std::ffi::c_void = std::ptr::null_mut();
            // SAFETY: live nonblocking channel; out-pointers valid.
            let ret = unsafe { (lib.ibv_get_cq_event)(self.channel, &mut cq, &mut ctx) };
            if ret != 0 {
                let e = Error::last_lib("ibv_get_cq_event");
                if e.errno() == libc::EAGAIN || e.errno() == libc::EINTR {
                    return Ok(any);
                }
                return Err(e);
            }
            any = true;
            // SAFETY: `cq` is one of our CQs (the only ones on this channel); ack it.
            unsafe { (lib.ibv_ack_cq_events)(cq, 1) };
        }
        Ok(any)
    }

    /// Waits up to `timeout` for a completion-channel event (caller has armed the CQ);
    /// consumes it and re-arms. Returns `Ok(false)` on timeout.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<bool> {
        if self.take_cq_events(usize::MAX)? {
            self.arm()?;
            return Ok(true);
        }
        if !fd::wait_readable(self.comp_fd(), timeout)? {
            return Ok(false);
        }
        self.take_cq_events(usize::MAX)?;
        self.arm()?;
        Ok(true)
    }

    /// Polls; if nothing is there, arms the CQ, polls again and sleeps on the completion
    /// channel up to `timeout`. Returns the number of completions (0 on timeout).
    /// For a driver that owns this device's CQ; a progress engine with many fds would
    /// instead put [`Self::comp_fd`] in its epoll set and call [`Self::take_cq_events`],
    /// [`Self::arm`] and [`Self::poll`] itself.
    pub fn poll_or_wait(&self, wcs: &mut [Wc], timeout: Option<Duration>) -> Result<usize> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let n = self.poll(wcs)?;
            if n > 0 {
                return Ok(n);
            }
            self.arm()?;
            let n = self.poll(wcs)?;
            if n > 0 {
                return Ok(n);
            }
            if !self.wait(fd::remaining(deadline))? {
                return self.poll(wcs);
            }
        }
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        let Ok(lib) = lib() else { return };
        // Every QP holds an Arc<Device> (through its Pd), so none remains on the CQs; every
        // channel event was acked in take_cq_events. Order: CQs, channel.
        drop(self.cqs.take());
        // SAFETY: as above.
        unsafe {
            if !self.channel.is_null() {
                (lib.ibv_destroy_comp_channel)(self.channel);
            }
        }
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("cq_usage", &self.cq_usage())
            .field("limits", &self.limits)
            .finish()
    }
}

/// An asynchronous event of a device, as the transport needs it
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AsyncEvent {
    /// The QP with this number is in the error state (fatal, request or access error)
    QpFatal(u32),
    /// The CQ or the whole device failed (raw `ibv_event_type`): every QP on it is lost
    DeviceFatal(u32),
    /// A port went down: its connections cannot carry anything
    PortDown,
    /// Anything else (raw `ibv_event_type`): informational
    Other(u32),
}
