//! The accepting end of links: a link request on a listener (or a branch) set up, and the
//! streams its peer opens answered — at once for a listener of this process's, when the
//! program accepts for a branch (`listener/branch.rs` keeps them waiting meanwhile).

use super::make::{build, link_caps, memory};
use super::parts::{stream_params, stream_slots};
use super::Link;
use crate::engine::setup::opts_socket;
use crate::engine::stream::fresh_bell;
use crate::engine::{lock, Engine, Stream};
use crate::proto::link::imm::StreamId;
use crate::proto::link::record::{Open, RefuseReason};
use crate::proto::wire::{FLAG_LINK_GRANTS, FLAG_LINK_GROW, FLAG_LINK_PORTS};
use crate::proto::{Conn, Hello, HelloKind, Reject, RejectReason};
use crate::rdma::{self, ConnParam};
use std::sync::Arc;

/// Where the streams of a link's OPENs go: a listener's accept queue.
pub(in crate::engine) trait OpenTarget {
    /// Whether another stream may be queued.
    fn has_room_for_link_stream(&self) -> bool;
    /// Whether streams may be granted ahead for it (a listener this process alone accepts
    /// on: not a shared one, not a branch, whose streams wait for the program's accept).
    fn grants(&self) -> bool;
    /// Queues a stream for `accept()`.
    fn push_stream(&self, s: Arc<Stream>);
}

/// Whether a connect request asks for a link (to a listener, or to a branch).
pub(in crate::engine) fn is_link_request(private_data: &[u8]) -> bool {
    matches!(Hello::parse(private_data), Ok(h) if h.kind.is_link())
}

/// Passive side: a connect request for a link on the listener whose token is `listener`
/// (of kind Link; of kind BranchLink on a `branch`, which checked its id): sets the link up
/// and accepts, or rejects it ("no resources": the client then connects as before).
pub(in crate::engine) fn accept_link(
    engine: &'static Engine,
    (listener, branch): (u64, bool),
    inc: rdma::Incoming,
) {
    let rdma::Incoming {
        mut id,
        device,
        event,
    } = inc;
    let from = id.peer_addr();
    let no_room = Reject::new(RejectReason::NoResources).to_bytes();
    let kind = match branch {
        true => HelloKind::BranchLink,
        false => HelloKind::Link,
    };
    let hello = match Hello::parse_kind(event.private_data(), kind) {
        Ok(h) if engine.cfg.links => h,
        _ => {
            let _ = id.reject(&no_room);
            return;
        }
    };
    let token = engine.token();
    id.set_token(token);
    let refuse = |e: &rdma::Error| log::warn!("refusing an rdma link from {from:?}: {e}");
    let made = engine.dev(&device).and_then(|d| Ok((d, memory(&device)?)));
    let (d, mem) = match made {
        Ok(x) => x,
        Err(e) => {
            refuse(&e);
            let _ = id.reject(&no_room);
            return;
        }
    };
    let mut rc = match rdma::RcQp::new(id, &mem.pd, link_caps(engine)) {
        Ok(rc) => rc,
        Err((e, mut id)) => {
            refuse(&e);
            let _ = id.reject(&no_room);
            return;
        }
    };
    let caps = rc.caps();
    let params = stream_params(engine, &caps, true);
    let built = rc.post_recvs(0, params.recv_credits).and_then(|()| {
        rc.id_mut().migrate(&engine.ch)?;
        Conn::on_link(&params, &hello, StreamId::CONTROL, StreamId::CONTROL)
            .map_err(|_| rdma::Error::from_errno("link hello", libc::EPROTO))
    });
    let conn = match built {
        Ok(x) => x,
        Err(e) => {
            refuse(&e);
            let _ = rc.reject(&no_room);
            return;
        }
    };
    let mr = mem.rings.first().mr();
    // Grants only to a peer that takes them (an older one would fail the link on a GRANT),
    // and not from a branch: its streams wait for its program's accept.
    let grant_pool = if hello.flags & FLAG_LINK_GRANTS != 0 && !branch {
        engine.cfg.link_grants
    } else {
        0
    };
    let mut ours = params.hello(
        HelloKind::Accept,
        mr.iova() + u64::from(mem.control_ring.offset),
        mr.rkey().unwrap_or(0),
        hello.conn_id,
    );
    ours.flags |= FLAG_LINK_PORTS | FLAG_LINK_GROW;
    if grant_pool > 0 {
        ours.flags |= FLAG_LINK_GRANTS;
    }
    let ours = ours.to_bytes();
    let (Some(local), Some(peer)) = (rc.id().local_addr(), rc.id().peer_addr()) else {
        let _ = rc.reject(&no_room);
        return;
    };
    // Registered before the accept: the client may OPEN as soon as it is established.
    let Some(link) = build(
        engine,
        d,
        rc,
        conn,
        &params,
        mem,
        token,
        local,
        local,
        peer,
        // A connector's hello never says it shows ports (an accept's flag).
        (listener, grant_pool, hello.flags & !FLAG_LINK_PORTS, None),
    ) else {
        return;
    };
    let mut st = link.lock();
    let r = st.rc.accept(&ConnParam {
        private_data: &ours[..Hello::LEN],
        ..ConnParam::default()
    });
    drop(st);
    match r {
        Ok(()) => log::info!("rdma link {local} <- {peer}: up (qp {})", link.qpn),
        Err(e) => {
            log::warn!("rdma link from {peer}: accept: {e}");
            link.fail("accept failed");
        }
    }
}

/// Acceptor: refuses the peer's `open` for `reason`.
pub(in crate::engine) fn refuse_open(link: &Link, open: &Open, reason: RefuseReason) {
    log::debug!(
        "rdma link from {}: OPEN of stream {} refused ({reason:?})",
        link.peer,
        open.opener.get()
    );
    let mut st = link.lock();
    st.mux.refuse(open.opener, reason);
    link.pump(&mut st);
}

/// Acceptor, at a branch whose program accepts: the OPEN that waited for it is answered,
/// its stream queued on `target`. The device's poll lock is held meanwhile, as the poller
/// holds it: the peer's first bytes must not be looked at before the stream exists.
pub(in crate::engine) fn accept_waiting_open(
    link: &Arc<Link>,
    engine: &Engine,
    target: &dyn OpenTarget,
    open: Open,
) {
    if link.is_failed() {
        return; // its opener's stream was reset with the link
    }
    let _poll = lock(&link.dev.poll);
    accept_open(link, engine, target, open)
}

/// Acceptor: answers the peer's `open` for `target` (ACCEPT, or REFUSE for want of room),
/// and queues its stream there.
pub(in crate::engine) fn accept_open(
    link: &Arc<Link>,
    engine: &Engine,
    target: &dyn OpenTarget,
    open: Open,
) {
    let refuse = |reason| refuse_open(link, &open, reason);
    if !target.has_room_for_link_stream() {
        return refuse(RefuseReason::BacklogFull);
    }
    let opts_fd = opts_socket(&link.peer);
    let bell = match fresh_bell() {
        Ok(b) if opts_fd >= 0 => b,
        _ => {
            crate::sys::raw::close(opts_fd);
            return refuse(RefuseReason::NoResources);
        }
    };
    let taken = {
        let mut st = link.lock();
        let (params, slots) = stream_slots(engine, link, &mut st);
        match slots {
            (Some(ring), Some(send)) => {
                let at = ring.ring_at();
                st.opened += 1;
                match st.mux.accept(&open, params, at) {
                    Ok((mine, conn)) => Ok((ring, send, mine, conn)),
                    // Refused by the mux (no id or no room in the queues).
                    Err(_) => {
                        log::debug!(
                            "rdma link from {}: no id or queue room ({})",
                            link.peer,
                            st.describe()
                        );
                        st.mux.release_closes(); // what we hold back keeps the peer's too
                        Err((Some(ring), Some(send)))
                    }
                }
            }
            unused => {
                log::debug!(
                    "rdma link from {}: no slot for a stream ({})",
                    link.peer,
                    st.describe()
                );
                st.mux.refuse(open.opener, RefuseReason::NoResources);
                st.mux.release_closes();
                Err(unused)
            }
        }
    };
    let (mut ring, mut send, mine, conn) = match taken {
        Ok(x) => x,
        Err(unused) => {
            drop(unused);
            crate::sys::raw::close(opts_fd);
            let mut st = link.lock();
            link.pump(&mut st);
            return;
        }
    };
    ring.id = Some(mine);
    send.id = Some(mine);
    log::debug!(
        "rdma link from {}: OPEN of stream {} to {} accepted as {}",
        link.peer,
        open.opener.get(),
        open.dest,
        mine.get()
    );
    let slots = (ring, send);
    super::grant::queue_accepted(
        link,
        engine,
        target,
        (&open, mine, conn),
        slots,
        (opts_fd, bell),
    );
}
