//! Queue-pair hand-over (PROTOCOL.md §11) by scenario: what is refused, what a hostile or
//! stale peer gets, half-closed connections, and the events. Random interleavings are in
//! `proto_props.rs` (`handed_over_midway`).

use rsock_core::proto::wire::{Hello, HelloKind, Imm, ResumePoint};
use rsock_core::proto::{Conn, Event, MigrateError, Params, ProtocolError, ReadError, State};
use rsock_core::transport::mem::{Fault, Pair, Side};

fn cfg() -> Params {
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

fn read_all(p: &mut Pair, side: Side) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let mut buf = [0u8; 13];
    loop {
        match p.read(side, &mut buf) {
            Ok(0) => return (out, true),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(ReadError::Blocked) => return (out, false),
            Err(e) => panic!("{e:?}"),
        }
    }
}

/// A pair where B moved (MIGRATE sent and received, A quiet), not yet resumed.
fn moving_pair() -> Pair {
    let mut p = Pair::new(cfg(), cfg());
    p.write(Side::A, b"before").unwrap();
    p.write(Side::B, b"reply").unwrap();
    p.drive().unwrap();
    p.b.conn.start_migration(4791).unwrap();
    p.drive().unwrap();
    assert!(p.b.conn.migration_sent());
    assert_eq!(p.a.conn.peer_moving_to(), Some(4791));
    assert!(p.a.conn.ready_to_resume());
    p
}

#[test]
fn the_staying_end_hears_of_the_move_once_and_sends_nothing_more() {
    let mut p = moving_pair();
    let moving =
        p.a.events
            .iter()
            .filter(|e| **e == Event::PeerMoving { port: 4791 });
    assert_eq!(moving.count(), 1);
    // Writes still queue (the app is not blocked), but nothing is posted until the resume.
    assert_eq!(p.write(Side::A, b"queued").unwrap(), 6);
    assert!(p.a.conn.poll_write().is_none());
    assert!(!p.a.conn.output_pending());
    // The old queue pair going down is expected, not a failure.
    p.a.conn.handle_disconnect();
    assert_ne!(p.a.conn.state(), State::Reset);
    assert!(!p.a.conn.is_finished());
}

#[test]
fn refusals_leave_the_connection_unharmed() {
    let mut p = Pair::new(cfg(), cfg());
    assert_eq!(p.b.conn.start_migration(0), Err(MigrateError::NotNow));
    p.b.conn.start_migration(9).unwrap();
    assert_eq!(p.b.conn.start_migration(9), Err(MigrateError::NotNow));
    // The peer cannot resume before the MIGRATE arrived and its queue pair is quiet.
    let accept = cfg().hello(HelloKind::Accept, 0, 1, 2);
    assert_eq!(p.a.conn.resume(&accept), Err(MigrateError::NotReady));

    // Both FINs passed: the peer may be gone, so there is nothing to move to.
    let mut q = Pair::new(cfg(), cfg());
    for s in [Side::A, Side::B] {
        q.ep_mut(s).conn.shutdown_write();
    }
    q.drive().unwrap();
    assert_eq!(q.a.conn.start_migration(5), Err(MigrateError::NotNow));
    assert_eq!(q.b.conn.start_migration(5), Err(MigrateError::NotNow));
}

#[test]
fn a_resume_that_does_not_fit_is_refused() {
    let mut p = moving_pair();
    let state = p.b.conn.handover().expect("exported after MIGRATE");
    let resume = p.a.conn.resume_hello(0x1000, 7, 42);
    let rp = resume.resume.unwrap();
    // The taker must use the old ring size, and the accept must announce it.
    let small = Params {
        ring_size: 32,
        ..cfg()
    };
    let r = Conn::from_handover(&small, &state, &resume);
    assert_eq!(r.err(), Some(MigrateError::RingMismatch));
    let wrong = small.hello(HelloKind::Accept, 0, 1, 42);
    assert_eq!(p.a.conn.resume(&wrong), Err(MigrateError::RingMismatch));
    // A resume point that contradicts the export (stale, foreign, or bytes still in flight).
    for bad in [
        ResumePoint {
            sent_end: rp.sent_end + 1,
            ..rp
        },
        ResumePoint {
            granted_end: state.tx_posted - 1,
            ..rp
        },
        ResumePoint {
            granted_end: state.tx_posted + 65,
            ..rp
        },
    ] {
        let h = Hello {
            resume: Some(bad),
            ..resume
        };
        let r = Conn::from_handover(&cfg(), &state, &h);
        assert_eq!(r.err(), Some(MigrateError::BadResume), "{bad:?}");
    }
    let not_resume = cfg().hello(HelloKind::Connect, 0, 1, 42);
    let r = Conn::from_handover(&cfg(), &state, &not_resume);
    assert_eq!(r.err(), Some(MigrateError::BadResume));
    // Unsent bytes the taker's send buffer cannot hold.
    let mut q = Pair::new(cfg(), cfg());
    q.write(Side::B, &[7; 40]).unwrap();
    q.b.conn.start_migration(3).unwrap();
    q.post(Side::B).unwrap(); // MIGRATE goes before the queued bytes
    let state = q.b.conn.handover().unwrap();
    assert_eq!(state.tx_queued - state.tx_posted, 40);
    let tiny = Params {
        send_buf_size: 16,
        ..cfg()
    };
    let resume = q.a.conn.resume_hello(0, 0, 0);
    let r = Conn::from_handover(&tiny, &state, &resume);
    assert_eq!(r.err(), Some(MigrateError::SendBufTooSmall));
}

#[test]
fn anything_after_migrate_is_a_protocol_error() {
    let mut p = moving_pair();
    p.inject_imm(Side::A, Imm::Data { len: 1 }.encode());
    match p.step() {
        Err(Fault::Protocol {
            side: Side::A,
            error,
        }) => {
            assert_eq!(error, ProtocolError::AfterMigrate)
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(p.a.conn.state(), State::Reset);
}

#[test]
fn a_migrate_on_a_reset_connection_is_ignored() {
    let mut p = Pair::new(cfg(), cfg());
    p.a.conn.abort();
    p.drive().unwrap();
    assert_eq!(p.b.conn.state(), State::Reset);
    assert_eq!(p.b.conn.peer_moving_to(), None);
    assert_eq!(p.b.conn.start_migration(5), Err(MigrateError::NotNow));
}

#[test]
fn crossing_moves_the_passive_end_wins() {
    let mut p = Pair::new(cfg(), cfg());
    p.write(Side::A, b"from a").unwrap();
    p.write(Side::B, b"from b").unwrap();
    p.a.conn.start_migration(1111).unwrap();
    p.b.conn.start_migration(2222).unwrap();
    let mut p = p.complete_hand_over(Side::B, 2222, cfg()).unwrap();
    p.check_invariants().unwrap();
    // A stayed (now `a`), B's taker is `b`; A's own move was dropped.
    assert_eq!(p.a.conn.peer_moving_to(), None);
    assert!(p.a.conn.start_migration(3333).is_ok(), "A may try again");
    p.a.conn.shutdown_write();
    p.b.conn.shutdown_write();
    p.drive().unwrap();
    // A's MIGRATE went out before its FIN: its taker sends the FIN.
    let mut p = p.complete_hand_over(Side::A, 3333, cfg()).unwrap();
    p.drive().unwrap();
    // Now `a` is B's taker and `b` A's taker.
    assert_eq!(read_all(&mut p, Side::A), (b"from a".to_vec(), true));
    assert_eq!(read_all(&mut p, Side::B), (b"from b".to_vec(), true));
    p.drive().unwrap();
    assert!(p.a.conn.is_finished() && p.b.conn.is_finished());
}

#[test]
fn half_closed_connection_moves_and_fin_is_not_repeated() {
    let mut p = Pair::new(cfg(), cfg());
    p.write(Side::B, b"last words").unwrap();
    p.b.conn.shutdown_write();
    p.drive().unwrap();
    // A keeps sending more than B's ring holds; B has read nothing yet.
    let data: Vec<u8> = (0..200u8).collect();
    let mut sent = p.write(Side::A, &data).unwrap();
    p.drive().unwrap();
    let mut p = p.hand_over(Side::B, 99, cfg()).unwrap();
    let mut got = Vec::new();
    for _ in 0..100 {
        if sent < data.len() {
            sent += p.write(Side::A, &data[sent..]).unwrap_or(0);
        }
        p.drive().unwrap();
        p.check_invariants().unwrap();
        got.extend(read_all(&mut p, Side::B).0);
    }
    assert_eq!(got, data);
    assert_eq!(read_all(&mut p, Side::A), (b"last words".to_vec(), true));
    p.a.conn.shutdown_write();
    p.drive().unwrap();
    assert_eq!(read_all(&mut p, Side::B), (Vec::new(), true));
    assert!(p.a.conn.is_finished() && p.b.conn.is_finished());
}
