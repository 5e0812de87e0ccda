//! Property tests: random configs, app call sizes and step interleavings over the in-memory
//! transport. After every step the credit invariants hold and no write leaves the granted
//! window (checked by the harness); at the end both streams arrive intact and the connection
//! finishes. Seeds are fixed so runs are deterministic.

use proptest::prelude::*;
use proptest::test_runner::{Config as PtConfig, RngSeed};
use rsock_core::proto::link::imm::StreamId;
use rsock_core::proto::{Params, ReadError, WriteError};
use rsock_core::transport::mem::{Pair, Side};

fn pt_config(cases: u32) -> PtConfig {
    PtConfig {
        cases,
        rng_seed: RngSeed::Fixed(0x5253_434b),
        failure_persistence: None,
        max_shrink_iters: 2000,
        ..PtConfig::default()
    }
}

fn config() -> impl Strategy<Value = Params> {
    (
        prop_oneof![3 => 1u32..=16, 2 => 17u32..=80, 1 => 81u32..=700],
        4u32..=12,
        prop_oneof![3 => 1u32..=16, 2 => 17u32..=96],
        4u32..=12,
        prop_oneof![Just(0u32), 0u32..=8],
    )
        .prop_map(
            |(ring_size, recv_credits, send_buf_size, send_queue_depth, max_inline)| Params {
                ring_size,
                recv_credits,
                send_buf_size,
                send_queue_depth,
                max_inline,
                ring_grow_to: 0,
                send_grow_to: 0,
            },
        )
}

/// `config()` with buffers that grow: rings to one or two 4 KiB pages (what a GROW can
/// announce), send buffers to any bigger size.
fn growing_config() -> impl Strategy<Value = Params> {
    (
        config(),
        prop_oneof![Just(0u32), Just(4096), Just(8192)],
        prop_oneof![Just(0u32), 1u32..=300],
    )
        .prop_map(|(c, ring_to, send_more)| Params {
            ring_grow_to: ring_to,
            send_grow_to: if send_more == 0 {
                0
            } else {
                c.send_buf_size + send_more
            },
            ..c
        })
}

fn side() -> impl Strategy<Value = Side> {
    prop_oneof![Just(Side::A), Just(Side::B)]
}

#[derive(Debug, Clone)]
enum Action {
    Write(Side, usize),
    Read(Side, usize, usize),
    Peek(Side, usize),
    Post(Side),
    Deliver(Side, usize),
    Recv(Side, usize),
    Complete(Side, usize),
    Shutdown(Side),
    /// That end starts handing itself over (PROTOCOL.md §11); refused ones change nothing.
    Migrate(Side),
    /// The started hand-over completes: the pair continues with the taker.
    Resume,
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        4 => (side(), 1usize..=40).prop_map(|(s, n)| Action::Write(s, n)),
        4 => (side(), 0usize..=30, 0usize..=30).prop_map(|(s, a, b)| Action::Read(s, a, b)),
        1 => (side(), 1usize..=30).prop_map(|(s, n)| Action::Peek(s, n)),
        3 => side().prop_map(Action::Post),
        3 => (side(), 1usize..=3).prop_map(|(s, n)| Action::Deliver(s, n)),
        3 => (side(), 1usize..=4).prop_map(|(s, n)| Action::Recv(s, n)),
        3 => (side(), 1usize..=4).prop_map(|(s, n)| Action::Complete(s, n)),
        1 => side().prop_map(Action::Shutdown),
    ]
}

/// `action()` plus queue-pair hand-overs started and completed at random points.
fn action_or_move() -> impl Strategy<Value = Action> {
    prop_oneof![
        20 => action(),
        1 => side().prop_map(Action::Migrate),
        1 => Just(Action::Resume),
    ]
}

/// One direction's bookkeeping: what the app wrote and what the peer's app read.
#[derive(Default)]
struct Stream {
    data: Vec<u8>,
    written: usize,
    read: Vec<u8>,
    shut: bool,
    eof: bool,
}

struct World {
    p: Pair,
    /// The link was cut: resets are expected and the streams may stop short.
    broken: bool,
    /// The app closed this side (indexed by side): it reads no more.
    closed: [bool; 2],
    /// Indexed by sending side: 0 = A->B, 1 = B->A.
    s: [Stream; 2],
    /// Hand-overs started (indexed by side) and completed.
    moving: [bool; 2],
    moves: usize,
}

fn idx(side: Side) -> usize {
    match side {
        Side::A => 0,
        Side::B => 1,
    }
}

impl World {
    fn write(&mut self, side: Side, n: usize) -> Result<(), TestCaseError> {
        let st = &mut self.s[idx(side)];
        let end = (st.written + n).min(st.data.len());
        let r = if n % 3 == 1 {
            // Zero-copy path: copy into the free ranges, then commit.
            let ep = self.p.ep_mut(side);
            let mut src = &st.data[st.written..end];
            let mut placed = 0;
            for r in ep.conn.send_space() {
                let k = r.len().min(src.len());
                ep.send_buf[r.start..r.start + k].copy_from_slice(&src[..k]);
                src = &src[k..];
                placed += k;
            }
            ep.conn
                .commit_write(placed.max(usize::from(end > st.written)))
        } else {
            self.p.write(side, &st.data[st.written..end])
        };
        match r {
            Ok(k) => {
                prop_assert!(k <= end - st.written);
                st.written += k;
            }
            Err(WriteError::Blocked) => prop_assert!(end > st.written),
            Err(WriteError::Closed) => prop_assert!(st.shut),
            Err(WriteError::Reset) => prop_assert!(self.broken, "unexpected reset"),
        }
        Ok(())
    }

    fn read(&mut self, side: Side, a: usize, b: usize) -> Result<(), TestCaseError> {
        if self.closed[idx(side)] {
            return Ok(());
        }
        // `side` reads what its peer wrote.
        let st = &mut self.s[idx(side.peer())];
        let (mut x, mut y) = (vec![0u8; a], vec![0u8; b]);
        let ep = self.p.ep_mut(side);
        let mut bufs = [
            std::io::IoSliceMut::new(&mut x),
            std::io::IoSliceMut::new(&mut y),
        ];
        let result = if a == 0 && b > 0 {
            // Zero-copy path: read the ranges in place, then consume.
            let mut k = 0;
            for r in ep.conn.readable_ranges() {
                let take = r.len().min(b - k);
                y[k..k + take].copy_from_slice(&ep.ring[r.start..r.start + take]);
                k += take;
            }
            let consumed = ep.conn.consume(k);
            assert_eq!(consumed, k);
            match ep.conn.readable_slices(&ep.ring) {
                Err(e) => Err(e),
                Ok(_) if k > 0 => Ok(k),
                Ok(_) if ep.conn.at_eof() => Ok(0),
                Ok(_) => Err(ReadError::Blocked),
            }
        } else {
            ep.conn.read_vectored(&ep.ring, &mut bufs)
        };
        match result {
            Ok(0) if a + b > 0 => {
                prop_assert!(st.shut && st.read.len() == st.written, "early EOF");
                st.eof = true;
            }
            Ok(n) => {
                prop_assert!(n <= a + b);
                let got: Vec<u8> = x.iter().chain(y.iter()).take(n).copied().collect();
                st.read.extend_from_slice(&got);
                prop_assert!(st.read.len() <= st.written);
                prop_assert_eq!(&st.read[..], &st.data[..st.read.len()]);
            }
            Err(ReadError::Blocked) => {}
            Err(ReadError::Reset) => prop_assert!(self.broken, "unexpected reset"),
        }
        Ok(())
    }

    fn peek(&mut self, side: Side, n: usize) -> Result<(), TestCaseError> {
        if self.closed[idx(side)] {
            return Ok(());
        }
        let st = &self.s[idx(side.peer())];
        let ep = self.p.ep(side);
        let mut buf = vec![0u8; n];
        let avail = ep.conn.readable();
        if let Ok(k) = ep.conn.peek(&ep.ring, &mut buf) {
            prop_assert_eq!(k, n.min(avail));
            let from = st.read.len();
            prop_assert_eq!(&buf[..k], &st.data[from..from + k]);
        }
        Ok(())
    }

    fn apply(&mut self, a: &Action) -> Result<(), TestCaseError> {
        let fault = |f| TestCaseError::fail(format!("{f:?}"));
        match *a {
            Action::Write(s, n) => self.write(s, n)?,
            Action::Read(s, x, y) => self.read(s, x, y)?,
            Action::Peek(s, n) => self.peek(s, n)?,
            Action::Post(s) => {
                self.p.post(s).map_err(fault)?;
            }
            Action::Deliver(s, n) => {
                for _ in 0..n {
                    self.p.deliver(s).map_err(fault)?;
                }
            }
            Action::Recv(s, n) => {
                for _ in 0..n {
                    self.p.recv(s).map_err(fault)?;
                }
            }
            Action::Complete(s, n) => {
                for _ in 0..n {
                    self.p.complete(s);
                }
            }
            Action::Shutdown(s) => {
                self.p.ep_mut(s).conn.shutdown_write();
                self.s[idx(s)].shut = true;
            }
            Action::Migrate(s) => {
                let port = 7 + self.moves as u16;
                if self.p.ep_mut(s).conn.start_migration(port).is_ok() {
                    self.moving[idx(s)] = true;
                }
            }
            Action::Resume => self.resume()?,
        }
        self.p.check_invariants().map_err(TestCaseError::fail)?;
        Ok(())
    }

    /// Completes a started hand-over. When both ends started one, the passive end's (B)
    /// wins. The end that stays becomes A; the taker B (with the moved end's config).
    fn resume(&mut self) -> Result<(), TestCaseError> {
        let from = match self.moving {
            [false, false] => return Ok(()),
            [true, false] => Side::A,
            _ => Side::B,
        };
        let port = 7 + self.moves as u16;
        // The taker's buffers are the moved end's as they are now (they may have grown).
        let conn = &self.p.ep(from).conn;
        let cfg = Params {
            ring_size: conn.ring_size(),
            send_buf_size: conn.send_buf_size(),
            ..self.p.ep(from).config().clone()
        };
        let placeholder = Pair::new(cfg.clone(), cfg.clone());
        let p = std::mem::replace(&mut self.p, placeholder);
        self.p = p
            .complete_hand_over(from, port, cfg)
            .map_err(|f| TestCaseError::fail(format!("hand-over: {f:?}")))?;
        if from == Side::A {
            self.s.swap(0, 1);
            self.closed.swap(0, 1);
        }
        self.moving = [false; 2];
        self.moves += 1;
        self.p.check_invariants().map_err(TestCaseError::fail)
    }

    /// Fair schedule until both streams are complete, at EOF, and both ends finished (after a
    /// disconnect: until both ends are finished).
    fn finish(&mut self) -> Result<(), TestCaseError> {
        self.resume()?;
        for _ in 0..20_000 {
            for side in [Side::A, Side::B] {
                let i = idx(side);
                if self.s[i].written < self.s[i].data.len() && !self.s[i].shut {
                    self.write(side, usize::MAX / 2)?;
                }
                if self.s[i].written == self.s[i].data.len() && !self.s[i].shut {
                    self.apply(&Action::Shutdown(side))?;
                }
                self.read(side, 17, 9)?;
            }
            let moved = self
                .p
                .step()
                .map_err(|f| TestCaseError::fail(format!("{f:?}")))?;
            self.p.check_invariants().map_err(TestCaseError::fail)?;
            let finished = self.p.a.conn.is_finished() && self.p.b.conn.is_finished();
            if finished && !moved && (self.broken || self.s.iter().all(|s| s.eof)) {
                return Ok(());
            }
        }
        Err(TestCaseError::fail(format!(
            "no progress: A {:?} B {:?}",
            self.p.a.conn.counters(),
            self.p.b.conn.counters()
        )))
    }
}

fn run(
    ca: Params,
    cb: Params,
    la: usize,
    lb: usize,
    actions: Vec<Action>,
) -> Result<(), TestCaseError> {
    run_with_cut(ca, cb, la, lb, actions, None)
}

/// How a run is interrupted.
#[derive(Debug, Clone, Copy)]
enum Cut {
    /// The link fails under both ends.
    Disconnect,
    /// One end aborts (SO_LINGER 0).
    Abort(Side),
    /// One end closes while the other may still be sending (which may reset it).
    Close(Side),
}

fn cut() -> impl Strategy<Value = Cut> {
    prop_oneof![
        Just(Cut::Disconnect),
        side().prop_map(Cut::Abort),
        side().prop_map(Cut::Close),
    ]
}

impl World {
    fn interrupt(&mut self, how: Cut) {
        match how {
            Cut::Disconnect => self.p.disconnect(),
            Cut::Abort(s) => self.p.ep_mut(s).conn.abort(),
            Cut::Close(s) => {
                self.p.ep_mut(s).conn.close();
                self.s[idx(s)].shut = true;
                self.closed[idx(s)] = true;
            }
        }
        self.broken = true;
    }
}

/// Like `run`, interrupting the run before action `at` if given.
fn run_with_cut(
    ca: Params,
    cb: Params,
    la: usize,
    lb: usize,
    actions: Vec<Action>,
    cut: Option<(usize, Cut)>,
) -> Result<(), TestCaseError> {
    run_pair(Pair::new(ca, cb), la, lb, actions, cut)
}

/// Like `run_with_cut` on the pair `p` as made.
fn run_pair(
    p: Pair,
    la: usize,
    lb: usize,
    actions: Vec<Action>,
    cut: Option<(usize, Cut)>,
) -> Result<(), TestCaseError> {
    let gen = |n: usize, salt: u8| {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
            .collect()
    };
    let mut w = World {
        moving: [false; 2],
        moves: 0,
        broken: false,
        closed: [false; 2],
        p,
        s: [
            Stream {
                data: gen(la, 1),
                ..Stream::default()
            },
            Stream {
                data: gen(lb, 2),
                ..Stream::default()
            },
        ],
    };
    for (n, a) in actions.iter().enumerate() {
        if let Some((at, how)) = cut {
            if at == n {
                w.interrupt(how);
            }
        }
        w.apply(a)?;
    }
    if let Some((at, how)) = cut {
        if at >= actions.len() {
            w.interrupt(how);
        }
    }
    w.finish()?;
    for st in &w.s {
        // Bytes read are always a correct prefix; after a cut they may stop short.
        prop_assert_eq!(&st.read[..], &st.data[..st.read.len()]);
        if !w.broken {
            prop_assert_eq!(st.read.len(), st.written);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(pt_config(512))]

    /// Both directions at once, random interleavings, tiny rings and queues.
    #[test]
    fn streams_arrive_intact(
        ca in config(),
        cb in config(),
        la in 0usize..=600,
        lb in 0usize..=600,
        actions in proptest::collection::vec(action(), 0..250),
    ) {
        run(ca, cb, la, lb, actions)?;
    }

    /// One direction only, long stream, the receiver reading in odd sizes.
    #[test]
    fn one_way_long_stream(
        ca in config(),
        cb in config(),
        la in 0usize..=3000,
        actions in proptest::collection::vec(action(), 0..100),
    ) {
        run(ca, cb, la, 0, actions)?;
    }
}

proptest! {
    #![proptest_config(pt_config(512))]

    /// Queue-pair hand-overs (either end, crossing ones too, several in a row) at random
    /// points of random traffic: unread, unposted and in-flight bytes all arrive once, in
    /// order, and both ends finish.
    #[test]
    fn handed_over_midway(
        ca in config(),
        cb in config(),
        la in 0usize..=600,
        lb in 0usize..=600,
        actions in proptest::collection::vec(action_or_move(), 0..250),
    ) {
        run(ca, cb, la, lb, actions)?;
    }
}

proptest! {
    #![proptest_config(pt_config(512))]

    /// Buffers that grow under load (PROTOCOL.md §12), with hand-overs at random points:
    /// streams long enough to wrap the grown rings arrive intact.
    #[test]
    fn buffers_grow_midway(
        ca in growing_config(),
        cb in growing_config(),
        la in 0usize..=12_000,
        lb in 0usize..=12_000,
        actions in proptest::collection::vec(action_or_move(), 0..250),
    ) {
        run(ca, cb, la, lb, actions)?;
    }

    /// Growth interrupted by a disconnect, abort or close.
    #[test]
    fn growth_interrupted(
        ca in growing_config(),
        cb in growing_config(),
        la in 0usize..=6000,
        lb in 0usize..=6000,
        actions in proptest::collection::vec(action(), 0..150),
        at in 0usize..160,
        how in cut(),
    ) {
        run_with_cut(ca, cb, la, lb, actions, Some((at, how)))?;
    }
}

proptest! {
    #![proptest_config(pt_config(256))]

    /// A disconnect, abort or close at a random point: no panic, no corrupted byte, both
    /// ends finish.
    #[test]
    fn interrupted_midway(
        ca in config(),
        cb in config(),
        la in 0usize..=300,
        lb in 0usize..=300,
        actions in proptest::collection::vec(action(), 0..150),
        at in 0usize..160,
        how in cut(),
    ) {
        run_with_cut(ca, cb, la, lb, actions, Some((at, how)))?;
    }
}

proptest! {
    #![proptest_config(pt_config(128))]

    /// Completions delivered as late as possible: everything else runs first.
    #[test]
    fn late_completions(ca in config(), cb in config(), la in 0usize..=500, lb in 0usize..=500) {
        let mut actions = Vec::new();
        for round in 0..60usize {
            for s in [Side::A, Side::B] {
                actions.push(Action::Write(s, 7 + round % 13));
                actions.push(Action::Post(s));
                actions.push(Action::Deliver(s, 4));
                actions.push(Action::Recv(s.peer(), 4));
                actions.push(Action::Read(s.peer(), 5, 6));
                if round % 10 == 9 {
                    actions.push(Action::Complete(s, 50));
                }
            }
        }
        run(ca, cb, la, lb, actions)?;
    }
}

/// Configs of a stream on a link: rings of whole credit units (4 KiB pages) or more, which
/// do not grow; small receive shares and queues.
fn link_config() -> impl Strategy<Value = Params> {
    (
        prop_oneof![Just(4096u32), Just(8192), 4096u32..=12_000],
        4u32..=16,
        // Not below 16 bytes: a stream several rings long must finish within the harness's
        // step bound (a 1-byte send buffer posts a message per byte).
        prop_oneof![1 => 16u32..=64, 3 => 65u32..=9000],
        4u32..=12,
        prop_oneof![Just(0u32), 0u32..=8],
    )
        .prop_map(
            |(ring_size, recv_credits, send_buf_size, send_queue_depth, max_inline)| Params {
                ring_size,
                recv_credits,
                send_buf_size,
                send_queue_depth,
                max_inline,
                ring_grow_to: 0,
                send_grow_to: 0,
            },
        )
}

proptest! {
    #![proptest_config(pt_config(256))]

    /// Streams of a link (docs/DESIGN.md, "Links"): the same properties with the link's
    /// immediates — ring bytes returned in whole pages, at most 15 receives per credit,
    /// bursts of at most 65,535 bytes — over streams several rings long; a hand-over asked
    /// for is refused and changes nothing.
    #[test]
    fn streams_of_a_link_arrive_intact(
        ca in link_config(),
        cb in link_config(),
        ids in (0u16..=0x7fff, 0u16..=0x7fff),
        la in 0usize..=20_000,
        lb in 0usize..=20_000,
        actions in proptest::collection::vec(action_or_move(), 0..250),
    ) {
        let ids = (StreamId::new(ids.0).unwrap(), StreamId::new(ids.1).unwrap());
        run_pair(Pair::on_link(ca, cb, ids), la, lb, actions, None)?;
    }

    /// The same, interrupted at a random point.
    #[test]
    fn streams_of_a_link_interrupted(
        ca in link_config(),
        cb in link_config(),
        la in 0usize..=20_000,
        lb in 0usize..=20_000,
        actions in proptest::collection::vec(action(), 0..150),
        at in 0usize..160,
        how in cut(),
    ) {
        let ids = (StreamId::new(7).unwrap(), StreamId::new(300).unwrap());
        run_pair(Pair::on_link(ca, cb, ids), la, lb, actions, Some((at, how)))?;
    }
}
