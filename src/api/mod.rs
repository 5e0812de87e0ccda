//! libc-shaped entry points: what each hook in `preload/` calls.
//!
//! Every function has the signature of the libc function it stands in for and keeps its
//! contract, errno included. The first thing each does is look the fd up: an fd the shim does
//! not own goes straight to libc. Lifecycle calls (socket, connect, accept, close, dup, ...)
//! run shim logic only outside the reentrancy guard, so calls made by the shim itself or by
//! librdmacm/libibverbs on its behalf go straight to libc.
//!
//! An owned socket is carried either by kernel TCP (calls forward to libc and count bytes) or
//! by an RDMA stream of the [`engine`](crate::engine) (the program's fd is then a doorbell and
//! calls are served by the stream).
//!
//! Rooms, one job each (this file only declares them and re-exports the hooks):
//! - `connect` — socket, socketpair, bind, connect;
//! - `listen` — listen, accept, accept4;
//! - `io` — data calls: read/write, the send/recv families (sendmmsg/recvmmsg too), sendfile,
//!   splice;
//! - `opts` — options, names, ioctl, fcntl, shutdown;
//! - `wait` — readiness: poll, select, epoll;
//! - `fds` — fd lifetime: close, close_range, dup, dup2, dup3, fclose;
//! - `stdio` — sockets libc reads and writes itself: fdopen, dprintf, vdprintf;
//! - `process` — fork, exec, `_exit`, `syscall`, `prctl`;
//! - `creds` — credential changes (`setuid` and its family);
//! - `inherit` — sockets another process owns: got by fork, exec or `SCM_RIGHTS`;
//! - `rights` — sending a stream's fd to a process without the shim;
//! - `ownership` — the bookkeeping of owned fds the rooms share.

#![allow(clippy::missing_safety_doc)] // each fn has its libc namesake's contract

mod connect;
mod creds;
mod dual;
mod fds;
mod inherit;
mod io;
mod listen;
mod opts;
mod ownership;
mod process;
mod rights;
mod stdio;
mod wait;

pub use connect::{bind, connect, socket, socketpair};
pub use creds::*;
pub use fds::{close, close_range, closefrom, dup, dup2, dup3, fclose};
pub use inherit::passed_at_exec;
pub use io::*;
pub use listen::{accept, accept4, listen};
pub use opts::*;
pub use process::{execv, execve, execvp, execvpe, exit_now, fexecve, fork, prctl, syscall};
pub use stdio::{dprintf_target, fdopen, vdprintf};
pub use wait::{
    __poll_chk, epoll_create, epoll_create1, epoll_ctl, epoll_pwait, epoll_pwait2, epoll_wait,
    poll, ppoll, pselect, select,
};
