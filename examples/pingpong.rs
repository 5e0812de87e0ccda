//! TCP ping-pong round-trip latency with blocking `std::net::TcpStream`s and `TCP_NODELAY`,
//! for comparing rsock (`LD_PRELOAD=librsock.so`), kernel TCP and rdma-core's librspreload
//! with one and the same program (bench/rdma).
//!
//! ```text
//! pingpong server ADDR:PORT [--once] [--epoll]
//! pingpong client ADDR:PORT [--size N[,N...]] [--iters N[,N...]] [--warmup N] [--label S] [--epoll]
//! ```
//!
//! `--epoll`: the socket is nonblocking and every wait is an `epoll_wait` (level-triggered,
//! `EPOLLIN` registered once, `EPOLLOUT` added only while a write would block), the way an
//! event loop such as Redis's waits — rather than a blocking `read`.
//!
//! The client sends `--size` bytes, the server echoes them back, and the client times each
//! round trip with `Instant` (after `--warmup` untimed ones). Several sizes may be given, run
//! one after the other on the same connection; `--iters` is one count for all of them or one
//! per size. For each size the client prints one line:
//!
//! ```text
//! pingpong label=rsock size=64 iters=2000 median_us=52.1 p99_us=97.3 mean_us=55.0 min_us=41.2 max_us=812.4 cli_cpu_us_rt=48.1 srv_cpu_us_rt=47.9 cli_csw_rt=0.02 srv_csw_rt=0.01
//! ```
//!
//! `cli_cpu_us_rt`/`srv_cpu_us_rt`: CPU time (user + system, all threads of the process,
//! from `getrusage`) spent by each side during the timed round trips, per round trip; in µs
//! per round trip, which is also CPU seconds per million round trips. `*_csw_rt`: context
//! switches (voluntary + involuntary) per round trip. The server measures its own and sends
//! them back at the end of each size.
//!
//! The sockets are made with plain `socket`/`bind`/`listen`/`accept`/`connect` (no
//! `accept4`, no `SOCK_CLOEXEC`) and only then wrapped in `TcpStream`, because librspreload
//! intercepts only those forms; the data path is `TcpStream`'s `read_exact`/`write_all`.
//! The server serves connections one after another until killed (`--once`: one).
//!
//! Exit status: 0 = done; 1 = failure (I/O error, wrong echo); 2 = usage.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd};
use std::process::ExitCode;
use std::time::Instant;

const MAGIC: u32 = 0x5050_4e47; // "PPNG"

fn usage() -> ExitCode {
    eprintln!(
        "usage: pingpong server ADDR:PORT [--once] [--epoll]\n       \
         pingpong client ADDR:PORT [--size N[,N...]] [--iters N[,N...]] [--warmup N] [--label S] [--epoll]"
    );
    ExitCode::from(2)
}

fn os_err(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// A sockaddr for `a`, and its length.
fn sockaddr(a: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_storage is large enough and suitably aligned for sockaddr_in.
            let sin = unsafe {
                &mut *(&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>()
            };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = v4.port().to_be();
            sin.sin_addr.s_addr = u32::from_ne_bytes(v4.ip().octets());
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe {
                &mut *(&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = v6.port().to_be();
            sin6.sin6_addr.s6_addr = v6.ip().octets();
            sin6.sin6_scope_id = v6.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

fn tcp_socket(a: &SocketAddr) -> io::Result<libc::c_int> {
    let dom = if a.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain syscall wrapper.
    let fd = unsafe { libc::socket(dom, libc::SOCK_STREAM, 0) };
    if fd < 0 {
        return Err(os_err("socket"));
    }
    Ok(fd)
}

fn connect(a: &SocketAddr) -> io::Result<TcpStream> {
    let fd = tcp_socket(a)?;
    let (ss, len) = sockaddr(a);
    // SAFETY: ss holds a valid sockaddr of len bytes.
    if unsafe { libc::connect(fd, (&ss as *const libc::sockaddr_storage).cast(), len) } != 0 {
        let e = os_err("connect");
        // SAFETY: fd is ours.
        unsafe { libc::close(fd) };
        return Err(e);
    }
    // SAFETY: fd is a connected stream socket that we own.
    Ok(unsafe { TcpStream::from_raw_fd(fd) })
}

fn listen(a: &SocketAddr) -> io::Result<libc::c_int> {
    let fd = tcp_socket(a)?;
    let one: libc::c_int = 1;
    let (ss, len) = sockaddr(a);
    // SAFETY: valid option buffer; ss holds a valid sockaddr of len bytes.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
        if libc::bind(fd, (&ss as *const libc::sockaddr_storage).cast(), len) != 0 {
            return Err(os_err("bind"));
        }
        if libc::listen(fd, 16) != 0 {
            return Err(os_err("listen"));
        }
    }
    Ok(fd)
}

fn accept(lfd: libc::c_int) -> io::Result<TcpStream> {
    loop {
        // SAFETY: null address buffers are allowed.
        let fd = unsafe { libc::accept(lfd, std::ptr::null_mut(), std::ptr::null_mut()) };
        if fd >= 0 {
            // SAFETY: fd is a connected stream socket that we own.
            return Ok(unsafe { TcpStream::from_raw_fd(fd) });
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(os_err("accept"));
        }
    }
}

/// A connection whose waits are blocking reads and writes, or `epoll_wait` (`--epoll`).
struct Conn {
    s: TcpStream,
    /// The epoll fd, in `--epoll` mode.
    ep: Option<libc::c_int>,
}

impl Conn {
    fn new(s: TcpStream, epoll: bool) -> io::Result<Conn> {
        s.set_nodelay(true)?;
        if !epoll {
            return Ok(Conn { s, ep: None });
        }
        s.set_nonblocking(true)?;
        // SAFETY: plain syscall wrappers; ev is a valid epoll_event.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(os_err("epoll_create1"));
        }
        let c = Conn { s, ep: Some(ep) };
        c.ctl(libc::EPOLL_CTL_ADD, libc::EPOLLIN)?;
        Ok(c)
    }

    fn ctl(&self, op: libc::c_int, events: libc::c_int) -> io::Result<()> {
        let (Some(ep), fd) = (self.ep, self.s.as_raw_fd()) else {
            return Ok(());
        };
        let mut ev = libc::epoll_event {
            events: events as u32,
            u64: fd as u64,
        };
        // SAFETY: our epoll fd and socket; valid event.
        if unsafe { libc::epoll_ctl(ep, op, fd, &mut ev) } != 0 {
            return Err(os_err("epoll_ctl"));
        }
        Ok(())
    }

    /// Waits in epoll_wait until the socket is ready (anything: the caller retries).
    fn wait(&self) -> io::Result<()> {
        let Some(ep) = self.ep else { return Ok(()) };
        // SAFETY: all-zero is a valid epoll_event.
        let mut ev: libc::epoll_event = unsafe { std::mem::zeroed() };
        loop {
            // SAFETY: our epoll fd; room for one event.
            match unsafe { libc::epoll_wait(ep, &mut ev, 1, -1) } {
                n if n > 0 => return Ok(()),
                _ if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
                _ => return Err(os_err("epoll_wait")),
            }
        }
    }
}

impl Read for Conn {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.s.read(b) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.wait()?,
                r => return r,
            }
        }
    }
}

impl Write for Conn {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        loop {
            match self.s.write(b) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.ctl(libc::EPOLL_CTL_MOD, libc::EPOLLIN | libc::EPOLLOUT)?;
                    let r = self.wait();
                    self.ctl(libc::EPOLL_CTL_MOD, libc::EPOLLIN)?;
                    r?;
                }
                r => return r,
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(ep) = self.ep {
            // SAFETY: our epoll fd.
            unsafe { libc::close(ep) };
        }
    }
}

/// (CPU µs user + system, context switches voluntary + involuntary) of this process so far.
fn usage_now() -> (u64, u64) {
    // SAFETY: all-zero is a valid rusage; getrusage fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    (
        us(ru.ru_utime) + us(ru.ru_stime),
        (ru.ru_nvcsw + ru.ru_nivcsw) as u64,
    )
}

fn get_u32(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[i * 4..i * 4 + 4].try_into().unwrap())
}
fn get_u64(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap())
}

/// One connection: headers (magic, size, warmup, iters) until a size of 0 or EOF.
fn serve(mut s: Conn) -> io::Result<()> {
    let mut buf = Vec::new();
    loop {
        let mut h = [0u8; 16];
        match s.read_exact(&mut h) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        if get_u32(&h, 0) != MAGIC {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "bad header"));
        }
        let (size, warmup, iters) = (get_u32(&h, 1) as usize, get_u32(&h, 2), get_u32(&h, 3));
        if size == 0 {
            return Ok(());
        }
        buf.resize(size, 0);
        for _ in 0..warmup {
            s.read_exact(&mut buf)?;
            s.write_all(&buf)?;
        }
        let (c0, w0) = usage_now();
        for _ in 0..iters {
            s.read_exact(&mut buf)?;
            s.write_all(&buf)?;
        }
        let (c1, w1) = usage_now();
        let mut t = [0u8; 16];
        t[..8].copy_from_slice(&(c1 - c0).to_le_bytes());
        t[8..].copy_from_slice(&(w1 - w0).to_le_bytes());
        s.write_all(&t)?;
    }
}

fn server(addr: &SocketAddr, once: bool, epoll: bool) -> io::Result<()> {
    let lfd = listen(addr)?;
    loop {
        let s = Conn::new(accept(lfd)?, epoll)?;
        if let Err(e) = serve(s) {
            eprintln!("pingpong server: {e}");
            if once {
                return Err(e);
            }
        }
        if once {
            return Ok(());
        }
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    // nearest rank
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn client(
    addr: &SocketAddr,
    sizes: &[usize],
    iters: &[u32],
    warmup: u32,
    label: &str,
    epoll: bool,
) -> io::Result<()> {
    let mut s = Conn::new(connect(addr)?, epoll)?;
    for (k, &size) in sizes.iter().enumerate() {
        let n = if iters.len() == 1 { iters[0] } else { iters[k] };
        let mut h = [0u8; 16];
        for (i, v) in [MAGIC, size as u32, warmup, n].into_iter().enumerate() {
            h[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
        }
        s.write_all(&h)?;
        let mut out = vec![0u8; size];
        let mut back = vec![0u8; size];
        let mut rtt = Vec::with_capacity(n as usize);
        let mut c0 = (0, 0);
        for i in 0..(warmup + n) {
            if i == warmup {
                c0 = usage_now();
            }
            // A different first and last byte each round trip, checked on the way back.
            let tag = (i as u8).wrapping_mul(31).wrapping_add(7);
            out[0] = tag;
            out[size - 1] = !tag;
            let t = Instant::now();
            s.write_all(&out)?;
            s.read_exact(&mut back)?;
            let d = t.elapsed();
            if back[0] != tag || back[size - 1] != !tag {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "echo differs from what was sent",
                ));
            }
            if i >= warmup {
                rtt.push(d.as_secs_f64() * 1e6);
            }
        }
        let c1 = usage_now();
        let mut t = [0u8; 16];
        s.read_exact(&mut t)?;
        let (srv_cpu, srv_csw) = (get_u64(&t, 0), get_u64(&t, 1));
        if rtt.is_empty() {
            continue;
        }
        let mean = rtt.iter().sum::<f64>() / rtt.len() as f64;
        rtt.sort_by(f64::total_cmp);
        let nf = n as f64;
        println!(
            "pingpong label={label} size={size} iters={n} median_us={:.2} p99_us={:.2} mean_us={:.2} min_us={:.2} max_us={:.2} \
             cli_cpu_us_rt={:.2} srv_cpu_us_rt={:.2} cli_csw_rt={:.3} srv_csw_rt={:.3}",
            percentile(&rtt, 50.0),
            percentile(&rtt, 99.0),
            mean,
            rtt[0],
            rtt[rtt.len() - 1],
            (c1.0 - c0.0) as f64 / nf,
            srv_cpu as f64 / nf,
            (c1.1 - c0.1) as f64 / nf,
            srv_csw as f64 / nf,
        );
        io::stdout().flush()?;
    }
    // size 0: end of this connection
    let mut h = [0u8; 16];
    h[..4].copy_from_slice(&MAGIC.to_le_bytes());
    s.write_all(&h)?;
    Ok(())
}

fn list<T: std::str::FromStr>(v: &str) -> Option<Vec<T>> {
    v.split(',').map(|x| x.trim().parse().ok()).collect()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 2 {
        return usage();
    }
    let Ok(addr) = args[1].parse::<SocketAddr>() else {
        eprintln!("pingpong: ADDR:PORT expected, got {}", args[1]);
        return usage();
    };
    let (mut sizes, mut iters, mut warmup, mut label, mut once, mut epoll) = (
        vec![64usize],
        vec![1000u32],
        100u32,
        "-".to_string(),
        false,
        false,
    );
    let mut it = args[2..].iter();
    while let Some(a) = it.next() {
        let ok = match a.as_str() {
            "--once" => {
                once = true;
                true
            }
            "--epoll" => {
                epoll = true;
                true
            }
            "--size" => it.next().and_then(|v| list(v)).map(|v| sizes = v).is_some(),
            "--iters" => it.next().and_then(|v| list(v)).map(|v| iters = v).is_some(),
            "--warmup" => it
                .next()
                .and_then(|v| v.parse().ok())
                .map(|v| warmup = v)
                .is_some(),
            "--label" => it.next().map(|v| label = v.clone()).is_some(),
            _ => false,
        };
        if !ok {
            eprintln!("pingpong: bad argument {a}");
            return usage();
        }
    }
    if sizes.is_empty()
        || sizes.iter().any(|&s| s == 0 || s > u32::MAX as usize)
        || (iters.len() != 1 && iters.len() != sizes.len())
    {
        eprintln!("pingpong: sizes must be > 0; --iters takes one count or one per size");
        return usage();
    }
    let r = match args[0].as_str() {
        "server" => server(&addr, once, epoll),
        "client" => client(&addr, &sizes, &iters, warmup, &label, epoll),
        _ => return usage(),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pingpong {}: {e}", args[0]);
            ExitCode::from(1)
        }
    }
}
