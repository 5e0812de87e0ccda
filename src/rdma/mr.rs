//! Memory registration.
//!
//! Access is chosen from a closed set: this transport never lets a peer read its memory,
//! so there is no way to ask for `IBV_ACCESS_REMOTE_READ` (nor atomics). A region the peer
//! writes is registered zero-based (its IOVA starts at 0), so what the peer is told — an
//! offset range and an rkey — says nothing about this process's address space.

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use rdma_sys::{ibv_access_flags, ibv_mr, ibv_sge};

use super::error::{Error, Reason, Result};
use super::ffi::lib;
use super::pd::Pd;

/// What an MR allows
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Source of RDMA WRITEs only (the send buffer): no remote access at all
    LocalRead,
    /// Local reads and writes (e.g. a receive target of SEND, a scratch buffer)
    LocalWrite,
    /// A receive ring the peer RDMA-WRITEs into: `LOCAL_WRITE | REMOTE_WRITE`, never
    /// `REMOTE_READ`
    RemoteWrite,
}

impl Access {
    fn flags(self) -> i32 {
        let f = match self {
            Access::LocalRead => ibv_access_flags(0),
            Access::LocalWrite => ibv_access_flags::IBV_ACCESS_LOCAL_WRITE,
            Access::RemoteWrite => {
                ibv_access_flags::IBV_ACCESS_LOCAL_WRITE | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            }
        };
        f.0 as i32
    }
}

/// A registration of memory the caller owns; deregistered on drop
pub struct Mr {
    /// Null once deregistered.
    mr: *mut ibv_mr,
    /// Where byte 0 sits in the MR's address space (SGEs and remote writes use it): the
    /// virtual address, or 0 for a zero-based registration.
    iova: u64,
    access: Access,
    pd: Arc<Pd>,
}

// SAFETY: an MR is an immutable handle; dereg happens once in Drop.
unsafe impl Send for Mr {}
// SAFETY: as above.
unsafe impl Sync for Mr {}

impl Mr {
    /// Registers `len` bytes at `addr` in `pd`: zero-based for [`Access::RemoteWrite`]
    /// (no local SGE may point into such a region), at its virtual address otherwise.
    ///
    /// # Safety
    /// The memory must stay valid (not freed or unmapped) until the `Mr` is dropped, and
    /// for [`Access::RemoteWrite`] the caller must expect it to change under it at any time.
    pub unsafe fn register(pd: &Arc<Pd>, addr: *mut u8, len: usize, access: Access) -> Result<Mr> {
        let lib = lib()?;
        let iova = if access == Access::RemoteWrite {
            0
        } else {
            addr as u64
        };
        // SAFETY: live PD; memory validity is the caller's contract.
        let mr =
            unsafe { (lib.ibv_reg_mr_iova)(pd.as_ptr(), addr.cast(), len, iova, access.flags()) };
        if mr.is_null() {
            // ENOMEM here is usually RLIMIT_MEMLOCK.
            return Err(Error::last_lib("ibv_reg_mr_iova").with_reason(Reason::Resources));
        }
        Ok(Mr {
            mr,
            iova,
            access,
            pd: pd.clone(),
        })
    }

    /// Where byte 0 is in the MR's own address space (0 for a zero-based MR)
    pub fn iova(&self) -> u64 {
        self.iova
    }

    /// Length in bytes
    pub fn len(&self) -> usize {
        // SAFETY: live MR.
        unsafe { (*self.mr).length }
    }

    /// Whether the MR is empty
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Local key (for SGEs)
    pub fn lkey(&self) -> u32 {
        // SAFETY: live MR.
        unsafe { (*self.mr).lkey }
    }

    /// Remote key to give the peer; `None` unless the MR is [`Access::RemoteWrite`]
    pub fn rkey(&self) -> Option<u32> {
        // SAFETY: live MR.
        (self.access == Access::RemoteWrite).then(|| unsafe { (*self.mr).rkey })
    }

    /// The access it was registered with
    pub fn access(&self) -> Access {
        self.access
    }

    /// An SGE for `len` bytes at `offset` (panics if out of bounds)
    pub fn sge(&self, offset: usize, len: usize) -> Sge {
        assert!(offset <= self.len() && len <= self.len() - offset && len <= u32::MAX as usize);
        Sge {
            addr: self.iova + offset as u64,
            length: len as u32,
            lkey: self.lkey(),
        }
    }
}

impl Mr {
    /// The PD it is registered in.
    pub fn pd(&self) -> &Arc<Pd> {
        &self.pd
    }

    /// Deregisters (once); false if the device refused, when the memory may still be
    /// written by the NIC and must never be reused.
    fn deregister(&mut self) -> bool {
        if self.mr.is_null() {
            return true;
        }
        let Ok(lib) = lib() else { return false };
        // SAFETY: live MR, deregistered once. A QP still referencing it would see
        // protection errors, never memory corruption.
        let ret = unsafe { (lib.ibv_dereg_mr)(self.mr) };
        if ret != 0 {
            log::error!(
                "{}: the memory is leaked, not freed",
                Error::from_ret("ibv_dereg_mr", ret)
            );
            return false;
        }
        self.mr = std::ptr::null_mut();
        true
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        self.deregister();
    }
}

impl std::fmt::Debug for Mr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mr")
            .field("iova", &self.iova)
            .field("len", &self.len())
            .field("access", &self.access)
            .finish()
    }
}

/// A local scatter/gather entry (same layout as `ibv_sge`)
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    /// Address inside a registered region
    pub addr: u64,
    /// Length in bytes
    pub length: u32,
    /// The region's lkey
    pub lkey: u32,
}

const _: () = assert!(std::mem::size_of::<Sge>() == std::mem::size_of::<ibv_sge>());

/// Pages of [`RegBuf`]s this process holds (low 32 bits) and the process they count for
/// (high 32 bits: a fork child starts from 0, its parent's buffers in its memory are never
/// freed there). One word, so that threads of a new process that register at once cannot
/// wipe each other's count (a count reset after another thread's reservation went
/// below zero at its release, and refused every registration from then on).
static PINNED: AtomicU64 = AtomicU64::new(0);
static PINNED_LIMIT: AtomicUsize = AtomicUsize::new(usize::MAX);
const PAGE: usize = 4096;

/// The most bytes of registered buffers this process may hold; beyond it [`RegBuf::new`]
/// fails with [`Reason::Resources`] (before the kernel would pin pages the machine may not
/// have: a pinned page cannot be reclaimed, and the OOM killer would pick the program).
pub fn set_pinned_limit(bytes: usize) {
    PINNED_LIMIT.store(bytes, Relaxed);
}

/// This process's pages in `PINNED`'s word `w` (none if it counts for another process).
fn pages_of(w: u64, me: u32) -> u64 {
    if (w >> 32) as u32 == me {
        w & u64::from(u32::MAX)
    } else {
        0
    }
}

/// Bytes of registered buffers this process may still add under [`set_pinned_limit`].
pub fn pinned_room() -> usize {
    let me = crate::sys::raw::pid() as u32;
    let held = pages_of(PINNED.load(Relaxed), me) as usize;
    PINNED_LIMIT
        .load(Relaxed)
        .saturating_sub(held.saturating_mul(PAGE))
}

/// Counts `len` (whole pages) more pinned bytes, or refuses if that goes beyond the limit.
fn reserve_pinned(len: usize) -> Result<()> {
    let me = crate::sys::raw::pid() as u32;
    let limit = PINNED_LIMIT.load(Relaxed);
    let add = len.div_ceil(PAGE) as u64;
    let r = PINNED.fetch_update(Relaxed, Relaxed, |w| {
        let pages = pages_of(w, me) + add;
        let fits = pages <= u64::from(u32::MAX)
            && usize::try_from(pages).is_ok_and(|p| p.saturating_mul(PAGE) <= limit);
        fits.then_some(u64::from(me) << 32 | pages)
    });
    match r {
        Ok(_) => Ok(()),
        Err(_) => Err(Error::new(
            "pinned memory limit (RSOCK_MAX_PINNED_MB)",
            libc::ENOMEM,
            Reason::Resources,
        )),
    }
}

fn release_pinned(len: usize) {
    let me = crate::sys::raw::pid() as u32;
    let sub = len.div_ceil(PAGE) as u64;
    let _ = PINNED.fetch_update(Relaxed, Relaxed, |w| {
        ((w >> 32) as u32 == me).then(|| u64::from(me) << 32 | pages_of(w, me).saturating_sub(sub))
    });
}

/// A page-aligned, zeroed buffer with its registration (the usual ring or send buffer)
pub struct RegBuf {
    // Dropped by hand in Drop: deregister before freeing.
    mr: ManuallyDrop<Mr>,
    ptr: *mut u8,
    size: usize,
}

// SAFETY: owns its mapping; the MR is Send.
unsafe impl Send for RegBuf {}
// SAFETY: &RegBuf hands out only shared views and raw pointers.
unsafe impl Sync for RegBuf {}

impl RegBuf {
    /// Maps `len` bytes (rounded up to a page), zeroed and left out of fork children
    /// ([`crate::sys::mem::map_unforked`]), and registers them
    pub fn new(pd: &Arc<Pd>, len: usize, access: Access) -> Result<RegBuf> {
        let size = len.max(1).div_ceil(PAGE) * PAGE;
        reserve_pinned(size)?;
        let ptr = match crate::sys::mem::map_unforked(size) {
            Ok(p) => p,
            Err(e) => {
                release_pinned(size);
                let errno = e.raw_os_error().unwrap_or(libc::ENOMEM);
                return Err(Error::new("RegBuf::new", errno, Reason::Resources));
            }
        };
        // SAFETY: the mapping lives until Drop, which drops the MR first.
        match unsafe { Mr::register(pd, ptr, size, access) } {
            Ok(mr) => Ok(RegBuf {
                mr: ManuallyDrop::new(mr),
                ptr,
                size,
            }),
            Err(e) => {
                // SAFETY: mapped above with this size, never registered.
                unsafe { crate::sys::mem::unmap(ptr.cast(), size) };
                release_pinned(size);
                Err(e)
            }
        }
    }

    /// The registration
    pub fn mr(&self) -> &Mr {
        &self.mr
    }

    /// Start of the buffer
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Size in bytes (a multiple of the page size)
    pub fn len(&self) -> usize {
        self.size
    }

    /// Always false (the size is at least one page)
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The bytes. For a [`Access::RemoteWrite`] ring, only read a range the protocol says
    /// the peer has finished writing (a completion with immediate was seen for it).
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: owned mapping of len bytes.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len()) }
    }

    /// The bytes, mutably. Don't change a range an outstanding WRITE is sending from.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: owned mapping of len bytes; &mut self excludes other views.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len()) }
    }

    /// An SGE for `len` bytes at `offset`
    pub fn sge(&self, offset: usize, len: usize) -> Sge {
        self.mr.sge(offset, len)
    }

    /// Where the peer should write: (IOVA, rkey); `None` unless RemoteWrite
    pub fn remote(&self) -> Option<RemoteBuf> {
        self.mr.rkey().map(|rkey| RemoteBuf {
            addr: self.mr.iova(),
            rkey,
            len: self.len() as u64,
        })
    }
}

impl Drop for RegBuf {
    fn drop(&mut self) {
        // The memory is freed only once the device gave up remote access to it.
        let released = self.mr.deregister();
        // SAFETY: the MR is dropped exactly once, here (already deregistered); the memory
        // is freed once, only if deregistered.
        unsafe {
            ManuallyDrop::drop(&mut self.mr);
            if released {
                crate::sys::mem::unmap(self.ptr.cast(), self.size);
            }
        }
        if released {
            release_pinned(self.size); // else it stays pinned: still counted
        }
    }
}

/// A peer's registered region (from its private data): base address, rkey and length
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RemoteBuf {
    /// Byte 0 in the peer's MR address space (0 for rsock peers: zero-based rings)
    pub addr: u64,
    /// Peer's rkey
    pub rkey: u32,
    /// Length in bytes
    pub len: u64,
}

impl RemoteBuf {
    /// Address of byte `offset` (panics past the end)
    pub fn at(&self, offset: u64) -> u64 {
        assert!(offset <= self.len);
        self.addr + offset
    }
}

#[cfg(test)]
mod pinned_tests {
    use super::*;

    #[test]
    fn threads_of_a_new_process_count_their_pinned_pages_together_and_the_limit_holds() {
        let me = crate::sys::raw::pid() as u32;
        // As a fork child finds it: its parent's count.
        PINNED.store(u64::from(me.wrapping_add(1)) << 32 | 5, Relaxed);
        let threads: Vec<_> = (0..8)
            .map(|_| {
                std::thread::spawn(|| {
                    for _ in 0..2000 {
                        reserve_pinned(3 * PAGE).expect("no limit");
                        release_pinned(3 * PAGE);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        assert_eq!(pages_of(PINNED.load(Relaxed), me), 0, "every page released");
        set_pinned_limit(10 * PAGE);
        reserve_pinned(8 * PAGE).expect("within the limit");
        assert!(reserve_pinned(4 * PAGE).is_err(), "beyond the limit");
        release_pinned(8 * PAGE);
        reserve_pinned(10 * PAGE).expect("all of it");
        release_pinned(10 * PAGE);
        set_pinned_limit(usize::MAX);
        assert_eq!(pages_of(PINNED.load(Relaxed), me), 0);
    }
}
