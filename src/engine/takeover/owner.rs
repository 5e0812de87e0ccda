//! The old owner's side of a hand-over: it answers the taker's requests on its helper thread
//! ([`Request::Take`], [`Request::Export`]), hands a prefork worker a stream it accepted,
//! takes a stream back before its taker changes credentials ([`Request::Reclaim`]), and
//! remembers where the streams it handed over went.

use super::{take_over, Inherited, HANDOVER_TIMEOUT};
use crate::engine::ipc::{self, Reply, Request};
use crate::engine::setup::{self, BufSizes};
use crate::engine::{lock, Engine, Stream};
use crate::sys::fcntl::dup_hidden;
use crate::sys::{raw, unix};
use libc::c_int;
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// How many handed-over streams an engine remembers (to send requests on), and how long.
const MOVED_KEPT: usize = 4096;
const MOVED_FOR: Duration = Duration::from_secs(600);

/// Streams handed over to another process: requests for them are sent on, to whoever still
/// holds their A (the same proof as for a stream that is here).
#[derive(Default)]
pub struct Moved {
    by_token: std::collections::HashMap<u64, Gone>,
}

/// Where a stream went, the identities of its A and B, when, and this process's old stream
/// (its program's fds hold it).
struct Gone {
    to: ipc::Owner,
    identity: Option<unix::Identity>,
    shim_identity: Option<unix::Identity>,
    at: Instant,
    old: Weak<Stream>,
}

impl Moved {
    fn insert(&mut self, old: &Arc<Stream>, to: ipc::Owner) {
        let (token, identity) = (old.token, old.bell().identity());
        let shim_identity = unix::file_identity(old.bell().shim_fd());
        let at = Instant::now();
        self.by_token
            .retain(|_, g| at.duration_since(g.at) < MOVED_FOR);
        if self.by_token.len() >= MOVED_KEPT {
            let oldest = self.by_token.iter().min_by_key(|e| e.1.at).map(|e| *e.0);
            if let Some(t) = oldest {
                self.by_token.remove(&t);
            }
        }
        let old = Arc::downgrade(old);
        self.by_token.insert(
            token,
            Gone {
                to,
                identity,
                shim_identity,
                at,
                old,
            },
        );
    }

    /// Forgets stream `token`; whether it had been handed over from here.
    pub(super) fn forget(&mut self, token: u64) -> bool {
        self.by_token.remove(&token).is_some()
    }

    /// No stream handed over is remembered (none may be asked about any more).
    pub(in crate::engine) fn is_empty(&self) -> bool {
        self.by_token.is_empty()
    }

    /// This process's old stream `token` (handed over), while its program holds an fd of it.
    pub(super) fn old_held(&self, token: u64) -> Option<Arc<Stream>> {
        self.by_token
            .get(&token)
            .and_then(|g| g.old.upgrade())
            .filter(|s| s.life().program)
    }

    /// Where stream `token` went, told to a caller that proves it holds the stream's A — or
    /// its B, which only the shim's processes hold (a taker whose program closed its fds
    /// gives the stream back with B as it exits).
    pub(super) fn get(&self, token: u64, proof: c_int) -> Option<ipc::Owner> {
        let g = self.by_token.get(&token)?;
        let id = unix::file_identity(proof)?;
        (g.identity == Some(id) || g.shim_identity == Some(id)).then_some(g.to)
    }
}

impl Engine {
    /// Old owner, helper thread: [`Request::Take`] — MIGRATE to the peer, B to the caller.
    pub(in crate::engine) fn answer_take(
        &'static self,
        s: &Arc<Stream>,
        port: u16,
        taker: ipc::Owner,
    ) -> (Reply, Option<c_int>) {
        if s.life().released() {
            return (Reply::Failed(libc::ECONNRESET), None);
        }
        if let Err(e) = s.start_move(port, Instant::now() + 2 * HANDOVER_TIMEOUT) {
            // Busy: the taker asks again; what it waits for (a growth's SWITCHED) may be
            // a completion nobody else here polls while the program is in exec's hook.
            self.progress(&s.dev);
            return (Reply::Failed(e), None);
        }
        self.tend(s); // the helper resets it if the taker never asks for the state
        let b = dup_hidden(s.bell().shim_fd()); // a copy of our own B: the reply carries it
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
    pub(in crate::engine) fn answer_export(
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
        lock(&self.moved).insert(s, taker);
        self.unwatch(s.bell().shim_fd());
        for fd in s.relay_fds() {
            self.unwatch(fd);
        }
        raw::close(s.bell().take_shim());
        self.tend(s); // the helper drains and frees its old QP
        self.wake();
        match unix::memfd_with(&state.encode()) {
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
    pub(in crate::engine) fn hand_to_worker(
        &'static self,
        s: &Arc<Stream>,
    ) -> (Reply, Option<c_int>) {
        let a = dup_hidden(s.bell().app_fd()); // a copy of our own copy of A
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
    /// `exiting`: the taker is exiting and this process's program still holds the stream,
    /// as a TCP connection stays with the processes that hold it: taken back for the
    /// program (its fds find it here again: `api::inherit::streams`), relayed to nobody.
    pub(in crate::engine) fn answer_reclaim(
        &'static self,
        token: u64,
        taker: ipc::Owner,
        exiting: bool,
        proof: c_int,
    ) -> (Reply, Option<c_int>) {
        if lock(&self.moved).get(token, proof) != Some(taker) {
            return (Reply::Failed(libc::ENOENT), None);
        }
        // An exiting taker may hold only B; the stream's new doorbell here needs an fd of
        // A: the copy this process's old stream keeps while the program holds the stream.
        let old = if exiting {
            match lock(&self.moved).old_held(token) {
                Some(old) if old.bell().app_fd() >= 0 => Some(old),
                _ => return (Reply::Failed(libc::ENOENT), None),
            }
        } else {
            None
        };
        let proof = old.as_ref().map_or(proof, |o| o.bell().app_fd());
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
            on_link: false, // a link's stream is never taken over, so never given back
        };
        let taken = take_over(&mut st, proof);
        raw::close(opts_fd); // the stream has its own copy
        match taken {
            Ok(s) if exiting => {
                log::info!(
                    "rdma stream {} -> {}: taken back from pid {}, which exits",
                    s.local,
                    s.peer,
                    taker.pid
                );
                // The program's fds are to name the stream here (they still name the
                // taker): at their next call, or before the program's next fork.
                lock(&self.given_back).push(s);
                GIVEN_BACK.store(true, Release);
                drop(old); // the old stream's copy of A was the proof until here
                (Reply::Done, None)
            }
            Ok(s) => {
                // No program here holds it: only the relay does.
                s.advance(crate::engine::stream::Event::LetGo);
                self.relay_only(&s)
            }
            Err(e) => {
                log::warn!("reclaim of stream {token:x} from pid {}: {e:?}", taker.pid);
                (Reply::Failed(libc::EAGAIN), None)
            }
        }
    }

    /// The answer for a stream this engine no longer has: where it went, if it was handed
    /// over and the caller holds it; else ENOENT.
    pub(in crate::engine) fn not_here(&self, token: u64, proof: c_int) -> (Reply, Option<c_int>) {
        match lock(&self.moved).get(token, proof) {
            Some(to) => (Reply::Moved(to), None),
            None => (Reply::Failed(libc::ENOENT), None),
        }
    }
}

/// Some engine took a stream back for its program (`Engine::take_given_back`): one load for
/// the fork hook.
static GIVEN_BACK: AtomicBool = AtomicBool::new(false);

impl Engine {
    /// The streams taken back for the program since the last call (none: one load).
    pub fn take_given_back(&self) -> Vec<Arc<Stream>> {
        if !GIVEN_BACK.swap(false, Acquire) {
            return Vec::new();
        }
        std::mem::take(&mut *lock(&self.given_back))
    }
}
