//! An RC connection: a cm id plus its QP, with send/receive queue accounting.
//!
//! The QP posts both queues' completions to its device's shared CQ; whoever polls that
//! CQ hands each completion to the owning `RcQp` (found by [`Wc::qp_num`]) through
//! [`RcQp::on_send_completion`] / [`RcQp::on_recv_completion`], which free queue slots.
//!
//! Signaling is selective: an unsignaled WRITE produces no completion on success, so its
//! send-queue slot is freed by the next signaled one (RC completes in order). `post_*`
//! force a signaled WR at least every `max_send_wr / 2` WRs and on the last free slot
//! ([`Signal::Auto`]), so the send queue can never fill up with slots nobody will free —
//! unless the caller owns signalling ([`Signal::No`]: the stream protocol), when this only
//! counts slots.
//!
//! wr_ids: callers use values below [`DRAIN_SEND_WR_ID`]; receive WRs are posted with
//! [`RECV_FLAG`] added, which [`Wc::wr_id`] strips and [`Wc::is_recv`] reports.
//!
//! Teardown: [`RcQp::disconnect`] (the QP goes to the error state and flushes), then
//! [`RcQp::start_drain`] and keep feeding completions until [`RcQp::is_drained`], then
//! drop: the QP is destroyed before the id, its CQ entries are returned to the device,
//! and no completion of it can arrive later. Dropping without draining is allowed (e.g.
//! on a fatal error) but may leave flushed completions of this QP in the shared CQ, which
//! the poller must then discard (their `qp_num` matches no connection).

use std::collections::VecDeque;
use std::sync::Arc;

use rdma_sys::{
    ibv_qp, ibv_qp_init_attr, ibv_qp_type, ibv_recv_wr, ibv_send_flags, ibv_send_wr, ibv_sge,
    ibv_wr_opcode,
};

use super::cm::{CmId, ConnParam};
use super::device::Device;
use super::error::{Error, Reason, Result};
use super::ffi::lib;
use super::mr::{RemoteBuf, Sge};
use super::pd::Pd;
use super::wc::{Wc, DRAIN_SEND_WR_ID, RECV_FLAG};

/// Queue sizes of an RC QP: asked for in [`RcQp::new`], granted in [`RcQp::caps`]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    /// Send queue depth
    pub max_send_wr: u32,
    /// Receive queue depth
    pub max_recv_wr: u32,
    /// SGEs per send WR
    pub max_send_sge: u32,
    /// Largest inline send; [`RcQp::new`] lowers it until the device accepts the QP
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        use crate::proto::{DEFAULT_MAX_INLINE, DEFAULT_RECV_CREDITS, DEFAULT_SEND_QUEUE_DEPTH};
        // What a stream asks for (`engine::setup::qp_caps`): one send WR more than the
        // protocol's queue depth, for a keepalive probe.
        QpCaps {
            max_send_wr: DEFAULT_SEND_QUEUE_DEPTH + 1,
            max_recv_wr: DEFAULT_RECV_CREDITS,
            max_send_sge: 2,
            max_inline_data: DEFAULT_MAX_INLINE,
        }
    }
}

/// Whether a send WR asks for a completion
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// Always signaled: its completion (with its wr_id) will be seen
    Yes,
    /// Unsignaled unless the queue accounting needs a signal here
    Auto,
    /// Unsignaled: the caller decides signalling and promises a later signaled WR (the
    /// stream protocol, which owns it: proto's `Write::signaled`)
    No,
}

/// An RC connection (see the module doc); `Send`, not `Sync`
pub struct RcQp {
    qp: *mut ibv_qp,
    qp_num: u32,
    caps: QpCaps,
    dev: Arc<Device>,
    /// The connection's own PD (its ring and send buffer are registered in it).
    pd: Arc<Pd>,
    /// The device CQ it posts to, and the entries it holds there.
    cq_slot: usize,
    cqe_reserved: u32,
    sq: SqAccount,
    rq_posted: u32,
    broken: bool,
    disconnected: bool,
    drain_sq_posted: bool,
    drain_sq: bool,
    // Last: dropped after Drop::drop destroyed the QP.
    id: CmId,
}

// SAFETY: the QP is used through &mut self only; verbs are thread-safe.
unsafe impl Send for RcQp {}

fn sq_full() -> Error {
    Error::new("ibv_post_send", libc::ENOBUFS, Reason::Resources)
}

/// Send-queue accounting under selective signaling (pure logic, no verbs)
#[derive(Debug)]
struct SqAccount {
    depth: u32,
    used: u32,
    unsignaled_run: u32,
    signal_every: u32,
    /// Sizes of signaled batches in flight (each = its unsignaled run + itself)
    batches: VecDeque<u32>,
}

impl SqAccount {
    fn new(depth: u32) -> SqAccount {
        let depth = depth.max(1);
        SqAccount {
            depth,
            used: 0,
            unsignaled_run: 0,
            signal_every: (depth / 2).max(1),
            batches: VecDeque::new(),
        }
    }

    fn room(&self) -> u32 {
        self.depth - self.used
    }

    /// Whether the next WR must be signaled: asked for, a run long enough, or the last slot
    fn want_signal(&self, s: Signal) -> bool {
        if s == Signal::No {
            return false;
        }
        s == Signal::Yes
            || self.unsignaled_run + 1 >= self.signal_every
            || self.used + 1 >= self.depth
    }

    /// A WR was posted (the caller checked `room() > 0`)
    fn posted(&mut self, signaled: bool) {
        self.used += 1;
        if signaled {
            self.batches.push_back(self.unsignaled_run + 1);
            self.unsignaled_run = 0;
        } else {
            self.unsignaled_run += 1;
        }
    }

    /// A signaled WR completed successfully: frees it and the unsignaled run before it
    fn completed(&mut self) -> u32 {
        let n = self.batches.pop_front().unwrap_or(1);
        self.used = self.used.saturating_sub(n);
        n
    }
}

impl RcQp {
    /// Creates an RC QP on `id` (resolved or from a connect request) in `pd`, posting to
    /// its device's CQ. Lowers `max_inline_data` until the device accepts it.
    /// On failure the id is handed back (to reject a connect request, say).
    pub fn new(id: CmId, pd: &Arc<Pd>, want: QpCaps) -> std::result::Result<RcQp, (Error, CmId)> {
        let dev = pd.device();
        let lib = match lib() {
            Ok(l) => l,
            Err(e) => return Err((e, id)),
        };
        if id.verbs().is_null() || id.verbs() != dev.context() {
            return Err((
                Error::new("rdma_create_qp", libc::EINVAL, Reason::Other),
                id,
            ));
        }
        // Entries in a CQ with room are reserved before the QP exists (it must post to one
        // that can take its depth), then trued up to what the device granted.
        let asked = want.max_send_wr.max(1) + want.max_recv_wr.max(1);
        let slot = match dev.cqs().reserve(asked) {
            Ok(slot) => slot,
            Err(e) => return Err((e, id)),
        };
        let cq = dev.cqs().cq(slot);
        let mut inline = want.max_inline_data;
        let (qp, caps) = loop {
            // SAFETY: plain C struct; zero is valid for all fields.
            let mut attr: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
            attr.send_cq = cq;
            attr.recv_cq = cq;
            attr.qp_type = ibv_qp_type::IBV_QPT_RC;
            attr.sq_sig_all = 0;
            attr.cap.max_send_wr = want.max_send_wr.max(1);
            attr.cap.max_recv_wr = want.max_recv_wr.max(1);
            attr.cap.max_send_sge = want.max_send_sge.max(1);
            attr.cap.max_recv_sge = 1;
            attr.cap.max_inline_data = inline;
            // SAFETY: live id on dev's context, live PD and CQ; attr is valid and is
            // updated with the granted caps.
            let ret = unsafe { (lib.rdma_create_qp)(id.as_ptr(), pd.as_ptr(), &mut attr) };
            if ret == 0 {
                // SAFETY: rdma_create_qp stored the QP in the id.
                let qp = unsafe { (*id.as_ptr()).qp };
                let c = attr.cap;
                break (
                    qp,
                    QpCaps {
                        max_send_wr: c.max_send_wr,
                        max_recv_wr: c.max_recv_wr,
                        max_send_sge: c.max_send_sge,
                        max_inline_data: c.max_inline_data,
                    },
                );
            }
            let e = Error::from_ret("rdma_create_qp", ret);
            if e.errno() == libc::EINVAL && inline > 0 {
                inline = if inline > 64 { inline / 2 } else { 0 };
                continue;
            }
            let e = if e.reason() == Reason::Other {
                e.with_reason(Reason::Resources)
            } else {
                e
            };
            dev.cqs().release(slot, asked);
            return Err((e, id));
        };
        let reserve = caps.max_send_wr + caps.max_recv_wr;
        if reserve > asked {
            if let Err(e) = dev.cqs().add(slot, reserve - asked) {
                dev.cqs().release(slot, asked);
                // SAFETY: the QP was just created on this id and is not used.
                unsafe { (lib.rdma_destroy_qp)(id.as_ptr()) };
                return Err((e, id));
            }
        } else {
            dev.cqs().release(slot, asked - reserve);
        }
        Ok(RcQp {
            qp,
            // SAFETY: live QP.
            qp_num: unsafe { (*qp).qp_num },
            caps,
            dev: dev.clone(),
            pd: pd.clone(),
            cq_slot: slot,
            cqe_reserved: reserve,
            sq: SqAccount::new(caps.max_send_wr),
            rq_posted: 0,
            broken: false,
            disconnected: false,
            drain_sq_posted: false,
            drain_sq: false,
            id,
        })
    }

    /// The cm id
    pub fn id(&self) -> &CmId {
        &self.id
    }

    /// The cm id, mutably (token, migrate)
    pub fn id_mut(&mut self) -> &mut CmId {
        &mut self.id
    }

    /// The device (its CQ)
    pub fn device(&self) -> &Arc<Device> {
        &self.dev
    }

    /// The connection's protection domain
    pub fn pd(&self) -> &Arc<Pd> {
        &self.pd
    }

    /// QP number, as in [`Wc::qp_num`]
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// Granted queue sizes (`max_inline_data` is what inline sends may carry)
    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    /// Free send-queue slots
    pub fn sq_room(&self) -> u32 {
        self.sq.room()
    }

    /// Receive WRs posted and not yet completed
    pub fn rq_posted(&self) -> u32 {
        self.rq_posted
    }

    /// Whether an error completion or disconnect made the QP unusable
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// Active side: sends the connect request with `param` (private data ≤ 56 bytes)
    pub fn connect(&mut self, param: &ConnParam<'_>) -> Result<()> {
        self.id.connect(param)
    }

    /// Passive side: accepts with `param` (private data ≤ 196 bytes)
    pub fn accept(&mut self, param: &ConnParam<'_>) -> Result<()> {
        self.id.accept(param)
    }

    /// Passive side: rejects with private data (≤ 148 bytes)
    pub fn reject(&mut self, private_data: &[u8]) -> Result<()> {
        self.id.reject(private_data)
    }

    /// Records that this id's `DISCONNECTED` event was seen (so [`super::close`] does not
    /// wait for it again); the QP is in the error state from then on
    pub fn set_disconnected(&mut self) {
        self.disconnected = true;
        self.broken = true;
    }

    /// Whether `DISCONNECTED` was seen ([`Self::set_disconnected`])
    pub fn is_disconnected(&self) -> bool {
        self.disconnected
    }

    /// Starts an orderly disconnect; the QP flushes outstanding WRs
    pub fn disconnect(&mut self) -> Result<()> {
        self.broken = true;
        self.id.disconnect()
    }

    fn check_usable(&self) -> Result<()> {
        if self.broken {
            return Err(Error::new(
                "ibv_post_send",
                libc::ENOTCONN,
                Reason::Disconnected,
            ));
        }
        Ok(())
    }

    /// # Safety
    /// `sges` stay registered and unmodified until the WR completes (inline: until return).
    #[allow(clippy::too_many_arguments)]
    unsafe fn post_send_raw(
        &mut self,
        wr_id: u64,
        sges: *mut ibv_sge,
        nsge: usize,
        total: usize,
        remote: u64,
        rkey: u32,
        imm: Option<u32>,
        signal: Signal,
        force_inline: bool,
    ) -> Result<()> {
        self.check_usable()?;
        if wr_id >= DRAIN_SEND_WR_ID {
            return Err(Error::new("ibv_post_send", libc::EINVAL, Reason::Other));
        }
        if self.sq.room() == 0 {
            return Err(sq_full());
        }
        let signaled = self.sq.want_signal(signal);
        // SAFETY: plain C struct; zero is valid.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = if nsge == 0 {
            std::ptr::null_mut()
        } else {
            sges
        };
        wr.num_sge = nsge as i32;
        let mut flags = ibv_send_flags(0);
        if signaled {
            flags |= ibv_send_flags::IBV_SEND_SIGNALED;
        }
        if force_inline || (total > 0 && total <= self.caps.max_inline_data as usize) {
            flags |= ibv_send_flags::IBV_SEND_INLINE;
        }
        wr.send_flags = flags.0;
        match imm {
            Some(v) => {
                wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
                wr.imm_data_invalidated_rkey_union.imm_data = v.to_be();
            }
            None => wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE,
        }
        wr.wr.rdma.remote_addr = remote;
        wr.wr.rdma.rkey = rkey;
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: live QP; wr and its SGEs are valid for the call (inline data is copied,
        // other SGEs are the caller's contract). rdma-sys calls the provider through the
        // context ops table: no libibverbs symbol is needed.
        let ret = unsafe { rdma_sys::ibv_post_send(self.qp, &mut wr, &mut bad) };
        if ret != 0 {
            let errno = if ret > 0 { ret } else { libc::EIO };
            return Err(if errno == libc::ENOMEM {
                sq_full()
            } else {
                Error::from_errno("ibv_post_send", errno)
            });
        }
        self.sq.posted(signaled);
        Ok(())
    }

    /// RDMA WRITE (with immediate if `imm` is `Some`) of registered memory to
    /// `remote_addr`. Sent inline when the total fits [`QpCaps::max_inline_data`].
    /// Fails with `ENOBUFS` ([`Reason::Resources`]) when the send queue is full: poll.
    ///
    /// # Safety
    /// The memory behind `sges` must stay registered and unchanged until the WR is known
    /// complete (a later signaled completion), unless it was sent inline.
    pub unsafe fn post_write(
        &mut self,
        wr_id: u64,
        sges: &[Sge],
        remote_addr: u64,
        rkey: u32,
        imm: Option<u32>,
        signal: Signal,
    ) -> Result<()> {
        if sges.len() > self.caps.max_send_sge as usize {
            return Err(Error::new("ibv_post_send", libc::EINVAL, Reason::Other));
        }
        let total: usize = sges.iter().map(|s| s.length as usize).sum();
        // SAFETY: Sge has ibv_sge's layout (checked at compile time in mr.rs); the
        // provider only reads the list. Memory validity is the caller's contract.
        unsafe {
            self.post_send_raw(
                wr_id,
                sges.as_ptr() as *mut ibv_sge,
                sges.len(),
                total,
                remote_addr,
                rkey,
                imm,
                signal,
                false,
            )
        }
    }

    /// RDMA WRITE of `data` sent inline (copied at post time: no MR, reusable on return);
    /// `data.len()` must not exceed [`QpCaps::max_inline_data`]
    pub fn post_write_inline(
        &mut self,
        wr_id: u64,
        data: &[u8],
        remote: &RemoteBuf,
        offset: u64,
        imm: Option<u32>,
        signal: Signal,
    ) -> Result<()> {
        if data.len() > self.caps.max_inline_data as usize
            || offset + data.len() as u64 > remote.len
        {
            return Err(Error::new("ibv_post_send", libc::EINVAL, Reason::Other));
        }
        let mut sge = ibv_sge {
            addr: data.as_ptr() as u64,
            length: data.len() as u32,
            lkey: 0,
        };
        let n = usize::from(!data.is_empty());
        // SAFETY: IBV_SEND_INLINE makes the provider copy `data` during the call.
        unsafe {
            self.post_send_raw(
                wr_id,
                &mut sge,
                n,
                data.len(),
                remote.at(offset),
                remote.rkey,
                imm,
                signal,
                true,
            )
        }
    }

    /// Zero-length RDMA WRITE with immediate: consumes one receive at the peer and
    /// delivers `imm` (credit returns, doorbells)
    pub fn post_imm(
        &mut self,
        wr_id: u64,
        remote: &RemoteBuf,
        imm: u32,
        signal: Signal,
    ) -> Result<()> {
        // SAFETY: no SGE; remote address/rkey are given although a zero-length write
        // does not access the peer's memory.
        unsafe {
            self.post_send_raw(
                wr_id,
                std::ptr::null_mut(),
                0,
                0,
                remote.addr,
                remote.rkey,
                Some(imm),
                signal,
                false,
            )
        }
    }

    /// Posts `count` zero-length receives (the targets of incoming WRITE_WITH_IMM), all
    /// with `wr_id` (< [`DRAIN_SEND_WR_ID`]; posted with [`RECV_FLAG`] added). Fails with `ENOBUFS` if the receive queue lacks room.
    pub fn post_recvs(&mut self, wr_id: u64, count: u32) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        if wr_id >= DRAIN_SEND_WR_ID {
            return Err(Error::new("ibv_post_recv", libc::EINVAL, Reason::Other));
        }
        let wr_id = wr_id | RECV_FLAG;
        if self.rq_posted + count > self.caps.max_recv_wr {
            return Err(Error::new(
                "ibv_post_recv",
                libc::ENOBUFS,
                Reason::Resources,
            ));
        }
        let mut wrs: Vec<ibv_recv_wr> = (0..count)
            .map(|_| ibv_recv_wr {
                wr_id,
                next: std::ptr::null_mut(),
                sg_list: std::ptr::null_mut(),
                num_sge: 0,
            })
            .collect();
        for i in 0..wrs.len() - 1 {
            let next: *mut ibv_recv_wr = &mut wrs[i + 1];
            wrs[i].next = next;
        }
        self.post_recv_chain(&mut wrs, count)
    }

    fn post_recv_chain(&mut self, wrs: &mut [ibv_recv_wr], count: u32) -> Result<()> {
        let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: live QP; a valid chain of `count` WRs without SGEs; ops-table call.
        let ret = unsafe { rdma_sys::ibv_post_recv(self.qp, wrs.as_mut_ptr(), &mut bad) };
        if ret != 0 {
            // Count what made it in before `bad`.
            let ok = if bad.is_null() {
                0
            } else {
                // SAFETY: `bad` points into `wrs`.
                unsafe { bad.offset_from(wrs.as_ptr()) }.max(0) as u32
            };
            self.rq_posted += ok;
            let errno = if ret > 0 { ret } else { libc::EIO };
            return Err(Error::from_errno("ibv_post_recv", errno));
        }
        self.rq_posted += count;
        Ok(())
    }

    /// Accounts a completion of this QP's send queue (`!wc.is_recv()`); returns how many
    /// send-queue slots it freed. An error status marks the connection broken.
    pub fn on_send_completion(&mut self, wc: &Wc) -> u32 {
        if wc.wr_id() == DRAIN_SEND_WR_ID && self.drain_sq_posted {
            self.drain_sq = true;
        }
        if !wc.is_ok() {
            // Flushed WRs complete even when unsignaled: stop exact accounting.
            self.broken = true;
            return 0;
        }
        self.sq.completed()
    }

    /// Accounts a completion of this QP's receive queue. An error status marks the
    /// connection broken.
    pub fn on_recv_completion(&mut self, wc: &Wc) {
        self.rq_posted = self.rq_posted.saturating_sub(1);
        if !wc.is_ok() {
            self.broken = true;
        }
    }

    /// Accounts any completion of this QP (the queue comes from [`Wc::is_recv`])
    pub fn on_completion(&mut self, wc: &Wc) {
        if wc.is_recv() {
            self.on_recv_completion(wc)
        } else {
            self.on_send_completion(wc);
        }
    }

    /// After [`Self::disconnect`] (or a fatal error): posts a signaled marker on the send
    /// queue (wr_id [`DRAIN_SEND_WR_ID`]); in the error state it completes with a flush
    /// after every earlier send WR. The receive queue is drained when every posted
    /// receive has completed (flushed): a marker posted there in the error state is not
    /// flushed by every provider (rxe on Linux 6.1 never completes it). Call again after
    /// polling if it fails with ENOMEM (a full send queue still flushing).
    pub fn start_drain(&mut self) -> Result<()> {
        self.broken = true;
        if !self.drain_sq_posted {
            // SAFETY: plain C struct; zero is valid.
            let mut swr: ibv_send_wr = unsafe { std::mem::zeroed() };
            swr.wr_id = DRAIN_SEND_WR_ID;
            swr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
            swr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
            let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
            // SAFETY: live QP, one zero-length WR.
            let s = unsafe { rdma_sys::ibv_post_send(self.qp, &mut swr, &mut bad) };
            if s != 0 {
                return Err(Error::from_errno(
                    "start_drain",
                    if s > 0 { s } else { libc::EIO },
                ));
            }
            self.drain_sq_posted = true;
        }
        Ok(())
    }

    /// Whether the send marker completed and no receive is outstanding (no completion of
    /// this QP can follow)
    pub fn is_drained(&self) -> bool {
        self.drain_sq && self.rq_posted == 0
    }
}

impl Drop for RcQp {
    fn drop(&mut self) {
        if let Ok(lib) = lib() {
            // SAFETY: the QP belongs to `id`, which is dropped after this (field drop).
            unsafe { (lib.rdma_destroy_qp)(self.id.as_ptr()) };
        }
        self.dev.cqs().release(self.cq_slot, self.cqe_reserved);
    }
}

impl std::fmt::Debug for RcQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RcQp")
            .field("qp_num", &self.qp_num)
            .field("caps", &self.caps)
            .field("sq_room", &self.sq.room())
            .field("rq_posted", &self.rq_posted)
            .field("broken", &self.broken)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Posts Auto WRs as fast as room allows, completing signaled ones in order after a
    /// lag; the queue must never wedge (room 0 with nothing signaled in flight).
    #[test]
    fn selective_signaling_never_wedges_the_send_queue() {
        for depth in [1, 2, 3, 4, 7, 16, 128] {
            let mut sq = SqAccount::new(depth);
            let mut in_flight_signaled = 0u32;
            let mut posted = 0u32;
            let mut freed = 0u32;
            for step in 0..10_000u32 {
                if sq.room() > 0 && (step % 3 != 2 || in_flight_signaled == 0) {
                    let sig = sq.want_signal(Signal::Auto);
                    sq.posted(sig);
                    posted += 1;
                    in_flight_signaled += u32::from(sig);
                } else {
                    // Full (or choosing to complete): a signaled WR must be in flight.
                    assert!(
                        in_flight_signaled > 0,
                        "depth {depth}: full queue with no signaled WR"
                    );
                    freed += sq.completed();
                    in_flight_signaled -= 1;
                }
                assert!(sq.unsignaled_run < depth.max(1));
                assert_eq!(posted - freed, sq.used);
            }
        }
    }

    #[test]
    fn signaled_completion_frees_its_unsignaled_run() {
        let mut sq = SqAccount::new(8); // signal every 4th
        let sigs: Vec<bool> = (0..4)
            .map(|_| {
                let s = sq.want_signal(Signal::Auto);
                sq.posted(s);
                s
            })
            .collect();
        assert_eq!(sigs, [false, false, false, true]);
        assert_eq!(sq.room(), 4);
        assert_eq!(sq.completed(), 4);
        assert_eq!(sq.room(), 8);
        // An explicit signal closes a shorter run.
        sq.posted(false);
        assert!(sq.want_signal(Signal::Yes));
        sq.posted(true);
        assert_eq!(sq.completed(), 2);
        assert_eq!(sq.room(), 8);
    }

    #[test]
    fn last_slot_is_always_signaled() {
        let sq = SqAccount::new(3); // signal_every = 1: every WR signaled
        assert!(sq.want_signal(Signal::Auto));
        let mut sq = SqAccount::new(5); // signal_every = 2
        sq.posted(false);
        sq.posted(true);
        sq.posted(false);
        sq.posted(true);
        assert_eq!(sq.room(), 1);
        assert!(sq.want_signal(Signal::Auto));
        // A caller that owns signalling gets exactly what it asked for, and its slots are
        // still counted: a signaled WR frees the unsignaled run before it.
        assert!(!sq.want_signal(Signal::No));
        sq.posted(false);
        assert_eq!(sq.room(), 0);
        sq.completed();
        sq.completed();
        assert_eq!(
            sq.room(),
            4,
            "the unsignaled tail waits for a later signaled WR"
        );
    }
}
