//! The rules file (`RSOCK_CONFIG`, default `/etc/rsock.conf`): which connections try RDMA.
//!
//! One rule per line, `ACTION [KEY=VALUE]...`; the first rule whose conditions all hold
//! decides. Parsing is a pure function of the file's bytes: a line that does not parse is
//! reported (with its number) and skipped, never a panic, so a bad file can't break the
//! host program. Matching allocates nothing; it runs on every `connect()` and `listen()`.
//!
//! ```text
//! # ACTION       CONDITIONS...                          OPTIONS...
//! tcp            port=5432                              # tracked, never tries RDMA
//! passthrough    prog=sshd
//! rdma           remote=10.0.0.0/8 port=5000-5999       ring=1M sndbuf=512K
//! rdma           role=server local=10.77.0.1 port=7000
//! ```

use std::fmt;
use std::net::{IpAddr, SocketAddr};

/// What a rule does with a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Try RDMA, fall back to kernel TCP.
    Rdma,
    /// Kernel TCP, tracked and counted (path `tcp`, reason `rule`); never tries RDMA.
    Tcp,
    /// Kernel TCP, counted as `passthrough` (as `RSOCK_EXCLUDE` does).
    Passthrough,
}

impl Action {
    /// The keyword in the rules file.
    pub fn name(self) -> &'static str {
        match self {
            Action::Rdma => "rdma",
            Action::Tcp => "tcp",
            Action::Passthrough => "passthrough",
        }
    }
}

/// Which side of a connection the program is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `connect()`.
    Client,
    /// `listen()`.
    Server,
}

impl Role {
    /// The keyword in the rules file.
    pub fn name(self) -> &'static str {
        match self {
            Role::Client => "client",
            Role::Server => "server",
        }
    }
}

/// An address block, `ADDR[/PREFIX]`. IPv4-mapped IPv6 addresses match as IPv4.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Net {
    /// Network address (bits beyond the prefix are ignored).
    pub addr: IpAddr,
    /// Prefix length: 0–32 for IPv4, 0–128 for IPv6.
    pub prefix: u8,
}

impl Net {
    /// Parses `ADDR` (a host) or `ADDR/PREFIX`.
    pub fn parse(s: &str) -> Option<Net> {
        let (addr, prefix) = s.split_once('/').map_or((s, None), |(a, p)| (a, Some(p)));
        let addr: IpAddr = addr.parse().ok()?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) if p.bytes().all(|b| b.is_ascii_digit()) => {
                p.parse().ok().filter(|&p| p <= max)?
            }
            Some(_) => return None,
            None => max,
        };
        Some(Net { addr, prefix })
    }

    /// Whether `ip` is in this block.
    pub fn contains(&self, ip: IpAddr) -> bool {
        crate::addr::prefix_match(self.addr, crate::addr::canonical(ip), self.prefix)
    }
}

impl fmt::Display for Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// A program name pattern: exact, or a prefix when it ends in `*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prog(pub String);

impl Prog {
    fn matches(&self, name: &str) -> bool {
        match self.0.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => name == self.0,
        }
    }
}

/// One line of the rules file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Line number in the file (1-based), for the log.
    pub line: u32,
    /// What to do with a matching connection.
    pub action: Action,
    /// `prog=NAME` or `prog=PREFIX*`: the program's name (basename of argv[0]).
    pub prog: Option<Prog>,
    /// `role=client|server`.
    pub role: Option<Role>,
    /// `local=ADDR[/PREFIX]`: a server's listening address. (A client's own address is
    /// chosen by the kernel during `connect()`, after the decision: a client never matches.)
    pub local: Option<Net>,
    /// `remote=ADDR[/PREFIX]`: the destination of a client's connect.
    pub remote: Option<Net>,
    /// `port=N` or `port=N-M`: the service port — the destination port of a client, the
    /// listening port of a server.
    pub ports: Option<(u16, u16)>,
    /// `ring=SIZE`: bytes of the receive ring of connections this rule sends to RDMA.
    pub ring_size: Option<u32>,
    /// `sndbuf=SIZE`: bytes of their registered send buffer.
    pub send_buf: Option<u32>,
}

/// Smallest and largest `ring=`/`sndbuf=` (the same bounds as `RSOCK_RING_SIZE`).
pub const SIZE_MIN: u32 = 4096;
/// See [`SIZE_MIN`].
pub const SIZE_MAX: u32 = 1 << 30;
/// Lines beyond this many rules are reported and ignored (keeps matching cheap).
pub const MAX_RULES: usize = 1024;
/// Bytes of the rules file read at most.
pub const MAX_FILE: usize = 1 << 20;
/// Problems reported one by one; the rest are counted in one last message (a file of junk
/// must not flood the log).
pub const MAX_PROBLEMS: usize = 32;

impl Rule {
    /// Whether the connection described matches every condition of this rule.
    pub fn matches(
        &self,
        prog: &str,
        role: Role,
        local: Option<SocketAddr>,
        remote: Option<SocketAddr>,
    ) -> bool {
        let service = match role {
            Role::Client => remote,
            Role::Server => local,
        };
        let holds = |a: Option<SocketAddr>, n: &Net| a.is_some_and(|a| n.contains(a.ip()));
        unset_or(self.prog.as_ref(), |p| p.matches(prog))
            && unset_or(self.role, |r| r == role)
            && unset_or(self.local, |n| holds(local, &n))
            && unset_or(self.remote, |n| holds(remote, &n))
            && unset_or(self.ports, |(a, b)| {
                service.is_some_and(|s| (a..=b).contains(&s.port()))
            })
    }

    /// Parses one line (without its newline); `Ok(None)` for a blank or comment line.
    pub fn parse(line_no: u32, line: &str) -> Result<Option<Rule>, String> {
        let line = line.split_once('#').map_or(line, |(code, _)| code);
        let mut words = line.split_ascii_whitespace();
        let Some(action) = words.next() else {
            return Ok(None);
        };
        let action = match action {
            "rdma" => Action::Rdma,
            "tcp" => Action::Tcp,
            "passthrough" => Action::Passthrough,
            other => {
                return Err(format!(
                    "unknown action {:?} (expected rdma, tcp or passthrough)",
                    clip(other)
                ))
            }
        };
        let mut r = Rule {
            line: line_no,
            action,
            prog: None,
            role: None,
            local: None,
            remote: None,
            ports: None,
            ring_size: None,
            send_buf: None,
        };
        for word in words {
            let Some((key, value)) = word.split_once('=') else {
                return Err(format!("expected KEY=VALUE, got {:?}", clip(word)));
            };
            let bad = |what: &str| format!("{key}={:?}: expected {what}", clip(value));
            let fresh = match key {
                "prog" if value.is_empty() || value.contains('/') => {
                    return Err(bad("a program name"))
                }
                "prog" => r.prog.replace(Prog(value.to_string())).is_none(),
                "role" => {
                    let role = match value {
                        "client" => Role::Client,
                        "server" => Role::Server,
                        _ => return Err(bad("client or server")),
                    };
                    r.role.replace(role).is_none()
                }
                "local" => r
                    .local
                    .replace(Net::parse(value).ok_or_else(|| bad("ADDR[/PREFIX]"))?)
                    .is_none(),
                "remote" => r
                    .remote
                    .replace(Net::parse(value).ok_or_else(|| bad("ADDR[/PREFIX]"))?)
                    .is_none(),
                "port" => r
                    .ports
                    .replace(parse_ports(value).ok_or_else(|| bad("N or N-M, 0-65535"))?)
                    .is_none(),
                "ring" => r
                    .ring_size
                    .replace(parse_size(value).ok_or_else(|| bad(SIZE_RANGE))?)
                    .is_none(),
                "sndbuf" => r
                    .send_buf
                    .replace(parse_size(value).ok_or_else(|| bad(SIZE_RANGE))?)
                    .is_none(),
                _ => {
                    return Err(format!(
                    "unknown key {:?} (expected prog, role, local, remote, port, ring or sndbuf)",
                    clip(key)
                ))
                }
            };
            if !fresh {
                return Err(format!("{key} given twice"));
            }
        }
        Ok(Some(r))
    }
}

/// A condition left out holds; one given must hold. (`Option::is_none_or`, Rust 1.82, is
/// newer than the MSRV.)
fn unset_or<T>(condition: Option<T>, holds: impl FnOnce(T) -> bool) -> bool {
    match condition {
        Some(c) => holds(c),
        None => true,
    }
}

const SIZE_RANGE: &str = "a size from 4096 to 1G (suffix K, M or G)";

/// Long junk in a message is cut: the log line has a fixed size.
fn clip(s: &str) -> &str {
    match s.char_indices().nth(40) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

fn parse_ports(s: &str) -> Option<(u16, u16)> {
    let (a, b) = s.split_once('-').unwrap_or((s, s));
    let num = |x: &str| {
        x.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| x.parse::<u16>().ok())
            .flatten()
    };
    let (a, b) = (num(a)?, num(b)?);
    (a <= b).then_some((a, b))
}

/// `N`, `NK`, `NM` or `NG` (powers of 1024), within [`SIZE_MIN`]..=[`SIZE_MAX`].
pub fn parse_size(s: &str) -> Option<u32> {
    let (digits, unit) = match s.as_bytes().last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 1u64 << 10),
        b'm' | b'M' => (&s[..s.len() - 1], 1 << 20),
        b'g' | b'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit()) || digits.len() > 10 {
        return None;
    }
    let n = digits.parse::<u64>().ok()?.checked_mul(unit)?;
    (SIZE_MIN as u64..=SIZE_MAX as u64)
        .contains(&n)
        .then_some(n as u32)
}

/// Formats a size the way [`parse_size`] reads it back.
fn fmt_size(n: u32) -> String {
    match n {
        n if n % (1 << 30) == 0 => format!("{}G", n >> 30),
        n if n % (1 << 20) == 0 => format!("{}M", n >> 20),
        n if n % (1 << 10) == 0 => format!("{}K", n >> 10),
        n => n.to_string(),
    }
}

impl fmt::Display for Rule {
    /// The rule as a line of the rules file (parses back to the same rule).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.action.name())?;
        if let Some(p) = &self.prog {
            write!(f, " prog={}", p.0)?;
        }
        if let Some(r) = self.role {
            write!(f, " role={}", r.name())?;
        }
        if let Some(n) = self.local {
            write!(f, " local={n}")?;
        }
        if let Some(n) = self.remote {
            write!(f, " remote={n}")?;
        }
        match self.ports {
            Some((a, b)) if a == b => write!(f, " port={a}")?,
            Some((a, b)) => write!(f, " port={a}-{b}")?,
            None => {}
        }
        if let Some(n) = self.ring_size {
            write!(f, " ring={}", fmt_size(n))?;
        }
        if let Some(n) = self.send_buf {
            write!(f, " sndbuf={}", fmt_size(n))?;
        }
        Ok(())
    }
}

/// Parses a whole rules file: the rules in order, and one message per line ignored
/// (`line N: why`; after [`MAX_PROBLEMS`] of them, one message counting the rest).
pub fn parse(text: &[u8]) -> (Vec<Rule>, Vec<String>) {
    let mut rules = Vec::new();
    let mut problems = Vec::new();
    let mut unreported = 0usize;
    for (i, raw) in text.split(|&b| b == b'\n').enumerate() {
        let line_no = u32::try_from(i + 1).unwrap_or(u32::MAX);
        let parsed = match std::str::from_utf8(raw) {
            Ok(line) => Rule::parse(line_no, line.strip_suffix('\r').unwrap_or(line)),
            Err(_) => Err("not UTF-8".to_string()),
        };
        let problem = match parsed {
            Ok(None) => None,
            Ok(Some(_)) if rules.len() == MAX_RULES => Some(format!("more than {MAX_RULES} rules")),
            Ok(Some(rule)) => {
                rules.push(rule);
                None
            }
            Err(why) => Some(why),
        };
        match problem {
            Some(why) if problems.len() < MAX_PROBLEMS => {
                problems.push(format!("line {line_no}: {why}; line ignored"))
            }
            Some(_) => unreported += 1,
            None => {}
        }
    }
    if unreported > 0 {
        problems.push(format!("{unreported} more lines ignored"));
    }
    (rules, problems)
}

/// What to do with one connection: the outcome of [`Config::decide`](crate::config::Config::decide).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// The path to take.
    pub action: Action,
    /// Receive ring bytes for an RDMA connection (the rule's `ring=`, else `RSOCK_RING_SIZE`).
    pub ring_size: u32,
    /// Send buffer bytes (the rule's `sndbuf=`, else `RSOCK_SEND_BUF`).
    pub send_buf: u32,
    /// Line of the rule that decided, if one did.
    pub rule_line: Option<u32>,
    /// The `RSOCK_EXCLUDE` entry (counted from 1) that named the service address, if one did.
    pub exclude: Option<u32>,
    /// `RSOCK_RDMA=0` turned `rdma` into `tcp`.
    pub rdma_off: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(s: &str) -> Rule {
        Rule::parse(1, s).unwrap().unwrap()
    }
    fn sa(s: &str) -> Option<SocketAddr> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn parses_every_key() {
        let r = rule("rdma prog=nc role=server local=10.77.0.1 remote=fd00::/8 port=5000-5999 ring=1M sndbuf=512K");
        assert_eq!(r.action, Action::Rdma);
        assert_eq!(r.prog, Some(Prog("nc".into())));
        assert_eq!(r.role, Some(Role::Server));
        assert_eq!(r.local, Net::parse("10.77.0.1/32"));
        assert_eq!(r.remote.unwrap().prefix, 8);
        assert_eq!(r.ports, Some((5000, 5999)));
        assert_eq!((r.ring_size, r.send_buf), (Some(1 << 20), Some(512 << 10)));
        assert_eq!(rule("  tcp\tport=22   # ssh").ports, Some((22, 22)));
        assert_eq!(rule("passthrough").action, Action::Passthrough);
    }

    #[test]
    fn blank_and_comment_lines_are_not_rules() {
        for s in ["", "   ", "# rdma port=1", "\t# x"] {
            assert_eq!(Rule::parse(1, s), Ok(None), "{s:?}");
        }
    }

    #[test]
    fn malformed_lines_say_why() {
        for (s, why) in [
            ("rdmaa port=1", "unknown action"),
            ("rdma port", "KEY=VALUE"),
            ("rdma prot=1", "unknown key"),
            ("rdma port=70000", "port="),
            ("rdma port=9-1", "port="),
            ("rdma port=+5", "port="),
            ("rdma port=1 port=2", "twice"),
            ("rdma role=both", "client or server"),
            ("rdma local=10.0.0.0/33", "local="),
            ("rdma remote=host.example", "remote="),
            ("rdma remote=10.0.0.1/+8", "remote="),
            ("rdma ring=1K", "size"),
            ("rdma ring=2G", "size"),
            ("rdma sndbuf=12x", "size"),
            ("rdma prog=", "program name"),
            ("rdma prog=/usr/bin/nc", "program name"),
        ] {
            let e = Rule::parse(3, s).unwrap_err();
            assert!(e.contains(why), "{s:?}: {e}");
        }
    }

    #[test]
    fn file_reports_bad_lines_with_numbers_and_keeps_the_rest() {
        let (rules, problems) =
            parse(b"# rules\ntcp port=22\nbogus\n\nrdma remote=10.0.0.0/8\r\nrdma \xff\n");
        assert_eq!(rules.len(), 2);
        assert_eq!((rules[0].line, rules[1].line), (2, 5));
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(
            problems[0].starts_with("line 3: unknown action"),
            "{problems:?}"
        );
        assert!(problems[1].starts_with("line 6: not UTF-8"), "{problems:?}");
    }

    #[test]
    fn too_many_rules_are_cut() {
        let text = "tcp port=1\n".repeat(MAX_RULES + 2);
        let (rules, problems) = parse(text.as_bytes());
        assert_eq!(rules.len(), MAX_RULES);
        assert_eq!(problems.len(), 2);
        assert!(
            problems[0].starts_with("line 1025: more than 1024 rules"),
            "{problems:?}"
        );
    }

    #[test]
    fn a_file_of_junk_is_reported_in_bounded_messages() {
        let (rules, problems) = parse("junk\n".repeat(10_000).as_bytes());
        assert!(rules.is_empty());
        assert_eq!(problems.len(), MAX_PROBLEMS + 1);
        assert_eq!(
            problems[MAX_PROBLEMS],
            format!("{} more lines ignored", 10_000 - MAX_PROBLEMS)
        );
    }

    #[test]
    fn matching() {
        let r = rule("tcp port=5432");
        assert!(r.matches("psql", Role::Client, None, sa("10.0.0.1:5432")));
        assert!(r.matches("postgres", Role::Server, sa("0.0.0.0:5432"), None));
        assert!(
            !r.matches("psql", Role::Client, sa("10.0.0.2:5432"), sa("10.0.0.1:80")),
            "client port is the remote's"
        );
        let r = rule("rdma role=server local=10.77.0.0/24");
        assert!(r.matches("x", Role::Server, sa("10.77.0.1:1"), None));
        assert!(
            r.matches("x", Role::Server, sa("[::ffff:10.77.0.1]:1"), None),
            "a dual-stack socket bound to a mapped address"
        );
        assert!(!r.matches("x", Role::Client, sa("10.77.0.1:1"), sa("10.77.0.2:1")));
        assert!(!r.matches("x", Role::Server, sa("10.78.0.1:1"), None));
        assert!(
            !r.matches("x", Role::Server, None, None),
            "an unknown address never matches"
        );
        let r = rule("passthrough remote=10.0.0.0/8");
        assert!(
            r.matches("x", Role::Client, None, sa("[::ffff:10.1.2.3]:9")),
            "v4-mapped"
        );
        assert!(!r.matches("x", Role::Client, None, sa("[fd00::1]:9")));
        let r = rule("tcp prog=redis*");
        assert!(r.matches("redis-server", Role::Client, None, sa("1.1.1.1:1")));
        assert!(!r.matches("xredis", Role::Client, None, sa("1.1.1.1:1")));
        assert!(rule("tcp prog=nc").matches("nc", Role::Client, None, sa("1.1.1.1:1")));
        assert!(!rule("tcp prog=nc").matches("ncat", Role::Client, None, sa("1.1.1.1:1")));
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("4k"), Some(4096));
        assert_eq!(parse_size("1G"), Some(1 << 30));
        assert_eq!(parse_size("4095"), None);
        assert_eq!(parse_size("99999999999999999999"), None);
        assert_eq!(parse_size("K"), None);
        assert_eq!(parse_size(""), None);
        for n in [4096, 5000, 1 << 20, 3 << 30 >> 2, 1 << 30] {
            assert_eq!(parse_size(&fmt_size(n)), Some(n));
        }
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "rdma",
            "tcp prog=nc* role=client remote=10.0.0.0/8 port=1-2 ring=1M sndbuf=4100",
            "passthrough local=::1/128 port=80",
        ] {
            let r = rule(s);
            assert_eq!(rule(&r.to_string()), r, "{s}");
        }
    }

    proptest::proptest! {
        #[test]
        fn never_panics_and_round_trips(text in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            let (rules, _) = parse(&text);
            for r in rules {
                let again = Rule::parse(r.line, &r.to_string()).unwrap().unwrap();
                proptest::prop_assert_eq!(again, r);
            }
        }

        #[test]
        fn keyword_soup_never_panics(words in proptest::collection::vec(
            proptest::sample::select(vec!["rdma", "tcp", "passthrough", "port=", "port=1-", "port=65535",
                "ring=4K", "ring=", "local=1.2.3.4/", "remote=::/0", "prog=a*", "role=server", "=", "#", "x=y"]),
            0..8)) {
            let line = words.join(" ");
            if let Ok(Some(r)) = Rule::parse(1, &line) {
                proptest::prop_assert_eq!(Rule::parse(1, &r.to_string()), Ok(Some(r)));
            }
        }
    }
}
