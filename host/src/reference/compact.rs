//! Reference sliding compaction: the oracle the device compaction kernel is checked against.
//!
//! This module lives next to the strategies (not in [`analysis`](crate::analysis)) because applying a plan
//! changes an allocator: it is part of the [`SubAllocator`] contract.
//!
//! 1. [`SubAllocator::compaction_layout`] lists the *units* compaction may move (live blocks; whole slab
//!    pages or direct blocks for [`Slab`](super::Slab); per-segment blocks for the caching allocator) and the
//!    regions they slide within (the whole range, or one region per segment).
//! 2. [`plan_slide`] computes the order-preserving slide inside each region: every unpinned unit moves to
//!    the lowest address at or above the end of its predecessor that honours its alignment (or the highest,
//!    for a region marked `toward_end`); pinned units stay and later units pack behind them.
//!    Destinations never exceed sources (`dst <= src` for a forward slide), so an in-place ascending
//!    `memmove` per unit is a correct executor (see DESIGN.md §3.1).
//! 3. [`SubAllocator::apply_relocation`] moves the units and rebuilds the strategy's free structures from
//!    the new layout. [`compact`] does 1–3 in one call.
//!
//! The [`CompactionPlan`] is the relocation map: [`CompactionPlan::translate`] maps any old address inside a
//! moved unit (e.g. an object inside a slab page) to its new address.

use super::{align_down, align_up, AllocError, AllocatedBlock, SubAllocator};

/// A unit compaction may move. All values in bytes except `id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[doc(hidden)]
pub struct CompactBlock {
    /// Caller's identifier (the strategies use the original offset).
    pub id: u64,
    /// Current offset in bytes.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// Alignment (power of two, bytes) the new offset must keep.
    pub align: u64,
    /// Pinned units never move (e.g. referenced by pending work).
    pub pinned: bool,
}

/// A range `[start, end)` (bytes) within which units slide. Units never cross regions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[doc(hidden)]
pub struct Region {
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
    /// Slide toward `end` instead of toward `start`.
    pub toward_end: bool,
}

impl Region {
    /// A region `[start, end)` that slides toward `start`.
    pub fn new(start: u64, end: u64) -> Self {
        Region { start, end, toward_end: false }
    }
}

/// Input of [`plan_slide`]: movable units and the regions they live in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompactionLayout {
    /// Units, any order.
    pub blocks: Vec<CompactBlock>,
    /// Disjoint regions; every unit lies inside exactly one.
    pub regions: Vec<Region>,
}

/// One unit's relocation (bytes). `src == dst` for units that stay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[doc(hidden)]
pub struct Move {
    /// The unit's [`CompactBlock::id`].
    pub id: u64,
    /// Old offset.
    pub src: u64,
    /// New offset.
    pub dst: u64,
    /// Length.
    pub len: u64,
}

/// The result of [`plan_slide`]: one [`Move`] per unit, ascending by `src`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompactionPlan {
    /// Every unit, ascending by source offset.
    pub moves: Vec<Move>,
    /// Bytes that change address (the lower bound on traffic is twice this).
    pub bytes_moved: u64,
    /// Units that change address.
    pub blocks_moved: usize,
}

impl CompactionPlan {
    /// New address of the byte at old address `addr`, if `addr` lies inside a unit; O(log n).
    #[doc(hidden)]
    pub fn translate(&self, addr: u64) -> Option<u64> {
        let i = self.moves.partition_point(|m| m.src <= addr).checked_sub(1)?;
        let m = &self.moves[i];
        (addr - m.src < m.len).then(|| m.dst + (addr - m.src))
    }

    /// The units that change address, ascending by source.
    #[doc(hidden)]
    pub fn moved(&self) -> impl Iterator<Item = &Move> + '_ {
        self.moves.iter().filter(|m| m.src != m.dst)
    }
}

/// Computes the order-preserving slide of `layout` (see the module docs). O(n log n).
///
/// # Errors
/// [`AllocError::InvalidRelocation`] if units overlap, lie outside every region, have a zero length or a
/// bad alignment, or regions overlap.
#[doc(hidden)]
pub fn plan_slide(layout: &CompactionLayout) -> Result<CompactionPlan, AllocError> {
    let bad = AllocError::InvalidRelocation;
    let mut regions = layout.regions.clone();
    regions.sort_by_key(|r| r.start);
    if regions.iter().any(|r| r.start > r.end) || regions.windows(2).any(|w| w[0].end > w[1].start) {
        return Err(bad("regions overlap"));
    }
    let mut blocks = layout.blocks.clone();
    blocks.sort_by_key(|b| b.offset);
    let mut moves = Vec::with_capacity(blocks.len());
    let mut i = 0;
    for r in &regions {
        let first = i;
        while i < blocks.len() && blocks[i].offset < r.end {
            let b = &blocks[i];
            let end = b.offset.checked_add(b.len).ok_or(bad("unit end overflows"))?;
            if b.len == 0 || b.align == 0 || !b.align.is_power_of_two() {
                return Err(bad("unit with zero length or bad alignment"));
            }
            if b.offset < r.start || end > r.end {
                return Err(bad("unit outside its region"));
            }
            if i > first && blocks[i - 1].offset + blocks[i - 1].len > b.offset {
                return Err(bad("units overlap"));
            }
            i += 1;
        }
        let units = &blocks[first..i];
        let mut region_moves: Vec<Move> = Vec::with_capacity(units.len());
        if !r.toward_end {
            let mut cursor = r.start;
            for b in units {
                let dst =
                    if b.pinned { b.offset } else { align_up(cursor, b.align).map_or(b.offset, |d| d.min(b.offset)) };
                cursor = dst + b.len;
                region_moves.push(Move { id: b.id, src: b.offset, dst, len: b.len });
            }
        } else {
            let mut cursor = r.end;
            for b in units.iter().rev() {
                let dst = if b.pinned { b.offset } else { align_down(cursor - b.len, b.align).max(b.offset) };
                cursor = dst;
                region_moves.push(Move { id: b.id, src: b.offset, dst, len: b.len });
            }
            region_moves.reverse();
        }
        moves.extend(region_moves);
    }
    if i != blocks.len() {
        return Err(bad("unit outside every region"));
    }
    let bytes_moved = moves.iter().filter(|m| m.src != m.dst).map(|m| m.len).sum();
    let blocks_moved = moves.iter().filter(|m| m.src != m.dst).count();
    Ok(CompactionPlan { moves, bytes_moved, blocks_moved })
}

/// Plans and applies a slide on `alloc`; `pinned(offset, len)` says which units must stay (a unit is pinned
/// if it contains any pinned allocation). Returns the plan (the relocation map).
///
/// # Errors
/// Those of [`plan_slide`] and [`SubAllocator::apply_relocation`]; the allocator is unchanged on error.
pub fn compact<A: SubAllocator + ?Sized>(
    alloc: &mut A,
    pinned: &dyn Fn(u64, u64) -> bool,
) -> Result<CompactionPlan, AllocError> {
    let mut layout = alloc.compaction_layout();
    for b in &mut layout.blocks {
        b.pinned |= pinned(b.offset, b.len);
    }
    let plan = plan_slide(&layout)?;
    alloc.apply_relocation(&plan)?;
    Ok(plan)
}

/// Checks that `plan` moves exactly the units of `layout`, whose units are the live blocks `live`, and
/// returns `(old offset, relocated block)` ascending by new offset.
pub(crate) fn relocate_live(
    live: &[AllocatedBlock],
    layout: &CompactionLayout,
    plan: &CompactionPlan,
) -> Result<Vec<(u64, AllocatedBlock)>, AllocError> {
    let mut units: Vec<(u64, u64)> = layout.blocks.iter().map(|b| (b.offset, b.len)).collect();
    units.sort_unstable();
    check_plan_matches(&units, plan)?;
    let mut out = Vec::with_capacity(live.len());
    for b in live {
        let dst = plan.translate(b.offset).ok_or(AllocError::InvalidRelocation("live block not covered"))?;
        out.push((b.offset, AllocatedBlock { offset: dst, ..*b }));
    }
    out.sort_by_key(|x| x.1.offset);
    Ok(out)
}

/// `plan.moves` must list exactly the `(offset, len)` units (ascending).
pub(crate) fn check_plan_matches(units: &[(u64, u64)], plan: &CompactionPlan) -> Result<(), AllocError> {
    let same = units.len() == plan.moves.len()
        && units.iter().zip(&plan.moves).all(|(&(o, l), m)| o == m.src && l == m.len && m.dst.checked_add(l).is_some());
    if same {
        Ok(())
    } else {
        Err(AllocError::InvalidRelocation("plan does not match the allocator's units"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blk(offset: u64, len: u64, pinned: bool) -> CompactBlock {
        CompactBlock { id: offset, offset, len, align: 16, pinned }
    }

    #[test]
    fn slides_around_pinned_blocks_preserving_order() {
        let layout = CompactionLayout {
            blocks: vec![blk(32, 16, false), blk(96, 32, true), blk(160, 16, false), blk(0, 16, false)],
            regions: vec![Region::new(0, 256)],
        };
        let plan = plan_slide(&layout).unwrap();
        let dsts: Vec<(u64, u64)> = plan.moves.iter().map(|m| (m.src, m.dst)).collect();
        assert_eq!(dsts, vec![(0, 0), (32, 16), (96, 96), (160, 128)]);
        assert_eq!((plan.bytes_moved, plan.blocks_moved), (32, 2));
        assert_eq!(plan.translate(165), Some(133));
        assert_eq!(plan.translate(20), None);
    }

    #[test]
    fn toward_end_and_alignment() {
        let layout = CompactionLayout {
            blocks: vec![CompactBlock { id: 1, offset: 0, len: 10, align: 64, pinned: false }, blk(100, 20, false)],
            regions: vec![Region { start: 0, end: 256, toward_end: true }],
        };
        let plan = plan_slide(&layout).unwrap();
        assert_eq!(plan.moves[1].dst, 224);
        assert_eq!(plan.moves[0].dst, 192);
    }

    #[test]
    fn rejects_bad_layouts() {
        let overlap =
            CompactionLayout { blocks: vec![blk(0, 32, false), blk(16, 16, false)], regions: vec![Region::new(0, 64)] };
        assert!(plan_slide(&overlap).is_err());
        let outside = CompactionLayout { blocks: vec![blk(60, 32, false)], regions: vec![Region::new(0, 64)] };
        assert!(plan_slide(&outside).is_err());
        let overflow =
            CompactionLayout { blocks: vec![blk(u64::MAX - 1, 32, false)], regions: vec![Region::new(0, 64)] };
        assert!(plan_slide(&overflow).is_err());
    }
}
