//! The control records of a link (link/record.rs): golden bytes both ways, every refusal,
//! incremental parsing of a byte stream, and property tests (no panic on any bytes, canonical
//! decoding, valid records round-trip however the stream is cut).

use super::imm::StreamId;
use super::record::{
    Accept, Grant, Grow, Open, Record, RecordError, RefuseReason, MAX_RECORD_LEN, MAX_RING_SIZE,
    MIN_RECV_CREDITS, MIN_RING_SIZE,
};
use proptest::prelude::*;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};

fn id(n: u16) -> StreamId {
    StreamId::new(n).unwrap()
}

fn open() -> Open {
    Open {
        opener: id(5),
        granted: None,
        from_port: 0,
        recv_credits: 16,
        ring_size: 32 * 1024,
        ring_rkey: 0xdead_beef,
        ring_addr: 0x1_8000,
        conn_id: 0x0123_4567_89ab_cdef,
        dest: "192.0.2.10:8080".parse().unwrap(),
    }
}

const OPEN_BYTES: [u8; 56] = [
    0x00, 0x38, // len 56
    0x01, // kind: OPEN
    0x00, // flags
    0x00, 0x05, // opener id 5
    0x00, 0x10, // recv credits 16
    0x00, 0x00, 0x80, 0x00, // ring size 32 KiB
    0xde, 0xad, 0xbe, 0xef, // ring rkey
    0x00, 0x00, // granted id: none
    0x00, 0x00, // reserved
    0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x80, 0x00, // ring addr
    0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, // conn id
    0x1f, 0x90, // port 8080
    0x04, // family: IPv4
    0x00, // reserved
    0xc0, 0x00, 0x02, 0x0a, // 192.0.2.10
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // padding
];

/// An OPEN at every upper limit, to an IPv6 destination.
fn open_v6() -> Open {
    Open {
        opener: id(0x7fff),
        granted: None,
        from_port: 0,
        recv_credits: 0xffff,
        ring_size: MAX_RING_SIZE,
        ring_rkey: 1,
        ring_addr: u64::MAX - u64::from(MAX_RING_SIZE),
        conn_id: 0,
        dest: "[2001:db8::1]:443".parse().unwrap(),
    }
}

const OPEN_V6_BYTES: [u8; 56] = [
    0x00, 0x38, 0x01, 0x00, // len 56, OPEN, flags
    0x7f, 0xff, // opener id 0x7fff
    0xff, 0xff, // recv credits 65535
    0x40, 0x00, 0x00, 0x00, // ring size 1 GiB
    0x00, 0x00, 0x00, 0x01, // ring rkey
    0x00, 0x00, 0x00, 0x00, // granted id: none; reserved
    0xff, 0xff, 0xff, 0xff, 0xbf, 0xff, 0xff, 0xff, // ring addr: its end is 2^64 - 1
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // conn id
    0x01, 0xbb, // port 443
    0x06, // family: IPv6
    0x00, // reserved
    0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00, //
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, // 2001:db8::1
];

fn accept() -> Accept {
    Accept {
        opener: id(5),
        acceptor: id(9),
        recv_credits: 16,
        ring_size: 32 * 1024,
        ring_rkey: 0x0bad_f00d,
        ring_addr: 0x4_0000,
        conn_id: 0x0123_4567_89ab_cdef,
    }
}

const ACCEPT_BYTES: [u8; 36] = [
    0x00, 0x24, // len 36
    0x02, // kind: ACCEPT
    0x00, // flags
    0x00, 0x05, // opener id 5
    0x00, 0x09, // acceptor id 9
    0x00, 0x10, // recv credits 16
    0x00, 0x00, // reserved
    0x00, 0x00, 0x80, 0x00, // ring size 32 KiB
    0x0b, 0xad, 0xf0, 0x0d, // ring rkey
    0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, // ring addr
    0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, // conn id, echoed
];

const REFUSE_BYTES: [u8; 8] = [
    0x00, 0x08, 0x03, 0x00, // len 8, REFUSE, flags
    0x00, 0x05, // opener id 5
    0x02, // reason: backlog full
    0x00, // reserved
];

const CLOSE_BYTES: [u8; 8] = [
    0x00, 0x08, 0x04, 0x00, // len 8, CLOSE, flags
    0x00, 0x09, // closer id 9 (the sender's)
    0x00, 0x05, // peer id 5 (the receiver's)
];

const GOODBYE_BYTES: [u8; 4] = [0x00, 0x04, 0x05, 0x00];

fn golden() -> Vec<(Record, &'static [u8])> {
    vec![
        (Record::Open(open()), &OPEN_BYTES),
        (Record::Open(open_v6()), &OPEN_V6_BYTES),
        (Record::Accept(accept()), &ACCEPT_BYTES),
        (
            Record::Refuse {
                opener: id(5),
                reason: RefuseReason::BacklogFull,
            },
            &REFUSE_BYTES,
        ),
        (
            Record::Close {
                closer: id(9),
                peer: id(5),
            },
            &CLOSE_BYTES,
        ),
        (Record::Goodbye, &GOODBYE_BYTES),
    ]
}

#[test]
fn golden_records_encode_to_their_bytes() {
    for (record, bytes) in golden() {
        assert_eq!(record.encoded_len(), bytes.len(), "{record:?}");
        // Over a poisoned buffer: reserved bytes are written, bytes past the record are not.
        let mut buf = [0xa5u8; MAX_RECORD_LEN + 8];
        assert_eq!(record.write_to(&mut buf), Some(bytes.len()), "{record:?}");
        assert_eq!(&buf[..bytes.len()], bytes, "{record:?}");
        assert!(buf[bytes.len()..].iter().all(|&b| b == 0xa5), "{record:?}");
    }
}

#[test]
fn golden_bytes_parse_to_their_records() {
    for (record, bytes) in golden() {
        assert_eq!(Record::parse(bytes), Ok(Some((record, bytes.len()))));
    }
}

#[test]
fn write_to_needs_room_for_the_whole_record() {
    for (record, bytes) in golden() {
        let mut buf = [0xa5u8; MAX_RECORD_LEN];
        assert_eq!(record.write_to(&mut buf[..bytes.len() - 1]), None);
        assert_eq!(buf, [0xa5; MAX_RECORD_LEN], "{record:?}: nothing written");
    }
}

#[test]
fn no_record_is_longer_than_max_record_len() {
    for (record, _) in golden() {
        assert!(record.encoded_len() <= MAX_RECORD_LEN);
    }
    assert_eq!(Record::Open(open()).encoded_len(), MAX_RECORD_LEN);
}

#[test]
fn every_refuse_reason_has_its_code() {
    let reasons = [
        (RefuseReason::NotMine, 1),
        (RefuseReason::BacklogFull, 2),
        (RefuseReason::Rule, 3),
        (RefuseReason::NoResources, 4),
        (RefuseReason::LinkClosing, 5),
    ];
    for (reason, code) in reasons {
        let mut bytes = REFUSE_BYTES;
        bytes[6] = code;
        let record = Record::Refuse {
            opener: id(5),
            reason,
        };
        assert_eq!(Record::parse(&bytes), Ok(Some((record, 8))));
        let mut out = [0u8; 8];
        record.write_to(&mut out);
        assert_eq!(out, bytes);
    }
}

/// A GRANT: stream 9 of the answerer, 16 receives, a 32 KiB ring at `0x20000`.
const GRANT_BYTES: [u8; 24] = [
    0x00, 0x18, 0x06, 0x00, // len 24, GRANT, flags
    0x00, 0x09, // acceptor id 9
    0x00, 0x10, // recv credits 16
    0x00, 0x00, 0x80, 0x00, // ring size 32 KiB
    0xde, 0xad, 0xbe, 0xef, // ring rkey
    0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, // ring addr
];

fn grant() -> Grant {
    Grant {
        acceptor: id(9),
        recv_credits: 16,
        ring_size: 32 * 1024,
        ring_rkey: 0xdead_beef,
        ring_addr: 0x2_0000,
    }
}

/// PROTOCOL.md §14, GROW: stream 7 (the grower's id) / 3 (the receiver's), a 256 KiB ring.
const GROW_BYTES: [u8; 24] = [
    0x00, 0x18, 0x07, 0x00, // header: len 24, kind 7, flags 0
    0x00, 0x07, 0x00, 0x03, // grower id, peer id
    0x00, 0x04, 0x00, 0x00, // ring size
    0xca, 0xfe, 0xf0, 0x0d, // ring rkey
    0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, // ring addr
];

fn grow() -> Grow {
    Grow {
        grower: id(7),
        peer: id(3),
        ring_size: 256 * 1024,
        ring_rkey: 0xcafe_f00d,
        ring_addr: 0x4_0000,
    }
}

#[test]
fn grow_golden_bytes_and_limits() {
    let mut out = [0u8; MAX_RECORD_LEN];
    assert_eq!(Record::Grow(grow()).write_to(&mut out), Some(24));
    assert_eq!(out[..24], GROW_BYTES);
    assert_eq!(
        Record::parse(&GROW_BYTES),
        Ok(Some((Record::Grow(grow()), 24)))
    );
    // A ring of part of a page, a control stream's id, an address that overflows.
    assert_eq!(
        Record::parse(&patched(&GROW_BYTES, 8, &[0, 4, 0, 1])),
        Err(RecordError::BadRingSize(0x4_0001))
    );
    assert_eq!(
        Record::parse(&patched(&GROW_BYTES, 6, &[0, 0])),
        Err(RecordError::BadStreamId(0))
    );
    assert_eq!(
        Record::parse(&patched(&GROW_BYTES, 16, &[0xff; 8])),
        Err(RecordError::BadRingAddr(u64::MAX))
    );
    assert_eq!(
        Record::parse(&patched(&GROW_BYTES, 3, &[1])),
        Err(RecordError::ReservedBits(3))
    );
}

#[test]
fn grant_and_granted_open_golden_bytes() {
    let mut out = [0u8; MAX_RECORD_LEN];
    assert_eq!(Record::Grant(grant()).write_to(&mut out), Some(24));
    assert_eq!(out[..24], GRANT_BYTES);
    assert_eq!(
        Record::parse(&GRANT_BYTES),
        Ok(Some((Record::Grant(grant()), 24)))
    );
    // An OPEN that takes stream 9 (flag GRANTED, the id at offset 16) from port 40961 (at
    // offset 18).
    let o = Open {
        granted: Some(id(9)),
        from_port: 0xa001,
        ..open()
    };
    let bytes = patched(&patched(&OPEN_BYTES, 3, &[1]), 16, &[0, 9, 0xa0, 0x01]);
    assert_eq!(Record::Open(o).write_to(&mut out), Some(56));
    assert_eq!(out[..56], bytes[..]);
    assert_eq!(Record::parse(&bytes), Ok(Some((Record::Open(o), 56))));
    use RecordError::*;
    for (what, b, e) in [
        ("granted id 0", patched(&bytes, 16, &[0, 0]), BadStreamId(0)),
        (
            "an id without the flag",
            patched(&OPEN_BYTES, 16, &[0, 9]),
            ReservedBits(17),
        ),
        ("flag 2", patched(&OPEN_BYTES, 3, &[2]), ReservedBits(3)),
        (
            "GRANTED on a GRANT",
            patched(&GRANT_BYTES, 3, &[1]),
            ReservedBits(3),
        ),
        (
            "GRANT of id 0",
            patched(&GRANT_BYTES, 4, &[0, 0]),
            BadStreamId(0),
        ),
        (
            "GRANT of 3 receives",
            patched(&GRANT_BYTES, 6, &[0, 3]),
            BadRecvCredits(3),
        ),
        (
            "GRANT one byte long",
            patched(&GRANT_BYTES, 0, &[0, 25]),
            BadLength { kind: 6, len: 25 },
        ),
    ] {
        assert_eq!(Record::parse(&b), Err(e), "{what}");
    }
}

#[test]
fn ipv4_mapped_destination_stays_ipv6() {
    let mapped: Ipv6Addr = "::ffff:192.0.2.10".parse().unwrap();
    let o = Open {
        dest: SocketAddr::new(IpAddr::V6(mapped), 8080),
        ..open()
    };
    let mut bytes = [0u8; 56];
    Record::Open(o).write_to(&mut bytes);
    assert_eq!(bytes[38], 6);
    assert_eq!(bytes[40..], mapped.octets());
    assert_eq!(Record::parse(&bytes), Ok(Some((Record::Open(o), 56))));
}

#[test]
fn ipv6_flow_label_and_scope_are_not_carried() {
    let scoped = SocketAddrV6::new("fe80::1".parse().unwrap(), 80, 7, 3);
    let o = Open {
        dest: SocketAddr::V6(scoped),
        ..open()
    };
    let mut bytes = [0u8; 56];
    Record::Open(o).write_to(&mut bytes);
    let unscoped = SocketAddrV6::new(*scoped.ip(), 80, 0, 0);
    let parsed = Open {
        dest: SocketAddr::V6(unscoped),
        ..o
    };
    assert_eq!(Record::parse(&bytes), Ok(Some((Record::Open(parsed), 56))));
}

/// `bytes` with `patch` written at `offset`.
fn patched(bytes: &[u8], offset: usize, patch: &[u8]) -> Vec<u8> {
    let mut b = bytes.to_vec();
    b[offset..offset + patch.len()].copy_from_slice(patch);
    b
}

#[test]
fn every_refusal() {
    use RecordError::*;
    let cases: Vec<(&str, Vec<u8>, RecordError)> = vec![
        ("kind 0", patched(&GOODBYE_BYTES, 2, &[0]), UnknownKind(0)),
        ("kind 8", patched(&GOODBYE_BYTES, 2, &[8]), UnknownKind(8)),
        (
            "kind 255",
            patched(&OPEN_BYTES, 2, &[255]),
            UnknownKind(255),
        ),
        (
            "OPEN one byte short",
            patched(&OPEN_BYTES, 0, &[0, 55]),
            BadLength { kind: 1, len: 55 },
        ),
        (
            "ACCEPT one byte long",
            patched(&ACCEPT_BYTES, 0, &[0, 37]),
            BadLength { kind: 2, len: 37 },
        ),
        (
            "REFUSE of length 0",
            patched(&REFUSE_BYTES, 0, &[0, 0]),
            BadLength { kind: 3, len: 0 },
        ),
        (
            "CLOSE of length 4",
            patched(&CLOSE_BYTES, 0, &[0, 4]),
            BadLength { kind: 4, len: 4 },
        ),
        (
            "GOODBYE of length 8",
            patched(&CLOSE_BYTES, 2, &[5]),
            BadLength { kind: 5, len: 8 },
        ),
        (
            "flags",
            patched(&GOODBYE_BYTES, 3, &[0x80]),
            ReservedBits(3),
        ),
        (
            "OPEN reserved u8",
            patched(&OPEN_BYTES, 39, &[1]),
            ReservedBits(39),
        ),
        (
            "ACCEPT reserved",
            patched(&ACCEPT_BYTES, 11, &[1]),
            ReservedBits(11),
        ),
        (
            "REFUSE reserved",
            patched(&REFUSE_BYTES, 7, &[1]),
            ReservedBits(7),
        ),
        (
            "OPEN opener 0",
            patched(&OPEN_BYTES, 4, &[0, 0]),
            BadStreamId(0),
        ),
        (
            "OPEN opener 0x8000",
            patched(&OPEN_BYTES, 4, &[0x80, 0]),
            BadStreamId(0x8000),
        ),
        (
            "ACCEPT opener 0",
            patched(&ACCEPT_BYTES, 4, &[0, 0]),
            BadStreamId(0),
        ),
        (
            "ACCEPT acceptor 0xffff",
            patched(&ACCEPT_BYTES, 6, &[0xff, 0xff]),
            BadStreamId(0xffff),
        ),
        (
            "REFUSE opener 0",
            patched(&REFUSE_BYTES, 4, &[0, 0]),
            BadStreamId(0),
        ),
        (
            "CLOSE closer 0",
            patched(&CLOSE_BYTES, 4, &[0, 0]),
            BadStreamId(0),
        ),
        (
            "CLOSE peer 0x8000",
            patched(&CLOSE_BYTES, 6, &[0x80, 0]),
            BadStreamId(0x8000),
        ),
        (
            "OPEN 3 receives",
            patched(&OPEN_BYTES, 6, &[0, 3]),
            BadRecvCredits(3),
        ),
        (
            "ACCEPT 0 receives",
            patched(&ACCEPT_BYTES, 8, &[0, 0]),
            BadRecvCredits(0),
        ),
        (
            "OPEN ring under a page",
            patched(&OPEN_BYTES, 8, &[0, 0, 0x0f, 0xff]),
            BadRingSize(4095),
        ),
        (
            "ACCEPT ring over 1 GiB",
            patched(&ACCEPT_BYTES, 12, &[0x40, 0, 0, 1]),
            BadRingSize(MAX_RING_SIZE + 1),
        ),
        (
            "OPEN ring past 2^64",
            patched(&OPEN_V6_BYTES, 20, &[0xff, 0xff, 0xff, 0xff, 0xc0, 0, 0, 0]),
            BadRingAddr(0xffff_ffff_c000_0000),
        ),
        (
            "ACCEPT ring past 2^64",
            patched(&ACCEPT_BYTES, 20, &[0xff; 8]),
            BadRingAddr(u64::MAX),
        ),
        ("port 0", patched(&OPEN_BYTES, 36, &[0, 0]), BadPort),
        ("family 0", patched(&OPEN_BYTES, 38, &[0]), BadFamily(0)),
        (
            "family 10 (AF_INET6)",
            patched(&OPEN_BYTES, 38, &[10]),
            BadFamily(10),
        ),
        ("IPv4 padding", patched(&OPEN_BYTES, 55, &[1]), BadAddress),
        (
            "IPv4 padding, first",
            patched(&OPEN_BYTES, 44, &[0xff]),
            BadAddress,
        ),
        ("reason 0", patched(&REFUSE_BYTES, 6, &[0]), BadReason(0)),
        ("reason 6", patched(&REFUSE_BYTES, 6, &[6]), BadReason(6)),
    ];
    for (what, bytes, err) in cases {
        assert_eq!(Record::parse(&bytes), Err(err), "{what}");
        assert!(!err.to_string().is_empty());
    }
}

#[test]
fn check_refuses_what_parse_refuses() {
    let o = open();
    let a = accept();
    let cases = [
        (
            Record::Open(Open {
                opener: StreamId::CONTROL,
                ..o
            }),
            RecordError::BadStreamId(0),
        ),
        (
            Record::Open(Open {
                recv_credits: MIN_RECV_CREDITS - 1,
                ..o
            }),
            RecordError::BadRecvCredits(3),
        ),
        (
            Record::Open(Open {
                ring_size: MIN_RING_SIZE - 1,
                ..o
            }),
            RecordError::BadRingSize(4095),
        ),
        (
            Record::Open(Open {
                ring_addr: u64::MAX,
                ..o
            }),
            RecordError::BadRingAddr(u64::MAX),
        ),
        (
            Record::Open(Open {
                dest: "[::1]:0".parse().unwrap(),
                ..o
            }),
            RecordError::BadPort,
        ),
        (
            Record::Accept(Accept {
                acceptor: StreamId::CONTROL,
                ..a
            }),
            RecordError::BadStreamId(0),
        ),
        (
            Record::Refuse {
                opener: StreamId::CONTROL,
                reason: RefuseReason::Rule,
            },
            RecordError::BadStreamId(0),
        ),
        (
            Record::Close {
                closer: id(1),
                peer: StreamId::CONTROL,
            },
            RecordError::BadStreamId(0),
        ),
    ];
    for (record, err) in cases {
        assert_eq!(record.check(), Err(err), "{record:?}");
        let mut bytes = [0u8; MAX_RECORD_LEN];
        let n = record.write_to(&mut bytes).unwrap();
        assert_eq!(Record::parse(&bytes[..n]), Err(err), "{record:?}");
    }
    for (record, _) in golden() {
        assert_eq!(record.check(), Ok(()));
    }
}

#[test]
fn every_strict_prefix_waits_for_more() {
    for (record, bytes) in golden() {
        for n in 0..bytes.len() {
            assert_eq!(
                Record::parse(&bytes[..n]),
                Ok(None),
                "{record:?}, {n} bytes"
            );
        }
    }
}

#[test]
fn records_back_to_back_parse_one_after_another() {
    let records = golden();
    let stream: Vec<u8> = records
        .iter()
        .flat_map(|(_, b)| b.iter().copied())
        .collect();
    let mut rest = &stream[..];
    for (record, bytes) in &records {
        assert_eq!(Record::parse(rest), Ok(Some((*record, bytes.len()))));
        rest = &rest[bytes.len()..];
    }
    assert_eq!(Record::parse(rest), Ok(None));
}

#[test]
fn a_wrong_length_is_refused_from_the_header_alone() {
    // A peer announcing a 60,000-byte OPEN is refused at once, not waited for.
    let header = [0xea, 0x60, 0x01, 0x00];
    assert_eq!(
        Record::parse(&header),
        Err(RecordError::BadLength {
            kind: 1,
            len: 60_000
        })
    );
    assert_eq!(
        Record::parse(&[0x00, 0x38, 0x09, 0x00]),
        Err(RecordError::UnknownKind(9))
    );
    assert_eq!(
        Record::parse(&[0x00, 0x38, 0x01, 0x02]),
        Err(RecordError::ReservedBits(3))
    );
    // With the right length, the same header waits for its body.
    assert_eq!(Record::parse(&OPEN_BYTES[..4]), Ok(None));
}

/// A valid stream id, not the control stream's.
fn stream_id() -> impl Strategy<Value = StreamId> {
    (1..=super::imm::MAX_STREAM).prop_map(id)
}

/// A valid ring: (size, rkey, addr).
fn ring() -> impl Strategy<Value = (u32, u32, u64)> {
    (MIN_RING_SIZE..=MAX_RING_SIZE, any::<u32>()).prop_flat_map(|(size, rkey)| {
        (0..=u64::MAX - u64::from(size)).prop_map(move |addr| (size, rkey, addr))
    })
}

fn dest() -> impl Strategy<Value = SocketAddr> {
    let ip = prop_oneof![
        any::<[u8; 4]>().prop_map(|b| IpAddr::V4(Ipv4Addr::from(b))),
        any::<[u8; 16]>().prop_map(|b| IpAddr::V6(Ipv6Addr::from(b))),
    ];
    (ip, 1..=u16::MAX).prop_map(|(ip, port)| SocketAddr::new(ip, port))
}

fn reason() -> impl Strategy<Value = RefuseReason> {
    prop_oneof![
        Just(RefuseReason::NotMine),
        Just(RefuseReason::BacklogFull),
        Just(RefuseReason::Rule),
        Just(RefuseReason::NoResources),
        Just(RefuseReason::LinkClosing),
    ]
}

fn record() -> impl Strategy<Value = Record> {
    let credits = MIN_RECV_CREDITS..=u16::MAX;
    prop_oneof![
        (
            stream_id(),
            (prop::option::of(stream_id()), any::<u16>()),
            credits.clone(),
            ring(),
            any::<u64>(),
            dest()
        )
            .prop_map(
                |(
                    opener,
                    (granted, from_port),
                    recv_credits,
                    (ring_size, ring_rkey, ring_addr),
                    conn_id,
                    dest,
                )| {
                    Record::Open(Open {
                        opener,
                        granted,
                        from_port,
                        recv_credits,
                        ring_size,
                        ring_rkey,
                        ring_addr,
                        conn_id,
                        dest,
                    })
                }
            ),
        (
            stream_id(),
            stream_id(),
            credits.clone(),
            ring(),
            any::<u64>()
        )
            .prop_map(
                |(opener, acceptor, recv_credits, (ring_size, ring_rkey, ring_addr), conn_id)| {
                    Record::Accept(Accept {
                        opener,
                        acceptor,
                        recv_credits,
                        ring_size,
                        ring_rkey,
                        ring_addr,
                        conn_id,
                    })
                }
            ),
        (stream_id(), reason()).prop_map(|(opener, reason)| Record::Refuse { opener, reason }),
        (stream_id(), stream_id()).prop_map(|(closer, peer)| Record::Close { closer, peer }),
        Just(Record::Goodbye),
        (stream_id(), stream_id(), ring()).prop_map(
            |(grower, peer, (ring_size, ring_rkey, ring_addr))| {
                let ring_size = (ring_size & !(MIN_RING_SIZE - 1)).max(MIN_RING_SIZE);
                Record::Grow(Grow {
                    grower,
                    peer,
                    ring_size,
                    ring_rkey,
                    ring_addr: ring_addr.min(u64::MAX - u64::from(ring_size)),
                })
            }
        ),
        (stream_id(), credits, ring()).prop_map(
            |(acceptor, recv_credits, (ring_size, ring_rkey, ring_addr))| {
                Record::Grant(Grant {
                    acceptor,
                    recv_credits,
                    ring_size,
                    ring_rkey,
                    ring_addr,
                })
            }
        ),
    ]
}

/// Whatever `buf` starts with, parsing it does not panic, and a record that parses
/// re-encodes to exactly the bytes it took.
fn parses_canonically(buf: &[u8]) -> Result<(), TestCaseError> {
    if let Ok(Some((record, n))) = Record::parse(buf) {
        prop_assert_eq!(record.check(), Ok(()));
        let mut out = [0u8; MAX_RECORD_LEN];
        prop_assert_eq!(record.write_to(&mut out), Some(n));
        prop_assert_eq!(&out[..n], &buf[..n]);
    }
    Ok(())
}

proptest! {
    /// Arbitrary bytes: no panic; whatever parses is canonical.
    #[test]
    fn arbitrary_bytes_parse_canonically(buf in prop::collection::vec(any::<u8>(), 0..80)) {
        parses_canonically(&buf)?;
    }

    /// Arbitrary bodies under a header that fits its kind, so the body checks are reached.
    #[test]
    fn arbitrary_bodies_parse_canonically(kind in 1u8..=7, flags in 0u8..=1,
                                          body in prop::collection::vec(any::<u8>(), 0..60)) {
        // The length of each kind, from PROTOCOL.md §14's tables.
        let len: u16 = [0, 56, 36, 8, 8, 4, 24, 24][usize::from(kind)];
        let mut buf = len.to_be_bytes().to_vec();
        buf.extend([kind, flags]);
        buf.extend(body);
        parses_canonically(&buf)?;
    }

    /// A valid record with a few bytes changed: no panic; whatever parses is canonical.
    #[test]
    fn mutated_records_parse_canonically(r in record(),
                                         edits in prop::collection::vec((0..MAX_RECORD_LEN, any::<u8>()), 1..4)) {
        let mut buf = [0u8; MAX_RECORD_LEN];
        let n = r.write_to(&mut buf).unwrap();
        for (at, b) in edits {
            buf[at % n] = b;
        }
        parses_canonically(&buf[..n])?;
    }

    /// Valid records come back as they went, however the stream is cut into reads.
    #[test]
    fn valid_records_round_trip(records in prop::collection::vec(record(), 1..8),
                                cut in 1..=MAX_RECORD_LEN + 4) {
        let mut stream = Vec::new();
        for r in &records {
            prop_assert_eq!(r.check(), Ok(()));
            let mut buf = [0u8; MAX_RECORD_LEN];
            let n = r.write_to(&mut buf).unwrap();
            prop_assert_eq!(n, r.encoded_len());
            stream.extend_from_slice(&buf[..n]);
        }
        // The reader sees `cut` more bytes at a time and parses whatever is complete.
        let (mut seen, mut start, mut got) = (0, 0, Vec::new());
        while got.len() < records.len() {
            prop_assert!(seen < stream.len(), "stream ended before its records");
            seen = (seen + cut).min(stream.len());
            while let Some((r, n)) = Record::parse(&stream[start..seen]).unwrap() {
                got.push(r);
                start += n;
            }
        }
        prop_assert_eq!(got, records);
        prop_assert_eq!(start, stream.len());
    }
}
