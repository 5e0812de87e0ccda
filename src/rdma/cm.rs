//! rdma_cm: event channels, connection identifiers and their events.
//!
//! Ids are created in `RDMA_PS_TCP`. Every id keeps its event channel alive (an `Arc`),
//! and a channel is destroyed only after its last id. Events are copied out and acked at
//! once (`rdma_destroy_id` waits for every event of its id to be acked, so holding an
//! event would risk a deadlock); a `CONNECT_REQUEST` hands over the new id as an owned
//! [`CmId`].

use std::ffi::c_void;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_sys::{
    ibv_context, rdma_cm_event, rdma_cm_event_type as ev, rdma_cm_id, rdma_conn_param,
    rdma_event_channel, rdma_port_space,
};

use super::error::{Error, Reason, Result};
use super::fd;
use super::ffi::{self, lib};

/// Most private data an active side can send in `rdma_connect` (IB/RoCE CM REQ, after
/// rdma_cm's own header). The passive side receives it padded with zeros to this length,
/// so the payload must carry its own length or magic.
pub const REQ_PRIVATE_MAX: usize = 56;
/// Most private data `rdma_accept` can send (CM REP); received zero-padded, likewise.
pub const REP_PRIVATE_MAX: usize = 196;
/// Most private data `rdma_reject` can send (CM REJ).
pub const REJ_PRIVATE_MAX: usize = 148;

/// A nonblocking rdma_cm event channel (its fd is pollable)
pub struct EventChannel {
    ch: *mut rdma_event_channel,
}

// SAFETY: librdmacm event channels are used from any thread (the fd is a kernel file;
// rdma_get_cm_event is thread-safe).
unsafe impl Send for EventChannel {}
// SAFETY: as above; all methods take &self and librdmacm locks internally.
unsafe impl Sync for EventChannel {}

impl EventChannel {
    /// Creates a channel with a nonblocking, close-on-exec fd.
    ///
    /// On a host without an RDMA device this fails with `ENODEV` ([`Reason::NoRdma`]).
    pub fn new() -> Result<Arc<EventChannel>> {
        let lib = lib()?;
        // SAFETY: no arguments; returns NULL + errno on failure.
        let ch = unsafe { (lib.rdma_create_event_channel)() };
        if ch.is_null() {
            let e = Error::last_lib("rdma_create_event_channel");
            // librdmacm reports "no device" as ENODEV (or ENOENT/ENOSYS without ucma).
            return Err(e);
        }
        // SAFETY: a channel just made, not yet used by anyone.
        unsafe { crate::sys::raw::rehome(std::ptr::addr_of_mut!((*ch).fd)) };
        let chan = Arc::new(EventChannel { ch });
        fd::set_nonblocking(chan.fd())?;
        Ok(chan)
    }

    /// The channel's fd (readable when an event is pending)
    pub fn fd(&self) -> RawFd {
        // SAFETY: `ch` is valid for the life of self.
        unsafe { (*self.ch).fd }
    }

    /// The raw channel pointer (for calls this layer does not wrap)
    pub fn as_ptr(&self) -> *mut rdma_event_channel {
        self.ch
    }

    /// Takes the next event without blocking; `Ok(None)` if there is none
    pub fn try_get_event(self: &Arc<Self>) -> Result<Option<CmEvent>> {
        let lib = lib()?;
        let mut raw: *mut rdma_cm_event = std::ptr::null_mut();
        // SAFETY: valid channel; `raw` receives an event we ack below.
        let ret = unsafe { (lib.rdma_get_cm_event)(self.ch, &mut raw) };
        if ret != 0 {
            let e = Error::from_ret("rdma_get_cm_event", ret);
            if e.errno() == libc::EAGAIN || e.errno() == libc::EINTR {
                return Ok(None);
            }
            return Err(e);
        }
        // SAFETY: rdma_get_cm_event succeeded, so `raw` is a valid event until acked.
        let event = unsafe { CmEvent::copy_from(raw, self) };
        // SAFETY: `raw` came from rdma_get_cm_event and is acked exactly once.
        unsafe { (lib.rdma_ack_cm_event)(raw) };
        Ok(Some(event))
    }

    /// Waits up to `timeout` (`None` = forever) for the next event; `Ok(None)` on timeout
    pub fn get_event(self: &Arc<Self>, timeout: Option<Duration>) -> Result<Option<CmEvent>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(e) = self.try_get_event()? {
                return Ok(Some(e));
            }
            if !fd::wait_readable(self.fd(), fd::remaining(deadline))? {
                // One last try: the event may have raced the timeout.
                return self.try_get_event();
            }
        }
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        if let Ok(lib) = lib() {
            // SAFETY: every CmId holds an Arc to its channel, so none is left on it.
            unsafe { (lib.rdma_destroy_event_channel)(self.ch) };
        }
    }
}

/// Kind of an rdma_cm event
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum EventKind {
    AddrResolved,
    AddrError,
    RouteResolved,
    RouteError,
    ConnectRequest,
    ConnectResponse,
    ConnectError,
    Unreachable,
    Rejected,
    Established,
    Disconnected,
    DeviceRemoval,
    AddrChange,
    TimewaitExit,
    Other(u32),
}

impl EventKind {
    fn from_raw(t: ev::Type) -> EventKind {
        match t {
            ev::RDMA_CM_EVENT_ADDR_RESOLVED => EventKind::AddrResolved,
            ev::RDMA_CM_EVENT_ADDR_ERROR => EventKind::AddrError,
            ev::RDMA_CM_EVENT_ROUTE_RESOLVED => EventKind::RouteResolved,
            ev::RDMA_CM_EVENT_ROUTE_ERROR => EventKind::RouteError,
            ev::RDMA_CM_EVENT_CONNECT_REQUEST => EventKind::ConnectRequest,
            ev::RDMA_CM_EVENT_CONNECT_RESPONSE => EventKind::ConnectResponse,
            ev::RDMA_CM_EVENT_CONNECT_ERROR => EventKind::ConnectError,
            ev::RDMA_CM_EVENT_UNREACHABLE => EventKind::Unreachable,
            ev::RDMA_CM_EVENT_REJECTED => EventKind::Rejected,
            ev::RDMA_CM_EVENT_ESTABLISHED => EventKind::Established,
            ev::RDMA_CM_EVENT_DISCONNECTED => EventKind::Disconnected,
            ev::RDMA_CM_EVENT_DEVICE_REMOVAL => EventKind::DeviceRemoval,
            ev::RDMA_CM_EVENT_ADDR_CHANGE => EventKind::AddrChange,
            ev::RDMA_CM_EVENT_TIMEWAIT_EXIT => EventKind::TimewaitExit,
            other => EventKind::Other(other),
        }
    }

    /// Whether this event ends a connection attempt in failure
    pub fn is_failure(self) -> bool {
        matches!(
            self,
            EventKind::AddrError
                | EventKind::RouteError
                | EventKind::ConnectError
                | EventKind::Unreachable
                | EventKind::Rejected
                | EventKind::DeviceRemoval
        )
    }
}

/// An rdma_cm event, copied out of librdmacm and already acked
pub struct CmEvent {
    /// What happened
    pub kind: EventKind,
    /// The event's status (negative errno, or the IB CM reject reason for `Rejected`)
    pub status: i32,
    /// The id the event is for (for a connect request: the new id, see [`Self::take_id`])
    pub id: *mut rdma_cm_id,
    /// For a connect request: the listening id
    pub listen_id: *mut rdma_cm_id,
    /// The token (`context`) of `listen_id` for a connect request, else of `id`
    pub token: u64,
    /// Peer's `responder_resources` (connect request/response)
    pub responder_resources: u8,
    /// Peer's `initiator_depth` (connect request/response)
    pub initiator_depth: u8,
    private: [u8; REP_PRIVATE_MAX],
    private_len: u8,
    new_id: Option<CmId>,
}

// SAFETY: a copy of an acked event: its pointers name ids (compared, or taken over once by
// `take_id`), and nothing in librdmacm ties them to the thread that read the event.
unsafe impl Send for CmEvent {}

impl CmEvent {
    /// SAFETY: `raw` is a valid, not yet acked event taken from `chan`.
    unsafe fn copy_from(raw: *const rdma_cm_event, chan: &Arc<EventChannel>) -> CmEvent {
        // SAFETY: valid per the contract.
        let e = unsafe { &*raw };
        let kind = EventKind::from_raw(e.event);
        let mut private = [0u8; REP_PRIVATE_MAX];
        let mut private_len = 0u8;
        let mut rr = 0;
        let mut id_ = 0;
        // Connected-mode events carry rdma_conn_param (UD events would carry ud params).
        if matches!(
            kind,
            EventKind::ConnectRequest
                | EventKind::ConnectResponse
                | EventKind::Established
                | EventKind::Rejected
        ) {
            // SAFETY: for RC ids the union's active member is `conn`.
            let p = unsafe { e.param.conn };
            rr = p.responder_resources;
            id_ = p.initiator_depth;
            if !p.private_data.is_null() && p.private_data_len > 0 {
                let n = (p.private_data_len as usize).min(REP_PRIVATE_MAX);
                // SAFETY: librdmacm guarantees private_data_len readable bytes until ack.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        p.private_data.cast::<u8>(),
                        private.as_mut_ptr(),
                        n,
                    )
                };
                private_len = n as u8;
            }
        }
        let (token, new_id) = if kind == EventKind::ConnectRequest {
            // SAFETY: listen_id is the listener that produced the request.
            let tok = if e.listen_id.is_null() {
                0
            } else {
                unsafe { (*e.listen_id).context as u64 }
            };
            // The new id is ours from now on (destroying it unanswered rejects the peer).
            // Its listener's family is set by `rdma::CmListener::next_request`.
            let new = CmId {
                id: e.id,
                _ch: chan.clone(),
                v6: false,
            };
            (tok, Some(new))
        } else {
            // SAFETY: `id` is a live id of this channel.
            (
                if e.id.is_null() {
                    0
                } else {
                    unsafe { (*e.id).context as u64 }
                },
                None,
            )
        };
        CmEvent {
            kind,
            status: e.status,
            id: e.id,
            listen_id: e.listen_id,
            token,
            responder_resources: rr,
            initiator_depth: id_,
            private,
            private_len,
            new_id,
        }
    }

    /// Private data the peer sent (REQ, REP or REJ); zero-padded by the CM to its limit
    pub fn private_data(&self) -> &[u8] {
        &self.private[..self.private_len as usize]
    }

    /// For a connect request: the new id, to accept or reject (dropping it rejects)
    pub fn take_id(&mut self) -> Option<CmId> {
        self.new_id.take()
    }

    /// librdmacm's name for the event
    pub fn name(&self) -> &'static str {
        ffi::event_str(self.raw_kind())
    }

    /// The error this event means for a connection attempt at step `op`
    pub fn to_error(&self, op: &'static str) -> Error {
        self.error_kind(op).with_event(self.raw_kind(), self.status)
    }

    /// This event's `rdma_cm_event_type`
    pub fn raw_kind(&self) -> ev::Type {
        match self.kind {
            EventKind::Other(t) => t,
            k => kind_to_raw(k),
        }
    }

    fn error_kind(&self, op: &'static str) -> Error {
        let neg = if self.status < 0 { -self.status } else { 0 };
        match self.kind {
            EventKind::Rejected => Error::new(op, libc::ECONNREFUSED, Reason::Rejected),
            EventKind::AddrError if neg == libc::ENODEV => {
                Error::new(op, libc::ENODEV, Reason::NoRdma)
            }
            EventKind::AddrError
            | EventKind::RouteError
            | EventKind::Unreachable
            | EventKind::ConnectError => {
                if neg == libc::ETIMEDOUT {
                    Error::new(op, libc::ETIMEDOUT, Reason::Timeout)
                } else if neg == libc::ENODEV {
                    Error::new(op, libc::ENODEV, Reason::NoRdma)
                } else {
                    Error::new(
                        op,
                        if neg > 0 { neg } else { libc::EHOSTUNREACH },
                        Reason::Unreachable,
                    )
                }
            }
            EventKind::DeviceRemoval => Error::new(op, libc::ENODEV, Reason::NoRdma),
            EventKind::Disconnected | EventKind::TimewaitExit => {
                Error::new(op, libc::ECONNRESET, Reason::Disconnected)
            }
            _ => Error::new(op, libc::EPROTO, Reason::BadHandshake),
        }
    }
}

impl std::fmt::Debug for CmEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmEvent")
            .field("kind", &self.kind)
            .field("status", &self.status)
            .field("token", &self.token)
            .field("private_len", &self.private_len)
            .finish()
    }
}

fn kind_to_raw(k: EventKind) -> ev::Type {
    match k {
        EventKind::AddrResolved => ev::RDMA_CM_EVENT_ADDR_RESOLVED,
        EventKind::AddrError => ev::RDMA_CM_EVENT_ADDR_ERROR,
        EventKind::RouteResolved => ev::RDMA_CM_EVENT_ROUTE_RESOLVED,
        EventKind::RouteError => ev::RDMA_CM_EVENT_ROUTE_ERROR,
        EventKind::ConnectRequest => ev::RDMA_CM_EVENT_CONNECT_REQUEST,
        EventKind::ConnectResponse => ev::RDMA_CM_EVENT_CONNECT_RESPONSE,
        EventKind::ConnectError => ev::RDMA_CM_EVENT_CONNECT_ERROR,
        EventKind::Unreachable => ev::RDMA_CM_EVENT_UNREACHABLE,
        EventKind::Rejected => ev::RDMA_CM_EVENT_REJECTED,
        EventKind::Established => ev::RDMA_CM_EVENT_ESTABLISHED,
        EventKind::Disconnected => ev::RDMA_CM_EVENT_DISCONNECTED,
        EventKind::DeviceRemoval => ev::RDMA_CM_EVENT_DEVICE_REMOVAL,
        EventKind::AddrChange => ev::RDMA_CM_EVENT_ADDR_CHANGE,
        EventKind::TimewaitExit => ev::RDMA_CM_EVENT_TIMEWAIT_EXIT,
        EventKind::Other(t) => t,
    }
}

/// Connection parameters for [`CmId::connect`] / [`CmId::accept`]
#[derive(Clone, Copy, Debug)]
pub struct ConnParam<'a> {
    /// ≤ [`REQ_PRIVATE_MAX`] on connect, ≤ [`REP_PRIVATE_MAX`] on accept
    pub private_data: &'a [u8],
    /// Incoming RDMA READ/atomic depth (0: this transport never lets the peer read)
    pub responder_resources: u8,
    /// Outgoing RDMA READ/atomic depth
    pub initiator_depth: u8,
    /// Transport retries (max 7)
    pub retry_count: u8,
    /// RNR retries (7 = retry forever). Finite by default: credits make RNR impossible
    /// with a well-behaved peer, and one that never posts a receive must fail the QP, not
    /// hang it.
    pub rnr_retry_count: u8,
}

impl Default for ConnParam<'_> {
    fn default() -> Self {
        ConnParam {
            private_data: &[],
            responder_resources: 0,
            initiator_depth: 0,
            retry_count: 7,
            rnr_retry_count: 6,
        }
    }
}

impl ConnParam<'_> {
    fn to_raw(self) -> rdma_conn_param {
        rdma_conn_param {
            private_data: if self.private_data.is_empty() {
                std::ptr::null()
            } else {
                self.private_data.as_ptr().cast()
            },
            private_data_len: self.private_data.len() as u8,
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            flow_control: 1,
            retry_count: self.retry_count.min(7),
            rnr_retry_count: self.rnr_retry_count.min(7),
            srq: 0,
            qp_num: 0,
        }
    }
}

/// An rdma_cm identifier (`RDMA_PS_TCP`), destroyed on drop.
///
/// A QP created on it belongs to a [`super::RcQp`], which destroys the QP before the id.
///
/// Addresses cross it in the caller's family (`crate::addr`): rdma_cm is given an
/// IPv4-mapped address as plain IPv4, and an id used with IPv6 addresses reports IPv4 ones
/// back mapped, as the kernel does on an AF_INET6 socket.
pub struct CmId {
    id: *mut rdma_cm_id,
    _ch: Arc<EventChannel>,
    /// The caller speaks IPv6 (bound, resolved or listened with an AF_INET6 address).
    v6: bool,
}

// SAFETY: an rdma_cm_id may be used from any thread (one at a time: &mut for changes).
unsafe impl Send for CmId {}

/// A socket address in C form
#[repr(C)]
pub(crate) union SockAddr {
    pub v4: libc::sockaddr_in,
    pub v6: libc::sockaddr_in6,
    pub any: libc::sockaddr,
}

impl SockAddr {
    pub(crate) fn new(a: &SocketAddr) -> SockAddr {
        match a {
            SocketAddr::V4(a) => SockAddr {
                v4: libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: a.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from(*a.ip()).to_be(),
                    },
                    sin_zero: [0; 8],
                },
            },
            SocketAddr::V6(a) => SockAddr {
                v6: libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: a.port().to_be(),
                    sin6_flowinfo: a.flowinfo(),
                    sin6_addr: libc::in6_addr {
                        s6_addr: a.ip().octets(),
                    },
                    sin6_scope_id: a.scope_id(),
                },
            },
        }
    }

    pub(crate) fn as_mut_ptr(&mut self) -> *mut libc::sockaddr {
        (self as *mut SockAddr).cast()
    }
}

/// Reads a sockaddr written by the kernel/librdmacm.
///
/// SAFETY: `sa` points to at least a `sockaddr_in6`-sized readable buffer.
pub(crate) unsafe fn sockaddr_to_std(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    // SAFETY: per the contract, the buffer holds a full sockaddr_in6.
    unsafe {
        crate::sys::sockaddr::read(
            sa,
            std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
        )
    }
}

fn timeout_ms(t: Duration) -> i32 {
    t.as_millis().clamp(1, i32::MAX as u128) as i32
}

impl CmId {
    /// Creates an id on `ch` in `RDMA_PS_TCP`; `token` is stored in its `context` and
    /// reported in its events ([`CmEvent::token`]).
    pub fn new(ch: &Arc<EventChannel>, token: u64) -> Result<CmId> {
        let lib = lib()?;
        let mut id: *mut rdma_cm_id = std::ptr::null_mut();
        // SAFETY: valid channel; `id` receives the new id.
        let ret = unsafe {
            (lib.rdma_create_id)(
                ch.ch,
                &mut id,
                token as *mut c_void,
                rdma_port_space::RDMA_PS_TCP,
            )
        };
        if ret != 0 {
            return Err(Error::from_ret("rdma_create_id", ret));
        }
        Ok(CmId {
            id,
            _ch: ch.clone(),
            v6: false,
        })
    }

    /// Reports this id's addresses in the IPv6 family (see the type's doc): for the
    /// requests of a listener bound with an AF_INET6 address.
    pub fn set_v6(&mut self, v6: bool) {
        self.v6 = v6;
    }

    /// Whether the id reports its addresses in the IPv6 family
    pub fn is_v6(&self) -> bool {
        self.v6
    }

    /// Sets `RDMA_OPTION_ID_AFONLY` (before [`Self::bind`]): whether an IPv6 wildcard
    /// listener takes IPv6 requests only, like `IPV6_V6ONLY`.
    pub fn set_afonly(&mut self, afonly: bool) -> Result<()> {
        let lib = lib()?;
        let mut v: libc::c_int = afonly.into();
        // SAFETY: live id; optval points to an int of the size given (copied by the call).
        let ret = unsafe {
            (lib.rdma_set_option)(
                self.id,
                ffi::RDMA_OPTION_ID,
                ffi::RDMA_OPTION_ID_AFONLY,
                (&mut v as *mut libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>(),
            )
        };
        if ret != 0 {
            return Err(Error::from_ret("rdma_set_option(AFONLY)", ret));
        }
        Ok(())
    }

    /// The raw id (valid while self lives)
    pub fn as_ptr(&self) -> *mut rdma_cm_id {
        self.id
    }

    /// The channel this id reports on
    pub fn channel(&self) -> &Arc<EventChannel> {
        &self._ch
    }

    /// The token given at creation (or by [`Self::set_token`])
    pub fn token(&self) -> u64 {
        // SAFETY: live id.
        unsafe { (*self.id).context as u64 }
    }

    /// Replaces the token reported in this id's events
    pub fn set_token(&mut self, token: u64) {
        // SAFETY: live id; librdmacm never reads `context` itself.
        unsafe { (*self.id).context = token as *mut c_void }
    }

    /// The verbs context the id is bound to (null before address resolution/bind to an
    /// RDMA address)
    pub fn verbs(&self) -> *mut ibv_context {
        // SAFETY: live id.
        unsafe { (*self.id).verbs }
    }

    /// Binds to a local address (port 0 = any); for a listener
    pub fn bind(&mut self, addr: SocketAddr) -> Result<()> {
        let lib = lib()?;
        self.v6 = addr.is_ipv6();
        let mut sa = SockAddr::new(&crate::addr::v4_of(addr));
        // SAFETY: live id; sa is a valid sockaddr of the right family.
        let ret = unsafe { (lib.rdma_bind_addr)(self.id, sa.as_mut_ptr()) };
        if ret != 0 {
            return Err(Error::from_ret("rdma_bind_addr", ret));
        }
        Ok(())
    }

    /// Starts listening (after [`Self::bind`]); connect requests arrive on the channel
    pub fn listen(&mut self, backlog: i32) -> Result<()> {
        let lib = lib()?;
        // SAFETY: live, bound id.
        let ret = unsafe { (lib.rdma_listen)(self.id, backlog) };
        if ret != 0 {
            return Err(Error::from_ret("rdma_listen", ret));
        }
        Ok(())
    }

    /// Starts address resolution; `ADDR_RESOLVED` or `ADDR_ERROR` follows within `timeout`
    /// (the kernel enforces it). Resolves which RDMA device and port reach `dst`.
    pub fn resolve_addr(
        &mut self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<()> {
        let lib = lib()?;
        self.v6 = dst.is_ipv6();
        let (src, dst) = crate::addr::resolve_pair(src, dst);
        let mut d = SockAddr::new(&dst);
        let mut s = src.map(|a| SockAddr::new(&a));
        let sp = s.as_mut().map_or(std::ptr::null_mut(), |s| s.as_mut_ptr());
        // SAFETY: live id; addresses valid for the call (librdmacm copies them).
        let ret =
            unsafe { (lib.rdma_resolve_addr)(self.id, sp, d.as_mut_ptr(), timeout_ms(timeout)) };
        if ret != 0 {
            return Err(Error::from_ret("rdma_resolve_addr", ret));
        }
        Ok(())
    }

    /// Starts route resolution; `ROUTE_RESOLVED` or `ROUTE_ERROR` follows within `timeout`
    pub fn resolve_route(&mut self, timeout: Duration) -> Result<()> {
        let lib = lib()?;
        // SAFETY: live id with a resolved address.
        let ret = unsafe { (lib.rdma_resolve_route)(self.id, timeout_ms(timeout)) };
        if ret != 0 {
            return Err(Error::from_ret("rdma_resolve_route", ret));
        }
        Ok(())
    }

    /// Sends the connect request (after route resolution and QP creation)
    pub fn connect(&mut self, param: &ConnParam<'_>) -> Result<()> {
        if param.private_data.len() > REQ_PRIVATE_MAX {
            return Err(Error::new("rdma_connect", libc::EINVAL, Reason::Other));
        }
        let lib = lib()?;
        let mut raw = param.to_raw();
        // SAFETY: live id; raw and its private data are valid for the call (copied).
        let ret = unsafe { (lib.rdma_connect)(self.id, &mut raw) };
        if ret != 0 {
            return Err(Error::from_ret("rdma_connect", ret));
        }
        Ok(())
    }

    /// Accepts a connect request (the id from [`CmEvent::take_id`], with a QP)
    pub fn accept(&mut self, param: &ConnParam<'_>) -> Result<()> {
        if param.private_data.len() > REP_PRIVATE_MAX {
            return Err(Error::new("rdma_accept", libc::EINVAL, Reason::Other));
        }
        let lib = lib()?;
        let mut raw = param.to_raw();
        // SAFETY: live id; raw and its private data are valid for the call (copied).
        let ret = unsafe { (lib.rdma_accept)(self.id, &mut raw) };
        if ret != 0 {
            return Err(Error::from_ret("rdma_accept", ret));
        }
        Ok(())
    }

    /// Rejects a connect request with private data (≤ [`REJ_PRIVATE_MAX`] bytes)
    pub fn reject(&mut self, private_data: &[u8]) -> Result<()> {
        if private_data.len() > REJ_PRIVATE_MAX {
            return Err(Error::new("rdma_reject", libc::EINVAL, Reason::Other));
        }
        let lib = lib()?;
        let p = if private_data.is_empty() {
            std::ptr::null()
        } else {
            private_data.as_ptr().cast()
        };
        // SAFETY: live id of a connect request; private data valid for the call.
        let ret = unsafe { (lib.rdma_reject)(self.id, p, private_data.len() as u8) };
        if ret != 0 {
            return Err(Error::from_ret("rdma_reject", ret));
        }
        Ok(())
    }

    /// Starts an orderly disconnect (`DISCONNECTED` follows on both sides); moves the QP
    /// to the error state, which flushes its outstanding work requests
    pub fn disconnect(&mut self) -> Result<()> {
        let lib = lib()?;
        // SAFETY: live id.
        let ret = unsafe { (lib.rdma_disconnect)(self.id) };
        if ret != 0 {
            return Err(Error::from_ret("rdma_disconnect", ret));
        }
        Ok(())
    }

    /// Moves the id (and its future events) to another channel
    pub fn migrate(&mut self, ch: &Arc<EventChannel>) -> Result<()> {
        let lib = lib()?;
        // SAFETY: live id and channel; no event of this id is held unacked (we ack at once).
        let ret = unsafe { (lib.rdma_migrate_id)(self.id, ch.ch) };
        if ret != 0 {
            return Err(Error::from_ret("rdma_migrate_id", ret));
        }
        self._ch = ch.clone();
        Ok(())
    }

    /// Local address (after bind/resolve/accept)
    pub fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: live id; src_storage is a sockaddr_storage inside it.
        unsafe {
            let a = &(*self.id).route.addr.src_addr_union.src_storage as *const _
                as *const libc::sockaddr;
            sockaddr_to_std(a).map(|a| crate::addr::seen(a, self.v6))
        }
    }

    /// Peer address (after resolve/connect request)
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: live id; dst_storage is a sockaddr_storage inside it.
        unsafe {
            let a = &(*self.id).route.addr.dst_addr_union.dst_storage as *const _
                as *const libc::sockaddr;
            sockaddr_to_std(a).map(|a| crate::addr::seen(a, self.v6))
        }
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        if let Ok(lib) = lib() {
            // SAFETY: live id; its QP (if any) was destroyed by its RcQp first; all its
            // events are acked (CmEvent copies and acks at once).
            unsafe { (lib.rdma_destroy_id)(self.id) };
        }
    }
}

impl std::fmt::Debug for CmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmId")
            .field("token", &self.token())
            .field("peer", &self.peer_addr())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockaddr_round_trip() {
        for a in ["10.77.0.1:7471", "[fe80::1%2]:9", "[::1]:65535"] {
            let a: SocketAddr = a.parse().unwrap();
            let mut s = SockAddr::new(&a);
            // SAFETY: s is a full sockaddr_in6-sized union.
            let back = unsafe { sockaddr_to_std(s.as_mut_ptr()) };
            assert_eq!(back, Some(a));
        }
    }

    #[test]
    fn conn_param_limits_and_defaults() {
        let p = ConnParam::default();
        let raw = p.to_raw();
        assert!(raw.private_data.is_null());
        assert_eq!(
            (raw.retry_count, raw.rnr_retry_count, raw.flow_control),
            (7, 6, 1),
            "RNR retry must be finite (7 means forever)"
        );
    }
}
