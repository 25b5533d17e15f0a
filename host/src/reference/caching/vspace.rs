//! Segments and the virtual address space: the segment records by id, the segments by start address
//! ([`SegIndex`], for the lookups by offset), the unused virtual ranges (`va_holes`) a new segment or
//! expandable reservation is placed in, and the device model (a new segment needs free device pages,
//! `alloc_block` in `c10/cuda/CUDACachingAllocator.cpp`, not a free address range). The seeding
//! primitives for segments that existed before a trace began ([`CachingAllocator::seed_segment_on`]) and
//! the snapshot listing ([`CachingAllocator::segments`]) are here too.

use std::collections::VecDeque;

use super::{CachingAllocator, Pool, LIVE, MIN_BLOCK};
use crate::reference::{oom, AllocError};

/// Every segment's start address (bytes) with its segment id, sorted by start: a flat ring buffer.
/// A lookup is one binary search; an insertion or removal moves the shorter side, so seeding segments in
/// address order appends, and a replay's segments, created and released mostly at the low end, move few
/// entries. Replaces a `BTreeMap<u64, u32>` (same answers).
#[derive(Debug, Default)]
pub(super) struct SegIndex {
    /// `(start, segment id)`, ascending by start, starts distinct.
    entries: VecDeque<(u64, u32)>,
}

impl SegIndex {
    /// Records segment `id` at `start` (replacing the id of a segment already recorded there).
    pub(super) fn insert(&mut self, start: u64, id: u32) {
        // Seeding in address order appends.
        if self.entries.back().is_none_or(|e| e.0 < start) {
            self.entries.push_back((start, id));
            return;
        }
        let i = self.entries.partition_point(|e| e.0 < start);
        match self.entries.get_mut(i) {
            Some(e) if e.0 == start => e.1 = id,
            _ => self.entries.insert(i, (start, id)),
        }
    }

    /// Forgets the segment at `start`, if any.
    pub(super) fn remove(&mut self, start: u64) {
        let i = self.entries.partition_point(|e| e.0 < start);
        if self.entries.get(i).is_some_and(|e| e.0 == start) {
            self.entries.remove(i);
        }
    }

    /// The id of the segment that starts at `start`.
    pub(super) fn get(&self, start: u64) -> Option<u32> {
        let i = self.entries.partition_point(|e| e.0 < start);
        self.entries.get(i).filter(|e| e.0 == start).map(|e| e.1)
    }

    /// The segment with the highest start at or below `offset`, as `(start, id)`.
    pub(super) fn at_or_before(&self, offset: u64) -> Option<(u64, u32)> {
        let i = self.entries.partition_point(|e| e.0 <= offset);
        i.checked_sub(1).map(|k| self.entries[k])
    }

    /// The segments whose start lies in `[from, to)`, ascending, as `(start, id)`.
    pub(super) fn starting_in(&self, from: u64, to: u64) -> impl Iterator<Item = (u64, u32)> + '_ {
        let i = self.entries.partition_point(|e| e.0 < from);
        self.entries.range(i..).copied().take_while(move |e| e.0 < to)
    }

    /// Every segment, ascending by start, as `(start, id)`.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.entries.iter().copied()
    }
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Segment {
    pub(super) start: u64,
    pub(super) size: u64,
    pub(super) pool: Pool,
    /// Memory pool (0: the default pool).
    pub(super) mempool: u16,
    pub(super) stream: u32,
    pub(super) expandable: bool,
}

/// A segment as reported by [`CachingAllocator::segments`]: a `cudaMalloc`ed segment, or one contiguous
/// mapped range of an expandable segment (as PyTorch's snapshot lists them). Bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentInfo {
    /// Start offset.
    pub offset: u64,
    /// Size (the mapped range for an expandable segment).
    pub size: u64,
    /// Pool.
    pub pool: Pool,
    /// Memory pool (as given to [`CachingAllocator::alloc_in`]; 0: the default pool).
    pub mempool: u16,
    /// Stream (as given to [`CachingAllocator::alloc_on`]).
    pub stream: i64,
    /// Part of an expandable segment.
    pub expandable: bool,
    /// Bytes of live blocks in it.
    pub in_use: u64,
    /// Blocks as `(offset, size, live)`, ascending.
    pub blocks: Vec<(u64, u64, bool)>,
}

impl CachingAllocator {
    pub(super) fn seg(&self, id: u32) -> Segment {
        self.segments[id as usize].expect("live segment id")
    }

    pub(super) fn add_reserved(&mut self, bytes: u64) {
        self.reserved += bytes;
        self.counters.peak_reserved = self.counters.peak_reserved.max(self.reserved);
    }

    pub(super) fn new_segment(&mut self, s: Segment) -> u32 {
        let free = self.segments[self.segment_hint..].iter().position(Option::is_none);
        let id = if let Some(i) = free.map(|i| i + self.segment_hint) {
            self.segments[i] = Some(s);
            i
        } else {
            self.segments.push(Some(s));
            self.segments.len() - 1
        };
        self.segment_hint = id + 1;
        let id = id as u32;
        self.seg_index.insert(s.start, id);
        id
    }

    pub(super) fn drop_segment(&mut self, id: u32) {
        let s = self.seg(id);
        self.seg_index.remove(s.start);
        self.segments[id as usize] = None;
        self.segment_hint = self.segment_hint.min(id as usize);
    }

    /// The segment holding `offset` as `(start, size, expandable)` (an expandable segment's whole virtual
    /// reservation), if any.
    #[doc(hidden)]
    pub fn segment_at(&self, offset: u64) -> Option<(u64, u64, bool)> {
        let (_, id) = self.seg_index.at_or_before(offset)?;
        let s = self.seg(id);
        (offset < s.start + s.size).then_some((s.start, s.size, s.expandable))
    }

    /// Places the next new segment (or expandable reservation) at virtual address `addr` when that range is
    /// unused, instead of the lowest unused range. A replay passes the address a recorded `segment_alloc`
    /// (or first `segment_map`) shows, so that the model's addresses, and with them the address order that
    /// breaks ties between equal-size cached blocks (`BlockComparatorSize`), are PyTorch's. The hint is
    /// used by the next segment created and dropped by the next [`CachingAllocator::alloc_on`].
    #[doc(hidden)]
    pub fn hint_next_segment(&mut self, addr: Option<u64>) {
        self.va_hint = addr;
    }

    /// The unused virtual range of `size` bytes at the hint if possible, else the lowest one.
    pub(super) fn va_alloc(&mut self, size: u64) -> Option<u64> {
        if let Some(a) = self.va_hint.take() {
            // The last range starting at or before `a` (when seeding in address order: the last range).
            let n = self.va_holes.len();
            let k = if self.va_holes.back().is_some_and(|h| h.0 <= a) {
                n.checked_sub(1)
            } else {
                self.va_holes.partition_point(|h| h.0 <= a).checked_sub(1)
            };
            if let Some(k) = k {
                let (hs, hl) = self.va_holes[k];
                if a.checked_add(size).is_some_and(|e| e <= hs + hl) && a.is_multiple_of(MIN_BLOCK) {
                    self.va_take(k, a, size);
                    return Some(a);
                }
            }
        }
        let k = self.va_holes.iter().position(|h| h.1 >= size)?;
        let start = self.va_holes[k].0;
        self.va_take(k, start, size);
        Some(start)
    }

    /// Takes `[a, a + size)` out of the unused range `va_holes[k]`, which holds it.
    pub(super) fn va_take(&mut self, k: usize, a: u64, size: u64) {
        let (hs, hl) = self.va_holes[k];
        let (front, back) = (a - hs, hs + hl - (a + size));
        match (front > 0, back > 0) {
            (true, true) => {
                self.va_holes[k].1 = front;
                self.va_holes.insert(k + 1, (a + size, back));
            }
            (true, false) => self.va_holes[k].1 = front,
            (false, true) => self.va_holes[k] = (a + size, back),
            (false, false) => {
                self.va_holes.remove(k);
            }
        }
    }

    /// Returns `[start, start + len)` to the unused ranges, merged with the ranges it touches.
    pub(super) fn va_free(&mut self, start: u64, len: u64) {
        // The first range starting at or after `start`, and the one before it.
        let i = self.va_holes.partition_point(|h| h.0 < start);
        let next = self.va_holes.get(i).is_some_and(|h| h.0 == start + len);
        let prev = i.checked_sub(1).is_some_and(|p| self.va_holes[p].0 + self.va_holes[p].1 == start);
        match (prev, next) {
            (true, true) => {
                let n = self.va_holes.remove(i).map_or(0, |h| h.1);
                self.va_holes[i - 1].1 += len + n;
            }
            (true, false) => self.va_holes[i - 1].1 += len,
            (false, true) => self.va_holes[i] = (start, self.va_holes[i].1 + len),
            (false, false) => self.va_holes.insert(i, (start, len)),
        }
    }

    /// Device free bytes listed as the lowest unused virtual ranges, `capacity − reserved` bytes in all.
    pub(super) fn device_ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let mut left = self.config.device_capacity - self.reserved;
        self.va_holes.iter().map_while(move |&(o, l)| {
            let take = l.min(left);
            left -= take;
            (take > 0).then_some((o, take))
        })
    }

    /// Segments with their blocks, ascending by offset (expandable segments: one entry per contiguous
    /// mapped range, as in a snapshot).
    pub fn segments(&self) -> Vec<SegmentInfo> {
        let mut ranges: Vec<(u64, u64, u32)> = self
            .segments
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.filter(|s| !s.expandable).map(|s| (s.start, s.start + s.size, i as u32)))
            .collect();
        ranges.extend(self.mapped_runs());
        ranges.sort_unstable();
        ranges
            .into_iter()
            .map(|(a, b, id)| {
                let s = self.seg(id);
                let blocks: Vec<(u64, u64, bool)> =
                    self.chain(a, b).map(|k| (k.off, k.size, k.state == LIVE)).collect();
                let in_use = blocks.iter().filter(|b| b.2).map(|b| b.1).sum();
                SegmentInfo {
                    offset: a,
                    size: b - a,
                    pool: s.pool,
                    mempool: s.mempool,
                    stream: self.streams[s.stream as usize],
                    expandable: s.expandable,
                    in_use,
                    blocks,
                }
            })
            .collect()
    }

    /// `alloc_block`: a new segment (or expandable mapping) for a rounded request; returns a cached block
    /// that holds it, still in the free set.
    pub(super) fn alloc_block(
        &mut self,
        mempool: u16,
        pool: Pool,
        stream: u32,
        size: u64,
        alloc_size: u64,
    ) -> Option<u32> {
        if self.config.memory_fraction.is_some()
            && self.reserved.saturating_add(alloc_size) > self.config.allowed_memory_maximum()
        {
            return None;
        }
        if self.config.expandable_segments {
            return self.try_allocate_expandable_block(mempool, pool, stream, size);
        }
        if alloc_size > self.device_free_bytes() {
            return None;
        }
        let start = self.va_alloc(alloc_size)?;
        let id = self.new_segment(Segment { start, size: alloc_size, pool, mempool, stream, expandable: false });
        self.add_reserved(alloc_size);
        self.counters.segment_allocs += 1;
        let n = self.segment_block(id);
        self.cache(n);
        Some(n)
    }

    /// Seeds a segment that existed before a trace replay began (a trace recorded mid-run): `size` bytes
    /// (a multiple of 512) in `pool` on stream 0, wholly free. See [`CachingAllocator::seed_segment_on`].
    ///
    /// # Errors
    /// As [`CachingAllocator::seed_segment_on`].
    #[doc(hidden)]
    pub fn seed_segment(&mut self, size: u64, pool: Pool) -> Result<u64, AllocError> {
        self.seed_segment_in(size, pool, 0, 0)
    }

    /// [`CachingAllocator::seed_segment_in`] in the default memory pool.
    ///
    /// # Errors
    /// As [`CachingAllocator::seed_segment_in`].
    #[doc(hidden)]
    pub fn seed_segment_on(&mut self, size: u64, pool: Pool, stream: i64) -> Result<u64, AllocError> {
        self.seed_segment_in(size, pool, stream, 0)
    }

    /// Seeds a non-expandable segment of `size` bytes (a multiple of 512) in `pool` of memory pool
    /// `mempool` (0: the default pool) on `stream`, wholly free, at the lowest free virtual address. Not counted in
    /// [`CachingCounters::segment_allocs`](super::CachingCounters::segment_allocs).
    /// Returns its offset; replay maps the recorded segment there and its blocks to the same relative
    /// positions ([`CachingAllocator::seed_block`]).
    ///
    /// # Errors
    /// [`AllocError::SizeOverflow`] for a zero or unaligned size; [`AllocError::OutOfMemory`] when the
    /// device has fewer free bytes.
    #[doc(hidden)]
    pub fn seed_segment_in(&mut self, size: u64, pool: Pool, stream: i64, mempool: u16) -> Result<u64, AllocError> {
        if size == 0 || !size.is_multiple_of(MIN_BLOCK) || size > crate::reference::MAX_BYTES {
            return Err(AllocError::SizeOverflow { size });
        }
        if size > self.config.device_capacity - self.reserved {
            return Err(oom(size, self.config.device_capacity - self.reserved, 0));
        }
        let st = self.stream_index(stream);
        let start = self.va_alloc(size).ok_or(oom(size, 0, 0))?;
        let id = self.new_segment(Segment { start, size, pool, mempool, stream: st, expandable: false });
        self.add_reserved(size);
        let n = self.segment_block(id);
        self.cache(n);
        Ok(start)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::SegIndex;
    use crate::reference::caching::{CachingAllocator, CachingConfig};
    use crate::reference::SubAllocator;

    const MIB: u64 = 1 << 20;

    /// Random insertions, removals and lookups answer as a `BTreeMap` does.
    #[test]
    fn seg_index_matches_a_btree_map() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut rnd = move |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        let (mut s, mut b) = (SegIndex::default(), BTreeMap::new());
        for step in 0..20_000u32 {
            let k = rnd(4000) * 512;
            match rnd(3) {
                0 => {
                    s.insert(k, step);
                    b.insert(k, step);
                }
                1 => {
                    s.remove(k);
                    b.remove(&k);
                }
                _ => {}
            }
            let q = rnd(4100 * 512);
            assert_eq!(s.get(k), b.get(&k).copied());
            assert_eq!(s.at_or_before(q), b.range(..=q).next_back().map(|(&a, &i)| (a, i)));
            let e = q + rnd(8) * 512;
            let want: Vec<(u64, u32)> = b.range(q..e).map(|(&a, &i)| (a, i)).collect();
            assert_eq!(s.starting_in(q, e).collect::<Vec<_>>(), want);
        }
        assert_eq!(s.iter().collect::<Vec<_>>(), b.into_iter().collect::<Vec<_>>());
    }

    #[test]
    fn a_new_segment_needs_free_pages_not_a_free_address_range() {
        // Five 12 MiB segments on a 64 MiB device, three of them cached: a 40 MiB segment fits once they are
        // released (`release_cached_blocks`), although no 40 MiB range of [0, 64 MiB) is free around the two
        // live ones: the device counts free pages, and virtual addresses go past the device size.
        let mut c = CachingAllocator::new(CachingConfig::new(64 * MIB)).unwrap();
        let v: Vec<u64> = (0..5).map(|_| c.alloc(12 * MIB, 1).unwrap().offset).collect();
        assert_eq!(v, (0..5).map(|i| i * 12 * MIB).collect::<Vec<_>>());
        for i in [0, 2, 4] {
            c.free_at(v[i]).unwrap();
        }
        let big = c.alloc(40 * MIB, 1).unwrap();
        assert_eq!((c.reserved_bytes(), c.counters().alloc_retries), (64 * MIB, 1));
        assert_eq!(big.offset, 48 * MIB, "[48, 88) MiB: past the 64 MiB device size");
    }
}
