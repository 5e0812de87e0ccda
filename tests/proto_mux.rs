//! Many streams on one queue pair (PROTOCOL.md §14): two ends' `Mux`es, each with its
//! streams' `Conn`s as a driver keeps them, over the in-memory RC model
//! (`transport::mem::fabric`: one QP each, one shared receive queue that fails on a message
//! without a receive, one send queue that fails when full), opening streams, moving bytes on
//! all of them at once through small rings, one stream's reader stalled while the others
//! flow, a link whose queues are full refusing the next stream, and closing everything down
//! to no stream.

use rsock_core::proto::link::imm::StreamId;
use rsock_core::proto::link::record::{Open, RefuseReason};
use rsock_core::proto::link::{tag, untag, widen, LinkEvent, Mux, RingAt, WR_STREAM_SHIFT};
use rsock_core::proto::wire::{Hello, HelloKind};
use rsock_core::proto::WrId;
use rsock_core::proto::{Conn, Params, ReadError, WriteError};
use rsock_core::transport::mem::fabric::{Cqe, Landing, Qp, Wr};
use std::collections::{HashMap, VecDeque};
use std::ops::Range;

const SQ: u32 = 256;
const RQ: u32 = 256;

fn params(ring_size: u32) -> Params {
    Params {
        ring_size,
        recv_credits: 8,
        send_buf_size: 4096,
        send_queue_depth: 8,
        max_inline: 0,
        ring_grow_to: 0,
        send_grow_to: 0,
    }
}

/// One end: its mux, its streams' connections (by our id), QP, rings (by rkey) and send
/// buffers (by stream id).
struct End {
    mux: Mux,
    conns: HashMap<u16, Conn>,
    /// What stream 0 said, not yet looked at by the test.
    said: Vec<Said>,
    /// Where the next turn to post starts (streams post in turns, as a driver's would).
    turn: u16,
    qp: Qp,
    rings: HashMap<u32, Vec<u8>>,
    sends: HashMap<u16, Vec<u8>>,
    /// Our stream id -> the rkey of its ring.
    ring_of: HashMap<u16, u32>,
    /// Posted writes not yet delivered, with their payload (read at post).
    wire: VecDeque<(Wr, Vec<u8>)>,
    next_rkey: u32,
    /// Stream 0's writes posted (control messages).
    control_writes: usize,
    /// Our stream id -> the rkey of the bigger ring offered and not switched to yet.
    next_ring: HashMap<u16, u32>,
    /// Rings that grew here.
    grew: usize,
}

/// What stream 0 said (a [`LinkEvent`] whose connection the end kept).
#[derive(Debug)]
enum Said {
    Incoming(Open),
    /// The peer's OPEN took our grant: its connection is kept.
    IncomingGranted(Open, StreamId),
    Opened(StreamId),
    Refused(StreamId, RefuseReason),
    PeerClosed(StreamId),
    Goodbye,
    /// The peer's GROW record for our stream, handed to its connection.
    Grew(StreamId),
}

/// The receiving end's rings, and one write's payload.
struct Land<'a> {
    rings: &'a mut HashMap<u32, Vec<u8>>,
    payload: &'a [u8],
}

impl Landing for Land<'_> {
    fn ring_len(&self, rkey: u32) -> Option<usize> {
        self.rings.get(&rkey).map(Vec::len)
    }

    fn land(&mut self, rkey: u32, at: Range<usize>) -> bool {
        match self.rings.get_mut(&rkey) {
            Some(r) => {
                r[at].copy_from_slice(self.payload);
                true
            }
            None => false,
        }
    }
}

const CONTROL_RKEY: u32 = 1;

impl End {
    fn new(control: Conn, max_streams: u16) -> End {
        let mut rings = HashMap::new();
        rings.insert(CONTROL_RKEY, vec![0; 4096]);
        let mut sends = HashMap::new();
        sends.insert(0, vec![0; 4096]);
        End {
            mux: Mux::new(control, &params(4096), RQ, SQ, max_streams).unwrap(),
            conns: HashMap::new(),
            said: Vec::new(),
            turn: 0,
            qp: Qp::new(0, SQ),
            rings,
            sends,
            ring_of: HashMap::from([(0, CONTROL_RKEY)]),
            wire: VecDeque::new(),
            next_rkey: 100,
            control_writes: 0,
            next_ring: HashMap::new(),
            grew: 0,
        }
    }

    /// A new ring of `size` and its place.
    fn ring(&mut self, size: u32) -> (u32, RingAt) {
        let rkey = self.next_rkey;
        self.next_rkey += 1;
        self.rings.insert(rkey, vec![0; size as usize]);
        (rkey, RingAt { rkey, addr: 0 })
    }

    fn adopt(&mut self, id: StreamId, rkey: u32, send_size: u32) {
        self.ring_of.insert(id.get(), rkey);
        self.sends.insert(id.get(), vec![0; send_size as usize]);
    }

    /// Posts receives owed, stream 0's writes, then the streams' in turns (each stream's
    /// share of the send queue is its own: the queue never overflows).
    fn post(&mut self) {
        self.qp.recvs += self.mux.receives_to_post();
        loop {
            let send0 = self.sends.get_mut(&0).unwrap();
            let Some(w) = self.mux.poll_control_write(send0) else {
                break;
            };
            self.send(w);
            self.control_writes += 1;
        }
        let mut ids: Vec<u16> = self.conns.keys().copied().collect();
        ids.sort_unstable();
        let start = ids.iter().position(|&i| i >= self.turn).unwrap_or(0);
        ids.rotate_left(start);
        for id in ids {
            while let Some(w) = self.conns.get_mut(&id).unwrap().poll_write() {
                self.send(tag(StreamId::new(id).unwrap(), w));
            }
            self.turn = id + 1;
        }
    }

    fn send(&mut self, w: rsock_core::proto::Write) {
        let stream = untag(w.wr_id.0).0.unwrap().get();
        let buf = &self.sends[&stream];
        let at = w.local_offset as usize..(w.local_offset + w.len) as usize;
        assert!(self.qp.post_send(w.wr_id.0), "send queue full");
        self.wire.push_back((Wr::from(&w), buf[at].to_vec()));
    }

    /// Hands every completion to the mux, and a stream's to its connection (and reposts
    /// receives); takes stream 0's events at once (an ACCEPT's stream must exist before
    /// the next completion) and keeps them for the test.
    fn complete(&mut self) {
        while let Some(c) = self.qp.poll() {
            match c {
                Cqe::Recv { imm, byte_len } => {
                    let ring0 = &self.rings[&CONTROL_RKEY];
                    match self.mux.handle_imm(imm, byte_len, ring0).unwrap() {
                        Some(id) => {
                            let conn = self.conns.get_mut(&id.get()).unwrap();
                            if let Err(e) = conn.handle_imm(imm, byte_len) {
                                panic!("stream {}: {e:?}", id.get());
                            }
                        }
                        None => {
                            while let Some(ev) = self.mux.poll_event() {
                                let said = match ev {
                                    LinkEvent::Opened { mine, conn } => {
                                        self.conns.insert(mine.get(), *conn);
                                        Said::Opened(mine)
                                    }
                                    LinkEvent::Incoming(open) => Said::Incoming(open),
                                    LinkEvent::IncomingGranted { open, mine, conn } => {
                                        self.conns.insert(mine.get(), *conn);
                                        Said::IncomingGranted(open, mine)
                                    }
                                    LinkEvent::Refused { mine, reason } => {
                                        Said::Refused(mine, reason)
                                    }
                                    LinkEvent::PeerClosed { mine } => Said::PeerClosed(mine),
                                    LinkEvent::Goodbye => Said::Goodbye,
                                    LinkEvent::Grow { mine, size, ring } => {
                                        let conn = self.conns.get_mut(&mine.get()).unwrap();
                                        conn.on_grow_record(size, ring.rkey, ring.addr).unwrap();
                                        Said::Grew(mine)
                                    }
                                };
                                self.said.push(said);
                            }
                        }
                    }
                    self.qp.recvs += self.mux.receives_to_post();
                }
                Cqe::Sent { wr_id } => {
                    if let Some((id, own)) = self.mux.handle_send_complete(wr_id).unwrap() {
                        let conn = self.conns.get_mut(&id.get()).unwrap();
                        let own = widen(own, conn.counters().wrs_retired);
                        conn.handle_send_complete(own).unwrap();
                    }
                }
                other => panic!("{other:?}"),
            }
        }
    }

    /// What a driver does for rings that grow: makes the ring a connection asks for, sends
    /// its GROW record, and after the peer's SWITCHED moves the unread bytes into it.
    fn sync_growth(&mut self) {
        let ids: Vec<u16> = self.conns.keys().copied().collect();
        for id in ids {
            let sid = StreamId::new(id).unwrap();
            if let Some(size) = self.conns[&id].ring_grow_wanted() {
                let (rkey, at) = self.ring(size);
                self.next_ring.insert(id, rkey);
                self.conn(sid).offer_ring_at(at.rkey, at.addr);
            }
            if let Some((size, rkey, addr)) = self.conn(sid).take_grow_record() {
                self.mux.grow(sid, size, RingAt { rkey, addr });
            }
            if let Some(copy) = self.conn(sid).take_ring_copy() {
                let new = self.next_ring.remove(&id).unwrap();
                let old = self.rings[&self.ring_of[&id]].clone();
                let ring = self.rings.get_mut(&new).unwrap();
                for (from, to) in copy.pieces() {
                    ring[to].copy_from_slice(&old[from]);
                }
                self.ring_of.insert(id, new);
                self.grew += 1;
            }
        }
    }

    fn conn(&mut self, id: StreamId) -> &mut Conn {
        self.conns.get_mut(&id.get()).unwrap()
    }

    /// Closes stream `id` here: its connection goes, its CLOSE goes out.
    fn close(&mut self, id: StreamId) {
        self.conns.remove(&id.get());
        self.mux.close(id);
    }

    /// As `close`, the CLOSE held back for the next record (as the engine closes).
    fn close_lazily(&mut self, id: StreamId) {
        self.conns.remove(&id.get());
        self.mux.close_lazily(id);
    }

    fn write(&mut self, id: StreamId, data: &[u8]) -> usize {
        let buf = self.sends.get_mut(&id.get()).unwrap();
        match self.conns.get_mut(&id.get()).unwrap().write(buf, data) {
            Ok(n) => n,
            Err(WriteError::Blocked) => 0,
            Err(e) => panic!("{e:?}"),
        }
    }

    fn read(&mut self, id: StreamId, out: &mut Vec<u8>) -> bool {
        let ring = &self.rings[&self.ring_of[&id.get()]];
        let mut b = [0u8; 3000];
        loop {
            match self.conns.get_mut(&id.get()).unwrap().read(ring, &mut b) {
                Ok(0) => return true,
                Ok(n) => out.extend_from_slice(&b[..n]),
                Err(ReadError::Blocked) => return false,
                Err(e) => panic!("{e:?}"),
            }
        }
    }
}

struct Link {
    ends: [End; 2],
}

impl Link {
    fn new() -> Link {
        Link::with_ids(64)
    }

    /// A link each of whose ends gives out at most `max_streams` ids.
    fn with_ids(max_streams: u16) -> Link {
        let p = params(4096);
        let hello = |rkey| Hello {
            kind: HelloKind::Accept,
            flags: 0,
            ring_addr: 0,
            rkey,
            ring_size: 4096,
            recv_credits: 8,
            conn_id: 7,
            resume: None,
            branch: None,
        };
        let c = StreamId::CONTROL;
        // Each end's stream 0 writes into the other's control ring (both under rkey 1).
        let a = Conn::on_link(&p, &hello(CONTROL_RKEY), c, c).unwrap();
        let b = Conn::on_link(&p, &hello(CONTROL_RKEY), c, c).unwrap();
        Link {
            ends: [End::new(a, max_streams), End::new(b, max_streams)],
        }
    }

    /// One round: post, deliver everything, complete. True if anything moved.
    fn round(&mut self) -> bool {
        for e in &mut self.ends {
            e.post();
        }
        let mut moved = false;
        for from in 0..2 {
            let (x, y) = split(&mut self.ends, from);
            while let Some((wr, payload)) = x.wire.pop_front() {
                let mut land = Land {
                    rings: &mut y.rings,
                    payload: &payload,
                };
                x.qp.execute(&mut y.qp, &wr, &mut land).unwrap();
                moved = true;
            }
        }
        for e in &mut self.ends {
            e.complete();
        }
        moved
    }

    fn settle(&mut self) -> [Vec<Said>; 2] {
        for _ in 0..1000 {
            if !self.round() {
                break;
            }
        }
        let [a, b] = &mut self.ends;
        [std::mem::take(&mut a.said), std::mem::take(&mut b.said)]
    }

    /// A opens a stream with a ring of `a_ring`, B accepts with `b_ring`: (A's id, B's id).
    fn open(&mut self, a_ring: u32, b_ring: u32) -> (StreamId, StreamId) {
        self.open_with(params(a_ring), params(b_ring))
    }

    /// As `open`, with A's params `pa` and B's `pb`.
    fn open_with(&mut self, pa: Params, pb: Params) -> (StreamId, StreamId) {
        let (rk, at) = self.ends[0].ring(pa.ring_size);
        let dest = "10.0.0.2:80".parse().unwrap();
        let a_id = self.ends[0].mux.open(pa, at, 42, (dest, 40_001)).unwrap();
        self.ends[0].adopt(a_id, rk, 4096);
        // A CLOSE held back rides with the OPEN or ACCEPT: its PeerClosed comes first.
        let not_closes = |ev: Vec<Said>| -> Vec<Said> {
            ev.into_iter()
                .filter(|e| !matches!(e, Said::PeerClosed(_)))
                .collect()
        };
        let [_, b_ev] = self.settle();
        let b_ev = not_closes(b_ev);
        let [Said::Incoming(open)] = &b_ev[..] else {
            panic!("{b_ev:?}")
        };
        assert_eq!(open.from_port, 40_001);
        let (rk, at) = self.ends[1].ring(pb.ring_size);
        let (b_id, conn) = self.ends[1].mux.accept(open, pb, at).unwrap();
        self.ends[1].conns.insert(b_id.get(), conn);
        self.ends[1].adopt(b_id, rk, 4096);
        let [a_ev, _] = self.settle();
        let a_ev = not_closes(a_ev);
        assert!(
            matches!(a_ev[..], [Said::Opened(id)] if id == a_id),
            "{a_ev:?}"
        );
        (a_id, b_id)
    }
}

impl Link {
    /// B grants A `n` streams with rings of `ring` bytes: B's ids.
    fn grant(&mut self, n: usize, ring: u32) -> Vec<StreamId> {
        let ids = (0..n)
            .map(|_| {
                let (rk, at) = self.ends[1].ring(ring);
                let id = self.ends[1].mux.grant(params(ring), at).unwrap();
                self.ends[1].adopt(id, rk, 4096);
                id
            })
            .collect();
        let said = self.settle();
        assert!(said.iter().all(Vec::is_empty), "{said:?}");
        assert_eq!(self.ends[0].mux.grants_held(), n);
        assert_eq!(self.ends[1].mux.grants_out(), n);
        ids
    }

    /// A opens a stream on B's oldest grant and announces it at once: A's id.
    fn open_granted(&mut self, ring: u32) -> StreamId {
        let (rk, at) = self.ends[0].ring(ring);
        let dest = "10.0.0.2:80".parse().unwrap();
        let a = &mut self.ends[0];
        assert!(a.mux.can_open_granted(&params(ring)));
        let (id, conn) = a
            .mux
            .open_granted(params(ring), at, 43, (dest, 40_002))
            .unwrap();
        a.conns.insert(id.get(), conn);
        a.adopt(id, rk, 4096);
        assert!(a.mux.announce(id).is_some());
        assert!(a.mux.announce(id).is_none(), "announced twice");
        id
    }
}

fn split(ends: &mut [End; 2], from: usize) -> (&mut End, &mut End) {
    let [a, b] = ends;
    if from == 0 {
        (a, b)
    } else {
        (b, a)
    }
}

fn pattern(n: usize, salt: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt) ^ (i / 253) as u8)
        .collect()
}

#[test]
fn streams_share_a_queue_pair_and_each_arrives_intact() {
    let mut l = Link::new();
    let ids: Vec<_> = [65536u32, 8192, 32768, 65536]
        .iter()
        .map(|&r| l.open(r, r))
        .collect();
    assert_eq!(l.ends[0].mux.streams(), 4);
    // Each stream both ways, different lengths, all at once through small rings.
    let data: Vec<[Vec<u8>; 2]> = (0..ids.len())
        .map(|k| {
            let n = 20_000 + 17_000 * k;
            [pattern(n, k as u8), pattern(n / 2 + 5, 100 + k as u8)]
        })
        .collect();
    let mut sent = vec![[0usize; 2]; ids.len()];
    let mut got: Vec<[Vec<u8>; 2]> = vec![[Vec::new(), Vec::new()]; ids.len()];
    for _ in 0..20_000 {
        for (k, &(a, b)) in ids.iter().enumerate() {
            for (e, id) in [(0, a), (1, b)] {
                // Small writes, several a round, each posted at once: a message each, so
                // that immediates of many streams are in flight together on the shared
                // receive queue (more than any one stream's share).
                for _ in 0..5 {
                    let from = sent[k][e];
                    let to = (from + 333).min(data[k][e].len());
                    if from < to {
                        sent[k][e] += l.ends[e].write(id, &data[k][e][from..to]);
                        l.ends[e].post();
                    }
                }
            }
        }
        l.round();
        for (k, &(a, b)) in ids.iter().enumerate() {
            l.ends[1].read(b, &mut got[k][0]);
            l.ends[0].read(a, &mut got[k][1]);
        }
        if (0..ids.len())
            .all(|k| got[k][0].len() == data[k][0].len() && got[k][1].len() == data[k][1].len())
        {
            break;
        }
    }
    for k in 0..ids.len() {
        assert_eq!(got[k][0], data[k][0], "stream {k}, A to B");
        assert_eq!(got[k][1], data[k][1], "stream {k}, B to A");
    }
    // Close every stream from both ends: FINs, then CLOSE records; nothing left.
    for &(a, b) in &ids {
        l.ends[0].conn(a).shutdown_write();
        l.ends[1].conn(b).shutdown_write();
    }
    for _ in 0..200 {
        l.round();
        for &(a, b) in &ids {
            for (e, id) in [(0, a), (1, b)] {
                let mut sink = Vec::new();
                if l.ends[e].conns.contains_key(&id.get()) {
                    l.ends[e].read(id, &mut sink);
                    if l.ends[e].conn(id).is_finished() {
                        l.ends[e].close(id);
                    }
                }
            }
        }
    }
    let said = l.settle();
    // Each end heard the peer's CLOSE of every stream.
    for (e, said) in said.iter().enumerate() {
        let mut closed: Vec<u16> = said
            .iter()
            .filter_map(|s| match s {
                Said::PeerClosed(id) => Some(id.get()),
                _ => None,
            })
            .collect();
        closed.sort_unstable();
        let mut want: Vec<u16> = ids.iter().map(|p| [p.0, p.1][e].get()).collect();
        want.sort_unstable();
        assert_eq!(closed, want, "end {e}");
    }
    assert_eq!(l.ends[0].mux.streams(), 0);
    assert_eq!(l.ends[1].mux.streams(), 0);
    assert!(l.ends.iter().all(|e| e.mux.error().is_none()));
}

#[test]
fn a_stalled_reader_holds_only_its_own_stream() {
    let mut l = Link::new();
    let (stalled_a, _stalled_b) = l.open(4096, 4096);
    let (a, b) = l.open(4096, 4096);
    // A fills the stalled stream (nobody reads it at B) and streams 200 KB on the other.
    let big = pattern(200_000, 9);
    let mut sent = 0;
    let mut got = Vec::new();
    let mut stalled_sent = 0;
    for _ in 0..20_000 {
        stalled_sent += l.ends[0].write(stalled_a, &[7u8; 1000]);
        if sent < big.len() {
            sent += l.ends[0].write(a, &big[sent..]);
        }
        l.round();
        l.ends[1].read(b, &mut got);
        if got.len() == big.len() {
            break;
        }
    }
    assert_eq!(got, big);
    // The stalled stream took what its window and send buffer hold, and no more.
    assert!(
        (4096..=4096 + 4096).contains(&stalled_sent),
        "{stalled_sent}"
    );
    assert!(l.ends.iter().all(|e| e.mux.error().is_none()));
}

#[test]
fn a_foreign_immediate_fails_the_link() {
    let mut l = Link::new();
    // DATA for stream 5, which is not open at B.
    let raw = (5u32 << 16) | 10;
    let ring0 = l.ends[1].rings[&CONTROL_RKEY].clone();
    assert!(l.ends[1].mux.handle_imm(raw, 10, &ring0).is_err());
    assert!(l.ends[1].mux.error().is_some());
    // A send completion of a stream that is not open, and one of no stream at all.
    let mut m = Link::new();
    assert!(m.ends[0].mux.handle_send_complete(3 << 48 | 1).is_err());
    assert!(l.ends[1].mux.handle_send_complete(99).is_err());
}

#[test]
fn a_link_whose_queues_are_full_refuses_the_next_stream() {
    let mut l = Link::new();
    // Stream 0 takes 8 of each queue; each stream 8 more: (256 - 8) / 8 = 31 fit.
    let opened: Vec<_> = (0..31).map(|_| l.open(4096, 4096)).collect();
    assert_eq!(l.ends[0].mux.streams(), 31);
    let dest = "10.0.0.2:80".parse().unwrap();
    let (_, at) = l.ends[0].ring(4096);
    assert!(l.ends[0].mux.open(params(4096), at, 1, (dest, 0)).is_err());
    // The peer opening one more is refused by B, not failed.
    let (_, at) = l.ends[1].ring(4096);
    let b_id = l.ends[1].mux.open(params(4096), at, 2, (dest, 0));
    assert!(b_id.is_err(), "B's own queues are as full");
    // One closes at both ends: its shares return, and a stream fits again.
    let (a, b) = opened[5];
    l.ends[0].close(a);
    l.ends[1].close(b);
    l.settle();
    assert_eq!(l.ends[0].mux.streams(), 30);
    l.open(4096, 4096);
    assert!(l.ends.iter().all(|e| e.mux.error().is_none()));
}

#[test]
fn an_open_the_acceptor_cannot_fit_is_refused() {
    let mut l = Link::new();
    let dest = "10.0.0.2:80".parse().unwrap();
    let (_, at) = l.ends[0].ring(4096);
    let mut big = params(4096);
    big.recv_credits = 200;
    let a_id = l.ends[0].mux.open(big, at, 1, (dest, 0)).unwrap();
    let [_, b_ev] = l.settle();
    let [Said::Incoming(open)] = &b_ev[..] else {
        panic!("{b_ev:?}")
    };
    // B's side would take 200 receives more than B's queue holds beside what it has.
    let mut mine = params(4096);
    mine.recv_credits = 249;
    let (_, at) = l.ends[1].ring(4096);
    assert!(l.ends[1].mux.accept(open, mine, at).is_err());
    let [a_ev, _] = l.settle();
    assert!(
        matches!(a_ev[..], [Said::Refused(id, RefuseReason::NoResources)] if id == a_id),
        "{a_ev:?}"
    );
    assert_eq!(
        l.ends[0].mux.streams(),
        0,
        "a refused stream's shares return"
    );
}

#[test]
fn a_work_request_id_survives_its_tag_however_long_the_stream_lives() {
    let id = StreamId::new(32767).unwrap();
    let wrap = 1u64 << WR_STREAM_SHIFT;
    for (retired, own) in [
        (0, 0),
        (5, 9),
        (wrap - 2, wrap + 3),
        (7 * wrap + 1, 7 * wrap + 1),
    ] {
        let w = rsock_core::proto::Write {
            wr_id: WrId(own),
            local_offset: 0,
            len: 0,
            remote_offset: 0,
            remote_addr: 0,
            rkey: 0,
            imm: None,
            inline: false,
            signaled: true,
        };
        let tagged = tag(id, w).wr_id.0;
        assert!(
            tagged < 1 << 59,
            "the driver's top bits stay free: {tagged:#x}"
        );
        let (got, low) = untag(tagged);
        assert_eq!(got, Some(id));
        assert_eq!(widen(low, retired), WrId(own), "retired {retired}");
    }
    // The driver's flag bits are no stream's.
    assert_eq!(untag(1 << 62 | 5 << WR_STREAM_SHIFT).0, None);
}

#[test]
fn hundreds_of_streams_open_and_close_one_after_another() {
    let mut l = Link::new();
    for k in 0..400 {
        let (a, b) = l.open(4096, 4096);
        // A byte each way, FIN each way, then both ends close.
        assert_eq!(l.ends[0].write(a, &[k as u8]), 1);
        l.settle();
        let mut got = Vec::new();
        l.ends[1].read(b, &mut got);
        assert_eq!(got, [k as u8], "stream {k}");
        assert_eq!(l.ends[1].write(b, &got), 1);
        l.ends[0].conn(a).shutdown_write();
        l.settle();
        let mut back = Vec::new();
        l.ends[0].read(a, &mut back);
        assert_eq!(back, [k as u8], "stream {k} back");
        l.ends[1].conn(b).shutdown_write();
        l.settle();
        for (e, id) in [(0, a), (1, b)] {
            let mut sink = Vec::new();
            assert!(
                l.ends[e].read(id, &mut sink),
                "stream {k}: end {e} saw no FIN"
            );
            l.settle();
            assert!(
                l.ends[e].conn(id).is_finished(),
                "stream {k}: end {e} not finished"
            );
            l.ends[e].close(id);
        }
        l.settle();
        assert_eq!(l.ends[0].mux.streams(), 0, "stream {k}");
        assert_eq!(l.ends[1].mux.streams(), 0, "stream {k}");
    }
    assert!(l.ends.iter().all(|e| e.mux.error().is_none()));
}

/// Churn as the engine closes: each CLOSE is held back and rides with the next OPEN (or
/// ACCEPT), so a connection costs about half the control messages it does when each
/// CLOSE goes at once; ids are taken again in order (a CLOSE always goes before the OPEN
/// that reuses its id); what is held goes out when released, and holding stops at half the
/// ids.
#[test]
fn closes_held_back_ride_with_the_next_open() {
    let churn = |lazy: bool| {
        let mut l = Link::new();
        for k in 0..300 {
            let (a, b) = l.open(4096, 4096);
            l.ends[0].conn(a).shutdown_write();
            l.ends[1].conn(b).shutdown_write();
            l.settle();
            for (e, id) in [(0, a), (1, b)] {
                let mut sink = Vec::new();
                assert!(
                    l.ends[e].read(id, &mut sink),
                    "stream {k}: end {e} saw no FIN"
                );
                if lazy {
                    l.ends[e].close_lazily(id);
                } else {
                    l.ends[e].close(id);
                }
            }
            l.settle();
            assert_eq!(
                l.ends.iter().all(|e| e.mux.holds_closes()),
                lazy,
                "stream {k}"
            );
        }
        for e in &mut l.ends {
            assert_eq!(e.mux.release_closes(), lazy);
            assert!(!e.mux.holds_closes());
        }
        l.settle();
        for e in &l.ends {
            assert_eq!(e.mux.streams(), 0);
            assert!(e.mux.error().is_none(), "{:?}", e.mux.error());
        }
        let writes = [l.ends[0].control_writes, l.ends[1].control_writes];
        (l, writes)
    };
    let (_, at_once) = churn(false);
    let (l, held) = churn(true);
    for e in 0..2 {
        assert!(
            held[e] * 10 <= at_once[e] * 6,
            "end {e}: {} control messages with CLOSEs held back, {} without",
            held[e],
            at_once[e]
        );
    }
    assert!(l.ends.iter().all(|e| e.mux.error().is_none()));
    // Many closed at once: past half the ids in use, the CLOSEs go without waiting, so
    // the ids come back without a release.
    let mut l = Link::with_ids(16);
    let opened: Vec<_> = (0..16).map(|_| l.open(4096, 4096)).collect();
    for (a, b) in opened {
        l.ends[0].close_lazily(a);
        l.ends[1].close_lazily(b);
    }
    l.settle();
    let again: Vec<_> = (0..7).map(|_| l.open(4096, 4096)).collect();
    assert_eq!(again.len(), 7);
    assert!(l.ends.iter().all(|e| e.mux.error().is_none()));
}

#[test]
fn a_granted_stream_carries_bytes_before_any_answer() {
    let mut l = Link::new();
    let granted = l.grant(3, 8192);
    // A opens two streams on grants and writes on them at once: no round trip between.
    let ids: Vec<StreamId> = (0..2).map(|_| l.open_granted(16384)).collect();
    let data: Vec<Vec<u8>> = (0..2)
        .map(|k| pattern(30_000 + k * 7_000, k as u8))
        .collect();
    let mut sent = [0usize; 2];
    for (k, &id) in ids.iter().enumerate() {
        sent[k] += l.ends[0].write(id, &data[k]);
        assert!(sent[k] > 0);
    }
    l.ends[0].post();
    assert_eq!(l.ends[0].mux.streams(), 2);
    assert_eq!(l.ends[0].mux.grants_held(), 1);
    // B hears both OPENs (each took the oldest grant, in order) before their bytes.
    l.round();
    let said = std::mem::take(&mut l.ends[1].said);
    let took: Vec<(u16, u16)> = said
        .iter()
        .map(|s| match s {
            Said::IncomingGranted(open, mine) => {
                assert_eq!(open.granted, Some(*mine));
                assert_eq!(open.from_port, 40_002, "the opener's port for the stream");
                (open.opener.get(), mine.get())
            }
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        took,
        vec![
            (ids[0].get(), granted[0].get()),
            (ids[1].get(), granted[1].get())
        ]
    );
    assert_eq!(l.ends[1].mux.grants_out(), 1);
    let mut got = [Vec::new(), Vec::new()];
    let echo: Vec<Vec<u8>> = (0..2).map(|k| pattern(5_000, 50 + k as u8)).collect();
    let mut echoed = [Vec::new(), Vec::new()];
    let mut echo_sent = [0usize; 2];
    for _ in 0..2000 {
        for (k, &id) in ids.iter().enumerate() {
            let from = sent[k];
            sent[k] += l.ends[0].write(id, &data[k][from..]);
            l.ends[1].read(granted[k], &mut got[k]);
            if got[k].len() == data[k].len() {
                let from = echo_sent[k];
                echo_sent[k] += l.ends[1].write(granted[k], &echo[k][from..]);
            }
            l.ends[0].read(id, &mut echoed[k]);
        }
        l.round();
        if (0..2).all(|k| got[k].len() == data[k].len() && echoed[k].len() == echo[k].len()) {
            break;
        }
    }
    for k in 0..2 {
        assert_eq!(got[k].len(), data[k].len(), "stream {k}, A to B: bytes");
        assert!(got[k] == data[k], "stream {k}, A to B: bytes differ");
        assert!(
            echoed[k] == echo[k],
            "stream {k}, B to A: {} bytes",
            echoed[k].len()
        );
    }
    // No ACCEPT ever came: A heard nothing on stream 0 after the grants.
    assert!(l.ends[0].said.is_empty(), "{:?}", l.ends[0].said);
}

#[test]
fn an_open_on_an_id_never_granted_fails_the_link() {
    let mut l = Link::new();
    l.grant(1, 8192);
    // A takes the grant; B meanwhile forgets it was granted: its table says no.
    let id = l.open_granted(8192);
    let mut other = Link::new();
    std::mem::swap(&mut l.ends[1].mux, &mut other.ends[1].mux);
    l.ends[0].write(id, b"x");
    l.ends[0].post();
    let (a, b) = split(&mut l.ends, 0);
    while let Some((wr, payload)) = a.wire.pop_front() {
        let mut land = Land {
            rings: &mut b.rings,
            payload: &payload,
        };
        a.qp.execute(&mut b.qp, &wr, &mut land).unwrap();
    }
    let ring0 = &b.rings[&CONTROL_RKEY];
    let mut failed = None;
    while let Some(c) = b.qp.poll() {
        if let Cqe::Recv { imm, byte_len } = c {
            b.mux.receives_to_post();
            if let Err(e) = b.mux.handle_imm(imm, byte_len, ring0) {
                failed = Some(e);
                break;
            }
        }
    }
    let e = failed.expect("the link failed");
    assert!(format!("{e:?}").contains("NotGranted"), "{e:?}");
}

#[test]
fn no_grant_is_taken_without_one_or_after_goodbye() {
    let mut l = Link::new();
    assert_eq!(l.ends[0].mux.grants_held(), 0);
    assert!(!l.ends[0].mux.can_open_granted(&params(8192)));
    let (_, at) = l.ends[0].ring(8192);
    let dest: std::net::SocketAddr = "10.0.0.2:80".parse().unwrap();
    assert!(l.ends[0]
        .mux
        .open_granted(params(8192), at, 1, (dest, 0))
        .is_none());
    assert_eq!(l.ends[0].mux.streams(), 0);
    // Grants given, then B says GOODBYE: A may take none of them.
    l.grant(2, 8192);
    l.ends[1].mux.goodbye();
    let said = l.settle();
    assert!(matches!(said[0][..], [Said::Goodbye]), "{said:?}");
    assert!(!l.ends[0].mux.can_open_granted(&params(8192)));
    assert_eq!(l.ends[0].mux.grants_held(), 0);
}

#[test]
fn a_granted_open_after_the_acceptors_goodbye_is_still_taken() {
    let mut l = Link::new();
    l.grant(1, 8192);
    let id = l.open_granted(8192);
    // B says GOODBYE as A's OPEN is on its way: the grant holds.
    l.ends[1].mux.goodbye();
    let said = l.settle();
    assert!(
        matches!(said[1][..], [Said::IncomingGranted(o, _)] if o.opener == id),
        "{said:?}"
    );
    assert!(matches!(said[0][..], [Said::Goodbye]), "{said:?}");
}

#[test]
fn an_answerers_bytes_that_overtake_its_accept_wait_for_it() {
    // The ACCEPT waits on stream 0 (credits, say) while the new stream's first bytes go: the
    // opener keeps them for the connection the ACCEPT makes, and does not fail the link.
    let mut l = Link::new();
    let (rk, at) = l.ends[0].ring(8192);
    let dest = "10.0.0.2:80".parse().unwrap();
    let a_id = l.ends[0]
        .mux
        .open(params(8192), at, 42, (dest, 40_001))
        .unwrap();
    l.ends[0].adopt(a_id, rk, 4096);
    let [_, b_ev] = l.settle();
    let [Said::Incoming(open)] = &b_ev[..] else {
        panic!("{b_ev:?}")
    };
    let (rk, at) = l.ends[1].ring(8192);
    let (b_id, conn) = l.ends[1].mux.accept(open, params(8192), at).unwrap();
    let b = &mut l.ends[1];
    b.conns.insert(b_id.get(), conn);
    b.adopt(b_id, rk, 4096);
    let hello = pattern(1500, 9);
    assert_eq!(b.write(b_id, &hello), hello.len());
    // The stream's writes are posted before stream 0's ACCEPT.
    while let Some(w) = b.conns.get_mut(&b_id.get()).unwrap().poll_write() {
        b.send(tag(b_id, w));
    }
    let [a_ev, _] = l.settle();
    assert!(
        matches!(a_ev[..], [Said::Opened(id)] if id == a_id),
        "{a_ev:?}"
    );
    assert!(l.ends[0].mux.error().is_none());
    let mut got = Vec::new();
    l.ends[0].read(a_id, &mut got);
    assert_eq!(got, hello);
    // And the stream works both ways from there.
    let back = pattern(700, 3);
    assert_eq!(l.ends[0].write(a_id, &back), back.len());
    l.settle();
    let mut got = Vec::new();
    l.ends[1].read(b_id, &mut got);
    assert_eq!(got, back);
}

#[test]
fn a_streams_ring_grows_on_the_link_and_every_byte_arrives() {
    let mut l = Link::new();
    let growing = Params {
        ring_grow_to: 65536,
        ..params(4096)
    };
    // Two streams: B's ring of the first grows while A streams at it; the second, beside
    // it, keeps its ring and its bytes.
    let (a, b) = l.open_with(params(4096), growing);
    let (a2, b2) = l.open(4096, 4096);
    let big = pattern(300_000, 3);
    let small = pattern(50_000, 77);
    let (mut sent, mut sent2) = (0, 0);
    let (mut got, mut got2) = (Vec::new(), Vec::new());
    let mut grew_records = 0;
    for _ in 0..20_000 {
        if sent < big.len() {
            sent += l.ends[0].write(a, &big[sent..]);
        }
        if sent2 < small.len() {
            sent2 += l.ends[0].write(a2, &small[sent2..(sent2 + 700).min(small.len())]);
        }
        l.round();
        // As a driver does: the memory in order before it is used after any input.
        for e in &mut l.ends {
            e.sync_growth();
        }
        l.ends[1].read(b, &mut got);
        l.ends[1].read(b2, &mut got2);
        for e in &mut l.ends {
            e.sync_growth();
        }
        grew_records += l.ends[0]
            .said
            .drain(..)
            .filter(|s| matches!(s, Said::Grew(id) if *id == a))
            .count();
        if got.len() == big.len() && got2.len() == small.len() {
            break;
        }
    }
    assert_eq!(got, big);
    assert_eq!(got2, small);
    assert_eq!(grew_records, 1, "A heard one GROW for the stream");
    assert_eq!(l.ends[1].grew, 1, "B switched to the bigger ring once");
    assert_eq!(l.ends[1].conn(b).ring_size(), 65536);
    assert_eq!(l.ends[1].conn(b2).ring_size(), 4096);
    assert!(l.ends.iter().all(|e| e.mux.error().is_none()));
}

#[test]
fn a_grow_before_its_granted_open_is_announced_brings_the_open_first() {
    let mut l = Link::new();
    let granted = l.grant(1, 8192);
    let (rk, at) = l.ends[0].ring(4096);
    let dest = "10.0.0.2:80".parse().unwrap();
    let a = &mut l.ends[0];
    let growing = Params {
        ring_grow_to: 16384,
        ..params(4096)
    };
    let (id, conn) = a.mux.open_granted(growing, at, 43, (dest, 40_002)).unwrap();
    a.conns.insert(id.get(), conn);
    a.adopt(id, rk, 4096);
    // A's ring grows before its OPEN was announced: the GROW must not reach B before the
    // OPEN that takes the grant.
    a.conn(id).ask_bigger_ring();
    let size = a.conns[&id.get()].ring_grow_wanted().unwrap();
    let (rkey, new) = a.ring(size);
    a.next_ring.insert(id.get(), rkey);
    a.conn(id).offer_ring_at(new.rkey, new.addr);
    let (size, rkey, addr) = a.conn(id).take_grow_record().unwrap();
    a.mux.grow(id, size, RingAt { rkey, addr });
    let [_, b] = l.settle();
    l.ends[0].sync_growth();
    assert_eq!(l.ends[0].grew, 1, "B's SWITCHED reached A");
    assert!(
        matches!(&b[..], [Said::IncomingGranted(_, g), Said::Grew(m)] if *g == granted[0] && *m == granted[0]),
        "{b:?}"
    );
    assert!(l.ends.iter().all(|e| e.mux.error().is_none()));
}
