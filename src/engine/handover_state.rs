//! The hand-over state as it travels from the old owner to the taker (PROTOCOL.md §11, "The
//! hand-over state"): one type, encoded by the old owner's export and decoded by the taker,
//! so the two sides cannot disagree on the layout.

use crate::proto::{Handover, Readiness};
use std::fmt;

/// What the old owner passes the taker: the protocol's positions and flags, what its doorbell
/// showed, the unread ring bytes and the queued unsent bytes, each in stream order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exported {
    pub handover: Handover,
    /// The readiness the doorbell shows, so the taker continues from it.
    pub shown: Readiness,
    /// [`Handover::unread_len`] bytes.
    pub unread: Vec<u8>,
    /// [`Handover::unsent_len`] bytes.
    pub unsent: Vec<u8>,
}

/// Why bytes are not a hand-over state. The texts are part of the take-over's log lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadState {
    /// Shorter than the fixed part.
    Short,
    /// Flag bits beyond [`Handover::FLAG_NAMES`].
    Flags,
    /// Readiness bits beyond the four defined.
    Shown,
    /// Consumed past the received end, or posted past the queued end.
    Counters,
    /// Fewer bytes than the counters say.
    Missing,
    /// More bytes than the counters say.
    Trailing,
}

impl fmt::Display for BadState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BadState::Short => "short state",
            BadState::Flags => "unknown flags",
            BadState::Shown => "unknown readiness bits",
            BadState::Counters => "counters out of order",
            BadState::Missing => "bytes missing",
            BadState::Trailing => "byte count differs",
        })
    }
}

impl Exported {
    /// The fixed part: the hand-over, then the readiness byte.
    pub const HEAD: usize = Handover::LEN + 1;

    /// The bytes for the taker. `unread` and `unsent` are as long as the counters say (as the
    /// export makes them), else [`decode`](Self::decode) refuses the result.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::HEAD + self.unread.len() + self.unsent.len());
        out.extend_from_slice(&self.handover.to_bytes());
        out.push(self.shown.bits());
        out.extend_from_slice(&self.unread);
        out.extend_from_slice(&self.unsent);
        out
    }

    /// The state in `b`, refused whole if anything is off; whatever decodes re-encodes to
    /// the same bytes. Whether the positions fit a connection is `Conn::from_handover`'s.
    pub fn decode(b: &[u8]) -> Result<Exported, BadState> {
        let handover = Handover::parse(b).ok_or(BadState::Short)?;
        if handover.flags >> Handover::FLAG_NAMES.len() != 0 {
            return Err(BadState::Flags);
        }
        let bits = *b.get(Handover::LEN).ok_or(BadState::Short)?;
        let shown = Readiness::from_bits(bits);
        if shown.bits() != bits {
            return Err(BadState::Shown);
        }
        let len = |n: Option<u64>| {
            let n = n.ok_or(BadState::Counters)?;
            usize::try_from(n).map_err(|_| BadState::Missing)
        };
        let unread = len(handover.unread_len())?;
        let unsent = len(handover.unsent_len())?;
        let rest = b.get(Self::HEAD..).ok_or(BadState::Short)?;
        let want = unread.checked_add(unsent).ok_or(BadState::Missing)?;
        if rest.len() < want {
            return Err(BadState::Missing);
        }
        if rest.len() > want {
            return Err(BadState::Trailing);
        }
        let (unread, unsent) = rest.split_at(unread);
        Ok(Exported {
            handover,
            shown,
            unread: unread.to_vec(),
            unsent: unsent.to_vec(),
        })
    }
}

#[cfg(test)]
mod tests;
