//! Per-process counters in a small file-backed shared-memory region.
//!
//! Each process that tracks a socket maps `<RSOCK_STATS_DIR>/<pid>.stats` (default dir
//! `/dev/shm/rsock-<uid>`): a header, process-wide counters and a table of per-connection
//! slots, all plain atomics. `rsock stat` reads the files of live processes (like `smcss` or
//! `vma_stats`); the file is removed at exit unless `RSOCK_STATS_KEEP=1`. Updating a counter
//! is one relaxed atomic add; nothing here locks on the data path.
//!
//! After `fork` the child must not count into its parent's region (the mapping is shared):
//! [`after_fork_child`] drops the mapping and bumps an epoch that invalidates every slot handle
//! held by inherited sockets; the child creates its own region on its next tracked socket.

use crate::config::Config;
use crate::sys::raw;
use std::os::unix::ffi::OsStrExt;
use std::ptr;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU32, AtomicU64, Ordering::*};

/// File magic; the last byte is the layout version.
pub const MAGIC: [u8; 8] = *b"RSOCKST\x09";

/// The layout version: the last byte of [`MAGIC`].
pub const VERSION: u8 = MAGIC[7];

/// Which transport carries a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Path {
    /// An rdma_cm RC connection driven by the stream protocol.
    Rdma = 0,
    /// Kernel TCP because RDMA could not serve; see [`Fallback`] for why.
    Tcp = 1,
    /// Kernel TCP because the shim was told not to try (rules, RSOCK_* settings).
    Passthrough = 2,
}

/// Number of [`Path`] values.
pub const PATHS: usize = 3;

impl Path {
    /// Lower-case name used by `rsock stat` and the log.
    pub fn name(self) -> &'static str {
        ["rdma", "tcp", "passthrough"][self as usize]
    }

    fn from_u32(v: u32) -> Option<Path> {
        [Path::Rdma, Path::Tcp, Path::Passthrough]
            .get(v as usize)
            .copied()
    }
}

/// Why a connection is on kernel TCP instead of RDMA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Fallback {
    /// No RDMA device on this host.
    NoDevice = 0,
    /// A device exists but RDMA cannot be used (librdmacm/libibverbs missing or failing).
    RdmaUnavailable = 1,
    /// Accepted on the kernel TCP listener: the peer came over TCP.
    PeerTcp = 2,
    /// The peer has no rsock listener (rdma_cm connect rejected).
    Rejected = 3,
    /// Address or route resolution failed, or the peer is unreachable over RDMA.
    Unreachable = 4,
    /// The RDMA connection did not complete in time.
    Timeout = 5,
    /// The peer answered with a foreign or incompatible handshake.
    BadHandshake = 6,
    /// Out of QPs, CQs, registered memory or memlock.
    Resources = 7,
    /// Remembered as failing by the negative cache.
    NegativeCache = 8,
    /// Socket options or address family the RDMA path does not serve.
    Unsupported = 9,
    /// A rule of the rules file (action `tcp`) or `RSOCK_RDMA=0` kept it off RDMA.
    Rule = 10,
    /// `RSOCK_EXCLUDE` names the destination (or, for a server, the listening address).
    Excluded = 11,
}

/// Number of [`Fallback`] slots in the region (room to grow without a layout change).
pub const REASONS: usize = 16;

impl Fallback {
    /// All reasons, in wire order.
    pub const ALL: [Fallback; 12] = [
        Fallback::NoDevice,
        Fallback::RdmaUnavailable,
        Fallback::PeerTcp,
        Fallback::Rejected,
        Fallback::Unreachable,
        Fallback::Timeout,
        Fallback::BadHandshake,
        Fallback::Resources,
        Fallback::NegativeCache,
        Fallback::Unsupported,
        Fallback::Rule,
        Fallback::Excluded,
    ];

    /// Snake-case name used by `rsock stat` and the log.
    pub fn name(self) -> &'static str {
        [
            "no_device",
            "rdma_unavailable",
            "peer_tcp",
            "rejected",
            "unreachable",
            "timeout",
            "bad_handshake",
            "resources",
            "negative_cache",
            "unsupported",
            "rule",
            "excluded",
        ][self as usize]
    }
}

/// Process-wide counters.
#[repr(C)]
pub struct Counters {
    /// Connections established, by [`Path`].
    pub conns: [AtomicU64; PATHS],
    /// Bytes sent, by [`Path`].
    pub tx: [AtomicU64; PATHS],
    /// Bytes received, by [`Path`].
    pub rx: [AtomicU64; PATHS],
    /// Fallbacks to TCP, by [`Fallback`].
    pub fallback: [AtomicU64; REASONS],
    /// Blocking calls on RDMA streams that slept (their polling ended without an answer).
    pub slept: AtomicU64,
    /// Of those, sleeps that found the stream ready only when their bound ran out, with no
    /// wake-up on its way: lost wake-ups (none expected; see docs/DESIGN.md, "One source of
    /// truth, and a seam").
    pub woke_late: AtomicU64,
    /// Nonblocking writes that found the send buffer full and waited out their whole bound
    /// (50 ms) for the writes in flight to complete: none expected, as completions come in
    /// milliseconds at most (a stream on a link waited so at most of its EAGAINs for one
    /// that was never coming, fixed 2026-11-29).
    pub settle_timeouts: AtomicU64,
    /// Receive rings that grew to their full size (a peer streamed into them).
    pub grown_rings: AtomicU64,
    /// Send buffers that grew to their full size.
    pub grown_send: AtomicU64,
    /// Sockets that started listening.
    pub listens: AtomicU64,
    /// Connects the peer refused (`ECONNREFUSED`): not connections, so not in `conns`.
    pub connects_refused: AtomicU64,
    /// Connects that failed otherwise (unreachable, timed out, ...).
    pub connects_failed: AtomicU64,
    /// Links set up (engine/link.rs), either end.
    pub links: AtomicU64,
    /// Streams opened or accepted over a link (no rdma_cm connection of their own; also
    /// counted in `conns`).
    pub link_streams: AtomicU64,
    /// Of those, streams opened or accepted on a grant: the connector wrote without waiting
    /// for an answer.
    pub link_granted: AtomicU64,
    /// Connects that went to a branch of the listener (another process accepting from it)
    /// rather than to its owner (listener/branch.rs): redirected, or to where one was.
    pub branch_connects: AtomicU64,
    /// Connections accepted through this process's branch of a listener another owns.
    pub branch_accepts: AtomicU64,
}

/// Start of the region.
#[repr(C)]
pub struct Header {
    /// [`MAGIC`].
    pub magic: [u8; 8],
    /// Process id.
    pub pid: u32,
    /// Number of [`ConnSlot`]s after the header.
    pub nslots: u32,
    /// When the region was made, seconds since the epoch.
    pub start_sec: u64,
    /// The process's start time in clock ticks after boot, field 22 of `/proc/<pid>/stat`
    /// (0 if unknown): a live pid whose start differs is another process (the pid was reused).
    pub start_ticks: u64,
    /// Program name, NUL-padded.
    pub comm: [u8; 32],
    /// Process-wide counters.
    pub counters: Counters,
    /// The log level asked for from outside (`rsock log`) and the one in force.
    pub log: LogControl,
}

/// A log level change asked of a running process, and its answer (see [`control`]).
#[repr(C)]
pub struct LogControl {
    /// Asked for by `rsock log`: a level (`log::LevelFilter` as usize) + 1; 0: nothing asked.
    pub request: AtomicU32,
    /// In force: level + 1 (0 before the process first looked).
    pub level: AtomicU32,
    /// Where the log goes: [`control::LOG_NOWHERE`], `LOG_RSOCK_LOG` or `LOG_STATS_DIR`.
    pub target: AtomicU32,
    /// With `LOG_STATS_DIR`: the pid in the log file's name (a forked child logs on into
    /// its parent's file).
    pub file_pid: AtomicU32,
}

/// What a [`ConnSlot`] holds.
pub const SLOT_CONN: u32 = 0;
/// A [`ConnSlot`] holding a listener: `path` is `rdma` for a dual (RDMA + kernel TCP)
/// listener, `tcp` for kernel TCP only with `reason` saying why; `peer` is empty.
pub const SLOT_LISTENER: u32 = 1;

/// One live connection or listener. `seq` is 0 when free, odd while being filled, even when
/// valid.
#[repr(C)]
pub struct ConnSlot {
    /// Publication word (see the type doc).
    pub seq: AtomicU32,
    /// [`SLOT_CONN`] or [`SLOT_LISTENER`].
    pub kind: AtomicU32,
    /// The program's fd.
    pub fd: AtomicI32,
    /// [`Path`] as u32.
    pub path: AtomicU32,
    /// [`Fallback`] as u32, or u32::MAX.
    pub reason: AtomicU32,
    /// Local address as a raw `sockaddr_in`/`sockaddr_in6` (zero-padded).
    pub local: [u8; 28],
    /// Peer address, same encoding.
    pub peer: [u8; 28],
    /// The [`Detail`] of the slot's cause, first word (see [`Detail::encode`]).
    pub detail: AtomicU32,
    /// Its second word: the rdma_cm event.
    pub event: AtomicU32,
    /// Padding to keep the counters aligned.
    pub _pad: u32,
    /// Bytes sent.
    pub tx: AtomicU64,
    /// Bytes received.
    pub rx: AtomicU64,
}

impl ConnSlot {
    /// Records `cause`: its reason and both words of its detail.
    fn set_cause(&self, cause: Cause) {
        let (detail, event) = cause.detail.encode();
        self.reason
            .store(cause.reason.map_or(u32::MAX, |r| r as u32), Relaxed);
        self.detail.store(detail, Relaxed);
        self.event.store(event, Relaxed);
    }
}

/// Byte length of a region with `nslots` slots.
pub fn region_len(nslots: u32) -> usize {
    std::mem::size_of::<Header>() + nslots as usize * std::mem::size_of::<ConnSlot>()
}

static REGION: AtomicPtr<Header> = AtomicPtr::new(ptr::null_mut());
static EPOCH: AtomicU32 = AtomicU32::new(1);
/// Creation state in this epoch: 0 not tried, 1 being created, 2 done (made or given up).
static CREATE: AtomicU32 = AtomicU32::new(0);
/// The region's file name (leaked, NUL-terminated), for removal at exit.
static FILE: AtomicPtr<libc::c_char> = AtomicPtr::new(ptr::null_mut());

/// The region, created on first use if stats are enabled.
#[inline]
pub fn region() -> Option<&'static Header> {
    let p = REGION.load(Acquire);
    if !p.is_null() {
        // SAFETY: once published the mapping lives until exit.
        return Some(unsafe { &*p });
    }
    if CREATE.load(Acquire) == 2 {
        return None;
    }
    create()
}

#[cold]
fn create() -> Option<&'static Header> {
    // One thread creates; threads racing with it wait for the outcome (a few syscalls), so
    // no connection of a burst at start-up goes uncounted.
    if CREATE.compare_exchange(0, 1, AcqRel, Acquire).is_err() {
        while CREATE.load(Acquire) == 1 {
            std::thread::yield_now();
        }
        let p = REGION.load(Acquire);
        // SAFETY: as in `region`.
        return (!p.is_null()).then(|| unsafe { &*p });
    }
    let cfg = Config::get();
    let made = if cfg.stats {
        map_new(cfg)
    } else {
        Err(std::io::Error::from_raw_os_error(0))
    };
    let result = match made {
        Ok((h, path)) => {
            FILE.store(
                std::ffi::CString::new(path).map_or(ptr::null_mut(), |c| c.into_raw()),
                Release,
            );
            REGION.store(h, Release);
            if !cfg.stats_keep {
                static ATEXIT: std::sync::Once = std::sync::Once::new();
                ATEXIT.call_once(|| {
                    crate::sys::process::at_exit(remove_file_at_exit);
                });
            }
            // SAFETY: just mapped.
            Some(unsafe { &*h })
        }
        Err(_) if !cfg.stats => None,
        Err(e) => {
            log::warn!(
                "stats disabled: cannot create region in {}: {e}",
                cfg.stats_dir.display()
            );
            None
        }
    };
    CREATE.store(2, Release);
    result
}

fn map_new(cfg: &Config) -> std::io::Result<(*mut Header, Vec<u8>)> {
    let pid = raw::getpid();
    let dir_name = std::ffi::CString::new(cfg.stats_dir.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    let dir = crate::sys::private::private_dir(&dir_name)?;
    let name = std::ffi::CString::new(format!("{pid}.stats")).unwrap_or_default();
    let file = crate::sys::private::open_private(&dir, &name, libc::O_RDWR, 0o600)?;
    let fd = file.as_raw_fd();
    let mut path = dir_name.into_bytes();
    path.push(b'/');
    path.extend_from_slice(name.as_bytes());
    path.push(0);
    let len = region_len(cfg.stats_slots);
    // A file of another process with our pid (kept by RSOCK_STATS_KEEP) is emptied first,
    // then sized and mapped shared read-write; on an error, dropping `file` closes it.
    file.set_len(0)?;
    file.set_len(len as libc::off_t)?;
    let mem = crate::sys::mem::map_shared(fd, len);
    drop(file);
    let h = mem?.cast::<Header>();
    let start_ticks = std::fs::read("/proc/self/stat")
        .ok()
        .and_then(|b| start_ticks_of(&b))
        .unwrap_or(0);
    let mut comm = [0u8; 32];
    if let Ok(c) = std::fs::read("/proc/self/comm") {
        let c = c.strip_suffix(b"\n").unwrap_or(&c);
        let n = c.len().min(comm.len());
        comm[..n].copy_from_slice(&c[..n]);
    }
    // SAFETY: the zero-filled mapping is large enough for the header; counters start at 0.
    unsafe {
        ptr::addr_of_mut!((*h).pid).write(pid as u32);
        ptr::addr_of_mut!((*h).nslots).write(cfg.stats_slots);
        ptr::addr_of_mut!((*h).start_sec).write(process_start_sec());
        ptr::addr_of_mut!((*h).start_ticks).write(start_ticks);
        ptr::addr_of_mut!((*h).comm).write(comm);
        control::init(&(*h).log);
        std::sync::atomic::fence(Release);
        ptr::addr_of_mut!((*h).magic).write(MAGIC); // last: readers skip half-made files
    }
    path.pop(); // CString adds it back
    Ok((h, path))
}

/// Field 22 (`starttime`, clock ticks after boot) of a `/proc/<pid>/stat` line. The program
/// name in field 2 may hold spaces and parentheses: fields are counted after its last `)`.
pub fn start_ticks_of(stat: &[u8]) -> Option<u64> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&stat[close + 1..]).ok()?;
    // After the name come field 3 (state), 4, ...: field 22 is the 20th of them.
    rest.split_ascii_whitespace().nth(19)?.parse().ok()
}

fn process_start_sec() -> u64 {
    raw::realtime().0 as u64
}

extern "C" fn remove_file_at_exit() {
    if sealed() {
        return; // the filter may forbid it; `rsock stat` skips a dead process's file
    }
    let h = REGION.load(Acquire);
    let f = FILE.load(Acquire);
    // SAFETY: h is our live mapping. A forked child exiting must not remove its parent's file.
    if h.is_null() || f.is_null() || unsafe { (*h).pid } != raw::getpid() as u32 {
        return;
    }
    // SAFETY: f is the NUL-terminated name stored at creation.
    let name = unsafe { std::ffi::CStr::from_ptr(f) };
    crate::sys::private::remove(name);
}

/// The process installed a seccomp filter (`init::seal`): the shim makes no file call of its
/// own from then on.
static SEALED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// No region is made from now on, nor a log file for `rsock log`, nor the region's file
/// removed at exit (`init::seal`): each is a file call the program's filter may forbid.
pub fn seal() {
    SEALED.store(true, Release);
    let _ = CREATE.compare_exchange(0, 2, AcqRel, Acquire);
}

/// Whether [`seal`] was called.
pub(crate) fn sealed() -> bool {
    SEALED.load(Relaxed)
}

/// Forgets the parent's region in a forked child (see the module doc). A child that
/// inherited tracked sockets gets its own region at once, while it still has its parent's
/// credentials: servers drop root right after fork (nginx's and Apache's workers, rsyncd,
/// sshd's privilege separation), and then could not create it in the parent's directory.
/// `sockets_came_along`: the fd table holds sockets (its caller knows; stats does not look).
pub fn after_fork_child(sockets_came_along: bool) {
    REGION.store(ptr::null_mut(), Release); // the old mapping stays; it is small and harmless
    FILE.store(ptr::null_mut(), Release);
    EPOCH.fetch_add(1, AcqRel);
    CREATE.store(if sealed() { 2 } else { 0 }, Release);
    if CREATE.load(Acquire) == 0 && Config::get().stats && sockets_came_along {
        create();
    }
}

/// A connection's claim on a [`ConnSlot`], valid within one epoch. Packed into a u64 so a
/// socket can hold it in an atomic: epoch << 32 | index + 1; 0 means no slot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotHandle(pub u64);

impl SlotHandle {
    fn slot(self) -> Option<&'static ConnSlot> {
        if self.0 == 0 || (self.0 >> 32) as u32 != EPOCH.load(Relaxed) {
            return None;
        }
        let h = region()?;
        let idx = (self.0 as u32 - 1) as usize;
        if idx >= h.nslots as usize {
            return None;
        }
        // SAFETY: idx < nslots and slots follow the header in the mapping.
        Some(unsafe { &*(h as *const Header).add(1).cast::<ConnSlot>().add(idx) })
    }
}

/// Counts a blocking call's sleep on an RDMA stream, and whether it woke late (see
/// [`Counters::woke_late`]).
pub fn count_sleep(woke_late: bool) {
    if let Some(h) = region() {
        h.counters.slept.fetch_add(1, Relaxed);
        if woke_late {
            h.counters.woke_late.fetch_add(1, Relaxed);
        }
    }
}

/// Counts a nonblocking write that waited out its bound for completions (see
/// [`Counters::settle_timeouts`]).
pub fn count_settle_timeout() {
    if let Some(h) = region() {
        h.counters.settle_timeouts.fetch_add(1, Relaxed);
    }
}

/// Counts a buffer that grew: a receive ring (`ring`) or a send buffer.
pub fn count_growth(ring: bool) {
    if let Some(h) = region() {
        let c = if ring {
            &h.counters.grown_rings
        } else {
            &h.counters.grown_send
        };
        c.fetch_add(1, Relaxed);
    }
}

/// Counts a link set up (`stream`: false) or a stream opened or accepted on one.
pub fn count_link(stream: bool) {
    if let Some(h) = region() {
        let c = if stream {
            &h.counters.link_streams
        } else {
            &h.counters.links
        };
        c.fetch_add(1, Relaxed);
    }
}

/// Counts a stream opened or accepted on a grant (no answer waited for).
pub fn count_granted() {
    if let Some(h) = region() {
        h.counters.link_granted.fetch_add(1, Relaxed);
    }
}

/// Counts a connect that went to a branch (`accepted`: false) or a connection accepted
/// through one (true).
pub fn count_branch(accepted: bool) {
    if let Some(h) = region() {
        let c = if accepted {
            &h.counters.branch_accepts
        } else {
            &h.counters.branch_connects
        };
        c.fetch_add(1, Relaxed);
    }
}

/// Makes this process's region now if it has none yet: a process shows in `rsock stat` from
/// its first tracked socket, before it connects or listens. One load once made.
#[inline]
pub fn touch() {
    let _ = region();
    control::poll();
}

/// Counts a connect that failed with `errno` (`refused` for `ECONNREFUSED`).
pub fn count_connect_failed(errno: i32) {
    if let Some(h) = region() {
        let c = if errno == libc::ECONNREFUSED {
            &h.counters.connects_refused
        } else {
            &h.counters.connects_failed
        };
        c.fetch_add(1, Relaxed);
    }
}

/// Counts a new connection on `path` (with its cause's reason, for fallbacks) and claims a
/// slot for it.
pub fn open_conn(fd: i32, path: Path, cause: Cause, local: &[u8], peer: &[u8]) -> SlotHandle {
    control::poll();
    let Some(h) = region() else {
        return SlotHandle(0);
    };
    h.counters.conns[path as usize].fetch_add(1, Relaxed);
    if let Some(r) = cause.reason {
        h.counters.fallback[r as usize].fetch_add(1, Relaxed);
    }
    claim(h, SLOT_CONN, fd, path, cause, local, peer)
}

/// Counts a new listener and claims a slot for it: `rdma` for a dual listener, else kernel
/// TCP only because of `tcp_only`.
pub fn open_listener(fd: i32, tcp_only: Option<Cause>, local: &[u8]) -> SlotHandle {
    control::poll();
    let Some(h) = region() else {
        return SlotHandle(0);
    };
    h.counters.listens.fetch_add(1, Relaxed);
    let path = if tcp_only.is_some() {
        Path::Tcp
    } else {
        Path::Rdma
    };
    let cause = tcp_only.unwrap_or(Cause::NONE);
    claim(h, SLOT_LISTENER, fd, path, cause, local, &[])
}

fn claim(
    h: &Header,
    kind: u32,
    fd: i32,
    path: Path,
    cause: Cause,
    local: &[u8],
    peer: &[u8],
) -> SlotHandle {
    // SAFETY: slots follow the header; nslots of them.
    let slots = unsafe {
        std::slice::from_raw_parts(
            (h as *const Header).add(1).cast::<ConnSlot>(),
            h.nslots as usize,
        )
    };
    for (i, s) in slots.iter().enumerate() {
        if s.seq.compare_exchange(0, 1, Acquire, Relaxed).is_ok() {
            s.kind.store(kind, Relaxed);
            s.fd.store(fd, Relaxed);
            s.path.store(path as u32, Relaxed);
            s.set_cause(cause);
            s.tx.store(0, Relaxed);
            s.rx.store(0, Relaxed);
            // SAFETY: we own the slot while seq is odd; readers retry on odd seq.
            unsafe {
                copy_addr(ptr::addr_of!(s.local).cast_mut(), local);
                copy_addr(ptr::addr_of!(s.peer).cast_mut(), peer);
            }
            s.seq.store(2, Release);
            return SlotHandle(((EPOCH.load(Relaxed) as u64) << 32) | (i as u64 + 1));
        }
    }
    SlotHandle(0)
}

unsafe fn copy_addr(dst: *mut [u8; 28], src: &[u8]) {
    let mut a = [0u8; 28];
    let n = src.len().min(28);
    a[..n].copy_from_slice(&src[..n]);
    ptr::write_volatile(dst, a);
}

/// Updates a slot's fd (after dup2 moved the connection) — cosmetic, for `rsock stat`.
pub fn set_fd(h: SlotHandle, fd: i32) {
    if let Some(s) = h.slot() {
        s.fd.store(fd, Relaxed);
    }
}

/// A listener now on kernel TCP only (`cause` says why): its slot says so from now on.
pub fn set_tcp_only(h: SlotHandle, cause: Cause) {
    if let Some(s) = h.slot() {
        s.set_cause(cause);
        s.path.store(Path::Tcp as u32, Relaxed);
    }
}

/// Releases a connection's or listener's slot.
pub fn close_conn(h: SlotHandle) {
    control::poll();
    if let Some(s) = h.slot() {
        s.seq.store(0, Release);
    }
}

/// Counts `n` bytes sent on `path` (and on the connection's slot).
#[inline]
pub fn add_tx(path: Path, h: SlotHandle, n: usize) {
    if let Some(r) = region() {
        r.counters.tx[path as usize].fetch_add(n as u64, Relaxed);
    }
    if let Some(s) = h.slot() {
        s.tx.fetch_add(n as u64, Relaxed);
    }
}

/// Counts `n` bytes received on `path` (and on the connection's slot).
#[inline]
pub fn add_rx(path: Path, h: SlotHandle, n: usize) {
    if let Some(r) = region() {
        r.counters.rx[path as usize].fetch_add(n as u64, Relaxed);
    }
    if let Some(s) = h.slot() {
        s.rx.fetch_add(n as u64, Relaxed);
    }
}

mod cause;
pub mod control;
pub mod read;
pub use cause::{Cause, CmCode, Detail};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_keep_their_counters_aligned() {
        assert_eq!(std::mem::size_of::<ConnSlot>(), 104);
        assert_eq!(std::mem::size_of::<Header>() % 8, 0);
    }

    #[test]
    fn start_ticks_after_an_awkward_name() {
        let line = b"4242 (a b) c)) S 1 4242 4242 0 -1 4194560 120 0 0 0 1 2 0 0 20 0 1 0 987654 2367488 200 18446744073709551615\n";
        assert_eq!(start_ticks_of(line), Some(987654));
        assert_eq!(start_ticks_of(b"4242 (x) S 1 2"), None, "too short");
        assert_eq!(start_ticks_of(b"no name here"), None);
        let own = std::fs::read("/proc/self/stat").unwrap();
        assert!(start_ticks_of(&own).is_some_and(|t| t > 0));
    }
}
