//! Scenario tests of the protocol core over the in-memory transport, grouped by state.

use rsock_core::proto::wire::Imm;
use rsock_core::proto::{
    CompletionError, Event, Params, ProtocolError, ReadError, State, WrId, WriteError,
};
use rsock_core::transport::mem::{Fault, Pair, Side};

mod common;
use common::{drive, pattern, read_all, transfer};

fn small_config() -> Params {
    Params {
        ring_size: 64,
        recv_credits: 8,
        send_buf_size: 64,
        send_queue_depth: 8,
        max_inline: 8,
        ring_grow_to: 0,
        send_grow_to: 0,
    }
}

fn pair() -> Pair {
    Pair::new(small_config(), small_config())
}

/// A pair whose A has a send buffer four rings big: writes wait there for B's credits.
fn pair_big_sender() -> Pair {
    Pair::new(
        Params {
            send_buf_size: 256,
            ..small_config()
        },
        small_config(),
    )
}

/// Reads at `side`, driving the pair, until end of stream (or 100 rounds).
fn read_to_eof(p: &mut Pair, side: Side) -> Vec<u8> {
    let mut got = Vec::new();
    for _ in 0..100 {
        got.extend(read_all(p, side));
        drive(p);
        if p.ep(side).conn.at_eof() {
            break;
        }
    }
    got
}

// ---- Tests for the established state --------------------------------------------------------

#[test]
fn test_established_small_write_is_read() {
    let mut p = pair();
    assert_eq!(p.write(Side::A, b"hello"), Ok(5));
    drive(&mut p);
    assert_eq!(p.b.conn.readable(), 5);
    assert_eq!(read_all(&mut p, Side::B), b"hello");
    assert!(p.b.events.contains(&Event::Readable));
}

#[test]
fn test_established_stream_larger_than_ring_wraps() {
    let mut p = pair();
    let data = pattern(1000);
    assert_eq!(transfer(&mut p, Side::A, &data), data);
}

#[test]
fn test_established_odd_sizes_wrap_everywhere() {
    let a = Params {
        ring_size: 7,
        recv_credits: 4,
        send_buf_size: 5,
        send_queue_depth: 4,
        max_inline: 2,
        ring_grow_to: 0,
        send_grow_to: 0,
    };
    let b = Params {
        ring_size: 11,
        recv_credits: 4,
        send_buf_size: 13,
        send_queue_depth: 5,
        max_inline: 0,
        ring_grow_to: 0,
        send_grow_to: 0,
    };
    let mut p = Pair::new(a, b);
    let data = pattern(500);
    assert_eq!(transfer(&mut p, Side::A, &data), data);
    assert_eq!(transfer(&mut p, Side::B, &data), data);
}

#[test]
fn test_established_writer_stops_at_the_granted_window() {
    let mut p = pair_big_sender();
    assert_eq!(p.write(Side::A, &pattern(200)), Ok(200));
    drive(&mut p);
    // B does not read: exactly one ring's worth crossed, the rest waits in A's send buffer.
    let (ca, cb) = (p.a.conn.counters(), p.b.conn.counters());
    assert_eq!(cb.rx_received_end, 64);
    assert_eq!(ca.tx_posted, 64);
    assert_eq!(ca.tx_queued, 200);
    assert_eq!(read_all(&mut p, Side::B).len(), 64);
    drive(&mut p);
    assert_eq!(p.b.conn.readable(), 64);
}

#[test]
fn test_established_output_pending_until_credits_release_it() {
    let mut p = pair_big_sender();
    assert!(!p.a.conn.output_pending());
    p.write(Side::A, &pattern(200)).unwrap();
    drive(&mut p);
    // A ring's worth crossed; the rest waits for credits the reader has not returned.
    assert!(p.a.conn.output_pending());
    assert!(!p.b.conn.output_pending());
    p.a.conn.close();
    let got = read_to_eof(&mut p, Side::B);
    assert_eq!(got.len(), 200);
    // Everything, FIN included, went out: nothing waits on the peer any more.
    assert!(!p.a.conn.output_pending());
}

#[test]
fn test_established_send_buffer_full_blocks_then_wakes() {
    let mut p = pair();
    assert_eq!(p.write(Side::A, &pattern(100)), Ok(64));
    assert_eq!(p.write(Side::A, b"x"), Err(WriteError::Blocked));
    assert_eq!(p.a.conn.writable(), 0);
    drive(&mut p);
    assert!(p.a.events.contains(&Event::Writable));
    assert_eq!(p.a.conn.writable(), 64);
}

#[test]
fn test_established_poll_writable_needs_a_third_free() {
    let mut p = pair(); // 64-byte send buffer and ring
    assert_eq!(p.write(Side::A, &pattern(64)), Ok(64));
    assert!(!p.a.conn.poll_writable());
    assert!(
        !p.a.conn.completions_could_wake_writer(),
        "nothing posted yet"
    );
    assert!(p.post(Side::A).unwrap() > 0);
    assert!(
        p.a.conn.completions_could_wake_writer(),
        "64 bytes in flight"
    );
    drive(&mut p); // delivered and completed; B reads nothing
    assert!(p.a.conn.poll_writable());
    // 44 of 64 queued: 20 free is less than a third — writable for send(), not for poll.
    assert_eq!(p.write(Side::A, &pattern(44)), Ok(44));
    assert_eq!(p.a.conn.writable(), 20);
    assert!(!p.a.conn.poll_writable());
    assert!(
        !p.a.conn.completions_could_wake_writer(),
        "B's ring is full: nothing posts"
    );
    // B reads everything: credits return, the 44 cross, and the buffer frees entirely.
    assert_eq!(read_all(&mut p, Side::B).len(), 64);
    drive(&mut p);
    assert!(p.a.conn.poll_writable());
}

#[test]
fn test_established_credits_are_returned_in_batches() {
    let mut p = pair();
    let data = pattern(64 * 20);
    assert_eq!(transfer(&mut p, Side::A, &data), data);
    let credits = p.b.conn.stats().credit_messages;
    // Half a ring (32 bytes) or half the receives (4) per update, never one per message.
    assert!(
        credits > 0 && credits <= 64 * 20 / 32 + 2,
        "{credits} credit messages"
    );
}

#[test]
fn test_established_vectored_and_peek() {
    let mut p = pair();
    p.write(Side::A, b"abcdefgh").unwrap();
    drive(&mut p);
    let mut x = [0u8; 3];
    assert_eq!(p.b.conn.peek(&p.b.ring, &mut x), Ok(3));
    assert_eq!(&x, b"abc");
    assert_eq!(p.b.conn.readable(), 8);
    let (mut y, mut z) = ([0u8; 2], [0u8; 4]);
    let mut bufs = [
        std::io::IoSliceMut::new(&mut y),
        std::io::IoSliceMut::new(&mut z),
    ];
    assert_eq!(p.b.conn.read_vectored(&p.b.ring, &mut bufs), Ok(6));
    assert_eq!((&y, &z), (b"ab", b"cdef"));
    let (s1, s2) = p.b.conn.readable_slices(&p.b.ring).unwrap();
    assert_eq!([s1, s2].concat(), b"gh");
    assert_eq!(p.b.conn.consume(10), 2);
    assert_eq!(p.b.conn.read(&p.b.ring, &mut x), Err(ReadError::Blocked));
}

#[test]
fn test_established_zero_copy_ranges() {
    let mut p = pair();
    assert_eq!(transfer(&mut p, Side::A, &pattern(60)).len(), 60);
    // Free send space starts at offset 60 and wraps.
    let [x, y] = p.a.conn.send_space();
    assert_eq!((x.clone(), y.clone()), (60..64, 0..60));
    p.a.send_buf[x].copy_from_slice(b"wxyz");
    p.a.send_buf[y.start..y.start + 3].copy_from_slice(b"123");
    assert_eq!(p.a.conn.commit_write(7), Ok(7));
    drive(&mut p);
    let [r1, r2] = p.b.conn.readable_ranges();
    assert_eq!((r1.clone(), r2.clone()), (60..64, 0..3));
    let got = [&p.b.ring[r1], &p.b.ring[r2]].concat();
    assert_eq!(got, b"wxyz123");
    assert_eq!(p.b.conn.consume(7), 7);
    assert!(p.b.conn.readable_ranges().iter().all(|r| r.is_empty()));
    p.a.conn.shutdown_write();
    assert_eq!(p.a.conn.commit_write(1), Err(WriteError::Closed));
}

#[test]
fn test_established_vectored_write() {
    let mut p = pair();
    let bufs = [std::io::IoSlice::new(b"ab"), std::io::IoSlice::new(b"cde")];
    assert_eq!(p.a.conn.write_vectored(&mut p.a.send_buf, &bufs), Ok(5));
    drive(&mut p);
    assert_eq!(read_all(&mut p, Side::B), b"abcde");
}

#[test]
fn test_established_small_writes_are_inline_large_are_not() {
    let mut p = pair();
    p.write(Side::A, b"tiny").unwrap();
    let w = p.a.conn.poll_write().unwrap();
    assert!(w.inline && w.len == 4 && w.imm == Some(Imm::Data { len: 4 }.encode()));
    let mut p = pair();
    p.write(Side::A, &pattern(20)).unwrap();
    let w = p.a.conn.poll_write().unwrap();
    assert!(!w.inline && w.len == 20);
}

#[test]
fn test_established_wrapping_burst_is_two_writes_last_with_imm() {
    // The peer's ring wraps inside the burst, the send buffer (256) does not: one burst,
    // the immediate on the part from ring offset 0 (the peer checks that length).
    let mut p = pair_big_sender();
    assert_eq!(transfer(&mut p, Side::A, &pattern(50)).len(), 50);
    p.write(Side::A, &pattern(30)).unwrap();
    let w1 = p.a.conn.poll_write().unwrap();
    let w2 = p.a.conn.poll_write().unwrap();
    assert_eq!((w1.remote_offset, w1.len, w1.imm), (50, 14, None));
    assert_eq!((w2.remote_offset, w2.len, w2.imm), (0, 16, Some(30)));
    assert_eq!((w1.local_offset, w2.local_offset), (50, 64));
}

#[test]
fn test_established_send_buffer_wrap_ends_the_burst() {
    // The send buffer wraps (and, at equal sizes, the ring with it): two bursts, each one
    // write with its own immediate, so every burst is split only where the ring wraps.
    for ring in [64, 256] {
        let b = Params {
            ring_size: ring,
            ..small_config()
        };
        let mut p = Pair::new(small_config(), b);
        assert_eq!(transfer(&mut p, Side::A, &pattern(50)).len(), 50);
        p.write(Side::A, &pattern(30)).unwrap();
        let w1 = p.a.conn.poll_write().unwrap();
        let w2 = p.a.conn.poll_write().unwrap();
        assert_eq!(
            (w1.local_offset, w1.len, w1.imm),
            (50, 14, Some(14)),
            "ring {ring}"
        );
        assert_eq!(
            (w2.local_offset, w2.len, w2.imm),
            (0, 16, Some(16)),
            "ring {ring}"
        );
        assert_eq!(w2.remote_offset, 64 % ring, "ring {ring}");
    }
}

#[test]
fn test_established_selective_signaling() {
    let mut p = Pair::new(
        Params {
            ring_size: 4096,
            send_buf_size: 4096,
            recv_credits: 64,
            ..small_config()
        },
        Params {
            ring_size: 4096,
            send_buf_size: 4096,
            recv_credits: 64,
            ..small_config()
        },
    );
    for i in 0..40 {
        p.write(Side::A, &[i]).unwrap();
        p.post(Side::A).unwrap();
        while p.deliver(Side::A).unwrap() {}
        while p.complete(Side::A) {}
        while p.recv(Side::B).unwrap() {}
        let _ = p.post(Side::B).unwrap();
        while p.deliver(Side::B).unwrap() {}
        while p.recv(Side::A).unwrap() {}
        p.check_invariants().unwrap();
    }
    let s = p.a.conn.stats();
    assert_eq!(s.data_messages, 40);
    // Send queue depth 8: one in four is signaled, not every one.
    assert!(s.signaled <= 40 / 4 + 1, "{s:?}");
}

#[test]
fn test_established_fence_when_writer_waits_on_unsignaled_space() {
    let cfg = Params {
        ring_size: 30,
        recv_credits: 64,
        send_buf_size: 64,
        send_queue_depth: 64,
        max_inline: 0,
        ring_grow_to: 0,
        send_grow_to: 0,
    };
    let mut p = Pair::new(cfg.clone(), cfg);
    // Five unsignaled 6-byte messages fill B's ring (B does not read) and hold 30 of A's 64
    // send-buffer bytes, under the half-buffer signaling threshold.
    for _ in 0..5 {
        p.write(Side::A, b"sixsix").unwrap();
        p.post(Side::A).unwrap();
    }
    assert_eq!(p.a.conn.stats().signaled, 0);
    assert_eq!(p.write(Side::A, &pattern(40)), Ok(34));
    // The short write asks for a completion; no credits for data, so a fence carries it.
    let fence = p.a.conn.poll_write().unwrap();
    assert_eq!((fence.len, fence.imm, fence.signaled), (0, None, true));
    assert_eq!(p.a.conn.stats().fences, 1);
    assert_eq!(p.a.conn.poll_write(), None);
    p.a.conn.handle_send_complete(fence.wr_id).unwrap();
    assert_eq!(p.a.conn.writable(), 30);
    assert_eq!(p.a.conn.poll_event(), Some(Event::Writable));
}

#[test]
fn test_established_both_directions_with_starved_credits() {
    let cfg = Params {
        ring_size: 3,
        recv_credits: 4,
        send_buf_size: 4,
        send_queue_depth: 4,
        max_inline: 1,
        ring_grow_to: 0,
        send_grow_to: 0,
    };
    let mut p = Pair::new(cfg.clone(), cfg);
    let (da, db) = (pattern(300), pattern(301));
    let (mut sa, mut sb, mut ga, mut gb) = (0, 0, Vec::new(), Vec::new());
    for _ in 0..10_000 {
        if let Ok(n) = p.write(Side::A, &da[sa..]) {
            sa += n;
        }
        if let Ok(n) = p.write(Side::B, &db[sb..]) {
            sb += n;
        }
        p.step().unwrap();
        p.check_invariants().unwrap();
        gb.extend(read_all(&mut p, Side::B));
        ga.extend(read_all(&mut p, Side::A));
        if ga.len() == db.len() && gb.len() == da.len() {
            break;
        }
    }
    assert_eq!((ga, gb), (db, da));
}

// ---- Tests for half-close and close ---------------------------------------------------------

#[test]
fn test_fin_peer_reads_queued_bytes_then_eof() {
    let mut p = pair();
    p.write(Side::A, b"last words").unwrap();
    p.a.conn.shutdown_write();
    drive(&mut p);
    assert_eq!(p.b.conn.state(), State::ReadClosed);
    assert!(!p.b.conn.at_eof());
    assert_eq!(read_all(&mut p, Side::B), b"last words");
    let mut buf = [0u8; 4];
    assert_eq!(p.read(Side::B, &mut buf), Ok(0));
    assert_eq!(p.read(Side::B, &mut buf), Ok(0));
    assert!(p.b.conn.at_eof());
}

#[test]
fn test_fin_shutdown_read_returns_queued_bytes_then_end_then_later_bytes() {
    let mut p = pair();
    assert_eq!(p.write(Side::A, b"queued"), Ok(6));
    drive(&mut p);
    p.b.conn.shutdown_read();
    assert!(!p.b.conn.at_eof(), "queued bytes come first");
    assert_eq!(read_all(&mut p, Side::B), b"queued");
    assert!(p.b.conn.at_eof());
    let mut buf = [0u8; 8];
    assert_eq!(
        p.read(Side::B, &mut buf),
        Ok(0),
        "end of stream, not Blocked"
    );
    assert!(!p.b.conn.hung_up(), "B can still write");
    // As on Linux, bytes arriving after SHUT_RD are still delivered.
    assert_eq!(p.write(Side::A, b"late"), Ok(4));
    drive(&mut p);
    assert_eq!(read_all(&mut p, Side::B), b"late");
    p.b.conn.shutdown_write();
    assert!(p.b.conn.hung_up());
    assert_eq!(transfer(&mut p, Side::A, b"still flows"), b"still flows");
}

#[test]
fn test_fin_write_after_shutdown_is_closed() {
    let mut p = pair();
    p.a.conn.shutdown_write();
    assert_eq!(p.write(Side::A, b"x"), Err(WriteError::Closed));
    assert_eq!(p.a.conn.writable(), 0);
    assert_eq!(p.a.conn.state(), State::WriteClosed);
}

#[test]
fn test_fin_half_closed_side_still_receives() {
    let mut p = pair();
    p.a.conn.shutdown_write();
    drive(&mut p);
    let data = pattern(300);
    assert_eq!(transfer(&mut p, Side::B, &data), data);
    p.b.conn.shutdown_write();
    drive(&mut p);
    assert!(p.a.conn.at_eof() && p.b.conn.at_eof());
    assert_eq!(p.a.conn.state(), State::Closed);
    assert_eq!(p.b.conn.state(), State::Closed);
    assert!(p.a.events.contains(&Event::Finished) && p.b.events.contains(&Event::Finished));
}

#[test]
fn test_fin_waits_behind_data_blocked_on_credits() {
    let mut p = pair_big_sender();
    let data = pattern(200);
    p.write(Side::A, &data).unwrap();
    p.a.conn.close();
    drive(&mut p);
    // Only a ring's worth is across; FIN must not overtake the rest.
    assert_eq!(p.b.conn.state(), State::Open);
    let got = read_to_eof(&mut p, Side::B);
    assert_eq!(got, data);
    assert!(p.b.conn.at_eof());
    p.b.conn.close();
    drive(&mut p);
    assert!(p.a.conn.is_finished() && p.b.conn.is_finished());
}

#[test]
fn test_fin_finished_waits_for_unread_bytes() {
    let mut p = pair();
    p.write(Side::B, b"unread").unwrap();
    p.a.conn.shutdown_write();
    p.b.conn.shutdown_write();
    drive(&mut p);
    assert!(!p.a.conn.is_finished());
    assert_eq!(read_all(&mut p, Side::A), b"unread");
    assert!(p.a.conn.is_finished());
}

#[test]
fn test_fin_fin_needs_no_data_credits() {
    // Two data messages leave A at the control reserve (B's credits are not processed), yet
    // FIN still goes out.
    let cfg = Params {
        ring_size: 16,
        recv_credits: 4,
        send_buf_size: 64,
        send_queue_depth: 8,
        max_inline: 0,
        ring_grow_to: 0,
        send_grow_to: 0,
    };
    let mut p = Pair::new(cfg.clone(), cfg.clone());
    for _ in 0..2 {
        p.write(Side::A, b"data").unwrap();
        p.post(Side::A).unwrap();
    }
    assert_eq!(p.a.conn.counters().tx_wr_credits, 2);
    p.write(Side::A, b"more").unwrap();
    assert_eq!(p.post(Side::A), Ok(0), "data must not touch the reserve");
    p.a.conn.abort();
    let mut p = Pair::new(cfg.clone(), cfg);
    for _ in 0..2 {
        p.write(Side::A, b"data").unwrap();
        p.post(Side::A).unwrap();
    }
    p.a.conn.shutdown_write();
    let fin = p.a.conn.poll_write().unwrap();
    assert_eq!(fin.imm, Some(Imm::Fin.encode()));
    assert_eq!(p.a.conn.counters().tx_wr_credits, 1);
}

// ---- Tests for reset ------------------------------------------------------------------------

#[test]
fn test_reset_abort_resets_peer() {
    let mut p = pair();
    p.write(Side::A, b"dropped?").unwrap();
    drive(&mut p);
    p.a.conn.abort();
    drive(&mut p);
    assert_eq!(p.b.conn.state(), State::Reset);
    assert_eq!(p.write(Side::B, b"x"), Err(WriteError::Reset));
    let mut buf = [0u8; 4];
    assert_eq!(p.read(Side::B, &mut buf), Err(ReadError::Reset));
    assert!(p.b.events.contains(&Event::Reset));
    assert!(p.a.conn.is_finished() && p.b.conn.is_finished());
}

#[test]
fn test_reset_data_after_close_resets_writer() {
    let mut p = pair();
    p.a.conn.close();
    drive(&mut p);
    p.write(Side::B, b"anyone?").unwrap();
    drive(&mut p);
    assert_eq!(p.b.conn.state(), State::Reset);
    assert_eq!(p.write(Side::B, b"x"), Err(WriteError::Reset));
}

#[test]
fn test_reset_send_error_fails_connection() {
    let mut p = pair();
    p.fail_next_delivery(Side::A);
    p.write(Side::A, b"doomed").unwrap();
    drive(&mut p);
    assert_eq!(p.a.conn.state(), State::Reset);
    assert_eq!(p.a.conn.error(), Some(ProtocolError::TransportFailed));
    assert_eq!(p.write(Side::A, b"x"), Err(WriteError::Reset));
    assert!(p.a.conn.is_finished());
}

// ---- Tests for malformed peer input ---------------------------------------------------------

fn expect_protocol_error(p: &mut Pair, side: Side, imm: u32, want: ProtocolError) {
    p.inject_imm(side, imm);
    match p.recv(side) {
        Err(Fault::Protocol { error, .. }) => assert_eq!(error, want),
        other => panic!("{other:?}"),
    }
    assert_eq!(p.ep(side).conn.state(), State::Reset);
    assert_eq!(p.ep(side).conn.error(), Some(want));
    assert_eq!(p.ep_mut(side).conn.poll_write(), None);
    // Later input is ignored rather than panicking.
    p.ep_mut(side).conn.handle_imm(u32::MAX, 0).unwrap();
}

#[test]
fn test_malformed_imm_claims_more_than_granted() {
    let mut p = pair();
    expect_protocol_error(
        &mut p,
        Side::B,
        Imm::Data { len: 65 }.encode(),
        ProtocolError::DataBeyondCredit {
            len: 65,
            window: 64,
        },
    );
}

/// Issue #21: a DATA's write must carry what the DATA announces, or the program would read
/// whatever the ring held (a recycled ring: another client's bytes).
fn expect_length_error(p: &mut Pair, side: Side, imm: u32, byte_len: u32, want: ProtocolError) {
    p.inject_write(side, imm, byte_len);
    assert_eq!(p.recv(side), Err(Fault::Protocol { side, error: want }));
    assert_eq!(p.ep(side).conn.state(), State::Reset);
    let mut buf = [0u8; 64];
    assert_eq!(
        p.read(side, &mut buf),
        Err(ReadError::Reset),
        "nothing is readable"
    );
}

#[test]
fn test_malformed_zero_length_write_announcing_a_full_ring() {
    let mut p = pair();
    let want = ProtocolError::LengthMismatch {
        len: 64,
        expected: 64,
        written: 0,
    };
    expect_length_error(&mut p, Side::B, Imm::Data { len: 64 }.encode(), 0, want);
}

#[test]
fn test_malformed_data_longer_or_shorter_than_its_write() {
    for written in [9, 11, 1000] {
        let mut p = pair();
        let want = ProtocolError::LengthMismatch {
            len: 10,
            expected: 10,
            written,
        };
        expect_length_error(
            &mut p,
            Side::B,
            Imm::Data { len: 10 }.encode(),
            written,
            want,
        );
    }
}

#[test]
fn test_malformed_wrapped_data_must_carry_its_part_after_the_wrap() {
    // 50 bytes in: a 30-byte burst is 14 bytes before the ring's end, then 16 from offset 0
    // in the write with the immediate. Announcing it on a write of all 30 (or 14) fails.
    for written in [30, 14, 0] {
        let mut p = pair();
        assert_eq!(transfer(&mut p, Side::A, &pattern(50)).len(), 50);
        let want = ProtocolError::LengthMismatch {
            len: 30,
            expected: 16,
            written,
        };
        expect_length_error(
            &mut p,
            Side::B,
            Imm::Data { len: 30 }.encode(),
            written,
            want,
        );
    }
    let mut p = pair();
    assert_eq!(transfer(&mut p, Side::A, &pattern(50)).len(), 50);
    p.inject_write(Side::B, Imm::Data { len: 30 }.encode(), 16);
    assert_eq!(p.recv(Side::B), Ok(true));
}

#[test]
fn test_malformed_control_message_carrying_bytes() {
    let mut p = pair();
    let want = ProtocolError::LengthMismatch {
        len: 0,
        expected: 0,
        written: 4,
    };
    expect_length_error(&mut p, Side::B, Imm::Fin.encode(), 4, want);
}

#[test]
fn test_malformed_imm_huge_length() {
    let mut p = pair();
    expect_protocol_error(
        &mut p,
        Side::B,
        0x7fff_ffff,
        ProtocolError::DataBeyondCredit {
            len: 0x7fff_ffff,
            window: 64,
        },
    );
}

#[test]
fn test_malformed_imm_undecodable() {
    let mut p = pair();
    expect_protocol_error(
        &mut p,
        Side::A,
        0xc700_0000,
        ProtocolError::BadImm(rsock_core::proto::ImmError::UnknownOp(7)),
    );
}

#[test]
fn test_malformed_credit_never_given() {
    let mut p = pair();
    expect_protocol_error(
        &mut p,
        Side::A,
        Imm::Credit { wrs: 1, bytes: 0 }.encode(),
        ProtocolError::CreditOverflow { wrs: 1, bytes: 0 },
    );
}

#[test]
fn test_malformed_too_many_messages() {
    let mut p = pair();
    for _ in 0..8 {
        p.inject_write(Side::B, Imm::Data { len: 1 }.encode(), 1);
        p.recv(Side::B).unwrap();
    }
    expect_protocol_error(
        &mut p,
        Side::B,
        Imm::Data { len: 1 }.encode(),
        ProtocolError::TooManyMessages,
    );
}

#[test]
fn test_malformed_data_after_fin_and_duplicate_fin() {
    let mut p = pair();
    p.inject_imm(Side::B, Imm::Fin.encode());
    p.recv(Side::B).unwrap();
    expect_protocol_error(
        &mut p,
        Side::B,
        Imm::Data { len: 1 }.encode(),
        ProtocolError::DataAfterFin,
    );
    let mut p = pair();
    p.inject_imm(Side::B, Imm::Fin.encode());
    p.recv(Side::B).unwrap();
    expect_protocol_error(
        &mut p,
        Side::B,
        Imm::Fin.encode(),
        ProtocolError::DuplicateFin,
    );
}

#[test]
fn test_malformed_completion_for_unknown_wr() {
    let mut p = pair();
    assert_eq!(
        p.a.conn.handle_send_complete(WrId(0)),
        Err(CompletionError::UnknownWr(WrId(0)))
    );
    p.write(Side::A, b"x").unwrap();
    let w = p.a.conn.poll_write().unwrap();
    assert_eq!(p.a.conn.handle_send_complete(w.wr_id), Ok(()));
    // Stale and duplicate completions are harmless.
    assert_eq!(p.a.conn.handle_send_complete(w.wr_id), Ok(()));
}

#[test]
fn test_established_send_buffer_not_reused_before_its_completion() {
    let cfg = Params {
        ring_size: 64,
        recv_credits: 8,
        send_buf_size: 16,
        send_queue_depth: 8,
        max_inline: 0,
        ring_grow_to: 0,
        send_grow_to: 0,
    };
    let mut p = Pair::new(cfg.clone(), cfg);
    p.write(Side::A, b"AAAAAAAA").unwrap();
    p.post(Side::A).unwrap();
    p.deliver(Side::A).unwrap();
    p.write(Side::A, b"BBBBBBBB").unwrap();
    p.post(Side::A).unwrap();
    // WR 0 completes while WR 1 still waits to be read from the send buffer.
    assert!(p.complete(Side::A));
    assert_eq!(p.a.conn.writable(), 8);
    assert_eq!(p.write(Side::A, b"CCCCCCCCCCCCCCCC"), Ok(8));
    drive(&mut p);
    let got = read_all(&mut p, Side::B);
    assert_eq!(got, b"AAAAAAAABBBBBBBBCCCCCCCC");
}

#[test]
fn test_established_credit_backlog_larger_than_one_message() {
    // Thresholds (1.5 MiB, 1500 receives) exceed what one credit message carries
    // (1 MiB - 1, 1023): the backlog goes out in several messages and nothing is lost.
    let big = Params {
        ring_size: 3 << 20,
        recv_credits: 3000,
        send_buf_size: 1 << 20,
        send_queue_depth: 64,
        max_inline: 0,
        ring_grow_to: 0,
        send_grow_to: 0,
    };
    let mut p = Pair::new(small_config(), big.clone());
    p.check_grants = false;
    let data = pattern(8 << 20);
    let mut sent = 0;
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 16];
    while got < data.len() {
        if sent < data.len() {
            sent += p.write(Side::A, &data[sent..]).unwrap_or(0);
        }
        drive(&mut p);
        while let Ok(n) = p.read(Side::B, &mut buf) {
            assert_eq!(&buf[..n], &data[got..got + n]);
            got += n;
        }
    }
    assert!(
        p.b.conn.stats().credit_messages >= 8,
        "{:?}",
        p.b.conn.stats()
    );
    // Many one-byte messages: the receive backlog crosses 1023 before it is returned.
    let mut p = Pair::new(small_config(), big);
    for i in 0..2000u32 {
        p.write(Side::A, &[i as u8]).unwrap();
        p.post(Side::A).unwrap();
        while p.deliver(Side::A).unwrap() {}
        while p.complete(Side::A) {}
        while p.recv(Side::B).unwrap() {}
        p.check_invariants().unwrap();
    }
    assert!(p.a.conn.counters().tx_wr_credits < 3000);
    drive(&mut p);
    assert_eq!(read_all(&mut p, Side::B).len(), 2000);
    drive(&mut p);
    p.check_invariants().unwrap();
}

#[test]
fn test_established_waitall_is_a_loop_over_read() {
    // MSG_WAITALL for 100 bytes: keep reading until 100 arrived, however they trickle in.
    let mut p = Pair::new(
        small_config(),
        Params {
            ring_size: 7,
            ..small_config()
        },
    );
    let data = pattern(100);
    let mut sent = 0;
    let mut want = [0u8; 100];
    let mut have = 0;
    while have < want.len() {
        if sent < data.len() {
            sent += p
                .write(Side::A, &data[sent..sent + 3.min(data.len() - sent)])
                .unwrap_or(0);
        }
        drive(&mut p);
        match p.read(Side::B, &mut want[have..]) {
            Ok(n) => have += n,
            Err(ReadError::Blocked) => {}
            Err(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(&want[..], &data[..]);
}

#[test]
fn test_reset_disconnect_after_clean_close_is_harmless() {
    let mut p = pair();
    p.a.conn.shutdown_write();
    p.b.conn.shutdown_write();
    drive(&mut p);
    assert_eq!(p.a.conn.state(), State::Closed);
    p.disconnect();
    assert_eq!(p.a.conn.state(), State::Closed);
    assert_eq!(p.a.conn.error(), None);
    let mut p = pair();
    p.write(Side::A, b"in flight").unwrap();
    p.post(Side::A).unwrap();
    p.disconnect();
    drive(&mut p);
    assert_eq!(p.a.conn.state(), State::Reset);
    assert_eq!(p.b.conn.state(), State::Reset);
    assert!(p.a.conn.is_finished() && p.b.conn.is_finished());
}

// ---- streams of a link ---------------------------------------------------------------------

fn link_pair(ring: u32, send_buf: u32) -> Pair {
    let config = Params {
        ring_size: ring,
        recv_credits: 16,
        send_buf_size: send_buf,
        send_queue_depth: 16,
        max_inline: 64,
        ring_grow_to: 0,
        send_grow_to: 0,
    };
    let id = |n| rsock_core::proto::link::imm::StreamId::new(n).unwrap();
    Pair::on_link(config.clone(), config, (id(3), id(9)))
}

/// A link immediate announces a burst of any length up to 65,535 bytes, or of whole pages
/// beyond (PROTOCOL.md §14, DATA in pages): 200,000 bytes into a 256 KiB ring go as one
/// burst of 48 pages and one of the 3,392 bytes left, and arrive whole.
#[test]
fn link_bursts_beyond_64_kib_are_whole_pages() {
    let mut p = link_pair(256 * 1024, 256 * 1024);
    let data = pattern(200_000);
    p.write(Side::A, &data).unwrap();
    drive(&mut p);
    let got = read_all(&mut p, Side::B);
    assert_eq!(got, data);
    let bursts = p.a.conn.stats().data_messages;
    assert_eq!(bursts, 2, "{bursts} bursts");
}

/// Ring bytes come back in whole 4 KiB pages, and streams many rings long flow on them.
#[test]
fn link_credits_return_whole_pages() {
    let mut p = link_pair(8192, 8192);
    let data = pattern(8192);
    assert_eq!(transfer(&mut p, Side::A, &data), data);
    // Everything was read: the sender's window is back to a whole ring at least.
    let c = p.a.conn.counters();
    assert_eq!(c.tx_granted_end % 4096, 0);
    assert!(c.tx_granted_end >= 8192 + 4096, "{c:?}");
    let more = pattern(20_000);
    assert_eq!(transfer(&mut p, Side::A, &more), more);
}

/// A stream of a link has no room for growth or a hand-over: both are refused up front.
#[test]
fn link_streams_grow_by_record_and_do_not_migrate() {
    let config = Params {
        ring_size: 4096,
        ring_grow_to: 64 * 1024,
        ..small_config()
    };
    let id = rsock_core::proto::link::imm::StreamId::new(1).unwrap();
    let peer = config.hello(rsock_core::proto::HelloKind::Accept, 0, 1, 2);
    let on_link = |c: &Params| rsock_core::proto::Conn::on_link(c, &peer, id, id);
    // A ring that grows is fine on a link (its GROW is a record); one below a page is not.
    assert!(on_link(&config).is_ok(), "a ring that grows");
    assert!(on_link(&Params {
        ring_size: 2048,
        ring_grow_to: 0,
        ..config.clone()
    })
    .is_err());
    // A lone connection takes no GROW record; a link stream takes one bigger ring only.
    let mut lone = rsock_core::proto::Conn::new(&config, &peer).unwrap();
    assert!(lone.on_grow_record(8192, 9, 0).is_err());
    let mut c = on_link(&config).unwrap();
    assert!(
        c.on_grow_record(4096, 9, 0).is_err(),
        "no bigger than the ring"
    );
    let mut c = on_link(&config).unwrap();
    assert!(c.on_grow_record(8192, 9, 0x1000).is_ok());
    assert!(
        c.on_grow_record(16384, 9, 0).is_err(),
        "a second GROW before SWITCHED"
    );
    let mut p = link_pair(4096, 4096);
    assert!(p.a.conn.start_migration(7).is_err());
}

/// A writer that hit EAGAIN waits out completions only until it may write: bursts that
/// follow a signaled one are unsignaled, and their completions are not reported until a
/// later signaled write's (iperf3 on a link stream napped 50 ms at an EAGAIN for one,
/// measured 2026-11-29).
#[test]
fn a_writer_waits_for_completions_only_until_writable() {
    let mut p = link_pair(256 * 1024, 256 * 1024);
    // 1000 bytes read by B and not yet credited back (nor completed at A: unsignaled), so
    // what fills A's buffer goes as 63 pages (signaled: a writer waits) and a 3,096-byte
    // tail (unsignaled).
    assert_eq!(transfer(&mut p, Side::A, &pattern(1000)).len(), 1000);
    assert_eq!(p.write(Side::A, &pattern(300_000)), Ok(256 * 1024 - 1000));
    p.post(Side::A).unwrap();
    assert_eq!(p.write(Side::A, b"x"), Err(WriteError::Blocked));
    assert!(
        p.a.conn.completions_could_wake_writer(),
        "the pages' completion frees most of the buffer"
    );
    // The pages land and complete; A posts nothing meanwhile.
    while p.deliver(Side::A).unwrap() {}
    while p.recv(Side::B).unwrap() {}
    while p.complete(Side::A) {}
    assert!(p.a.conn.poll_writable());
    assert!(
        !p.a.conn.completions_could_wake_writer(),
        "writable already: nothing to wait for"
    );
    drive(&mut p);
    assert_eq!(
        read_all(&mut p, Side::B),
        pattern(300_000)[..256 * 1024 - 1000]
    );
    let more = pattern(5000);
    assert_eq!(transfer(&mut p, Side::A, &more), more);
}
