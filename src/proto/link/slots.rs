//! Where each stream's memory lies in a link's registered slabs: a buddy allocator over
//! offsets, with no memory of its own to hand out.
//!
//! A link registers memory in slabs (of `slab` bytes, or a smaller power of two: a link's
//! first slab is small, so that a link with one connection pins little) and gives every
//! stream a slot of a slab for its receive ring and another for its send buffer.
//! [`Slots`] only decides which slab and offset a slot gets; the driver registers a slab
//! when told [`SlotsError::NeedSlab`] and deregisters the ones [`Slots::release_idle`]
//! gives back.
//!
//! Why a buddy allocator: every slot is a power of two from `min` to `slab` bytes, aligned
//! to its size, and a freed slot merges with its free buddy. Rings start at 16 KiB and grow
//! towards 256 KiB and beyond, so sizes mix; merging means a slab whose slots are all freed
//! is one whole block again, never fragmented for good. Alignment makes checking a slot
//! handed back a matter of one bit: is a block of that size allocated at that offset.
//!
//! Rejected: a free list per size class, which is simpler but a slab that once held one
//! 4 KiB slot could never serve a 256 KiB one; and a general first-fit allocator over byte
//! ranges, which fragments and costs a walk over all free ranges per call.
//!
//! Placement is deterministic: the lowest-numbered slab with room, and in it the smallest
//! free block that fits (so big blocks stay whole), lowest offset first. Packing streams into
//! the oldest slabs lets the newest ones drain so they can be released.
//!
//! Cost: in each slab it tries, a call touches each block size (`log2(slab / min) + 1` of
//! them) at most once, and finding a free block scans that size's bitmap a word (64 blocks)
//! at a time. Slots are taken when a stream opens or its ring grows, not per byte sent. The
//! bookkeeping is four bits per `min` bytes of slab (128 KiB for 1 GiB in 4 KiB blocks),
//! allocated when the slab is added.

use core::fmt;

/// Names a slab. Never reused within one [`Slots`], so a slot of a released slab can never
/// be mistaken for a slot of a newer one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SlabId(pub u32);

/// A block of a slab: `len` bytes from `offset`. `len` is a power of two and `offset` a
/// multiple of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Slot {
    /// The slab it lies in.
    pub slab: SlabId,
    /// Its first byte's offset in the slab.
    pub offset: u32,
    /// Its size in bytes.
    pub len: u32,
}

/// Why a call to [`Slots`] did nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SlotsError {
    /// `min` or `slab` is not a power of two with `4096 <= min <= slab <= 1 << 30`, or
    /// `max_slabs` is 0, or a slab added is not a power of two from `min` to `slab`.
    BadSizes,
    /// A slot of 0 bytes was asked for.
    ZeroLen,
    /// A slot larger than the largest slab was asked for.
    TooBig,
    /// No live slab has room; register a slab, call [`Slots::add_slab`] and ask again.
    NeedSlab,
    /// No live slab has room and no slab may be added: `max_slabs` are live (or, after
    /// about four billion slabs, every [`SlabId`] has been used).
    Full,
    /// The slot handed back is not allocated exactly as given: a double free, a wrong
    /// offset or length, or a slab that is released or never was.
    NotAllocated,
}

impl fmt::Display for SlotsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SlotsError::BadSizes => "slot or slab size out of range",
            SlotsError::ZeroLen => "slot of 0 bytes",
            SlotsError::TooBig => "slot larger than a slab",
            SlotsError::NeedSlab => "no slab has room",
            SlotsError::Full => "no slab has room and no slab may be added",
            SlotsError::NotAllocated => "slot not allocated",
        })
    }
}

impl std::error::Error for SlotsError {}

/// The smallest slot: a page.
const MIN_SLOT: u32 = 4096;
/// The largest slab: 1 GiB keeps every offset and length in a `u32`.
const MAX_SLAB: u32 = 1 << 30;

/// The slots of a link's slabs: which are free, which are handed out.
#[derive(Debug)]
pub struct Slots {
    /// log2 of the smallest slot; a block of order `k` is `1 << (min_shift + k)` bytes.
    min_shift: u32,
    slab_size: u32,
    max_slabs: usize,
    /// The live slabs, in id order (ids only grow, so pushing keeps the order).
    slabs: Vec<Slab>,
    next_id: u32,
    /// Bytes handed out, over all slabs.
    allocated: u64,
}

impl Slots {
    /// An allocator of slots from `min` to `slab` bytes in at most `max_slabs` slabs of at
    /// most `slab` bytes each, with no slab yet.
    pub fn new(min: u32, slab: u32, max_slabs: usize) -> Result<Slots, SlotsError> {
        let pow2 = |v: u32| v.is_power_of_two();
        if !(pow2(min) && pow2(slab) && MIN_SLOT <= min && min <= slab && slab <= MAX_SLAB)
            || max_slabs == 0
        {
            return Err(SlotsError::BadSizes);
        }
        Ok(Slots {
            min_shift: min.trailing_zeros(),
            slab_size: slab,
            max_slabs,
            slabs: Vec::new(),
            next_id: 0,
            allocated: 0,
        })
    }

    /// Hands out a free block of `len` rounded up to a power of two of at least `min`
    /// bytes: in the lowest-numbered live slab with room, the smallest free block that
    /// fits, lowest offset first.
    pub fn alloc(&mut self, len: u32) -> Result<Slot, SlotsError> {
        if len == 0 {
            return Err(SlotsError::ZeroLen);
        }
        if len > self.slab_size {
            return Err(SlotsError::TooBig);
        }
        // Cannot overflow: len <= slab <= 1 << 30.
        let size = len.next_power_of_two().max(1 << self.min_shift);
        let order = size.trailing_zeros() - self.min_shift;
        for slab in &mut self.slabs {
            // Also skips a slab smaller than the slot.
            if slab.size - slab.used_bytes < size {
                continue;
            }
            if let Some(block) = slab.take(order) {
                slab.used_bytes += size;
                self.allocated += u64::from(size);
                return Ok(Slot {
                    slab: slab.id,
                    offset: block << size.trailing_zeros(),
                    len: size,
                });
            }
        }
        Err(if self.slabs.len() < self.max_slabs {
            SlotsError::NeedSlab
        } else {
            SlotsError::Full
        })
    }

    /// Takes a newly registered slab of the largest size into use, all of it free, and
    /// names it. `Full` if `max_slabs` are live already.
    pub fn add_slab(&mut self) -> Result<SlabId, SlotsError> {
        self.add_slab_of(self.slab_size)
    }

    /// As [`add_slab`](Self::add_slab), for a slab of `size` bytes: a power of two from
    /// `min` to the largest slab (`BadSizes` otherwise).
    pub fn add_slab_of(&mut self, size: u32) -> Result<SlabId, SlotsError> {
        if !size.is_power_of_two()
            || size.trailing_zeros() < self.min_shift
            || size > self.slab_size
        {
            return Err(SlotsError::BadSizes);
        }
        if self.slabs.len() >= self.max_slabs {
            return Err(SlotsError::Full);
        }
        let id = SlabId(self.next_id);
        self.next_id = self.next_id.checked_add(1).ok_or(SlotsError::Full)?;
        let orders = size.trailing_zeros() - self.min_shift + 1;
        self.slabs.push(Slab::new(id, size, orders));
        Ok(id)
    }

    /// Takes a slot back, merging it with its free buddies. `NotAllocated` (and nothing
    /// changed) unless `slot` is allocated exactly as given.
    pub fn free(&mut self, slot: Slot) -> Result<(), SlotsError> {
        let Slot { slab, offset, len } = slot;
        let Ok(at) = self.slabs.binary_search_by_key(&slab, |s| s.id) else {
            return Err(SlotsError::NotAllocated);
        };
        let size = self.slabs[at].size;
        let fits = len.is_power_of_two()
            && len.trailing_zeros() >= self.min_shift
            && len <= size
            && offset % len == 0
            && offset < size;
        if !fits {
            return Err(SlotsError::NotAllocated);
        }
        let order = len.trailing_zeros() - self.min_shift;
        let slab = &mut self.slabs[at];
        if !slab.give_back(order, offset >> len.trailing_zeros()) {
            return Err(SlotsError::NotAllocated);
        }
        slab.used_bytes -= len;
        self.allocated -= u64::from(len);
        Ok(())
    }

    /// Releases one slab with nothing allocated, if more than `keep` such slabs are live,
    /// and returns its id so the caller deregisters its memory; `None` otherwise. Call it
    /// until `None` to release all but `keep`. The highest-numbered idle slab goes first:
    /// allocation prefers low numbers, so the kept ones are those it fills first.
    pub fn release_idle(&mut self, keep: usize) -> Option<SlabId> {
        if self.idle_slabs() <= keep {
            return None;
        }
        let at = self.slabs.iter().rposition(|s| s.used_bytes == 0)?;
        Some(self.slabs.remove(at).id)
    }

    /// Live slabs: added and not released.
    pub fn live_slabs(&self) -> usize {
        self.slabs.len()
    }

    /// Live slabs with nothing allocated.
    pub fn idle_slabs(&self) -> usize {
        self.slabs.iter().filter(|s| s.used_bytes == 0).count()
    }

    /// Bytes handed out and not yet freed, over all slabs (slot lengths, after rounding).
    pub fn allocated_bytes(&self) -> u64 {
        self.allocated
    }

    /// The largest slab's size in bytes.
    pub fn slab_size(&self) -> u32 {
        self.slab_size
    }

    /// Bytes of all live slabs.
    pub fn slab_bytes(&self) -> u64 {
        self.slabs.iter().map(|s| u64::from(s.size)).sum()
    }

    /// Nothing is allocated (there may still be live slabs).
    pub fn is_idle(&self) -> bool {
        self.allocated == 0
    }
}

/// One slab's blocks. Block `b` of order `k` is the `b`-th block of `min << k` bytes.
#[derive(Debug)]
struct Slab {
    id: SlabId,
    /// Its size in bytes.
    size: u32,
    /// Per order, the blocks that are free as a whole (neither split nor merged into a
    /// bigger free block).
    free: Vec<Bitmap>,
    /// Per order, the blocks handed out.
    used: Vec<Bitmap>,
    used_bytes: u32,
}

impl Slab {
    /// A slab of `size` bytes in `orders` block sizes, all of it one free block of the top
    /// order.
    fn new(id: SlabId, size: u32, orders: u32) -> Slab {
        let top = orders - 1;
        let maps = || (0..orders).map(|k| Bitmap::new(1 << (top - k))).collect();
        let mut slab = Slab {
            id,
            size,
            free: maps(),
            used: maps(),
            used_bytes: 0,
        };
        slab.free[top as usize].set(0);
        slab
    }

    /// Hands out a block of `order`: the lowest free one of the smallest order that has
    /// one, split down to `order` keeping the low half each time.
    fn take(&mut self, order: u32) -> Option<u32> {
        let (found, mut block) =
            (order as usize..self.free.len()).find_map(|k| self.free[k].first().map(|b| (k, b)))?;
        self.free[found].clear(block);
        for k in (order as usize..found).rev() {
            block *= 2;
            self.free[k].set(block + 1);
        }
        self.used[order as usize].set(block);
        Some(block)
    }

    /// Takes back block `block` of `order` if it is handed out, merging it with its buddy
    /// while the buddy is free. False (and nothing changed) if it was not handed out.
    fn give_back(&mut self, order: u32, block: u32) -> bool {
        let mut k = order as usize;
        if !self.used[k].get(block) {
            return false;
        }
        self.used[k].clear(block);
        let mut block = block;
        while k + 1 < self.free.len() && self.free[k].get(block ^ 1) {
            self.free[k].clear(block ^ 1);
            block /= 2;
            k += 1;
        }
        self.free[k].set(block);
        true
    }
}

/// One bit per block of one order.
#[derive(Debug)]
struct Bitmap(Vec<u64>);

impl Bitmap {
    fn new(bits: u32) -> Bitmap {
        Bitmap(vec![0; bits.div_ceil(64) as usize])
    }

    /// Bit `i`; false past the end, so an out-of-range block reads as neither free nor used.
    fn get(&self, i: u32) -> bool {
        self.0
            .get(i as usize / 64)
            .is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    fn set(&mut self, i: u32) {
        self.0[i as usize / 64] |= 1 << (i % 64);
    }

    fn clear(&mut self, i: u32) {
        self.0[i as usize / 64] &= !(1 << (i % 64));
    }

    /// The lowest set bit.
    fn first(&self) -> Option<u32> {
        let (w, word) = self.0.iter().enumerate().find(|(_, w)| **w != 0)?;
        Some(w as u32 * 64 + word.trailing_zeros())
    }
}
