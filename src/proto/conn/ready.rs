//! What a connection shows to the program: readiness for poll/epoll and blocking calls, and
//! failures of the transport under it. The driver asks these questions instead of keeping
//! its own copy of the connection's state.

use super::{Conn, EV_RESET};

/// The transport ended the connection under the protocol: the queue pair or its device
/// failed, a post failed, the peer stopped answering or went away. Bytes that had arrived
/// stay readable (as on a TCP socket that got a reset); then reads fail, and writes fail
/// at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Failure {
    /// The connection broke (ECONNRESET).
    Reset,
    /// The peer stopped answering: retries exhausted, keepalive or user timeout (ETIMEDOUT).
    TimedOut,
    /// The peer went away after its FIN: reads end normally, writes fail (EPIPE).
    PeerGone,
}

/// What a blocked caller waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Want {
    /// Bytes, end of stream or an error to read.
    Read,
    /// Room to write, or an error.
    Write,
}

/// What poll/epoll should report for the connection (each implies the ones before it in
/// the order hang-up ⇒ read ended ⇒ readable, as the kernel sets these flags together).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Readiness {
    /// A read returns at once: bytes, end of stream or an error (POLLIN).
    pub readable: bool,
    /// Room worth waking a writer for — a third of the send buffer, as kernel TCP's
    /// `sk_stream_is_writeable` — or writes fail at once (POLLOUT).
    pub writable: bool,
    /// The peer's FIN arrived, reading was shut down, or the connection failed (POLLRDHUP).
    pub read_ended: bool,
    /// Both directions are shut, or the connection failed (POLLHUP).
    pub hangup: bool,
}

impl Readiness {
    /// The four flags as bits 0–3 (readable, writable, read ended, hang-up).
    pub fn bits(self) -> u8 {
        u8::from(self.readable)
            | u8::from(self.writable) << 1
            | u8::from(self.read_ended) << 2
            | u8::from(self.hangup) << 3
    }

    /// The inverse of [`bits`](Self::bits) (higher bits are ignored).
    pub fn from_bits(b: u8) -> Readiness {
        Readiness {
            readable: b & 1 != 0,
            writable: b & 2 != 0,
            read_ended: b & 4 != 0,
            hangup: b & 8 != 0,
        }
    }
}

impl Conn {
    /// The transport failed under the connection (see [`Failure`]); the first failure is
    /// the one reported. Nothing more is posted, and the driver may tear the queue pair
    /// down once the program is done reading.
    pub fn handle_failure(&mut self, f: Failure) {
        if self.transport.is_some() {
            return;
        }
        self.transport = Some(f);
        self.planned.clear();
        self.events |= EV_RESET;
    }

    /// The transport failure, if any.
    pub fn failure(&self) -> Option<Failure> {
        self.transport
    }

    /// For a write after a failure: true the first time. TCP reports a time-out once, then
    /// EPIPE; the driver uses this to do the same.
    pub fn first_failure_report(&mut self) -> bool {
        !std::mem::replace(&mut self.failure_reported, true)
    }

    /// Reset, failed on a protocol error, or failed under by the transport.
    pub fn is_broken(&self) -> bool {
        self.is_reset() || self.transport.is_some()
    }

    /// What poll/epoll should report now.
    pub fn readiness(&self) -> Readiness {
        let broken = self.is_broken();
        let hangup = broken || self.hung_up();
        let read_ended = hangup || self.read_ended();
        Readiness {
            readable: broken || self.readable() > 0 || self.at_eof(),
            writable: broken || self.write_shut || self.poll_writable(),
            read_ended,
            hangup,
        }
    }

    /// Whether a call waiting for `want` can proceed without blocking (for writes, any free
    /// space; poll's [`Readiness::writable`] asks for more).
    pub fn ready(&self, want: Want) -> bool {
        self.is_broken()
            || match want {
                Want::Read => self.readable() > 0 || self.at_eof(),
                Want::Write => self.writable() > 0 || self.write_shut,
            }
    }

    /// Whether everything queued, FIN included, has been acknowledged — or never can be
    /// (the connection broke). What a lingering close waits for.
    pub fn flushed(&self) -> bool {
        self.is_broken() || (self.fin_sent && self.all_sent())
    }

    /// Everything the program wrote was sent and acknowledged (or the connection broke).
    pub fn all_sent(&self) -> bool {
        self.is_broken()
            || (self.tx_acked == self.tx_queued
                && self.wrs_retired == self.next_wr
                && self.planned.is_empty())
    }
}
