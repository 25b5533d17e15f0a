//! Returning memory to the device (`c10/cuda/CUDACachingAllocator.cpp`): `release_block` of a wholly free
//! segment, `release_blocks` / `release_cached_blocks` (`torch.cuda.empty_cache()`, and the last retry of
//! `malloc`), `release_available_cached_blocks` (oversize blocks, with `max_split_size`) and
//! `garbage_collect_cached_blocks`.

use super::{CachingAllocator, Pool, FREE, NIL};
use crate::reference::AllocError;

impl CachingAllocator {
    /// `torch.cuda.empty_cache()` (`release_cached_blocks(context, {0, 0})`, also the last retry of
    /// `malloc`): releases every wholly free cached segment of the default pool and unmaps every whole free
    /// page of its expandable segments. Returns the bytes released.
    ///
    /// Private pools keep their memory: PyTorch releases one only once it is freeable (its CUDA graph or
    /// `MemPool` destroyed, `graph_pools_freeable`, use count 0), which a snapshot does not record; a
    /// replay releases what such a pool released where the trace records it
    /// ([`CachingAllocator::release_segment`]).
    pub fn empty_cache(&mut self) -> u64 {
        let before = self.reserved;
        for pool in [Pool::Large, Pool::Small] {
            self.release_blocks(0, pool);
        }
        before - self.reserved
    }

    /// Releases the non-expandable segment that starts at `start` if it is wholly free (`release_block`, as
    /// a replay does at a recorded `segment_free`). Returns its size.
    ///
    /// # Errors
    /// [`AllocError::InvalidFree`] when no wholly free non-expandable segment starts there.
    #[doc(hidden)]
    pub fn release_segment(&mut self, start: u64) -> Result<u64, AllocError> {
        let id = self.seg_index.get(start).ok_or(AllocError::InvalidFree { offset: start })?;
        let n = self.seg_first[id as usize];
        let b = self.blocks[n as usize];
        if b.state != FREE || !self.releasable(n) {
            return Err(AllocError::InvalidFree { offset: start });
        }
        self.release_block(n);
        Ok(b.size)
    }

    /// `release_block`: returns the wholly free non-expandable segment of the cached block `n` to the device.
    pub(super) fn release_block(&mut self, n: u32) {
        let b = self.blocks[n as usize];
        self.uncache(n);
        let seg = self.seg(b.seg);
        debug_assert!(!seg.expandable && seg.start == b.off && seg.size == b.size);
        self.drop_block(n);
        self.va_free(seg.start, seg.size);
        self.drop_segment(b.seg);
        self.reserved -= seg.size;
        self.counters.segment_frees += 1;
    }

    pub(super) fn is_whole_segment(&self, n: u32) -> bool {
        let b = &self.blocks[n as usize];
        b.prev == NIL && b.next == NIL
    }

    /// Whether the cached block `n` is a whole non-expandable segment. With PyTorch's smallest
    /// `max_split_size` (20 MiB) every cached block at or above it is one; the model also accepts smaller
    /// values, and then skips split blocks instead of releasing part of a segment.
    pub(super) fn releasable(&self, n: u32) -> bool {
        !self.seg(self.blocks[n as usize].seg).expandable && self.is_whole_segment(n)
    }

    /// `release_blocks` of one pool of memory pool `mempool`: whole free segments are released, free
    /// expandable pages unmapped.
    pub(super) fn release_blocks(&mut self, mempool: u16, pool: Pool) {
        let nodes: Vec<u32> = self.free_set(mempool, pool).iter().map(|x| x.3).collect();
        let mut to_unmap = Vec::new();
        for n in nodes {
            if self.seg(self.blocks[n as usize].seg).expandable {
                to_unmap.push(n);
            } else if self.is_whole_segment(n) {
                self.release_block(n);
            }
        }
        for n in to_unmap {
            self.unmap_block(n);
        }
    }

    /// `release_available_cached_blocks`: with `max_split_size` set, releases one cached oversize block of
    /// the request's pool (`p.pool`) that holds the request, else oversize blocks from the largest down
    /// until their bytes cover it.
    pub(super) fn release_available_cached_blocks(&mut self, mempool: u16, pool: Pool, stream: u32, size: u64) -> bool {
        let max_split = self.config.max_split_size;
        if max_split == u64::MAX {
            return false;
        }
        let key = size.max(max_split);
        let first = self.free_set(mempool, pool).first_at_least(stream, key);
        if let Some(((_, _, n), _)) = first {
            if self.releasable(n) {
                self.release_block(n);
                return true;
            }
        }
        // The stream's blocks of `max_split ..key` bytes, from the largest down.
        let mut below: Vec<(u64, u32)> = self
            .free_set(mempool, pool)
            .iter()
            .filter(|x| x.0 == stream && x.1 >= max_split && x.1 < key)
            .map(|x| (x.1, x.3))
            .collect();
        below.reverse();
        let mut released = 0u64;
        for (size, n) in below {
            if released >= key {
                break;
            }
            if self.releasable(n) {
                self.release_block(n);
                released += size;
            }
        }
        released >= key
    }

    /// `garbage_collect_cached_blocks`.
    pub(super) fn garbage_collect(&mut self) {
        let threshold = (self.config.garbage_collection_threshold * self.config.allowed_memory_maximum() as f64) as u64;
        if self.reserved <= threshold {
            return;
        }
        let target = self.reserved - threshold;
        let now = self.gc_calls[Pool::Large as usize];
        // (record, size, age, releasable): whole (unsplit) free blocks of the large pool.
        let mut cands: Vec<(u32, u64, u64, bool)> = self
            .free_set(0, Pool::Large)
            .iter()
            .map(|x| x.3)
            .filter(|&n| self.is_whole_segment(n))
            .map(|n| {
                let b = self.blocks[n as usize];
                (n, b.size, now - b.gc_base, !self.seg(b.seg).expandable)
            })
            .collect();
        let mut total_age: u64 = cands.iter().map(|c| c.2).sum();
        let mut count = cands.len() as u64;
        let (mut reclaimed, mut freed) = (0u64, true);
        while reclaimed < target && freed && count > 0 {
            let age_threshold = total_age as f64 / count as f64;
            freed = false;
            for c in cands.iter_mut().filter(|c| c.3) {
                if c.2 as f64 >= age_threshold {
                    freed = true;
                    reclaimed += c.1;
                    total_age -= c.2;
                    count -= 1;
                    c.3 = false;
                    c.1 = 0;
                    self.release_block(c.0);
                    self.counters.gc_releases += 1;
                }
            }
            cands.retain(|c| c.1 > 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::reference::caching::{CachingAllocator, CachingConfig};
    use crate::reference::SubAllocator;

    const MIB: u64 = 1 << 20;

    #[test]
    fn garbage_collection_frees_old_cached_segments_only_with_a_memory_fraction() {
        // `garbage_collect_cached_blocks`: fraction 0.5 of 1 GiB allows 512 MiB; threshold 0.6 starts
        // collecting above 307.2 MiB. Ages in `get_free_block` calls: A 3, B 2, C 1, average 2: A and B go.
        let run = |fraction: Option<f64>| {
            let cfg = CachingConfig::new(1 << 30).gc_threshold(0.6).memory_fraction(fraction);
            let mut c = CachingAllocator::new(cfg).unwrap();
            for s in [100, 150, 200] {
                let x = c.alloc(s * MIB, 1).unwrap();
                c.free_at(x.offset).unwrap();
            }
            c.alloc(250 * MIB, 1).unwrap();
            (c.reserved_bytes(), c.counters().gc_releases, c.counters().alloc_retries)
        };
        assert_eq!(run(Some(0.5)), (450 * MIB, 2, 0), "C (200) stays cached next to D (250)");
        assert_eq!(run(None), (700 * MIB, 0, 0), "without a fraction PyTorch never collects");
        let cfg = CachingConfig::new(1 << 30).memory_fraction(Some(0.5));
        let mut c = CachingAllocator::new(cfg).unwrap();
        for s in [100, 150, 200] {
            let x = c.alloc(s * MIB, 1).unwrap();
            c.free_at(x.offset).unwrap();
        }
        c.alloc(250 * MIB, 1).unwrap();
        assert_eq!((c.reserved_bytes(), c.counters().alloc_retries), (250 * MIB, 1), "fraction alone: empty_cache");
    }
}
