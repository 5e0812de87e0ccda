//! The streams the helper tends: every one the program does not plainly hold — held only by
//! other processes or relay ends, being handed over, closing, or handed over and draining —
//! kept in one set and visited by their state (stream/life.rs) on each pass of the helper,
//! until their QP and memory are freed.

use super::stream::{Event, Phase};
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
        let draining = list.iter().any(|s| s.life().released());
        if draining {
            self.progress_devices(true); // completions the drains wait for
        }
        let now = Instant::now();
        for s in list {
            let life = s.life();
            match life.phase {
                Phase::Moving | Phase::Open => {
                    if life.phase == Phase::Moving {
                        s.expire_move(now);
                    }
                    if life.held_elsewhere() && !s.held() {
                        self.close_unheld(&s); // the last holder went
                    } else if life.program && s.life().phase == Phase::Open {
                        self.untend(&s); // a move that expired: the program's again
                    }
                }
                Phase::Closing | Phase::Moved => {
                    if s.reap_step(self.linger()) {
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

    fn untend(&self, s: &Arc<Stream>) {
        lock(&self.tended).remove(&key(s));
    }
}
