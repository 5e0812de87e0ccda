//! How long a waiter polls the completion queue before it sleeps, and spinning that long
//! without reading the clock.
//!
//! **Adaptive budget.** A reply that lands while the waiter still polls costs no syscall and
//! no context switch; one that lands after it went to sleep costs a wake-up (in the test bed
//! that is ~300 µs against a ~50 µs busy round trip). But polling for a peer that answers
//! late only burns CPU. So each waiter keeps a [`Budget`], as KVM's halt polling does: a
//! wait that slept but was over within `RSOCK_SPIN_US` grows the budget to cover such waits;
//! one that slept longer halves it. A ping-pong converges to spinning through its round
//! trip; an idle connection to a few µs of polling before each sleep.
//!
//! **Counting passes.** Where the clock is a syscall (the guest uses hpet), reading it
//! while spinning costs more than the spin saves: the profile showed two `clock_gettime`
//! per round trip from the spin loops alone. So a spin counts passes; how many passes make
//! a millisecond is measured by the first spin (reading the clock every eighth pass) and
//! re-measured by every [`RECALIBRATE`]th spin that runs out (two clock reads).

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Passes per millisecond, as last measured (0: not yet).
static PASSES_PER_MS: AtomicU32 = AtomicU32::new(0);
/// Spins since the last measured one.
static SINCE_MEASURED: AtomicU32 = AtomicU32::new(0);
/// Every this many spins, one is measured.
const RECALIBRATE: u32 = 256;
/// The least a budget shrinks to (µs): a reply already on the wire is still caught.
const FLOOR_US: u32 = 4;

/// A waiter's current polling time (µs), adapted between [`FLOOR_US`] and the maximum.
#[derive(Debug)]
pub struct Budget(AtomicU32);

impl Budget {
    /// Starts at `max`: a latency-bound program is fast from its first message.
    pub fn new(max: Duration) -> Budget {
        Budget(AtomicU32::new(us(max)))
    }

    /// A spin for the current budget.
    pub fn spin(&self) -> Spin {
        Spin::new(Duration::from_micros(u64::from(self.0.load(Relaxed))))
    }

    /// The wait ran out of polling and slept for `slept` before it was satisfied: grow the
    /// budget if polling that much longer (with a margin) would have stayed under `max`,
    /// else halve it.
    pub fn slept(&self, slept: Duration, max: Duration) {
        let (cur, max) = (self.0.load(Relaxed), us(max));
        let total = cur.saturating_add(us(slept));
        let next = if total <= max {
            cur.saturating_mul(2)
                .max(total.saturating_add(total / 4))
                .min(max)
        } else {
            (cur / 2).max(FLOOR_US).min(max)
        };
        self.0.store(next, Relaxed);
    }

    #[cfg(test)]
    fn current(&self) -> Duration {
        Duration::from_micros(u64::from(self.0.load(Relaxed)))
    }
}

fn us(d: Duration) -> u32 {
    d.as_micros().min(u128::from(u32::MAX)) as u32
}

/// One spin: call [`Spin::go_on`] after each pass that found nothing.
pub struct Spin {
    passes: u32,
    mode: Mode,
}

enum Mode {
    Off,
    /// Calibrated: passes left; with the start time if this spin is measured.
    Counted {
        left: u32,
        measure: Option<Instant>,
    },
    /// Not calibrated yet: ends at the deadline, then calibrates.
    Timed {
        start: Instant,
        end: Instant,
    },
}

impl Spin {
    pub fn new(d: Duration) -> Spin {
        let per_ms = PASSES_PER_MS.load(Relaxed);
        let mode = if d.is_zero() {
            Mode::Off
        } else if per_ms == 0 {
            let start = Instant::now();
            Mode::Timed {
                start,
                end: start + d,
            }
        } else {
            let want = u128::from(per_ms) * d.as_nanos() / 1_000_000;
            let measure = (SINCE_MEASURED.fetch_add(1, Relaxed) >= RECALIBRATE).then(|| {
                SINCE_MEASURED.store(0, Relaxed);
                Instant::now()
            });
            Mode::Counted {
                left: want.clamp(1, u128::from(u32::MAX)) as u32,
                measure,
            }
        };
        Spin { passes: 0, mode }
    }

    /// After a pass that found nothing: whether to spin on.
    pub fn go_on(&mut self) -> bool {
        self.passes = self.passes.saturating_add(1);
        match &mut self.mode {
            Mode::Off => false,
            Mode::Counted { left, measure } => {
                *left -= 1;
                if *left > 0 {
                    return true;
                }
                if let Some(start) = *measure {
                    calibrate(self.passes, start);
                }
                false
            }
            // The clock can be a syscall: read it every eighth pass.
            Mode::Timed { .. } if self.passes & 7 != 0 => true,
            Mode::Timed { start, end } => {
                if Instant::now() < *end {
                    return true;
                }
                calibrate(self.passes, *start);
                false
            }
        }
    }
}

fn calibrate(passes: u32, start: Instant) {
    let ns = start.elapsed().as_nanos().max(1);
    let per_ms = (u128::from(passes) * 1_000_000 / ns).clamp(1, u128::from(u32::MAX));
    PASSES_PER_MS.store(per_ms as u32, Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_spins_not_at_all() {
        assert!(!Spin::new(Duration::ZERO).go_on());
    }

    #[test]
    fn a_spin_ends_and_calibrates() {
        for _ in 0..3 {
            let t = Instant::now();
            let mut s = Spin::new(Duration::from_micros(200));
            while s.go_on() {
                std::hint::spin_loop();
            }
            // Counted or timed, a spin is bounded (generously: CI machines are noisy).
            assert!(t.elapsed() < Duration::from_secs(2));
        }
        assert!(PASSES_PER_MS.load(Relaxed) > 0);
    }

    #[test]
    fn budget_grows_for_near_misses_and_shrinks_for_long_sleeps() {
        let max = Duration::from_micros(1000);
        let b = Budget::new(max);
        assert_eq!(b.current(), max);
        // An idle connection: every wait sleeps long; polling shrinks to the floor.
        for _ in 0..20 {
            b.slept(Duration::from_millis(50), max);
        }
        assert_eq!(b.current(), Duration::from_micros(u64::from(FLOOR_US)));
        // Replies 60 µs after the poll ran out: the budget grows to cover them...
        b.slept(Duration::from_micros(60), max);
        assert!(b.current() >= Duration::from_micros(64 * 5 / 4));
        // ... and never beyond the maximum.
        for _ in 0..20 {
            b.slept(Duration::from_micros(900), max);
        }
        assert!(b.current() <= max);
        // With polling off, it stays off.
        let off = Budget::new(Duration::ZERO);
        off.slept(Duration::from_micros(1), Duration::ZERO);
        assert_eq!(off.current(), Duration::ZERO);
    }
}
