//! Buffers that start small and grow under load (PROTOCOL.md §12), on the in-memory
//! transport: when growth happens and when it does not, unread bytes moved at the switch,
//! growth crossing a FIN, and a hostile peer's GROW and SWITCHED.

use rsock_core::proto::wire::Imm;
use rsock_core::proto::{Params, ProtocolError};
use rsock_core::transport::mem::{Fault, Pair, Side};

mod common;
use common::{drive, pattern, read_all, transfer};

fn growing() -> Params {
    Params {
        ring_size: 64,
        recv_credits: 8,
        send_buf_size: 64,
        send_queue_depth: 8,
        max_inline: 8,
        ring_grow_to: 4096,
        send_grow_to: 1000,
    }
}

#[test]
fn a_stream_grows_the_ring_and_the_send_buffer() {
    let mut p = Pair::new(growing(), growing());
    let data = pattern(50_000);
    assert_eq!(transfer(&mut p, Side::A, &data), data);
    assert_eq!(p.b.conn.ring_size(), 4096, "receiver's ring grew");
    assert_eq!(p.a.conn.send_buf_size(), 1000, "sender's send buffer grew");
    assert_eq!(p.b.ring.len(), 4096);
    assert_eq!(p.a.send_buf.len(), 1000);
    // The other direction carried nothing: it stays small.
    assert_eq!(p.a.conn.ring_size(), 64);
    assert_eq!(p.b.conn.send_buf_size(), 64);
    let c = p.a.conn.counters();
    assert_eq!(c.tx_peer_ring, 4096);
    // And it streams back through its own growth.
    let back = pattern(9_000);
    assert_eq!(transfer(&mut p, Side::B, &back), back);
    assert_eq!(p.a.conn.ring_size(), 4096);
}

#[test]
fn small_messages_leave_buffers_small() {
    let mut p = Pair::new(growing(), growing());
    for i in 0..300u32 {
        let msg = pattern(20 + (i % 20) as usize);
        assert_eq!(transfer(&mut p, Side::A, &msg), msg);
        assert_eq!(transfer(&mut p, Side::B, &msg), msg);
    }
    for ep in [&p.a, &p.b] {
        assert_eq!(ep.conn.ring_size(), 64);
        assert_eq!(ep.conn.send_buf_size(), 64);
    }
}

#[test]
fn unread_bytes_move_into_the_new_ring() {
    let mut p = Pair::new(growing(), growing());
    let data = pattern(64 + 3000);
    // Fill B's window: a ring nobody reads does not grow.
    let mut sent = p.write(Side::A, &data).unwrap();
    drive(&mut p);
    assert_eq!(p.b.conn.ring_size(), 64, "grew while nobody read");
    // B reads 5 bytes while A waits for credits: B grows; the 59 unread bytes must move.
    let mut got = vec![0u8; 5];
    assert_eq!(p.read(Side::B, &mut got), Ok(5));
    drive(&mut p);
    assert_eq!(
        p.b.conn.ring_size(),
        4096,
        "grew with the old ring almost full"
    );
    assert_eq!(p.b.conn.readable(), 59);
    for _ in 0..100 {
        if sent < data.len() {
            if let Ok(n) = p.write(Side::A, &data[sent..]) {
                sent += n;
            }
        }
        drive(&mut p);
    }
    got.extend(read_all(&mut p, Side::B));
    drive(&mut p);
    got.extend(read_all(&mut p, Side::B));
    assert_eq!(got, data);
}

#[test]
fn a_fin_crossing_the_grow_cancels_it() {
    let mut p = Pair::new(growing(), growing());
    let data = pattern(64);
    assert_eq!(p.write(Side::A, &data), Ok(64));
    p.post(Side::A).unwrap();
    while p.deliver(Side::A).unwrap() {}
    while p.recv(Side::B).unwrap() {}
    // B reads while A waits for credits: B offers a ring and posts its GROW ...
    let mut got = vec![0u8; 5];
    assert_eq!(p.read(Side::B, &mut got), Ok(5));
    p.post(Side::B).unwrap();
    assert_eq!(p.b.conn.pending_ring(), Some(4096), "GROW sent");
    // ... while A's FIN is on its way: A ignores the GROW, B cancels on the FIN.
    p.a.conn.shutdown_write();
    p.post(Side::A).unwrap();
    while p.deliver(Side::A).unwrap() {}
    while p.deliver(Side::B).unwrap() {}
    while p.recv(Side::A).unwrap() {}
    while p.recv(Side::B).unwrap() {}
    assert_eq!(p.b.conn.pending_ring(), None, "cancelled");
    drive(&mut p);
    assert_eq!(p.b.conn.ring_size(), 64);
    assert_eq!(p.a.conn.counters().tx_peer_ring, 64);
    got.extend(read_all(&mut p, Side::B));
    assert_eq!(got, data);
    assert!(p.b.conn.at_eof());
    p.b.conn.shutdown_write();
    drive(&mut p);
    assert!(p.a.conn.is_finished() && p.b.conn.is_finished());
}

fn expect_error(p: &mut Pair, side: Side, imms: &[u32], want: ProtocolError) {
    for &imm in imms {
        p.inject_imm(side, imm);
    }
    let mut last = Ok(true);
    for _ in imms {
        last = p.recv(side);
    }
    assert_eq!(last, Err(Fault::Protocol { side, error: want }));
    assert_eq!(p.ep(side).conn.error(), Some(want));
}

#[test]
fn hostile_grow_and_switched_fail_the_connection() {
    let [hi, lo] = Imm::grow_pair(0x1234_5678, 2).map(Imm::encode);
    let data = Imm::Data { len: 1 }.encode();
    let cases: [(&[u32], &str); 5] = [
        (&[lo], "second half alone"),
        (&[hi, data], "halves split"),
        (&[Imm::Switched.encode()], "SWITCHED nobody asked for"),
        (&[0xc400_0000, 0xc500_0007], "empty ring"),
        // 64 bytes is the ring now: a GROW must make it bigger than that.
        (&[hi, lo, hi, lo], "a second GROW before SWITCHED"),
    ];
    for (imms, what) in cases {
        let mut p = Pair::new(growing(), growing());
        eprintln!("case: {what}");
        expect_error(&mut p, Side::A, imms, ProtocolError::BadGrow);
    }
    // A grow to a size no bigger than the ring now.
    let mut cfg = growing();
    cfg.ring_size = 8192;
    let mut p = Pair::new(growing(), cfg);
    expect_error(
        &mut p,
        Side::A,
        &Imm::grow_pair(9, 2).map(Imm::encode),
        ProtocolError::BadGrow,
    );
}
