//! The seam under [`Stream`](super::Stream): what a stream needs of its queue pair
//! ([`QueuePair`]) and of whoever polls its completions and lets its waiters sleep
//! ([`Port`]). The RDMA device through the engine is one implementation; the in-memory one
//! (`stream/mem.rs`) runs the same stream code in `cargo test`, without a device.

use super::PROTO_SIGNALED;
use crate::engine::{Dev, Engine};
use crate::proto;
use crate::proto::link::RingAt;
use crate::rdma::{self, RegBuf, RemoteBuf, Signal, Wc};
use libc::c_int;
use std::ops::Range;

/// How many bytes from their start a freed stream's ring and send buffer were ever written
/// (`None`: maybe all of it): a link scrubs only those before the next stream has them.
#[derive(Clone, Copy, Debug)]
pub struct Written {
    pub ring: Option<u64>,
    pub send: u64,
}

/// Memory a stream's ring or send buffer lives in (registered with the device, or plain).
/// Its bytes are not Rust's alone: the peer's NIC writes a ring's free part and the local
/// NIC reads a send buffer's in-flight part at any time, so the stream looks only at the
/// ranges the protocol hands out ([`range`](Self::range), [`range_mut`](Self::range_mut)).
pub trait Region: Send + Sync {
    /// Start of the memory (a raw pointer: the NIC shares it).
    fn as_ptr(&self) -> *mut u8;
    /// Size in bytes.
    fn len(&self) -> usize;

    /// Whether it is empty (never, for a ring or send buffer).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes of `r` (panics outside the region).
    fn range(&self, r: Range<usize>) -> &[u8] {
        assert!(
            r.start <= r.end && r.end <= self.len(),
            "range outside the region"
        );
        // SAFETY: inside the allocation (checked); the protocol gave out `r` as complete
        // (a ring's received bytes) or as ours (a send buffer's free part).
        unsafe { std::slice::from_raw_parts(self.as_ptr().add(r.start), r.len()) }
    }

    /// The bytes of `r`, mutably (panics outside the region).
    fn range_mut(&mut self, r: Range<usize>) -> &mut [u8] {
        assert!(
            r.start <= r.end && r.end <= self.len(),
            "range outside the region"
        );
        // SAFETY: as `range`; `&mut self` excludes other views made through this region.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr().add(r.start), r.len()) }
    }

    /// Two disjoint ranges of it, mutably (the protocol's free space, which may wrap).
    fn ranges_mut(&mut self, [a, b]: [Range<usize>; 2]) -> [&mut [u8]; 2] {
        let len = self.len();
        let inside = |r: &Range<usize>| r.start <= r.end && r.end <= len;
        assert!(inside(&a) && inside(&b), "range outside the region");
        let disjoint = a.is_empty() || b.is_empty() || a.end <= b.start || b.end <= a.start;
        assert!(disjoint, "overlapping ranges");
        let p = self.as_ptr();
        // SAFETY: both inside the allocation and disjoint (checked); `&mut self` excludes
        // other views made through this region.
        unsafe {
            [
                std::slice::from_raw_parts_mut(p.add(a.start), a.len()),
                std::slice::from_raw_parts_mut(p.add(b.start), b.len()),
            ]
        }
    }

    /// The whole memory. Only for a region no NIC touches now (a hand-over's export).
    fn as_slice(&self) -> &[u8] {
        self.range(0..self.len())
    }

    /// The whole memory, mutably (as [`as_slice`](Self::as_slice)).
    fn as_mut_slice(&mut self) -> &mut [u8] {
        let len = self.len();
        self.range_mut(0..len)
    }
}

impl Region for RegBuf {
    fn as_ptr(&self) -> *mut u8 {
        RegBuf::as_ptr(self)
    }

    fn len(&self) -> usize {
        RegBuf::len(self)
    }
}

/// The memory type of port `P`'s streams.
pub type Buf<P> = <<P as Port>::Qp as QueuePair>::Buf;

/// The work requests a stream posts, and the bookkeeping of their completions.
pub trait QueuePair: Send {
    /// The memory its writes are sent from and land in.
    type Buf: Region;
    /// The QP number its completions carry.
    fn qp_num(&self) -> u32;
    /// Posts one protocol write: its payload from `send`, into the peer's ring it names.
    fn post(&mut self, w: &proto::Write, send: &Self::Buf) -> rdma::Result<()>;
    /// A zero-length signaled WRITE with `wr_id` (a keepalive probe, unknown to the protocol).
    fn post_probe(&mut self, wr_id: u64, remote: &RemoteBuf) -> rdma::Result<()>;
    /// Memory of `len` bytes for a buffer that grows: a ring the peer may write (with where
    /// it lies, to announce: a region of its own from 0, or a link's slot) if `ring`, else a
    /// send buffer.
    fn alloc(&self, len: usize, ring: bool) -> rdma::Result<(Self::Buf, RingAt)>;
    /// A link stream's bigger ring, offered (`Conn::take_grow_record`): its GROW record goes
    /// out on the link's control stream. A queue pair of its own sends the GROW pair itself.
    fn send_grow(&self, size: u32, at: RingAt) {
        let _ = (size, at);
    }
    /// Posts `n` receives for the peer's immediates.
    fn post_recvs(&mut self, wr_id: u64, n: u32) -> rdma::Result<()>;
    /// Accounts one completion of this QP (either queue).
    fn on_completion(&mut self, wc: &Wc);
    /// Whether other streams share the queue pair (a link's): its completions come through
    /// the link, not by the queue pair's number.
    fn is_shared(&self) -> bool {
        false
    }
    /// The stream will post nothing more and its peer nothing more to it (both ends
    /// finished, or it was reset): a link frees its id for the next stream now, rather than
    /// when the teardown gets to it.
    fn stream_done(&mut self) {}
    /// The stream's own id of a send completion's `wr_id` (a link's queue pair tags it with
    /// the stream's id).
    fn own_wr_id(&self, wr_id: u64) -> u64 {
        wr_id
    }
    /// The peer disconnected (the connection manager said so).
    fn set_disconnected(&mut self);
    /// Whether a connection manager event for `id` is about this queue pair (not one it
    /// replaced: a moved end's old queue pair disconnects after the new one is up).
    fn is_conn(&self, id: *const libc::c_void) -> bool {
        let _ = id;
        true
    }
    /// Starts the disconnect (the QP goes to the error state; what is posted flushes).
    fn disconnect(&mut self) -> rdma::Result<()>;
    /// After [`disconnect`](Self::disconnect): asks for the marker that ends the flush.
    fn start_drain(&mut self) -> rdma::Result<()>;
    /// No completion of this QP can follow.
    fn is_drained(&self) -> bool;
    /// The stream switched to the grown ring `ring`, where it holds the stream positions
    /// `held` (unread bytes moved in, or read and not yet returned): not the peer's to
    /// write. Only the in-memory port, which checks the peer's writes against what was
    /// granted, needs to know.
    fn ring_switched(&self, ring: &Self::Buf, held: Range<u64>) {
        let _ = (ring, held);
    }
    /// A freed stream's ring and send buffer, after its QP is gone: kept for the next
    /// stream if `reusable` (the sizes a new one starts with), or freed. `written`: how
    /// many bytes from their start were ever written (what must be scrubbed).
    fn recycle(ring: Self::Buf, send: Self::Buf, reusable: bool, written: Written) {
        let _ = (reusable, written);
        drop((ring, send));
    }
}

/// Where a stream's completions come from and how its waiters sleep.
pub trait Port: Send + Sync + Sized + 'static {
    /// The queue pairs of this port's streams.
    type Qp: QueuePair;
    /// Handles the completions waiting now (each reaches its stream's `on_completion`);
    /// how many. 0 also when another thread is polling.
    fn progress(&self) -> usize;
    /// Arms for the next completion and polls once more (one that landed before the arm
    /// raises no event); returns the fd that becomes readable when the next one arrives.
    fn arm(&self) -> c_int;
    /// The fd from [`arm`](Self::arm) was readable: take its event and handle completions;
    /// then arm again if other threads still sleep on it (the event was the one report of
    /// an arm they count on).
    fn woken(&self);
    /// A thread starts (`true`) or stops sleeping on the fd from [`arm`](Self::arm); counted
    /// from before its arm until before it takes an event.
    fn sleeping(&self, on: bool);
    /// A blocking call slept; `woke_late`: it found the stream ready only when its bounded
    /// sleep ran out (a lost wake-up). For the process's counters.
    fn count_sleep(&self, woke_late: bool) {
        let _ = woke_late;
    }
    /// A nonblocking write waited out its bound for completions (see `Stream::settle`).
    /// For the process's counters.
    fn count_settle_timeout(&self) {}
    /// A stream needs its completions handled while no program thread waits on it.
    fn demand_up(&self);
    /// ... and no longer does.
    fn demand_down(&self);
    /// A program thread is about to sleep: whatever rings doorbells for it must be running.
    fn ensure_helper(&self);
    /// The peer of stream `token` moves to a taker listening on `port`: resume there.
    /// False if that cannot be arranged (the stream is then reset).
    fn peer_moving(&self, token: u64, port: u16) -> bool;
}

fn engine() -> Option<&'static Engine> {
    crate::engine::get()
}

impl Port for Dev {
    type Qp = super::dev_qp::StreamQp;

    fn progress(&self) -> usize {
        engine().map_or(0, |e| e.progress(self))
    }

    fn arm(&self) -> c_int {
        if let Some(e) = engine() {
            e.sleep_armed(self);
        }
        self.dev.comp_fd()
    }

    fn woken(&self) {
        if let Some(e) = engine() {
            e.on_cq_event(self, 1);
        }
    }

    fn sleeping(&self, on: bool) {
        Dev::sleeping(self, on);
    }

    fn count_sleep(&self, woke_late: bool) {
        crate::stats::count_sleep(woke_late);
    }

    fn count_settle_timeout(&self) {
        crate::stats::count_settle_timeout();
    }

    fn demand_up(&self) {
        Dev::demand_up(self);
    }

    fn demand_down(&self) {
        Dev::demand_down(self);
    }

    fn ensure_helper(&self) {
        if let Some(e) = engine() {
            e.ensure_helper();
        }
    }

    fn peer_moving(&self, token: u64, port: u16) -> bool {
        engine().map(|e| e.schedule_resume(token, port)).is_some()
    }
}

impl QueuePair for rdma::RcQp {
    type Buf = RegBuf;

    fn qp_num(&self) -> u32 {
        rdma::RcQp::qp_num(self)
    }

    fn post(&mut self, w: &proto::Write, send: &RegBuf) -> rdma::Result<()> {
        let wr_id = w.wr_id.0 | if w.signaled { PROTO_SIGNALED } else { 0 };
        // Signalling is proto's alone (it counts the send queue and signals before it
        // fills); the verbs layer adds none.
        let signal = if w.signaled { Signal::Yes } else { Signal::No };
        let off = u64::from(w.remote_offset);
        // The peer's ring as this write names it (a grown ring has its own rkey).
        let remote = &RemoteBuf {
            addr: w.remote_addr.wrapping_sub(off),
            rkey: w.rkey,
            len: off + u64::from(w.len),
        };
        if w.len == 0 {
            return match w.imm {
                Some(imm) => self.post_imm(wr_id, remote, imm, signal),
                // A fence: a zero-length write that exists to be completed.
                // SAFETY: no SGEs; remote address inside the peer's ring.
                None => unsafe {
                    self.post_write(wr_id, &[], remote.at(off), remote.rkey, None, signal)
                },
            };
        }
        let (start, len) = (w.local_offset as usize, w.len as usize);
        if w.inline {
            let data = send.range(start..start + len);
            return self.post_write_inline(wr_id, data, remote, off, w.imm, signal);
        }
        let sge = send.sge(start, len);
        // SAFETY: the SGE lies inside our registered send buffer, the remote range inside
        // the peer's ring (the protocol checked both against its windows).
        unsafe { self.post_write(wr_id, &[sge], remote.at(off), remote.rkey, w.imm, signal) }
    }

    fn post_probe(&mut self, wr_id: u64, remote: &RemoteBuf) -> rdma::Result<()> {
        // SAFETY: no SGEs; a zero-length write names no memory of the peer's.
        unsafe { self.post_write(wr_id, &[], remote.at(0), remote.rkey, None, Signal::Yes) }
    }

    fn alloc(&self, len: usize, ring: bool) -> rdma::Result<(RegBuf, RingAt)> {
        let access = if ring {
            rdma::Access::RemoteWrite
        } else {
            rdma::Access::LocalRead
        };
        let buf = RegBuf::new(self.pd(), len, access)?;
        let rkey = buf.remote().map_or(0, |r| r.rkey);
        Ok((buf, RingAt { rkey, addr: 0 }))
    }

    fn post_recvs(&mut self, wr_id: u64, n: u32) -> rdma::Result<()> {
        rdma::RcQp::post_recvs(self, wr_id, n)
    }

    fn on_completion(&mut self, wc: &Wc) {
        rdma::RcQp::on_completion(self, wc);
    }

    fn set_disconnected(&mut self) {
        rdma::RcQp::set_disconnected(self);
    }

    fn is_conn(&self, id: *const libc::c_void) -> bool {
        self.id().as_ptr().cast_const().cast() == id
    }

    fn disconnect(&mut self) -> rdma::Result<()> {
        rdma::RcQp::disconnect(self)
    }

    fn start_drain(&mut self) -> rdma::Result<()> {
        rdma::RcQp::start_drain(self)
    }

    fn is_drained(&self) -> bool {
        rdma::RcQp::is_drained(self)
    }

    fn recycle(ring: RegBuf, send: RegBuf, reusable: bool, _: Written) {
        rdma::pool::give_back(ring, send, reusable);
    }
}
