//! Dead-peer detection for RDMA streams: `SO_KEEPALIVE` (with `TCP_KEEPIDLE`,
//! `TCP_KEEPINTVL`, `TCP_KEEPCNT`) and `TCP_USER_TIMEOUT`, as Linux TCP applies them.
//!
//! An RC queue pair retransmits what it sent, so a peer host that vanishes is noticed only
//! by a side with something in flight; an idle reader would wait forever. Keepalive probes
//! are zero-length RDMA WRITEs: the peer's NIC acknowledges them without its program or
//! protocol seeing anything, so they need no wire-protocol message. Hearing from the peer —
//! any successful completion, a receive or the acknowledgement of a write — restarts the
//! clocks. This module is the pure decision; the stream posts the probe or fails.

use std::time::{Duration, Instant};

/// What the program asked for (read from its socket options).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    /// `SO_KEEPALIVE`
    pub keepalive: bool,
    /// `TCP_KEEPIDLE`: silence before the first probe
    pub idle: Duration,
    /// `TCP_KEEPINTVL`: between probes
    pub intvl: Duration,
    /// `TCP_KEEPCNT`: unanswered probes before the connection is dropped
    pub cnt: u32,
    /// `TCP_USER_TIMEOUT` (0: none): how long sent data (or probes) may stay unacknowledged
    pub user_timeout: Duration,
}

impl Settings {
    /// Whether any clock runs at all.
    pub fn any(&self) -> bool {
        self.keepalive || !self.user_timeout.is_zero()
    }
}

/// What the stream should do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing yet.
    Wait,
    /// Post one keepalive probe.
    Probe,
    /// The peer is gone: fail the stream with `ETIMEDOUT`.
    TimedOut,
}

/// A stream's clocks.
#[derive(Clone, Copy, Debug)]
pub struct Timers {
    last_heard: Instant,
    unanswered: u32,
    probe_outstanding: bool,
}

impl Timers {
    /// Clocks of a stream that was just established.
    pub fn new(now: Instant) -> Timers {
        Timers {
            last_heard: now,
            unanswered: 0,
            probe_outstanding: false,
        }
    }

    /// A completion came from the peer's side: it is alive.
    pub fn heard(&mut self, now: Instant) {
        self.last_heard = now;
        self.unanswered = 0;
    }

    /// The probe completed (successfully: [`heard`](Self::heard) is called too).
    pub fn probe_done(&mut self) {
        self.probe_outstanding = false;
    }

    /// Decides at `now`; `in_flight` says whether written data awaits acknowledgement.
    /// Probes are due at idle, idle + intvl, …; after `cnt` unanswered ones, one more
    /// interval ends the connection — unless a user timeout is set, which then decides
    /// alone (as on Linux).
    pub fn decide(&mut self, s: &Settings, now: Instant, in_flight: bool) -> Action {
        let silent = now.saturating_duration_since(self.last_heard);
        if !s.user_timeout.is_zero()
            && (in_flight || self.unanswered > 0)
            && silent >= s.user_timeout
        {
            return Action::TimedOut;
        }
        if !s.keepalive || in_flight {
            return Action::Wait; // a queue pair with data in flight notices by itself
        }
        if silent < s.idle + s.intvl * self.unanswered {
            return Action::Wait;
        }
        if self.unanswered >= s.cnt.max(1) {
            return if s.user_timeout.is_zero() {
                Action::TimedOut
            } else {
                Action::Wait
            };
        }
        self.unanswered += 1;
        if self.probe_outstanding {
            return Action::Wait; // the NIC is still retrying the last one
        }
        self.probe_outstanding = true;
        Action::Probe
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ka(idle: u64, intvl: u64, cnt: u32) -> Settings {
        Settings {
            keepalive: true,
            idle: Duration::from_secs(idle),
            intvl: Duration::from_secs(intvl),
            cnt,
            user_timeout: Duration::ZERO,
        }
    }

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn silent_peer_is_probed_cnt_times_then_dropped() {
        let t0 = Instant::now();
        let s = ka(2, 1, 3);
        let mut t = Timers::new(t0);
        assert_eq!(t.decide(&s, at(t0, 1999), false), Action::Wait);
        assert_eq!(t.decide(&s, at(t0, 2000), false), Action::Probe);
        // The probe hangs (the NIC retries): later probes are counted, not posted.
        assert_eq!(t.decide(&s, at(t0, 2500), false), Action::Wait);
        assert_eq!(t.decide(&s, at(t0, 3000), false), Action::Wait);
        assert_eq!(t.decide(&s, at(t0, 4000), false), Action::Wait);
        assert_eq!(t.decide(&s, at(t0, 4999), false), Action::Wait);
        assert_eq!(t.decide(&s, at(t0, 5000), false), Action::TimedOut);
    }

    #[test]
    fn an_answer_restarts_the_idle_clock() {
        let t0 = Instant::now();
        let s = ka(2, 1, 3);
        let mut t = Timers::new(t0);
        assert_eq!(t.decide(&s, at(t0, 2000), false), Action::Probe);
        t.probe_done();
        t.heard(at(t0, 2010));
        assert_eq!(t.decide(&s, at(t0, 4000), false), Action::Wait);
        assert_eq!(t.decide(&s, at(t0, 4010), false), Action::Probe);
    }

    #[test]
    fn no_keepalive_while_data_is_in_flight_or_when_off() {
        let t0 = Instant::now();
        let mut t = Timers::new(t0);
        assert_eq!(t.decide(&ka(1, 1, 1), at(t0, 60_000), true), Action::Wait);
        let off = Settings::default();
        assert!(!off.any());
        assert_eq!(t.decide(&off, at(t0, 60_000), false), Action::Wait);
    }

    #[test]
    fn user_timeout_ends_unacknowledged_data_and_overrides_keepcnt() {
        let t0 = Instant::now();
        let ut = Settings {
            user_timeout: Duration::from_millis(1500),
            ..Settings::default()
        };
        let mut t = Timers::new(t0);
        assert_eq!(
            t.decide(&ut, at(t0, 10_000), false),
            Action::Wait,
            "idle is fine"
        );
        t.heard(at(t0, 10_000));
        assert_eq!(t.decide(&ut, at(t0, 11_499), true), Action::Wait);
        assert_eq!(t.decide(&ut, at(t0, 11_500), true), Action::TimedOut);

        let both = Settings {
            user_timeout: Duration::from_secs(10),
            ..ka(1, 1, 1)
        };
        let mut t = Timers::new(t0);
        assert_eq!(t.decide(&both, at(t0, 1000), false), Action::Probe);
        assert_eq!(
            t.decide(&both, at(t0, 2000), false),
            Action::Wait,
            "cnt is overridden"
        );
        assert_eq!(t.decide(&both, at(t0, 10_000), false), Action::TimedOut);
    }
}
