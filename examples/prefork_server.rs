//! A prefork server (the process model of nginx, Apache prefork, gunicorn, php-fpm): the
//! master listens, forks N workers, and each worker accepts on the listener it inherited
//! and serves the connection itself (examples/support/fork_proto.rs). Used by
//! tests/rdma/fork_matrix.sh.
//!
//! ```text
//! prefork_server ADDR:PORT N --log FILE [--epoll] [--hold-ms MS] [--pidfile F] [--timeout SECS]
//! ```
//!
//! - default: each worker loops on a blocking `accept()`;
//! - `--epoll`: the listener is nonblocking and each worker waits in its own epoll
//!   instance, registered with `EPOLLIN | EPOLLEXCLUSIVE` (nginx without accept_mutex),
//!   then accepts (EAGAIN: another worker was faster);
//! - `--hold-ms`: a worker waits MS after accepting before it serves, so that concurrent
//!   connections must be taken by several workers.
//!
//! The master waits for its workers; on SIGTERM or SIGINT it sends SIGTERM to each, reaps
//! them and exits 0 if no worker had failed before (a worker that exits on its own, e.g.
//! because accept failed, is a failure: status 1). The event log gets `master pid=P`,
//! `worker pid=W ppid=P`, `accept pid=W conn=I peer=..`, `served pid=W conn=I ...`,
//! `error pid=W ...`, `worker-exit pid=W status=..`, `exit pid=P status=S`. Nothing on
//! stdout.

#[path = "support/fork_proto.rs"]
mod fork_proto;

use std::io;
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use fork_proto::{log_line, pid, serve, write_pidfile};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_term(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

struct Opts {
    addr: String,
    workers: usize,
    log: String,
    epoll: bool,
    hold_ms: u64,
    pidfile: Option<String>,
    timeout: Duration,
}

fn worker(o: &Opts, l: &TcpListener) -> io::Result<()> {
    let log = Some(o.log.as_str());
    log_line(
        log,
        &format!(
            "worker pid={} ppid={}",
            pid(),
            std::os::unix::process::parent_id()
        ),
    );
    let mut ep = -1;
    if o.epoll {
        // SAFETY: epoll_create1/epoll_ctl with valid arguments.
        ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLEXCLUSIVE) as u32,
            u64: 0,
        };
        // SAFETY: as above.
        if unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, l.as_raw_fd(), &mut ev) } < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("epoll_ctl(EPOLLEXCLUSIVE): {e}"),
            ));
        }
    }
    let mut i = 0u64;
    loop {
        if o.epoll {
            let mut ev = libc::epoll_event { events: 0, u64: 0 };
            // SAFETY: one valid event slot.
            let n = unsafe { libc::epoll_wait(ep, &mut ev, 1, -1) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(io::Error::new(e.kind(), format!("epoll_wait: {e}")));
            }
        }
        let (conn, peer) = match l.accept() {
            Ok(c) => c,
            Err(e) if o.epoll && e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => continue,
            Err(e) => return Err(io::Error::new(e.kind(), format!("accept: {e}"))),
        };
        log_line(log, &format!("accept pid={} conn={i} peer={peer}", pid()));
        if o.hold_ms > 0 {
            std::thread::sleep(Duration::from_millis(o.hold_ms));
        }
        match serve(conn, Some(o.timeout)) {
            Ok(s) => log_line(
                log,
                &format!(
                    "served pid={} conn={i} op={} up={} down={}",
                    pid(),
                    s.op,
                    s.up,
                    s.down
                ),
            ),
            Err(e) => {
                log_line(log, &format!("error pid={} conn={i} {e}", pid()));
                eprintln!("prefork_server: worker {} conn {i}: {e}", pid());
            }
        }
        i += 1;
    }
}

fn run(o: &Opts) -> io::Result<u8> {
    let log = Some(o.log.as_str());
    let l = TcpListener::bind(o.addr.as_str())?;
    if o.epoll {
        l.set_nonblocking(true)?;
    }
    write_pidfile(o.pidfile.as_deref())?;
    log_line(
        log,
        &format!(
            "master pid={} addr={} workers={} epoll={}",
            pid(),
            o.addr,
            o.workers,
            o.epoll as u8
        ),
    );
    // SAFETY: installing a handler that only stores to an atomic; no SA_RESTART, so the
    // master's waitpid returns EINTR.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_term as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGTERM, &sa, std::ptr::null_mut());
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
    }
    let mut kids = Vec::new();
    for _ in 0..o.workers {
        // SAFETY: plain fork; the worker runs only this program's code.
        match unsafe { libc::fork() } {
            -1 => return Err(io::Error::last_os_error()),
            0 => {
                // SAFETY: back to the default action in the worker: SIGTERM ends it.
                unsafe {
                    libc::signal(libc::SIGTERM, libc::SIG_DFL);
                    libc::signal(libc::SIGINT, libc::SIG_DFL);
                }
                let st = match worker(o, &l) {
                    Ok(()) => 0,
                    Err(e) => {
                        log_line(log, &format!("error pid={} {e}", pid()));
                        eprintln!("prefork_server: worker {}: {e}", pid());
                        1
                    }
                };
                std::process::exit(st);
            }
            p => kids.push(p),
        }
    }
    drop(l);
    let mut failed = 0;
    while !kids.is_empty() && !STOP.load(Ordering::SeqCst) {
        let mut st = 0;
        // SAFETY: waitpid with a valid status pointer.
        let p = unsafe { libc::waitpid(-1, &mut st, 0) };
        if p > 0 {
            kids.retain(|&k| k != p);
            failed += 1;
            log_line(
                log,
                &format!("worker-exit pid={p} status={st} (exited on its own)"),
            );
            eprintln!("prefork_server: worker {p} exited on its own (wait status {st})");
        }
    }
    for &k in &kids {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(k, libc::SIGTERM) };
    }
    for &k in &kids {
        let mut st = 0;
        // SAFETY: as above.
        unsafe { libc::waitpid(k, &mut st, 0) };
    }
    let st = if failed > 0 { 1 } else { 0 };
    log_line(
        log,
        &format!("exit pid={} status={st} failed_workers={failed}", pid()),
    );
    Ok(st)
}

fn usage() -> ExitCode {
    eprintln!("usage: prefork_server ADDR:PORT N --log FILE [--epoll] [--hold-ms MS] [--pidfile F] [--timeout SECS]");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [addr, n, rest @ ..] = args.as_slice() else {
        return usage();
    };
    let Ok(workers) = n.parse::<usize>() else {
        return usage();
    };
    let mut o = Opts {
        addr: addr.clone(),
        workers,
        log: String::new(),
        epoll: false,
        hold_ms: 0,
        pidfile: None,
        timeout: Duration::from_secs(60),
    };
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        if a == "--epoll" {
            o.epoll = true;
            continue;
        }
        let Some(v) = it.next() else { return usage() };
        match (a.as_str(), v.parse::<u64>().ok()) {
            ("--log", _) => o.log = v.clone(),
            ("--hold-ms", Some(n)) => o.hold_ms = n,
            ("--pidfile", _) => o.pidfile = Some(v.clone()),
            ("--timeout", Some(n)) if n > 0 => o.timeout = Duration::from_secs(n),
            _ => return usage(),
        }
    }
    if o.log.is_empty() || workers == 0 {
        return usage();
    }
    match run(&o) {
        Ok(st) => ExitCode::from(st),
        Err(e) => {
            eprintln!("prefork_server: {e}");
            ExitCode::FAILURE
        }
    }
}
