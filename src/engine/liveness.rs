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
    /// Since when written data has awaited acknowledgement (seen by a tick).
    pending_since: Option<Instant>,
    unanswered: u32,
    probe_outstanding: bool,
}

impl Timers {
    /// Clocks of a stream that was just established.
    pub fn new(now: Instant) -> Timers {
        Timers {
            last_heard: now,
            pending_since: None,
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

    /// Decides at `now`; `in_flight` says whether written data may await acknowledgement
    /// or credits (unsignaled writes leave the driver unsure: a probe's completion settles
    /// it, and keeps telling, while the peer cannot take more, that it is alive).
    /// Probes are due at idle, idle + intvl, …; after `cnt` unanswered ones, one more
    /// interval ends the connection — unless a user timeout is set, which then decides
    /// alone (as on Linux), counting from when data was last acknowledged or first seen
    /// waiting.
    pub fn decide(&mut self, s: &Settings, now: Instant, in_flight: bool) -> Action {
        let pending = if in_flight {
            Some(*self.pending_since.get_or_insert(now))
        } else {
            self.pending_since = None;
            None
        };
        let silent = now.saturating_duration_since(self.last_heard);
        if !s.user_timeout.is_zero() {
            let waited = match pending {
                Some(p) => now.saturating_duration_since(p.max(self.last_heard)),
                None if self.unanswered > 0 => silent,
                None => Duration::ZERO,
            };
            if waited >= s.user_timeout {
                return Action::TimedOut;
            }
        }
        if in_flight {
            // The queue pair notices a dead peer by itself (retries exhausted); a probe
            // behind the data tells when it was all acknowledged.
            if self.probe_outstanding {
                return Action::Wait;
            }
            self.probe_outstanding = true;
            return Action::Probe;
        }
        if !s.keepalive {
            return Action::Wait;
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
    fn data_in_flight_gets_one_settling_probe_and_no_keepalive_count() {
        let t0 = Instant::now();
        let s = ka(1, 1, 1);
        let mut t = Timers::new(t0);
        assert_eq!(t.decide(&s, at(t0, 60_000), true), Action::Probe);
        assert_eq!(
            t.decide(&s, at(t0, 61_000), true),
            Action::Wait,
            "one at a time"
        );
        assert_eq!(
            t.decide(&s, at(t0, 90_000), true),
            Action::Wait,
            "the QP's own retries decide"
        );
        t.probe_done();
        t.heard(at(t0, 90_010));
        assert_eq!(t.decide(&s, at(t0, 90_020), false), Action::Wait);
        let off = Settings::default();
        assert!(!off.any());
        assert_eq!(
            Timers::new(t0).decide(&off, at(t0, 60_000), false),
            Action::Wait
        );
    }

    #[test]
    fn user_timeout_counts_from_when_data_was_first_seen_waiting() {
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
        // Data waits from 10 s on (the last answer was at 0 s): the clock starts at 10 s.
        assert_eq!(t.decide(&ut, at(t0, 10_000), true), Action::Probe);
        assert_eq!(t.decide(&ut, at(t0, 11_499), true), Action::Wait);
        assert_eq!(t.decide(&ut, at(t0, 11_500), true), Action::TimedOut);
        // An answer meanwhile moves it.
        let mut t = Timers::new(t0);
        assert_eq!(t.decide(&ut, at(t0, 10_000), true), Action::Probe);
        t.heard(at(t0, 11_000));
        assert_eq!(t.decide(&ut, at(t0, 12_000), true), Action::Wait);
        assert_eq!(t.decide(&ut, at(t0, 12_500), true), Action::TimedOut);
    }

    #[test]
    fn user_timeout_overrides_keepcnt() {
        let t0 = Instant::now();
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
