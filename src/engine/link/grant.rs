//! Streams granted ahead (PROTOCOL.md §14, GRANT): the accepting end of a link keeps a few
//! streams ready for the connecting end — an id, a ring and send buffer, its receives — so
//! that a connect takes one and writes at once, its OPEN and first bytes in one go, without
//! waiting for an ACCEPT. The acceptor queues the stream for accept() when the OPEN arrives,
//! as a kernel listener completes a handshake without its program: a connection costs two
//! user-space wake-ups in turn, as kernel TCP's does, instead of four.
//!
//! A grant is for the listener the link came in on, while it is this process's alone; a
//! stream whose OPEN finds that listener gone is closed at once (the connector's end is
//! reset: its connect had succeeded, as a TCP connection queued on a listener that then
//! closes is reset).

use super::parts::{accepted_stream, connector_stream, stream_slots, Bell};
use super::{refused_failed, Link, OpenTarget, Opening, SlotBuf, State};
use crate::engine::setup::{opts_socket, OptsSocket};
use crate::engine::stream::fresh_bell;
use crate::engine::{lock, Engine, Stream};
use crate::proto::link::imm::StreamId;
use crate::proto::link::record::Open;
use crate::proto::Conn;
use crate::stats::Cause;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

/// Streams granted to a peer that has opened one so far.
const FIRST_GRANTS: usize = 2;

/// Acceptor: tops the streams granted to the peer up to the link's pool once half of them
/// were taken (so a GRANT message carries several), unless the link's listener is
/// `shared` with other processes. The pool grows with use: [`FIRST_GRANTS`] while the peer
/// has opened one stream, then twice as many as it has opened, up to `RSOCK_LINK_GRANTS`
/// — each grant is a ring and send buffer registered here, and most links between two
/// processes carry one connection. Returns the slots not used, to drop once `st` is let go
/// (a slot goes back to the link, which takes its lock).
pub(super) fn refill(
    link: &Arc<Link>,
    engine: &Engine,
    shared: bool,
    st: &mut State,
) -> Vec<SlotBuf> {
    let mut unused = Vec::new();
    let used = usize::try_from(st.opened).unwrap_or(usize::MAX);
    let pool = (link.grant_pool as usize).min(FIRST_GRANTS.max(used.saturating_mul(2)));
    if pool == 0 || link.is_failed() || shared || st.mux.grants_out() * 2 > pool {
        return unused;
    }
    while st.mux.grants_out() < pool {
        let (params, slots) = stream_slots(engine, link, st);
        let (mut ring, mut send) = match slots {
            (Some(r), Some(s)) => (r, s),
            (r, s) => {
                unused.extend(r.into_iter().chain(s)); // dropped by the caller, unlocked
                break;
            }
        };
        let at = ring.ring_at();
        match st.mux.grant(params, at) {
            Ok(mine) => {
                ring.id = Some(mine);
                send.id = Some(mine);
                st.granted.insert(mine.get(), (ring, send));
            }
            Err(_) => {
                unused.extend([ring, send]);
                break;
            }
        }
    }
    unused
}

/// Acceptor, on the poller: the peer's OPEN took our granted stream `mine` (`conn` its
/// connection): made now and queued for accept(), before the link's next completion (the
/// stream's first bytes follow the OPEN). A listener gone or handed to other processes
/// since the grant: the stream is closed, which resets the connector's end.
pub(super) fn on_open_granted(
    link: &Arc<Link>,
    engine: &Engine,
    open: Open,
    mine: StreamId,
    conn: Conn,
) {
    let slots = link.lock().granted.remove(&mine.get());
    let listener = lock(&engine.listeners).get(&link.listener).cloned();
    // Taken even if other processes accept through the listener now (a prefork master's,
    // once its workers accept): the connector's connect has returned, so refusing would
    // reset a connection the program holds. The worker that accepts it gets it relayed.
    let listener = listener.filter(|_| open.dest.port() == link.dest.port());
    let opts_fd = opts_socket(&link.peer);
    let bell = fresh_bell().ok().filter(|_| opts_fd >= 0);
    let ready = match (listener, slots, bell) {
        (Some(l), Some(s), Some(b)) => Some((l, s, b)),
        (_, slots, bell) => {
            drop((slots, bell)); // unlocked: a slot goes back to the link, which locks it
            None
        }
    };
    let Some((listener, (ring, send), bell)) = ready else {
        log::info!(
            "rdma link from {}: the OPEN of granted stream {} to {} finds no listener or no resources: closed",
            link.peer,
            mine.get(),
            open.dest
        );
        crate::sys::raw::close(opts_fd);
        let mut st = link.lock();
        st.mux.close(mine);
        link.pump(&mut st);
        return;
    };
    log::debug!(
        "rdma link from {}: OPEN of stream {} to {} took granted {}",
        link.peer,
        open.opener.get(),
        open.dest,
        mine.get()
    );
    crate::stats::count_granted();
    link.lock().opened += 1;
    // Queued beyond the backlog if need be: the connector's connect has returned.
    let slots = (ring, send);
    queue_accepted(
        link,
        engine,
        &*listener,
        (&open, mine, conn),
        slots,
        (opts_fd, bell),
    );
}

/// Acceptor: the records owed go out (an ACCEPT, grants topped up if `target` takes them),
/// then the stream `mine` the peer's `open` asked for is made of `conn` and its slots and
/// queued on `target` (its listener). In that order: the program
/// may write as soon as it accepts, and its first bytes must not overtake the ACCEPT (the
/// peer would fail the link). The peer's first bytes cannot come before the stream exists:
/// this runs on the poller, which looks at the link's next completion only after it.
pub(super) fn queue_accepted(
    link: &Arc<Link>,
    engine: &Engine,
    target: &dyn OpenTarget,
    (open, mine, conn): (&Open, StreamId, Conn),
    slots: (SlotBuf, SlotBuf),
    fds: (libc::c_int, Bell),
) {
    let mut st = link.lock();
    let unused = refill(link, engine, !target.grants(), &mut st);
    link.pump(&mut st);
    drop(st);
    drop(unused); // a slot goes back to the link, which takes its lock
    if let Some(s) = accepted_stream(link, engine, open, mine, conn, slots, fds) {
        target.push_stream(s);
    }
}

/// Connector: opens a stream to `dest` on a grant of the peer's (its doorbell `bell`, its
/// local address and port for the OPEN `(local, from_port)`), if
/// the link holds one and its control stream can send the OPEN at once. `Err(bell)`: no
/// grant to take (open and wait for the answer instead). The stream is made and registered
/// before its OPEN is queued (the peer writes as soon as it has it), and is returned once
/// the OPEN is posted (the program's first write must not overtake it).
pub(super) fn open(
    engine: &'static Engine,
    link: &Arc<Link>,
    dest: SocketAddr,
    opts: &OptsSocket,
    (bell, (local, from_port)): (Bell, (SocketAddr, u16)),
    deadline: Instant,
) -> Result<Result<Arc<Stream>, Cause>, Bell> {
    if link.grant_pool != 0 || engine.cfg.link_grants == 0 {
        return Err(bell); // an acceptor's link, or grants off
    }
    let mut st = link.lock();
    if link.is_failed() || st.mux.grants_held() == 0 {
        return Err(bell);
    }
    let (params, slots) = stream_slots(engine, link, &mut st);
    let (mut ring, mut send) = match slots {
        (Some(r), Some(s)) => (r, s),
        unused => {
            drop(st);
            drop(unused); // a slot goes back to the link, which takes its lock
            return Err(bell);
        }
    };
    let conn_id = crate::sys::unix::random_u64();
    let at = ring.ring_at();
    let Some((mine, conn)) = st.mux.open_granted(params, at, conn_id, (dest, from_port)) else {
        drop(st);
        drop((ring, send));
        return Err(bell);
    };
    st.opened += 1;
    drop(st);
    ring.id = Some(mine);
    send.id = Some(mine);
    let o = Opening {
        ring,
        send,
        local,
        opts: *opts,
        token: engine.token(),
        conn_id,
        bell,
    };
    let made = connector_stream(link, engine, mine, conn, o);
    let mut st = link.lock();
    let end = st.mux.announce(mine);
    if made.is_err() {
        st.mux.close(mine); // the peer's stream is reset; ours never was
    }
    link.pump(&mut st);
    drop(st);
    let stream = match made {
        Ok(s) => s,
        Err(c) => return Ok(Err(c)),
    };
    if link.is_failed() {
        // It failed before the stream was a member, so the reset missed it.
        stream.app_closed(true);
        engine.retire(stream);
        return Ok(Err(refused_failed()));
    }
    log::debug!(
        "rdma link to {}: OPEN of stream {} to {dest} on a grant",
        link.peer,
        mine.get()
    );
    crate::stats::count_granted();
    if let Some(end) = end {
        wait_posted(engine, link, end, deadline);
    }
    Ok(Ok(stream))
}

/// Connector: waits until stream 0 has posted up to `end` (its OPEN). It was checked to
/// go at once; records queued by other threads in between can hold it behind the peer's
/// credits, which the peer returns as it reads. A link stuck past the deadline fails (the
/// stream with it).
fn wait_posted(engine: &'static Engine, link: &Arc<Link>, end: u64, deadline: Instant) {
    loop {
        {
            let mut st = link.lock();
            link.pump(&mut st);
            if st.mux.control_posted() >= end || link.is_failed() {
                return;
            }
        }
        if Instant::now() >= deadline {
            link.fail("the control stream could not send an OPEN before the connect timeout");
            return;
        }
        engine.progress(&link.dev);
        std::thread::yield_now();
    }
}
