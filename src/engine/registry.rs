//! Which stream an event is for: the engine's maps of streams by QP number (with the
//! completions kept for a QP not routed yet) and by token, fresh tokens, and the count of
//! RDMA streams alive in this process.

use super::tags::TAG_MASK;
use super::{lock, Engine, Stream};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::*};
use std::sync::Arc;

/// RDMA streams alive in this process (what makes blocking waits spin first).
pub(super) static ACTIVE_STREAMS: AtomicUsize = AtomicUsize::new(0);

/// Whether this process has RDMA streams: one relaxed load, for the poll/epoll hooks.
#[inline]
pub fn active() -> bool {
    ACTIVE_STREAMS.load(Relaxed) != 0
}

/// See [`Engine::keep_early`].
pub(super) struct EarlyQp(&'static Engine, u32);

impl Drop for EarlyQp {
    fn drop(&mut self) {
        lock(&self.0.early).remove(&self.1); // nothing left once routed
    }
}

/// A map keyed by QP number, looked up for every completion. QP numbers are distinct
/// integers the local device hands out (no peer chooses them): a multiply hashes them well
/// enough, where the default SipHash costs more than the rest of a completion's dispatch.
pub(super) type QpMap<V> = HashMap<u32, V, std::hash::BuildHasherDefault<QpHasher>>;

#[derive(Default)]
pub(super) struct QpHasher(u64);

impl std::hash::Hasher for QpHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u32(&mut self, v: u32) {
        self.0 = u64::from(v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

impl Engine {
    /// A fresh id token (names a cm id, a stream or a listener).
    pub(super) fn token(&self) -> u64 {
        self.next_token.fetch_add(1, Relaxed) & !TAG_MASK
    }

    /// Registers a new stream for completions and cm events.
    pub(super) fn register(&self, s: &Arc<Stream>) {
        ACTIVE_STREAMS.fetch_add(1, Relaxed);
        lock(&self.streams_by_token).insert(s.token, s.clone());
        self.route_qp(s, None);
    }

    /// Registers a new stream of a link (its completions come through the link).
    pub(super) fn register_member(&self, s: &Arc<Stream>) {
        ACTIVE_STREAMS.fetch_add(1, Relaxed);
        lock(&self.streams_by_token).insert(s.token, s.clone());
        crate::stats::count_link(true);
    }

    pub(super) fn unregister(&self, s: &Stream) {
        if s.on_link {
            if self.unregister_token(s) {
                ACTIVE_STREAMS.fetch_sub(1, Relaxed);
            }
            return;
        }
        if lock(&self.streams_by_qp).remove(&s.qp_num()).is_some() {
            ACTIVE_STREAMS.fetch_sub(1, Relaxed);
        }
        self.unregister_token(s);
    }

    /// Removes `s` from the token map if it is there: a stream handed over and taken back
    /// is registered again under the same token, and its old copy, freed later, must not
    /// take the new one's entry with it.
    fn unregister_token(&self, s: &Stream) -> bool {
        let mut by_token = lock(&self.streams_by_token);
        let here = by_token
            .get(&s.token)
            .is_some_and(|x| std::ptr::eq(Arc::as_ptr(x), s));
        here && by_token.remove(&s.token).is_some()
    }

    /// This process's own stream `old.token`, served here, on the same A as `old`, the copy
    /// the program's fds still name: one a fork child gave back as it exited
    /// (`Request::Reclaim`, exiting).
    pub fn given_back(&self, old: &Stream) -> Option<Arc<Stream>> {
        lock(&self.streams_by_token)
            .get(&old.token)
            .filter(|s| {
                !std::ptr::eq(Arc::as_ptr(s), old)
                    && s.owner().is_me()
                    && !s.life().released()
                    && s.bell().identity().is_some()
                    && s.bell().identity() == old.bell().identity()
            })
            .cloned()
    }

    /// Keeps the completions of QP `qp` from now until its stream is registered with
    /// [`route_qp`](Self::route_qp), which hands them over in order; forgets them when the
    /// returned guard drops without that (the attempt failed). Call as soon as the QP can
    /// receive: without it, whoever polled the CQ in between dropped them as a stranger's
    /// — a client's first message to a server busy accepting others was lost, and both
    /// ends waited forever.
    pub(super) fn keep_early(&'static self, qp: u32) -> EarlyQp {
        lock(&self.early).insert(qp, Vec::new());
        EarlyQp(self, qp)
    }

    /// Routes the completions of `s`'s current QP to it from now on (and no longer those of
    /// `old`, the QP it left, if any), first handing it those kept since
    /// [`keep_early`](Self::keep_early): under the device's poll lock, so that they stay in order.
    pub(super) fn route_qp(&self, s: &Arc<Stream>, old: Option<u32>) {
        let _g = lock(&s.dev.poll);
        let kept = lock(&self.early).remove(&s.qp_num()).unwrap_or_default();
        {
            let mut by_qp = lock(&self.streams_by_qp);
            if let Some(old) = old {
                by_qp.remove(&old);
            }
            by_qp.insert(s.qp_num(), s.clone());
        }
        for wc in &kept {
            s.on_completion(wc);
        }
    }
}
