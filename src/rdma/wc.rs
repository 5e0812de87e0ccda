//! One work completion as the shim reads it, and the wr_id convention that tells a
//! receive's completion from a send's (a flushed completion's opcode is undefined).

use super::ffi;
use rdma_sys::{ibv_wc, ibv_wc_flags, ibv_wc_opcode, ibv_wc_status};
/// Bit 63 of the posted wr_id marks receive WRs ([`RcQp::post_recvs`](super::RcQp::post_recvs) sets it,
/// [`Wc::is_recv`] tests it, [`Wc::wr_id`] strips it): the opcode of a flushed completion
/// is undefined, so this is how a completion's queue is known in every case.
pub const RECV_FLAG: u64 = 1 << 63;
/// wr_id of the send-queue drain marker of [`RcQp::start_drain`](super::RcQp::start_drain); callers' wr_ids must be
/// below it
pub const DRAIN_SEND_WR_ID: u64 = RECV_FLAG - 1;

/// Opcode of a completion
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum WcOpcode {
    Send,
    RdmaWrite,
    RdmaRead,
    Recv,
    /// A receive consumed by an incoming RDMA WRITE with immediate
    RecvRdmaWithImm,
    Other(u32),
}

/// One work completion (`ibv_wc`), as [`Device::poll`](super::Device::poll) fills it
#[repr(transparent)]
pub struct Wc(pub ibv_wc);

impl Wc {
    /// A copy, to keep past the poll buffer.
    pub fn copied(&self) -> Wc {
        // SAFETY: ibv_wc is plain data (no pointers owned, no drop).
        Wc(unsafe { std::ptr::read(&self.0) })
    }

    /// A zeroed buffer of `n` completions for [`Device::poll`](super::Device::poll)
    pub fn buffer(n: usize) -> Vec<Wc> {
        // SAFETY: ibv_wc is plain data; all-zero is valid.
        (0..n).map(|_| Wc(unsafe { std::mem::zeroed() })).collect()
    }

    /// The wr_id given when posting ([`RECV_FLAG`] stripped)
    pub fn wr_id(&self) -> u64 {
        self.0.wr_id & !RECV_FLAG
    }

    /// Whether this completes a receive WR; reliable for flushed completions too (it
    /// tests [`RECV_FLAG`], not the opcode)
    pub fn is_recv(&self) -> bool {
        self.0.wr_id & RECV_FLAG != 0
    }

    /// Whether the work request succeeded
    pub fn is_ok(&self) -> bool {
        self.0.status == ibv_wc_status::IBV_WC_SUCCESS
    }

    /// Raw status
    pub fn status(&self) -> u32 {
        self.0.status
    }

    /// Whether it was flushed (QP in error state, e.g. after a disconnect)
    pub fn is_flush(&self) -> bool {
        self.0.status == ibv_wc_status::IBV_WC_WR_FLUSH_ERR
    }

    /// libibverbs' name of the status
    pub fn status_str(&self) -> &'static str {
        ffi::wc_status_str(self.0.status)
    }

    /// Opcode (valid only when [`Self::is_ok`])
    pub fn opcode(&self) -> WcOpcode {
        match self.0.opcode {
            ibv_wc_opcode::IBV_WC_SEND => WcOpcode::Send,
            ibv_wc_opcode::IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
            ibv_wc_opcode::IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
            ibv_wc_opcode::IBV_WC_RECV => WcOpcode::Recv,
            ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
            o => WcOpcode::Other(o),
        }
    }

    /// Bytes written by the incoming operation (receives)
    pub fn byte_len(&self) -> u32 {
        self.0.byte_len
    }

    /// Immediate data (host order) if the completion carries one
    pub fn imm(&self) -> Option<u32> {
        if ibv_wc_flags(self.0.wc_flags) & ibv_wc_flags::IBV_WC_WITH_IMM != ibv_wc_flags(0) {
            // SAFETY: WITH_IMM says the union holds imm_data (network order).
            Some(u32::from_be(unsafe {
                self.0.imm_data_invalidated_rkey_union.imm_data
            }))
        } else {
            None
        }
    }

    /// The QP the completion belongs to (to find its connection)
    pub fn qp_num(&self) -> u32 {
        self.0.qp_num
    }

    /// Vendor error (diagnostics)
    pub fn vendor_err(&self) -> u32 {
        self.0.vendor_err
    }
}

impl std::fmt::Debug for Wc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wc")
            .field("wr_id", &self.wr_id())
            .field("recv", &self.is_recv())
            .field("status", &self.status())
            .field("opcode", &self.0.opcode)
            .field("byte_len", &self.byte_len())
            .field("imm", &self.imm())
            .field("qp_num", &self.qp_num())
            .finish()
    }
}
