//! A stream's life in the process whose engine made it: one state, moved on only by
//! [`Lifecycle::apply`], which logs every transition. It answers "why is this stream still
//! here?": the program holds it; or other processes do; or it is being handed over; or it
//! is closing (delivering what is queued, then draining its QP); or it was handed over and
//! only its old QP drains. The engine's helper tends every stream the program does not plainly
//! hold, by this state (`engine/tend.rs`), until it frees it.
//!
//! One atomic, so that the helper, the program's threads and a fork child's copy read it
//! without the stream's lock.

use std::sync::atomic::{AtomicU8, Ordering::*};

/// Where a stream's connection is, as this process sees it. Besides it, a [`Life`] says
/// whether this process's program still holds an fd of the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// Served here. Held by the program, or by other processes or relay ends (held
    /// elsewhere); once nobody holds it, it closes.
    Open = 0,
    /// Being handed over to another process: MIGRATE went out, and the taker has until a
    /// deadline (the stream keeps it) to ask for the state.
    Moving = 1,
    /// Nobody holds it: closed (or reset, for `SO_LINGER` 0), lingering to deliver what is
    /// queued; the helper then drains and frees its QP.
    Closing = 2,
    /// Handed over: another process serves it; here only the old QP drains. The program's
    /// fds here, if any, answer from the options fd until its last close.
    Moved = 3,
}

/// A stream's state: its [`Phase`], and whether this process's program holds an fd of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Life {
    pub phase: Phase,
    /// This process's program holds an fd of it (cleared once, by [`Event::LetGo`]).
    pub program: bool,
}

/// What happens to a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// The program lets go: its last fd closed, or the stream is given to another process
    /// without ever being the program's. In a stream handed over, the program's last fd of
    /// it closed.
    LetGo,
    /// No process holds it any more: it closes.
    Close,
    /// MIGRATE went out to hand it to another process.
    StartMove,
    /// The taker never asked for the state in time: the stream (reset by then) is served
    /// here again, until it is closed.
    MoveExpired,
    /// Exported to a taker: its old QP only drains from now on.
    Move,
}

impl Phase {
    const ALL: [Phase; 4] = [Phase::Open, Phase::Moving, Phase::Closing, Phase::Moved];
}

/// The program bit of the packed state.
const PROGRAM: u8 = 0x80;

impl Life {
    /// A new stream: open, held by the program (one handed elsewhere lets go at once).
    pub const NEW: Life = Life {
        phase: Phase::Open,
        program: true,
    };

    /// The state `ev` leads to from `self`, or `None` where it does not apply (the event
    /// came late, or twice: it changes nothing).
    pub fn after(self, ev: Event) -> Option<Life> {
        use {Event::*, Phase::*};
        let to = |phase| Some(Life { phase, ..self });
        match (self.phase, ev) {
            (_, LetGo) if self.program => Some(Life {
                program: false,
                ..self
            }),
            (Open | Moving, Close) => to(Closing),
            (Open, StartMove) => to(Moving),
            (Moving, MoveExpired) => to(Open),
            // From Closing: a close the program asked for while the move was being
            // answered; the stream is the taker's. From Open: an export the engine answered
            // without a move started first (it refuses none that proves the caller).
            (Open | Moving | Closing, Move) => to(Moved),
            _ => None,
        }
    }

    /// Closing or handed over: it answers no request and serves no program call any more.
    pub fn released(self) -> bool {
        matches!(self.phase, Phase::Closing | Phase::Moved)
    }

    /// Handed over to another process.
    pub fn moved(self) -> bool {
        self.phase == Phase::Moved
    }

    /// Not the program's, yet still served here: other processes or relay ends hold it.
    pub fn held_elsewhere(self) -> bool {
        !self.program && matches!(self.phase, Phase::Open | Phase::Moving)
    }

    fn pack(self) -> u8 {
        self.phase as u8 | if self.program { PROGRAM } else { 0 }
    }

    fn unpack(v: u8) -> Life {
        Life {
            phase: Phase::ALL[usize::from(v & !PROGRAM) % Phase::ALL.len()],
            program: v & PROGRAM != 0,
        }
    }
}

/// A stream's [`Life`], shared by every thread that looks at it.
pub struct Lifecycle(AtomicU8);

impl Lifecycle {
    pub fn new() -> Lifecycle {
        Lifecycle(AtomicU8::new(Life::NEW.pack()))
    }

    /// Where the stream is now.
    pub fn get(&self) -> Life {
        Life::unpack(self.0.load(Acquire))
    }

    /// Moves the stream on by `ev`: `Some((from, to))` if it changed (logged, at trace
    /// level, for stream `token`), `None` if `ev` does not apply where it is.
    pub fn apply(&self, ev: Event, token: u64) -> Option<(Life, Life)> {
        let mut now = self.get();
        loop {
            let next = now.after(ev)?;
            match self
                .0
                .compare_exchange(now.pack(), next.pack(), AcqRel, Acquire)
            {
                Ok(_) => {
                    log::trace!("rdma stream {token:x}: {now:?} -> {next:?} ({ev:?})");
                    return Some((now, next));
                }
                Err(v) => now = Life::unpack(v),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVENTS: [Event; 5] = [
        Event::LetGo,
        Event::Close,
        Event::StartMove,
        Event::MoveExpired,
        Event::Move,
    ];

    fn all() -> impl Iterator<Item = Life> {
        Phase::ALL.into_iter().flat_map(|phase| {
            [true, false]
                .into_iter()
                .map(move |program| Life { phase, program })
        })
    }

    #[test]
    fn every_state_and_event() {
        use {Event::*, Phase::*};
        for l in all() {
            for e in EVENTS {
                let phase = match (l.phase, e) {
                    (p, LetGo) => l.program.then_some(p),
                    (Open, Close) | (Moving, Close) => Some(Closing),
                    (Open, StartMove) => Some(Moving),
                    (Moving, MoveExpired) => Some(Open),
                    (Open, Move) | (Moving, Move) | (Closing, Move) => Some(Moved),
                    _ => None,
                };
                let want = phase.map(|phase| Life {
                    phase,
                    program: l.program && e != LetGo,
                });
                assert_eq!(l.after(e), want, "{l:?} on {e:?}");
            }
        }
    }

    #[test]
    fn only_an_expired_move_goes_back() {
        // Every other transition goes forward in the phases' order, and the program, once
        // gone, never comes back.
        for l in all() {
            for e in EVENTS {
                if let Some(n) = l.after(e) {
                    assert!(!n.program || l.program, "{l:?} -> {n:?}");
                    if e != Event::MoveExpired {
                        assert!(n.phase as u8 >= l.phase as u8, "{l:?} -> {n:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_predicates_agree_with_the_states() {
        for l in all() {
            let served = matches!(l.phase, Phase::Open | Phase::Moving);
            assert_eq!(l.released(), !served, "{l:?}");
            assert_eq!(l.held_elsewhere(), served && !l.program, "{l:?}");
            assert!(!l.moved() || l.released(), "{l:?}");
            assert_eq!(Life::unpack(l.pack()), l);
        }
    }

    #[test]
    fn apply_changes_once() {
        let c = Lifecycle::new();
        let unheld = Life {
            phase: Phase::Open,
            program: false,
        };
        assert_eq!(c.apply(Event::LetGo, 1), Some((Life::NEW, unheld)));
        assert_eq!(c.apply(Event::LetGo, 1), None, "twice changes nothing");
        let closing = Life {
            phase: Phase::Closing,
            ..unheld
        };
        assert_eq!(c.apply(Event::Close, 1), Some((unheld, closing)));
        assert_eq!(c.apply(Event::Close, 1), None, "the close runs once");
        assert_eq!(c.get(), closing);
    }

    #[test]
    fn a_move_that_expires_is_served_here_again() {
        let c = Lifecycle::new();
        c.apply(Event::StartMove, 1).unwrap();
        assert_eq!(c.apply(Event::StartMove, 1), None, "one move at a time");
        c.apply(Event::MoveExpired, 1).unwrap();
        assert_eq!(c.get(), Life::NEW);
        c.apply(Event::StartMove, 1).unwrap();
        c.apply(Event::Move, 1).unwrap();
        assert_eq!(c.apply(Event::MoveExpired, 1), None, "too late: it went");
        c.apply(Event::LetGo, 1).unwrap();
        assert_eq!(c.get().phase, Phase::Moved);
        assert!(!c.get().program);
    }

    #[test]
    fn racing_closes_close_once() {
        let c = std::sync::Arc::new(Lifecycle::new());
        let wins: usize = (0..8)
            .map(|_| {
                let c = c.clone();
                std::thread::spawn(move || c.apply(Event::Close, 7).is_some() as usize)
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap_or(0))
            .sum();
        assert_eq!(wins, 1);
        assert_eq!(c.get().phase, Phase::Closing);
    }
}
