//! The control path between processes, in one process: a [`Server`] on a thread and
//! callers, honest and not.

use super::*;
use crate::sys::unix::tests::copies_of;
use crate::sys::unix::{file_identity, stream_pair};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

fn me() -> Owner {
    Owner {
        pid: std::process::id() as i32,
        nonce: unix::random_u64() | 1,
    }
}

/// Serves `owner` on a thread as the engine's helper would (waiting callers included) until
/// `stop`; `answer` gets each request and the identity of its proof.
fn serve(
    owner: Owner,
    stop: Arc<AtomicBool>,
    mut answer: impl FnMut(&Request, Option<(u64, u64)>) -> (Reply, Option<c_int>) + Send + 'static,
) -> std::thread::JoinHandle<usize> {
    let server = Server::listen(&owner).unwrap();
    std::thread::spawn(move || {
        let mut watched: Vec<c_int> = Vec::new();
        let mut most_waiting = 0;
        while !stop.load(Ordering::Relaxed) {
            let mut ans =
                |r: &Request, call: super::Call| Some(answer(r, file_identity(call.proof)));
            if unix::wait(server.fd(), libc::POLLIN, 5) != 0 {
                server.on_listener(&mut ans, &mut |c| watched.push(c));
            }
            for c in std::mem::take(&mut watched) {
                if unix::wait(c, libc::POLLIN, 0) != 0 {
                    server.on_waiting(c, &mut ans);
                } else {
                    watched.push(c);
                }
            }
            most_waiting = most_waiting.max(server.waiting.lock().unwrap().len());
            server.expire(Instant::now());
            watched.retain(|&c| server.waiting.lock().unwrap().iter().any(|w| w.fd == c));
        }
        most_waiting
    })
}

#[test]
fn a_holder_gets_the_answer_and_the_owner_sees_its_proof() {
    let owner = me();
    let (a, b) = stream_pair().unwrap();
    let want = file_identity(a);
    let stop = Arc::new(AtomicBool::new(false));
    let t = serve(owner, stop.clone(), move |r, proof| {
        if *r != (Request::Relay { token: 42 }) || proof != want {
            return (Reply::Failed(libc::ENOENT), None);
        }
        let (x, y) = stream_pair().unwrap();
        raw::close(y);
        let ends = Ends {
            local: "10.0.0.1:1".parse().unwrap(),
            peer: "10.0.0.2:2".parse().unwrap(),
        };
        (Reply::Relay(ends), Some(x))
    });
    let mut at = owner;
    let (r, fd) = call(&mut at, &Request::Relay { token: 42 }, a).unwrap();
    assert!(matches!(r, Reply::Relay(_)));
    let fd = fd.unwrap();
    let mut byte = [0u8; 1];
    // The pair's other end is closed: the fd we got reads end of stream.
    assert_eq!(unsafe { libc::read(fd, byte.as_mut_ptr().cast(), 1) }, 0);
    // A stranger's socket (b is the same pair, but not A) proves nothing.
    assert_eq!(
        call(&mut at, &Request::Relay { token: 42 }, b),
        Err(CallError::Refused(libc::ENOENT))
    );
    stop.store(true, Ordering::Relaxed);
    t.join().unwrap();
    for f in [a, b, fd] {
        raw::close(f);
    }
    // Once the owner's socket is gone, callers learn it at once.
    assert_eq!(
        call(&mut at, &Request::Relay { token: 42 }, 0),
        Err(CallError::Gone)
    );
}

#[test]
fn a_squatter_on_the_owners_name_is_not_the_owner() {
    // The owner (pid 1 here) is gone and this process took its name: nothing it answers
    // is believed.
    let owner = Owner {
        pid: 1,
        nonce: unix::random_u64(),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let t = serve(owner, stop.clone(), |_, _| {
        (Reply::Failed(libc::EAGAIN), None)
    });
    let mut at = owner;
    let r = call(
        &mut at,
        &Request::Accept {
            token: 1,
            taker: None,
        },
        0,
    );
    assert_eq!(r, Err(CallError::Gone));
    stop.store(true, Ordering::Relaxed);
    t.join().unwrap();
}

#[test]
fn moved_replies_are_followed_a_bounded_number_of_times() {
    let (x, y) = (me(), me());
    let stop = Arc::new(AtomicBool::new(false));
    // Two owners that send callers to each other for ever.
    let tx = serve(x, stop.clone(), move |_, _| (Reply::Moved(y), None));
    let ty = serve(y, stop.clone(), move |_, _| (Reply::Moved(x), None));
    let (a, _b) = stream_pair().unwrap();
    let mut at = x;
    assert_eq!(
        call(&mut at, &Request::Relay { token: 1 }, a),
        Err(CallError::Failed(libc::ELOOP))
    );
    stop.store(true, Ordering::Relaxed);
    tx.join().unwrap();
    ty.join().unwrap();
}

/// Sends `bytes` with `fds` attached on a fresh connection to `owner` and returns the
/// reply, if one came.
fn raw_request(owner: &Owner, bytes: &[u8], fds: &[c_int]) -> Option<Reply> {
    let c = unix::connect_abstract(&owner.name(), CALL_TIMEOUT).unwrap();
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    let mut cbuf = [0u64; 8];
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = &mut iov;
    m.msg_iovlen = 1;
    if !fds.is_empty() {
        let n = std::mem::size_of_val(fds) as u32;
        m.msg_control = cbuf.as_mut_ptr().cast();
        m.msg_controllen = unsafe { libc::CMSG_SPACE(n) } as usize;
        unsafe {
            let h = libc::CMSG_FIRSTHDR(&m);
            (*h).cmsg_level = libc::SOL_SOCKET;
            (*h).cmsg_type = libc::SCM_RIGHTS;
            (*h).cmsg_len = libc::CMSG_LEN(n) as usize;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(h).cast(), fds.len());
        }
    }
    assert!(unsafe { libc::sendmsg(c, &m, 0) } >= 0);
    let mut buf = [0u8; msg::REPLY_LEN];
    let r = unix::recv_one(c, &mut buf)
        .ok()
        .and_then(|g| Reply::decode(&buf[..g.len]).ok());
    raw::close(c);
    r
}

#[test]
fn malformed_requests_are_refused_and_every_fd_they_bring_is_closed() {
    let owner = me();
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let n = served.clone();
    let t = serve(owner, stop.clone(), move |_, _| {
        n.fetch_add(1, Ordering::Relaxed);
        (Reply::Failed(libc::ENOENT), None)
    });
    let (p, q) = stream_pair().unwrap();
    let good = Request::Relay { token: 5 }.encode();
    let eproto = Some(Reply::Failed(libc::EPROTO));
    // No proof; garbage; a short and an oversized message; two fds at once.
    assert_eq!(raw_request(&owner, &good, &[]), eproto);
    assert_eq!(raw_request(&owner, b"hello, owner", &[p]), eproto);
    assert_eq!(raw_request(&owner, &good[..20], &[p]), eproto);
    assert_eq!(raw_request(&owner, &[good, good].concat(), &[p]), eproto);
    assert_eq!(raw_request(&owner, &good, &[p, q]), eproto);
    assert_eq!(
        served.load(Ordering::Relaxed),
        0,
        "nothing reached the answerer"
    );
    // The well-formed one does.
    assert_eq!(
        raw_request(&owner, &good, &[p]),
        Some(Reply::Failed(libc::ENOENT))
    );
    assert_eq!(served.load(Ordering::Relaxed), 1);
    stop.store(true, Ordering::Relaxed);
    t.join().unwrap();
    assert_eq!(
        copies_of(p),
        1,
        "the owner kept no copy of what it was sent"
    );
    assert_eq!(copies_of(q), 1);
    raw::close(p);
    raw::close(q);
}

#[test]
fn idle_callers_neither_block_the_owner_nor_pile_up() {
    let owner = me();
    let stop = Arc::new(AtomicBool::new(false));
    let t = serve(owner, stop.clone(), |_, _| {
        (Reply::Failed(libc::EAGAIN), None)
    });
    // 60 connections that never say anything (one uid: all of them are this test's).
    let idle: Vec<c_int> = (0..60)
        .map(|_| unix::connect_abstract(&owner.name(), CALL_TIMEOUT).unwrap())
        .collect();
    let (a, _b) = stream_pair().unwrap();
    let started = Instant::now();
    let mut at = owner;
    let ask = |at: &mut Owner| {
        call(
            at,
            &Request::Accept {
                token: 1,
                taker: None,
            },
            a,
        )
    };
    let mut r = ask(&mut at);
    // The owner may accept this connection before its request is in, when this uid's
    // waiting places are all taken by the idle ones: it closes it, and the caller, as real
    // callers do, asks again.
    for _ in 0..3 {
        if !matches!(r, Err(CallError::Failed(libc::EPIPE | libc::ECONNRESET))) {
            break;
        }
        r = ask(&mut at);
    }
    assert_eq!(r, Err(CallError::Refused(libc::EAGAIN)));
    assert!(
        started.elapsed() < Duration::from_millis(400),
        "an honest caller is served while idle ones wait: {:?}",
        started.elapsed()
    );
    stop.store(true, Ordering::Relaxed);
    let most = t.join().unwrap();
    assert!(
        most <= MAX_WAITING_PER_UID,
        "{most} callers were kept waiting"
    );
    for c in idle {
        raw::close(c);
    }
}

#[test]
fn a_stream_name_says_whose_stream_and_nothing_else_parses() {
    let o = Owner {
        pid: 4321,
        nonce: 0xfeed_0000_0000_0001,
    };
    let n = stream_name(&o, 0xabc);
    assert_eq!(parse_stream_name(&n), Some((o, 0xabc)));
    // A named socketpair end reports the name to whoever holds it.
    let (a, b) = stream_pair().unwrap();
    unix::bind_abstract(a, &n).unwrap();
    assert_eq!(unix::abstract_name(a), Some(n.clone()));
    assert_eq!(unix::abstract_name(b), None);
    for bad in [
        &b"rsock.4321.feed000000000001"[..],
        b"rsock-s.0.1.2",
        b"rsock-s.-5.1.2",
        b"rsock-s.4321.zz.2",
        b"rsock-s.4321.1.2.3",
        b"rsock-s.4321.1",
    ] {
        assert_eq!(
            parse_stream_name(bad),
            None,
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
    raw::close(a);
    raw::close(b);
}

#[test]
fn a_request_that_comes_after_its_connect_is_served_by_a_busy_helper() {
    // The helper, in its exit drain, accepts and then only polls: the caller's request
    // arrives after the accept found none (a parent's reclaim from its exiting child).
    let owner = me();
    let server = Server::listen(&owner).unwrap();
    let c = unix::connect_abstract(&owner.name(), CALL_TIMEOUT).unwrap();
    let mut served = 0;
    let mut ans = |_: &Request, _: super::Call| {
        served += 1;
        Some((Reply::Done, None))
    };
    server.on_listener(&mut ans, &mut |_| {});
    assert!(server.has_waiting(), "accepted before its request");
    server.on_waiting_ready(&mut ans); // nothing readable yet: still waiting
    assert!(server.has_waiting());
    let (a, b) = stream_pair().unwrap();
    let req = Request::Relay { token: 7 }.encode();
    unix::send(c, &req, Some(a)).unwrap();
    server.on_waiting_ready(&mut ans);
    assert!(!server.has_waiting());
    let mut buf = [0u8; msg::REPLY_LEN];
    let got = unix::recv_one(c, &mut buf).unwrap();
    assert_eq!(Reply::decode(&buf[..got.len]), Ok(Reply::Done));
    assert_eq!(served, 1);
    for f in [a, b, c] {
        raw::close(f);
    }
}
