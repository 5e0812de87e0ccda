//! The `log` facade's backend: lines appended to `RSOCK_LOG` with raw syscalls.
//!
//! Never std I/O (it would come back into our `write` hook and could land on the host
//! program's stderr, which may be a socket). Each record is formatted into a stack buffer
//! and written with one `write(2)` on an `O_APPEND` fd, so concurrent processes and threads
//! sharing one log file interleave whole lines. Programs that close every fd they did not
//! open (daemons, `close_range`) may close ours or reuse its number: before each write the
//! fd is checked against the file's device and inode and reopened if it changed.

use crate::sys::raw;
use std::fmt::Write as _;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::OnceLock;

struct FileLogger {
    path: Vec<u8>, // NUL-terminated
    /// Why it logs there: [`LOG_RSOCK_LOG`] or `LOG_STATS_DIR`.
    target: u32,
    fd: AtomicI32,
    dev_ino: (AtomicU64, AtomicU64),
}

static LOGGER: OnceLock<FileLogger> = OnceLock::new();

/// `stats::LogControl::target`: not logging.
pub const LOG_NOWHERE: u32 = 0;
/// `stats::LogControl::target`: logging to `RSOCK_LOG`.
pub const LOG_RSOCK_LOG: u32 = 1;
/// `stats::LogControl::target`: logging to `<stats dir>/<pid>.log`, asked for by `rsock log`.
pub const LOG_STATS_DIR: u32 = 2;
/// `stats::LogControl::target`: a log file is set but the process cannot open it (it dropped the
/// privileges it made its stats file with, or the file's directory is gone).
pub const LOG_UNWRITABLE: u32 = 3;

/// Installs the file logger for `RSOCK_LOG`'s `path` at `level`. Later calls are ignored.
pub fn init(path: &Path, level: log::LevelFilter) {
    init_at(path, LOG_RSOCK_LOG, level);
}

/// Installs the file logger for `path`, there because of `target`, at `level`; ignored once
/// one is installed.
pub fn init_at(path: &Path, target: u32, level: log::LevelFilter) {
    let mut p = path.as_os_str().as_bytes().to_vec();
    p.push(0);
    let logger = LOGGER.get_or_init(|| FileLogger {
        path: p,
        target,
        fd: AtomicI32::new(-1),
        dev_ino: (AtomicU64::new(0), AtomicU64::new(0)),
    });
    if log::set_logger(logger).is_ok() {
        log::set_max_level(level);
    }
}

/// The installed logger's file (without its NUL), if one is installed.
pub fn installed() -> Option<&'static [u8]> {
    LOGGER.get().map(|l| &l.path[..l.path.len() - 1])
}

/// Whether the installed logger can write its file now (opening it if need be).
pub fn writable() -> bool {
    LOGGER.get().is_some_and(|l| l.fd() >= 0)
}

/// Why the installed logger logs where it does (0 if none is installed).
pub fn target() -> u32 {
    LOGGER.get().map_or(0, |l| l.target)
}

impl FileLogger {
    /// Returns an fd that still refers to our log file, reopening it if needed.
    fn fd(&self) -> i32 {
        let fd = self.fd.load(Ordering::Relaxed);
        if fd >= 0 && self.still_ours(fd) {
            return fd;
        }
        // The file `rsock log` turned on is in the stats directory (checked to be ours when
        // the region was made): never through a link, readable only by us, like the region.
        let private = self.target == LOG_STATS_DIR;
        let (flags, mode) = if private {
            (libc::O_NOFOLLOW, 0o600)
        } else {
            (0, 0o644)
        };
        let new = raw::hide(raw::open(
            &self.path,
            libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT | flags,
            mode,
        ));
        if new < 0 {
            return -1;
        }
        if private && !crate::sys::private::is_own_file(new) {
            raw::close(new);
            return -1;
        }
        if let Some((dev, ino)) = stat(new) {
            self.dev_ino.0.store(dev, Ordering::Relaxed);
            self.dev_ino.1.store(ino, Ordering::Relaxed);
        }
        // Another thread may have reopened too; keep one and close the other.
        match self
            .fd
            .compare_exchange(fd, new, Ordering::AcqRel, Ordering::Relaxed)
        {
            Ok(_) => new,
            Err(current) => {
                raw::close(new);
                current
            }
        }
    }

    fn still_ours(&self, fd: i32) -> bool {
        stat(fd)
            == Some((
                self.dev_ino.0.load(Ordering::Relaxed),
                self.dev_ino.1.load(Ordering::Relaxed),
            ))
    }
}

fn stat(fd: i32) -> Option<(u64, u64)> {
    let saved = raw::errno();
    let id = crate::sys::unix::file_identity(fd);
    raw::set_errno(saved);
    id
}

/// A fixed buffer that silently truncates: formatting never allocates or fails.
struct LineBuf {
    buf: [u8; 1024],
    len: usize,
}

impl std::fmt::Write for LineBuf {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let room = self.buf.len() - 1 - self.len; // keep one byte for '\n'
        let n = s.len().min(room);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

impl log::Log for FileLogger {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let (s, ns) = raw::realtime();
        let (year, month, day, hour, min, sec) = utc(s);
        let mut line = LineBuf {
            buf: [0; 1024],
            len: 0,
        };
        // RFC 3339, UTC, microseconds: 2026-11-23T23:10:01.123456Z.
        let _ = write!(
            line,
            "{year:04}-{month:02}-{day:02}T{hour:02}:{min:02}:{sec:02}.{:06}Z rsock[{}:{}] {:<5} {}",
            ns / 1000,
            raw::getpid(),
            raw::gettid(),
            record.level(),
            record.args()
        );
        line.buf[line.len] = b'\n';
        let fd = self.fd();
        if fd >= 0 {
            raw::write_all(fd, &line.buf[..=line.len]);
        }
    }

    fn flush(&self) {}
}

/// (year, month, day, hour, minute, second) in UTC of `secs` since the epoch, without a date
/// crate or the C library (days to civil date: Howard Hinnant's method). Allocates nothing.
pub fn utc(secs: i64) -> (i64, u32, u32, u32, u32, u32) {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let rem = rem as u32;
    (
        year,
        month as u32,
        day as u32,
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
    )
}

#[cfg(test)]
mod tests {
    use super::utc;

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), (1970, 1, 1, 0, 0, 0));
        assert_eq!(utc(951_782_400), (2000, 2, 29, 0, 0, 0), "a leap day");
        assert_eq!(utc(1_795_654_311), (2026, 11, 26, 0, 51, 51));
        assert_eq!(utc(-1), (1969, 12, 31, 23, 59, 59));
    }
}
