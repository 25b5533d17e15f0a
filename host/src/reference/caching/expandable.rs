//! Expandable segments (`expandable_segments:True`; `ExpandableSegment`, `try_allocate_expandable_block`,
//! `find_expandable_block`, `map_block`, `unmap_block`, `release_expandable_segment` in
//! `c10/cuda/CUDACachingAllocator.cpp`): one virtual reservation per (stream, pool), mapped and unmapped in
//! pages; unmapped blocks are kept per pool by `(stream, offset)`. The replay's `segment_unmap`
//! ([`CachingAllocator::unmap_range`]) and the seeding of mapped ranges
//! ([`CachingAllocator::seed_mapped`]) are here too.

use std::collections::BTreeMap;

use super::rules::{round_down_to, round_up_to, set_index};
use super::{CachingAllocator, Pool, Segment, ADDRESS_RANGE, FREE, LIVE, NIL, UNMAPPED};
use crate::reference::{oom, AllocError};

impl CachingAllocator {
    /// Start of the expandable reservation of (`pool`, `stream`) in the default memory pool, if it exists.
    #[doc(hidden)]
    pub fn reservation_start(&self, pool: Pool, stream: i64) -> Option<u64> {
        self.reservation_start_in(pool, stream, 0)
    }

    /// Start of the expandable reservation of (`pool`, `stream`) in memory pool `mempool`, if it exists.
    #[doc(hidden)]
    pub fn reservation_start_in(&self, pool: Pool, stream: i64, mempool: u16) -> Option<u64> {
        let st = self.streams.iter().position(|&s| s == stream)? as u32;
        let mut segs = self.segments.iter().flatten();
        segs.find(|s| s.expandable && s.pool == pool && s.mempool == mempool && s.stream == st).map(|s| s.start)
    }

    /// Virtual bytes of an expandable reservation: `totalGlobalMem + totalGlobalMem / 8` in whole pages
    /// (`ExpandableSegment`).
    pub(super) fn reservation_size(&self, pool: Pool) -> u64 {
        let cap = self.config.device_capacity;
        round_up_to(cap + cap / 8, pool.page())
            .unwrap_or(ADDRESS_RANGE)
            .min(round_down_to(ADDRESS_RANGE / 4, pool.page()))
    }

    pub(super) fn new_reservation(&mut self, mempool: u16, pool: Pool, stream: u32, len: u64) -> Option<u32> {
        let start = self.va_alloc(len)?;
        let id = self.new_segment(Segment { start, size: len, pool, mempool, stream, expandable: true });
        let n = self.segment_block(id);
        self.park(n);
        Some(id)
    }

    /// `try_allocate_expandable_block`.
    pub(super) fn try_allocate_expandable_block(
        &mut self,
        mempool: u16,
        pool: Pool,
        stream: u32,
        size: u64,
    ) -> Option<u32> {
        let mut cand = self.find_expandable_block(mempool, pool, stream, size)?;
        if self.blocks[cand as usize].state == UNMAPPED {
            let len = self.blocks[cand as usize].size.min(size);
            cand = self.map_block(cand, len)?;
        }
        while self.blocks[cand as usize].size < size {
            let b = self.blocks[cand as usize];
            let next = self.blocks.get(b.next as usize).filter(|n| n.state == UNMAPPED)?;
            let len = (size - b.size).min(next.size);
            cand = self.map_block(b.next, len)?;
        }
        Some(cand)
    }

    /// `find_expandable_block`: the lowest unmapped range of the stream's reservation (with the free block
    /// before it) with room for `size` bytes, or a new reservation. Returns the first block of it.
    pub(super) fn find_expandable_block(&mut self, mempool: u16, pool: Pool, stream: u32, size: u64) -> Option<u32> {
        let p = set_index(mempool, pool);
        let mut key = (stream, 0u64);
        while let Some((&(st, off), &n)) = self.unmapped.get(p).and_then(|u| u.range(key..).next()) {
            if st != stream {
                break;
            }
            key = (stream, off + 1);
            let prev = self.blocks[n as usize].prev;
            let c = if prev != NIL && self.blocks[prev as usize].state == FREE { prev } else { n };
            let (mut bytes, mut at) = (0u64, c);
            while bytes < size && at != NIL {
                let b = &self.blocks[at as usize];
                if b.state == LIVE {
                    break;
                }
                bytes += b.size;
                at = b.next;
            }
            if bytes >= size {
                return Some(c);
            }
        }
        let len = self.reservation_size(pool);
        let id = self.new_reservation(mempool, pool, stream, len)?;
        Some(self.seg_first[id as usize])
    }

    /// `map_block`: maps the pages covering the first `size` bytes of the unmapped block `n` if the device
    /// has them; returns the resulting cached block (merged with free neighbours).
    pub(super) fn map_block(&mut self, n: u32, size: u64) -> Option<u32> {
        let b = self.blocks[n as usize];
        let page = self.seg(b.seg).pool.page();
        let bytes = round_up_to(size, page)?.min(b.size);
        if bytes > self.device_free_bytes() {
            return None;
        }
        self.unpark(n);
        if bytes < b.size {
            let tail = self.split(n, bytes);
            self.park(tail);
        }
        self.add_reserved(bytes);
        self.counters.segment_allocs += 1;
        Some(self.merge_free(n))
    }

    /// `unmap_block`: unmaps the whole pages inside the cached free block `n`. Returns the bytes unmapped.
    pub(super) fn unmap_block(&mut self, n: u32) -> u64 {
        let b = self.blocks[n as usize];
        let seg = self.seg(b.seg);
        let page = seg.pool.page();
        let rel = b.off - seg.start;
        let begin = seg.start + round_up_to(rel, page).expect("inside the range");
        let end = seg.start + round_down_to(rel + b.size, page);
        if begin >= end {
            return 0;
        }
        self.uncache(n);
        let mut mid = n;
        if begin > b.off {
            mid = self.split(n, begin - b.off);
            self.cache(n);
        }
        if b.off + b.size > end {
            let tail = self.split(mid, end - begin);
            self.cache(tail);
        }
        let m = self.merge_unmapped(mid);
        self.reserved -= end - begin;
        self.counters.segment_frees += 1;
        let mb = self.blocks[m as usize];
        if mb.off == seg.start && mb.size == seg.size {
            // `release_expandable_segment`: nothing mapped any more.
            self.drop_block(m);
            self.va_free(seg.start, seg.size);
            self.drop_segment(b.seg);
        } else {
            self.park(m);
        }
        end - begin
    }

    /// Unmaps the whole pages of `[offset, offset + size)` that lie in free blocks of an expandable segment
    /// (`unmap_block` on that part of each free block, as a replay does at a recorded `segment_unmap`).
    /// Returns the bytes unmapped.
    #[doc(hidden)]
    pub fn unmap_range(&mut self, offset: u64, size: u64) -> u64 {
        let end = offset.saturating_add(size);
        let mut unmapped = 0;
        let mut at = offset;
        while at < end {
            let Some(n) = self.find_block(at, end, |b| b.state == FREE) else {
                break;
            };
            let b = self.blocks[n as usize];
            let b_end = b.off + b.size;
            at = b_end;
            if !self.seg(b.seg).expandable {
                continue;
            }
            let (lo, hi) = (b.off.max(offset), b_end.min(end));
            self.uncache(n);
            let mut mid = n;
            if lo > b.off {
                mid = self.split(n, lo - b.off);
                self.cache(n);
            }
            if b_end > hi {
                let tail = self.split(mid, hi - lo);
                self.cache(tail);
            }
            self.cache(mid);
            unmapped += self.unmap_block(mid);
            // Pieces that stayed mapped merge back with their free neighbours.
            for p in [lo, hi] {
                if let Some(k) = self.block_at(p).filter(|&k| self.blocks[k as usize].state == FREE) {
                    self.uncache(k);
                    self.merge_free(k);
                }
            }
        }
        unmapped
    }

    /// Contiguous mapped ranges of expandable segments as `(start, end, segment id)`, ascending.
    pub(super) fn mapped_runs(&self) -> Vec<(u64, u64, u32)> {
        let mut runs: Vec<(u64, u64, u32)> = Vec::new();
        for (start, id) in self.seg_index.iter() {
            let s = self.seg(id);
            if !s.expandable {
                continue;
            }
            for b in self.chain(start, start + s.size) {
                if b.state == UNMAPPED {
                    continue;
                }
                match runs.last_mut() {
                    Some(r) if r.1 == b.off && r.2 == id => r.1 = b.off + b.size,
                    _ => runs.push((b.off, b.off + b.size, id)),
                }
            }
        }
        runs
    }

    /// Block `n` becomes unmapped, in its pool's unmapped set.
    pub(super) fn park(&mut self, n: u32) {
        let b = &mut self.blocks[n as usize];
        b.state = UNMAPPED;
        b.requested = 0;
        b.gc_base = 0;
        let p = set_index(b.mempool, Pool::of_index(b.pool));
        if self.unmapped.len() <= p {
            self.unmapped.resize_with(p + 1, BTreeMap::new);
        }
        self.unmapped[p].insert((b.stream, b.off), n);
    }

    /// Takes the unmapped block `n` out of its unmapped set.
    pub(super) fn unpark(&mut self, n: u32) {
        let b = &self.blocks[n as usize];
        debug_assert_eq!(b.state, UNMAPPED);
        self.unmapped[set_index(b.mempool, Pool::of_index(b.pool))].remove(&(b.stream, b.off));
    }

    /// Block `n` (in no set) merged with the unmapped neighbours of its segment; the result is in no set.
    pub(super) fn merge_unmapped(&mut self, mut n: u32) -> u32 {
        let next = self.blocks[n as usize].next;
        if next != NIL && self.blocks[next as usize].state == UNMAPPED {
            self.unpark(next);
            self.absorb_next(n);
        }
        let prev = self.blocks[n as usize].prev;
        if prev != NIL && self.blocks[prev as usize].state == UNMAPPED {
            self.unpark(prev);
            self.absorb_next(prev);
            n = prev;
        }
        n
    }

    /// Seeds a mapped range of the expandable segment of (`pool`, `stream`) that existed before a trace
    /// replay began: `size` bytes at `rel` bytes from the start of the segment's virtual reservation (both
    /// multiples of the pool's page), wholly free. The reservation is created on first use with
    /// `max(1⅛ × capacity, span)` bytes. Not counted in
    /// [`CachingCounters::segment_allocs`](super::CachingCounters::segment_allocs). Returns the
    /// offset of the range.
    ///
    /// # Errors
    /// [`AllocError::InvalidRelocation`] for unaligned values or a range that is not wholly unmapped;
    /// [`AllocError::OutOfMemory`] when the device has fewer free bytes.
    #[doc(hidden)]
    pub fn seed_mapped(&mut self, pool: Pool, stream: i64, rel: u64, size: u64, span: u64) -> Result<u64, AllocError> {
        let page = pool.page();
        let bad = AllocError::InvalidRelocation("seeded mapped range not page-aligned inside unmapped space");
        if size == 0 || !rel.is_multiple_of(page) || !size.is_multiple_of(page) {
            return Err(bad);
        }
        if size > self.config.device_capacity - self.reserved {
            return Err(oom(size, self.config.device_capacity - self.reserved, 0));
        }
        let st = self.stream_index(stream);
        let existing = self
            .segments
            .iter()
            .position(|s| s.is_some_and(|s| s.expandable && s.pool == pool && s.mempool == 0 && s.stream == st));
        let id = match existing {
            Some(id) => id as u32,
            None => {
                let len = self.reservation_size(pool).max(round_up_to(span, page).ok_or(bad.clone())?);
                self.new_reservation(0, pool, st, len).ok_or(oom(size, 0, 0))?
            }
        };
        let seg = self.seg(id);
        let off = seg.start.checked_add(rel).ok_or(bad.clone())?;
        let end = off.checked_add(size).ok_or(bad.clone())?;
        let n = self.block_containing(off).ok_or(bad.clone())?;
        let ub = self.blocks[n as usize];
        if ub.state != UNMAPPED || ub.seg != id || end > ub.off + ub.size {
            return Err(bad);
        }
        self.unpark(n);
        let mut mid = n;
        if off > ub.off {
            mid = self.split(n, off - ub.off);
            self.park(n);
        }
        if ub.off + ub.size > end {
            let tail = self.split(mid, size);
            self.park(tail);
        }
        self.add_reserved(size);
        self.merge_free(mid);
        Ok(off)
    }
}

#[cfg(test)]
mod tests {
    use crate::reference::caching::{CachingAllocator, CachingConfig};
    use crate::reference::{AllocError, Allocation, SubAllocator};

    const MIB: u64 = 1 << 20;

    #[test]
    fn allocation_order_matters_without_expandable_segments() {
        // The devlog example: 8 x 16 MiB then 4 x 32 MiB reserves 256 MiB; the reverse order 128 MiB.
        let run = |first: u64, n1: usize, second: u64, n2: usize, expandable: bool| {
            let mut c = CachingAllocator::new(CachingConfig::new(1 << 30).expandable(expandable)).unwrap();
            let v: Vec<u64> = (0..n1).map(|_| c.alloc(first, 1).unwrap().offset).collect();
            v.into_iter().for_each(|o| c.free_at(o).unwrap());
            let w: Vec<u64> = (0..n2).map(|_| c.alloc(second, 1).unwrap().offset).collect();
            w.into_iter().for_each(|o| c.free_at(o).unwrap());
            c.counters().peak_reserved
        };
        assert_eq!(run(16 * MIB, 8, 32 * MIB, 4, false), 256 * MIB);
        assert_eq!(run(32 * MIB, 4, 16 * MIB, 8, false), 128 * MIB);
        assert_eq!(run(16 * MIB, 8, 32 * MIB, 4, true), 140 * MIB);
    }

    #[test]
    fn expandable_unmap_in_the_middle_and_remap() {
        // Large pages are 20 MiB (`kLargeBuffer`); the segment's blocks split at 512 B (`should_split` with
        // expandable segments); `empty_cache` unmaps whole free pages anywhere (`release_blocks`,
        // `unmap_block`); a request maps the lowest unmapped range with the free block before it
        // (`find_expandable_block`, `map_block`).
        let mut c = CachingAllocator::new(CachingConfig::new(1 << 30).expandable(true)).unwrap();
        let a = c.alloc(30 * MIB, 1).unwrap();
        let base = a.offset;
        assert_eq!(c.reserved_bytes(), 40 * MIB, "30 MiB maps two 20 MiB pages");
        let b = c.alloc(30 * MIB, 1).unwrap();
        assert_eq!(
            (b.offset - base, c.reserved_bytes()),
            (30 * MIB, 60 * MIB),
            "the free 10 MiB tail grows by one page"
        );
        let d = c.alloc(20 * MIB, 1).unwrap();
        assert_eq!((d.offset - base, c.reserved_bytes()), (60 * MIB, 80 * MIB));
        c.free_at(b.offset).unwrap();
        assert_eq!(c.empty_cache(), 20 * MIB, "only the page [40, 60) MiB is wholly free");
        assert_eq!(c.reserved_bytes(), 60 * MIB);
        let segs: Vec<(u64, u64)> = c.segments().iter().map(|s| (s.offset - base, s.size)).collect();
        assert_eq!(segs, vec![(0, 40 * MIB), (60 * MIB, 20 * MIB)], "two mapped ranges around the hole");
        assert_eq!(c.segment_count(), 2);
        let e = c.alloc(20 * MIB, 1).unwrap();
        assert_eq!((e.offset - base, c.reserved_bytes()), (30 * MIB, 80 * MIB), "the hole is mapped again");
        assert_eq!(c.segment_count(), 1);
        // The device model: 1 GiB minus 80 MiB reserved leaves 944 MiB, 47 whole 20 MiB pages.
        assert!(c.alloc(941 * MIB, 1).is_err());
        assert!(c.alloc(940 * MIB, 1).is_ok());
    }

    #[test]
    fn expandable_reservation_whose_first_mapping_failed_stays_reserved() {
        // `try_allocate_expandable_block` creates the `ExpandableSegment` before it maps; when the map fails
        // the segment stays, and `release_blocks` releases only expandable segments that hold a cached block
        // (c10/cuda/CUDACachingAllocator.cpp), so `empty_cache` keeps the empty reservation. Found by the
        // property test `caching_expandable_matches_model`.
        let mut c = CachingAllocator::new(CachingConfig::new(60 * MIB).expandable(true)).unwrap();
        let small = c.alloc(1, 1).unwrap();
        let small_res = c.segment_at(small.offset).unwrap();
        let big: Vec<Allocation> = (0..2).map(|_| c.alloc(16 * MIB, 1).unwrap()).collect();
        c.free(small).unwrap();
        // A third 16 MiB maps a third 20 MiB page: 62 MiB with the small page, so the cached small page is
        // unmapped and its reservation released (it held a cached block).
        let third = c.alloc(16 * MIB, 1).unwrap();
        assert_eq!(c.reserved_bytes(), 60 * MIB);
        assert_eq!(c.segment_at(small_res.0), None);
        // A small request: a new small reservation, whose 2 MiB page does not fit.
        assert!(matches!(c.alloc(20_379, 1), Err(AllocError::OutOfMemory { .. })));
        let empty = c.segment_at(small_res.0).expect("the new reservation at the lowest unused range");
        for a in big.into_iter().chain([third]) {
            c.free(a).unwrap();
        }
        c.empty_cache();
        assert_eq!(c.reserved_bytes(), 0);
        assert_eq!(c.segment_at(empty.0), Some(empty), "never mapped: kept");
        // The device's 60 MiB are all free, listed after the kept reservation.
        assert_eq!(c.free_blocks().collect::<Vec<_>>(), vec![(empty.0 + empty.1, 60 * MIB)]);
    }
}
