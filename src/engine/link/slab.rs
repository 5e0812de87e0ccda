//! A link's registered memory of one kind — its streams' rings, or their send buffers — in
//! slabs registered as streams need them and deregistered once idle (beyond one spare).
//!
//! Why slabs that grow: a link used to register 2 MiB of each kind when it came up, room
//! for all 62 streams it may carry, so a link with one stream pinned 4 MiB at each end
//! where a connection with a queue pair of its own pins 32 KiB. The slots' allocator
//! (`proto::link::Slots`) already placed slots in several slabs; this registers them.
//!
//! Why the first slab is small: most links carry one connection, and with 256 KiB slabs a
//! link pinned 512 KiB at each end for it. The first slab holds stream 0's slot and three
//! streams' (one, and the two an acceptor grants ahead): 128 KiB at each end.

use crate::proto::link::{SlabId, Slot, Slots, SlotsError};
use crate::rdma::{self, Access, Pd, RegBuf};
use std::sync::Arc;

use super::parts::{CONTROL_BUF, STREAM_BUF, STREAM_BUF_MAX};

/// The first slab's size: stream 0's slot and three streams'.
const FIRST_SLAB: u32 = CONTROL_BUF + 3 * STREAM_BUF;
/// Every later slab's: sixteen streams' slots, or one stream's ring (or send buffer) grown
/// as far as it goes.
const SLAB: u32 = STREAM_BUF_MAX;
/// Slabs of each kind a link may add after the first: room for `MAX_STREAMS` streams, or
/// for eight grown ones.
const MORE_SLABS: usize = 8;
/// The most a link registers of each kind.
const ROOM: u64 = FIRST_SLAB as u64 + SLAB as u64 * MORE_SLABS as u64;
/// Idle slabs kept registered, so a link whose streams come and go does not register and
/// deregister one at each.
const SPARE_SLABS: usize = 1;

/// A link's slabs of one kind and which of their slots are taken.
pub(super) struct Slab {
    /// The live slabs' memory, in id order; the first holds stream 0's slot for the link's
    /// life. (Before `pd`: a registration goes before its protection domain.)
    bufs: Vec<(SlabId, Arc<RegBuf>)>,
    slots: Slots,
    pd: Arc<Pd>,
    access: Access,
}

impl Slab {
    /// The first slab, registered in `pd` with `access`, and stream 0's slot in it.
    pub(super) fn new(pd: &Arc<Pd>, access: Access) -> rdma::Result<(Slab, Slot)> {
        let bad = |_| rdma::Error::from_errno("link slab", libc::EINVAL);
        let mut s = Slab {
            bufs: Vec::new(),
            slots: Slots::new(4096, SLAB, 1 + MORE_SLABS).map_err(bad)?,
            pd: pd.clone(),
            access,
        };
        s.add(FIRST_SLAB)?;
        let control = s.slots.alloc(CONTROL_BUF).map_err(bad)?;
        Ok((s, control))
    }

    /// Registers one more slab, of `size` bytes.
    fn add(&mut self, size: u32) -> rdma::Result<()> {
        let buf = RegBuf::new(&self.pd, size as usize, self.access)?;
        let id = self
            .slots
            .add_slab_of(size)
            .map_err(|_| rdma::Error::from_errno("link slab", libc::ENOSPC))?;
        self.bufs.push((id, Arc::new(buf)));
        Ok(())
    }

    /// Registers a slab with room for a slot of `len` bytes: a whole one or, when memory
    /// is short, a smaller one, down to the slot's own size — at most half the room left
    /// under `RSOCK_MAX_PINNED_MB` (a stream needs a slot of the other kind too), and
    /// halved while the kernel refuses (`RLIMIT_MEMLOCK`). With whole slabs only, a 1 MiB
    /// budget held 23 connections on a link against 32 with queue pairs of their own.
    fn add_for(&mut self, len: u32) -> rdma::Result<()> {
        let least = len.next_power_of_two().max(4096);
        let half_room = u32::try_from(rdma::mr::pinned_room() / 2).unwrap_or(u32::MAX);
        let mut size = match half_room.checked_next_power_of_two() {
            Some(p) if p > half_room => p / 2,
            Some(p) => p,
            None => SLAB,
        };
        size = size.clamp(least, SLAB);
        loop {
            match self.add(size) {
                Err(e) if e.errno() == libc::ENOMEM && size / 2 >= least => size /= 2,
                done => return done,
            }
        }
    }

    /// A slot of `len` bytes and the slab it lies in, registering a slab if none has room;
    /// `None` if the link may register no more, or a registration failed (logged).
    pub(super) fn take(&mut self, len: u32) -> Option<(Slot, Arc<RegBuf>)> {
        let slot = match self.slots.alloc(len) {
            Ok(slot) => slot,
            Err(SlotsError::NeedSlab) => {
                if let Err(e) = self.add_for(len) {
                    log::info!("rdma link: no slab for a new stream: {e}");
                    return None;
                }
                self.slots.alloc(len).ok()?
            }
            Err(_) => return None,
        };
        let buf = self.buf_of(slot)?.clone();
        Some((slot, buf))
    }

    /// The memory of `slot`'s slab, if live.
    fn buf_of(&self, slot: Slot) -> Option<&Arc<RegBuf>> {
        let at = self.bufs.binary_search_by_key(&slot.slab, |b| b.0).ok()?;
        Some(&self.bufs[at].1)
    }

    /// The first slab, where stream 0's slot is.
    pub(super) fn first(&self) -> &Arc<RegBuf> {
        // The first slab holds stream 0's slot until the link goes: never released.
        &self.bufs[0].1
    }

    /// Zeroes the first `dirty` bytes of `slot` (where its stream's bytes are: the rest
    /// holds zeros) and frees it — a slot holds only zeros when a stream takes it — then
    /// deregisters idle slabs beyond the spare. Nobody may use the slot any more.
    pub(super) fn give_back(&mut self, slot: Slot, dirty: u32) {
        if let Some(buf) = self.buf_of(slot) {
            // SAFETY: inside the slab (the allocator's offsets); its stream is gone and the
            // peer is done with it.
            unsafe {
                std::ptr::write_bytes(
                    buf.as_ptr().add(slot.offset as usize),
                    0,
                    dirty.min(slot.len) as usize,
                )
            };
        }
        if self.slots.free(slot).is_err() {
            return;
        }
        while let Some(id) = self.slots.release_idle(SPARE_SLABS) {
            // A stream's slot holds its slab's memory until the slot drops, so none is
            // left here: the registration goes when the last reference does.
            self.bufs.retain(|b| b.0 != id);
        }
    }

    /// Whether a slot of `len` bytes may still be had (in a live slab, or one to add).
    pub(super) fn has_room(&self, len: u32) -> bool {
        self.slots.allocated_bytes() + u64::from(len) <= ROOM
    }

    /// Whether more than half of what the link may register is taken.
    pub(super) fn is_tight(&self) -> bool {
        self.slots.allocated_bytes() * 2 > ROOM
    }

    /// Bytes taken, and bytes registered.
    pub(super) fn usage(&self) -> (u64, u64) {
        (self.slots.allocated_bytes(), self.slots.slab_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::super::parts::MAX_STREAMS;
    use super::*;

    #[test]
    fn the_slabs_hold_every_stream_a_link_may_carry() {
        let streams = u64::from(MAX_STREAMS) * u64::from(STREAM_BUF) + u64::from(CONTROL_BUF);
        assert!(ROOM >= streams);
        // Whole slots per slab: the buddy allocator wastes nothing on these sizes.
        assert_eq!(SLAB % STREAM_BUF, 0);
        assert!(FIRST_SLAB.is_power_of_two() && FIRST_SLAB <= SLAB);
        assert_eq!(FIRST_SLAB, 64 * 1024);
    }
}
