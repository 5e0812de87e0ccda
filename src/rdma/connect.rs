//! Blocking connection-setup helpers built on the wrappers, each on a dedicated event
//! channel so a wait sees only its own id's events.
//!
//! Active side: [`resolve`] → (register the ring in the returned device's PD, build the
//! private data) → [`RcQp::new`] → post receives → [`connect`]. Passive side:
//! [`CmListener::bind`] → [`CmListener::next_request`] → [`RcQp::new`] on the request's id →
//! post receives → [`accept`]. Teardown: [`close`].
//!
//! A progress engine that multiplexes many connections would drive the same steps from
//! [`EventChannel::try_get_event`] instead; these helpers are what the shim's blocking
//! `connect()`/`accept()` paths and the examples use.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::cm::{CmEvent, CmId, ConnParam, EventChannel, EventKind};
use super::conn::RcQp;
use super::device::Device;
use super::error::{Error, Reason, Result};
use super::fd;
use super::wc::Wc;

/// Waits on `ch` until `deadline` for the event `want`; failure events map to their
/// error ([`CmEvent::to_error`]), any other event to [`Reason::BadHandshake`], and the
/// deadline to `ETIMEDOUT` ([`Reason::Timeout`]).
pub fn wait_event(
    ch: &Arc<EventChannel>,
    want: EventKind,
    op: &'static str,
    deadline: Option<Instant>,
) -> Result<CmEvent> {
    let Some(ev) = ch.get_event(fd::remaining(deadline))? else {
        return Err(Error::new(op, libc::ETIMEDOUT, Reason::Timeout));
    };
    if ev.kind == want {
        Ok(ev)
    } else {
        Err(ev.to_error(op))
    }
}

/// Resolves `dst`'s address and route on a new channel and id (with `token`); returns the
/// id and the shared resources of the device that reaches `dst`.
///
/// No RDMA device for the address → [`Reason::NoRdma`]; no route / timeout →
/// [`Reason::Unreachable`] / [`Reason::Timeout`].
pub fn resolve(
    src: Option<SocketAddr>,
    dst: SocketAddr,
    token: u64,
    timeout: Duration,
) -> Result<(CmId, Arc<Device>)> {
    let deadline = Instant::now() + timeout;
    let ch = EventChannel::new()?;
    let mut id = CmId::new(&ch, token)?;
    // Give the kernel the step's share of the budget; our own wait is the hard limit.
    id.resolve_addr(src, dst, timeout)?;
    wait_event(
        &ch,
        EventKind::AddrResolved,
        "rdma_resolve_addr",
        Some(deadline),
    )?;
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    id.resolve_route(left)?;
    wait_event(
        &ch,
        EventKind::RouteResolved,
        "rdma_resolve_route",
        Some(deadline),
    )?;
    let dev = Device::for_id(&id)?;
    Ok((id, dev))
}

/// Sends the connect request and waits for `ESTABLISHED`; returns that event, whose
/// [`CmEvent::private_data`] is the peer's accept data (zero-padded to 196 bytes).
/// Post the receives the peer may consume *before* calling this.
pub fn connect(conn: &mut RcQp, param: &ConnParam<'_>, timeout: Duration) -> Result<CmEvent> {
    let ev = connect_event(conn, param, timeout)?;
    if ev.kind == EventKind::Established {
        Ok(ev)
    } else {
        Err(ev.to_error("rdma_connect"))
    }
}

/// Like [`connect`], but returns whatever event ends the attempt — `ESTABLISHED`, or
/// `REJECTED` (whose [`CmEvent::private_data`] is the peer's reject data and
/// [`CmEvent::status`] the CM reject reason), `UNREACHABLE`, `CONNECT_ERROR` — so the
/// caller can read why. Only the timeout and local failures are errors.
pub fn connect_event(conn: &mut RcQp, param: &ConnParam<'_>, timeout: Duration) -> Result<CmEvent> {
    let deadline = Instant::now() + timeout;
    conn.connect(param)?;
    let ch = conn.id().channel().clone();
    match ch.get_event(fd::remaining(Some(deadline)))? {
        Some(ev) => Ok(ev),
        None => Err(Error::new("rdma_connect", libc::ETIMEDOUT, Reason::Timeout)),
    }
}

/// Accepts (the QP exists, receives are posted) and waits for `ESTABLISHED`
pub fn accept(conn: &mut RcQp, param: &ConnParam<'_>, timeout: Duration) -> Result<CmEvent> {
    let deadline = Instant::now() + timeout;
    conn.accept(param)?;
    let ch = conn.id().channel().clone();
    wait_event(&ch, EventKind::Established, "rdma_accept", Some(deadline))
}

/// A connect request taken from a [`CmListener`]: its id (already moved to its own event
/// channel), the device it arrived on and the client's private data
pub struct Incoming {
    /// The new id: give it to [`RcQp::new`], or [`CmId::reject`] it (dropping it rejects)
    pub id: CmId,
    /// The device the request came in on
    pub device: Arc<Device>,
    /// The request event (private data ≤ 56 bytes, zero-padded)
    pub event: CmEvent,
}

/// An rdma_cm listener in `RDMA_PS_TCP` on its own event channel
pub struct CmListener {
    id: CmId,
}

impl CmListener {
    /// Binds `addr` and listens. Binding to an address without an RDMA device fails
    /// with [`Reason::NoRdma`] (`EADDRNOTAVAIL`/`ENODEV`).
    pub fn bind(addr: SocketAddr, backlog: i32, token: u64) -> Result<CmListener> {
        CmListener::bind_afonly(addr, None, backlog, token)
    }

    /// [`Self::bind`], with `RDMA_OPTION_ID_AFONLY` set first when given (an IPv6 wildcard
    /// then takes IPv4 requests only if `afonly` is false; without it rdma_cm follows
    /// `net.ipv6.bindv6only`). An IPv4-mapped `addr` is bound as IPv4; either way the
    /// requests of an AF_INET6 `addr` report their addresses in the IPv6 family.
    pub fn bind_afonly(
        addr: SocketAddr,
        afonly: Option<bool>,
        backlog: i32,
        token: u64,
    ) -> Result<CmListener> {
        let ch = EventChannel::new()?;
        let mut id = CmId::new(&ch, token)?;
        if let Some(only) = afonly {
            id.set_afonly(only)?;
        }
        id.bind(addr)?;
        id.listen(backlog)?;
        Ok(CmListener { id })
    }

    /// The listening id
    pub fn id(&self) -> &CmId {
        &self.id
    }

    /// The channel fd (readable when a request is pending)
    pub fn fd(&self) -> std::os::fd::RawFd {
        self.id.channel().fd()
    }

    /// Next connect request within `timeout` (`None` = wait forever); `Ok(None)` on
    /// timeout. Other events on the listener (e.g. device removal) are errors. A request
    /// this side cannot take (its device unknown, no event channel of its own) is rejected
    /// with `refusal` — the caller's "no resources here", which a client must not hold
    /// against the listener — and its error returned.
    pub fn next_request(
        &self,
        timeout: Option<Duration>,
        refusal: &[u8],
    ) -> Result<Option<Incoming>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let Some(mut ev) = self.id.channel().get_event(fd::remaining(deadline))? else {
                return Ok(None);
            };
            if ev.kind != EventKind::ConnectRequest {
                if ev.kind == EventKind::DeviceRemoval {
                    return Err(ev.to_error("rdma_listen"));
                }
                continue; // stray event of an id that has since moved away
            }
            let Some(mut id) = ev.take_id() else { continue };
            id.set_v6(self.id.is_v6());
            let device = match Device::for_id(&id).and_then(|d| own_channel(&mut id).map(|()| d)) {
                Ok(d) => d,
                Err(e) => {
                    let _ = id.reject(refusal);
                    return Err(e);
                }
            };
            return Ok(Some(Incoming {
                id,
                device,
                event: ev,
            }));
        }
    }
}

/// Moves a connect request's id to an event channel of its own. `rdma_migrate_id` failed
/// with EAGAIN once under load (a node server, four clients connecting in turn; the kernel
/// path shows no such error, cause not found): it is tried again before the request is
/// refused.
fn own_channel(id: &mut CmId) -> Result<()> {
    let mut tries = 0;
    loop {
        match EventChannel::new().and_then(|ch| id.migrate(&ch)) {
            Ok(()) => return Ok(()),
            Err(e) if tries >= 2 => return Err(e),
            Err(e) => {
                tries += 1;
                log::debug!("rdma listener: {e}: trying again");
            }
        }
    }
}

/// Orderly teardown: disconnect, wait for `DISCONNECTED` (up to `timeout`, unless
/// [`RcQp::set_disconnected`] says it was seen already), drain both
/// queues and drop the connection. Completions of *other* QPs polled meanwhile from the
/// shared CQ are handed to `other`. Returns whether the drain completed in time (if not,
/// the QP is destroyed anyway; late completions of it must be ignored by the poller).
pub fn close(mut conn: RcQp, timeout: Duration, other: &mut dyn FnMut(&Wc)) -> Result<bool> {
    let deadline = Instant::now() + timeout;
    // rdma_disconnect moves the QP to the error state first (so its WRs flush), then asks
    // the CM; that step fails on an id that never connected or whose peer left first,
    // and then no DISCONNECTED event is coming: don't wait for one.
    let expect_event = conn.disconnect().is_ok();
    let ch = conn.id().channel().clone();
    while expect_event && !conn.is_disconnected() {
        match ch.get_event(fd::remaining(Some(deadline)))? {
            Some(ev) if ev.kind == EventKind::Disconnected => conn.set_disconnected(),
            Some(_) => continue,
            None => break,
        }
    }
    let dev = conn.device().clone();
    let qpn = conn.qp_num();
    let mut wcs = Wc::buffer(32);
    while !conn.is_drained() && Instant::now() < deadline {
        // ENOMEM while the full send queue is flushing: poll and retry.
        let _ = conn.start_drain();
        let n = dev.poll_or_wait(&mut wcs, Some(Duration::from_millis(50)))?;
        for wc in &wcs[..n] {
            if wc.qp_num() == qpn {
                conn.on_completion(wc);
            } else {
                other(wc);
            }
        }
    }
    let drained = conn.is_drained();
    drop(conn);
    Ok(drained)
}
