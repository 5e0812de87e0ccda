//! A program that sandboxes itself with a seccomp filter, as vsftpd's session processes,
//! OpenSSH's pre-auth child and browsers' renderers do, and then uses TCP. It checks that
//! the shim stands aside once a filter is installed (`init::seal`): a filter allows the
//! program's calls, not the shim's.
//!
//! ```text
//! sandboxed [--socket-first] [--via prctl|syscall]
//! ```
//!
//! The filter kills the process on `open`, `openat`, `unlink` and `unlinkat`: calls this
//! program makes none of once it is installed, and that a shim which did not stand aside
//! would make (its rules file and stats region on first use, a log file, its stats file's
//! removal at exit). Then a listener on 127.0.0.1 and one
//! connection to it carry 1 MiB each way, checked byte for byte.
//!
//! `--socket-first`: one connection (and its bytes) before the filter, so the shim is
//! running when it comes. `--via syscall`: the filter is installed with `syscall(SYS_seccomp)`
//! as libseccomp does, rather than `prctl(PR_SET_SECCOMP)` as vsftpd does.
//!
//! Exit status: 0 = done; 1 = failure; 2 = usage. Killed by SIGSYS if a forbidden call was
//! made.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::ExitCode;

const LEN: usize = 1 << 20;

fn main() -> ExitCode {
    let mut socket_first = false;
    let mut via_syscall = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match (
            a.as_str(),
            (a == "--via").then(|| args.next()).flatten().as_deref(),
        ) {
            ("--socket-first", None) => socket_first = true,
            ("--via", Some("prctl")) => via_syscall = false,
            ("--via", Some("syscall")) => via_syscall = true,
            _ => {
                eprintln!("usage: sandboxed [--socket-first] [--via prctl|syscall]");
                return ExitCode::from(2);
            }
        }
    }
    if socket_first {
        if let Err(e) = exchange() {
            eprintln!("sandboxed: before the filter: {e}");
            return ExitCode::from(1);
        }
    }
    if let Err(e) = install_filter(via_syscall) {
        eprintln!("sandboxed: filter: {e}");
        return ExitCode::from(1);
    }
    match exchange() {
        Ok(()) => {
            println!("sandboxed: ok: {LEN} bytes each way under the filter");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sandboxed: under the filter: {e}");
            ExitCode::from(1)
        }
    }
}

/// The pattern both ends write: position-dependent, so a lost or repeated chunk shows.
fn pattern() -> Vec<u8> {
    (0..LEN).map(|i| (i * 7 + i / 4096) as u8).collect()
}

/// One connection over loopback: the client sends the pattern, the server echoes it.
fn exchange() -> std::io::Result<()> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let server = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut c, _) = l.accept()?;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = c.read(&mut buf)?;
            if n == 0 {
                return Ok(());
            }
            c.write_all(&buf[..n])?;
        }
    });
    let mut c = TcpStream::connect(addr)?;
    let data = pattern();
    let mut w = c.try_clone()?;
    let sent = data.clone();
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
        w.write_all(&sent)?;
        w.shutdown(std::net::Shutdown::Write)
    });
    let mut got = Vec::with_capacity(LEN);
    c.read_to_end(&mut got)?;
    let joined = |r: std::thread::Result<std::io::Result<()>>| {
        r.unwrap_or_else(|_| Err(std::io::Error::other("thread panicked")))
    };
    joined(writer.join())?;
    joined(server.join())?;
    if got != data {
        return Err(std::io::Error::other(format!(
            "echo differs: {} bytes back, {LEN} sent",
            got.len()
        )));
    }
    Ok(())
}

/// Kills the process on the calls listed in the module doc; allows the rest.
fn install_filter(via_syscall: bool) -> std::io::Result<()> {
    const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    const ALLOW: u32 = 0x7fff_0000;
    const KILL_PROCESS: u32 = 0x8000_0000;
    let forbidden = [
        libc::SYS_open,
        libc::SYS_openat,
        libc::SYS_unlink,
        libc::SYS_unlinkat,
    ];
    let op = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    let n = forbidden.len() as u8;
    let mut f = vec![
        op(LD_W_ABS, 0, 0, 4), // seccomp_data.arch
        op(JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        op(RET_K, 0, 0, KILL_PROCESS),
        op(LD_W_ABS, 0, 0, 0), // seccomp_data.nr
    ];
    for (i, nr) in forbidden.iter().enumerate() {
        // Jumps to the KILL at the end: past the remaining tests and the ALLOW.
        f.push(op(JEQ_K, n - i as u8, 0, *nr as u32));
    }
    f.push(op(RET_K, 0, 0, ALLOW));
    f.push(op(RET_K, 0, 0, KILL_PROCESS));
    let prog = libc::sock_fprog {
        len: f.len() as u16,
        filter: f.as_mut_ptr(),
    };
    // SAFETY: plain prctl/seccomp calls with a filter that outlives them.
    let r = unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if via_syscall {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                0,
                &prog as *const libc::sock_fprog,
            ) as i32
        } else {
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const libc::sock_fprog,
            )
        }
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
