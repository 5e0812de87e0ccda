//! Immediate decoder and a live connection fed arbitrary peer immediates, interleaved with
//! application reads and writes: never panic, decoding is canonical.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rsock_core::proto::wire::{Hello, HelloKind, Imm};
use rsock_core::proto::{Conn, Params};

fuzz_target!(|data: &[u8]| {
    let cfg = Params {
        ring_size: 61,
        recv_credits: 5,
        send_buf_size: 37,
        send_queue_depth: 6,
        max_inline: 4,
        ring_grow_to: 8192,
        send_grow_to: 53,
    };
    let peer = Hello {
        kind: HelloKind::Accept,
        flags: 0,
        ring_addr: 0,
        rkey: 0,
        ring_size: 29,
        recv_credits: 4,
        conn_id: 1,
        resume: None,
        branch: None,
    };
    let mut conn = Conn::new(&cfg, &peer).unwrap();
    let mut ring = vec![0u8; 61];
    let mut send_buf = vec![0u8; 37];
    let mut out = [0u8; 23];
    for chunk in data.chunks_exact(5) {
        let v = u32::from_be_bytes([chunk[1], chunk[2], chunk[3], chunk[4]]);
        if let Ok(imm) = Imm::decode(v) {
            assert_eq!(imm.encode(), v);
        }
        // A driver's part of buffers that grow, after every call.
        if conn.ring_grow_wanted().is_some() {
            conn.offer_ring(0x77);
        }
        if let Some(c) = conn.take_ring_copy() {
            let mut new = vec![0u8; c.new_size as usize];
            for (a, b) in c.pieces() {
                new[b].copy_from_slice(&ring[a]);
            }
            ring = new;
        }
        if conn.send_grow_wanted().is_some() {
            conn.offer_send_buf();
        }
        if conn.send_buf_size() as usize != send_buf.len() {
            send_buf = vec![0u8; conn.send_buf_size() as usize];
        }
        match chunk[0] % 6 {
            0 => {
                // The write's length: small, so that DATA of matching length gets through.
                let _ = conn.handle_imm(v, u32::from(chunk[0] >> 3));
            }
            1 => {
                let _ = conn.write(&mut send_buf, &out[..(chunk[1] % 23) as usize]);
            }
            2 => {
                let _ = conn.read(&ring, &mut out);
            }
            3 => {
                while let Some(w) = conn.poll_write() {
                    // Pretend the peer consumed it; only signaled ones complete.
                    if w.signaled {
                        let _ = conn.handle_send_complete(w.wr_id);
                    }
                    assert!(w.local_offset + w.len <= conn.send_buf_size());
                    let peer_ring = conn.counters().tx_peer_ring as usize;
                    assert!(w.remote_offset as usize + w.len as usize <= peer_ring);
                }
            }
            4 => {
                let n = ring.len();
                ring[v as usize % n] = chunk[1];
                while conn.poll_event().is_some() {}
            }
            _ => match chunk[1] % 4 {
                0 => conn.shutdown_write(),
                1 => conn.close(),
                2 => conn.abort(),
                _ => conn.handle_send_error(),
            },
        }
    }
});
