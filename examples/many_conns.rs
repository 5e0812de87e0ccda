//! Many concurrent TCP connections, each echoing a few KiB (tests/rdma/shim_matrix.sh, cell
//! many_conns). Only `std::net`.
//!
//! ```text
//! many_conns server ADDR:PORT N BYTES   # accepts N connections, echoes each until EOF
//! many_conns client ADDR:PORT N BYTES [HOLD_MS]
//!                                       # opens N connections at once (one thread each),
//!                                       # waits until all are open (and HOLD_MS more, for
//!                                       # a sampler to see them), then each sends BYTES
//!                                       # (a pattern of its own), reads them back, checks
//! ```
//!
//! Both print `ok N` at the end (client: `ok N connections, BYTES bytes each verified`) and
//! exit 0 only if every connection succeeded; failures are printed one per line.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::{Arc, Barrier};
use std::thread;

fn pattern(conn: usize, len: usize) -> Vec<u8> {
    let mut x: u32 = 0x9E37_79B9u32.wrapping_mul(conn as u32 + 1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

fn server(addr: &str, n: usize) -> io::Result<usize> {
    let listener = TcpListener::bind(addr)?;
    let mut handles = Vec::with_capacity(n);
    for _ in 0..n {
        let (mut conn, _) = listener.accept()?;
        handles.push(thread::Builder::new().stack_size(256 * 1024).spawn(
            move || -> io::Result<u64> {
                let mut buf = [0u8; 16384];
                let mut total = 0u64;
                loop {
                    let k = match conn.read(&mut buf) {
                        Ok(0) => break,
                        Ok(k) => k,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(e),
                    };
                    conn.write_all(&buf[..k])?;
                    total += k as u64;
                }
                conn.shutdown(Shutdown::Write)?;
                Ok(total)
            },
        )?);
    }
    drop(listener);
    let mut ok = 0;
    for (i, h) in handles.into_iter().enumerate() {
        match h.join() {
            Ok(Ok(_)) => ok += 1,
            Ok(Err(e)) => println!("conn {i}: {e}"),
            Err(_) => println!("conn {i}: thread panicked"),
        }
    }
    Ok(ok)
}

fn client(addr: &str, n: usize, bytes: usize, hold: std::time::Duration) -> usize {
    let barrier = Arc::new(Barrier::new(n));
    let mut handles = Vec::with_capacity(n);
    for i in 0..n {
        let addr = addr.to_string();
        let barrier = barrier.clone();
        handles.push(
            thread::Builder::new()
                .stack_size(256 * 1024)
                .spawn(move || -> io::Result<()> {
                    let conn = TcpStream::connect(&addr);
                    // Everyone waits here, connected or not, so all are open at once.
                    barrier.wait();
                    thread::sleep(hold);
                    let mut conn = conn?;
                    let data = pattern(i, bytes);
                    let mut w = conn.try_clone()?;
                    let d2 = data.clone();
                    let writer = thread::Builder::new().stack_size(128 * 1024).spawn(
                        move || -> io::Result<()> {
                            w.write_all(&d2)?;
                            w.shutdown(Shutdown::Write)
                        },
                    )?;
                    let mut back = Vec::with_capacity(bytes);
                    conn.read_to_end(&mut back)?;
                    writer
                        .join()
                        .map_err(|_| io::Error::other("writer panicked"))??;
                    if back != data {
                        return Err(io::Error::other(format!(
                            "echo mismatch: {} bytes back",
                            back.len()
                        )));
                    }
                    Ok(())
                })
                .expect("spawn"),
        );
    }
    let mut ok = 0;
    for (i, h) in handles.into_iter().enumerate() {
        match h.join() {
            Ok(Ok(())) => ok += 1,
            Ok(Err(e)) => println!("conn {i}: {e}"),
            Err(_) => println!("conn {i}: thread panicked"),
        }
    }
    ok
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = || {
        eprintln!("usage: many_conns server|client ADDR:PORT N BYTES [HOLD_MS]");
        ExitCode::from(2)
    };
    let (role, addr, n, bytes, hold) = match args.as_slice() {
        [r, a, n, b] => (r, a, n, b, "0"),
        [r, a, n, b, h] => (r, a, n, b, h.as_str()),
        _ => return usage(),
    };
    let Ok(hold) = hold.parse::<u64>().map(std::time::Duration::from_millis) else {
        return usage();
    };
    let (Ok(n), Ok(bytes)) = (n.parse::<usize>(), bytes.parse::<usize>()) else {
        return usage();
    };
    let ok = match role.as_str() {
        "server" => match server(addr, n) {
            Ok(ok) => ok,
            Err(e) => {
                eprintln!("many_conns server: {e}");
                return ExitCode::FAILURE;
            }
        },
        "client" => client(addr, n, bytes, hold),
        _ => return usage(),
    };
    if role == "client" {
        println!("ok {ok} connections, {bytes} bytes each verified");
    } else {
        println!("ok {ok}");
    }
    if ok == n {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
