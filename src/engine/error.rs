//! The engine's one error: which step failed and why. It is told in the log as "step: why"
//! (or just "why"), and says what it means for the program (an errno) and for the counters (a
//! fallback [`Cause`]); docs/DESIGN.md, "Errors".

use super::handover_state::BadState;
use crate::proto::{HelloError, MigrateError};
use crate::rdma;
use crate::stats::{Cause, Fallback};
use libc::c_int;
use std::borrow::Cow;
use std::{fmt, io};

/// See the module doc.
pub struct Error {
    /// The step that failed ("listen", "export", ...), if the cause does not say it.
    step: Option<&'static str>,
    why: Why,
}

/// Why a step failed.
#[derive(Debug)]
pub enum Why {
    /// An RDMA-layer call failed.
    Rdma(rdma::Error),
    /// rdma_cm answered with this event (its name) instead of the one expected.
    Event(&'static str, rdma::Error),
    /// A system call failed, or another process answered with this errno.
    Errno(c_int),
    /// A system call failed, as the standard library tells it.
    Io(io::Error),
    /// The hand-over state another process passed is malformed.
    State(BadState),
    /// The protocol refused a hand-over step.
    Migrate(MigrateError),
    /// A peer's hello is unusable.
    Hello(HelloError),
    /// Another party answered what makes no sense here.
    Protocol(Cow<'static, str>),
    /// Another party did not do its part in time.
    Timeout(&'static str),
    /// Not possible in this process (configuration, no engine, ...): nothing was tried.
    Unavailable(&'static str),
    /// What the step needed is gone (a stream closed meanwhile).
    Gone(&'static str),
}

impl Error {
    pub fn new(step: Option<&'static str>, why: impl Into<Why>) -> Error {
        Error {
            step,
            why: why.into(),
        }
    }

    /// For `map_err`: the error `e` at `step`.
    pub fn at<E: Into<Why>>(step: &'static str) -> impl FnOnce(E) -> Error {
        move |e| Error::new(Some(step), e)
    }

    pub fn why(&self) -> &Why {
        &self.why
    }

    /// What the program's call would see (always > 0).
    pub fn errno(&self) -> c_int {
        match &self.why {
            Why::Rdma(e) | Why::Event(_, e) => e.errno(),
            Why::Errno(e) => *e,
            Why::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            Why::State(_) | Why::Migrate(_) | Why::Hello(_) | Why::Protocol(_) => libc::EPROTO,
            Why::Timeout(_) => libc::ETIMEDOUT,
            Why::Unavailable(_) => libc::EOPNOTSUPP,
            Why::Gone(_) => libc::ENOTCONN,
        }
    }

    /// The fallback reason a connection this kept off RDMA is counted with, and its detail.
    pub fn cause(&self) -> Cause {
        match &self.why {
            Why::Rdma(e) | Why::Event(_, e) => cause_of(e),
            Why::Errno(_) | Why::Io(_) => cause_of(&rdma::Error::from_errno("", self.errno())),
            Why::State(_) | Why::Migrate(_) | Why::Hello(_) | Why::Protocol(_) => {
                Cause::errno(Fallback::BadHandshake, self.errno())
            }
            Why::Timeout(_) => Cause::errno(Fallback::Timeout, self.errno()),
            Why::Unavailable(_) => Fallback::RdmaUnavailable.into(),
            Why::Gone(_) => Cause::errno(Fallback::Unreachable, self.errno()),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(step) = self.step {
            write!(f, "{step}: ")?;
        }
        match &self.why {
            Why::Rdma(e) => write!(f, "{e}"),
            Why::Event(name, _) => f.write_str(name),
            Why::Errno(e) => write!(f, "{}", io::Error::from_raw_os_error(*e)),
            Why::Io(e) => write!(f, "{e}"),
            Why::State(e) => write!(f, "{e}"),
            Why::Migrate(e) => write!(f, "{e}"),
            Why::Hello(e) => write!(f, "{e}"),
            Why::Protocol(s) => f.write_str(s),
            Why::Timeout(s) | Why::Unavailable(s) | Why::Gone(s) => f.write_str(s),
        }
    }
}

/// As the log line says it (the strings these errors replaced printed so).
impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.to_string())
    }
}

impl std::error::Error for Error {}

impl From<Why> for Error {
    fn from(why: Why) -> Error {
        Error::new(None, why)
    }
}

impl From<rdma::Error> for Why {
    fn from(e: rdma::Error) -> Why {
        Why::Rdma(e)
    }
}

impl From<io::Error> for Why {
    fn from(e: io::Error) -> Why {
        Why::Io(e)
    }
}

impl From<BadState> for Why {
    fn from(e: BadState) -> Why {
        Why::State(e)
    }
}

impl From<MigrateError> for Why {
    fn from(e: MigrateError) -> Why {
        Why::Migrate(e)
    }
}

impl From<HelloError> for Why {
    fn from(e: HelloError) -> Why {
        Why::Hello(e)
    }
}

/// Why an active RDMA attempt failed, in the counters' terms, with its errno and rdma_cm
/// event.
pub(in crate::engine) fn cause_of(e: &rdma::Error) -> Cause {
    let reason = match e.reason() {
        rdma::Reason::NoRdma => Fallback::Unreachable,
        rdma::Reason::Rejected => Fallback::Rejected,
        rdma::Reason::Unreachable => Fallback::Unreachable,
        rdma::Reason::Timeout => Fallback::Timeout,
        rdma::Reason::Resources => Fallback::Resources,
        rdma::Reason::BadHandshake => Fallback::BadHandshake,
        rdma::Reason::Disconnected | rdma::Reason::Other => Fallback::Unreachable,
    };
    let event = e
        .event()
        .map(|(kind, status)| crate::stats::CmCode { kind, status });
    Cause::new(
        reason,
        crate::stats::Detail::Failed {
            errno: e.errno(),
            event,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn told_as_step_then_why() {
        let e = Error::at("export")(Why::Errno(libc::ETIMEDOUT));
        assert_eq!(e.to_string(), "export: Connection timed out (os error 110)");
        assert_eq!(format!("{e:?}"), format!("{:?}", e.to_string()));
        let e = Error::from(Why::Timeout("the old queue pair did not drain"));
        assert_eq!(e.to_string(), "the old queue pair did not drain");
        let e = Error::at("export")(BadState::Short);
        assert_eq!(e.to_string(), "export: short state");
        let r = rdma::Error::from_errno("rdma_listen", libc::EADDRINUSE);
        assert_eq!(Error::new(None, r).to_string(), r.to_string());
        assert_eq!(Error::at("listen")(r).to_string(), format!("listen: {r}"));
    }

    #[test]
    fn maps_to_an_errno_and_a_cause() {
        let r = rdma::Error::from_errno("rdma_resolve_addr", libc::EHOSTUNREACH);
        let e = Error::at("resolve")(r);
        assert_eq!(e.errno(), libc::EHOSTUNREACH);
        assert_eq!(e.cause(), cause_of(&r));
        let e = Error::at("export")(Why::Errno(libc::ENOMEM));
        assert_eq!(e.errno(), libc::ENOMEM);
        assert_eq!(
            e.cause(),
            Cause::new(
                Fallback::Resources,
                crate::stats::Detail::Failed {
                    errno: libc::ENOMEM,
                    event: None
                }
            )
        );
        let e = Error::at("export")(BadState::Missing);
        assert_eq!(e.errno(), libc::EPROTO);
        assert_eq!(e.cause().reason, Some(Fallback::BadHandshake));
        let e = Error::from(Why::Timeout("the peer did not come"));
        assert_eq!(
            (e.errno(), e.cause().reason),
            (libc::ETIMEDOUT, Some(Fallback::Timeout))
        );
        let e = Error::from(Why::Unavailable("RSOCK_TAKEOVER=0"));
        assert_eq!(e.cause().reason, Some(Fallback::RdmaUnavailable));
        let io = io::Error::from_raw_os_error(libc::EMFILE);
        assert_eq!(Error::at("dup")(io).errno(), libc::EMFILE);
    }
}
