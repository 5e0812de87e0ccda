//! `RSOCK_*` settings, read once from the environment.
//!
//! Parsing is a pure function of (name, value) pairs so it can be tested without touching
//! the process environment. A malformed value never fails the host program: it is replaced
//! by its default and a warning is logged once, when the log is up.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::OnceLock;

/// Log verbosity, `RSOCK_LOG_LEVEL`.
pub use log::LevelFilter;

/// Every setting a user can tune. Field docs name the variable and the default.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `RSOCK_ENABLE` (default 1): 0 makes the shim a pure passthrough — no socket is tracked,
    /// no stats file is created.
    pub enable: bool,
    /// `RSOCK_LOG` (default unset: no log): file the shim appends its log to.
    pub log_path: Option<PathBuf>,
    /// `RSOCK_LOG_LEVEL` (default `info`): off, error, warn, info, debug or trace.
    pub log_level: LevelFilter,
    /// `RSOCK_STATS` (default 1): 0 disables the per-process stats region.
    pub stats: bool,
    /// `RSOCK_STATS_DIR` (default `/dev/shm/rsock-<uid>`): where stats regions live.
    pub stats_dir: PathBuf,
    /// `RSOCK_STATS_KEEP` (default 0): 1 keeps the stats file after the process exits.
    pub stats_keep: bool,
    /// `RSOCK_STATS_SLOTS` (default 1024, 0–65536): live connections listed individually.
    pub stats_slots: u32,
    /// `RSOCK_CONNECT_TIMEOUT_MS` (default 500, 1–60000): how long `connect()` tries RDMA
    /// before falling back to kernel TCP.
    pub connect_timeout_ms: u32,
    /// `RSOCK_NEG_CACHE_MS` (default 30000, 0 = off): how long a destination that failed
    /// RDMA goes straight to TCP.
    pub neg_cache_ms: u32,
    /// `RSOCK_RING_SIZE` (default 262144, 4096–1073741824): bytes of each receive ring.
    pub ring_size: u32,
    /// `RSOCK_SEND_BUF` (default 262144, 4096–1073741824): bytes of each send buffer.
    pub send_buf: u32,
    /// `RSOCK_RECV_CREDITS` (default 64, 4–65536): receives posted per connection.
    pub recv_credits: u32,
    /// `RSOCK_INLINE` (default 128, 0–1024): largest write posted inline (capped by the device).
    pub max_inline: u32,
    /// `RSOCK_SPIN_US` (default 20, 0–100000): how long a blocking call polls before sleeping.
    pub spin_us: u32,
    /// `RSOCK_EXCLUDE` (default `127.0.0.0/8,::1/128`): destinations that never try RDMA:
    /// comma-separated `ADDR/PREFIX` or `port=N` / `port=N-M` entries (empty: none).
    pub exclude: Vec<Exclude>,
}

/// One `RSOCK_EXCLUDE` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exclude {
    /// An address block.
    Net(std::net::IpAddr, u8),
    /// A destination port range, inclusive.
    Ports(u16, u16),
}

impl Exclude {
    /// Parses `ADDR/PREFIX`, `ADDR` (a host), `port=N` or `port=N-M`.
    pub fn parse(s: &str) -> Option<Exclude> {
        if let Some(p) = s.strip_prefix("port=") {
            let (a, b) = p.split_once('-').unwrap_or((p, p));
            let (a, b) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
            return (a <= b).then_some(Exclude::Ports(a, b));
        }
        let (addr, prefix) = s.split_once('/').map_or((s, None), |(a, p)| (a, Some(p)));
        let ip: std::net::IpAddr = addr.trim().parse().ok()?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p.trim().parse().ok().filter(|&p| p <= max)?,
            None => max,
        };
        Some(Exclude::Net(ip, prefix))
    }

    /// Whether `dest` falls in this entry.
    pub fn matches(&self, dest: &std::net::SocketAddr) -> bool {
        match *self {
            Exclude::Ports(a, b) => (a..=b).contains(&dest.port()),
            Exclude::Net(net, prefix) => prefix_match(net, canonical(dest.ip()), prefix),
        }
    }
}

/// IPv4-mapped IPv6 destinations are matched as IPv4.
fn canonical(ip: std::net::IpAddr) -> std::net::IpAddr {
    match ip {
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, std::net::IpAddr::V4),
        v4 => v4,
    }
}

fn prefix_match(net: std::net::IpAddr, ip: std::net::IpAddr, prefix: u8) -> bool {
    use std::net::IpAddr::{V4, V6};
    let (a, b, bits) = match (net, ip) {
        (V4(n), V4(i)) => (u32::from(n) as u128, u32::from(i) as u128, 32),
        (V6(n), V6(i)) => (u128::from(n), u128::from(i), 128),
        _ => return false,
    };
    let shift = bits - prefix as u32;
    shift >= bits || (a >> shift) == (b >> shift)
}

impl Config {
    /// Whether `RSOCK_EXCLUDE` keeps `dest` off RDMA.
    pub fn excludes(&self, dest: &std::net::SocketAddr) -> bool {
        self.exclude.iter().any(|e| e.matches(dest))
    }
}

impl Default for Config {
    fn default() -> Self {
        // SAFETY: getuid cannot fail.
        let uid = unsafe { libc::getuid() };
        Config {
            enable: true,
            log_path: None,
            log_level: LevelFilter::Info,
            stats: true,
            stats_dir: PathBuf::from(format!("/dev/shm/rsock-{uid}")),
            stats_keep: false,
            stats_slots: 1024,
            connect_timeout_ms: 500,
            neg_cache_ms: 30_000,
            ring_size: 256 * 1024,
            send_buf: 256 * 1024,
            recv_credits: 64,
            max_inline: 128,
            spin_us: 20,
            exclude: DEFAULT_EXCLUDE.split(',').filter_map(Exclude::parse).collect(),
        }
    }
}

/// `RSOCK_EXCLUDE`'s default: loopback never reaches an RDMA device.
pub const DEFAULT_EXCLUDE: &str = "127.0.0.0/8,::1/128";

/// Names of all known variables; anything else starting with `RSOCK_` draws a warning.
pub const KNOWN: &[&str] = &[
    "RSOCK_ENABLE",
    "RSOCK_LOG",
    "RSOCK_LOG_LEVEL",
    "RSOCK_STATS",
    "RSOCK_STATS_DIR",
    "RSOCK_STATS_KEEP",
    "RSOCK_STATS_SLOTS",
    "RSOCK_CONNECT_TIMEOUT_MS",
    "RSOCK_NEG_CACHE_MS",
    "RSOCK_RING_SIZE",
    "RSOCK_SEND_BUF",
    "RSOCK_RECV_CREDITS",
    "RSOCK_INLINE",
    "RSOCK_SPIN_US",
    "RSOCK_EXCLUDE",
];

impl Config {
    /// Builds a config from `RSOCK_*` pairs; returns it with one warning per bad input.
    pub fn parse<I>(vars: I) -> (Config, Vec<String>)
    where
        I: IntoIterator<Item = (OsString, OsString)>,
    {
        let mut c = Config::default();
        let mut warnings = Vec::new();
        for (name, value) in vars {
            let Some(name) = name.to_str() else { continue };
            if !name.starts_with("RSOCK_") {
                continue;
            }
            let Some(v) = value.to_str().map(str::trim) else {
                warnings.push(format!("{name}: value is not UTF-8; using the default"));
                continue;
            };
            let mut bad = |what: &str| warnings.push(format!("{name}={v:?}: {what}; using the default"));
            match name {
                "RSOCK_ENABLE" => set_bool(&mut c.enable, v, &mut bad),
                "RSOCK_STATS" => set_bool(&mut c.stats, v, &mut bad),
                "RSOCK_STATS_KEEP" => set_bool(&mut c.stats_keep, v, &mut bad),
                "RSOCK_LOG" if v.is_empty() => {}
                "RSOCK_LOG" => c.log_path = Some(PathBuf::from(value.as_os_str())),
                "RSOCK_LOG_LEVEL" => match v.parse::<LevelFilter>() {
                    Ok(l) => c.log_level = l,
                    Err(_) => bad("expected off, error, warn, info, debug or trace"),
                },
                "RSOCK_STATS_DIR" if v.is_empty() || !v.starts_with('/') => bad("expected an absolute path"),
                "RSOCK_STATS_DIR" => c.stats_dir = PathBuf::from(value.as_os_str()),
                "RSOCK_STATS_SLOTS" => set_u32(&mut c.stats_slots, v, 0, 65536, &mut bad),
                "RSOCK_CONNECT_TIMEOUT_MS" => set_u32(&mut c.connect_timeout_ms, v, 1, 60_000, &mut bad),
                "RSOCK_NEG_CACHE_MS" => set_u32(&mut c.neg_cache_ms, v, 0, 86_400_000, &mut bad),
                "RSOCK_RING_SIZE" => set_u32(&mut c.ring_size, v, 4096, 1 << 30, &mut bad),
                "RSOCK_SEND_BUF" => set_u32(&mut c.send_buf, v, 4096, 1 << 30, &mut bad),
                "RSOCK_RECV_CREDITS" => set_u32(&mut c.recv_credits, v, 4, 65536, &mut bad),
                "RSOCK_INLINE" => set_u32(&mut c.max_inline, v, 0, 1024, &mut bad),
                "RSOCK_SPIN_US" => set_u32(&mut c.spin_us, v, 0, 100_000, &mut bad),
                "RSOCK_EXCLUDE" => {
                    let entries: Vec<&str> = v.split(',').map(str::trim).filter(|e| !e.is_empty()).collect();
                    let parsed: Option<Vec<Exclude>> = entries.iter().map(|e| Exclude::parse(e)).collect();
                    match parsed {
                        Some(list) => c.exclude = list,
                        None => bad("expected comma-separated ADDR/PREFIX or port=N[-M] entries"),
                    }
                }
                _ => warnings.push(format!("{name}: unknown variable, ignored (known: {})", KNOWN.join(", "))),
            }
        }
        (c, warnings)
    }

    /// The process's config, read from the environment on first call.
    pub fn get() -> &'static Config {
        &loaded().0
    }
}

/// The config and its warnings, read once. Warnings are logged by whoever sets up the log.
pub fn loaded() -> &'static (Config, Vec<String>) {
    static CONFIG: OnceLock<(Config, Vec<String>)> = OnceLock::new();
    CONFIG.get_or_init(|| {
        Config::parse(std::env::vars_os().filter(|(k, _)| k.as_bytes().starts_with(b"RSOCK_")))
    })
}

fn set_u32(slot: &mut u32, v: &str, min: u32, max: u32, bad: &mut impl FnMut(&str)) {
    match v.parse::<u32>() {
        Ok(n) if (min..=max).contains(&n) => *slot = n,
        _ => bad(&format!("expected an integer from {min} to {max}")),
    }
}

fn set_bool(slot: &mut bool, v: &str, bad: &mut impl FnMut(&str)) {
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => *slot = true,
        "0" | "false" | "no" | "off" => *slot = false,
        _ => bad("expected 0 or 1"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> (Config, Vec<String>) {
        Config::parse(pairs.iter().map(|(k, v)| (OsString::from(k), OsString::from(v))))
    }

    #[test]
    fn defaults_when_empty() {
        let (c, w) = parse(&[]);
        assert_eq!(c, Config::default());
        assert!(w.is_empty());
        assert!(c.enable && c.stats && !c.stats_keep);
        assert_eq!(c.log_level, LevelFilter::Info);
    }

    #[test]
    fn reads_every_known_variable() {
        let (c, w) = parse(&[
            ("RSOCK_ENABLE", "0"),
            ("RSOCK_LOG", "/tmp/x.log"),
            ("RSOCK_LOG_LEVEL", "debug"),
            ("RSOCK_STATS", "off"),
            ("RSOCK_STATS_DIR", "/tmp/st"),
            ("RSOCK_STATS_KEEP", "yes"),
            ("RSOCK_STATS_SLOTS", "7"),
        ]);
        assert!(w.is_empty(), "{w:?}");
        assert!(!c.enable && !c.stats && c.stats_keep);
        assert_eq!(c.log_path.as_deref(), Some(std::path::Path::new("/tmp/x.log")));
        assert_eq!(c.log_level, LevelFilter::Debug);
        assert_eq!(c.stats_dir, PathBuf::from("/tmp/st"));
        assert_eq!(c.stats_slots, 7);
    }

    #[test]
    fn malformed_values_fall_back_to_defaults_with_one_warning_each() {
        let (c, w) = parse(&[
            ("RSOCK_ENABLE", "maybe"),
            ("RSOCK_LOG_LEVEL", "loud"),
            ("RSOCK_STATS_DIR", "relative/dir"),
            ("RSOCK_STATS_SLOTS", "-3"),
            ("RSOCK_STATS_KEEP", ""),
        ]);
        assert_eq!(c, Config::default());
        assert_eq!(w.len(), 5, "{w:?}");
        assert!(w[0].contains("RSOCK_ENABLE") && w[0].contains("default"));
    }

    #[test]
    fn unknown_rsock_variable_is_warned_and_others_ignored() {
        let (c, w) = parse(&[("RSOCK_ENABEL", "0"), ("HOME", "/root")]);
        assert!(c.enable);
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("RSOCK_ENABEL") && w[0].contains("unknown"));
    }

    #[test]
    fn rdma_tunables_parse_and_range_check() {
        let (c, w) = parse(&[
            ("RSOCK_CONNECT_TIMEOUT_MS", "250"),
            ("RSOCK_NEG_CACHE_MS", "0"),
            ("RSOCK_RING_SIZE", "1048576"),
            ("RSOCK_SEND_BUF", "65536"),
            ("RSOCK_RECV_CREDITS", "32"),
            ("RSOCK_INLINE", "0"),
            ("RSOCK_SPIN_US", "5"),
        ]);
        assert!(w.is_empty(), "{w:?}");
        assert_eq!((c.connect_timeout_ms, c.neg_cache_ms, c.ring_size), (250, 0, 1 << 20));
        assert_eq!((c.send_buf, c.recv_credits, c.max_inline, c.spin_us), (65536, 32, 0, 5));
        let (c, w) = parse(&[("RSOCK_CONNECT_TIMEOUT_MS", "0"), ("RSOCK_RING_SIZE", "12"), ("RSOCK_RECV_CREDITS", "x")]);
        assert_eq!(w.len(), 3, "{w:?}");
        assert_eq!((c.connect_timeout_ms, c.ring_size, c.recv_credits), (500, 256 * 1024, 64));
    }

    #[test]
    fn exclude_rules() {
        let d = |s: &str| s.parse::<std::net::SocketAddr>().unwrap();
        let (c, w) = parse(&[]);
        assert!(w.is_empty());
        assert!(c.excludes(&d("127.0.0.1:80")) && c.excludes(&d("[::1]:80")));
        assert!(c.excludes(&d("[::ffff:127.0.0.5]:80")), "v4-mapped loopback");
        assert!(!c.excludes(&d("10.77.0.1:80")));
        let (c, w) = parse(&[("RSOCK_EXCLUDE", "10.0.0.0/8, port=22, port=6000-6010, fd00::/8, 192.168.1.7")]);
        assert!(w.is_empty(), "{w:?}");
        assert!(c.excludes(&d("10.77.0.1:80")) && !c.excludes(&d("11.0.0.1:80")));
        assert!(c.excludes(&d("1.2.3.4:22")) && c.excludes(&d("1.2.3.4:6005")) && !c.excludes(&d("1.2.3.4:6011")));
        assert!(c.excludes(&d("[fd12::1]:80")) && !c.excludes(&d("[fe80::1]:80")));
        assert!(c.excludes(&d("192.168.1.7:1")) && !c.excludes(&d("192.168.1.8:1")));
        assert!(!c.excludes(&d("127.0.0.1:80")), "replacing the list drops the default");
        let (c, _) = parse(&[("RSOCK_EXCLUDE", "")]);
        assert!(c.exclude.is_empty());
        let (c, w) = parse(&[("RSOCK_EXCLUDE", "10.0.0.0/33,port=9-1")]);
        assert_eq!(w.len(), 1);
        assert_eq!(c.exclude, Config::default().exclude);
        assert!(Exclude::parse("0.0.0.0/0").unwrap().matches(&d("8.8.8.8:1")));
    }

    #[test]
    fn out_of_range_slots_rejected() {
        let (c, w) = parse(&[("RSOCK_STATS_SLOTS", "65537")]);
        assert_eq!(c.stats_slots, 1024);
        assert_eq!(w.len(), 1);
    }
}
