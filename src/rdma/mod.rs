//! RDMA groundwork: rdma_cm connections and RC verbs for the transport.
//!
//! librdmacm and libibverbs are never linked: [`ffi::lib`] `dlopen`s them on first use and
//! fails cleanly ([`Reason::NoRdma`]) when they or a device are missing. Types and layouts
//! come from rdma-sys; the data-path verbs go through the provider's ops table.
//!
//! Rooms:
//! - [`ffi`]: the lazily loaded function table.
//! - [`error`]: [`Error`] = operation + errno + fallback [`Reason`].
//! - [`cm`]: [`EventChannel`] (nonblocking fd), [`CmId`], [`CmEvent`], [`ConnParam`].
//! - [`device`]: per-device completion channel + CQ pool ([`Device`], [`cq`]), completions ([`Wc`]).
//! - [`pd`]: a protection domain per connection ([`Pd`]): a ring's rkey works on its own QP only.
//! - [`mr`]: registrations ([`Mr`], [`RegBuf`]) with a closed set of [`Access`] modes.
//! - [`pool`]: registered memory of ended connections, reused by new ones of the same sizes.
//! - [`conn`]: an RC QP on a cm id ([`RcQp`]): WRITE / WRITE_WITH_IMM (inline when small,
//!   selectively signaled), zero-length receives, queue accounting, drain.
//! - [`connect`]: blocking setup and teardown helpers ([`resolve`], [`connect()`],
//!   [`CmListener`], [`accept`], [`close`]).
//!
//! What it does not do: no threads, no progress engine, no stream protocol (that is
//! `proto`); it calls no hooked libc function itself (fd control and waits are raw
//! syscalls), though librdmacm and libibverbs do — call it with the shim's reentrancy
//! guard held.

pub mod cm;
pub mod conn;
pub mod connect;
pub mod cq;
pub mod device;
pub mod error;
pub mod fd;
pub mod ffi;
pub mod mr;
pub mod pd;
pub mod pool;
mod providers;
pub mod wc;

pub use cm::{
    CmEvent, CmId, ConnParam, EventChannel, EventKind, REJ_PRIVATE_MAX, REP_PRIVATE_MAX,
    REQ_PRIVATE_MAX,
};
pub use conn::{QpCaps, RcQp, Signal};
pub use connect::{
    accept, close, connect, connect_event, resolve, wait_event, CmListener, Incoming,
};
pub use device::{AsyncEvent, Device, DeviceLimits};
pub use error::{Error, Reason, Result};
pub use mr::{Access, Mr, RegBuf, RemoteBuf, Sge};
pub use pd::Pd;
pub use wc::{Wc, WcOpcode, DRAIN_SEND_WR_ID, RECV_FLAG};

/// Whether this host has a usable RDMA device: one listed in sysfs and the rdma_cm device
/// node to reach it (a container or namespace may see the first without the second). Read
/// once, without loading libibverbs.
pub fn device_present() -> bool {
    static PRESENT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PRESENT.get_or_init(|| {
        let listed =
            std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some());
        let present = listed && std::path::Path::new("/dev/infiniband/rdma_cm").exists();
        log::info!("RDMA device present: {present}");
        present
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host_has_rdma_device() -> bool {
        std::fs::read_dir("/sys/class/infiniband")
            .map(|mut d| d.next().is_some())
            .unwrap_or(false)
    }

    #[test]
    fn missing_device_or_library_is_a_clean_no_rdma_error() {
        if host_has_rdma_device() {
            return;
        }
        let e = EventChannel::new()
            .err()
            .expect("no RDMA device here, so no event channel");
        assert_eq!(e.reason(), Reason::NoRdma, "{e}");
        // Cached: the second attempt fails the same way without crashing.
        let e2 = resolve(
            None,
            "10.77.0.1:7471".parse().unwrap(),
            0,
            std::time::Duration::from_millis(100),
        )
        .expect_err("resolve cannot work without a device");
        assert_eq!(e2.reason(), Reason::NoRdma, "{e2}");
        let l = CmListener::bind("0.0.0.0:0".parse().unwrap(), 1, 0)
            .err()
            .expect("no listener without a device");
        assert_eq!(l.reason(), Reason::NoRdma);
    }

    #[test]
    fn device_lookup_rejects_null_context() {
        // SAFETY: null is allowed and rejected.
        let e = unsafe { Device::for_context(std::ptr::null_mut()) }
            .err()
            .unwrap();
        assert_eq!(e.reason(), Reason::NoRdma);
    }
}
