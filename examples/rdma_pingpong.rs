//! End-to-end check of `rsock_core::rdma` on a real device (Soft-RoCE in the test bed).
//!
//! ```text
//! rdma_pingpong server ADDR PORT [--timeout SECS] [--linger SECS] [--reject]
//! rdma_pingpong client ADDR PORT [--size N] [--iters N] [--bytes N] [--ring N]
//!                                [--events] [--timeout SECS] [--linger SECS]
//! ```
//! 1. Connection: the client's request and the server's accept carry each side's receive
//!    ring (address, rkey, length) and the test parameters in rdma_cm private data.
//! 2. Ping-pong latency with RDMA WRITE_WITH_IMM, 64 B and 4 KiB (`--iters` round trips
//!    each): the server echoes the payload back; the client checks it.
//! 3. Streaming: `--bytes` in `--size` chunks written into the server's ring with
//!    WRITE_WITH_IMM, limited by credits (ring slots) that the server returns with
//!    zero-length WRITE_WITH_IMM; both sides checksum the stream (word-wise FNV-1a 64) and
//!    the server writes its sum back for the client to compare.
//!
//! `--events` sleeps on the completion channel instead of busy-polling the CQ (the client
//! passes it to the server). `--linger SECS` keeps the process alive after teardown and
//! prints `LINGER pid=N`, so a test can check that no RDMA object of it is left.
//! `server --reject` rejects the first request with private data, which the client prints.
//!
//! Exit status: 0 = all checks passed; 1 = failure; 2 = usage; 3 = no RDMA (fallback case).

use std::net::{SocketAddr, ToSocketAddrs};
use std::process::exit;
use std::time::{Duration, Instant};

use rsock_core::rdma::{
    self, Access, ConnParam, Device, Pd, QpCaps, RcQp, Reason, RegBuf, RemoteBuf, Signal, Wc,
};

const MAGIC: u32 = 0x5253_5050; // "RSPP"
const VERSION: u8 = 1;
const FLAG_EVENTS: u8 = 1;

const T_PING: u32 = 1;
const T_PONG: u32 = 2;
const T_DATA: u32 = 3;
const T_CREDIT: u32 = 4;
const T_SUM: u32 = 5;

/// What `server --reject` sends in its REJ private data
const REJECT_NOTE: &[u8] = b"RSPP:reject:test";

const WR_SEND: u64 = 1;
const WR_RECV: u64 = 2;
const RECV_DEPTH: u32 = 256;
const LAT_SIZES: [usize; 2] = [64, 4096];

fn imm(t: u32, v: u32) -> u32 {
    (t << 28) | (v & 0x0fff_ffff)
}
fn imm_type(i: u32) -> u32 {
    i >> 28
}
fn imm_val(i: u32) -> u32 {
    i & 0x0fff_ffff
}

/// Word-wise FNV-1a 64: each little-endian u64 word (tail bytes one by one) is xored in
/// and multiplied by the FNV prime. Stream-consistent for chunks that are multiples of 8.
#[derive(Clone, Copy)]
struct Sum(u64);
impl Sum {
    fn new() -> Sum {
        Sum(0xcbf2_9ce4_8422_2325)
    }
    fn update(&mut self, data: &[u8]) {
        const P: u64 = 0x0000_0100_0000_01b3;
        let mut h = self.0;
        let mut words = data.chunks_exact(8);
        for w in &mut words {
            h = (h ^ u64::from_le_bytes(w.try_into().unwrap())).wrapping_mul(P);
        }
        for &b in words.remainder() {
            h = (h ^ b as u64).wrapping_mul(P);
        }
        self.0 = h;
    }
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Fills `buf` with the stream's bytes starting at stream word `word0`
fn generate(buf: &mut [u8], word0: u64) {
    for (i, w) in buf.chunks_mut(8).enumerate() {
        let v = splitmix(word0 + i as u64).to_le_bytes();
        w.copy_from_slice(&v[..w.len()]);
    }
}

struct Opts {
    size: usize,
    iters: u32,
    bytes: u64,
    ring: usize,
    events: bool,
    timeout: Duration,
    linger: u64,
    reject: bool,
}

fn usage() -> ! {
    eprintln!("usage: rdma_pingpong server ADDR PORT [--timeout SECS] [--linger SECS] [--reject]");
    eprintln!("       rdma_pingpong client ADDR PORT [--size N] [--iters N] [--bytes N] [--ring N] [--events] [--timeout SECS] [--linger SECS]");
    exit(2)
}

fn fail(what: &str, e: rdma::Error) -> ! {
    eprintln!("rdma_pingpong: {what}: {e}");
    exit(if e.reason() == Reason::NoRdma { 3 } else { 1 })
}

fn die(msg: &str) -> ! {
    eprintln!("rdma_pingpong: {msg}");
    exit(1)
}

/// Private data: client REQ (40 bytes ≤ 56) and server REP (24 bytes)
struct Hello {
    flags: u8,
    ring: RemoteBuf,
    size: u32,
    iters: u32,
    bytes: u64,
}

impl Hello {
    fn encode(&self) -> [u8; 40] {
        let mut b = [0u8; 40];
        b[0..4].copy_from_slice(&MAGIC.to_be_bytes());
        b[4] = VERSION;
        b[5] = self.flags;
        b[8..16].copy_from_slice(&self.ring.addr.to_be_bytes());
        b[16..20].copy_from_slice(&self.ring.rkey.to_be_bytes());
        b[20..24].copy_from_slice(&(self.ring.len as u32).to_be_bytes());
        b[24..28].copy_from_slice(&self.size.to_be_bytes());
        b[28..32].copy_from_slice(&self.iters.to_be_bytes());
        b[32..40].copy_from_slice(&self.bytes.to_be_bytes());
        b
    }
    fn decode(b: &[u8]) -> Option<Hello> {
        if b.len() < 24 || u32::from_be_bytes(b[0..4].try_into().ok()?) != MAGIC || b[4] != VERSION
        {
            return None;
        }
        let g32 = |o: usize| {
            b.get(o..o + 4)
                .map(|s| u32::from_be_bytes(s.try_into().unwrap()))
                .unwrap_or(0)
        };
        let g64 = |o: usize| {
            b.get(o..o + 8)
                .map(|s| u64::from_be_bytes(s.try_into().unwrap()))
                .unwrap_or(0)
        };
        Some(Hello {
            flags: b[5],
            ring: RemoteBuf {
                addr: g64(8),
                rkey: g32(16),
                len: g32(20) as u64,
            },
            size: g32(24),
            iters: g32(28),
            bytes: g64(32),
        })
    }
}

/// One side's state: connection, buffers, completion handling
struct Side {
    conn: RcQp,
    dev: std::sync::Arc<Device>,
    ring: RegBuf,
    sendbuf: RegBuf,
    peer: RemoteBuf,
    events: bool,
    deadline: Instant,
    wcs: Vec<Wc>,
    /// Incoming immediates not yet handled
    inbox: std::collections::VecDeque<(u32, u32)>,
}

impl Side {
    /// Polls completions once (busy or sleeping); accounts them; queues received imms
    fn progress(&mut self) {
        if Instant::now() > self.deadline {
            die("timeout");
        }
        let n = if self.events {
            match self
                .dev
                .poll_or_wait(&mut self.wcs, Some(Duration::from_millis(200)))
            {
                Ok(n) => n,
                Err(e) => fail("poll_or_wait", e),
            }
        } else {
            match self.dev.poll(&mut self.wcs) {
                Ok(n) => n,
                Err(e) => fail("poll", e),
            }
        };
        let mut reposts = 0;
        for wc in &self.wcs[..n] {
            if wc.qp_num() != self.conn.qp_num() {
                continue;
            }
            let is_recv = wc.is_recv();
            if !wc.is_ok() {
                die(&format!("completion error: {} ({:?})", wc.status_str(), wc));
            }
            self.conn.on_completion(wc);
            if is_recv {
                let i = wc.imm().unwrap_or_else(|| die("receive without immediate"));
                self.inbox.push_back((i, wc.byte_len()));
                reposts += 1;
            }
        }
        if reposts > 0 {
            if let Err(e) = self.conn.post_recvs(WR_RECV, reposts) {
                fail("post_recvs", e);
            }
        }
    }

    fn next_imm(&mut self) -> (u32, u32) {
        loop {
            if let Some(x) = self.inbox.pop_front() {
                return x;
            }
            self.progress();
        }
    }

    /// Posts a WRITE(+imm) of `len` bytes of the send buffer at `off` to the peer ring at
    /// `roff`, polling while the send queue is full
    fn write(&mut self, off: usize, len: usize, roff: u64, imm_v: Option<u32>, signal: Signal) {
        loop {
            let sge = self.sendbuf.sge(off, len);
            let sges: &[rdma::Sge] = if len == 0 {
                &[]
            } else {
                std::slice::from_ref(&sge)
            };
            // SAFETY: the send buffer lives as long as the connection; a slot is rewritten
            // only after the peer returned its credit (so the WRITE has been executed).
            let r = unsafe {
                self.conn.post_write(
                    WR_SEND,
                    sges,
                    self.peer.at(roff),
                    self.peer.rkey,
                    imm_v,
                    signal,
                )
            };
            match r {
                Ok(()) => return,
                Err(e) if e.errno() == libc::ENOBUFS => self.progress(),
                Err(e) => fail("post_write", e),
            }
        }
    }

    fn send_imm(&mut self, v: u32) {
        loop {
            match self.conn.post_imm(WR_SEND, &self.peer, v, Signal::Auto) {
                Ok(()) => return,
                Err(e) if e.errno() == libc::ENOBUFS => self.progress(),
                Err(e) => fail("post_imm", e),
            }
        }
    }

    fn close(self) {
        let Side { conn, .. } = self;
        match rdma::close(conn, Duration::from_secs(20), &mut |_| {}) {
            Ok(true) => println!("close: drained"),
            Ok(false) => println!("close: not drained in time"),
            Err(e) => fail("close", e),
        }
    }
}

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 128,
        max_recv_wr: RECV_DEPTH,
        max_send_sge: 1,
        max_inline_data: 512,
    }
}

fn server(addr: SocketAddr, o: &Opts) {
    let listener = rdma::CmListener::bind(addr, 16, 1).unwrap_or_else(|e| fail("listen", e));
    println!("server: listening on {addr}");
    let inc = match listener.next_request(Some(o.timeout), &[]) {
        Ok(Some(i)) => i,
        Ok(None) => die("no connect request in time"),
        Err(e) => fail("next_request", e),
    };
    if o.reject {
        let mut id = inc.id;
        id.reject(REJECT_NOTE).unwrap_or_else(|e| fail("reject", e));
        println!("server: rejected the request with private data");
        return;
    }
    let Some(hello) = Hello::decode(inc.event.private_data()) else {
        let mut id = inc.id;
        let _ = id.reject(b"bad hello");
        die("bad handshake: client private data");
    };
    println!(
        "server: request from {:?}: size={} iters={} bytes={} ring={} events={}",
        inc.id.peer_addr(),
        hello.size,
        hello.iters,
        hello.bytes,
        hello.ring.len,
        hello.flags & FLAG_EVENTS != 0
    );
    let pd = Pd::new(&inc.device).unwrap_or_else(|e| fail("pd", e));
    let ring = RegBuf::new(&pd, hello.ring.len as usize, Access::RemoteWrite)
        .unwrap_or_else(|e| fail("ring", e));
    let sendbuf =
        RegBuf::new(&pd, 64 * 1024, Access::LocalRead).unwrap_or_else(|e| fail("sendbuf", e));
    let mut conn = match RcQp::new(inc.id, &pd, caps()) {
        Ok(c) => c,
        Err((e, mut id)) => {
            let _ = id.reject(&[]);
            fail("create qp", e)
        }
    };
    println!("server: qp {} caps {:?}", conn.qp_num(), conn.caps());
    conn.post_recvs(WR_RECV, RECV_DEPTH)
        .unwrap_or_else(|e| fail("post_recvs", e));
    let rep = Hello {
        flags: 0,
        ring: ring.remote().unwrap(),
        size: 0,
        iters: 0,
        bytes: 0,
    }
    .encode();
    let param = ConnParam {
        private_data: &rep[..24],
        ..Default::default()
    };
    rdma::accept(&mut conn, &param, o.timeout).unwrap_or_else(|e| fail("accept", e));
    println!("server: established");
    drop(listener);

    let mut s = Side {
        conn,
        dev: inc.device.clone(),
        ring,
        sendbuf,
        peer: hello.ring,
        events: hello.flags & FLAG_EVENTS != 0,
        deadline: Instant::now() + o.timeout,
        wcs: Wc::buffer(64),
        inbox: Default::default(),
    };
    let chunk = hello.size as usize;
    let slots = (hello.ring.len as usize / chunk.max(1)).max(1);
    let credit_batch = (slots / 4).max(1) as u32;
    let mut sum = Sum::new();
    let mut got: u64 = 0;
    let mut k: u64 = 0;
    let mut unreturned = 0u32;
    loop {
        let (i, len) = s.next_imm();
        match imm_type(i) {
            T_PING => {
                // Echo the payload back: copy it out of the ring, WRITE_WITH_IMM it back.
                let len = len as usize;
                let (ring, sendbuf) = (&s.ring, &mut s.sendbuf);
                sendbuf.as_mut_slice()[..len].copy_from_slice(&ring.as_slice()[..len]);
                s.write(0, len, 0, Some(imm(T_PONG, imm_val(i))), Signal::Auto);
            }
            T_DATA => {
                let off = (k as usize % slots) * chunk;
                sum.update(&s.ring.as_slice()[off..off + len as usize]);
                got += len as u64;
                k += 1;
                unreturned += 1;
                if got >= hello.bytes || unreturned >= credit_batch {
                    s.send_imm(imm(T_CREDIT, unreturned));
                    unreturned = 0;
                }
                if got >= hello.bytes {
                    break;
                }
            }
            t => die(&format!("server: unexpected message type {t}")),
        }
    }
    // Send our checksum (8 bytes, inline) into the client's ring at offset 0.
    let peer = s.peer;
    let bytes = sum.0.to_le_bytes();
    loop {
        match s
            .conn
            .post_write_inline(WR_SEND, &bytes, &peer, 0, Some(imm(T_SUM, 0)), Signal::Yes)
        {
            Ok(()) => break,
            Err(e) if e.errno() == libc::ENOBUFS => s.progress(),
            Err(e) => fail("post_write_inline", e),
        }
    }
    println!(
        "server: received {got} bytes in {k} chunks, checksum={:016x}",
        sum.0
    );
    // Wait for the client to disconnect (it does so once it has our sum).
    let ch = s.conn.id().channel().clone();
    match rdma::wait_event(
        &ch,
        rdma::EventKind::Disconnected,
        "wait disconnect",
        Some(Instant::now() + o.timeout),
    ) {
        Ok(_) => {
            println!("server: peer disconnected");
            s.conn.set_disconnected();
        }
        Err(e) => eprintln!("server: waiting for disconnect: {e}"),
    }
    s.close();
    println!("server: done");
}

fn client(addr: SocketAddr, o: &Opts) {
    let t0 = Instant::now();
    let (id, dev) = rdma::resolve(None, addr, 2, o.timeout).unwrap_or_else(|e| fail("resolve", e));
    let pd = Pd::new(&dev).unwrap_or_else(|e| fail("pd", e));
    let ring = RegBuf::new(&pd, o.ring, Access::RemoteWrite).unwrap_or_else(|e| fail("ring", e));
    let sendbuf =
        RegBuf::new(&pd, o.ring, Access::LocalRead).unwrap_or_else(|e| fail("sendbuf", e));
    let mut conn = RcQp::new(id, &pd, caps()).unwrap_or_else(|(e, _)| fail("create qp", e));
    println!("client: qp {} caps {:?}", conn.qp_num(), conn.caps());
    conn.post_recvs(WR_RECV, RECV_DEPTH)
        .unwrap_or_else(|e| fail("post_recvs", e));
    let hello = Hello {
        flags: if o.events { FLAG_EVENTS } else { 0 },
        ring: ring.remote().unwrap(),
        size: o.size as u32,
        iters: o.iters,
        bytes: o.bytes,
    };
    let req = hello.encode();
    let param = ConnParam {
        private_data: &req,
        ..Default::default()
    };
    let est =
        rdma::connect_event(&mut conn, &param, o.timeout).unwrap_or_else(|e| fail("connect", e));
    if est.kind != rdma::EventKind::Established {
        let note = String::from_utf8_lossy(est.private_data());
        println!(
            "client: {} (status {}), peer private data: {:?}",
            est.name(),
            est.status,
            note.trim_end_matches('\0')
        );
        fail("connect", est.to_error("rdma_connect"));
    }
    let Some(peer) = Hello::decode(est.private_data()) else {
        die("bad handshake: server private data")
    };
    println!(
        "client: established in {:.1} ms; peer ring addr={:#x} rkey={:#x} len={}",
        t0.elapsed().as_secs_f64() * 1e3,
        peer.ring.addr,
        peer.ring.rkey,
        peer.ring.len
    );
    if peer.ring.len < o.ring as u64 {
        die("peer ring smaller than requested");
    }
    let mut s = Side {
        conn,
        dev,
        ring,
        sendbuf,
        peer: peer.ring,
        events: o.events,
        deadline: Instant::now() + o.timeout,
        wcs: Wc::buffer(64),
        inbox: Default::default(),
    };

    // Ping-pong.
    for &size in &LAT_SIZES {
        let warm = 10.min(o.iters);
        let mut rtts = Vec::with_capacity(o.iters as usize);
        for it in 0..warm + o.iters {
            let seq = it as u64 + 1;
            {
                let b = &mut s.sendbuf.as_mut_slice()[..size];
                b[..8].copy_from_slice(&seq.to_le_bytes());
                b[size - 8..].copy_from_slice(&(!seq).to_le_bytes());
            }
            let t = Instant::now();
            s.write(0, size, 0, Some(imm(T_PING, seq as u32)), Signal::Auto);
            let (i, len) = s.next_imm();
            let rtt = t.elapsed();
            if imm_type(i) != T_PONG || imm_val(i) != seq as u32 || len as usize != size {
                die(&format!(
                    "bad pong: type {} seq {} len {len}",
                    imm_type(i),
                    imm_val(i)
                ));
            }
            let r = &s.ring.as_slice()[..size];
            if r[..8] != seq.to_le_bytes() || r[size - 8..] != (!seq).to_le_bytes() {
                die("pong payload mismatch");
            }
            if it >= warm {
                rtts.push(rtt.as_secs_f64() * 1e6);
            }
        }
        rtts.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let n = rtts.len().max(1);
        let avg = rtts.iter().sum::<f64>() / n as f64;
        let med = rtts.get(n / 2).copied().unwrap_or(0.0);
        let min = rtts.first().copied().unwrap_or(0.0);
        println!(
            "RESULT lat size={size} iters={} rtt_us min={min:.1} median={med:.1} avg={avg:.1} one_way_us median={:.1} avg={:.1}",
            o.iters,
            med / 2.0,
            avg / 2.0
        );
    }

    // Streaming with credits.
    let chunk = o.size;
    let slots = (o.ring / chunk).max(1);
    let mut credits = slots as u32;
    let mut sum = Sum::new();
    let mut sent: u64 = 0;
    let mut k: u64 = 0;
    let t = Instant::now();
    let mut peer_sum = None;
    while sent < o.bytes {
        while credits == 0 {
            let (i, _) = s.next_imm();
            match imm_type(i) {
                T_CREDIT => credits += imm_val(i),
                ty => die(&format!(
                    "client: unexpected message type {ty} while streaming"
                )),
            }
        }
        let len = (o.bytes - sent).min(chunk as u64) as usize;
        let off = (k as usize % slots) * chunk;
        {
            let b = &mut s.sendbuf.as_mut_slice()[off..off + len];
            generate(b, sent / 8);
            sum.update(b);
        }
        s.write(
            off,
            len,
            off as u64,
            Some(imm(T_DATA, len as u32)),
            Signal::Auto,
        );
        credits -= 1;
        sent += len as u64;
        k += 1;
    }
    while peer_sum.is_none() {
        let (i, _) = s.next_imm();
        match imm_type(i) {
            T_CREDIT => {}
            T_SUM => {
                let v = u64::from_le_bytes(s.ring.as_slice()[..8].try_into().unwrap());
                peer_sum = Some(v);
            }
            ty => die(&format!("client: unexpected message type {ty}")),
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let peer_sum = peer_sum.unwrap();
    println!(
        "RESULT bw size={chunk} bytes={sent} chunks={k} secs={secs:.3} MBps={:.2} Gbps={:.3}",
        sent as f64 / secs / 1e6,
        sent as f64 * 8.0 / secs / 1e9
    );
    println!("checksum client={:016x} server={peer_sum:016x}", sum.0);
    let ok = peer_sum == sum.0;
    s.close();
    if !ok {
        die("CHECKSUM MISMATCH");
    }
    println!("client: checksum OK, done");
}

fn parse_num(v: Option<String>) -> u64 {
    let v = v.unwrap_or_else(|| usage());
    let (num, mul) = match v.chars().last() {
        Some('k' | 'K') => (&v[..v.len() - 1], 1024),
        Some('m' | 'M') => (&v[..v.len() - 1], 1024 * 1024),
        Some('g' | 'G') => (&v[..v.len() - 1], 1024 * 1024 * 1024),
        _ => (&v[..], 1),
    };
    num.parse::<u64>()
        .map(|n| n * mul)
        .unwrap_or_else(|_| usage())
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| usage());
    let host = args.next().unwrap_or_else(|| usage());
    let port: u16 = args
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| usage());
    let mut o = Opts {
        size: 64 * 1024,
        iters: 1000,
        bytes: 64 * 1024 * 1024,
        ring: 1024 * 1024,
        events: false,
        timeout: Duration::from_secs(120),
        linger: 0,
        reject: false,
    };
    while let Some(a) = args.next() {
        match a.as_str() {
            "--size" => o.size = parse_num(args.next()) as usize,
            "--iters" => o.iters = parse_num(args.next()) as u32,
            "--bytes" => o.bytes = parse_num(args.next()),
            "--ring" => o.ring = parse_num(args.next()) as usize,
            "--events" => o.events = true,
            "--timeout" => o.timeout = Duration::from_secs(parse_num(args.next())),
            "--linger" => o.linger = parse_num(args.next()),
            "--reject" => o.reject = true,
            _ => usage(),
        }
    }
    if o.size == 0
        || o.size & 7 != 0
        || o.size > o.ring
        || o.bytes == 0
        || o.iters == 0
        || o.size >= 1 << 28
    {
        eprintln!("rdma_pingpong: --size must be a non-zero multiple of 8 and <= --ring; --bytes, --iters > 0");
        exit(2);
    }
    let addr = (host.as_str(), port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .unwrap_or_else(|| die("cannot parse address"));
    match mode.as_str() {
        "server" => server(addr, &o),
        "client" => client(addr, &o),
        _ => usage(),
    }
    if o.linger > 0 {
        // Every RDMA object is gone now; stay alive so a test can check that the kernel
        // lists no QP/CQ/MR/PD/cm_id of this pid.
        println!("LINGER pid={}", std::process::id());
        std::thread::sleep(Duration::from_secs(o.linger));
    }
}
