//! A stream's life in the process whose engine made it: one state, moved on only by
//! [`Lifecycle::apply`], which logs every transition. It answers "why is this stream still
//! here?": the program holds it; or other processes do; or it is closing (delivering what
//! is queued, then draining its QP); or it was handed over and only its old QP drains.
//!
//! One atomic, so that the helper, the program's threads and a fork child's copy read it
//! without the stream's lock.

use std::sync::atomic::{AtomicU8, Ordering::*};

/// Where a stream is (see the module doc). Transitions go only forward: see [`Life::after`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Life {
    /// This process's program holds an fd of it.
    Open = 0,
    /// The program holds none: it closed its last, or never had one (accepted for another
    /// process, or taken back to be relayed). Other processes, or relay ends, may hold it;
    /// once none does, it closes.
    Unheld = 1,
    /// Nobody holds it: closed (or reset, for `SO_LINGER` 0), lingering to deliver what is
    /// queued; the helper then drains and frees its QP.
    Closing = 2,
    /// Handed over to another process while this process's program still held it: the
    /// program's fds here answer from the options fd until its last close.
    MovedHeld = 3,
    /// Handed over, and this process's program holds nothing of it.
    Moved = 4,
}

/// What happens to a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// The program lets go: its last fd closed, or the stream is given to another process
    /// without ever being the program's.
    LetGo,
    /// No process holds it any more: it closes.
    Close,
    /// Exported to a taker: its old QP only drains from now on.
    Move,
    /// The program's last fd here closed after the stream was handed over.
    LetGoAfterMove,
}

impl Life {
    const ALL: [Life; 5] = [
        Life::Open,
        Life::Unheld,
        Life::Closing,
        Life::MovedHeld,
        Life::Moved,
    ];

    /// The state `ev` leads to from `self`, or `None` where it does not apply (the event
    /// came late, or twice: it changes nothing).
    pub fn after(self, ev: Event) -> Option<Life> {
        use {Event::*, Life::*};
        match (self, ev) {
            (Open, LetGo) => Some(Unheld),
            (Open | Unheld, Close) => Some(Closing),
            (Open, Move) => Some(MovedHeld),
            // A close the program asked for while the move was being answered: the stream
            // is the taker's, and nothing of the program's is left here.
            (Unheld | Closing, Move) => Some(Moved),
            (MovedHeld, LetGoAfterMove) => Some(Moved),
            _ => None,
        }
    }

    /// This process's program holds an fd of it.
    pub fn program_holds(self) -> bool {
        matches!(self, Life::Open | Life::MovedHeld)
    }

    /// Closing, or handed over: it answers no request and serves no program call any more.
    pub fn released(self) -> bool {
        matches!(self, Life::Closing | Life::MovedHeld | Life::Moved)
    }

    /// Handed over to another process.
    pub fn moved(self) -> bool {
        matches!(self, Life::MovedHeld | Life::Moved)
    }

    fn from_u8(v: u8) -> Life {
        Life::ALL[v as usize]
    }
}

/// A stream's [`Life`], shared by every thread that looks at it.
pub struct Lifecycle(AtomicU8);

impl Lifecycle {
    pub fn new() -> Lifecycle {
        Lifecycle(AtomicU8::new(Life::Open as u8))
    }

    /// Where the stream is now.
    pub fn get(&self) -> Life {
        Life::from_u8(self.0.load(Acquire))
    }

    /// Moves the stream on by `ev`: `Some((from, to))` if it changed (logged, at trace
    /// level, for stream `token`), `None` if `ev` does not apply where it is.
    pub fn apply(&self, ev: Event, token: u64) -> Option<(Life, Life)> {
        let mut now = self.get();
        loop {
            let next = now.after(ev)?;
            match self
                .0
                .compare_exchange(now as u8, next as u8, AcqRel, Acquire)
            {
                Ok(_) => {
                    log::trace!("rdma stream {token:x}: {now:?} -> {next:?} ({ev:?})");
                    return Some((now, next));
                }
                Err(v) => now = Life::from_u8(v),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVENTS: [Event; 4] = [
        Event::LetGo,
        Event::Close,
        Event::Move,
        Event::LetGoAfterMove,
    ];

    #[test]
    fn every_state_and_event() {
        use {Event::*, Life::*};
        let want = |l: Life, e: Event| match (l, e) {
            (Open, LetGo) => Some(Unheld),
            (Open, Close) | (Unheld, Close) => Some(Closing),
            (Open, Move) => Some(MovedHeld),
            (Unheld, Move) | (Closing, Move) | (MovedHeld, LetGoAfterMove) => Some(Moved),
            _ => None,
        };
        for l in Life::ALL {
            for e in EVENTS {
                assert_eq!(l.after(e), want(l, e), "{l:?} on {e:?}");
            }
        }
    }

    #[test]
    fn transitions_only_go_forward() {
        // No path leads back to a state it left: the discriminants' order is one every
        // transition respects.
        for l in Life::ALL {
            for e in EVENTS {
                if let Some(n) = l.after(e) {
                    assert!(n as u8 > l as u8, "{l:?} -> {n:?}");
                }
            }
        }
    }

    #[test]
    fn released_and_held_agree_with_the_states() {
        for l in Life::ALL {
            assert_eq!(l.released(), l as u8 >= Life::Closing as u8, "{l:?}");
            assert!(!(l.program_holds() && l == Life::Unheld));
            assert_eq!(l.moved(), l.released() && l != Life::Closing, "{l:?}");
        }
    }

    #[test]
    fn apply_changes_once() {
        let c = Lifecycle::new();
        assert_eq!(c.apply(Event::LetGo, 1), Some((Life::Open, Life::Unheld)));
        assert_eq!(c.apply(Event::LetGo, 1), None, "twice changes nothing");
        assert_eq!(
            c.apply(Event::Close, 1),
            Some((Life::Unheld, Life::Closing))
        );
        assert_eq!(c.apply(Event::Close, 1), None, "the close runs once");
        assert_eq!(c.get(), Life::Closing);
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
        assert_eq!(c.get(), Life::Closing);
    }
}
