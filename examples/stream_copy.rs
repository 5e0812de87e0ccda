//! Copies a byte stream over one TCP connection, with nothing but `std::net`.
//!
//! ```text
//! stream_copy [--rw|--copy] server ADDR:PORT > out   # accepts one connection, writes it to stdout
//! stream_copy [--rw|--copy] client ADDR:PORT < in    # sends stdin, then half-closes
//! ```
//!
//! `--rw` (default) moves the bytes with a plain read/write loop; `--copy` uses
//! `std::io::copy`, which on Linux picks `sendfile`/`splice` when one side is a file or a pipe.
//! The client waits for the server to close after the half-close, so it exits only once
//! every byte has been taken. Used by the passthrough test matrix.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::ExitCode;

fn pump(from: &mut impl Read, to: &mut impl Write, use_copy: bool) -> io::Result<u64> {
    if use_copy {
        return io::copy(from, to);
    }
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&buf[..n])?;
        total += n as u64;
    }
}

fn run(args: &[String]) -> io::Result<()> {
    let mut use_copy = false;
    let mut rest = args;
    while let Some(first) = rest.first() {
        match first.as_str() {
            "--rw" => use_copy = false,
            "--copy" => use_copy = true,
            _ => break,
        }
        rest = &rest[1..];
    }
    match rest {
        [role, addr] if role == "server" => {
            let listener = TcpListener::bind(addr.as_str())?;
            let (mut conn, _) = listener.accept()?;
            drop(listener);
            let stdout = io::stdout();
            let mut out = stdout.lock();
            let n = if use_copy {
                pump(&mut conn, &mut *fd_file(1), true)?
            } else {
                pump(&mut conn, &mut out, false)?
            };
            out.flush()?;
            eprintln!("server: received {n} bytes");
            Ok(())
        }
        [role, addr] if role == "client" => {
            let mut conn = TcpStream::connect(addr.as_str())?;
            let n = if use_copy {
                pump(&mut *fd_file(0), &mut conn, true)?
            } else {
                pump(&mut io::stdin().lock(), &mut conn, false)?
            };
            conn.shutdown(Shutdown::Write)?;
            // Wait for the server's close: it has read everything by then.
            let mut sink = [0u8; 64];
            while conn.read(&mut sink)? > 0 {}
            eprintln!("client: sent {n} bytes");
            Ok(())
        }
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "usage: stream_copy [--rw|--copy] server|client ADDR:PORT",
        )),
    }
}

/// A `File` view of a standard fd that never closes it (std's `Stdin`/`Stdout` are
/// buffered; a `File` lets `io::copy` see the fd and pick sendfile/splice).
fn fd_file(fd: i32) -> std::mem::ManuallyDrop<std::fs::File> {
    use std::os::unix::io::FromRawFd;
    // SAFETY: fds 0 and 1 stay open for the life of the process; ManuallyDrop never closes.
    std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stream_copy: {e}");
            ExitCode::FAILURE
        }
    }
}
