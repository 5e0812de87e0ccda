//! `--phantom-read OUT` (issue #21): make the server's program read bytes this peer never
//! sent. The server hands a new connection a ring a finished connection used (its pool);
//! the attacker announces a full ring of DATA with a zero-length WRITE_WITH_IMM, writing
//! nothing. A server that trusts the announced length lets its program read whatever the
//! ring held — the previous client's bytes — and an echo server sends them back here.
//!
//! The attacker announces a real ring (64 KiB, registered for remote write) so the echo can
//! land, collects the server's DATA immediates, and writes the echoed bytes to OUT. It prints
//! `phantom: announced N bytes, wrote 0; echoed E bytes (Z nonzero); ended=HOW`, where HOW is
//! `disconnected` (the server dropped the connection), `reset` (a RESET immediate), `fin`,
//! `complete` (echoed all N) or `timeout`. Exit 0 when nothing nonzero came back, 1 when it did
//! (the server's program read bytes nobody sent on this connection), 3 when the attack could
//! not be made.

use std::net::SocketAddr;
use std::process::exit;
use std::time::{Duration, Instant};

use rdma_sys::ibv_wc;
use rsock_core::proto::Imm;
use rsock_core::rdma::EventKind;

use super::{Peer, WR_RECV, WR_WRITE};

/// The ring the attacker announces: room for a whole echoed ring of the server's.
const OWN_RING: usize = 64 * 1024;

/// How the wait for the echo ended.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Ended {
    Disconnected,
    Reset,
    Fin,
    Complete,
    Timeout,
}

pub fn run(addr: SocketAddr, timeout: Duration, out: &str) -> ! {
    let mut p = match Peer::open_with_ring("P", addr, timeout, OWN_RING) {
        Ok(p) => p,
        Err(e) => {
            println!("attacker: could not connect (P: {e})");
            exit(3)
        }
    };
    let announced = p.ring.ring_size;
    let imm = Imm::Data { len: announced }.encode();
    // Not waited for here: its completion and the echo are collected in one loop.
    if let Err(e) = p.post_imm(imm) {
        println!("attacker: phantom DATA not posted: {e}");
        exit(3)
    }
    let (echoed, ended) = collect(&mut p, u64::from(announced), timeout);
    let got = &p.own_ring[p.own_at..][..echoed.min(OWN_RING as u64) as usize];
    let nonzero = got.iter().filter(|&&b| b != 0).count();
    if let Err(e) = std::fs::write(out, got) {
        println!("attacker: cannot write {out}: {e}");
        exit(3)
    }
    println!(
        "phantom: announced {announced} bytes, wrote 0; echoed {echoed} bytes ({nonzero} nonzero); ended={}",
        format!("{ended:?}").to_lowercase()
    );
    p.close(Duration::from_secs(2));
    exit(i32::from(nonzero > 0))
}

/// Waits for the server's answer: DATA immediates (summed), until `want` bytes came, the
/// connection ends, or `timeout`. Each receive is reposted; credits are ignored (the echo
/// fits in the announced ring).
fn collect(p: &mut Peer, want: u64, timeout: Duration) -> (u64, Ended) {
    let deadline = Instant::now() + timeout;
    let ch = p.id.as_ref().expect("connected").channel().clone();
    let mut echoed = 0u64;
    // SAFETY: plain C struct; zero is valid.
    let mut wcs: [ibv_wc; 16] = unsafe { std::mem::zeroed() };
    while Instant::now() < deadline {
        // SAFETY: live CQ; room for 16 entries.
        let n = unsafe { rdma_sys::ibv_poll_cq(p.cq, 16, wcs.as_mut_ptr()) };
        for wc in &wcs[..n.max(0) as usize] {
            if wc.wr_id == WR_WRITE && wc.status != rdma_sys::ibv_wc_status::IBV_WC_SUCCESS {
                println!(
                    "attacker: the phantom DATA write failed: status {}",
                    wc.status
                );
                exit(3)
            }
            if wc.wr_id != WR_RECV {
                continue;
            }
            if wc.status != rdma_sys::ibv_wc_status::IBV_WC_SUCCESS {
                return (echoed, Ended::Disconnected); // flushed: the QP is down
            }
            let _ = p.repost_recv();
            // SAFETY: a u32 either way; a receive with immediate fills it.
            let raw = unsafe { wc.imm_data_invalidated_rkey_union.imm_data };
            match Imm::decode(u32::from_be(raw)) {
                Ok(Imm::Data { len }) => echoed += u64::from(len),
                Ok(Imm::Reset) => return (echoed, Ended::Reset),
                Ok(Imm::Fin) => return (echoed, Ended::Fin),
                _ => {}
            }
        }
        if echoed >= want {
            return (echoed, Ended::Complete);
        }
        if let Ok(Some(ev)) = ch.get_event(Some(Duration::ZERO)) {
            if ev.kind == EventKind::Disconnected {
                return (echoed, Ended::Disconnected);
            }
        }
        if n <= 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    (echoed, Ended::Timeout)
}
