//! Per-connection sizes and limits chosen by the local side.
//!
//! Nothing here allocates: the driver registers memory of these sizes and hands the slices to
//! [`Conn`](super::Conn) on every call.

use super::wire::{
    Hello, HelloError, HelloKind, MAX_RECV_CREDITS, MAX_RING_SIZE, MIN_RECV_CREDITS, MIN_RING_SIZE,
};
use core::fmt;

/// Local connection parameters.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Params {
    /// Bytes in the local receive ring the peer writes into. Any size in
    /// `MIN_RING_SIZE..=MAX_RING_SIZE` (not just powers of two; see PROTOCOL.md §4).
    pub ring_size: u32,
    /// Receives the driver keeps posted; each incoming WRITE_WITH_IMM consumes one.
    pub recv_credits: u32,
    /// Bytes in the local registered send buffer that app writes are copied into.
    pub send_buf_size: u32,
    /// Send queue depth of the QP: the core never has more work requests outstanding.
    pub send_queue_depth: u32,
    /// Writes of at most this many bytes are flagged `inline` (0 disables inlining).
    pub max_inline: u32,
    /// The ring grows to this size (whole 4 KiB pages, at most `MAX_GROW_PAGES` of them)
    /// when the peer fills it; at most `ring_size` (0, say) keeps it as it is.
    pub ring_grow_to: u32,
    /// The send buffer grows to this size when a write finds it full; at most
    /// `send_buf_size` keeps it as it is.
    pub send_grow_to: u32,
}

/// A connection's defaults, the one place they are set: the shim's settings
/// (`crate::config::Config`), its connection setup and the QP caps start from these.
pub const DEFAULT_RING_SIZE: u32 = 256 * 1024;
/// Receive credits (`RSOCK_RECV_CREDITS`): receive WRs posted, so writes in flight.
pub const DEFAULT_RECV_CREDITS: u32 = 64;
/// Send buffer bytes (`RSOCK_SEND_BUF`).
pub const DEFAULT_SEND_BUF_SIZE: u32 = 256 * 1024;
/// Send queue depth: half the ring's worth of writes in flight is plenty (bursts merge),
/// and a smaller queue leaves room in the device's shared CQ for more connections.
pub const DEFAULT_SEND_QUEUE_DEPTH: u32 = 64;
/// Largest inline write (`RSOCK_MAX_INLINE`).
pub const DEFAULT_MAX_INLINE: u32 = 128;

impl Default for Params {
    fn default() -> Self {
        Params {
            ring_size: DEFAULT_RING_SIZE,
            recv_credits: DEFAULT_RECV_CREDITS,
            send_buf_size: DEFAULT_SEND_BUF_SIZE,
            send_queue_depth: DEFAULT_SEND_QUEUE_DEPTH,
            max_inline: DEFAULT_MAX_INLINE,
            ring_grow_to: 0,
            send_grow_to: 0,
        }
    }
}

/// Smallest send queue: a data burst may need three work requests plus one control message.
pub const MIN_SEND_QUEUE_DEPTH: u32 = 4;
/// Largest send buffer (bursts must fit the 31-bit immediate length).
pub const MAX_SEND_BUF_SIZE: u32 = 1 << 30;

/// A [`Params`] field out of range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigError {
    /// `ring_size` outside `MIN_RING_SIZE..=MAX_RING_SIZE`.
    RingSize(u32),
    /// `recv_credits` outside `MIN_RECV_CREDITS..=MAX_RECV_CREDITS`.
    RecvCredits(u32),
    /// `send_buf_size` outside `1..=MAX_SEND_BUF_SIZE`.
    SendBufSize(u32),
    /// `send_queue_depth` below `MIN_SEND_QUEUE_DEPTH`.
    SendQueueDepth(u32),
    /// The peer's hello breaks a protocol limit (only possible for a hand-built `Hello`).
    Peer(HelloError),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::RingSize(v) => write!(f, "ring_size {v} out of range"),
            ConfigError::RecvCredits(v) => write!(f, "recv_credits {v} out of range"),
            ConfigError::SendBufSize(v) => write!(f, "send_buf_size {v} out of range"),
            ConfigError::SendQueueDepth(v) => write!(f, "send_queue_depth {v} out of range"),
            ConfigError::Peer(e) => write!(f, "peer hello: {e}"),
        }
    }
}

impl std::error::Error for ConfigError {}

impl Params {
    /// Checks every field against the protocol limits.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(MIN_RING_SIZE..=MAX_RING_SIZE).contains(&self.ring_size) {
            return Err(ConfigError::RingSize(self.ring_size));
        }
        if !(MIN_RECV_CREDITS..=MAX_RECV_CREDITS).contains(&self.recv_credits) {
            return Err(ConfigError::RecvCredits(self.recv_credits));
        }
        if !(1..=MAX_SEND_BUF_SIZE).contains(&self.send_buf_size) {
            return Err(ConfigError::SendBufSize(self.send_buf_size));
        }
        if self.send_grow_to > MAX_SEND_BUF_SIZE {
            return Err(ConfigError::SendBufSize(self.send_grow_to));
        }
        if self.send_queue_depth < MIN_SEND_QUEUE_DEPTH {
            return Err(ConfigError::SendQueueDepth(self.send_queue_depth));
        }
        Ok(())
    }

    /// The connect or accept hello announcing this config, for a ring registered at
    /// `ring_addr` with `rkey`, on the connection `conn_id`.
    pub fn hello(&self, kind: HelloKind, ring_addr: u64, rkey: u32, conn_id: u64) -> Hello {
        Hello {
            kind,
            flags: 0,
            ring_addr,
            rkey,
            ring_size: self.ring_size,
            recv_credits: self.recv_credits,
            conn_id,
            resume: None,
            branch: None,
        }
    }
}
