//! `rsock`: the user's window into running rsock processes.
//!
//! `rsock stat` lists processes with the shim loaded, their connections by path (rdma, tcp,
//! passthrough), bytes each way, fallback reasons and live connections — read from the
//! per-process stats regions (see `rsock_core::stats`).

use rsock_core::config::Config;
use rsock_core::stats::read::{read_dir, Snapshot};
use rsock_core::stats::{Fallback, Path};
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: rsock stat [--dir DIR] [--all] [--json] [--gc] [PID...]
  --dir DIR  stats directory (default: RSOCK_STATS_DIR or /dev/shm/rsock-<uid>)
  --all      include processes that have exited (their files were kept with RSOCK_STATS_KEEP=1)
  --json     one JSON object per process, one per line
  --gc       remove the files of processes that have exited";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("stat") => stat(&args[1..]),
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn stat(args: &[String]) -> ExitCode {
    let mut dir: PathBuf = Config::get().stats_dir.clone();
    let (mut all, mut json, mut gc) = (false, false, false);
    let mut pids = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--dir" => match it.next() {
                Some(d) => dir = PathBuf::from(d),
                None => return usage_error("--dir needs a value"),
            },
            "--all" => all = true,
            "--json" => json = true,
            "--gc" => gc = true,
            p => match p.parse::<u32>() {
                Ok(pid) => pids.push(pid),
                Err(_) => return usage_error(&format!("unknown argument {p:?}")),
            },
        }
    }
    let procs = match read_dir(&dir) {
        Ok(p) => p,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => {
            eprintln!("rsock stat: {}: {e}", dir.display());
            return ExitCode::from(1);
        }
    };
    let mut shown = 0;
    for (file, s) in &procs {
        if gc && !s.alive {
            let _ = std::fs::remove_file(file);
            continue;
        }
        if (!all && !s.alive) || (!pids.is_empty() && !pids.contains(&s.pid)) {
            continue;
        }
        shown += 1;
        if json {
            println!("{}", s.to_json());
        } else {
            print_human(s);
        }
    }
    if shown == 0 && !json {
        println!("no rsock processes in {}", dir.display());
    }
    ExitCode::SUCCESS
}

fn usage_error(msg: &str) -> ExitCode {
    eprintln!("rsock stat: {msg}\n{USAGE}");
    ExitCode::from(2)
}

fn print_human(s: &Snapshot) {
    let state = if s.alive { "" } else { " (exited)" };
    println!("pid {} {}{state}", s.pid, s.comm);
    println!(
        "  {:<12} {:>8} {:>16} {:>16}",
        "path", "conns", "tx bytes", "rx bytes"
    );
    for p in [Path::Rdma, Path::Tcp, Path::Passthrough] {
        let i = p as usize;
        println!(
            "  {:<12} {:>8} {:>16} {:>16}",
            p.name(),
            s.conns[i],
            s.tx[i],
            s.rx[i]
        );
    }
    let reasons: Vec<String> = Fallback::ALL
        .iter()
        .filter(|r| s.fallback[**r as usize] > 0)
        .map(|r| format!("{}={}", r.name(), s.fallback[*r as usize]))
        .collect();
    if !reasons.is_empty() {
        println!("  fallbacks: {}", reasons.join(" "));
    }
    for c in &s.sockets {
        let show = |a: Option<std::net::SocketAddr>| a.map_or("-".to_string(), |a| a.to_string());
        let why = c
            .reason
            .map_or(String::new(), |r| format!(" ({})", r.name()));
        println!(
            "  fd {:<5} {:<5}{why} {} -> {} tx {} rx {}",
            c.fd,
            c.path.name(),
            show(c.local),
            show(c.peer),
            c.tx,
            c.rx
        );
    }
}
