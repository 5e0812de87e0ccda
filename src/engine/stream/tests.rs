//! The real [`Stream`] over the in-memory port (stream/mem.rs): the program's calls, the
//! waits, the doorbell the program polls, and teardown, in-process.

use super::mem::{pair, pair_with, MemPort};
use super::{Port, QueuePair, Stream};
use crate::proto::Params;
use libc::c_int;
use std::io::{IoSlice, IoSliceMut};
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

pub(super) type S = Arc<Stream<MemPort>>;

pub(super) fn small() -> Params {
    Params {
        ring_size: 4096,
        recv_credits: 16,
        send_buf_size: 4096,
        send_queue_depth: 16,
        max_inline: 64,
        ring_grow_to: 0,
        send_grow_to: 0,
    }
}

pub(super) fn send(s: &S, data: &[u8], flags: c_int) -> Result<usize, c_int> {
    s.send(&[IoSlice::new(data)], flags, None)
}

pub(super) fn recv(s: &S, buf: &mut [u8], flags: c_int) -> Result<usize, c_int> {
    s.recv(&mut [IoSliceMut::new(buf)], flags, None)
}

/// Deterministic, position-dependent bytes (a shifted or repeated chunk shows).
pub(super) fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}

/// Reads until end of stream.
pub(super) fn read_to_end(s: &S) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = vec![0; 1500];
    loop {
        match recv(s, &mut buf, 0) {
            Ok(0) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) => panic!("recv: errno {e}"),
        }
    }
}

/// A thread that reads `s` to its end, then closes it (as a peer program would): its bytes.
pub(super) fn read_all_then_close(s: &S) -> thread::JoinHandle<Vec<u8>> {
    let s = s.clone();
    thread::spawn(move || {
        let got = read_to_end(&s);
        s.app_closed(false);
        got
    })
}

pub(super) fn poll_flags(s: &S) -> i16 {
    let mut p = libc::pollfd {
        fd: s.bell().app_fd(),
        events: libc::POLLIN | libc::POLLOUT | libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, 0) };
    p.revents
}

/// Plays the engine's helper thread for `streams`: handles their completions until
/// stopped (the program's own thread handles them only while it waits in a call).
pub(super) fn helper(streams: &[&S]) -> (Arc<AtomicBool>, thread::JoinHandle<()>) {
    let stop = Arc::new(AtomicBool::new(false));
    let (streams, flag) = (
        streams.iter().map(|s| (*s).clone()).collect::<Vec<_>>(),
        stop.clone(),
    );
    let h = thread::spawn(move || {
        while !flag.load(Acquire) {
            for s in &streams {
                s.dev.progress();
            }
            thread::sleep(Duration::from_micros(100));
        }
    });
    (stop, h)
}

#[test]
fn a_megabyte_each_way_through_small_rings_arrives_intact() {
    let (a, b) = pair(&small());
    let (da, db) = (pattern(1 << 20, 1), pattern(1 << 20, 2));
    let writer = |s: S, d: Vec<u8>| {
        thread::spawn(move || {
            assert_eq!(send(&s, &d, 0), Ok(d.len()));
            s.shutdown_write();
        })
    };
    let (wa, wb) = (writer(a.clone(), da.clone()), writer(b.clone(), db.clone()));
    let rb = {
        let b = b.clone();
        thread::spawn(move || read_to_end(&b))
    };
    assert!(read_to_end(&a) == db, "a received b's bytes");
    assert!(rb.join().unwrap() == da, "b received a's bytes");
    wa.join().unwrap();
    wb.join().unwrap();
    assert_eq!(a.dev.woke_late() + b.dev.woke_late(), 0, "wake-ups lost");
    assert_eq!(a.dev.grant_faults(), 0, "a write outside the grants");
}

#[test]
fn buffers_grow_under_a_stream_and_stay_small_for_chatter() {
    let cfg = Params {
        ring_grow_to: 65536,
        send_grow_to: 65536,
        ..small()
    };
    let (a, b) = pair_with(&cfg, Duration::ZERO);
    // Chatter: messages smaller than the ring grow nothing.
    let mut buf = [0; 512];
    for i in 0..50u8 {
        let msg = [i; 300];
        assert_eq!(send(&a, &msg, 0), Ok(300));
        assert_eq!(recv(&b, &mut buf[..300], libc::MSG_WAITALL), Ok(300));
        assert_eq!(buf[..300], msg);
    }
    assert_eq!((a.sizes(), b.sizes()), ((4096, 4096), (4096, 4096)));
    // A stream: a's send buffer and b's ring grow, with b reading behind (unread bytes
    // move into the new ring) and every wait sleeping.
    let data = pattern(3 << 20, 9);
    let writer = {
        let (a, d) = (a.clone(), data.clone());
        thread::spawn(move || {
            assert_eq!(send(&a, &d, 0), Ok(d.len()));
            a.shutdown_write();
        })
    };
    assert!(read_to_end(&b) == data, "b received a's bytes");
    writer.join().unwrap();
    assert_eq!(
        a.sizes(),
        (4096, 65536),
        "a's send buffer grew, its ring did not"
    );
    assert_eq!(
        b.sizes(),
        (65536, 4096),
        "b's ring grew, its send buffer did not"
    );
    assert_eq!(a.dev.woke_late() + b.dev.woke_late(), 0, "wake-ups lost");
    assert_eq!(a.dev.grant_faults(), 0, "a write outside the grants");
}

#[test]
fn busy_request_response_grows_buffers() {
    // 1 KiB each way never fills a 4 KiB window, but moving several rings' worth within
    // milliseconds is a busy connection: both ends' rings and send buffers grow.
    let cfg = Params {
        ring_grow_to: 65536,
        send_grow_to: 65536,
        ..small()
    };
    let (a, b) = pair(&cfg);
    let echo = thread::spawn(move || {
        let mut buf = [0; 1024];
        for _ in 0..400 {
            assert_eq!(recv(&b, &mut buf, libc::MSG_WAITALL), Ok(1024));
            assert_eq!(send(&b, &buf, 0), Ok(1024));
        }
        b
    });
    let mut buf = [0; 1024];
    for i in 0..400u32 {
        let msg = pattern(1024, i as u8);
        assert_eq!(send(&a, &msg, 0), Ok(1024));
        assert_eq!(recv(&a, &mut buf, libc::MSG_WAITALL), Ok(1024));
        assert!(buf[..] == msg[..], "echo {i}");
    }
    let b = echo.join().unwrap();
    assert_eq!((a.sizes(), b.sizes()), ((65536, 65536), (65536, 65536)));
    assert_eq!(a.dev.grant_faults(), 0, "a write outside the grants");
}

#[test]
fn ping_pong_that_always_sleeps_loses_no_wake_up() {
    // Spin 0: every wait arms and sleeps, so a message landing between the check and the
    // sleep must wake it through the completion channel or the doorbell.
    let (a, b) = pair_with(&small(), Duration::ZERO);
    let b_port = b.dev.clone();
    let echo = thread::spawn(move || {
        let mut buf = [0; 64];
        loop {
            match recv(&b, &mut buf, 0) {
                Ok(0) => return,
                Ok(n) => assert_eq!(send(&b, &buf[..n], 0), Ok(n)),
                Err(e) => panic!("echo: errno {e}"),
            }
        }
    });
    let mut buf = [0; 64];
    for i in 0..500u32 {
        let msg = i.to_le_bytes();
        assert_eq!(send(&a, &msg, 0), Ok(4));
        assert_eq!(recv(&a, &mut buf[..4], libc::MSG_WAITALL), Ok(4));
        assert_eq!(buf[..4], msg);
    }
    a.shutdown_write();
    echo.join().unwrap();
    assert_eq!(a.dev.woke_late() + b_port.woke_late(), 0, "wake-ups lost");
    assert_eq!(b_port.grant_faults(), 0, "a write outside the grants");
}

#[test]
fn peek_shows_what_the_read_then_returns_and_waitall_waits_for_all() {
    let (a, b) = pair(&small());
    send(&a, b"hello ", 0).unwrap();
    let mut buf = [0; 32];
    assert_eq!(recv(&b, &mut buf, libc::MSG_PEEK), Ok(6));
    assert_eq!(&buf[..6], b"hello ");
    let late = {
        let a = a.clone();
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(20));
            send(&a, b"world", 0).unwrap();
        })
    };
    let mut all = [0; 11];
    assert_eq!(recv(&b, &mut all, libc::MSG_WAITALL), Ok(11));
    assert_eq!(&all, b"hello world");
    late.join().unwrap();
}

#[test]
fn nonblocking_calls_say_eagain_and_poll_agrees() {
    let cfg = small();
    let (a, b) = pair(&cfg);
    let mut buf = [0; 16];
    assert_eq!(recv(&b, &mut buf, libc::MSG_DONTWAIT), Err(libc::EAGAIN));
    b.watch();
    assert_eq!(poll_flags(&b) & libc::POLLIN, 0);
    send(&a, b"x", 0).unwrap();
    // Nobody polled the CQ yet: the nonblocking read looks once itself.
    assert_eq!(recv(&b, &mut buf, libc::MSG_DONTWAIT), Ok(1));
    // Fill a's buffer while b does not read: EAGAIN, and poll says not writable.
    let chunk = vec![7; 1000];
    let mut queued = 0;
    loop {
        match send(&a, &chunk, libc::MSG_DONTWAIT) {
            Ok(n) => queued += n,
            Err(e) => {
                assert_eq!(e, libc::EAGAIN);
                break;
            }
        }
        assert!(queued < 1 << 20, "never full");
    }
    a.watch();
    assert!(
        queued >= cfg.send_buf_size as usize,
        "the peer's ring took some"
    );
    assert_eq!(poll_flags(&a) & libc::POLLOUT, 0, "full: not writable");
    // b drains (a's queued bytes go out as b's credits come back to a: the port's helper
    // handles a's completions, a's program waits nowhere), and a becomes writable again.
    let mut big = vec![0; 1 << 16];
    let mut got = 0;
    while got < queued {
        got += recv(&b, &mut big, 0).unwrap();
    }
    assert_eq!(got, queued);
    // a's last completions may still be on their way through the port's helper thread.
    let t0 = std::time::Instant::now();
    while poll_flags(&a) & libc::POLLOUT == 0 && t0.elapsed() < std::time::Duration::from_secs(5) {
        a.dev.progress();
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_ne!(poll_flags(&a) & libc::POLLOUT, 0, "drained: writable");
}

/// Waits for one epoll event on `ep` (5 s: a hang is a failure, not a slow pass).
fn epoll_one(ep: c_int) -> Option<u32> {
    let mut ev = libc::epoll_event { events: 0, u64: 0 };
    // SAFETY: one valid event slot.
    let n = unsafe { libc::epoll_wait(ep, &mut ev, 1, 5000) };
    (n == 1).then_some(ev.events)
}

fn epoll_on(s: &S, events: u32) -> c_int {
    // SAFETY: plain syscalls on fds of ours.
    unsafe {
        let ep = libc::epoll_create1(libc::EPOLL_CLOEXEC);
        let mut ev = libc::epoll_event { events, u64: 1 };
        assert_eq!(
            libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, s.bell().app_fd(), &mut ev),
            0
        );
        ep
    }
}

#[test]
fn every_message_raises_an_edge_for_edge_triggered_and_oneshot_epoll() {
    for oneshot in [false, true] {
        let (a, b) = pair(&small());
        b.watch();
        let flags = libc::EPOLLIN as u32
            | libc::EPOLLET as u32
            | if oneshot {
                libc::EPOLLONESHOT as u32
            } else {
                0
            };
        let ep = epoll_on(&b, flags);
        let (stop, h) = helper(&[&a, &b]);
        let mut buf = [0; 64];
        for i in 0..200u32 {
            send(&a, &i.to_le_bytes(), 0).unwrap();
            let ev = epoll_one(ep).unwrap_or_else(|| panic!("message {i}: no edge"));
            assert_ne!(ev & libc::EPOLLIN as u32, 0);
            // Read to EAGAIN, as an edge-triggered program must.
            let mut got = Vec::new();
            loop {
                match recv(&b, &mut buf, libc::MSG_DONTWAIT) {
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                    Err(e) => {
                        assert_eq!(e, libc::EAGAIN);
                        break;
                    }
                }
            }
            assert_eq!(got, i.to_le_bytes());
            if oneshot {
                let mut ev = libc::epoll_event {
                    events: flags,
                    u64: 1,
                };
                // SAFETY: re-arming our registration.
                let r =
                    unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_MOD, b.bell().app_fd(), &mut ev) };
                assert_eq!(r, 0);
            }
        }
        stop.store(true, Release);
        h.join().unwrap();
        crate::sys::raw::close(ep);
    }
}

#[test]
fn level_triggered_epoll_reports_until_everything_is_read() {
    let (a, b) = pair(&small());
    b.watch();
    let ep = epoll_on(&b, libc::EPOLLIN as u32);
    let (stop, h) = helper(&[&a, &b]);
    send(&a, b"0123456789", 0).unwrap();
    let mut buf = [0; 4];
    let mut got = Vec::new();
    while got.len() < 10 {
        assert!(epoll_one(ep).is_some(), "readable bytes remain");
        let n = recv(&b, &mut buf, libc::MSG_DONTWAIT).unwrap();
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(got, b"0123456789");
    let mut ev = libc::epoll_event { events: 0, u64: 0 };
    // SAFETY: one valid event slot.
    assert_eq!(unsafe { libc::epoll_wait(ep, &mut ev, 1, 0) }, 0, "drained");
    stop.store(true, Release);
    h.join().unwrap();
    crate::sys::raw::close(ep);
}

#[test]
fn a_blocked_reader_wakes_when_another_thread_shuts_reading() {
    let (_a, b) = pair(&small());
    let reader = {
        let b = b.clone();
        thread::spawn(move || recv(&b, &mut [0; 8], 0))
    };
    thread::sleep(Duration::from_millis(20));
    b.shutdown_read();
    assert_eq!(reader.join().unwrap(), Ok(0));
}

#[test]
fn fin_shows_end_of_stream_then_both_ways_a_hang_up() {
    let (a, b) = pair(&small());
    a.watch();
    b.watch();
    send(&a, b"bye", 0).unwrap();
    a.shutdown_write();
    b.dev.progress();
    let f = poll_flags(&b);
    assert_ne!(f & libc::POLLIN, 0);
    assert_ne!(f & libc::POLLRDHUP, 0);
    assert_eq!(f & libc::POLLHUP, 0);
    assert_eq!(read_to_end(&b), b"bye");
    b.shutdown_write();
    a.dev.progress();
    assert_ne!(poll_flags(&a) & libc::POLLHUP, 0);
    assert_ne!(poll_flags(&b) & libc::POLLHUP, 0);
    assert_eq!(send(&a, b"late", 0), Err(libc::EPIPE));
}

#[test]
fn a_close_lingers_until_its_bytes_are_delivered_then_tears_down() {
    let (a, b) = pair(&small());
    let data = pattern(10_000, 3);
    let reader = read_all_then_close(&b);
    assert_eq!(send(&a, &data, 0), Ok(data.len()));
    a.app_closed(false);
    let linger = Duration::from_secs(60);
    let mut steps = 0;
    while !a.reap_step(linger, std::time::Instant::now()) {
        a.dev.progress();
        b.dev.progress();
        thread::sleep(Duration::from_millis(1));
        steps += 1;
        assert!(steps < 20_000, "teardown never finished");
    }
    assert!(reader.join().unwrap() == data);
    assert!(
        a.lock().proto.is_finished(),
        "finished both ways, not dropped at the linger"
    );
    a.destroy();
}

#[test]
fn an_abortive_close_resets_the_peer() {
    let (a, b) = pair(&small());
    send(&a, b"dropped", 0).unwrap();
    a.app_closed(true);
    b.dev.progress();
    let mut buf = [0; 16];
    assert_eq!(recv(&b, &mut buf, 0), Err(libc::ECONNRESET));
    assert_eq!(send(&b, b"x", 0), Err(libc::EPIPE));
}

#[test]
fn a_vanished_peer_leaves_arrived_bytes_readable_then_resets() {
    let (a, b) = pair(&small());
    send(&a, b"last words", 0).unwrap();
    a.lock().rc.as_mut().unwrap().disconnect().unwrap();
    b.dev.progress();
    let mut buf = [0; 32];
    assert_eq!(recv(&b, &mut buf, 0), Ok(10));
    assert_eq!(&buf[..10], b"last words");
    assert_eq!(recv(&b, &mut buf, 0), Err(libc::ECONNRESET));
    assert_eq!(send(&b, b"x", 0), Err(libc::EPIPE));
    assert_ne!(poll_flags(&b) & libc::POLLHUP, 0);
}

#[test]
fn a_write_to_a_vanished_host_times_out_and_the_error_is_told_once() {
    let (a, _b) = pair(&small());
    a.dev.vanish_peer();
    // The write is queued, then its post fails (the peer stopped answering: retries exhausted).
    let _ = send(&a, b"into the void", 0);
    a.dev.progress();
    assert_eq!(send(&a, b"again", 0), Err(libc::ETIMEDOUT), "told once");
    assert_eq!(send(&a, b"again", 0), Err(libc::EPIPE));
    assert_eq!(recv(&a, &mut [0; 8], 0), Err(libc::ETIMEDOUT));
}

#[test]
fn a_receive_timeout_gives_eagain() {
    let (_a, b) = pair(&small());
    let r = b.recv(
        &mut [IoSliceMut::new(&mut [0; 8])],
        0,
        Some(Duration::from_millis(30)),
    );
    assert_eq!(r, Err(libc::EAGAIN));
}

#[test]
fn a_closed_reader_keeps_its_receives_posted_until_the_writer_hears_the_reset() {
    let (a, b) = pair(&small());
    a.app_closed(false);
    // The engine's helper drives a closing stream.
    let (stop, h) = helper(&[&a]);
    let chunk = [5u8; 700];
    let mut r = Ok(0);
    for _ in 0..2000 {
        r = send(&b, &chunk, 0);
        if r.is_err() {
            break;
        }
    }
    stop.store(true, Release);
    h.join().unwrap();
    assert_eq!(r, Err(libc::EPIPE), "the writer hears the reset");
    assert_eq!(
        b.dev.rnr() + a.dev.rnr(),
        0,
        "a write found no receive posted"
    );
}

#[test]
fn an_accepted_streams_writes_wait_until_established_or_the_peer_writes() {
    let mut buf = [0; 16];
    // Established by the CM's event.
    let (a, b) = pair(&small());
    a.await_peer();
    assert_eq!(send(&a, b"early", 0), Ok(5), "queued, not refused");
    assert_eq!(
        recv(&b, &mut buf, libc::MSG_DONTWAIT),
        Err(libc::EAGAIN),
        "held back"
    );
    a.on_established();
    assert_eq!(recv(&b, &mut buf, 0), Ok(5));
    assert_eq!(&buf[..5], b"early");
    // Or by the peer's first write, which proves its queue pair ready (a lost RTU).
    let (a, b) = pair(&small());
    a.await_peer();
    assert_eq!(send(&a, b"reply", 0), Ok(5));
    assert_eq!(
        recv(&b, &mut buf, libc::MSG_DONTWAIT),
        Err(libc::EAGAIN),
        "held back"
    );
    assert_eq!(send(&b, b"request", 0), Ok(7));
    assert_eq!(recv(&a, &mut buf, 0), Ok(7));
    assert_eq!(recv(&b, &mut buf, 0), Ok(5));
    assert_eq!(&buf[..5], b"reply");
    // A late event changes nothing.
    a.on_established();
    assert_eq!(recv(&b, &mut buf, libc::MSG_DONTWAIT), Err(libc::EAGAIN));
}
