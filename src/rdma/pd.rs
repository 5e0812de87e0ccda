//! Protection domains: one per connection.
//!
//! An rkey is valid on every QP of its PD, so a PD shared by a process's connections would
//! let any peer write into any of its rings with an rkey it learnt or guessed. With a PD
//! per connection, a ring's rkey works through that connection's QP alone; a write aimed
//! elsewhere fails on the writer's QP with a remote access error.

use std::sync::Arc;

use rdma_sys::ibv_pd;

use super::device::Device;
use super::error::{Error, Reason, Result};
use super::ffi::lib;

/// A protection domain on a device; deallocated when the last QP and MR in it are gone
/// (each holds an `Arc<Pd>`).
pub struct Pd {
    pd: *mut ibv_pd,
    dev: Arc<Device>,
}

// SAFETY: a PD is an immutable handle; verbs are thread-safe; dealloc happens once in Drop.
unsafe impl Send for Pd {}
// SAFETY: as above.
unsafe impl Sync for Pd {}

impl Pd {
    /// Allocates a PD on `dev`.
    pub fn new(dev: &Arc<Device>) -> Result<Arc<Pd>> {
        let lib = lib()?;
        // SAFETY: live context.
        let pd = unsafe { (lib.ibv_alloc_pd)(dev.context()) };
        if pd.is_null() {
            return Err(Error::last_lib("ibv_alloc_pd").with_reason(Reason::Resources));
        }
        Ok(Arc::new(Pd {
            pd,
            dev: dev.clone(),
        }))
    }

    /// The verbs handle
    pub fn as_ptr(&self) -> *mut ibv_pd {
        self.pd
    }

    /// The device it lives on (context, shared CQ)
    pub fn device(&self) -> &Arc<Device> {
        &self.dev
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        if let Ok(lib) = lib() {
            // SAFETY: every QP and MR in the PD holds an Arc<Pd>, so none remains.
            let ret = unsafe { (lib.ibv_dealloc_pd)(self.pd) };
            if ret != 0 {
                log::warn!("ibv_dealloc_pd: {}", Error::from_ret("ibv_dealloc_pd", ret));
            }
        }
    }
}

impl std::fmt::Debug for Pd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pd").field("pd", &self.pd).finish()
    }
}
