//! The time each step of a long operation took — a connection's setup, an engine's making,
//! a take-over — written to the debug log as "… in N us: step N us …".

use std::sync::atomic::{AtomicI64, Ordering::Relaxed};
use std::time::Instant;

/// The time each step took, for the debug log (nothing is measured while debug logging is
/// off).
pub(in crate::engine) struct Steps(Option<(Instant, Instant, String)>);

impl Steps {
    pub(in crate::engine) fn start() -> Steps {
        Steps(log::log_enabled!(log::Level::Debug).then(|| {
            let t = Instant::now();
            (t, t, String::new())
        }))
    }

    /// `step` ended now.
    pub(in crate::engine) fn mark(&mut self, step: &str) {
        if let Some((_, last, out)) = &mut self.0 {
            let now = Instant::now();
            let _ = std::fmt::Write::write_fmt(
                out,
                format_args!(" {step} {}us", (now - *last).as_micros()),
            );
            *last = now;
        }
    }

    pub(in crate::engine) fn log(&self, what: std::fmt::Arguments<'_>) {
        if let Some((t0, _, out)) = &self.0 {
            log::debug!("{what} in {}us:{out}", t0.elapsed().as_micros());
        }
    }
}

/// When this process was forked (`CLOCK_MONOTONIC` µs; 0: not a fork child), for the
/// take-over's debug log: the time from the fork to a stream's hand-over is what a forking
/// server's connection pays.
static FORKED_AT_US: AtomicI64 = AtomicI64::new(0);

/// Microseconds since this process was forked, if it is a fork child.
pub(in crate::engine) fn us_since_fork() -> Option<i64> {
    let at = FORKED_AT_US.load(Relaxed);
    (at != 0).then(|| crate::sys::poll::monotonic_us() - at)
}

/// In a fork child (the fork handler): remembers when.
pub(in crate::engine) fn forked_now() {
    FORKED_AT_US.store(crate::sys::poll::monotonic_us(), Relaxed);
}
