//! Requests between processes that hold the same socket (docs/DESIGN.md, "Processes").
//!
//! Every engine listens on an abstract `SOCK_SEQPACKET` address named after its [`Owner`]
//! (pid and a random nonce). Another process that holds one of its sockets — by fork, exec
//! or `SCM_RIGHTS`, under any uid — asks it for what only the owner can do, in one request
//! and one reply ([`msg`]) that may carry an fd.
//!
//! **Authority is possession.** Every request carries the caller's fd of the socket it asks
//! about; the owner serves it only if that fd is the very socket (the doorbell's A: same
//! device and inode, [`crate::readiness::Doorbell::is_this`]). A uid proves nothing here:
//! workers drop root after fork, and a stranger of the same uid must not get a stream.
//! **Answers are checked too**: the caller talks only to the process it asked for (the
//! socket's `SO_PEERCRED` pid), decodes the reply strictly, and checks the fd it carries.
//!
//! The owner's helper thread never waits on a caller ([`Server`]): requests are read
//! nonblocking, a connection whose request is not there yet waits in a bounded list, and
//! every fd that arrives is closed unless used.

pub mod msg;

pub use msg::{Ends, Reply, Request, BRANCH_ID_MASK};

use crate::sys::{raw, unix};
use libc::c_int;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a caller waits to connect, and then for the owner's reply.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How many times a caller follows [`Reply::Moved`] before giving up.
pub const MAX_HOPS: usize = 8;

/// The process that owns an RDMA object, and where it takes requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    /// Its process id.
    pub pid: i32,
    /// Random per engine: tells this owner from a later process with the same pid.
    pub nonce: u64,
}

static MY_NONCE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Owner {
    /// This process's engine (its nonce is what [`is_me`](Self::is_me) compares).
    pub fn mine(pid: i32, nonce: u64) -> Owner {
        MY_NONCE.store(nonce, std::sync::atomic::Ordering::Relaxed);
        Owner { pid, nonce }
    }

    /// The abstract socket name the owner listens on.
    pub fn name(&self) -> Vec<u8> {
        format!("rsock.{}.{:016x}", self.pid, self.nonce).into_bytes()
    }

    /// Whether this owner is the calling process's engine (pid and nonce: a fork child's
    /// memory holds its parent's nonce, but not its pid).
    pub fn is_me(&self) -> bool {
        self.pid == raw::pid() && self.nonce == MY_NONCE.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The name a stream's doorbell A carries (`getsockname` on it): a process that receives
/// the fd with `SCM_RIGHTS` learns from it whom to ask, and proves with the fd itself.
pub fn stream_name(owner: &Owner, token: u64) -> Vec<u8> {
    format!(
        "{STREAM_PREFIX}{}.{:016x}.{:016x}",
        owner.pid, owner.nonce, token
    )
    .into_bytes()
}

const STREAM_PREFIX: &str = "rsock-s.";

/// The owner and token in a [`stream_name`].
pub fn parse_stream_name(name: &[u8]) -> Option<(Owner, u64)> {
    let rest = std::str::from_utf8(name)
        .ok()?
        .strip_prefix(STREAM_PREFIX)?;
    let mut it = rest.split('.');
    let pid = it.next()?.parse::<i32>().ok().filter(|&p| p > 0)?;
    let nonce = u64::from_str_radix(it.next()?, 16).ok()?;
    let token = u64::from_str_radix(it.next()?, 16).ok()?;
    it.next().is_none().then_some((Owner { pid, nonce }, token))
}

/// A stream known only by its A's name ([`stream_name`]): whose it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Passed {
    pub owner: Owner,
    pub token: u64,
}

/// Why a call got no usable answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallError {
    /// Nobody serves the owner's name, or someone else does: the owner's engine is gone.
    Gone,
    /// The owner refused, with this errno (EAGAIN: nothing to accept now).
    Refused(c_int),
    /// No answer in time, or an answer that breaks the protocol: the owner may be alive.
    Failed(c_int),
}

impl CallError {
    /// An errno for logs and callers that need one.
    pub fn errno(self) -> c_int {
        match self {
            CallError::Gone => libc::ECONNREFUSED,
            CallError::Refused(e) | CallError::Failed(e) => e,
        }
    }
}

/// Asks `owner` for `req`, proving possession with `proof` (the caller's fd of the socket),
/// and follows [`Reply::Moved`] (at most [`MAX_HOPS`] times; `owner` is updated). Ok: the
/// reply and its fd (present exactly when [`Reply::carries_fd`]).
pub fn call(
    owner: &mut Owner,
    req: &Request,
    proof: c_int,
) -> Result<(Reply, Option<c_int>), CallError> {
    for _ in 0..=MAX_HOPS {
        match ask_once(owner, req, proof)? {
            (Reply::Moved(to), _) if to != *owner => *owner = to,
            (Reply::Moved(_), _) => return Err(CallError::Failed(libc::ELOOP)),
            (Reply::Failed(e), _) => return Err(CallError::Refused(e)),
            done => return Ok(done),
        }
    }
    Err(CallError::Failed(libc::ELOOP))
}

/// Times a request is sent again when the owner closed the connection before reading it.
const UNSENT_RETRIES: u32 = 20;

fn ask_once(
    owner: &Owner,
    req: &Request,
    proof: c_int,
) -> Result<(Reply, Option<c_int>), CallError> {
    let mut pause = Duration::from_millis(1);
    let mut retries = 0;
    loop {
        let fd = unix::connect_abstract(&owner.name(), CALL_TIMEOUT).map_err(|e| {
            match e.raw_os_error() {
                Some(libc::ECONNREFUSED | libc::ENOENT) => CallError::Gone,
                other => CallError::Failed(other.unwrap_or(libc::EIO)),
            }
        })?;
        let result = exchange(fd, owner, req, proof);
        raw::close(fd);
        match result {
            // The owner accepted before the request was in and, its callers' quota full (a
            // flood of silent connections, maybe by this uid: `Server::on_listener`),
            // closed the connection unread: nothing was done, so asking again is safe.
            Err(Exchange::Unsent(_)) if retries < UNSENT_RETRIES => {
                retries += 1;
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(Exchange::Unsent(e)) => return Err(CallError::Failed(e)),
            Err(Exchange::Call(e)) => return Err(e),
            Ok(r) => return Ok(r),
        }
    }
}

/// How an exchange failed: the request never reached the owner, or the call failed.
enum Exchange {
    Unsent(c_int),
    Call(CallError),
}

impl From<CallError> for Exchange {
    fn from(e: CallError) -> Exchange {
        Exchange::Call(e)
    }
}

fn exchange(
    fd: c_int,
    owner: &Owner,
    req: &Request,
    proof: c_int,
) -> Result<(Reply, Option<c_int>), Exchange> {
    // Whoever listens on the name must be the owner's process: once the owner is gone, any
    // local user may bind its (visible) name.
    if unix::peer_cred(fd).map(|c| c.pid) != Some(owner.pid) {
        return Err(CallError::Gone.into());
    }
    let os = |e: std::io::Error| CallError::Failed(e.raw_os_error().unwrap_or(libc::EIO));
    unix::send(fd, &req.encode(), Some(proof)).map_err(|e| match e.raw_os_error() {
        Some(e @ (libc::EPIPE | libc::ECONNRESET)) => Exchange::Unsent(e),
        _ => Exchange::Call(os(e)),
    })?;
    let mut buf = [0u8; msg::REPLY_LEN];
    let got = unix::recv_one(fd, &mut buf).map_err(|e| match e.raw_os_error() {
        Some(libc::EAGAIN) => CallError::Failed(libc::ETIMEDOUT).into(),
        // The owner closed the connection with the request unread in it (an exit or exec
        // under way: the next connect finds no one): nothing was done, ask again.
        Some(libc::ECONNRESET) => Exchange::Unsent(libc::ECONNRESET),
        other => CallError::Failed(other.unwrap_or(libc::EIO)).into(),
    })?;
    let reply = Reply::decode(&buf[..got.len]);
    match (reply, got.fd) {
        (Ok(r), fd) if r.carries_fd() == fd.is_some() && fits(&r, fd) => Ok((r, fd)),
        (r, fd) => {
            if let Some(fd) = fd {
                raw::close(fd);
            }
            log::warn!("ipc: pid {} answered out of protocol: {r:?}", owner.pid);
            Err(CallError::Failed(libc::EPROTO).into())
        }
    }
}

/// Whether the fd a reply carries is the kind of file the reply says.
fn fits(r: &Reply, fd: Option<c_int>) -> bool {
    let Some(fd) = fd else { return true };
    match r {
        Reply::Relay(_) | Reply::Doorbell { .. } | Reply::Stream { .. } => {
            unix::socket_kind(fd) == Some((libc::AF_UNIX, libc::SOCK_STREAM))
        }
        Reply::Tcp { .. } => matches!(
            unix::socket_kind(fd),
            Some((libc::AF_INET | libc::AF_INET6, libc::SOCK_STREAM))
        ),
        Reply::Listening { .. } => {
            matches!(
                unix::socket_kind(fd),
                Some((libc::AF_INET | libc::AF_INET6, libc::SOCK_STREAM))
            ) && unix::is_listening(fd)
        }
        Reply::State => unix::is_regular_file(fd),
        Reply::Failed(_) | Reply::Moved(_) | Reply::Described { .. } | Reply::Done => false,
    }
}

/// At most this many connections wait for their request at once, and this many per uid.
const MAX_WAITING: usize = 32;
const MAX_WAITING_PER_UID: usize = 8;
/// How long a connection may take to send its request (callers send it right after
/// connecting).
const REQUEST_WAIT: Duration = Duration::from_millis(500);

/// What an owner makes of one request: its reply now, or `None` when the answer takes long
/// (a hand-over that waits for the remote peer) and another thread gives it later with
/// [`reply`], on its own copies of the caller's connection and proof (`Call`). The proof fd
/// is the caller's; the answerer must not keep or close it.
pub type Answer<'a> = dyn FnMut(&Request, Call) -> Option<(Reply, Option<c_int>)> + 'a;

/// One caller's connection and the fd it sent as proof (both the server's, closed after).
#[derive(Clone, Copy)]
pub struct Call {
    pub conn: c_int,
    pub proof: c_int,
}

/// Sends `reply` (with `fd`, which is closed) on the caller's connection `conn`, then closes it.
pub fn reply(conn: c_int, reply: &Reply, fd: Option<c_int>) {
    if let Err(e) = unix::send(conn, &reply.encode(), fd) {
        log::debug!("ipc: reply not sent: {e}");
    }
    if let Some(fd) = fd {
        raw::close(fd); // the caller has its own copy now
    }
    raw::close(conn);
}

/// The owner's side: a listening socket and the connections whose request is still due.
pub struct Server {
    lfd: std::sync::atomic::AtomicI32,
    waiting: Mutex<Vec<Waiting>>,
}

struct Waiting {
    fd: c_int,
    uid: u32,
    since: Instant,
}

impl Server {
    /// Listens at `owner`'s name.
    pub fn listen(owner: &Owner) -> std::io::Result<Server> {
        Ok(Server {
            lfd: unix::listen_abstract(&owner.name())?.into(),
            waiting: Mutex::new(Vec::new()),
        })
    }

    /// The listening socket (the helper watches it).
    pub fn fd(&self) -> c_int {
        self.lfd.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// In a fork child: the parent's sockets must not answer for it from here (once the
    /// parent is gone, callers must be refused, not left waiting on a socket nobody serves).
    /// No lock is waited for: a parent thread may have held it at the fork.
    pub fn forget_in_child(&self) {
        raw::close(self.lfd.swap(-1, std::sync::atomic::Ordering::Relaxed));
        if let Ok(mut w) = self.waiting.try_lock() {
            for x in w.drain(..) {
                raw::close(x.fd);
            }
        }
    }

    /// Helper: the listening socket is readable. Accepts every queued connection and
    /// answers those whose request is in; the rest wait (`watch` is asked to watch them,
    /// [`on_waiting`](Self::on_waiting) serves them when readable).
    pub fn on_listener(&self, answer: &mut Answer, watch: &mut dyn FnMut(c_int)) {
        while let Some(c) = unix::accept_nonblocking(self.fd()) {
            if self.serve(c, answer) {
                continue;
            }
            let uid = unix::peer_cred(c).map_or(u32::MAX, |p| p.uid);
            let mut w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
            let mine = w.iter().filter(|x| x.uid == uid).count();
            if mine >= MAX_WAITING_PER_UID || w.len() >= MAX_WAITING {
                raw::close(c); // a slow or idle caller: it retries, or was never honest
                continue;
            }
            w.push(Waiting {
                fd: c,
                uid,
                since: Instant::now(),
            });
            watch(c);
        }
    }

    /// Helper: a waiting connection is readable (or hung up).
    pub fn on_waiting(&self, c: c_int, answer: &mut Answer) {
        let known = {
            let mut w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
            let before = w.len();
            w.retain(|x| x.fd != c);
            w.len() != before
        };
        if known && !self.serve(c, answer) {
            raw::close(c); // readable but no request: hung up, or a partial message
        }
    }

    /// Helper, busy outside its loop (the exit drain), where no readiness reaches
    /// [`on_waiting`](Self::on_waiting): serves the waiting connections that are readable
    /// now. Without it a caller whose request came in after its connect was accepted waited
    /// out its time-out (a parent's reclaim from its exiting fork child).
    pub fn on_waiting_ready(&self, answer: &mut Answer) {
        let fds: Vec<c_int> = {
            let w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
            w.iter().map(|x| x.fd).collect()
        };
        for c in fds {
            if crate::sys::poll::poll_one_raw(c, libc::POLLIN, 0) > 0 {
                self.on_waiting(c, answer);
            }
        }
    }

    /// Helper, now and then: closes connections that sent nothing in time.
    pub fn expire(&self, now: Instant) {
        let mut w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        w.retain(|x| {
            let keep = now.duration_since(x.since) < REQUEST_WAIT;
            if !keep {
                raw::close(x.fd);
            }
            keep
        });
    }

    /// Whether connections are waiting (the helper then wakes often enough to expire them).
    pub fn has_waiting(&self) -> bool {
        !self
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    /// Reads `c`'s request without waiting and answers it. False: no request yet (`c` stays
    /// open); otherwise `c` is answered (or refused) and closed.
    fn serve(&self, c: c_int, answer: &mut Answer) -> bool {
        let mut buf = [0u8; msg::REQUEST_LEN + 1];
        let got = match unix::recv_one_nonblocking(c, &mut buf) {
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => return false,
            r => r,
        };
        let answered = match &got {
            Ok(g) if !g.truncated => match (Request::decode(&buf[..g.len]), g.fd) {
                (Ok(req), Some(proof)) => answer(&req, Call { conn: c, proof }),
                _ => Some((Reply::Failed(libc::EPROTO), None)),
            },
            _ => Some((Reply::Failed(libc::EPROTO), None)),
        };
        if let Ok(Some(proof)) = got.as_ref().map(|g| g.fd) {
            raw::close(proof);
        }
        match answered {
            Some((r, fd)) => reply(c, &r, fd),
            None => raw::close(c), // answered later, on the answerer's copy
        }
        true
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        for w in self
            .waiting
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            raw::close(w.fd);
        }
        raw::close(self.fd());
    }
}

#[cfg(test)]
mod tests;
