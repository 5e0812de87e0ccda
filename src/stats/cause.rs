//! What put one connection or listener on its path: the counted [`Fallback`] reason and,
//! where it is known, what exactly — the errno and rdma_cm event of a failed attempt, the
//! rules-file line or `RSOCK_EXCLUDE` entry that decided (smc-tools' `smcss` shows a code per
//! connection for the same need). Packed into two u32s in a stats slot.

use super::Fallback;
use crate::rules::{Action, Decision};
use std::fmt;

/// How a connection came to its path: the reason it is counted with (none for one on RDMA,
/// or on passthrough by a rule) and the detail that says what exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cause {
    /// The fallback reason counted, if any.
    pub reason: Option<Fallback>,
    /// What exactly, where known.
    pub detail: Detail,
}

/// What an rdma_cm event said: its `rdma_cm_event_type` and `status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmCode {
    /// `enum rdma_cm_event_type`.
    pub kind: u32,
    /// `rdma_cm_event.status`: a negative errno, or the reject reason for REJECTED.
    pub status: i32,
}

/// The specific cause behind a [`Cause`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Detail {
    /// Nothing more is known.
    #[default]
    None,
    /// A step failed with `errno` (0: none), reported by `event` if rdma_cm reported it.
    Failed {
        /// The errno of the failed step.
        errno: i32,
        /// The rdma_cm event that said so.
        event: Option<CmCode>,
    },
    /// The rule on this line of the rules file decided.
    Rule(u32),
    /// `RSOCK_RDMA=0` turned RDMA off (after the rule on this line, if one matched).
    RdmaOff(Option<u32>),
    /// This entry of `RSOCK_EXCLUDE` (counted from 1) names the address.
    Exclude(u32),
    /// The process changed its credentials (`setuid` and friends) after its engine started.
    CredentialsChanged,
}

impl Cause {
    /// No reason, no detail: a connection on RDMA by default.
    pub const NONE: Cause = Cause {
        reason: None,
        detail: Detail::None,
    };

    /// `reason` with `detail`.
    pub fn new(reason: Fallback, detail: Detail) -> Cause {
        Cause {
            reason: Some(reason),
            detail,
        }
    }

    /// `reason` with the errno of the step that failed.
    pub fn errno(reason: Fallback, errno: i32) -> Cause {
        Cause::new(reason, Detail::Failed { errno, event: None })
    }
}

impl From<Fallback> for Cause {
    fn from(reason: Fallback) -> Cause {
        Cause::new(reason, Detail::None)
    }
}

// Slot encoding. `detail`: a tag in the top 4 bits, a value in the rest. `event`: 0 for
// none, else the event type + 1 in the low 8 bits and the status as an i16 in the top 16.
const TAG_SHIFT: u32 = 28;
const VALUE: u32 = (1 << TAG_SHIFT) - 1;
const TAG_FAILED: u32 = 1;
const TAG_RULE: u32 = 2;
const TAG_RDMA_OFF: u32 = 3;
const TAG_EXCLUDE: u32 = 4;
const TAG_CREDENTIALS: u32 = 5;

impl Detail {
    /// The two slot words: (`detail`, `event`).
    pub fn encode(self) -> (u32, u32) {
        let tagged = |tag: u32, v: u32| (tag << TAG_SHIFT) | (v & VALUE);
        match self {
            Detail::None => (0, 0),
            Detail::Failed { errno, event } => (
                tagged(TAG_FAILED, errno.clamp(0, 0xffff) as u32),
                event.map_or(0, |e| {
                    (e.kind.min(0xfe) + 1)
                        | ((e.status.clamp(-32768, 32767) as i16 as u16 as u32) << 16)
                }),
            ),
            Detail::Rule(line) => (tagged(TAG_RULE, line), 0),
            Detail::RdmaOff(line) => (tagged(TAG_RDMA_OFF, line.unwrap_or(0)), 0),
            Detail::Exclude(n) => (tagged(TAG_EXCLUDE, n), 0),
            Detail::CredentialsChanged => (tagged(TAG_CREDENTIALS, 0), 0),
        }
    }

    /// The detail from the two slot words; an unknown tag reads as [`Detail::None`].
    pub fn decode(detail: u32, event: u32) -> Detail {
        let v = detail & VALUE;
        match detail >> TAG_SHIFT {
            TAG_FAILED => Detail::Failed {
                errno: v as i32,
                event: (event & 0xff != 0).then(|| CmCode {
                    kind: (event & 0xff) - 1,
                    status: (event >> 16) as u16 as i16 as i32,
                }),
            },
            TAG_RULE => Detail::Rule(v),
            TAG_RDMA_OFF => Detail::RdmaOff((v != 0).then_some(v)),
            TAG_EXCLUDE => Detail::Exclude(v),
            TAG_CREDENTIALS => Detail::CredentialsChanged,
            _ => Detail::None,
        }
    }
}

/// librdmacm's event names (`enum rdma_cm_event_type`, stable ABI), without the
/// `RDMA_CM_EVENT_` prefix.
const EVENTS: [&str; 16] = [
    "ADDR_RESOLVED",
    "ADDR_ERROR",
    "ROUTE_RESOLVED",
    "ROUTE_ERROR",
    "CONNECT_REQUEST",
    "CONNECT_RESPONSE",
    "CONNECT_ERROR",
    "UNREACHABLE",
    "REJECTED",
    "ESTABLISHED",
    "DISCONNECTED",
    "DEVICE_REMOVAL",
    "MULTICAST_JOIN",
    "MULTICAST_ERROR",
    "ADDR_CHANGE",
    "TIMEWAIT_EXIT",
];
const REJECTED: u32 = 8;

impl fmt::Display for CmCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match EVENTS.get(self.kind as usize) {
            Some(name) => write!(f, "rdma_cm {name}")?,
            None => write!(f, "rdma_cm event {}", self.kind)?,
        }
        if self.kind == REJECTED {
            // The IB CM reject reason (IBTA table 112): what a user can act on.
            match self.status {
                8 => f.write_str(" (no RDMA listener: invalid service ID)"),
                28 => f.write_str(" (by the peer's program)"),
                s => write!(f, " (reason {s})"),
            }
        } else if self.status < 0 {
            write!(f, " ({})", crate::sys::errno_name(-self.status))
        } else {
            Ok(())
        }
    }
}

impl fmt::Display for Detail {
    /// Empty for [`Detail::None`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Detail::None => Ok(()),
            Detail::Failed { errno, event } => match (event, errno) {
                (Some(e), 0) => write!(f, "{e}"),
                (Some(e), n) => write!(f, "{e}, {}", crate::sys::errno_name(*n)),
                (None, 0) => Ok(()),
                (None, n) => f.write_str(&crate::sys::errno_name(*n)),
            },
            Detail::Rule(line) => write!(f, "rules file line {line}"),
            Detail::RdmaOff(None) => f.write_str("RSOCK_RDMA=0"),
            Detail::RdmaOff(Some(line)) => write!(f, "RSOCK_RDMA=0 (rules file line {line})"),
            Detail::Exclude(n) => write!(f, "RSOCK_EXCLUDE entry {n}"),
            Detail::CredentialsChanged => f.write_str("the process changed its credentials"),
        }
    }
}

impl fmt::Display for Cause {
    /// `reason: detail`, `reason`, or `detail`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.reason, self.detail) {
            (Some(r), Detail::None) => f.write_str(r.name()),
            (Some(r), d) => write!(f, "{}: {d}", r.name()),
            (None, d) => write!(f, "{d}"),
        }
    }
}

// Here rather than in rules.rs: what a decision counts as is the counters' business.
impl Decision {
    /// What decided, as a connection's cause: counted as `excluded` or `rule` where it keeps
    /// the connection off RDMA, except a passthrough by a rule (told not to try, no fallback).
    pub fn cause(&self) -> Cause {
        if let Some(n) = self.exclude {
            return Cause::new(Fallback::Excluded, Detail::Exclude(n));
        }
        if self.rdma_off {
            return Cause::new(Fallback::Rule, Detail::RdmaOff(self.rule_line));
        }
        let Some(line) = self.rule_line else {
            return Cause::NONE;
        };
        match self.action {
            Action::Tcp => Cause::new(Fallback::Rule, Detail::Rule(line)),
            Action::Rdma | Action::Passthrough => Cause {
                reason: None,
                detail: Detail::Rule(line),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_detail_survives_its_slot_words() {
        let ev = |kind, status| Some(CmCode { kind, status });
        for d in [
            Detail::None,
            Detail::Failed {
                errno: 111,
                event: ev(8, 8),
            },
            Detail::Failed {
                errno: 110,
                event: ev(1, -110),
            },
            Detail::Failed {
                errno: 12,
                event: None,
            },
            Detail::Failed {
                errno: 0,
                event: ev(15, 0),
            },
            Detail::Rule(1),
            Detail::Rule(VALUE),
            Detail::RdmaOff(None),
            Detail::RdmaOff(Some(7)),
            Detail::Exclude(3),
            Detail::CredentialsChanged,
        ] {
            let (a, b) = d.encode();
            assert_eq!(Detail::decode(a, b), d, "{d:?} as {a:#x} {b:#x}");
        }
        assert_eq!(Detail::decode(0xf000_0001, 0), Detail::None, "unknown tag");
    }

    #[test]
    fn reads_as_an_operator_would_say_it() {
        let c = Cause::new(
            Fallback::Rejected,
            Detail::Failed {
                errno: libc::ECONNREFUSED,
                event: Some(CmCode { kind: 8, status: 8 }),
            },
        );
        assert_eq!(
            c.to_string(),
            "rejected: rdma_cm REJECTED (no RDMA listener: invalid service ID), ECONNREFUSED"
        );
        let c = Cause::new(
            Fallback::Unreachable,
            Detail::Failed {
                errno: libc::ETIMEDOUT,
                event: Some(CmCode {
                    kind: 3,
                    status: -libc::ETIMEDOUT,
                }),
            },
        );
        assert_eq!(
            c.to_string(),
            "unreachable: rdma_cm ROUTE_ERROR (ETIMEDOUT), ETIMEDOUT"
        );
        assert_eq!(
            Cause::errno(Fallback::Resources, libc::ENOMEM).to_string(),
            "resources: ENOMEM"
        );
        assert_eq!(
            Cause::new(Fallback::Rule, Detail::Rule(4)).to_string(),
            "rule: rules file line 4"
        );
        assert_eq!(
            Cause::new(Fallback::Excluded, Detail::Exclude(2)).to_string(),
            "excluded: RSOCK_EXCLUDE entry 2"
        );
        assert_eq!(Cause::from(Fallback::NoDevice).to_string(), "no_device");
        assert_eq!(
            Cause {
                reason: None,
                detail: Detail::Rule(9)
            }
            .to_string(),
            "rules file line 9"
        );
        assert_eq!(Cause::NONE.to_string(), "");
    }
}
