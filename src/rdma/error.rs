//! Errors of the RDMA layer: an errno plus the fallback reason the shim counts.

use std::fmt;
use std::io;

/// Why an RDMA attempt failed, as the shim counts fallbacks to kernel TCP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// librdmacm/libibverbs missing, no RDMA device, or no device for the address.
    NoRdma,
    /// The peer rejected the connection (no rdma_cm listener, or it said no).
    Rejected,
    /// Address or route resolution failed, or the peer is unreachable.
    Unreachable,
    /// A step did not finish in time.
    Timeout,
    /// Out of memory, memlock, QPs, CQ entries, or a queue is full.
    Resources,
    /// The peer's private data was missing or malformed, or an unexpected event arrived.
    BadHandshake,
    /// The connection was torn down by the peer or by a fatal completion error.
    Disconnected,
    /// Anything else (a bad argument, an unexpected errno).
    Other,
}

impl Reason {
    /// Short lowercase name, stable for counters and logs
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::NoRdma => "no_rdma",
            Reason::Rejected => "rejected",
            Reason::Unreachable => "unreachable",
            Reason::Timeout => "timeout",
            Reason::Resources => "resources",
            Reason::BadHandshake => "bad_handshake",
            Reason::Disconnected => "disconnected",
            Reason::Other => "other",
        }
    }

    /// The reason a bare errno most likely means
    pub fn from_errno(errno: i32) -> Reason {
        match errno {
            libc::ENODEV
            | libc::ENOENT
            | libc::ENOSYS
            | libc::EAFNOSUPPORT
            | libc::EPROTONOSUPPORT
            | libc::EADDRNOTAVAIL => Reason::NoRdma,
            libc::ECONNREFUSED => Reason::Rejected,
            libc::EHOSTUNREACH | libc::ENETUNREACH | libc::ENETDOWN => Reason::Unreachable,
            libc::ETIMEDOUT => Reason::Timeout,
            libc::ENOMEM
            | libc::ENOSPC
            | libc::EAGAIN
            | libc::ENOBUFS
            | libc::EMFILE
            | libc::ENFILE => Reason::Resources,
            libc::EPROTO | libc::EBADMSG => Reason::BadHandshake,
            libc::ECONNRESET | libc::ENOTCONN | libc::EPIPE => Reason::Disconnected,
            _ => Reason::Other,
        }
    }
}

/// An RDMA-layer error: which operation failed, the errno, and the fallback reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Error {
    op: &'static str,
    errno: i32,
    reason: Reason,
    /// The rdma_cm event that reported it: (`rdma_cm_event_type`, status).
    event: Option<(u32, i32)>,
}

/// Result of the RDMA layer
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An error with an explicit reason
    pub fn new(op: &'static str, errno: i32, reason: Reason) -> Error {
        Error {
            op,
            errno,
            reason,
            event: None,
        }
    }

    /// An error from an errno, with the reason [`Reason::from_errno`] gives
    pub fn from_errno(op: &'static str, errno: i32) -> Error {
        Error {
            op,
            errno,
            reason: Reason::from_errno(errno),
            event: None,
        }
    }

    /// An error from the calling thread's current errno (right after a failed C call)
    pub fn last_os(op: &'static str) -> Error {
        let errno = io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO);
        // A failing call that left errno at 0 still failed.
        Error::from_errno(op, if errno == 0 { libc::EIO } else { errno })
    }

    /// An error for a library call that returns a negative errno (or -1 with errno set)
    pub fn from_ret(op: &'static str, ret: i32) -> Error {
        if ret < -1 {
            Error::from_errno(op, -ret)
        } else {
            Error::last_lib(op)
        }
    }

    /// The operation that failed ("rdma_connect", "REJECTED", "ibv_reg_mr", …)
    pub fn op(&self) -> &'static str {
        self.op
    }

    /// errno-like value for the caller's errno (always > 0)
    pub fn errno(&self) -> i32 {
        self.errno
    }

    /// The fallback reason the shim counts
    pub fn reason(&self) -> Reason {
        self.reason
    }

    /// The rdma_cm event that reported it: (`rdma_cm_event_type`, status)
    pub fn event(&self) -> Option<(u32, i32)> {
        self.event
    }

    /// Same error, reported by rdma_cm event `kind` with `status`
    pub fn with_event(mut self, kind: u32, status: i32) -> Error {
        self.event = Some((kind, status));
        self
    }

    /// Same error with another reason
    pub fn with_reason(mut self, reason: Reason) -> Error {
        self.reason = reason;
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} (errno {}, {})",
            self.op,
            io::Error::from_raw_os_error(self.errno),
            self.errno,
            self.reason.as_str()
        )
    }
}

impl std::error::Error for Error {}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        io::Error::from_raw_os_error(e.errno)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_maps_to_reasons() {
        assert_eq!(Reason::from_errno(libc::ENODEV), Reason::NoRdma);
        assert_eq!(Reason::from_errno(libc::ECONNREFUSED), Reason::Rejected);
        assert_eq!(Reason::from_errno(libc::ETIMEDOUT), Reason::Timeout);
        assert_eq!(Reason::from_errno(libc::ENOMEM), Reason::Resources);
        assert_eq!(Reason::from_errno(libc::EHOSTUNREACH), Reason::Unreachable);
        assert_eq!(Reason::from_errno(libc::EPROTO), Reason::BadHandshake);
    }

    #[test]
    fn negative_return_is_an_errno() {
        let e = Error::from_ret("x", -libc::ETIMEDOUT);
        assert_eq!(e.errno(), libc::ETIMEDOUT);
        assert_eq!(e.reason(), Reason::Timeout);
        assert_eq!(io::Error::from(e).raw_os_error(), Some(libc::ETIMEDOUT));
        assert!(e.to_string().starts_with("x: "));
    }
}
