//! The completion queues a device's connections share: a pool that grows by one CQ when
//! those it has cannot take a new QP's entries.
//!
//! Every QP reserves its send + receive depth in the CQ it posts to, so a CQ can never
//! overflow (an overflow is fatal to every QP on it). One CQ is bounded by the device's
//! `max_cqe` (32767 on rxe: about 255 connections); the pool lifts that to [`MAX_CQS`]
//! times as many. All CQs share the device's completion channel, so one fd still serves
//! them all, and a poll walks them starting from a rotating one.

use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicUsize, Ordering};
use std::sync::Mutex;

use rdma_sys::{ibv_comp_channel, ibv_context, ibv_cq, ibv_wc};

use super::error::{Error, Reason, Result};
use super::ffi::lib;
use super::wc::Wc;

/// Most CQs per device and process.
pub const MAX_CQS: usize = 64;

/// A device's CQs (see the module doc).
pub struct CqPool {
    ctx: *mut ibv_context,
    channel: *mut ibv_comp_channel,
    /// Entries of each CQ.
    entries: u32,
    cqs: [AtomicPtr<ibv_cq>; MAX_CQS],
    reserved: [AtomicU32; MAX_CQS],
    /// CQs made so far (each slot below is set before this grows past it).
    len: AtomicUsize,
    grow: Mutex<()>,
    cursor: AtomicUsize,
}

// SAFETY: verbs objects are thread-safe; the rest is atomics and a mutex.
unsafe impl Send for CqPool {}
// SAFETY: as above.
unsafe impl Sync for CqPool {}

impl CqPool {
    /// A pool of CQs of `entries` each on `ctx`, signalling `channel`; makes the first.
    ///
    /// # Safety
    /// `ctx` and `channel` stay live for the life of the pool.
    pub unsafe fn new(
        ctx: *mut ibv_context,
        channel: *mut ibv_comp_channel,
        entries: u32,
    ) -> Result<CqPool> {
        let p = CqPool {
            ctx,
            channel,
            entries: entries.max(1),
            cqs: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())),
            reserved: std::array::from_fn(|_| AtomicU32::new(0)),
            len: AtomicUsize::new(0),
            grow: Mutex::new(()),
            cursor: AtomicUsize::new(0),
        };
        p.push(0)?;
        Ok(p)
    }

    /// Makes CQ number `i` (== len) with `n` entries already reserved, armed.
    fn push(&self, n: u32) -> Result<usize> {
        let lib = lib()?;
        let i = self.len.load(Ordering::Acquire);
        if i == MAX_CQS {
            return Err(Error::new("ibv_create_cq", libc::ENOSPC, Reason::Resources));
        }
        // SAFETY: live context and channel; cq_context unused.
        let cq = unsafe {
            (lib.ibv_create_cq)(
                self.ctx,
                self.entries as i32,
                std::ptr::null_mut(),
                self.channel,
                0,
            )
        };
        if cq.is_null() {
            return Err(Error::last_lib("ibv_create_cq").with_reason(Reason::Resources));
        }
        // Armed from the start: a waiter that armed the pool before this CQ existed must
        // still hear of its completions.
        // SAFETY: live CQ; ops-table call.
        unsafe { rdma_sys::ibv_req_notify_cq(cq, 0) };
        self.reserved[i].store(n, Ordering::Relaxed);
        self.cqs[i].store(cq, Ordering::Release);
        self.len.store(i + 1, Ordering::Release);
        if i > 0 {
            log::info!("rdma device: completion queue {} of {MAX_CQS} made", i + 1);
        }
        Ok(i)
    }

    fn live(&self) -> impl Iterator<Item = *mut ibv_cq> + '_ {
        let n = self.len.load(Ordering::Acquire);
        self.cqs[..n].iter().map(|c| c.load(Ordering::Acquire))
    }

    /// Reserves `n` entries in a CQ with room, making a new CQ if none has; returns its
    /// slot. [`Reason::Resources`] when the pool is full or the device refuses a CQ.
    pub fn reserve(&self, n: u32) -> Result<usize> {
        if n > self.entries {
            return Err(Error::new("reserve_cqe", libc::ENOSPC, Reason::Resources));
        }
        loop {
            let len = self.len.load(Ordering::Acquire);
            if let Some(i) = (0..len).find(|&i| self.add(i, n).is_ok()) {
                return Ok(i);
            }
            let _g = self.grow.lock().unwrap_or_else(|e| e.into_inner());
            if self.len.load(Ordering::Acquire) == len {
                return self.push(n);
            }
            // Another thread grew the pool meanwhile: look again.
        }
    }

    /// Reserves `n` more entries in CQ `slot`.
    pub fn add(&self, slot: usize, n: u32) -> Result<()> {
        let r = &self.reserved[slot];
        let mut cur = r.load(Ordering::Relaxed);
        loop {
            let Some(next) = cur.checked_add(n).filter(|&v| v <= self.entries) else {
                return Err(Error::new("reserve_cqe", libc::ENOSPC, Reason::Resources));
            };
            match r.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return Ok(()),
                Err(v) => cur = v,
            }
        }
    }

    /// Returns `n` entries of CQ `slot`.
    pub fn release(&self, slot: usize, n: u32) {
        self.reserved[slot].fetch_sub(n, Ordering::AcqRel);
    }

    /// The CQ of `slot`.
    pub fn cq(&self, slot: usize) -> *mut ibv_cq {
        self.cqs[slot].load(Ordering::Acquire)
    }

    /// Entries: (reserved, total).
    pub fn usage(&self) -> (u32, u32) {
        let n = self.len.load(Ordering::Acquire);
        let used = self.reserved[..n]
            .iter()
            .map(|r| r.load(Ordering::Relaxed))
            .sum();
        (used, self.entries * n as u32)
    }

    /// Polls up to `wcs.len()` completions from the CQs, starting at a rotating one so that
    /// no CQ's connections starve; returns how many were written.
    pub fn poll(&self, wcs: &mut [Wc]) -> Result<usize> {
        let n = self.len.load(Ordering::Acquire);
        let start = if n > 1 {
            self.cursor.fetch_add(1, Ordering::Relaxed) % n
        } else {
            0
        };
        let mut got = 0;
        for k in 0..n {
            if got == wcs.len() {
                break;
            }
            let cq = self.cqs[(start + k) % n].load(Ordering::Acquire);
            let room = (wcs.len() - got).min(i32::MAX as usize) as i32;
            // SAFETY: live CQ; Wc is repr(transparent) over ibv_wc, so the rest of the
            // buffer holds `room` writable ibv_wc. An ops-table call (no symbol).
            let ret = unsafe {
                rdma_sys::ibv_poll_cq(cq, room, wcs[got..].as_mut_ptr().cast::<ibv_wc>())
            };
            if ret < 0 {
                return Err(Error::new("ibv_poll_cq", libc::EIO, Reason::Other));
            }
            got += ret as usize;
        }
        Ok(got)
    }

    /// Requests a channel event for the next completion of every CQ.
    pub fn arm(&self) -> Result<()> {
        for cq in self.live() {
            // SAFETY: live CQ; ops-table call, no libibverbs symbol.
            let ret = unsafe { rdma_sys::ibv_req_notify_cq(cq, 0) };
            if ret != 0 {
                return Err(Error::from_errno(
                    "ibv_req_notify_cq",
                    if ret > 0 { ret } else { libc::EIO },
                ));
            }
        }
        Ok(())
    }
}

impl Drop for CqPool {
    fn drop(&mut self) {
        let Ok(lib) = lib() else { return };
        for cq in self.live() {
            // SAFETY: no QP remains on it (each holds the device alive); destroyed once.
            unsafe { (lib.ibv_destroy_cq)(cq) };
        }
    }
}
