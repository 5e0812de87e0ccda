//! Drivers of the [`proto`](crate::proto) state machine.
//!
//! - [`mem`]: two connections in one process, their "RDMA writes" applied as memcpy between
//!   plain buffers, with every step (post, delivery, receive and send completion) under the
//!   caller's control. Used by the protocol tests and the benchmark. Its [`mem::fabric`] (what
//!   an RC queue pair does) is also what the stream's in-memory port runs on.
//!
//! There is deliberately no `Transport` trait yet: a driver's contract is the method set of
//! [`Conn`](crate::proto::Conn) (`handle_*`, `poll_write`, `poll_event`), and the in-memory and
//! RDMA drivers share nothing else (one schedules steps by hand, the other reacts to CQ events
//! and owns registered memory). A trait can be extracted when the shared-memory driver exists.

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod mem;
