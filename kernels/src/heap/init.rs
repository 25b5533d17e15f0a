//! The initial state of a heap: every unit free, in maximal buddy blocks.
//!
//! Run on the host over a [`super::layout::InitImage`] (whose bytes are then
//! uploaded) and in the model-checking tests; a fresh heap and a `reset()`
//! heap are this state exactly. Everything not written here is zero: no page
//! is formatted, no tag is set, all counters are 0.
//!
//! `free_runs` is also the rebuild step after a compaction: given the unit
//! ranges that are *not* live, it recreates a valid buddy state over them.

use super::buddy;
use super::layout::{HeapMem, MetaSection, CTRL_LEVELS, CTRL_MAGIC, MAGIC};
use crate::arch::atomic::Ordering;

/// Writes the control block (magic, buddy level table) and sets all of
/// `[0, units)` free. Expects zeroed metadata.
pub(crate) fn init<M: HeapMem>(m: &M) {
    write_ctrl(m);
    let units = m.geom().units;
    free_runs(m, core::iter::once((0, units)));
}

/// Writes the magic and the buddy level table (for the host's decoding;
/// device code reads the geometry from the handle) into the control block.
pub(crate) fn write_ctrl<M: HeapMem>(m: &M) {
    let g = *m.geom();
    m.word(MetaSection::Ctrl, CTRL_MAGIC as u64).store(MAGIC, Ordering::Relaxed);
    for k in 0..=g.max_order as u32 {
        m.word(MetaSection::Ctrl, CTRL_LEVELS as u64 + k as u64).store(g.level_offset(k), Ordering::Relaxed);
    }
}

/// Sets every unit range `[start, end)` free, each decomposed greedily into
/// maximal aligned power-of-two blocks. Greedy maximal blocks never leave two
/// free buddies unmerged (the left one of such a pair would have been taken
/// one order larger), so the result is a valid buddy state as long as the
/// ranges are disjoint and everything outside them is live or a slab page.
/// Expects the buddy levels to be zero over these ranges.
pub(crate) fn free_runs<M: HeapMem>(m: &M, runs: impl Iterator<Item = (u64, u64)>) {
    let g = *m.geom();
    for (start, end) in runs {
        let mut u = start;
        let end = end.min(g.units);
        while u < end {
            let mut k = g.max_order as u32;
            while k > 0 && (u % (1 << k) != 0 || u + (1 << k) > end) {
                k -= 1;
            }
            buddy::level(m, k).set(m, (u >> k) as u32);
            u += 1 << k;
        }
    }
}
