//! The hand-over state's encoding: golden bytes, round trips, malformed and fuzzed input.

use super::*;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Four unread bytes, three unsent; the peer's FIN in and writing shut; readable and read
/// ended shown.
fn sample() -> Exported {
    Exported {
        handover: Handover {
            ring_size: 16,
            rx_consumed: 10,
            rx_received_end: 14,
            rx_returned: 8,
            tx_posted: 100,
            tx_queued: 103,
            flags: 0x11,
        },
        shown: Readiness {
            readable: true,
            writable: false,
            read_ended: true,
            hangup: false,
        },
        unread: b"abcd".to_vec(),
        unsent: b"xyz".to_vec(),
    }
}

#[test]
fn golden_state_bytes() {
    assert_eq!(
        hex(&sample().encode()),
        concat!(
            "00000010",         // ring size
            "000000000000000a", // consumed
            "000000000000000e", // received end
            "0000000000000008", // returned
            "0000000000000064", // posted
            "0000000000000067", // queued
            "11",               // flags: write_shut, fin_received
            "05",               // shown: readable, read ended
            "61626364",         // unread
            "78797a"            // unsent
        )
    );
}

#[test]
fn states_round_trip() {
    let mut x = sample();
    assert_eq!(Exported::decode(&x.encode()), Ok(x.clone()));
    // Nothing unread or unsent, every readiness bit, positions near the end of u64.
    x.handover.rx_consumed = u64::MAX;
    x.handover.rx_received_end = u64::MAX;
    x.handover.rx_returned = u64::MAX - 16;
    x.handover.tx_posted = u64::MAX - 1;
    x.handover.tx_queued = u64::MAX - 1;
    x.shown = Readiness::from_bits(0x0f);
    x.unread.clear();
    x.unsent.clear();
    assert_eq!(x.encode().len(), Exported::HEAD);
    assert_eq!(Exported::decode(&x.encode()), Ok(x));
}

#[test]
fn every_truncation_is_refused() {
    let b = sample().encode();
    for n in 0..b.len() {
        let want = if n < Exported::HEAD {
            BadState::Short
        } else {
            BadState::Missing
        };
        assert_eq!(Exported::decode(&b[..n]), Err(want), "{n} bytes");
    }
}

#[test]
fn malformed_states_are_refused() {
    let good = sample().encode();
    let mut b = good.clone();
    b.push(0);
    assert_eq!(Exported::decode(&b), Err(BadState::Trailing));
    let mut b = good.clone();
    b[Handover::LEN - 1] |= 0x20;
    assert_eq!(Exported::decode(&b), Err(BadState::Flags));
    let mut b = good.clone();
    b[Handover::LEN] |= 0x10;
    assert_eq!(Exported::decode(&b), Err(BadState::Shown));
    // Consumed past the received end; posted past the queued end.
    let mut x = sample();
    x.handover.rx_consumed = 15;
    assert_eq!(Exported::decode(&x.encode()), Err(BadState::Counters));
    let mut x = sample();
    x.handover.tx_posted = 104;
    assert_eq!(Exported::decode(&x.encode()), Err(BadState::Counters));
    // Reading closed: the unread bytes were discarded, so any that come are too many.
    let mut x = sample();
    x.handover.flags |= 4;
    assert_eq!(Exported::decode(&x.encode()), Err(BadState::Trailing));
    x.unread.clear();
    assert_eq!(Exported::decode(&x.encode()), Ok(x));
    // Counters that claim more than any buffer.
    let mut x = sample();
    x.handover.tx_queued = u64::MAX;
    assert_eq!(Exported::decode(&x.encode()), Err(BadState::Missing));
}

#[test]
fn any_bytes_decode_or_are_refused_without_panicking() {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut decoded = 0;
    for _ in 0..20_000 {
        let mut b = vec![0u8; Exported::HEAD + 32];
        for v in b.iter_mut() {
            let r = next();
            *v = if r.is_multiple_of(3) { 0 } else { r as u8 };
        }
        let mut len = (next() % b.len() as u64) as usize + 1;
        // Often small positions, so that their differences are lengths that fit, and often
        // exactly the length they say.
        if next().is_multiple_of(2) {
            for at in [4, 12, 28, 36] {
                b[at..at + 7].fill(0);
                b[at + 7] &= 0x0f;
            }
            b[Handover::LEN - 1] &= 0x3f;
            b[Handover::LEN] &= 0x1f;
            let h = Handover::parse(&b).expect("long enough");
            if let (Some(r), Some(s), true) = (h.unread_len(), h.unsent_len(), next() % 2 == 0) {
                len = Exported::HEAD + (r + s) as usize;
            }
        }
        b.truncate(len);
        // Whatever decodes is canonical: it re-encodes to the very same bytes.
        if let Ok(s) = Exported::decode(&b) {
            assert_eq!(s.encode(), b);
            decoded += 1;
        }
    }
    assert!(
        decoded > 100,
        "the property was exercised ({decoded} decodes)"
    );
}
