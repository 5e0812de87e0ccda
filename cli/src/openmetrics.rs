//! `rsock stat --openmetrics`: the per-process counters in the OpenMetrics text format, for
//! Prometheus (node_exporter's textfile collector: `rsock stat --openmetrics > f.prom.$$ &&
//! mv f.prom.$$ f.prom`).
//!
//! Each family is one block (`# TYPE`, `# HELP`, then a sample per process, and per path or
//! reason where it has them); every sample has the labels `pid` and `comm`; `# EOF` ends the
//! exposition. Counter samples carry the `_total` suffix; live connections and listeners
//! are gauges.

use rsock_core::stats::read::Snapshot;
use rsock_core::stats::{Fallback, Path};
use std::fmt::Write as _;

/// A family with one sample per process: name, type, help, value.
type Family = (
    &'static str,
    &'static str,
    &'static str,
    fn(&Snapshot) -> u64,
);

/// The exposition for `procs`.
pub fn render(procs: &[Snapshot]) -> String {
    let mut t = String::new();
    let paths = [Path::Rdma, Path::Tcp, Path::Passthrough];
    let by_path = |t: &mut String, name: &str, help: &str, v: &dyn Fn(&Snapshot) -> [u64; 3]| {
        family(t, name, "counter", help);
        for s in procs {
            for p in paths {
                let l = format!("{},path=\"{}\"", labels(s), p.name());
                let _ = writeln!(t, "{name}_total{{{l}}} {}", v(s)[p as usize]);
            }
        }
    };
    by_path(
        &mut t,
        "rsock_connections",
        "Connections established, by path.",
        &|s| s.conns,
    );
    by_path(&mut t, "rsock_sent_bytes", "Bytes sent, by path.", &|s| {
        s.tx
    });
    by_path(
        &mut t,
        "rsock_received_bytes",
        "Bytes received, by path.",
        &|s| s.rx,
    );
    family(
        &mut t,
        "rsock_fallbacks",
        "counter",
        "Connections on kernel TCP instead of RDMA, by reason.",
    );
    for s in procs {
        for r in Fallback::ALL {
            let l = format!("{},reason=\"{}\"", labels(s), r.name());
            let _ = writeln!(t, "rsock_fallbacks_total{{{l}}} {}", s.fallback[r as usize]);
        }
    }
    family(
        &mut t,
        "rsock_failed_connects",
        "counter",
        "Connects that failed (not connections): refused by the peer, or otherwise.",
    );
    for s in procs {
        let l = labels(s);
        let _ = writeln!(
            t,
            "rsock_failed_connects_total{{{l},why=\"refused\"}} {}",
            s.connects_refused
        );
        let _ = writeln!(
            t,
            "rsock_failed_connects_total{{{l},why=\"other\"}} {}",
            s.connects_failed
        );
    }
    let simple: [Family; 13] = [
        (
            "rsock_listens",
            "counter",
            "Sockets that started listening.",
            |s| s.listens,
        ),
        (
            "rsock_blocking_sleeps",
            "counter",
            "Blocking calls on RDMA streams that slept after polling.",
            |s| s.slept,
        ),
        (
            "rsock_late_wakeups",
            "counter",
            "Sleeps that woke only at their bound with the stream ready (lost wake-ups).",
            |s| s.woke_late,
        ),
        (
            "rsock_settle_timeouts",
            "counter",
            "Nonblocking writes that waited out their bound for completions (none expected).",
            |s| s.settle_timeouts,
        ),
        (
            "rsock_grown_rings",
            "counter",
            "Receive rings grown to their full size.",
            |s| s.grown_rings,
        ),
        (
            "rsock_grown_send_buffers",
            "counter",
            "Send buffers grown to their full size.",
            |s| s.grown_send,
        ),
        (
            "rsock_links",
            "counter",
            "Links set up (one queue pair carrying many connections).",
            |s| s.links,
        ),
        (
            "rsock_link_streams",
            "counter",
            "Connections opened or accepted over a link.",
            |s| s.link_streams,
        ),
        (
            "rsock_link_granted",
            "counter",
            "Connections over a link opened or accepted on a grant (no answer waited for).",
            |s| s.link_granted,
        ),
        (
            "rsock_branch_connects",
            "counter",
            "Connects that went to a branch of the listener (a worker accepting from it).",
            |s| s.branch_connects,
        ),
        (
            "rsock_branch_accepts",
            "counter",
            "Connections accepted through this process's branch of a listener.",
            |s| s.branch_accepts,
        ),
        (
            "rsock_open_connections",
            "gauge",
            "Live connections.",
            |s| s.sockets.len() as u64,
        ),
        ("rsock_open_listeners", "gauge", "Live listeners.", |s| {
            s.listeners.len() as u64
        }),
    ];
    for (name, kind, help, v) in simple {
        family(&mut t, name, kind, help);
        let suffix = if kind == "counter" { "_total" } else { "" };
        for s in procs {
            let _ = writeln!(t, "{name}{suffix}{{{}}} {}", labels(s), v(s));
        }
    }
    t.push_str("# EOF\n");
    t
}

fn family(t: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(t, "# TYPE {name} {kind}\n# HELP {name} {help}");
}

/// `pid="123",comm="nc"`.
fn labels(s: &Snapshot) -> String {
    format!("pid=\"{}\",comm=\"{}\"", s.pid, escape(&s.comm))
}

/// A label value: backslash, double quote and newline escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(pid: u32, comm: &str) -> Snapshot {
        Snapshot {
            pid,
            comm: comm.into(),
            alive: true,
            pid_reused: false,
            conns: [0, 2, 0],
            tx: [0, 20, 0],
            rx: [0, 10, 0],
            fallback: [0; rsock_core::stats::REASONS],
            slept: 0,
            woke_late: 0,
            settle_timeouts: 0,
            grown_rings: 0,
            grown_send: 0,
            listens: 1,
            connects_refused: 3,
            connects_failed: 0,
            links: 0,
            link_streams: 0,
            link_granted: 0,
            branch_connects: 0,
            branch_accepts: 0,
            log: (None, 0, 0),
            sockets: Vec::new(),
            listeners: Vec::new(),
        }
    }

    #[test]
    fn families_are_blocks_with_labels_and_an_eof() {
        let mut a = snapshot(7, "nc");
        a.fallback[Fallback::Excluded as usize] = 2;
        let t = render(&[a, snapshot(9, "a \"b\"\\")]);
        assert!(
            t.ends_with("\n# EOF\n") && t.matches("# EOF").count() == 1,
            "{t}"
        );
        assert!(t.contains("# TYPE rsock_connections counter\n"), "{t}");
        assert!(
            t.contains("rsock_connections_total{pid=\"7\",comm=\"nc\",path=\"tcp\"} 2\n"),
            "{t}"
        );
        assert!(t.contains("rsock_fallbacks_total{pid=\"7\",comm=\"nc\",reason=\"excluded\"} 2\n"));
        assert!(t.contains(
            "rsock_failed_connects_total{pid=\"9\",comm=\"a \\\"b\\\"\\\\\",why=\"refused\"} 3\n"
        ), "{t}");
        assert!(
            t.contains("rsock_open_connections{pid=\"7\",comm=\"nc\"} 0\n"),
            "{t}"
        );
        // Each family's samples follow its TYPE line, before the next family's.
        let mut family = "";
        let mut seen = Vec::new();
        for line in t.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                family = rest.split(' ').next().unwrap();
                assert!(!seen.contains(&family), "{family} twice");
                seen.push(family);
            } else if !line.starts_with('#') {
                assert!(line.starts_with(family), "{line} outside {family}");
            }
        }
        assert_eq!(seen.len(), 18);
    }
}
