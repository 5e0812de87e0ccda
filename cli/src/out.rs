//! Writing to stdout without panicking: `println!` panics when stdout is a closed pipe
//! (`rsock stat | head -1`, or a reader that left). Rust ignores SIGPIPE, so the write
//! fails with EPIPE instead; rsock then exits quietly with status 0, as ripgrep does: the
//! reader took what it wanted. (Restoring SIGPIPE's default, as C tools have it, would end
//! rsock by the signal — status 141, which a `set -o pipefail` script reads as a failure
//! of rsock.) Any other write error (a full disk) is reported, status 1.

use std::io::Write as _;

/// Writes `args` to stdout and flushes, or exits (see the module's note).
pub fn print(args: std::fmt::Arguments) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.flush()) {
        exit_on(&e);
    }
}

/// Exits after a failed write to stdout: quietly with status 0 if the reader went away.
pub fn exit_on(e: &std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    eprintln!("rsock: cannot write to stdout: {e}");
    std::process::exit(1)
}

/// `println!` that never panics (see the module's note).
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::out::print(format_args!("{}\n", format_args!($($arg)*)))
    };
}
pub(crate) use outln;
