//! A stream's life (stream/life.rs) on real streams over the in-memory port: each transition
//! driven through the stream's own methods, in the order the engine calls them
//! (`holders.rs`, `tend.rs`, `takeover/`), checked by its phase and by what the peer sees.

use super::mem::pair;
use super::tests::{pattern, read_all_then_close, recv, send, small, S};
use super::{Event, Life, Phase, Port};
use crate::engine::ipc::Owner;
use std::sync::atomic::Ordering::*;
use std::thread;
use std::time::{Duration, Instant};

const LINGER: Duration = Duration::from_secs(60);

fn life(phase: Phase, program: bool) -> Life {
    Life { phase, program }
}

/// The program's last fd closed, as `holders::stream_fd_closed` does it for the owner.
fn let_go(s: &S) {
    s.release_app();
    assert!(s.advance(Event::LetGo).is_some());
}

/// Nobody holds it: the close, as `Engine::close_unheld` does it (`reset`: SO_LINGER 0).
fn close(s: &S, reset: bool) {
    assert!(s.advance(Event::Close).is_some());
    s.app_closed(reset);
}

/// Plays the helper's reaping of a released stream until it frees it (`tend_streams`).
fn reap(s: &S, peer: &S) {
    for _ in 0..20_000 {
        if s.reap_step(LINGER, Instant::now()) {
            s.destroy();
            return;
        }
        s.dev.progress();
        peer.dev.progress();
        thread::sleep(Duration::from_millis(1));
    }
    panic!("teardown never finished");
}

/// Handles both ends' completions until neither has any.
fn settle(a: &S, b: &S) {
    while a.dev.progress() + b.dev.progress() > 0 {}
}

fn owner() -> Owner {
    Owner { pid: 1, nonce: 2 }
}

/// Queues bytes on `s` without blocking until its buffers are full; how many.
fn fill(s: &S) -> Vec<u8> {
    let data = pattern(1 << 16, 4);
    let mut at = 0;
    while let Ok(n) = send(
        s,
        &data[at..(at + 1000).min(data.len())],
        libc::MSG_DONTWAIT,
    ) {
        at += n;
    }
    data[..at].to_vec()
}

#[test]
fn letting_go_with_bytes_queued_closes_lingers_delivers_them_then_frees() {
    let (a, b) = pair(&small());
    let queued = fill(&a);
    assert!(a.unsent_bytes() > 0, "bytes wait for the peer's credits");
    let_go(&a);
    assert_eq!(a.life(), life(Phase::Open, false));
    assert!(!a.held(), "no other process holds it: the engine closes it");
    close(&a, false);
    assert_eq!(a.life(), life(Phase::Closing, false));
    assert!(a.life().released());
    // It lingers while the peer has not taken the bytes.
    a.dev.progress();
    assert!(
        !a.reap_step(LINGER, Instant::now()),
        "lingers with bytes undelivered"
    );
    assert!(a.lock().rc.is_some());
    let reader = read_all_then_close(&b);
    reap(&a, &b);
    assert!(reader.join().unwrap() == queued, "the peer read every byte");
    assert!(
        a.lock().proto.is_finished(),
        "finished, not dropped at the linger"
    );
    assert!(a.lock().rc.is_none(), "its queue pair is gone");
    assert!(
        a.opts_closed.load(Acquire),
        "nobody holds it: its options fd too"
    );
    assert_eq!(a.life(), life(Phase::Closing, false));
}

#[test]
fn a_stream_held_elsewhere_stays_open_until_its_last_holder_goes() {
    let (a, b) = pair(&small());
    // Another process's copy of A (inherited, or sent with SCM_RIGHTS).
    let other = crate::sys::fcntl::dup_lowest(a.bell().app_fd(), true);
    assert!(other >= 0);
    let_go(&a);
    assert_eq!(a.life(), life(Phase::Open, false));
    assert!(a.life().held_elsewhere() && !a.life().released());
    assert!(a.held(), "the other holder keeps it");
    // Still served: the peer's bytes arrive for whoever holds it.
    send(&b, b"for the other holder", 0).unwrap();
    a.dev.progress();
    assert_eq!(a.readable_bytes(), 20);
    crate::sys::raw::close(other);
    assert!(
        !a.held(),
        "what the helper then closes (holders.rs: on_hold_event)"
    );
    close(&a, false);
    assert_eq!(a.life(), life(Phase::Closing, false));
    b.app_closed(false);
    reap(&a, &b);
    assert!(a.lock().rc.is_none());
}

#[test]
fn a_close_whose_linger_runs_out_drops_the_bytes_and_resets_the_peer() {
    let (a, b) = pair(&small());
    fill(&a);
    let_go(&a);
    close(&a, false);
    // The peer never reads; its linger runs out (time moved on, not slept).
    let t0 = Instant::now();
    assert!(!a.reap_step(LINGER, t0), "lingers first");
    assert!(!a.reap_step(LINGER, t0 + LINGER / 2), "still");
    assert!(!a.lock().proto.is_finished());
    for _ in 0..1000 {
        if a.reap_step(LINGER, t0 + LINGER + Duration::from_millis(1)) {
            break;
        }
        a.dev.progress();
    }
    assert!(a.lock().draining, "dropped at the linger");
    a.destroy();
    assert!(a.lock().rc.is_none());
    // What had arrived stays readable; then the peer sees the connection reset.
    b.dev.progress();
    let mut buf = vec![0; 1 << 16];
    let mut r = recv(&b, &mut buf, 0);
    while let Ok(n) = r {
        assert!(n > 0, "no end of stream: the close never finished");
        r = recv(&b, &mut buf, 0);
    }
    assert_eq!(r, Err(libc::ECONNRESET));
}

#[test]
fn a_close_with_unread_bytes_drops_them_and_the_peer_s_next_bytes_are_refused() {
    let (a, b) = pair(&small());
    send(&b, b"never read", 0).unwrap();
    a.dev.progress();
    assert_eq!(a.readable_bytes(), 10);
    let_go(&a);
    close(&a, false);
    assert_eq!(a.life(), life(Phase::Closing, false));
    // Unlike TCP, no reset goes out at the close (proto's `close` drops the unread bytes
    // and sends FIN): the peer reads end of stream, and its next bytes are refused.
    settle(&a, &b);
    assert_eq!(recv(&b, &mut [0; 16], 0), Ok(0));
    let (stop, h) = super::tests::helper(&[&a]);
    let mut r = Ok(0);
    for _ in 0..2000 {
        r = send(&b, &[1; 700], 0);
        if r.is_err() {
            break;
        }
    }
    stop.store(true, Release);
    h.join().unwrap();
    assert_eq!(r, Err(libc::EPIPE), "the writer hears the reset");
    reap(&a, &b);
}

#[test]
fn an_abortive_close_resets_the_peer_at_once() {
    let (a, b) = pair(&small());
    send(&a, b"dropped", 0).unwrap();
    let_go(&a);
    close(&a, true);
    assert_eq!(a.life(), life(Phase::Closing, false));
    b.dev.progress();
    assert_eq!(recv(&b, &mut [0; 16], 0), Err(libc::ECONNRESET));
    reap(&a, &b);
    assert!(a.lock().rc.is_none());
}

#[test]
fn a_move_expires_back_to_open_and_reset() {
    let (a, b) = pair(&small());
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(5);
    assert_eq!(a.start_move(4000, deadline), Ok(()));
    assert_eq!(a.life(), life(Phase::Moving, true));
    settle(&a, &b);
    assert_eq!(b.dev.peer_moving_to(), Some(4000), "the peer heard MIGRATE");
    assert!(!a.expire_move(t0), "not yet");
    assert_eq!(a.life().phase, Phase::Moving);
    assert!(a.expire_move(deadline + Duration::from_millis(1)));
    assert_eq!(a.life(), Life::NEW, "served here again");
    // It can send nothing after MIGRATE: reset, as the program sees it.
    assert_eq!(recv(&a, &mut [0; 8], 0), Err(libc::ECONNRESET));
    assert_eq!(send(&a, b"x", 0), Err(libc::EPIPE));
    assert!(!a.expire_move(deadline + Duration::from_secs(1)), "once");
    // A taker asking after the deadline is refused: the stream was reset here, and stays
    // this process's.
    assert!(a.export(owner()).is_none(), "a late export is refused");
    assert_eq!(a.life(), Life::NEW);
}

#[test]
fn a_move_nobody_holds_that_expires_is_closed_by_the_helper() {
    let (a, _b) = pair(&small());
    let deadline = Instant::now();
    a.start_move(4000, deadline).unwrap();
    let_go(&a);
    assert_eq!(a.life(), life(Phase::Moving, false));
    assert!(a.expire_move(deadline + Duration::from_millis(1)));
    assert_eq!(a.life(), life(Phase::Open, false));
    assert!(
        !a.held(),
        "what the helper then closes (tend.rs: Visit::Close)"
    );
}

#[test]
fn an_export_moves_the_stream_and_the_peer_waits_for_the_resume() {
    let (a, b) = pair(&small());
    send(&b, b"unread by a", 0).unwrap();
    a.dev.progress();
    let deadline = Instant::now() + Duration::from_secs(5);
    a.start_move(4000, deadline).unwrap();
    settle(&a, &b);
    assert!(b.quiesced(), "the peer's old queue pair is quiet");
    assert_eq!(a.received_end(), 11, "the resume point");
    assert!(a.export(owner()).is_some());
    assert_eq!(a.life(), life(Phase::Moved, true));
    assert_eq!(a.owner(), owner(), "the taker's from now on");
    assert!(
        !a.expire_move(deadline + Duration::from_secs(1)),
        "it went in time"
    );
    // The old queue pair drains and goes; the peer, waiting for the resume, is not reset
    // by its disconnect.
    reap(&a, &b);
    assert!(a.lock().rc.is_none());
    settle(&a, &b);
    assert_eq!(b.dev.peer_moving_to(), Some(4000));
    assert!(
        b.lock().proto.failure().is_none(),
        "the peer sees a move, not a reset"
    );
    // The program here still holds fds: they answer from the options fd until its last
    // close (`holders::stream_fd_closed`).
    assert!(!a.opts_closed.load(Acquire));
    assert!(a.advance(Event::LetGo).is_some());
    a.close_opts_once();
    assert!(a.opts_closed.load(Acquire));
    assert_eq!(a.life(), life(Phase::Moved, false));
}

#[test]
fn a_close_during_a_move_still_exports() {
    let (a, b) = pair(&small());
    a.start_move(4000, Instant::now() + Duration::from_secs(5))
        .unwrap();
    settle(&a, &b);
    let_go(&a);
    assert!(a.advance(Event::Close).is_some());
    assert_eq!(a.life(), life(Phase::Closing, false));
    assert!(a.export(owner()).is_some(), "the taker asked in time");
    assert_eq!(a.life(), life(Phase::Moved, false));
}

#[test]
fn a_move_starts_only_from_open_and_idle() {
    let deadline = Instant::now() + Duration::from_secs(5);
    // Moving already.
    let (a, _b) = pair(&small());
    a.start_move(4000, deadline).unwrap();
    assert_eq!(a.start_move(4001, deadline), Err(libc::EBUSY));
    assert_eq!(a.life().phase, Phase::Moving);
    // A program call in progress.
    let (a, _b) = pair(&small());
    a.call_begins();
    assert_eq!(a.start_move(4000, deadline), Err(libc::EBUSY));
    assert_eq!(a.life(), Life::NEW);
    a.call_ends();
    // Closing.
    let (a, _b) = pair(&small());
    let_go(&a);
    close(&a, false);
    assert_eq!(a.start_move(4000, deadline), Err(libc::EBUSY));
    assert_eq!(a.life(), life(Phase::Closing, false));
    // Moved.
    let (a, b) = pair(&small());
    a.start_move(4000, deadline).unwrap();
    settle(&a, &b);
    a.export(owner()).unwrap();
    assert_eq!(a.start_move(4000, deadline), Err(libc::EBUSY));
    assert_eq!(a.life(), life(Phase::Moved, true));
}

#[test]
fn events_that_do_not_apply_change_nothing() {
    let (a, _b) = pair(&small());
    assert_eq!(a.advance(Event::MoveExpired), None, "no move to expire");
    assert_eq!(a.life(), Life::NEW);
    let_go(&a);
    assert_eq!(a.advance(Event::LetGo), None, "twice");
    close(&a, false);
    for ev in [
        Event::LetGo,
        Event::Close,
        Event::StartMove,
        Event::MoveExpired,
    ] {
        assert_eq!(a.advance(ev), None, "{ev:?} on a closing stream");
    }
    assert_eq!(a.life(), life(Phase::Closing, false));
    assert!(!a.expire_move(Instant::now() + LINGER), "no move to expire");
}
