//! The control messages' encodings: golden bytes, round trips, malformed and fuzzed input.

use super::*;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

const TAKER: Owner = Owner {
    pid: 0x1234,
    nonce: 0x0102_0304_0506_0708,
};

#[test]
fn golden_request_bytes() {
    let take = Request::Take {
        token: 7,
        port: 4791,
        taker: TAKER,
    };
    assert_eq!(
        hex(&take.encode()),
        concat!(
            "5253434b01030000",
            "0700000000000000",
            "b712000000000000",
            "3412000000000000",
            "0807060504030201"
        )
    );
    let relay = Request::Relay { token: 0xab };
    assert_eq!(
        hex(&relay.encode()),
        format!("5253434b01010000ab00000000000000{}", "0".repeat(48))
    );
}

#[test]
fn golden_reply_bytes() {
    assert_eq!(
        hex(&Reply::Failed(libc::EAGAIN).encode()),
        format!("5253434b010000000b000000{}", "0".repeat(184))
    );
    let ends = Ends {
        local: "10.0.0.1:80".parse().unwrap(),
        peer: "10.0.0.2:4000".parse().unwrap(),
    };
    let b = Reply::Relay(ends).encode();
    assert_eq!(hex(&b[..48]), format!("5253434b01010000{}", "0".repeat(80)));
    // sockaddr_in: family 2 (host order), then port and address in network order.
    assert_eq!(hex(&b[48..56]), "020000500a000001");
    assert_eq!(hex(&b[76..84]), "02000fa00a000002");
    let m = Reply::Moved(TAKER).encode();
    assert_eq!(hex(&m[..8]), "5253434b01060000");
    assert_eq!(hex(&m[32..48]), "34120000000000000807060504030201");
    let l = Reply::Listening {
        token: 0x21,
        owner: TAKER,
        sizes: (16384u64 << 32) | 65536,
        local: ends.local,
    }
    .encode();
    assert_eq!(
        hex(&l[..48]),
        concat!(
            "5253434b01080000",
            "0000000000000000",
            "2100000000000000",
            "0000010000400000",
            "3412000000000000",
            "0807060504030201"
        )
    );
    assert_eq!(hex(&l[48..56]), "020000500a000001");
    assert!(l[56..104].iter().all(|&x| x == 0), "no peer");
}

#[test]
fn every_message_round_trips() {
    let ends = Ends {
        local: "[fe80::1]:80".parse().unwrap(),
        peer: "10.1.2.3:4567".parse().unwrap(),
    };
    let sizes = (16384u64 << 32) | 65536;
    for r in [
        Request::Relay { token: 1 },
        Request::Accept {
            token: 2,
            taker: None,
        },
        Request::Accept {
            token: 2,
            taker: Some(TAKER),
        },
        Request::Take {
            token: 3,
            port: 1,
            taker: TAKER,
        },
        Request::Export {
            token: u64::MAX,
            resume_at: 1 << 40,
            taker: TAKER,
        },
        Request::Describe { token: 8 },
        Request::Reclaim {
            token: 9,
            taker: TAKER,
            exiting: false,
        },
        Request::Reclaim {
            token: 9,
            taker: TAKER,
            exiting: true,
        },
        Request::Branch {
            token: 10,
            port: 50001,
            id: (1 << 48) - 1,
            taker: TAKER,
        },
        Request::Branch {
            token: 10,
            port: 0,
            id: 1,
            taker: TAKER,
        },
    ] {
        assert_eq!(Request::decode(&r.encode()), Ok(r));
    }
    for r in [
        Reply::Failed(libc::EAGAIN),
        Reply::Moved(TAKER),
        Reply::Relay(ends),
        Reply::Tcp {
            local: None,
            peer: Some(ends.peer),
        },
        Reply::Doorbell {
            conn_id: 9,
            sizes,
            ends,
        },
        Reply::State,
        Reply::Done,
        Reply::Stream {
            token: 5,
            owner: TAKER,
            sizes,
            ends,
        },
        Reply::Described {
            token: 6,
            owner: TAKER,
            sizes,
            ends,
        },
        Reply::Listening {
            token: 7,
            owner: TAKER,
            sizes,
            local: ends.local,
        },
    ] {
        assert_eq!(Reply::decode(&r.encode()), Ok(r), "{r:?}");
    }
}

#[test]
fn malformed_messages_are_refused() {
    let take = Request::Take {
        token: 3,
        port: 9,
        taker: TAKER,
    }
    .encode();
    assert_eq!(Request::decode(&take[..39]), Err(BadMsg::Length));
    let mut b = take;
    b[0] = b'X';
    assert_eq!(Request::decode(&b), Err(BadMsg::Magic));
    let mut b = take;
    b[4] = 2;
    assert_eq!(Request::decode(&b), Err(BadMsg::Version));
    let mut b = take;
    b[5] = 9;
    assert_eq!(Request::decode(&b), Err(BadMsg::Kind));
    let mut b = take;
    b[30] = 1;
    assert_eq!(Request::decode(&b), Err(BadMsg::Reserved));
    let mut b = take;
    b[16..24].copy_from_slice(&70000u64.to_le_bytes()); // no such port
    assert_eq!(Request::decode(&b), Err(BadMsg::Field));
    let mut b = take;
    b[24..28].fill(0); // a take-over needs the taker's engine
    assert_eq!(Request::decode(&b), Err(BadMsg::Field));
    let mut b = Request::Reclaim {
        token: 9,
        taker: TAKER,
        exiting: true,
    }
    .encode();
    b[16] = 2; // exiting or not: nothing else
    assert_eq!(Request::decode(&b), Err(BadMsg::Field));
    // Replies: sizes that would overflow, an errno out of range, a Moved to nobody.
    let ends = Ends {
        local: "10.0.0.1:80".parse().unwrap(),
        peer: "10.0.0.2:81".parse().unwrap(),
    };
    let huge = Reply::Doorbell {
        conn_id: 1,
        sizes: u64::MAX,
        ends,
    };
    assert_eq!(Reply::decode(&huge.encode()), Err(BadMsg::Field));
    let mut f = Reply::Failed(1).encode();
    f[8..12].copy_from_slice(&(-5i32).to_le_bytes());
    assert_eq!(Reply::decode(&f), Err(BadMsg::Field));
    let mut m = Reply::Moved(TAKER).encode();
    m[32..36].fill(0);
    assert_eq!(Reply::decode(&m), Err(BadMsg::Field));
    // A Relay without addresses, and an address with stray bytes.
    let mut r = Reply::Relay(ends).encode();
    r[76..104].fill(0);
    assert_eq!(Reply::decode(&r), Err(BadMsg::Field));
    let mut r = Reply::Relay(ends).encode();
    r[70] = 1;
    assert_eq!(Reply::decode(&r), Err(BadMsg::Field));
    // A listener's description has its address and no peer.
    let listening = Reply::Listening {
        token: 1,
        owner: TAKER,
        sizes: (16384u64 << 32) | 65536,
        local: ends.local,
    };
    let mut r = listening.encode();
    r[48..76].fill(0);
    assert_eq!(Reply::decode(&r), Err(BadMsg::Field));
    let mut r = listening.encode();
    r[76..84].copy_from_slice(&Reply::Relay(ends).encode()[76..84]);
    assert_eq!(Reply::decode(&r), Err(BadMsg::Reserved));
}

#[test]
fn a_changed_byte_is_refused_or_another_canonical_message() {
    let ends = Ends {
        local: "10.0.0.1:80".parse().unwrap(),
        peer: "[fe80::2]:81".parse().unwrap(),
    };
    let sizes = (65536u64 << 32) | 16384;
    let replies = [
        Reply::Failed(11).encode(),
        Reply::Moved(TAKER).encode(),
        Reply::Relay(ends).encode(),
        Reply::Doorbell {
            conn_id: 3,
            sizes,
            ends,
        }
        .encode(),
        Reply::Stream {
            token: 4,
            owner: TAKER,
            sizes,
            ends,
        }
        .encode(),
        Reply::Listening {
            token: 5,
            owner: TAKER,
            sizes,
            local: ends.peer,
        }
        .encode(),
    ];
    let mut decoded = 0;
    for msg in replies {
        for i in 0..REPLY_LEN {
            for v in [0u8, 1, 0x7f, 0xff] {
                let mut b = msg;
                b[i] = v;
                if let Ok(r) = Reply::decode(&b) {
                    assert_eq!(r.encode(), b, "byte {i} = {v:#x}");
                    decoded += 1;
                }
            }
        }
    }
    assert!(
        decoded > 500,
        "the property was exercised ({decoded} decodes)"
    );
}

#[test]
fn any_bytes_decode_or_are_refused_without_panicking() {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..20_000 {
        let mut b = [0u8; REPLY_LEN];
        for v in b.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *v = if x.is_multiple_of(3) { 0 } else { x as u8 };
        }
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = VERSION;
        b[5] %= 8;
        // Whatever decodes is canonical: it re-encodes to the very same bytes.
        if let Ok(r) = Reply::decode(&b) {
            assert_eq!(r.encode(), b);
        }
        if let Ok(r) = Request::decode(&b[..REQUEST_LEN]) {
            assert_eq!(r.encode()[..], b[..REQUEST_LEN]);
        }
    }
}
