//! What a connection shows to the program — poll readiness, blocking readiness, transport
//! failures — over the in-memory transport. The driver asks only these questions.

use rsock_core::proto::{Failure, Params, ReadError, Readiness, State, Want, WriteError};
use rsock_core::transport::mem::{Pair, Side};

mod common;
use common::drive;

fn pair() -> Pair {
    let c = Params {
        ring_size: 64,
        recv_credits: 8,
        send_buf_size: 60,
        send_queue_depth: 8,
        max_inline: 8,
        ring_grow_to: 0,
        send_grow_to: 0,
    };
    Pair::new(c.clone(), c)
}

fn shows(p: &Pair, side: Side) -> Readiness {
    p.ep(side).conn.readiness()
}

#[test]
fn a_fresh_connection_is_writable_and_not_readable() {
    let p = pair();
    let r = shows(&p, Side::A);
    assert!(r.writable && !r.readable && !r.read_ended && !r.hangup);
    assert!(p.a.conn.ready(Want::Write) && !p.a.conn.ready(Want::Read));
    assert!(!p.a.conn.flushed());
}

#[test]
fn poll_writable_needs_a_third_of_the_buffer_but_a_blocked_write_any_room() {
    let mut p = pair();
    assert_eq!(p.write(Side::A, &[7; 50]).unwrap(), 50); // 10 of 60 free
    let a = &p.a.conn;
    assert!(a.ready(Want::Write), "room for a write");
    assert!(
        !shows(&p, Side::A).writable,
        "under a third free: poll says not writable"
    );
    drive(&mut p);
    assert!(
        shows(&p, Side::A).writable,
        "acknowledged: the buffer is free again"
    );
}

#[test]
fn bytes_then_fin_show_readable_then_read_ended_then_eof() {
    let mut p = pair();
    p.write(Side::A, b"hello").unwrap();
    p.a.conn.shutdown_write();
    drive(&mut p);
    let r = shows(&p, Side::B);
    assert!(r.readable && r.read_ended && !r.hangup, "{r:?}");
    let mut buf = [0; 16];
    assert_eq!(p.read(Side::B, &mut buf).unwrap(), 5);
    assert!(p.b.conn.ready(Want::Read), "end of stream is ready to read");
    assert_eq!(p.read(Side::B, &mut buf).unwrap(), 0);
    // Shut both ways: a hang-up, as the kernel shows a TCP socket shut both ways.
    assert!(shows(&p, Side::A).writable && !shows(&p, Side::A).hangup);
    p.b.conn.shutdown_write();
    assert!(shows(&p, Side::B).hangup);
    drive(&mut p);
    assert!(shows(&p, Side::A).hangup);
}

#[test]
fn a_transport_failure_keeps_arrived_bytes_readable_then_fails_reads_and_writes() {
    let mut p = pair();
    p.write(Side::A, b"arrived").unwrap();
    drive(&mut p);
    p.b.conn.handle_failure(Failure::TimedOut);
    p.b.conn.handle_failure(Failure::Reset); // the first failure is the one reported
    assert_eq!(p.b.conn.failure(), Some(Failure::TimedOut));
    assert_eq!(p.b.conn.state(), State::Reset);
    let r = shows(&p, Side::B);
    assert!(
        r.readable && r.writable && r.read_ended && r.hangup,
        "{r:?}"
    );
    let mut buf = [0; 16];
    assert_eq!(p.read(Side::B, &mut buf).unwrap(), 7);
    assert_eq!(&buf[..7], b"arrived");
    assert_eq!(p.read(Side::B, &mut buf), Err(ReadError::Blocked));
    assert!(p.b.conn.ready(Want::Read) && p.b.conn.ready(Want::Write));
    assert_eq!(p.write(Side::B, b"x"), Err(WriteError::Reset));
    assert!(p.b.conn.poll_write().is_none() && !p.b.conn.output_pending());
    assert!(p.b.conn.is_finished() && p.b.conn.flushed());
    assert!(p.b.conn.first_failure_report());
    assert!(!p.b.conn.first_failure_report(), "told once");
}

#[test]
fn a_disconnect_after_the_peers_fin_is_the_peer_gone_and_reads_end_normally() {
    let mut p = pair();
    p.write(Side::A, b"last").unwrap();
    p.a.conn.shutdown_write();
    drive(&mut p);
    p.b.conn.handle_disconnect();
    assert_eq!(p.b.conn.failure(), Some(Failure::PeerGone));
    let mut buf = [0; 16];
    assert_eq!(p.read(Side::B, &mut buf).unwrap(), 4);
    assert_eq!(p.read(Side::B, &mut buf).unwrap(), 0);
    // Before the FIN the same disconnect is a reset.
    let mut q = pair();
    q.b.conn.handle_disconnect();
    assert_eq!(q.b.conn.failure(), Some(Failure::Reset));
}

#[test]
fn a_disconnect_after_a_clean_finish_changes_nothing() {
    let mut p = pair();
    p.a.conn.shutdown_write();
    p.b.conn.shutdown_write();
    drive(&mut p);
    assert_eq!(p.a.conn.state(), State::Closed);
    p.a.conn.handle_disconnect();
    assert_eq!(p.a.conn.failure(), None);
    assert_eq!(p.a.conn.state(), State::Closed);
}

#[test]
fn flushed_waits_for_the_fin_to_complete() {
    let mut p = pair();
    p.write(Side::A, b"data").unwrap();
    p.a.conn.shutdown_write();
    assert!(!p.a.conn.flushed(), "nothing posted yet");
    p.post(Side::A).unwrap();
    assert!(!p.a.conn.flushed(), "posted, not completed");
    drive(&mut p);
    assert!(p.a.conn.flushed());
}

#[test]
fn readiness_bits_round_trip() {
    for b in 0..16u8 {
        assert_eq!(Readiness::from_bits(b).bits(), b);
    }
}

/// What a link scrubs of a freed ring (engine/link.rs): after the peer's FIN, every byte it
/// wrote was announced; after a reset it may have written more than it announced, so the
/// whole ring is the answer (`None`).
#[test]
fn the_ring_bytes_written_are_known_after_a_fin_and_not_after_a_reset() {
    let mut p = pair();
    p.write(Side::A, b"hello").unwrap();
    drive(&mut p);
    assert_eq!(p.b.conn.ring_written(), None, "open: more may come");
    p.a.conn.shutdown_write();
    drive(&mut p);
    assert_eq!(p.b.conn.ring_written(), Some(5));
    let mut q = pair();
    q.write(Side::A, b"hello").unwrap();
    drive(&mut q);
    q.a.conn.abort();
    drive(&mut q);
    assert_eq!(
        q.b.conn.ring_written(),
        None,
        "reset: a burst may be cut short"
    );
}
