//! `rsock check [HOST[:PORT]]`: can this host use RDMA, and does a server answer over it.
//!
//! Each line is a verdict (ok, warn, FAIL), what was found, and what to do. The peer test
//! asks the shim itself: a copy of this binary runs under `rsock run`, connects to
//! HOST:PORT as any program would, and the shim's own counters say which path it took and
//! why — the same reason `rsock stat` would show for a real program.

use crate::args::CheckArgs;
use crate::out::outln;
use rsock_core::stats::read::Snapshot;
use rsock_core::stats::{Fallback, Path};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::process::{Command, ExitCode, Stdio};
use std::time::Duration;

#[derive(Clone, Copy, PartialEq)]
enum Verdict {
    Ok,
    Warn,
    Fail,
}

struct Report {
    failed: bool,
}

impl Report {
    fn line(&mut self, v: Verdict, what: &str, found: &str, todo: &str) {
        let tag = match v {
            Verdict::Ok => "ok  ",
            Verdict::Warn => "warn",
            Verdict::Fail => "FAIL",
        };
        self.failed |= v == Verdict::Fail;
        if todo.is_empty() {
            outln!("{tag}  {what:<9} {found}");
        } else {
            outln!("{tag}  {what:<9} {found}\n                 -> {todo}");
        }
    }
}

pub fn main(args: CheckArgs) -> ExitCode {
    let peer = args.target;
    let mut r = Report { failed: false };
    let shim = check_shim(&mut r);
    check_devices(&mut r);
    check_memlock(&mut r);
    if let Some((host, port)) = peer {
        if let Some(addr) = resolve_host(&mut r, &host, port) {
            check_route(&mut r, addr);
            if port.is_some() {
                check_peer(&mut r, shim.as_deref(), addr);
            }
        }
    }
    if r.failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// "HOST", "HOST:PORT", "[V6]:PORT" or a bare IPv6 address. (clap's value parser: its
/// error is said after "invalid value 'S' for '[HOST[:PORT]]': ".)
pub fn parse_target(s: &str) -> Result<(String, Option<u16>), String> {
    let port = |p: &str| {
        p.parse::<u16>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| "PORT must be 1-65535".to_string())
    };
    if let Some(rest) = s.strip_prefix('[') {
        let (host, tail) = rest.split_once(']').ok_or("no closing ]")?;
        return match tail.strip_prefix(':') {
            Some(p) => Ok((host.to_string(), Some(port(p)?))),
            None if tail.is_empty() => Ok((host.to_string(), None)),
            None => Err("expected [HOST]:PORT".into()),
        };
    }
    match s.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') && !h.is_empty() => Ok((h.to_string(), Some(port(p)?))),
        _ if s.is_empty() => Err("empty HOST".into()),
        _ => Ok((s.to_string(), None)),
    }
}

fn check_shim(r: &mut Report) -> Option<std::path::PathBuf> {
    match crate::run::find_shim() {
        Ok(p) => {
            r.line(Verdict::Ok, "shim", &p.display().to_string(), "");
            Some(p)
        }
        Err((_, msg)) => {
            r.line(
                Verdict::Fail,
                "shim",
                &msg,
                "install rsock (make install), or set RSOCK_LIB",
            );
            None
        }
    }
}

/// The kernel's RDMA devices and their ports, from sysfs (no verbs call needed).
fn check_devices(r: &mut Report) {
    let root = std::path::Path::new("/sys/class/infiniband");
    let mut devs: Vec<_> = std::fs::read_dir(root)
        .map(|d| d.filter_map(Result::ok).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    devs.sort();
    if devs.is_empty() {
        r.line(
            Verdict::Fail,
            "device",
            "no RDMA device (/sys/class/infiniband is empty or missing)",
            "load the NIC's RDMA driver (or Soft-RoCE: modprobe rdma_rxe; rdma link add rxe0 type rxe netdev IFACE); programs fall back to kernel TCP meanwhile",
        );
        return;
    }
    let mut any_active = false;
    for dev in &devs {
        let ports = root.join(dev).join("ports");
        let mut nums: Vec<_> = std::fs::read_dir(&ports)
            .map(|d| d.filter_map(Result::ok).map(|e| e.file_name()).collect())
            .unwrap_or_default();
        nums.sort();
        for p in nums {
            let read = |f: &str| {
                std::fs::read_to_string(ports.join(&p).join(f))
                    .map(|s| s.trim().to_string())
                    .unwrap_or_default()
            };
            let state = read("state"); // e.g. "4: ACTIVE"
            let layer = read("link_layer");
            let active = state.ends_with("ACTIVE");
            any_active |= active;
            let found = format!(
                "{} port {}: {} ({})",
                dev.to_string_lossy(),
                p.to_string_lossy(),
                state.split(": ").last().unwrap_or("unknown"),
                if layer.is_empty() { "?" } else { &layer }
            );
            let (v, todo) = if active {
                (Verdict::Ok, "")
            } else {
                (
                    Verdict::Warn,
                    "bring the port's link up (ip link set IFACE up; cable, switch)",
                )
            };
            r.line(v, "device", &found, todo);
        }
    }
    if !any_active {
        r.line(
            Verdict::Fail,
            "device",
            "no port is ACTIVE",
            "connections fall back to kernel TCP until a port is up",
        );
    }
}

/// RLIMIT_MEMLOCK against what connections pin: 2 × RSOCK_BUF_START idle, ring and send
/// buffer at full size when streaming.
fn check_memlock(r: &mut Report) {
    let cfg = rsock_core::config::Config::get();
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 {
        r.line(Verdict::Warn, "memlock", "getrlimit failed", "");
        return;
    }
    if lim.rlim_cur == libc::RLIM_INFINITY {
        r.line(Verdict::Ok, "memlock", "unlimited", "");
        return;
    }
    let idle = 2 * u64::from(cfg.buf_start);
    let busy = u64::from(cfg.ring_size) + u64::from(cfg.send_buf);
    let (n_idle, n_busy) = (lim.rlim_cur / idle.max(1), lim.rlim_cur / busy.max(1));
    let found = format!(
        "{} KiB: room for about {n_idle} idle or {n_busy} streaming connections",
        lim.rlim_cur / 1024
    );
    let todo = "raise it: ulimit -l unlimited, LimitMEMLOCK=infinity (systemd), --ulimit memlock=-1 (containers); beyond it connections fall back to kernel TCP (reason resources)";
    let v = if n_busy >= 64 {
        Verdict::Ok
    } else {
        Verdict::Warn
    };
    r.line(
        v,
        "memlock",
        &found,
        if v == Verdict::Ok { "" } else { todo },
    );
}

/// HOST's first address (with PORT, or 0).
fn resolve_host(r: &mut Report, host: &str, port: Option<u16>) -> Option<SocketAddr> {
    match (host, port.unwrap_or(0)).to_socket_addrs() {
        Ok(mut a) => a.next().or_else(|| {
            r.line(
                Verdict::Fail,
                "peer",
                &format!("{host}: no address"),
                "check the name",
            );
            None
        }),
        Err(e) => {
            r.line(
                Verdict::Fail,
                "peer",
                &format!("{host}: {e}"),
                "check the name",
            );
            None
        }
    }
}

/// Whether rdma_cm resolves HOST's address and route (what every RDMA connect does first).
fn check_route(r: &mut Report, addr: SocketAddr) {
    let host = addr.ip();
    match rsock_core::rdma::connect::resolve(None, addr, 0, Duration::from_secs(2)) {
        Ok(_) => r.line(
            Verdict::Ok,
            "route",
            &format!("{host}: rdma_cm resolved its address and route"),
            "",
        ),
        Err(e) => r.line(
            Verdict::Fail,
            "route",
            &format!("{host}: {e}"),
            "use the address of the peer's RDMA interface (rdma_cm picks the local device by the route to it); check that both ports are ACTIVE",
        ),
    }
}

/// Connects to ADDR under the shim, in a child process, and reads the shim's verdict from
/// that child's own stats.
fn check_peer(r: &mut Report, shim: Option<&std::path::Path>, addr: SocketAddr) {
    let what = "server";
    let Some(shim) = shim else {
        r.line(
            Verdict::Fail,
            what,
            &format!("{addr}: not tested (no shim)"),
            "",
        );
        return;
    };
    let dir = std::env::temp_dir().join(format!("rsock-check.{}", std::process::id()));
    let snap = run_probe(shim, &dir, addr);
    let _ = std::fs::remove_dir_all(&dir);
    match snap {
        Ok((s, detail)) => {
            let (v, found, todo) = judge(&s, &detail);
            r.line(v, what, &format!("{addr}: {found}"), todo);
        }
        Err(e) => r.line(
            Verdict::Fail,
            what,
            &format!("{addr}: the probe failed: {e}"),
            "",
        ),
    }
}

/// Runs `rsock run -- rsock check __probe ADDR` with a private stats directory and returns
/// the probe's snapshot, and what its connection's cause was (the probe prints it).
fn run_probe(
    shim: &std::path::Path,
    dir: &std::path::Path,
    addr: SocketAddr,
) -> Result<(Snapshot, String), String> {
    let me = std::env::current_exe().map_err(|e| format!("cannot find rsock itself: {e}"))?;
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let status = Command::new(&me)
        .args(["run", "--"])
        .arg(&me)
        .args(["check", "__probe"])
        .arg(addr.to_string())
        .env("RSOCK_LIB", shim)
        .env("RSOCK_STATS_DIR", dir)
        .env("RSOCK_STATS_KEEP", "1")
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", me.display()))?;
    if !status.status.success() {
        return Err(format!("it exited with {}", status.status));
    }
    let detail = String::from_utf8_lossy(&status.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(PROBE_DETAIL).map(str::to_string))
        .unwrap_or_default();
    let procs = rsock_core::stats::read::read_dir(dir).map_err(|e| e.to_string())?;
    let (_, snap) = procs
        .into_iter()
        .next()
        .ok_or_else(|| "the shim recorded nothing (was it loaded?)".to_string())?;
    Ok((snap, detail))
}

/// How the probe tells `rsock check` its connection's cause, on its standard output.
const PROBE_DETAIL: &str = "detail: ";

/// The verdict on a probe's snapshot: the path its one connection took and why.
fn judge(s: &Snapshot, detail: &str) -> (Verdict, String, &'static str) {
    if s.conns[Path::Rdma as usize] > 0 {
        return (
            Verdict::Ok,
            "connected over RDMA: a server running under rsock answers there".into(),
            "",
        );
    }
    let reason = Fallback::ALL
        .iter()
        .copied()
        .find(|&f| s.fallback[f as usize] > 0);
    let refused = s.connects_refused > 0;
    let tcp = s.conns[Path::Tcp as usize] + s.conns[Path::Passthrough as usize] > 0;
    let how = if tcp {
        "connected over kernel TCP"
    } else if refused {
        "kernel TCP refused too"
    } else {
        "no connection"
    };
    let Some(reason) = reason else {
        return if refused {
            (
                Verdict::Fail,
                "connection refused".into(),
                "nothing listens there: start the server (under rsock run for RDMA)",
            )
        } else {
            (
                Verdict::Fail,
                format!("{how}, and the shim gave no reason"),
                "run with RSOCK_LOG to see why",
            )
        };
    };
    let said = if detail.is_empty() {
        format!("{how}; RDMA: {}", reason.name())
    } else {
        format!("{how}; RDMA: {}: {detail}", reason.name())
    };
    let (v, todo) = match reason {
        Fallback::Rejected => (
            Verdict::Warn,
            "RDMA reaches the host, but no server under rsock listens on that port: start the server with rsock run",
        ),
        Fallback::NoDevice => (Verdict::Fail, "no RDMA device on this host (see device above)"),
        Fallback::RdmaUnavailable => (
            Verdict::Fail,
            "librdmacm/libibverbs missing or failing: install rdma-core (librdmacm1, libibverbs1, ibverbs-providers)",
        ),
        Fallback::Unreachable => (
            Verdict::Fail,
            "rdma_cm cannot resolve or reach it: use the address of the peer's RDMA interface (rdma_cm picks the device by address)",
        ),
        Fallback::Timeout => (
            Verdict::Warn,
            "the RDMA connect timed out: a slow or loaded peer (RSOCK_CONNECT_TIMEOUT_MS)",
        ),
        Fallback::BadHandshake => (
            Verdict::Fail,
            "a foreign rdma_cm listener or an incompatible rsock answers there",
        ),
        Fallback::Resources => (
            Verdict::Fail,
            "out of RDMA resources or locked memory: see memlock above",
        ),
        Fallback::Excluded => (
            Verdict::Warn,
            "RSOCK_EXCLUDE names it (loopback by default): rsock never tries RDMA there",
        ),
        Fallback::Rule => (
            Verdict::Warn,
            "a rule or RSOCK_RDMA=0 keeps it on kernel TCP (rsock rules)",
        ),
        _ => (Verdict::Warn, "see rsock stat's reasons in docs/USAGE.md"),
    };
    let mut found = said;
    if refused && !tcp {
        found.push_str(" (kernel TCP: connection refused)");
    }
    (v, found, todo)
}

/// The probe itself (`rsock check __probe ADDR`, hidden), run under the shim: one connect to
/// ADDR, closed at once.
pub fn probe(addr: SocketAddr) -> ExitCode {
    // take_error (SO_ERROR) settles the connect for the shim's counters, as a program's
    // first read or write would.
    if let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_secs(10)) {
        let _ = s.take_error();
        // Its slot goes at close: read the cause while connected.
        let fd = std::os::unix::io::AsRawFd::as_raw_fd(&s);
        let file = rsock_core::config::Config::get()
            .stats_dir
            .join(format!("{}.stats", std::process::id()));
        let snap = std::fs::read(file)
            .ok()
            .and_then(|b| rsock_core::stats::read::parse(&b));
        if let Some(c) = snap.and_then(|s| s.sockets.into_iter().find(|c| c.fd == fd)) {
            let d = c.detail.to_string();
            if !d.is_empty() {
                outln!("{PROBE_DETAIL}{d}");
            }
        }
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::parse_target;

    #[test]
    fn targets() {
        let t = |s: &str| parse_target(s);
        assert_eq!(t("10.0.0.1"), Ok(("10.0.0.1".into(), None)));
        assert_eq!(t("10.0.0.1:7000"), Ok(("10.0.0.1".into(), Some(7000))));
        assert_eq!(t("host.example:80"), Ok(("host.example".into(), Some(80))));
        assert_eq!(t("[fe80::1]:5"), Ok(("fe80::1".into(), Some(5))));
        assert_eq!(t("[fe80::1]"), Ok(("fe80::1".into(), None)));
        assert_eq!(t("fe80::1"), Ok(("fe80::1".into(), None)));
        assert!(t("10.0.0.1:0").is_err());
        assert!(t("10.0.0.1:x").is_err());
        assert!(t("[fe80::1").is_err());
        assert!(t("").is_err());
    }
}
