//! Property test of the real [`Stream`](super::Stream) over the in-memory port: random
//! nonblocking reads, peeks and writes both ways, random sizes, tiny rings; every byte
//! arrives once and in order, a peek shows what the next read returns, and what poll
//! shows on the program's fd agrees with what the calls do.

use super::mem::{pair, MemPort};
use super::{Port, Stream};
use crate::proto::Params;
use proptest::prelude::*;
use proptest::test_runner::{Config as PtConfig, RngSeed};
use std::io::{IoSlice, IoSliceMut};
use std::sync::Arc;

type S = Arc<Stream<MemPort>>;

#[derive(Debug, Clone)]
enum Op {
    Write { from: usize, len: usize },
    Read { at: usize, len: usize, peek: bool },
    Progress(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..2usize, 1..700usize).prop_map(|(from, len)| Op::Write { from, len }),
        3 => (0..2usize, 1..700usize, any::<bool>())
            .prop_map(|(at, len, peek)| Op::Read { at, len, peek }),
        2 => (0..2usize).prop_map(Op::Progress),
    ]
}

fn config() -> impl Strategy<Value = Params> {
    prop_oneof![
        Just(Params {
            ring_size: 64,
            recv_credits: 4,
            send_buf_size: 64,
            send_queue_depth: 8,
            max_inline: 8,
            ring_grow_to: 0,
            send_grow_to: 0,
        }),
        Just(Params {
            ring_size: 300,
            recv_credits: 8,
            send_buf_size: 200,
            send_queue_depth: 8,
            max_inline: 16,
            ring_grow_to: 0,
            send_grow_to: 0,
        }),
        Just(Params {
            ring_size: 64,
            recv_credits: 6,
            send_buf_size: 64,
            send_queue_depth: 8,
            max_inline: 8,
            ring_grow_to: 4096,
            send_grow_to: 1000,
        }),
        Just(Params {
            ring_size: 4096,
            recv_credits: 16,
            send_buf_size: 1000,
            send_queue_depth: 16,
            max_inline: 64,
            ring_grow_to: 0,
            send_grow_to: 0,
        }),
    ]
}

/// One direction's bytes: what the writer's calls accepted, what the reader's returned.
#[derive(Default)]
struct Flow {
    sent: Vec<u8>,
    read: usize,
}

fn pollin(s: &S) -> bool {
    let mut p = libc::pollfd {
        fd: s.bell().app_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, 0) };
    p.revents & libc::POLLIN != 0
}

fn run(cfg: &Params, ops: &[Op]) -> Result<(), TestCaseError> {
    let (a, b) = pair(cfg);
    let ends = [a, b];
    ends.iter().for_each(|s| s.watch());
    let mut flows = [Flow::default(), Flow::default()]; // [a→b, b→a]
    let mut next = 0u8;
    let dontwait = libc::MSG_DONTWAIT;
    for op in ops {
        match *op {
            Op::Write { from, len } => {
                let data: Vec<u8> = (0..len)
                    .map(|_| {
                        next = next.wrapping_add(31);
                        next
                    })
                    .collect();
                match ends[from].send(&[IoSlice::new(&data)], dontwait, None) {
                    Ok(n) => flows[from].sent.extend_from_slice(&data[..n]),
                    Err(e) => prop_assert_eq!(e, libc::EAGAIN),
                }
            }
            Op::Read { at, len, peek } => {
                let flow = &mut flows[1 - at];
                let mut buf = vec![0; len];
                let flags = dontwait | if peek { libc::MSG_PEEK } else { 0 };
                match ends[at].recv(&mut [IoSliceMut::new(&mut buf)], flags, None) {
                    Ok(n) => {
                        prop_assert!(n > 0, "end of stream on an open stream");
                        let want = &flow.sent[flow.read..flow.read + n];
                        prop_assert_eq!(&buf[..n], want, "bytes out of order or changed");
                        if !peek {
                            flow.read += n;
                        }
                    }
                    Err(e) => {
                        prop_assert_eq!(e, libc::EAGAIN);
                        // Told "nothing to read": poll must not say otherwise, unless bytes
                        // arrived since (the port's helper thread handles completions of a
                        // stream waiting for credits, at any moment).
                        prop_assert!(
                            !pollin(&ends[at]) || ends[at].readable_bytes() > 0,
                            "EAGAIN, yet POLLIN"
                        );
                    }
                }
            }
            Op::Progress(i) => {
                ends[i].dev.progress();
            }
        }
    }
    // Both writers finish; everything accepted arrives once, then end of stream.
    ends.iter().for_each(|s| s.shutdown_write());
    for at in 0..2 {
        let flow = &mut flows[1 - at];
        let mut buf = vec![0; 4096];
        loop {
            match ends[at].recv(&mut [IoSliceMut::new(&mut buf)], 0, None) {
                Ok(0) => break,
                Ok(n) => {
                    prop_assert_eq!(&buf[..n], &flow.sent[flow.read..flow.read + n]);
                    flow.read += n;
                }
                Err(e) => return Err(TestCaseError::fail(format!("drain: errno {e}"))),
            }
        }
        prop_assert_eq!(flow.read, flow.sent.len(), "bytes lost");
    }
    prop_assert_eq!(ends[0].dev.rnr() + ends[1].dev.rnr(), 0);
    prop_assert_eq!(ends[0].dev.grant_faults(), 0, "a write outside the grants");
    Ok(())
}

proptest! {
    #![proptest_config(PtConfig {
        cases: 96,
        rng_seed: RngSeed::Fixed(0x7273_6f63),
        failure_persistence: None,
        ..PtConfig::default()
    })]

    #[test]
    fn random_nonblocking_traffic_arrives_intact_and_poll_agrees(
        cfg in config(),
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        run(&cfg, &ops)?;
    }
}
