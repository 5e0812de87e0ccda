//! The helper thread's epoll tags: what woke it, by kind in the top byte, with the device
//! index, listener or stream token, or caller fd below. Shared by every room that adds an
//! fd to the helper's epoll set.

pub(super) const TAG_WAKE: u64 = 0;
pub(super) const TAG_CM: u64 = 1 << 56;
pub(super) const TAG_DEV: u64 = 2 << 56;
pub(super) const TAG_LISTEN_RDMA: u64 = 3 << 56;
pub(super) const TAG_LISTEN_TCP: u64 = 4 << 56;
pub(super) const TAG_IPC: u64 = 5 << 56;
pub(super) const TAG_HOLD: u64 = 6 << 56;
pub(super) const TAG_ASYNC: u64 = 7 << 56;
pub(super) const TAG_IPC_CONN: u64 = 8 << 56;
/// The doorbell of a listener this process has a branch of rang (listener/branch.rs).
pub(super) const TAG_BRANCH_RANG: u64 = 9 << 56;
pub(super) const TAG_MASK: u64 = 0xff << 56;
