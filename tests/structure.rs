//! The shape of the code, checked: no circle of imports between sibling modules, every
//! file opens with a comment saying its job, no file under `src/engine` or `src/api` over
//! 700 lines, and libc called only from `src/sys` (test code aside). docs/DESIGN.md's "Map
//! of the code" relies on these; a change that breaks one says so here.
//!
//! The import graph is read from the source text: `crate::…` and `super::…` paths (brace
//! groups one level deep), comments and test code left out, each resolved to the longest
//! module it names. A module and its own ancestors or descendants may use each other (a
//! parent declares its children); siblings and strangers may not go round in a circle.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 700;

struct File {
    path: PathBuf,
    /// The text with comments and the trailing test module removed.
    code: String,
    lines: usize,
    first_line: String,
    /// Declared under `#[cfg(test)]` or named `tests.rs`: test code.
    test_only: bool,
}

/// Module path (`engine::stream::life`) → its file.
fn modules() -> BTreeMap<String, File> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    walk(&root, &mut paths);
    let mut out = BTreeMap::new();
    for p in paths {
        let rel = p.strip_prefix(&root).unwrap().with_extension("");
        let mut name = rel.to_string_lossy().replace('/', "::");
        if name == "lib" {
            name = String::new();
        } else if let Some(parent) = name.strip_suffix("::mod") {
            name = parent.to_string();
        }
        let text = fs::read_to_string(&p).unwrap();
        out.insert(
            name,
            File {
                lines: text.lines().count(),
                first_line: text.lines().next().unwrap_or("").to_string(),
                code: strip(&text),
                test_only: p.file_name().is_some_and(|n| n == "tests.rs"),
                path: p,
            },
        );
    }
    // Files declared as `#[cfg(test)] mod x;` (and everything below them) are test code.
    let test_mods: Vec<String> = out
        .iter()
        .flat_map(|(name, f)| {
            let raw = fs::read_to_string(&f.path).unwrap();
            let lines: Vec<&str> = raw.lines().map(str::trim).collect();
            let mut found = Vec::new();
            for w in lines.windows(2) {
                if w[0] == "#[cfg(test)]" {
                    if let Some(m) = w[1].strip_prefix("mod ").and_then(|m| m.strip_suffix(';')) {
                        found.push(join(name, m));
                    }
                }
            }
            found
        })
        .collect();
    for (name, f) in out.iter_mut() {
        if test_mods
            .iter()
            .any(|t| name == t || name.starts_with(&format!("{t}::")))
        {
            f.test_only = true;
        }
    }
    out
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            walk(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn join(parent: &str, child: &str) -> String {
    if parent.is_empty() {
        child.to_string()
    } else {
        format!("{parent}::{child}")
    }
}

/// `text` without comments (line comments; doc comments are line comments too) and without
/// the test module that ends a file by convention.
fn strip(text: &str) -> String {
    let end = text.find("#[cfg(test)]\nmod tests").unwrap_or(text.len());
    text[..end]
        .lines()
        .map(|l| match l.find("//") {
            // A `//` inside a string literal ("http://") is rare in this code and would only
            // hide a path, never invent one.
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every `crate::…`/`super::…` path in `code`, as segments (brace groups expanded once).
fn paths_in(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let is_ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i < bytes.len() {
        let starts = (code[i..].starts_with("crate::") || code[i..].starts_with("super::"))
            && (i == 0 || !is_ident(bytes[i - 1]));
        if !starts {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < bytes.len() && (is_ident(bytes[j]) || code[j..].starts_with("::")) {
            j += if bytes[j] == b':' { 2 } else { 1 };
        }
        let head: Vec<String> = code[i..j]
            .split("::")
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect();
        if code[j..].starts_with('{') {
            let close = code[j..].find('}').map_or(code.len(), |k| j + k);
            for item in code[j + 1..close].split(',') {
                let item = item.split_whitespace().next().unwrap_or("");
                let mut p = head.clone();
                p.extend(item.split("::").filter(|s| !s.is_empty()).map(String::from));
                out.push(p);
            }
            i = close;
        } else {
            out.push(head);
            i = j;
        }
    }
    out
}

/// The module `path` (as written in module `from`) refers to, if it names one.
fn resolve(from: &str, path: &[String], mods: &BTreeMap<String, File>) -> Option<String> {
    let mut cur: Vec<&str> = if from.is_empty() {
        vec![]
    } else {
        from.split("::").collect()
    };
    let mut rest = path;
    if rest.first().is_some_and(|s| s == "crate") {
        cur.clear();
        rest = &rest[1..];
    }
    while rest.first().is_some_and(|s| s == "super") {
        cur.pop();
        rest = &rest[1..];
    }
    let mut full: Vec<&str> = cur;
    full.extend(rest.iter().map(String::as_str).filter(|s| *s != "self"));
    (1..=full.len())
        .rev()
        .map(|k| full[..k].join("::"))
        .find(|m| mods.contains_key(m))
}

fn related(a: &str, b: &str) -> bool {
    a == b
        || a.is_empty()
        || b.is_empty()
        || a.starts_with(&format!("{b}::"))
        || b.starts_with(&format!("{a}::"))
}

/// An edge between `a` and `b` lifted to the children of their closest common ancestor:
/// `engine::stream::pump` → `stats` counts as `engine` → `stats`.
fn siblings(a: &str, b: &str) -> (String, String) {
    let (sa, sb): (Vec<&str>, Vec<&str>) = (a.split("::").collect(), b.split("::").collect());
    let k = sa.iter().zip(&sb).take_while(|(x, y)| x == y).count();
    (sa[..=k].join("::"), sb[..=k].join("::"))
}

/// Circles among modules, each with one edge's evidence per step.
fn circles(mods: &BTreeMap<String, File>) -> Vec<Vec<String>> {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (name, f) in mods.iter().filter(|(_, f)| !f.test_only) {
        for p in paths_in(&f.code) {
            if let Some(to) = resolve(name, &p, mods) {
                if !related(name, &to) && !mods[&to].test_only {
                    let (a, b) = siblings(name, &to);
                    edges.entry(a).or_default().insert(b);
                }
            }
        }
    }
    // Tarjan's strongly connected components, iteratively small enough to recurse.
    struct T<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<String, usize>,
        low: BTreeMap<String, usize>,
        stack: Vec<String>,
        on: BTreeSet<String>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit(t: &mut T, v: &str) {
        t.index.insert(v.into(), t.next);
        t.low.insert(v.into(), t.next);
        t.next += 1;
        t.stack.push(v.into());
        t.on.insert(v.into());
        let succ: Vec<String> = t
            .edges
            .get(v)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        for w in succ {
            if !t.index.contains_key(&w) {
                visit(t, &w);
                let lw = t.low[&w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on.contains(&w) {
                let iw = t.index[&w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = t.stack.pop().unwrap();
                t.on.remove(&w);
                let done = w == v;
                comp.push(w);
                if done {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        edges: &edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    let names: Vec<String> = edges.keys().cloned().collect();
    for v in names {
        if !t.index.contains_key(&v) {
            visit(&mut t, &v);
        }
    }
    t.out
}

#[test]
fn no_circle_of_imports() {
    let found = circles(&modules());
    assert!(
        found.is_empty(),
        "modules that import each other in a circle: {found:?}"
    );
}

#[test]
fn the_circle_check_sees_a_circle() {
    let mut mods = BTreeMap::new();
    for (name, code) in [
        ("a", "use crate::b::X;"),
        ("b", "use super::{a::Y, c};"),
        ("c", "fn f() { crate::d::g() }"),
        ("d", "// use crate::a;\nfn g() {}"),
        ("d::e", "use crate::c;"),
    ] {
        mods.insert(
            name.to_string(),
            File {
                path: PathBuf::new(),
                code: strip(code),
                lines: 1,
                first_line: String::new(),
                test_only: false,
            },
        );
    }
    let found = circles(&mods);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found.contains(&vec!["a".to_string(), "b".to_string()]));
    // d::e → c lifts to d → c; with c → d that is a circle between siblings c and d.
    assert!(found.contains(&vec!["c".to_string(), "d".to_string()]));
}

#[test]
fn every_file_says_its_job_first() {
    let missing: Vec<_> = modules()
        .into_values()
        .filter(|f| !f.first_line.starts_with("//!"))
        .map(|f| f.path)
        .collect();
    assert!(
        missing.is_empty(),
        "files without an opening //! comment: {missing:?}"
    );
}

#[test]
fn engine_and_api_files_fit_one_sitting() {
    let long: Vec<_> = modules()
        .into_iter()
        .filter(|(name, f)| {
            (name.starts_with("engine") || name.starts_with("api")) && f.lines > MAX_LINES
        })
        .map(|(name, f)| format!("{name}: {} lines", f.lines))
        .collect();
    assert!(long.is_empty(), "over {MAX_LINES} lines: {long:?}");
}

#[test]
fn libc_is_called_from_sys_only() {
    let calls: Vec<_> = modules()
        .into_iter()
        .filter(|(name, f)| !name.starts_with("sys") && !f.test_only)
        .flat_map(|(name, f)| {
            let code = f.code;
            code.match_indices("libc::")
                .filter_map(|(i, _)| {
                    let rest = &code[i + 6..];
                    let id: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    rest[id.len()..]
                        .trim_start()
                        .starts_with('(')
                        .then(|| format!("{name}: libc::{id}"))
                })
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(calls.is_empty(), "libc called outside src/sys: {calls:?}");
}
