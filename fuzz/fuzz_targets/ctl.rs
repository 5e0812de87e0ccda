//! The control messages between processes (PROTOCOL.md §13) on arbitrary bytes: never
//! panic; whatever decodes re-encodes to the very same bytes (every byte of a message has
//! one meaning, reserved ones are zero).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rsock_core::engine::ipc::{Reply, Request};

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = Request::decode(data) {
        assert_eq!(&r.encode()[..], data);
    }
    if let Ok(r) = Reply::decode(data) {
        assert_eq!(&r.encode()[..], data);
    }
});
