//! `rsock stat`: one look at the stats regions (or, with `--watch`, a live view).
//!
//! Regions live in `/dev/shm/rsock-<uid>/` (mode 0700, files 0600): a user sees their own
//! processes; another user's are refused by the kernel, and we say so plainly instead of
//! listing nothing.

use crate::args::StatArgs;
use crate::out::outln;
use crate::watch;
use rsock_core::config::Config;
use rsock_core::stats::read::{self, read_dir_reporting, DirContents, ListenerSnapshot, Snapshot};
use rsock_core::stats::{Cause, Detail, Fallback, Path};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::ExitCode;

/// What to show (`rsock stat`'s options, the directory resolved).
pub struct Opts {
    pub dir: PathBuf,
    pub dir_given: bool,
    pub all: bool,
    pub json: bool,
    pub openmetrics: bool,
    pub gc: bool,
    pub watch: Option<f64>,
    pub count: Option<u64>,
    pub pids: Vec<u32>,
}

impl From<StatArgs> for Opts {
    fn from(a: StatArgs) -> Opts {
        Opts {
            dir_given: a.dir.is_some(),
            dir: a.dir.unwrap_or_else(|| Config::get().stats_dir.clone()),
            all: a.all,
            json: a.json,
            openmetrics: a.openmetrics,
            gc: a.gc,
            watch: a.watch,
            count: a.count,
            pids: a.pids,
        }
    }
}

pub fn main(args: StatArgs) -> ExitCode {
    let o = Opts::from(args);
    if o.gc {
        for line in gc(&o.dir) {
            if o.json || o.openmetrics {
                eprintln!("rsock stat: {line}"); // stdout stays JSON or OpenMetrics only
            } else {
                outln!("{line}");
            }
        }
    }
    if o.watch.is_some() {
        return watch::main(&o);
    }
    let (procs, problems) = collect(&o);
    if o.openmetrics {
        outln!("{}", crate::openmetrics::render(&procs).trim_end());
        for p in &problems {
            eprintln!("rsock stat: {p}");
        }
        return if problems.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        };
    }
    let mut shown = 0;
    for s in &procs {
        shown += 1;
        if o.json {
            outln!("{}", s.to_json());
        } else {
            print_human(s);
        }
    }
    for p in &problems {
        eprintln!("rsock stat: {p}");
    }
    if shown == 0 && !o.json && problems.is_empty() {
        outln!("no rsock processes in {}", o.dir.display());
    }
    if problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// The processes to show, and what kept others from being shown (permission, unknown PID).
pub fn collect(o: &Opts) -> (Vec<Snapshot>, Vec<String>) {
    let mut problems = Vec::new();
    let mut procs = Vec::new();
    let mut noted = Vec::new(); // PIDs whose file was reported already
    match read_checked(&o.dir) {
        Ok(c) => {
            for (_, s) in c.procs {
                if (o.all || s.alive) && (o.pids.is_empty() || o.pids.contains(&s.pid)) {
                    procs.push(s);
                }
            }
            for (path, v) in &c.other_version {
                let pid = file_pid(path);
                if o.pids.is_empty() || pid.is_some_and(|p| o.pids.contains(&p)) {
                    problems.push(other_version_note(path, *v));
                    noted.extend(pid);
                }
            }
            if let Some((path, e)) = c.unreadable.first() {
                problems.push(format!(
                    "{} of the stats files in {} cannot be read ({}: {e}){}",
                    c.unreadable.len(),
                    o.dir.display(),
                    path.display(),
                    owner_hint(path)
                ));
            }
        }
        Err(msg) if o.pids.is_empty() => problems.push(msg),
        Err(_) => {} // PIDs asked for: each is looked for below, with its own message
    }
    // PIDs not found here: they may be another user's, whose files are in their own directory.
    for &pid in &o.pids {
        if procs.iter().any(|s| s.pid == pid) || noted.contains(&pid) {
            continue;
        }
        match lookup_elsewhere(o, pid) {
            Ok(Some(s)) => procs.push(s),
            Ok(None) => problems.push(format!(
                "pid {pid}: no rsock stats (not running with the shim, RSOCK_STATS=0, or no TCP socket yet)"
            )),
            Err(msg) => problems.push(format!("pid {pid}: {msg}")),
        }
    }
    procs.sort_by_key(|s| s.pid);
    (procs, problems)
}

/// The PID in a region file's name (`<pid>.stats`).
fn file_pid(path: &std::path::Path) -> Option<u32> {
    path.file_stem()?.to_str()?.parse().ok()
}

/// One line about a region file this build cannot read.
fn other_version_note(path: &std::path::Path, v: u8) -> String {
    format!(
        "{}: stats layout version {v}, this rsock reads version {} (the process runs another \
         build of rsock; use that build's rsock stat)",
        path.display(),
        rsock_core::stats::VERSION
    )
}

/// `--gc`: removes the region files of processes that have exited, and says which, one line
/// per file: "removed FILE: pid N PROGRAM (why)". Files of another layout version go too
/// when the pid in their name is not running.
fn gc(dir: &std::path::Path) -> Vec<String> {
    let Ok(c) = read_checked(dir) else {
        return Vec::new(); // collect() reports it
    };
    let mut dead: Vec<(PathBuf, String)> = Vec::new();
    for (path, s) in c.procs {
        if !s.alive {
            let why = if s.pid_reused {
                "exited; its pid now runs another process"
            } else {
                "exited"
            };
            dead.push((path, format!("pid {} {} ({why})", s.pid, s.comm)));
        }
    }
    for (path, v) in c.other_version {
        if let Some(pid) = file_pid(&path).filter(|&p| !pid_running(p)) {
            dead.push((
                path,
                format!("pid {pid} (exited; stats layout version {v})"),
            ));
        }
    }
    dead.sort();
    dead.into_iter()
        .filter_map(|(path, what)| match std::fs::remove_file(&path) {
            Ok(()) => Some(format!("removed {}: {what}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => Some(format!("cannot remove {}: {what}: {e}", path.display())),
        })
        .collect()
}

fn pid_running(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Reads a stats directory; a missing one is empty, an unreadable one is a clear message.
fn read_checked(dir: &std::path::Path) -> Result<DirContents, String> {
    match read_dir_reporting(dir) {
        Ok(c) => Ok(c),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(DirContents::default()),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Err(format!(
            "{}: permission denied{}",
            dir.display(),
            owner_hint(dir)
        )),
        Err(e) => Err(format!("{}: {e}", dir.display())),
    }
}

/// "; it belongs to uid N (name): ..." — who can read it.
fn owner_hint(path: &std::path::Path) -> String {
    let Ok(m) = std::fs::metadata(path) else {
        return String::new();
    };
    format!(
        ": it belongs to {}, and only that user or root may read another user's rsock stats \
         (run rsock stat as that user, or with sudo)",
        user_name(m.uid())
    )
}

/// "user NAME (uid N)", or "uid N" for a uid without a name.
fn user_name(uid: u32) -> String {
    match passwd_name(uid) {
        Some(n) => format!("user {n} (uid {uid})"),
        None => format!("uid {uid}"),
    }
}

/// The name of `uid` from the system's user database (NSS: files, LDAP, SSSD, systemd...).
fn passwd_name(uid: u32) -> Option<String> {
    let mut buf = vec![0u8; 1024];
    loop {
        // SAFETY: an all-zero passwd is a valid out-buffer; its pointers are only read when
        // getpwuid_r says it filled them (into buf, which outlives the reads).
        let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
        let mut found = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call; buf.len() is buf's size.
        let r = unsafe {
            libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr().cast(), buf.len(), &mut found)
        };
        if r == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        if r != 0 || found.is_null() || pw.pw_name.is_null() {
            return None;
        }
        // SAFETY: pw_name points at a NUL-terminated string in buf.
        let name = unsafe { std::ffi::CStr::from_ptr(pw.pw_name) };
        return Some(name.to_string_lossy().into_owned());
    }
}

/// A PID not in our directory: if it runs as another user, try that user's default
/// directory (only when no `--dir` was given).
fn lookup_elsewhere(o: &Opts, pid: u32) -> Result<Option<Snapshot>, String> {
    let Ok(m) = std::fs::metadata(format!("/proc/{pid}")) else {
        return Err("no such process".into());
    };
    // SAFETY: cannot fail.
    let me = unsafe { libc::geteuid() };
    if m.uid() == me || o.dir_given {
        return Ok(None);
    }
    let dir = PathBuf::from(format!("/dev/shm/rsock-{}", m.uid()));
    let file = dir.join(format!("{pid}.stats"));
    match std::fs::read(&file) {
        Ok(bytes) => match read::other_version(&bytes) {
            Some(v) => Err(other_version_note(&file, v)),
            None => Ok(read::parse(&bytes)),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Err(format!(
            "runs as {}; its stats ({}) are readable only by that user or root \
             (run rsock stat as that user, or with sudo)",
            user_name(m.uid()),
            file.display()
        )),
        Err(e) => Err(format!("{}: {e}", file.display())),
    }
}

/// "" for a live process, " (exited)", or " (exited; pid reused by another process)".
pub fn state(s: &Snapshot) -> &'static str {
    match (s.alive, s.pid_reused) {
        (true, _) => "",
        (false, false) => " (exited)",
        (false, true) => " (exited; pid reused by another process)",
    }
}

pub fn print_human(s: &Snapshot) {
    outln!("pid {} {}{}", s.pid, s.comm, state(s));
    outln!(
        "  {:<12} {:>8} {:>16} {:>16}",
        "path",
        "conns",
        "tx bytes",
        "rx bytes"
    );
    for p in [Path::Rdma, Path::Tcp, Path::Passthrough] {
        let i = p as usize;
        outln!(
            "  {:<12} {:>8} {:>16} {:>16}",
            p.name(),
            s.conns[i],
            s.tx[i],
            s.rx[i]
        );
    }
    let reasons = reasons(s);
    if !reasons.is_empty() {
        outln!("  fallbacks: {reasons}");
    }
    if let Some(f) = failed_connects(s) {
        outln!("  {f}");
    }
    if s.log
        .0
        .is_some_and(|l| l != rsock_core::config::LevelFilter::Off)
    {
        outln!("  log: {}", s.log_text());
    }
    for l in &s.listeners {
        outln!("  {}", listener_line(l));
    }
    if s.slept > 0 {
        outln!(
            "  blocking calls slept {} times ({} woke late)",
            s.slept,
            s.woke_late
        );
    }
    if s.settle_timeouts > 0 {
        outln!(
            "  nonblocking writes waited out their bound for completions {} times",
            s.settle_timeouts
        );
    }
    if s.grown_rings + s.grown_send > 0 {
        outln!(
            "  buffers grown under load: {} rings, {} send buffers",
            s.grown_rings,
            s.grown_send
        );
    }
    if s.links > 0 {
        outln!(
            "  links: {} set up, {} connections over them ({} on a grant)",
            s.links,
            s.link_streams,
            s.link_granted
        );
    }
    if s.branch_connects + s.branch_accepts > 0 {
        outln!(
            "  branches: {} connects went to one, {} connections accepted through this process's",
            s.branch_connects,
            s.branch_accepts
        );
    }
    for c in &s.sockets {
        outln!(
            "  fd {:<5} {:<5} {} -> {} tx {} rx {}{}",
            c.fd,
            c.path.name(),
            show_addr(c.local),
            show_addr(c.peer),
            c.tx,
            c.rx,
            cause_text(c.reason, c.detail)
        );
    }
}

/// "connects failed: 2 refused, 1 other" when a connect failed.
pub fn failed_connects(s: &Snapshot) -> Option<String> {
    (s.connects_refused + s.connects_failed > 0).then(|| {
        format!(
            "connects failed: {} refused, {} other",
            s.connects_refused, s.connects_failed
        )
    })
}

/// "  (rejected: rdma_cm REJECTED (...), ECONNREFUSED)": what put a connection on its path,
/// or "" when nothing did (RDMA by default).
pub fn cause_text(reason: Option<Fallback>, detail: Detail) -> String {
    let c = Cause { reason, detail };
    if c == Cause::NONE {
        String::new()
    } else {
        format!("  ({c})")
    }
}

/// "fd 3     listening on 127.0.0.1:5000  tcp only (excluded: RSOCK_EXCLUDE entry 1)", or
/// "... rdma+tcp".
pub fn listener_line(l: &ListenerSnapshot) -> String {
    let how = match l.tcp_only {
        None => format!("rdma+tcp{}", cause_text(None, l.detail)),
        Some(r) => format!("tcp only ({})", Cause::new(r, l.detail)),
    };
    format!("fd {:<5} listening on {}  {how}", l.fd, show_addr(l.local))
}

/// "peer_tcp=2 rule=1": the non-zero fallback counters.
pub fn reasons(s: &Snapshot) -> String {
    let v: Vec<String> = Fallback::ALL
        .iter()
        .filter(|r| s.fallback[**r as usize] > 0)
        .map(|r| format!("{}={}", r.name(), s.fallback[*r as usize]))
        .collect();
    v.join(" ")
}

pub fn show_addr(a: Option<std::net::SocketAddr>) -> String {
    a.map_or("-".to_string(), |a| a.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `rsock stat ARGS...` parsed as main() parses it.
    fn parse(v: &[&str]) -> Result<Opts, clap::Error> {
        use clap::FromArgMatches as _;
        let argv = ["rsock", "stat"]
            .iter()
            .chain(v)
            .map(std::ffi::OsString::from);
        let m = crate::args::parser()
            .try_get_matches_from(crate::args::join_watch_interval(argv.collect()))?;
        match crate::args::Cli::from_arg_matches(&m)?.command {
            crate::args::Command::Stat(a) => Ok(a.into()),
            _ => unreachable!(),
        }
    }

    #[test]
    fn user_names_come_from_the_user_database() {
        assert_eq!(user_name(0), "user root (uid 0)");
        assert_eq!(user_name(4_000_000_000), "uid 4000000000");
        // SAFETY: cannot fail.
        let me = unsafe { libc::getuid() };
        let id = std::process::Command::new("id")
            .arg("-un")
            .output()
            .unwrap();
        let name = String::from_utf8(id.stdout).unwrap();
        assert_eq!(user_name(me), format!("user {} (uid {me})", name.trim()));
    }

    #[test]
    fn watch_takes_an_optional_interval() {
        assert_eq!(parse(&["--watch"]).unwrap().watch, Some(1.0));
        assert_eq!(parse(&["--watch", "0.5"]).unwrap().watch, Some(0.5));
        let o = parse(&["--watch", "2", "12345"]).unwrap();
        assert_eq!((o.watch, o.pids.clone()), (Some(2.0), vec![12345]));
        let o = parse(&["--watch", "1234"]).unwrap();
        assert_eq!(
            (o.watch, o.pids.clone()),
            (Some(1.0), vec![1234]),
            "an integer above 60 is a PID"
        );
        assert_eq!(parse(&["--watch", "120s"]).unwrap().watch, Some(120.0));
        assert_eq!(
            parse(&["--watch=3", "--count", "2"]).unwrap().count,
            Some(2)
        );
        assert!(parse(&["--count", "2"]).is_err());
        assert!(parse(&["--watch=0"]).is_err());
        assert!(parse(&["--watch", "0"]).is_err(), "0 is not a PID");
        let o = parse(&["--watch", "--count=3", "--dir=/d"]).unwrap();
        assert_eq!((o.count, o.dir), (Some(3), PathBuf::from("/d")));
    }
}
