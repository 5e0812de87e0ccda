//! Readiness semantics of one TCP connection, printed deterministically so that a run under
//! the shim (RDMA, socketpair-driven readiness) can be compared line for line with a run on
//! kernel TCP (tests/rdma/shim_matrix.sh, cell epoll_modes).
//!
//! ```text
//! epoll_modes ADDR PORT      # listens on ADDR:PORT, connects to it, runs every section
//! ```
//!
//! One process, one thread, one connection (client end `c`, accepted end `s`):
//! - `connect`: a nonblocking socket registered for EPOLLOUT *before* `connect()`; the
//!   connect returns EINPROGRESS (or 0) and completion shows as EPOLLOUT with SO_ERROR 0;
//! - `lt`: level-triggered EPOLLIN keeps reporting while bytes remain unread;
//! - `et`: EPOLLET gives one event per new message after a full drain, none while idle;
//! - `oneshot`: EPOLLONESHOT gives one event, then none until EPOLL_CTL_MOD re-arms it;
//! - `poll`, `select`: readability with poll(2) and select(2), both ways;
//! - `out`: the writer fills the connection until EAGAIN (EPOLLOUT|EPOLLET registered), the
//!   reader drains everything, and the writer gets an EPOLLOUT edge;
//! - `rdhup`: shutdown(SHUT_WR) on one end gives EPOLLIN|EPOLLRDHUP on the other, reads
//!   return 0; then the other end's close gives the first end EOF.
//!
//! "Expect an event" waits up to 10 s (the slow guest); "expect none" waits 300 ms.
//! Exit status 0 when every section ran (the output says what was seen; the test compares
//! it with a kernel TCP run).

use std::io::{self, Write};
use std::process::ExitCode;

use libc::{c_int, c_void};

const LONG_MS: c_int = 10_000;
const SHORT_MS: c_int = 300;

fn err(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn cvt(rc: c_int, what: &str) -> io::Result<c_int> {
    if rc < 0 {
        Err(err(what))
    } else {
        Ok(rc)
    }
}

/// Waits made so far (see `Ep::wait`).
static WAITS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn mask_names(ev: u32) -> String {
    let bits: [(u32, &str); 6] = [
        (libc::EPOLLIN as u32, "IN"),
        (libc::EPOLLPRI as u32, "PRI"),
        (libc::EPOLLOUT as u32, "OUT"),
        (libc::EPOLLERR as u32, "ERR"),
        (libc::EPOLLHUP as u32, "HUP"),
        (libc::EPOLLRDHUP as u32, "RDHUP"),
    ];
    let mut out: Vec<&str> = bits
        .iter()
        .filter(|(b, _)| ev & b != 0)
        .map(|(_, n)| *n)
        .collect();
    let known = bits.iter().fold(0, |a, (b, _)| a | b);
    let other = ev & !known;
    let extra;
    if other != 0 {
        extra = format!("0x{other:x}");
        out.push(&extra);
    }
    if out.is_empty() {
        "-".into()
    } else {
        out.join("|")
    }
}

struct Ep(c_int);

impl Ep {
    fn new() -> io::Result<Ep> {
        Ok(Ep(cvt(
            unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) },
            "epoll_create1",
        )?))
    }
    fn ctl(&self, op: c_int, fd: c_int, events: u32) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events,
            u64: fd as u64,
        };
        cvt(
            unsafe { libc::epoll_ctl(self.0, op, fd, &mut ev) },
            "epoll_ctl",
        )?;
        Ok(())
    }
    /// Waits once; returns a description "n=N MASK" (MASK of the first event). Every other
    /// wait goes through `epoll_pwait2` (a timespec timeout), so that both calls are covered.
    fn wait(&self, ms: c_int) -> io::Result<String> {
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 4];
        let pwait2 = WAITS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 2 == 1;
        let ts = libc::timespec {
            tv_sec: libc::time_t::from(ms / 1000),
            tv_nsec: libc::c_long::from(ms % 1000) * 1_000_000,
        };
        let n = loop {
            let n = if pwait2 {
                unsafe { libc::epoll_pwait2(self.0, evs.as_mut_ptr(), 4, &ts, std::ptr::null()) }
            } else {
                unsafe { libc::epoll_wait(self.0, evs.as_mut_ptr(), 4, ms) }
            };
            if n < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            break cvt(n, "epoll_wait")?;
        };
        if n == 0 {
            return Ok("n=0".into());
        }
        let ev = evs[0].events;
        Ok(format!("n={n} {}", mask_names(ev)))
    }
}

impl Drop for Ep {
    fn drop(&mut self) {
        unsafe { libc::close(self.0) };
    }
}

fn set_nonblock(fd: c_int, on: bool) -> io::Result<()> {
    let fl = cvt(unsafe { libc::fcntl(fd, libc::F_GETFL) }, "F_GETFL")?;
    let fl = if on {
        fl | libc::O_NONBLOCK
    } else {
        fl & !libc::O_NONBLOCK
    };
    cvt(unsafe { libc::fcntl(fd, libc::F_SETFL, fl) }, "F_SETFL")?;
    Ok(())
}

fn send_all(fd: c_int, data: &[u8]) -> io::Result<()> {
    let mut off = 0;
    while off < data.len() {
        let n = unsafe {
            libc::send(
                fd,
                data[off..].as_ptr() as *const c_void,
                data.len() - off,
                libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            if e.raw_os_error() == Some(libc::EAGAIN) {
                poll1(fd, libc::POLLOUT, LONG_MS)?;
                continue;
            }
            return Err(err("send"));
        }
        off += n as usize;
    }
    Ok(())
}

/// One nonblocking read: Ok(Some(n)) bytes (0 = EOF), Ok(None) = EAGAIN.
fn read_nb(fd: c_int, buf: &mut [u8]) -> io::Result<Option<usize>> {
    loop {
        let n = unsafe {
            libc::recv(
                fd,
                buf.as_mut_ptr() as *mut c_void,
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n >= 0 {
            return Ok(Some(n as usize));
        }
        match io::Error::last_os_error().raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) => return Ok(None),
            _ => return Err(err("recv")),
        }
    }
}

/// Reads until EAGAIN; returns the bytes read.
fn drain(fd: c_int) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 65536];
    while let Some(n) = read_nb(fd, &mut buf)? {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    Ok(out)
}

/// Reads exactly `len` bytes (waiting with poll as needed).
fn read_exact(fd: c_int, len: usize) -> io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(len);
    let mut buf = vec![0u8; 65536];
    while out.len() < len {
        let want = (len - out.len()).min(buf.len());
        match read_nb(fd, &mut buf[..want])? {
            Some(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "EOF in read_exact",
                ))
            }
            Some(n) => out.extend_from_slice(&buf[..n]),
            None => {
                poll1(fd, libc::POLLIN, LONG_MS)?;
            }
        }
    }
    Ok(out)
}

/// poll(2) on one fd; returns the revents (0 on timeout).
fn poll1(fd: c_int, events: i16, ms: c_int) -> io::Result<i16> {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    loop {
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        if n < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        cvt(n, "poll")?;
        return Ok(if n == 0 { 0 } else { p.revents });
    }
}

fn poll_names(r: i16) -> String {
    let bits: [(i16, &str); 5] = [
        (libc::POLLIN, "IN"),
        (libc::POLLOUT, "OUT"),
        (libc::POLLERR, "ERR"),
        (libc::POLLHUP, "HUP"),
        (libc::POLLRDHUP, "RDHUP"),
    ];
    let v: Vec<&str> = bits
        .iter()
        .filter(|(b, _)| r & b != 0)
        .map(|(_, n)| *n)
        .collect();
    if v.is_empty() {
        "-".into()
    } else {
        v.join("|")
    }
}

/// select(2) readability of one fd with a timeout in ms.
fn select_readable(fd: c_int, ms: i64) -> io::Result<bool> {
    assert!((fd as usize) < libc::FD_SETSIZE);
    unsafe {
        let mut set: libc::fd_set = std::mem::zeroed();
        libc::FD_ZERO(&mut set);
        libc::FD_SET(fd, &mut set);
        let mut tv = libc::timeval {
            tv_sec: ms / 1000,
            tv_usec: (ms % 1000) * 1000,
        };
        let n = cvt(
            libc::select(
                fd + 1,
                &mut set,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut tv,
            ),
            "select",
        )?;
        Ok(n > 0 && libc::FD_ISSET(fd, &set))
    }
}

fn so_error(fd: c_int) -> io::Result<c_int> {
    let mut v: c_int = -1;
    let mut len = std::mem::size_of::<c_int>() as libc::socklen_t;
    cvt(
        unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_ERROR,
                &mut v as *mut c_int as *mut c_void,
                &mut len,
            )
        },
        "getsockopt(SO_ERROR)",
    )?;
    Ok(v)
}

fn sockaddr(addr: std::net::Ipv4Addr, port: u16) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(addr).to_be(),
        },
        sin_zero: [0; 8],
    }
}

fn run(addr: std::net::Ipv4Addr, port: u16) -> io::Result<()> {
    let out = io::stdout();
    let mut o = out.lock();
    macro_rules! say {
        ($($t:tt)*) => {{ writeln!(o, $($t)*)?; o.flush()?; }};
    }

    // Listener (blocking accept).
    let lfd = cvt(
        unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) },
        "socket",
    )?;
    let one: c_int = 1;
    unsafe {
        libc::setsockopt(
            lfd,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            &one as *const c_int as *const c_void,
            4,
        );
    }
    let sa = sockaddr(addr, port);
    let salen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    cvt(
        unsafe { libc::bind(lfd, &sa as *const _ as *const libc::sockaddr, salen) },
        "bind",
    )?;
    cvt(unsafe { libc::listen(lfd, 16) }, "listen")?;
    say!("listen ok");

    // --- connect: registered for EPOLLOUT before connect() ---
    let c = cvt(
        unsafe {
            libc::socket(
                libc::AF_INET,
                libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        },
        "socket",
    )?;
    let ep = Ep::new()?;
    ep.ctl(libc::EPOLL_CTL_ADD, c, libc::EPOLLOUT as u32)?;
    let rc = unsafe { libc::connect(c, &sa as *const _ as *const libc::sockaddr, salen) };
    let how = if rc == 0 {
        "0".to_string()
    } else {
        match io::Error::last_os_error().raw_os_error() {
            Some(libc::EINPROGRESS) => "EINPROGRESS".to_string(),
            _ => return Err(err("connect")),
        }
    };
    say!("connect: returned {how}");
    say!("connect: wait {}", ep.wait(LONG_MS)?);
    say!("connect: SO_ERROR {}", so_error(c)?);
    // The registration must still be the program's fd's: DEL succeeds, and a fresh wait on
    // the same epoll set reports nothing for it afterwards.
    match ep.ctl(libc::EPOLL_CTL_DEL, c, 0) {
        Ok(()) => say!("connect: EPOLL_CTL_DEL ok"),
        Err(e) => say!("connect: EPOLL_CTL_DEL failed: {}", e.kind()),
    }
    say!("connect: after DEL {}", ep.wait(SHORT_MS)?);
    drop(ep);
    let s = cvt(
        unsafe {
            libc::accept4(
                lfd,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        },
        "accept4",
    )?;
    set_nonblock(s, true)?;
    say!("accept ok");
    // Round trip, so that both ends are known to be fully up before the timing-sensitive parts.
    send_all(c, b"hello")?;
    let got = read_exact(s, 5)?;
    say!("hello: server got {:?}", String::from_utf8_lossy(&got));

    // --- level-triggered ---
    {
        let ep = Ep::new()?;
        ep.ctl(libc::EPOLL_CTL_ADD, s, libc::EPOLLIN as u32)?;
        say!("lt: idle {}", ep.wait(SHORT_MS)?);
        send_all(c, &[b'L'; 100])?;
        say!("lt: after 100 bytes {}", ep.wait(LONG_MS)?);
        say!("lt: again without reading {}", ep.wait(SHORT_MS)?);
        let part = read_exact(s, 50)?;
        say!("lt: read {}", part.len());
        say!("lt: after partial read {}", ep.wait(SHORT_MS)?);
        let rest = read_exact(s, 50)?;
        say!("lt: read {}", rest.len());
        say!("lt: after full read {}", ep.wait(SHORT_MS)?);
        say!("lt: extra bytes {}", drain(s)?.len());
    }

    // --- edge-triggered ---
    {
        let ep = Ep::new()?;
        ep.ctl(
            libc::EPOLL_CTL_ADD,
            s,
            (libc::EPOLLIN | libc::EPOLLET) as u32,
        )?;
        say!("et: idle {}", ep.wait(SHORT_MS)?);
        for i in 1..=3 {
            let msg = format!("message {i}");
            send_all(c, msg.as_bytes())?;
            say!("et: msg {i} {}", ep.wait(LONG_MS)?);
            say!("et: msg {i} no new data {}", ep.wait(SHORT_MS)?);
            // Read exactly the message (it may arrive in pieces), then drain to EAGAIN.
            let got = read_exact(s, msg.len())?;
            let extra = drain(s)?;
            say!(
                "et: msg {i} read {:?} extra {}",
                String::from_utf8_lossy(&got),
                extra.len()
            );
            say!("et: msg {i} after drain {}", ep.wait(SHORT_MS)?);
        }
    }

    // --- one-shot ---
    {
        let ep = Ep::new()?;
        let ev = (libc::EPOLLIN | libc::EPOLLONESHOT) as u32;
        ep.ctl(libc::EPOLL_CTL_ADD, s, ev)?;
        send_all(c, b"one")?;
        say!("oneshot: first {}", ep.wait(LONG_MS)?);
        say!("oneshot: unread, disarmed {}", ep.wait(SHORT_MS)?);
        send_all(c, b"two")?;
        // Let "two" arrive: the data must not re-arm it.
        std::thread::sleep(std::time::Duration::from_millis(500));
        say!("oneshot: more data, disarmed {}", ep.wait(SHORT_MS)?);
        ep.ctl(libc::EPOLL_CTL_MOD, s, ev)?;
        say!("oneshot: after MOD {}", ep.wait(LONG_MS)?);
        say!("oneshot: after MOD again {}", ep.wait(SHORT_MS)?);
        let got = read_exact(s, 6)?;
        say!(
            "oneshot: read {:?} extra {}",
            String::from_utf8_lossy(&got),
            drain(s)?.len()
        );
        ep.ctl(libc::EPOLL_CTL_MOD, s, ev)?;
        say!("oneshot: re-armed, nothing pending {}", ep.wait(SHORT_MS)?);
    }

    // --- poll(2) and select(2) ---
    {
        say!(
            "poll: idle {}",
            poll_names(poll1(s, libc::POLLIN, SHORT_MS)?)
        );
        say!(
            "poll: writable {}",
            poll_names(poll1(c, libc::POLLOUT, LONG_MS)?)
        );
        send_all(c, b"poll!")?;
        say!(
            "poll: after data {}",
            poll_names(poll1(s, libc::POLLIN, LONG_MS)?)
        );
        say!(
            "poll: read {:?}",
            String::from_utf8_lossy(&read_exact(s, 5)?)
        );
        say!(
            "poll: drained {}",
            poll_names(poll1(s, libc::POLLIN, SHORT_MS)?)
        );
        say!("select: idle {}", select_readable(s, SHORT_MS as i64)?);
        send_all(s, b"select")?;
        say!(
            "select: after data (other way) {}",
            select_readable(c, LONG_MS as i64)?
        );
        say!(
            "select: read {:?}",
            String::from_utf8_lossy(&read_exact(c, 6)?)
        );
        say!("select: drained {}", select_readable(c, SHORT_MS as i64)?);
    }

    // --- EPOLLOUT edge after the peer drains a full connection ---
    {
        let ep = Ep::new()?;
        ep.ctl(
            libc::EPOLL_CTL_ADD,
            c,
            (libc::EPOLLOUT | libc::EPOLLET) as u32,
        )?;
        say!("out: initial {}", ep.wait(LONG_MS)?);
        let chunk = vec![b'x'; 65536];
        let mut sent: usize = 0;
        let mut eagain = false;
        // Fill until EAGAIN (bounded: 256 MiB would be far beyond any buffer).
        while sent < (256 << 20) {
            let n = unsafe {
                libc::send(
                    c,
                    chunk.as_ptr() as *const c_void,
                    chunk.len(),
                    libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                match io::Error::last_os_error().raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::EAGAIN) => {
                        eagain = true;
                        break;
                    }
                    _ => return Err(err("send (fill)")),
                }
            }
            sent += n as usize;
        }
        say!("out: filled until EAGAIN {eagain}");
        // The initial edge was consumed; a full connection gives nothing.
        say!("out: while full {}", ep.wait(SHORT_MS)?);
        // Fill again to EAGAIN (the kernel may take a little more by now): an edge-triggered
        // writer now waits for the next EPOLLOUT edge, which must come once the reader drains.
        let mut eagain2 = false;
        while sent < (512 << 20) {
            let n = unsafe {
                libc::send(
                    c,
                    chunk.as_ptr() as *const c_void,
                    chunk.len(),
                    libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                match io::Error::last_os_error().raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::EAGAIN) => {
                        eagain2 = true;
                        break;
                    }
                    _ => return Err(err("send (refill)")),
                }
            }
            sent += n as usize;
        }
        say!("out: refilled until EAGAIN {eagain2}");
        let got = read_exact(s, sent)?;
        say!(
            "out: reader drained all {}",
            got.len() == sent && got.iter().all(|&b| b == b'x')
        );
        say!("out: after drain {}", ep.wait(LONG_MS)?);
        ep.ctl(libc::EPOLL_CTL_DEL, c, 0)?;
        // Nothing else is in flight.
        say!("out: extra {}", drain(s)?.len());
    }

    // --- EPOLLRDHUP: client shuts down its write side ---
    {
        let ep = Ep::new()?;
        ep.ctl(
            libc::EPOLL_CTL_ADD,
            s,
            (libc::EPOLLIN | libc::EPOLLRDHUP) as u32,
        )?;
        say!("rdhup: idle {}", ep.wait(SHORT_MS)?);
        send_all(c, b"last")?;
        cvt(unsafe { libc::shutdown(c, libc::SHUT_WR) }, "shutdown")?;
        // Data and FIN may be seen in one or two wakeups: read until EOF first.
        let got = read_exact(s, 4)?;
        say!("rdhup: read {:?}", String::from_utf8_lossy(&got));
        say!("rdhup: after shutdown {}", ep.wait(LONG_MS)?);
        let mut b = [0u8; 16];
        say!("rdhup: read returns {:?}", read_nb(s, &mut b)?);
        say!(
            "rdhup: poll {}",
            poll_names(poll1(s, libc::POLLIN | libc::POLLRDHUP, LONG_MS)?)
        );
        // The server can still send on its side; then it closes.
        send_all(s, b"reply")?;
        let got = read_exact(c, 5)?;
        say!("rdhup: client got {:?}", String::from_utf8_lossy(&got));
        let ep2 = Ep::new()?;
        ep2.ctl(
            libc::EPOLL_CTL_ADD,
            c,
            (libc::EPOLLIN | libc::EPOLLRDHUP) as u32,
        )?;
        unsafe { libc::close(s) };
        say!("close: client sees {}", ep2.wait(LONG_MS)?);
        say!("close: client read returns {:?}", read_nb(c, &mut b)?);
        unsafe { libc::close(c) };
    }
    unsafe { libc::close(lfd) };
    say!("done");
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (addr, port) = match args.as_slice() {
        [a, p] => match (a.parse(), p.parse()) {
            (Ok(a), Ok(p)) => (a, p),
            _ => {
                eprintln!("usage: epoll_modes IPV4ADDR PORT");
                return ExitCode::from(2);
            }
        },
        _ => {
            eprintln!("usage: epoll_modes IPV4ADDR PORT");
            return ExitCode::from(2);
        }
    };
    match run(addr, port) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("epoll_modes: {e}");
            ExitCode::FAILURE
        }
    }
}
