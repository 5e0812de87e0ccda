//! Answering other processes' requests about this process's sockets (`ipc`, on the helper
//! thread): what a socket is, a relay of a stream, a connection accepted through a listener;
//! the hand-over requests are answered in `takeover`.

use super::stream::Event;
use super::tags::TAG_IPC_CONN;
use super::{ipc, lock, Accepted, BufSizes, Engine, Listener, Stream};
use libc::c_int;
use std::sync::Arc;

impl Engine {
    /// Helper: the ipc socket is readable (see `ipc`).
    pub(super) fn serve_requests(&'static self) {
        if let Some(server) = &self.ipc {
            let mut watch = |c| {
                if let Err(e) = self.watch(c, TAG_IPC_CONN | c as u64) {
                    log::debug!("ipc: cannot watch a caller: {e}");
                }
            };
            server.on_listener(&mut |req, call| self.answer(req, call), &mut watch);
        }
    }

    /// Helper, while it waits outside its loop (the exit drain): new callers, and the
    /// waiting ones whose request has come in since (nothing else watches them meanwhile).
    pub(super) fn serve_requests_while_busy(&'static self) {
        self.serve_requests();
        if let Some(server) = &self.ipc {
            server.on_waiting_ready(&mut |req, call| self.answer(req, call));
            server.expire(std::time::Instant::now());
        }
    }

    /// Helper: a caller whose request was not in yet is readable.
    pub(super) fn serve_waiting(&'static self, c: c_int) {
        if let Some(server) = &self.ipc {
            server.on_waiting(c, &mut |req, call| self.answer(req, call));
        }
    }

    /// Helper: drops callers that sent nothing in time.
    pub(super) fn expire_callers(&self) {
        if let Some(server) = self.ipc.as_ref().filter(|s| s.has_waiting()) {
            server.expire(std::time::Instant::now());
        }
    }

    /// Whether callers wait for the helper to read their request.
    pub(super) fn callers_waiting(&self) -> bool {
        self.ipc.as_ref().is_some_and(|s| s.has_waiting())
    }

    /// One request, from a process that sent `proof` as its fd of the socket asked about.
    /// Whoever does not hold that socket learns nothing (ENOENT, as for a token never
    /// issued), whatever its uid.
    fn answer(
        &'static self,
        req: &ipc::Request,
        call: ipc::Call,
    ) -> Option<(ipc::Reply, Option<c_int>)> {
        let proof = call.proof;
        if let ipc::Request::Reclaim {
            token,
            taker,
            exiting,
        } = *req
        {
            return self.defer_reclaim(token, taker, exiting, call);
        }
        Some(self.answer_now(req, proof))
    }

    /// [`answer`](Self::answer) for the requests the helper answers at once.
    fn answer_now(&'static self, req: &ipc::Request, proof: c_int) -> (ipc::Reply, Option<c_int>) {
        let token = req.token();
        let stream = || {
            lock(&self.streams_by_token)
                .get(&token)
                .filter(|s| s.bell().is_this(proof))
                .cloned()
        };
        match *req {
            ipc::Request::Describe { .. } => match stream() {
                Some(s) if !s.life().released() => {
                    let (ring, send) = s.sizes();
                    let r = ipc::Reply::Described {
                        token,
                        owner: self.owner,
                        sizes: BufSizes { ring, send }.packed(),
                        ends: s.ends(),
                    };
                    (r, None)
                }
                Some(_) => self.not_here(token, proof),
                None => match self.listener_held(token, proof) {
                    Some(l) => self.describe_listener(&l),
                    None => self.not_here(token, proof),
                },
            },
            ipc::Request::Relay { .. } => match stream() {
                Some(s) if !s.life().released() => self.relay(&s),
                _ => self.not_here(token, proof),
            },
            ipc::Request::Take { port, taker, .. } => match stream() {
                Some(s) => self.answer_take(&s, port, taker),
                None => self.not_here(token, proof),
            },
            ipc::Request::Export {
                resume_at, taker, ..
            } => match stream() {
                Some(s) => self.answer_export(&s, resume_at, taker),
                None => self.not_here(token, proof),
            },
            ipc::Request::Reclaim { .. } => (ipc::Reply::Failed(libc::EINVAL), None), // deferred
            ipc::Request::Accept { taker, .. } => match self.listener_held(token, proof) {
                Some(l) => self.accept_for(&l, taker),
                None => (ipc::Reply::Failed(libc::ENOENT), None),
            },
            ipc::Request::Branch {
                port, id, taker, ..
            } => match self.listener_held(token, proof) {
                // Only a listener of this process's own, and only from a caller that says
                // who it is: a branch of a branch would send clients round in circles.
                Some(l) if !l.is_branch() && self.cfg.redirect => {
                    self.set_branch(&l, taker, port, id);
                    (ipc::Reply::Done, None)
                }
                Some(_) => (ipc::Reply::Failed(libc::EOPNOTSUPP), None),
                None => (ipc::Reply::Failed(libc::ENOENT), None),
            },
        }
    }

    /// Listener `token`, if `proof` is its A.
    fn listener_held(&self, token: u64, proof: c_int) -> Option<Arc<Listener>> {
        lock(&self.listeners)
            .get(&token)
            .filter(|l| l.bell().is_this(proof))
            .cloned()
    }

    /// [`ipc::Request::Describe`] of a listener (its A was sent to another process): its
    /// facts, and a copy of its kernel listener for the day this process is gone.
    fn describe_listener(&self, l: &Listener) -> (ipc::Reply, Option<c_int>) {
        // A copy of the listener's own fd; the ipc server sends and closes it.
        let tcp = crate::sys::fcntl::dup_lowest(l.tcp_fd, true);
        let local = crate::sys::sockaddr::local_of(l.tcp_fd);
        match (tcp, local) {
            (t, Some(local)) if t >= 0 => {
                l.described();
                let r = ipc::Reply::Listening {
                    token: l.token,
                    owner: self.owner,
                    sizes: l.sizes.packed(),
                    local,
                };
                (r, Some(t))
            }
            (t, _) => {
                crate::sys::raw::close(t);
                (ipc::Reply::Failed(libc::ENOBUFS), None)
            }
        }
    }

    /// [`ipc::Request::Accept`]: the next connection of `l`'s queue, for another process.
    fn accept_for(
        &'static self,
        l: &Arc<Listener>,
        taker: Option<ipc::Owner>,
    ) -> (ipc::Reply, Option<c_int>) {
        l.served_elsewhere(); // another process accepts through it
        if let Some(t) = taker {
            l.branches.set_free(t.pid); // a branch's process is free for connections
        }
        match l.try_pop(self) {
            None => (ipc::Reply::Failed(libc::EAGAIN), None),
            Some(Accepted::Tcp(fd)) => {
                let local = crate::sys::sockaddr::local_of(fd);
                let peer = crate::sys::sockaddr::peer_of(fd);
                (ipc::Reply::Tcp { local, peer }, Some(fd))
            }
            Some(Accepted::Rdma(s)) => {
                // Never given to this process's program: the worker takes it over (given
                // A and the facts), or only the relay holds it (always for a link's
                // stream, which does not move).
                s.advance(Event::LetGo);
                if taker.is_some() && self.cfg.takeover && !s.is_on_link() {
                    return self.hand_to_worker(&s);
                }
                self.relay_only(&s)
            }
        }
    }

    /// Relays `s`, which no program of this process holds (`Life::Unheld`), to the caller:
    /// the relay is then its only holder, whose last close ends it — which the helper
    /// rechecks (the end of stream may be read by a completion, raising no event on the
    /// relay end). No relay: it ends now.
    pub(super) fn relay_only(&'static self, s: &Arc<Stream>) -> (ipc::Reply, Option<c_int>) {
        s.release_app();
        let r = self.relay(s);
        if r.1.is_none() {
            self.close_unheld(s);
        } else {
            self.settle_holders(s);
        }
        r
    }

    /// A relay end of `s`, which this process owns, for a process that cannot use its A.
    pub fn relay_end(&'static self, s: &Arc<Stream>) -> Option<c_int> {
        self.relay(s).1
    }

    /// A relay end of `s` for this process's own program (whose fds then carry the stream's
    /// bytes: stdio, `api::stdio`), taking the bytes only after the program's calls in
    /// progress on the stream.
    pub fn relay_end_for_self(&'static self, s: &Arc<Stream>) -> Option<c_int> {
        s.relay_after_calls();
        self.relay(s).1
    }

    /// Starts a relay of `s` and the reply that hands its A over.
    fn relay(&'static self, s: &Arc<Stream>) -> (ipc::Reply, Option<c_int>) {
        match s.start_relay() {
            Ok((a, b)) => {
                self.watch_hold(b, s.token);
                log::debug!(
                    "rdma stream {} -> {}: relayed to another process",
                    s.local,
                    s.peer
                );
                (ipc::Reply::Relay(s.ends()), Some(a))
            }
            Err(e) => {
                log::warn!("rdma stream {}: cannot relay: {e}", s.peer);
                (ipc::Reply::Failed(libc::ENOBUFS), None)
            }
        }
    }
}
