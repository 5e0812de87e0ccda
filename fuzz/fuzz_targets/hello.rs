//! Handshake decoders on arbitrary private data: never panic; what parses re-encodes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rsock_core::proto::wire::{field, Hello, Reject};

fuzz_target!(|data: &[u8]| {
    if let Ok(hello) = Hello::parse(data) {
        assert!(hello.check().is_ok());
        // Re-encoding keeps every field; only `reserved` (ignored) and `len` (extensions
        // skipped) may differ from the input.
        assert_eq!(Hello::parse(&hello.to_bytes()), Ok(hello));
        let (out, n) = (hello.to_bytes(), hello.encoded_len());
        assert_eq!(out[..field::LEN.start], data[..field::LEN.start]);
        assert_eq!(out[field::RKEY.start..n], data[field::RKEY.start..n]);
    }
    if let Ok(reject) = Reject::parse(data) {
        assert_eq!(Reject::parse(&reject.to_bytes()), Ok(reject));
    }
});
