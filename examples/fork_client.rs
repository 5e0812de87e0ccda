//! Client of the fork test servers (examples/prefork_server.rs, examples/fork_echo.rs,
//! tests/rdma/fork/forking_server.py; protocol in examples/support/fork_proto.rs), and of
//! plain echo servers (`socat ... EXEC:cat`, `ncat --sh-exec cat`) with `--op raw`.
//! Only `std::net`.
//!
//! ```text
//! fork_client ADDR:PORT [--op echo|sinksrc|raw|ping] [--file F | --bytes N] [--down M]
//!             [--conns K] [--parallel P] [--pause-ms MS] [--timeout SECS]
//! ```
//!
//! - `echo` (default): sends `E` + the payload (the file, or N bytes of a pattern of its
//!   own per connection), half-closes, checks that exactly the payload comes back and that
//!   the server's trailer reports the payload's sha256.
//! - `sinksrc`: sends `S<M>\n` + the payload while receiving M pattern bytes; checks both
//!   digests (the server's for the upload, its own for the download).
//! - `raw`: sends the payload, half-closes, expects exactly the payload back, then EOF
//!   (no trailer: for `cat` behind socat/ncat).
//! - `ping`: per connection: connect, send `P`, wait for the 1-byte answer, close; prints
//!   the latency of connect+answer (median, p90, min, max in µs). Connections in sequence.
//!
//! `--pause-ms`: the writer stops for MS after half of the payload (the connection stays
//! open on both sides: a test samples the device's QPs meanwhile). `--parallel P`: P
//! connections at a time (default 1). `--timeout`: per-connection read/write timeout
//! (default 60 s): a server that never answers fails the run instead of hanging it.
//!
//! Prints one line per connection, `conn I ok pid=P up=N down=M up_sha=.. down_sha=..
//! tx=.. rx=.. ms=..` (or `conn I FAIL why`), then `ok K/K connections tx=T rx=R pids=..`
//! (or `FAILED F/K ...`). Exit status 0 only if every connection checked out.

#[path = "support/fork_proto.rs"]
mod fork_proto;

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use fork_proto::{pattern, sha256_hex, Sha256, SOURCE_SEED};

#[derive(Clone, Copy, PartialEq)]
enum Op {
    Echo,
    SinkSrc,
    Raw,
    Ping,
}

#[derive(Clone)]
struct Opts {
    addr: String,
    op: Op,
    file: Option<Arc<Vec<u8>>>,
    bytes: usize,
    down: usize,
    conns: usize,
    parallel: usize,
    pause_ms: u64,
    timeout: Duration,
}

struct Outcome {
    pid: String,
    up: usize,
    down: usize,
    up_sha: String,
    down_sha: String,
    tx: u64,
    rx: u64,
    ms: u128,
}

type Finished = (usize, Result<Outcome, String>);

fn parse_trailer(t: &str) -> Option<std::collections::HashMap<String, String>> {
    let t = t.strip_prefix("digest ")?.trim_end();
    Some(
        t.split(' ')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

fn read_retry(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match r.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

fn one(o: &Opts, i: usize) -> Result<Outcome, String> {
    let t0 = Instant::now();
    let payload: Arc<Vec<u8>> = match &o.file {
        Some(f) => f.clone(),
        None => Arc::new(pattern(i as u64 + 1, o.bytes)),
    };
    let mut conn = TcpStream::connect(&o.addr).map_err(|e| format!("connect: {e}"))?;
    conn.set_read_timeout(Some(o.timeout))
        .map_err(|e| e.to_string())?;
    conn.set_write_timeout(Some(o.timeout))
        .map_err(|e| e.to_string())?;
    let head: Vec<u8> = match o.op {
        Op::Echo => b"E".to_vec(),
        Op::SinkSrc => format!("S{}\n", o.down).into_bytes(),
        Op::Raw => Vec::new(),
        Op::Ping => unreachable!(),
    };
    let tx = (head.len() + payload.len()) as u64;
    let mut w = conn.try_clone().map_err(|e| e.to_string())?;
    let (pl, pause) = (payload.clone(), o.pause_ms);
    let writer = thread::spawn(move || -> io::Result<()> {
        w.write_all(&head)?;
        let half = pl.len() / 2;
        for (k, c) in pl.chunks(64 * 1024).enumerate() {
            if pause > 0 && k * 64 * 1024 <= half && half < (k + 1) * 64 * 1024 {
                thread::sleep(Duration::from_millis(pause));
            }
            w.write_all(c)?;
        }
        if pause > 0 && pl.is_empty() {
            thread::sleep(Duration::from_millis(pause));
        }
        w.shutdown(Shutdown::Write)
    });
    // What must come back before the trailer.
    let expect: Vec<u8> = match o.op {
        Op::Echo | Op::Raw => payload.to_vec(),
        Op::SinkSrc => pattern(SOURCE_SEED, o.down),
        Op::Ping => unreachable!(),
    };
    let mut got = vec![0u8; 64 * 1024];
    let mut pos = 0usize;
    let mut rx = 0u64;
    let mut h = Sha256::new();
    let mut err = None;
    while pos < expect.len() {
        let want = (expect.len() - pos).min(got.len());
        match read_retry(&mut conn, &mut got[..want]) {
            Ok(0) => {
                err = Some(format!("EOF after {pos} of {} bytes", expect.len()));
                break;
            }
            Ok(n) => {
                if got[..n] != expect[pos..pos + n] {
                    let k = (0..n).find(|&k| got[k] != expect[pos + k]).unwrap_or(0);
                    err = Some(format!(
                        "data differs at byte {} of {}",
                        pos + k,
                        expect.len()
                    ));
                    break;
                }
                h.update(&got[..n]);
                pos += n;
                rx += n as u64;
            }
            Err(e) => {
                err = Some(format!("read after {pos} of {} bytes: {e}", expect.len()));
                break;
            }
        }
    }
    let mut tail = Vec::new();
    if err.is_none() {
        if let Err(e) = conn.read_to_end(&mut tail) {
            err = Some(format!(
                "reading the trailer: {e} (got {:?})",
                String::from_utf8_lossy(&tail)
            ));
        }
        rx += tail.len() as u64;
    }
    let wr = writer.join().map_err(|_| "writer panicked".to_string())?;
    if let Some(e) = err {
        return Err(match wr {
            Err(we) => format!("{e}; writer: {we}"),
            Ok(()) => e,
        });
    }
    wr.map_err(|e| format!("write: {e}"))?;
    let up_sha = sha256_hex(&payload);
    let down_sha = h.hex();
    let mut pid = "-".to_string();
    if o.op == Op::Raw {
        if !tail.is_empty() {
            return Err(format!("{} unexpected bytes after the echo", tail.len()));
        }
    } else {
        let t = String::from_utf8_lossy(&tail).to_string();
        let kv = parse_trailer(&t).ok_or_else(|| format!("no trailer: {t:?}"))?;
        let get = |k: &str| kv.get(k).cloned().unwrap_or_default();
        if get("up") != up_sha || get("n") != payload.len().to_string() {
            return Err(format!(
                "server received n={} up={}, sent {} bytes sha256 {up_sha}",
                get("n"),
                get("up"),
                payload.len()
            ));
        }
        if get("down") != down_sha || get("m") != expect.len().to_string() {
            return Err(format!(
                "server says it sent m={} down={}, received {} bytes sha256 {down_sha}",
                get("m"),
                get("down"),
                expect.len()
            ));
        }
        pid = get("pid");
    }
    Ok(Outcome {
        pid,
        up: payload.len(),
        down: expect.len(),
        up_sha,
        down_sha,
        tx,
        rx,
        ms: t0.elapsed().as_millis(),
    })
}

fn ping(o: &Opts) -> ExitCode {
    let mut lat = Vec::new();
    let mut failed = 0;
    for i in 0..o.conns {
        let t0 = Instant::now();
        let r = (|| -> io::Result<()> {
            let mut c = TcpStream::connect(&o.addr)?;
            c.set_read_timeout(Some(o.timeout))?;
            c.set_nodelay(true)?;
            c.write_all(b"P")?;
            let mut b = [0u8; 1];
            if read_retry(&mut c, &mut b)? != 1 || b[0] != b'p' {
                return Err(io::Error::other("no 'p' answer"));
            }
            lat.push(t0.elapsed().as_secs_f64() * 1e6);
            c.shutdown(Shutdown::Write)?;
            let mut sink = [0u8; 16];
            while read_retry(&mut c, &mut sink)? > 0 {}
            Ok(())
        })();
        if let Err(e) = r {
            println!("conn {i} FAIL {e}");
            failed += 1;
        }
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    let q = |p: f64| {
        lat.get(((lat.len() as f64 - 1.0) * p).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    println!(
        "ping conns={} ok={} median_us={:.0} p90_us={:.0} min_us={:.0} max_us={:.0}",
        o.conns,
        lat.len(),
        q(0.5),
        q(0.9),
        q(0.0),
        q(1.0)
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn usage() -> ExitCode {
    eprintln!(
        "usage: fork_client ADDR:PORT [--op echo|sinksrc|raw|ping] [--file F | --bytes N] [--down M] \
         [--conns K] [--parallel P] [--pause-ms MS] [--timeout SECS]"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(addr) = args.first().cloned() else {
        return usage();
    };
    let mut o = Opts {
        addr,
        op: Op::Echo,
        file: None,
        bytes: 1 << 20,
        down: 1 << 20,
        conns: 1,
        parallel: 1,
        pause_ms: 0,
        timeout: Duration::from_secs(60),
    };
    let mut it = args[1..].iter();
    while let Some(a) = it.next() {
        let Some(v) = it.next() else { return usage() };
        let num = |v: &str| v.parse::<usize>().ok();
        match (a.as_str(), num(v)) {
            ("--op", _) => {
                o.op = match v.as_str() {
                    "echo" => Op::Echo,
                    "sinksrc" => Op::SinkSrc,
                    "raw" => Op::Raw,
                    "ping" => Op::Ping,
                    _ => return usage(),
                }
            }
            ("--file", _) => match std::fs::read(v) {
                Ok(d) => o.file = Some(Arc::new(d)),
                Err(e) => {
                    eprintln!("fork_client: {v}: {e}");
                    return ExitCode::from(2);
                }
            },
            ("--bytes", Some(n)) => o.bytes = n,
            ("--down", Some(n)) => o.down = n,
            ("--conns", Some(n)) if n > 0 => o.conns = n,
            ("--parallel", Some(n)) if n > 0 => o.parallel = n,
            ("--pause-ms", Some(n)) => o.pause_ms = n as u64,
            ("--timeout", Some(n)) if n > 0 => o.timeout = Duration::from_secs(n as u64),
            _ => return usage(),
        }
    }
    if o.op == Op::Ping {
        return ping(&o);
    }
    let results: Arc<Mutex<Vec<Finished>>> = Arc::new(Mutex::new(Vec::new()));
    let next = Arc::new(Mutex::new(0usize));
    let workers: Vec<_> = (0..o.parallel.min(o.conns))
        .map(|_| {
            let (o, results, next) = (o.clone(), results.clone(), next.clone());
            thread::spawn(move || loop {
                let i = {
                    let mut n = next.lock().unwrap();
                    if *n >= o.conns {
                        return;
                    }
                    *n += 1;
                    *n - 1
                };
                let r = one(&o, i);
                match &r {
                    Ok(x) => println!(
                        "conn {i} ok pid={} up={} down={} up_sha={} down_sha={} tx={} rx={} ms={}",
                        x.pid, x.up, x.down, x.up_sha, x.down_sha, x.tx, x.rx, x.ms
                    ),
                    Err(e) => println!("conn {i} FAIL {e}"),
                }
                results.lock().unwrap().push((i, r));
            })
        })
        .collect();
    for w in workers {
        let _ = w.join();
    }
    let results = results.lock().unwrap();
    let ok: Vec<&Outcome> = results
        .iter()
        .filter_map(|(_, r)| r.as_ref().ok())
        .collect();
    let (tx, rx) = ok.iter().fold((0, 0), |(t, r), x| (t + x.tx, r + x.rx));
    let mut pids: Vec<&str> = ok.iter().map(|x| x.pid.as_str()).collect();
    pids.sort();
    pids.dedup();
    let failed = o.conns - ok.len();
    println!(
        "{} {}/{} connections tx={tx} rx={rx} pids={}",
        if failed == 0 { "ok" } else { "FAILED" },
        if failed == 0 { ok.len() } else { failed },
        o.conns,
        pids.join(",")
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
