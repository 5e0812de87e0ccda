//! `rsock`: the user's front door to the shim.
//!
//! - `rsock run [OPTIONS] -- PROGRAM ARGS...` runs a program with librsock.so preloaded.
//! - `rsock stat` lists processes with the shim loaded, their connections by path (rdma, tcp,
//!   passthrough), bytes each way, fallback reasons and live connections — read from the
//!   per-process stats regions (see `rsock_core::stats`); `--watch` refreshes it live.
//! - `rsock rules [FILE]` checks a rules file the way the shim reads it.
//! - `rsock check [HOST[:PORT]]` checks the device, memlock, and a peer over RDMA.
//! - `rsock log PID [LEVEL]` shows or changes a running process's log level.
//! - `rsock completions SHELL` prints a shell completion script.
//!
//! The command line is defined once, with clap, in `args.rs`: parsing, `--help`, the man
//! pages and the completions all come from there (`man.rs`).

mod args;
mod check;
mod explain;
mod log;
mod man;
mod openmetrics;
mod out;
mod run;
mod stat;
mod watch;

use args::{Cli, Command};
use clap::FromArgMatches as _;
use out::outln;
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let argv = args::join_watch_interval(std::env::args_os().collect());
    let matches = match args::parser().try_get_matches_from(argv) {
        Ok(m) => m,
        Err(e) => return clap_exit(&e),
    };
    // The hidden commands first: `Cli` does not know them.
    match matches.subcommand() {
        Some(("__man", m)) => return man::write_pages(m.get_one::<PathBuf>("dir").unwrap()),
        Some(("check", m)) => {
            if let Some(p) = m.subcommand_matches("__probe") {
                return check::probe(*p.get_one("addr").unwrap());
            }
        }
        _ => {}
    }
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => return clap_exit(&e),
    };
    match cli.command {
        Command::Run(a) => run::main(a),
        Command::Stat(a) => stat::main(a),
        Command::Rules(a) => rules(a),
        Command::Check(a) => check::main(a),
        Command::Log(a) => log::main(a),
        Command::Completions(a) => man::completions(a.shell),
    }
}

/// What clap's error says, where it belongs: help and version on stdout (quietly ending if
/// stdout is a closed pipe, as everything rsock prints there), errors on stderr with their
/// status (2 for a usage error).
fn clap_exit(e: &clap::Error) -> ExitCode {
    if e.use_stderr() {
        let _ = e.print();
        return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
    }
    out::print(format_args!("{}", e.render()));
    ExitCode::SUCCESS
}

/// A usage error of `rsock COMMAND` found after parsing, said as clap says its own (the
/// message, COMMAND's usage, a pointer to --help), status 2.
pub fn usage_error(command: &str, msg: impl std::fmt::Display) -> ExitCode {
    let mut cmd = args::parser();
    cmd.build();
    let e = match cmd.find_subcommand_mut(command) {
        Some(sub) => sub.error(clap::error::ErrorKind::ValueValidation, msg),
        None => cmd.error(clap::error::ErrorKind::ValueValidation, msg),
    };
    clap_exit(&e)
}

/// `rsock rules [FILE]`: prints each rule as the shim understands it, and every line it
/// would ignore; exit status 1 if there is one. With `--explain`, the decision for one
/// connection (explain.rs).
fn rules(a: args::RulesArgs) -> ExitCode {
    use rsock_core::config::Config;
    if let Some(addr) = a.explain {
        return explain::explain(&explain::Question {
            addr,
            prog: a.prog,
            role: if a.server {
                rsock_core::rules::Role::Server
            } else {
                rsock_core::rules::Role::Client
            },
            file: a.file,
        });
    }
    let path = match a.file {
        Some(f) => f,
        None => {
            match &Config::get().rules_path {
                Some(p) => p.clone(),
                None => {
                    outln!("no rules file (RSOCK_CONFIG unset and {} absent): every connection tries RDMA", rsock_core::config::DEFAULT_RULES);
                    return ExitCode::SUCCESS;
                }
            }
        }
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
