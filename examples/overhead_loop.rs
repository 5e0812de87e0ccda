//! Tight loops of read/write on non-socket fds, to measure what the shim adds to calls it
//! only forwards (bench/overhead/run.sh).
//!
//! ```text
//! overhead_loop count N   # N write()s of 1 byte to /dev/null, then N read()s of 1 byte
//!                         # from /dev/zero; prints nothing (run it under callgrind)
//! overhead_loop time N    # same loops, timed in-process: prints
//!                         # "write_ns X" and "read_ns Y" (ns per call)
//! overhead_loop count-tcp N  # N write()s of 1 byte on a loopback TCP connection, each
//!                         # followed by a 1-byte read() on the other end (the shim tracks
//!                         # and counts both ends); prints nothing
//! ```
//!
//! The calls go through libc's `write`/`read` symbols, as a C program's would, so the shim's
//! hooks interpose them when it is preloaded.

use std::ffi::CString;
use std::process::ExitCode;
use std::time::Instant;

fn open(path: &str, flags: libc::c_int) -> libc::c_int {
    let p = CString::new(path).unwrap();
    // SAFETY: NUL-terminated path.
    let fd = unsafe { libc::open(p.as_ptr(), flags) };
    assert!(fd >= 0, "open {path}");
    fd
}

#[inline(never)]
fn writes(fd: libc::c_int, n: u64) {
    let b = [0u8; 1];
    for _ in 0..n {
        // SAFETY: valid 1-byte buffer.
        let r = unsafe { libc::write(fd, b.as_ptr().cast(), 1) };
        debug_assert_eq!(r, 1);
        std::hint::black_box(r);
    }
}

#[inline(never)]
fn reads(fd: libc::c_int, n: u64) {
    let mut b = [0u8; 1];
    for _ in 0..n {
        // SAFETY: valid 1-byte buffer.
        let r = unsafe { libc::read(fd, b.as_mut_ptr().cast(), 1) };
        debug_assert_eq!(r, 1);
        std::hint::black_box(r);
    }
}

#[inline(never)]
fn tcp_pingpong(w: libc::c_int, r: libc::c_int, n: u64) {
    let b = [7u8; 1];
    let mut got = [0u8; 1];
    for _ in 0..n {
        // SAFETY: valid 1-byte buffers on our own connected sockets.
        unsafe {
            let x = libc::write(w, b.as_ptr().cast(), 1);
            let y = libc::read(r, got.as_mut_ptr().cast(), 1);
            debug_assert!(x == 1 && y == 1);
            std::hint::black_box((x, y));
        }
    }
}

/// A connected loopback TCP pair made with std (through the libc calls the shim hooks).
fn tcp_pair() -> (std::net::TcpStream, std::net::TcpStream) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let c = std::net::TcpStream::connect(l.local_addr().unwrap()).expect("connect");
    let (s, _) = l.accept().expect("accept");
    c.set_nodelay(true).unwrap();
    (c, s)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mode, n) = match args.as_slice() {
        [m, n] => match n.parse::<u64>() {
            Ok(n) => (m.as_str(), n),
            Err(_) => return usage(),
        },
        _ => return usage(),
    };
    let null = open("/dev/null", libc::O_WRONLY);
    let zero = open("/dev/zero", libc::O_RDONLY);
    match mode {
        "count-tcp" => {
            use std::os::unix::io::AsRawFd;
            let (c, s) = tcp_pair();
            tcp_pingpong(c.as_raw_fd(), s.as_raw_fd(), n);
        }
        "count" => {
            writes(null, n);
            reads(zero, n);
        }
        "time" => {
            // Warm up (page faults, lazy binding), then time.
            writes(null, 10_000);
            reads(zero, 10_000);
            let t = Instant::now();
            writes(null, n);
            let w = t.elapsed();
            let t = Instant::now();
            reads(zero, n);
            let r = t.elapsed();
            println!("write_ns {:.2}", w.as_nanos() as f64 / n.max(1) as f64);
            println!("read_ns {:.2}", r.as_nanos() as f64 / n.max(1) as f64);
        }
        _ => return usage(),
    }
    ExitCode::SUCCESS
}

fn usage() -> ExitCode {
    eprintln!("usage: overhead_loop count|time|count-tcp N");
    ExitCode::from(2)
}
