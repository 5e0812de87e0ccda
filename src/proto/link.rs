//! Links: many streams between the same two processes sharing one RC queue pair, its
//! protection domain and memory registered once (docs/DESIGN.md, "Links"). Being built: what
//! is here is not yet used by the engine.
//!
//! - [`imm`]: the immediate of a stream on a link (its id and a lone connection's meaning).

pub mod imm;
