//! `rsock rules --explain ADDR:PORT [--prog NAME] [--server] [FILE]`: the shim's decision
//! for one connection, step by step, in the order `Config::decide` takes them.

use crate::out::outln;
use rsock_core::config::Config;
use rsock_core::rules::{Action, Role};
use std::net::SocketAddr;
use std::os::unix::ffi::OsStrExt;
use std::process::ExitCode;

/// What to explain.
pub struct Question {
    pub addr: SocketAddr,
    pub prog: Option<String>,
    pub role: Role,
    pub file: Option<std::path::PathBuf>,
}

/// The process's configuration as the shim would read it here (`RSOCK_*` from the
/// environment, the rules file from FILE, else `RSOCK_CONFIG` or /etc/rsock.conf).
fn config(q: &Question) -> (Config, Vec<String>) {
    let env = std::env::vars_os().filter(|(k, _)| k.as_bytes().starts_with(b"RSOCK_"));
    let (mut c, mut problems) = Config::parse(env);
    if let Some(f) = &q.file {
        c.rules_path = Some(f.clone());
    } else if std::env::var_os("RSOCK_CONFIG").is_none() {
        let d = std::path::PathBuf::from(rsock_core::config::DEFAULT_RULES);
        c.rules_path = d.exists().then_some(d);
    }
    c.load_rules(&mut problems);
    if let Some(p) = &q.prog {
        c.prog = p.clone();
    }
    (c, problems)
}

pub fn explain(q: &Question) -> ExitCode {
    let (c, problems) = config(q);
    for p in &problems {
        eprintln!("rsock rules: {p}");
    }
    let (role, local, remote) = match q.role {
        Role::Client => ("a connect to", None, Some(q.addr)),
        Role::Server => ("a listener on", Some(q.addr), None),
    };
    if c.prog.is_empty() {
        outln!(
            "{role} {} by a program not named (rules with prog= do not match; --prog NAME):",
            q.addr
        );
    } else {
        outln!("{role} {} by program {:?}:", q.addr, c.prog);
    }
    let mut step = 1;
    let mut say = |s: String| {
        outln!("  {step}. {s}");
        step += 1;
    };
    let decision = c.decide(q.role, local, remote);
    if let Some(n) = decision.exclude {
        say(format!(
            "RSOCK_EXCLUDE ({}) names {} (entry {n}): passthrough, no rule is read",
            std::env::var("RSOCK_EXCLUDE")
                .unwrap_or_else(|_| format!("default {}", rsock_core::config::DEFAULT_EXCLUDE)),
            q.addr
        ));
    } else {
        say(format!("RSOCK_EXCLUDE does not name {}", q.addr));
        let hit = decision
            .rule_line
            .and_then(|n| c.rules.iter().find(|r| r.line == n));
        match &c.rules_path {
            None => say("no rules file".into()),
            Some(p) => match hit {
                Some(r) => say(format!(
                    "{} line {}: {r} -- the first rule that matches",
                    p.display(),
                    r.line
                )),
                None => say(format!(
                    "{}: none of its {} rule(s) matches",
                    p.display(),
                    c.rules.len()
                )),
            },
        }
        if decision.rdma_off {
            say("RSOCK_RDMA=0: what would try RDMA takes kernel TCP".into());
        }
    }
    let what = match decision.action {
        Action::Rdma => "rdma: tries RDMA first, kernel TCP if RDMA cannot serve",
        Action::Tcp => "tcp: kernel TCP, counted with reason rule",
        Action::Passthrough => "passthrough: kernel TCP, not tried",
    };
    outln!("decision: {what}");
    let cause = decision.cause();
    if cause != rsock_core::stats::Cause::NONE {
        outln!("  rsock stat shows it with: {cause}");
    }
    if decision.action == Action::Rdma {
        outln!(
            "  buffers: ring {} KiB, send buffer {} KiB at full size",
            decision.ring_size / 1024,
            decision.send_buf / 1024
        );
    }
    if problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
