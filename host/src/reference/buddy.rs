//! Binary buddy system over any capacity, with a minimum block size.
//!
//! A capacity that is not a power of two is tiled by its binary decomposition into *top blocks*, largest
//! first: 12 MiB becomes `[0, 8 MiB)` and `[8 MiB, 12 MiB)`. Every block of order `k` (size `2^k` bytes) is
//! aligned to `2^k`, so the buddy of `(off, k)` is `off ^ 2^k`, and merging stops at the order of the top
//! block that contains `off`: `63 - lzcnt(capacity ^ off)`. A tail of the capacity below the minimum block
//! is never handed out (reported as `stranded`).
//!
//! # Invariants
//! - Every block (free or live) is `2^k` bytes, `min_block <= 2^k <= its top block`, aligned to `2^k`.
//! - Free and live blocks tile the usable range; a free block's buddy is never entirely free (merging is
//!   complete up to the top order).
//! - `live` holds one record (order and requested size, packed in one `u64`) per live block, named by the
//!   block's [`Handle`](super::Handle): `free` reads that one record, with no offset lookup. `free_set` maps
//!   each free block's offset to its order and list index (an open-addressing table that stays small and
//!   cache-resident, so the merge checks rarely miss; 16-byte slots, four to a cache line); `free_lists[k]`
//!   holds exactly the free blocks of order `k` (a free block records its index there); bit `k` of
//!   `nonempty` mirrors `free_lists[k]`.
//!
//! # Time complexity
//! - `alloc`: O(log(capacity / min_block)) for the splits; finding the order is one `trailing_zeros`.
//! - `free`: O(1) to find the block from its handle, then O(log(capacity / min_block)) merges, each O(1)
//!   expected (lookup in the free blocks' open-addressing `OffsetTable`, swap-remove).
//! - `stats`: O(1); `free_blocks`: O(n log n) (sorts).
//!
//! Within an order, blocks are reused LIFO (the most recently freed first).
//!
//! Measured (`strategies_icount` under callgrind, 200k pairs, 1 MiB LL): packing the entry from 16 to 8
//! bytes (24- to 16-byte slots; the 100k-entry live table 6 -> 4 MiB) cut the misses per pair from 7.63 to
//! 6.05 in D1 and 3.17 to 2.56 in LL, at 582 -> 605 instructions. Replacing that live table (keyed by
//! offset) by handle-named records removed its insert and lookup; the figures are in `bench/results/`.

use super::compact::{relocate_live, CompactBlock, CompactionLayout, CompactionPlan, Region};
use super::live_slots::LiveSlots;
use super::offset_table::OffsetTable;
use super::{check_request, oom, AllocError, AllocatedBlock, Allocation, Stats, SubAllocator, MAX_BYTES};

/// Default minimum block in bytes.
#[doc(hidden)]
pub const DEFAULT_MIN_BLOCK: u64 = 256;

/// A block's table entry packed in one `u64` (so a table slot is 16 bytes, four to a cache line): order
/// (bits 0–5), live flag (bit 6) and, from bit 7, the index in `free_lists[order]` when free or the
/// requested bytes (at most 2^48) when live.
#[derive(Clone, Copy, Debug)]
struct Entry(u64);

impl Entry {
    #[inline]
    fn new(order: u32, used: bool, val: u64) -> Self {
        debug_assert!(order < 64 && val < 1 << 57);
        Entry(order as u64 | (used as u64) << 6 | val << 7)
    }
    #[inline]
    fn order(self) -> u32 {
        (self.0 & 63) as u32
    }
    #[inline]
    fn used(self) -> bool {
        self.0 & 64 != 0
    }
    #[inline]
    fn val(self) -> u64 {
        self.0 >> 7
    }
}

/// Buddy-system sub-allocator. See the module docs for invariants and complexity.
#[derive(Debug)]
pub struct Buddy {
    capacity: u64,
    usable: u64,
    min_log2: u32,
    free_lists: Vec<Vec<u64>>,
    nonempty: u64,
    /// Free blocks by offset (few: they stay cache-resident).
    free_set: OffsetTable<Entry>,
    /// Live blocks by handle.
    live: LiveSlots<Entry>,
    allocated: u64,
    reserved_in_use: u64,
    free_bytes: u64,
    free_count: usize,
}

impl Buddy {
    /// Buddy system over `capacity` bytes with a [256-byte](DEFAULT_MIN_BLOCK) minimum block.
    ///
    /// # Errors
    /// [`AllocError::InvalidConfig`] if `capacity` is below the minimum block or above 2^48.
    pub fn new(capacity: u64) -> Result<Self, AllocError> {
        Self::with_min_block(capacity, DEFAULT_MIN_BLOCK)
    }

    /// Buddy system whose smallest block is `min_block` bytes (a power of two).
    ///
    /// # Errors
    /// [`AllocError::InvalidConfig`] for a bad `min_block` or capacity.
    #[doc(hidden)]
    pub fn with_min_block(capacity: u64, min_block: u64) -> Result<Self, AllocError> {
        if min_block == 0 || !min_block.is_power_of_two() || min_block > MAX_BYTES {
            return Err(AllocError::InvalidConfig("minimum block must be a power of two in [1, 2^48]"));
        }
        if capacity > MAX_BYTES || capacity < min_block {
            return Err(AllocError::InvalidConfig("capacity must lie in [min_block, 2^48]"));
        }
        let mut b = Buddy {
            capacity,
            usable: capacity & !(min_block - 1),
            min_log2: min_block.trailing_zeros(),
            free_lists: vec![Vec::new(); 64],
            nonempty: 0,
            free_set: OffsetTable::new(Entry(0)),
            live: LiveSlots::default(),
            allocated: 0,
            reserved_in_use: 0,
            free_bytes: 0,
            free_count: 0,
        };
        b.reset();
        Ok(b)
    }

    /// Minimum block in bytes.
    #[doc(hidden)]
    pub fn min_block(&self) -> u64 {
        1 << self.min_log2
    }

    /// Order of the top block containing `off` (< usable).
    #[inline]
    fn top_order(&self, off: u64) -> u32 {
        63 - (self.usable ^ off).leading_zeros()
    }

    #[inline]
    fn push_free(&mut self, off: u64, order: u32) {
        let list = &mut self.free_lists[order as usize];
        self.free_set.insert(off, Entry::new(order, false, list.len() as u64));
        list.push(off);
        self.nonempty |= 1 << order;
        self.free_bytes += 1 << order;
        self.free_count += 1;
    }

    /// Removes free block `off` (recorded at `idx` of `free_lists[order]`).
    #[inline]
    fn take_free(&mut self, off: u64, order: u32, idx: usize) {
        let list = &mut self.free_lists[order as usize];
        list.swap_remove(idx);
        if let Some(&moved) = list.get(idx) {
            if let Some(e) = self.free_set.get_mut(moved) {
                *e = Entry::new(e.order(), false, idx as u64);
            }
        }
        if list.is_empty() {
            self.nonempty &= !(1 << order);
        }
        self.free_set.remove(off);
        self.free_bytes -= 1 << order;
        self.free_count -= 1;
    }

    /// Adds the free range `[a, b)` as maximal aligned blocks.
    fn add_free_range(&mut self, mut a: u64, b: u64) {
        while a < b {
            let mut k = if a == 0 { 63 } else { a.trailing_zeros() };
            k = k.min(63 - (b - a).leading_zeros()).min(self.top_order(a));
            self.push_free(a, k);
            a += 1 << k;
        }
    }

    /// Error path, O(log capacity) (plus O(live) for a free by handle): a double free if `offset` lies in a
    /// free block, a stale handle if (for a free by handle) a live block starts there, else an invalid free.
    fn classify_bad_free(&self, offset: u64, by_handle: bool) -> AllocError {
        if offset < self.usable {
            for k in self.min_log2..64 {
                let s = offset & !((1u64 << k) - 1);
                if self.free_set.get(s).is_some_and(|e| s + (1u64 << e.order()) > offset) {
                    return AllocError::DoubleFree { offset };
                }
                if s == 0 {
                    break;
                }
            }
        }
        if by_handle && self.live.contains_offset(offset) {
            AllocError::StaleHandle { offset }
        } else {
            AllocError::InvalidFree { offset }
        }
    }

    /// Frees the live block `offset` whose record was just taken, merging with free buddies.
    #[inline]
    fn release(&mut self, offset: u64, entry: Entry) {
        let mut order = entry.order();
        self.allocated -= entry.val();
        self.reserved_in_use -= 1 << order;
        let mut off = offset;
        let top = self.top_order(off);
        while order < top {
            let buddy = off ^ (1 << order);
            match self.free_set.get(buddy) {
                Some(e) if !e.used() && e.order() == order => {
                    let idx = e.val() as usize;
                    self.take_free(buddy, order, idx);
                    off = off.min(buddy);
                    order += 1;
                }
                _ => break,
            }
        }
        self.push_free(off, order);
    }

    /// Checks that `live` (ascending) is a set of disjoint buddy blocks and rebuilds the free structures
    /// around it; the live records are not touched.
    fn rebuild_free(&mut self, live: &[AllocatedBlock]) -> Result<(), AllocError> {
        let mut cursor = 0u64;
        for b in live {
            let ok = b.size.is_power_of_two()
                && b.size >= self.min_block()
                && b.offset % b.size == 0
                && b.offset >= cursor
                && b.offset.checked_add(b.size).is_some_and(|e| e <= self.usable)
                && b.size.trailing_zeros() <= self.top_order(b.offset)
                && b.requested <= b.size;
            if !ok {
                return Err(AllocError::InvalidRelocation("layout is not a set of disjoint buddy blocks"));
            }
            cursor = b.offset + b.size;
        }
        self.free_lists.iter_mut().for_each(Vec::clear);
        self.free_set.clear();
        (self.nonempty, self.free_bytes, self.free_count) = (0, 0, 0);
        let mut cursor = 0;
        for b in live {
            self.add_free_range(cursor, b.offset);
            cursor = b.offset + b.size;
        }
        self.add_free_range(cursor, self.usable);
        Ok(())
    }
}

impl SubAllocator for Buddy {
    fn name(&self) -> &'static str {
        "buddy"
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn alloc(&mut self, size: u64, align: u64) -> Result<Allocation, AllocError> {
        let rounded = check_request(size, align, 1)?;
        let need = rounded.max(align).max(self.min_block()).next_power_of_two();
        let order = need.trailing_zeros();
        let avail = if order < 64 { self.nonempty & (u64::MAX << order) } else { 0 };
        if avail == 0 {
            let largest = if self.nonempty == 0 { 0 } else { 1u64 << (63 - self.nonempty.leading_zeros()) };
            return Err(oom(size, self.free_bytes, largest));
        }
        let mut j = avail.trailing_zeros();
        let off = *self.free_lists[j as usize].last().expect("nonempty bit mirrors the list");
        let idx = self.free_lists[j as usize].len() - 1;
        self.take_free(off, j, idx);
        while j > order {
            j -= 1;
            self.push_free(off + (1 << j), j);
        }
        let handle = self.live.insert(off, Entry::new(order, true, size));
        self.allocated += size;
        self.reserved_in_use += need;
        Ok(Allocation { offset: off, size: need, handle })
    }

    #[inline]
    fn free(&mut self, a: Allocation) -> Result<(), AllocError> {
        match self.live.take(a.handle, a.offset) {
            Some(entry) => {
                self.release(a.offset, entry);
                Ok(())
            }
            None => Err(self.classify_bad_free(a.offset, true)),
        }
    }

    fn free_at(&mut self, offset: u64) -> Result<(), AllocError> {
        let entry = self.live.handle_at(offset).and_then(|h| self.live.take(h, offset));
        match entry {
            Some(entry) => {
                self.release(offset, entry);
                Ok(())
            }
            None => Err(self.classify_bad_free(offset, false)),
        }
    }

    fn stats(&self) -> Stats {
        Stats {
            capacity: self.capacity,
            allocated: self.allocated,
            reserved_in_use: self.reserved_in_use,
            reserved: self.reserved_in_use,
            free: self.free_bytes,
            largest_free: if self.nonempty == 0 { 0 } else { 1 << (63 - self.nonempty.leading_zeros()) },
            stranded: self.capacity - self.usable,
            free_blocks: self.free_count,
            live_blocks: self.live.len(),
        }
    }

    fn free_blocks(&self) -> Box<dyn Iterator<Item = (u64, u64)> + '_> {
        let mut v: Vec<(u64, u64)> = self.free_set.iter().map(|(o, e)| (o, 1u64 << e.order())).collect();
        v.sort_unstable();
        Box::new(v.into_iter())
    }

    fn live_blocks(&self) -> Vec<AllocatedBlock> {
        let mut v: Vec<AllocatedBlock> = self
            .live
            .iter()
            .map(|(offset, e, _)| AllocatedBlock { offset, size: 1 << e.order(), requested: e.val() })
            .collect();
        v.sort_unstable();
        v
    }

    fn reset(&mut self) {
        self.free_lists.iter_mut().for_each(Vec::clear);
        self.live.clear();
        self.free_set.clear();
        self.nonempty = 0;
        (self.allocated, self.reserved_in_use, self.free_bytes, self.free_count) = (0, 0, 0, 0);
        self.add_free_range(0, self.usable);
    }

    fn compaction_layout(&self) -> CompactionLayout {
        let blocks = self
            .live_blocks()
            .into_iter()
            .map(|b| CompactBlock { id: b.offset, offset: b.offset, len: b.size, align: b.size, pinned: false })
            .collect();
        CompactionLayout { blocks, regions: vec![Region::new(0, self.usable)] }
    }

    /// Live blocks keep their handles (their records move with them).
    fn apply_relocation(&mut self, plan: &CompactionPlan) -> Result<(), AllocError> {
        let live = self.live_blocks();
        let moved: Vec<AllocatedBlock> =
            relocate_live(&live, &self.compaction_layout(), plan)?.into_iter().map(|x| x.1).collect();
        self.rebuild_free(&moved)?;
        self.live.relocate(|o, _| plan.translate(o).expect("checked by relocate_live"));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_power_of_two_capacity_uses_top_blocks() {
        let mut b = Buddy::with_min_block(12 * 1024 + 100, 1024).unwrap();
        assert_eq!(b.free_blocks().collect::<Vec<_>>(), vec![(0, 8192), (8192, 4096)]);
        assert_eq!(b.stats().stranded, 100);
        let x = b.alloc(4096, 1).unwrap();
        assert_eq!(x.offset, 8192, "the exact-order top block is used before splitting the larger one");
        let y = b.alloc(8192, 1).unwrap();
        assert_eq!(y.offset, 0);
        assert!(matches!(b.alloc(1, 1), Err(AllocError::OutOfMemory { free: 0, .. })));
        b.free(x).unwrap();
        b.free(y).unwrap();
        assert_eq!(b.free_blocks().collect::<Vec<_>>(), vec![(0, 8192), (8192, 4096)]);
    }

    #[test]
    fn merges_up_to_the_top_and_detects_double_free() {
        let mut b = Buddy::with_min_block(1 << 20, 64).unwrap();
        let v: Vec<Allocation> = (0..16).map(|_| b.alloc(100, 1).unwrap()).collect();
        assert!(v.iter().all(|a| a.offset % 128 == 0));
        for (i, a) in v.iter().enumerate().rev() {
            if i % 2 == 0 {
                b.free(*a).unwrap();
            } else {
                b.free_at(a.offset).unwrap();
            }
        }
        assert_eq!(b.free_blocks().collect::<Vec<_>>(), vec![(0, 1 << 20)]);
        assert_eq!(b.free(v[3]), Err(AllocError::DoubleFree { offset: v[3].offset }));
        assert_eq!(b.free_at(v[3].offset), Err(AllocError::DoubleFree { offset: v[3].offset }));
        let a = b.alloc(64, 4096).unwrap();
        assert_eq!((a.offset % 4096, a.size), (0, 4096));
        assert_eq!(b.free_at(a.offset + 64), Err(AllocError::InvalidFree { offset: a.offset + 64 }));
        assert_eq!(b.free_at(1 << 40), Err(AllocError::InvalidFree { offset: 1 << 40 }));
        let stale = Allocation { handle: crate::reference::Handle::NONE, ..a };
        assert_eq!(b.free(stale), Err(AllocError::StaleHandle { offset: a.offset }));
        b.free(a).unwrap();
    }
}
