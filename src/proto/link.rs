//! Links shared between streams (issue #24): many TCP-like streams between the same two
//! processes carried over one RDMA queue pair, the *link*, instead of one queue pair each
//! (docs/DESIGN.md, "Links"; PROTOCOL.md §14). Being built: nothing here is used by the
//! engine yet.
//!
//! A link registers memory once, in large *slabs*, and carves each stream's receive ring and
//! send buffer out of them as a *slot*, so opening a stream costs no memory registration.
//!
//! - [`Control`]: one end's control plane: records queued into stream 0 and those read from
//!   it, applied to the stream table as events for the driver.
//! - [`Mux`]: one end's data plane: stream 0, the stream table and the queue pair's shares
//!   (immediates and completions routed by stream, tagged work requests, each stream's share
//!   of the receive and send queues); the streams' `Conn`s are the driver's.
//! - [`imm`]: the immediate of a stream on a link (its id and a lone connection's meaning),
//!   and the [`Codec`](imm::Codec) a [`Conn`](super::Conn) speaks.
//! - [`record`]: the control records of a link's stream 0 (OPEN, ACCEPT, REFUSE, CLOSE,
//!   GOODBYE): their encoding and an incremental parser.
//! - [`Slots`]: which slab and offset each slot gets (a buddy allocator; offset arithmetic only).
//! - [`Streams`]: one end's stream ids — opening, open, closing — and when an id may be reused.
//!
//! Like the rest of `proto`, nothing here does I/O: the driver registers and deregisters the
//! slabs' memory when [`Slots`] asks for a slab or gives one back.

mod control;
pub mod imm;
mod mux;
pub mod record;
#[cfg(test)]
mod record_tests;
mod slots;
#[cfg(test)]
mod slots_tests;
mod streams;
#[cfg(test)]
mod streams_tests;

pub use control::{Control, ControlError, ControlEvent};
pub use mux::{
    tag, untag, widen, LinkEvent, Mux, MuxError, RingAt, WR_DRIVER_BITS, WR_STREAM_BITS,
    WR_STREAM_SHIFT,
};
pub use slots::{SlabId, Slot, Slots, SlotsError};
pub use streams::{LinkError, NoId, Streams};
