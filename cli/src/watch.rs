//! `rsock stat --watch`: the stats redrawn every interval, with rates.
//!
//! Rates are differences between two reads of the same counters divided by the time between
//! the reads, per process and path, and per connection (keyed by pid, fd and addresses). On a
//! terminal each frame overwrites the last (cursor home, clear to end of line/screen); when
//! stdout is not a terminal, frames follow one another as plain text, each headed by a
//! `--- ` line with the time, so a log or a pipe reads naturally. With `--json`, each frame
//! is one line: a JSON object with the time and every process's counters (no rates: a reader
//! takes differences itself).

use crate::stat::{
    cause_text, collect, failed_connects, listener_line, reasons, show_addr, state, Opts,
};
use rsock_core::stats::read::{json_escape, Snapshot};
use rsock_core::stats::{Path, PATHS};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

/// Counters remembered from the previous frame.
#[derive(Default)]
struct Previous {
    at: Option<Instant>,
    procs: HashMap<u32, ([u64; PATHS], [u64; PATHS])>,
    conns: HashMap<ConnKey, (u64, u64)>,
}

type ConnKey = (
    u32,
    i32,
    Option<std::net::SocketAddr>,
    Option<std::net::SocketAddr>,
);

pub fn main(o: &Opts) -> ExitCode {
    let secs = o.watch.unwrap_or(1.0);
    // SAFETY: isatty only inspects the fd.
    let tty = unsafe { libc::isatty(1) } == 1;
    let mut prev = Previous::default();
    let mut out = std::io::stdout().lock();
    let mut frames = 0u64;
    loop {
        let (procs, problems) = collect(o);
        if frames == 0 && procs.is_empty() && !problems.is_empty() {
            for p in &problems {
                eprintln!("rsock stat: {p}");
            }
            return ExitCode::from(1);
        }
        let now = Instant::now();
        let dt = prev.at.map(|t| now.duration_since(t).as_secs_f64());
        let text = frame(o, secs, &procs, &problems, dt, &mut prev);
        prev.at = Some(now);
        let written = if o.json {
            writeln!(out, "{}", json_frame(o, secs, &procs, &problems))
        } else if tty {
            // Home, each line cleared to its end, then the rest of the screen cleared.
            let body: String = text.lines().map(|l| format!("{l}\x1b[K\n")).collect();
            write!(out, "\x1b[H{body}\x1b[J")
        } else {
            writeln!(out, "{text}")
        };
        if let Err(e) = written.and_then(|_| out.flush()) {
            crate::out::exit_on(&e); // quietly if the reader went away (a closed pipe)
        }
        frames += 1;
        if o.count.is_some_and(|n| frames >= n) {
            return ExitCode::SUCCESS;
        }
        std::thread::sleep(Duration::from_secs_f64(secs));
    }
}

fn frame(
    o: &Opts,
    secs: f64,
    procs: &[Snapshot],
    problems: &[String],
    dt: Option<f64>,
    prev: &mut Previous,
) -> String {
    let mut t = String::new();
    let (date, time) = utc_now();
    let _ = writeln!(
        t,
        "--- rsock stat --watch {secs}s  {date} {time} UTC  {}",
        o.dir.display()
    );
    if procs.is_empty() {
        let _ = writeln!(t, "no rsock processes");
    }
    let mut procs_now = HashMap::new();
    let mut conns_now = HashMap::new();
    for s in procs {
        let _ = writeln!(
            t,
            "pid {} {}{}  {:>13} {:>13} {:>11} {:>11}",
            s.pid,
            s.comm,
            state(s),
            "tx/s",
            "rx/s",
            "tx",
            "rx"
        );
        let before = prev.procs.get(&s.pid);
        for p in [Path::Rdma, Path::Tcp, Path::Passthrough] {
            let i = p as usize;
            if s.conns[i] == 0 && s.tx[i] == 0 && s.rx[i] == 0 {
                continue;
            }
            let tx_rate = rate(before.map(|b| b.0[i]), s.tx[i], dt);
            let rx_rate = rate(before.map(|b| b.1[i]), s.rx[i], dt);
            let _ = writeln!(
                t,
                "  {:<12} {:>5} conns  {:>13} {:>13} {:>11} {:>11}",
                p.name(),
                s.conns[i],
                tx_rate,
                rx_rate,
                bytes(s.tx[i]),
                bytes(s.rx[i])
            );
        }
        procs_now.insert(s.pid, (s.tx, s.rx));
        let r = reasons(s);
        if !r.is_empty() {
            let _ = writeln!(t, "  fallbacks: {r}");
        }
        if let Some(f) = failed_connects(s) {
            let _ = writeln!(t, "  {f}");
        }
        for l in &s.listeners {
            let _ = writeln!(t, "    {}", listener_line(l));
        }
        for c in &s.sockets {
            let key = (s.pid, c.fd, c.local, c.peer);
            let before = prev.conns.get(&key);
            let _ = writeln!(
                t,
                "    fd {:<5} {}  {} -> {}  tx {} rx {}  (total {} / {}){}",
                c.fd,
                c.path.name(),
                show_addr(c.local),
                show_addr(c.peer),
                rate(before.map(|b| b.0), c.tx, dt),
                rate(before.map(|b| b.1), c.rx, dt),
                bytes(c.tx),
                bytes(c.rx),
                cause_text(c.reason, c.detail)
            );
            conns_now.insert(key, (c.tx, c.rx));
        }
    }
    for p in problems {
        let _ = writeln!(t, "! {p}");
    }
    prev.procs = procs_now;
    prev.conns = conns_now;
    t
}

/// `{"time":"2026-11-23T23:10:01Z","interval":0.5,"dir":"...","processes":[...],"problems":[...]}`
fn json_frame(o: &Opts, secs: f64, procs: &[Snapshot], problems: &[String]) -> String {
    let procs: Vec<String> = procs.iter().map(Snapshot::to_json).collect();
    let problems: Vec<String> = problems
        .iter()
        .map(|p| format!("\"{}\"", json_escape(p)))
        .collect();
    let (date, time) = utc_now();
    format!(
        "{{\"time\":\"{date}T{time}Z\",\"interval\":{secs},\"dir\":\"{}\",\"processes\":[{}],\"problems\":[{}]}}",
        json_escape(&o.dir.display().to_string()),
        procs.join(","),
        problems.join(",")
    )
}

/// Bytes per second between two reads, or "-" on the first frame or if the counter went back
/// (a reused slot).
fn rate(before: Option<u64>, now: u64, dt: Option<f64>) -> String {
    match (before, dt) {
        (Some(b), Some(dt)) if now >= b && dt > 0.0 => {
            format!("{}/s", bytes(((now - b) as f64 / dt) as u64))
        }
        _ => "-".to_string(),
    }
}

/// 1536 -> "1.5 KiB".
fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// ("2026-11-23", "23:10:01"), UTC.
fn utc_now() -> (String, String) {
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (year, month, day, hour, min, sec) = rsock_core::logger::utc(secs);
    (
        format!("{year:04}-{month:02}-{day:02}"),
        format!("{hour:02}:{min:02}:{sec:02}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_units() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(16 << 20), "16.0 MiB");
        assert_eq!(rate(None, 10, Some(1.0)), "-");
        assert_eq!(rate(Some(0), 2048, Some(2.0)), "1.0 KiB/s");
        assert_eq!(rate(Some(5), 1, Some(1.0)), "-", "a counter that went back");
    }

    #[test]
    fn utc_date_is_plausible() {
        let (date, time) = utc_now();
        let s = format!("{date} {time} UTC");
        assert_eq!(s.len(), 23, "{s}");
        assert!(
            s.ends_with(" UTC") && s[..4].parse::<u32>().unwrap() >= 2024,
            "{s}"
        );
    }
}
