//! The command line, defined once with clap: every command, option, value check and help
//! text. The same definitions parse the arguments, print `-h`/`--help`, and generate the man
//! pages and shell completions (`man.rs`).
//!
//! Values are checked while parsing, so a bad one is reported as clap reports it ("invalid
//! value 'X' for '--opt <V>': why", status 2): `rsock run`'s settings by the shim's own
//! parser ([`Config::parse`]), so that rsock refuses exactly what the shim would replace by
//! its default.

use clap::builder::{PossibleValue, TypedValueParser};
use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum, ValueHint};
use rsock_core::config::{Config, USING_DEFAULT};
use std::ffi::{OsStr, OsString};
use std::net::SocketAddr;
use std::path::PathBuf;

/// The help of every command: its usage first, then what it does, its arguments, and notes.
const TEMPLATE: &str = "{usage-heading} {usage}\n\n{about-with-newline}\n{all-args}{after-help}";

const RUN_USAGE: &str = "rsock run [OPTIONS] [--] PROGRAM [ARGS...]";
const STAT_USAGE: &str = "rsock stat [OPTIONS] [PID...]";
const RULES_USAGE: &str = "rsock rules [FILE]
       rsock rules --explain ADDR:PORT [--prog NAME] [--server] [FILE]";
const CHECK_USAGE: &str = "rsock check [HOST[:PORT]]";
const LOG_USAGE: &str = "rsock log [--dir DIR] PID [LEVEL]";
const COMPLETIONS_USAGE: &str = "rsock completions SHELL";

/// Every command's usage, one per line (rsock's own usage).
fn usage() -> String {
    [
        RUN_USAGE,
        STAT_USAGE,
        RULES_USAGE,
        CHECK_USAGE,
        LOG_USAGE,
        COMPLETIONS_USAGE,
        "rsock help [COMMAND]",
        "rsock --version",
    ]
    .join("\n       ")
}

/// What a command's exit status means (its help's last paragraph, and the man pages' EXIT
/// STATUS).
pub fn exit_status(command: &str) -> Option<&'static str> {
    Some(match command {
        "run" => {
            "PROGRAM's own; 2 for a usage error; 126 when rsock refuses (no shim, a \
             setuid/setgid/capability program, a bad --config file) or cannot execute PROGRAM; \
             127 when PROGRAM is not found."
        }
        "stat" => {
            "0; 1 when a process or file could not be read (each problem is said on standard \
             error); 2 for a usage error."
        }
        "rules" => {
            "0 if every line is a rule; 1 if a line would be ignored or FILE cannot be read; 2 \
             for a usage error."
        }
        "check" => {
            "0 if nothing failed (warnings allowed); 1 if a check failed; 2 for a usage error."
        }
        "log" => {
            "0 if the process answered (with LEVEL: it logs at LEVEL now); 1 if it cannot be \
             found or read, or has not answered within 3 seconds; 2 for a usage error."
        }
        "completions" => "0; 2 for a usage error.",
        _ => return None,
    })
}

/// "Exit status: ...", in lines of at most 90 characters.
fn after_help(command: &str) -> String {
    let text = format!("Exit status: {}", exit_status(command).unwrap_or_default());
    let mut out = String::new();
    let mut line = 0;
    for word in text.split(' ') {
        if line > 0 && line + 1 + word.len() > 90 {
            out.push('\n');
            line = 0;
        } else if line > 0 {
            out.push(' ');
            line += 1;
        }
        out.push_str(word);
        line += word.len();
    }
    out
}

#[derive(Parser, Debug)]
#[command(
    name = "rsock",
    version,
    about = "Run unmodified TCP programs over RDMA, and watch what they do",
    long_about = "\
librsock.so is an LD_PRELOAD shim: a program started with it has its TCP connections carried
by RDMA (rdma_cm RC connections) where an RDMA device and a peer running rsock allow it, and
by kernel TCP everywhere else, without the program noticing. rsock starts programs with the
shim (run), shows the shim's counters (stat), checks rules files (rules) and whether this
host can use RDMA (check), and changes a running process's log level (log).

Every command takes -h (a summary) and --help (all of it), as does rsock help COMMAND. An
option's value may follow it (--log FILE) or an = (--log=FILE).",
    override_usage = usage(),
    help_template = TEMPLATE,
    subcommand_required = true,
    arg_required_else_help = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    Run(RunArgs),
    Stat(StatArgs),
    Rules(RulesArgs),
    Check(CheckArgs),
    Log(LogArgs),
    Completions(CompletionsArgs),
}

/// `rsock run`.
#[derive(Args, Debug)]
#[command(
    about = "Run PROGRAM with librsock.so preloaded",
    long_about = "\
Runs PROGRAM with librsock.so first in LD_PRELOAD (a value already set is kept after it) and
the options turned into RSOCK_* variables. rsock execs PROGRAM: no wrapper process stays
behind, so the exit status and any signal that ends it are the caller's, unchanged.
Everything after PROGRAM is PROGRAM's own arguments, passed untouched.

Values are checked the way the shim reads them, the options' and the RSOCK_* variables
inherited from the environment alike: a bad one is a usage error naming the variable; an
unknown RSOCK_* name is a warning.

The shim is RSOCK_LIB if set; else the first librsock.so found next to this rsock binary,
in ../lib/rsock/ from its directory (for /usr/bin/rsock: /usr/lib/rsock/librsock.so), or in
the library directory set when rsock was built (RSOCK_LIBDIR at build time; make sets it to
PREFIX/lib/rsock). When none is found, the error lists every place looked at.

rsock refuses to run a program that is set-user-ID or set-group-ID to someone else or has
file capabilities: the dynamic loader runs such programs in secure-execution mode and
ignores LD_PRELOAD, so they would run without rsock.",
    override_usage = RUN_USAGE,
    help_template = TEMPLATE,
    after_help = after_help("run"),
    args_override_self = true
)]
pub struct RunArgs {
    #[arg(
        long,
        value_name = "FILE",
        value_parser = crate::run::log_file,
        value_hint = ValueHint::FilePath,
        help = "The shim's log file (RSOCK_LOG)",
        long_help = "The shim's log file (RSOCK_LOG), made absolute; its directory must exist
and be writable. - is refused: the shim never writes to the program's standard
output or error."
    )]
    pub log: Option<PathBuf>,

    #[arg(
        long,
        value_name = "LEVEL",
        value_parser = ShimSetting::new("RSOCK_LOG_LEVEL", &["off", "error", "warn", "info", "debug", "trace"]),
        hide_possible_values = true,
        help = "The shim's log level (RSOCK_LOG_LEVEL)",
        long_help = "The shim's log level: off, error, warn, info, debug or trace (RSOCK_LOG_LEVEL)"
    )]
    pub log_level: Option<String>,

    #[arg(
        long,
        value_name = "SPEC",
        value_parser = ShimSetting::new("RSOCK_EXCLUDE", &[]),
        help = "Destinations never tried over RDMA (RSOCK_EXCLUDE)",
        long_help = "Destinations never tried over RDMA, e.g. 10.0.0.0/8,port=22 (RSOCK_EXCLUDE)"
    )]
    pub exclude: Option<String>,

    #[arg(
        long,
        value_name = "FILE",
        value_parser = crate::run::absolute_path,
        value_hint = ValueHint::FilePath,
        help = "Rules file (RSOCK_CONFIG); its bad lines are listed here too",
        long_help = "Rules file (RSOCK_CONFIG), made absolute; its bad lines are listed on
standard error first, and a file that cannot be read is refused (status 126)"
    )]
    pub config: Option<PathBuf>,

    #[arg(
        long,
        value_name = "N",
        value_parser = ShimSetting::new("RSOCK_SPIN_US", &[]),
        help = "Microseconds a blocking call polls before sleeping (RSOCK_SPIN_US)"
    )]
    pub spin_us: Option<String>,

    #[arg(long, help = "Track connections but never try RDMA (RSOCK_RDMA=0)")]
    pub no_rdma: bool,

    /// PROGRAM and its arguments. One argument, so that once PROGRAM is seen everything
    /// after it is PROGRAM's (trailing_var_arg), options of rsock's own names included.
    #[arg(
        value_name = "PROGRAM",
        required = true,
        trailing_var_arg = true,
        value_hint = ValueHint::CommandWithArguments,
        help = "The program to run (looked up in PATH), then its arguments"
    )]
    pub command: Vec<OsString>,
}

/// `rsock stat`.
#[derive(Args, Debug)]
#[command(
    about = "Show the counters of processes running with the shim",
    long_about = "\
The counters of processes running with the shim, read from their stats files
(/dev/shm/rsock-UID/PID.stats): connections by path (rdma; tcp: RDMA could not serve, or a
rule said so; passthrough: the shim was told not to try), bytes sent and received by path,
fallbacks by reason, listeners, and each live connection. Another user's processes are
refused by the kernel, and rsock says so.",
    override_usage = STAT_USAGE,
    help_template = TEMPLATE,
    after_help = after_help("stat"),
    args_override_self = true
)]
pub struct StatArgs {
    #[arg(
        long,
        value_name = "DIR",
        value_hint = ValueHint::DirPath,
        help = "Stats directory (default: RSOCK_STATS_DIR or /dev/shm/rsock-<uid>)"
    )]
    pub dir: Option<PathBuf>,

    #[arg(
        long,
        help = "Include processes that have exited (kept with RSOCK_STATS_KEEP=1)",
        long_help = "Include processes that have exited (their files were kept with
RSOCK_STATS_KEEP=1)"
    )]
    pub all: bool,

    #[arg(
        long,
        help = "One JSON object per process, one per line",
        long_help = "One JSON object per process, one per line; with --watch, one per refresh:
{\"time\":..., \"processes\":[...], \"problems\":[...]}"
    )]
    pub json: bool,

    #[arg(
        long,
        conflicts_with_all = ["json", "watch"],
        help = "The counters in the OpenMetrics text format",
        long_help = "The counters in the OpenMetrics text format (labels pid and comm; ends with
# EOF), e.g. for node_exporter's textfile collector"
    )]
    pub openmetrics: bool,

    #[arg(
        long,
        help = "First remove the files of processes that have exited",
        long_help = "First remove the files of processes that have exited, one line per
file (\"removed FILE: pid N PROGRAM (why)\"; on standard error with --json or
--openmetrics)"
    )]
    pub gc: bool,

    // An optional value that may also follow as the next word: see `join_watch_interval`.
    #[arg(
        long,
        value_name = "SECS",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "1",
        value_parser = interval,
        help = "Refresh every SECS seconds (default 1), with rates",
        long_help = "Refresh every SECS seconds (default 1; 0.1-3600, e.g. 2, 0.5, 90s):
rates per process and per connection, in place on a terminal, one block per
refresh otherwise. SECS may also be the next word (--watch 2) if it reads as an
interval and not as a PID: with a fraction, an s, or an integer up to 60."
    )]
    pub watch: Option<f64>,

    #[arg(
        long,
        value_name = "N",
        requires = "watch",
        value_parser = positive,
        help = "With --watch: stop after N refreshes"
    )]
    pub count: Option<u64>,

    #[arg(
        value_name = "PID",
        value_parser = pid,
        help = "Only these processes (another user's are looked up in their directory)"
    )]
    pub pids: Vec<u32>,
}

/// `rsock rules`.
#[derive(Args, Debug)]
#[command(
    about = "Check a rules file, or explain the shim's decision for one connection",
    long_about = "\
Prints each rule of FILE as the shim understands it, and every line it would ignore. FILE
is RSOCK_CONFIG if set, else /etc/rsock.conf.

With --explain ADDR:PORT, how the shim decides for a connect to ADDR:PORT (--server: a
listener on it), step by step: RSOCK_EXCLUDE, the first rule that matches (--prog NAME: for
program NAME; without it rules with prog= do not match), RSOCK_RDMA, and the decision with
its buffer sizes, with the RSOCK_* variables of the environment it runs in.",
    override_usage = RULES_USAGE,
    help_template = TEMPLATE,
    after_help = after_help("rules"),
    args_override_self = true
)]
pub struct RulesArgs {
    #[arg(
        long,
        value_name = "ADDR:PORT",
        value_parser = socket_addr,
        help = "How the shim decides for a connection to ADDR:PORT",
        long_help = "How the shim decides for a connection to ADDR:PORT (IPv6: [ADDR]:PORT)"
    )]
    pub explain: Option<SocketAddr>,

    #[arg(
        long,
        value_name = "NAME",
        requires = "explain",
        help = "With --explain: for program NAME (the rules' prog=)"
    )]
    pub prog: Option<String>,

    #[arg(
        long,
        requires = "explain",
        help = "With --explain: a listener on ADDR:PORT, not a connect to it"
    )]
    pub server: bool,

    #[arg(
        value_name = "FILE",
        value_hint = ValueHint::FilePath,
        help = "The rules file (default: RSOCK_CONFIG, else /etc/rsock.conf)"
    )]
    pub file: Option<PathBuf>,
}

/// `rsock check`.
#[derive(Args, Debug)]
#[command(
    about = "Check that this host can use RDMA, and whether a server answers over it",
    long_about = "\
Checks that this host can use RDMA: the shim, each RDMA device's ports (from
/sys/class/infiniband), and the memlock limit against what connections pin. With HOST, also
whether rdma_cm resolves HOST's address and route; with PORT, connects there the way a
program under rsock would (a copy of rsock under rsock run) and says which path the
connection took and why: over RDMA only if a server running under rsock listens there.
HOST is the address (or name) of the peer's RDMA interface.

Each line is a verdict (ok, warn, FAIL), what was found, and what to do.",
    override_usage = CHECK_USAGE,
    help_template = TEMPLATE,
    after_help = after_help("check"),
    args_override_self = true
)]
pub struct CheckArgs {
    #[arg(
        value_name = "HOST[:PORT]",
        value_parser = crate::check::parse_target,
        value_hint = ValueHint::Hostname,
        help = "The peer: HOST, HOST:PORT, [IPV6]:PORT"
    )]
    pub target: Option<(String, Option<u16>)>,
}

/// `rsock log`.
#[derive(Args, Debug)]
#[command(
    about = "Show or change the log level of a process running with the shim",
    long_about = "\
Shows the shim's log level in process PID and where its log goes; with LEVEL, changes it
while the process runs, and waits (up to 3 seconds) for the process to answer. The shim
takes the change at the process's next socket call, or within a second when it has an RDMA
engine. A process started without a log (no RSOCK_LOG) then logs to DIR/PID.log.

The request goes through the process's stats file, which only its user and root can
write.",
    override_usage = LOG_USAGE,
    help_template = TEMPLATE,
    after_help = after_help("log"),
    args_override_self = true
)]
pub struct LogArgs {
    #[arg(
        long,
        value_name = "DIR",
        value_hint = ValueHint::DirPath,
        help = "Stats directory (default: RSOCK_STATS_DIR or /dev/shm/rsock-<uid of PID>)"
    )]
    pub dir: Option<PathBuf>,

    #[arg(value_name = "PID", value_parser = pid, help = "The process")]
    pub pid: u32,

    #[arg(
        value_name = "LEVEL",
        value_parser = ShimSetting::new("RSOCK_LOG_LEVEL", &["off", "error", "warn", "info", "debug", "trace"]),
        hide_possible_values = true,
        help = "The new level: off, error, warn, info, debug or trace"
    )]
    pub level: Option<String>,
}

/// `rsock completions`.
#[derive(Args, Debug)]
#[command(
    about = "Print rsock's completion script for a shell",
    long_about = "\
Prints rsock's completion script for SHELL. make install puts them where the shells look:
bash in share/bash-completion/completions/rsock, zsh in share/zsh/vendor-completions/_rsock,
fish in share/fish/vendor_completions.d/rsock.fish. To try one in the running shell:
source <(rsock completions bash).",
    override_usage = COMPLETIONS_USAGE,
    help_template = TEMPLATE,
    after_help = after_help("completions"),
    args_override_self = true
)]
pub struct CompletionsArgs {
    #[arg(value_name = "SHELL", value_enum, help = "The shell")]
    pub shell: Shell,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

/// The command line as it is parsed: [`Cli`] and the hidden commands, which are not part of
/// `Cli` so that help, man pages and completions (made from `Cli::command()`) never show
/// them: `rsock check __probe ADDR` (the connection `rsock check` makes under the shim) and
/// `rsock __man DIR` (writes the man pages into DIR; `make install` runs it).
pub fn parser() -> clap::Command {
    Cli::command()
        .subcommand(
            clap::Command::new("__man")
                .hide(true)
                .about("Write rsock's man pages into DIR (rsock.1, rsock-COMMAND.1)")
                .arg(
                    clap::Arg::new("dir")
                        .value_name("DIR")
                        .required(true)
                        .value_parser(clap::value_parser!(PathBuf)),
                ),
        )
        .mut_subcommand("check", |c| {
            // No `help` subcommand: `rsock check help` checks a host named help.
            c.disable_help_subcommand(true).subcommand(
                clap::Command::new("__probe")
                    .hide(true)
                    .about("Connect to ADDR:PORT once (run by rsock check under the shim)")
                    .arg(
                        clap::Arg::new("addr")
                            .value_name("ADDR:PORT")
                            .required(true)
                            .value_parser(socket_addr),
                    ),
            )
        })
}

/// `stat --watch`'s interval may also be the next word, when it reads as one rather than as a
/// PID: a fraction ("0.5"), an "s" suffix ("10s"), or an integer up to 60 (`--watch 0` is an
/// interval out of range, not a PID after `--watch`; `--watch 1234` is PID 1234). clap
/// takes an optional value only after `=` (`require_equals`); this joins such a word to its
/// `--watch` first.
pub fn join_watch_interval(mut args: Vec<OsString>) -> Vec<OsString> {
    if args.get(1).map(OsString::as_os_str) != Some(OsStr::new("stat")) {
        return args;
    }
    let looks_like_interval = |w: &OsStr| {
        w.to_str().is_some_and(|n| {
            n.contains('.') || n.ends_with('s') || n.parse::<u32>().is_ok_and(|v| v <= 60)
        })
    };
    let mut i = 2;
    while i < args.len() {
        if args[i] == "--" {
            break;
        }
        if args[i] == "--watch" && args.get(i + 1).is_some_and(|w| looks_like_interval(w)) {
            let secs = args.remove(i + 1);
            let mut joined = OsString::from("--watch=");
            joined.push(secs);
            args[i] = joined;
        }
        i += 1;
    }
    args
}

/// Seconds, `N`, `N.N` or with an `s` suffix, from 0.1 to 3600.
pub fn interval(s: &str) -> Result<f64, String> {
    s.strip_suffix('s')
        .unwrap_or(s)
        .parse::<f64>()
        .ok()
        .filter(|v| (0.1..=3600.0).contains(v))
        .ok_or_else(|| "expected seconds from 0.1 to 3600 (e.g. 2, 0.5, 90s)".to_string())
}

fn positive(s: &str) -> Result<u64, String> {
    s.parse::<u64>()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| "expected a positive integer".to_string())
}

fn pid(s: &str) -> Result<u32, String> {
    s.parse::<u32>()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| "not a PID (a positive integer)".to_string())
}

fn socket_addr(s: &str) -> Result<SocketAddr, String> {
    s.parse()
        .map_err(|_| "expected ADDR:PORT (IPv6: [ADDR]:PORT)".to_string())
}

/// The value of an option that sets the shim variable `var`, checked by the shim's own
/// parser: a value it would replace by its default is invalid. `values`, if any, are listed
/// in the help and offered by the completions (the check is still the shim's).
#[derive(Clone)]
pub struct ShimSetting {
    var: &'static str,
    values: &'static [&'static str],
}

impl ShimSetting {
    fn new(var: &'static str, values: &'static [&'static str]) -> ShimSetting {
        ShimSetting { var, values }
    }

    /// The shim's complaint about `value` for this variable, if it would not take it.
    pub fn check(&self, value: &OsStr) -> Result<(), String> {
        let (_, warnings) = Config::parse([(OsString::from(self.var), value.to_owned())]);
        match warnings.iter().find_map(|w| w.strip_suffix(USING_DEFAULT)) {
            Some(bad) => Err(bad.to_string()),
            None => Ok(()),
        }
    }
}

impl TypedValueParser for ShimSetting {
    type Value = String;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<String, clap::Error> {
        // A fn's errors are what clap reports as "invalid value 'X' for '--opt <V>': why".
        let me = self.clone();
        let check = move |v: &str| me.check(OsStr::new(v)).map(|()| v.to_string());
        check.parse_ref(cmd, arg, value)
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        if self.values.is_empty() {
            return None;
        }
        Some(Box::new(self.values.iter().map(PossibleValue::new)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn definitions_are_consistent() {
        parser().debug_assert();
    }

    #[test]
    fn watch_joins_only_an_interval() {
        let j = |v: &[&str]| {
            join_watch_interval(v.iter().map(OsString::from).collect())
                .into_iter()
                .map(|s| s.into_string().unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            j(&["rsock", "stat", "--watch", "2"]),
            ["rsock", "stat", "--watch=2"]
        );
        assert_eq!(
            j(&["rsock", "stat", "--watch", "0.5", "7"]),
            ["rsock", "stat", "--watch=0.5", "7"]
        );
        assert_eq!(
            j(&["rsock", "stat", "--watch", "1234"]),
            ["rsock", "stat", "--watch", "1234"]
        );
        assert_eq!(
            j(&["rsock", "stat", "--watch", "0"]),
            ["rsock", "stat", "--watch=0"]
        );
        assert_eq!(
            j(&["rsock", "stat", "--", "--watch", "2"]),
            ["rsock", "stat", "--", "--watch", "2"]
        );
        assert_eq!(
            j(&["rsock", "run", "--watch", "2"]),
            ["rsock", "run", "--watch", "2"]
        );
    }
}
