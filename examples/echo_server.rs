//! A threaded echo server: accepts forever, one thread per connection, echoes each until
//! EOF (then half-closes) or an error. Only `std::net`. Used by tests/rdma/isolation.sh as
//! the rsock server that a hostile peer attacks while a legitimate client streams through it.
//!
//! ```text
//! echo_server ADDR:PORT
//! ```
//!
//! Prints `listening ADDR` once, then one line per connection when it ends:
//! `conn=I peer=P bytes=N result=ok` or `conn=I peer=P bytes=N result=error: WHY`
//! (stdout is flushed after every line). Runs until killed; exits 1 if it cannot listen or
//! accept fails.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;

fn echo(conn: &mut TcpStream, total: &AtomicU64) -> io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let k = match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        conn.write_all(&buf[..k])?;
        total.fetch_add(k as u64, Ordering::Relaxed);
    }
    conn.shutdown(Shutdown::Write)
}

fn say(line: &str) {
    let out = io::stdout();
    let mut out = out.lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn main() -> ExitCode {
    let Some(addr) = std::env::args().nth(1) else {
        eprintln!("usage: echo_server ADDR:PORT");
        return ExitCode::from(2);
    };
    let listener = match TcpListener::bind(addr.as_str()) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("echo_server: bind {addr}: {e}");
            return ExitCode::from(1);
        }
    };
    say(&format!("listening {addr}"));
    for i in 0u64.. {
        let (mut conn, peer) = match listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                eprintln!("echo_server: accept: {e}");
                return ExitCode::from(1);
            }
        };
        let spawned = thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(move || {
                let total = AtomicU64::new(0);
                let r = echo(&mut conn, &total);
                let n = total.load(Ordering::Relaxed);
                match r {
                    Ok(()) => say(&format!("conn={i} peer={peer} bytes={n} result=ok")),
                    Err(e) => say(&format!("conn={i} peer={peer} bytes={n} result=error: {e}")),
                }
            });
        if let Err(e) = spawned {
            eprintln!("echo_server: spawn: {e}");
            return ExitCode::from(1);
        }
    }
    ExitCode::SUCCESS
}
