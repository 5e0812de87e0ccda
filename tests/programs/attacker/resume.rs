//! `--oversized-resume sent|granted|unwritten` (issue #21): a resume (PROTOCOL.md §11 step 4)
//! at positions the attacker could never have reached, on its own connection.
//!
//! The attacker connects to a server that hands connections to another process (a
//! fork-after-accept server: the child takes the connection over, so the server's end sends
//! MIGRATE{port}), waits for that MIGRATE, and resumes as the protocol says — a new QP, an
//! rdma_cm connect to the server's address at `port` with a resume hello (kind 4) carrying
//! its own ring and its correct connection id — but lies about its stream positions. It has
//! sent nothing and granted its 4 KiB ring, so the truth is `sent_end` 0, `granted_end`
//! 4096; it claims:
//!
//! - `sent`: `sent_end` 2^62 (far beyond a ring past what the server received);
//! - `granted`: `granted_end` 2^62 (a window far beyond its ring);
//! - `unwritten`: `sent_end` = the server's ring size: within a ring of what the server
//!   received, so not refused at sight, but never written.
//!
//! The server must refuse (REJECTED, or any failure of the connect) quickly, and end the
//! old connection. Prints `resume: variant=V port=P sent_end=S granted_end=G answer=EVENT
//! status=N answer_ms=T migrate_ms=M` (`answer=none` if nothing came in time; `migrate_ms`:
//! from our connect to the server's MIGRATE), then `old: ended=HOW after_ms=U` (how and
//! when, after the answer, the server ended the old connection; `ended=open` if it did not
//! within the timeout). Exit 0 when the resume was refused, 1 when it was accepted, 3 when
//! the attack could not be made (no connection, no MIGRATE), 4 when the resume got no
//! answer within the timeout.

use std::net::SocketAddr;
use std::process::exit;
use std::time::{Duration, Instant};

use rsock_core::proto::{HelloKind, Imm, ResumePoint};
use rsock_core::rdma::EventKind;

use super::{Ended, Peer, FAKE_RING_SIZE};

/// What the attacker claims in its resume.
#[derive(Clone, Copy, Debug)]
pub enum Variant {
    Sent,
    Granted,
    Unwritten,
}

impl Variant {
    pub fn parse(s: &str) -> Option<Variant> {
        match s {
            "sent" => Some(Variant::Sent),
            "granted" => Some(Variant::Granted),
            "unwritten" => Some(Variant::Unwritten),
            _ => None,
        }
    }

    /// The positions claimed, given the server's ring size.
    fn point(self, server_ring: u32) -> ResumePoint {
        let honest = ResumePoint {
            sent_end: 0,
            granted_end: u64::from(FAKE_RING_SIZE),
        };
        match self {
            Variant::Sent => ResumePoint {
                sent_end: 1 << 62,
                ..honest
            },
            Variant::Granted => ResumePoint {
                granted_end: 1 << 62,
                ..honest
            },
            Variant::Unwritten => ResumePoint {
                sent_end: u64::from(server_ring),
                ..honest
            },
        }
    }
}

pub fn run(addr: SocketAddr, timeout: Duration, variant: Variant) -> ! {
    let started = Instant::now();
    let mut p = Peer::open("R", addr, timeout).unwrap_or_else(|e| {
        println!("attacker: could not connect (R: {e})");
        exit(3)
    });
    let port = wait_migrate(&mut p, started + timeout);
    let migrate_ms = started.elapsed().as_millis();
    let at = variant.point(p.ring.ring_size);
    let mut hello = p.ours;
    hello.kind = HelloKind::Resume;
    hello.resume = Some(at);
    let bytes = hello.to_bytes();
    let to = SocketAddr::new(addr.ip(), port);
    let asked = Instant::now();
    let mut r = Peer::prepare("R2", to, timeout, 0).unwrap_or_else(|e| {
        println!("attacker: resume towards {to} not made: {e}");
        exit(3)
    });
    let answer = r.handshake(&bytes[..hello.encoded_len()], asked + timeout);
    let answer_ms = asked.elapsed().as_millis();
    let prefix = format!(
        "resume: variant={} port={port} sent_end={} granted_end={}",
        format!("{variant:?}").to_lowercase(),
        at.sent_end,
        at.granted_end
    );
    let status = match &answer {
        Ok(ev) => {
            println!(
                "{prefix} answer={} status={} answer_ms={answer_ms} migrate_ms={migrate_ms}",
                ev.name(),
                ev.status
            );
            if ev.kind == EventKind::Established {
                1
            } else {
                0
            }
        }
        Err(e) => {
            println!("{prefix} answer=none answer_ms={answer_ms} migrate_ms={migrate_ms} ({e})");
            4
        }
    };
    drop(answer);
    r.close(Duration::from_secs(2));
    // The old connection: the server must end it (nothing can continue it now).
    let answered = Instant::now();
    let until = started + timeout;
    let ended = loop {
        match p.poll_imm() {
            Err(how) => break Some(how),
            Ok(Some(_)) => continue,
            Ok(None) if Instant::now() >= until => break None,
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
        }
    };
    let how = ended.map_or("open".to_string(), |e: Ended| format!("{e:?}"));
    println!(
        "old: ended={} after_ms={}",
        how.to_lowercase(),
        answered.elapsed().as_millis()
    );
    p.close(Duration::from_secs(2));
    exit(status)
}

/// The port of the server's MIGRATE on `p`, waiting until `deadline` (exit 3 without it).
fn wait_migrate(p: &mut Peer, deadline: Instant) -> u16 {
    loop {
        match p.poll_imm() {
            Ok(Some(Imm::Migrate { port })) => return port,
            Ok(Some(_)) => continue,
            Ok(None) if Instant::now() >= deadline => {
                println!("attacker: no MIGRATE from the server in time");
                exit(3)
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(1)),
            Err(how) => {
                println!("attacker: the server ended the connection before MIGRATE ({how:?})");
                exit(3)
            }
        }
    }
}
