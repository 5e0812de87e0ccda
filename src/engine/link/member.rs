//! A stream's end of a link: its writes go out on the link's queue pair tagged with its id,
//! its receives are its share of the link's receive queue, and its ring and send buffer are
//! slots of the link's slabs, given back (zeroed) when the stream and its id are done.

use super::{Link, State};
use crate::engine::stream::{LinkEnd, LinkSlot, QueuePair};
use crate::proto;
use crate::proto::link::imm::StreamId;
use crate::proto::link::{tag, RingAt, Slot, WR_STREAM_SHIFT};
use crate::rdma::{self, RegBuf, RemoteBuf};
use std::sync::Arc;

/// A stream's queue pair on a link.
pub struct Member {
    link: Arc<Link>,
    id: StreamId,
    closed: bool,
}

impl Member {
    pub(super) fn new(link: Arc<Link>, id: StreamId) -> Member {
        Member {
            link,
            id,
            closed: false,
        }
    }
}

impl LinkEnd for Member {
    fn qp_num(&self) -> u32 {
        self.link.qpn
    }

    fn post(&mut self, w: &proto::Write, send: &dyn LinkSlot) -> rdma::Result<()> {
        // After its CLOSE nothing may name the stream (the peer would fail the link).
        if self.closed {
            return Err(rdma::Error::from_errno("ibv_post_send", libc::ENOTCONN));
        }
        let mut w = tag(self.id, *w);
        w.local_offset += send.offset();
        QueuePair::post(&mut self.link.lock().rc, &w, send.slab())
    }

    fn post_probe(&mut self, wr_id: u64, remote: &RemoteBuf) -> rdma::Result<()> {
        if self.closed {
            return Err(rdma::Error::from_errno("ibv_post_send", libc::ENOTCONN));
        }
        let tagged = wr_id | u64::from(self.id.get()) << WR_STREAM_SHIFT;
        QueuePair::post_probe(&mut self.link.lock().rc, tagged, remote)
    }

    fn post_recvs(&mut self) -> rdma::Result<()> {
        let mut st = self.link.lock();
        let k = st.mux.receives_to_post();
        st.rc.post_recvs(0, k)
    }

    fn close(&mut self) {
        if std::mem::replace(&mut self.closed, true) {
            return;
        }
        log::debug!(
            "rdma link to {}: CLOSE of stream {}",
            self.link.peer,
            self.id.get()
        );
        let mut st = self.link.lock();
        st.mux.close_lazily(self.id);
        // The peer's slots for our closed streams come back only with our CLOSEs (and ours
        // with its): once half our slots are taken, none is held back.
        if st.rings.is_tight() {
            st.mux.release_closes();
        }
        let held = st.mux.holds_closes();
        st.free_quarantined();
        self.link.pump(&mut st);
        drop(st);
        if held {
            self.link.holds_closes();
        }
    }

    fn alloc(&self, len: u32, ring: bool) -> rdma::Result<(Box<dyn LinkSlot>, RingAt)> {
        let mut st = self.link.lock();
        let Some(mut slot) = SlotBuf::take(&self.link, &mut st, len, ring) else {
            return Err(rdma::Error::from_errno("link slot", libc::ENOMEM));
        };
        // Kept aside when it drops while the peer may still write into it (as every slot
        // of a stream is).
        slot.id = Some(self.id);
        let at = if ring {
            slot.ring_at()
        } else {
            RingAt { rkey: 0, addr: 0 }
        };
        Ok((Box::new(slot), at))
    }

    fn send_grow(&self, size: u32, at: RingAt) {
        if self.closed {
            return;
        }
        let mut st = self.link.lock();
        st.mux.grow(self.id, size, at);
        self.link.pump(&mut st);
    }

    fn is_drained(&self) -> bool {
        self.link.is_failed() || !self.link.lock().mux.holds(self.id)
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.close(); // the link forgets the stream once its id is free
    }
}

/// A stream's ring or send buffer: a slot of one of its link's slabs.
pub struct SlotBuf {
    link: Arc<Link>,
    pub(super) slot: Slot,
    /// The slab it lies in (kept registered while the slot lives).
    slab: Arc<RegBuf>,
    ptr: *mut u8,
    ring: bool,
    /// The stream it is for (0 until the stream has an id).
    pub(super) id: Option<StreamId>,
    /// How many bytes from its start may hold a stream's bytes (scrubbed when it goes back).
    dirty: u32,
}

// SAFETY: a view of registered memory the link keeps alive; shared views only through
// &self (the stream's lock orders them).
unsafe impl Send for SlotBuf {}
// SAFETY: as above.
unsafe impl Sync for SlotBuf {}

impl SlotBuf {
    /// Takes a slot of `len` bytes of the link's ring slab (`ring`) or send slab.
    pub(super) fn take(link: &Arc<Link>, st: &mut State, len: u32, ring: bool) -> Option<SlotBuf> {
        let slabs = if ring { &mut st.rings } else { &mut st.sends };
        let (slot, slab) = slabs.take(len)?;
        // SAFETY: the slot lies inside the slab (the allocator's offsets).
        let ptr = unsafe { slab.as_ptr().add(slot.offset as usize) };
        Some(SlotBuf {
            link: link.clone(),
            slot,
            slab,
            ptr,
            ring,
            id: None,
            dirty: slot.len,
        })
    }

    /// Where the peer writes into this ring: its slab's rkey and the slot's address.
    pub(super) fn ring_at(&self) -> crate::proto::link::RingAt {
        let mr = self.slab.mr();
        crate::proto::link::RingAt {
            rkey: mr.rkey().unwrap_or(0),
            addr: mr.iova() + u64::from(self.slot.offset),
        }
    }
}

impl LinkSlot for SlotBuf {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    fn size(&self) -> usize {
        self.slot.len as usize
    }

    fn offset(&self) -> u32 {
        self.slot.offset
    }

    fn slab(&self) -> &RegBuf {
        &self.slab
    }

    fn written(&mut self, bytes: u64) {
        self.dirty = self.dirty.min(bytes.min(u64::from(u32::MAX)) as u32);
    }
}

impl Drop for SlotBuf {
    fn drop(&mut self) {
        let mut st = self.link.lock();
        match self.id {
            // The peer may still write into a ring, and the NIC read a send buffer, until
            // the stream's id is free.
            Some(id) if st.mux.holds(id) => {
                st.quarantine.push((id, self.slot, self.ring, self.dirty));
            }
            _ => st.give_back(self.slot, self.ring, self.dirty),
        }
    }
}
