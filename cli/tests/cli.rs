//! `rsock run` as a user meets it: the real binary, real programs. (The shim itself is
//! exercised under `rsock run` by tests/rdma/product.sh; here RSOCK_LIB names a harmless
//! system library so these checks need no build of librsock.so.)

use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

const RSOCK: &str = env!("CARGO_BIN_EXE_rsock");

/// A library the loader can preload without effect (libm is on every glibc system).
fn harmless_lib() -> &'static str {
    [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/usr/lib/x86_64-linux-gnu/libm.so.6",
        "/lib64/libm.so.6",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists())
    .expect("libm.so.6 not found")
}

fn rsock(args: &[&str]) -> Output {
    Command::new(RSOCK)
        .args(args)
        .env("RSOCK_LIB", harmless_lib())
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn status(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

/// `o` is a usage error (status 2) whose message contains `said`; `what` names the case.
fn assert_usage_error(o: &Output, said: &str, what: &str) {
    assert_eq!(o.status.code(), Some(2), "{what}: {}", stderr(o));
    assert!(stderr(o).contains(said), "{what}: {}", stderr(o));
}

/// An empty directory of this test's own.
fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rsock-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn exit_status_and_signals_pass_through() {
    let o = rsock(&["run", "--", "sh", "-c", "exit 7"]);
    assert_eq!(o.status.code(), Some(7), "{}", stderr(&o));
    let o = rsock(&["run", "--", "sh", "-c", "kill -TERM $$"]);
    assert_eq!(
        o.status.signal(),
        Some(libc::SIGTERM),
        "{:?} {}",
        o.status,
        stderr(&o)
    );
}

#[test]
fn environment_is_set_for_the_program() {
    let o = Command::new(RSOCK)
        .args(["run", "--spin-us", "7", "--no-rdma", "--exclude=port=22", "--log", "rel.log", "--"])
        .args(["sh", "-c", r#"printf '%s|%s|%s|%s|%s' "$LD_PRELOAD" "$RSOCK_SPIN_US" "$RSOCK_RDMA" "$RSOCK_EXCLUDE" "$RSOCK_LOG""#])
        .env("RSOCK_LIB", harmless_lib())
        .env("LD_PRELOAD", "/nonexistent-before.so")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let f: Vec<&str> = out.split('|').collect();
    assert_eq!(
        f[0],
        format!("{}:/nonexistent-before.so", harmless_lib()),
        "shim first, the old value kept"
    );
    assert_eq!(&f[1..4], ["7", "0", "port=22"]);
    assert!(
        f[4].starts_with('/') && f[4].ends_with("/rel.log"),
        "log path made absolute: {}",
        f[4]
    );
}

#[test]
fn refuses_clearly() {
    let o = Command::new(RSOCK)
        .args(["run", "--", "true"])
        .env("RSOCK_LIB", "/nonexistent/librsock.so")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(126));
    assert!(
        stderr(&o).contains("cannot find the shim: /nonexistent/librsock.so"),
        "{}",
        stderr(&o)
    );

    let o = rsock(&["run", "--", "no-such-program-for-rsock"]);
    assert_eq!(o.status.code(), Some(127), "{}", stderr(&o));
    let o = rsock(&["run", "--log-level", "chatty", "--", "true"]);
    assert_usage_error(&o, "RSOCK_LOG_LEVEL=\"chatty\"", "");
}

/// passwd is set-user-ID root on Debian: for anyone but root the loader would ignore
/// LD_PRELOAD, and rsock says so instead of running it. As root the check runs as nobody,
/// from a copy of rsock in a world-readable directory (the checkout may not be).
#[test]
fn refuses_setuid_programs() {
    use std::os::unix::fs::PermissionsExt;
    let passwd = "/usr/bin/passwd";
    // SAFETY: cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let dir = std::env::temp_dir().join(format!("rsock-cli-setuid-{}", std::process::id()));
    let mut cmd = if root {
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let copy = dir.join("rsock");
        std::fs::copy(RSOCK, &copy).unwrap();
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(copy);
        c
    } else {
        Command::new(RSOCK)
    };
    let o = cmd
        .args(["run", "--", passwd, "--help"])
        .env("RSOCK_LIB", harmless_lib())
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(o.status.code(), Some(126), "{:?}: {}", o.status, stderr(&o));
    assert!(
        stderr(&o).contains("/usr/bin/passwd is set-user-ID (owner uid 0)"),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("ignores LD_PRELOAD"), "{}", stderr(&o));
}

#[test]
fn rules_command_reports_bad_lines() {
    let dir = std::env::temp_dir().join(format!("rsock-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("r.conf");
    std::fs::write(&f, "tcp port=22\nrdma port=99999\n").unwrap();
    let o = Command::new(RSOCK)
        .args(["rules", f.to_str().unwrap()])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        out.contains("line 1    tcp port=22") && out.contains("1 rule(s), 1 line(s) ignored"),
        "{out}"
    );
    assert!(
        stderr(&o).contains("r.conf line 2: port=\"99999\""),
        "{}",
        stderr(&o)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// rsock with stdout a pipe whose reader is gone, as in `(sleep 1; rsock help stat) | true`.
fn with_closed_stdout(args: &[&str]) -> Output {
    let mut fds = [0; 2];
    // SAFETY: fds is an array of two ints for pipe2 to fill.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: pipe2 just opened both; nothing else owns them.
    let (reader, writer) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(reader);
    Command::new(RSOCK)
        .args(args)
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

#[test]
fn a_closed_stdout_ends_quietly() {
    let dir = temp_dir("closed-stdout");
    let rules = dir.join("r.conf");
    std::fs::write(&rules, "tcp port=22\n").unwrap();
    let (dir, rules) = (dir.to_str().unwrap(), rules.to_str().unwrap());
    for args in [
        &["help", "stat"][..],
        &["stat", "--all", "--dir", dir],
        &["rules", rules],
        &["--version"],
        &["--help"],
        &["run", "-h"],
        &["completions", "bash"],
        &[
            "stat", "--json", "--watch", "0.1", "--count", "2", "--dir", dir,
        ],
    ] {
        let o = with_closed_stdout(args);
        assert_eq!(
            (o.status.code(), stderr(&o).as_str()),
            (Some(0), ""),
            "{args:?}: {:?}",
            o.status
        );
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn version() {
    for flag in ["--version", "-V"] {
        let o = rsock(&[flag]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        assert_eq!(stdout(&o), format!("rsock {}\n", env!("CARGO_PKG_VERSION")));
    }
}

#[test]
fn every_command_has_help() {
    for cmd in ["run", "stat", "rules", "check", "completions"] {
        for args in [[cmd, "--help"], [cmd, "-h"], ["help", cmd]] {
            let o = rsock(&args);
            assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
            assert!(
                stdout(&o).starts_with(&format!("Usage: rsock {cmd} ")),
                "{args:?}: {}",
                stdout(&o)
            );
            assert!(
                stdout(&o).contains("Exit status: "),
                "{args:?}: {}",
                stdout(&o)
            );
        }
        // -h is the summary, --help all of it.
        assert!(
            stdout(&rsock(&[cmd, "-h"])).len() < stdout(&rsock(&[cmd, "--help"])).len(),
            "{cmd}"
        );
    }
    for args in [&["help"][..], &["--help"], &["-h"]] {
        let o = rsock(args);
        assert_eq!(o.status.code(), Some(0), "{args:?}");
        assert!(
            stdout(&o).contains("rsock stat [OPTIONS]"),
            "{}",
            stdout(&o)
        );
    }
}

#[test]
fn no_command_is_a_usage_error() {
    let o = rsock(&[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(stdout(&o), "");
    assert!(
        stderr(&o).contains("rsock stat [OPTIONS]"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn program_arguments_pass_untouched() {
    // With or without --, everything after PROGRAM is PROGRAM's: rsock's own option names,
    // -h, --version and a second -- included.
    let script = r#"printf '%s|' "$@""#;
    for args in [
        &["run", "--no-rdma", "sh", "-c", script][..],
        &["run", "--no-rdma", "--", "sh", "-c", script],
    ] {
        let mut v = args.to_vec();
        v.extend(["x", "--log", "y", "-h", "--version", "--", "--no-rdma=1"]);
        let o = rsock(&v);
        assert_eq!(o.status.code(), Some(0), "{v:?}: {}", stderr(&o));
        assert_eq!(stdout(&o), "--log|y|-h|--version|--|--no-rdma=1|", "{v:?}");
    }
}

/// The man pages `rsock __man DIR` writes (what `make install` installs).
fn man_pages(name: &str) -> PathBuf {
    let dir = temp_dir(name);
    let o = rsock(&["__man", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    dir
}

/// Every public command: the hidden ones are `rsock __man` and `rsock check __probe`.
const COMMANDS: [&str; 6] = ["run", "stat", "rules", "check", "log", "completions"];

#[test]
fn man_pages_come_from_the_definitions() {
    let dir = man_pages("man");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let mut want: Vec<String> = COMMANDS.iter().map(|c| format!("rsock-{c}.1")).collect();
    want.push("rsock.1".into());
    want.sort();
    assert_eq!(names, want);
    let main = std::fs::read_to_string(dir.join("rsock.1")).unwrap();
    for section in [
        "NAME",
        "SYNOPSIS",
        "DESCRIPTION",
        "COMMANDS",
        "OPTIONS",
        "\"EXIT STATUS\"",
        "ENVIRONMENT",
        "FILES",
        "NOTES",
        "EXAMPLES",
        "SEE ALSO",
    ] {
        assert!(
            main.contains(&format!("\n.SH {section}\n")),
            "{section}: {main}"
        );
    }
    // Rendered: each command's page has every option its --help has, and rsock(1) names
    // every command's page. (Where man-db is installed: scripts/setup.sh installs it.)
    let Ok(probe) = Command::new("man").arg("--version").output() else {
        eprintln!("not rendered: no man");
        return std::fs::remove_dir_all(dir).unwrap();
    };
    assert!(probe.status.success());
    let render = |page: &str| {
        let o = Command::new("man")
            .args(["--warnings", "-l"])
            .arg(dir.join(page))
            .env("MANWIDTH", "200")
            .env("LC_ALL", "C.UTF-8")
            .output()
            .unwrap();
        assert_eq!(stderr(&o), "", "{page}: warnings");
        assert!(o.status.success(), "{page}");
        stdout(&o)
    };
    assert!(render("rsock.1").contains("rsock run"));
    for c in COMMANDS {
        let see = format!("\n.BR rsock\\-{c} (1)");
        assert!(main.contains(&see), "{see} in {main}");
        let page = render(&format!("rsock-{c}.1"));
        let help = stdout(&rsock(&[c, "--help"]));
        let options = help
            .split_whitespace()
            .filter(|w| w.starts_with("--") && w.len() > 2)
            .map(|w| w.trim_end_matches(|c: char| !c.is_ascii_alphanumeric()))
            .map(|w| w.split(['=', '[']).next().unwrap());
        for o in options {
            assert!(
                page.contains(o),
                "{o} of `rsock {c} --help` not in rsock-{c}(1): {page}"
            );
        }
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn completions_for_each_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let o = rsock(&["completions", shell]);
        assert_eq!(o.status.code(), Some(0), "{shell}: {}", stderr(&o));
        let script = stdout(&o);
        for word in COMMANDS.iter().chain(&["log-level", "watch", "explain"]) {
            assert!(script.contains(word), "{shell}: {word} in {script}");
        }
    }
    let o = Command::new("bash")
        .args([
            "-c",
            "source <(\"$0\" completions bash) && complete -p rsock",
        ])
        .arg(RSOCK)
        .output()
        .unwrap();
    assert!(
        stdout(&o).contains("-F _rsock_with_extras rsock"),
        "{}{}",
        stdout(&o),
        stderr(&o)
    );
    assert_usage_error(
        &rsock(&["completions", "tcsh"]),
        "invalid value 'tcsh' for '<SHELL>'",
        "",
    );
}

/// Runs bash with `rsock completions bash` sourced, completes `line` (the cursor at its end;
/// a trailing space starts a new word) and returns the candidates, one per line.
fn bash_complete(line: &str, stats_dir: &std::path::Path) -> String {
    let script = r#"source <("$0" completions bash) || exit 1
        read -ra COMP_WORDS <<< "$1"
        [[ $1 == *" " ]] && COMP_WORDS+=("")
        COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
        _rsock_with_extras rsock "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
        printf '%s\n' "${COMPREPLY[@]}""#;
    let o = Command::new("bash")
        .args(["-c", script])
        .arg(RSOCK)
        .arg(line)
        .env("RSOCK_STATS_DIR", stats_dir)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{line}: {}", stderr(&o));
    stdout(&o)
}

#[test]
fn bash_completes_pids_and_the_program_after_run() {
    let dir = std::env::temp_dir().join(format!("rsock-cli-compl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("424242.stats"), b"").unwrap();
    let words = |l: &str| bash_complete(l, &dir);
    assert!(
        words("rsock stat ").lines().any(|w| w == "424242"),
        "stat PID"
    );
    assert!(
        words("rsock stat 4242").lines().any(|w| w == "424242"),
        "stat PID prefix"
    );
    assert!(
        words("rsock log ").lines().any(|w| w == "424242"),
        "log PID"
    );
    let level = words("rsock log 424242 ");
    assert!(
        level.lines().any(|w| w == "debug"),
        "log LEVEL after the PID: {level}"
    );
    assert!(!level.contains("424242"), "no second PID: {level}");
    let prog = words("rsock run --log /tmp/x bas");
    assert!(prog.lines().any(|w| w == "bash"), "PROGRAM: {prog}");
    let opt = words("rsock run --no-");
    assert!(
        opt.lines().any(|w| w == "--no-rdma"),
        "run's options: {opt}"
    );
    let sub = words("rsock st");
    assert!(sub.lines().any(|w| w == "stat"), "commands: {sub}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// The options of `rsock run` that take a value, which the bash additions skip over to find
/// PROGRAM, are the parser's.
#[test]
fn bash_extras_know_runs_value_options() {
    let help = stdout(&rsock(&["run", "--help"]));
    let script = stdout(&rsock(&["completions", "bash"]));
    let listed = script
        .lines()
        .find(|l| l.trim_start().starts_with("--log |"))
        .expect("the list in BASH_EXTRAS");
    let listed: Vec<&str> = listed
        .split([' ', '|', ')'])
        .filter(|w| w.starts_with("--"))
        .collect();
    let mut seen = 0;
    for line in help.lines().map(str::trim_start) {
        let Some(rest) = line.strip_prefix("--") else {
            continue;
        };
        let mut it = rest.split_whitespace();
        let name = format!("--{}", it.next().unwrap_or(""));
        let takes_value = it.next().is_some_and(|w| w.starts_with('<'));
        assert_eq!(
            listed.contains(&name.as_str()),
            takes_value,
            "{name} in {listed:?} (help: {line})"
        );
        seen += usize::from(takes_value);
    }
    assert_eq!(seen, listed.len(), "{listed:?} against {help}");
}

#[test]
fn hidden_commands_stay_hidden() {
    let dir = man_pages("hidden");
    let mut shown = vec![
        stdout(&rsock(&["--help"])),
        stdout(&rsock(&["help"])),
        stdout(&rsock(&["check", "--help"])),
        stderr(&rsock(&["frob"])),
    ];
    for shell in ["bash", "zsh", "fish"] {
        shown.push(stdout(&rsock(&["completions", shell])));
    }
    for page in std::fs::read_dir(&dir).unwrap() {
        shown.push(std::fs::read_to_string(page.unwrap().path()).unwrap());
    }
    for text in shown {
        assert!(
            !text.contains("__man") && !text.contains("__probe"),
            "{text}"
        );
    }
    std::fs::remove_dir_all(dir).unwrap();
    // ... and work: the probe connects (here to a port nobody listens on) and exits 0.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let o = rsock(&["check", "__probe", &format!("127.0.0.1:{port}")]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // `rsock check help` checks a host named help (check has no help subcommand).
    let o = rsock(&["check", "help"]);
    assert!(stdout(&o).contains("ok    shim"), "{}", stdout(&o));
}

#[test]
fn unknown_commands_are_named() {
    for args in [&["frob"][..], &["help", "frob"]] {
        let o = rsock(args);
        assert_usage_error(&o, "unrecognized subcommand 'frob'", &format!("{args:?}"));
        assert_eq!(stdout(&o), "");
    }
}

#[test]
fn options_take_their_value_either_way() {
    let dir = temp_dir("opt-equals");
    let d = dir.to_str().unwrap();
    let joined = [
        "stat".to_string(),
        "--json".into(),
        format!("--dir={d}"),
        "--watch=0.1".into(),
        "--count=1".into(),
    ];
    let joined: Vec<&str> = joined.iter().map(String::as_str).collect();
    for args in [
        &joined[..],
        &[
            "stat", "--json", "--dir", d, "--watch", "0.1", "--count", "1",
        ],
    ] {
        let o = rsock(args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
        assert!(
            stdout(&o).contains(&format!("\"dir\":\"{d}\"")),
            "{}",
            stdout(&o)
        );
    }
    let o = rsock(&["stat", "--all=yes"]);
    assert_usage_error(&o, "unexpected value 'yes' for '--all'", "");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn out_of_range_values_name_their_option() {
    for (args, said) in [
        (
            &["stat", "--watch", "0"][..],
            "invalid value '0' for '--watch[=<SECS>]': expected seconds from 0.1 to 3600",
        ),
        (&["stat", "--watch=0"], "invalid value '0' for '--watch"),
        (
            &["stat", "--watch", "5000s"],
            "invalid value '5000s' for '--watch",
        ),
        (
            &["stat", "--watch", "--count", "0"],
            "invalid value '0' for '--count <N>'",
        ),
        (&["stat", "0"], "invalid value '0' for '[PID]...': not a PID"),
        (
            &["run", "--spin-us", "999999", "true"],
            "invalid value '999999' for '--spin-us <N>': RSOCK_SPIN_US=\"999999\": expected an integer from 0 to 100000",
        ),
        (
            &["run", "--exclude=10.0.0.0/99", "true"],
            "invalid value '10.0.0.0/99' for '--exclude <SPEC>': RSOCK_EXCLUDE=",
        ),
        (
            &["check", "10.0.0.1:0"],
            "invalid value '10.0.0.1:0' for '[HOST[:PORT]]': PORT must be 1-65535",
        ),
    ] {
        let o = rsock(args);
        assert_usage_error(&o, said, &format!("{args:?}"));
    }
}

#[test]
fn json_watch_prints_a_json_line_per_frame() {
    let dir = temp_dir("json-watch");
    let o = rsock(
        &["stat", "--json", "--watch", "0.1", "--count", "2"]
            .into_iter()
            .chain(["--dir", dir.to_str().unwrap()])
            .collect::<Vec<_>>(),
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    for l in lines {
        assert!(
            l.starts_with("{\"time\":\"") && l.ends_with("\"problems\":[]}"),
            "{l}"
        );
        assert!(l.contains("\"processes\":[]"), "{l}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn inherited_rsock_variables_are_checked() {
    let run = |var: (&str, &str), args: &[&str]| {
        Command::new(RSOCK)
            .arg("run")
            .args(args)
            .args(["--", "true"])
            .env("RSOCK_LIB", harmless_lib())
            .env(var.0, var.1)
            .output()
            .unwrap()
    };
    let o = run(("RSOCK_SPIN_US", "lots"), &[]);
    assert_usage_error(&o, "RSOCK_SPIN_US=\"lots\": expected an integer", "");
    let o = run(("RSOCK_SPIN_US", "lots"), &["--spin-us", "5"]);
    assert_eq!(o.status.code(), Some(0), "an option wins: {}", stderr(&o));
    // RSOCK_LIB (set here) is known to the shim; an unknown name is a warning, as in the shim.
    let o = run(("RSOCK_FROB", "1"), &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("warning: RSOCK_FROB: unknown variable")
            && !stderr(&o).contains("RSOCK_LIB: unknown"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn log_file_must_be_writable() {
    let o = rsock(&["run", "--log", "/nonexistent/dir/x.log", "--", "true"]);
    assert_usage_error(
        &o,
        "invalid value '/nonexistent/dir/x.log' for '--log <FILE>': cannot write to /nonexistent/dir",
        "",
    );
    let dir = temp_dir("log-dash");
    let o = Command::new(RSOCK)
        .args(["run", "--log", "-", "--", "true"])
        .current_dir(&dir)
        .env("RSOCK_LIB", harmless_lib())
        .output()
        .unwrap();
    assert_usage_error(&o, "invalid value '-' for '--log <FILE>': ", "");
    assert!(!dir.join("-").exists());
    std::fs::remove_dir_all(dir).unwrap();
}

// ---- `rsock stat` over real shimmed processes ----------------------------------------------
//
// The host has no RDMA device: connections fall back to kernel TCP and the shim still counts
// them. The shim is librsock.so next to the rsock binary under test (`cargo build
// --workspace`) or the release build, whichever is newer.

/// librsock.so for these tests (see above).
fn shim() -> PathBuf {
    let exe = PathBuf::from(RSOCK);
    let release = exe
        .parent()
        .and_then(|d| d.parent())
        .map(|t| t.join("release/librsock.so"));
    let newest = [Some(exe.with_file_name("librsock.so")), release]
        .into_iter()
        .flatten()
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .max();
    newest
        .map(|(_, p)| p)
        .expect("no librsock.so: build it first (cargo build --workspace)")
}

/// `args` with the shim preloaded, counting into `dir` (kept after exit).
fn shimmed(dir: &std::path::Path, args: &[&str]) -> Command {
    let mut c = Command::new(args[0]);
    c.args(&args[1..])
        .env("LD_PRELOAD", shim())
        .env("RSOCK_STATS_DIR", dir)
        .env("RSOCK_STATS_KEEP", "1")
        .env_remove("RSOCK_EXCLUDE")
        .env_remove("RSOCK_RDMA")
        .env_remove("RSOCK_CONFIG");
    c
}

/// A Python program under the shim that runs `body`, prints "ready", and waits for its stdin
/// to close; the caller reads stats meanwhile.
struct Held {
    child: std::process::Child,
}

impl Held {
    fn start(dir: &std::path::Path, body: &str, env: &[(&str, &str)]) -> Held {
        use std::io::BufRead as _;
        let script =
            format!("import socket, sys\n{body}\nprint('ready', flush=True)\nsys.stdin.read()\n");
        let mut child = shimmed(dir, &["python3", "-c", &script])
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line, "ready\n", "the python program failed");
        Held { child }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Lets the program end, and waits for it.
    fn finish(mut self) {
        drop(self.child.stdin.take());
        assert!(self.child.wait().unwrap().success());
    }
}

/// A connection from the process to itself over 127.0.0.1, 10 bytes each way.
const PY_PAIR: &str = "l = socket.socket(); l.bind(('127.0.0.1', 0)); l.listen()
c = socket.create_connection(l.getsockname()); a, _ = l.accept()
c.sendall(b'x' * 10); a.recv(10); a.sendall(b'y' * 10); c.recv(10)";

fn stat_in(dir: &std::path::Path, args: &[&str]) -> Output {
    let mut v = vec!["stat", "--dir", dir.to_str().unwrap()];
    v.extend_from_slice(args);
    rsock(&v)
}

#[test]
fn a_reused_pid_shows_the_process_as_exited() {
    let dir = temp_dir("pid-reuse");
    let held = Held::start(&dir, PY_PAIR, &[]);
    let pid = held.pid();
    let o = stat_in(&dir, &["--json"]);
    assert!(
        stdout(&o).contains(&format!("{{\"pid\":{pid},"))
            && stdout(&o).contains("\"alive\":true,\"pid_reused\":false"),
        "{}",
        stdout(&o)
    );
    held.finish();
    let o = stat_in(&dir, &["--all"]);
    assert!(
        stdout(&o).contains(&format!("pid {pid} ")) && stdout(&o).contains(" (exited)\n"),
        "{}",
        stdout(&o)
    );
    // The pid is taken again by a process that started later (in a later clock tick: the
    // start times /proc gives are in ticks).
    let file = dir.join(format!("{pid}.stats"));
    let mut bytes = std::fs::read(&file).unwrap();
    let at = std::mem::offset_of!(rsock_core::stats::Header, start_ticks);
    let stored = u64::from_ne_bytes(bytes[at..at + 8].try_into().unwrap());
    assert!(stored > 0, "the shim stored no start time");
    let mut later = loop {
        let c = Command::new("sleep").arg("1000").spawn().unwrap();
        let stat = std::fs::read(format!("/proc/{}/stat", c.id())).unwrap();
        if rsock_core::stats::start_ticks_of(&stat) != Some(stored) {
            break c;
        }
        let mut c = c;
        c.kill().unwrap();
        c.wait().unwrap();
    };
    let me = later.id();
    let at = std::mem::offset_of!(rsock_core::stats::Header, pid);
    bytes[at..at + 4].copy_from_slice(&me.to_ne_bytes());
    std::fs::write(dir.join(format!("{me}.stats")), &bytes).unwrap();
    std::fs::remove_file(&file).unwrap();
    let o = stat_in(&dir, &[]);
    assert!(
        stdout(&o).starts_with("no rsock processes"),
        "a reused pid is not this process: {}",
        stdout(&o)
    );
    let o = stat_in(&dir, &["--all"]);
    assert!(
        stdout(&o).contains(&format!("pid {me} "))
            && stdout(&o).contains(" (exited; pid reused by another process)\n"),
        "{}",
        stdout(&o)
    );
    let o = stat_in(&dir, &["--all", "--json"]);
    assert!(
        stdout(&o).contains("\"alive\":false,\"pid_reused\":true"),
        "{}",
        stdout(&o)
    );
    later.kill().unwrap();
    later.wait().unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn b_a_file_of_another_layout_version_is_reported() {
    let dir = temp_dir("other-version");
    let held = Held::start(&dir, PY_PAIR, &[]);
    let pid = held.pid();
    let file = dir.join(format!("{pid}.stats"));
    let mut bytes = std::fs::read(&file).unwrap();
    let version = rsock_core::stats::VERSION;
    bytes[7] = version - 1;
    std::fs::write(&file, &bytes).unwrap();
    let said = format!(
        "{}: stats layout version {}, this rsock reads version {version}",
        file.display(),
        version - 1
    );
    for args in [&[][..], &["--json"], &[&pid.to_string()]] {
        let o = stat_in(&dir, args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
        assert_eq!(
            stderr(&o).lines().collect::<Vec<_>>(),
            [format!("rsock stat: {said} (the process runs another build of rsock; use that build's rsock stat)")],
            "{args:?}"
        );
    }
    held.finish();
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn c_gc_says_what_it_removed() {
    let dir = temp_dir("gc");
    let live = Held::start(&dir, PY_PAIR, &[]);
    let gone = Held::start(&dir, PY_PAIR, &[]);
    let (live_pid, gone_pid) = (live.pid(), gone.pid());
    gone.finish();
    let o = stat_in(&dir, &["--gc"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let removed = format!(
        "removed {}: pid {gone_pid} python3 (exited)",
        dir.join(format!("{gone_pid}.stats")).display()
    );
    assert_eq!(
        stdout(&o).lines().next(),
        Some(removed.as_str()),
        "{}",
        stdout(&o)
    );
    assert_eq!(stdout(&o).matches("removed ").count(), 1, "{}", stdout(&o));
    assert!(
        stdout(&o).contains(&format!("pid {live_pid} python3\n")),
        "the live one is listed: {}",
        stdout(&o)
    );
    assert!(!dir.join(format!("{gone_pid}.stats")).exists());
    assert!(dir.join(format!("{live_pid}.stats")).exists());
    // Nothing more to remove: nothing said.
    let o = stat_in(&dir, &["--gc", "--json"]);
    assert_eq!((stderr(&o).as_str(), o.status.code()), ("", Some(0)));
    live.finish();
    let o = stat_in(&dir, &["--gc", "--json"]);
    assert_eq!(stdout(&o), "", "stdout keeps JSON only");
    assert!(
        stderr(&o).contains(&format!(
            "removed {}",
            dir.join(format!("{live_pid}.stats")).display()
        )),
        "{}",
        stderr(&o)
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn e_excluded_is_its_own_reason() {
    let dir = temp_dir("excluded");
    // 127.0.0.0/8 is in RSOCK_EXCLUDE by default: both ends (the client by its destination,
    // the server by its listening address) are excluded.
    let held = Held::start(&dir, PY_PAIR, &[]);
    let o = stat_in(&dir, &["--json"]);
    let out = stdout(&o);
    assert!(out.contains(",\"excluded\":2}"), "{out}");
    assert!(out.contains("\"no_device\":0,"), "{out}");
    assert_eq!(out.matches("\"reason\":\"excluded\"").count(), 2, "{out}");
    let o = stat_in(&dir, &[]);
    assert!(
        stdout(&o).contains("  fallbacks: excluded=2\n"),
        "{}",
        stdout(&o)
    );
    assert_eq!(
        stdout(&o)
            .matches("  (excluded: RSOCK_EXCLUDE entry 1)\n")
            .count(),
        2,
        "{}",
        stdout(&o)
    );
    held.finish();
    // Not excluded: some other reason (no_device on a host without RDMA), never `excluded`.
    let held = Held::start(&dir, PY_PAIR, &[("RSOCK_EXCLUDE", "port=1")]);
    let o = stat_in(&dir, &["--json", &held.pid().to_string()]);
    assert!(stdout(&o).contains(",\"excluded\":0}"), "{}", stdout(&o));
    assert!(
        !stdout(&o).contains("\"reason\":\"excluded\""),
        "{}",
        stdout(&o)
    );
    held.finish();
    std::fs::remove_dir_all(dir).unwrap();
}

/// A listener on 127.0.0.1 that has accepted nothing.
const PY_LISTEN: &str = "l = socket.socket(); l.bind(('127.0.0.1', 0)); l.listen()";

#[test]
fn f_a_listener_shows_from_its_first_socket() {
    let dir = temp_dir("listener");
    // Excluded (127.0.0.0/8 by default): TCP only, and why.
    let held = Held::start(&dir, PY_LISTEN, &[]);
    let pid = held.pid();
    let o = stat_in(&dir, &[]);
    let out = stdout(&o);
    assert!(out.starts_with(&format!("pid {pid} python3\n")), "{out}");
    assert!(
        out.contains("listening on 127.0.0.1:")
            && out.contains("  tcp only (excluded: RSOCK_EXCLUDE entry 1)\n"),
        "{out}"
    );
    let o = stat_in(&dir, &["--json"]);
    assert!(
        stdout(&o).contains("\"listens\":1,")
            && stdout(&o).contains(
                ",\"rdma\":false,\"tcp_only\":\"excluded\",\"detail\":\"RSOCK_EXCLUDE entry 1\"}]"
            ),
        "{}",
        stdout(&o)
    );
    held.finish();
    // Not excluded: RDMA + TCP where a device serves it, else TCP only for another reason.
    let held = Held::start(&dir, PY_LISTEN, &[("RSOCK_EXCLUDE", "")]);
    let o = stat_in(&dir, &[&held.pid().to_string()]);
    let out = stdout(&o);
    assert!(out.contains("listening on 127.0.0.1:"), "{out}");
    assert!(
        out.contains("  rdma+tcp\n") || out.contains("  tcp only (no_device)\n"),
        "{out}"
    );
    held.finish();
    std::fs::remove_dir_all(dir).unwrap();
}

/// `rsock run -- nc -l 127.0.0.1 PORT`: the server shows in `rsock stat` while it waits.
#[test]
fn f_a_server_under_rsock_run_shows_while_it_waits() {
    let dir = temp_dir("nc-listen");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut nc = Command::new(RSOCK)
        .args(["run", "--", "nc", "-l", "127.0.0.1", &port.to_string()])
        .env("RSOCK_LIB", shim())
        .env("RSOCK_STATS_DIR", &dir)
        .env_remove("LD_PRELOAD")
        .env_remove("RSOCK_EXCLUDE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let want = format!("listening on 127.0.0.1:{port}  tcp only (excluded: RSOCK_EXCLUDE entry 1)");
    // nc needs a moment to start: look until it shows (or give up after a generous while).
    let mut out = String::new();
    for _ in 0..200 {
        out = stdout(&stat_in(&dir, &[&nc.id().to_string()]));
        if out.contains(&want) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    nc.kill().unwrap();
    nc.wait().unwrap();
    assert!(out.contains(&want), "{out}");
    assert!(out.starts_with(&format!("pid {} nc", nc.id())), "{out}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn f_a_refused_connect_leaves_a_trace() {
    let dir = temp_dir("refused");
    // A port nobody listens on; then a blocking connect and one with a timeout (nonblocking,
    // its failure read from SO_ERROR).
    let body = "p = socket.socket(); p.bind(('127.0.0.1', 0)); port = p.getsockname()[1]; p.close()
for t in (None, 5):
    c = socket.socket(); c.settimeout(t)
    try:
        c.connect(('127.0.0.1', port)); sys.exit('connected?')
    except ConnectionRefusedError:
        pass
    c.close()";
    let held = Held::start(&dir, body, &[]);
    let o = stat_in(&dir, &[]);
    let out = stdout(&o);
    assert!(
        out.starts_with(&format!("pid {} python3\n", held.pid())),
        "{out}"
    );
    assert!(
        out.contains("  connects failed: 2 refused, 0 other\n"),
        "{out}"
    );
    let o = stat_in(&dir, &["--json"]);
    assert!(
        stdout(&o).contains("\"conns\":{\"rdma\":0,\"tcp\":0,\"passthrough\":0}")
            && stdout(&o).contains("\"connects\":{\"refused\":2,\"failed\":0}"),
        "{}",
        stdout(&o)
    );
    held.finish();
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn g_openmetrics_export() {
    let dir = temp_dir("openmetrics");
    let held = Held::start(&dir, PY_PAIR, &[]);
    let pid = held.pid();
    let o = stat_in(&dir, &["--openmetrics"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.ends_with("\n# EOF\n"), "{out}");
    let who = format!("pid=\"{pid}\",comm=\"python3\"");
    for want in [
        "# TYPE rsock_connections counter\n".to_string(),
        format!("rsock_connections_total{{{who},path=\"tcp\"}} 2\n"),
        format!("rsock_sent_bytes_total{{{who},path=\"tcp\"}} 20\n"),
        format!("rsock_received_bytes_total{{{who},path=\"tcp\"}} 20\n"),
        format!("rsock_fallbacks_total{{{who},reason=\"excluded\"}} 2\n"),
        format!("rsock_listens_total{{{who}}} 1\n"),
        format!("rsock_open_connections{{{who}}} 2\n"),
        format!("rsock_open_listeners{{{who}}} 1\n"),
    ] {
        assert!(out.contains(&want), "{want:?} in {out}");
    }
    for line in out.lines().filter(|l| !l.starts_with('#')) {
        let (metric, value) = line.rsplit_once(' ').unwrap();
        assert!(value.parse::<u64>().is_ok(), "{line}");
        assert!(
            metric.starts_with("rsock_")
                && metric.contains(&format!("{{{who}"))
                && metric.ends_with('}'),
            "{line}"
        );
    }
    held.finish();
    let o = stat_in(&dir, &["--openmetrics", "--json"]);
    assert_usage_error(
        &o,
        "the argument '--openmetrics' cannot be used with '--json'",
        "",
    );
    let o = stat_in(&dir, &["--openmetrics", "--watch"]);
    assert_usage_error(
        &o,
        "the argument '--openmetrics' cannot be used with '--watch",
        "",
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn h_log_lines_start_with_an_rfc3339_time() {
    let dir = temp_dir("log-time");
    let log = dir.join("shim.log");
    let held = Held::start(
        &dir,
        PY_PAIR,
        &[
            ("RSOCK_LOG", log.to_str().unwrap()),
            ("RSOCK_LOG_LEVEL", "debug"),
        ],
    );
    held.finish();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("over kernel TCP (excluded: RSOCK_EXCLUDE entry 1)"),
        "{text}"
    );
    for line in text.lines() {
        let (time, rest) = line.split_once(' ').unwrap();
        assert!(rest.starts_with("rsock["), "{line}");
        // 2026-11-23T23:10:01.123456Z
        let b = time.as_bytes();
        assert_eq!(b.len(), 27, "{line}");
        for (i, c) in b.iter().enumerate() {
            let want = match i {
                4 | 7 => b'-',
                10 => b'T',
                13 | 16 => b':',
                19 => b'.',
                26 => b'Z',
                _ => b'0',
            };
            assert!(
                if want == b'0' {
                    c.is_ascii_digit()
                } else {
                    *c == want
                },
                "{line}"
            );
        }
        assert!(time[..4].parse::<u32>().unwrap() >= 2024, "{line}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

// ---- rsock check -------------------------------------------------------------------------------

/// `rsock check` with the real shim (RSOCK_LIB), the environment otherwise the test's.
fn check(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(RSOCK);
    c.arg("check")
        .args(args)
        .env("RSOCK_LIB", shim())
        .env_remove("LD_PRELOAD");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

#[test]
fn check_says_what_this_host_lacks_and_why_a_connection_fell_back() {
    if std::path::Path::new("/sys/class/infiniband")
        .read_dir()
        .is_ok_and(|mut d| d.next().is_some())
    {
        // A host with a device answers otherwise; the RDMA suite checks that case
        // (tests/rdma/product.sh, cell check).
        eprintln!("not run: this host has an RDMA device");
        return;
    }
    // No device: the device check fails (status 1) and says what to do.
    let o = check(&[], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(
        stdout(&o).contains("FAIL  device    no RDMA device"),
        "{}",
        stdout(&o)
    );
    assert!(stdout(&o).contains("ok    shim"), "{}", stdout(&o));
    // A listener on loopback: the probe connects over kernel TCP, excluded by default...
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let target = l.local_addr().unwrap().to_string();
    let o = check(&[&target], &[]);
    assert!(
        stdout(&o).contains(&format!(
            "{target}: connected over kernel TCP; RDMA: excluded"
        )),
        "{}",
        stdout(&o)
    );
    // ... and, not excluded, because there is no device.
    let o = check(&[&target], &[("RSOCK_EXCLUDE", "")]);
    assert!(
        stdout(&o).contains(&format!(
            "{target}: connected over kernel TCP; RDMA: no_device"
        )),
        "{}",
        stdout(&o)
    );
    // Nothing listening: refused.
    drop(l);
    let o = check(&[&target], &[]);
    assert!(
        stdout(&o).contains(&format!("FAIL  server    {target}: connection refused")),
        "{}",
        stdout(&o)
    );
}

#[test]
fn check_rejects_a_bad_target() {
    for bad in [
        "10.0.0.1:0",
        "10.0.0.1:x",
        "[fe80::1",
        "[fe80::1]x",
        "",
        "--frob",
    ] {
        let o = rsock(&["check", bad]);
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {}", stderr(&o));
    }
    assert_usage_error(
        &rsock(&["check", "a", "b"]),
        "unexpected argument",
        "two targets",
    );
    assert_usage_error(
        &rsock(&["check", "10.0.0.1:70000"]),
        "PORT must be 1-65535",
        "port",
    );
    let o = rsock(&["help", "check"]);
    assert!(
        stdout(&o).starts_with("Usage: rsock check [HOST[:PORT]]"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn rules_explain_gives_each_step_of_the_decision() {
    let d = temp_dir("explain");
    let f = d.join("r.conf");
    std::fs::write(
        &f,
        "tcp port=5432\nrdma prog=nginx ring=1M\npassthrough remote=10.9.0.0/16\n",
    )
    .unwrap();
    let f = f.to_str().unwrap();
    let explain = |args: &[&str], env: &[(&str, &str)]| {
        let mut c = Command::new(RSOCK);
        c.args(["rules", "--explain"])
            .args(args)
            .env_remove("RSOCK_EXCLUDE")
            .env_remove("RSOCK_RDMA");
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let o = explain(&["10.0.0.1:5432", f], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("line 1: tcp port=5432 -- the first rule that matches"),
        "{}",
        stdout(&o)
    );
    assert!(stdout(&o).contains("decision: tcp"), "{}", stdout(&o));
    let o = explain(&["127.0.0.1:80", f], &[]);
    assert!(
        stdout(&o).contains("RSOCK_EXCLUDE (default 127.0.0.0/8,::1/128) names 127.0.0.1:80"),
        "{}",
        stdout(&o)
    );
    assert!(
        stdout(&o).contains("decision: passthrough"),
        "{}",
        stdout(&o)
    );
    // prog= matches only with --prog; the rule's ring size is shown; RSOCK_RDMA=0 is the last word.
    let o = explain(&["10.0.0.2:80", "--prog", "nginx", "--server", f], &[]);
    assert!(
        stdout(&o).starts_with("a listener on 10.0.0.2:80 by program \"nginx\""),
        "{}",
        stdout(&o)
    );
    assert!(
        stdout(&o).contains("buffers: ring 1024 KiB"),
        "{}",
        stdout(&o)
    );
    let o = explain(&["10.0.0.2:80", f], &[]);
    assert!(
        stdout(&o).contains("none of its 3 rule(s) matches"),
        "{}",
        stdout(&o)
    );
    assert!(stdout(&o).contains("decision: rdma"), "{}", stdout(&o));
    let o = explain(&["10.0.0.2:80", f], &[("RSOCK_RDMA", "0")]);
    assert!(
        stdout(&o).contains("RSOCK_RDMA=0: what would try RDMA takes kernel TCP"),
        "{}",
        stdout(&o)
    );
    assert!(stdout(&o).contains("decision: tcp"), "{}", stdout(&o));
    assert_usage_error(
        &explain(&["10.0.0.1"], &[]),
        "expected ADDR:PORT",
        "no port",
    );
    assert_usage_error(
        &explain(&[], &[]),
        "a value is required for '--explain <ADDR:PORT>'",
        "no address",
    );
    assert_usage_error(
        &rsock(&["rules", "--prog", "nginx"]),
        "--explain <ADDR:PORT>",
        "--prog without --explain",
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// A socket made and closed every 20 ms: the shim looks for log requests at each.
const PY_CHURN: &str = "import threading, time
socket.socket().close()
def churn():
    while True:
        socket.socket().close(); time.sleep(0.02)
threading.Thread(target=churn, daemon=True).start()";

#[test]
fn i_log_level_changes_in_a_running_process() {
    let dir = temp_dir("log-live");
    let held = Held::start(&dir, PY_CHURN, &[("RSOCK_LOG", "")]);
    let pid = held.pid().to_string();
    let log = |args: &[&str]| {
        let mut v = vec!["log", "--dir", dir.to_str().unwrap()];
        v.extend_from_slice(args);
        rsock(&v)
    };
    let o = log(&[&pid]);
    assert_eq!(status(&o), 0, "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        format!("pid {pid} python3: log off\n"),
        "no RSOCK_LOG: off"
    );
    let o = log(&[&pid, "debug"]);
    let file = dir.join(format!("{pid}.log"));
    assert_eq!(status(&o), 0, "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        format!("pid {pid} python3: log debug to {}\n", file.display())
    );
    let o = stat_in(&dir, &["--json"]);
    assert!(
        stdout(&o).contains("\"log\":{\"level\":\"debug\",\"to\":\"stats_dir\"}"),
        "{}",
        stdout(&o)
    );
    assert!(
        stdout(&stat_in(&dir, &[])).contains(&format!("  log: debug to {pid}.log\n")),
        "rsock stat shows where the log goes"
    );
    let o = log(&[&pid, "off"]);
    assert_eq!(stdout(&o), format!("pid {pid} python3: log off\n"));
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("rsock log: level OFF -> DEBUG"), "{text}");
    assert!(text.contains("rsock log: level DEBUG -> OFF"), "{text}");
    held.finish();
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn i_log_says_what_is_wrong() {
    let dir = temp_dir("log-errors");
    // An idle process never reaches the shim again: the request is not taken, and rsock
    // says so after its wait.
    let held = Held::start(&dir, "socket.socket()", &[]);
    let pid = held.pid().to_string();
    let d = dir.to_str().unwrap();
    let o = rsock(&["log", "--dir", d, &pid, "trace"]);
    assert_eq!(status(&o), 1);
    assert!(
        stderr(&o).contains("asked for log level trace, not taken yet"),
        "{}",
        stderr(&o)
    );
    let o = rsock(&["log", "--dir", d, &pid, "chatty"]);
    assert_eq!(status(&o), 2);
    assert!(
        stderr(&o).contains("invalid value 'chatty'"),
        "{}",
        stderr(&o)
    );
    held.finish();
    let me = std::process::id().to_string();
    let o = rsock(&["log", "--dir", d, &me]);
    assert_eq!(status(&o), 1);
    assert!(
        stderr(&o).contains(&format!("no {d}/{me}.stats")),
        "{}",
        stderr(&o)
    );
    let o = rsock(&["log", "4194304"]);
    assert_eq!(status(&o), 1);
    assert!(stderr(&o).contains("no such process"), "{}", stderr(&o));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn j_a_stats_directory_others_can_write_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = temp_dir("open-dir");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let log = std::env::temp_dir().join(format!("rsock-cli-open-dir-{}.log", std::process::id()));
    let held = Held::start(&dir, PY_PAIR, &[("RSOCK_LOG", log.to_str().unwrap())]);
    let o = stat_in(&dir, &[]);
    assert_eq!(
        stdout(&o),
        format!("no rsock processes in {}\n", dir.display())
    );
    held.finish();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("stats disabled") && text.contains("not sticky"),
        "{text}"
    );
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "no file was made there"
    );
    std::fs::remove_file(log).unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}
