//! The free (cached) blocks of a pool and the search for a request (`BlockPool` and `get_free_block` in
//! `c10/cuda/CUDACachingAllocator.cpp`): [`FreeSet`] keeps one pool's blocks in `BlockComparatorSize`
//! order `(stream, size, address)`; caching a block (`BlockPool::insert_into_blocks`) and taking it out
//! are the only writes. Outside this file a pool's free set is read through [`CachingAllocator::free_set`]
//! only, so which set holds a block and which set serves a request are decided here alone.

use super::rules::set_index;
use super::{CachingAllocator, Pool, ADDRESS_RANGE, FREE, UNMAPPED};
use crate::reference::block_list::size_class;
use crate::reference::class_index::{key, key_offset, key_record, key_size, ClassIndex, Pos};

/// The cached blocks of one pool in `BlockComparatorSize` order (stream, size, address): per stream, a
/// [`ClassIndex`] of keys `(size, address, record)` (TLSF size classes of the block sizes in bytes, each an
/// exact-ordered set of sorted chunks, with a two-level bitmap over the non-empty classes). A search is one
/// lookup in the request's class and, when nothing there is large enough, the first entry of the next
/// non-empty class: the same best fit as one ordered set of all blocks, on sets that stay small (one narrow
/// size band each). Keys fit: blocks lie in the virtual range `[0, ADDRESS_RANGE)`, 2^48 bytes.
#[derive(Debug, Default)]
pub(super) struct FreeSet {
    streams: Vec<ClassIndex>,
}

/// The size class of a block of `size` bytes.
fn class_of(size: u64) -> (usize, usize) {
    size_class(size.max(1))
}

/// The search key of a request of `size` bytes: below every key of a block of `size` bytes or more (None
/// above [`ADDRESS_RANGE`], where no block is).
fn search_key(size: u64) -> Option<u128> {
    (size <= ADDRESS_RANGE).then(|| key(size.max(1), 0, 0))
}

/// `(size, offset, record)` of a key.
fn entry(k: u128) -> (u64, u64, u32) {
    (key_size(k), key_offset(k), key_record(k))
}

impl FreeSet {
    pub(super) fn insert(&mut self, stream: u32, size: u64, off: u64, n: u32) {
        let s = stream as usize;
        if self.streams.len() <= s {
            self.streams.resize_with(s + 1, ClassIndex::default);
        }
        self.streams[s].insert(class_of(size), key(size, off, n));
    }

    /// Removes block `n`, cached as `(size, off)` on `stream` (no change if it is not there).
    pub(super) fn remove(&mut self, stream: u32, size: u64, off: u64, n: u32) {
        if let Some(index) = self.streams.get_mut(stream as usize) {
            index.remove(class_of(size), key(size, off, n));
        }
    }

    /// Removes the entry at `at` of `stream`'s classes (a position [`FreeSet::first_at_least`] found, with
    /// no change to the set since).
    pub(super) fn remove_at(&mut self, stream: u32, at: Pos) {
        self.streams[stream as usize].remove_at(at);
    }

    /// The first of [`FreeSet::at_least`] (best fit) and its position, without building the iterator: one
    /// lookup in the request's class, else the first block of the next non-empty class.
    #[inline]
    pub(super) fn first_at_least(&self, stream: u32, size: u64) -> Option<((u64, u64, u32), Pos)> {
        let (k, at) = self.streams.get(stream as usize)?.first_at_least(class_of(size), search_key(size)?)?;
        Some((entry(k), at))
    }

    /// The free blocks of `stream` of at least `size` bytes as `(size, offset, record)`, in `(size, offset)` order.
    pub(super) fn at_least(&self, stream: u32, size: u64) -> impl Iterator<Item = (u64, u64, u32)> + '_ {
        let from = search_key(size);
        let index = self.streams.get(stream as usize).filter(|_| from.is_some());
        let (fl, sl) = class_of(size);
        let first = index.and_then(|index| index.class_at_or_above(fl, sl));
        let classes = std::iter::successors(first, move |&(fl, sl)| index?.class_at_or_above(fl, sl + 1));
        classes.flat_map(move |class| {
            index.into_iter().flat_map(move |index| index.class_from(class, from.unwrap_or(0)).map(entry))
        })
    }

    /// Every block as `(stream, size, offset, record)`, in order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u32, u64, u64, u32)> + '_ {
        self.streams.iter().enumerate().flat_map(move |(s, index)| {
            index.keys().map(move |k| {
                let (z, o, n) = entry(k);
                (s as u32, z, o, n)
            })
        })
    }

    /// The largest block's size (0 without blocks).
    pub(super) fn largest(&self) -> u64 {
        self.streams.iter().filter_map(ClassIndex::last).map(key_size).max().unwrap_or(0)
    }
}

impl CachingAllocator {
    /// The free set of `pool` of memory pool `mempool` (0: the default pool): every lookup of cached
    /// blocks goes through here. A memory pool with no cached block yet has an empty set.
    pub(super) fn free_set(&self, mempool: u16, pool: Pool) -> &FreeSet {
        static EMPTY: FreeSet = FreeSet { streams: Vec::new() };
        self.free_sets.get(set_index(mempool, pool)).unwrap_or(&EMPTY)
    }

    /// The free set block `n` belongs in (created on first use).
    fn free_set_of(&mut self, n: u32) -> &mut FreeSet {
        let b = &self.blocks[n as usize];
        let i = set_index(b.mempool, Pool::of_index(b.pool));
        if self.free_sets.len() <= i {
            self.free_sets.resize_with(i + 1, FreeSet::default);
        }
        &mut self.free_sets[i]
    }

    /// `BlockPool::insert_into_blocks`: caches block `n` as free (its age starts now).
    pub(super) fn cache(&mut self, n: u32) {
        let b = &mut self.blocks[n as usize];
        b.state = FREE;
        b.requested = 0;
        // Garbage collection counts the default pool's searches (it collects the default large pool).
        b.gc_base = self.gc_calls[b.pool as usize];
        let (stream, size, off) = (b.stream, b.size, b.off);
        self.free_set_of(n).insert(stream, size, off, n);
        self.cached_free += size;
        self.cached_free_count += 1;
    }

    /// Takes the free block `n` out of its free set (it stays a block for the caller to change).
    pub(super) fn uncache(&mut self, n: u32) {
        let b = self.blocks[n as usize];
        debug_assert_eq!(b.state, FREE);
        self.free_set_of(n).remove(b.stream, b.size, b.off, n);
        self.cached_free -= b.size;
        self.cached_free_count -= 1;
    }

    /// [`CachingAllocator::uncache`] of the free block `n` found at `at` in its free set.
    pub(super) fn uncache_at(&mut self, n: u32, at: Pos) {
        let b = self.blocks[n as usize];
        debug_assert_eq!(b.state, FREE);
        self.free_set_of(n).remove_at(b.stream, at);
        self.cached_free -= b.size;
        self.cached_free_count -= 1;
    }

    pub(super) fn largest_cached(&self) -> u64 {
        self.free_sets.iter().map(FreeSet::largest).max().unwrap_or(0)
    }

    /// `get_free_block`: the cached block to use for a rounded request of memory pool `mempool` (`get_pool`:
    /// the request's own pool only), still in the free set, with its position there when the search found
    /// it directly (not through the expandable-segment rule).
    pub(super) fn get_free_block(
        &mut self,
        mempool: u16,
        pool: Pool,
        stream: u32,
        size: u64,
    ) -> Option<(u32, Option<Pos>)> {
        if self.config.gc_active() && mempool == 0 {
            self.gc_calls[pool as usize] += 1;
        }
        let ((_, _, mut cur), at) = self.free_set(mempool, pool).first_at_least(stream, size)?;
        let mut at = Some(at);
        if self.config.expandable_segments && self.seg(self.blocks[cur as usize].seg).expandable {
            let it = self.free_set(mempool, pool).at_least(stream, size).skip(1);
            let room = |n: u32| {
                let b = &self.blocks[n as usize];
                let next = self.blocks.get(b.next as usize).filter(|x| x.state == UNMAPPED);
                b.size + next.map_or(0, |x| x.size)
            };
            for (_, _, next) in it {
                if room(next) >= room(cur) {
                    break;
                }
                cur = next;
                at = None;
                if !self.seg(self.blocks[cur as usize].seg).expandable {
                    break;
                }
            }
        }
        let cur_size = self.blocks[cur as usize].size;
        let max_split = self.config.max_split_size;
        if size < max_split && cur_size >= max_split {
            return None;
        }
        if size >= max_split && cur_size >= size.saturating_add(self.config.max_non_split_rounding) {
            return None;
        }
        Some((cur, at))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::reference::caching::CachingConfig;
    use crate::reference::SubAllocator;

    const MIB: u64 = 1 << 20;

    /// The free set against one ordered set of `(stream, size, offset)` (`BlockComparatorSize`): random
    /// insertions and removals (by key and at a found position) on two streams; after each step the best
    /// fit of one stream, and at the end every stream's `at_least` walk across its classes, the full order
    /// and the largest. (The chunked classes themselves are checked against a `BTreeSet` in
    /// `class_index.rs`.)
    #[test]
    fn free_set_keeps_block_comparator_order_per_stream() {
        let mut rng = crate::testing::SplitMix64::new(11);
        let mut fs = FreeSet::default();
        let mut reference = BTreeMap::new();
        for step in 0..5_000u32 {
            // Few sizes (so classes hold many blocks), two streams.
            let (stream, size) = ((rng.next_u64() % 2) as u32, 512 * (1 + rng.next_u64() % 40));
            if !rng.next_u64().is_multiple_of(3) || reference.is_empty() {
                let off = 512 * (rng.next_u64() % 1_000_000);
                if reference.insert((stream, size, off), step).is_none() {
                    fs.insert(stream, size, off, step);
                }
            } else {
                let (&(st, z, o), &n) =
                    reference.range((stream, size, 0)..).next().unwrap_or(reference.first_key_value().unwrap());
                reference.remove(&(st, z, o));
                if step % 2 == 0 {
                    fs.remove(st, z, o, n);
                } else {
                    let (found, at) = fs.first_at_least(st, z).unwrap();
                    assert_eq!(found, (z, o, n));
                    fs.remove_at(st, at);
                }
            }
            let want =
                reference.range((stream, size, 0)..).next().filter(|x| x.0 .0 == stream).map(|(x, &n)| (x.1, x.2, n));
            assert_eq!(fs.first_at_least(stream, size).map(|(e, _)| e), want, "step {step}");
        }
        for stream in 0..3 {
            let got: Vec<_> = fs.at_least(stream, 4096).collect();
            let want: Vec<_> =
                reference.range((stream, 4096, 0)..(stream + 1, 0, 0)).map(|(x, &n)| (x.1, x.2, n)).collect();
            assert_eq!(got, want, "stream {stream}");
        }
        let got: Vec<_> = fs.iter().collect();
        assert_eq!(got, reference.iter().map(|(x, &n)| (x.0, x.1, x.2, n)).collect::<Vec<_>>());
        let largest = reference.keys().map(|x| x.1).max().unwrap_or(0);
        assert_eq!(fs.largest(), largest);
        assert_eq!(fs.first_at_least(0, ADDRESS_RANGE + 1), None);
    }

    #[test]
    fn max_non_split_rounding_lets_an_oversize_block_serve_a_large_request() {
        // `get_free_block`: a request at or above max_split_size takes a cached block only if it is less than
        // `max_non_split_rounding` larger.
        let run = |conf: &str| {
            let (cfg, _) = CachingConfig::from_env(conf, 4 << 30).unwrap();
            let mut c = CachingAllocator::new(cfg).unwrap();
            let a = c.alloc(300 * MIB, 1).unwrap();
            c.free_at(a.offset).unwrap();
            let b = c.alloc(250 * MIB, 1).unwrap();
            (b.size, c.reserved_bytes())
        };
        assert_eq!(run("max_split_size_mb:100,max_non_split_rounding_mb:64"), (300 * MIB, 300 * MIB));
        assert_eq!(run("max_split_size_mb:100"), (250 * MIB, 550 * MIB), "300 >= 250 + 20: a new segment");
    }

    #[test]
    fn blocks_are_reused_only_by_their_stream() {
        // `BlockComparatorSize` orders by stream first; `get_free_block` stops at another stream's block.
        let mut c = CachingAllocator::new(CachingConfig::new(1 << 30)).unwrap();
        let a = c.alloc_on(4 * MIB, 1).unwrap();
        c.free_at(a.offset).unwrap();
        let b = c.alloc_on(4 * MIB, 2).unwrap();
        assert_ne!(b.offset, a.offset);
        assert_eq!(c.reserved_bytes(), 40 * MIB, "stream 2 gets its own 20 MiB segment");
        let a2 = c.alloc_on(4 * MIB, 1).unwrap();
        assert_eq!((a2.offset, c.reserved_bytes()), (a.offset, 40 * MIB), "stream 1 reuses its block");
        let segs = c.segments();
        assert_eq!(segs.iter().map(|s| s.stream).collect::<Vec<_>>(), vec![1, 2]);
    }
}
