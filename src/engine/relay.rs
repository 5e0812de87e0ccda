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

use super::peeked::Peeked;
use crate::proto;
use crate::sys::real;
use libc::c_int;
use std::io::IoSliceMut;

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
    peeked: &mut Peeked,
    reset: bool,
) -> bool {
    let mut any = false;
    if let Some(e) = ends.iter_mut().rev().find(|e| !e.gone && !e.rx_shut) {
        while p.readable() > 0 {
            let Ok(n) = p.peek(ring, scratch) else { break };
            peeked.after_peek(&mut [IoSliceMut::new(&mut scratch[..n])], n);
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
            peeked.forget(w as usize);
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

#[cfg(test)]
mod tests {
    //! The relay's byte moving, over the real protocol core driven in memory (`transport::mem`)
    //! and a real socketpair: nothing lost or duplicated when the socket takes only part of
    //! what is readable, and end of stream passed on only after the last byte.
    use super::*;
    use crate::proto::Params;
    use crate::transport::mem::{Pair, Side};

    fn cfg() -> Params {
        Params {
            ring_size: 4096,
            recv_credits: 8,
            send_buf_size: 4096,
            send_queue_depth: 8,
            max_inline: 64,
            ring_grow_to: 0,
            send_grow_to: 0,
        }
    }

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    /// (A, B) with B's send buffer at the minimum, so it fills after a few KiB.
    fn small_pair() -> (c_int, c_int) {
        let (a, b) = crate::sys::unix::stream_pair().unwrap();
        let one: c_int = 1;
        // SAFETY: valid option pointer and length on our fd.
        unsafe {
            libc::setsockopt(
                b,
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&one as *const c_int).cast(),
                4,
            )
        };
        (a, b)
    }

    fn read_some(fd: c_int, out: &mut Vec<u8>) -> isize {
        let mut buf = [0u8; 1500];
        // SAFETY: valid buffer; nonblocking read on a test fd.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n > 0 {
            out.extend_from_slice(&buf[..n as usize]);
        }
        n
    }

    #[test]
    fn stream_to_relay_end_delivers_every_byte_once_then_eof() {
        let data = pattern(100_000);
        let mut p = Pair::new(cfg(), cfg());
        let (a, b) = small_pair();
        let mut ends = [End::new(b)];
        let mut scratch = vec![0u8; 3000];
        let (mut sent, mut got, mut eof) = (0usize, Vec::new(), false);
        for _ in 0..100_000 {
            if sent < data.len() {
                sent += p.write(Side::A, &data[sent..]).unwrap_or(0);
            } else if p.ep(Side::A).conn.state() == crate::proto::State::Open {
                p.ep_mut(Side::A).conn.shutdown_write();
            }
            p.drive().unwrap();
            let ep = p.ep_mut(Side::B);
            out_of_stream(
                &mut ends,
                &mut ep.conn,
                &ep.ring,
                &mut scratch,
                &mut Peeked::default(),
                false,
            );
            p.drive().unwrap(); // credits back to A
                                // The program reads only a little at a time: B keeps filling up.
            match read_some(a, &mut got) {
                0 => {
                    eof = true;
                    break;
                }
                _ => continue,
            }
        }
        assert!(
            eof,
            "end of stream passed on (got {} of {})",
            got.len(),
            data.len()
        );
        assert_eq!(got.len(), data.len());
        assert!(got == data, "bytes differ");
        crate::sys::raw::close(a);
        crate::sys::raw::close(b);
    }

    #[test]
    fn relay_end_to_stream_queues_only_what_fits_and_sees_eof() {
        let data = pattern(50_000);
        let mut p = Pair::new(cfg(), cfg());
        let (a, b) = crate::sys::unix::stream_pair().unwrap();
        let mut ends = [End::new(b)];
        let mut scratch = vec![0u8; 2000];
        let writer = {
            let data = data.clone();
            std::thread::spawn(move || {
                // SAFETY: blocking writes of a valid buffer to our fd, then close.
                unsafe {
                    let mut off = 0;
                    while off < data.len() {
                        let n = libc::write(a, data[off..].as_ptr().cast(), data.len() - off);
                        assert!(n > 0);
                        off += n as usize;
                    }
                    libc::close(a);
                }
            })
        };
        let mut got = vec![0u8; 0];
        let mut buf = [0u8; 4096];
        for _ in 0..1_000_000 {
            let ep = p.ep_mut(Side::B);
            into_stream(&mut ends, &mut ep.conn, &mut ep.send_buf, &mut scratch);
            p.drive().unwrap();
            while let Ok(n) = p.read(Side::A, &mut buf) {
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            if ends[0].tx_eof && got.len() == data.len() {
                break;
            }
        }
        writer.join().unwrap();
        assert!(ends[0].tx_eof, "the holder's close reads as end of stream");
        assert!(ends[0].check_gone(), "and, with nothing left in B, as gone");
        assert!(
            got == data,
            "{} of {} bytes, or bytes differ",
            got.len(),
            data.len()
        );
        crate::sys::raw::close(b);
    }
}
