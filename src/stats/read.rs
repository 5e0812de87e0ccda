//! Reading stats regions back: what `rsock stat` and the tests use.
//!
//! A region is read by copying its file into an aligned buffer; counters are atomics updated
//! in place, so a copy is a consistent-enough snapshot (each counter is exact; counters are not
//! mutually atomic). Slots being filled (odd `seq`) are skipped.

use super::{region_len, ConnSlot, Detail, Fallback, Header, Path, MAGIC, PATHS, REASONS, VERSION};
use super::{SLOT_CONN, SLOT_LISTENER};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::sync::atomic::Ordering::Relaxed;

/// One process's counters and live connections.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Process id.
    pub pid: u32,
    /// Program name.
    pub comm: String,
    /// Whether the process is still running.
    pub alive: bool,
    /// The pid runs another process now (its start time differs from the one stored): the
    /// process this region belongs to has exited.
    pub pid_reused: bool,
    /// Connections established, by path.
    pub conns: [u64; PATHS],
    /// Bytes sent, by path.
    pub tx: [u64; PATHS],
    /// Bytes received, by path.
    pub rx: [u64; PATHS],
    /// Fallbacks by reason.
    pub fallback: [u64; REASONS],
    /// Blocking calls on RDMA streams that slept, and those that woke late.
    pub slept: u64,
    /// See [`Counters::woke_late`](super::Counters::woke_late).
    pub woke_late: u64,
    /// See [`Counters::settle_timeouts`](super::Counters::settle_timeouts).
    pub settle_timeouts: u64,
    /// See [`Counters::grown_rings`](super::Counters::grown_rings) and `grown_send`.
    pub grown_rings: u64,
    /// See [`Counters::grown_send`](super::Counters::grown_send).
    pub grown_send: u64,
    /// Sockets that started listening.
    pub listens: u64,
    /// Connects refused by the peer.
    pub connects_refused: u64,
    /// Connects that failed otherwise.
    pub connects_failed: u64,
    /// Links set up, and streams opened or accepted on them.
    pub links: u64,
    /// See `links`.
    pub link_streams: u64,
    /// Of `link_streams`, those opened or accepted on a grant.
    pub link_granted: u64,
    /// Connects that went to a branch, and connections accepted through one.
    pub branch_connects: u64,
    /// See `branch_connects`.
    pub branch_accepts: u64,
    /// The log level in force (`None`: not known yet), where the log goes and the pid in
    /// its file's name (see [`super::control`]).
    pub log: (Option<log::LevelFilter>, u32, u32),
    /// Live connections with a slot.
    pub sockets: Vec<ConnSnapshot>,
    /// Live listeners with a slot.
    pub listeners: Vec<ListenerSnapshot>,
}

/// One live listener.
#[derive(Debug, Clone)]
pub struct ListenerSnapshot {
    /// The program's fd.
    pub fd: i32,
    /// Why it listens on kernel TCP only; `None`: on RDMA and kernel TCP.
    pub tcp_only: Option<Fallback>,
    /// What exactly decided its path, where known.
    pub detail: Detail,
    /// The listening address.
    pub local: Option<SocketAddr>,
}

/// One live connection.
#[derive(Debug, Clone)]
pub struct ConnSnapshot {
    /// The program's fd.
    pub fd: i32,
    /// Transport.
    pub path: Path,
    /// Why it is on TCP, if it is.
    pub reason: Option<Fallback>,
    /// What exactly decided its path, where known (the errno and rdma_cm event of a failed
    /// attempt, the rule's line, the `RSOCK_EXCLUDE` entry).
    pub detail: Detail,
    /// Local address.
    pub local: Option<SocketAddr>,
    /// Peer address.
    pub peer: Option<SocketAddr>,
    /// Bytes sent.
    pub tx: u64,
    /// Bytes received.
    pub rx: u64,
}

/// Parses a region file's contents; `None` if it is not a complete region.
pub fn parse(bytes: &[u8]) -> Option<Snapshot> {
    let hlen = std::mem::size_of::<Header>();
    if bytes.len() < hlen {
        return None;
    }
    // Copy into u64s so the atomics inside are aligned.
    let mut buf = vec![0u64; bytes.len().div_ceil(8)];
    // SAFETY: buf has at least bytes.len() bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.as_mut_ptr().cast::<u8>(), bytes.len())
    };
    // SAFETY: buf is aligned, large enough, and every bit pattern is valid for Header.
    let h = unsafe { &*buf.as_ptr().cast::<Header>() };
    if h.magic != MAGIC || bytes.len() < region_len(h.nslots) {
        return None;
    }
    let load = |a: &[std::sync::atomic::AtomicU64]| -> Vec<u64> {
        a.iter().map(|x| x.load(Relaxed)).collect()
    };
    let mut s = Snapshot {
        pid: h.pid,
        comm: String::from_utf8_lossy(h.comm.split(|&b| b == 0).next().unwrap_or(&[])).into_owned(),
        alive: false,
        pid_reused: false,
        conns: load(&h.counters.conns).try_into().ok()?,
        tx: load(&h.counters.tx).try_into().ok()?,
        rx: load(&h.counters.rx).try_into().ok()?,
        fallback: load(&h.counters.fallback).try_into().ok()?,
        slept: h.counters.slept.load(Relaxed),
        woke_late: h.counters.woke_late.load(Relaxed),
        settle_timeouts: h.counters.settle_timeouts.load(Relaxed),
        grown_rings: h.counters.grown_rings.load(Relaxed),
        grown_send: h.counters.grown_send.load(Relaxed),
        listens: h.counters.listens.load(Relaxed),
        connects_refused: h.counters.connects_refused.load(Relaxed),
        connects_failed: h.counters.connects_failed.load(Relaxed),
        links: h.counters.links.load(Relaxed),
        link_streams: h.counters.link_streams.load(Relaxed),
        link_granted: h.counters.link_granted.load(Relaxed),
        branch_connects: h.counters.branch_connects.load(Relaxed),
        branch_accepts: h.counters.branch_accepts.load(Relaxed),
        log: (
            super::control::decode(h.log.level.load(Relaxed)),
            h.log.target.load(Relaxed),
            h.log.file_pid.load(Relaxed),
        ),
        sockets: Vec::new(),
        listeners: Vec::new(),
    };
    // SAFETY: the length check above covers nslots slots after the header.
    let slots = unsafe {
        std::slice::from_raw_parts(
            (h as *const Header).add(1).cast::<ConnSlot>(),
            h.nslots as usize,
        )
    };
    for c in slots {
        let seq = c.seq.load(Relaxed);
        if seq == 0 || seq % 2 == 1 {
            continue;
        }
        let Some(path) = Path::from_u32(c.path.load(Relaxed)) else {
            continue;
        };
        let reason = Fallback::ALL.get(c.reason.load(Relaxed) as usize).copied();
        let detail = Detail::decode(c.detail.load(Relaxed), c.event.load(Relaxed));
        match c.kind.load(Relaxed) {
            SLOT_CONN => {}
            SLOT_LISTENER => {
                s.listeners.push(ListenerSnapshot {
                    fd: c.fd.load(Relaxed),
                    tcp_only: if path == Path::Rdma { None } else { reason },
                    detail,
                    local: decode_addr(&c.local),
                });
                continue;
            }
            _ => continue,
        }
        s.sockets.push(ConnSnapshot {
            fd: c.fd.load(Relaxed),
            path,
            reason,
            detail,
            local: decode_addr(&c.local),
            peer: decode_addr(&c.peer),
            tx: c.tx.load(Relaxed),
            rx: c.rx.load(Relaxed),
        });
    }
    (s.alive, s.pid_reused) = liveness(h.pid, h.start_ticks);
    s.sockets.sort_by_key(|c| c.fd);
    s.listeners.sort_by_key(|l| l.fd);
    Some(s)
}

/// (alive, pid reused) for the process `pid` that started `start_ticks` after boot (0:
/// unknown, then a running pid counts as alive).
fn liveness(pid: u32, start_ticks: u64) -> (bool, bool) {
    if !pid_alive(pid) {
        return (false, false);
    }
    let now = std::fs::read(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|b| super::start_ticks_of(&b));
    match now {
        Some(t) if start_ticks != 0 && t != start_ticks => (false, true),
        _ => (true, false),
    }
}

/// The layout version of a region file that is not of this build's version ([`VERSION`]):
/// `Some(v)` if `bytes` starts with the magic of version `v`, `None` otherwise (ours, or not
/// a region — a file being made starts all zero).
pub fn other_version(bytes: &[u8]) -> Option<u8> {
    let prefix = &MAGIC[..MAGIC.len() - 1];
    (bytes.len() >= MAGIC.len() && bytes.starts_with(prefix))
        .then(|| bytes[MAGIC.len() - 1])
        .filter(|&v| v != VERSION)
}

/// Decodes a raw `sockaddr_in`/`sockaddr_in6`.
pub fn decode_addr(a: &[u8; 28]) -> Option<SocketAddr> {
    let family = u16::from_ne_bytes([a[0], a[1]]) as i32;
    let port = u16::from_be_bytes([a[2], a[3]]);
    match family {
        libc::AF_INET => {
            let ip = Ipv4Addr::new(a[4], a[5], a[6], a[7]);
            Some(SocketAddr::V4(SocketAddrV4::new(ip, port)))
        }
        libc::AF_INET6 => {
            let mut ip = [0u8; 16];
            ip.copy_from_slice(&a[8..24]);
            let scope = u32::from_ne_bytes([a[24], a[25], a[26], a[27]]);
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(ip),
                port,
                0,
                scope,
            )))
        }
        _ => None,
    }
}

fn pid_alive(pid: u32) -> bool {
    pid != 0 && crate::sys::process::exists(pid as i32)
}

/// Reads every region file in `dir`, sorted by pid. Files that cannot be read are skipped.
pub fn read_dir(dir: &std::path::Path) -> std::io::Result<Vec<(std::path::PathBuf, Snapshot)>> {
    read_dir_reporting(dir).map(|d| d.procs)
}

/// What [`read_dir_reporting`] found in a stats directory.
#[derive(Debug, Default)]
pub struct DirContents {
    /// Region files that parsed, with their processes' snapshots, sorted by pid.
    pub procs: Vec<(std::path::PathBuf, Snapshot)>,
    /// Region files that could not be read (another user's, with mode 0600), and why.
    pub unreadable: Vec<(std::path::PathBuf, std::io::Error)>,
    /// Region files of another layout version (made by another build of rsock), with it.
    pub other_version: Vec<(std::path::PathBuf, u8)>,
}

/// Reads every region file in `dir`, and says which could not be read.
pub fn read_dir_reporting(dir: &std::path::Path) -> std::io::Result<DirContents> {
    let mut out = DirContents::default();
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.extension().and_then(|x| x.to_str()) != Some("stats") {
            continue;
        }
        match std::fs::read(&p) {
            Ok(bytes) => {
                if let Some(s) = parse(&bytes) {
                    out.procs.push((p, s));
                } else if let Some(v) = other_version(&bytes) {
                    out.other_version.push((p, v));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {} // exited meanwhile
            Err(e) => out.unreadable.push((p, e)),
        }
    }
    out.procs.sort_by_key(|(_, s)| s.pid);
    out.other_version.sort();
    Ok(out)
}

impl Snapshot {
    /// The snapshot as one JSON object (hand-written: the core has no serde dependency).
    pub fn to_json(&self) -> String {
        let by_path = |v: &[u64; PATHS]| {
            let f: Vec<String> = [Path::Rdma, Path::Tcp, Path::Passthrough]
                .iter()
                .map(|p| format!("\"{}\":{}", p.name(), v[*p as usize]))
                .collect();
            format!("{{{}}}", f.join(","))
        };
        let reasons: Vec<String> = Fallback::ALL
            .iter()
            .map(|r| format!("\"{}\":{}", r.name(), self.fallback[*r as usize]))
            .collect();
        let addr = |a: Option<SocketAddr>| a.map_or("null".to_string(), |a| format!("\"{a}\""));
        let detail = |d: Detail| match d {
            Detail::None => "null".to_string(),
            d => format!("\"{}\"", json_escape(&d.to_string())),
        };
        let socks: Vec<String> = self
            .sockets
            .iter()
            .map(|c| {
                format!(
                    "{{\"fd\":{},\"path\":\"{}\",\"reason\":{},\"detail\":{},\"local\":{},\"peer\":{},\"tx\":{},\"rx\":{}}}",
                    c.fd,
                    c.path.name(),
                    c.reason.map_or("null".to_string(), |r| format!("\"{}\"", r.name())),
                    detail(c.detail),
                    addr(c.local),
                    addr(c.peer),
                    c.tx,
                    c.rx
                )
            })
            .collect();
        let listeners: Vec<String> = self
            .listeners
            .iter()
            .map(|l| {
                format!(
                    "{{\"fd\":{},\"local\":{},\"rdma\":{},\"tcp_only\":{},\"detail\":{}}}",
                    l.fd,
                    addr(l.local),
                    l.tcp_only.is_none(),
                    l.tcp_only
                        .map_or("null".to_string(), |r| format!("\"{}\"", r.name())),
                    detail(l.detail)
                )
            })
            .collect();
        format!(
            "{{\"pid\":{},\"comm\":\"{}\",\"alive\":{},\"pid_reused\":{},\"conns\":{},\"tx\":{},\"rx\":{},\"fallback\":{{{}}},\"waits\":{{\"slept\":{},\"woke_late\":{},\"settle_timeouts\":{}}},\"grown\":{{\"rings\":{},\"send\":{}}},\"listens\":{},\"connects\":{{\"refused\":{},\"failed\":{}}},\"links\":{{\"made\":{},\"streams\":{},\"granted\":{}}},\"branches\":{{\"connects\":{},\"accepts\":{}}},\"log\":{},\"sockets\":[{}],\"listeners\":[{}]}}",
            self.pid,
            json_escape(&self.comm),
            self.alive,
            self.pid_reused,
            by_path(&self.conns),
            by_path(&self.tx),
            by_path(&self.rx),
            reasons.join(","),
            self.slept,
            self.woke_late,
            self.settle_timeouts,
            self.grown_rings,
            self.grown_send,
            self.listens,
            self.connects_refused,
            self.connects_failed,
            self.links,
            self.link_streams,
            self.link_granted,
            self.branch_connects,
            self.branch_accepts,
            self.log_json(),
            socks.join(","),
            listeners.join(",")
        )
    }
}

impl Snapshot {
    /// Where the process logs, as `rsock stat` says it: "off", "info to RSOCK_LOG", ...
    pub fn log_text(&self) -> String {
        let (level, target, file_pid) = self.log;
        super::control::describe(level, target, "RSOCK_LOG", &format!("{file_pid}.log"))
    }

    fn log_json(&self) -> String {
        use super::control::{LOG_RSOCK_LOG, LOG_STATS_DIR, LOG_UNWRITABLE};
        let level = self.log.0.map_or("null".to_string(), |l| {
            format!("\"{}\"", l.as_str().to_lowercase())
        });
        let to = match self.log.1 {
            LOG_RSOCK_LOG => "\"rsock_log\"",
            LOG_STATS_DIR => "\"stats_dir\"",
            LOG_UNWRITABLE => "\"unwritable\"",
            _ => "null",
        };
        format!("{{\"level\":{level},\"to\":{to}}}")
    }
}

/// Escapes a string for a JSON string literal.
pub fn json_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_versions_are_told_apart() {
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&[0; 64]);
        assert_eq!(other_version(&b), None, "ours");
        b[7] = 3;
        assert_eq!(other_version(&b), Some(3));
        assert_eq!(parse(&b).map(|s| s.pid), None);
        assert_eq!(other_version(&[0; 72]), None, "a file being made");
        assert_eq!(other_version(b"RSOCKST"), None, "too short");
    }
}
