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
        }
    }
}

/// Names of all known variables; anything else starting with `RSOCK_` draws a warning.
pub const KNOWN: &[&str] = &[
    "RSOCK_ENABLE",
    "RSOCK_LOG",
    "RSOCK_LOG_LEVEL",
    "RSOCK_STATS",
    "RSOCK_STATS_DIR",
    "RSOCK_STATS_KEEP",
    "RSOCK_STATS_SLOTS",
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
                "RSOCK_STATS_SLOTS" => match v.parse::<u32>() {
                    Ok(n) if n <= 65536 => c.stats_slots = n,
                    _ => bad("expected an integer from 0 to 65536"),
                },
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
    fn out_of_range_slots_rejected() {
        let (c, w) = parse(&[("RSOCK_STATS_SLOTS", "65537")]);
        assert_eq!(c.stats_slots, 1024);
        assert_eq!(w.len(), 1);
    }
}
