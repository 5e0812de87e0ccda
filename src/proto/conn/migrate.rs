//! Moving one end of a connection to another queue pair (PROTOCOL.md §11): the owner of that
//! end (O) sends MIGRATE and falls silent; the peer (P) quiesces its old queue pair and sends a
//! resume hello to the taker (T), which continues from O's exported [`Handover`] at the same
//! stream positions. Bytes O had received but not consumed, and bytes it had queued but not
//! posted, are copied by the drivers from O's memory into T's at the same ring and send-buffer
//! positions ([`Conn::readable_ranges`], [`Conn::unsent_ranges`]).

use core::ops::Range;

use super::{Conn, EV_MOVING};
use crate::proto::credits::{MsgClass, RxCredits, TxCredits};
use crate::proto::wire::{Hello, HelloKind, Imm, ResumePoint};
use crate::proto::{ConfigError, Params, ProtocolError, Write};

/// Where a connection's queue-pair hand-over stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub(super) enum Migration {
    /// Not moving.
    #[default]
    None,
    /// We (O) are handing over: MIGRATE is due on the next `poll_write`.
    Leaving { port: u16 },
    /// We (O) sent MIGRATE: nothing more goes out on this queue pair.
    Left,
    /// The peer is moving (we are P): quiesce, then resume towards `port`.
    PeerMoving { port: u16 },
}

/// Why a hand-over step was refused. The connection itself is unharmed by a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigrateError {
    /// Reset, failed, finished both ways, or a hand-over already under way.
    NotNow,
    /// The resume may only follow MIGRATE and the quiescing of the old queue pair.
    NotReady,
    /// The new peer's ring is not the size of the old one (positions would not map).
    RingMismatch,
    /// The resume point contradicts the exported state (a stale or foreign resume).
    BadResume,
    /// The taker's send buffer cannot hold the bytes queued and not yet posted.
    SendBufTooSmall,
    /// The hello or config is unusable.
    Config(ConfigError),
}

impl core::fmt::Display for MigrateError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            MigrateError::NotNow => f.write_str("connection cannot be handed over now"),
            MigrateError::NotReady => f.write_str("hand-over not ready to resume"),
            MigrateError::RingMismatch => f.write_str("new ring size differs from the old"),
            MigrateError::BadResume => f.write_str("resume point contradicts the hand-over"),
            MigrateError::SendBufTooSmall => f.write_str("send buffer too small for hand-over"),
            MigrateError::Config(e) => write!(f, "hand-over config: {e}"),
        }
    }
}

impl std::error::Error for MigrateError {}

/// What O exports for T once MIGRATE is out and every byte P posted has arrived: the stream
/// positions and flags T continues from. Travels between processes of one host (the shim's
/// ipc), never on the wire to the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Handover {
    /// O's ring size; T's ring must be the same size.
    pub ring_size: u32,
    /// Receive side: consumed <= received_end <= returned + ring_size, returned <= consumed.
    pub rx_consumed: u64,
    /// End of the bytes P wrote into O's ring.
    pub rx_received_end: u64,
    /// End of the consumed bytes O granted back.
    pub rx_returned: u64,
    /// Send side: P has every byte before this.
    pub tx_posted: u64,
    /// Bytes `tx_posted..tx_queued` were queued and not posted: T sends them.
    pub tx_queued: u64,
    /// Shutdown and FIN flags, in [`Handover::FLAG_NAMES`] order from bit 0.
    pub flags: u8,
}

const F_WRITE_SHUT: u8 = 1;
const F_READ_SHUT: u8 = 2;
const F_READ_CLOSED: u8 = 4;
const F_FIN_SENT: u8 = 8;
const F_FIN_RECEIVED: u8 = 16;

impl Handover {
    /// Encoded length.
    pub const LEN: usize = 45;
    /// The flag bits, from bit 0.
    pub const FLAG_NAMES: [&'static str; 5] = [
        "write_shut",
        "read_shut",
        "read_closed",
        "fin_sent",
        "fin_received",
    ];

    /// Big-endian encoding for the ipc message.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&self.ring_size.to_be_bytes());
        for (i, v) in [
            self.rx_consumed,
            self.rx_received_end,
            self.rx_returned,
            self.tx_posted,
            self.tx_queued,
        ]
        .iter()
        .enumerate()
        {
            b[4 + 8 * i..12 + 8 * i].copy_from_slice(&v.to_be_bytes());
        }
        b[44] = self.flags;
        b
    }

    /// Decodes; `None` if short. Consistency is checked by [`Conn::from_handover`].
    pub fn parse(b: &[u8]) -> Option<Handover> {
        let b = b.get(..Self::LEN)?;
        let u64_at = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[4 + 8 * i..12 + 8 * i]);
            u64::from_be_bytes(x)
        };
        Some(Handover {
            ring_size: u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
            rx_consumed: u64_at(0),
            rx_received_end: u64_at(1),
            rx_returned: u64_at(2),
            tx_posted: u64_at(3),
            tx_queued: u64_at(4),
            flags: b[44],
        })
    }

    /// How many unread ring bytes travel with this state (what [`Conn::readable_ranges`]
    /// covers): none once reading was closed (they are discarded), else received end minus
    /// consumed. `None` if the counters are out of order.
    pub fn unread_len(&self) -> Option<u64> {
        let unread = self.rx_received_end.checked_sub(self.rx_consumed)?;
        Some(if self.flags & F_READ_CLOSED != 0 {
            0
        } else {
            unread
        })
    }

    /// How many queued unposted bytes travel with this state ([`Conn::unsent_ranges`]).
    /// `None` if the counters are out of order.
    pub fn unsent_len(&self) -> Option<u64> {
        self.tx_queued.checked_sub(self.tx_posted)
    }
}

impl Conn {
    // ---- O: the end that moves away ------------------------------------------------------

    /// Starts handing this end over to a taker listening on `port` (at our address): the next
    /// [`poll_write`](Self::poll_write) gives MIGRATE, after which nothing more is sent here.
    /// Refused (and nothing changes) when the connection is reset, both FINs have passed (the
    /// peer may already be gone), a hand-over is under way, or it is a stream of a link.
    pub fn start_migration(&mut self, port: u16) -> Result<(), MigrateError> {
        let over = self.is_broken() || self.reset_sent || (self.fin_sent && self.fin_received);
        // A ring growth announced and not yet switched would strand the new ring.
        let growing = matches!(self.ring_growth, super::Growth::Sent { .. });
        let movable = self.codec.carries_moves();
        if over || port == 0 || self.migration != Migration::None || growing || !movable {
            return Err(MigrateError::NotNow);
        }
        self.cancel_ring_growth();
        self.cancel_send_growth();
        self.migration = Migration::Leaving { port };
        Ok(())
    }

    /// O: MIGRATE has been handed to the driver; after every byte the peer posted has arrived
    /// (its resume says how far, [`ResumePoint::sent_end`]) the state can be exported.
    pub fn migration_sent(&self) -> bool {
        self.migration == Migration::Left
    }

    /// O: the state T continues from, once MIGRATE is out. Export only after
    /// `counters().rx_received_end` reached the peer's resume point.
    pub fn handover(&self) -> Option<Handover> {
        if self.migration != Migration::Left || self.is_reset() {
            return None;
        }
        let flags = [
            self.write_shut,
            self.read_shut,
            self.read_closed,
            self.fin_sent,
            self.fin_received,
        ]
        .iter()
        .enumerate()
        .fold(0u8, |acc, (i, &on)| acc | (u8::from(on) << i));
        Some(Handover {
            ring_size: self.ring.size(),
            rx_consumed: self.rx.consumed(),
            rx_received_end: self.rx.received_end(),
            rx_returned: self.rx.returned(),
            tx_posted: self.tx_posted,
            tx_queued: self.tx_queued,
            flags,
        })
    }

    /// Send-buffer ranges of the bytes queued and not yet posted (`tx_posted..tx_queued`), in
    /// stream order: what O copies out and T copies in.
    pub fn unsent_ranges(&self) -> [Range<usize>; 2] {
        self.send_ring
            .ranges(self.tx_posted, self.tx_queued - self.tx_posted)
    }

    // ---- P: the end that stays -----------------------------------------------------------

    /// P: the peer announced it moves to `port` at its address (event
    /// [`Event::PeerMoving`](super::Event::PeerMoving)).
    pub fn peer_moving_to(&self) -> Option<u16> {
        match self.migration {
            Migration::PeerMoving { port } => Some(port),
            _ => None,
        }
    }

    /// P: the old queue pair is quiet (every posted work request completed): send the resume.
    pub fn ready_to_resume(&self) -> bool {
        self.peer_moving_to().is_some()
            && self.planned.is_empty()
            && self.wrs_retired == self.next_wr
    }

    /// P: the resume hello for a ring registered at `ring_addr` with `rkey` (the same ring
    /// as before) on connection `conn_id`; `recv_credits` receives must be posted on the new
    /// queue pair before it is sent.
    pub fn resume_hello(&self, ring_addr: u64, rkey: u32, conn_id: u64) -> Hello {
        Hello {
            kind: HelloKind::Resume,
            flags: 0,
            ring_addr,
            rkey,
            ring_size: self.ring.size(),
            recv_credits: self.rx.recvs(),
            conn_id,
            resume: Some(ResumePoint {
                sent_end: self.tx_posted,
                granted_end: self.rx.granted_end(),
            }),
            branch: None,
        }
    }

    /// P: continues on the new queue pair whose passive side (T) answered with `accept`.
    pub fn resume(&mut self, accept: &Hello) -> Result<(), MigrateError> {
        if !self.ready_to_resume() {
            return Err(MigrateError::NotReady);
        }
        accept
            .check()
            .map_err(|e| MigrateError::Config(ConfigError::Peer(e)))?;
        if accept.kind != HelloKind::Accept {
            return Err(MigrateError::BadResume);
        }
        if accept.ring_size != self.peer_ring.size() {
            return Err(MigrateError::RingMismatch);
        }
        let granted = self.tx.granted_end();
        self.tx = TxCredits::resumed(accept.ring_size, accept.recv_credits, granted);
        self.peer_ring_addr = accept.ring_addr;
        self.peer_rkey = accept.rkey;
        self.peer_grow_hi = None;
        self.switch_owed = false;
        self.rx.forget_messages();
        self.signaled.clear();
        self.unsignaled_wrs = 0;
        self.unsignaled_bytes = 0;
        self.migration = Migration::None;
        self.active = true;
        Ok(())
    }

    // ---- T: the taker ---------------------------------------------------------------------

    /// T: the connection continued from O's `state`, towards the peer whose resume hello is
    /// `peer`. `config.ring_size` must be O's ring size; the driver then copies O's unread
    /// bytes to [`readable_ranges`](Self::readable_ranges) of the new ring and O's unsent
    /// bytes to [`unsent_ranges`](Self::unsent_ranges) of the new send buffer.
    pub fn from_handover(
        config: &Params,
        state: &Handover,
        peer: &Hello,
    ) -> Result<Conn, MigrateError> {
        let at = peer.resume.filter(|_| peer.kind == HelloKind::Resume);
        let at = at.ok_or(MigrateError::BadResume)?;
        let mut conn = Conn::new(config, peer).map_err(MigrateError::Config)?;
        if config.ring_size != state.ring_size {
            return Err(MigrateError::RingMismatch);
        }
        let unsent = state.tx_queued.checked_sub(state.tx_posted);
        let unsent = unsent.ok_or(MigrateError::BadResume)?;
        if unsent > u64::from(config.send_buf_size) {
            return Err(MigrateError::SendBufTooSmall);
        }
        let peer_window = u64::from(peer.ring_size);
        if at.sent_end != state.rx_received_end
            || at.granted_end < state.tx_posted
            || at.granted_end - state.tx_posted > peer_window
        {
            return Err(MigrateError::BadResume);
        }
        conn.rx = RxCredits::resumed(
            config.ring_size,
            config.recv_credits,
            state.rx_consumed,
            state.rx_received_end,
            state.rx_returned,
        )
        .ok_or(MigrateError::BadResume)?;
        conn.tx = TxCredits::resumed(peer.ring_size, peer.recv_credits, at.granted_end);
        conn.tx_acked = state.tx_posted;
        conn.tx_posted = state.tx_posted;
        conn.tx_queued = state.tx_queued;
        let flag = |f: u8| state.flags & f != 0;
        conn.write_shut = flag(F_WRITE_SHUT);
        conn.read_shut = flag(F_READ_SHUT);
        conn.read_closed = flag(F_READ_CLOSED);
        conn.fin_sent = flag(F_FIN_SENT);
        conn.fin_received = flag(F_FIN_RECEIVED);
        conn.active = false;
        Ok(conn)
    }

    // ---- inside the core --------------------------------------------------------------------

    /// The hand-over's part of `poll_write`: `Some(next)` while it decides what is posted.
    pub(super) fn migration_write(&mut self) -> Option<Option<Write>> {
        match self.migration {
            Migration::None => None,
            Migration::Leaving { port } => {
                // The last credit may go on MIGRATE: nothing follows it on this queue pair.
                if !(self.tx.allows(MsgClass::Reset) && self.sq_room(1)) {
                    return Some(None);
                }
                self.tx.spend_wr();
                self.migration = Migration::Left;
                Some(Some(self.control(Imm::Migrate { port }, true)))
            }
            Migration::Left => Some(None),
            // Quiesce: fence the unsignaled tail so its completion proves everything landed.
            Migration::PeerMoving { .. } if self.unsignaled_wrs > 0 && self.sq_room(1) => {
                self.stats.fences += 1;
                Some(Some(self.work_request(0, 0, 0, None, true)))
            }
            Migration::PeerMoving { .. } => Some(None),
        }
    }

    /// Whether the hand-over still owes a work request (see `output_pending`).
    pub(super) fn migration_output_pending(&self) -> bool {
        match self.migration {
            Migration::Leaving { .. } => true,
            Migration::PeerMoving { .. } => self.unsignaled_wrs > 0,
            _ => false,
        }
    }

    /// A MIGRATE from the peer.
    pub(super) fn on_migrate(&mut self, port: u16) -> Result<(), ProtocolError> {
        match self.migration {
            Migration::PeerMoving { .. } => return Err(ProtocolError::AfterMigrate),
            // Both ends started at once: the passive end's move wins, the active end yields
            // (its own taker is refused and can try again on the new queue pair).
            Migration::Leaving { .. } | Migration::Left if !self.active => return Ok(()),
            _ => {}
        }
        if self.is_reset() {
            return Ok(());
        }
        self.migration = Migration::PeerMoving { port };
        self.cancel_ring_growth();
        self.planned.clear(); // nothing is planned between poll_write calls; keep it so
        self.events |= EV_MOVING;
        Ok(())
    }

    /// Whether an immediate may still arrive on this queue pair.
    pub(super) fn migration_allows_input(&self) -> bool {
        !matches!(self.migration, Migration::PeerMoving { .. })
    }

    /// Whether a disconnect of the old queue pair is expected rather than a failure: P has
    /// quiesced and O tears its side down once T has the state.
    pub(super) fn migration_expects_disconnect(&self) -> bool {
        self.ready_to_resume()
    }

    /// Whether the hand-over keeps the connection from finishing (memory must stay).
    pub(super) fn migrating(&self) -> bool {
        self.migration != Migration::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handover_round_trips_and_refuses_short_input() {
        let h = Handover {
            ring_size: 4096,
            rx_consumed: 1,
            rx_received_end: 2,
            rx_returned: 0,
            tx_posted: u64::MAX - 1,
            tx_queued: u64::MAX,
            flags: F_FIN_SENT | F_WRITE_SHUT,
        };
        let b = h.to_bytes();
        assert_eq!(Handover::parse(&b), Some(h));
        assert_eq!(Handover::parse(&b[..Handover::LEN - 1]), None);
    }

    #[test]
    fn the_bytes_a_handover_carries_follow_its_counters() {
        let mut h = Handover {
            ring_size: 16,
            rx_consumed: 10,
            rx_received_end: 14,
            rx_returned: 10,
            tx_posted: 100,
            tx_queued: 103,
            flags: 0,
        };
        assert_eq!((h.unread_len(), h.unsent_len()), (Some(4), Some(3)));
        h.flags = F_READ_CLOSED; // unread bytes are discarded, not exported
        assert_eq!((h.unread_len(), h.unsent_len()), (Some(0), Some(3)));
        h.rx_consumed = 15;
        h.tx_posted = 104;
        assert_eq!((h.unread_len(), h.unsent_len()), (None, None));
    }
}
