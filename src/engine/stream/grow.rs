//! Buffers that grow (proto/conn/grow.rs): a stream registers the bigger memory its protocol
//! asks for and swaps it in, and tells a busy connection from the rate it moves bytes.

use super::{Inner, Port, QueuePair, Region, Stream};
use crate::proto::Failure;
use std::sync::atomic::Ordering::*;
use std::time::{Duration, Instant};

impl<P: Port> Stream<P> {
    /// Buffers that grow (proto/conn/grow.rs): registers what the protocol asks for, moves
    /// the unread bytes into a ring the peer switched to, swaps in a drained send buffer,
    /// and frees what it no longer needs. Run before the memory is used after any input.
    pub(super) fn sync_memory(&self, inner: &mut Inner<P>) {
        let Some(rc) = inner.rc.as_ref() else { return };
        let p = &mut inner.proto;
        if let Some(size) = p.ring_grow_wanted() {
            match rc.alloc(size as usize, true) {
                Ok((buf, at)) => {
                    inner.next_ring = Some(buf);
                    p.offer_ring_at(at.rkey, at.addr);
                }
                Err(e) => {
                    log::info!("rdma stream {}: ring stays small: {e}", self.peer);
                    p.decline_ring();
                }
            }
        }
        // On a link the GROW is a record of the link's control stream.
        if let Some((size, rkey, addr)) = p.take_grow_record() {
            rc.send_grow(size, crate::proto::link::RingAt { rkey, addr });
        }
        if let Some(copy) = p.take_ring_copy() {
            let Some(mut new) = inner.next_ring.take() else {
                // Unreachable: the protocol switches only to a ring it was given.
                log::error!("rdma stream {}: switched to a ring it never had", self.peer);
                p.handle_failure(Failure::Reset);
                return;
            };
            for (from, to) in copy.pieces() {
                new.range_mut(to).copy_from_slice(inner.ring.range(from));
            }
            let returned = p
                .counters()
                .rx_granted_end
                .saturating_sub(u64::from(copy.new_size));
            rc.ring_switched(&new, returned..copy.to);
            // The old ring: nothing writes it any more (every write before SWITCHED landed).
            drop(std::mem::replace(&mut *inner.ring, new));
            log::debug!("rdma stream {}: ring grew to {}", self.peer, copy.new_size);
            crate::stats::count_growth(true);
        }
        if p.pending_ring().is_none() {
            inner.next_ring = None; // cancelled (a FIN or a move crossed it)
        }
        if let Some(size) = p.send_grow_wanted() {
            match rc.alloc(size as usize, false) {
                Ok((buf, _)) => {
                    inner.next_send = Some(buf);
                    p.offer_send_buf();
                }
                Err(e) => {
                    log::info!("rdma stream {}: send buffer stays small: {e}", self.peer);
                    p.decline_send_buf();
                }
            }
        }
        if p.send_buf_size() as usize != inner.send.len() {
            if let Some(new) = inner.next_send.take() {
                // The old one: every write from it has completed.
                drop(std::mem::replace(&mut *inner.send, new));
                log::debug!(
                    "rdma stream {}: send buffer grew to {}",
                    self.peer,
                    p.send_buf_size()
                );
                crate::stats::count_growth(false);
            }
        }
        if p.pending_send_buf().is_none() {
            inner.next_send = None;
        }
        let sizes = buf_sizes(&*inner.ring, &*inner.send).packed();
        if self.sizes.load(Relaxed) != sizes {
            self.sizes.store(sizes, Release);
        }
    }
}

/// Bytes a program moved through one of a stream's buffers lately: a buffer that sees
/// [`BUSY_BUFFERS`] times its size within [`BUSY_WINDOW`] is too small for the connection
/// (with a 16 KiB ring, 4 KiB request/response costs a credit message every second
/// message: 30 % slower in the bed than with 256 KiB, 2026-11-24). The clock is read once
/// per that many bytes, not per call.
#[derive(Default)]
pub(super) struct Rate {
    since: Option<Instant>,
    bytes: usize,
}

const BUSY_BUFFERS: usize = 4;
const BUSY_WINDOW: Duration = Duration::from_millis(10);

impl Rate {
    /// Counts `n` bytes through a buffer of `size`; true when the connection is busy.
    pub(super) fn busy(&mut self, n: usize, size: usize) -> bool {
        self.bytes += n;
        if self.bytes < BUSY_BUFFERS * size {
            return false;
        }
        let now = Instant::now();
        let busy = self.since.is_some_and(|t| now - t <= BUSY_WINDOW);
        (self.since, self.bytes) = (Some(now), 0);
        busy
    }
}

pub(super) fn buf_sizes<B: Region>(ring: &B, send: &B) -> crate::engine::BufSizes {
    crate::engine::BufSizes {
        ring: ring.len() as u32,
        send: send.len() as u32,
    }
}
