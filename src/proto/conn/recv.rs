//! The receive path of [`Conn`]: processing the peer's immediates and copying readable bytes
//! out of the ring.

use std::io::IoSliceMut;
use std::ops::Range;

use super::{Conn, EV_READABLE, EV_RESET};
use crate::proto::ring::scatter;
use crate::proto::wire::Imm;
use crate::proto::{ProtocolError, ReadError};

impl Conn {
    /// Copies readable bytes into `buf` and consumes them; see [`read_vectored`](Self::read_vectored).
    pub fn read(&mut self, ring: &[u8], buf: &mut [u8]) -> Result<usize, ReadError> {
        self.read_vectored(ring, &mut [IoSliceMut::new(buf)])
    }

    /// Copies readable bytes into `bufs` in order and consumes them.
    ///
    /// `Ok(0)` for empty `bufs` or at end of stream, `Blocked` when nothing is readable yet
    /// (EAGAIN), `Reset` after a reset. MSG_WAITALL is the caller looping until enough
    /// arrived or `at_eof`.
    ///
    /// # Panics
    /// If `ring` is not exactly `config.ring_size` bytes.
    pub fn read_vectored(
        &mut self,
        ring: &[u8],
        bufs: &mut [IoSliceMut<'_>],
    ) -> Result<usize, ReadError> {
        let n = self.peek_vectored(ring, bufs)?;
        self.app_consumed(n as u64);
        Ok(n)
    }

    /// The read primitive for a driver that must not view the whole ring (the peer's NIC
    /// writes its free part meanwhile): `copy` gets the ring ranges of the readable bytes,
    /// in stream order, and returns how many it took from their start (at least one); they
    /// are consumed unless `peek`. `Ok(0)` is end of stream; errors as
    /// [`read_vectored`](Self::read_vectored).
    pub fn read_with(
        &mut self,
        peek: bool,
        copy: impl FnOnce([Range<usize>; 2]) -> usize,
    ) -> Result<usize, ReadError> {
        if self.is_reset() {
            return Err(ReadError::Reset);
        }
        let readable = self.readable();
        if readable == 0 {
            return if self.fin_received || self.read_shut {
                Ok(0)
            } else {
                Err(ReadError::Blocked)
            };
        }
        let n = copy(self.readable_ranges()).min(readable);
        if !peek {
            self.app_consumed(n as u64);
        }
        Ok(n)
    }

    /// Like [`read`](Self::read) without consuming (MSG_PEEK).
    pub fn peek(&self, ring: &[u8], buf: &mut [u8]) -> Result<usize, ReadError> {
        self.peek_vectored(ring, &mut [IoSliceMut::new(buf)])
    }

    /// Like [`read_vectored`](Self::read_vectored) without consuming (MSG_PEEK).
    pub fn peek_vectored(
        &self,
        ring: &[u8],
        bufs: &mut [IoSliceMut<'_>],
    ) -> Result<usize, ReadError> {
        assert_eq!(ring.len(), self.ring.size() as usize, "ring size");
        if self.is_reset() {
            return Err(ReadError::Reset);
        }
        if self.readable() == 0 {
            let empty = bufs.iter().all(|b| b.is_empty());
            return if empty || self.fin_received || self.read_shut {
                Ok(0)
            } else {
                Err(ReadError::Blocked)
            };
        }
        let (a, b) = self.readable_slices(ring)?;
        Ok(scatter([a, b], bufs))
    }

    /// The readable bytes in place, as one or two slices of `ring` (zero-copy read); follow
    /// with [`consume`](Self::consume).
    pub fn readable_slices<'r>(&self, ring: &'r [u8]) -> Result<(&'r [u8], &'r [u8]), ReadError> {
        assert_eq!(ring.len(), self.ring.size() as usize, "ring size");
        if self.is_reset() {
            return Err(ReadError::Reset);
        }
        let unread = if self.read_closed {
            0
        } else {
            self.rx.unread()
        };
        Ok(self.ring.slices(ring, self.rx.consumed(), unread))
    }

    /// Offsets in the ring of the readable bytes, in stream order (the second range is empty
    /// unless they wrap). For drivers that must not form a slice over the whole ring while
    /// the NIC writes into its free part: read these ranges, then [`consume`](Self::consume).
    pub fn readable_ranges(&self) -> [Range<usize>; 2] {
        self.ring.ranges(self.rx.consumed(), self.readable() as u64)
    }

    /// Consumes up to `n` readable bytes without copying them; returns how many.
    pub fn consume(&mut self, n: usize) -> usize {
        let n = (n as u64).min(self.readable() as u64);
        self.app_consumed(n);
        n as usize
    }

    /// Processes the immediate of a completed receive (a peer WRITE_WITH_IMM) and the
    /// completion's `byte_len`: how many bytes that write carried.
    ///
    /// The length is checked exactly (PROTOCOL.md §3): a control message carries none, and a
    /// DATA's write carries its whole burst, or the part after the ring's wrap point. So a
    /// peer cannot announce bytes it did not write in that write, and make the program read
    /// whatever the ring held there ([`ProtocolError::LengthMismatch`]).
    ///
    /// On `Err` the connection is failed: reads and writes return `Reset`, nothing more is
    /// posted, and the driver should disconnect. After a reset, input is ignored.
    pub fn handle_imm(&mut self, imm: u32, byte_len: u32) -> Result<(), ProtocolError> {
        if self.failed.is_some() || self.peer_reset {
            return Ok(());
        }
        self.stats.imms_received += 1;
        let result = self.process_imm(imm, byte_len);
        if let Err(e) = result {
            self.fail_on_input(e);
        }
        result
    }

    /// What the peer sent broke the protocol: the connection is failed (see
    /// [`handle_imm`](Self::handle_imm)).
    pub(super) fn fail_on_input(&mut self, e: ProtocolError) {
        self.failed = Some(e);
        self.planned.clear();
        self.events |= EV_RESET;
    }

    fn process_imm(&mut self, raw: u32, byte_len: u32) -> Result<(), ProtocolError> {
        let imm = self.codec.decode(raw).map_err(ProtocolError::BadImm)?;
        if !self.migration_allows_input() {
            return Err(ProtocolError::AfterMigrate);
        }
        self.rx.on_message()?;
        if byte_len != 0 && !matches!(imm, Imm::Data { .. }) {
            // Control messages are zero-length writes.
            return Err(ProtocolError::LengthMismatch {
                len: 0,
                expected: 0,
                written: byte_len,
            });
        }
        if let Some((rkey_hi, pages_hi)) = self.peer_grow_hi.take() {
            // The second half must follow the first directly.
            let Imm::Grow { rkey_lo, pages_lo } = imm else {
                return Err(ProtocolError::BadGrow);
            };
            let rkey = u32::from(rkey_hi) << 16 | u32::from(rkey_lo);
            let pages = u32::from(pages_hi) << 8 | u32::from(pages_lo);
            return self.on_grow(rkey, pages);
        }
        match imm {
            Imm::Data { len } => {
                if self.fin_received {
                    return Err(ProtocolError::DataAfterFin);
                }
                let expected = self.last_write_len(len);
                self.rx.on_data(len)?; // the window first: `expected` assumes len <= ring
                if byte_len != expected {
                    return Err(ProtocolError::LengthMismatch {
                        len,
                        expected,
                        written: byte_len,
                    });
                }
                if self.read_closed {
                    // Nobody will read this: discard, and tell the writer like a TCP RST.
                    self.rx.consume(self.rx.unread());
                    if !self.reset_queued {
                        self.reset_queued = true;
                        self.tx_queued = self.tx_posted;
                    }
                } else {
                    self.events |= EV_READABLE;
                }
            }
            Imm::Credit { wrs, bytes } => self.tx.grant(wrs, bytes, self.tx_posted)?,
            Imm::Fin => {
                if self.fin_received {
                    return Err(ProtocolError::DuplicateFin);
                }
                self.fin_received = true;
                self.cancel_ring_growth();
                self.events |= EV_READABLE;
            }
            Imm::Reset => {
                self.peer_reset = true;
                self.planned.clear();
                self.events |= EV_RESET;
            }
            Imm::Migrate { port } => self.on_migrate(port)?,
            Imm::GrowHi { rkey_hi, pages_hi } => self.peer_grow_hi = Some((rkey_hi, pages_hi)),
            Imm::Grow { .. } => return Err(ProtocolError::BadGrow),
            Imm::Switched => self.on_switched()?,
        }
        Ok(())
    }

    /// The bytes the WRITE_WITH_IMM of a `len`-byte DATA starting at `received_end` carries:
    /// a burst is one write, or two when it crosses the ring's end — then the immediate
    /// rides on the part from offset 0 (PROTOCOL.md §4). Only for `len <= ring size` (a
    /// longer one fails the window check).
    fn last_write_len(&self, len: u32) -> u32 {
        let room = self.ring.size() - self.ring.offset(self.rx.received_end());
        if len <= room {
            len
        } else {
            len - room
        }
    }
}
