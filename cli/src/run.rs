//! `rsock run`: execs a program with librsock.so first in `LD_PRELOAD` and the options turned
//! into `RSOCK_*` variables. It execs (no child process), so the program's exit status and
//! signals are the caller's to see, unchanged.

use crate::args::RunArgs;
use rsock_core::config::{Config, USING_DEFAULT};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

const REFUSED: u8 = 126;
const NOT_FOUND: u8 = 127;
/// A usage error (said with the usage, as clap's own).
const USAGE: u8 = 2;

pub fn main(args: RunArgs) -> ExitCode {
    match prepare(args) {
        Ok(cmd) => exec(cmd),
        Err((USAGE, msg)) => crate::usage_error("run", msg),
        Err((code, msg)) => {
            eprintln!("rsock run: {msg}");
            ExitCode::from(code)
        }
    }
}

/// What will be executed.
struct Launch {
    program: PathBuf,
    arg0: OsString,
    args: Vec<OsString>,
    env: Vec<(String, OsString)>,
}

/// The options as `RSOCK_*` variables (their values were checked while parsing: see
/// args.rs), PROGRAM found, the shim found.
fn prepare(args: RunArgs) -> Result<Launch, (u8, String)> {
    let mut env: Vec<(String, OsString)> = Vec::new();
    let mut set = |name: &str, v: Option<OsString>| {
        if let Some(v) = v {
            env.push((name.into(), v));
        }
    };
    set("RSOCK_LOG", args.log.map(PathBuf::into_os_string));
    set("RSOCK_LOG_LEVEL", args.log_level.map(OsString::from));
    set("RSOCK_EXCLUDE", args.exclude.map(OsString::from));
    set("RSOCK_CONFIG", args.config.map(PathBuf::into_os_string));
    set("RSOCK_SPIN_US", args.spin_us.map(OsString::from));
    set("RSOCK_RDMA", args.no_rdma.then(|| "0".into()));
    let mut command = args.command.into_iter();
    let Some(program) = command.next() else {
        return Err((USAGE, "no PROGRAM given".into()));
    };
    check_settings(&env)?;
    let shim = find_shim()?;
    let path = resolve(&program).ok_or_else(|| {
        (
            NOT_FOUND,
            format!("{}: command not found", program.to_string_lossy()),
        )
    })?;
    if let Some(why) = secure_exec(&path) {
        return Err((
            REFUSED,
            format!(
                "{} {why}: the dynamic loader ignores LD_PRELOAD for such programs (secure-execution mode), \
                 so it would run without rsock; refusing rather than pretending",
                path.display()
            ),
        ));
    }
    env.push((
        "LD_PRELOAD".into(),
        preload_with(&shim, std::env::var_os("LD_PRELOAD")),
    ));
    Ok(Launch {
        program: path,
        arg0: program,
        args: command.collect(),
        env,
    })
}

/// The `RSOCK_*` variables PROGRAM will see (inherited ones, and the options' over them)
/// parse the way the shim will read them: a value the shim would replace by its default is a
/// usage error; its other notes (an unknown name, a size rounded up) are warnings here. A
/// rules file with bad lines is run anyway (the shim skips them too) after listing them.
fn check_settings(env: &[(String, OsString)]) -> Result<(), (u8, String)> {
    let from_options = |k: &OsStr| env.iter().any(|(n, _)| OsStr::new(n) == k);
    let inherited = std::env::vars_os()
        .filter(|(k, _)| k.as_bytes().starts_with(b"RSOCK_") && !from_options(k));
    let options = env.iter().map(|(k, v)| (OsString::from(k), v.clone()));
    let (mut cfg, warnings) = Config::parse(inherited.chain(options));
    if let Some(bad) = warnings.iter().find_map(|w| w.strip_suffix(USING_DEFAULT)) {
        let name = bad.split(['=', ':']).next().unwrap_or_default();
        let from = if from_options(OsStr::new(name)) {
            ""
        } else {
            " (from the environment)"
        };
        return Err((USAGE, format!("{bad}{from}")));
    }
    for w in &warnings {
        eprintln!("rsock run: warning: {w}");
    }
    if cfg.rules_path.is_some() && env.iter().any(|(k, _)| k == "RSOCK_CONFIG") {
        let mut problems = Vec::new();
        cfg.load_rules(&mut problems);
        if let Some(p) = problems.iter().find(|p| p.contains("cannot read")) {
            return Err((REFUSED, format!("--config: {p}")));
        }
        for p in problems {
            eprintln!("rsock run: warning: {p}");
        }
    }
    Ok(())
}

/// `--log FILE`, made absolute. The shim appends to it (creating it) and logs nothing if it
/// cannot, so check now that it could, creating nothing. `-` is refused: the log is a file,
/// and the shim stays off the program's stdout and stderr. (clap's value parser: its error
/// is said after "invalid value 'FILE' for '--log <FILE>': ".)
pub fn log_file(v: &str) -> Result<PathBuf, String> {
    if v == "-" {
        return Err("the shim's log is a file; give its path".into());
    }
    let p = absolute(v);
    let (target, what) = match std::fs::metadata(&p) {
        Ok(m) if m.is_dir() => return Err("is a directory".into()),
        Ok(_) => (p.clone(), libc::W_OK),
        Err(_) => (
            p.parent().unwrap_or(Path::new("/")).to_path_buf(),
            libc::W_OK | libc::X_OK,
        ),
    };
    let c = std::ffi::CString::new(target.as_os_str().as_bytes())
        .map_err(|_| "a path with a NUL byte".to_string())?;
    // SAFETY: c is NUL-terminated; access only reads it.
    if unsafe { libc::access(c.as_ptr(), what) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!("cannot write to {}: {e}", target.display()));
    }
    Ok(p)
}

fn absolute(p: impl AsRef<Path>) -> PathBuf {
    std::path::absolute(&p).unwrap_or_else(|_| p.as_ref().to_path_buf())
}

/// `--config FILE`, made absolute (the program may change its directory).
pub fn absolute_path(v: &str) -> Result<PathBuf, std::convert::Infallible> {
    Ok(absolute(v))
}

/// The library directory fixed when rsock was built (`RSOCK_LIBDIR=/usr/lib/rsock cargo
/// build`; `make` sets it to `$(PREFIX)/lib/rsock`), if any.
const BUILD_LIBDIR: Option<&str> = option_env!("RSOCK_LIBDIR");

/// The places librsock.so is looked for, in order, each with what it is: `RSOCK_LIB` alone
/// if it is set (a name the user gave is not second-guessed); else next to the rsock binary
/// (`target/release/`, or wherever both were copied together), in `../lib/rsock/` from the
/// binary's directory (`/usr/bin/rsock` and `/usr/lib/rsock/librsock.so`), and in the
/// library directory set at build time. A place named twice is listed once.
fn shim_candidates(
    rsock_lib: Option<&OsStr>,
    exe: Option<&Path>,
    build_libdir: Option<&str>,
) -> Vec<(PathBuf, &'static str)> {
    if let Some(p) = rsock_lib.filter(|p| !p.is_empty()) {
        return vec![(absolute(p), "RSOCK_LIB")];
    }
    let mut c: Vec<(PathBuf, &'static str)> = Vec::new();
    if let Some(dir) = exe.and_then(Path::parent) {
        c.push((dir.join("librsock.so"), "next to the rsock binary"));
        if let Some(up) = dir.parent() {
            c.push((
                up.join("lib/rsock/librsock.so"),
                "../lib/rsock from the rsock binary",
            ));
        }
    }
    if let Some(d) = build_libdir.filter(|d| !d.is_empty()) {
        c.push((
            Path::new(d).join("librsock.so"),
            "the library directory set at build time",
        ));
    }
    let mut seen = Vec::new();
    c.retain(|(p, _)| {
        let new = !seen.contains(p);
        seen.push(p.clone());
        new
    });
    c
}

/// The first of `candidates` that is a file, or an error naming every place looked at and
/// why each did not do.
fn first_shim(candidates: &[(PathBuf, &str)]) -> Result<PathBuf, (u8, String)> {
    let mut looked = Vec::new();
    for (path, from) in candidates {
        match std::fs::metadata(path) {
            Ok(m) if m.is_file() => return Ok(path.clone()),
            Ok(_) => looked.push(format!("{} ({from}): not a file", path.display())),
            Err(e) => looked.push(format!("{} ({from}): {e}", path.display())),
        }
    }
    if looked.is_empty() {
        looked.push("nowhere (the rsock binary's own path is unknown)".to_string());
    }
    Err((
        REFUSED,
        format!(
            "cannot find the shim: {}; build it with `cargo build --release`, install it with \
             `make install`, or point RSOCK_LIB at librsock.so",
            looked.join("; ")
        ),
    ))
}

/// librsock.so, looked for where [`shim_candidates`] says.
pub(crate) fn find_shim() -> Result<PathBuf, (u8, String)> {
    let exe = std::env::current_exe().ok();
    first_shim(&shim_candidates(
        std::env::var_os("RSOCK_LIB").as_deref(),
        exe.as_deref(),
        BUILD_LIBDIR,
    ))
}

/// `program` as execvp would find it: a path if it has a slash, else the first executable
/// file of that name in PATH.
fn resolve(program: &OsStr) -> Option<PathBuf> {
    let executable = |p: &Path| {
        let c = std::ffi::CString::new(p.as_os_str().as_bytes()).ok();
        // SAFETY: c is NUL-terminated; access only reads it.
        p.is_file() && c.is_some_and(|c| unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0)
    };
    if program.as_bytes().contains(&b'/') {
        let p = PathBuf::from(program);
        return p.exists().then_some(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| executable(p))
}

/// Why the loader would run `path` in secure-execution mode (and so drop LD_PRELOAD), if it
/// would: set-user-ID or set-group-ID to someone else, or file capabilities for a non-root
/// caller. Not when the file system is mounted nosuid (the bits are ignored there).
fn secure_exec(path: &Path) -> Option<String> {
    let m = std::fs::metadata(path).ok()?;
    if nosuid_mount(path) {
        return None;
    }
    // SAFETY: these calls cannot fail.
    let (uid, gid, euid) = unsafe { (libc::getuid(), libc::getgid(), libc::geteuid()) };
    let mode = m.mode();
    if mode & libc::S_ISUID != 0 && m.uid() != uid {
        return Some(format!("is set-user-ID (owner uid {})", m.uid()));
    }
    if mode & libc::S_ISGID != 0 && mode & libc::S_IXGRP != 0 && m.gid() != gid {
        return Some(format!("is set-group-ID (group gid {})", m.gid()));
    }
    if euid != 0 && has_file_capabilities(path) {
        return Some("has file capabilities (security.capability)".to_string());
    }
    None
}

fn nosuid_mount(path: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: an all-zero statvfs is a valid out-buffer.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is NUL-terminated, st a valid out-pointer.
    unsafe { libc::statvfs(c.as_ptr(), &mut st) == 0 && st.f_flag & libc::ST_NOSUID != 0 }
}

fn has_file_capabilities(path: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: NUL-terminated names; a NULL buffer of size 0 asks only for the length.
    unsafe {
        libc::getxattr(
            c.as_ptr(),
            c"security.capability".as_ptr(),
            std::ptr::null_mut(),
            0,
        ) > 0
    }
}

/// LD_PRELOAD with the shim first; an existing value is kept after it (once).
fn preload_with(shim: &Path, existing: Option<OsString>) -> OsString {
    let mut v = shim.as_os_str().to_owned();
    if let Some(old) = existing {
        let shim_bytes = shim.as_os_str().as_bytes();
        let rest: Vec<&[u8]> = old
            .as_bytes()
            .split(|&b| b == b':' || b == b' ')
            .filter(|e| !e.is_empty() && *e != shim_bytes)
            .collect();
        for e in rest {
            v.push(":");
            v.push(OsStr::from_bytes(e));
        }
    }
    v
}

fn exec(l: Launch) -> ExitCode {
    let mut cmd = std::process::Command::new(&l.program);
    cmd.arg0(&l.arg0).args(&l.args);
    for (k, v) in &l.env {
        cmd.env(k, v);
    }
    let e = cmd.exec(); // returns only on failure
    let code = if e.kind() == std::io::ErrorKind::NotFound {
        NOT_FOUND
    } else {
        REFUSED
    };
    eprintln!("rsock run: cannot execute {}: {e}", l.program.display());
    ExitCode::from(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preload_is_prepended_once() {
        let s = Path::new("/opt/rsock/librsock.so");
        assert_eq!(preload_with(s, None), "/opt/rsock/librsock.so");
        assert_eq!(preload_with(s, Some("".into())), "/opt/rsock/librsock.so");
        assert_eq!(
            preload_with(s, Some("/a.so /b.so".into())),
            "/opt/rsock/librsock.so:/a.so:/b.so"
        );
        assert_eq!(
            preload_with(s, Some("/a.so:/opt/rsock/librsock.so".into())),
            "/opt/rsock/librsock.so:/a.so"
        );
    }

    /// `rsock run ARGS...` parsed as main() parses it; a parse error is a usage error.
    fn parse_and_prepare(args: &[&str]) -> Result<Launch, (u8, String)> {
        use clap::FromArgMatches as _;
        let argv = ["rsock", "run"].iter().chain(args);
        let m = crate::args::parser()
            .try_get_matches_from(argv)
            .map_err(|e| (USAGE, e.to_string()))?;
        match crate::args::Cli::from_arg_matches(&m).unwrap().command {
            crate::args::Command::Run(a) => prepare(a),
            _ => unreachable!(),
        }
    }

    #[test]
    fn options_become_rsock_variables() {
        let args = [
            "--log-level",
            "debug",
            "--spin-us=5",
            "--no-rdma",
            "--exclude",
            "port=22",
            "--",
            "true",
            "-x",
            "--log-level",
        ];
        std::env::set_var("RSOCK_LIB", "/bin/sh"); // any file: only its existence is checked
        let l = parse_and_prepare(&args).unwrap();
        let get = |k: &str| {
            l.env
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.to_str().unwrap().to_string())
        };
        assert_eq!(get("RSOCK_LOG_LEVEL").as_deref(), Some("debug"));
        assert_eq!(get("RSOCK_SPIN_US").as_deref(), Some("5"));
        assert_eq!(get("RSOCK_RDMA").as_deref(), Some("0"));
        assert_eq!(get("RSOCK_EXCLUDE").as_deref(), Some("port=22"));
        assert!(get("LD_PRELOAD").unwrap().starts_with("/bin/sh"));
        assert_eq!(
            (l.arg0.as_os_str(), l.args.clone()),
            (
                OsStr::new("true"),
                vec![OsString::from("-x"), "--log-level".into()]
            )
        );
        // Without --, everything after PROGRAM is PROGRAM's too, options of rsock's names
        // included.
        let l = parse_and_prepare(&["--no-rdma", "true", "--no-rdma", "--log", "-", "--"]).unwrap();
        assert_eq!(l.args, ["--no-rdma", "--log", "-", "--"]);

        let bad = |v: &[&str]| parse_and_prepare(v).err().unwrap();
        assert_eq!(bad(&["--spin-us", "lots", "true"]).0, USAGE);
        assert_eq!(bad(&["--log-level", "loud", "true"]).0, USAGE);
        assert_eq!(bad(&["--frobnicate", "true"]).0, USAGE);
        assert_eq!(bad(&["--log"]).0, USAGE);
        assert_eq!(bad(&[]).0, USAGE);
        assert_eq!(bad(&["no-such-program-rsock-test"]).0, NOT_FOUND);
        assert_eq!(
            bad(&["--config", "/nonexistent/rsock.conf", "true"]).0,
            REFUSED
        );
        std::env::set_var("RSOCK_LIB", "/nonexistent/librsock.so");
        let (code, msg) = bad(&["true"]);
        assert!(
            code == REFUSED && msg.contains("cannot find the shim"),
            "{msg}"
        );
        std::env::remove_var("RSOCK_LIB");
    }

    #[test]
    fn shim_is_looked_for_in_order() {
        let exe = Path::new("/opt/x/bin/rsock");
        let paths = |c: Vec<(PathBuf, &str)>| c.into_iter().map(|(p, _)| p).collect::<Vec<_>>();
        assert_eq!(
            paths(shim_candidates(None, Some(exe), Some("/usr/lib/rsock"))),
            [
                "/opt/x/bin/librsock.so",
                "/opt/x/lib/rsock/librsock.so",
                "/usr/lib/rsock/librsock.so"
            ]
            .map(PathBuf::from)
        );
        // RSOCK_LIB alone when set; empty counts as unset; no build-time directory by default.
        assert_eq!(
            paths(shim_candidates(
                Some(OsStr::new("/a/librsock.so")),
                Some(exe),
                Some("/x")
            )),
            [PathBuf::from("/a/librsock.so")]
        );
        assert_eq!(
            paths(shim_candidates(Some(OsStr::new("")), Some(exe), None)).len(),
            2
        );
        // The build-time directory that is ../lib/rsock anyway is listed once.
        let c = shim_candidates(
            None,
            Some(Path::new("/usr/bin/rsock")),
            Some("/usr/lib/rsock"),
        );
        assert_eq!(c.len(), 2, "{c:?}");

        // The first that exists wins; the error names every place looked at.
        let root = std::env::temp_dir().join(format!("rsock-find-shim-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let (bin, lib, fixed) = (root.join("bin"), root.join("lib/rsock"), root.join("fixed"));
        for d in [&bin, &lib, &fixed] {
            std::fs::create_dir_all(d).unwrap();
        }
        let exe = bin.join("rsock");
        let fixed_s = fixed.to_str().unwrap();
        let find = || first_shim(&shim_candidates(None, Some(&exe), Some(fixed_s)));
        let (code, msg) = find().unwrap_err();
        assert_eq!(code, REFUSED);
        for p in [
            bin.join("librsock.so"),
            lib.join("librsock.so"),
            fixed.join("librsock.so"),
        ] {
            assert!(msg.contains(p.to_str().unwrap()), "{msg}");
        }
        assert!(
            msg.contains("set at build time") && msg.contains("RSOCK_LIB"),
            "{msg}"
        );
        std::fs::write(fixed.join("librsock.so"), b"").unwrap();
        assert_eq!(find().unwrap(), fixed.join("librsock.so"));
        std::fs::write(lib.join("librsock.so"), b"").unwrap();
        assert_eq!(find().unwrap(), lib.join("librsock.so"));
        std::fs::create_dir(bin.join("librsock.so")).unwrap(); // not a file: skipped
        assert_eq!(find().unwrap(), lib.join("librsock.so"));
        std::fs::remove_dir(bin.join("librsock.so")).unwrap();
        std::fs::write(bin.join("librsock.so"), b"").unwrap();
        assert_eq!(find().unwrap(), bin.join("librsock.so"));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn setuid_programs_are_refused_unless_ours() {
        // SAFETY: cannot fail.
        let uid = unsafe { libc::getuid() };
        // passwd is set-user-ID root on Debian: refused for anyone but root.
        let passwd = Path::new("/usr/bin/passwd");
        if passwd.exists() {
            assert_eq!(
                secure_exec(passwd).is_some(),
                uid != 0 && !nosuid_mount(passwd)
            );
        }
        assert_eq!(secure_exec(Path::new("/bin/sh")), None);
    }
}
