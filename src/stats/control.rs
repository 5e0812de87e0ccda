//! Changing a running process's log level from outside: `rsock log PID LEVEL`.
//!
//! The request is a word in the process's stats region ([`LogControl`]), which only its
//! user (and root) can write. The shim looks at it at its slow points — a new socket,
//! connection, listener or close, and the engine helper's tick — one relaxed load when
//! nothing is asked, and answers in [`LogControl::level`]. A process started without
//! `RSOCK_LOG` then logs to `<stats dir>/<pid>.log`. Rejected: a signal (the program may use
//! any of them, and a handler could not take the logger's locks); a file the shim stats on
//! every call (a syscall on the data path).

use super::{Header, LogControl, MAGIC, REGION};
use log::LevelFilter;
use std::sync::atomic::{AtomicU32, Ordering::*};

/// The pid in the name of the log file `rsock log` made this process open (0: none).
static FILE_PID: AtomicU32 = AtomicU32::new(0);

// Where the log goes lives with the logger; the control word carries it.
pub use crate::logger::{LOG_NOWHERE, LOG_RSOCK_LOG, LOG_STATS_DIR, LOG_UNWRITABLE};

/// The word for `level`: its index + 1.
pub fn encode(level: LevelFilter) -> u32 {
    level as u32 + 1
}

/// The level of a word; `None` for 0 or a value out of range.
pub fn decode(word: u32) -> Option<LevelFilter> {
    LevelFilter::iter().nth(word.checked_sub(1)? as usize)
}

/// How a process logs, in words: "off", "debug to FILE", ... `rsock_log` names the file of
/// `RSOCK_LOG`, `stats_file` the one `rsock log` turned on (`LOG_STATS_DIR`).
pub fn describe(
    level: Option<LevelFilter>,
    target: u32,
    rsock_log: &str,
    stats_file: &str,
) -> String {
    let level = match level {
        None => return "level not known yet".into(),
        Some(LevelFilter::Off) => return "off".into(),
        Some(l) => l.as_str().to_lowercase(),
    };
    match target {
        LOG_RSOCK_LOG => format!("{level} to {rsock_log}"),
        LOG_STATS_DIR => format!("{level} to {stats_file}"),
        LOG_UNWRITABLE => {
            format!("{level}, but the process cannot open its log file, so it logs nothing")
        }
        _ => "off".into(),
    }
}

/// The file a process logs to when `rsock log` turned its log on.
pub fn log_file(dir: &std::path::Path, pid: u32) -> std::path::PathBuf {
    dir.join(format!("{pid}.log"))
}

/// Fills a new region's answer: the level and target in force now.
pub(super) fn init(log: &LogControl) {
    let target = if crate::logger::installed().is_some() {
        crate::logger::target()
    } else {
        LOG_NOWHERE
    };
    let level = if target == LOG_NOWHERE {
        LevelFilter::Off
    } else {
        log::max_level()
    };
    log.target.store(target, Relaxed);
    log.file_pid.store(FILE_PID.load(Relaxed), Relaxed);
    log.level.store(encode(level), Relaxed);
}

/// Applies a pending log level request, if there is one. Never makes the region.
#[inline]
pub fn poll() {
    let p = REGION.load(Acquire);
    if p.is_null() || super::sealed() {
        return;
    }
    // SAFETY: once published the mapping lives until exit.
    let h: &Header = unsafe { &*p };
    let want = h.log.request.load(Relaxed);
    if want != 0 && want != h.log.level.load(Relaxed) {
        apply(h, want);
    }
}

#[cold]
fn apply(h: &Header, want: u32) {
    // A vfork child shares its parent's memory: the logger it would set up is the
    // parent's, and the answer would be the parent's to give. The parent takes it.
    if crate::sys::raw::in_vfork_child() {
        return;
    }
    let Some(level) = decode(want) else {
        h.log.request.store(0, Relaxed); // garbage: not ours to guess at
        return;
    };
    if level != LevelFilter::Off && crate::logger::installed().is_none() {
        let cfg = crate::config::Config::get();
        crate::logger::init_at(&log_file(&cfg.stats_dir, h.pid), LOG_STATS_DIR, level);
        if crate::logger::target() == LOG_STATS_DIR {
            FILE_PID.store(h.pid, Relaxed);
        }
    }
    let target = match crate::logger::installed() {
        None => LOG_NOWHERE,
        Some(_) if level != LevelFilter::Off && !crate::logger::writable() => LOG_UNWRITABLE,
        Some(_) => crate::logger::target(),
    };
    let before = decode(h.log.level.load(Relaxed)).unwrap_or(LevelFilter::Off);
    // Said at the higher of the two levels, so the change shows in the log either way.
    log::set_max_level(level.max(before));
    log::warn!("rsock log: level {before} -> {level} (asked by rsock log)");
    // A log it cannot open stays off: each record would try to open it again.
    log::set_max_level(if target == LOG_UNWRITABLE {
        LevelFilter::Off
    } else {
        level
    });
    h.log.target.store(target, Relaxed);
    h.log.file_pid.store(FILE_PID.load(Relaxed), Relaxed);
    h.log.level.store(want, Release);
}

/// What `rsock log` reads and writes: another process's [`LogControl`], mapped from its
/// stats file.
pub struct Remote {
    map: *mut Header,
    len: usize,
}

impl Remote {
    /// Maps `<dir>/<pid>.stats` read-write. Fails with the open's error (EACCES: another
    /// user's process), or EINVAL if the file is not a region of this layout for `pid`, or
    /// a link, or not owned by the process's user (run as root, rsock must not write into
    /// a file another user pointed it at).
    pub fn open(dir: &std::path::Path, pid: u32) -> std::io::Result<Remote> {
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        use std::os::unix::io::AsRawFd;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(dir.join(format!("{pid}.stats")))?;
        let len = std::mem::size_of::<Header>();
        let meta = f.metadata()?;
        // Made by the process under one of its uids, or by root before it dropped them.
        let owner_ok = meta.uid() == 0 || process_uids(pid)?.contains(&meta.uid());
        if meta.len() < len as u64 || !owner_ok || meta.nlink() != 1 {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        // The header of a file we opened read-write, shared.
        let map = crate::sys::mem::map_shared(f.as_raw_fd(), len)?;
        let r = Remote {
            map: map.cast(),
            len,
        };
        // SAFETY: mapped above, at least a header long.
        let h = unsafe { &*r.map };
        if h.magic != MAGIC || h.pid != pid {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        Ok(r)
    }

    fn log(&self) -> &LogControl {
        // SAFETY: mapped for self's life.
        unsafe { &(*self.map).log }
    }

    /// Asks the process for `level`.
    pub fn request(&self, level: LevelFilter) {
        self.log().request.store(encode(level), Release);
    }

    /// The level in force, where the log goes ([`LOG_NOWHERE`], ...) and, for
    /// [`LOG_STATS_DIR`], the pid in the file's name.
    pub fn current(&self) -> (Option<LevelFilter>, u32, u32) {
        let l = self.log();
        (
            decode(l.level.load(Acquire)),
            l.target.load(Relaxed),
            l.file_pid.load(Relaxed),
        )
    }
}

/// The real, effective, saved and filesystem uids of `pid` (`/proc/PID/status`, readable by
/// anyone; `/proc/PID` itself is root's for a process that changed credentials).
pub fn process_uids(pid: u32) -> std::io::Result<Vec<u32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    Ok(status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .map(|ids| {
            ids.split_whitespace()
                .filter_map(|u| u.parse().ok())
                .collect()
        })
        .unwrap_or_default())
}

impl Drop for Remote {
    fn drop(&mut self) {
        // SAFETY: our mapping, unused from now on.
        unsafe { crate::sys::mem::unmap(self.map.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_level_has_a_word() {
        for l in LevelFilter::iter() {
            assert_eq!(decode(encode(l)), Some(l));
        }
        assert_eq!(decode(0), None);
        assert_eq!(decode(7), None);
    }
}
