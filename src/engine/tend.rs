//! The streams the helper tends: every one the program does not plainly hold — held only by
//! other processes or relay ends, being handed over, closing, or handed over and draining —
//! kept in one set and visited by their state (stream/life.rs) on each pass of the helper,
//! until their QP and memory are freed.

use super::stream::{Event, Life, Phase};
use super::{lock, Engine, Stream};
use std::sync::Arc;
use std::time::Instant;

/// A stream's key in the set: its address (a taker that gives a stream back makes a new
/// stream with the same token while the old one may still drain).
fn key(s: &Arc<Stream>) -> usize {
    Arc::as_ptr(s) as usize
}

impl Engine {
    /// `s` needs the helper from now on (see the module doc); once is enough.
    pub(super) fn tend(&'static self, s: &Arc<Stream>) {
        lock(&self.tended).insert(key(s), s.clone());
        self.ensure_helper();
    }

    /// A stream closed (or reset) that nobody holds any more: the helper finishes and frees
    /// it.
    pub fn retire(&'static self, s: Arc<Stream>) {
        s.advance(Event::LetGo);
        s.advance(Event::Close);
        self.tend(&s);
        self.wake();
    }

    /// Helper: one visit of every tended stream, by its state. True while some stream
    /// closes or drains (the helper comes back sooner then).
    pub(super) fn tend_streams(&'static self) -> bool {
        let list: Vec<Arc<Stream>> = lock(&self.tended).values().cloned().collect();
        if list.is_empty() {
            return false; // no clock read (a syscall where the clock has no vDSO path)
        }
        let draining = list.iter().any(|s| s.life().released());
        if draining {
            self.progress_devices(true); // completions the drains wait for
        }
        let now = Instant::now();
        for s in list {
            if s.life().phase == Phase::Moving {
                s.expire_move(now);
            }
            match visit(s.life(), || s.held()) {
                Visit::Keep => {}
                Visit::Close => self.close_unheld(&s), // the last holder went
                Visit::Untend => self.untend(&s),
                Visit::Reap => {
                    if s.reap_step(self.linger(), now) {
                        self.unregister(&s);
                        s.destroy();
                        self.untend(&s);
                        log::debug!("rdma stream {} -> {} closed and freed", s.local, s.peer);
                    }
                }
            }
        }
        draining
    }

    /// Frees `s` now if the helper would at its next pass: a link stream whose id the
    /// peer's CLOSE just freed (its slots then go back at once, not after the helper's next
    /// look: a churning link ran out of slots held by streams awaiting their reaping).
    pub(super) fn reap_now(&'static self, s: &Arc<Stream>) {
        if !lock(&self.tended).contains_key(&key(s)) || visit(s.life(), || true) != Visit::Reap {
            return;
        }
        if s.reap_step(self.linger(), Instant::now()) {
            self.unregister(s);
            s.destroy();
            self.untend(s);
            log::debug!("rdma stream {} -> {} closed and freed", s.local, s.peer);
        }
    }

    fn untend(&self, s: &Arc<Stream>) {
        lock(&self.tended).remove(&key(s));
    }
}

/// What the helper does with a tended stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Visit {
    /// Nothing yet: held elsewhere, or moving.
    Keep,
    /// Nobody holds it any more: close it.
    Close,
    /// The program's again (a move that expired): not the helper's to tend.
    Untend,
    /// Closing or moved away: advance its teardown, free it once done.
    Reap,
}

/// The helper's decision for a stream in state `life`; `held`: whether any process or
/// relay end still holds it (asked only where it matters: it takes the stream's lock).
fn visit(life: Life, held: impl FnOnce() -> bool) -> Visit {
    match life.phase {
        Phase::Closing | Phase::Moved => Visit::Reap,
        Phase::Open | Phase::Moving if life.program => match life.phase {
            Phase::Open => Visit::Untend,
            _ => Visit::Keep, // until the taker asks, or its deadline
        },
        Phase::Open | Phase::Moving => match held() {
            true => Visit::Keep,
            false => Visit::Close,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_is_visited_as_its_life_says() {
        use Phase::*;
        for phase in [Open, Moving, Closing, Moved] {
            for program in [true, false] {
                for held in [true, false] {
                    let life = Life { phase, program };
                    let want = match (phase, program, held) {
                        (Closing | Moved, _, _) => Visit::Reap,
                        (Open, true, _) => Visit::Untend,
                        (Moving, true, _) | (_, false, true) => Visit::Keep,
                        (_, false, false) => Visit::Close,
                    };
                    assert_eq!(visit(life, || held), want, "{life:?}, held {held}");
                }
            }
        }
    }

    #[test]
    fn holders_are_asked_only_of_streams_held_elsewhere() {
        for phase in [Phase::Open, Phase::Moving, Phase::Closing, Phase::Moved] {
            for program in [true, false] {
                let life = Life { phase, program };
                let mut asked = false;
                visit(life, || {
                    asked = true;
                    true
                });
                assert_eq!(asked, life.held_elsewhere(), "{life:?}");
            }
        }
    }
}
