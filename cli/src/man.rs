//! Man pages and shell completions, generated from the clap definitions of `args.rs`
//! ([`Cli`]: the public commands only, never the hidden ones).
//!
//! `rsock __man DIR` (hidden; `make install` runs it) writes rsock.1, the main page, and one
//! page per command, rsock-COMMAND.1. Their NAME, SYNOPSIS, DESCRIPTION, OPTIONS and EXIT
//! STATUS come from the definitions (clap_mangen renders the options); the main page adds
//! what no option says (environment, files, notes, examples), kept here in roff.
//! `rsock completions SHELL` prints clap_complete's script for bash, zsh or fish.

use crate::args::{Cli, Shell};
use clap::CommandFactory as _;
use clap_mangen::roff::{bold, italic, roman, Inline, Roff};
use clap_mangen::Man;
use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;

/// `rsock completions SHELL`.
pub fn completions(shell: Shell) -> ExitCode {
    use clap_complete::shells::{Bash, Fish, Zsh};
    let (mut cmd, mut script) = (Cli::command(), Vec::new());
    // Each generator by name, not clap_complete::Shell: only these three are linked in.
    match shell {
        Shell::Bash => clap_complete::generate(Bash, &mut cmd, "rsock", &mut script),
        Shell::Zsh => clap_complete::generate(Zsh, &mut cmd, "rsock", &mut script),
        Shell::Fish => clap_complete::generate(Fish, &mut cmd, "rsock", &mut script),
    }
    if let Shell::Bash = shell {
        script.extend_from_slice(BASH_EXTRAS.as_bytes());
    }
    crate::out::print(format_args!("{}", String::from_utf8_lossy(&script)));
    ExitCode::SUCCESS
}

/// What clap_complete's bash script cannot know, in front of it: the PIDs `stat` and `log`
/// take (processes with a stats region: the user's, root's, `RSOCK_STATS_DIR`'s), and after
/// `rsock run [OPTIONS] PROGRAM`, PROGRAM's own completion (bash-completion's
/// `_command_offset`). The options of `run` that take a value are listed here by hand; a
/// test checks the list against the parser.
const BASH_EXTRAS: &str = r#"
# rsock's additions to the generated script: PIDs for `stat` and `log`, and PROGRAM's own
# completion after `rsock run [OPTIONS] PROGRAM`.
_rsock_pids() {
    local f b
    for f in ${RSOCK_STATS_DIR:+"$RSOCK_STATS_DIR"/*.stats} /dev/shm/rsock-*/*.stats; do
        [[ -e $f ]] || continue
        b=${f##*/}
        echo "${b%.stats}"
    done
}

_rsock_with_extras() {
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} i sub='' at=0
    for ((i = 1; i < COMP_CWORD; i++)); do
        case ${COMP_WORDS[i]} in
            -*) ;;
            *) sub=${COMP_WORDS[i]}; at=$i; break ;;
        esac
    done
    case $sub in
        run)
            local prog='' skip=0
            for ((i = at + 1; i < COMP_CWORD; i++)); do
                if ((skip)); then skip=0; continue; fi
                case ${COMP_WORDS[i]} in
                    --) prog=$((i + 1)); break ;;
                    --log | --log-level | --exclude | --config | --spin-us) skip=1 ;;
                    -*) ;;
                    *) prog=$i; break ;;
                esac
            done
            if [[ -n $prog ]] && ((COMP_CWORD > prog)) && declare -F _command_offset >/dev/null; then
                _command_offset "$prog"
                return
            fi
            if { [[ -n $prog ]] && ((COMP_CWORD == prog)); } ||
                { [[ -z $prog ]] && ((!skip)) && [[ $cur != -* ]]; }; then
                mapfile -t COMPREPLY < <(compgen -c -- "$cur")
                return
            fi
            ;;
        stat | log)
            [[ $cur == -* || $prev == --dir || $prev == --watch || $prev == --count ]] && { _rsock "$@"; return; }
            local given=0
            for ((i = at + 1; i < COMP_CWORD; i++)); do
                case ${COMP_WORDS[i]} in
                    --dir) ((i++)) ;;
                    -*) ;;
                    *) ((given++)) ;;
                esac
            done
            # `stat` takes any number of PIDs; `log` one, then a level.
            if [[ $sub == stat ]] || ((given == 0)); then
                mapfile -t COMPREPLY < <(compgen -W "$(_rsock_pids)" -- "$cur")
                return
            fi
            ;;
    esac
    _rsock "$@"
}

complete -F _rsock_with_extras -o nosort -o bashdefault -o default rsock
"#;

/// `rsock __man DIR`: the pages into DIR (created if need be), mode 0644 whatever the umask
/// (`make install` runs it as root), each path on stdout.
pub fn write_pages(dir: &Path) -> ExitCode {
    use std::os::unix::fs::PermissionsExt as _;
    let written = std::fs::create_dir_all(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))
        .and_then(|()| {
            pages()
                .into_iter()
                .map(|(name, text)| {
                    let path = dir.join(name);
                    std::fs::File::create(&path)
                        .and_then(|mut f| {
                            f.write_all(text.as_bytes())?;
                            f.set_permissions(std::fs::Permissions::from_mode(0o644))
                        })
                        .map_err(|e| format!("{}: {e}", path.display()))
                        .map(|()| path)
                })
                .collect::<Result<Vec<_>, String>>()
        });
    match written {
        Ok(paths) => {
            for p in paths {
                crate::out::outln!("{}", p.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rsock: cannot write the man pages: {e}");
            ExitCode::from(1)
        }
    }
}

/// Every page, (file name, roff source): rsock.1 first, then one per command.
pub fn pages() -> Vec<(String, String)> {
    let mut cmd = Cli::command();
    cmd.build();
    let mut pages = vec![("rsock.1".to_string(), main_page(&cmd))];
    for sub in commands(&cmd) {
        pages.push((
            format!("rsock-{}.1", sub.get_name()),
            command_page(&cmd, sub),
        ));
    }
    pages
}

/// The commands with a page of their own: all but `help` (and the hidden ones, which `Cli`
/// does not have).
fn commands(cmd: &clap::Command) -> impl Iterator<Item = &clap::Command> {
    cmd.get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
}

fn version() -> String {
    format!("rsock {}", env!("CARGO_PKG_VERSION"))
}

/// A page's sections, in order. `Man`'s parts are rendered one by one, each after the same
/// preamble, which the page has once.
struct Page {
    text: String,
}

impl Page {
    /// The preamble and the title line. (Not `Man::render_title`: its empty date argument
    /// disappears from the .TH line, and the arguments after it move up one.)
    fn new(title: &str) -> Page {
        Page {
            text: format!(
                "{}.TH {title} 1 \"\" \"{}\" \"User Commands\"\n",
                Roff::new().render(),
                version()
            ),
        }
    }

    fn man(&mut self, part: impl FnOnce(&mut Vec<u8>) -> std::io::Result<()>) {
        let mut buf = Vec::new();
        part(&mut buf).expect("writing to a Vec");
        let text = String::from_utf8(buf).expect("roff is UTF-8");
        let preamble = Roff::new().render();
        self.text
            .push_str(text.strip_prefix(&preamble).unwrap_or(&text));
    }

    fn roff(&mut self, r: &Roff) {
        self.text.push_str(&r.to_roff());
    }

    fn raw(&mut self, roff: &str) {
        self.text.push_str(roff);
    }
}

/// A usage line in roff: command names and options bold, placeholders italic.
fn usage_inlines(line: &str) -> Vec<Inline> {
    let mut out = Vec::new();
    let mut plain = String::new();
    let mut chars = line.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let word = |chars: &mut std::iter::Peekable<std::str::CharIndices>,
                    ok: fn(char) -> bool| {
            let mut end = i + c.len_utf8();
            while let Some(&(j, d)) = chars.peek() {
                if !ok(d) {
                    break;
                }
                end = j + d.len_utf8();
                chars.next();
            }
            line[i..end].to_string()
        };
        let inline = if c == '-' {
            bold(word(&mut chars, |d| d == '-' || d.is_ascii_lowercase()))
        } else if c.is_ascii_uppercase() {
            italic(word(&mut chars, |d| d.is_ascii_uppercase() || d == '_'))
        } else if c.is_ascii_lowercase() {
            bold(word(&mut chars, |d| d.is_ascii_lowercase() || d == '-'))
        } else {
            plain.push(c);
            continue;
        };
        if !plain.is_empty() {
            out.push(roman(std::mem::take(&mut plain)));
        }
        out.push(inline);
    }
    if !plain.is_empty() {
        out.push(roman(plain));
    }
    out
}

/// SYNOPSIS: `cmd`'s usage, a line per form.
fn synopsis(cmd: &clap::Command) -> Roff {
    let usage = cmd.clone().render_usage().to_string();
    let usage = usage.strip_prefix("Usage: ").unwrap_or(&usage);
    let mut r = Roff::new();
    r.control("SH", ["SYNOPSIS"]);
    for (n, line) in usage.lines().enumerate() {
        if n > 0 {
            r.control("br", []);
        }
        r.text(usage_inlines(line.trim()));
    }
    r
}

fn exit_status(r: &mut Roff, name: &str) {
    if let Some(text) = crate::args::exit_status(name) {
        r.text([roman(text.replace('\n', " "))]);
    }
}

/// SEE ALSO: the other pages of rsock, then `others` (roff).
fn see_also(this: &str, cmd: &clap::Command, others: &str) -> String {
    let mut pages = vec!["rsock".to_string()];
    pages.extend(commands(cmd).map(|s| format!("rsock-{}", s.get_name())));
    let refs: Vec<String> = pages
        .into_iter()
        .filter(|p| p != this)
        .map(|p| format!(".BR {} (1)", p.replace('-', "\\-")))
        .collect();
    format!(".SH SEE ALSO\n{}{others}\n", refs.join(",\n"))
}

fn main_page(cmd: &clap::Command) -> String {
    let man = Man::new(cmd.clone());
    let mut page = Page::new("RSOCK");
    page.man(|w| man.render_name_section(w));
    page.roff(&synopsis(cmd));
    page.man(|w| man.render_description_section(w));

    let mut r = Roff::new();
    r.control("SH", ["COMMANDS"]);
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = sub.get_name();
        r.control("TP", []);
        r.text([bold(format!("rsock {name}"))]);
        let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
        if name == "help" {
            r.text([roman(format!("{about}."))]);
        } else {
            r.text([
                roman(format!("{about}; see ")),
                bold(format!("rsock-{name}")),
                roman("(1)."),
            ]);
        }
    }
    page.roff(&r);
    page.man(|w| man.render_options_section(w));

    let mut r = Roff::new();
    r.control("SH", ["EXIT STATUS"]);
    for sub in commands(cmd) {
        r.control("TP", []);
        r.text([bold(format!("rsock {}", sub.get_name()))]);
        exit_status(&mut r, sub.get_name());
    }
    page.roff(&r);
    page.raw(MAIN_PAGE_PROSE);
    page.raw(&see_also("rsock", cmd, MAIN_PAGE_SEE_ALSO));
    page.text
}

fn command_page(root: &clap::Command, sub: &clap::Command) -> String {
    let name = format!("rsock-{}", sub.get_name());
    let man = Man::new(sub.clone());
    let mut page = Page::new(&name.to_uppercase());
    page.man(|w| man.render_name_section(w));
    page.roff(&synopsis(sub));
    page.man(|w| man.render_description_section(w));
    page.man(|w| man.render_options_section(w));
    let mut r = Roff::new();
    r.control("SH", ["EXIT STATUS"]);
    exit_status(&mut r, sub.get_name());
    page.roff(&r);
    page.raw(&see_also(&name, root, ""));
    page.text
}

/// The main page's sections that no definition holds (roff).
const MAIN_PAGE_PROSE: &str = r#"
.SH ENVIRONMENT
Read by the shim once per process, when it opens its first TCP socket. A malformed value
is reported in the log and replaced by its default; it never stops the program.
.TP
.B RSOCK_ENABLE
0: pure passthrough, no socket tracked (default 1).
.TP
.B RSOCK_LOG
file the shim appends its log to (default: no log, until
.B rsock log
asks for one).
.TP
.B RSOCK_LOG_LEVEL
.BR off ", " error ", " warn ", " info " (default), " debug ", " trace .
.TP
.B RSOCK_CONFIG
the rules file (default
.B /etc/rsock.conf
if it exists; empty: none).
.TP
.B RSOCK_EXCLUDE
destinations that never try RDMA: comma-separated
.IR ADDR [/ PREFIX ],
.BI port= N\fR,
.BI port= N\-M
(default
.BR 127.0.0.0/8,::1/128 ;
empty: none).
.TP
.B RSOCK_RDMA
0: no connection tries RDMA; they are tracked and counted as
.B tcp
(default 1).
.TP
.B RSOCK_CONNECT_TIMEOUT_MS
how long
.BR connect ()
tries RDMA before kernel TCP (default 500).
.TP
.B RSOCK_SPIN_US
the longest a blocking call polls the completion queue before sleeping (default 400; 0:
never).
.TP
.BR RSOCK_STATS ", " RSOCK_STATS_DIR ", " RSOCK_STATS_KEEP ", " RSOCK_STATS_SLOTS
the stats file: on or off, its directory (absolute), whether it is kept after the process
exits, how many live connections it lists.
.TP
.B RSOCK_LIB
read by
.B rsock run
only: the shim to preload.
.PP
The other settings (buffer sizes, credits, pinned-memory bound, take-over) are described in
docs/CONFIGURATION.md in the rsock sources.
.SH FILES
.TP
.B /etc/rsock.conf
the rules file read when
.B RSOCK_CONFIG
is unset: one rule per line,
.IB ACTION " [" KEY = VALUE "]..."
with
.I ACTION
.BR rdma ", " tcp " or " passthrough .
The installed file has examples only, commented out.
.TP
.IB PREFIX /lib/rsock/librsock.so
the shim.
.TP
.BI /dev/shm/rsock\- UID /
the stats files of a user's processes (directory mode 0700, files 0600), and
.IB PID .log
for a process whose log
.B rsock log
turned on.
.SH NOTES
RDMA registers (pins) memory: a process needs a locked-memory limit
.RB ( "ulimit \-l" ,
systemd's
.BR LimitMEMLOCK= )
large enough for its connections, or they fall back to kernel TCP.
.PP
librsock.so loaded twice in one process (a copy in
.B LD_PRELOAD
plus
.BR "rsock run" )
serves with the copy loaded first; the other stays inert and says so in the log.
.SH EXAMPLES
.nf
rsock run \-\- iperf3 \-s
rsock run \-\-config rules.conf \-\-log /tmp/rsock.log \-\-log\-level debug \-\- nc \-l 10.0.0.1 5000
rsock run \-\-no\-rdma \-\- ./client
rsock stat \-\-watch 0.5
rsock log 1234 debug
rsock rules /etc/rsock.conf
rsock check 10.0.0.2:5000
rsock completions bash > ~/.local/share/bash-completion/completions/rsock
.fi
"#;

/// After the pages of rsock in SEE ALSO (roff).
const MAIN_PAGE_SEE_ALSO: &str = r#",
.BR ld.so (8),
.BR rdma_cm (7),
.BR ibv_devices (1)
.PP
README.md and docs/ (USAGE.md, CONFIGURATION.md, LIMITATIONS.md, DESIGN.md, PROTOCOL.md) in
the rsock sources."#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_lines_are_marked_up() {
        let r: Vec<Inline> = usage_inlines("rsock stat [--watch [SECS]] [PID...]");
        assert_eq!(
            r,
            [
                bold("rsock"),
                roman(" "),
                bold("stat"),
                roman(" ["),
                bold("--watch"),
                roman(" ["),
                italic("SECS"),
                roman("]] ["),
                italic("PID"),
                roman("...]"),
            ]
        );
    }
}
