//! `--migrate TO_PORT` (issue #9) and `--migrate-storm N` (issue #21): hostile MIGRATEs.
//!
//! Opens N connections to the server (1 for `--migrate`), then sends MIGRATE{TO_PORT}
//! (PROTOCOL.md §11: "my end moves to TO_PORT at my address", where nothing listens) on
//! all of them at once: every write is posted before any completion is awaited. Then it
//! stays connected for `--timeout`, watching each connection: the server must try each
//! resume, fail, and end the connection with an error by itself (not because we left),
//! without waiting for ever nor disturbing its other connections.
//!
//! Prints `migrate conn=NAME qpn=Q port=P sent` per connection, `attacker: MIGRATE to port P
//! sent on K of N connection(s)` once all are sent, then per connection how it ended
//! (`ended conn=NAME how=disconnected|flushed|reset after_ms=T` or `ended conn=NAME
//! how=open`), and `storm: N connections, MIGRATE sent on K; ended by the server: E
//! (last after T ms); still open: O`. Exit 0 when every MIGRATE went out, 3 when the attack
//! could not be made (a connection or a MIGRATE write failed).

use std::net::SocketAddr;
use std::process::exit;
use std::time::{Duration, Instant};

use rsock_core::proto::Imm;

use super::{Ended, Peer};

pub fn run(addr: SocketAddr, timeout: Duration, to: u16, n: usize) -> ! {
    let mut conns: Vec<Peer> = (0..n)
        .map(|i| {
            let name = if n == 1 {
                "M".to_string()
            } else {
                format!("M{}", i + 1)
            };
            Peer::open(&name, addr, timeout).unwrap_or_else(|e| {
                println!("attacker: could not connect ({name}: {e})");
                exit(3)
            })
        })
        .collect();
    let imm = Imm::Migrate { port: to }.encode();
    // All at once: post every MIGRATE, then collect the completions.
    for p in &mut conns {
        if let Err(e) = p.post_imm(imm) {
            println!("attacker: MIGRATE not posted on {}: {e}", p.name);
            exit(3)
        }
    }
    let sent_at = Instant::now();
    let mut sent = 0;
    for p in &mut conns {
        match p.wait_write(timeout) {
            Ok(o) if o.ok() => {
                sent += 1;
                println!("migrate conn={} qpn={} port={to} sent", p.name, p.qpn);
            }
            Ok(o) => println!(
                "migrate conn={} the MIGRATE write failed: {}",
                p.name,
                o.text()
            ),
            Err(e) => println!("migrate conn={} {e}", p.name),
        }
    }
    println!(
        "attacker: MIGRATE to port {to} sent on {sent} of {n} connection(s) (imm {imm:#010x})"
    );
    if sent < n {
        exit(3)
    }
    // Stay connected for the whole timeout: the server must give up on its own.
    let mut ended: Vec<Option<(Ended, Duration)>> = vec![None; n];
    let until = sent_at + timeout;
    while Instant::now() < until {
        for (p, e) in conns.iter_mut().zip(ended.iter_mut()) {
            if e.is_none() {
                // Anything the server still sends after MIGRATE is not ours to answer.
                loop {
                    match p.poll_imm() {
                        Ok(Some(_)) => continue,
                        Ok(None) => break,
                        Err(how) => {
                            *e = Some((how, sent_at.elapsed()));
                            break;
                        }
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut last = Duration::ZERO;
    let mut done = 0;
    for (p, e) in conns.iter().zip(&ended) {
        match e {
            Some((how, after)) => {
                done += 1;
                last = last.max(*after);
                println!(
                    "ended conn={} how={} after_ms={}",
                    p.name,
                    format!("{how:?}").to_lowercase(),
                    after.as_millis()
                );
            }
            None => println!("ended conn={} how=open", p.name),
        }
    }
    println!(
        "storm: {n} connections, MIGRATE sent on {sent}; ended by the server: {done} (last after {} ms); still open: {}",
        last.as_millis(),
        n - done
    );
    for p in &mut conns {
        p.close(Duration::from_secs(2));
    }
    exit(0)
}
