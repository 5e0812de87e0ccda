//! fd edge cases around sockets, printed deterministically so that a run under the shim can
//! be compared line for line with a run without it (tests/passthrough/run.sh, cell fd_edge).
//!
//! Covers: fd numbers above 1024 (F_DUPFD to 2000, dup2 to 2001), dup2 of a socket onto
//! another socket (the old connection must end), dup2 of a file onto a socket, close_range
//! over sockets (and CLOSE_RANGE_CLOEXEC), ioctl(FIONBIO), and a dup'd socket that stays
//! connected until its last fd is closed.
//!
//! Output: one observation per line. `pair TAG` for every connection pair made (each is two
//! connections in this process: the connect and the accept); `checkpoint LABEL live FDS` at
//! points where FDS are exactly the connection fds open; a final `total sent N received M`
//! (bytes moved by successful socket calls) and `done`.
//!
//! `fd_edge` runs the sections above; `fd_edge stdio` runs instead a section where a socket
//! is written and closed through stdio (`fdopen`, `fputs`, `fclose`: glibc's internal write
//! and close, which an LD_PRELOAD shim does not see), and its fd number is then reused by a
//! file.
//!
//! With FD_EDGE_RSOCK=<rsock CLI> and FD_EDGE_SNAPS=<dir> set (and RSOCK_STATS_DIR), each
//! checkpoint also saves `rsock stat --json <own pid>` to <dir>/<LABEL>.json; this does not
//! change the output.

use std::ffi::CString;
use std::io::Write;
use std::process::ExitCode;

use libc::{c_int, c_void};

struct Ctx {
    listener: c_int,
    addr: libc::sockaddr_in,
    sent: u64,
    received: u64,
    out: std::io::StdoutLock<'static>,
}

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn ename(e: c_int) -> String {
    match e {
        libc::EAGAIN => "EAGAIN".into(),
        libc::EBADF => "EBADF".into(),
        libc::EINVAL => "EINVAL".into(),
        libc::EPIPE => "EPIPE".into(),
        libc::ECONNRESET => "ECONNRESET".into(),
        libc::ENOTSOCK => "ENOTSOCK".into(),
        libc::ENOTCONN => "ENOTCONN".into(),
        e => format!("errno {e}"),
    }
}

macro_rules! say {
    ($cx:expr, $($arg:tt)*) => {{
        let _ = writeln!($cx.out, $($arg)*);
    }};
}

impl Ctx {
    fn new() -> Result<Ctx, String> {
        // SAFETY: plain socket calls on our own fds and stack buffers.
        unsafe {
            let l = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
            if l < 0 {
                return Err(format!("socket: {}", ename(errno())));
            }
            let one: c_int = 1;
            libc::setsockopt(
                l,
                libc::SOL_SOCKET,
                libc::SO_REUSEADDR,
                (&one as *const c_int).cast(),
                4,
            );
            let mut a: libc::sockaddr_in = std::mem::zeroed();
            a.sin_family = libc::AF_INET as libc::sa_family_t;
            a.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
            a.sin_port = 0;
            let alen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            if libc::bind(l, (&a as *const libc::sockaddr_in).cast(), alen) != 0 {
                return Err(format!("bind: {}", ename(errno())));
            }
            if libc::listen(l, 16) != 0 {
                return Err(format!("listen: {}", ename(errno())));
            }
            let mut len = alen;
            libc::getsockname(l, (&mut a as *mut libc::sockaddr_in).cast(), &mut len);
            Ok(Ctx {
                listener: l,
                addr: a,
                sent: 0,
                received: 0,
                out: std::io::stdout().lock(),
            })
        }
    }

    /// A connected pair: (the connecting end, the accepted end).
    fn pair(&mut self, tag: &str) -> (c_int, c_int) {
        // SAFETY: as above.
        unsafe {
            let c = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
            let alen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            if c < 0 || libc::connect(c, (&self.addr as *const libc::sockaddr_in).cast(), alen) != 0
            {
                panic!("connect for {tag}: {}", ename(errno()));
            }
            let s = libc::accept(self.listener, std::ptr::null_mut(), std::ptr::null_mut());
            if s < 0 {
                panic!("accept for {tag}: {}", ename(errno()));
            }
            say!(self, "pair {tag}");
            (c, s)
        }
    }

    /// Sends `msg` on `fd` (one send call), reporting the outcome.
    fn send(&mut self, what: &str, fd: c_int, msg: &str) {
        // SAFETY: msg is a valid buffer.
        let n = unsafe { libc::send(fd, msg.as_ptr().cast(), msg.len(), libc::MSG_NOSIGNAL) };
        if n >= 0 {
            self.sent += n as u64;
            say!(self, "{what}: send {:?} -> {n}", msg);
        } else {
            say!(self, "{what}: send {:?} -> {}", msg, ename(errno()));
        }
    }

    /// Waits up to `ms` for `fd` to be readable, then makes one recv; reports what it saw.
    fn recv(&mut self, what: &str, fd: c_int, ms: c_int) {
        let r = self.recv_raw(fd, ms);
        say!(self, "{what}: {r}");
    }

    fn recv_raw(&mut self, fd: c_int, ms: c_int) -> String {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut p, 1, ms) };
        if ready == 0 {
            return "nothing to read".into();
        }
        if ready < 0 {
            return format!("poll -> {}", ename(errno()));
        }
        let mut buf = [0u8; 256];
        // SAFETY: buf is valid for its length.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast::<c_void>(), buf.len(), 0) };
        match n {
            0 => "eof".into(),
            n if n > 0 => {
                self.received += n as u64;
                format!("got {:?}", String::from_utf8_lossy(&buf[..n as usize]))
            }
            _ => format!("recv -> {}", ename(errno())),
        }
    }

    /// Whether `fd` is an open descriptor.
    fn fd_state(&mut self, what: &str, fd: c_int) {
        // SAFETY: F_GETFD on any number is harmless.
        let r = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        if r < 0 {
            say!(self, "{what}: fd {fd} closed ({})", ename(errno()));
        } else {
            say!(
                self,
                "{what}: fd {fd} open cloexec={}",
                r & libc::FD_CLOEXEC != 0
            );
        }
    }

    fn close(&mut self, what: &str, fd: c_int) {
        // SAFETY: closing a number we chose.
        let r = unsafe { libc::close(fd) };
        if r != 0 {
            say!(self, "{what}: close({fd}) -> {}", ename(errno()));
        }
    }

    /// Records that `live` are exactly the connection fds open now; snapshots the counters.
    fn checkpoint(&mut self, label: &str, live: &[c_int]) {
        let list: Vec<String> = live.iter().map(|f| f.to_string()).collect();
        say!(self, "checkpoint {label} live {}", list.join(","));
        let _ = self.out.flush();
        let (Ok(bin), Ok(dir), Ok(stats)) = (
            std::env::var("FD_EDGE_RSOCK"),
            std::env::var("FD_EDGE_SNAPS"),
            std::env::var("RSOCK_STATS_DIR"),
        ) else {
            return;
        };
        let Ok(file) = std::fs::File::create(format!("{dir}/{label}.json")) else {
            return;
        };
        let _ = std::process::Command::new(bin)
            .args([
                "stat",
                "--dir",
                &stats,
                "--json",
                &std::process::id().to_string(),
            ])
            .env_remove("LD_PRELOAD")
            .stdout(file)
            .status();
    }
}

fn high_fds(cx: &mut Ctx) {
    // F_DUPFD to the lowest free fd >= 2000, then use only the high fd.
    let (c, s) = cx.pair("f_dupfd_2000");
    // SAFETY: fcntl/close on our own fds.
    let h = unsafe { libc::fcntl(c, libc::F_DUPFD, 2000) };
    say!(cx, "F_DUPFD(c, 2000) -> {h}");
    cx.close("f_dupfd", c);
    cx.send("via 2000", h, "ping-2000");
    cx.recv("peer", s, 2000);
    cx.send("peer", s, "pong-2000");
    cx.recv("via 2000", h, 2000);
    cx.checkpoint("high_fd", &[s, h]);
    cx.close("f_dupfd", h);
    cx.recv("peer after close(2000)", s, 2000);
    cx.close("f_dupfd", s);

    // A socket moved to 2001 with dup2.
    let (c, s) = cx.pair("dup2_to_2001");
    // SAFETY: as above.
    let r = unsafe { libc::dup2(c, 2001) };
    say!(cx, "dup2(c, 2001) -> {r}");
    cx.close("dup2_to_2001", c);
    cx.fd_state("after close(c)", c);
    cx.send("via 2001", 2001, "ping-2001");
    cx.recv("peer", s, 2000);
    cx.send("peer", s, "pong-2001");
    cx.recv("via 2001", 2001, 2000);
    cx.close("dup2_to_2001", 2001);
    cx.recv("peer after close(2001)", s, 2000);
    cx.close("dup2_to_2001", s);
    cx.checkpoint("high_fds_closed", &[]);
}

fn dup2_onto_socket(cx: &mut Ctx) {
    let (a, a_peer) = cx.pair("dup2_a");
    let (b, b_peer) = cx.pair("dup2_b");
    cx.checkpoint("before_dup2_onto_socket", &[a, a_peer, b, b_peer]);
    // SAFETY: dup2 between our own fds.
    let r = unsafe { libc::dup2(a, b) };
    say!(
        cx,
        "dup2(a, b) -> {}",
        if r == b {
            "b".to_string()
        } else {
            r.to_string()
        }
    );
    // b was the only fd of its connection: that connection is closed now.
    cx.recv("b's old peer", b_peer, 2000);
    cx.send("old peer of b", b_peer, "anyone?");
    cx.send("via b", b, "via-b");
    cx.recv("a's peer", a_peer, 2000);
    cx.send("via a", a, "via-a");
    cx.recv("a's peer", a_peer, 2000);
    cx.close("dup2 onto socket", a);
    cx.send("via b after close(a)", b, "still-b");
    cx.recv("a's peer", a_peer, 2000);
    cx.recv("a's peer again", a_peer, 100);
    cx.checkpoint("dup2_onto_socket", &[a_peer, b, b_peer]);
    cx.close("dup2 onto socket", b);
    cx.recv("a's peer after close(b)", a_peer, 2000);
    cx.close("dup2 onto socket", a_peer);
    cx.close("dup2 onto socket", b_peer);

    // A file dup2'd onto a socket fd: the connection ends, the fd is now /dev/null.
    let (c, s) = cx.pair("dup2_file_onto_socket");
    let path = CString::new("/dev/null").unwrap();
    // SAFETY: open/dup2/write on our own fds and buffers.
    unsafe {
        let n = libc::open(path.as_ptr(), libc::O_WRONLY);
        let r = libc::dup2(n, c);
        say!(
            cx,
            "dup2(/dev/null, c) -> {}",
            if r == c {
                "c".to_string()
            } else {
                r.to_string()
            }
        );
        libc::close(n);
    }
    cx.recv("peer of c", s, 2000);
    // SAFETY: as above.
    let w = unsafe { libc::write(c, b"to-null".as_ptr().cast(), 7) };
    say!(cx, "write to c (now /dev/null) -> {w}");
    cx.checkpoint("file_onto_socket", &[s]);
    cx.close("dup2 file onto socket", c);
    cx.close("dup2 file onto socket", s);
}

fn close_range(cx: &mut Ctx) {
    let mut peers = Vec::new();
    for i in 0..3 {
        let (c, s) = cx.pair(&format!("close_range_{i}"));
        // SAFETY: dup2/close on our own fds.
        unsafe {
            libc::dup2(c, 3000 + i);
            libc::close(c);
        }
        peers.push(s);
    }
    cx.checkpoint(
        "before_close_range",
        &[peers[0], peers[1], peers[2], 3000, 3001, 3002],
    );
    // SAFETY: closes only fds this program made.
    let r = unsafe { libc::close_range(3000, 3002, 0) };
    say!(cx, "close_range(3000, 3002, 0) -> {r}");
    for i in 0..3 {
        cx.fd_state("after close_range", 3000 + i);
        let p = peers[i as usize];
        cx.recv(&format!("peer {i}"), p, 2000);
    }
    cx.checkpoint("after_close_range", &peers);
    for p in peers {
        cx.close("close_range", p);
    }

    // CLOSE_RANGE_CLOEXEC only marks: the socket stays usable.
    let (c, s) = cx.pair("close_range_cloexec");
    // SAFETY: as above.
    let r = unsafe {
        libc::dup2(c, 3010);
        libc::close(c);
        libc::close_range(3010, 3010, libc::CLOSE_RANGE_CLOEXEC as c_int)
    };
    say!(cx, "close_range(3010, 3010, CLOEXEC) -> {r}");
    cx.fd_state("after close_range cloexec", 3010);
    cx.send("via 3010", 3010, "cloexec-still-works");
    cx.recv("peer", s, 2000);
    cx.checkpoint("close_range_cloexec", &[s, 3010]);
    // close_range over a range holding a socket and many unused numbers.
    // SAFETY: as above.
    let r = unsafe { libc::close_range(3005, 4000, 0) };
    say!(cx, "close_range(3005, 4000, 0) -> {r}");
    cx.fd_state("after wide close_range", 3010);
    cx.recv("peer", s, 2000);
    cx.close("close_range", s);
}

fn fionbio(cx: &mut Ctx) {
    let (c, s) = cx.pair("fionbio");
    let mut on: c_int = 1;
    // SAFETY: ioctl/fcntl on our own fd with a valid int pointer.
    let r = unsafe { libc::ioctl(c, libc::FIONBIO, &mut on as *mut c_int) };
    let fl = unsafe { libc::fcntl(c, libc::F_GETFL) };
    say!(
        cx,
        "ioctl(FIONBIO, 1) -> {r}, O_NONBLOCK={}",
        fl & libc::O_NONBLOCK != 0
    );
    let mut buf = [0u8; 16];
    // SAFETY: valid buffer.
    let n = unsafe { libc::recv(c, buf.as_mut_ptr().cast(), buf.len(), 0) };
    say!(
        cx,
        "recv on empty nonblocking socket -> {}",
        if n < 0 { ename(errno()) } else { n.to_string() }
    );
    // SAFETY: valid buffer.
    let n = unsafe { libc::read(c, buf.as_mut_ptr().cast(), buf.len()) };
    say!(
        cx,
        "read on empty nonblocking socket -> {}",
        if n < 0 { ename(errno()) } else { n.to_string() }
    );
    let mut off: c_int = 0;
    // SAFETY: as above.
    let r = unsafe { libc::ioctl(c, libc::FIONBIO, &mut off as *mut c_int) };
    let fl = unsafe { libc::fcntl(c, libc::F_GETFL) };
    say!(
        cx,
        "ioctl(FIONBIO, 0) -> {r}, O_NONBLOCK={}",
        fl & libc::O_NONBLOCK != 0
    );
    cx.send("peer", s, "late");
    // Blocking recv (no poll first): must wait for and return the data.
    // SAFETY: valid buffer.
    let n = unsafe { libc::recv(c, buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n > 0 {
        cx.received += n as u64;
    }
    say!(
        cx,
        "blocking recv -> {:?}",
        if n > 0 {
            String::from_utf8_lossy(&buf[..n as usize]).into_owned()
        } else {
            ename(errno())
        }
    );
    // FIONREAD on the peer after a send.
    cx.send("c", c, "12345");
    let mut avail: c_int = -1;
    // SAFETY: valid int pointer; wait for the bytes to arrive first.
    unsafe {
        let mut p = libc::pollfd {
            fd: s,
            events: libc::POLLIN,
            revents: 0,
        };
        libc::poll(&mut p, 1, 2000);
        libc::ioctl(s, libc::FIONREAD, &mut avail as *mut c_int);
    }
    say!(cx, "FIONREAD on peer -> {avail}");
    cx.recv("peer", s, 2000);
    cx.close("fionbio", c);
    cx.close("fionbio", s);
}

fn dup_shared(cx: &mut Ctx) {
    let (c, s) = cx.pair("dup_shared");
    // SAFETY: dup/fcntl on our own fds.
    let d = unsafe { libc::dup(c) };
    say!(cx, "dup(c) -> {}", if d > c { "higher fd" } else { "?" });
    cx.close("dup_shared", c);
    cx.send("via dup", d, "after-close-of-original");
    cx.recv("peer", s, 2000);
    cx.recv("peer (expect no eof)", s, 100);
    cx.checkpoint("dup_shared", &[s, d]);
    let d2 = unsafe { libc::fcntl(d, libc::F_DUPFD_CLOEXEC, 0) };
    say!(
        cx,
        "F_DUPFD_CLOEXEC(d, 0) -> {}",
        if d2 >= 0 { "ok" } else { "failed" }
    );
    cx.fd_state("F_DUPFD_CLOEXEC copy", d2);
    cx.close("dup_shared", d);
    cx.send("via second dup", d2, "last-fd");
    cx.recv("peer", s, 2000);
    cx.recv("peer (expect no eof)", s, 100);
    cx.close("dup_shared", d2);
    cx.recv("peer after last close", s, 2000);
    cx.send("peer to closed connection", s, "x");
    cx.close("dup_shared", s);
}

fn stdio_on_socket(cx: &mut Ctx) {
    let (c, s) = cx.pair("stdio_fdopen");
    let msg = "via-stdio\n";
    let mode = CString::new("w").unwrap();
    let text = CString::new(msg).unwrap();
    // SAFETY: c is our socket; the FILE takes it over and fclose closes it.
    let r = unsafe {
        let f = libc::fdopen(c, mode.as_ptr());
        assert!(!f.is_null(), "fdopen");
        libc::fputs(text.as_ptr(), f);
        libc::fclose(f)
    };
    say!(cx, "fdopen/fputs/fclose -> {r}");
    // The bytes did go out, but through glibc's internal write(), which no LD_PRELOAD shim
    // can see: they are left out of the total the shim's tx counter is checked against.
    say!(cx, "stdio wrote {} bytes outside the hooks", msg.len());
    cx.recv("peer", s, 2000);
    cx.recv("peer after fclose", s, 2000);
    cx.fd_state("after fclose", c);
    // (No checkpoint here: taking one opens and closes a file, which would reuse the number.)
    // The number is free again: a regular file gets it, and is no socket.
    let path = CString::new("/dev/zero").unwrap();
    // SAFETY: open/read/close on our own fd and buffer.
    unsafe {
        let f = libc::open(path.as_ptr(), libc::O_RDONLY);
        say!(cx, "open(/dev/zero) reuses the socket's number: {}", f == c);
        let mut buf = [0u8; 100];
        let n = libc::read(f, buf.as_mut_ptr().cast(), buf.len());
        say!(cx, "read(/dev/zero) -> {n}");
        cx.checkpoint("file_on_old_number", &[s]);
        libc::close(f);
    }
    cx.close("stdio", s);
}

fn main() -> ExitCode {
    let stdio = std::env::args().nth(1).as_deref() == Some("stdio");
    let mut cx = match Ctx::new() {
        Ok(cx) => cx,
        Err(e) => {
            eprintln!("fd_edge: {e}");
            return ExitCode::FAILURE;
        }
    };
    if stdio {
        stdio_on_socket(&mut cx);
    } else {
        high_fds(&mut cx);
        dup2_onto_socket(&mut cx);
        close_range(&mut cx);
        fionbio(&mut cx);
        dup_shared(&mut cx);
    }
    let l = cx.listener;
    cx.close("listener", l);
    cx.checkpoint("end", &[]);
    let (sent, received) = (cx.sent, cx.received);
    say!(cx, "total sent {sent} received {received}");
    say!(cx, "done");
    ExitCode::SUCCESS
}
