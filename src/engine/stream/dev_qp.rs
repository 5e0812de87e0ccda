//! The queue pair and memory of a stream on the RDMA device: its own RC queue pair and
//! registered buffers (one connection per queue pair, PROTOCOL.md §2), or its share of a
//! link's (a stream of a link, §14), which `engine/link` provides through [`LinkEnd`] and
//! [`LinkSlot`].

use super::{QueuePair, Region, Written};
use crate::proto;
use crate::proto::link::{RingAt, WR_STREAM_BITS};
use crate::rdma::{self, RegBuf, RemoteBuf, Wc};
use std::ops::Range;

/// A stream's end of a link (engine/link/member.rs).
pub trait LinkEnd: Send {
    /// The link's queue pair number.
    fn qp_num(&self) -> u32;
    /// Posts one of the stream's writes, its payload at the write's offset in `send` (the
    /// stream's send buffer).
    fn post(&mut self, w: &proto::Write, send: &dyn LinkSlot) -> rdma::Result<()>;
    /// A keepalive probe of the stream.
    fn post_probe(&mut self, wr_id: u64, remote: &RemoteBuf) -> rdma::Result<()>;
    /// The stream consumed receives: the link posts what the shares lack.
    fn post_recvs(&mut self) -> rdma::Result<()>;
    /// The stream is done: its CLOSE goes out.
    fn close(&mut self);
    /// A slot of `len` bytes of the link's slabs for the stream's bigger ring (`ring`) or
    /// send buffer, and where the peer writes into it.
    fn alloc(&self, len: u32, ring: bool) -> rdma::Result<(Box<dyn LinkSlot>, RingAt)>;
    /// The stream's bigger ring, offered: its GROW record goes out on the control stream.
    fn send_grow(&self, size: u32, at: RingAt);
    /// Nothing can reach the stream any more (its id is free at both ends).
    fn is_drained(&self) -> bool;
}

/// A slot of a link's slab: a stream's ring or send buffer (engine/link/member.rs).
pub trait LinkSlot: Send + Sync {
    /// Its first byte.
    fn as_ptr(&self) -> *mut u8;
    /// Its size in bytes.
    fn size(&self) -> usize;
    /// Where it starts in its slab.
    fn offset(&self) -> u32;
    /// The slab it lies in (what a post names as its memory region).
    fn slab(&self) -> &RegBuf;
    /// Only its first `bytes` were ever written (the rest holds zeros still): only those
    /// need scrubbing when it goes back.
    fn written(&mut self, bytes: u64);
}

/// A stream's queue pair on the device.
pub enum StreamQp {
    /// Its own, set up by rdma_cm.
    Own(rdma::RcQp),
    /// A link's, shared with the link's other streams.
    Link(Box<dyn LinkEnd>),
}

/// A stream's ring or send buffer on the device.
pub enum StreamBuf {
    /// Registered for it alone.
    Own(RegBuf),
    /// A slot of a link's slab.
    Slot(Box<dyn LinkSlot>),
}

impl StreamQp {
    /// The stream's own queue pair (rdma_cm's id, its PD, its queues), if it has one.
    pub fn own(&self) -> Option<&rdma::RcQp> {
        match self {
            StreamQp::Own(rc) => Some(rc),
            StreamQp::Link(_) => None,
        }
    }

    /// As [`own`](Self::own), mutably.
    pub fn own_mut(&mut self) -> Option<&mut rdma::RcQp> {
        match self {
            StreamQp::Own(rc) => Some(rc),
            StreamQp::Link(_) => None,
        }
    }
}

impl StreamBuf {
    /// The memory region it was registered as, if its own.
    pub fn own(&self) -> Option<&RegBuf> {
        match self {
            StreamBuf::Own(b) => Some(b),
            StreamBuf::Slot(_) => None,
        }
    }
}

impl Region for StreamBuf {
    fn as_ptr(&self) -> *mut u8 {
        match self {
            StreamBuf::Own(b) => b.as_ptr(),
            StreamBuf::Slot(s) => s.as_ptr(),
        }
    }

    fn len(&self) -> usize {
        match self {
            StreamBuf::Own(b) => b.len(),
            StreamBuf::Slot(s) => s.size(),
        }
    }
}

/// A link stream's memory is always a slot, an own stream's always its own: anything else
/// is a bug of the setup, refused as a post error rather than a panic.
fn mismatch() -> rdma::Error {
    rdma::Error::from_errno("ibv_post_send", libc::EINVAL)
}

impl QueuePair for StreamQp {
    type Buf = StreamBuf;

    fn qp_num(&self) -> u32 {
        match self {
            StreamQp::Own(rc) => rc.qp_num(),
            StreamQp::Link(m) => m.qp_num(),
        }
    }

    fn post(&mut self, w: &proto::Write, send: &StreamBuf) -> rdma::Result<()> {
        match (self, send) {
            (StreamQp::Own(rc), StreamBuf::Own(b)) => QueuePair::post(rc, w, b),
            (StreamQp::Link(m), StreamBuf::Slot(s)) => m.post(w, &**s),
            _ => Err(mismatch()),
        }
    }

    fn post_probe(&mut self, wr_id: u64, remote: &RemoteBuf) -> rdma::Result<()> {
        match self {
            StreamQp::Own(rc) => QueuePair::post_probe(rc, wr_id, remote),
            StreamQp::Link(m) => m.post_probe(wr_id, remote),
        }
    }

    fn alloc(&self, len: usize, ring: bool) -> rdma::Result<(StreamBuf, RingAt)> {
        match self {
            StreamQp::Own(rc) => {
                QueuePair::alloc(rc, len, ring).map(|(b, at)| (StreamBuf::Own(b), at))
            }
            StreamQp::Link(m) => {
                let len = u32::try_from(len)
                    .map_err(|_| rdma::Error::from_errno("link slot", libc::EINVAL))?;
                m.alloc(len, ring).map(|(b, at)| (StreamBuf::Slot(b), at))
            }
        }
    }

    fn send_grow(&self, size: u32, at: RingAt) {
        if let StreamQp::Link(m) = self {
            m.send_grow(size, at);
        }
    }

    fn post_recvs(&mut self, wr_id: u64, n: u32) -> rdma::Result<()> {
        match self {
            StreamQp::Own(rc) => QueuePair::post_recvs(rc, wr_id, n),
            StreamQp::Link(m) => m.post_recvs(),
        }
    }

    fn on_completion(&mut self, wc: &Wc) {
        if let StreamQp::Own(rc) = self {
            QueuePair::on_completion(rc, wc);
        }
    }

    fn is_shared(&self) -> bool {
        matches!(self, StreamQp::Link(_))
    }

    fn stream_done(&mut self) {
        if let StreamQp::Link(m) = self {
            m.close();
        }
    }

    fn own_wr_id(&self, wr_id: u64) -> u64 {
        match self {
            StreamQp::Own(_) => wr_id,
            // A link tags it with the stream's id (proto/link/mux.rs).
            StreamQp::Link(_) => wr_id & !WR_STREAM_BITS,
        }
    }

    fn set_disconnected(&mut self) {
        if let StreamQp::Own(rc) = self {
            QueuePair::set_disconnected(rc);
        }
    }

    fn is_conn(&self, id: *const libc::c_void) -> bool {
        match self {
            StreamQp::Own(rc) => QueuePair::is_conn(rc, id),
            // The link's id is the link's: its events never reach a stream directly.
            StreamQp::Link(_) => false,
        }
    }

    fn disconnect(&mut self) -> rdma::Result<()> {
        match self {
            StreamQp::Own(rc) => QueuePair::disconnect(rc),
            StreamQp::Link(m) => {
                m.close();
                Ok(())
            }
        }
    }

    fn start_drain(&mut self) -> rdma::Result<()> {
        match self {
            StreamQp::Own(rc) => QueuePair::start_drain(rc),
            StreamQp::Link(_) => Ok(()),
        }
    }

    fn is_drained(&self) -> bool {
        match self {
            StreamQp::Own(rc) => QueuePair::is_drained(rc),
            StreamQp::Link(m) => m.is_drained(),
        }
    }

    fn ring_switched(&self, _: &StreamBuf, _: Range<u64>) {}

    fn recycle(ring: StreamBuf, send: StreamBuf, reusable: bool, written: Written) {
        match (ring, send) {
            (StreamBuf::Own(r), StreamBuf::Own(s)) => {
                <rdma::RcQp as QueuePair>::recycle(r, s, reusable, written)
            }
            // A slot goes back to its link when it drops, scrubbed as far as it was used.
            (StreamBuf::Slot(mut r), StreamBuf::Slot(mut s)) => {
                if let Some(n) = written.ring {
                    r.written(n);
                }
                s.written(written.send);
            }
            (r, s) => drop((r, s)),
        }
    }
}
