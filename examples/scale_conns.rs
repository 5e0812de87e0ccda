//! Many concurrent connections: setup rate, memory and QPs per connection, and round-trip
//! latency with all of them open (bench/rdma/scale.sh, tests/rdma/scale.sh).
//!
//! ```text
//! scale_conns server ADDR:PORT N        # epoll echo server; exits 0 once N connections
//!                                       # were accepted and all of them closed
//! scale_conns client ADDR:PORT N [--par K] [--rtt ROUNDS] [--server-pid PID] [--close-each 1]
//! ```
//!
//! The client opens N connections from K threads (default 16; 1 = sequential). Setting one
//! up is connect, one byte to the server and its echo back ("first byte each way"), and the
//! connection stays open. With all N open it reads its own and the server's `VmPin`/`VmLck`
//! (`/proc/PID/status`) and counts the device's RC QPs (`rdma resource show qp`), then times
//! ROUNDS 64-byte round trips on one connection (default 1000), then echoes 64 bytes of its
//! own pattern on every connection and checks them, then closes all. It prints one JSON
//! line (`"ok": true` only if every connection was set up and verified) and exits 0 if so.
//! With `--close-each 1` each connection is closed right after its first byte each way
//! (connection churn: nothing stays open, nothing else is measured).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use libc::c_int;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let usage = || {
        eprintln!(
            "usage: scale_conns server ADDR:PORT N | client ADDR:PORT N [--par K] [--rtt ROUNDS] [--server-pid PID] [--close-each 1]"
        );
        ExitCode::from(2)
    };
    if args.len() < 4 {
        return usage();
    }
    let (Ok(addr), Ok(n)) = (args[2].parse::<SocketAddr>(), args[3].parse::<usize>()) else {
        return usage();
    };
    raise_nofile();
    let r = match args[1].as_str() {
        "server" => server(addr, n),
        "client" => {
            let mut opts = ClientOpts {
                par: 16,
                rtt: 1000,
                server_pid: None,
                close_each: false,
            };
            let mut it = args[4..].iter();
            while let Some(a) = it.next() {
                let v = it.next().and_then(|v| v.parse::<usize>().ok());
                match (a.as_str(), v) {
                    ("--par", Some(v)) if v > 0 => opts.par = v,
                    ("--rtt", Some(v)) => opts.rtt = v,
                    ("--server-pid", Some(v)) => opts.server_pid = Some(v),
                    ("--close-each", Some(v)) => opts.close_each = v != 0,
                    _ => return usage(),
                }
            }
            client(addr, n, &opts)
        }
        _ => return usage(),
    };
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("scale_conns: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Many connections need many fds: the soft limit goes up to the hard one (as servers do).
fn raise_nofile() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain getrlimit/setrlimit on a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

fn os_err(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

// ---- server ---------------------------------------------------------------------------

fn server(addr: SocketAddr, n: usize) -> io::Result<bool> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let lfd = listener.as_raw_fd();
    // SAFETY: epoll_create1 with a valid flag.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if ep < 0 {
        return Err(os_err("epoll_create1"));
    }
    add(ep, lfd)?;
    let (mut accepted, mut closed) = (0usize, 0usize);
    let mut evs = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
    let mut buf = [0u8; 4096];
    while closed < n {
        // SAFETY: valid epoll fd and buffer.
        let k = unsafe { libc::epoll_wait(ep, evs.as_mut_ptr(), evs.len() as c_int, 1000) };
        if k < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(os_err("epoll_wait"));
        }
        for ev in &evs[..k as usize] {
            let fd = ev.u64 as c_int;
            if fd == lfd {
                while accepted < n {
                    // SAFETY: accept4 on our nonblocking listener; no address wanted.
                    let c = unsafe {
                        libc::accept4(lfd, std::ptr::null_mut(), std::ptr::null_mut(), 0)
                    };
                    if c < 0 {
                        break; // EAGAIN: wait for the next readiness
                    }
                    accepted += 1;
                    add(ep, c)?;
                }
                continue;
            }
            // SAFETY: read into our buffer from a connection we accepted.
            let r = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
            if r > 0 {
                write_all(fd, &buf[..r as usize])?;
            } else if r == 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                // SAFETY: our fd; closing also removes it from the epoll set.
                unsafe { libc::close(fd) };
                closed += 1;
            }
        }
    }
    println!("ok {n} connections served");
    Ok(true)
}

fn add(ep: c_int, fd: c_int) -> io::Result<()> {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: fd as u64,
    };
    // SAFETY: valid epoll fd, fd and event.
    if unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
        return Err(os_err("epoll_ctl"));
    }
    Ok(())
}

fn write_all(fd: c_int, mut b: &[u8]) -> io::Result<()> {
    while !b.is_empty() {
        // SAFETY: write from a live slice to a connection we accepted (blocking).
        let w = unsafe { libc::write(fd, b.as_ptr().cast(), b.len()) };
        if w < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        b = &b[w as usize..];
    }
    Ok(())
}

// ---- client ---------------------------------------------------------------------------

struct ClientOpts {
    par: usize,
    rtt: usize,
    server_pid: Option<usize>,
    close_each: bool,
}

/// One connection set up: connect, a byte each way.
fn set_up(addr: SocketAddr, i: usize) -> io::Result<TcpStream> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    let b = [i as u8];
    s.write_all(&b)?;
    let mut r = [0u8; 1];
    s.read_exact(&mut r)?;
    if r != b {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "first byte echoed wrong",
        ));
    }
    Ok(s)
}

fn client(addr: SocketAddr, n: usize, o: &ClientOpts) -> io::Result<bool> {
    let next = AtomicUsize::new(0);
    let conns: Mutex<Vec<Option<TcpStream>>> = Mutex::new((0..n).map(|_| None).collect());
    let failures: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let lat: Mutex<Vec<f64>> = Mutex::new(Vec::with_capacity(n));
    let busy0 = busy_cpu_ms();
    let t0 = Instant::now();
    std::thread::scope(|sc| {
        for _ in 0..o.par.min(n.max(1)) {
            sc.spawn(|| loop {
                let i = next.fetch_add(1, Relaxed);
                if i >= n {
                    return;
                }
                let t = Instant::now();
                match set_up(addr, i) {
                    Ok(s) => {
                        lat.lock().unwrap().push(t.elapsed().as_secs_f64() * 1e3);
                        if !o.close_each {
                            conns.lock().unwrap()[i] = Some(s);
                        }
                    }
                    Err(e) => failures.lock().unwrap().push(format!("conn {i}: {e}")),
                }
            });
        }
    });
    let setup_s = t0.elapsed().as_secs_f64();
    let busy1 = busy_cpu_ms();
    let (setup_user_ms, setup_kernel_ms) = if busy0.0 > 0.0 && busy1.0 > 0.0 {
        (busy1.0 - busy0.0, busy1.1 - busy0.1)
    } else {
        (0.0, 0.0) // unknown
    };
    let mut conns: Vec<TcpStream> = conns.into_inner().unwrap().into_iter().flatten().collect();
    let mut failures = failures.into_inner().unwrap();
    let mut lat = lat.into_inner().unwrap();
    lat.sort_by(f64::total_cmp);

    // All open: memory and queue pairs.
    let me = std::process::id() as usize;
    let (cli_pin, cli_lck) = pinned_kib(me);
    let (srv_pin, srv_lck) = o.server_pid.map_or((0, 0), pinned_kib);
    let qps = rc_qps();

    // Round trips on one connection while all are open.
    let mut rtt = Vec::with_capacity(o.rtt);
    if let Some(s) = conns.first_mut() {
        let msg = [0x5au8; 64];
        let mut back = [0u8; 64];
        for _ in 0..o.rtt {
            let t = Instant::now();
            if let Err(e) = s.write_all(&msg).and_then(|()| s.read_exact(&mut back)) {
                failures.push(format!("round trip: {e}"));
                break;
            }
            rtt.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    rtt.sort_by(f64::total_cmp);

    // Every connection echoes its own pattern.
    let mut verified = if o.close_each { lat.len() } else { 0 };
    for (i, s) in conns.iter_mut().enumerate() {
        let pat: Vec<u8> = (0..64).map(|k| (i * 31 + k * 7) as u8).collect();
        let mut back = [0u8; 64];
        match s.write_all(&pat).and_then(|()| s.read_exact(&mut back)) {
            Ok(()) if back[..] == pat[..] => verified += 1,
            Ok(()) => failures.push(format!("conn {i}: echo differs")),
            Err(e) => failures.push(format!("conn {i}: echo: {e}")),
        }
    }
    drop(conns);

    let ok = failures.is_empty() && verified == n;
    let q = |v: &[f64], p: f64| {
        if v.is_empty() {
            0.0
        } else {
            v[((v.len() - 1) as f64 * p) as usize]
        }
    };
    let per = |x: u64| if n > 0 { x as f64 / n as f64 } else { 0.0 };
    println!(
        "{{\"ok\": {ok}, \"n\": {n}, \"par\": {}, \"opened\": {}, \"verified\": {verified}, \
         \"setup_s\": {setup_s:.3}, \"setup_per_s\": {:.1}, \"cpu_ms_per_setup\": {:.2}, \
         \"user_cpu_ms_per_setup\": {:.2}, \
         \"connect_ms_p50\": {:.2}, \
         \"connect_ms_p99\": {:.2}, \"cli_vmpin_kib\": {cli_pin}, \"cli_vmlck_kib\": {cli_lck}, \
         \"srv_vmpin_kib\": {srv_pin}, \"srv_vmlck_kib\": {srv_lck}, \
         \"pin_kib_per_conn\": {:.1}, \"rc_qps\": {qps}, \"rtt_us_p50\": {:.1}, \
         \"rtt_us_p99\": {:.1}, \"rtt_rounds\": {}}}",
        o.par,
        lat.len(),
        lat.len() as f64 / setup_s.max(1e-9),
        (setup_user_ms + setup_kernel_ms) / lat.len().max(1) as f64,
        setup_user_ms / lat.len().max(1) as f64,
        q(&lat, 0.5),
        q(&lat, 0.99),
        per(cli_pin.max(cli_lck)),
        q(&rtt, 0.5),
        q(&rtt, 0.99),
        rtt.len()
    );
    for f in failures.iter().take(10) {
        eprintln!("FAIL {f}");
    }
    Ok(ok)
}

/// CPU time the whole machine spent busy (all CPUs, not idle or waiting for I/O), ms, as
/// (user, kernel): the setup's work at both ends, the kernel's and the device's included.
/// (0, 0) if `/proc/stat` cannot be read (out of fds).
fn busy_cpu_ms() -> (f64, f64) {
    let s = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<f64> = s
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal guest guest_nice (guest time is
    // already in user)
    let sum = |idx: &[usize]| idx.iter().filter_map(|&i| v.get(i)).sum::<f64>();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (sum(&[0, 1]) * 1000.0 / hz, sum(&[2, 5, 6, 7]) * 1000.0 / hz)
}

/// `VmPin` and `VmLck` of `pid`, KiB (0 if unreadable).
fn pinned_kib(pid: usize) -> (u64, u64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmPin:"), field("VmLck:"))
}

/// RC queue pairs on the host's RDMA devices (`rdma resource show qp`), 0 without the tool.
fn rc_qps() -> usize {
    Command::new("rdma")
        .args(["resource", "show", "qp"])
        .env_remove("LD_PRELOAD")
        .stderr(Stdio::null())
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| l.contains(" type RC "))
                .count()
        })
        .unwrap_or(0)
}
