//! `rsock`: the user's front door to the shim.
//!
//! - `rsock run [OPTIONS] -- PROGRAM ARGS...` runs a program with librsock.so preloaded.
//! - `rsock stat` lists processes with the shim loaded, their connections by path (rdma, tcp,
//!   passthrough), bytes each way, fallback reasons and live connections — read from the
//!   per-process stats regions (see `rsock_core::stats`); `--watch` refreshes it live.
//! - `rsock rules [FILE]` checks a rules file the way the shim reads it.
//! - `rsock check [HOST[:PORT]]` checks the device, memlock, and a peer over RDMA.

mod check;
mod explain;
mod openmetrics;
mod out;
mod run;
mod stat;
mod watch;

use out::outln;
use std::process::ExitCode;

const USAGE: &str = "usage:
  rsock run [OPTIONS] [--] PROGRAM [ARGS...]   run PROGRAM with librsock.so preloaded
  rsock stat [OPTIONS] [PID...]                 counters of processes running with the shim
  rsock rules [FILE]                            check a rules file (default: RSOCK_CONFIG or /etc/rsock.conf)
  rsock rules --explain ADDR:PORT [--prog NAME] [--server] [FILE]
                                                how the shim decides for one connection
  rsock check [HOST[:PORT]]                     can this host use RDMA; does a server answer over it
  rsock help [COMMAND]                          a command's usage (also rsock COMMAND --help)
  rsock --version";

const RULES_USAGE: &str = "usage: rsock rules [FILE]
       rsock rules --explain ADDR:PORT [--prog NAME] [--server] [FILE]
Prints each rule of FILE as the shim understands it, and every line it would ignore.
FILE: RSOCK_CONFIG if set, else /etc/rsock.conf.
--explain: how the shim decides for a connect to ADDR:PORT (--server: a listener on it),
step by step: RSOCK_EXCLUDE, the first rule that matches (--prog: for program NAME;
without it rules with prog= do not match), RSOCK_RDMA — with this environment's RSOCK_*.
Exit status: 0 if every line is a rule; 1 if a line would be ignored or FILE cannot be read;
2 for a usage error.";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rest = args.get(1..).unwrap_or(&[]);
    match args.first().map(String::as_str) {
        Some("run") => run::main(rest),
        Some("stat") => stat::main(rest),
        Some("rules") => rules(rest),
        Some("check") => check::main(rest),
        Some("help" | "-h" | "--help") => help(rest),
        Some("-V" | "--version") => {
            outln!("rsock {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Some(a) if a.starts_with('-') => usage_error(&format!("unknown option {a:?}")),
        Some(a) => usage_error(&format!("unknown command {a:?}")),
        None => usage_error("no command given"),
    }
}

fn usage_error(msg: &str) -> ExitCode {
    eprintln!("rsock: {msg}\n{USAGE}");
    ExitCode::from(2)
}

/// `rsock help [COMMAND]`: the usage of COMMAND, or of rsock.
fn help(topic: &[String]) -> ExitCode {
    let text = match topic.first().map(String::as_str) {
        None | Some("help" | "-h" | "--help") => USAGE,
        Some("run") => run::USAGE,
        Some("stat") => stat::USAGE,
        Some("rules") => RULES_USAGE,
        Some("check") => check::USAGE,
        Some(c) => return usage_error(&format!("unknown command {c:?}")),
    };
    outln!("{text}");
    ExitCode::SUCCESS
}

fn rules_usage(msg: &str) -> ExitCode {
    eprintln!("rsock rules: {msg}\n{RULES_USAGE}");
    ExitCode::from(2)
}

/// `rsock rules [FILE]`: prints each rule as the shim understands it, and every line it
/// would ignore; exit status 1 if there is one.
fn rules(args: &[String]) -> ExitCode {
    use rsock_core::config::Config;
    if args
        .iter()
        .any(|a| a == "--explain" || a.starts_with("--explain="))
    {
        return match explain_question(args) {
            Ok(q) => explain::explain(&q),
            Err(e) => rules_usage(&e),
        };
    }
    let path = match args {
        [] => {
            match &Config::get().rules_path {
                Some(p) => p.clone(),
                None => {
                    outln!("no rules file (RSOCK_CONFIG unset and {} absent): every connection tries RDMA", rsock_core::config::DEFAULT_RULES);
                    return ExitCode::SUCCESS;
                }
            }
        }
        [h] if h == "-h" || h == "--help" => {
            outln!("{RULES_USAGE}");
            return ExitCode::SUCCESS;
        }
        [f] if !f.starts_with('-') => std::path::PathBuf::from(f),
        [o] => return rules_usage(&format!("unknown option {o:?}")),
        _ => return rules_usage("one FILE at most"),
    };
    let mut c = Config {
        rules_path: Some(path.clone()),
        ..Config::default()
    };
    let mut problems = Vec::new();
    c.load_rules(&mut problems);
    for r in &c.rules {
        outln!("line {:<4} {r}", r.line);
    }
    for p in &problems {
        eprintln!("rsock rules: {p}");
    }
    outln!(
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

/// The arguments of `rsock rules --explain`.
fn explain_question(args: &[String]) -> Result<explain::Question, String> {
    let mut addr = None;
    let mut prog = None;
    let mut role = rsock_core::rules::Role::Client;
    let mut file = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (opt, inline) = match a.split_once('=') {
            Some((o, v)) if o.starts_with("--") => (o, Some(v.to_string())),
            _ => (a.as_str(), None),
        };
        let mut value = |name: &str| {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match opt {
            "--explain" => {
                let v = value("--explain")?;
                addr = Some(v.parse::<std::net::SocketAddr>().map_err(|_| {
                    format!("--explain {v:?}: expected ADDR:PORT (IPv6: [ADDR]:PORT)")
                })?);
            }
            "--prog" => prog = Some(value("--prog")?),
            "--server" => role = rsock_core::rules::Role::Server,
            "-h" | "--help" => return Err("--help takes no other arguments".into()),
            o if o.starts_with('-') => return Err(format!("unknown option {o:?}")),
            f if file.is_none() => file = Some(std::path::PathBuf::from(f)),
            _ => return Err("one FILE at most".into()),
        }
    }
    Ok(explain::Question {
        addr: addr.ok_or("--explain needs ADDR:PORT")?,
        prog,
        role,
        file,
    })
}
