//! Moving one end of an RDMA connection to the process that uses it (docs/DESIGN.md,
//! "Processes"; the wire side is PROTOCOL.md §11). Three parties:
//!
//! - the **taker** (a fork child using an inherited stream): listens on an ephemeral rdma_cm
//!   port at the stream's address, asks the owner to [`Op::Take`] (MIGRATE goes to the peer,
//!   the doorbell's B comes back), waits for the peer's resume, asks for the state at the
//!   resume point ([`Op::Export`]), builds the stream in its own engine on the same doorbell
//!   and accepts — [`take_over`];
//! - the **old owner** answers both requests on its helper thread — [`Engine::answer_take`](super::Engine::answer_take),
//!   [`Engine::answer_export`](super::Engine::answer_export) — then tears its QP down;
//! - the **peer** quiesces its old QP and resumes towards the taker on a new QP in the same
//!   protection domain, in a short-lived thread — [`resume`](mover::resume).
//!
//! Here: the taker's side. Beside it: `owner.rs` (the old owner's answers, and where the
//! streams it handed over went), `mover.rs` (the threads that run what waits on a remote
//! peer: the peer's resume, and a reclaim), `../handover_state.rs` (the state passed from
//! one to the other).

mod mover;
mod owner;
pub use mover::Resumes;
pub use owner::Moved;

use super::error::{Error, Why};
use super::handover_state::{BadState, Exported};
use super::ipc::{self, Reply, Request};
use super::lock;
use super::setup::{self, BufSizes};
use super::stream::{Parts, Stream, StreamBuf, StreamQp};
use crate::proto::{self, Hello, HelloKind};
use crate::rdma::{self, ConnParam, Device};
use crate::readiness::Doorbell;
use crate::sys::fcntl::dup_hidden;
use crate::sys::{raw, unix};
use libc::c_int;
use std::net::SocketAddr;
use std::ops::Range;
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
/// How long a taker asks again while the owner says the stream is busy (EBUSY): a ring
/// growth waiting for the peer's SWITCHED, or a call of the owner's program on it, are over
/// in moments. Without it, a child that execs just after taking its connection over (its
/// ring growing under the client's stream) lost the connection: the old owner's reclaim
/// met EBUSY once and gave up (`passed_exec_taken`, 2026-11-27).
const BUSY_WAIT: Duration = Duration::from_millis(500);

/// Why a take-over did not happen.
#[derive(Debug)]
pub enum TakeError {
    /// Nothing changed (no engine here, the owner refused, resources): relay instead.
    Refused(Error),
    /// The peer was told to move and the move failed: the connection is lost.
    Lost(Error),
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
    /// It is a link's stream, which never moves to another queue pair (PROTOCOL.md §14).
    pub on_link: bool,
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
            on_link: st.is_on_link(),
        }
    }
}

/// Taker: takes the stream `st` (whose A this process holds as `fd`) over from its owner.
/// On success the stream is this process's own, on the same doorbell.
pub fn take_over(st: &mut Inherited, fd: c_int) -> Result<Arc<Stream>, TakeError> {
    let mut steps = super::steps::Steps::start();
    let refused = |step| move |e: rdma::Error| TakeError::Refused(Error::at(step)(e));
    let unavailable = |why| TakeError::Refused(Why::Unavailable(why).into());
    // Before the engine: making one (its own RDMA libraries, the device) is most of a
    // take-over's cost, and a relay needs none.
    if !crate::config::Config::get().takeover {
        return Err(unavailable("RSOCK_TAKEOVER=0"));
    }
    if st.on_link {
        return Err(unavailable("a link's stream stays on its link"));
    }
    let engine = super::for_new().ok_or_else(|| unavailable("no RDMA engine here"))?;
    steps.mark("engine");
    if lock(&engine.streams_by_token).contains_key(&st.token) {
        return Err(unavailable("token in use here"));
    }
    // Everything that can fail for lack of resources is set up before the peer is told.
    let here = SocketAddr::new(st.local.ip(), 0);
    let listener = rdma::CmListener::bind(here, 4, engine.token()).map_err(refused("listen"))?;
    let port = listener.id().local_addr().map_or(0, |a| a.port());
    steps.mark("listen");
    let dev = Device::for_id(listener.id()).map_err(refused("device"))?;
    let d = engine.dev(&dev).map_err(refused("device"))?;
    steps.mark("device");
    let sizes = BufSizes {
        ring: st.ring_size,
        send: st.send_size,
    };
    // The end continues at the owner's sizes and may grow as far as ours.
    let full = BufSizes {
        ring: engine.cfg.ring_size.max(sizes.ring),
        send: engine.cfg.send_buf.max(sizes.send),
    };
    let mut m = setup::memory(engine, &dev, sizes, full).map_err(refused("memory"))?;
    steps.mark("memory");
    let take = Request::Take {
        token: st.token,
        port,
        taker: engine.owner,
    };
    let busy_until = Instant::now() + BUSY_WAIT;
    let called = loop {
        match ipc::call(&mut st.owner, &take, fd) {
            Err(ipc::CallError::Refused(libc::EBUSY)) if Instant::now() < busy_until => {
                std::thread::sleep(Duration::from_millis(2));
            }
            r => break r,
        }
    };
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
            let why = Why::Protocol(format!("unexpected answer {r:?}").into());
            return Err(TakeError::Refused(Error::new(Some("owner"), why)));
        }
        Err(e) => {
            let why = Error::new(Some("owner refused"), Why::Errno(e.errno()));
            return Err(TakeError::Refused(why));
        }
    };
    steps.mark("owner");
    let started = Instant::now();
    if now != sizes {
        // The owner's buffers grew since this copy of the stream was made.
        m = match setup::memory(engine, &dev, now, full) {
            Ok(m) => m,
            Err(e) => {
                raw::close(bfd);
                return Err(TakeError::Lost(Error::at("memory")(e)));
            }
        };
    }
    // Holds the new QP's completions until the stream is registered below. From here the
    // peer is moving: a failure loses the connection.
    let mut early = None;
    let built = (|| {
        let deadline = started + HANDOVER_TIMEOUT;
        let (inc, hello) = next_resume(&listener, conn_id, st.peer, deadline)?;
        steps.mark("resume");
        let sent_end = hello.resume.map_or(0, |r| r.sent_end);
        let mut rc = rdma::RcQp::new(inc.id, &m.pd, setup::qp_caps(&m))
            .map_err(|(e, _)| Error::at("queue pair")(e))?;
        early = Some(engine.keep_early(rc.qp_num()));
        setup::fit_and_post(&mut rc, &mut m).map_err(Error::at("queue pair"))?;
        steps.mark("qp");
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
                    let why = Why::Protocol("not a state".into());
                    return Err(Error::new(Some("export"), why));
                }
                // The peer's last writes are not all in the owner's ring yet.
                Err(ipc::CallError::Refused(libc::EAGAIN)) if Instant::now() < export_by => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => return Err(Error::at("export")(Why::Errno(e.errno()))),
            }
        };
        // At most what the state can hold: the header and two buffers of the sizes agreed.
        let most = Exported::HEAD + (m.ring.len() + m.send.len());
        let state = unix::read_file(memfd, most);
        raw::close(memfd);
        let state = state.map_err(Error::at("export"))?;
        let (conn, shown) = restore(&state, &mut m, &hello)?;
        steps.mark("export");
        let ours = setup::hello(&m, HelloKind::Accept, conn_id);
        let param = ConnParam {
            private_data: &ours,
            ..ConnParam::default()
        };
        let left = deadline.saturating_duration_since(Instant::now());
        rdma::accept(&mut rc, &param, left).map_err(Error::at("accept"))?;
        rc.id_mut()
            .migrate(&engine.ch)
            .map_err(Error::at("accept"))?;
        steps.mark("accept");
        Ok((rc, conn, shown))
    })();
    let (rc, conn, shown) = match built {
        Ok(x) => x,
        Err(why) => {
            raw::close(bfd);
            return Err(TakeError::Lost(why));
        }
    };
    // Copies of the program's fd of A and of the inherited options socket.
    let app = dup_hidden(fd);
    let opts_fd = dup_hidden(st.opts_fd);
    let parts = Parts {
        rc: StreamQp::Own(rc),
        proto: conn,
        ring: StreamBuf::Own(m.ring),
        send: StreamBuf::Own(m.send),
        local: st.local,
        peer: st.peer,
        opts_fd,
        opts_default: false, // the program's socket, which may hold its settings
        token: st.token,
        conn_id,
        bell: Some((Doorbell::from_fds(app, bfd), shown)),
    };
    let s = Stream::new(parts, d, engine.spin_max(), engine.owner)
        .map_err(|e| TakeError::Lost(Error::at("stream")(e)))?;
    // One this engine had handed over and takes back is its own again, taken from nobody.
    if !lock(&engine.moved).forget(st.token) {
        let _ = s.taken_from.set(owner);
    }
    engine.register(&s);
    drop(early);
    engine.ensure_helper();
    log::info!(
        "rdma stream {} -> {}: taken over from pid {} in {} us",
        s.local,
        s.peer,
        owner.pid,
        started.elapsed().as_micros()
    );
    steps.mark("stream");
    steps.log(format_args!(
        "rdma stream {} -> {}: take-over, {}us after the fork,",
        s.local,
        s.peer,
        super::steps::us_since_fork().unwrap_or(-1)
    ));
    Ok(s)
}

/// The peer's resume on `listener`: a resume hello for `conn_id` from `peer`'s address.
/// Anything else is refused and waited past.
fn next_resume(
    listener: &rdma::CmListener,
    conn_id: u64,
    peer: SocketAddr,
    deadline: Instant,
) -> Result<(rdma::Incoming, Hello), Error> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let inc = listener
            .next_request(Some(left), &setup::no_room())
            .map_err(Error::at("resume"))?
            .ok_or_else(|| Error::new(Some("resume"), Why::Timeout("the peer did not come")))?;
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
) -> Result<(proto::Conn, proto::Readiness), Error> {
    let x = Exported::decode(state).map_err(Error::at("export"))?;
    let conn = proto::Conn::from_handover(&m.cfg, &x.handover, peer).map_err(Error::at("state"))?;
    scatter(m.ring.as_mut_slice(), conn.readable_ranges(), &x.unread)?;
    scatter(m.send.as_mut_slice(), conn.unsent_ranges(), &x.unsent)?;
    Ok((conn, x.shown))
}

/// Copies `bytes` into `buf` at `ranges`, which must hold exactly that many.
fn scatter(buf: &mut [u8], ranges: [Range<usize>; 2], bytes: &[u8]) -> Result<(), Error> {
    let mut at = 0;
    for r in ranges {
        let n = r.len();
        let (Some(to), Some(from)) = (buf.get_mut(r), bytes.get(at..at + n)) else {
            return Err(Error::at("export")(BadState::Missing));
        };
        to.copy_from_slice(from);
        at += n;
    }
    if at != bytes.len() {
        return Err(Error::at("export")(BadState::Trailing));
    }
    Ok(())
}
