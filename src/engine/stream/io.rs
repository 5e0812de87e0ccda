//! The program's data calls on a stream: `recv` and `send` (blocking, nonblocking, with a
//! time-out), and `shutdown`.

use super::{Port, Region, Stream, Want};
use crate::proto::{self, Failure, ReadError, WriteError};
use libc::c_int;
use std::io::{IoSlice, IoSliceMut};
use std::sync::atomic::Ordering::*;
use std::time::{Duration, Instant};

impl<P: Port> Stream<P> {
    /// `recv`-like: fills `bufs`; honours MSG_PEEK, MSG_WAITALL, MSG_DONTWAIT and the file's
    /// O_NONBLOCK. Ok(0) is end of stream. Err is an errno.
    pub fn recv(
        &self,
        bufs: &mut [IoSliceMut<'_>],
        flags: c_int,
        timeout: Option<Duration>,
    ) -> Result<usize, c_int> {
        let want: usize = bufs.iter().map(|b| b.len()).sum();
        if want == 0 {
            return Ok(0);
        }
        let nonblock = flags & libc::MSG_DONTWAIT != 0 || self.nonblocking.load(Relaxed);
        let peek = flags & libc::MSG_PEEK != 0;
        let waitall = flags & libc::MSG_WAITALL != 0 && !peek && !nonblock;
        let mut done = 0usize;
        // Taken at the first wait: a call that does not block reads no clock.
        let mut deadline = None;
        loop {
            {
                let mut g = self.lock();
                let inner = &mut *g;
                let (proto, ring, peeked) = (&mut inner.proto, &inner.ring, &mut inner.peeked);
                let r = after(bufs, done, |rest| {
                    let r = proto.read_with(peek, |[a, b]| {
                        proto::scatter([ring.range(a), ring.range(b)], rest)
                    });
                    match r {
                        Ok(n) if peek => peeked.after_peek(rest, n),
                        Ok(n) => peeked.after_read(rest, n),
                        Err(_) => {}
                    }
                    r
                });
                match r {
                    Ok(0) => return Ok(done), // EOF
                    Ok(n) => {
                        done += n;
                        if !peek && inner.read_rate.busy(n, inner.ring.len()) {
                            inner.proto.ask_bigger_ring();
                        }
                        self.pump(inner);
                        if !waitall || done == want {
                            return Ok(done);
                        }
                    }
                    Err(ReadError::Blocked) if done > 0 && !waitall => return Ok(done),
                    Err(ReadError::Blocked) => {
                        if let Some(f) = inner.proto.failure() {
                            return if done > 0 {
                                Ok(done)
                            } else {
                                Err(read_errno(f))
                            };
                        }
                        self.show(inner);
                    }
                    Err(ReadError::Reset) => {
                        return if done > 0 {
                            Ok(done)
                        } else {
                            Err(libc::ECONNRESET)
                        };
                    }
                }
            }
            if nonblock {
                // Nobody may have polled the CQ since the data arrived: look once, then retry.
                if self.dev.progress() > 0 && self.ready(Want::Read) {
                    continue;
                }
                return Err(libc::EAGAIN);
            }
            let d = *deadline.get_or_insert_with(|| timeout.map(|t| Instant::now() + t));
            if let Err(e) = self.wait(Want::Read, d) {
                return if done > 0 { Ok(done) } else { Err(e) }; // EINTR, or SO_RCVTIMEO's EAGAIN
            }
        }
    }

    /// `send`-like: copies `bufs` into the send buffer and posts it. Blocking callers wait
    /// until everything is queued. Err is an errno (EPIPE: the caller raises SIGPIPE).
    pub fn send(
        &self,
        bufs: &[IoSlice<'_>],
        flags: c_int,
        timeout: Option<Duration>,
    ) -> Result<usize, c_int> {
        let want: usize = bufs.iter().map(|b| b.len()).sum();
        let nonblock = flags & libc::MSG_DONTWAIT != 0 || self.nonblocking.load(Relaxed);
        let mut done = 0usize;
        // Taken at the first wait: a call that does not block reads no clock.
        let mut deadline = None;
        loop {
            {
                let mut g = self.lock();
                let inner = &mut *g;
                if let Some(f) = inner.proto.failure() {
                    if done > 0 {
                        return Ok(done);
                    }
                    // As on TCP: a timed-out connection's error is told once, then EPIPE (a
                    // write on a broken stream, as on a reset TCP one).
                    let first = inner.proto.first_failure_report();
                    return Err(if f == Failure::TimedOut && first {
                        libc::ETIMEDOUT
                    } else {
                        libc::EPIPE
                    });
                }
                if want == 0 {
                    return Ok(0);
                }
                let owned;
                let rest = if done == 0 {
                    bufs
                } else {
                    owned = skip_const(bufs, done);
                    &owned
                };
                let send = &mut inner.send;
                let r = inner.proto.write_with(want - done, |ranges, n| {
                    proto::gather(rest, send.ranges_mut(ranges), n);
                });
                match r {
                    Ok(n) => {
                        done += n;
                        if inner.write_rate.busy(n, inner.send.len()) {
                            inner.proto.ask_bigger_send_buf();
                        }
                        self.pump(inner);
                        if done == want {
                            return Ok(done);
                        }
                    }
                    // Blocked asks for a completion (a fence, if the writes in flight are
                    // unsignaled): the pump posts it.
                    Err(WriteError::Blocked) => self.pump(inner),
                    Err(WriteError::Closed) => {
                        return if done > 0 { Ok(done) } else { Err(libc::EPIPE) }
                    }
                    Err(WriteError::Reset) => {
                        return if done > 0 { Ok(done) } else { Err(libc::EPIPE) }
                    }
                }
            }
            if nonblock {
                // "Full" is final only once the writes already posted have completed (they
                // free send-buffer space within microseconds): settle, bounded, so that a
                // program told EAGAIN is not told writable right after for space that was
                // merely in flight — kernel TCP's EAGAIN likewise means "full".
                if self.settle() && self.ready(Want::Write) {
                    continue;
                }
                return if done > 0 {
                    Ok(done)
                } else {
                    Err(libc::EAGAIN)
                };
            }
            let d = *deadline.get_or_insert_with(|| timeout.map(|t| Instant::now() + t));
            if let Err(e) = self.wait(Want::Write, d) {
                return if done > 0 { Ok(done) } else { Err(e) };
            }
        }
    }

    /// `shutdown(SHUT_RD)`: reads return what is queued, then 0 instead of blocking; a
    /// reader blocked in another thread wakes up.
    pub fn shutdown_read(&self) {
        self.with(|inner| {
            inner.proto.shutdown_read();
            self.show(inner);
        });
    }

    /// `shutdown(SHUT_WR)`: FIN after the queued bytes.
    pub fn shutdown_write(&self) {
        self.with(|inner| {
            inner.proto.shutdown_write();
            self.pump(inner);
        });
    }
}

/// A read that found nothing left on a broken stream (end of stream is the caller's).
fn read_errno(f: Failure) -> c_int {
    match f {
        Failure::TimedOut => libc::ETIMEDOUT,
        Failure::Reset | Failure::PeerGone => libc::ECONNRESET,
    }
}

/// Calls `f` with the part of `bufs` after the first `done` bytes (allocating only when
/// `done` > 0: a MSG_WAITALL read that goes on).
fn after<R>(
    bufs: &mut [IoSliceMut<'_>],
    done: usize,
    f: impl FnOnce(&mut [IoSliceMut<'_>]) -> R,
) -> R {
    if done == 0 {
        f(bufs)
    } else {
        f(&mut skip(bufs, done))
    }
}

/// The part of `bufs` after the first `n` bytes.
fn skip<'a, 'b>(bufs: &'a mut [IoSliceMut<'b>], mut n: usize) -> Vec<IoSliceMut<'a>> {
    let mut out = Vec::with_capacity(bufs.len());
    for b in bufs.iter_mut() {
        if n >= b.len() {
            n -= b.len();
            continue;
        }
        out.push(IoSliceMut::new(&mut b[n..]));
        n = 0;
    }
    out
}

fn skip_const<'a>(bufs: &'a [IoSlice<'_>], mut n: usize) -> Vec<IoSlice<'a>> {
    let mut out = Vec::with_capacity(bufs.len());
    for b in bufs {
        if n >= b.len() {
            n -= b.len();
            continue;
        }
        out.push(IoSlice::new(&b[n..]));
        n = 0;
    }
    out
}
