//! The slot allocator (link/slots.rs): golden layouts, every refusal, and a property test
//! against a model that knows only which slots are live and which slabs exist.

use super::{SlabId, Slot, Slots, SlotsError};
use proptest::prelude::*;
use proptest::test_runner::{Config as PtConfig, RngSeed};

const KIB: u32 = 1024;
const MIB: u32 = 1024 * KIB;

fn slot(slab: u32, offset: u32, len: u32) -> Slot {
    Slot {
        slab: SlabId(slab),
        offset,
        len,
    }
}

/// `s` with one slab added.
fn with_slab(min: u32, slab: u32, max_slabs: usize) -> Slots {
    let mut s = Slots::new(min, slab, max_slabs).unwrap();
    assert_eq!(s.add_slab(), Ok(SlabId(0)));
    s
}

#[test]
fn sizes_out_of_range_are_refused() {
    for (min, slab, max) in [
        (2048, MIB, 1),
        (4096, 3 * 4096, 1),
        (12 * KIB, MIB, 1),
        (8192, 4096, 1),
        (4096, 1 << 31, 1),
        (0, MIB, 1),
        (4096, MIB, 0),
    ] {
        assert_eq!(
            Slots::new(min, slab, max).unwrap_err(),
            SlotsError::BadSizes,
            "{min} {slab} {max}"
        );
    }
    for (min, slab) in [(4096, 4096), (4096, 1 << 30), (1 << 30, 1 << 30)] {
        assert!(Slots::new(min, slab, 1).is_ok(), "{min} {slab}");
    }
}

#[test]
fn first_slots_of_a_1mib_slab_land_at_their_golden_offsets() {
    let mut s = with_slab(4 * KIB, MIB, 4);
    assert_eq!(s.alloc(4 * KIB), Ok(slot(0, 0, 4 * KIB)));
    // The 1 MiB block was split down to 4 KiB: free now are 4, 8, 16, 32 KiB ... 512 KiB,
    // each at its own size.
    assert_eq!(s.alloc(32 * KIB), Ok(slot(0, 32 * KIB, 32 * KIB)));
    assert_eq!(s.alloc(4 * KIB), Ok(slot(0, 4 * KIB, 4 * KIB)));
    assert_eq!(s.alloc(256 * KIB), Ok(slot(0, 256 * KIB, 256 * KIB)));
    assert_eq!(s.alloc(512 * KIB), Ok(slot(0, 512 * KIB, 512 * KIB)));
    assert_eq!(s.allocated_bytes(), u64::from(808 * KIB));
}

#[test]
fn lengths_round_up_to_a_power_of_two_of_at_least_min() {
    let mut s = with_slab(8 * KIB, MIB, 1);
    for (asked, got) in [
        (1, 8 * KIB),
        (8 * KIB, 8 * KIB),
        (8 * KIB + 1, 16 * KIB),
        (100 * KIB, 128 * KIB),
        (MIB - 1, MIB),
    ] {
        let t = s.alloc(asked).unwrap();
        assert_eq!(t.len, got, "{asked}");
        s.free(t).unwrap();
    }
}

#[test]
fn zero_and_too_big_lengths_are_refused() {
    let mut s = with_slab(4 * KIB, MIB, 1);
    assert_eq!(s.alloc(0), Err(SlotsError::ZeroLen));
    assert_eq!(s.alloc(MIB + 1), Err(SlotsError::TooBig));
    assert_eq!(s.alloc(u32::MAX), Err(SlotsError::TooBig));
    assert!(s.is_idle());
}

#[test]
fn need_slab_then_add_slab_then_the_alloc_succeeds_until_full() {
    let mut s = Slots::new(4 * KIB, 64 * KIB, 2).unwrap();
    assert_eq!(s.alloc(4 * KIB), Err(SlotsError::NeedSlab));
    assert_eq!(s.add_slab(), Ok(SlabId(0)));
    assert_eq!(s.alloc(64 * KIB), Ok(slot(0, 0, 64 * KIB)));
    assert_eq!(s.alloc(4 * KIB), Err(SlotsError::NeedSlab));
    assert_eq!(s.add_slab(), Ok(SlabId(1)));
    assert_eq!(s.alloc(4 * KIB), Ok(slot(1, 0, 4 * KIB)));
    assert_eq!(
        s.alloc(64 * KIB),
        Err(SlotsError::Full),
        "registering would be in vain"
    );
    assert_eq!(s.add_slab(), Err(SlotsError::Full));
    assert_eq!(s.live_slabs(), 2);
}

#[test]
fn the_lowest_slab_with_room_is_filled_first() {
    let mut s = with_slab(4 * KIB, 64 * KIB, 3);
    let whole = s.alloc(64 * KIB).unwrap();
    s.add_slab().unwrap();
    assert_eq!(s.alloc(8 * KIB), Ok(slot(1, 0, 8 * KIB)));
    s.free(whole).unwrap();
    assert_eq!(s.alloc(4 * KIB), Ok(slot(0, 0, 4 * KIB)));
    // Best fit within a slab: the free 4 KiB block beats splitting a bigger one lower down.
    let mut t = with_slab(4 * KIB, 64 * KIB, 1);
    let a = t.alloc(32 * KIB).unwrap();
    let _b = t.alloc(4 * KIB).unwrap();
    t.free(a).unwrap();
    assert_eq!(t.alloc(4 * KIB), Ok(slot(0, 36 * KIB, 4 * KIB)));
}

#[test]
fn a_small_first_slab_serves_small_slots_and_bigger_ones_need_a_slab() {
    let mut s = Slots::new(4 * KIB, 256 * KIB, 3).unwrap();
    assert_eq!(s.add_slab_of(3 * 4 * KIB), Err(SlotsError::BadSizes));
    assert_eq!(s.add_slab_of(512 * KIB), Err(SlotsError::BadSizes));
    assert_eq!(s.add_slab_of(2 * KIB), Err(SlotsError::BadSizes));
    assert_eq!(s.add_slab_of(64 * KIB), Ok(SlabId(0)));
    assert_eq!(s.slab_bytes(), u64::from(64 * KIB));
    assert_eq!(s.alloc(16 * KIB), Ok(slot(0, 0, 16 * KIB)));
    // Bigger than the first slab: another slab, of the full size.
    assert_eq!(s.alloc(128 * KIB), Err(SlotsError::NeedSlab));
    assert_eq!(s.add_slab(), Ok(SlabId(1)));
    assert_eq!(s.alloc(128 * KIB), Ok(slot(1, 0, 128 * KIB)));
    // Small ones still fill the first slab first.
    assert_eq!(s.alloc(32 * KIB), Ok(slot(0, 32 * KIB, 32 * KIB)));
    assert_eq!(s.alloc(16 * KIB), Ok(slot(0, 16 * KIB, 16 * KIB)));
    assert_eq!(s.alloc(16 * KIB), Ok(slot(1, 128 * KIB, 16 * KIB)));
    assert_eq!(s.slab_bytes(), u64::from(320 * KIB));
    // A slot of the first slab is checked against its size.
    let past = Slot {
        offset: 64 * KIB,
        ..slot(0, 0, 16 * KIB)
    };
    assert_eq!(s.free(past), Err(SlotsError::NotAllocated));
    assert_eq!(s.free(slot(0, 0, 64 * KIB)), Err(SlotsError::NotAllocated));
}

#[test]
fn bad_frees_change_nothing() {
    let mut s = with_slab(4 * KIB, MIB, 2);
    let a = s.alloc(8 * KIB).unwrap();
    let b = s.alloc(32 * KIB).unwrap();
    let gone = s.alloc(4 * KIB).unwrap();
    s.free(gone).unwrap();
    s.add_slab().unwrap();
    let released = s.alloc(MIB).unwrap(); // slab 0 has no free MiB: slab 1
    assert_eq!(released.slab, SlabId(1));
    s.free(released).unwrap();
    assert_eq!(s.release_idle(0), Some(SlabId(1)));
    let before = s.allocated_bytes();
    for bad in [
        gone,                        // double free
        released,                    // its slab is released
        Slot { len: 4 * KIB, ..a },  // wrong length: half of a
        Slot { len: 16 * KIB, ..a }, // wrong length: a and its free buddy
        Slot {
            offset: 4 * KIB,
            ..a
        }, // misaligned
        Slot {
            offset: 64 * KIB,
            ..b
        }, // aligned but free
        Slot { offset: MIB, ..b },   // past the slab
        Slot {
            offset: u32::MAX,
            ..b
        }, // far past it
        Slot { len: 0, ..a },        // no length
        Slot { len: 3 * KIB, ..a },  // not a power of two
        Slot { len: 2 * MIB, ..a },  // bigger than a slab
        Slot { len: u32::MAX, ..a }, // ...much bigger
        Slot {
            slab: SlabId(7),
            ..a
        }, // never was
    ] {
        assert_eq!(s.free(bad), Err(SlotsError::NotAllocated), "{bad:?}");
        assert_eq!(s.allocated_bytes(), before, "{bad:?}");
    }
    // Both real slots are still allocated, and only them.
    s.free(a).unwrap();
    s.free(b).unwrap();
    assert!(s.is_idle());
    assert_eq!(s.alloc(MIB), Ok(slot(0, 0, MIB)));
}

#[test]
fn freed_buddies_merge_back_into_one_slab_sized_block() {
    let mut s = with_slab(4 * KIB, 64 * KIB, 1);
    let small: Vec<Slot> = (0..16).map(|_| s.alloc(4 * KIB).unwrap()).collect();
    assert_eq!(s.alloc(4 * KIB), Err(SlotsError::Full));
    // Free out of order: odd blocks first, so no merge happens until the evens come back.
    for t in small
        .iter()
        .skip(1)
        .step_by(2)
        .chain(small.iter().step_by(2))
    {
        s.free(*t).unwrap();
    }
    assert_eq!(s.alloc(64 * KIB), Ok(slot(0, 0, 64 * KIB)));
}

#[test]
fn release_idle_keeps_keep_slabs_and_never_a_busy_one() {
    let mut s = Slots::new(4 * KIB, 64 * KIB, 8).unwrap();
    for _ in 0..5 {
        s.add_slab().unwrap();
    }
    // Busy: slabs 1 and 3.
    let mut busy = Vec::new();
    for _ in 0..5 {
        busy.push(s.alloc(64 * KIB).unwrap());
    }
    for t in [busy[0], busy[2], busy[4]] {
        s.free(t).unwrap();
    }
    assert_eq!(s.idle_slabs(), 3);
    assert_eq!(
        s.release_idle(1),
        Some(SlabId(4)),
        "the newest idle slab goes first"
    );
    assert_eq!(s.release_idle(1), Some(SlabId(2)));
    assert_eq!(s.release_idle(1), None, "slab 0 is kept");
    assert_eq!(s.live_slabs(), 3);
    assert_eq!(s.release_idle(0), Some(SlabId(0)));
    assert_eq!(s.release_idle(0), None, "slabs 1 and 3 are busy");
    assert_eq!(s.live_slabs(), 2);
    assert_eq!(s.alloc(4 * KIB), Err(SlotsError::NeedSlab));
    s.free(busy[1]).unwrap();
    s.free(busy[3]).unwrap();
    assert!(s.is_idle());
    assert_eq!(s.release_idle(5), None);
    assert_eq!(s.release_idle(0), Some(SlabId(3)));
    assert_eq!(s.release_idle(0), Some(SlabId(1)));
    assert_eq!(s.live_slabs(), 0);
}

#[test]
fn slab_ids_are_never_reused() {
    let mut s = Slots::new(4 * KIB, 64 * KIB, 1).unwrap();
    let mut stale: Option<Slot> = None;
    for n in 0..10 {
        assert_eq!(s.add_slab(), Ok(SlabId(n)));
        let t = s.alloc(4 * KIB).unwrap();
        assert_eq!(t, slot(n, 0, 4 * KIB));
        // The released slab's slot, same offset and length, is not the new slab's.
        if let Some(old) = stale {
            assert_eq!(s.free(old), Err(SlotsError::NotAllocated));
        }
        s.free(t).unwrap();
        assert_eq!(s.release_idle(0), Some(SlabId(n)));
        stale = Some(t);
    }
}

// The model: live slots, live slabs in id order, every id ever handed out.

const MIN: u32 = 4 * KIB;
const SLAB: u32 = 64 * KIB;
const MAX_SLABS: usize = 3;

#[derive(Debug, Clone)]
enum Op {
    Alloc(u32),
    /// Free the live slot at this index (modulo their number).
    Free(usize),
    /// Free the live slot at this index moved by `offset` and resized to `len`.
    FreeBogus(usize, u32, u32),
    /// Add a slab of this size (not a power of two from `MIN` to `SLAB`: refused).
    AddSlab(u32),
    ReleaseIdle(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => prop_oneof![1..=MIN, 1..=SLAB, Just(SLAB), SLAB..=SLAB + 1].prop_map(Op::Alloc),
        5 => any::<usize>().prop_map(Op::Free),
        1 => (any::<usize>(), prop_oneof![Just(0), 0..SLAB * 2], prop_oneof![Just(MIN), 0..SLAB * 2])
            .prop_map(|(i, offset, len)| Op::FreeBogus(i, offset, len)),
        2 => prop_oneof![4 => Just(SLAB), 2 => Just(SLAB / 4), 1 => Just(MIN), 1 => Just(3 * MIN), 1 => Just(2 * SLAB)]
            .prop_map(Op::AddSlab),
        1 => (0..3usize).prop_map(Op::ReleaseIdle),
    ]
}

#[derive(Default)]
struct Model {
    slots: Vec<Slot>,
    slabs: Vec<SlabId>,
    /// Each live slab's size, by id.
    sizes: std::collections::HashMap<SlabId, u32>,
    ids_seen: Vec<SlabId>,
}

impl Model {
    fn overlaps(&self, slab: SlabId, offset: u32, len: u32) -> bool {
        self.slots
            .iter()
            .any(|t| t.slab == slab && t.offset < offset + len && offset < t.offset + t.len)
    }

    /// The lowest slab with a free aligned block of `len` bytes: where a buddy allocator
    /// with merged buddies must put the slot.
    fn first_slab_with_room(&self, len: u32) -> Option<SlabId> {
        self.slabs
            .iter()
            .copied()
            .find(|&slab| (0..self.sizes[&slab] / len).any(|i| !self.overlaps(slab, i * len, len)))
    }

    fn idle(&self) -> Vec<SlabId> {
        let busy = |id: &SlabId| self.slots.iter().any(|t| t.slab == *id);
        self.slabs.iter().copied().filter(|id| !busy(id)).collect()
    }
}

fn check(s: &Slots, m: &Model) -> Result<(), TestCaseError> {
    let mut slots = m.slots.clone();
    slots.sort_by_key(|t| (t.slab, t.offset));
    for w in slots.windows(2) {
        prop_assert!(
            w[0].slab != w[1].slab || w[0].offset + w[0].len <= w[1].offset,
            "overlap: {:?}",
            w
        );
    }
    for t in &slots {
        prop_assert!(m.slabs.contains(&t.slab), "{:?} not in a live slab", t);
        prop_assert!(t.len.is_power_of_two() && (MIN..=SLAB).contains(&t.len));
        prop_assert_eq!(t.offset % t.len, 0);
        prop_assert!(t.offset + t.len <= m.sizes[&t.slab]);
    }
    let sum: u64 = slots.iter().map(|t| u64::from(t.len)).sum();
    prop_assert_eq!(s.allocated_bytes(), sum);
    prop_assert_eq!(s.is_idle(), slots.is_empty());
    prop_assert_eq!(s.live_slabs(), m.slabs.len());
    let bytes: u64 = m.slabs.iter().map(|id| u64::from(m.sizes[id])).sum();
    prop_assert_eq!(s.slab_bytes(), bytes);
    prop_assert_eq!(s.idle_slabs(), m.idle().len());
    Ok(())
}

fn step(s: &mut Slots, m: &mut Model, op: &Op) -> Result<(), TestCaseError> {
    match *op {
        Op::Alloc(len) => match s.alloc(len) {
            Ok(t) => {
                prop_assert_eq!(t.len, len.next_power_of_two().max(MIN));
                prop_assert_eq!(Some(t.slab), m.first_slab_with_room(t.len));
                prop_assert!(!m.overlaps(t.slab, t.offset, t.len), "{:?}", t);
                m.slots.push(t);
            }
            Err(SlotsError::TooBig) => prop_assert!(len > SLAB),
            Err(e @ (SlotsError::NeedSlab | SlotsError::Full)) => {
                prop_assert!(len <= SLAB);
                let size = len.next_power_of_two().max(MIN);
                prop_assert_eq!(m.first_slab_with_room(size), None);
                let full = m.slabs.len() == MAX_SLABS;
                prop_assert_eq!(
                    e,
                    if full {
                        SlotsError::Full
                    } else {
                        SlotsError::NeedSlab
                    }
                );
            }
            Err(e) => prop_assert!(false, "alloc({}): {:?}", len, e),
        },
        Op::Free(i) if !m.slots.is_empty() => {
            let t = m.slots.swap_remove(i % m.slots.len());
            prop_assert_eq!(s.free(t), Ok(()));
        }
        Op::Free(_) => {}
        Op::FreeBogus(i, offset, len) => {
            let base = m.slots.get(i % m.slots.len().max(1)).copied();
            let t = base.map_or(slot((i % 8) as u32, offset, len), |t| Slot {
                offset: t.offset.wrapping_add(offset),
                len,
                ..t
            });
            match m.slots.iter().position(|u| *u == t) {
                Some(at) => {
                    prop_assert_eq!(s.free(t), Ok(()));
                    m.slots.swap_remove(at);
                }
                None => prop_assert_eq!(s.free(t), Err(SlotsError::NotAllocated)),
            }
        }
        Op::AddSlab(size) => match s.add_slab_of(size) {
            Ok(id) => {
                prop_assert!(m.ids_seen.iter().all(|old| *old < id), "{:?} reused", id);
                m.slabs.push(id);
                m.sizes.insert(id, size);
                m.ids_seen.push(id);
            }
            Err(SlotsError::BadSizes) => {
                prop_assert!(!size.is_power_of_two() || !(MIN..=SLAB).contains(&size))
            }
            Err(e) => {
                prop_assert_eq!(e, SlotsError::Full);
                prop_assert_eq!(m.slabs.len(), MAX_SLABS);
            }
        },
        Op::ReleaseIdle(keep) => {
            let idle = m.idle();
            let mut released = Vec::new();
            while let Some(id) = s.release_idle(keep) {
                prop_assert!(released.len() < idle.len(), "released a busy slab");
                released.push(id);
            }
            // The highest-numbered idle slabs go, newest first; the lowest `keep` stay.
            let gone: Vec<SlabId> = idle
                .iter()
                .rev()
                .take(idle.len().saturating_sub(keep))
                .copied()
                .collect();
            prop_assert_eq!(&released, &gone);
            m.slabs.retain(|id| !gone.contains(id));
        }
    }
    check(s, m)
}

fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let mut s = Slots::new(MIN, SLAB, MAX_SLABS).unwrap();
    let mut m = Model::default();
    for op in ops {
        step(&mut s, &mut m, op)?;
    }
    // Everything freed: every live slab is one whole block again.
    for t in std::mem::take(&mut m.slots) {
        prop_assert_eq!(s.free(t), Ok(()));
    }
    prop_assert!(s.is_idle());
    // Each slab, lowest first, is one block of its size (the lower ones are taken whole).
    for id in &m.slabs {
        let size = m.sizes[id];
        let t = s
            .alloc(size)
            .map_err(|e| TestCaseError::fail(format!("slab {id:?} is not whole: {e:?}")))?;
        prop_assert_eq!(
            t,
            Slot {
                slab: *id,
                offset: 0,
                len: size
            }
        );
    }
    let more = s.alloc(SLAB);
    prop_assert!(more == Err(SlotsError::NeedSlab) || more == Err(SlotsError::Full));
    Ok(())
}

proptest! {
    #![proptest_config(PtConfig {
        cases: 256,
        rng_seed: RngSeed::Fixed(0x736c_6f74),
        failure_persistence: None,
        ..PtConfig::default()
    })]

    #[test]
    fn random_operations_agree_with_the_model(ops in proptest::collection::vec(op(), 1..200)) {
        run(&ops)?;
    }
}
