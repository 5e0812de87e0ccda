//! The immediate of a stream that shares a link (docs/DESIGN.md, "Links"): which stream, and
//! what a lone connection's immediate ([`Imm`]) would say, in the bits left over.
//!
//! ```text
//! 0   | stream:15 | len:16               DATA, len 1..=65535
//! 100 | stream:15 | wrs:4 | pages:10     CREDIT, not both zero; bytes in 4 KiB pages
//! 101 | stream:15 | op:6  | 0:8          FIN (op 1), RESET (op 2), SWITCHED (op 6)
//! 110 | stream:15 | pages:14             DATA of pages x 4 KiB, pages 16..=16383
//! 111                                    reserved
//! ```
//!
//! A ring's growth (§12's GROW pair) and migration carry addresses and ports that do not fit:
//! on a link GROW is a record of the link's control stream (stream 0), and migration is not
//! carried at all; SWITCHED, which must stay in order with the stream's data, is an immediate. Decoding is canonical: whatever
//! decodes re-encodes to the same value.

use crate::proto::wire::{Imm, ImmError};

/// Highest stream id on a link; 0 is the link's control stream.
pub const MAX_STREAM: u16 = 0x7fff;
/// Longest burst of any length one link immediate announces (DATA).
pub const MAX_DATA_LEN: u32 = 0xffff;
/// Longest burst one link immediate announces (DATA in pages, for a ring that grew): longer
/// bursts are cut to whole pages, and bursts over [`MAX_DATA_LEN`] are whole pages.
pub const MAX_PAGED_DATA_LEN: u32 = MAX_PAGED * CREDIT_UNIT;
const MAX_PAGED: u32 = 0x3fff;
/// The fewest pages DATA in pages carries: fewer fit DATA, which is then the only encoding.
const MIN_PAGED: u32 = MAX_DATA_LEN / CREDIT_UNIT + 1;
/// Most receives one credit immediate returns.
pub const MAX_CREDIT_WRS: u32 = 0xf;
/// Unit of ring bytes a credit immediate returns: rings on a link are whole pages.
pub const CREDIT_UNIT: u32 = 4096;
/// Most ring bytes one credit immediate returns.
pub const MAX_CREDIT_BYTES: u32 = 0x3ff * CREDIT_UNIT;

const STREAM_SHIFT: u32 = 16;
const CTRL_STREAM_SHIFT: u32 = 14;
const TAG_SHIFT: u32 = 29;
const TAG_CREDIT: u32 = 0b100;
const TAG_CONTROL: u32 = 0b101;
const TAG_PAGED: u32 = 0b110;
const WRS_SHIFT: u32 = 10;
const PAGES_MASK: u32 = 0x3ff;
const OP_SHIFT: u32 = 8;
const OP_MASK: u32 = 0x3f;
const OP_FIN: u32 = 1;
const OP_RESET: u32 = 2;
/// §12's SWITCHED, with §3's op number.
const OP_SWITCHED: u32 = 6;

/// A stream's number on its link, `0..=MAX_STREAM`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(u16);

impl StreamId {
    /// The link's control stream.
    pub const CONTROL: StreamId = StreamId(0);

    /// The id `n`, if it is one (`0..=MAX_STREAM`).
    pub fn new(n: u16) -> Option<StreamId> {
        (n <= MAX_STREAM).then_some(StreamId(n))
    }

    /// Its number.
    pub fn get(self) -> u16 {
        self.0
    }

    /// Whether it is the link's control stream, which no record opens or closes.
    pub fn is_control(self) -> bool {
        self == StreamId::CONTROL
    }
}

/// Why an immediate cannot go on a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotEncodable {
    /// The GROW pair is a control record on a link, and a link's streams do not migrate.
    NotOnLink,
    /// A value beyond the link's limits (a burst over [`MAX_DATA_LEN`], a credit over its
    /// caps or not in whole pages, or an empty one).
    OutOfRange,
}

/// The link immediate of `imm` for stream `id`.
pub fn encode(id: StreamId, imm: Imm) -> Result<u32, NotEncodable> {
    let stream = u32::from(id.0);
    match imm {
        Imm::Data { len } if (1..=MAX_DATA_LEN).contains(&len) => Ok(stream << STREAM_SHIFT | len),
        Imm::Data { len }
            if len > MAX_DATA_LEN && len % CREDIT_UNIT == 0 && len <= MAX_PAGED_DATA_LEN =>
        {
            Ok((TAG_PAGED << TAG_SHIFT) | (stream << CTRL_STREAM_SHIFT) | (len / CREDIT_UNIT))
        }
        Imm::Credit { wrs, bytes }
            if wrs <= MAX_CREDIT_WRS
                && bytes <= MAX_CREDIT_BYTES
                && bytes % CREDIT_UNIT == 0
                && (wrs, bytes) != (0, 0) =>
        {
            Ok((TAG_CREDIT << TAG_SHIFT)
                | (stream << CTRL_STREAM_SHIFT)
                | (wrs << WRS_SHIFT)
                | (bytes / CREDIT_UNIT))
        }
        Imm::Fin => Ok(control(stream, OP_FIN)),
        Imm::Reset => Ok(control(stream, OP_RESET)),
        Imm::Switched => Ok(control(stream, OP_SWITCHED)),
        Imm::Data { .. } | Imm::Credit { .. } => Err(NotEncodable::OutOfRange),
        Imm::Migrate { .. } | Imm::GrowHi { .. } | Imm::Grow { .. } => Err(NotEncodable::NotOnLink),
    }
}

fn control(stream: u32, op: u32) -> u32 {
    TAG_CONTROL << TAG_SHIFT | stream << CTRL_STREAM_SHIFT | op << OP_SHIFT
}

/// The stream and meaning of the link immediate `v` (host order).
pub fn decode(v: u32) -> Result<(StreamId, Imm), ImmError> {
    if v >> 31 == 0 {
        let len = v & MAX_DATA_LEN;
        if len == 0 {
            return Err(ImmError::EmptyData);
        }
        return Ok((StreamId((v >> STREAM_SHIFT) as u16), Imm::Data { len }));
    }
    let id = StreamId((v >> CTRL_STREAM_SHIFT) as u16 & MAX_STREAM);
    match v >> TAG_SHIFT {
        TAG_CREDIT => {
            let wrs = (v >> WRS_SHIFT) & MAX_CREDIT_WRS;
            let bytes = (v & PAGES_MASK) * CREDIT_UNIT;
            if wrs == 0 && bytes == 0 {
                return Err(ImmError::EmptyCredit);
            }
            Ok((id, Imm::Credit { wrs, bytes }))
        }
        TAG_CONTROL => {
            if v & ((1 << OP_SHIFT) - 1) != 0 {
                return Err(ImmError::ReservedBits(v));
            }
            match (v >> OP_SHIFT) & OP_MASK {
                OP_FIN => Ok((id, Imm::Fin)),
                OP_RESET => Ok((id, Imm::Reset)),
                OP_SWITCHED => Ok((id, Imm::Switched)),
                op => Err(ImmError::UnknownOp(op as u8)),
            }
        }
        TAG_PAGED => {
            let pages = v & MAX_PAGED;
            if pages < MIN_PAGED {
                return Err(ImmError::ReservedBits(v)); // DATA says it
            }
            Ok((
                id,
                Imm::Data {
                    len: pages * CREDIT_UNIT,
                },
            ))
        }
        tag => Err(ImmError::UnknownOp(tag as u8)),
    }
}

/// How a connection writes and reads its immediates: alone on its queue pair ([`Imm`]'s own
/// encoding), or as one stream of a link. The limits that differ live here too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Codec {
    /// A connection with a queue pair of its own.
    Lone,
    /// A stream of a link, which each end names by an id of its own (PROTOCOL.md §14): the
    /// immediates it sends carry `theirs`, the ones it gets must carry `mine`.
    Link {
        /// This end's id of the stream.
        mine: StreamId,
        /// The peer's id of the stream.
        theirs: StreamId,
    },
}

impl Codec {
    /// The immediate of `imm`. The connection sends only what its codec carries: bursts
    /// within [`max_data_len`](Self::max_data_len), credits within
    /// [`credit_caps`](Self::credit_caps), and on a link no growth or migration.
    pub fn encode(self, imm: Imm) -> u32 {
        match self {
            Codec::Lone => imm.encode(),
            Codec::Link { theirs, .. } => {
                let v = encode(theirs, imm);
                debug_assert!(v.is_ok(), "{imm:?} on a link");
                v.unwrap_or(0)
            }
        }
    }

    /// The meaning of the immediate `v`, which must be this connection's.
    pub fn decode(self, v: u32) -> Result<Imm, ImmError> {
        match self {
            Codec::Lone => Imm::decode(v),
            Codec::Link { mine, .. } => match decode(v)? {
                (s, imm) if s == mine => Ok(imm),
                (s, _) => Err(ImmError::OtherStream(s.get())),
            },
        }
    }

    /// The burst to post of the `len` bytes the windows allow: all of them, or as many as
    /// one immediate announces (on a link: any length up to [`MAX_DATA_LEN`], whole pages
    /// beyond it).
    pub fn burst_len(self, len: u64) -> u32 {
        match self {
            Codec::Lone => len.min(u64::from(crate::proto::wire::MAX_DATA_LEN)) as u32,
            Codec::Link { .. } if len <= u64::from(MAX_DATA_LEN) => len as u32,
            Codec::Link { .. } => {
                len.min(u64::from(MAX_PAGED_DATA_LEN)) as u32 / CREDIT_UNIT * CREDIT_UNIT
            }
        }
    }

    /// What one credit immediate returns at most (receives, ring bytes) and the unit of its
    /// bytes.
    pub fn credit_caps(self) -> (u32, u32, u32) {
        match self {
            Codec::Lone => (
                crate::proto::wire::MAX_CREDIT_WRS,
                crate::proto::wire::MAX_CREDIT_BYTES,
                1,
            ),
            Codec::Link { .. } => (MAX_CREDIT_WRS, MAX_CREDIT_BYTES, CREDIT_UNIT),
        }
    }

    /// Whether growth and migration, which need more bits than a link immediate has, are
    /// messages of this connection.
    pub fn carries_moves(self) -> bool {
        self == Codec::Lone
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn id(n: u16) -> StreamId {
        StreamId::new(n).unwrap()
    }

    #[test]
    fn golden_values() {
        assert_eq!(encode(id(1), Imm::Data { len: 1 }), Ok(0x0001_0001));
        assert_eq!(
            encode(id(0x7fff), Imm::Data { len: 0xffff }),
            Ok(0x7fff_ffff)
        );
        let credit = Imm::Credit {
            wrs: 3,
            bytes: 2 * 4096,
        };
        assert_eq!(encode(id(5), credit), Ok(0x8001_4c02));
        assert_eq!(encode(id(5), Imm::Fin), Ok(0xa001_4100));
        assert_eq!(encode(id(0x7fff), Imm::Reset), Ok(0xbfff_c200));
        assert_eq!(encode(id(5), Imm::Switched), Ok(0xa001_4600));
        // 64 KiB and 64 MiB - 4 KiB of stream 5, in pages.
        assert_eq!(encode(id(5), Imm::Data { len: 0x10000 }), Ok(0xc001_4010));
        assert_eq!(
            encode(id(5), Imm::Data { len: 0x3fff * 4096 }),
            Ok(0xc001_7fff)
        );
        for v in [
            0xc001_4010,
            0xc001_7fff,
            0xa001_4600,
            0x0001_0001,
            0x7fff_ffff,
            0x8001_4c02,
            0xa001_4100,
            0xbfff_c200,
        ] {
            let (s, imm) = decode(v).unwrap();
            assert_eq!(encode(s, imm), Ok(v));
        }
    }

    #[test]
    fn bursts_on_a_link_are_any_length_to_64_kib_then_whole_pages() {
        let l = Codec::Link {
            mine: id(1),
            theirs: id(2),
        };
        assert_eq!(l.burst_len(1), 1);
        assert_eq!(l.burst_len(65_535), 65_535);
        assert_eq!(l.burst_len(70_000), 69_632);
        assert_eq!(l.burst_len(200_000), 196_608);
        assert_eq!(l.burst_len(u64::MAX), MAX_PAGED_DATA_LEN);
        assert_eq!(Codec::Lone.burst_len(200_000), 200_000);
        for len in [1, 65_535, 70_000, 200_000, 1 << 40] {
            let b = l.burst_len(len);
            assert_eq!(
                decode(l.encode(Imm::Data { len: b })),
                Ok((id(2), Imm::Data { len: b }))
            );
        }
    }

    #[test]
    fn what_a_link_cannot_carry() {
        let s = id(1);
        assert_eq!(
            encode(s, Imm::Data { len: 0 }),
            Err(NotEncodable::OutOfRange)
        );
        for len in [0x10001, 0x10000 + 4095, MAX_PAGED_DATA_LEN + 4096] {
            assert_eq!(
                encode(s, Imm::Data { len }),
                Err(NotEncodable::OutOfRange),
                "{len}"
            );
        }
        for credit in [
            Imm::Credit { wrs: 16, bytes: 0 },
            Imm::Credit { wrs: 0, bytes: 100 },
            Imm::Credit { wrs: 0, bytes: 0 },
            Imm::Credit {
                wrs: 1,
                bytes: MAX_CREDIT_BYTES + CREDIT_UNIT,
            },
        ] {
            assert_eq!(
                encode(s, credit),
                Err(NotEncodable::OutOfRange),
                "{credit:?}"
            );
        }
        for imm in [
            Imm::Migrate { port: 80 },
            Imm::grow_pair(7, 9)[0],
            Imm::grow_pair(7, 9)[1],
        ] {
            assert_eq!(encode(s, imm), Err(NotEncodable::NotOnLink), "{imm:?}");
        }
        assert_eq!(StreamId::new(0x8000), None);
    }

    #[test]
    fn malformed_immediates() {
        assert_eq!(decode(0x0005_0000), Err(ImmError::EmptyData));
        assert_eq!(decode(0x8001_4000), Err(ImmError::EmptyCredit));
        assert_eq!(
            decode(0xa001_4101),
            Err(ImmError::ReservedBits(0xa001_4101))
        );
        assert_eq!(decode(0xa001_4300), Err(ImmError::UnknownOp(3)));
        // DATA in pages of 15 pages or fewer (DATA says it), and the reserved tag.
        assert_eq!(
            decode(0xc001_400f),
            Err(ImmError::ReservedBits(0xc001_400f))
        );
        assert_eq!(
            decode(0xc000_0000),
            Err(ImmError::ReservedBits(0xc000_0000))
        );
        assert_eq!(decode(0xe000_0000), Err(ImmError::UnknownOp(0b111)));
        assert_eq!(decode(0xffff_ffff), Err(ImmError::UnknownOp(0b111)));
    }

    proptest! {
        /// Decoding is canonical: every value that decodes re-encodes to itself, for its stream.
        #[test]
        fn decode_is_canonical(v in any::<u32>()) {
            if let Ok((s, imm)) = decode(v) {
                prop_assert_eq!(encode(s, imm), Ok(v));
            }
        }

        /// Everything encodable comes back as it went.
        #[test]
        fn round_trip(n in 0..=MAX_STREAM, len in 1..=MAX_DATA_LEN, wrs in 0..=MAX_CREDIT_WRS,
                      pages in 0..=MAX_CREDIT_BYTES / CREDIT_UNIT, paged in MIN_PAGED..=MAX_PAGED) {
            let s = id(n);
            let mut imms = vec![
                Imm::Data { len },
                Imm::Data { len: paged * CREDIT_UNIT },
                Imm::Fin,
                Imm::Reset,
                Imm::Switched,
            ];
            if (wrs, pages) != (0, 0) {
                imms.push(Imm::Credit { wrs, bytes: pages * CREDIT_UNIT });
            }
            for imm in imms {
                let v = encode(s, imm).unwrap();
                prop_assert_eq!(decode(v), Ok((s, imm)));
            }
        }
    }
}
