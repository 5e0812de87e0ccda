//! `rsock`: the user's front door to the shim.
//!
//! - `rsock run [OPTIONS] -- PROGRAM ARGS...` runs a program with librsock.so preloaded.
//! - `rsock stat` lists processes with the shim loaded, their connections by path (rdma, tcp,
//!   passthrough), bytes each way, fallback reasons and live connections — read from the
//!   per-process stats regions (see `rsock_core::stats`); `--watch` refreshes it live.
//! - `rsock rules [FILE]` checks a rules file the way the shim reads it.

// A binary's root looks for modules beside it (src/bin/), where cargo would take them for
// binaries of their own: they live in src/bin/rsock/.
#[path = "rsock/run.rs"]
mod run;
#[path = "rsock/stat.rs"]
mod stat;
#[path = "rsock/watch.rs"]
mod watch;

use std::process::ExitCode;

const USAGE: &str = "usage:
  rsock run [OPTIONS] [--] PROGRAM [ARGS...]   run PROGRAM with librsock.so preloaded
  rsock stat [OPTIONS] [PID...]                 counters of processes running with the shim
  rsock rules [FILE]                            check a rules file (default: RSOCK_CONFIG or /etc/rsock.conf)
  rsock help [run|stat]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rest = args.get(1..).unwrap_or(&[]);
    match args.first().map(String::as_str) {
        Some("run") => run::main(rest),
        Some("stat") => stat::main(rest),
        Some("rules") => rules(rest),
        Some("-h" | "--help" | "help") => {
            match rest.first().map(String::as_str) {
                Some("run") => println!("{}", run::USAGE),
                Some("stat") => println!("{}", stat::USAGE),
                _ => println!("{USAGE}"),
            }
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

/// `rsock rules [FILE]`: prints each rule as the shim understands it, and every line it
/// would ignore; exit status 1 if there is one.
fn rules(args: &[String]) -> ExitCode {
    use rsock_core::config::Config;
    let path = match args {
        [] => {
            match &Config::get().rules_path {
                Some(p) => p.clone(),
                None => {
                    println!("no rules file (RSOCK_CONFIG unset and {} absent): every connection tries RDMA", rsock_core::config::DEFAULT_RULES);
                    return ExitCode::SUCCESS;
                }
            }
        }
        [f] if !f.starts_with('-') => std::path::PathBuf::from(f),
        _ => {
            eprintln!("usage: rsock rules [FILE]");
            return ExitCode::from(2);
        }
    };
    let mut c = Config {
        rules_path: Some(path.clone()),
        ..Config::default()
    };
    let mut problems = Vec::new();
    c.load_rules(&mut problems);
    for r in &c.rules {
        println!("line {:<4} {r}", r.line);
    }
    for p in &problems {
        eprintln!("rsock rules: {p}");
    }
    println!(
        "{}: {} rule(s), {} line(s) ignored",
        path.display(),
        c.rules.len(),
        problems.len()
    );
    if problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
