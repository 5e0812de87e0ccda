//! A connector's wait for the answer to its OPEN, and each connecting thread's eventfd:
//! what wakes it from its sleep on a completion channel when another thread handled the
//! answer it waits for.

use super::{Link, State};
use crate::engine::stream::Asleep;
use crate::engine::{Dev, Engine, Stream};
use crate::proto::link::imm::StreamId;
use crate::stats::{Cause, Fallback};
use crate::sys::raw;
use libc::c_int;
use std::cell::Cell;
use std::sync::{Arc, MutexGuard};
use std::time::Instant;

/// How long past its deadline a connector waits for an answer already being made.
const ANSWER_IN_FLIGHT: std::time::Duration = std::time::Duration::from_secs(1);

/// Connector: waits for the answer to its OPEN of `mine`. It usually comes within a round
/// trip, so the CQ is polled first (a blocked call's spin budget); then the thread sleeps on
/// the device's completion channel and on its own eventfd, which the thread that handles
/// the answer rings if it is another one (the helper, or another connector). Naps with a
/// timeout instead cost the connect half a millisecond on average (measured 2026-11-28).
pub(super) fn wait(
    engine: &'static Engine,
    link: &Arc<Link>,
    conn_id: u64,
    mine: StreamId,
    deadline: Instant,
) -> Result<Arc<Stream>, Cause> {
    engine.ensure_helper();
    let mut spin = engine.poll_budget.spin();
    loop {
        engine.progress(&link.dev);
        if link.lock().answers.contains_key(&conn_id) || !spin.go_on() {
            break;
        }
        std::hint::spin_loop();
    }
    let waker = this_thread_waker();
    loop {
        let left = {
            let mut st = link.lock();
            if let Some(r) = st.answers.remove(&conn_id) {
                st.sleepers.remove(&conn_id);
                return r;
            }
            let now = Instant::now();
            let left = deadline.saturating_duration_since(now);
            // An ACCEPT whose stream is being made right now (its opening taken, the answer
            // not in yet) is answered in a moment: giving up then would leave the stream
            // to nobody, its slots and the peer's end held for the link's life.
            let unanswered = st
                .opening
                .get(&mine.get())
                .is_some_and(|o| o.conn_id == conn_id);
            if left.is_zero() && (unanswered || now >= deadline + ANSWER_IN_FLIGHT) {
                st.sleepers.remove(&conn_id);
                return Err(no_answer(link, st, conn_id, mine));
            }
            if let Some(fd) = waker {
                st.sleepers.insert(conn_id, fd);
            }
            left
        };
        // Without an eventfd, an answer another thread handles is seen at the next look.
        let most = if waker.is_some() { 200 } else { 1 };
        let ms = left.as_millis().clamp(1, most) as c_int;
        let answered = || link.lock().answers.contains_key(&conn_id);
        if sleep_on_device(engine, &link.dev, waker.unwrap_or(-1), ms, answered) {
            raw::eventfd_take(waker.unwrap_or(-1));
        }
    }
}

/// Sleeps on `dev`'s completion channel and on `fd` (ignored if negative) for at most
/// `ms`, unless `done` says the wait is over once the CQ is armed (what landed before the
/// arm is handled then). A completion event is handled here: the thread counts as one
/// asleep on the device meanwhile, so the helper leaves the device's events to it rather
/// than handing them on with a thread hop. Whether `fd` became readable.
pub(in crate::engine) fn sleep_on_device(
    engine: &Engine,
    dev: &Arc<Dev>,
    fd: c_int,
    ms: c_int,
    done: impl Fn() -> bool,
) -> bool {
    let asleep = Asleep::new(&**dev);
    engine.sleep_armed(dev); // polls once more: what landed before the arm
    if done() {
        return false;
    }
    let mut p = [
        libc::pollfd {
            fd: dev.dev.comp_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // SAFETY: two valid pollfds (a negative fd is ignored).
    unsafe { crate::sys::real::poll(p.as_mut_ptr(), 2, ms) };
    drop(asleep);
    if p[0].revents & libc::POLLIN != 0 {
        engine.on_cq_event(dev, 1);
    }
    p[1].revents & libc::POLLIN != 0
}

/// Connector: its OPEN of `mine` went unanswered until its deadline.
fn no_answer(link: &Link, mut st: MutexGuard<'_, State>, conn_id: u64, mine: StreamId) -> Cause {
    log::warn!(
        "rdma link to {}: no answer to the OPEN of stream {} ({})",
        link.peer,
        mine.get(),
        st.describe()
    );
    // Its answer, if it comes, finds no opening: the stream is closed then. (Ours only:
    // unanswered, the id is still ours.)
    let ours = st
        .opening
        .get(&mine.get())
        .is_some_and(|o| o.conn_id == conn_id);
    let opening = if ours {
        st.opening.remove(&mine.get())
    } else {
        None
    };
    drop(st);
    drop(opening); // its slots go back to the link, which takes the lock
    Cause::errno(Fallback::Timeout, libc::ETIMEDOUT)
}

/// A thread's eventfd, made at its first use and closed as the thread ends.
struct Waker {
    /// The process it was made in: a fork child's copy of the forking thread's is the
    /// parent's eventfd (not closed there: a child may have closed and reused the number).
    pid: Cell<i32>,
    fd: Cell<c_int>,
}

impl Drop for Waker {
    fn drop(&mut self) {
        if self.fd.get() >= 0 && self.pid.get() == raw::pid() {
            raw::close(self.fd.get());
        }
    }
}

thread_local! {
    static WAKER: Waker = const {
        Waker {
            pid: Cell::new(0),
            fd: Cell::new(-1),
        }
    };
}

/// This thread's eventfd (nonblocking, out of the program's way), or `None` if none can
/// be had (no fds, or the thread is ending).
fn this_thread_waker() -> Option<c_int> {
    WAKER
        .try_with(|w| {
            let me = raw::pid();
            if w.fd.get() >= 0 && w.pid.get() == me {
                return Some(w.fd.get());
            }
            let fd = raw::hide(raw::eventfd());
            (fd >= 0).then(|| {
                w.pid.set(me);
                w.fd.set(fd);
                fd
            })
        })
        .ok()
        .flatten()
}
