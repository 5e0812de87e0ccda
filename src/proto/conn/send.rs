//! The send path of [`Conn`]: copying into the send buffer, planning bursts, allocating work
//! request ids, deciding which are signaled, and reclaiming space on completion.

use std::io::IoSlice;
use std::ops::Range;

use super::{Conn, WrId, Write, EV_WRITABLE};
use crate::proto::credits::MsgClass;
use crate::proto::ring::gather_into;
use crate::proto::wire::Imm;
use crate::proto::{CompletionError, WriteError};

impl Conn {
    /// Copies as much of `data` as fits into the send buffer; see [`write_vectored`](Self::write_vectored).
    pub fn write(&mut self, send_buf: &mut [u8], data: &[u8]) -> Result<usize, WriteError> {
        self.write_vectored(send_buf, &[IoSlice::new(data)])
    }

    /// Copies as much of `bufs` as fits into the send buffer and returns the count; the bytes
    /// go out on later `poll_write` calls as credits allow.
    ///
    /// `Blocked` when no space is free (EAGAIN), `Closed` after `shutdown_write`/`close`
    /// (EPIPE), `Reset` after a reset (ECONNRESET). Empty input returns `Ok(0)`.
    ///
    /// # Panics
    /// If `send_buf` is not exactly `config.send_buf_size` bytes.
    pub fn write_vectored(
        &mut self,
        send_buf: &mut [u8],
        bufs: &[IoSlice<'_>],
    ) -> Result<usize, WriteError> {
        assert_eq!(
            send_buf.len(),
            self.send_ring.size() as usize,
            "send buffer size"
        );
        let wanted: usize = bufs.iter().map(|b| b.len()).sum();
        let (ring, pos) = (self.send_ring, self.tx_queued);
        self.write_with(wanted, |_, n| {
            gather_into(ring, send_buf, pos, bufs, n);
        })
    }

    /// The write primitive for a driver that must not view the whole send buffer (the NIC
    /// reads its in-flight part meanwhile): of `wanted` bytes, `n` fit; `copy(ranges, n)`
    /// places them at the start of the free `ranges`, in stream order. Errors as
    /// [`write_vectored`](Self::write_vectored).
    pub fn write_with(
        &mut self,
        wanted: usize,
        copy: impl FnOnce([Range<usize>; 2], usize),
    ) -> Result<usize, WriteError> {
        if self.is_broken() {
            return Err(WriteError::Reset);
        }
        if self.write_shut {
            return Err(WriteError::Closed);
        }
        if wanted == 0 {
            return Ok(0);
        }
        let n = wanted.min(self.writable());
        if n > 0 {
            copy(self.send_space(), n);
        }
        self.tx_queued += n as u64;
        if n < wanted {
            // Space comes back only through completions: make sure one is coming.
            self.need_signal = true;
            self.writer_waiting = true;
            self.note_send_full(wanted);
        }
        if n == 0 {
            return Err(WriteError::Blocked);
        }
        Ok(n)
    }

    /// Offsets in the send buffer of the free space, in stream order (the second range is
    /// empty unless it wraps). Copy bytes there, then [`commit_write`](Self::commit_write):
    /// the zero-copy form of [`write`](Self::write), which never touches bytes the NIC may
    /// still be reading.
    pub fn send_space(&self) -> [Range<usize>; 2] {
        self.send_ring
            .ranges(self.tx_queued, self.writable() as u64)
    }

    /// Queues `n` bytes the caller placed at the start of [`send_space`](Self::send_space);
    /// `n` larger than the free space is clamped. Errors as [`write_vectored`](Self::write_vectored).
    pub fn commit_write(&mut self, n: usize) -> Result<usize, WriteError> {
        if self.is_broken() {
            return Err(WriteError::Reset);
        }
        if self.write_shut {
            return Err(WriteError::Closed);
        }
        if n == 0 {
            return Ok(0);
        }
        let free = self.writable();
        if free == 0 {
            self.need_signal = true;
            self.writer_waiting = true;
            self.note_send_full(n);
            return Err(WriteError::Blocked);
        }
        let n = n.min(free);
        self.tx_queued += n as u64;
        Ok(n)
    }

    /// Processes a successful signaled send completion. Completions are cumulative (an RC
    /// completion implies every earlier work request finished), so stale or duplicate ids are
    /// ignored.
    pub fn handle_send_complete(&mut self, wr_id: WrId) -> Result<(), CompletionError> {
        if wr_id.0 >= self.next_wr {
            return Err(CompletionError::UnknownWr(wr_id));
        }
        if wr_id.0 < self.wrs_retired {
            return Ok(());
        }
        self.wrs_retired = wr_id.0 + 1;
        while let Some(&(id, pos)) = self.signaled.front() {
            if id > wr_id.0 {
                break;
            }
            self.tx_acked = self.tx_acked.max(pos);
            self.signaled.pop_front();
        }
        if self.wrs_retired == self.next_wr {
            // Everything retired: the unsignaled tail completed too.
            self.tx_acked = self.tx_posted;
            self.unsignaled_wrs = 0;
            self.unsignaled_bytes = 0;
        }
        self.swap_send_buf_if_drained();
        if self.writer_waiting && self.writable() > 0 {
            self.writer_waiting = false;
            self.events |= EV_WRITABLE;
        }
        Ok(())
    }

    pub(super) fn sq_room(&self, n: u64) -> bool {
        self.next_wr - self.wrs_retired + n <= u64::from(self.sq_depth)
    }

    /// Plans the next data burst (one or two writes, the last carrying the immediate) and
    /// returns its first write.
    pub(super) fn plan_burst(&mut self) -> Option<Write> {
        let unsent = self.tx_queued - self.tx_posted;
        if unsent == 0 || !self.tx.allows(MsgClass::Data) {
            return None;
        }
        let mut local = self.send_ring.offset(self.tx_posted);
        // A burst ends at the send buffer's end (the rest is the next burst): it is then
        // split only where the peer's ring wraps, which the peer can compute, so the peer
        // checks the length of the write carrying the immediate exactly (PROTOCOL.md §4).
        let len = u64::from(
            self.codec.burst_len(
                unsent
                    .min(u64::from(self.send_ring.size() - local))
                    .min(self.tx.bytes_after(self.tx_posted)),
            ),
        );
        if len == 0 {
            return None;
        }
        // The peer ring wraps at most once because len <= its size. Offsets are computed
        // once (two divisions) and then advanced with wrap checks.
        let mut pieces = [(0u32, 0u32, 0u32); 2];
        let (mut count, mut left) = (0, len);
        let mut remote = self.peer_ring.offset(self.tx_posted);
        while left > 0 {
            let n = left.min(u64::from(self.peer_ring.size() - remote)) as u32;
            pieces[count] = (local, remote, n);
            count += 1;
            left -= u64::from(n);
            local = self.send_ring.advance(local, n);
            remote = self.peer_ring.advance(remote, n);
        }
        if !self.sq_room(count as u64) {
            return None;
        }
        self.tx.spend_wr();
        self.stats.data_messages += 1;
        let mut first = None;
        for (i, &(local, remote, n)) in pieces[..count].iter().enumerate() {
            let imm = (i + 1 == count).then(|| self.codec.encode(Imm::Data { len: len as u32 }));
            self.tx_posted += u64::from(n);
            let w = self.work_request(local, n, remote, imm, false);
            // The first piece is returned directly; only wrapped bursts queue the rest.
            match first {
                None => first = Some(w),
                Some(_) => self.planned.push_back(w),
            }
        }
        first
    }

    pub(super) fn control(&mut self, imm: Imm, signal: bool) -> Write {
        self.work_request(0, 0, 0, Some(self.codec.encode(imm)), signal)
    }

    /// Allocates a work request id and decides signaling. Called with `tx_posted` already
    /// covering this write's payload.
    pub(super) fn work_request(
        &mut self,
        local_offset: u32,
        len: u32,
        remote_offset: u32,
        imm: Option<u32>,
        force_signal: bool,
    ) -> Write {
        let wr_id = WrId(self.next_wr);
        self.next_wr += 1;
        self.unsignaled_wrs += 1;
        self.unsignaled_bytes += u64::from(len);
        // Signal often enough that neither the send queue nor the send buffer can fill with
        // work whose completion would never be reported.
        let signaled = force_signal
            || self.need_signal
            || self.unsignaled_wrs >= self.signal_every
            || self.unsignaled_bytes >= u64::from(self.send_ring.size() / 2).max(1);
        if signaled {
            self.signaled.push_back((wr_id.0, self.tx_posted));
            self.unsignaled_wrs = 0;
            self.unsignaled_bytes = 0;
            self.need_signal = false;
            self.stats.signaled += 1;
        }
        self.stats.writes_posted += 1;
        self.stats.bytes_posted += u64::from(len);
        Write {
            wr_id,
            local_offset,
            len,
            remote_offset,
            remote_addr: self.peer_ring_addr.wrapping_add(u64::from(remote_offset)),
            rkey: self.peer_rkey,
            imm,
            inline: len > 0 && len <= self.max_inline,
            signaled,
        }
    }
}
