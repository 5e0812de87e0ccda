//! Echoes a byte stream over one TCP connection through the libc calls that read and write a
//! socket without the plain data calls: stdio on an `fdopen`ed socket, `dprintf`,
//! `sendmmsg`/`recvmmsg` and `preadv2`/`pwritev2` (tests/rdma/shim_matrix.sh, cells libc_*).
//!
//! ```text
//! libc_io server ADDR:PORT IN OUT [--fork]        # accepts one connection and echoes it
//!                                                 # (in a child it forks for it: --fork)
//! libc_io client ADDR:PORT IN OUT [--stdio-first] < data > echoed
//! ```
//!
//! IN (how the socket is read): `stdio` (`fdopen(fd, "r")`, `fread`), `mmsg` (`recvmmsg`, four
//! 16 KiB messages, `MSG_WAITFORONE`), `rw2` (`preadv2` at offset -1, two iovecs; every
//! other read with `RWF_NOWAIT` — `poll` on EAGAIN, without it where the kernel answers
//! EOPNOTSUPP), `plain` (`read`).
//! OUT (how it is written): `stdio` (`fdopen(dup(fd), "w")`, `fwrite`, `fflush`), `dprintf`
//! (`dprintf(fd, "%s", chunk)`: the data must hold no NUL byte), `stdout` (`dup2(fd, 1)`,
//! then `fwrite` to stdio's `stdout`), `mmsg` (`sendmmsg`, four messages), `rw2` (`pwritev2`
//! at offset -1), `plain` (`write`).
//! The client sends stdin with OUT (then half-closes) while it reads the echo with IN to
//! stdout; `--stdio-first` makes the reading `FILE` before `connect` (IN must be `stdio`).
//! Status 0 when every call did what it should; a failed call is reported on stderr, status 1.

use libc::{c_int, c_void, iovec};
use std::ffi::CString;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::IntoRawFd;
use std::process::ExitCode;

const CHUNK: usize = 16 * 1024;

extern "C" {
    fn dprintf(fd: c_int, fmt: *const libc::c_char, ...) -> c_int;
    static mut stdout: *mut libc::FILE;
}

fn check(what: &str, r: isize) -> io::Result<usize> {
    if r < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    Ok(r as usize)
}

/// Reads the socket one way.
enum Reader {
    Stdio(*mut libc::FILE),
    Mmsg(c_int),
    Rw2(c_int, u32),
    Plain(c_int),
}

impl Reader {
    fn new(mode: &str, fd: c_int, file: Option<*mut libc::FILE>) -> io::Result<Reader> {
        Ok(match mode {
            "stdio" => match file {
                Some(f) => Reader::Stdio(f),
                None => Reader::Stdio(fdopen(fd, "r")?),
            },
            "mmsg" => Reader::Mmsg(fd),
            "rw2" => Reader::Rw2(fd, 0),
            "plain" => Reader::Plain(fd),
            m => return Err(io::Error::other(format!("unknown IN mode {m}"))),
        })
    }

    /// Appends what one call read to `out`; 0 at end of stream.
    fn read(&mut self, out: &mut Vec<u8>) -> io::Result<usize> {
        let mut buf = vec![0u8; 4 * CHUNK];
        // SAFETY: every call writes into `buf`, within its length.
        let n = unsafe {
            match self {
                Reader::Stdio(f) => {
                    let n = libc::fread(buf.as_mut_ptr().cast(), 1, buf.len(), *f);
                    if n == 0 && libc::ferror(*f) != 0 {
                        return Err(io::Error::other("fread failed"));
                    }
                    n
                }
                Reader::Mmsg(fd) => {
                    let mut iov: Vec<iovec> = buf
                        .chunks_mut(CHUNK)
                        .map(|c| iovec {
                            iov_base: c.as_mut_ptr().cast(),
                            iov_len: c.len(),
                        })
                        .collect();
                    let mut msgs = one_per_message(&mut iov);
                    let r = libc::recvmmsg(
                        *fd,
                        msgs.as_mut_ptr(),
                        msgs.len() as u32,
                        libc::MSG_WAITFORONE,
                        std::ptr::null_mut(),
                    );
                    let got = check("recvmmsg", r as isize)?;
                    // Messages are filled in order; a short one ends what arrived.
                    let mut n = 0;
                    for (i, m) in msgs[..got].iter().enumerate() {
                        let len = m.msg_len as usize;
                        buf.copy_within(i * CHUNK..i * CHUNK + len, n);
                        n += len;
                    }
                    n
                }
                Reader::Rw2(fd, calls) => {
                    *calls += 1;
                    let (a, b) = buf.split_at_mut(CHUNK);
                    let iov = [
                        iovec {
                            iov_base: a.as_mut_ptr().cast(),
                            iov_len: a.len(),
                        },
                        iovec {
                            iov_base: b.as_mut_ptr().cast(),
                            iov_len: b.len(),
                        },
                    ];
                    let mut flags = if *calls % 2 == 0 { libc::RWF_NOWAIT } else { 0 };
                    loop {
                        let r = libc::preadv2(*fd, iov.as_ptr(), 2, -1, flags);
                        if r < 0
                            && flags != 0
                            && io::Error::last_os_error().raw_os_error() == Some(libc::EOPNOTSUPP)
                        {
                            flags = 0; // a kernel without RWF_NOWAIT for this socket
                            continue;
                        }
                        if r < 0 && io::Error::last_os_error().kind() == io::ErrorKind::WouldBlock {
                            let mut p = libc::pollfd {
                                fd: *fd,
                                events: libc::POLLIN,
                                revents: 0,
                            };
                            libc::poll(&mut p, 1, 10_000);
                            continue;
                        }
                        break check("preadv2", r)?;
                    }
                }
                Reader::Plain(fd) => {
                    check("read", libc::read(*fd, buf.as_mut_ptr().cast(), buf.len()))?
                }
            }
        };
        out.extend_from_slice(&buf[..n]);
        Ok(n)
    }
}

/// Writes the socket one way.
enum Writer {
    Stdio(*mut libc::FILE),
    Dprintf(c_int),
    Mmsg(c_int),
    Rw2(c_int),
    Plain(c_int),
}

impl Writer {
    fn new(mode: &str, fd: c_int) -> io::Result<Writer> {
        Ok(match mode {
            // SAFETY: dup of our own fd.
            "stdio" => Writer::Stdio(fdopen(unsafe { libc::dup(fd) }, "w")?),
            "dprintf" => Writer::Dprintf(fd),
            // SAFETY: our own fd onto 1; stdio's stdout is then the socket.
            "stdout" => unsafe {
                check("dup2", libc::dup2(fd, 1) as isize)?;
                Writer::Stdio(stdout)
            },
            "mmsg" => Writer::Mmsg(fd),
            "rw2" => Writer::Rw2(fd),
            "plain" => Writer::Plain(fd),
            m => return Err(io::Error::other(format!("unknown OUT mode {m}"))),
        })
    }

    fn write_all(&mut self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            // SAFETY: every call reads from `data`, within its length.
            let n = unsafe {
                match self {
                    Writer::Stdio(f) => {
                        let n = libc::fwrite(data.as_ptr().cast(), 1, data.len(), *f);
                        if n == 0 {
                            return Err(io::Error::other("fwrite failed"));
                        }
                        n
                    }
                    Writer::Dprintf(fd) => {
                        let s = CString::new(data)
                            .map_err(|_| io::Error::other("NUL in dprintf data"))?;
                        check("dprintf", dprintf(*fd, c"%s".as_ptr(), s.as_ptr()) as isize)?
                    }
                    Writer::Mmsg(fd) => {
                        let mut iov: Vec<iovec> = data
                            .chunks(CHUNK)
                            .take(4)
                            .map(|c| iovec {
                                iov_base: c.as_ptr() as *mut c_void,
                                iov_len: c.len(),
                            })
                            .collect();
                        let mut msgs = one_per_message(&mut iov);
                        let sent = check(
                            "sendmmsg",
                            libc::sendmmsg(*fd, msgs.as_mut_ptr(), msgs.len() as u32, 0) as isize,
                        )?;
                        // A stream takes the messages in order: a short one ends the batch.
                        let mut n = 0;
                        for m in &msgs[..sent] {
                            n += m.msg_len as usize;
                            if (m.msg_len as usize)
                                < m.msg_hdr.msg_iov.as_ref().map_or(0, |v| v.iov_len)
                            {
                                break;
                            }
                        }
                        n
                    }
                    Writer::Rw2(fd) => {
                        let iov = iovec {
                            iov_base: data.as_ptr() as *mut c_void,
                            iov_len: data.len().min(4 * CHUNK),
                        };
                        check("pwritev2", libc::pwritev2(*fd, &iov, 1, -1, 0))?
                    }
                    Writer::Plain(fd) => {
                        check("write", libc::write(*fd, data.as_ptr().cast(), data.len()))?
                    }
                }
            };
            data = &data[n..];
        }
        Ok(())
    }

    fn finish(self, fd: c_int) -> io::Result<()> {
        // SAFETY: our FILE and fd.
        unsafe {
            if let Writer::Stdio(f) = self {
                if libc::fflush(f) != 0 {
                    return Err(io::Error::other("fflush failed"));
                }
                libc::fclose(f);
            }
            check("shutdown", libc::shutdown(fd, libc::SHUT_WR) as isize)?;
        }
        Ok(())
    }
}

/// A message per iovec, for `sendmmsg`/`recvmmsg`.
fn one_per_message(iov: &mut [iovec]) -> Vec<libc::mmsghdr> {
    iov.iter_mut()
        .map(|v| {
            // SAFETY: mmsghdr is plain data; zeroed, then given its one iovec.
            let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
            m.msg_hdr.msg_iov = v;
            m.msg_hdr.msg_iovlen = 1;
            m
        })
        .collect()
}

fn fdopen(fd: c_int, mode: &str) -> io::Result<*mut libc::FILE> {
    let m = CString::new(mode).expect("mode");
    // SAFETY: valid fd and mode string.
    let f = unsafe { libc::fdopen(fd, m.as_ptr()) };
    if f.is_null() {
        return Err(io::Error::last_os_error());
    }
    Ok(f)
}

fn server(addr: SocketAddr, inm: &str, outm: &str, fork: bool) -> io::Result<()> {
    let l = TcpListener::bind(addr)?;
    let (c, _) = l.accept()?;
    let fd = c.into_raw_fd();
    if fork {
        // SAFETY: fork; the child only echoes and exits, the parent waits for it.
        match unsafe { libc::fork() } {
            -1 => return Err(io::Error::last_os_error()),
            0 => {
                drop(l);
                let code = match echo(fd, inm, outm) {
                    Ok(()) => 0,
                    Err(e) => {
                        eprintln!("libc_io: child: {e}");
                        1
                    }
                };
                // SAFETY: end the child without running the parent's exit handlers twice.
                unsafe { libc::_exit(code) };
            }
            child => {
                // SAFETY: our own fd, then wait for our own child.
                unsafe { libc::close(fd) };
                let mut status = 0;
                check("waitpid", unsafe { libc::waitpid(child, &mut status, 0) }
                    as isize)?;
                if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
                    return Err(io::Error::other(format!(
                        "child ended with status {status:#x}"
                    )));
                }
                return Ok(());
            }
        }
    }
    echo(fd, inm, outm)
}

/// The server's echo of the accepted connection `fd`.
fn echo(fd: c_int, inm: &str, outm: &str) -> io::Result<()> {
    let mut r = Reader::new(inm, fd, None)?;
    let mut w = Writer::new(outm, fd)?;
    let mut total = 0;
    loop {
        let mut got = Vec::new();
        if r.read(&mut got)? == 0 {
            break;
        }
        total += got.len();
        w.write_all(&got)?;
    }
    w.finish(fd)?;
    eprintln!("server: echoed {total} bytes (in {inm}, out {outm})");
    Ok(())
}

fn client(addr: SocketAddr, inm: &str, outm: &str, stdio_first: bool) -> io::Result<()> {
    let v6 = addr.is_ipv6();
    // SAFETY: plain socket calls on our own fd.
    let fd = unsafe {
        libc::socket(
            if v6 { libc::AF_INET6 } else { libc::AF_INET },
            libc::SOCK_STREAM,
            0,
        )
    };
    check("socket", fd as isize)?;
    let early = if stdio_first {
        Some(fdopen(fd, "r")?)
    } else {
        None
    };
    let std::net::SocketAddr::V4(a4) = addr else {
        return Err(io::Error::other("IPv4 only"));
    };
    let sa = libc::sockaddr_in {
        sin_family: libc::AF_INET as u16,
        sin_port: a4.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a4.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: a valid sockaddr_in.
    let r = unsafe {
        libc::connect(
            fd,
            (&sa as *const libc::sockaddr_in).cast(),
            std::mem::size_of_val(&sa) as u32,
        )
    };
    check("connect", r as isize)?;
    let mut reader = Reader::new(inm, fd, early)?;
    let outm2 = outm.to_string();
    let writer = std::thread::spawn(move || -> io::Result<usize> {
        let mut w = Writer::new(&outm2, fd)?;
        let mut data = Vec::new();
        io::stdin().read_to_end(&mut data)?;
        for c in data.chunks(3 * CHUNK + 123) {
            w.write_all(c)?;
        }
        w.finish(fd)?;
        Ok(data.len())
    });
    let mut out = io::stdout().lock();
    let mut total = 0;
    loop {
        let mut got = Vec::new();
        if reader.read(&mut got)? == 0 {
            break;
        }
        total += got.len();
        out.write_all(&got)?;
    }
    out.flush()?;
    let sent = writer
        .join()
        .map_err(|_| io::Error::other("writer panicked"))??;
    eprintln!("client: sent {sent}, got {total} bytes (in {inm}, out {outm})");
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 5 {
        eprintln!("usage: libc_io server|client ADDR:PORT IN OUT [--fork|--stdio-first]");
        return ExitCode::from(2);
    }
    let Ok(addr) = args[2].parse::<SocketAddr>() else {
        eprintln!("bad address {}", args[2]);
        return ExitCode::from(2);
    };
    let r = match args[1].as_str() {
        "server" => server(
            addr,
            &args[3],
            &args[4],
            args.get(5).is_some_and(|a| a == "--fork"),
        ),
        "client" => client(
            addr,
            &args[3],
            &args[4],
            args.get(5).is_some_and(|a| a == "--stdio-first"),
        ),
        m => Err(io::Error::other(format!("unknown role {m}"))),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("libc_io: {e}");
            ExitCode::FAILURE
        }
    }
}
