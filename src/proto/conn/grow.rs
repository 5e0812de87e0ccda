//! Buffers that start small and grow under load (PROTOCOL.md §12), so an idle connection
//! pins little memory and a busy one still streams at full speed.
//!
//! - The receive ring: when our reader consumes bytes while the peer has used the whole
//!   window (it waits for credits, our reader keeps up), we ask the driver for a ring of
//!   `ring_max` bytes and announce it with the GROW pair. From the moment the peer reads
//!   GROW it writes into the new ring only and answers SWITCHED; every byte before SWITCHED
//!   is in the old ring. The driver copies those still unread into the new ring at their
//!   positions ([`RingCopy`]) and frees the old one. Between GROW and SWITCHED we return no
//!   ring bytes: the peer's window moves from `returned + old` to `returned + new` at GROW,
//!   and a byte credit crossing it would count twice.
//! - The send buffer is ours alone: when the peer's ring grows (we stream at it), or a write
//!   of at least the whole buffer finds it full, we ask the driver for one of `send_max`
//!   bytes, take no more bytes until every posted one has completed, and swap. A full buffer
//!   alone proves nothing: space comes back lazily (signaled completions), so a chatty
//!   program finds it full now and then without ever waiting on it.

use core::ops::Range;

use super::{Conn, EV_WRITABLE};
use crate::proto::credits::MsgClass;
use crate::proto::ring::Ring;
use crate::proto::wire::{Imm, GROW_PAGE, MAX_GROW_PAGES};
use crate::proto::ProtocolError;

/// Where growing one of our buffers stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Growth {
    /// Small, and may grow when load shows.
    Idle,
    /// The driver is asked for a buffer of this size.
    Wanted(u32),
    /// The driver gave one (where the peer writes into the ring: rkey, address): the GROW
    /// pair (on a link, the GROW record), or the swap, is due.
    Offered { size: u32, rkey: u32, addr: u64 },
    /// GROW sent; waiting for SWITCHED.
    Sent { size: u32 },
    /// Grown, declined, or cancelled: stays as it is.
    Done,
}

impl Growth {
    pub(super) fn new(size: u32, max: u32) -> Growth {
        if size < max {
            Growth::Idle
        } else {
            Growth::Done
        }
    }

    fn pending_size(self) -> Option<u32> {
        match self {
            Growth::Offered { size, .. } | Growth::Sent { size } => Some(size),
            _ => None,
        }
    }
}

/// Unread bytes of the old ring the driver moves into the new one after a switch: stream
/// positions `from..to`, at `p mod old_size` in the old ring and `p mod new_size` in the new.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RingCopy {
    /// Size of the old ring.
    pub old_size: u32,
    /// Size of the new ring.
    pub new_size: u32,
    /// First position to move (the consumed end at the switch).
    pub from: u64,
    /// End of the positions to move (the received end at the switch).
    pub to: u64,
}

impl RingCopy {
    /// Pairs of (old ring range, new ring range) of equal length covering `from..to`.
    pub fn pieces(&self) -> impl Iterator<Item = (Range<usize>, Range<usize>)> {
        let (old, new) = (Ring::new(self.old_size), Ring::new(self.new_size));
        let (mut pos, to) = (self.from, self.to);
        core::iter::from_fn(move || {
            if pos >= to {
                return None;
            }
            let n = (to - pos)
                .min(u64::from(old.contiguous(pos)))
                .min(u64::from(new.contiguous(pos)));
            let (a, b) = (old.offset(pos) as usize, new.offset(pos) as usize);
            pos += n;
            Some((a..a + n as usize, b..b + n as usize))
        })
    }
}

/// The largest size a GROW can announce that is at most `max` (a multiple of 4 KiB).
pub(super) fn grow_target(max: u32) -> u32 {
    (max / GROW_PAGE).min(MAX_GROW_PAGES) * GROW_PAGE
}

impl Conn {
    // ---- driver: the receive ring ---------------------------------------------------------

    /// Size of the ring the driver should register and [`offer_ring`](Self::offer_ring)
    /// (remote write, in this connection's protection domain, addressed from 0), if the
    /// ring should grow now.
    pub fn ring_grow_wanted(&self) -> Option<u32> {
        match self.ring_growth {
            Growth::Wanted(size) => Some(size),
            _ => None,
        }
    }

    /// The driver registered the ring asked for: announce it. Keep it until
    /// [`take_ring_copy`](Self::take_ring_copy) (it is now the ring) or until
    /// [`pending_ring`](Self::pending_ring) is `None` (cancelled: free it).
    pub fn offer_ring(&mut self, rkey: u32) {
        self.offer_ring_at(rkey, 0);
    }

    /// As [`offer_ring`](Self::offer_ring), for a ring at `addr` of its memory region: a
    /// link's stream, whose ring is a slot of a slab (a lone connection's rings start at 0).
    /// On a link the driver then sends it with [`take_grow_record`](Self::take_grow_record).
    pub fn offer_ring_at(&mut self, rkey: u32, addr: u64) {
        if let Growth::Wanted(size) = self.ring_growth {
            self.ring_growth = Growth::Offered { size, rkey, addr };
        }
    }

    /// On a link: the bigger ring offered, for the driver to announce in a GROW record on
    /// the link's control stream (PROTOCOL.md §14) — `(size, rkey, addr)`. From now until
    /// the peer's SWITCHED no ring bytes are returned (as after §12's GROW pair). `None`
    /// while nothing is offered, on a lone connection (its GROW pair is an immediate), or
    /// when the offer is off (the peer will write no more, or not here).
    pub fn take_grow_record(&mut self) -> Option<(u32, u32, u64)> {
        if self.codec.carries_moves() {
            return None;
        }
        let (size, rkey, addr) = self.standing_ring_offer()?;
        self.ring_growth = Growth::Sent { size };
        Some((size, rkey, addr))
    }

    /// The ring offered and not announced yet, unless the offer is off: the peer will
    /// write no more (its FIN), or not here (a move).
    fn standing_ring_offer(&mut self) -> Option<(u32, u32, u64)> {
        let Growth::Offered { size, rkey, addr } = self.ring_growth else {
            return None;
        };
        if self.fin_received || self.migrating() {
            self.ring_growth = Growth::Done;
            return None;
        }
        Some((size, rkey, addr))
    }

    /// The driver judged the connection busy (it moves several rings' worth in a short
    /// time): grow the ring now rather than pay a credit message every half ring.
    pub fn ask_bigger_ring(&mut self) {
        let quiet = self.fin_received || self.read_closed || self.migrating();
        if self.ring_growth == Growth::Idle && !quiet {
            self.ring_growth = Growth::Wanted(grow_target(self.ring_max));
        }
    }

    /// As [`ask_bigger_ring`](Self::ask_bigger_ring), for the send buffer.
    pub fn ask_bigger_send_buf(&mut self) {
        self.want_bigger_send_buf();
    }

    /// The driver could not register a bigger ring: stay small.
    pub fn decline_ring(&mut self) {
        self.ring_growth = Growth::Done;
    }

    /// Size of the ring offered and not yet switched to.
    pub fn pending_ring(&self) -> Option<u32> {
        self.ring_growth.pending_size()
    }

    /// After the peer switched: the bytes to move from the old ring into the new one, which
    /// is the ring from now on (every later call means the new one). Returned once.
    pub fn take_ring_copy(&mut self) -> Option<RingCopy> {
        self.ring_copy.take()
    }

    /// Size of the receive ring now.
    pub fn ring_size(&self) -> u32 {
        self.ring.size()
    }

    /// Whether the ring or the send buffer grew (neither is the size a new connection
    /// starts with any more).
    pub fn buffers_grew(&self) -> bool {
        self.ring_size() > self.ring_start || self.send_buf_size() > self.send_start
    }

    // ---- driver: the send buffer ----------------------------------------------------------

    /// Size of the send buffer the driver should register and
    /// [`offer_send_buf`](Self::offer_send_buf), if it should grow now.
    pub fn send_grow_wanted(&self) -> Option<u32> {
        match self.send_growth {
            Growth::Wanted(size) => Some(size),
            _ => None,
        }
    }

    /// The driver registered the send buffer asked for: writes wait until every posted byte
    /// has completed, then [`send_buf_size`](Self::send_buf_size) says it is the one in use.
    pub fn offer_send_buf(&mut self) {
        if let Growth::Wanted(size) = self.send_growth {
            self.send_growth = Growth::Offered {
                size,
                rkey: 0,
                addr: 0,
            };
            self.need_signal = true;
            self.swap_send_buf_if_drained();
        }
    }

    /// The driver could not register a bigger send buffer: stay small.
    pub fn decline_send_buf(&mut self) {
        self.send_growth = Growth::Done;
    }

    /// Size of the send buffer offered and not yet in use.
    pub fn pending_send_buf(&self) -> Option<u32> {
        self.send_growth.pending_size()
    }

    /// Size of the send buffer in use now.
    pub fn send_buf_size(&self) -> u32 {
        self.send_ring.size()
    }

    // ---- inside the core --------------------------------------------------------------------

    /// The program read `n` bytes. If the peer had filled the whole window, it waits for
    /// credits while our reader keeps up: a bigger ring lets it stream. (A reader that is
    /// behind gains nothing from a bigger ring, and an idle one must stay small.)
    pub(super) fn app_consumed(&mut self, n: u64) {
        self.rx.consume(n);
        if n > 0 && self.rx.window() == 0 {
            self.ask_bigger_ring();
        }
    }

    /// A write of `wanted` bytes found the send buffer full: a bulk writer if it wanted at
    /// least the whole buffer.
    pub(super) fn note_send_full(&mut self, wanted: usize) {
        if wanted >= self.send_ring.size() as usize {
            self.want_bigger_send_buf();
        }
    }

    fn want_bigger_send_buf(&mut self) {
        if self.send_growth == Growth::Idle && !self.migrating() {
            self.send_growth = Growth::Wanted(self.send_max);
        }
    }

    /// While a send buffer waits to be swapped in, no bytes are taken.
    pub(super) fn send_swap_pending(&self) -> bool {
        matches!(self.send_growth, Growth::Offered { .. })
    }

    pub(super) fn swap_send_buf_if_drained(&mut self) {
        if let Growth::Offered { size, .. } = self.send_growth {
            if self.tx_acked == self.tx_queued && self.wrs_retired == self.next_wr {
                self.send_ring = Ring::new(size);
                self.send_growth = Growth::Done;
                if self.writer_waiting {
                    self.writer_waiting = false;
                    self.events |= EV_WRITABLE;
                }
            }
        }
    }

    /// Byte credits are held from GROW until SWITCHED.
    pub(super) fn credit_bytes_held(&self) -> bool {
        matches!(self.ring_growth, Growth::Sent { .. })
    }

    /// The GROW pair, when offered and the credits allow: two immediates back to back,
    /// leaving the control reserve.
    pub(super) fn grow_write(&mut self) -> Option<super::Write> {
        if !self.codec.carries_moves() {
            return None; // a link's GROW is a record: take_grow_record
        }
        let (size, rkey, _) = self.standing_ring_offer()?;
        if !(self.tx.allows(MsgClass::GrowPair) && self.sq_room(2)) {
            return None;
        }
        let [hi, lo] = Imm::grow_pair(rkey, size / GROW_PAGE);
        self.tx.spend_wr();
        self.tx.spend_wr();
        self.ring_growth = Growth::Sent { size };
        let first = self.control(hi, false);
        let second = self.control(lo, false);
        self.planned.push_back(second);
        Some(first)
    }

    /// SWITCHED, owed since the peer's GROW: ahead of any data, FIN or MIGRATE (credit
    /// returns may go first, so both ends can always make progress).
    pub(super) fn switched_write(&mut self) -> Option<super::Write> {
        if !(self.tx.allows(MsgClass::Fin) && self.sq_room(1)) {
            return None;
        }
        self.tx.spend_wr();
        self.switch_owed = false;
        Some(self.control(Imm::Switched, false))
    }

    /// The peer's GROW pair (halves already combined): write into the new ring from now on.
    pub(super) fn on_grow(&mut self, rkey: u32, pages: u32) -> Result<(), ProtocolError> {
        self.peer_ring_grew(pages.saturating_mul(GROW_PAGE), rkey, 0)
    }

    /// On a link: the peer's GROW record for this stream (PROTOCOL.md §14), a ring of `size`
    /// bytes (whole pages: the record says so) at `addr` of the region `rkey`. As §12's GROW
    /// pair: write into the new ring from now on, and answer SWITCHED. The driver hands it
    /// over in the order the link's completions came.
    pub fn on_grow_record(&mut self, size: u32, rkey: u32, addr: u64) -> Result<(), ProtocolError> {
        if self.failed.is_some() || self.peer_reset {
            return Ok(());
        }
        let r = if self.codec.carries_moves() {
            Err(ProtocolError::BadGrow)
        } else {
            self.peer_ring_grew(size, rkey, addr)
        };
        if let Err(e) = r {
            self.fail_on_input(e);
        }
        r
    }

    fn peer_ring_grew(&mut self, size: u32, rkey: u32, addr: u64) -> Result<(), ProtocolError> {
        if size == 0 || size <= self.peer_ring.size() || self.switch_owed {
            return Err(ProtocolError::BadGrow);
        }
        if self.fin_sent || self.migration_sent() {
            return Ok(()); // it cancels its growth when our FIN or MIGRATE arrives
        }
        self.tx.regrow(size);
        self.peer_ring = Ring::new(size);
        self.peer_rkey = rkey;
        self.peer_ring_addr = addr;
        self.switch_owed = true;
        // The peer's window ran out: we stream at it, and our send buffer should keep up.
        self.want_bigger_send_buf();
        Ok(())
    }

    /// The peer's SWITCHED: the new ring is ours from the bytes received so far.
    pub(super) fn on_switched(&mut self) -> Result<(), ProtocolError> {
        let Growth::Sent { size } = self.ring_growth else {
            return Err(ProtocolError::BadGrow);
        };
        let (from, to) = (self.rx.consumed(), self.rx.received_end());
        self.ring_copy = Some(RingCopy {
            old_size: self.ring.size(),
            new_size: size,
            from,
            to,
        });
        self.ring = Ring::new(size);
        self.rx.regrow(size);
        self.ring_growth = Growth::Done;
        Ok(())
    }

    /// A move freezes the send buffer's size (the taker registers it before the export).
    pub(super) fn cancel_send_growth(&mut self) {
        if matches!(self.send_growth, Growth::Wanted(_) | Growth::Offered { .. }) {
            self.send_growth = Growth::Done;
            if self.writer_waiting && self.writable() > 0 {
                self.writer_waiting = false;
                self.events |= EV_WRITABLE;
            }
        }
    }

    /// The peer's FIN or MIGRATE: a growth not yet switched is off (it will not answer).
    pub(super) fn cancel_ring_growth(&mut self) {
        if !matches!(self.ring_growth, Growth::Idle | Growth::Done) {
            self.ring_growth = Growth::Done;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_pieces_split_at_both_wraps() {
        let c = RingCopy {
            old_size: 10,
            new_size: 16,
            from: 7,
            to: 15,
        };
        let v: Vec<_> = c.pieces().collect();
        assert_eq!(v, vec![(7..10, 7..10), (0..5, 10..15)]);
        let c = RingCopy {
            old_size: 10,
            new_size: 16,
            from: 14,
            to: 22,
        };
        let v: Vec<_> = c.pieces().collect();
        assert_eq!(v, vec![(4..6, 14..16), (6..10, 0..4), (0..2, 4..6)]);
    }

    #[test]
    fn targets_are_whole_pages_within_the_limit() {
        assert_eq!(grow_target(256 * 1024), 256 * 1024);
        assert_eq!(grow_target(10_000), 8192);
        assert_eq!(grow_target(1 << 30), MAX_GROW_PAGES * GROW_PAGE);
    }
}
