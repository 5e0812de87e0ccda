//! Throughput and per-message cost of the protocol core on the in-memory transport.
//!
//! `cargo run --release --example proto_bench` prints a table for 64 B, 4 KiB and 64 KiB
//! messages sent one way (A writes, B reads; credits flow back), in two modes:
//! - `msg`: one message per round (write, deliver, read): every message is its own burst;
//! - `stream`: the writer fills the send buffer before each round, so bursts coalesce.
//!
//! Each message costs three copies (app -> send buffer, send buffer -> ring as the "RDMA
//! write", ring -> app) plus the core's bookkeeping and the harness's queues; no NIC is
//! involved. Time is reported as wall clock and as this thread's CPU time (the latter is
//! what to compare on a loaded machine).
//!
//! `proto_bench MODE SIZE COUNT` runs one case and prints nothing, for
//! `valgrind --tool=callgrind` (run two counts and difference the totals to cancel setup).

use std::time::Instant;

use rsock_core::proto::{Params, ReadError, WriteError};
use rsock_core::transport::mem::{Pair, Side};

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Msg,
    Stream,
}

/// Sends `count` messages of `size` bytes from A to B; returns bytes received.
#[inline(never)]
fn run(p: &mut Pair, mode: Mode, size: usize, count: usize) -> u64 {
    let msg = vec![0x5au8; size];
    let mut buf = vec![0u8; size];
    let mut received = 0u64;
    let total = (size * count) as u64;
    let (mut sent_msgs, mut offset) = (0, 0);
    while received < total {
        while sent_msgs < count {
            match p.write(Side::A, &msg[offset..]) {
                Ok(n) => {
                    offset += n;
                    if offset == size {
                        offset = 0;
                        sent_msgs += 1;
                        if mode == Mode::Msg {
                            break;
                        }
                    }
                }
                Err(WriteError::Blocked) => break,
                Err(e) => panic!("{e:?}"),
            }
        }
        p.step().expect("no fault");
        loop {
            match p.read(Side::B, &mut buf) {
                Ok(n) => received += n as u64,
                Err(ReadError::Blocked) => break,
                Err(e) => panic!("{e:?}"),
            }
        }
    }
    received
}

fn pair() -> Pair {
    let mut p = Pair::new(Params::default(), Params::default());
    p.check_grants = false;
    p
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [mode, size, count] = &args[..] {
        let mode = if mode == "stream" {
            Mode::Stream
        } else {
            Mode::Msg
        };
        let (size, count) = (size.parse().unwrap(), count.parse().unwrap());
        let got = run(&mut pair(), mode, size, count);
        assert_eq!(got, (size * count) as u64);
        return;
    }
    println!("config: {:?}", Params::default());
    println!(
        "{:>6} {:>6} {:>8} {:>9} {:>9} {:>10} {:>8} {:>8} {:>9}",
        "mode",
        "size",
        "messages",
        "wall ns",
        "cpu ns",
        "cpu MB/s",
        "WRs/msg",
        "sig/msg",
        "cred/msg"
    );
    let cases = [(64usize, 1_000_000usize), (4096, 200_000), (65536, 20_000)];
    for mode in [Mode::Msg, Mode::Stream] {
        for (size, count) in cases {
            run(&mut pair(), mode, size, count / 10); // warm up
            let mut p = pair();
            let (start, cpu0) = (Instant::now(), thread_cpu_ns());
            let got = run(&mut p, mode, size, count);
            let (wall, cpu) = (
                start.elapsed().as_nanos() as f64,
                (thread_cpu_ns() - cpu0) as f64,
            );
            let s = p.a.conn.stats();
            let n = count as f64;
            println!(
                "{:>6} {:>6} {:>8} {:>9.1} {:>9.1} {:>10.0} {:>8.3} {:>8.3} {:>9.4}",
                if mode == Mode::Msg { "msg" } else { "stream" },
                size,
                count,
                wall / n,
                cpu / n,
                got as f64 / cpu * 1e3,
                s.writes_posted as f64 / n,
                s.signaled as f64 / n,
                p.b.conn.stats().credit_messages as f64 / n,
            );
        }
    }
}
