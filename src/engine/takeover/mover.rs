//! The mover threads: what waits on a remote peer runs there, never on the helper — the
//! staying peer's resume towards the process that took its peer's end over, and the old
//! owner's reclaim of a stream (the hand-over back).

use super::HANDOVER_TIMEOUT;
use crate::engine::error::{Error, Why};
use crate::engine::ipc::{self, Reply};
use crate::engine::{lock, Engine, Stream};
use crate::proto::{Hello, HelloKind};
use crate::rdma::{self, ConnParam, EventKind};
use crate::sys::fcntl::dup_hidden;
use crate::sys::raw;
use libc::c_int;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// At most this many resumes run at once (each on a long-lived mover thread).
const MAX_MOVERS: usize = 4;

impl Engine {
    /// Any thread, stream lock held: the peer of stream `token` moves to `port`. The resume
    /// may block, so it runs on a mover thread (long-lived: the QPs it makes stay attributed
    /// to a live thread in `rdma resource show`); up to [`MAX_MOVERS`] run at once, so one
    /// slow or hostile peer does not hold up the others.
    pub(in crate::engine) fn schedule_resume(&'static self, token: u64, port: u16) {
        self.to_mover(MoverJob::Resume { token, port });
    }

    /// Helper: [`Request::Reclaim`](ipc::Request::Reclaim) is answered by a mover thread (the hand-over back waits
    /// for the remote peer's resume; the helper never waits on a peer). `None`: queued, with
    /// copies of the caller's connection and proof.
    pub(in crate::engine) fn defer_reclaim(
        &'static self,
        token: u64,
        taker: ipc::Owner,
        exiting: bool,
        call: ipc::Call,
    ) -> Option<(Reply, Option<c_int>)> {
        {
            let moved = lock(&self.moved);
            // An exiting taker's stream comes back only to a program that holds it.
            if moved.get(token, call.proof) != Some(taker)
                || exiting && moved.old_held(token).is_none()
            {
                return Some((Reply::Failed(libc::ENOENT), None));
            }
        }
        // Copies of fds the ipc server holds for this call.
        let (conn, proof) = (dup_hidden(call.conn), dup_hidden(call.proof));
        if conn < 0 || proof < 0 {
            raw::close(conn);
            raw::close(proof);
            return Some((Reply::Failed(libc::EMFILE), None));
        }
        let call = ipc::Call { conn, proof };
        self.to_mover(MoverJob::Reclaim {
            token,
            taker,
            exiting,
            call,
        });
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
                MoverJob::Reclaim {
                    token,
                    taker,
                    exiting,
                    call,
                } => {
                    let (r, fd) = self.answer_reclaim(token, taker, exiting, call.proof);
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
    /// [`Request::Reclaim`](ipc::Request::Reclaim), answered on `call`.
    Reclaim {
        token: u64,
        taker: ipc::Owner,
        exiting: bool,
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

impl Resumes {
    /// No resume is waiting for a mover thread.
    pub(in crate::engine) fn is_idle(&self) -> bool {
        self.queue.is_empty() && self.idle == self.threads
    }
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

fn resume_steps(engine: &'static Engine, s: &Arc<Stream>, port: u16) -> Result<(), Error> {
    let deadline = Instant::now() + HANDOVER_TIMEOUT;
    while !s.quiesced() {
        if Instant::now() > deadline {
            return Err(Why::Timeout("the old queue pair did not drain").into());
        }
        if engine.progress(&s.dev) == 0 {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    // A peer that moves right after connecting may get its MIGRATE here before the helper
    // saw our accepted id's ESTABLISHED; the message itself proves the connection up. Queue
    // the stream for accept() now: `resume_parts` clears the old id's token, after which that
    // event would find no stream, and the stream would wait for it for ever.
    crate::engine::listener::established(engine, s);
    let (pd, caps, hello) = s.resume_parts().ok_or(Why::Gone("no queue pair"))?;
    let dest = SocketAddr::new(s.peer.ip(), port);
    let src = SocketAddr::new(s.local.ip(), 0);
    let left = deadline.saturating_duration_since(Instant::now());
    let (id, dev) = rdma::resolve(Some(src), dest, s.token, left).map_err(Error::at("resolve"))?;
    if !Arc::ptr_eq(&dev, &s.dev.dev) {
        return Err(Why::Unavailable("the taker is on another device").into());
    }
    let rc = rdma::RcQp::new(id, &pd, caps).map_err(|(e, _)| Error::at("queue pair")(e))?;
    let _early = engine.keep_early(rc.qp_num());
    connect_resume(engine, s, rc, &hello, deadline)
}

/// The resume's connect on the new QP `rc`, and the swap once the taker accepted.
fn connect_resume(
    engine: &'static Engine,
    s: &Arc<Stream>,
    mut rc: rdma::RcQp,
    hello: &Hello,
    deadline: Instant,
) -> Result<(), Error> {
    rc.post_recvs(0, hello.recv_credits)
        .map_err(Error::at("receives"))?;
    let bytes = hello.to_bytes();
    let param = ConnParam {
        private_data: &bytes[..hello.encoded_len()],
        ..ConnParam::default()
    };
    let left = deadline.saturating_duration_since(Instant::now());
    let ev = rdma::connect_event(&mut rc, &param, left).map_err(Error::at("connect"))?;
    if ev.kind != EventKind::Established {
        let why = Why::Event(ev.name(), ev.to_error("rdma_connect"));
        return Err(Error::new(Some("connect"), why));
    }
    let accept = Hello::parse_kind(ev.private_data(), HelloKind::Accept)
        .map_err(Error::at("accept hello"))?;
    drop(ev);
    rc.id_mut()
        .migrate(&engine.ch)
        .map_err(Error::at("migrate id"))?;
    // Its errors are the protocol's: the taker's answer does not fit.
    let (old, old_qp) = s
        .finish_resume(rc, &accept)
        .map_err(|e| Error::from(Why::Protocol(e.into())))?;
    engine.route_qp(s, Some(old_qp));
    drop(old); // the old QP and id (its flushes are no one's now)
    Ok(())
}
