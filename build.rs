//! Checks, before anything else compiles, that the build can work: rdma-sys (the verbs and
//! rdma_cm types) runs pkg-config and bindgen over rdma-core's headers at build time, and
//! without them fails deep inside its build script with a panic and a backtrace that names
//! at most one of the packages. This script has no dependencies, so cargo runs it within a
//! second of starting, and on a machine that lacks something it stops the build with one
//! line naming every Debian package to install.
//!
//! `RSOCK_SKIP_BUILD_CHECK=1` skips the check (headers or libclang in places it does not
//! look; rdma-sys then has the last word).

use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    for v in [
        "RSOCK_SKIP_BUILD_CHECK",
        "LIBCLANG_PATH",
        "PKG_CONFIG",
        "CPATH",
        "C_INCLUDE_PATH",
    ] {
        println!("cargo:rerun-if-env-changed={v}");
    }
    if std::env::var_os("RSOCK_SKIP_BUILD_CHECK").is_some_and(|v| v == "1") {
        return;
    }
    let mut missing: Vec<(&str, &str)> = Vec::new(); // (what, Debian package)
    if !pkg_config_present() {
        missing.push(("pkg-config", "pkg-config"));
    }
    for (header, package) in [
        ("infiniband/verbs.h", "libibverbs-dev"),
        ("rdma/rdma_cma.h", "librdmacm-dev"),
    ] {
        if !include_dirs().iter().any(|d| d.join(header).is_file()) {
            missing.push((header, package));
        }
    }
    match libclang() {
        Clang::Found => {}
        Clang::NoLibrary => missing.push(("libclang.so", "libclang-dev")),
        Clang::NoStddef => missing.push(("clang's stddef.h", "libclang-dev")),
    }
    if missing.is_empty() {
        return;
    }
    let what: Vec<&str> = missing.iter().map(|m| m.0).collect();
    let mut packages: Vec<&str> = missing.iter().map(|m| m.1).collect();
    packages.dedup();
    eprintln!(
        "rsock: cannot build: {} not found (rdma-sys needs rdma-core's headers and libclang at build time); \
         install with: apt-get install {}   (or set RSOCK_SKIP_BUILD_CHECK=1 to skip this check)",
        what.join(", "),
        packages.join(" ")
    );
    std::process::exit(1);
}

fn pkg_config_present() -> bool {
    let exe =
        std::env::var_os("PKG_CONFIG").map_or_else(|| PathBuf::from("pkg-config"), PathBuf::from);
    std::process::Command::new(exe)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Where a C compiler (and bindgen, which adds /usr/include itself) finds headers.
fn include_dirs() -> Vec<PathBuf> {
    let mut dirs = vec![
        PathBuf::from("/usr/include"),
        PathBuf::from("/usr/local/include"),
    ];
    for var in ["CPATH", "C_INCLUDE_PATH"] {
        if let Some(v) = std::env::var_os(var) {
            dirs.extend(std::env::split_paths(&v));
        }
    }
    dirs
}

enum Clang {
    Found,
    NoLibrary,
    NoStddef,
}

/// clang-sys (under bindgen) loads libclang from LIBCLANG_PATH or the usual library
/// directories, and clang needs its resource directory's stddef.h (libclang-common-*-dev).
fn libclang() -> Clang {
    let mut lib_dirs: Vec<PathBuf> = std::env::var_os("LIBCLANG_PATH")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    lib_dirs.extend(
        children("/usr/lib", |n| n.starts_with("llvm-"))
            .into_iter()
            .map(|d| d.join("lib")),
    );
    lib_dirs.extend(
        [
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib64",
            "/usr/lib",
            "/usr/local/lib",
        ]
        .map(PathBuf::from),
    );
    let has_lib = lib_dirs
        .iter()
        .any(|d| !children(d, |n| n.starts_with("libclang") && n.contains(".so")).is_empty());
    if !has_lib {
        return Clang::NoLibrary;
    }
    let mut clang_dirs = children("/usr/lib", |n| n.starts_with("llvm-"))
        .into_iter()
        .map(|d| d.join("lib/clang"))
        .collect::<Vec<_>>();
    clang_dirs.push(PathBuf::from("/usr/lib/clang"));
    clang_dirs.push(PathBuf::from("/usr/local/lib/clang"));
    let has_stddef = clang_dirs
        .iter()
        .flat_map(|d| children(d, |_| true))
        .any(|version| version.join("include/stddef.h").is_file());
    if has_stddef {
        Clang::Found
    } else {
        Clang::NoStddef
    }
}

/// Entries of `dir` whose file name satisfies `keep` (none if it can't be read).
fn children(dir: impl AsRef<Path>, keep: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_str().is_some_and(&keep))
        .map(|e| e.path())
        .collect()
}
