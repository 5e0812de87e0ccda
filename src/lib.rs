//! rsock core: everything librsock.so does, minus the exported symbols.
//!
//! Rooms:
//! - [`sys`]: the only FFI — real libc functions resolved with `dlsym(RTLD_NEXT)` and raw syscalls.
//! - [`fdtable`]: fd-indexed table of sockets the shim owns; a foreign fd costs one atomic load.
//! - [`config`], [`rules`], [`logger`], [`stats`]: `RSOCK_*` settings, the rules file, the log
//!   file, per-process counters.
//! - [`socket`] and [`api`]: the socket state machine and the libc-shaped entry points that
//!   `preload/` forwards to.
//! - [`proto`]: the sans-IO stream protocol (ring + credits + wire format), no I/O at all.
//! - [`engine`]: the RDMA path: connection setup, streams driving [`proto`] over RC queue
//!   pairs, the helper thread, fork take-over and relay; [`rdma`] is its verbs/rdma_cm
//!   layer, loaded with `dlopen`.
//! - [`transport`]: an in-memory driver of the protocol, for tests.

pub mod proto;
pub mod rdma;
pub mod transport;

pub mod addr;
pub mod api;
pub mod config;
pub mod engine;
pub mod fdtable;
pub mod forklock;
pub mod guard;
pub mod init;
pub mod logger;
pub mod negcache;
pub mod readiness;
pub mod rules;
pub mod socket;
pub mod stats;
pub mod sys;
