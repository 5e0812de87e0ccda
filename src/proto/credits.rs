//! Credit accounting for one connection: what this side may still send (`TxCredits`) and what
//! it owes the peer (`RxCredits`).
//!
//! Two resources are counted exactly: bytes of the peer's ring and the peer's posted receives
//! ("WR credits"; every WRITE_WITH_IMM consumes one). Nothing here sends anything: the
//! connection asks for a credit message and decides when to emit it.
//!
//! Reserve rule (PROTOCOL.md §5): data needs at least [`CONTROL_RESERVE`]` + 1` WR credits,
//! FIN and a credit message that returns no WRs need 2, and a credit message returning at least
//! one WR (or a RESET) may use the last one. This keeps credit returns possible in both
//! directions when data has exhausted everything else.

use super::wire::{Imm, MAX_CREDIT_BYTES, MAX_CREDIT_WRS};
use super::ProtocolError;

/// WR credits data may never use.
pub const CONTROL_RESERVE: u32 = 2;

/// Kind of message, for the reserve rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MsgClass {
    Data,
    Fin,
    CreditBytesOnly,
    CreditWithWrs,
    Reset,
    /// The two immediates announcing a grown ring; they leave the control reserve intact.
    GrowPair,
}

impl MsgClass {
    /// WR credits that must be available before sending this class.
    fn min_credits(self) -> u32 {
        match self {
            MsgClass::Data => CONTROL_RESERVE + 1,
            MsgClass::Fin | MsgClass::CreditBytesOnly => 2,
            MsgClass::CreditWithWrs | MsgClass::Reset => 1,
            MsgClass::GrowPair => CONTROL_RESERVE + 2,
        }
    }
}

/// Send-side credits: how far into the peer's ring we may write and how many receives it has
/// posted for us.
#[derive(Debug, Clone, Hash)]
pub(crate) struct TxCredits {
    peer_ring: u32,
    peer_recvs: u32,
    /// Stream position we may write up to (exclusive).
    granted_end: u64,
    wrs: u32,
}

impl TxCredits {
    pub(crate) fn new(peer_ring: u32, peer_recvs: u32) -> TxCredits {
        TxCredits {
            peer_ring,
            peer_recvs,
            granted_end: u64::from(peer_ring),
            wrs: peer_recvs,
        }
    }

    pub(crate) fn granted_end(&self) -> u64 {
        self.granted_end
    }

    /// Credits on a new queue pair continuing a connection: the byte window carries over
    /// (`granted_end`), the peer's posted receives are fresh.
    pub(crate) fn resumed(peer_ring: u32, peer_recvs: u32, granted_end: u64) -> TxCredits {
        TxCredits {
            granted_end,
            ..TxCredits::new(peer_ring, peer_recvs)
        }
    }

    pub(crate) fn wrs(&self) -> u32 {
        self.wrs
    }

    /// The peer's ring grew to `size` (its GROW): the window it granted moves from
    /// `returned + old` to `returned + size`, since no byte credit crosses a GROW.
    pub(crate) fn regrow(&mut self, size: u32) {
        self.granted_end += u64::from(size.saturating_sub(self.peer_ring));
        self.peer_ring = size;
    }

    /// Ring bytes we may write from stream position `sent`.
    pub(crate) fn bytes_after(&self, sent: u64) -> u64 {
        self.granted_end.saturating_sub(sent)
    }

    pub(crate) fn allows(&self, class: MsgClass) -> bool {
        self.wrs >= class.min_credits()
    }

    /// Spends one WR credit; call only after `allows` said yes.
    pub(crate) fn spend_wr(&mut self) {
        debug_assert!(self.wrs > 0);
        self.wrs -= 1;
    }

    /// Applies a credit message. `announced` is the stream position our last data immediate
    /// covered: the peer cannot have freed bytes beyond it.
    pub(crate) fn grant(
        &mut self,
        wrs: u32,
        bytes: u32,
        announced: u64,
    ) -> Result<(), ProtocolError> {
        let new_wrs = self.wrs.checked_add(wrs).filter(|&w| w <= self.peer_recvs);
        let new_end = self
            .granted_end
            .checked_add(u64::from(bytes))
            .filter(|&end| end <= announced.saturating_add(u64::from(self.peer_ring)));
        match (new_wrs, new_end) {
            (Some(w), Some(end)) => {
                self.wrs = w;
                self.granted_end = end;
                Ok(())
            }
            _ => Err(ProtocolError::CreditOverflow { wrs, bytes }),
        }
    }
}

/// Receive-side accounting of the local ring and posted receives.
#[derive(Debug, Clone, Hash)]
pub(crate) struct RxCredits {
    ring: u32,
    recvs: u32,
    byte_threshold: u64,
    wr_threshold: u32,
    /// End of the bytes the peer has announced (written and visible).
    received_end: u64,
    /// End of the bytes the app has consumed.
    consumed: u64,
    /// End of the consumed bytes already granted back; the peer may write up to
    /// `returned + ring`.
    returned: u64,
    /// Immediates received whose receive has been reposted but not yet returned.
    wrs_pending: u32,
    /// Most receives and ring bytes one credit message returns, and the unit of its bytes
    /// (the codec's: [`Codec::credit_caps`](super::link::imm::Codec::credit_caps)).
    caps: (u32, u32, u32),
}

impl RxCredits {
    pub(crate) fn new(ring: u32, recvs: u32) -> RxCredits {
        RxCredits {
            ring,
            recvs,
            // Batching: return when half is reclaimable (PROTOCOL.md §5). The WR threshold
            // must stay <= recvs - CONTROL_RESERVE so a sender stuck at the reserve is always
            // answered, and >= 2 so that a credit message (which itself consumes one receive)
            // never triggers an answer on its own: with 1, two idle peers would trade credit
            // messages forever.
            byte_threshold: byte_threshold(ring, 1),
            wr_threshold: (recvs / 2)
                .min(recvs.saturating_sub(CONTROL_RESERVE))
                .max(2),
            received_end: 0,
            consumed: 0,
            returned: 0,
            wrs_pending: 0,
            caps: (MAX_CREDIT_WRS, MAX_CREDIT_BYTES, 1),
        }
    }

    /// The same with a codec's credit caps `(wrs, bytes, unit)`: ring bytes go back in whole
    /// units, so at least one unit must be reclaimable before bytes are due.
    pub(crate) fn with_caps(mut self, caps: (u32, u32, u32)) -> RxCredits {
        self.caps = caps;
        self.byte_threshold = byte_threshold(self.ring, caps.2);
        self
    }

    /// Accounting continued on a new queue pair at the given positions (no receive owed
    /// yet); `None` if they are inconsistent.
    pub(crate) fn resumed(
        ring: u32,
        recvs: u32,
        consumed: u64,
        received_end: u64,
        returned: u64,
    ) -> Option<RxCredits> {
        let ok = returned <= consumed
            && consumed <= received_end
            && received_end <= returned.checked_add(u64::from(ring))?;
        ok.then(|| RxCredits {
            received_end,
            consumed,
            returned,
            ..RxCredits::new(ring, recvs)
        })
    }

    /// Our ring grew to `size` (the peer's SWITCHED): it may write up to `returned + size`.
    pub(crate) fn regrow(&mut self, size: u32) {
        self.ring = size;
        self.byte_threshold = byte_threshold(size, self.caps.2);
    }

    /// Ring bytes the peer may still write.
    pub(crate) fn window(&self) -> u64 {
        self.granted_end() - self.received_end
    }

    /// The old queue pair's receives are gone: none is owed to the peer any more.
    pub(crate) fn forget_messages(&mut self) {
        self.wrs_pending = 0;
    }

    pub(crate) fn recvs(&self) -> u32 {
        self.recvs
    }

    pub(crate) fn returned(&self) -> u64 {
        self.returned
    }

    pub(crate) fn received_end(&self) -> u64 {
        self.received_end
    }

    pub(crate) fn consumed(&self) -> u64 {
        self.consumed
    }

    pub(crate) fn granted_end(&self) -> u64 {
        self.returned + u64::from(self.ring)
    }

    pub(crate) fn wrs_pending(&self) -> u32 {
        self.wrs_pending
    }

    /// Bytes announced but not consumed.
    pub(crate) fn unread(&self) -> u64 {
        self.received_end - self.consumed
    }

    /// Counts one incoming immediate (its receive has been reposted by the driver).
    pub(crate) fn on_message(&mut self) -> Result<(), ProtocolError> {
        if self.wrs_pending >= self.recvs {
            return Err(ProtocolError::TooManyMessages);
        }
        self.wrs_pending += 1;
        Ok(())
    }

    /// Accepts `len` announced bytes if they lie inside the granted window.
    pub(crate) fn on_data(&mut self, len: u32) -> Result<(), ProtocolError> {
        let window = self.granted_end() - self.received_end;
        if u64::from(len) > window {
            return Err(ProtocolError::DataBeyondCredit { len, window });
        }
        self.received_end += u64::from(len);
        Ok(())
    }

    /// Marks `n` more bytes consumed; `n` must not exceed [`unread`](Self::unread).
    pub(crate) fn consume(&mut self, n: u64) {
        debug_assert!(n <= self.unread());
        self.consumed += n.min(self.unread());
    }

    /// Whether enough is reclaimable that a credit message is owed to the peer; with
    /// `bytes_held` (a ring growth under way) only receives count.
    pub(crate) fn update_due(&self, bytes_held: bool) -> bool {
        (!bytes_held && self.consumed - self.returned >= self.byte_threshold)
            || self.wrs_pending >= self.wr_threshold
    }

    /// A credit message worth sending now, if one is due and `tx` allows it. Commits it.
    pub(crate) fn take_update(&mut self, tx: &mut TxCredits, bytes_held: bool) -> Option<Imm> {
        if !self.update_due(bytes_held) {
            return None;
        }
        let pending_bytes = if bytes_held {
            0
        } else {
            self.consumed - self.returned
        };
        let (max_wrs, max_bytes, unit) = self.caps;
        let wrs = self.wrs_pending.min(max_wrs);
        let bytes = pending_bytes.min(u64::from(max_bytes)) as u32 / unit * unit;
        if wrs == 0 && bytes == 0 {
            return None; // less than a unit reclaimable, and no receive to return
        }
        let class = if wrs > 0 {
            MsgClass::CreditWithWrs
        } else {
            MsgClass::CreditBytesOnly
        };
        if !tx.allows(class) {
            return None;
        }
        tx.spend_wr();
        self.wrs_pending -= wrs;
        self.returned += u64::from(bytes);
        Some(Imm::Credit { wrs, bytes })
    }
}

/// Consumed bytes worth a credit message for a ring of `ring` bytes returned in units of
/// `unit`: half the ring (PROTOCOL.md §5), and at least one unit.
fn byte_threshold(ring: u32, unit: u32) -> u64 {
    u64::from(ring / 2).max(u64::from(unit)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_rule() {
        let mut tx = TxCredits::new(100, 3);
        assert!(tx.allows(MsgClass::Data));
        tx.spend_wr();
        assert!(!tx.allows(MsgClass::Data));
        assert!(tx.allows(MsgClass::Fin));
        tx.spend_wr();
        assert!(!tx.allows(MsgClass::Fin));
        assert!(!tx.allows(MsgClass::CreditBytesOnly));
        assert!(tx.allows(MsgClass::CreditWithWrs));
        assert!(tx.allows(MsgClass::Reset));
    }

    #[test]
    fn grant_beyond_what_was_sent_is_refused() {
        let mut tx = TxCredits::new(100, 8);
        assert_eq!(
            tx.grant(1, 0, 0),
            Err(ProtocolError::CreditOverflow { wrs: 1, bytes: 0 })
        );
        assert_eq!(
            tx.grant(0, 1, 0),
            Err(ProtocolError::CreditOverflow { wrs: 0, bytes: 1 })
        );
        tx.spend_wr();
        assert_eq!(tx.grant(1, 40, 40), Ok(()));
        assert_eq!(tx.bytes_after(40), 100);
    }

    #[test]
    fn data_beyond_window_is_refused() {
        let mut rx = RxCredits::new(10, 4);
        assert_eq!(rx.on_data(6), Ok(()));
        assert_eq!(
            rx.on_data(5),
            Err(ProtocolError::DataBeyondCredit { len: 5, window: 4 })
        );
        assert_eq!(rx.on_data(4), Ok(()));
    }

    #[test]
    fn updates_are_batched() {
        let mut tx = TxCredits::new(10, 8);
        let mut rx = RxCredits::new(10, 8);
        rx.on_message().unwrap();
        rx.on_data(4).unwrap();
        rx.consume(4);
        assert_eq!(rx.take_update(&mut tx, false), None);
        rx.on_message().unwrap();
        rx.on_data(1).unwrap();
        rx.consume(1);
        assert_eq!(
            rx.take_update(&mut tx, false),
            Some(Imm::Credit { wrs: 2, bytes: 5 })
        );
        assert_eq!(tx.wrs(), 7);
        assert_eq!(rx.granted_end(), 15);
    }

    #[test]
    fn a_lone_credit_message_is_not_answered() {
        let mut tx = TxCredits::new(10, 4);
        let mut rx = RxCredits::new(10, 4);
        rx.on_message().unwrap();
        assert_eq!(rx.take_update(&mut tx, false), None);
        rx.on_message().unwrap();
        assert_eq!(
            rx.take_update(&mut tx, false),
            Some(Imm::Credit { wrs: 2, bytes: 0 })
        );
    }

    #[test]
    fn too_many_messages() {
        let mut rx = RxCredits::new(10, 4);
        for _ in 0..4 {
            rx.on_message().unwrap();
        }
        assert_eq!(rx.on_message(), Err(ProtocolError::TooManyMessages));
    }
}
