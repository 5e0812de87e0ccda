//! The in-memory port: two [`Stream`]s joined by a [`Wire`] that executes their work
//! requests at once, by copying into the peer's ring, and queues the completions an RC QP
//! would produce. It lets the real stream code — reads, writes, waits, the doorbell,
//! teardown — run in `cargo test` (stream/tests.rs).
//!
//! What a queue pair does is the shared model's (`transport/mem/fabric.rs`, which the
//! protocol's step-by-step `Pair` runs on too): writes land in order, a WRITE_WITH_IMM
//! consumes one posted receive (none posted: RNR, counted here, which the protocol
//! promises never to cause), only signaled writes complete, a disconnect flushes what is
//! posted and tells the peer, a QP in error or gone fails the peer's next write, a post
//! beyond the send queue's depth (the protocol's and a probe's slot) is refused; and every
//! byte written must have been granted by the ring's owner (each ring's grants, kept from
//! the writes and credits on the wire, and from what the stream holds when it switches to
//! a grown ring: `QueuePair::ring_switched`). Here: its completions become work
//! completions, a ring is plain memory known by its rkey, and a CQ arm is one-shot and rings
//! an eventfd, as the completion channel does.

use super::{Parts, Port, QueuePair, Region, Stream};
use crate::engine::ipc::Owner;
use crate::proto::link::imm::Codec;
use crate::proto::link::RingAt;
use crate::proto::{self, Hello, HelloKind, Params};
use crate::rdma::{self, RemoteBuf, Wc, DRAIN_SEND_WR_ID, RECV_FLAG};
use crate::readiness::Doorbell;
use crate::transport::mem::fabric::{credit_bytes, Cqe, Grants, Landing, Qp, Wr, WrError};
use libc::c_int;
use rdma_sys::{ibv_wc_opcode, ibv_wc_status};
use std::alloc::Layout;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

/// Plain heap memory standing in for a registered buffer (stable address, zeroed). A ring
/// is known to the wire by its rkey while it lives (as an MR is to the device).
pub struct HeapBuf {
    ptr: *mut u8,
    layout: Layout,
    ring_of: Option<(Weak<Wire>, usize, u32)>,
}

// SAFETY: owns its allocation; shared views only through &self.
unsafe impl Send for HeapBuf {}
// SAFETY: as above.
unsafe impl Sync for HeapBuf {}

impl HeapBuf {
    fn new(len: usize) -> HeapBuf {
        let layout = Layout::from_size_align(len.max(1), 64).expect("layout");
        // SAFETY: non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory");
        HeapBuf {
            ptr,
            layout,
            ring_of: None,
        }
    }

    /// A ring of `side` that the peer writes with `rkey`.
    fn ring(wire: &Arc<Wire>, side: usize, rkey: u32, len: usize) -> HeapBuf {
        let mut buf = HeapBuf::new(len);
        wire.lock()[side].rings.push(Ring {
            rkey,
            addr: buf.ptr as usize,
            len,
            grants: Grants::new(len),
        });
        buf.ring_of = Some((Arc::downgrade(wire), side, rkey));
        buf
    }
}

impl Region for HeapBuf {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    fn len(&self) -> usize {
        self.layout.size()
    }
}

impl Drop for HeapBuf {
    fn drop(&mut self) {
        if let Some((wire, side, rkey)) = self.ring_of.take() {
            if let Some(wire) = wire.upgrade() {
                wire.lock()[side].rings.retain(|r| r.rkey != rkey);
            }
        }
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// A ring writes land in, while it lives: its memory, and which bytes the peer may write.
struct Ring {
    rkey: u32,
    addr: usize,
    len: usize,
    grants: Grants,
}

/// One end's share of the wire.
struct End {
    qp: Qp,
    /// Where writes into this end land.
    rings: Vec<Ring>,
    /// The ring the stream reads now: the credits it returns give its bytes back.
    current: u32,
    armed: bool,
    wake: c_int,
}

/// The two ends' queues, under one lock (a post touches both).
pub struct Wire {
    ends: Mutex<[End; 2]>,
    /// Every RNR (a write with immediate and no receive posted): the protocol must never
    /// cause one.
    rnr: AtomicUsize,
    /// Every write outside the receiver's grants, and every credit for bytes not written:
    /// the protocol must cause none.
    grant_faults: AtomicUsize,
    /// The last rkey given out.
    rkeys: AtomicUsize,
}

impl Wire {
    fn lock(&self) -> std::sync::MutexGuard<'_, [End; 2]> {
        self.ends.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// `side`'s end and its peer's.
fn ends(e: &mut [End; 2], side: usize) -> (&mut End, &mut End) {
    let [x, y] = e;
    if side == 0 {
        (x, y)
    } else {
        (y, x)
    }
}

/// An armed end with something to poll is woken, once per arm (the completion channel's
/// event; a disconnect is the connection manager's, which wakes the engine too).
fn ring_bells(e: &mut [End; 2]) {
    for end in e.iter_mut() {
        if end.armed && (!end.qp.cq.is_empty() || end.qp.tell_disconnect) {
            end.armed = false;
            crate::sys::raw::eventfd_add(end.wake);
        }
    }
}

fn wc(qp: usize, wr_id: u64, status: u32, opcode: u32, imm: Option<u32>) -> Wc {
    // SAFETY: ibv_wc is plain data; all-zero is valid.
    let mut w: rdma_sys::ibv_wc = unsafe { std::mem::zeroed() };
    w.wr_id = wr_id;
    w.status = status;
    w.opcode = opcode;
    w.qp_num = qp_num(qp);
    if let Some(imm) = imm {
        w.wc_flags = rdma_sys::ibv_wc_flags::IBV_WC_WITH_IMM.0;
        w.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
    }
    Wc(w)
}

/// The work completion a device reports for `c`, on `side`'s CQ.
fn to_wc(side: usize, c: Cqe) -> Wc {
    use ibv_wc_status::*;
    match c {
        Cqe::Recv { imm, byte_len } => {
            let opcode = ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM;
            let mut w = wc(side, RECV_FLAG, IBV_WC_SUCCESS, opcode, Some(imm));
            w.0.byte_len = byte_len; // as a NIC reports the write's length
            w
        }
        Cqe::RecvFlushed => wc(side, RECV_FLAG, IBV_WC_WR_FLUSH_ERR, 0, None),
        Cqe::Sent { wr_id } => {
            let opcode = ibv_wc_opcode::IBV_WC_RDMA_WRITE;
            wc(side, wr_id, IBV_WC_SUCCESS, opcode, None)
        }
        Cqe::Failed { wr_id, why } => {
            let status = match why {
                WrError::Flushed => IBV_WC_WR_FLUSH_ERR,
                WrError::RetryExceeded => IBV_WC_RETRY_EXC_ERR,
                WrError::Rnr => IBV_WC_RNR_RETRY_EXC_ERR,
                WrError::RemoteAccess | WrError::OutsideGrant => IBV_WC_REM_ACCESS_ERR,
            };
            wc(side, wr_id, status, 0, None)
        }
    }
}

fn qp_num(side: usize) -> u32 {
    100 + side as u32
}

/// Where a write's bytes land: one of the peer's live rings, by rkey.
struct Into<'a> {
    rings: &'a mut [Ring],
    data: &'a [u8],
}

impl Landing for Into<'_> {
    fn ring_len(&self, rkey: u32) -> Option<usize> {
        self.rings.iter().find(|r| r.rkey == rkey).map(|r| r.len)
    }

    fn land(&mut self, rkey: u32, at: Range<usize>) -> bool {
        let Some(ring) = self.rings.iter_mut().find(|r| r.rkey == rkey) else {
            return false;
        };
        let addr = ring.addr;
        if at.end > ring.len || at.len() != self.data.len() || !ring.grants.take(at.clone()) {
            return false;
        }
        // SAFETY: inside one of the peer's live rings (bounds checked; a ring leaves the
        // list, under the wire's lock, held here, before its memory is freed).
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.data.as_ptr(),
                (addr + at.start) as *mut u8,
                at.len(),
            )
        };
        true
    }
}

/// One end's queue pair.
pub struct MemQp {
    wire: Arc<Wire>,
    side: usize,
    drained: bool,
}

impl MemQp {
    /// Posts one write and executes it at once: `data` into the peer's ring, by the shared
    /// model's rules. Refused (ENOMEM, as `ibv_post_send`) when the send queue is full.
    fn execute(&mut self, wr: Wr, data: &[u8]) -> rdma::Result<()> {
        let wire = self.wire.clone();
        let mut e = wire.lock();
        let (me, peer) = ends(&mut e, self.side);
        if !me.qp.post_send(wr.wr_id) {
            return Err(rdma::Error::from_errno("ibv_post_send", libc::ENOMEM));
        }
        let mut into = Into {
            rings: &mut peer.rings,
            data,
        };
        match me.qp.execute(&mut peer.qp, &wr, &mut into) {
            Err(WrError::Rnr) => _ = wire.rnr.fetch_add(1, SeqCst),
            Err(WrError::OutsideGrant) => _ = wire.grant_faults.fetch_add(1, SeqCst),
            // Credits this end returns give bytes of its own ring back to the peer.
            Ok(()) => {
                let current = me.current;
                let ring = me.rings.iter_mut().find(|r| r.rkey == current);
                if let (Some(r), Some(imm)) = (ring, wr.imm) {
                    if !r.grants.give_back(credit_bytes(imm, Codec::Lone)) {
                        wire.grant_faults.fetch_add(1, SeqCst);
                    }
                }
            }
            Err(_) => {}
        }
        ring_bells(&mut e);
        Ok(())
    }
}

impl QueuePair for MemQp {
    type Buf = HeapBuf;

    fn qp_num(&self) -> u32 {
        qp_num(self.side)
    }

    fn post(&mut self, w: &proto::Write, send: &HeapBuf) -> rdma::Result<()> {
        let wr_id = w.wr_id.0 | if w.signaled { super::PROTO_SIGNALED } else { 0 };
        let (start, len) = (w.local_offset as usize, w.len as usize);
        let data = send.range(start..start + len);
        self.execute(
            Wr {
                wr_id,
                ..Wr::from(w)
            },
            data,
        )
    }

    fn post_probe(&mut self, wr_id: u64, remote: &RemoteBuf) -> rdma::Result<()> {
        let wr = Wr {
            wr_id,
            rkey: remote.rkey,
            offset: 0,
            len: 0,
            imm: None,
            signaled: true,
        };
        self.execute(wr, &[])
    }

    fn alloc(&self, len: usize, ring: bool) -> rdma::Result<(HeapBuf, RingAt)> {
        if !ring {
            return Ok((HeapBuf::new(len), RingAt { rkey: 0, addr: 0 }));
        }
        let rkey = self.wire.rkeys.fetch_add(1, SeqCst) as u32 + 1;
        Ok((
            HeapBuf::ring(&self.wire, self.side, rkey, len),
            RingAt { rkey, addr: 0 },
        ))
    }

    fn post_recvs(&mut self, _: u64, n: u32) -> rdma::Result<()> {
        self.wire.lock()[self.side].qp.recvs += n;
        Ok(())
    }

    fn on_completion(&mut self, wc: &Wc) {
        if !wc.is_recv() && wc.wr_id() == DRAIN_SEND_WR_ID {
            self.drained = true;
        }
    }

    fn set_disconnected(&mut self) {}

    fn disconnect(&mut self) -> rdma::Result<()> {
        let mut e = self.wire.lock();
        let (me, peer) = ends(&mut e, self.side);
        me.qp.disconnect(&mut peer.qp);
        ring_bells(&mut e);
        Ok(())
    }

    fn start_drain(&mut self) -> rdma::Result<()> {
        let mut e = self.wire.lock();
        e[self.side].qp.flush(DRAIN_SEND_WR_ID);
        ring_bells(&mut e);
        Ok(())
    }

    fn is_drained(&self) -> bool {
        self.drained
    }

    fn ring_switched(&self, ring: &HeapBuf, held: Range<u64>) {
        let Some((_, side, rkey)) = ring.ring_of else {
            return;
        };
        let mut e = self.wire.lock();
        let me = &mut e[side];
        me.current = rkey;
        let grants = me.rings.iter_mut().find(|r| r.rkey == rkey);
        if !grants.is_some_and(|r| r.grants.hold(held.start, held.end)) {
            self.wire.grant_faults.fetch_add(1, SeqCst); // the peer wrote a held byte
        }
    }
}

impl Drop for MemQp {
    fn drop(&mut self) {
        let mut e = self.wire.lock();
        let (me, peer) = ends(&mut e, self.side);
        me.qp.destroy(&mut peer.qp);
        ring_bells(&mut e);
    }
}

/// One end's port: its CQ on the wire, polled for its one stream.
pub struct MemPort {
    wire: Arc<Wire>,
    side: usize,
    stream: OnceLock<Weak<Stream<MemPort>>>,
    poll: Mutex<()>,
    /// Streams that asked for the helper (`Port::demand_up`).
    demand: AtomicUsize,
    /// Threads sleeping on the wake fd (`Port::sleeping`).
    sleepers: AtomicUsize,
    /// Sleeps that found the stream ready only when their bound ran out (`Port::count_sleep`).
    woke_late: AtomicUsize,
    /// The port the peer said it moves to (`Port::peer_moving`), 0 if none.
    peer_moving_to: AtomicUsize,
}

impl MemPort {
    fn stream(&self) -> Option<Arc<Stream<MemPort>>> {
        self.stream.get().and_then(Weak::upgrade)
    }
}

impl MemPort {
    /// Writes into this end that found no receive posted (an RC QP would stall in RNR
    /// retries): the protocol promises none.
    pub fn rnr(&self) -> usize {
        self.wire.rnr.load(SeqCst)
    }

    /// Writes outside the receiver's grants and credits returned twice, either way: the
    /// protocol promises none.
    pub fn grant_faults(&self) -> usize {
        self.wire.grant_faults.load(SeqCst)
    }

    /// Lost wake-ups of this end's waits (sleeps that ended at their bound, stream ready).
    pub fn woke_late(&self) -> usize {
        self.woke_late.load(SeqCst)
    }

    /// The port the peer said it moves to (MIGRATE), if it did.
    pub fn peer_moving_to(&self) -> Option<u16> {
        let p = self.peer_moving_to.load(SeqCst);
        (p != 0).then_some(p as u16)
    }

    /// The peer's host vanishes: its QP stops answering, and no disconnect is heard.
    pub fn vanish_peer(&self) {
        self.wire.lock()[1 - self.side].qp.gone = true;
    }
}

impl Port for MemPort {
    type Qp = MemQp;

    fn progress(&self) -> usize {
        let Ok(_g) = self.poll.try_lock() else {
            return 0;
        };
        let Some(s) = self.stream() else { return 0 };
        let mut n = 0;
        loop {
            let (next, tell) = {
                let mut e = self.wire.lock();
                let me = &mut e[self.side].qp;
                (me.poll(), std::mem::take(&mut me.tell_disconnect))
            };
            if tell {
                s.on_disconnected_of(std::ptr::null());
                n += 1;
            }
            match next {
                Some(c) => s.on_completion(&to_wc(self.side, c)),
                None => return n,
            }
            n += 1;
        }
    }

    fn arm(&self) -> c_int {
        let mut e = self.wire.lock();
        let me = &mut e[self.side];
        me.armed = true;
        if !me.qp.cq.is_empty() || me.qp.tell_disconnect {
            me.armed = false;
            crate::sys::raw::eventfd_add(me.wake);
        }
        me.wake
    }

    fn woken(&self) {
        let wake = self.wire.lock()[self.side].wake;
        crate::sys::raw::eventfd_take(wake);
        self.progress();
        if self.sleepers.load(SeqCst) > 0 {
            self.arm();
        }
    }

    fn count_sleep(&self, woke_late: bool) {
        if woke_late {
            self.woke_late.fetch_add(1, SeqCst);
        }
    }

    fn sleeping(&self, on: bool) {
        if on {
            self.sleepers.fetch_add(1, SeqCst);
        } else {
            self.sleepers.fetch_sub(1, SeqCst);
        }
    }

    fn demand_up(&self) {
        self.demand.fetch_add(1, SeqCst);
    }

    fn demand_down(&self) {
        self.demand.fetch_sub(1, SeqCst);
    }

    fn ensure_helper(&self) {}

    fn peer_moving(&self, _: u64, port: u16) -> bool {
        // Noted for the test, which plays the engine's resume (or its absence).
        self.peer_moving_to.store(usize::from(port), SeqCst);
        true
    }
}

impl Drop for MemPort {
    fn drop(&mut self) {
        crate::sys::raw::close(self.wire.lock()[self.side].wake);
    }
}

/// Two connected streams, `a` (the connecting end) and `b`, with `config`'s sizes.
pub fn pair(config: &Params) -> (Arc<Stream<MemPort>>, Arc<Stream<MemPort>>) {
    pair_with(config, Duration::from_micros(50))
}

/// As [`pair`], with `spin` as `RSOCK_SPIN_US`.
pub fn pair_with(config: &Params, spin: Duration) -> (Arc<Stream<MemPort>>, Arc<Stream<MemPort>>) {
    // The device's send queue: the protocol's, and a slot for a keepalive probe (setup.rs).
    let end = || End {
        qp: Qp::new(0, config.send_queue_depth + 1),
        rings: Vec::new(),
        current: 0,
        armed: false,
        wake: crate::sys::raw::eventfd(),
    };
    let wire = Arc::new(Wire {
        ends: Mutex::new([end(), end()]),
        rnr: AtomicUsize::new(0),
        grant_faults: AtomicUsize::new(0),
        rkeys: AtomicUsize::new(0),
    });
    let hello = |kind| config.hello(kind, 0, 0, 7);
    // Both rings exist before either stream can post.
    let mut rings =
        [0, 1].map(|side| Some(HeapBuf::ring(&wire, side, 0, config.ring_size as usize)));
    let mut make = |side: usize, peer_hello: Hello| {
        let ring = rings[side].take().expect("ring");
        let mut qp = MemQp {
            wire: wire.clone(),
            side,
            drained: false,
        };
        qp.post_recvs(0, config.recv_credits).expect("receives");
        let opts_fd = crate::sys::unix::stream_pair().expect("options fd");
        crate::sys::raw::close(opts_fd.1);
        let parts = Parts {
            rc: qp,
            proto: proto::Conn::new(config, &peer_hello).expect("config"),
            ring,
            send: HeapBuf::new(config.send_buf_size as usize),
            local: "10.0.0.1:1".parse().expect("addr"),
            peer: "10.0.0.2:2".parse().expect("addr"),
            opts_fd: opts_fd.0,
            opts_default: false,
            token: side as u64 + 1,
            conn_id: 7,
            bell: None::<(Doorbell, proto::Readiness)>,
        };
        let port = Arc::new(MemPort {
            wire: wire.clone(),
            side,
            stream: OnceLock::new(),
            poll: Mutex::new(()),
            demand: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            woke_late: AtomicUsize::new(0),
            peer_moving_to: AtomicUsize::new(0),
        });
        let owner = Owner {
            pid: crate::sys::raw::pid(),
            nonce: 1,
        };
        let s = Stream::new(parts, port.clone(), spin, owner).expect("stream");
        port.stream.set(Arc::downgrade(&s)).ok();
        s
    };
    let a = make(0, hello(HelloKind::Accept));
    let b = make(1, hello(HelloKind::Connect));
    helper([Arc::downgrade(&a.dev), Arc::downgrade(&b.dev)]);
    (a, b)
}

/// The engine's helper thread, as the pair needs it: handles the completions of a stream
/// that asked for it (`Port::demand_up`: output waiting for the peer's credits) while no
/// program thread waits on it. Polls instead of sleeping on events; ends with the pair.
fn helper(ports: [Weak<MemPort>; 2]) {
    std::thread::spawn(move || loop {
        let mut alive = false;
        for p in ports.iter().filter_map(Weak::upgrade) {
            alive = true;
            if p.demand.load(SeqCst) > 0 {
                p.progress();
            }
        }
        if !alive {
            return;
        }
        std::thread::sleep(Duration::from_micros(200));
    });
}
