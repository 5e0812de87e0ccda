//! Relays: an RDMA stream served by its owner to another process through an `AF_UNIX`
//! socketpair (docs/DESIGN.md, "Processes").
//!
//! The other process (a fork child, or a program exec'd with the socket) holds end A as a
//! plain kernel socket and needs no shim; the owner keeps end B, nonblocking, and moves bytes
//! between B and the stream whenever either side changes: the helper thread watches B
//! (edge-triggered) and every pump of the stream runs the relay too. Bytes are consumed from
//! the ring only as far as B accepts them, so none is lost or duplicated.
//!
//! Lifetime follows the kernel's: a holder's `shutdown(SHUT_WR)` is a FIN; the end is gone
//! when every fd of A, in every process, is closed (B then reports `POLLHUP`).

use crate::proto;
use crate::sys::real;
use libc::c_int;

/// This process's view of a stream that another process owns and relays to it: the program's
/// fd is a plain `AF_UNIX` stream socket (the relay's A), so data calls go straight to the
/// kernel; the shim answers what only a TCP socket would (addresses, options).
pub struct Relayed {
    /// The connection's local address.
    pub local: std::net::SocketAddr,
    /// Its peer address.
    pub peer: std::net::SocketAddr,
    /// An unconnected kernel TCP socket that holds the program's options.
    pub opts_fd: c_int,
}

impl Drop for Relayed {
    fn drop(&mut self) {
        crate::sys::raw::close(self.opts_fd);
    }
}

/// Bytes moved per step: one chunk of the scratch buffer.
pub(super) const CHUNK: usize = 64 * 1024;

/// The owner's end (B) of one relay.
pub(super) struct End {
    /// B: nonblocking, close-on-exec, owned by the stream.
    pub fd: c_int,
    /// End of stream passed on to A (B shut for writing).
    rx_shut: bool,
    /// A's holders shut it for writing (or all closed it): no more bytes come from B.
    pub tx_eof: bool,
    /// Every fd of A is closed.
    pub gone: bool,
}

impl End {
    pub fn new(fd: c_int) -> End {
        End {
            fd,
            rx_shut: false,
            tx_eof: false,
            gone: false,
        }
    }

    /// Notes whether every fd of A is closed and every byte its holders wrote has been taken
    /// (`POLLHUP` alone comes while bytes may still be queued in B).
    pub fn check_gone(&mut self) -> bool {
        if !self.gone && self.tx_eof {
            self.gone = crate::sys::unix::wait(self.fd, 0, 0) & libc::POLLHUP != 0;
        }
        self.gone
    }
}

/// Moves bytes written into the ends' A sides into the stream, as far as its send buffer
/// takes them. True if anything was queued.
pub(super) fn into_stream(
    ends: &mut [End],
    p: &mut proto::Conn,
    send_buf: &mut [u8],
    scratch: &mut [u8],
) -> bool {
    let mut any = false;
    for e in ends.iter_mut().filter(|e| !e.tx_eof) {
        loop {
            let room = p.writable().min(scratch.len());
            if room == 0 {
                break;
            }
            // SAFETY: scratch is valid for `room` bytes; B is ours.
            let n =
                unsafe { real::recv(e.fd, scratch.as_mut_ptr().cast(), room, libc::MSG_DONTWAIT) };
            if n == 0 {
                e.tx_eof = true;
                break;
            }
            if n < 0 {
                break;
            }
            match p.write(send_buf, &scratch[..n as usize]) {
                Ok(w) if w == n as usize => any = true,
                r => {
                    // Cannot happen: we asked for no more than `writable()`.
                    log::error!("relay: stream took {r:?} of {n} bytes");
                    break;
                }
            }
        }
    }
    any
}

/// Moves readable stream bytes out to the newest end still open, as far as it takes them,
/// and passes end of stream on once everything is out. True if anything was consumed (the
/// protocol may owe the peer credits).
pub(super) fn out_of_stream(
    ends: &mut [End],
    p: &mut proto::Conn,
    ring: &[u8],
    scratch: &mut [u8],
    reset: bool,
) -> bool {
    let mut any = false;
    if let Some(e) = ends.iter_mut().rev().find(|e| !e.gone && !e.rx_shut) {
        while p.readable() > 0 {
            let Ok(n) = p.peek(ring, scratch) else { break };
            // SAFETY: scratch holds n peeked bytes; B is ours.
            let w = unsafe {
                real::send(
                    e.fd,
                    scratch.as_ptr().cast(),
                    n,
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            if w <= 0 {
                break;
            }
            p.consume(w as usize);
            any = true;
            if (w as usize) < n {
                break;
            }
        }
    }
    if (p.at_eof() || reset) && p.readable() == 0 {
        for e in ends.iter_mut().filter(|e| !e.rx_shut) {
            // A reset reads as end of stream and makes writes fail (EPIPE), as on a dead socket.
            let how = if reset {
                libc::SHUT_RDWR
            } else {
                libc::SHUT_WR
            };
            // SAFETY: shutdown on our fd.
            unsafe { real::shutdown(e.fd, how) };
            e.rx_shut = true;
            if reset {
                e.tx_eof = true;
            }
        }
    }
    any
}
