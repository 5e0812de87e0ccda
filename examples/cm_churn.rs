//! Bare rdma_cm connection churn: the floor under rsock's connection setup (issue #24).
//! No rsock protocol, memory or stream: each connection is an RC QP set up and torn down.
//!
//! ```text
//! cm_churn server ADDR PORT [--conns N] [--timeout SECS]
//! cm_churn client ADDR PORT [--conns N] [--timeout SECS]
//! ```
//!
//! The client makes N connections one after another: it resolves the address and route
//! (a new id and event channel each time, as rsock does), makes a QP, connects, waits for
//! ESTABLISHED, disconnects and destroys it all. It prints the medians (µs) of resolve, QP,
//! handshake (connect to ESTABLISHED) and the whole. The server accepts N connections, each
//! with a QP of its own in one protection domain, and drops each once the next comes.
//! Used by `bench/rdma/conn-phases.sh`.
//!
//! Exit status: 0 = all N connected; 1 = failure; 2 = usage; 3 = no RDMA.

use std::net::{SocketAddr, ToSocketAddrs};
use std::process::exit;
use std::time::{Duration, Instant};

use rsock_core::rdma::{self, ConnParam, Pd, QpCaps, RcQp, Reason};

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_inline_data: 64,
    }
}

fn fail(what: &str, e: rdma::Error) -> ! {
    eprintln!("cm_churn: {what}: {e}");
    exit(if e.reason() == Reason::NoRdma { 3 } else { 1 })
}

fn usage() -> ! {
    eprintln!("usage: cm_churn server|client ADDR PORT [--conns N] [--timeout SECS]");
    exit(2)
}

fn server(addr: SocketAddr, n: usize, timeout: Duration) {
    let listener = rdma::CmListener::bind(addr, 64, 1).unwrap_or_else(|e| fail("listen", e));
    let mut pd: Option<std::sync::Arc<Pd>> = None;
    let mut last = None;
    for _ in 0..n {
        let inc = match listener.next_request(Some(timeout), &[]) {
            Ok(Some(i)) => i,
            Ok(None) => {
                eprintln!("cm_churn: no connect request in time");
                exit(1)
            }
            Err(e) => fail("next_request", e),
        };
        let pd = pd.get_or_insert_with(|| Pd::new(&inc.device).unwrap_or_else(|e| fail("pd", e)));
        let mut conn = match RcQp::new(inc.id, pd, caps()) {
            Ok(c) => c,
            Err((e, mut id)) => {
                let _ = id.reject(&[]);
                fail("create qp", e)
            }
        };
        rdma::accept(&mut conn, &ConnParam::default(), timeout)
            .unwrap_or_else(|e| fail("accept", e));
        last = Some(conn); // the one before goes (its client disconnected already)
    }
    drop(last);
    println!("cm_churn server: {n} connections accepted");
}

fn median(v: &mut [u128]) -> u128 {
    v.sort_unstable();
    v[v.len() / 2]
}

fn client(addr: SocketAddr, n: usize, timeout: Duration) {
    let mut pd: Option<std::sync::Arc<Pd>> = None;
    let (mut resolve, mut qp, mut handshake, mut whole) = (vec![], vec![], vec![], vec![]);
    let started = Instant::now();
    for _ in 0..n {
        let t0 = Instant::now();
        let (id, dev) =
            rdma::resolve(None, addr, 1, timeout).unwrap_or_else(|e| fail("resolve", e));
        let t1 = Instant::now();
        let pd = pd.get_or_insert_with(|| Pd::new(&dev).unwrap_or_else(|e| fail("pd", e)));
        let mut conn = RcQp::new(id, pd, caps()).unwrap_or_else(|(e, _)| fail("create qp", e));
        let t2 = Instant::now();
        rdma::connect(&mut conn, &ConnParam::default(), timeout)
            .unwrap_or_else(|e| fail("connect", e));
        let t3 = Instant::now();
        let _ = conn.disconnect();
        drop(conn);
        let t4 = Instant::now();
        resolve.push((t1 - t0).as_micros());
        qp.push((t2 - t1).as_micros());
        handshake.push((t3 - t2).as_micros());
        whole.push((t4 - t0).as_micros());
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "cm_churn client: {n} in {secs:.2}s ({:.0}/s) medians us: resolve={} qp={} handshake={} whole={}",
        n as f64 / secs,
        median(&mut resolve),
        median(&mut qp),
        median(&mut handshake),
        median(&mut whole)
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(mode), Some(host), Some(port)) = (args.next(), args.next(), args.next()) else {
        usage()
    };
    let (mut n, mut timeout) = (100usize, Duration::from_secs(30));
    while let Some(a) = args.next() {
        let v: u64 = args
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| usage());
        match a.as_str() {
            "--conns" if v > 0 => n = v as usize,
            "--timeout" => timeout = Duration::from_secs(v),
            _ => usage(),
        }
    }
    let Some(addr) = format!("{host}:{port}")
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
    else {
        usage()
    };
    match mode.as_str() {
        "server" => server(addr, n, timeout),
        "client" => client(addr, n, timeout),
        _ => usage(),
    }
}
