//! A hostile rsock peer (issue #11, isolation): connects to an rsock server at the RDMA level
//! as an rsock client would, then RDMA-WRITEs into rings of *other* connections of the
//! server with the rkeys and addresses it learnt from their Accept hellos, or guessed.
//!
//! ```text
//! rsock_attacker ADDR PORT [--timeout SECS] [--migrate TO_PORT] [--migrate-storm N]
//!                [--phantom-read OUT] [--oversized-resume sent|granted|unwritten]
//! ```
//!
//! `--phantom-read OUT` (issue #21): announces a full ring of DATA without writing any of it,
//! on a connection that gets a ring a finished connection used, and saves what the server
//! echoes to OUT (see `attacker/phantom.rs`).
//!
//! `--migrate TO_PORT` (issue #9, a hostile MIGRATE): instead of the writes below, opens one
//! connection, sends MIGRATE{TO_PORT} (PROTOCOL.md §11: "my end moves to TO_PORT at my
//! address", where nothing listens), keeps the connection for `--timeout`, and exits 0 once
//! the MIGRATE's write completed. The server must end that connection with an error, not wait
//! for a resume forever nor disturb its other connections. `--migrate-storm N` (issue #21)
//! does it on N connections at once (to port 9 unless `--migrate` says), and reports when
//! the server ended each (see `attacker/storm.rs`).
//!
//! `--oversized-resume sent|granted|unwritten` (issue #21): waits for the MIGRATE of a server
//! that hands the connection to another process, then resumes at positions it never reached
//! (see `attacker/resume.rs`).
//!
//! 1. Opens connections A and B (rdma_cm connect with a valid Connect hello; the server's
//!    Accept hello in the ESTABLISHED event gives each ring's address, rkey and size).
//! 2. Sanity: an RDMA WRITE of 8 bytes of 0xEE on A's QP into A's own ring (and B's into
//!    B's): a legitimate peer may do this, so it must succeed, or the attacker's verbs do not
//!    work and a failure further on would prove nothing (exit 3).
//! 3. Cross-connection: a WRITE on B's QP into A's ring (rkey and address from A's hello).
//! 4. Guesses: for each of a few (rkey, address) pairs aimed at other connections' rings
//!    (A's rkey at other offsets and addresses, neighbouring rkeys, 0-based addresses), a
//!    fresh connection (an RC QP goes to the error state after a remote access error) makes
//!    one WRITE.
//!
//! Every write is signaled, without immediate (so the server's engine is not notified and
//! sees no protocol violation), 8 bytes sent inline (the attacker registers no memory at all:
//! its hello announces a ring it never registered, and the server never writes into it since
//! the attacker sends no data). Every wait is bounded by `--timeout` (default 20 s); every
//! connection is disconnected and its QP, CQ and PD destroyed before the next step.
//!
//! Output: one line per write,
//! `attempt name=N kind=sanity|cross via=CONN qpn=Q rkey=0x.. addr=0x.. len=8 status=S (TEXT) result=succeeded|failed`,
//! then `attacker: sanity ok, cross-connection writes: N attempted, S succeeded,
//! E remote-access-errors`.
//!
//! Exit status: 0 = every cross-connection write failed (remote access error or another
//! error); 1 = at least one succeeded; 2 = usage; 3 = could not connect, or a sanity write
//! failed.

#[path = "attacker/phantom.rs"]
mod phantom;
#[path = "attacker/resume.rs"]
mod resume;
#[path = "attacker/storm.rs"]
mod storm;

use std::net::{SocketAddr, ToSocketAddrs};
use std::process::exit;
use std::time::{Duration, Instant};

use rdma_sys::{
    ibv_cq, ibv_pd, ibv_qp, ibv_qp_init_attr, ibv_qp_type, ibv_recv_wr, ibv_send_flags,
    ibv_send_wr, ibv_sge, ibv_wc, ibv_wc_status, ibv_wr_opcode,
};
use rsock_core::proto::{Hello, HelloKind, Imm, Params};
use rsock_core::rdma::{self, ffi, CmEvent, CmId, ConnParam, EventChannel, EventKind};

/// Bytes of every attacking write.
const LEN: usize = 8;
/// What the attacker writes.
const PATTERN: [u8; LEN] = [0xEE; LEN];
/// Receives the attacker posts and announces (the protocol's minimum is 4).
const RECV_CREDITS: u32 = 16;
/// The ring the attacker announces (never registered, never written by the server).
const FAKE_RING_SIZE: u32 = 4096;
/// Where `--migrate-storm` says the connections move when `--migrate` does not say: the
/// discard port, where nothing listens in the test bed.
const STORM_PORT: u16 = 9;
const WR_WRITE: u64 = 1;
const WR_RECV: u64 = 2;

fn usage() -> ! {
    eprintln!(
        "usage: rsock_attacker ADDR PORT [--timeout SECS] [--migrate TO_PORT] [--migrate-storm N]\n       \
         [--phantom-read OUT] [--oversized-resume sent|granted|unwritten]"
    );
    exit(2)
}

/// One RDMA connection to the server: its own PD, CQ and RC QP.
struct Peer {
    name: String,
    id: Option<CmId>,
    qp: *mut ibv_qp,
    cq: *mut ibv_cq,
    pd: *mut ibv_pd,
    qpn: u32,
    /// The server's Accept hello: its ring for this connection.
    ring: Hello,
    /// Our Connect hello (a resume reuses its ring and connection id).
    ours: Hello,
    /// A ring of ours the server may write (phantom-read mode): a page-aligned part of this
    /// allocation (a zero-based registration needs the page offset of address and IOVA to
    /// agree), starting at `own_at`; and its registration.
    own_ring: Vec<u8>,
    own_at: usize,
    own_mr: *mut rdma_sys::ibv_mr,
}

/// A write's outcome: the completion status, or none within the timeout.
#[derive(Clone, Copy)]
struct Outcome {
    status: Option<u32>,
}

impl Outcome {
    fn ok(self) -> bool {
        self.status == Some(ibv_wc_status::IBV_WC_SUCCESS)
    }
    fn access_error(self) -> bool {
        self.status == Some(ibv_wc_status::IBV_WC_REM_ACCESS_ERR)
    }
    fn text(self) -> String {
        match self.status {
            Some(s) => format!("{s} ({})", ffi::wc_status_str(s)),
            None => "none (no completion in time)".to_string(),
        }
    }
}

/// How the server ended a connection, as the attacker saw it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Ended {
    /// rdma_cm's DISCONNECTED.
    Disconnected,
    /// A receive completed in error: the QP went to the error state.
    Flushed,
    /// A RESET immediate.
    Reset,
}

/// A connection id of our own (the server echoes it; a resume proves with it).
fn fresh_conn_id() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ (u64::from(std::process::id()) << 40) ^ 0x5253_434b_0000_0000
}

fn err<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> String + '_ {
    move |e| format!("{what}: {e}")
}

impl Peer {
    /// Resolves, builds a PD, CQ and QP, posts receives, connects with a Connect hello and
    /// reads the server's Accept hello.
    fn open(name: &str, addr: SocketAddr, timeout: Duration) -> Result<Peer, String> {
        Peer::open_with_ring(name, addr, timeout, 0)
    }

    /// [`Peer::open`], announcing a real ring of `ring_len` bytes (registered zero-based for
    /// remote write, as rsock does) instead of a fake one when `ring_len > 0`.
    fn open_with_ring(
        name: &str,
        addr: SocketAddr,
        timeout: Duration,
        ring_len: usize,
    ) -> Result<Peer, String> {
        let deadline = Instant::now() + timeout;
        let mut p = Peer::prepare(name, addr, timeout, ring_len)?;
        let ours = p.ours.to_bytes();
        let ev = p.handshake(&ours[..Hello::LEN], deadline)?;
        if ev.kind != EventKind::Established {
            return Err(format!(
                "connect answered with {} (status {})",
                ev.name(),
                ev.status
            ));
        }
        p.ring = Hello::parse_kind(ev.private_data(), HelloKind::Accept)
            .map_err(err("server's accept hello"))?;
        println!(
            "conn name={} qpn={} server_ring addr={:#x} rkey={:#x} size={} recv_credits={}",
            p.name, p.qpn, p.ring.ring_addr, p.ring.rkey, p.ring.ring_size, p.ring.recv_credits
        );
        Ok(p)
    }

    /// Everything before the connect request: resolves `addr`, builds a PD, CQ and QP, posts
    /// receives, registers the ring (`ring_len > 0`) and makes our Connect hello (`ours`,
    /// with a fresh connection id).
    fn prepare(
        name: &str,
        addr: SocketAddr,
        timeout: Duration,
        ring_len: usize,
    ) -> Result<Peer, String> {
        let lib = ffi::lib().map_err(err("load rdma libraries"))?;
        let deadline = Instant::now() + timeout;
        let ch = EventChannel::new().map_err(err("event channel"))?;
        let mut id = CmId::new(&ch, 0).map_err(err("rdma_create_id"))?;
        id.resolve_addr(None, addr, timeout)
            .map_err(err("resolve_addr"))?;
        rdma::wait_event(&ch, EventKind::AddrResolved, "resolve addr", Some(deadline))
            .map_err(err("resolve addr"))?;
        id.resolve_route(timeout).map_err(err("resolve_route"))?;
        rdma::wait_event(
            &ch,
            EventKind::RouteResolved,
            "resolve route",
            Some(deadline),
        )
        .map_err(err("resolve route"))?;
        let ctx = id.verbs();
        if ctx.is_null() {
            return Err("no verbs context on the resolved id".into());
        }
        let mut p = Peer {
            name: name.to_string(),
            id: None,
            qp: std::ptr::null_mut(),
            cq: std::ptr::null_mut(),
            pd: std::ptr::null_mut(),
            qpn: 0,
            ring: Params::default().hello(HelloKind::Accept, 0, 0, 0),
            ours: Params::default().hello(HelloKind::Connect, 0, 0, 0),
            own_ring: vec![0; if ring_len > 0 { ring_len + 4096 } else { 0 }],
            own_at: 0,
            own_mr: std::ptr::null_mut(),
        };
        // SAFETY: live context from the resolved id.
        p.pd = unsafe { (lib.ibv_alloc_pd)(ctx) };
        if p.pd.is_null() {
            return Err("ibv_alloc_pd failed".into());
        }
        // SAFETY: live context; no completion channel.
        p.cq =
            unsafe { (lib.ibv_create_cq)(ctx, 64, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
        if p.cq.is_null() {
            return Err("ibv_create_cq failed".into());
        }
        // SAFETY: plain C struct; zero is valid for every field.
        let mut attr: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = p.cq;
        attr.recv_cq = p.cq;
        attr.qp_type = ibv_qp_type::IBV_QPT_RC;
        attr.sq_sig_all = 0;
        attr.cap.max_send_wr = 8;
        attr.cap.max_recv_wr = RECV_CREDITS;
        attr.cap.max_send_sge = 1;
        attr.cap.max_recv_sge = 1;
        attr.cap.max_inline_data = 64;
        // SAFETY: live id on `ctx`, live PD and CQ of that context.
        let ret = unsafe { (lib.rdma_create_qp)(id.as_ptr(), p.pd, &mut attr) };
        if ret != 0 {
            return Err(format!("rdma_create_qp failed (errno {})", ffi::errno()));
        }
        // SAFETY: rdma_create_qp stored the QP in the id.
        p.qp = unsafe { (*id.as_ptr()).qp };
        // SAFETY: live QP.
        p.qpn = unsafe { (*p.qp).qp_num };
        p.id = Some(id);
        if attr.cap.max_inline_data < LEN as u32 {
            return Err(format!(
                "device grants {} bytes of inline data, need {LEN}",
                attr.cap.max_inline_data
            ));
        }
        // Zero-length receives for the server's immediates (credits, FIN), as a client posts.
        for _ in 0..RECV_CREDITS {
            p.repost_recv()?;
        }
        let mut cfg = Params {
            ring_size: FAKE_RING_SIZE,
            recv_credits: RECV_CREDITS,
            ..Params::default()
        };
        let mut rkey = 0;
        if ring_len > 0 {
            let access = (rdma_sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
                | rdma_sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE)
                .0 as i32;
            p.own_at = p.own_ring.as_ptr().align_offset(4096);
            // SAFETY: live PD; the Vec's heap memory stays put (it is never resized) until
            // `close` deregisters it.
            p.own_mr = unsafe {
                (lib.ibv_reg_mr_iova)(
                    p.pd,
                    p.own_ring.as_mut_ptr().add(p.own_at).cast(),
                    ring_len,
                    0,
                    access,
                )
            };
            if p.own_mr.is_null() {
                return Err(format!("ibv_reg_mr failed (errno {})", ffi::errno()));
            }
            // SAFETY: live MR.
            rkey = unsafe { (*p.own_mr).rkey };
            cfg.ring_size = ring_len as u32;
        }
        p.ours = cfg.hello(HelloKind::Connect, 0, rkey, fresh_conn_id());
        Ok(p)
    }

    /// Sends the connect request carrying `private_data` and returns the event that answers
    /// it (ESTABLISHED, REJECTED, UNREACHABLE, ...), waiting until `deadline`.
    fn handshake(&mut self, private_data: &[u8], deadline: Instant) -> Result<CmEvent, String> {
        let id = self.id.as_mut().ok_or("no id")?;
        let ch = id.channel().clone();
        id.connect(&ConnParam {
            private_data,
            ..ConnParam::default()
        })
        .map_err(err("rdma_connect"))?;
        match ch.get_event(rdma::fd::remaining(Some(deadline))) {
            Ok(Some(ev)) => Ok(ev),
            Ok(None) => Err("no answer to the connect request in time".to_string()),
            Err(e) => Err(format!(
                "waiting for the answer to the connect request: {e}"
            )),
        }
    }

    /// Posts one zero-length receive (each of the server's immediates consumes one).
    fn repost_recv(&mut self) -> Result<(), String> {
        let mut wr = ibv_recv_wr {
            wr_id: WR_RECV,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
        };
        let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: live QP; one WR without SGEs.
        let ret = unsafe { rdma_sys::ibv_post_recv(self.qp, &mut wr, &mut bad) };
        if ret != 0 {
            return Err(format!("ibv_post_recv failed ({ret})"));
        }
        Ok(())
    }

    /// Without waiting: the next immediate the server sent (its receive reposted), or how the
    /// connection ended. `Ok(None)`: nothing new. Completions of our own writes are skipped.
    fn poll_imm(&mut self) -> Result<Option<Imm>, Ended> {
        if let Some(id) = self.id.as_ref() {
            if let Ok(Some(ev)) = id.channel().clone().get_event(Some(Duration::ZERO)) {
                if ev.kind == EventKind::Disconnected {
                    return Err(Ended::Disconnected);
                }
            }
        }
        // SAFETY: plain C struct; zero is valid.
        let mut wc: ibv_wc = unsafe { std::mem::zeroed() };
        loop {
            // SAFETY: live CQ; room for one entry.
            let n = unsafe { rdma_sys::ibv_poll_cq(self.cq, 1, &mut wc) };
            if n <= 0 {
                return Ok(None);
            }
            if wc.wr_id != WR_RECV {
                continue;
            }
            if wc.status != ibv_wc_status::IBV_WC_SUCCESS {
                return Err(Ended::Flushed); // the QP went to the error state
            }
            let _ = self.repost_recv();
            // SAFETY: a u32 either way; a receive with immediate fills it.
            let raw = unsafe { wc.imm_data_invalidated_rkey_union.imm_data };
            return match Imm::decode(u32::from_be(raw)) {
                Ok(Imm::Reset) => Err(Ended::Reset),
                Ok(imm) => Ok(Some(imm)),
                Err(_) => Ok(None),
            };
        }
    }

    /// One signaled, inline RDMA WRITE (no immediate) of `PATTERN` to `addr` with `rkey`;
    /// waits for its completion until `timeout`.
    fn write(&mut self, rkey: u32, addr: u64, timeout: Duration) -> Result<Outcome, String> {
        let mut sge = ibv_sge {
            addr: PATTERN.as_ptr() as u64,
            length: LEN as u32,
            lkey: 0,
        };
        // SAFETY: plain C struct; zero is valid.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = WR_WRITE;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
        wr.send_flags = (ibv_send_flags::IBV_SEND_SIGNALED | ibv_send_flags::IBV_SEND_INLINE).0;
        wr.wr.rdma.remote_addr = addr;
        wr.wr.rdma.rkey = rkey;
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: live QP; inline data is copied during the call.
        let ret = unsafe { rdma_sys::ibv_post_send(self.qp, &mut wr, &mut bad) };
        if ret != 0 {
            return Err(format!("ibv_post_send failed ({ret})"));
        }
        self.wait_write(timeout)
    }

    /// The completion of the write just posted, until `timeout` (status `None` after it).
    fn wait_write(&mut self, timeout: Duration) -> Result<Outcome, String> {
        let deadline = Instant::now() + timeout;
        // SAFETY: plain C struct; zero is valid.
        let mut wcs: [ibv_wc; 8] = unsafe { std::mem::zeroed() };
        while Instant::now() < deadline {
            // SAFETY: live CQ; `wcs` has room for 8 entries.
            let n = unsafe { rdma_sys::ibv_poll_cq(self.cq, 8, wcs.as_mut_ptr()) };
            if n < 0 {
                return Err(format!("ibv_poll_cq failed ({n})"));
            }
            for wc in &wcs[..n as usize] {
                if wc.wr_id == WR_WRITE {
                    return Ok(Outcome {
                        status: Some(wc.status),
                    });
                }
            }
            if n == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        Ok(Outcome { status: None })
    }

    /// Posts one signaled, zero-length WRITE_WITH_IMM carrying `imm` (a control message,
    /// consuming one of the server's receives); [`Peer::wait_write`] waits for it.
    fn post_imm(&mut self, imm: u32) -> Result<(), String> {
        // SAFETY: plain C struct; zero is valid.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = WR_WRITE;
        wr.num_sge = 0;
        wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
        wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
        wr.wr.rdma.remote_addr = self.ring.ring_addr;
        wr.wr.rdma.rkey = self.ring.rkey;
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: live QP; no SGE.
        let ret = unsafe { rdma_sys::ibv_post_send(self.qp, &mut wr, &mut bad) };
        if ret != 0 {
            return Err(format!("ibv_post_send failed ({ret})"));
        }
        Ok(())
    }

    /// Disconnects (waiting for DISCONNECTED at most `timeout`) and destroys QP, id, CQ, PD.
    fn close(&mut self, timeout: Duration) {
        let Ok(lib) = ffi::lib() else { return };
        if let Some(mut id) = self.id.take() {
            if id.disconnect().is_ok() {
                let ch = id.channel().clone();
                let deadline = Instant::now() + timeout;
                while let Ok(Some(ev)) = ch.get_event(rdma::fd::remaining(Some(deadline))) {
                    if ev.kind == EventKind::Disconnected {
                        break;
                    }
                }
            }
            if !self.qp.is_null() {
                // SAFETY: the QP was created on this id and is no longer used.
                unsafe { (lib.rdma_destroy_qp)(id.as_ptr()) };
                self.qp = std::ptr::null_mut();
            }
            drop(id);
        }
        if !self.cq.is_null() {
            // SAFETY: the QP that used it is gone.
            unsafe { (lib.ibv_destroy_cq)(self.cq) };
            self.cq = std::ptr::null_mut();
        }
        if !self.own_mr.is_null() {
            // SAFETY: registered in `open_with_ring`; the QP that could use it is gone.
            unsafe { (lib.ibv_dereg_mr)(self.own_mr) };
            self.own_mr = std::ptr::null_mut();
        }
        if !self.pd.is_null() {
            // SAFETY: the QP in it is gone; its MR is deregistered.
            unsafe { (lib.ibv_dealloc_pd)(self.pd) };
            self.pd = std::ptr::null_mut();
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.close(Duration::from_secs(2));
    }
}

#[derive(Default)]
struct Tally {
    attempted: u32,
    succeeded: u32,
    access_errors: u32,
    other_errors: u32,
    skipped: u32,
}

/// Runs and reports one write; `cross` writes are counted.
fn attempt(
    name: &str,
    cross: bool,
    via: &mut Peer,
    rkey: u32,
    addr: u64,
    timeout: Duration,
    t: &mut Tally,
) -> Option<Outcome> {
    let kind = if cross { "cross" } else { "sanity" };
    match via.write(rkey, addr, timeout) {
        Ok(o) => {
            println!(
                "attempt name={name} kind={kind} via={} qpn={} rkey={rkey:#x} addr={addr:#x} len={LEN} status={} result={}",
                via.name,
                via.qpn,
                o.text(),
                if o.ok() { "succeeded" } else { "failed" }
            );
            if cross {
                t.attempted += 1;
                if o.ok() {
                    t.succeeded += 1;
                } else if o.access_error() {
                    t.access_errors += 1;
                } else {
                    t.other_errors += 1;
                }
            }
            Some(o)
        }
        Err(e) => {
            println!(
                "attempt name={name} kind={kind} via={} rkey={rkey:#x} addr={addr:#x} result=not-posted error=\"{e}\"",
                via.name
            );
            if cross {
                t.skipped += 1;
            }
            None
        }
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let host = args.next().unwrap_or_else(|| usage());
    let port: u16 = args
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| usage());
    let mut timeout = Duration::from_secs(20);
    let mut migrate: Option<u16> = None;
    let mut phantom: Option<String> = None;
    let mut storm_n = 1;
    let mut resume = None;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--timeout" => {
                let s: u64 = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| usage());
                timeout = Duration::from_secs(s.max(1));
            }
            "--migrate" => {
                migrate = Some(
                    args.next()
                        .and_then(|v| v.parse().ok())
                        .filter(|&p: &u16| p != 0)
                        .unwrap_or_else(|| usage()),
                );
            }
            "--phantom-read" => phantom = Some(args.next().unwrap_or_else(|| usage())),
            "--migrate-storm" => {
                storm_n = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|&n: &usize| (1..=1024).contains(&n))
                    .unwrap_or_else(|| usage());
                migrate = migrate.or(Some(STORM_PORT));
            }
            "--oversized-resume" => {
                resume = Some(
                    args.next()
                        .and_then(|v| resume::Variant::parse(&v))
                        .unwrap_or_else(|| usage()),
                );
            }
            _ => usage(),
        }
    }
    let Some(addr) = (host.as_str(), port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
    else {
        eprintln!("rsock_attacker: cannot resolve {host}:{port}");
        exit(2)
    };
    let close_t = Duration::from_secs(2);
    let open_or_die = |name: &str| {
        Peer::open(name, addr, timeout).unwrap_or_else(|e| {
            eprintln!("rsock_attacker: connection {name}: {e}");
            println!("attacker: could not connect ({name}: {e})");
            exit(3)
        })
    };
    if let Some(out) = phantom {
        phantom::run(addr, timeout, &out);
    }
    if let Some(v) = resume {
        resume::run(addr, timeout, v);
    }
    if let Some(to) = migrate {
        storm::run(addr, timeout, to, storm_n);
    }
    let mut a = open_or_die("A");
    let mut b = open_or_die("B");
    let (ra, rb) = (a.ring, b.ring);
    let mut t = Tally::default();

    // Sanity: each connection writes into its own ring, as any rsock peer does.
    for (p, r) in [(&mut a, ra), (&mut b, rb)] {
        let name = format!("sanity_{}", p.name);
        let ok =
            attempt(&name, false, p, r.rkey, r.ring_addr, timeout, &mut t).is_some_and(|o| o.ok());
        if !ok {
            println!("attacker: sanity write on {} failed: the attacker's verbs do not work, nothing proven", p.name);
            exit(3);
        }
    }

    // The attack: B's QP, A's ring.
    attempt(
        "cross_b_to_a",
        true,
        &mut b,
        ra.rkey,
        ra.ring_addr,
        timeout,
        &mut t,
    );
    // Its QP may be in the error state now; B's ring stays registered while B is connected.

    // Guesses, each on a fresh connection C; A and B stay connected (their rings are targets).
    let size = u64::from(ra.ring_size);
    let page = 4096u64;
    type Guess = (
        &'static str,
        fn(&Hello, &Hello, &Hello, u64, u64) -> (u32, u64),
    );
    let guesses: [Guess; 12] = [
        // A's key, the last bytes of A's ring.
        ("a_end", |a, _, _, s, _| {
            (a.rkey, a.ring_addr + s - LEN as u64)
        }),
        // A's key, one page into A's ring.
        ("a_page", |a, _, _, s, p| {
            (a.rkey, a.ring_addr + p.min(s - LEN as u64))
        }),
        // B's key and address from a third connection.
        ("b_ring", |_, b, _, _, _| (b.rkey, b.ring_addr)),
        // A's key at the address C was given (equal to A's when rings are 0-based).
        ("a_key_c_addr", |a, _, c, _, _| (a.rkey, c.ring_addr)),
        // A's key at 0-based offsets.
        ("a_key_zero", |a, _, _, _, _| (a.rkey, 0)),
        ("a_key_page", |a, _, _, _, p| (a.rkey, p)),
        // A's key, low byte off by one and by three (same MR index on rxe).
        ("a_key_plus1", |a, _, _, _, _| {
            (a.rkey.wrapping_add(1), a.ring_addr)
        }),
        ("a_key_minus3", |a, _, _, _, _| {
            (a.rkey.wrapping_sub(3), a.ring_addr)
        }),
        // Neighbouring MR indices (rxe: rkey = index << 8 | key byte): rings registered
        // around C's, e.g. the victim's, at addresses one ring or one page apart.
        ("c_key_minus_0x100", |_, _, c, s, _| {
            (c.rkey.wrapping_sub(0x100), c.ring_addr.wrapping_sub(s))
        }),
        ("c_key_plus_0x100", |_, _, c, s, _| {
            (c.rkey.wrapping_add(0x100), c.ring_addr.wrapping_add(s))
        }),
        // The ring of the connection made just before A (the victim's, in
        // tests/rdma/isolation.sh): one connection's step back in MR index (ring and send
        // buffer: 0x200) and in address (the distance from A's ring to B's).
        ("prev_ring_stride", |a, b, _, _, _| {
            let stride = b.ring_addr.wrapping_sub(a.ring_addr);
            (a.rkey.wrapping_sub(0x200), a.ring_addr.wrapping_sub(stride))
        }),
        ("b_key_plus_0x200_page", |_, b, _, _, p| {
            (b.rkey.wrapping_add(0x200), b.ring_addr.wrapping_add(p))
        }),
    ];
    for (i, (name, g)) in guesses.iter().enumerate() {
        let cname = format!("C{}", i + 1);
        let mut c = match Peer::open(&cname, addr, timeout) {
            Ok(c) => c,
            Err(e) => {
                println!(
                    "attempt name={name} kind=cross via={cname} result=not-connected error=\"{e}\""
                );
                t.skipped += 1;
                continue;
            }
        };
        let rc = c.ring;
        let (rkey, target) = g(&ra, &rb, &rc, size, page);
        if rkey == rc.rkey {
            // A guess that lands on C's own key is no attack: skip it.
            println!(
                "attempt name={name} kind=cross via={cname} rkey={rkey:#x} result=skipped-own-key"
            );
            t.skipped += 1;
        } else {
            attempt(name, true, &mut c, rkey, target, timeout, &mut t);
        }
        c.close(close_t);
    }
    b.close(close_t);
    a.close(close_t);
    println!(
        "attacker: sanity ok, cross-connection writes: {} attempted, {} succeeded, {} remote-access-errors, {} other errors, {} not attempted",
        t.attempted, t.succeeded, t.access_errors, t.other_errors, t.skipped
    );
    if t.succeeded > 0 {
        exit(1);
    }
    if t.attempted == 0 {
        exit(3);
    }
}
