//! The sans-IO stream protocol: one TCP-like byte stream per direction, carried as RDMA WRITEs
//! into the peer's registered receive ring, with credit-based flow control.
//!
//! - [`wire`]: the hello/reject carried in rdma_cm private data and the 32-bit immediate.
//! - [`Params`]: local sizes; [`Conn`]: the state machine a driver feeds and polls.
//! - [`link`]: streams that share one queue pair (issue #24): their immediates, slots and
//!   control records.
//! - `ring`, `credits`: offset arithmetic and the exact credit accounting behind `Conn`.
//!
//! What this module does not do: no syscalls, no verbs, no threads, no clock reads, no memory
//! registration, no timers and no `unsafe`. The driver owns the registered send buffer and
//! receive ring and lends them as byte slices; every peer-controlled value is checked before
//! use, so malformed input yields an error, never a panic. `docs/PROTOCOL.md` is the wire
//! format's source of truth.

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod conn;
mod credits;
pub mod link;
mod params;
mod ring;
pub mod wire;

use core::fmt;

pub use conn::{
    Conn, Counters, Event, Failure, Handover, MigrateError, Readiness, RingCopy, State, Stats,
    Want, WrId, Write,
};
pub use credits::CONTROL_RESERVE;
pub use params::{
    ConfigError, Params, DEFAULT_MAX_INLINE, DEFAULT_RECV_CREDITS, DEFAULT_RING_SIZE,
    DEFAULT_SEND_BUF_SIZE, DEFAULT_SEND_QUEUE_DEPTH, MAX_SEND_BUF_SIZE, MIN_SEND_QUEUE_DEPTH,
};
pub use ring::{gather, scatter};
pub use wire::{
    Hello, HelloError, HelloKind, Imm, ImmError, Redirect, Reject, RejectReason, ResumePoint,
};

/// Why an application write did not copy anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteError {
    /// The send buffer is full; retry after [`Event::Writable`] (EAGAIN).
    Blocked,
    /// Writing was shut down locally (EPIPE).
    Closed,
    /// The connection was reset or failed (ECONNRESET).
    Reset,
}

/// Why an application read returned no bytes (end of stream is `Ok(0)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadError {
    /// Nothing readable yet; retry after [`Event::Readable`] (EAGAIN).
    Blocked,
    /// The connection was reset or failed (ECONNRESET).
    Reset,
}

/// The peer broke the protocol (or the transport failed); the connection is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProtocolError {
    /// The immediate value does not decode.
    BadImm(ImmError),
    /// More immediates arrived than receives we granted.
    TooManyMessages,
    /// A data immediate claims more bytes than were granted.
    DataBeyondCredit {
        /// Bytes the immediate announced.
        len: u32,
        /// Bytes the peer was allowed to write.
        window: u64,
    },
    /// Data after the peer's FIN.
    DataAfterFin,
    /// A second FIN.
    DuplicateFin,
    /// A credit message returns more than we had outstanding.
    CreditOverflow {
        /// Receives it returned.
        wrs: u32,
        /// Ring bytes it returned.
        bytes: u32,
    },
    /// A send completed in error (reported through `handle_send_error`).
    TransportFailed,
    /// An immediate after the peer's MIGRATE (it promised to send nothing more there).
    AfterMigrate,
    /// A GROW pair that is split, shrinks the ring or comes twice, or a SWITCHED nobody
    /// asked for.
    BadGrow,
    /// The write that carried an immediate is not as long as the immediate says: a DATA
    /// announcing bytes the peer did not write, or a control message carrying bytes.
    LengthMismatch {
        /// Bytes the immediate announced (0 for a control message).
        len: u32,
        /// Bytes its write had to carry (the burst, or its part after the ring's wrap).
        expected: u32,
        /// Bytes it carried (the receive completion's `byte_len`).
        written: u32,
    },
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtocolError::BadImm(e) => write!(f, "bad immediate: {e}"),
            ProtocolError::TooManyMessages => f.write_str("peer exceeded its receive credits"),
            ProtocolError::DataBeyondCredit { len, window } => {
                write!(f, "peer announced {len} bytes with {window} bytes granted")
            }
            ProtocolError::DataAfterFin => f.write_str("data after FIN"),
            ProtocolError::DuplicateFin => f.write_str("duplicate FIN"),
            ProtocolError::CreditOverflow { wrs, bytes } => {
                write!(
                    f,
                    "peer returned {wrs} WRs / {bytes} bytes it was never given"
                )
            }
            ProtocolError::TransportFailed => f.write_str("send completed in error"),
            ProtocolError::AfterMigrate => f.write_str("message after MIGRATE"),
            ProtocolError::BadGrow => f.write_str("malformed ring growth"),
            ProtocolError::LengthMismatch {
                len,
                expected,
                written,
            } => write!(
                f,
                "length mismatch: peer announced {len} bytes, its write carried {written} \
                 where {expected} were due"
            ),
        }
    }
}

impl std::error::Error for ProtocolError {}

/// A completion the core cannot match to a work request it handed out (a driver bug).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompletionError {
    /// The id was never handed out by `poll_write`.
    UnknownWr(WrId),
}

impl fmt::Display for CompletionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CompletionError::UnknownWr(id) => write!(f, "completion for unknown wr_id {}", id.0),
        }
    }
}

impl std::error::Error for CompletionError {}
