//! `RSOCK_*` settings, read once from the environment, and the rules file they name.
//!
//! Parsing is a pure function of (name, value) pairs so it can be tested without touching
//! the process environment. A malformed value never fails the host program: it is replaced
//! by its default and a warning is logged once, when the log is up. The rules file
//! (`RSOCK_CONFIG`, [`crate::rules`]) is read once at the same time; [`Config::decide`] folds
//! it, `RSOCK_EXCLUDE` and `RSOCK_RDMA` into one answer per connection.

use crate::addr;
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::OnceLock;

use crate::rules::{self, Action, Decision, Role, Rule};

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
    /// `RSOCK_BUF_START` (default 16384, 4096–1073741824): bytes a ring and a send buffer
    /// start with; each grows to `RSOCK_RING_SIZE`/`RSOCK_SEND_BUF` (or a rule's size) when
    /// the connection streams. At or above those sizes, buffers never grow.
    pub buf_start: u32,
    /// `RSOCK_MAX_PINNED_MB` (default: a quarter of physical memory; 0 = no limit;
    /// 1–4194304): registered memory (rings, send buffers) this process may pin; a
    /// connection that would go beyond falls back to TCP (`resources`). `None` = default.
    pub max_pinned_mb: Option<u32>,
    /// `RSOCK_RECV_CREDITS` (default 64, 4–65536): receives posted per connection.
    pub recv_credits: u32,
    /// `RSOCK_INLINE` (default 128, 0–1024): largest write posted inline (capped by the device).
    pub max_inline: u32,
    /// `RSOCK_SPIN_US` (default 400, 0–100000): the longest a blocking call or wait polls
    /// before sleeping; each waiter adapts its polling below it (engine/spin.rs).
    pub spin_us: u32,
    /// `RSOCK_EXCLUDE` (default `127.0.0.0/8,::1/128`): destinations that never try RDMA:
    /// comma-separated `ADDR/PREFIX` or `port=N` / `port=N-M` entries (empty: none).
    pub exclude: Vec<Exclude>,
    /// `RSOCK_RDMA` (default 1): 0 keeps every connection off RDMA (tracked as `tcp`,
    /// reason `rule`), as if a first rule said `tcp`; `passthrough` decisions stay.
    pub rdma: bool,
    /// `RSOCK_TAKEOVER` (default 1): a process that uses an RDMA connection it inherited
    /// (a fork child) takes it over from its owner — the queue pair moves to it; 0 keeps
    /// the owner relaying it instead.
    pub takeover: bool,
    /// `RSOCK_LINKS` (default 0, being built): 1 carries the connections between two
    /// processes as streams of one shared link (one queue pair): the first connect to a
    /// destination sets the link up, later ones open a stream on it without rdma_cm.
    /// Not yet for programs that fork with connections open or pass them to other processes.
    pub links: bool,
    /// `RSOCK_REDIRECT` (default 1): a process that accepts from a listener another process
    /// owns (a prefork worker) takes RDMA connections on an rdma_cm port of its own (a
    /// branch), to which the owner redirects the clients that follow redirects (they say
    /// so; this setting makes a client say so): each such connection is set up once, where
    /// it is served, instead of accepted by the owner and taken over. 0: neither.
    pub redirect: bool,
    /// `RSOCK_LINK_IDLE_MS` (default 60000, 0: never): a link with no stream for this long
    /// is closed (its queue pair and pinned memory freed); the next connect sets one up.
    pub link_idle_ms: u32,
    /// `RSOCK_LINK_GRANTS` (default 8, 0: none, at most 32): streams a link's accepting end
    /// keeps ready for the connecting end (GRANT, PROTOCOL.md §14), each a 16 KiB ring and
    /// send buffer of the link's slabs: a connect that takes one writes at once, without
    /// waiting for an answer. 0 at either end: every stream waits for its ACCEPT.
    pub link_grants: u32,
    /// `RSOCK_CONFIG` (default `/etc/rsock.conf` if it exists; empty: none): the rules file.
    pub rules_path: Option<PathBuf>,
    /// The rules of [`Config::rules_path`], in file order.
    pub rules: Vec<Rule>,
    /// The program's name (basename of argv[0]) that `prog=` rules match.
    pub prog: String,
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
            Exclude::Net(net, prefix) => {
                addr::prefix_match(net, addr::canonical(dest.ip()), prefix)
            }
        }
    }
}

impl Config {
    /// Whether `RSOCK_EXCLUDE` keeps `dest` off RDMA.
    pub fn excludes(&self, dest: &std::net::SocketAddr) -> bool {
        self.exclude_entry(dest).is_some()
    }

    /// The `RSOCK_EXCLUDE` entry (counted from 1) that keeps `dest` off RDMA, if one does.
    pub fn exclude_entry(&self, dest: &std::net::SocketAddr) -> Option<u32> {
        let i = self.exclude.iter().position(|e| e.matches(dest))?;
        Some(i as u32 + 1)
    }

    /// What to do with a connection: `role` Client at `connect()` (`remote` = destination,
    /// `local` = None: not known yet), Server at `listen()` (`local` = the listening
    /// address, `remote` = None). In order: `RSOCK_EXCLUDE` on the service address (the destination of a
    /// client, the listening address of a server) gives `passthrough`; else the first
    /// matching rule; else `rdma`. `RSOCK_RDMA=0` then turns `rdma` into `tcp`. Allocates
    /// nothing.
    pub fn decide(
        &self,
        role: Role,
        local: Option<std::net::SocketAddr>,
        remote: Option<std::net::SocketAddr>,
    ) -> Decision {
        let mut d = Decision {
            action: Action::Rdma,
            ring_size: self.ring_size,
            send_buf: self.send_buf,
            rule_line: None,
            exclude: None,
            rdma_off: false,
        };
        let service = match role {
            Role::Client => remote,
            Role::Server => local,
        };
        d.exclude = service.and_then(|a| self.exclude_entry(&a));
        if d.exclude.is_some() {
            d.action = Action::Passthrough;
            return d;
        }
        if let Some(r) = self
            .rules
            .iter()
            .find(|r| r.matches(&self.prog, role, local, remote))
        {
            d.action = r.action;
            d.ring_size = r.ring_size.unwrap_or(d.ring_size);
            d.send_buf = r.send_buf.unwrap_or(d.send_buf);
            d.rule_line = Some(r.line);
        }
        if !self.rdma && d.action == Action::Rdma {
            d.action = Action::Tcp;
            d.rdma_off = true;
        }
        d
    }
}

impl Default for Config {
    fn default() -> Self {
        let uid = crate::sys::process::real_uid();
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
            ring_size: crate::proto::DEFAULT_RING_SIZE,
            send_buf: crate::proto::DEFAULT_SEND_BUF_SIZE,
            buf_start: 16 * 1024,
            max_pinned_mb: None,
            recv_credits: crate::proto::DEFAULT_RECV_CREDITS,
            max_inline: crate::proto::DEFAULT_MAX_INLINE,
            spin_us: 400,
            exclude: DEFAULT_EXCLUDE
                .split(',')
                .filter_map(Exclude::parse)
                .collect(),
            rdma: true,
            takeover: true,
            links: false,
            redirect: true,
            link_idle_ms: 60_000,
            link_grants: 8,
            rules_path: None,
            rules: Vec::new(),
            prog: String::new(),
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
    "RSOCK_BUF_START",
    "RSOCK_MAX_PINNED_MB",
    "RSOCK_RECV_CREDITS",
    "RSOCK_INLINE",
    "RSOCK_SPIN_US",
    "RSOCK_EXCLUDE",
    "RSOCK_RDMA",
    "RSOCK_TAKEOVER",
    "RSOCK_LINKS",
    "RSOCK_REDIRECT",
    "RSOCK_LINK_IDLE_MS",
    "RSOCK_LINK_GRANTS",
    "RSOCK_CONFIG",
    // Not settings: the exec hooks name the streams they pass to the new image, and the
    // relay ends it inherits, with them.
    "RSOCK_PASSED_FDS",
    "RSOCK_RELAYED_FDS",
    // Not the shim's: `rsock run` finds the shim with it (and passes it on to the program).
    "RSOCK_LIB",
];

/// How a warning of [`Config::parse`] ends when it rejected a value (the setting keeps its
/// default); `rsock run` makes those usage errors.
pub const USING_DEFAULT: &str = "; using the default";

/// The rules file read when `RSOCK_CONFIG` is unset, if it exists.
pub const DEFAULT_RULES: &str = "/etc/rsock.conf";

impl Config {
    /// Builds a config from `RSOCK_*` pairs; returns it with one warning per bad input.
    pub fn parse<I>(vars: I) -> (Config, Vec<String>)
    where
        I: IntoIterator<Item = (OsString, OsString)>,
    {
        let mut c = Config::default();
        let mut warnings = Vec::new();
        let mut config_path: Option<OsString> = None;
        for (name, value) in vars {
            let Some(name) = name.to_str() else { continue };
            if !name.starts_with("RSOCK_") {
                continue;
            }
            let Some(v) = value.to_str().map(str::trim) else {
                warnings.push(format!("{name}: value is not UTF-8{USING_DEFAULT}"));
                continue;
            };
            let mut bad =
                |what: &str| warnings.push(format!("{name}={v:?}: {what}{USING_DEFAULT}"));
            match name {
                "RSOCK_ENABLE" => set_bool(&mut c.enable, v, &mut bad),
                "RSOCK_STATS" => set_bool(&mut c.stats, v, &mut bad),
                "RSOCK_STATS_KEEP" => set_bool(&mut c.stats_keep, v, &mut bad),
                "RSOCK_RDMA" => set_bool(&mut c.rdma, v, &mut bad),
                "RSOCK_TAKEOVER" => set_bool(&mut c.takeover, v, &mut bad),
                "RSOCK_LINKS" => set_bool(&mut c.links, v, &mut bad),
                "RSOCK_REDIRECT" => set_bool(&mut c.redirect, v, &mut bad),
                "RSOCK_CONFIG" => config_path = Some(value.clone()),
                "RSOCK_LOG" if v.is_empty() => {}
                "RSOCK_LOG" => c.log_path = Some(PathBuf::from(value.as_os_str())),
                "RSOCK_LOG_LEVEL" => match v.parse::<LevelFilter>() {
                    Ok(l) => c.log_level = l,
                    Err(_) => bad("expected off, error, warn, info, debug or trace"),
                },
                "RSOCK_STATS_DIR" if v.is_empty() || !v.starts_with('/') => {
                    bad("expected an absolute path")
                }
                "RSOCK_STATS_DIR" => c.stats_dir = PathBuf::from(value.as_os_str()),
                "RSOCK_STATS_SLOTS" => set_u32(&mut c.stats_slots, v, 0, 65536, &mut bad),
                "RSOCK_CONNECT_TIMEOUT_MS" => {
                    set_u32(&mut c.connect_timeout_ms, v, 1, 60_000, &mut bad)
                }
                "RSOCK_NEG_CACHE_MS" => set_u32(&mut c.neg_cache_ms, v, 0, 86_400_000, &mut bad),
                "RSOCK_LINK_IDLE_MS" => set_u32(&mut c.link_idle_ms, v, 0, 86_400_000, &mut bad),
                "RSOCK_LINK_GRANTS" => set_u32(&mut c.link_grants, v, 0, 32, &mut bad),
                "RSOCK_RING_SIZE" => set_u32(&mut c.ring_size, v, 4096, 1 << 30, &mut bad),
                "RSOCK_SEND_BUF" => set_u32(&mut c.send_buf, v, 4096, 1 << 30, &mut bad),
                "RSOCK_BUF_START" => set_u32(&mut c.buf_start, v, 4096, 1 << 30, &mut bad),
                "RSOCK_MAX_PINNED_MB" => {
                    let mut mb = u32::MAX; // out of range: stays unless v is valid
                    set_u32(&mut mb, v, 0, 1 << 22, &mut bad);
                    if mb != u32::MAX {
                        c.max_pinned_mb = Some(mb);
                    }
                }
                "RSOCK_RECV_CREDITS" => set_u32(&mut c.recv_credits, v, 4, 65536, &mut bad),
                "RSOCK_INLINE" => set_u32(&mut c.max_inline, v, 0, 1024, &mut bad),
                "RSOCK_SPIN_US" => set_u32(&mut c.spin_us, v, 0, 100_000, &mut bad),
                "RSOCK_EXCLUDE" => {
                    let entries: Vec<&str> = v
                        .split(',')
                        .map(str::trim)
                        .filter(|e| !e.is_empty())
                        .collect();
                    let parsed: Option<Vec<Exclude>> =
                        entries.iter().map(|e| Exclude::parse(e)).collect();
                    match parsed {
                        Some(list) => c.exclude = list,
                        None => bad("expected comma-separated ADDR/PREFIX or port=N[-M] entries"),
                    }
                }
                // The shim's own note to an exec'd image (api::inherit), not a setting; the
                // CLI's.
                "RSOCK_PASSED_FDS" | "RSOCK_RELAYED_FDS" | "RSOCK_LIB" => {}
                _ => warnings.push(format!(
                    "{name}: unknown variable, ignored (known: {})",
                    KNOWN.join(", ")
                )),
            }
        }
        // Registered memory comes in pages: a ring or send buffer of another size would not
        // match its registration. Round up (the range checks keep the result in range).
        for (name, slot) in [
            ("RSOCK_RING_SIZE", &mut c.ring_size),
            ("RSOCK_SEND_BUF", &mut c.send_buf),
            ("RSOCK_BUF_START", &mut c.buf_start),
        ] {
            let rounded = slot.div_ceil(PAGE) * PAGE;
            if rounded != *slot {
                warnings.push(format!(
                    "{name}={}: not a multiple of {PAGE}; using {rounded}",
                    *slot
                ));
                *slot = rounded;
            }
        }
        // Unset: the default file, if it exists, is chosen by `loaded` (this stays pure).
        // Empty: no rules file at all.
        c.rules_path = config_path.filter(|p| !p.is_empty()).map(PathBuf::from);
        (c, warnings)
    }

    /// Reads and parses the rules file named by [`Config::rules_path`], adding one warning per
    /// line ignored (`FILE line N: why`) or for a file that cannot be read.
    pub fn load_rules(&mut self, warnings: &mut Vec<String>) {
        let Some(path) = &self.rules_path else { return };
        let text = match read_bounded(path, rules::MAX_FILE) {
            Ok(t) => t,
            Err(e) => {
                warnings.push(format!(
                    "RSOCK_CONFIG: cannot read {}: {e}; no rules applied",
                    path.display()
                ));
                return;
            }
        };
        let (list, problems) = rules::parse(&text);
        if text.len() >= rules::MAX_FILE {
            warnings.push(format!(
                "{}: only the first {} bytes are read",
                path.display(),
                rules::MAX_FILE
            ));
        }
        warnings.extend(
            problems
                .into_iter()
                .map(|p| format!("{} {p}", path.display())),
        );
        self.rules = list;
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
        // A setuid program (which /etc/ld.so.preload would give the shim) must not take
        // settings from whoever ran it: RSOCK_LOG would append to any file as root. It runs
        // on the defaults and the system's rules file.
        let secure = crate::sys::raw::secure_execution();
        let (mut c, mut warnings) = Config::parse(
            std::env::vars_os().filter(|(k, _)| !secure && k.as_bytes().starts_with(b"RSOCK_")),
        );
        if secure || std::env::var_os("RSOCK_CONFIG").is_none() {
            c.rules_path = Some(PathBuf::from(DEFAULT_RULES)).filter(|p| p.exists());
        }
        c.load_rules(&mut warnings);
        c.prog = program_name();
        (c, warnings)
    })
}

/// Up to `max` bytes of the file at `path` (std::fs: the config is read inside the shim's
/// reentrancy guard, so these calls go straight to libc).
fn read_bounded(path: &std::path::Path, max: usize) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut text = Vec::new();
    std::fs::File::open(path)?
        .take(max as u64)
        .read_to_end(&mut text)?;
    Ok(text)
}

/// The basename of argv[0], as glibc keeps it (no file read; `/proc/self/comm` would cut
/// it at 15 bytes).
fn program_name() -> String {
    crate::sys::process::short_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The page size registered buffers are made of.
const PAGE: u32 = 4096;

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

    #[test]
    fn max_pinned_is_default_zero_or_a_bound_and_bad_values_warn() {
        assert_eq!(parse(&[]).0.max_pinned_mb, None);
        assert_eq!(
            parse(&[("RSOCK_MAX_PINNED_MB", "0")]).0.max_pinned_mb,
            Some(0)
        );
        assert_eq!(
            parse(&[("RSOCK_MAX_PINNED_MB", "64")]).0.max_pinned_mb,
            Some(64)
        );
        for v in ["-1", "lots", "4194305"] {
            let (c, w) = parse(&[("RSOCK_MAX_PINNED_MB", v)]);
            assert_eq!(c.max_pinned_mb, None, "{v}");
            assert!(
                w.len() == 1 && w[0].contains("RSOCK_MAX_PINNED_MB"),
                "{v}: {w:?}"
            );
        }
    }

    #[test]
    fn ring_and_send_buffer_sizes_round_up_to_pages_with_a_warning() {
        let (c, w) = parse(&[("RSOCK_RING_SIZE", "5000"), ("RSOCK_SEND_BUF", "8192")]);
        assert_eq!(c.ring_size, 8192);
        assert_eq!(c.send_buf, 8192);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("RSOCK_RING_SIZE=5000") && w[0].contains("8192"),
            "{w:?}"
        );
        let (c, w) = parse(&[("RSOCK_SEND_BUF", "1073741823")]);
        assert_eq!(c.send_buf, 1 << 30);
        assert_eq!(w.len(), 1);
    }

    fn parse(pairs: &[(&str, &str)]) -> (Config, Vec<String>) {
        Config::parse(
            pairs
                .iter()
                .map(|(k, v)| (OsString::from(k), OsString::from(v))),
        )
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
        assert_eq!(
            c.log_path.as_deref(),
            Some(std::path::Path::new("/tmp/x.log"))
        );
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
    fn the_clis_variable_is_known() {
        let (c, w) = parse(&[("RSOCK_LIB", "/opt/rsock/librsock.so")]);
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(c, Config::default());
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
        assert_eq!(
            (c.connect_timeout_ms, c.neg_cache_ms, c.ring_size),
            (250, 0, 1 << 20)
        );
        assert_eq!(
            (c.send_buf, c.recv_credits, c.max_inline, c.spin_us),
            (65536, 32, 0, 5)
        );
        let (c, w) = parse(&[
            ("RSOCK_CONNECT_TIMEOUT_MS", "0"),
            ("RSOCK_RING_SIZE", "12"),
            ("RSOCK_RECV_CREDITS", "x"),
        ]);
        assert_eq!(w.len(), 3, "{w:?}");
        assert_eq!(
            (c.connect_timeout_ms, c.ring_size, c.recv_credits),
            (500, 256 * 1024, 64)
        );
    }

    #[test]
    fn exclude_rules() {
        let d = |s: &str| s.parse::<std::net::SocketAddr>().unwrap();
        let (c, w) = parse(&[]);
        assert!(w.is_empty());
        assert!(c.excludes(&d("127.0.0.1:80")) && c.excludes(&d("[::1]:80")));
        assert!(
            c.excludes(&d("[::ffff:127.0.0.5]:80")),
            "v4-mapped loopback"
        );
        assert!(!c.excludes(&d("10.77.0.1:80")));
        let (c, w) = parse(&[(
            "RSOCK_EXCLUDE",
            "10.0.0.0/8, port=22, port=6000-6010, fd00::/8, 192.168.1.7",
        )]);
        assert!(w.is_empty(), "{w:?}");
        assert!(c.excludes(&d("10.77.0.1:80")) && !c.excludes(&d("11.0.0.1:80")));
        assert!(
            c.excludes(&d("1.2.3.4:22"))
                && c.excludes(&d("1.2.3.4:6005"))
                && !c.excludes(&d("1.2.3.4:6011"))
        );
        assert!(c.excludes(&d("[fd12::1]:80")) && !c.excludes(&d("[fe80::1]:80")));
        assert!(c.excludes(&d("192.168.1.7:1")) && !c.excludes(&d("192.168.1.8:1")));
        assert!(
            !c.excludes(&d("127.0.0.1:80")),
            "replacing the list drops the default"
        );
        let (c, _) = parse(&[("RSOCK_EXCLUDE", "")]);
        assert!(c.exclude.is_empty());
        let (c, w) = parse(&[("RSOCK_EXCLUDE", "10.0.0.0/33,port=9-1")]);
        assert_eq!(w.len(), 1);
        assert_eq!(c.exclude, Config::default().exclude);
        assert!(Exclude::parse("0.0.0.0/0")
            .unwrap()
            .matches(&d("8.8.8.8:1")));
    }

    fn with_rules(env: &[(&str, &str)], text: &str) -> Config {
        let (mut c, w) = parse(env);
        assert!(w.is_empty(), "{w:?}");
        let (rules, problems) = rules::parse(text.as_bytes());
        assert!(problems.is_empty(), "{problems:?}");
        c.rules = rules;
        c
    }

    #[test]
    fn decide_folds_exclude_rules_and_rsock_rdma() {
        let d = |s: &str| Some(s.parse::<std::net::SocketAddr>().unwrap());
        let text = "tcp port=5000\nrdma port=5000-5999 ring=1M\npassthrough role=server\n";
        let c = with_rules(&[], text);
        let client = |to| c.decide(Role::Client, None, d(to));
        assert_eq!(
            client("10.77.0.1:5000").action,
            Action::Tcp,
            "first match wins"
        );
        assert_eq!(client("10.77.0.1:5000").rule_line, Some(1));
        let r = client("10.77.0.1:5001");
        assert_eq!(
            (r.action, r.ring_size, r.send_buf, r.rule_line),
            (Action::Rdma, 1 << 20, 256 << 10, Some(2))
        );
        let r = client("10.77.0.1:80");
        assert_eq!(
            (r.action, r.ring_size, r.rule_line),
            (Action::Rdma, 256 << 10, None),
            "no rule: rdma"
        );
        assert_eq!(
            client("127.0.0.1:5001").action,
            Action::Passthrough,
            "RSOCK_EXCLUDE first"
        );
        assert_eq!(
            c.decide(Role::Server, d("10.77.0.1:80"), None).action,
            Action::Passthrough
        );
        assert_eq!(
            c.decide(Role::Server, d("10.77.0.1:5000"), None).action,
            Action::Tcp
        );

        let c = with_rules(&[("RSOCK_RDMA", "0")], text);
        assert_eq!(
            c.decide(Role::Client, None, d("10.77.0.1:5001")).action,
            Action::Tcp
        );
        assert_eq!(
            c.decide(Role::Client, None, d("10.77.0.1:80")).action,
            Action::Tcp
        );
        assert_eq!(
            c.decide(Role::Server, d("10.77.0.1:80"), None).action,
            Action::Passthrough
        );

        let mut c = with_rules(&[], "tcp prog=nc\n");
        c.prog = "nc".into();
        assert_eq!(
            c.decide(Role::Client, None, d("10.77.0.1:1")).action,
            Action::Tcp
        );
        c.prog = "ncat".into();
        assert_eq!(
            c.decide(Role::Client, None, d("10.77.0.1:1")).action,
            Action::Rdma
        );
    }

    #[test]
    fn rules_file_is_read_and_bad_lines_reported_with_their_number() {
        let dir = std::env::temp_dir().join(format!("rsock-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("rsock.conf");
        std::fs::write(&file, "# test\ntcp port=1\nrmda port=2\n").unwrap();
        let (mut c, mut w) = parse(&[("RSOCK_CONFIG", file.to_str().unwrap())]);
        c.load_rules(&mut w);
        assert_eq!(c.rules.len(), 1);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("rsock.conf line 3: unknown action"), "{w:?}");

        let (mut c, mut w) = parse(&[("RSOCK_CONFIG", dir.join("missing.conf").to_str().unwrap())]);
        c.load_rules(&mut w);
        assert!(c.rules.is_empty());
        assert!(w.len() == 1 && w[0].contains("cannot read"), "{w:?}");

        let (c, w) = parse(&[("RSOCK_CONFIG", "")]);
        assert!(
            c.rules_path.is_none() && w.is_empty(),
            "empty: no file at all"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn out_of_range_slots_rejected() {
        let (c, w) = parse(&[("RSOCK_STATS_SLOTS", "65537")]);
        assert_eq!(c.stats_slots, 1024);
        assert_eq!(w.len(), 1);
    }
}
