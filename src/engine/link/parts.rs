//! What a link stream is made of — its params, its ring and send buffer (slots of the
//! link's slabs) — and the [`Stream`] made of them at either end.

use super::{Link, Member, Opening, SlotBuf, State};
use crate::engine::stream::{Parts, StreamBuf, StreamQp};
use crate::engine::OptsSocket;
use crate::engine::{Engine, Stream};
use crate::proto::link::imm::StreamId;
use crate::proto::link::record::Open;
use crate::proto::{Conn, Params};
use crate::rdma::QpCaps;
use crate::stats::{Cause, Fallback};
use std::net::SocketAddr;
use std::sync::Arc;

/// A link stream's ring and send buffer to start with: they grow, up to
/// [`STREAM_BUF_MAX`] (`RSOCK_RING_SIZE` and `RSOCK_SEND_BUF` if less), when the stream
/// streams and the peer takes GROW records.
pub(super) const STREAM_BUF: u32 = 16 * 1024;
/// The most a link stream's ring or send buffer grows to: a whole slab.
pub(super) const STREAM_BUF_MAX: u32 = 256 * 1024;
/// Stream 0's ring and send buffer.
pub(super) const CONTROL_BUF: u32 = 16 * 1024;
/// Each stream's share of the link's queues, and stream 0's.
pub(super) const STREAM_RECVS: u32 = 16;
pub(super) const STREAM_SENDS: u32 = 16;
/// Streams a link carries at most (the slabs hold as many, beside stream 0's slots).
pub(super) const MAX_STREAMS: u16 = 62;
/// The params of a stream on a link (stream 0's when `control`).
pub(super) fn stream_params(engine: &Engine, caps: &QpCaps, control: bool) -> Params {
    let buf = if control { CONTROL_BUF } else { STREAM_BUF };
    Params {
        ring_size: buf,
        recv_credits: STREAM_RECVS,
        send_buf_size: buf,
        send_queue_depth: STREAM_SENDS,
        max_inline: engine.cfg.max_inline.min(caps.max_inline_data),
        ring_grow_to: 0,
        send_grow_to: 0,
    }
}

/// A new stream's params and its ring and send buffer, if the slabs have room. A slot
/// goes back to the link when it drops, which takes the link's lock: the caller drops an
/// unused one only after letting go of `st`.
pub(super) fn stream_slots(
    engine: &Engine,
    link: &Arc<Link>,
    st: &mut State,
) -> (Params, (Option<SlotBuf>, Option<SlotBuf>)) {
    let mut params = stream_params(engine, &st.rc.caps(), false);
    if link.peer_grows {
        params.ring_grow_to = engine.cfg.ring_size.min(STREAM_BUF_MAX);
        params.send_grow_to = engine.cfg.send_buf.min(STREAM_BUF_MAX);
    }
    let ring = SlotBuf::take(link, st, params.ring_size, true);
    let send = SlotBuf::take(link, st, params.send_buf_size, false);
    (params, (ring, send))
}

/// Connector: the local address of a new stream — the link's, with a port of its own
/// (reserved by binding the copy of the program's socket the stream keeps) when the peer
/// shows it — and that port for the OPEN (0: none).
pub(super) fn stream_local(link: &Link, opts: &OptsSocket) -> (SocketAddr, u16) {
    let own = link.peer_shows_ports && opts.fd >= 0 && !link.local.ip().is_unspecified();
    match own.then(|| crate::sys::unix::bind_ephemeral(opts.fd, link.local.ip())) {
        Some(Some(port)) => (SocketAddr::new(link.local.ip(), port), port),
        _ => (link.local, 0),
    }
}

/// Connector: its stream `mine` on the link, made of what it left in `o` and the
/// connection `conn`, and registered (its completions find it from now on).
pub(super) fn connector_stream(
    link: &Arc<Link>,
    engine: &Engine,
    mine: StreamId,
    conn: Conn,
    o: Opening,
) -> Result<Arc<Stream>, Cause> {
    let parts = Parts {
        rc: StreamQp::Link(Box::new(Member::new(link.clone(), mine))),
        proto: conn,
        ring: StreamBuf::Slot(Box::new(o.ring)),
        send: StreamBuf::Slot(Box::new(o.send)),
        local: o.local,
        peer: link.dest,
        opts_fd: o.opts.fd,
        opts_default: o.opts.default_opts,
        token: o.token,
        conn_id: o.conn_id,
        bell: Some(o.bell),
    };
    match Stream::new(parts, link.dev.clone(), engine.spin_max(), engine.owner) {
        Ok(s) => {
            link.lock().members.insert(mine.get(), Arc::downgrade(&s));
            engine.register_member(&s);
            Ok(s)
        }
        Err(e) => {
            log::info!("rdma link to {}: stream {}: {e}", link.peer, mine.get());
            Err(Cause::errno(
                Fallback::Resources,
                e.raw_os_error().unwrap_or(0),
            ))
        }
    }
}

/// Acceptor: the stream `mine` the peer's `open` asked for, made of `conn` and its
/// slots and registered, for the caller to queue on its listener.
pub(super) fn accepted_stream(
    link: &Arc<Link>,
    engine: &Engine,
    open: &Open,
    mine: StreamId,
    conn: Conn,
    (ring, send): (SlotBuf, SlotBuf),
    (opts_fd, bell): (libc::c_int, Bell),
) -> Option<Arc<Stream>> {
    let parts = Parts {
        rc: StreamQp::Link(Box::new(Member::new(link.clone(), mine))),
        proto: conn,
        ring: StreamBuf::Slot(Box::new(ring)),
        send: StreamBuf::Slot(Box::new(send)),
        local: SocketAddr::new(link.local.ip(), open.dest.port()),
        peer: match open.from_port {
            0 => link.peer,
            port => SocketAddr::new(link.peer.ip(), port),
        },
        opts_fd,
        opts_default: true, // made here; the listener's options come after
        token: engine.token(),
        conn_id: open.conn_id,
        bell: Some(bell),
    };
    match Stream::new(parts, link.dev.clone(), engine.spin_max(), engine.owner) {
        Ok(s) => {
            link.lock().members.insert(mine.get(), Arc::downgrade(&s));
            engine.register_member(&s);
            Some(s)
        }
        Err(e) => {
            // The member closes the stream (its CLOSE follows the ACCEPT).
            log::warn!("rdma link from {}: stream: {e}", link.peer);
            None
        }
    }
}

/// A new stream's doorbell and what its A shows.
pub(super) type Bell = (crate::readiness::Doorbell, crate::proto::Readiness);
