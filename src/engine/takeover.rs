//! Moving one end of an RDMA connection to the process that uses it (docs/DESIGN.md,
//! "Processes"; the wire side is PROTOCOL.md §11). Three parties:
//!
//! - the **taker** (a fork child using an inherited stream): listens on an ephemeral rdma_cm
//!   port at the stream's address, asks the owner to [`Op::Take`] (MIGRATE goes to the peer,
//!   the doorbell's B comes back), waits for the peer's resume, asks for the state at the
//!   resume point ([`Op::Export`]), builds the stream in its own engine on the same doorbell
//!   and accepts — [`take_over`];
//! - the **old owner** answers both requests on its helper thread — [`Engine::answer_take`],
//!   [`Engine::answer_export`] — then tears its QP down;
//! - the **peer** quiesces its old QP and resumes towards the taker on a new QP in the same
//!   protection domain, in a short-lived thread — [`resume`].

use super::ipc::{self, Reply, Request};
use super::setup::{self, BufSizes};
use super::stream::{Parts, Stream};
use super::{lock, Engine};
use crate::proto::{self, Hello, HelloKind};
use crate::rdma::{self, ConnParam, Device, EventKind};
use crate::readiness::Doorbell;
use crate::sys::{raw, unix};
use libc::c_int;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a hand-over may take from MIGRATE to the resumed QP (Soft-RoCE under emulation
/// takes tens of milliseconds; hardware well under one).
const HANDOVER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an export waits for the peer's bytes up to its resume point. The peer resumes
/// only after every write of its old QP completed, i.e. was placed in our ring: what is
/// left is reading their completions, so an honest resume never waits long. The taker asks
/// again until then (the owner's helper never waits): a resume point the peer never wrote
/// (a hostile peer) costs that taker at most this, and the owner nothing.
const EXPORT_WAIT: Duration = Duration::from_secs(1);
/// At most this many resumes run at once (each on a long-lived mover thread).
const MAX_MOVERS: usize = 4;
/// How many handed-over streams an engine remembers (to send requests on), and how long.
const MOVED_KEPT: usize = 4096;
const MOVED_FOR: Duration = Duration::from_secs(600);

/// Streams handed over to another process: requests for them are sent on, to whoever still
/// holds their A (the same proof as for a stream that is here).
#[derive(Default)]
pub struct Moved {
    by_token: std::collections::HashMap<u64, Gone>,
}

/// Where a stream went, the identity of its A, and when.
struct Gone {
    to: ipc::Owner,
    identity: Option<unix::Identity>,
    at: Instant,
}

impl Moved {
    fn insert(&mut self, token: u64, to: ipc::Owner, identity: Option<unix::Identity>) {
        let at = Instant::now();
        self.by_token
            .retain(|_, g| at.duration_since(g.at) < MOVED_FOR);
        if self.by_token.len() >= MOVED_KEPT {
            let oldest = self.by_token.iter().min_by_key(|e| e.1.at).map(|e| *e.0);
            if let Some(t) = oldest {
                self.by_token.remove(&t);
            }
        }
        self.by_token.insert(token, Gone { to, identity, at });
    }

    fn forget(&mut self, token: u64) {
        self.by_token.remove(&token);
    }

    fn get(&self, token: u64, proof: c_int) -> Option<ipc::Owner> {
        let g = self.by_token.get(&token)?;
        (g.identity.is_some() && unix::file_identity(proof) == g.identity).then_some(g.to)
    }
}

/// Why a take-over did not happen.
#[derive(Debug)]
pub enum TakeError {
    /// Nothing changed (no engine here, the owner refused, resources): relay instead.
    Refused(String),
    /// The peer was told to move and the move failed: the connection is lost.
    Lost(String),
}

/// What a taker knows of a stream another process owns: from its inherited copy
/// ([`Inherited::of`]), or from the owner's answer to a prefork worker's accept.
#[derive(Clone, Copy, Debug)]
pub struct Inherited {
    pub token: u64,
    /// Updated when the owner answers that the stream moved on.
    pub owner: ipc::Owner,
    pub local: SocketAddr,
    pub peer: SocketAddr,
    pub ring_size: u32,
    pub send_size: u32,
    /// The program's socket options (a copy is taken).
    pub opts_fd: c_int,
}

impl Inherited {
    /// The facts of an inherited stream (read without its lock).
    pub fn of(st: &Stream) -> Inherited {
        let (ring_size, send_size) = st.sizes();
        Inherited {
            token: st.token,
            owner: st.owner(),
            local: st.local,
            peer: st.peer,
            ring_size,
            send_size,
            opts_fd: st.opts_fd,
        }
    }
}

/// Taker: takes the stream `st` (whose A this process holds as `fd`) over from its owner.
/// On success the stream is this process's own, on the same doorbell.
pub fn take_over(st: &mut Inherited, fd: c_int) -> Result<Arc<Stream>, TakeError> {
    let refused =
        |what: &str, e: &dyn std::fmt::Display| TakeError::Refused(format!("{what}: {e}"));
    // Before the engine: making one (its own RDMA libraries, the device) is most of a
    // take-over's cost, and a relay needs none.
    if !crate::config::Config::get().takeover {
        return Err(TakeError::Refused("RSOCK_TAKEOVER=0".into()));
    }
    let engine =
        super::for_new().ok_or_else(|| TakeError::Refused("no RDMA engine here".into()))?;
    if lock(&engine.streams_by_token).contains_key(&st.token) {
        return Err(TakeError::Refused("token in use here".into()));
    }
    // Everything that can fail for lack of resources is set up before the peer is told.
    let here = SocketAddr::new(st.local.ip(), 0);
    let listener =
        rdma::Listener::bind(here, 4, engine.token()).map_err(|e| refused("listen", &e))?;
    let port = listener.id().local_addr().map_or(0, |a| a.port());
    let dev = Device::for_id(listener.id()).map_err(|e| refused("device", &e))?;
    let d = engine.dev(&dev).map_err(|e| refused("device", &e))?;
    let sizes = BufSizes {
        ring: st.ring_size,
        send: st.send_size,
    };
    // The end continues at the owner's sizes and may grow as far as ours.
    let full = BufSizes {
        ring: engine.cfg.ring_size.max(sizes.ring),
        send: engine.cfg.send_buf.max(sizes.send),
    };
    let mut m = setup::memory(engine, &dev, sizes, full).map_err(|e| refused("memory", &e))?;
    let take = Request::Take {
        token: st.token,
        port,
        taker: engine.owner,
    };
    let called = ipc::call(&mut st.owner, &take, fd);
    let owner = st.owner; // where it went, if it had moved on
    let (conn_id, now, bfd) = match called {
        Ok((Reply::Doorbell { conn_id, sizes, .. }, Some(bfd))) => {
            // Kept for the stream's life: out of the numbers the program may dup2 onto.
            (conn_id, BufSizes::unpack(sizes), raw::hide(bfd))
        }
        Ok((r, fd)) => {
            if let Some(fd) = fd {
                raw::close(fd);
            }
            return Err(refused("owner", &format!("unexpected answer {r:?}")));
        }
        Err(e) => return Err(refused("owner refused", &errno_name(e.errno()))),
    };
    let started = Instant::now();
    if now != sizes {
        // The owner's buffers grew since this copy of the stream was made.
        m = match setup::memory(engine, &dev, now, full) {
            Ok(m) => m,
            Err(e) => {
                raw::close(bfd);
                return Err(TakeError::Lost(format!("memory: {e}")));
            }
        };
    }
    // Holds the new QP's completions until the stream is registered below. From here the
    // peer is moving: a failure loses the connection.
    let mut held = None;
    let built = (|| {
        let deadline = started + HANDOVER_TIMEOUT;
        let (inc, hello) = next_resume(&listener, conn_id, st.peer, deadline)?;
        let sent_end = hello.resume.map_or(0, |r| r.sent_end);
        let mut rc = rdma::Conn::new(inc.id, &m.pd, setup::qp_caps(&m))
            .map_err(|(e, _)| format!("queue pair: {e}"))?;
        held = Some(engine.hold_qp(rc.qp_num()));
        setup::fit_and_post(&mut rc, &mut m).map_err(|e| format!("queue pair: {e}"))?;
        let export = Request::Export {
            token: st.token,
            resume_at: sent_end,
            taker: engine.owner,
        };
        let export_by = Instant::now() + EXPORT_WAIT;
        let memfd = loop {
            let mut at = owner;
            match ipc::call(&mut at, &export, fd) {
                Ok((Reply::State, Some(memfd))) if at == owner => break memfd,
                Ok((_, f)) => {
                    if let Some(f) = f {
                        raw::close(f);
                    }
                    return Err("export: not a state".into());
                }
                // The peer's last writes are not all in the owner's ring yet.
                Err(ipc::CallError::Refused(libc::EAGAIN)) if Instant::now() < export_by => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => return Err(format!("export: {}", errno_name(e.errno()))),
            }
        };
        // At most what the state can hold: the header and two buffers of the sizes agreed.
        let most = proto::Handover::LEN + 1 + (m.ring.len() + m.send.len());
        let state = unix::read_file(memfd, most);
        raw::close(memfd);
        let state = state.map_err(|e| format!("export: {e}"))?;
        let (conn, shown) = restore(&state, &mut m, &hello)?;
        let ours = setup::hello(&m, HelloKind::Accept, conn_id);
        let param = ConnParam {
            private_data: &ours,
            ..ConnParam::default()
        };
        let left = deadline.saturating_duration_since(Instant::now());
        rdma::accept(&mut rc, &param, left).map_err(|e| format!("accept: {e}"))?;
        rc.id_mut()
            .migrate(&engine.ch)
            .map_err(|e| format!("accept: {e}"))?;
        Ok((rc, conn, shown))
    })();
    let (rc, conn, shown) = match built {
        Ok(x) => x,
        Err(why) => {
            raw::close(bfd);
            return Err(TakeError::Lost(why));
        }
    };
    // SAFETY: F_DUPFD_CLOEXEC on the program's fd of A.
    let app = raw::hide(unsafe { crate::sys::real::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) });
    // SAFETY: as above, on the inherited options socket.
    let opts_fd =
        raw::hide(unsafe { crate::sys::real::fcntl(st.opts_fd, libc::F_DUPFD_CLOEXEC, 0) });
    let parts = Parts {
        rc,
        proto: conn,
        ring: m.ring,
        send: m.send,
        local: st.local,
        peer: st.peer,
        opts_fd,
        token: st.token,
        conn_id,
        bell: Some((Doorbell::from_fds(app, bfd), shown)),
    };
    let s = Stream::new(parts, d, engine.spin_max(), engine.owner)
        .map_err(|e| TakeError::Lost(format!("stream: {e}")))?;
    let _ = s.taken_from.set(owner);
    lock(&engine.moved).forget(st.token); // it came back, if it had been ours
    engine.register(&s);
    drop(held);
    engine.ensure_helper();
    log::info!(
        "rdma stream {} -> {}: taken over from pid {} in {} us",
        s.local,
        s.peer,
        owner.pid,
        started.elapsed().as_micros()
    );
    Ok(s)
}

/// The peer's resume on `listener`: a resume hello for `conn_id` from `peer`'s address.
/// Anything else is refused and waited past.
fn next_resume(
    listener: &rdma::Listener,
    conn_id: u64,
    peer: SocketAddr,
    deadline: Instant,
) -> Result<(rdma::Incoming, Hello), String> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let inc = listener
            .next_request(Some(left))
            .map_err(|e| format!("resume: {e}"))?
            .ok_or("resume: the peer did not come")?;
        let from = inc.id.peer_addr().map(|a| a.ip());
        match Hello::parse_kind(inc.event.private_data(), HelloKind::Resume) {
            Ok(h) if h.conn_id == conn_id && from == Some(peer.ip()) => return Ok((inc, h)),
            r => {
                log::warn!("refusing a resume from {from:?} on a take-over listener: {r:?}");
                let mut id = inc.id;
                let _ = id.reject(&[]);
            }
        }
    }
}

/// Builds the taker's protocol state from the old owner's export and places its unread and
/// unsent bytes in `m`'s ring and send buffer.
fn restore(
    state: &[u8],
    m: &mut setup::Memory,
    peer: &Hello,
) -> Result<(proto::Conn, proto::Readiness), String> {
    let h = proto::Handover::parse(state).ok_or("export: short state")?;
    let shown = proto::Readiness::from_bits(
        *state
            .get(proto::Handover::LEN)
            .ok_or("export: short state")?,
    );
    let bytes = &state[proto::Handover::LEN + 1..];
    let conn = proto::Conn::from_handover(&m.cfg, &h, peer).map_err(|e| format!("state: {e}"))?;
    let mut at = 0;
    let ring = m.ring.as_mut_slice();
    for r in conn.readable_ranges() {
        let n = r.len();
        ring[r].copy_from_slice(bytes.get(at..at + n).ok_or("export: bytes missing")?);
        at += n;
    }
    let send = m.send.as_mut_slice();
    for r in conn.unsent_ranges() {
        let n = r.len();
        send[r].copy_from_slice(bytes.get(at..at + n).ok_or("export: bytes missing")?);
        at += n;
    }
    if at != bytes.len() {
        return Err("export: byte count differs".into());
    }
    Ok((conn, shown))
}

impl Engine {
    /// Old owner, helper thread: [`Request::Take`] — MIGRATE to the peer, B to the caller.
    pub(super) fn answer_take(
        &'static self,
        s: &Arc<Stream>,
        port: u16,
        taker: ipc::Owner,
    ) -> (Reply, Option<c_int>) {
        if s.released.load(std::sync::atomic::Ordering::Acquire) {
            return (Reply::Failed(libc::ECONNRESET), None);
        }
        if let Err(e) = s.start_move(port) {
            return (Reply::Failed(e), None);
        }
        let deadline = Instant::now() + 2 * HANDOVER_TIMEOUT;
        lock(&self.leaving).push((s.token, deadline));
        // SAFETY: F_DUPFD_CLOEXEC on our own B; the reply carries the copy.
        let b = raw::hide(unsafe {
            crate::sys::real::fcntl(s.bell().shim_fd(), libc::F_DUPFD_CLOEXEC, 0)
        });
        log::debug!(
            "rdma stream {} -> {}: moving to pid {} (port {port})",
            s.local,
            s.peer,
            taker.pid
        );
        // The sizes as the move froze them (buffers grow; the taker's copy may be older).
        let (ring, send) = s.sizes();
        let r = Reply::Doorbell {
            conn_id: s.conn_id,
            sizes: BufSizes { ring, send }.packed(),
            ends: s.ends(),
        };
        match b {
            b if b >= 0 => (r, Some(b)),
            _ => (Reply::Failed(libc::EMFILE), None),
        }
    }

    /// Old owner, helper thread: [`Request::Export`] — once the peer's bytes up to the
    /// resume point are in, the state in a memfd; the stream is the caller's from then on.
    pub(super) fn answer_export(
        &'static self,
        s: &Arc<Stream>,
        resume_at: u64,
        taker: ipc::Owner,
    ) -> (Reply, Option<c_int>) {
        // The peer cannot have written more than a ring beyond what we received.
        let (ring, _) = s.sizes();
        if resume_at > s.received_end().saturating_add(u64::from(ring)) {
            log::warn!(
                "rdma stream {} -> {}: the peer resumes at {resume_at}, beyond anything it could send",
                s.local,
                s.peer
            );
            return (Reply::Failed(libc::EPROTO), None);
        }
        // Not all in yet: the taker asks again (for up to EXPORT_WAIT). This thread never
        // waits on a peer, which may name a point it never wrote.
        if s.received_end() < resume_at {
            self.progress(&s.dev);
            if s.received_end() < resume_at {
                return (Reply::Failed(libc::EAGAIN), None);
            }
        }
        let Some(state) = s.export(taker) else {
            return (Reply::Failed(libc::ECONNRESET), None);
        };
        // The stream is the taker's: this engine forgets it (requests are sent on), keeps
        // nothing of its doorbell, and frees its QP and memory once drained.
        lock(&self.streams_by_token).remove(&s.token);
        lock(&self.moved).insert(s.token, taker, s.bell().identity());
        lock(&self.leaving).retain(|&(t, _)| t != s.token);
        lock(&self.held_elsewhere).retain(|x| !Arc::ptr_eq(x, s));
        self.unwatch(s.bell().shim_fd());
        for fd in s.relay_fds() {
            self.unwatch(fd);
        }
        raw::close(s.bell().take_shim());
        s.released.store(true, std::sync::atomic::Ordering::Release);
        self.retire(s.clone());
        match unix::memfd_with(&state) {
            Ok(fd) => (Reply::State, Some(fd)),
            Err(e) => {
                log::error!("hand-over state not passed: {e}");
                (Reply::Failed(libc::ENOMEM), None)
            }
        }
    }

    /// Owner, helper thread: a prefork worker accepts an RDMA stream from the queue of a
    /// listener this process owns: it gets the doorbell's A and the stream's facts, and takes
    /// the stream over (or asks for a relay of it if it cannot).
    pub(super) fn hand_to_worker(&'static self, s: &Arc<Stream>) -> (Reply, Option<c_int>) {
        // SAFETY: F_DUPFD_CLOEXEC on our own copy of A.
        let a = raw::hide(unsafe {
            crate::sys::real::fcntl(s.bell().app_fd(), libc::F_DUPFD_CLOEXEC, 0)
        });
        s.release_app();
        // Held while `a` travels and in the worker; the last holder's close ends it.
        self.settle_holders(s);
        if a < 0 {
            return (Reply::Failed(libc::EMFILE), None);
        }
        let (ring, send) = s.sizes();
        let r = Reply::Stream {
            token: s.token,
            owner: self.owner,
            sizes: BufSizes { ring, send }.packed(),
            ends: s.ends(),
        };
        (r, Some(a))
    }

    /// Old owner, mover thread: [`Request::Reclaim`] — the process this one handed stream
    /// `token` to (`taker`, holding its A as `proof`) is about to change its credentials,
    /// after which the kernel refuses its writes to the verbs and rdma_cm files: this process
    /// takes the stream back (the same hand-over, the other way) and relays it to the taker.
    pub(super) fn answer_reclaim(
        &'static self,
        token: u64,
        taker: ipc::Owner,
        proof: c_int,
    ) -> (Reply, Option<c_int>) {
        if lock(&self.moved).get(token, proof) != Some(taker) {
            return (Reply::Failed(libc::ENOENT), None);
        }
        let mut at = taker;
        let facts = match ipc::call(&mut at, &Request::Describe { token }, proof) {
            Ok((Reply::Described { sizes, ends, .. }, _)) if at == taker => {
                (BufSizes::unpack(sizes), ends)
            }
            other => {
                log::warn!(
                    "reclaim of stream {token:x} from pid {}: {other:?}",
                    taker.pid
                );
                return (Reply::Failed(libc::ESRCH), None);
            }
        };
        let (sizes, ends) = facts;
        let opts_fd = setup::opts_socket(&ends.peer);
        let mut st = Inherited {
            token,
            owner: taker,
            local: ends.local,
            peer: ends.peer,
            ring_size: sizes.ring,
            send_size: sizes.send,
            opts_fd,
        };
        let taken = take_over(&mut st, proof);
        raw::close(opts_fd); // the stream has its own copy
        match taken {
            Ok(s) => {
                // No program here holds it: only the relay does.
                s.app_gone.store(true, std::sync::atomic::Ordering::Release);
                self.relay_only(&s)
            }
            Err(e) => {
                log::warn!("reclaim of stream {token:x} from pid {}: {e:?}", taker.pid);
                (Reply::Failed(libc::EAGAIN), None)
            }
        }
    }

    /// Helper: a stream whose taker never asked for the state (it failed after MIGRATE went
    /// out) can send nothing any more: it is reset, rather than left waiting for ever.
    pub(super) fn expire_moves(&self) {
        let now = Instant::now();
        let expired: Vec<u64> = {
            let mut l = lock(&self.leaving);
            let gone = l.iter().filter(|e| e.1 <= now).map(|e| e.0).collect();
            l.retain(|e| e.1 > now);
            gone
        };
        for token in expired {
            let s = lock(&self.streams_by_token).get(&token).cloned();
            if let Some(s) = s {
                s.on_fatal("the process taking it over never finished");
            }
        }
    }

    /// The answer for a stream this engine no longer has: where it went, if it was handed
    /// over and the caller holds it; else ENOENT.
    pub(super) fn not_here(&self, token: u64, proof: c_int) -> (Reply, Option<c_int>) {
        match lock(&self.moved).get(token, proof) {
            Some(to) => (Reply::Moved(to), None),
            None => (Reply::Failed(libc::ENOENT), None),
        }
    }

    /// Any thread, stream lock held: the peer of stream `token` moves to `port`. The resume
    /// may block, so it runs on a mover thread (long-lived: the QPs it makes stay attributed
    /// to a live thread in `rdma resource show`); up to [`MAX_MOVERS`] run at once, so one
    /// slow or hostile peer does not hold up the others.
    pub(super) fn schedule_resume(&'static self, token: u64, port: u16) {
        self.to_mover(MoverJob::Resume { token, port });
    }

    /// Helper: [`Request::Reclaim`] is answered by a mover thread (the hand-over back waits
    /// for the remote peer's resume; the helper never waits on a peer). `None`: queued, with
    /// copies of the caller's connection and proof.
    pub(super) fn defer_reclaim(
        &'static self,
        token: u64,
        taker: ipc::Owner,
        call: ipc::Call,
    ) -> Option<(Reply, Option<c_int>)> {
        if lock(&self.moved).get(token, call.proof) != Some(taker) {
            return Some((Reply::Failed(libc::ENOENT), None));
        }
        // SAFETY: F_DUPFD_CLOEXEC on fds the ipc server holds for this call.
        let (conn, proof) = unsafe {
            (
                raw::hide(crate::sys::real::fcntl(call.conn, libc::F_DUPFD_CLOEXEC, 0)),
                raw::hide(crate::sys::real::fcntl(
                    call.proof,
                    libc::F_DUPFD_CLOEXEC,
                    0,
                )),
            )
        };
        if conn < 0 || proof < 0 {
            raw::close(conn);
            raw::close(proof);
            return Some((Reply::Failed(libc::EMFILE), None));
        }
        let call = ipc::Call { conn, proof };
        self.to_mover(MoverJob::Reclaim { token, taker, call });
        None
    }

    /// Queues `job` for a mover thread, starting one if none is idle (up to [`MAX_MOVERS`]).
    fn to_mover(&'static self, job: MoverJob) {
        let spawn = {
            let mut q = lock(&self.resumes);
            q.queue.push_back(job);
            let spawn = q.idle == 0 && q.threads < MAX_MOVERS;
            if spawn {
                q.threads += 1;
            }
            spawn
        };
        if spawn {
            let r = std::thread::Builder::new()
                .name("rsock-mover".into())
                .spawn(move || self.run_mover());
            if let Err(e) = r {
                log::error!("no thread for resumes ({e})");
                lock(&self.resumes).threads -= 1;
            }
        }
        self.resume_cv.notify_one();
    }

    /// A mover thread: resumes streams whose peer moved, and takes streams back, one at a
    /// time.
    fn run_mover(&'static self) {
        let Some(_g) = crate::guard::enter() else {
            return;
        };
        loop {
            let job = {
                let mut q = lock(&self.resumes);
                q.idle += 1;
                while q.queue.is_empty() {
                    q = self.resume_cv.wait(q).unwrap_or_else(|e| e.into_inner());
                }
                q.idle -= 1;
                match q.queue.pop_front() {
                    Some(next) => next,
                    None => continue,
                }
            };
            match job {
                MoverJob::Resume { token, port } => {
                    let s = lock(&self.streams_by_token).get(&token).cloned();
                    if let Some(s) = s {
                        resume(self, s, port);
                    }
                }
                MoverJob::Reclaim { token, taker, call } => {
                    let (r, fd) = self.answer_reclaim(token, taker, call.proof);
                    ipc::reply(call.conn, &r, fd);
                    raw::close(call.proof);
                }
            }
        }
    }
}

/// What a mover thread does.
enum MoverJob {
    /// Our peer moved to `port`: resume stream `token` there.
    Resume { token: u64, port: u16 },
    /// [`Request::Reclaim`], answered on `call`.
    Reclaim {
        token: u64,
        taker: ipc::Owner,
        call: ipc::Call,
    },
}

/// Jobs waiting for a mover thread, and the threads there are.
#[derive(Default)]
pub struct Resumes {
    queue: std::collections::VecDeque<MoverJob>,
    threads: usize,
    idle: usize,
}

/// Staying peer, mover thread: waits for the old QP to go quiet, connects a new QP to the
/// taker with the resume hello, and swaps it in. A failure resets the stream.
fn resume(engine: &'static Engine, s: Arc<Stream>, port: u16) {
    let started = Instant::now();
    match resume_steps(engine, &s, port) {
        Ok(()) => log::info!(
            "rdma stream {} -> {}: resumed with the peer's new process in {} us",
            s.local,
            s.peer,
            started.elapsed().as_micros()
        ),
        Err(why) => s.on_fatal(&format!("resume after the peer moved: {why}")),
    }
}

fn resume_steps(engine: &'static Engine, s: &Arc<Stream>, port: u16) -> Result<(), String> {
    let deadline = Instant::now() + HANDOVER_TIMEOUT;
    while !s.quiesced() {
        if Instant::now() > deadline {
            return Err("the old queue pair did not drain".into());
        }
        if engine.progress(&s.dev) == 0 {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    let (pd, caps, hello) = s.resume_parts().ok_or("no queue pair")?;
    let dest = SocketAddr::new(s.peer.ip(), port);
    let src = SocketAddr::new(s.local.ip(), 0);
    let left = deadline.saturating_duration_since(Instant::now());
    let (id, dev) =
        rdma::resolve(Some(src), dest, s.token, left).map_err(|e| format!("resolve: {e}"))?;
    if !Arc::ptr_eq(&dev, &s.dev.dev) {
        return Err("the taker is on another device".into());
    }
    let rc = rdma::Conn::new(id, &pd, caps).map_err(|(e, _)| format!("queue pair: {e}"))?;
    let _held = engine.hold_qp(rc.qp_num());
    connect_resume(engine, s, rc, &hello, deadline)
}

/// The resume's connect on the new QP `rc`, and the swap once the taker accepted.
fn connect_resume(
    engine: &'static Engine,
    s: &Arc<Stream>,
    mut rc: rdma::Conn,
    hello: &Hello,
    deadline: Instant,
) -> Result<(), String> {
    rc.post_recvs(0, hello.recv_credits)
        .map_err(|e| format!("receives: {e}"))?;
    let bytes = hello.to_bytes();
    let param = ConnParam {
        private_data: &bytes[..hello.encoded_len()],
        ..ConnParam::default()
    };
    let left = deadline.saturating_duration_since(Instant::now());
    let ev = rdma::connect_event(&mut rc, &param, left).map_err(|e| format!("connect: {e}"))?;
    if ev.kind != EventKind::Established {
        return Err(format!("connect: {}", ev.name()));
    }
    let accept = Hello::parse_kind(ev.private_data(), HelloKind::Accept)
        .map_err(|e| format!("accept hello: {e}"))?;
    drop(ev);
    rc.id_mut()
        .migrate(&engine.ch)
        .map_err(|e| format!("migrate id: {e}"))?;
    let (old, old_qp) = s.finish_resume(rc, &accept)?;
    engine.route_qp(s, Some(old_qp));
    drop(old); // the old QP and id (its flushes are no one's now)
    Ok(())
}

fn errno_name(e: c_int) -> String {
    std::io::Error::from_raw_os_error(e).to_string()
}
