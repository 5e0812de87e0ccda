//! `rsock log PID [LEVEL]`: a running process's log level, shown or changed through its
//! stats file (`rsock_core::stats::control`).

use crate::args::LogArgs;
use crate::out::outln;
use rsock_core::config::{Config, LevelFilter};
use rsock_core::stats::control::{self, Remote, LOG_UNWRITABLE};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// How long to wait for the process to take a new level.
const ANSWER_WITHIN: Duration = Duration::from_secs(3);

pub fn main(a: LogArgs) -> ExitCode {
    let pid = a.pid;
    let dir = a.dir.clone().unwrap_or_else(|| default_dir(pid));
    let comm = match std::fs::read_to_string(format!("/proc/{pid}/comm")) {
        Ok(c) => c.trim_end().to_string(),
        Err(_) => return fail(format!("pid {pid}: no such process")),
    };
    let remote = match Remote::open(&dir, pid) {
        Ok(r) => r,
        Err(e) => return fail(format!("pid {pid} {comm}: {}", open_error(&dir, pid, &e))),
    };
    let Some(level) = a.level else {
        outln!("pid {pid} {comm}: log {}", describe(&remote, &dir, pid));
        return ExitCode::SUCCESS;
    };
    // Checked by the parser with the shim's own rules; the log crate reads the same names.
    let Ok(level) = level.parse::<LevelFilter>() else {
        return crate::usage_error("log", format!("{level:?} is not a log level"));
    };
    remote.request(level);
    let start = Instant::now();
    while remote.current().0 != Some(level) {
        if start.elapsed() >= ANSWER_WITHIN {
            return fail(format!(
                "pid {pid} {comm}: asked for log level {}, not taken yet: the shim takes it \
                 at the process's next socket call (within a second if it has an RDMA engine); \
                 it logs {} until then",
                level.as_str().to_lowercase(),
                describe(&remote, &dir, pid)
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if remote.current().1 == LOG_UNWRITABLE {
        return fail(format!(
            "pid {pid} {comm}: log {}",
            describe(&remote, &dir, pid)
        ));
    }
    outln!("pid {pid} {comm}: log {}", describe(&remote, &dir, pid));
    ExitCode::SUCCESS
}

fn fail(msg: String) -> ExitCode {
    eprintln!("rsock log: {msg}");
    ExitCode::from(1)
}

/// The stats directory of `pid`: this environment's if the process has a file there, else
/// the default one of a user it runs as, or root's (where a server's worker made its file
/// before it dropped root).
fn default_dir(pid: u32) -> PathBuf {
    let own = Config::get().stats_dir.clone();
    let file = format!("{pid}.stats");
    let uids = control::process_uids(pid).unwrap_or_default();
    std::iter::once(own.clone())
        .chain(
            uids.iter()
                .chain(&[0])
                .map(|u| PathBuf::from(format!("/dev/shm/rsock-{u}"))),
        )
        .find(|d| d.join(&file).exists())
        .unwrap_or(own)
}

fn open_error(dir: &Path, pid: u32, e: &std::io::Error) -> String {
    let file = dir.join(format!("{pid}.stats"));
    match e.kind() {
        std::io::ErrorKind::NotFound => format!(
            "no {}: not running with the shim, RSOCK_STATS=0, no TCP socket yet, or another \
             stats directory (--dir)",
            file.display()
        ),
        std::io::ErrorKind::PermissionDenied => format!(
            "{}: permission denied: only the process's user or root may change its log",
            file.display()
        ),
        _ if e.raw_os_error() == Some(libc::EINVAL) => format!(
            "{} is not a stats file of this rsock's layout (version {}): use the rsock of \
             the build the process runs",
            file.display(),
            rsock_core::stats::VERSION
        ),
        _ => format!("{}: {e}", file.display()),
    }
}

/// "info to /var/log/x.log", "debug to DIR/PID.log", "off", and what to do when the
/// process cannot open its log.
fn describe(remote: &Remote, dir: &Path, pid: u32) -> String {
    let (level, target, file_pid) = remote.current();
    let rsock_log = rsock_log_of(pid).unwrap_or_else(|| "RSOCK_LOG".into());
    let stats_file = control::log_file(dir, file_pid);
    let said = control::describe(level, target, &rsock_log, &stats_file.to_string_lossy());
    if target == LOG_UNWRITABLE {
        format!(
            "{said} (did it drop the privileges it made its stats file with? start it with \
             RSOCK_LOG set to a file it can write)"
        )
    } else {
        said
    }
}

/// RSOCK_LOG in the environment `pid` started with, where we may read it.
fn rsock_log_of(pid: u32) -> Option<String> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    env.split(|&b| b == 0)
        .find_map(|kv| kv.strip_prefix(b"RSOCK_LOG="))
        .map(|v| String::from_utf8_lossy(v).into_owned())
}
