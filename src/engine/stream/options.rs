//! The program's socket options a stream honours itself: SO_RCVTIMEO/SO_SNDTIMEO, and
//! keepalive and the user timeout (probes and time-outs, ticked by the engine's helper).

use super::liveness::{self, Action};
use super::{Port, QueuePair, Stream, PROBE_WR, TIMED};
use crate::proto::Failure;
use crate::sys::sockopt;
use libc::c_int;
use std::sync::atomic::Ordering::*;
use std::time::{Duration, Instant};

impl<P: Port> Stream<P> {
    /// Reads every option the stream mirrors from its options socket (a socket that may
    /// hold the program's settings): SO_RCVTIMEO/SO_SNDTIMEO, keepalive and the user
    /// timeout, and SO_LINGER.
    pub fn load_options(&self) {
        self.load_timeouts();
        self.load_liveness();
        self.load_linger();
    }

    /// The program set option `name` (one the stream mirrors): re-read what it changes.
    pub fn option_set(&self, level: c_int, name: c_int) {
        match (level, name) {
            (libc::SOL_SOCKET, libc::SO_RCVTIMEO | libc::SO_SNDTIMEO) => self.load_timeouts(),
            (libc::SOL_SOCKET, libc::SO_LINGER) => self.load_linger(),
            _ => self.load_liveness(),
        }
    }

    fn load_liveness(&self) {
        let live = read_liveness(self.opts_fd);
        log::debug!("rdma stream {}: liveness {live:?}", self.peer);
        self.with(|inner| inner.live = live);
        if live.any() != self.timed.swap(live.any(), AcqRel) {
            if live.any() {
                TIMED.fetch_add(1, AcqRel);
            } else {
                TIMED.fetch_sub(1, AcqRel);
            }
        }
    }

    fn load_linger(&self) {
        self.linger_zero.store(linger_zero(self.opts_fd), Relaxed);
    }

    /// Whether closing the stream resets it (`SO_LINGER` on with a zero timeout). Read from
    /// the options socket once another process may have set it there (a fork child's
    /// setsockopt reaches the shared socket, not this process's copy of the stream).
    pub fn resets_on_close(&self) -> bool {
        if self.shared.load(Acquire) {
            linger_zero(self.opts_fd)
        } else {
            self.linger_zero.load(Relaxed)
        }
    }

    /// An accepted stream takes the listener's keepalive and user timeout, as a socket
    /// accepted by the kernel does (two reads when the listener set neither).
    pub fn inherit_options(&self, listener_fd: c_int) {
        let get = |level, name| sockopt_int(listener_fd, level, name);
        if get(libc::SOL_SOCKET, libc::SO_KEEPALIVE) == 0
            && get(libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT) == 0
        {
            return;
        }
        for (level, name) in LIVENESS_OPTIONS {
            let v = get(level, name) as c_int;
            // SAFETY: an int option from a valid buffer.
            unsafe {
                crate::sys::real::setsockopt(
                    self.opts_fd,
                    level,
                    name,
                    (&v as *const c_int).cast(),
                    std::mem::size_of::<c_int>() as libc::socklen_t,
                )
            };
        }
        self.load_liveness();
    }

    /// Helper, a few times a second while [`TIMED`]: keepalive probes and timeouts.
    pub(in crate::engine) fn tick(&self, now: Instant) {
        if !self.timed.load(Acquire) {
            return;
        }
        self.with(|inner| {
            let c = inner.proto.counters();
            let Some(rc) = inner
                .rc
                .as_mut()
                .filter(|_| inner.proto.failure().is_none())
            else {
                return;
            };
            // Written and not known acknowledged — posted, or queued for want of credits (a
            // peer that stopped reading, as TCP's zero window): both await the peer.
            let in_flight = c.tx_queued > c.tx_acked.max(inner.confirmed);
            match inner.timers.decide(&inner.live, now, in_flight) {
                Action::Wait => {}
                Action::Probe => {
                    log::trace!("rdma stream {}: probe (in flight: {in_flight})", self.peer);
                    inner.probe_covers = c.tx_posted;
                    let (addr, rkey) = inner.proto.peer_ring();
                    let remote = crate::rdma::RemoteBuf { addr, rkey, len: 0 };
                    if let Err(e) = rc.post_probe(PROBE_WR, &remote) {
                        log::info!("rdma stream {}: keepalive probe: {e}", self.peer);
                        inner.timers.probe_done();
                    }
                }
                Action::TimedOut => {
                    log::info!(
                        "rdma stream {} -> {}: peer silent past keepalive/user timeout: ETIMEDOUT",
                        self.local,
                        self.peer
                    );
                    inner.proto.handle_failure(Failure::TimedOut);
                    self.show(inner);
                }
            }
        });
    }

    fn load_timeouts(&self) {
        for (i, name) in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO]
            .into_iter()
            .enumerate()
        {
            let zero = libc::timeval {
                tv_sec: 0,
                tv_usec: 0,
            };
            let us = sockopt::get(self.opts_fd, libc::SOL_SOCKET, name, zero).map_or(0, |tv| {
                tv.tv_sec.max(0) as u64 * 1_000_000 + tv.tv_usec.max(0) as u64
            });
            self.timeouts_us[i].store(us, Relaxed);
        }
    }

    /// SO_RCVTIMEO, if set.
    pub fn rcv_timeout(&self) -> Option<Duration> {
        Some(self.timeouts_us[0].load(Relaxed))
            .filter(|&u| u > 0)
            .map(Duration::from_micros)
    }

    /// SO_SNDTIMEO, if set.
    pub fn snd_timeout(&self) -> Option<Duration> {
        Some(self.timeouts_us[1].load(Relaxed))
            .filter(|&u| u > 0)
            .map(Duration::from_micros)
    }
}

/// The options [`liveness`] follows, in the order of [`liveness::Settings`]'s fields.
const LIVENESS_OPTIONS: [(c_int, c_int); 5] = [
    (libc::SOL_SOCKET, libc::SO_KEEPALIVE),
    (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE),
    (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL),
    (libc::IPPROTO_TCP, libc::TCP_KEEPCNT),
    (libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT),
];

/// Whether socket `fd` has `SO_LINGER` on with a zero timeout.
fn linger_zero(fd: c_int) -> bool {
    let off = libc::linger {
        l_onoff: 0,
        l_linger: 0,
    };
    sockopt::get(fd, libc::SOL_SOCKET, libc::SO_LINGER, off)
        .is_some_and(|l| l.l_onoff != 0 && l.l_linger == 0)
}

/// An int socket option of a kernel socket (0 if it cannot be read).
fn sockopt_int(fd: c_int, level: c_int, name: c_int) -> u32 {
    sockopt::get(fd, level, name, 0 as c_int).map_or(0, |v| v.max(0) as u32)
}

/// Keepalive and user timeout of a kernel socket (its effective values: the system's
/// defaults where the program set none).
fn read_liveness(fd: c_int) -> liveness::Settings {
    let [keepalive, idle, intvl, cnt, user_ms] =
        LIVENESS_OPTIONS.map(|(level, name)| sockopt_int(fd, level, name));
    let secs = |n: u32| Duration::from_secs(u64::from(n));
    liveness::Settings {
        keepalive: keepalive != 0,
        idle: secs(idle),
        intvl: secs(intvl),
        cnt,
        user_timeout: Duration::from_millis(u64::from(user_ms)),
    }
}
