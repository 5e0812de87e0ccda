//! The control plane of a link (PROTOCOL.md §14) over the in-memory transport: two ends'
//! `Control`s exchanging records through a real stream 0 (`Conn::on_link`, 4 KiB rings),
//! opening, accepting, refusing and closing streams, and failing on a malformed record.

use rsock_core::proto::link::imm::StreamId;
use rsock_core::proto::link::record::{Accept, Grant, Grow, Open, RefuseReason};
use rsock_core::proto::link::{Control, ControlError, ControlEvent, NoId};
use rsock_core::proto::Params;
use rsock_core::transport::mem::{Pair, Side};

struct Link {
    /// Stream 0 of the link.
    wire: Pair,
    /// Side A's and side B's control planes.
    ends: [Control; 2],
}

fn idx(s: Side) -> usize {
    match s {
        Side::A => 0,
        Side::B => 1,
    }
}

fn id(n: u16) -> StreamId {
    StreamId::new(n).unwrap()
}

impl Link {
    fn new(max_streams: u16) -> Link {
        let config = Params {
            ring_size: 4096,
            recv_credits: 8,
            send_buf_size: 4096,
            send_queue_depth: 8,
            max_inline: 64,
            ring_grow_to: 0,
            send_grow_to: 0,
        };
        Link {
            wire: Pair::on_link(
                config.clone(),
                config,
                (StreamId::CONTROL, StreamId::CONTROL),
            ),
            ends: [Control::new(max_streams), Control::new(max_streams)],
        }
    }

    /// Moves records until both ends are quiet; returns the events each end got.
    fn run(&mut self) -> [Vec<ControlEvent>; 2] {
        let mut events = [Vec::new(), Vec::new()];
        for _ in 0..10_000 {
            for s in [Side::A, Side::B] {
                let ep = self.wire.ep_mut(s);
                self.ends[idx(s)].flush(&mut ep.conn, &mut ep.send_buf);
            }
            self.wire.drive().unwrap();
            self.wire.check_invariants().unwrap();
            for s in [Side::A, Side::B] {
                let ep = self.wire.ep_mut(s);
                let c = &mut self.ends[idx(s)];
                c.receive(&mut ep.conn, &ep.ring).unwrap();
                while let Some(e) = c.poll_event() {
                    events[idx(s)].push(e);
                }
            }
            let quiet = self.ends.iter().all(|c| c.queued() == 0)
                && self.wire.a.in_flight() == 0
                && self.wire.b.in_flight() == 0;
            if quiet {
                return events;
            }
        }
        panic!("the control stream does not settle");
    }
}

fn open_to(port: u16) -> Open {
    Open {
        opener: StreamId::CONTROL, // set by Control::open
        granted: None,
        from_port: 0,
        recv_credits: 16,
        ring_size: 32 * 1024,
        ring_rkey: 0x1234,
        ring_addr: 0x8000,
        conn_id: 0xfeed + u64::from(port),
        dest: format!("10.0.0.1:{port}").parse().unwrap(),
    }
}

fn grant() -> Grant {
    Grant {
        acceptor: StreamId::CONTROL, // set by Control::grant
        recv_credits: 16,
        ring_size: 32 * 1024,
        ring_rkey: 0x4321,
        ring_addr: 0x10000,
    }
}

fn our_side() -> Accept {
    Accept {
        opener: StreamId::CONTROL,
        acceptor: StreamId::CONTROL,
        recv_credits: 16,
        ring_size: 64 * 1024,
        ring_rkey: 0x5678,
        ring_addr: 0,
        conn_id: 0,
    }
}

#[test]
fn a_stream_opens_is_accepted_and_closes_and_its_ids_come_back() {
    let mut l = Link::new(8);
    let mine = l.ends[0].open(open_to(80)).unwrap();
    let [a, b] = l.run();
    assert!(a.is_empty());
    let [ControlEvent::Incoming(open)] = &b[..] else {
        panic!("{b:?}")
    };
    assert_eq!(open.opener, mine);
    assert_eq!(open.dest.port(), 80);
    let theirs = l.ends[1].accept(open, our_side()).unwrap();
    let [a, _] = l.run();
    let [ControlEvent::Accepted(acc)] = &a[..] else {
        panic!("{a:?}")
    };
    assert_eq!((acc.opener, acc.acceptor), (mine, theirs));
    assert_eq!(acc.conn_id, open.conn_id, "the OPEN's id, echoed");
    assert_eq!(acc.ring_size, 64 * 1024);
    assert_eq!(l.ends[0].streams().theirs(mine), Some(theirs));
    assert_eq!(l.ends[1].streams().theirs(theirs), Some(mine));

    // A closes first; B's table learns, B closes; both ids are free again.
    l.ends[0].close(mine);
    let [_, b] = l.run();
    assert_eq!(b, vec![ControlEvent::PeerClosed { mine: theirs }]);
    l.ends[1].close(theirs);
    let [a, _] = l.run();
    assert_eq!(a, vec![ControlEvent::PeerClosed { mine }]);
    assert!(l.ends.iter().all(|c| c.streams().is_idle()));
    assert_eq!(l.ends[0].open(open_to(81)), Ok(mine), "the id is reused");
}

#[test]
fn many_opens_cross_and_each_end_names_streams_its_own_way() {
    let mut l = Link::new(64);
    let from_a: Vec<_> = (0..20)
        .map(|i| l.ends[0].open(open_to(1000 + i)).unwrap())
        .collect();
    let from_b: Vec<_> = (0..20)
        .map(|i| l.ends[1].open(open_to(2000 + i)).unwrap())
        .collect();
    // Both ends gave out the same numbers: each end's ids are its own.
    assert_eq!(from_a, from_b);
    let [a, b] = l.run();
    for (end, events) in [(0, a), (1, b)] {
        assert_eq!(events.len(), 20);
        for e in events {
            let ControlEvent::Incoming(open) = e else {
                panic!("{e:?}")
            };
            l.ends[end].accept(&open, our_side()).unwrap();
        }
    }
    let [a, b] = l.run();
    assert_eq!(a.len(), 20);
    assert_eq!(b.len(), 20);
    assert_eq!(l.ends[0].streams().in_use(), 40);
    assert_eq!(l.ends[1].streams().in_use(), 40);
}

#[test]
fn refusals_free_the_openers_id_and_a_full_table_refuses_by_itself() {
    let mut l = Link::new(1);
    let s = l.ends[0].open(open_to(80)).unwrap();
    let [_, b] = l.run();
    let ControlEvent::Incoming(open) = &b[0] else {
        panic!()
    };
    l.ends[1].refuse(open.opener, RefuseReason::NotMine);
    let [a, _] = l.run();
    assert_eq!(
        a,
        vec![ControlEvent::Refused {
            mine: s,
            reason: RefuseReason::NotMine
        }]
    );
    assert!(l.ends[0].streams().is_idle());

    // Both ends open at once with their only id: neither has one left to accept the
    // other's OPEN with, so each refuses it (no resources) and both tables end empty.
    let sb = l.ends[1].open(open_to(90)).unwrap();
    let sa = l.ends[0].open(open_to(80)).unwrap();
    let events = l.run();
    for (end, ev) in events.iter().enumerate() {
        let [ControlEvent::Incoming(open)] = &ev[..] else {
            panic!("{ev:?}")
        };
        assert_eq!(l.ends[end].accept(open, our_side()), Err(NoId::Exhausted));
    }
    let [a, b] = l.run();
    let refused = |mine| ControlEvent::Refused {
        mine,
        reason: RefuseReason::NoResources,
    };
    assert_eq!((a, b), (vec![refused(sa)], vec![refused(sb)]));
    assert!(l.ends.iter().all(|c| c.streams().is_idle()));
}

#[test]
fn after_goodbye_nothing_new_opens() {
    let mut l = Link::new(8);
    l.ends[0].goodbye();
    let [_, b] = l.run();
    assert_eq!(b, vec![ControlEvent::Goodbye]);
    assert_eq!(l.ends[1].open(open_to(80)), Err(NoId::Closing));
    assert_eq!(l.ends[0].open(open_to(80)), Err(NoId::Closing));
}

#[test]
fn an_open_crossing_a_goodbye_is_refused_as_the_link_closes() {
    let mut l = Link::new(8);
    let s = l.ends[1].open(open_to(80)).unwrap();
    l.ends[0].goodbye();
    let [a, b] = l.run();
    assert_eq!(a, Vec::<ControlEvent>::new(), "A refused it by itself");
    assert_eq!(
        b,
        vec![
            ControlEvent::Goodbye,
            ControlEvent::Refused {
                mine: s,
                reason: RefuseReason::LinkClosing
            }
        ]
    );
    assert!(l.ends[1].streams().is_idle());
}

#[test]
fn a_malformed_record_fails_the_link() {
    let mut l = Link::new(8);
    // A record header with an unknown kind, written straight into stream 0.
    let ep = l.wire.ep_mut(Side::A);
    ep.conn.write(&mut ep.send_buf, &[0, 4, 9, 0]).unwrap();
    l.wire.drive().unwrap();
    let ep = l.wire.ep_mut(Side::B);
    let r = l.ends[1].receive(&mut ep.conn, &ep.ring);
    assert!(matches!(r, Err(ControlError::Record(_))), "{r:?}");
    assert_eq!(l.ends[1].error(), r.err());
}

#[test]
fn records_for_streams_that_are_not_there_fail_the_link() {
    let mut l = Link::new(8);
    // B claims to accept an OPEN A never sent: A's table refuses it.
    let mut b = [0u8; 64];
    let rec = rsock_core::proto::link::record::Record::Accept(Accept {
        opener: id(3),
        acceptor: id(1),
        ..our_side()
    });
    let n = rec.write_to(&mut b).unwrap();
    let ep = l.wire.ep_mut(Side::B);
    ep.conn.write(&mut ep.send_buf, &b[..n]).unwrap();
    l.wire.drive().unwrap();
    let ep = l.wire.ep_mut(Side::A);
    let r = l.ends[0].receive(&mut ep.conn, &ep.ring);
    assert!(matches!(r, Err(ControlError::Link(_))), "{r:?}");
}

#[test]
fn a_grow_reaches_the_streams_other_end_and_a_hostile_one_fails_the_link() {
    let mut l = Link::new(8);
    let mine = l.ends[0].open(open_to(80)).unwrap();
    let [_, b] = l.run();
    let [ControlEvent::Incoming(open)] = &b[..] else {
        panic!("{b:?}")
    };
    let theirs = l.ends[1].accept(open, our_side()).unwrap();
    l.run();
    // B's ring of the stream grows: A hears it for its id of the stream.
    l.ends[1].grow(theirs, 256 * 1024, 0x77, 0x4_0000);
    let [a, _] = l.run();
    let want = Grow {
        grower: theirs,
        peer: mine,
        ring_size: 256 * 1024,
        ring_rkey: 0x77,
        ring_addr: 0x4_0000,
    };
    assert_eq!(a, vec![ControlEvent::Grow(want)]);
    // GROWs B writes straight into stream 0: naming a stream of A's that is not B's (the
    // wrong grower), and one A never opened. Each fails the link.
    for bad in [
        Grow {
            grower: id(5),
            ..want
        },
        Grow {
            peer: id(6),
            ..want
        },
    ] {
        let mut l2 = Link::new(8);
        let m = l2.ends[0].open(open_to(80)).unwrap();
        let [_, b] = l2.run();
        let [ControlEvent::Incoming(open)] = &b[..] else {
            panic!("{b:?}")
        };
        let t = l2.ends[1].accept(open, our_side()).unwrap();
        l2.run();
        assert_eq!((m, t), (mine, theirs), "the same ids as above");
        let mut buf = [0u8; 64];
        let n = rsock_core::proto::link::record::Record::Grow(bad)
            .write_to(&mut buf)
            .unwrap();
        let ep = l2.wire.ep_mut(Side::B);
        ep.conn.write(&mut ep.send_buf, &buf[..n]).unwrap();
        l2.wire.drive().unwrap();
        let ep = l2.wire.ep_mut(Side::A);
        let r = l2.ends[0].receive(&mut ep.conn, &ep.ring);
        assert!(matches!(r, Err(ControlError::Link(_))), "{bad:?}: {r:?}");
    }
}

mod random {
    //! Random opens, answers and closes from both ends, with stream 0's send buffer small
    //! enough that records go out in pieces and across the ring's wrap.
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone, Copy)]
    enum Step {
        Open(usize),
        /// One round of the transport (post, deliver, receive, complete).
        Round,
        /// End `.0` reads stream 0 and answers what it got: accept unless `.1` says refuse.
        Answer(usize, bool),
        /// End `.0` closes one of its open streams.
        Close(usize, usize),
        /// End B grants A a stream (only the accepting end of a link grants, as rsock's:
        /// two ends that each granted their last id to the other could open nothing more).
        Grant,
        /// End `.0` opens a stream on a grant of the other's, if it holds one.
        OpenGranted(usize),
        /// End `.0` grows its ring of one of its open streams (a GROW record).
        Grow(usize, usize),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            2 => (0..2usize).prop_map(Step::Open),
            4 => Just(Step::Round),
            3 => (0..2usize, prop::bool::weighted(0.2)).prop_map(|(e, r)| Step::Answer(e, r)),
            2 => (0..2usize, any::<usize>()).prop_map(|(e, k)| Step::Close(e, k)),
            1 => Just(Step::Grant),
            2 => Just(Step::OpenGranted(0)),
            1 => (0..2usize, any::<usize>()).prop_map(|(e, k)| Step::Grow(e, k)),
        ]
    }

    struct World {
        link: Link,
        open: [Vec<StreamId>; 2],
    }

    impl World {
        fn side(e: usize) -> Side {
            if e == 0 {
                Side::A
            } else {
                Side::B
            }
        }

        fn flush(&mut self) {
            for e in 0..2 {
                let ep = self.link.wire.ep_mut(Self::side(e));
                self.link.ends[e].flush(&mut ep.conn, &mut ep.send_buf);
            }
        }

        fn answer(&mut self, e: usize, refuse: bool) -> Result<(), TestCaseError> {
            let ep = self.link.wire.ep_mut(Self::side(e));
            let c = &mut self.link.ends[e];
            c.receive(&mut ep.conn, &ep.ring)
                .map_err(|err| TestCaseError::fail(format!("end {e}: {err}")))?;
            while let Some(ev) = c.poll_event() {
                match ev {
                    ControlEvent::Incoming(open) if refuse => {
                        c.refuse(open.opener, RefuseReason::NotMine)
                    }
                    ControlEvent::Incoming(open) => {
                        if let Ok(mine) = c.accept(&open, our_side()) {
                            self.open[e].push(mine);
                        }
                    }
                    ControlEvent::Accepted(acc) => self.open[e].push(acc.opener),
                    ControlEvent::IncomingGranted { mine, .. } => self.open[e].push(mine),
                    ControlEvent::Refused { .. }
                    | ControlEvent::PeerClosed { .. }
                    | ControlEvent::Grow(_) => {}
                    ControlEvent::Goodbye => prop_assert!(false, "nobody said goodbye"),
                }
            }
            Ok(())
        }

        fn apply(&mut self, s: Step) -> Result<(), TestCaseError> {
            match s {
                Step::Open(e) => {
                    let _ = self.link.ends[e].open(open_to(80));
                }
                Step::Round => {
                    self.flush();
                    self.link
                        .wire
                        .step()
                        .map_err(|f| TestCaseError::fail(format!("{f:?}")))?;
                    self.link
                        .wire
                        .check_invariants()
                        .map_err(TestCaseError::fail)?;
                }
                Step::Answer(e, refuse) => self.answer(e, refuse)?,
                Step::Close(e, k) => {
                    if !self.open[e].is_empty() {
                        let mine = self.open[e].swap_remove(k % self.open[e].len());
                        self.link.ends[e].close(mine);
                    }
                }
                Step::Grant => {
                    let _ = self.link.ends[1].grant(grant());
                }
                Step::Grow(e, k) => {
                    if !self.open[e].is_empty() {
                        let mine = self.open[e][k % self.open[e].len()];
                        self.link.ends[e].grow(mine, 64 * 1024, 0x99, 0);
                    }
                }
                Step::OpenGranted(e) => {
                    let c = &mut self.link.ends[e];
                    if let Ok((mine, _, open)) = c.open_granted(open_to(80)) {
                        c.send_open(&open);
                        self.open[e].push(mine);
                    }
                }
            }
            Ok(())
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 256,
            rng_seed: proptest::test_runner::RngSeed::Fixed(0x4354_524c),
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// Whatever the order, two honest ends never fail the link, and once every stream
        /// is closed and everything delivered both tables are empty.
        #[test]
        fn honest_ends_never_fail_the_link(
            send_buf in 16u32..200,
            max in 1u16..8,
            steps in proptest::collection::vec(step(), 0..300),
        ) {
            let config = Params {
                ring_size: 4096,
                recv_credits: 4,
                send_buf_size: send_buf,
                send_queue_depth: 4,
                max_inline: 0,
                ring_grow_to: 0,
                send_grow_to: 0,
            };
            let mut w = World {
                link: Link {
                    wire: Pair::on_link(config.clone(), config, (StreamId::CONTROL, StreamId::CONTROL)),
                    ends: [Control::new(max), Control::new(max)],
                },
                open: [Vec::new(), Vec::new()],
            };
            for s in steps {
                w.apply(s)?;
            }
            // Settle: take every grant, answer everything (accepting), then close
            // everything, until quiet.
            for _ in 0..200 {
                for e in 0..2 {
                    while w.link.ends[e].next_grant().is_some() {
                        let before = w.link.ends[e].grants_held();
                        w.apply(Step::OpenGranted(e))?;
                        if w.link.ends[e].grants_held() == before {
                            break; // no id left here: a close frees one
                        }
                    }
                    w.apply(Step::Answer(e, false))?;
                    while !w.open[e].is_empty() {
                        w.apply(Step::Close(e, 0))?;
                    }
                }
                for _ in 0..4 {
                    w.apply(Step::Round)?;
                }
                let quiet = w.link.ends.iter().all(|c| c.queued() == 0 && c.grants_held() == 0)
                    && w.link.wire.a.in_flight() == 0
                    && w.link.wire.b.in_flight() == 0
                    && w.open.iter().all(|o| o.is_empty());
                if quiet && w.link.ends.iter().all(|c| c.streams().is_idle()) {
                    return Ok(());
                }
            }
            prop_assert!(false, "not idle: {} and {} ids in use",
                w.link.ends[0].streams().in_use(), w.link.ends[1].streams().in_use());
        }
    }
}
