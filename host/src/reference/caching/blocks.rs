//! Block records and chain surgery: each block is a record in a slab, linked to the adjacent blocks of its
//! segment (`Block::prev`/`next` in `c10/cuda/CUDACachingAllocator.cpp`), so splitting (`should_split`,
//! the split in `malloc`) and merging with free neighbours (`free_block`, `try_merge_blocks`) read and
//! write no index. Lookups by offset walk one segment's chain (the segment found through
//! [`super::vspace`]'s index by start). The seeding primitive for live blocks ([`CachingAllocator::seed_block`])
//! is chain surgery too and lives here.

use super::{CachingAllocator, MIN_BLOCK};
use crate::reference::{AllocError, Allocation, Handle};

pub(super) const LIVE: u8 = 0;
pub(super) const FREE: u8 = 1;
pub(super) const UNMAPPED: u8 = 2;
/// State of a record slot that holds no block (on the spare list).
pub(super) const SPARE: u8 = 3;
/// No block: the end of a segment's chain.
pub(super) const NIL: u32 = u32::MAX;

/// A block, a node of its segment's chain of blocks in address order (PyTorch's `Block::prev`/`next`):
/// `prev` and `next` are the adjacent blocks of the same segment, [`NIL`] at the segment's ends.
/// Aligned to a 64-byte cache line: the record is 50 bytes, so unaligned, 7 records in 8 straddle two lines.
#[derive(Clone, Copy, Debug)]
#[repr(align(64))]
pub(super) struct Block {
    pub(super) off: u64,
    pub(super) size: u64,
    pub(super) requested: u64,
    /// `gc_count_base`: the pool's `get_free_block` call count when the block was cached.
    pub(super) gc_base: u64,
    pub(super) seg: u32,
    pub(super) stream: u32,
    pub(super) prev: u32,
    pub(super) next: u32,
    pub(super) state: u8,
    /// The segment's pool (`Pool as u8`), kept here so that caching a block reads no segment record.
    pub(super) pool: u8,
    /// The segment's memory pool (0: the default pool), for the same reason.
    pub(super) mempool: u16,
}

impl CachingAllocator {
    /// A new record for `b` (a spare slot if any). Links are the caller's.
    pub(super) fn new_block(&mut self, b: Block) -> u32 {
        match self.spare.pop() {
            Some(n) => {
                self.blocks[n as usize] = b;
                n
            }
            None => {
                self.blocks.push(b);
                (self.blocks.len() - 1) as u32
            }
        }
    }

    /// Frees the record `n` (its block is in no set; the caller has unlinked it or drops its whole chain).
    pub(super) fn drop_block(&mut self, n: u32) {
        self.blocks[n as usize].state = SPARE;
        self.spare.push(n);
    }

    /// The single block that covers segment `id` (a new segment or reservation), in no set yet; it is the
    /// segment's first block.
    pub(super) fn segment_block(&mut self, id: u32) -> u32 {
        let s = self.seg(id);
        let n = self.new_block(Block {
            off: s.start,
            size: s.size,
            requested: 0,
            gc_base: 0,
            seg: id,
            stream: s.stream,
            prev: NIL,
            next: NIL,
            state: FREE,
            pool: s.pool as u8,
            mempool: s.mempool,
        });
        if self.seg_first.len() <= id as usize {
            self.seg_first.resize(id as usize + 1, NIL);
        }
        self.seg_first[id as usize] = n;
        n
    }

    /// Splits block `n` (in no set) `k` bytes after its start: `n` keeps `[off, off + k)`, a new block of the
    /// same segment, stream and state (returned, in no set) takes the rest.
    pub(super) fn split(&mut self, n: u32, k: u64) -> u32 {
        let b = self.blocks[n as usize];
        debug_assert!(k > 0 && k < b.size);
        let m = self.new_block(Block { off: b.off + k, size: b.size - k, prev: n, next: b.next, ..b });
        if b.next != NIL {
            self.blocks[b.next as usize].prev = m;
        }
        let bn = &mut self.blocks[n as usize];
        bn.size = k;
        bn.next = m;
        m
    }

    /// Block `n` takes over the next block of its segment (in no set), whose record is freed.
    pub(super) fn absorb_next(&mut self, n: u32) {
        let m = self.blocks[n as usize].next;
        let bm = self.blocks[m as usize];
        let bn = &mut self.blocks[n as usize];
        bn.size += bm.size;
        bn.next = bm.next;
        if bm.next != NIL {
            self.blocks[bm.next as usize].prev = n;
        }
        self.drop_block(m);
    }

    /// Block `n` becomes live with `requested` bytes asked for.
    pub(super) fn make_live(&mut self, n: u32, requested: u64) {
        let b = &mut self.blocks[n as usize];
        b.state = LIVE;
        b.requested = requested;
        b.gc_base = 0;
        self.allocated += requested;
        self.in_use += b.size;
        self.live += 1;
        let c = &mut self.counters;
        c.peak_allocated = c.peak_allocated.max(self.allocated);
        c.peak_in_use = c.peak_in_use.max(self.in_use);
    }

    /// `free_block` / `try_merge_blocks`: block `n` (in no set) is cached as free, merged with the free
    /// (mapped) neighbours of its segment. Returns the merged block.
    pub(super) fn merge_free(&mut self, mut n: u32) -> u32 {
        let next = self.blocks[n as usize].next;
        if next != NIL && self.blocks[next as usize].state == FREE {
            self.uncache(next);
            self.absorb_next(n);
        }
        let prev = self.blocks[n as usize].prev;
        if prev != NIL && self.blocks[prev as usize].state == FREE {
            self.uncache(prev);
            self.absorb_next(prev);
            n = prev;
        }
        self.cache(n);
        n
    }

    /// Frees the live block `n` (`free_block`).
    pub(super) fn free_block(&mut self, n: u32) {
        let b = &self.blocks[n as usize];
        self.allocated -= b.requested;
        self.in_use -= b.size;
        self.live -= 1;
        self.merge_free(n);
    }

    /// The first block (ascending) that overlaps `[a, e)` and satisfies `pred`. Walks the chains of the
    /// segments that overlap the range: O(blocks of those segments), for the cold paths.
    pub(super) fn find_block(&self, a: u64, e: u64, pred: impl Fn(&Block) -> bool) -> Option<u32> {
        let first = self.seg_index.at_or_before(a).map_or(a, |(s, _)| s);
        for (_, id) in self.seg_index.starting_in(first, e) {
            let mut n = self.seg_first[id as usize];
            while n != NIL {
                let b = &self.blocks[n as usize];
                if b.off >= e {
                    break;
                }
                if b.off + b.size > a && pred(b) {
                    return Some(n);
                }
                n = b.next;
            }
        }
        None
    }

    /// The block that holds `offset`, if any: a walk from `walk_hint` when that block lies at or before
    /// `offset` in the same segment, else from the segment's first block. O(blocks of its segment).
    pub(super) fn block_containing(&self, offset: u64) -> Option<u32> {
        // Any block record in use is a valid start: blocks tile their segment, so the first block from it
        // that ends after `offset` holds it; the chain's end (NIL) means another segment.
        let mut n = self.walk_hint;
        if self.blocks.get(n as usize).is_some_and(|b| b.state != SPARE && b.off <= offset) {
            while n != NIL {
                let b = &self.blocks[n as usize];
                if offset - b.off < b.size {
                    return Some(n);
                }
                n = b.next;
            }
        }
        self.find_block(offset, offset.checked_add(1)?, |_| true)
    }

    /// The block that starts at `offset`, if any: a walk of its segment's chain, O(blocks of the segment),
    /// for `free_at` and the cold paths (`alloc`/`free` never look a block up by offset).
    pub(super) fn block_at(&self, offset: u64) -> Option<u32> {
        let (_, id) = self.seg_index.at_or_before(offset)?;
        let mut n = self.seg_first[id as usize];
        while n != NIL {
            let b = &self.blocks[n as usize];
            if b.off >= offset {
                return (b.off == offset).then_some(n);
            }
            n = b.next;
        }
        None
    }

    /// The blocks of `[a, e)` in address order; `a` must be a block's start.
    pub(super) fn chain(&self, a: u64, e: u64) -> impl Iterator<Item = &Block> + '_ {
        let mut n = self.block_at(a).unwrap_or(NIL);
        std::iter::from_fn(move || {
            let b = self.blocks.get(n as usize).filter(|b| b.off < e)?;
            n = b.next;
            Some(b)
        })
    }

    /// Seeds a live block of `size` bytes (the block's rounded size as the snapshot records it, a multiple
    /// of 512) at `offset`, inside a free block of a seeded segment, with `requested` bytes asked for. The
    /// free rest of that block stays free on both sides (within the segment). The block belongs to its
    /// segment's stream.
    ///
    /// # Errors
    /// [`AllocError::InvalidRelocation`] when `[offset, offset + size)` is not inside one free block or is
    /// unaligned; [`AllocError::ZeroSize`] for `size == 0`.
    #[doc(hidden)]
    pub fn seed_block(&mut self, offset: u64, size: u64, requested: u64) -> Result<Allocation, AllocError> {
        if size == 0 {
            return Err(AllocError::ZeroSize);
        }
        let bad = AllocError::InvalidRelocation("seeded block not inside one free block of a segment");
        if !offset.is_multiple_of(MIN_BLOCK) || !size.is_multiple_of(MIN_BLOCK) {
            return Err(bad);
        }
        let n = self.block_containing(offset).ok_or(bad.clone())?;
        let fb = self.blocks[n as usize];
        let end = offset.checked_add(size).ok_or(bad.clone())?;
        if fb.state != FREE || end > fb.off + fb.size {
            return Err(bad);
        }
        self.uncache(n);
        let mut mid = n;
        if offset > fb.off {
            mid = self.split(n, offset - fb.off);
            self.cache(n);
        }
        if fb.off + fb.size > end {
            let tail = self.split(mid, size);
            self.cache(tail);
        }
        self.make_live(mid, requested.min(size));
        self.walk_hint = mid;
        Ok(Allocation { offset, size, handle: Handle::new(mid, 0) })
    }
}

#[cfg(test)]
mod tests {
    use crate::reference::caching::{CachingAllocator, CachingConfig};
    use crate::reference::SubAllocator;

    const MIB: u64 = 1 << 20;

    #[test]
    fn small_blocks_split_at_512_large_above_1_mib() {
        let mut c = CachingAllocator::new(CachingConfig::new(1 << 30)).unwrap();
        let big = c.alloc(12 * MIB, 1).unwrap();
        c.free_at(big.offset).unwrap();
        // 11.5 MiB from the cached 12 MiB block: the 0.5 MiB remainder is not split off.
        let x = c.alloc(11 * MIB + MIB / 2, 1).unwrap();
        assert_eq!((x.offset, x.size), (big.offset, 12 * MIB));
        let s = c.alloc(1000, 1).unwrap();
        let t = c.alloc(1000, 1).unwrap();
        assert_eq!(t.offset, s.offset + 1024);
    }
}
