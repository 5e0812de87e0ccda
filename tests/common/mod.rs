//! Helpers the protocol test files share (each `tests/*.rs` is its own crate and uses a
//! subset).
#![allow(dead_code)]

use rsock_core::proto::{ReadError, WriteError};
use rsock_core::transport::mem::{Pair, Side};

/// Drives and checks invariants; panics on any fault.
pub fn drive(p: &mut Pair) {
    p.drive().unwrap();
    p.check_invariants().unwrap();
}

/// Everything `side` can read now (stops at EAGAIN or end of stream).
pub fn read_all(p: &mut Pair, side: Side) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 13];
    loop {
        match p.read(side, &mut buf) {
            Ok(0) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(ReadError::Blocked) => return out,
            Err(e) => panic!("{e:?}"),
        }
    }
}

/// Sends `data` from `from`, reading at the peer as it arrives; returns what was read.
pub fn transfer(p: &mut Pair, from: Side, data: &[u8]) -> Vec<u8> {
    let mut sent = 0;
    let mut got = Vec::new();
    for _ in 0..100_000 {
        if sent < data.len() {
            match p.write(from, &data[sent..]) {
                Ok(n) => sent += n,
                Err(WriteError::Blocked) => {}
                Err(e) => panic!("{e:?}"),
            }
        }
        drive(p);
        got.extend(read_all(p, from.peer()));
        drive(p);
        if got.len() == data.len() {
            return got;
        }
    }
    panic!("no progress: sent {sent}, got {}", got.len());
}

/// Position-dependent bytes (a shifted or repeated chunk shows).
pub fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
}
