//! Decoder robustness: arbitrary bytes and immediates never panic, valid encodings round-trip,
//! and arbitrary peer input into a live connection is either accepted or refused cleanly.
//! (The same decoders are fuzzed by `fuzz/fuzz_targets/`.)

use proptest::prelude::*;
use proptest::test_runner::{Config as PtConfig, RngSeed};
use rsock_core::proto::wire::{
    field, names_branch, Hello, HelloError, HelloKind, Imm, ImmError, Reject, RejectReason,
    ResumePoint, MAGIC, MAX_REP_PRIVATE_DATA, VERSION,
};
use rsock_core::proto::{Params, ReadError, State};
use rsock_core::transport::mem::{Fault, Pair, Side};

fn pt_config(cases: u32) -> PtConfig {
    PtConfig {
        cases,
        rng_seed: RngSeed::Fixed(0x494d_4d21),
        failure_persistence: None,
        ..PtConfig::default()
    }
}

/// Bytes that often start like a real hello so the deeper checks are reached.
fn hello_like() -> impl Strategy<Value = Vec<u8>> {
    (
        proptest::collection::vec(any::<u8>(), 0..=MAX_REP_PRIVATE_DATA),
        any::<bool>(),
        any::<bool>(),
        0u8..=5,
    )
        .prop_map(|(mut b, magic, version, kind)| {
            if magic && b.len() >= 4 {
                b[..4].copy_from_slice(&MAGIC);
            }
            if version && b.len() >= 5 {
                b[4] = VERSION;
            }
            if b.len() >= 6 {
                b[5] = kind;
            }
            if b.len() >= 10 && b[8] > 0 {
                b[8] = 0; // keep the length field small enough to be plausible
            }
            b
        })
}

/// A valid hello with a few bytes overwritten, then cut or padded.
fn mutated_hello() -> impl Strategy<Value = Vec<u8>> {
    (
        valid_hello(),
        proptest::collection::vec((0usize..56, any::<u8>()), 0..4),
        0usize..=64,
    )
        .prop_map(|(h, edits, len)| {
            let mut b = vec![0u8; 64];
            h.emit(&mut b);
            for (i, v) in edits {
                b[i] = v;
            }
            b.truncate(len);
            b
        })
}

fn valid_hello() -> impl Strategy<Value = Hello> {
    (
        prop_oneof![
            Just(HelloKind::Connect),
            Just(HelloKind::Accept),
            Just(HelloKind::Resume),
            Just(HelloKind::Link),
            Just(HelloKind::Branch),
            Just(HelloKind::BranchLink)
        ],
        any::<u16>(),
        0u64..(u64::MAX >> 2),
        any::<u32>(),
        1u32..=(1 << 30),
        4u32..=(1 << 16),
        any::<u64>(),
        any::<(u64, u64)>(),
    )
        .prop_map(
            |(kind, flags, ring_addr, rkey, ring_size, recv_credits, conn_id, (sent, granted))| {
                Hello {
                    kind,
                    flags,
                    ring_addr,
                    rkey,
                    ring_size,
                    recv_credits,
                    conn_id,
                    resume: (kind == HelloKind::Resume).then_some(ResumePoint {
                        sent_end: sent,
                        granted_end: granted,
                    }),
                    branch: names_branch(kind, flags).then_some(sent ^ granted),
                }
            },
        )
}

proptest! {
    #![proptest_config(pt_config(4096))]

    #[test]
    fn fuzz_hello_parse_never_panics(buf in prop_oneof![hello_like(), mutated_hello()]) {
        match Hello::parse(&buf) {
            Ok(h) => {
                prop_assert!(h.check().is_ok());
                // Re-encoding keeps every field; only `reserved` (ignored) and `len`
                // (extensions skipped) may differ from the input.
                prop_assert_eq!(Hello::parse(&h.to_bytes()), Ok(h));
                let (out, n) = (h.to_bytes(), h.encoded_len());
                prop_assert_eq!(&out[..field::LEN.start], &buf[..field::LEN.start]);
                prop_assert_eq!(&out[field::RKEY.start..n], &buf[field::RKEY.start..n]);
            }
            Err(HelloError::Truncated { needed, got }) => {
                prop_assert_eq!(got, buf.len());
                prop_assert!(needed > got);
            }
            Err(_) => {}
        }
        let _ = Reject::parse(&buf);
    }

    #[test]
    fn fuzz_imm_decode_is_canonical(v in any::<u32>()) {
        if let Ok(imm) = Imm::decode(v) {
            prop_assert_eq!(imm.encode(), v);
        }
    }

    #[test]
    fn hello_round_trip(h in valid_hello(), pad in 0usize..=(MAX_REP_PRIVATE_DATA - Hello::RESUME_LEN)) {
        let mut buf = vec![0u8; h.encoded_len() + pad];
        h.emit(&mut buf);
        prop_assert_eq!(Hello::parse(&buf), Ok(h));
    }

    #[test]
    fn reject_round_trip(code in any::<u16>()) {
        let r = Reject::new(RejectReason::from(code));
        prop_assert_eq!(Reject::parse(&r.to_bytes()), Ok(r));
        prop_assert_eq!(u16::from(r.reason), code);
    }
}

fn peer_imm() -> impl Strategy<Value = u32> {
    prop_oneof![
        2 => any::<u32>(),
        3 => (1u32..=200).prop_map(|len| Imm::Data { len }.encode()),
        3 => (0u32..=6, 0u32..=200)
            .prop_filter("non-empty", |&(w, b)| w + b > 0)
            .prop_map(|(wrs, bytes)| Imm::Credit { wrs, bytes }.encode()),
        1 => Just(Imm::Fin.encode()),
        1 => Just(Imm::Reset.encode()),
        1 => (1u16..=u16::MAX).prop_map(|port| Imm::Migrate { port }.encode()),
    ]
}

proptest! {
    #![proptest_config(pt_config(1024))]

    /// A hostile peer: random immediates injected between ordinary traffic. The connection
    /// must refuse bad ones with an error, never panic, and stay consistent for good ones.
    #[test]
    fn hostile_peer_never_panics(
        imms in proptest::collection::vec((peer_imm(), 0usize..=40), 1..40),
    ) {
        let cfg = Params { ring_size: 64, recv_credits: 6, send_buf_size: 64, send_queue_depth: 8, max_inline: 4, ring_grow_to: 0, send_grow_to: 0 };
        let mut p = Pair::new(cfg.clone(), cfg);
        // Injected data makes A return credits for bytes B never wrote; that is the point.
        p.check_grants = false;
        let mut buf = [0u8; 50];
        for (imm, n) in imms {
            let _ = p.write(Side::A, &buf[..n]);
            p.inject_imm(Side::A, imm);
            match p.step() {
                Ok(_) | Err(Fault::Protocol { .. }) => {}
                Err(f) => prop_assert!(false, "{f:?}"),
            }
            match p.read(Side::A, &mut buf) {
                Ok(k) => prop_assert!(k <= buf.len()),
                Err(ReadError::Blocked) | Err(ReadError::Reset) => {}
            }
            if p.a.conn.error().is_some() {
                prop_assert_eq!(p.a.conn.state(), State::Reset);
                prop_assert!(p.a.conn.poll_write().is_none());
            }
        }
    }
}

proptest! {
    #![proptest_config(pt_config(512))]

    /// Issue #21: after honest traffic that leaves the ring anywhere, a DATA is accepted
    /// exactly when its write carried the burst's part after the ring's wrap (all of it if
    /// it does not wrap), computed here independently of the core.
    #[test]
    fn data_is_accepted_exactly_when_its_write_length_matches(
        ring in 1u32..=80,
        before in 0usize..=200,
        len_pick in any::<u32>(),
        written in prop_oneof![Just(None), (0u32..=100).prop_map(Some)],
    ) {
        let cfg = Params { ring_size: ring, recv_credits: 8, send_buf_size: 64, send_queue_depth: 8, max_inline: 4, ring_grow_to: 0, send_grow_to: 0 };
        let mut p = Pair::new(cfg.clone(), cfg);
        let data: Vec<u8> = (0..before).map(|i| i as u8).collect();
        let mut sent = 0;
        let mut got = Vec::new();
        let mut buf = [0u8; 64];
        while got.len() < before {
            if sent < before {
                sent += p.write(Side::A, &data[sent..]).unwrap_or(0);
            }
            p.step().unwrap();
            while let Ok(n @ 1..) = p.read(Side::B, &mut buf) {
                got.extend_from_slice(&buf[..n]);
            }
        }
        prop_assert_eq!(&got, &data);
        p.drive().unwrap();
        let c = p.b.conn.counters();
        let window = (c.rx_granted_end - c.rx_received_end) as u32;
        prop_assume!(window > 0);
        let len = 1 + len_pick % window;
        let off = (c.rx_received_end % u64::from(ring)) as u32;
        let due = if off + len <= ring { len } else { off + len - ring };
        let written = written.unwrap_or(due);
        p.inject_write(Side::B, Imm::Data { len }.encode(), written);
        let r = p.recv(Side::B);
        if written == due {
            prop_assert_eq!(r, Ok(true));
        } else {
            prop_assert!(matches!(r, Err(Fault::Protocol { .. })), "{:?}", r);
            prop_assert_eq!(p.b.conn.state(), State::Reset);
        }
    }
}

#[test]
fn wrong_magic_and_version_are_distinct_errors() {
    let good = Params::default()
        .hello(HelloKind::Connect, 0x1000, 7, 9)
        .to_bytes();
    let mut foreign = good;
    foreign[..4].copy_from_slice(b"SSH-");
    assert_eq!(Hello::parse(&foreign), Err(HelloError::BadMagic(*b"SSH-")));
    let mut future = good;
    future[4] = VERSION + 1;
    let err = Hello::parse(&future).unwrap_err();
    assert_eq!(err, HelloError::UnsupportedVersion(VERSION + 1));
    // The passive side answers with a reject any version can read.
    let rej = Reject::new(RejectReason::for_error(&err)).to_bytes();
    assert_eq!(
        Hello::parse_kind(&rej, HelloKind::Accept),
        Err(HelloError::Rejected(Reject {
            version: VERSION,
            reason: RejectReason::UnsupportedVersion
        }))
    );
    assert_eq!(
        Hello::parse(&[]),
        Err(HelloError::Truncated { needed: 4, got: 0 })
    );
}

#[test]
fn imm_errors_are_specific() {
    assert_eq!(Imm::decode(0), Err(ImmError::EmptyData));
    assert_eq!(Imm::decode(0x8000_0000), Err(ImmError::EmptyCredit));
    assert_eq!(Imm::decode(0xc700_0000), Err(ImmError::UnknownOp(7)));
    // MIGRATE needs a port, and only 16 bits of argument.
    assert_eq!(
        Imm::decode(0xc300_0000),
        Err(ImmError::ReservedBits(0xc300_0000))
    );
    assert_eq!(
        Imm::decode(0xc1ff_ffff),
        Err(ImmError::ReservedBits(0xc1ff_ffff))
    );
}
