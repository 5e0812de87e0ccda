//! All FFI of the core: real libc entry points and raw syscalls that no hook can intercept.

pub mod cmsg;
pub mod dl;
mod errno;
pub mod fcntl;
pub mod fileio;
pub mod mem;
pub mod poll;
pub mod private;
pub mod process;
pub mod raw;
pub mod real;
pub mod sockaddr;
pub mod sockopt;
pub mod unix;
pub use errno::errno_name;
