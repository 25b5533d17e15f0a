//! The compaction oracle of the kernels: the host reference of the sliding compaction, as the kernels' layouts
//! see it.
//!
//! The single source of truth for the layout a compaction must produce is
//! [`crate::reference::compact::plan_slide`] (the reference-allocator
//! oracle: per-unit alignment, regions, pinned units). This module only
//! converts a kernel layout ([`LiveBlock`]s: 16-byte granules, a pinned flag,
//! one region starting at offset 0) into its input ([`slide_layout`]) and its
//! plan back into new offsets ([`plan`]); it adds what the oracle does not
//! have: the kernels' input rules ([`validate`]) and the byte-level executor
//! ([`apply`], a sequential ascending `memmove` per block).

use gpuheap_kernels::compact::{LiveBlock, GRANULE};

use super::CompactionError;
use crate::reference::compact::{plan_slide, CompactBlock, CompactionLayout, CompactionPlan, Region};

/// Checks that `layout` is a valid compaction input for a region of
/// `capacity` bytes: sorted by offset, disjoint, inside the region, offsets
/// and sizes multiples of [`GRANULE`], sizes nonzero.
///
/// # Errors
/// [`CompactionError::InvalidLayout`] naming the first offending block.
pub fn validate(layout: &[LiveBlock], capacity: u64) -> Result<(), CompactionError> {
    let mut end = 0u64;
    for (i, b) in layout.iter().enumerate() {
        let bad = |why: &str| Err(CompactionError::InvalidLayout(format!("block {i} ({b:?}): {why}")));
        if b.size == 0 {
            return bad("zero size");
        }
        if !b.offset.is_multiple_of(GRANULE) || !b.size.is_multiple_of(GRANULE) {
            return bad("offset or size not a multiple of 16");
        }
        if b.offset < end {
            return bad("overlaps or precedes the previous block");
        }
        end = match b.offset.checked_add(b.size) {
            Some(e) if e <= capacity => e,
            _ => return bad("ends past the region"),
        };
    }
    Ok(())
}

/// The oracle's input for `layout`: one [`CompactBlock`] per block (`id` =
/// its index in `layout`, 16-byte alignment, its pinned flag) in one region
/// `[0, region_end)` (`region_end` is raised to the end of the last block
/// when smaller, so any valid layout fits).
pub fn slide_layout(layout: &[LiveBlock], region_end: u64) -> CompactionLayout {
    let end = layout.iter().map(|b| b.offset.saturating_add(b.size)).max().unwrap_or(0).max(region_end);
    CompactionLayout {
        blocks: layout
            .iter()
            .enumerate()
            .map(|(i, b)| CompactBlock {
                id: i as u64,
                offset: b.offset,
                len: b.size,
                align: GRANULE,
                pinned: b.pinned(),
            })
            .collect(),
        regions: vec![Region::new(0, end)],
    }
}

/// [`plan_slide`] of `layout` (see [`slide_layout`]).
///
/// # Errors
/// Those of [`plan_slide`] (overlapping, empty or overflowing blocks), as
/// [`CompactionError::InvalidLayout`].
pub fn slide_plan(layout: &[LiveBlock]) -> Result<CompactionPlan, CompactionError> {
    plan_slide(&slide_layout(layout, 0)).map_err(|e| CompactionError::InvalidLayout(e.to_string()))
}

/// The new offset of every block of `layout` (sorted by offset) after a
/// sliding compaction, as [`plan_slide`] computes it: unpinned blocks slide,
/// in order, to the start of their segment (the region start or the end of
/// the previous pinned block); pinned blocks stay.
///
/// # Errors
/// [`CompactionError`] when `layout` is not a valid layout (see [`validate`]):
/// overlapping, empty or overflowing blocks.
pub fn plan(layout: &[LiveBlock]) -> Result<Vec<u64>, CompactionError> {
    let p = slide_plan(layout)?;
    let mut out = vec![0u64; layout.len()];
    for m in &p.moves {
        out[m.id as usize] = m.dst;
    }
    Ok(out)
}

/// `true` when compacting `layout` moves nothing (no hole before any unpinned
/// block inside its segment). `false` for an invalid layout ([`validate`]).
pub fn is_packed(layout: &[LiveBlock]) -> bool {
    plan(layout).is_ok_and(|p| p.iter().zip(layout).all(|(&d, b)| d == b.offset))
}

/// Applies `new_offsets` to a host image of the region: a sequential
/// `memmove` per block in address order (correct because every block moves
/// down and the order is kept).
///
/// # Panics
/// When a block or its destination lies outside `image`.
pub fn apply(image: &mut [u8], layout: &[LiveBlock], new_offsets: &[u64]) {
    for (b, &d) in layout.iter().zip(new_offsets) {
        if d != b.offset {
            let s = b.offset as usize;
            image.copy_within(s..s + b.size as usize, d as usize);
        }
    }
}

/// Bytes that change address, and the number of blocks that move.
pub fn moved(layout: &[LiveBlock], new_offsets: &[u64]) -> (u64, u64) {
    layout
        .iter()
        .zip(new_offsets)
        .filter(|(b, &d)| d != b.offset)
        .fold((0, 0), |(bytes, n), (b, _)| (bytes + b.size, n + 1))
}

/// Free ranges `(offset, len)` of a region of `capacity` bytes holding
/// `layout` (at new offsets `offsets`, or the layout's own when `None`).
pub fn free_ranges(layout: &[LiveBlock], offsets: Option<&[u64]>, capacity: u64) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> =
        layout.iter().enumerate().map(|(i, b)| (offsets.map_or(b.offset, |o| o[i]), b.size)).collect();
    v.sort_unstable();
    let mut out = Vec::new();
    let mut end = 0;
    for (o, s) in v {
        if o > end {
            out.push((end, o - end));
        }
        end = end.max(o + s);
    }
    if capacity > end {
        out.push((end, capacity - end));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuheap_kernels::compact::BLOCK_PINNED;

    fn b(offset: u64, size: u64, pinned: bool) -> LiveBlock {
        LiveBlock { offset, size, handle: 0, flags: if pinned { BLOCK_PINNED } else { 0 } }
    }

    #[test]
    fn plan_restarts_at_pinned_blocks() {
        let l = [b(32, 16, false), b(64, 32, false), b(128, 16, true), b(176, 16, false), b(224, 32, false)];
        assert_eq!(plan(&l).unwrap(), vec![0, 16, 128, 144, 160]);
        assert!(!is_packed(&l));
        assert!(is_packed(&[b(0, 16, false), b(16, 16, false), b(64, 16, true), b(80, 16, false)]));
    }

    #[test]
    fn apply_is_a_sequential_memmove() {
        let mut img: Vec<u8> = (0..64).collect();
        let l = [b(16, 32, false)];
        apply(&mut img, &l, &plan(&l).unwrap());
        assert_eq!(&img[..32], &(16..48).collect::<Vec<u8>>()[..]);
        assert_eq!(free_ranges(&l, Some(&[0]), 64), vec![(32, 32)]);
        assert_eq!(free_ranges(&l, None, 64), vec![(0, 16), (48, 16)]);
    }

    #[test]
    fn validate_rejects_bad_layouts() {
        assert!(validate(&[b(0, 16, false), b(8, 16, false)], 64).is_err());
        assert!(validate(&[b(16, 16, false), b(0, 16, false)], 64).is_err());
        assert!(validate(&[b(48, 32, false)], 64).is_err());
        assert!(validate(&[b(0, 0, false)], 64).is_err());
        assert!(validate(&[b(0, 16, false), b(16, 48, true)], 64).is_ok());
    }
}
