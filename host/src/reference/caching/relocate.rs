//! Relocation for compaction ([`SubAllocator::apply_relocation`]): a model of a compacting caching
//! allocator, which PyTorch does not have. Live blocks slide toward the start of their region (a
//! non-expandable segment, or one contiguous mapped range of an expandable segment) to the offsets a
//! [`CompactionPlan`] gives; each region is then laid out again and trimmed to its live extent rounded up
//! to 2 MiB (non-expandable: a re-`cudaMalloc` and copy, `kRoundLarge`; expandable: unmapping whole pages,
//! as `unmap_block` in `c10/cuda/CUDACachingAllocator.cpp` does), and regions left without live blocks
//! are released (`release_block`, `release_expandable_segment`).

use super::rules::round_up_to;
use super::{Block, CachingAllocator, Segment, FREE, LIVE, MIN_BLOCK, NIL, ROUND_LARGE, UNMAPPED};
use crate::reference::compact::{check_plan_matches, CompactBlock, CompactionLayout, CompactionPlan, Region};
use crate::reference::{AllocError, SubAllocator};

impl CachingAllocator {
    /// [`SubAllocator::compaction_layout`]: regions are each non-expandable segment and each contiguous
    /// mapped range of an expandable segment; every live block is movable, aligned to 512 B.
    pub(super) fn relocation_layout(&self) -> CompactionLayout {
        let mut layout = CompactionLayout::default();
        for s in self.segments.iter().flatten().filter(|s| !s.expandable) {
            layout.regions.push(Region { start: s.start, end: s.start + s.size, toward_end: false });
        }
        for (a, b, _) in self.mapped_runs() {
            layout.regions.push(Region { start: a, end: b, toward_end: false });
        }
        layout.regions.sort_by_key(|r| r.start);
        layout.blocks = self
            .live_blocks()
            .into_iter()
            .map(|b| CompactBlock { id: b.offset, offset: b.offset, len: b.size, align: MIN_BLOCK, pinned: false })
            .collect();
        layout
    }

    /// [`SubAllocator::apply_relocation`]: moves the live blocks as `plan` says (each within its region), lays
    /// every region out again and trims it (see the module docs).
    pub(super) fn relocate(&mut self, plan: &CompactionPlan) -> Result<(), AllocError> {
        let live = self.live_blocks();
        let units: Vec<(u64, u64)> = live.iter().map(|b| (b.offset, b.size)).collect();
        check_plan_matches(&units, plan)?;
        // Regions (start, end, segment id), ascending; each live block must stay in its own.
        let mut regions: Vec<(u64, u64, u32)> = self
            .segments
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.filter(|s| !s.expandable).map(|s| (s.start, s.start + s.size, i as u32)))
            .collect();
        regions.extend(self.mapped_runs());
        regions.sort_unstable();
        // Per region: (destination, size, requested) of each live block.
        let mut per_region: Vec<Vec<(u64, u64, u64)>> = vec![Vec::new(); regions.len()];
        for (m, b) in plan.moves.iter().zip(live.iter()) {
            let r = regions.partition_point(|r| r.0 <= b.offset) - 1;
            let (a, e, _) = regions[r];
            if m.dst < a || m.dst + m.len > e || m.dst % MIN_BLOCK != 0 {
                return Err(AllocError::InvalidRelocation("a block would leave its segment"));
            }
            per_region[r].push((m.dst, b.size, b.requested));
        }
        for v in &mut per_region {
            v.sort_by_key(|x| x.0);
            if v.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0) {
                return Err(AllocError::InvalidRelocation("blocks would overlap"));
            }
        }
        // Each region: its blocks are dropped, then it is laid out again, trimmed.
        for ((a, e, id), v) in regions.into_iter().zip(per_region) {
            let seg = self.seg(id);
            let first = self.block_at(a).expect("a region starts with a block");
            let before = self.blocks[first as usize].prev;
            let (mut n, mut after) = (first, NIL);
            while n != NIL {
                let b = self.blocks[n as usize];
                if b.off >= e {
                    after = n;
                    break;
                }
                if b.state == FREE {
                    self.uncache(n);
                }
                self.drop_block(n);
                n = b.next;
            }
            let gran = if seg.expandable { seg.pool.page() } else { ROUND_LARGE };
            let last = v.last().map_or(a, |x| x.0 + x.1);
            let cut = (a + round_up_to(last - a, gran).expect("below 2^48")).min(e);
            // The new chain of [a, e): (offset, size, state, requested).
            let mut pieces: Vec<(u64, u64, u8, u64)> = Vec::with_capacity(2 * v.len() + 2);
            let mut cursor = a;
            for &(o, size, requested) in &v {
                if o > cursor {
                    pieces.push((cursor, o - cursor, FREE, 0));
                }
                pieces.push((o, size, LIVE, requested));
                cursor = o + size;
            }
            if cursor < cut {
                pieces.push((cursor, cut - cursor, FREE, 0));
            }
            if cut < e && seg.expandable {
                pieces.push((cut, e - cut, UNMAPPED, 0));
            }
            let mut prev = before;
            let mut nodes = Vec::with_capacity(pieces.len());
            for &(off, size, state, requested) in &pieces {
                let k = self.new_block(Block {
                    off,
                    size,
                    requested,
                    gc_base: 0,
                    seg: id,
                    stream: seg.stream,
                    prev,
                    next: NIL,
                    state,
                    pool: seg.pool as u8,
                });
                if prev != NIL {
                    self.blocks[prev as usize].next = k;
                }
                prev = k;
                nodes.push(k);
            }
            if let (true, Some(&k)) = (a == seg.start, nodes.first()) {
                self.seg_first[id as usize] = k;
            }
            if prev != NIL {
                self.blocks[prev as usize].next = after;
            }
            if after != NIL {
                self.blocks[after as usize].prev = prev;
            }
            for (&k, p) in nodes.iter().zip(&pieces) {
                if p.2 == FREE {
                    self.cache(k);
                }
            }
            if cut < e {
                self.reserved -= e - cut;
                self.counters.segment_frees += 1;
                if seg.expandable {
                    // Unmapped pages join the unmapped neighbours.
                    let u = self.merge_unmapped(*nodes.last().expect("the unmapped piece"));
                    let ub = self.blocks[u as usize];
                    if ub.off == seg.start && ub.size == seg.size {
                        self.drop_block(u);
                        self.va_free(seg.start, seg.size);
                        self.drop_segment(id);
                    } else {
                        self.park(u);
                    }
                } else {
                    self.va_free(cut, e - cut);
                    if cut == a {
                        self.drop_segment(id);
                    } else {
                        self.segments[id as usize] = Some(Segment { size: cut - a, ..seg });
                    }
                }
            }
        }
        Ok(())
    }
}
