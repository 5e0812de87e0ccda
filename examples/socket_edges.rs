//! Socket edge cases around shutdown, close, signals and `_exit`, printed deterministically so
//! that a run under the shim (both ends on RDMA) can be compared line for line with a run on
//! kernel TCP (tests/rdma/shim_matrix.sh, cell socket_edges; issue #11).
//!
//! ```text
//! socket_edges ADDR PORT [SECTION...]   # listens on ADDR:PORT; runs the sections (default all)
//! socket_edges exit-child ADDR PORT     # internal: the child of section exit_in_handler
//! ```
//!
//! Every section uses a fresh connection pair (client end `c`, accepted end `s`, both in this
//! process; exit_in_handler's client is a child process):
//! - `shut_rd`: bytes queued before `shutdown(c, SHUT_RD)` are still returned, then recv
//!   returns 0 (does not block); poll shows IN|OUT|RDHUP; bytes the peer sends afterwards
//!   are still delivered; `c` can still send;
//! - `shut_rd_wakes_reader`: a thread blocked in recv(c) wakes with 0 when the main thread
//!   calls `shutdown(c, SHUT_RD)`;
//! - `shut_rdwr`: poll shows IN|OUT|HUP|RDHUP, recv returns 0, send fails with EPIPE, the
//!   peer reads EOF;
//! - `close_while_blocked`: `close(c)` while a thread is blocked in recv(c) does not interrupt
//!   that recv: it returns the byte the peer sends 300 ms later; then the peer reads EOF;
//! - `raw_close`: `close` made with `syscall(SYS_close)` (libuv's way), then with
//!   `syscall(SYS_close_range)`: the peer reads EOF, and a file opened next (the lowest free
//!   fd: the closed one's number) reads back what was written to it;
//! - `eintr`: a blocked recv interrupted by SIGALRM whose handler lacks SA_RESTART returns
//!   EINTR; with SA_RESTART it keeps waiting and returns the data sent 500 ms after the signal;
//! - `handler_write`: the main thread is blocked in recv(c); a SIGALRM handler (SA_RESTART)
//!   sends one byte 'H' on `c`. Either the send succeeds and the peer gets 'H' (kernel TCP),
//!   or it fails with EAGAIN and the peer gets nothing (the shim: I/O from a handler that
//!   interrupted the shim); both print `consistent`. A send that "succeeds" while the byte
//!   never arrives prints `LOST`. (The send's own result goes to stderr only.)
//! - `exit_in_handler`: a child process (this program, mode exit-child, so under the same
//!   LD_PRELOAD) connects, sends 8 MiB of a known pattern with blocking sends, then raises
//!   SIGUSR1 whose handler calls `_exit(0)`: every byte must arrive, then EOF.
//!
//! Every wait is bounded. A recv that should return but does not is released after a few
//! seconds by the peer sending "rescue" (the output then says so and differs from kernel
//! TCP's); a watchdog ends the process (status 3) if a section takes more than 90 s.
//! Exit status 0 when every section ran without an internal failure (the output says what was
//! seen; the test compares it with a kernel TCP run); 1 when a section failed or timed out.

use std::io::{self, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicIsize, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use libc::{c_int, c_void};

/// "Expect something" bound (the slow guest), ms.
const LONG_MS: c_int = 10_000;
/// A recv that should return is released by the peer after this long, ms.
const RESCUE_MS: u64 = 5_000;
/// Watchdog bound per section, s.
const SECTION_S: u64 = 90;
/// Bytes sent by exit_in_handler's child.
const EXIT_BYTES: usize = 8 << 20;

const SO: Ordering = Ordering::SeqCst;

static FAILED: AtomicBool = AtomicBool::new(false);

// ---- output and failure ------------------------------------------------------------------

fn say(line: &str) {
    let out = io::stdout();
    let mut o = out.lock();
    let _ = writeln!(o, "{line}");
    let _ = o.flush();
}

/// A note that is not part of the compared output (stderr).
fn note(line: &str) {
    eprintln!("# {line}");
}

/// An internal failure of a section: printed on stdout (so the diff shows it) and stderr.
fn fail(section: &str, why: &str) {
    FAILED.store(true, SO);
    say(&format!("{section}: FAILED: {why}"));
    eprintln!("socket_edges: {section}: {why}");
}

// ---- watchdog ----------------------------------------------------------------------------

static T0: Mutex<Option<Instant>> = Mutex::new(None);
/// Deadline in ms since T0; 0 = disarmed.
static DEADLINE_MS: AtomicU64 = AtomicU64::new(0);
static SECTION: Mutex<String> = Mutex::new(String::new());

fn now_ms() -> u64 {
    let t0 = *T0.lock().unwrap();
    t0.map_or(0, |t| t.elapsed().as_millis() as u64)
}

fn arm(section: &str) {
    *SECTION.lock().unwrap() = section.to_string();
    DEADLINE_MS.store(now_ms() + SECTION_S * 1000, SO);
}

fn start_watchdog() {
    *T0.lock().unwrap() = Some(Instant::now());
    spawn_quiet(|| loop {
        thread::sleep(Duration::from_millis(100));
        let d = DEADLINE_MS.load(SO);
        if d != 0 && now_ms() > d {
            let s = SECTION.lock().map(|s| s.clone()).unwrap_or_default();
            let msg = format!("{s}: FAILED: TIMEOUT (watchdog, {SECTION_S} s)\n");
            unsafe {
                libc::write(1, msg.as_ptr() as *const c_void, msg.len());
                libc::write(2, msg.as_ptr() as *const c_void, msg.len());
                libc::_exit(3);
            }
        }
    });
}

/// Spawns a thread with SIGALRM and SIGUSR1 blocked, so that the signals the sections raise
/// reach the main thread.
fn spawn_quiet<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> thread::JoinHandle<T> {
    thread::spawn(move || {
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGALRM);
            libc::sigaddset(&mut set, libc::SIGUSR1);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        }
        f()
    })
}

// ---- socket helpers ----------------------------------------------------------------------

fn errno() -> c_int {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn errno_name(e: c_int) -> String {
    match e {
        libc::EINTR => "EINTR".into(),
        libc::EAGAIN => "EAGAIN".into(),
        libc::EBADF => "EBADF".into(),
        libc::EPIPE => "EPIPE".into(),
        libc::ECONNRESET => "ECONNRESET".into(),
        libc::ENOTCONN => "ENOTCONN".into(),
        libc::ENOTSOCK => "ENOTSOCK".into(),
        libc::EINVAL => "EINVAL".into(),
        libc::ETIMEDOUT => "ETIMEDOUT".into(),
        _ => format!("errno {e}"),
    }
}

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

fn timeout(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, format!("timed out: {what}"))
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
        if n < 0 && errno() == libc::EINTR {
            continue;
        }
        cvt(n, "poll")?;
        return Ok(if n == 0 { 0 } else { p.revents });
    }
}

fn poll_names(r: i16) -> String {
    let bits: [(i16, &str); 6] = [
        (libc::POLLIN, "IN"),
        (libc::POLLOUT, "OUT"),
        (libc::POLLERR, "ERR"),
        (libc::POLLHUP, "HUP"),
        (libc::POLLNVAL, "NVAL"),
        (libc::POLLRDHUP, "RDHUP"),
    ];
    let v: Vec<&str> = bits
        .iter()
        .filter(|(b, _)| r & b != 0)
        .map(|(_, n)| *n)
        .collect();
    let known = bits.iter().fold(0, |a, (b, _)| a | b);
    let mut s = if v.is_empty() {
        "-".into()
    } else {
        v.join("|")
    };
    let other = r & !known;
    if other != 0 {
        s.push_str(&format!("|0x{other:x}"));
    }
    format!("{s} ({r})")
}

/// All poll flags of `fd` right now (IN|OUT|RDHUP requested; ERR/HUP/NVAL always reported).
fn poll_now(fd: c_int) -> io::Result<String> {
    Ok(poll_names(poll1(
        fd,
        libc::POLLIN | libc::POLLOUT | libc::POLLRDHUP,
        0,
    )?))
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
            match errno() {
                libc::EINTR => continue,
                libc::EAGAIN => {
                    if poll1(fd, libc::POLLOUT, LONG_MS)? == 0 {
                        return Err(timeout("send: not writable"));
                    }
                    continue;
                }
                _ => return Err(err("send")),
            }
        }
        off += n as usize;
    }
    Ok(())
}

/// One recv(2): (return value, errno, bytes).
fn recv_once(fd: c_int, flags: c_int) -> (isize, c_int, Vec<u8>) {
    let mut buf = [0u8; 256];
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr() as *mut c_void, buf.len(), flags) };
    let e = if n < 0 { errno() } else { 0 };
    (n, e, buf[..n.max(0) as usize].to_vec())
}

fn describe(n: isize, e: c_int, data: &[u8]) -> String {
    if n > 0 {
        format!("{n} bytes {:?}", String::from_utf8_lossy(data))
    } else if n == 0 {
        "0 (EOF)".into()
    } else {
        format!("-1 {}", errno_name(e))
    }
}

/// Reads exactly `len` bytes, each wait bounded by LONG_MS.
fn read_exact(fd: c_int, len: usize) -> io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        if poll1(fd, libc::POLLIN, LONG_MS)? == 0 {
            return Err(timeout("read_exact: nothing to read"));
        }
        let (n, e, data) = recv_once(fd, libc::MSG_DONTWAIT);
        match n {
            0 => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "EOF")),
            n if n > 0 => out.extend_from_slice(&data[..(len - out.len()).min(data.len())]),
            _ if e == libc::EINTR || e == libc::EAGAIN => {}
            _ => return Err(io::Error::from_raw_os_error(e)),
        }
    }
    Ok(out)
}

/// Waits (bounded) until `len` bytes can be read from `fd` (MSG_PEEK), so that a later
/// operation finds them queued.
fn wait_queued(fd: c_int, len: usize) -> io::Result<()> {
    let end = Instant::now() + Duration::from_millis(LONG_MS as u64);
    loop {
        let (n, _, _) = recv_once(fd, libc::MSG_PEEK | libc::MSG_DONTWAIT);
        if n >= len as isize {
            return Ok(());
        }
        if Instant::now() > end {
            return Err(timeout("bytes never queued"));
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// A blocking recv(fd) (EINTR not retried). If it has not returned after `RESCUE_MS`, the
/// peer sends "rescue" so that it does; the description then ends with "(rescued)".
fn recv_rescued(fd: c_int, peer: c_int) -> String {
    let (tx, rx) = mpsc::channel::<()>();
    let rescuer = spawn_quiet(move || {
        if rx.recv_timeout(Duration::from_millis(RESCUE_MS)) == Err(mpsc::RecvTimeoutError::Timeout)
        {
            let _ = send_all(peer, b"rescue");
            return true;
        }
        false
    });
    let (n, e, data) = recv_once(fd, 0);
    let _ = tx.send(());
    let rescued = rescuer.join().unwrap_or(false);
    let d = describe(n, e, &data);
    if rescued {
        format!("{d} (rescued: it blocked)")
    } else {
        d
    }
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

const SALEN: libc::socklen_t = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;

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

fn close(fd: c_int) {
    unsafe { libc::close(fd) };
}

fn shutdown(fd: c_int, how: c_int) -> String {
    let rc = unsafe { libc::shutdown(fd, how) };
    if rc == 0 {
        "0".into()
    } else {
        format!("-1 {}", errno_name(errno()))
    }
}

fn accept_bounded(lfd: c_int, ms: c_int) -> io::Result<c_int> {
    if poll1(lfd, libc::POLLIN, ms)? == 0 {
        return Err(timeout("accept: no connection"));
    }
    cvt(
        unsafe {
            libc::accept4(
                lfd,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        },
        "accept4",
    )
}

struct Ctx {
    lfd: c_int,
    sa: libc::sockaddr_in,
}

/// A fresh connection pair (both blocking), checked with a round trip each way.
fn pair(ctx: &Ctx) -> io::Result<(c_int, c_int)> {
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
    let rc = unsafe { libc::connect(c, &ctx.sa as *const _ as *const libc::sockaddr, SALEN) };
    if rc < 0 && errno() != libc::EINPROGRESS {
        let e = err("connect");
        close(c);
        return Err(e);
    }
    if poll1(c, libc::POLLOUT, 2 * LONG_MS)? == 0 {
        close(c);
        return Err(timeout("connect"));
    }
    let e = so_error(c)?;
    if e != 0 {
        close(c);
        return Err(io::Error::from_raw_os_error(e));
    }
    let s = accept_bounded(ctx.lfd, 2 * LONG_MS)?;
    set_nonblock(c, false)?;
    send_all(c, b"hi")?;
    read_exact(s, 2)?;
    send_all(s, b"ho")?;
    read_exact(c, 2)?;
    Ok((c, s))
}

// ---- signals -----------------------------------------------------------------------------

fn install(sig: c_int, handler: extern "C" fn(c_int), flags: c_int) {
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as libc::sighandler_t;
        sa.sa_flags = flags;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(sig, &sa, std::ptr::null_mut());
    }
}

fn restore_default(sig: c_int) {
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
    }
}

/// SIGALRM (to the process, i.e. the main thread: every other thread of ours blocks it)
/// after `ms`.
fn alarm_in(ms: u64) {
    let it = libc::itimerval {
        it_interval: libc::timeval {
            tv_sec: 0,
            tv_usec: 0,
        },
        it_value: libc::timeval {
            tv_sec: (ms / 1000) as libc::time_t,
            tv_usec: ((ms % 1000) * 1000) as libc::suseconds_t,
        },
    };
    unsafe { libc::setitimer(libc::ITIMER_REAL, &it, std::ptr::null_mut()) };
}

static ALRM_COUNT: AtomicU32 = AtomicU32::new(0);

extern "C" fn count_alrm(_: c_int) {
    ALRM_COUNT.fetch_add(1, SO);
}

/// The signals with a handler installed without SA_RESTART (Rust's std installs SIGSEGV and
/// SIGBUS ones), for a note: a shim that cannot tell which signal interrupted it may decide
/// EINTR-or-restart from all of them.
fn handlers_without_restart() -> String {
    let v: Vec<String> = (1..=64)
        .filter(|&sig| {
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            let r = unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) };
            r == 0
                && old.sa_sigaction != libc::SIG_DFL
                && old.sa_sigaction != libc::SIG_IGN
                && old.sa_flags & libc::SA_RESTART == 0
        })
        .map(|sig| sig.to_string())
        .collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(" ")
    }
}

/// Waits (bounded) until the SIGALRM handler has run at least once.
fn wait_alrm(ms: u64) -> bool {
    let end = Instant::now() + Duration::from_millis(ms);
    while ALRM_COUNT.load(SO) == 0 {
        if Instant::now() > end {
            return false;
        }
        thread::sleep(Duration::from_millis(5));
    }
    true
}

// ---- sections ----------------------------------------------------------------------------

fn sec_shut_rd(ctx: &Ctx) -> io::Result<()> {
    const S: &str = "shut_rd";
    let (c, s) = pair(ctx)?;
    send_all(s, b"abc")?;
    wait_queued(c, 3)?;
    say(&format!("{S}: with 3 bytes queued, poll {}", poll_now(c)?));
    say(&format!(
        "{S}: shutdown(SHUT_RD) {}",
        shutdown(c, libc::SHUT_RD)
    ));
    say(&format!("{S}: after shutdown, poll {}", poll_now(c)?));
    say(&format!("{S}: recv {}", recv_rescued(c, s)));
    say(&format!("{S}: recv again {}", recv_rescued(c, s)));
    let (n, e, d) = recv_once(c, libc::MSG_DONTWAIT);
    say(&format!("{S}: recv MSG_DONTWAIT {}", describe(n, e, &d)));
    // The peer sends more: it is still delivered (Linux TCP keeps accepting data after SHUT_RD).
    send_all(s, b"late")?;
    let end = Instant::now() + Duration::from_millis(LONG_MS as u64);
    let late = loop {
        let (n, e, d) = recv_once(c, libc::MSG_DONTWAIT);
        if n > 0 {
            break describe(n, e, &d);
        }
        if n < 0 && e != libc::EAGAIN && e != libc::EINTR {
            break describe(n, e, &d);
        }
        if Instant::now() > end {
            break format!(
                "nothing within {LONG_MS} ms (last recv {})",
                describe(n, e, &d)
            );
        }
        thread::sleep(Duration::from_millis(10));
    };
    say(&format!("{S}: late bytes: {late}"));
    let (n, e, d) = recv_once(c, libc::MSG_DONTWAIT);
    say(&format!(
        "{S}: then recv MSG_DONTWAIT {}",
        describe(n, e, &d)
    ));
    say(&format!("{S}: poll {}", poll_now(c)?));
    // The write side is still open.
    send_all(c, b"up")?;
    say(&format!(
        "{S}: peer got {:?} from the shut-down reader",
        String::from_utf8_lossy(&read_exact(s, 2)?)
    ));
    close(c);
    close(s);
    Ok(())
}

fn sec_shut_rd_wakes_reader(ctx: &Ctx) -> io::Result<()> {
    const S: &str = "shut_rd_wakes_reader";
    let (c, s) = pair(ctx)?;
    let (tx, rx) = mpsc::channel();
    let reader = spawn_quiet(move || {
        let r = recv_once(c, 0);
        let _ = tx.send(r);
    });
    thread::sleep(Duration::from_millis(300));
    say(&format!(
        "{S}: reader still blocked before shutdown: {}",
        rx.try_recv().is_err()
    ));
    say(&format!(
        "{S}: shutdown(SHUT_RD) {}",
        shutdown(c, libc::SHUT_RD)
    ));
    let got = match rx.recv_timeout(Duration::from_millis(RESCUE_MS)) {
        Ok((n, e, d)) => describe(n, e, &d),
        Err(_) => {
            send_all(s, b"rescue")?;
            match rx.recv_timeout(Duration::from_millis(RESCUE_MS)) {
                Ok((n, e, d)) => format!("{} (rescued: it blocked)", describe(n, e, &d)),
                Err(_) => {
                    fail(
                        S,
                        "the reader is still blocked even after the peer sent data",
                    );
                    return Ok(()); // leaks c, s and the thread
                }
            }
        }
    };
    let _ = reader.join();
    say(&format!("{S}: reader got {got}"));
    close(c);
    close(s);
    Ok(())
}

fn sec_shut_rdwr(ctx: &Ctx) -> io::Result<()> {
    const S: &str = "shut_rdwr";
    let (c, s) = pair(ctx)?;
    say(&format!("{S}: before, poll {}", poll_now(c)?));
    say(&format!(
        "{S}: shutdown(SHUT_RDWR) {}",
        shutdown(c, libc::SHUT_RDWR)
    ));
    say(&format!("{S}: after shutdown, poll {}", poll_now(c)?));
    say(&format!("{S}: recv {}", recv_rescued(c, s)));
    let n = unsafe { libc::send(c, b"z".as_ptr() as *const c_void, 1, libc::MSG_NOSIGNAL) };
    let e = if n < 0 { errno() } else { 0 };
    say(&format!("{S}: send {}", describe(n, e, b"z")));
    let r = poll1(s, libc::POLLIN | libc::POLLRDHUP, LONG_MS)?;
    say(&format!("{S}: peer poll {}", poll_names(r)));
    let (n, e, d) = recv_once(s, libc::MSG_DONTWAIT);
    say(&format!("{S}: peer recv {}", describe(n, e, &d)));
    close(c);
    close(s);
    Ok(())
}

fn sec_raw_close(ctx: &Ctx) -> io::Result<()> {
    const S: &str = "raw_close";
    for (how, nr) in [
        ("SYS_close", libc::SYS_close),
        ("SYS_close_range", libc::SYS_close_range),
    ] {
        let (c, s) = pair(ctx)?;
        let r =
            unsafe { libc::syscall(nr, s as libc::c_long, s as libc::c_long, 0 as libc::c_long) };
        say(&format!(
            "{S}: {how} {}",
            if r == 0 { "ok" } else { "failed" }
        ));
        let r = poll1(c, libc::POLLIN | libc::POLLRDHUP, LONG_MS)?;
        say(&format!("{S}: peer poll {}", poll_names(r)));
        let (n, e, d) = recv_once(c, libc::MSG_DONTWAIT);
        say(&format!("{S}: peer recv {}", describe(n, e, &d)));
        // The lowest free fd: `s`'s number, which must be the file's now.
        let path =
            std::ffi::CString::new(format!("/tmp/socket_edges.{}.{how}", std::process::id()))
                .map_err(|_| timeout("path"))?;
        let f = cvt(
            unsafe {
                libc::open(
                    path.as_ptr(),
                    libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC,
                    0o600,
                )
            },
            "open",
        )?;
        unsafe { libc::unlink(path.as_ptr()) };
        let want = b"file bytes";
        let mut got = [0u8; 16];
        let n = unsafe {
            libc::write(f, want.as_ptr() as *const c_void, want.len());
            libc::lseek(f, 0, libc::SEEK_SET);
            libc::read(f, got.as_mut_ptr() as *mut c_void, got.len())
        };
        let e = if n < 0 { errno() } else { 0 };
        let read = &got[..n.max(0) as usize];
        say(&format!(
            "{S}: a file opened next reads {}",
            describe(n, e, read)
        ));
        close(f);
        close(c);
    }
    Ok(())
}

fn sec_close_while_blocked(ctx: &Ctx) -> io::Result<()> {
    const S: &str = "close_while_blocked";
    let (c, s) = pair(ctx)?;
    let (tx, rx) = mpsc::channel();
    // The reader never touches `c` after its recv returns (the number may be reused).
    let reader = spawn_quiet(move || {
        let r = recv_once(c, 0);
        let _ = tx.send(r);
    });
    thread::sleep(Duration::from_millis(300));
    say(&format!(
        "{S}: reader still blocked before close: {}",
        rx.try_recv().is_err()
    ));
    let rc = unsafe { libc::close(c) };
    say(&format!(
        "{S}: close {}",
        if rc == 0 {
            "0".into()
        } else {
            format!("-1 {}", errno_name(errno()))
        }
    ));
    thread::sleep(Duration::from_millis(300));
    let early = rx.try_recv().ok();
    say(&format!(
        "{S}: reader still blocked 300 ms after close: {}",
        early.is_none()
    ));
    // No fd is created until the reader has returned: its fd number stays unused.
    let sent = send_all(s, b"x");
    say(&format!(
        "{S}: peer sends \"x\": {}",
        match &sent {
            Ok(()) => "ok".to_string(),
            Err(e) => e.to_string(),
        }
    ));
    let got = match early {
        Some((n, e, d)) => Some(describe(n, e, &d)),
        None => rx
            .recv_timeout(Duration::from_millis(LONG_MS as u64))
            .ok()
            .map(|(n, e, d)| describe(n, e, &d)),
    };
    match got {
        Some(g) => {
            let _ = reader.join();
            say(&format!("{S}: reader got {g}"));
        }
        None => {
            fail(
                S,
                "the reader did not return within 10 s of the peer's byte",
            );
            return Ok(()); // leaks s and the thread
        }
    }
    // Now the socket is really closed: the peer reads EOF (within a few seconds).
    let r = poll1(s, libc::POLLIN, 5000)?;
    let eof = if r == 0 {
        "nothing within 5 s".to_string()
    } else {
        let (n, e, d) = recv_once(s, libc::MSG_DONTWAIT);
        describe(n, e, &d)
    };
    say(&format!("{S}: peer recv {eof}"));
    close(s);
    Ok(())
}

fn sec_eintr(ctx: &Ctx) -> io::Result<()> {
    const S: &str = "eintr";
    let (c, s) = pair(ctx)?;
    // Without SA_RESTART: the blocked recv returns EINTR.
    ALRM_COUNT.store(0, SO);
    install(libc::SIGALRM, count_alrm, 0);
    alarm_in(300);
    let r = recv_rescued(c, s);
    say(&format!("{S}: no SA_RESTART: recv {r}"));
    say(&format!(
        "{S}: no SA_RESTART: handler ran {} time(s)",
        ALRM_COUNT.load(SO)
    ));
    // Drain a possible rescue so that the next part starts clean.
    let _ = recv_once(c, libc::MSG_DONTWAIT);
    // With SA_RESTART: the recv keeps waiting and returns the data sent 500 ms after the signal.
    ALRM_COUNT.store(0, SO);
    install(libc::SIGALRM, count_alrm, libc::SA_RESTART);
    note(&format!(
        "{S}: SA_RESTART part: signals with a handler without SA_RESTART: {}",
        handlers_without_restart()
    ));
    let sender = spawn_quiet(move || {
        let seen = wait_alrm(5000);
        thread::sleep(Duration::from_millis(500));
        let _ = send_all(s, b"data");
        seen
    });
    alarm_in(300);
    let t = Instant::now();
    let (n, e, d) = recv_once(c, 0);
    let waited = t.elapsed();
    let seen = sender.join().unwrap_or(false);
    say(&format!("{S}: SA_RESTART: recv {}", describe(n, e, &d)));
    say(&format!(
        "{S}: SA_RESTART: handler ran {} time(s), before the data: {seen}",
        ALRM_COUNT.load(SO)
    ));
    say(&format!(
        "{S}: SA_RESTART: recv returned only after the data was sent: {}",
        waited >= Duration::from_millis(700)
    ));
    restore_default(libc::SIGALRM);
    close(c);
    close(s);
    Ok(())
}

static HW_FD: AtomicI32 = AtomicI32::new(-1);
static HW_RET: AtomicIsize = AtomicIsize::new(0);
static HW_ERRNO: AtomicI32 = AtomicI32::new(0);
static HW_DONE: AtomicBool = AtomicBool::new(false);

extern "C" fn handler_send(_: c_int) {
    unsafe {
        let saved = *libc::__errno_location();
        let fd = HW_FD.load(SO);
        let n = libc::send(fd, b"H".as_ptr() as *const c_void, 1, libc::MSG_NOSIGNAL);
        HW_ERRNO.store(if n < 0 { *libc::__errno_location() } else { 0 }, SO);
        HW_RET.store(n, SO);
        HW_DONE.store(true, SO);
        ALRM_COUNT.fetch_add(1, SO);
        *libc::__errno_location() = saved;
    }
}

fn sec_handler_write(ctx: &Ctx) -> io::Result<()> {
    const S: &str = "handler_write";
    let (c, s) = pair(ctx)?;
    HW_FD.store(c, SO);
    HW_DONE.store(false, SO);
    ALRM_COUNT.store(0, SO);
    install(libc::SIGALRM, handler_send, libc::SA_RESTART);
    // The peer: once the handler has run, looks for 'H' (5 s if the send succeeded, else
    // 1.5 s), then sends "release" to end the main thread's recv.
    let peer = spawn_quiet(move || {
        let end = Instant::now() + Duration::from_millis(5000);
        while !HW_DONE.load(SO) && Instant::now() < end {
            thread::sleep(Duration::from_millis(5));
        }
        let done = HW_DONE.load(SO);
        let ret = HW_RET.load(SO);
        let wait = if done && ret == 1 { 5000 } else { 1500 };
        let mut got = Vec::new();
        if poll1(s, libc::POLLIN, wait).unwrap_or(0) != 0 {
            // Whatever else arrives shortly after.
            thread::sleep(Duration::from_millis(100));
            loop {
                let (n, _, d) = recv_once(s, libc::MSG_DONTWAIT);
                if n <= 0 {
                    break;
                }
                got.extend_from_slice(&d);
            }
        }
        let _ = send_all(s, b"release");
        (done, got)
    });
    alarm_in(300);
    let (n, e, d) = recv_once(c, 0);
    let (done, got) = peer.join().unwrap_or((false, Vec::new()));
    let ret = HW_RET.load(SO);
    let herr = HW_ERRNO.load(SO);
    note(&format!(
        "{S}: handler ran: {done}; its send returned {ret} ({}); the peer got {:?}",
        errno_name(herr),
        String::from_utf8_lossy(&got)
    ));
    say(&format!("{S}: main recv {}", describe(n, e, &d)));
    say(&format!("{S}: handler ran {} time(s)", ALRM_COUNT.load(SO)));
    let sent_ok = done && ret == 1 && got == b"H";
    let refused = done && ret == -1 && herr == libc::EAGAIN && got.is_empty();
    if sent_ok || refused {
        say(&format!("{S}: consistent"));
    } else {
        say(&format!(
            "{S}: LOST (handler ran {done}, send returned {ret} {}, peer got {:?})",
            if ret < 0 {
                errno_name(herr)
            } else {
                String::new()
            },
            String::from_utf8_lossy(&got)
        ));
    }
    restore_default(libc::SIGALRM);
    close(c);
    close(s);
    Ok(())
}

/// The pattern exit_in_handler's child sends: byte `i` of the stream.
fn pattern(i: u64) -> u8 {
    (i.wrapping_mul(2_654_435_761) >> 13) as u8 ^ (i >> 16) as u8
}

fn sec_exit_in_handler(ctx: &Ctx, addr: &str, port: &str) -> io::Result<()> {
    const S: &str = "exit_in_handler";
    let exe = std::env::current_exe()?;
    let mut child = std::process::Command::new(exe)
        .args(["exit-child", addr, port])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()?;
    let s = match accept_bounded(ctx.lfd, 3 * LONG_MS) {
        Ok(s) => s,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
    };
    let mut buf = vec![0u8; 256 * 1024];
    let mut total: u64 = 0;
    let mut mismatch: Option<u64> = None;
    let end_state = loop {
        if poll1(s, libc::POLLIN, 2 * LONG_MS)? == 0 {
            break format!("no data or EOF within {} s", 2 * LONG_MS / 1000);
        }
        let n = unsafe {
            libc::recv(
                s,
                buf.as_mut_ptr() as *mut c_void,
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            match errno() {
                libc::EINTR | libc::EAGAIN => continue,
                e => break format!("recv -1 {}", errno_name(e)),
            }
        }
        if n == 0 {
            break "EOF".to_string();
        }
        for (k, &b) in buf[..n as usize].iter().enumerate() {
            if mismatch.is_none() && b != pattern(total + k as u64) {
                mismatch = Some(total + k as u64);
            }
        }
        total += n as u64;
    };
    // The child must have exited (status 0, from _exit in the handler).
    let t = Instant::now();
    let status = loop {
        match child.try_wait()? {
            Some(st) => break format!("{st}"),
            None if t.elapsed() > Duration::from_secs(20) => {
                let _ = child.kill();
                let _ = child.wait();
                break "still running after 20 s (killed)".to_string();
            }
            None => thread::sleep(Duration::from_millis(20)),
        }
    };
    if total == EXIT_BYTES as u64 && mismatch.is_none() && end_state == "EOF" {
        say(&format!("{S}: received {total} bytes ok"));
    } else {
        say(&format!(
            "{S}: received {total} bytes (want {EXIT_BYTES}), then {end_state}, {}",
            match mismatch {
                Some(m) => format!("first wrong byte at {m}"),
                None => "content ok".into(),
            }
        ));
    }
    say(&format!("{S}: child {status}"));
    close(s);
    Ok(())
}

extern "C" fn exit_now(_: c_int) {
    unsafe { libc::_exit(0) };
}

/// Mode exit-child: connect, send EXIT_BYTES of the pattern (blocking sends), raise SIGUSR1
/// whose handler calls `_exit(0)`.
fn exit_child(addr: std::net::Ipv4Addr, port: u16) -> io::Result<()> {
    let sa = sockaddr(addr, port);
    let c = cvt(
        unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) },
        "socket",
    )?;
    cvt(
        unsafe { libc::connect(c, &sa as *const _ as *const libc::sockaddr, SALEN) },
        "connect",
    )?;
    let data: Vec<u8> = (0..EXIT_BYTES as u64).map(pattern).collect();
    for chunk in data.chunks(64 * 1024) {
        send_all(c, chunk)?;
    }
    install(libc::SIGUSR1, exit_now, 0);
    unsafe { libc::raise(libc::SIGUSR1) };
    eprintln!("socket_edges exit-child: still running after raise(SIGUSR1)");
    unsafe { libc::_exit(4) };
}

// ---- main --------------------------------------------------------------------------------

const SECTIONS: [&str; 8] = [
    "shut_rd",
    "shut_rd_wakes_reader",
    "shut_rdwr",
    "close_while_blocked",
    "raw_close",
    "eintr",
    "handler_write",
    "exit_in_handler",
];

fn run(addr: std::net::Ipv4Addr, port: u16, only: &[String]) -> io::Result<()> {
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
    cvt(
        unsafe { libc::bind(lfd, &sa as *const _ as *const libc::sockaddr, SALEN) },
        "bind",
    )?;
    cvt(unsafe { libc::listen(lfd, 16) }, "listen")?;
    say("listen ok");
    let ctx = Ctx { lfd, sa };
    start_watchdog();
    for name in SECTIONS {
        if !only.is_empty() && !only.iter().any(|o| o == name) {
            continue;
        }
        arm(name);
        let r = match name {
            "shut_rd" => sec_shut_rd(&ctx),
            "shut_rd_wakes_reader" => sec_shut_rd_wakes_reader(&ctx),
            "shut_rdwr" => sec_shut_rdwr(&ctx),
            "close_while_blocked" => sec_close_while_blocked(&ctx),
            "raw_close" => sec_raw_close(&ctx),
            "eintr" => sec_eintr(&ctx),
            "handler_write" => sec_handler_write(&ctx),
            "exit_in_handler" => sec_exit_in_handler(&ctx, &addr.to_string(), &port.to_string()),
            _ => unreachable!(),
        };
        if let Err(e) = r {
            fail(name, &e.to_string());
        }
    }
    DEADLINE_MS.store(0, SO);
    close(lfd);
    say("done");
    Ok(())
}

fn usage() -> ExitCode {
    eprintln!("usage: socket_edges IPV4ADDR PORT [SECTION...]  (sections: {SECTIONS:?})");
    eprintln!("       socket_edges exit-child IPV4ADDR PORT");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("exit-child") {
        return match (
            args.get(1).map(|a| a.parse()),
            args.get(2).map(|p| p.parse()),
        ) {
            (Some(Ok(a)), Some(Ok(p))) if args.len() == 3 => match exit_child(a, p) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("socket_edges exit-child: {e}");
                    ExitCode::FAILURE
                }
            },
            _ => usage(),
        };
    }
    if args.len() < 2 {
        return usage();
    }
    let (addr, port) = match (args[0].parse(), args[1].parse()) {
        (Ok(a), Ok(p)) => (a, p),
        _ => return usage(),
    };
    let only = &args[2..];
    if let Some(bad) = only.iter().find(|o| !SECTIONS.contains(&o.as_str())) {
        eprintln!("socket_edges: unknown section {bad}");
        return usage();
    }
    match run(addr, port, only) {
        Ok(()) if !FAILED.load(SO) => ExitCode::SUCCESS,
        Ok(()) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("socket_edges: {e}");
            ExitCode::FAILURE
        }
    }
}
