//! Fds received with `SCM_RIGHTS`: an RDMA stream or listener another process owns that
//! arrives in a message is made this process's before the program sees it.

use super::listeners::track_foreign_listener;
use super::streams::{as_stream, attach_rdma};
use crate::engine::ipc::{self, Reply, Request};
use crate::fdtable;
use crate::sys::fcntl::fd_flags;
use crate::sys::{cmsg, raw, unix};
use libc::c_int;

/// After `recvmsg` on an fd the shim does not own: the fds the message brought
/// (`SCM_RIGHTS`). Any that is the A of an RDMA stream another process owns (its name says
/// whose: [`ipc::stream_name`]) is made this process's — taken over, or relayed — before
/// the program sees it (Node.js `cluster`, acceptor/worker servers). The sender closing its
/// copy then ends nothing: the owner ends a stream only when no process holds its A.
///
/// # Safety
/// `msg` is the message `recvmsg` just filled.
#[cold]
pub(in crate::api) unsafe fn received_rights(msg: *const libc::msghdr) {
    let Some(_g) = crate::guard::enter() else {
        return;
    };
    if !crate::init::enabled() {
        return;
    }
    cmsg::rights(msg).for_each(received);
}

fn received(fd: c_int) {
    if fd < 0 || fdtable::owns(fd) {
        return;
    }
    let Some((owner, token)) = unix::abstract_name(fd).and_then(|n| ipc::parse_stream_name(&n))
    else {
        return; // not an rsock stream: the program's own business
    };
    if owner.is_me() {
        // Our own stream came back through a unix socket: another fd of a socket this
        // process already tracks under its first fd; left as the plain A it is.
        log::info!("fd {fd}: received this process's own rdma stream {token:x}: left as is");
        return;
    }
    let mut at = owner;
    match ipc::call(&mut at, &Request::Describe { token }, fd) {
        Ok((r @ Reply::Described { ends, .. }, _)) => {
            log::debug!(
                "fd {fd}: received rdma stream to {} from pid {}",
                ends.peer,
                owner.pid
            );
            attach_rdma(fd, &as_stream(r), ends, fd_flags(fd).0);
        }
        Ok((
            Reply::Listening {
                token,
                owner,
                sizes,
                local,
            },
            Some(tcp_fd),
        )) => track_foreign_listener(fd, owner, token, sizes, local, tcp_fd),
        other => {
            if let Ok((_, Some(x))) = other {
                raw::close(x);
            }
            log::warn!(
                "fd {fd}: received an rdma socket of pid {}, which did not describe it ({other:?}): left as is",
                owner.pid
            );
        }
    }
}
