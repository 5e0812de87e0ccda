//! Tests of the link's stream table: unit cases, and two honest ends exchanging opens,
//! answers, data and closes in random order over in-order channels.

use super::imm::StreamId;
use super::streams::{LinkError, NoId, Streams};
use proptest::prelude::*;
use std::collections::VecDeque;

fn id(n: u16) -> StreamId {
    StreamId::new(n).unwrap()
}

#[test]
fn ids_are_given_lowest_first_and_reused_after_both_closes() {
    let mut a = Streams::new(100);
    assert_eq!(a.open(), Ok(id(1)));
    assert_eq!(a.open(), Ok(id(2)));
    a.on_accept(id(1), id(7)).unwrap();
    assert_eq!(a.close(id(1)), Some(id(7)));
    // Our CLOSE alone does not free it: the peer may still send for it.
    assert_eq!(a.open(), Ok(id(3)));
    assert_eq!(a.accepts_input(id(1)), Ok(()));
    a.on_close(id(7), id(1)).unwrap();
    assert_eq!(a.accepts_input(id(1)), Err(LinkError::NotOpen(1)));
    assert_eq!(a.open(), Ok(id(1)));
    assert_eq!(a.in_use(), 3);
}

#[test]
fn a_granted_id_is_taken_once_by_an_open_naming_it() {
    let (mut acceptor, mut opener) = (Streams::new(10), Streams::new(10));
    let g = acceptor.grant().unwrap();
    // Granted, not open: nothing may arrive for it yet, and it is not the peer's to close.
    assert_eq!(acceptor.accepts_input(g), Err(LinkError::NotOpen(g.get())));
    assert_eq!(acceptor.theirs(g), None);
    let mine = opener.open_granted(g).unwrap();
    assert_eq!(opener.theirs(mine), Some(g));
    assert_eq!(opener.accepts_input(mine), Ok(()));
    acceptor.on_open_granted(mine, g).unwrap();
    assert_eq!(acceptor.theirs(g), Some(mine));
    // A second OPEN on it, or one on an id never granted: the peer breaks the link.
    assert_eq!(
        acceptor.on_open_granted(id(9), g),
        Err(LinkError::NotGranted(g.get()))
    );
    assert_eq!(
        acceptor.on_open_granted(id(9), id(5)),
        Err(LinkError::NotGranted(5))
    );
    let g2 = acceptor.grant().unwrap();
    assert_eq!(
        acceptor.on_open_granted(mine, g2),
        Err(LinkError::DuplicateOpen(mine.get()))
    );
    // It closes as any stream: free at both ends once both CLOSEs passed.
    assert_eq!(opener.close(mine), Some(g));
    acceptor.on_close(mine, g).unwrap();
    assert_eq!(acceptor.close(g), Some(mine));
    opener.on_close(g, mine).unwrap();
    assert!(opener.is_idle());
    assert_eq!(acceptor.in_use(), 1, "the second grant is still out");
    // After GOODBYE no grant is given or taken.
    acceptor.say_goodbye();
    opener.say_goodbye();
    assert_eq!(acceptor.grant(), Err(NoId::Closing));
    assert_eq!(opener.open_granted(g), Err(NoId::Closing));
}

#[test]
fn the_peer_may_close_first() {
    let mut a = Streams::new(10);
    let mine = a.on_open(id(4)).unwrap().unwrap();
    a.on_close(id(4), mine).unwrap();
    assert_eq!(a.accepts_input(mine), Err(LinkError::NotOpen(mine.get())));
    assert_eq!(a.theirs(mine), Some(id(4)));
    assert_eq!(a.close(mine), Some(id(4)));
    assert!(a.is_idle());
    assert_eq!(a.close(mine), None, "a second close sends nothing");
}

#[test]
fn a_refused_open_frees_its_id_at_once() {
    let mut a = Streams::new(10);
    let s = a.open().unwrap();
    a.on_refuse(s).unwrap();
    assert!(a.is_idle());
    assert_eq!(a.on_refuse(s), Err(LinkError::NotOpening(s.get())));
}

#[test]
fn a_full_table_refuses_and_a_goodbye_stops_opens() {
    let mut a = Streams::new(2);
    a.open().unwrap();
    a.open().unwrap();
    assert_eq!(a.open(), Err(NoId::Exhausted));
    assert_eq!(a.on_open(id(1)), Ok(Err(NoId::Exhausted)));
    let mut b = Streams::new(2);
    b.say_goodbye();
    assert_eq!(b.open(), Err(NoId::Closing));
    assert_eq!(b.on_open(id(1)), Ok(Err(NoId::Closing)));
    assert!(b.is_idle());
}

#[test]
fn a_broken_peer_fails_the_link() {
    let mut a = Streams::new(10);
    assert_eq!(a.on_open(id(0)), Err(LinkError::ControlId));
    assert_eq!(a.on_accept(id(3), id(1)), Err(LinkError::NotOpening(3)));
    let mine = a.on_open(id(5)).unwrap().unwrap();
    assert_eq!(a.on_open(id(5)), Err(LinkError::DuplicateOpen(5)));
    assert_eq!(
        a.on_close(id(6), mine),
        Err(LinkError::WrongPeerId {
            mine: mine.get(),
            theirs: 6
        })
    );
    assert_eq!(a.on_close(id(5), id(9)), Err(LinkError::NotOpen(9)));
    assert_eq!(a.accepts_input(id(9)), Err(LinkError::NotOpen(9)));
    assert_eq!(a.accepts_input(StreamId::CONTROL), Ok(()));
    let s = a.open().unwrap();
    assert_eq!(a.on_accept(s, id(0)), Err(LinkError::ControlId));
    assert_eq!(
        a.accepts_input(s),
        Err(LinkError::NotOpen(s.get())),
        "nothing before ACCEPT"
    );
}

/// What one end sends the other, ids as the sender knows them.
#[derive(Debug, Clone, Copy)]
enum Msg {
    /// The opener's id, and the stream's serial number (the model's, not the protocol's:
    /// it tells streams apart across reused ids).
    Open(StreamId, u64),
    Accept {
        opener: StreamId,
        acceptor: StreamId,
    },
    Refuse {
        opener: StreamId,
    },
    Close {
        closer: StreamId,
        peer: StreamId,
    },
    /// An immediate for the receiver's stream, of the stream numbered `serial`.
    Data {
        to: StreamId,
        serial: u64,
    },
}

#[derive(Debug, Clone, Copy)]
enum Step {
    Open(usize),
    Deliver(usize),
    Data(usize, usize),
    Close(usize, usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        1 => (0..2usize).prop_map(Step::Open),
        3 => (0..2usize).prop_map(Step::Deliver),
        2 => (0..2usize, any::<usize>()).prop_map(|(s, k)| Step::Data(s, k)),
        1 => (0..2usize, any::<usize>()).prop_map(|(s, k)| Step::Close(s, k)),
    ]
}

struct End {
    table: Streams,
    /// Our ids of streams both ends know and we have not closed.
    open: Vec<StreamId>,
    /// Refuse every `refuse_every`-th open (0: never).
    refuse_every: usize,
    opens_seen: usize,
    /// The stream each of our ids was last given to.
    serial: std::collections::HashMap<StreamId, u64>,
}

struct Model {
    ends: [End; 2],
    /// `wire[i]`: what end `i` sent, in order.
    wire: [VecDeque<Msg>; 2],
    serials: u64,
}

impl Model {
    fn new(max: u16, refuse_every: usize) -> Model {
        let end = || End {
            table: Streams::new(max),
            open: Vec::new(),
            refuse_every,
            opens_seen: 0,
            serial: std::collections::HashMap::new(),
        };
        Model {
            ends: [end(), end()],
            wire: [VecDeque::new(), VecDeque::new()],
            serials: 0,
        }
    }

    fn apply(&mut self, s: Step) -> Result<(), TestCaseError> {
        match s {
            Step::Open(i) => {
                if let Ok(id) = self.ends[i].table.open() {
                    self.serials += 1;
                    self.ends[i].serial.insert(id, self.serials);
                    self.wire[i].push_back(Msg::Open(id, self.serials));
                }
            }
            Step::Deliver(i) => self.deliver(i)?,
            Step::Data(i, k) => {
                let e = &self.ends[i];
                if !e.open.is_empty() {
                    let mine = e.open[k % e.open.len()];
                    let to = e.table.theirs(mine).expect("open stream has a peer id");
                    let serial = e.serial[&mine];
                    self.wire[i].push_back(Msg::Data { to, serial });
                }
            }
            Step::Close(i, k) => {
                let e = &mut self.ends[i];
                if !e.open.is_empty() {
                    let mine = e.open.swap_remove(k % e.open.len());
                    let peer = e.table.close(mine).expect("an open stream closes");
                    self.wire[i].push_back(Msg::Close { closer: mine, peer });
                }
            }
        }
        Ok(())
    }

    /// Hands end `i`'s oldest message to the other end.
    fn deliver(&mut self, i: usize) -> Result<(), TestCaseError> {
        let Some(m) = self.wire[i].pop_front() else {
            return Ok(());
        };
        let j = 1 - i;
        let to = &mut self.ends[j];
        let fail = |e: LinkError| TestCaseError::fail(format!("{m:?} to end {j}: {e}"));
        match m {
            Msg::Open(theirs, serial) => {
                to.opens_seen += 1;
                let refuse = to.refuse_every > 0 && to.opens_seen.is_multiple_of(to.refuse_every);
                if refuse {
                    self.wire[j].push_back(Msg::Refuse { opener: theirs });
                } else {
                    match to.table.on_open(theirs).map_err(fail)? {
                        Ok(mine) => {
                            to.open.push(mine);
                            to.serial.insert(mine, serial);
                            self.wire[j].push_back(Msg::Accept {
                                opener: theirs,
                                acceptor: mine,
                            });
                        }
                        Err(_) => self.wire[j].push_back(Msg::Refuse { opener: theirs }),
                    }
                }
            }
            Msg::Accept { opener, acceptor } => {
                to.table.on_accept(opener, acceptor).map_err(fail)?;
                to.open.push(opener);
            }
            Msg::Refuse { opener } => to.table.on_refuse(opener).map_err(fail)?,
            Msg::Close { closer, peer } => {
                to.table.on_close(closer, peer).map_err(fail)?;
            }
            Msg::Data { to: mine, serial } => {
                to.table.accepts_input(mine).map_err(fail)?;
                // The immediate reaches the stream it was sent on, not a later one that got
                // the same id.
                prop_assert_eq!(to.serial.get(&mine), Some(&serial), "{:?} to end {}", m, j);
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x4c49_4e4b),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Two honest ends never see the other break the protocol — in particular an immediate
    /// sent before its stream's CLOSE never reaches a reused id — and once everything is
    /// delivered and closed both tables are empty.
    #[test]
    fn two_honest_ends_agree(
        max in 1u16..=6,
        refuse_every in 0usize..4,
        steps in proptest::collection::vec(step(), 0..300),
    ) {
        let mut m = Model::new(max, refuse_every);
        for s in steps {
            m.apply(s)?;
        }
        // Drain, close what is open, drain again.
        for _ in 0..3 {
            while !m.wire[0].is_empty() || !m.wire[1].is_empty() {
                m.deliver(0)?;
                m.deliver(1)?;
            }
            for i in 0..2 {
                while !m.ends[i].open.is_empty() {
                    m.apply(Step::Close(i, 0))?;
                }
            }
        }
        for e in &m.ends {
            prop_assert!(e.table.is_idle(), "left in use: {}", e.table.in_use());
        }
    }
}
