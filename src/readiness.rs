//! Readiness the shim drives on a real kernel fd (see docs/DESIGN.md, "The fd the program
//! holds").
//!
//! An RDMA socket's fd, as the program sees it, is end A of an `AF_UNIX SOCK_STREAM`
//! socketpair; the shim keeps end B. Because A is a real socket, poll/select/epoll (level- or
//! edge-triggered, one-shot, RDHUP) and `fstat` work on it unchanged, and the shim only has
//! to move A between states:
//!
//! - readable: a token byte sits in A's receive queue (B wrote it);
//! - not writable: A has enough of its own bytes queued at B to exceed a quarter of its
//!   (minimum) send buffer — the kernel's `unix_writable` rule;
//! - EOF: B shut down for writing (A sees `POLLIN | POLLRDHUP`);
//! - hang-up: B closed (A sees `POLLHUP`).
//!
//! Every change costs syscalls, so callers change state only on edges and under the
//! connection's lock. All calls go to the real libc functions: none may re-enter the hooks.

use crate::sys::raw::{errno, set_errno};
use crate::sys::{fcntl, real};
use libc::c_int;
use std::io;

/// The shim's half of a socketpair whose other half is the program's fd.
///
/// The doorbell keeps its own fd of A (close-on-exec), so the program may dup and close its
/// fds freely; [`Doorbell::release_app`] drops it when the program's last fd is closed, so
/// that the file (and any epoll registration of it) goes away with the program's close.
#[derive(Debug)]
pub struct Doorbell {
    app: std::sync::atomic::AtomicI32,
    /// B; -1 once handed to another process ([`take_shim`](Self::take_shim)).
    shim: std::sync::atomic::AtomicI32,
    /// A's (device, inode): what another process must hold to ask about this socket
    /// ([`is_this`](Self::is_this)).
    identity: Option<crate::sys::unix::Identity>,
}

/// Bytes sent per filler write when making A unwritable.
const FILL_CHUNK: usize = 512;
/// Upper bound on filler writes (the kernel's minimum send buffer needs two or three).
const FILL_MAX: usize = 64;

impl Doorbell {
    /// Makes a socketpair whose A starts not readable and writable, with `O_NONBLOCK` as the
    /// program wants it (a file flag, shared by every fd of A). Install A for the program with
    /// [`install_at`](Self::install_at) or [`install_new`](Self::install_new).
    pub fn new(nonblock: bool) -> io::Result<Doorbell> {
        // B comes back nonblocking and out of the program's fd range; A is moved there too.
        let (a, shim) = crate::sys::unix::stream_pair()?;
        let app = crate::sys::raw::hide(a);
        let d = Doorbell::from_fds(app, shim);
        // The smallest send buffer: few filler bytes make A unwritable. The kernel clamps 1
        // up to its minimum.
        let one: c_int = 1;
        // SAFETY: valid option pointer and length; fds are ours.
        unsafe {
            real::setsockopt(
                app,
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&one as *const c_int).cast(),
                4,
            )
        };
        // A is close-on-exec (made so, and moved with F_DUPFD_CLOEXEC) and blocking (made
        // without SOCK_NONBLOCK): only a nonblocking one needs a call.
        if nonblock {
            fcntl::set_only_nonblock(app);
        }
        Ok(d)
    }

    /// The doorbell of a stream taken over from another process: `app`, a private fd of the A
    /// the program already holds, and `shim`, the B that process handed over (already set up
    /// by [`new`](Self::new) there). Both become the doorbell's.
    pub fn from_fds(app: c_int, shim: c_int) -> Doorbell {
        Doorbell {
            app: std::sync::atomic::AtomicI32::new(app),
            shim: std::sync::atomic::AtomicI32::new(shim),
            identity: crate::sys::unix::file_identity(app),
        }
    }

    /// A's (device, inode).
    pub fn identity(&self) -> Option<crate::sys::unix::Identity> {
        self.identity
    }

    /// Whether `fd` (received from another process) is this doorbell's A: that process
    /// holds the socket, which is all the authority it needs (docs/DESIGN.md, "Processes").
    pub fn is_this(&self, fd: c_int) -> bool {
        self.identity.is_some() && crate::sys::unix::file_identity(fd) == self.identity
    }

    /// Gives up B (to pass it to the process taking the stream over): from now on this
    /// doorbell rings nothing, and dropping it closes only its copy of A.
    pub fn take_shim(&self) -> c_int {
        self.shim.swap(-1, std::sync::atomic::Ordering::AcqRel)
    }

    /// In a fork child: closes the child's copy of B, so that the owner's going (its exit,
    /// its exec) hangs A up for every process still holding it; a copy here would keep A
    /// quiet. Only a listener's: a stream's B is the proof a child gives when it gives the
    /// stream back (docs/DESIGN.md, "Processes"). Drop closes B the same way.
    pub fn forget_shim_in_child(&self) {
        let shim = self.take_shim();
        if shim >= 0 {
            crate::sys::raw::close(shim);
        }
    }

    fn shim(&self) -> c_int {
        self.shim.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Sets or clears `O_NONBLOCK` on A's file (shared by every fd of A).
    pub fn set_file_nonblocking(&self, on: bool) -> io::Result<()> {
        fcntl::change_nonblock(self.app_fd(), on)
    }

    /// As [`set_file_nonblocking`](Self::set_file_nonblocking), for a doorbell made by
    /// `new(false)` whose A nobody else holds yet (it is blocking: only `on` needs a call).
    pub fn set_fresh_nonblocking(&self, on: bool) {
        if on {
            fcntl::set_only_nonblock(self.app_fd());
        }
    }

    /// The doorbell's own fd of A, or -1 after [`release_app`](Self::release_app).
    pub fn app_fd(&self) -> c_int {
        self.app.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Makes the program's `fd` refer to A (the old file behind `fd` is closed by the kernel).
    pub fn install_at(&self, fd: c_int, cloexec: bool) -> io::Result<()> {
        let flags = if cloexec { libc::O_CLOEXEC } else { 0 };
        // SAFETY: plain dup3 on fds we hold; the caller owns `fd`'s slot.
        if unsafe { real::dup3(self.app_fd(), fd, flags) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// A new program fd for A (lowest free number, like `accept`).
    pub fn install_new(&self, cloexec: bool) -> io::Result<c_int> {
        let fd = fcntl::dup_lowest(self.app_fd(), cloexec);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(fd)
    }

    /// Closes the doorbell's own fd of A: the program has closed all of its fds, and A must
    /// not outlive them. Later changes that need it (draining tokens, adding filler) are skipped.
    pub fn release_app(&self) {
        let fd = self.app.swap(-1, std::sync::atomic::Ordering::AcqRel);
        if fd >= 0 {
            crate::sys::raw::close(fd);
        }
    }

    /// Makes A readable (`true`: a token is queued) or not (`false`: tokens drained).
    pub fn set_readable(&self, on: bool) {
        // Ringing needs only B: it still reaches A in other processes (fork children) after
        // the shim's own copy of A is released. Draining needs that copy.
        let app = self.app_fd();
        if app < 0 && !on {
            return;
        }
        let e = errno();
        let mut buf = [0u8; 64];
        // SAFETY: buffers are valid for their lengths; the fds are ours.
        unsafe {
            if on {
                real::send(
                    self.shim(),
                    b"r".as_ptr().cast(),
                    1,
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                );
            } else {
                // Tokens are single bytes: a short read means the queue is empty.
                while real::recv(app, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT)
                    == buf.len() as isize
                {}
            }
        }
        set_errno(e);
    }

    /// Makes A writable (`true`: filler drained from B) or not (`false`: filler queued).
    pub fn set_writable(&self, on: bool) {
        let app = self.app_fd(); // filling needs the shim's copy of A; draining B does not
        if app < 0 && !on {
            return;
        }
        let e = errno();
        let mut buf = [0u8; FILL_CHUNK];
        // SAFETY: as above.
        unsafe {
            if on {
                while real::recv(
                    self.shim(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                ) > 0
                {}
            } else {
                for _ in 0..FILL_MAX {
                    if !self.poll_app(libc::POLLOUT) {
                        break;
                    }
                    let n = real::send(
                        app,
                        buf.as_ptr().cast(),
                        buf.len(),
                        libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                    );
                    if n <= 0 {
                        break;
                    }
                }
            }
        }
        set_errno(e);
    }

    /// Signals end of stream: A reads as EOF (`POLLIN | POLLRDHUP`) once tokens are gone.
    pub fn set_eof(&self) {
        let e = errno();
        // SAFETY: the fd is ours.
        unsafe { real::shutdown(self.shim(), libc::SHUT_WR) };
        set_errno(e);
    }

    /// Signals a broken connection: A sees `POLLHUP` (and `POLLIN`, reads then fail).
    pub fn set_hangup(&self) {
        let e = errno();
        // SAFETY: the fd is ours.
        unsafe { real::shutdown(self.shim(), libc::SHUT_RDWR) };
        set_errno(e);
    }

    /// Whether a process other than the shim's own copy may still hold A: false once every
    /// fd of A is closed everywhere (B then sees `POLLRDHUP`), and also after a hang-up the
    /// shim itself made (B shut both ways), when the stream is dead anyway.
    pub fn peer_holds(&self) -> bool {
        crate::sys::unix::wait(self.shim(), libc::POLLRDHUP, 0) & (libc::POLLRDHUP | libc::POLLHUP)
            == 0
    }

    /// B, the shim's end (to watch for the last holder of A going away).
    pub fn shim_fd(&self) -> c_int {
        self.shim()
    }

    /// Whether A currently reports all of `events` to poll (used by tests and assertions).
    pub fn poll_app(&self, events: libc::c_short) -> bool {
        let mut p = libc::pollfd {
            fd: self.app_fd(),
            events,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { real::poll(&mut p, 1, 0) == 1 && p.revents & events == events }
    }
}

impl Drop for Doorbell {
    /// Closing B hangs A up (`POLLHUP`) for any fd of A the program still has.
    fn drop(&mut self) {
        self.release_app();
        self.forget_shim_in_child();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libc::{
        EPOLLET, EPOLLIN, EPOLLONESHOT, EPOLLOUT, EPOLLRDHUP, POLLHUP, POLLIN, POLLOUT, POLLRDHUP,
    };

    fn revents(fd: c_int) -> libc::c_short {
        let mut p = libc::pollfd {
            fd,
            events: POLLIN | POLLOUT | POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        assert!(unsafe { libc::poll(&mut p, 1, 0) } >= 0);
        p.revents
    }

    struct Epoll(c_int);
    impl Epoll {
        fn new(fd: c_int, events: i32) -> Epoll {
            // SAFETY: plain syscalls with valid arguments.
            unsafe {
                let ep = libc::epoll_create1(libc::EPOLL_CLOEXEC);
                let mut ev = libc::epoll_event {
                    events: events as u32,
                    u64: fd as u64,
                };
                assert_eq!(libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev), 0);
                Epoll(ep)
            }
        }
        fn wait(&self) -> u32 {
            let mut ev = [libc::epoll_event { events: 0, u64: 0 }; 4];
            // SAFETY: valid event array.
            let n = unsafe { libc::epoll_wait(self.0, ev.as_mut_ptr(), 4, 0) };
            if n > 0 {
                ev[0].events
            } else {
                0
            }
        }
    }
    impl Drop for Epoll {
        fn drop(&mut self) {
            // SAFETY: our epoll fd.
            unsafe { libc::close(self.0) };
        }
    }

    fn close(fd: c_int) {
        // SAFETY: test-owned fd.
        unsafe { libc::close(fd) };
    }

    #[test]
    fn starts_writable_and_not_readable_and_is_a_socket() {
        let d = Doorbell::new(true).unwrap();
        let a = d.install_new(true).unwrap();
        let r = revents(a);
        assert_eq!(r & POLLIN, 0);
        assert_ne!(r & POLLOUT, 0);
        // SAFETY: valid out-buffer.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::fstat(a, &mut st) }, 0);
        assert_eq!(st.st_mode & libc::S_IFMT, libc::S_IFSOCK);
        // SAFETY: plain fcntl.
        assert_ne!(
            unsafe { libc::fcntl(a, libc::F_GETFL) } & libc::O_NONBLOCK,
            0
        );
        assert_ne!(
            unsafe { libc::fcntl(a, libc::F_GETFD) } & libc::FD_CLOEXEC,
            0
        );
        drop(d);
        close(a);
    }

    #[test]
    fn readable_toggles_both_ways_and_is_idempotent() {
        let d = Doorbell::new(false).unwrap();
        let a = d.install_new(false).unwrap();
        d.set_readable(true);
        d.set_readable(true);
        assert_ne!(revents(a) & POLLIN, 0);
        d.set_readable(false);
        assert_eq!(revents(a) & POLLIN, 0);
        d.set_readable(false);
        assert_eq!(revents(a) & POLLIN, 0);
        drop(d);
        close(a);
    }

    #[test]
    fn writable_toggles_both_ways() {
        let d = Doorbell::new(true).unwrap();
        let a = d.install_new(false).unwrap();
        d.set_writable(false);
        assert_eq!(revents(a) & POLLOUT, 0, "filler must make A unwritable");
        d.set_writable(false);
        assert_eq!(revents(a) & POLLOUT, 0);
        d.set_writable(true);
        assert_ne!(revents(a) & POLLOUT, 0);
        drop(d);
        close(a);
    }

    #[test]
    fn eof_reads_as_rdhup_and_drop_as_hup() {
        let d = Doorbell::new(true).unwrap();
        let a = d.install_new(false).unwrap();
        d.set_eof();
        let r = revents(a);
        assert_ne!(r & POLLIN, 0);
        assert_ne!(r & POLLRDHUP, 0);
        assert_eq!(r & POLLHUP, 0);
        drop(d);
        assert_ne!(revents(a) & POLLHUP, 0);
        close(a);
    }

    #[test]
    fn epoll_edge_triggered_sees_each_new_token_as_an_edge() {
        let d = Doorbell::new(true).unwrap();
        let a = d.install_new(false).unwrap();
        let ep = Epoll::new(a, EPOLLIN | EPOLLET);
        assert_eq!(ep.wait(), 0);
        d.set_readable(true);
        assert_ne!(ep.wait() & EPOLLIN as u32, 0);
        assert_eq!(ep.wait(), 0, "edge reported once");
        d.set_readable(true); // new data while still readable: a new edge, as with TCP
        assert_ne!(ep.wait() & EPOLLIN as u32, 0);
        d.set_readable(false);
        assert_eq!(ep.wait(), 0);
        drop(d);
        close(a);
    }

    #[test]
    fn epoll_level_triggered_writable_follows_credits() {
        let d = Doorbell::new(true).unwrap();
        let a = d.install_new(false).unwrap();
        let ep = Epoll::new(a, EPOLLOUT);
        assert_ne!(ep.wait() & EPOLLOUT as u32, 0);
        d.set_writable(false);
        assert_eq!(ep.wait(), 0);
        d.set_writable(true);
        assert_ne!(ep.wait() & EPOLLOUT as u32, 0);
        drop(d);
        close(a);
    }

    #[test]
    fn epoll_oneshot_and_rdhup() {
        let d = Doorbell::new(true).unwrap();
        let a = d.install_new(false).unwrap();
        let ep = Epoll::new(a, EPOLLIN | EPOLLRDHUP | EPOLLONESHOT);
        d.set_eof();
        let ev = ep.wait();
        assert_ne!(ev & EPOLLRDHUP as u32, 0);
        assert_eq!(ep.wait(), 0, "one-shot: disarmed until EPOLL_CTL_MOD");
        drop(d);
        close(a);
    }

    #[test]
    fn install_at_replaces_the_programs_fd_and_release_lets_its_close_hang_up() {
        let d = Doorbell::new(false).unwrap();
        // SAFETY: a plain TCP socket stands in for the program's fd.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
        d.install_at(fd, true).unwrap();
        // SAFETY: plain fcntl/fstat.
        assert_ne!(
            unsafe { libc::fcntl(fd, libc::F_GETFD) } & libc::FD_CLOEXEC,
            0
        );
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::fstat(fd, &mut st) }, 0);
        d.set_readable(true);
        assert_ne!(revents(fd) & POLLIN, 0);
        d.release_app();
        assert_eq!(d.app_fd(), -1);
        d.set_readable(false); // ignored after release, must not touch a reused number
        assert_ne!(revents(fd) & POLLIN, 0);
        drop(d);
        assert_ne!(revents(fd) & POLLHUP, 0);
        close(fd);
    }

    #[test]
    fn hangup_reports_pollhup() {
        let d = Doorbell::new(true).unwrap();
        let a = d.install_new(false).unwrap();
        d.set_hangup();
        assert_ne!(revents(a) & POLLHUP, 0);
        drop(d);
        close(a);
    }
}
