//! A fork-after-accept server (the process model of PostgreSQL, inetd, `socat ...,fork`,
//! `socketserver.ForkingTCPServer`): the parent accepts, forks, and the child serves the
//! connection (examples/support/fork_proto.rs: echo or sink/source with sha256 both ways,
//! or a 1-byte ping) and exits. Used by tests/rdma/fork_matrix.sh and bench/rdma/fork.sh.
//!
//! ```text
//! fork_echo ADDR:PORT [--mode fork|shared|nofork] [--wait-data MS]
//!           [--daemon | --daemon-first] [--pidfile F] [--log F]
//!           [--max-conns K] [--idle-exit SECS] [--timeout SECS] [--drop-to UID]
//!           [--raw-clone] [--stdin-locked] [--drop-caps capset|syscall|prctl]
//! ```
//!
//! - `fork` (default): the parent closes its copy of the connection right after fork.
//! - `shared`: the parent keeps its copy open, unused, until that child has exited.
//! - `nofork`: the parent serves each connection itself (no fork; the reference case).
//! - `--wait-data MS`: before forking, the parent waits (poll, at most MS) until the
//!   connection is readable, then 200 ms more, without reading: bytes that arrived before
//!   the fork and were not read must reach the child.
//! - `--daemon`: listen, then daemonize (fork, the parent `_exit`s, setsid, fork again);
//!   `--daemon-first`: daemonize, then listen. The daemon writes `--pidfile`.
//! - `--max-conns K`: after K connections, stop accepting, wait for the children, exit
//!   (status 1 if a child failed). `--idle-exit SECS`: exit (status 3) when no connection
//!   came for SECS (bounds a daemon nobody stops). `--timeout`: per-connection I/O timeout
//!   in the child (default 60 s).
//! - `--drop-to UID`: the child drops root before its first read, as rsyncd, sshd's
//!   privilege separation and inetd services do: `setgroups([])`, `setgid(UID)`, `setuid(UID)`.
//! - `--stdin-locked`: as vsftpd's session process, the child moves the connection to fd 0
//!   (`dup2`, then closes the original), sets `RLIMIT_NOFILE` to 0 (no new fd at all) and
//!   serves it on fd 0.
//! - `--drop-caps HOW`: once it listens, the server installs new credentials without
//!   changing its ids, as Dovecot's master drops capabilities after it made its listeners:
//!   `capset` (libc's, which libcap calls) or `syscall` (`SYS_capset`) clear
//!   `CAP_SYS_MODULE`; `prctl` sets `PR_SET_KEEPCAPS`. Logged as `caps pid=P how=HOW`.
//!
//! The event log (`--log`, one line per event, O_APPEND) has `listen pid=P`, `accept pid=P
//! conn=I peer=..`, `fork pid=P child=C conn=I readable_before_fork=0|1`, `serve pid=C
//! ppid=P conn=I uid=U`, `served pid=C conn=I op=E up=N down=M` / `error pid=C conn=I ...`,
//! `exit pid=P status=S served=N failed=F`. Nothing is written to stdout.

#[path = "support/fork_proto.rs"]
mod fork_proto;

use std::collections::HashMap;
use std::io;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use fork_proto::{log_line, pid, serve, write_pidfile};

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Fork,
    Shared,
    NoFork,
}

struct Opts {
    addr: String,
    mode: Mode,
    wait_data: Option<u64>,
    daemon: u8, // 0 none, 1 listen then daemonize, 2 daemonize then listen
    pidfile: Option<String>,
    log: Option<String>,
    max_conns: Option<u64>,
    idle_exit: Option<u64>,
    timeout: Duration,
    drop_to: Option<u32>,
    drop_caps: Option<String>,
}

/// `--raw-clone`: fork with the raw `clone` system call through `syscall(2)`, as vsftpd does
/// (glibc runs no fork handlers for it).
static RAW_CLONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `--stdin-locked` (see the module doc).
static STDIN_LOCKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The connection moved to fd 0 of a process that may open no more fds (`--stdin-locked`).
fn onto_locked_stdin(o: &Opts, conn: TcpStream) -> io::Result<TcpStream> {
    use std::os::fd::{FromRawFd, IntoRawFd};
    fork_proto::keep_log_open(o.log.as_deref());
    let fd = conn.into_raw_fd();
    let none = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: fd is the connection's, given up above; fd 0 is replaced by it.
    unsafe {
        if libc::dup2(fd, 0) != 0 || libc::close(fd) != 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::setrlimit(libc::RLIMIT_NOFILE, &none) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(TcpStream::from_raw_fd(0))
    }
}

/// fork(2), or a raw clone; Err on failure.
fn fork() -> io::Result<libc::pid_t> {
    // SAFETY: plain fork (or clone without CLONE_VM and without a new stack: the same); the
    // child only runs this program's own code afterwards.
    let p = unsafe {
        if RAW_CLONE.load(std::sync::atomic::Ordering::Relaxed) {
            let flags = libc::SIGCHLD as libc::c_long;
            libc::syscall(libc::SYS_clone, flags, 0, 0, 0, 0) as libc::pid_t
        } else {
            libc::fork()
        }
    };
    if p < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(p)
    }
}

/// The classic double fork: returns in the grandchild only.
fn daemonize() -> io::Result<()> {
    if fork()? > 0 {
        // SAFETY: _exit ends the original process at once (as daemon(3) does).
        unsafe { libc::_exit(0) };
    }
    // SAFETY: setsid has no memory-safety preconditions.
    if unsafe { libc::setsid() } < 0 {
        return Err(io::Error::last_os_error());
    }
    if fork()? > 0 {
        // SAFETY: as above.
        unsafe { libc::_exit(0) };
    }
    Ok(())
}

/// Waits until `conn` is readable (at most `ms`); true if it is.
fn readable(conn: &TcpStream, ms: u64) -> bool {
    let mut p = libc::pollfd {
        fd: conn.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let rc = unsafe { libc::poll(&mut p, 1, ms.min(i32::MAX as u64) as i32) };
    rc > 0 && (p.revents & libc::POLLIN) != 0
}

/// Reaps exited children (blocking if `block`); returns (pid, ok) for each.
fn reap(block: bool) -> Vec<(libc::pid_t, bool)> {
    let mut out = Vec::new();
    loop {
        let mut st = 0;
        // SAFETY: waitpid with a valid status pointer.
        let p = unsafe {
            libc::waitpid(
                -1,
                &mut st,
                if block && out.is_empty() {
                    0
                } else {
                    libc::WNOHANG
                },
            )
        };
        if p <= 0 {
            return out;
        }
        out.push((p, libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0));
    }
}

fn child_serve(o: &Opts, conn: TcpStream, i: u64) -> bool {
    log_line(
        o.log.as_deref(),
        &format!(
            "serve pid={} ppid={} conn={i} uid={}",
            pid(),
            std::os::unix::process::parent_id(),
            // SAFETY: getuid cannot fail.
            unsafe { libc::getuid() }
        ),
    );
    match serve(conn, Some(o.timeout)) {
        Ok(s) => {
            log_line(
                o.log.as_deref(),
                &format!(
                    "served pid={} conn={i} op={} up={} down={}",
                    pid(),
                    s.op,
                    s.up,
                    s.down
                ),
            );
            true
        }
        Err(e) => {
            log_line(
                o.log.as_deref(),
                &format!("error pid={} conn={i} {e}", pid()),
            );
            eprintln!("fork_echo: pid {} conn {i}: {e}", pid());
            false
        }
    }
}

fn run(o: &Opts) -> io::Result<u8> {
    if o.daemon == 2 {
        daemonize()?;
    }
    let listener = TcpListener::bind(o.addr.as_str())?;
    if o.daemon == 1 {
        daemonize()?;
    }
    write_pidfile(o.pidfile.as_deref())?;
    log_line(
        o.log.as_deref(),
        &format!("listen pid={} addr={}", pid(), o.addr),
    );
    if let Some(how) = &o.drop_caps {
        drop_caps(how).map_err(|e| io::Error::new(e.kind(), format!("--drop-caps {how}: {e}")))?;
        log_line(o.log.as_deref(), &format!("caps pid={} how={how}", pid()));
    }
    listener.set_nonblocking(o.idle_exit.is_some())?;
    let mut kept: HashMap<libc::pid_t, TcpStream> = HashMap::new();
    let (mut n, mut failed, mut last) = (0u64, 0u64, Instant::now());
    let note = |ok: bool, failed: &mut u64| *failed += u64::from(!ok);
    while !matches!(o.max_conns, Some(m) if n >= m) {
        for (p, ok) in reap(false) {
            kept.remove(&p);
            note(ok, &mut failed);
        }
        let (conn, peer) = match listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if o.idle_exit
                    .is_some_and(|s| last.elapsed() > Duration::from_secs(s))
                {
                    log_line(
                        o.log.as_deref(),
                        &format!(
                            "exit pid={} status=3 idle served={n} failed={failed}",
                            pid()
                        ),
                    );
                    return Ok(3);
                }
                let mut p = libc::pollfd {
                    fd: listener.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd.
                unsafe { libc::poll(&mut p, 1, 100) };
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                log_line(
                    o.log.as_deref(),
                    &format!("error pid={} accept: {e}", pid()),
                );
                return Err(io::Error::new(e.kind(), format!("accept: {e}")));
            }
        };
        last = Instant::now();
        let i = n;
        n += 1;
        log_line(
            o.log.as_deref(),
            &format!("accept pid={} conn={i} peer={peer}", pid()),
        );
        if o.mode == Mode::NoFork {
            note(child_serve(o, conn, i), &mut failed);
            continue;
        }
        let mut before = -1;
        if let Some(ms) = o.wait_data {
            before = readable(&conn, ms) as i32;
            std::thread::sleep(Duration::from_millis(200));
        }
        match fork()? {
            0 => {
                // As careful servers do: the child closes the listener and the copies of
                // other connections the parent still holds (mode shared).
                drop(listener);
                kept.clear();
                if let Some(uid) = o.drop_to {
                    if let Err(e) = drop_root(uid) {
                        log_line(
                            o.log.as_deref(),
                            &format!("error pid={} drop-to: {e}", pid()),
                        );
                        std::process::exit(1);
                    }
                }
                let conn = if STDIN_LOCKED.load(std::sync::atomic::Ordering::Relaxed) {
                    match onto_locked_stdin(o, conn) {
                        Ok(c) => c,
                        Err(e) => {
                            let line = format!("error pid={} conn={i} stdin-locked: {e}", pid());
                            log_line(o.log.as_deref(), &line);
                            std::process::exit(1);
                        }
                    }
                } else {
                    conn
                };
                let ok = child_serve(o, conn, i);
                std::process::exit(if ok { 0 } else { 1 });
            }
            c => {
                log_line(
                    o.log.as_deref(),
                    &format!(
                        "fork pid={} child={c} conn={i} readable_before_fork={before}",
                        pid()
                    ),
                );
                if o.mode == Mode::Shared {
                    kept.insert(c, conn);
                } else {
                    drop(conn);
                }
            }
        }
    }
    drop(listener);
    // Wait for the children (each bounded by its own I/O timeout).
    loop {
        let r = reap(true);
        if r.is_empty() {
            break;
        }
        for (p, ok) in r {
            kept.remove(&p);
            note(ok, &mut failed);
        }
    }
    let st = if failed > 0 { 1 } else { 0 };
    log_line(
        o.log.as_deref(),
        &format!("exit pid={} status={st} served={n} failed={failed}", pid()),
    );
    Ok(st)
}

/// `--drop-caps HOW` (see the module doc).
fn drop_caps(how: &str) -> io::Result<()> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    extern "C" {
        fn capget(h: *mut Header, d: *mut Data) -> libc::c_int;
        fn capset(h: *mut Header, d: *const Data) -> libc::c_int;
    }
    const VERSION_3: u32 = 0x2008_0522;
    const CAP_SYS_MODULE: u32 = 16;
    let mut h = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut d = [Data::default(); 2];
    // SAFETY: a version-3 header and the two data words it names; prctl takes plain words.
    let r = unsafe {
        match how {
            "prctl" => libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0),
            "capset" | "syscall" => {
                if capget(&mut h, d.as_mut_ptr()) != 0 {
                    return Err(io::Error::last_os_error());
                }
                d[0].effective &= !(1 << CAP_SYS_MODULE);
                d[0].permitted &= !(1 << CAP_SYS_MODULE);
                if how == "capset" {
                    capset(&mut h, d.as_ptr())
                } else {
                    libc::syscall(libc::SYS_capset, &mut h as *mut Header, d.as_ptr())
                        as libc::c_int
                }
            }
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "--drop-caps: capset, syscall or prctl",
                ))
            }
        }
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Gives up root for good: no supplementary groups, then the group, then the user.
fn drop_root(uid: u32) -> io::Result<()> {
    // SAFETY: plain credential syscalls in a single-threaded fork child.
    let r = unsafe {
        if libc::setgroups(0, std::ptr::null()) != 0 || libc::setgid(uid) != 0 {
            -1
        } else {
            libc::setuid(uid)
        }
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn usage() -> ExitCode {
    eprintln!(
        "usage: fork_echo ADDR:PORT [--mode fork|shared|nofork] [--wait-data MS] [--daemon|--daemon-first] \
         [--pidfile F] [--log F] [--max-conns K] [--idle-exit SECS] [--timeout SECS] [--drop-to UID] [--raw-clone] [--stdin-locked] \
         [--drop-caps capset|syscall|prctl]"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(addr) = args.first().cloned() else {
        return usage();
    };
    let mut o = Opts {
        addr,
        mode: Mode::Fork,
        wait_data: None,
        daemon: 0,
        pidfile: None,
        log: None,
        max_conns: None,
        idle_exit: None,
        timeout: Duration::from_secs(60),
        drop_to: None,
        drop_caps: None,
    };
    let mut it = args[1..].iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--daemon" => o.daemon = 1,
            "--raw-clone" => RAW_CLONE.store(true, std::sync::atomic::Ordering::Relaxed),
            "--stdin-locked" => STDIN_LOCKED.store(true, std::sync::atomic::Ordering::Relaxed),
            "--daemon-first" => o.daemon = 2,
            _ => {
                let Some(v) = it.next() else { return usage() };
                let num = v.parse::<u64>().ok();
                match (a.as_str(), num) {
                    ("--mode", _) => {
                        o.mode = match v.as_str() {
                            "fork" => Mode::Fork,
                            "shared" => Mode::Shared,
                            "nofork" => Mode::NoFork,
                            _ => return usage(),
                        }
                    }
                    ("--wait-data", Some(n)) => o.wait_data = Some(n),
                    ("--pidfile", _) => o.pidfile = Some(v.clone()),
                    ("--log", _) => o.log = Some(v.clone()),
                    ("--max-conns", Some(n)) => o.max_conns = Some(n),
                    ("--idle-exit", Some(n)) => o.idle_exit = Some(n),
                    ("--timeout", Some(n)) if n > 0 => o.timeout = Duration::from_secs(n),
                    ("--drop-to", Some(n)) => o.drop_to = u32::try_from(n).ok(),
                    ("--drop-caps", _) => o.drop_caps = Some(v.clone()),
                    _ => return usage(),
                }
            }
        }
    }
    match run(&o) {
        Ok(st) => ExitCode::from(st),
        Err(e) => {
            log_line(
                o.log.as_deref(),
                &format!("exit pid={} status=1 error: {e}", pid()),
            );
            eprintln!("fork_echo: {e}");
            ExitCode::FAILURE
        }
    }
}
