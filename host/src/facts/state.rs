//! The allocator state a trace records at one moment, rebuilt from the trace's own events (no model):
//! PyTorch's segments, its live blocks and the holes between them.
//!
//! * **Segments** are the snapshot's segments alive before the first event, plus `segment_alloc`,
//!   minus `segment_free` (by segment id). Expandable segments are the union of their mapped ranges:
//!   `segment_map` adds `[addr, addr + size)`, `segment_unmap` removes it, and each maximal mapped
//!   range is one segment; a range mapped twice (a seeded segment and its own `segment_map`) is
//!   counted once.
//! * **Live blocks** are the blocks alive before the first event plus `alloc`, minus `free_completed`
//!   (a block released by the user but still used by another stream stays allocated until then, as
//!   in PyTorch). A block's bytes are those the snapshot's final state records for it when it is
//!   still there at the end with the same requested size, else PyTorch's `round_size` (a multiple of
//!   512 B, `c10/cuda/CUDACachingAllocator.cpp`); a large-pool remainder of ≤ 1 MiB that PyTorch
//!   left unsplit is then counted as a hole.
//! * **Holes** are the bytes of a segment outside its live blocks: PyTorch's reserved but
//!   unallocated bytes, per segment, largest first.
//! * **Memory pools**: every segment is in one ([`crate::trace::MempoolId`]: the default pool, or a
//!   private pool of a CUDA graph, a `torch.cuda.MemPool`, a serving engine); [`HeapState::pools`] sums
//!   reserved, allocated and hole bytes per pool, since only requests of a pool can use its holes.
//!
//! Sums are taken in 128 bits and reported as `u64` only where they fit ([`StateError`] otherwise).

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::reference::caching;
use crate::trace::{BlockStatus, DeviceTrace, EventKind, MempoolId, Pool, SnapshotState};

/// A live block (a tensor's storage) at the moment. Bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[doc(hidden)]
pub struct SnapshotBlock {
    /// Device address.
    pub addr: u64,
    /// Block bytes (rounding included; see the module docs).
    pub size: u64,
    /// Requested bytes.
    pub requested: u64,
    /// CUDA stream.
    pub stream: i64,
    /// The `alloc` event that created it (`None`: alive before the first event).
    pub alloc_event: Option<usize>,
}

/// A free range inside a segment (bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[doc(hidden)]
pub struct Hole {
    /// Start address.
    pub addr: u64,
    /// Length.
    pub size: u64,
}

/// One segment at the moment, with its holes. Bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[doc(hidden)]
pub struct SegmentView {
    /// Start address.
    pub addr: u64,
    /// Reserved bytes (mapped bytes for an expandable segment).
    pub size: u64,
    /// `small` or `large` pool, `unknown` when not recorded.
    pub pool: &'static str,
    /// The memory pool it belongs to (serialised only when private).
    #[serde(skip_serializing_if = "is_default_pool")]
    pub mempool: MempoolId,
    /// An expandable segment (a maximal mapped range).
    pub expandable: bool,
    /// Bytes of live blocks in it.
    pub allocated: u64,
    /// Free ranges, largest first.
    pub holes: Vec<Hole>,
}

impl SegmentView {
    /// Sum of the holes.
    pub fn hole_bytes(&self) -> u64 {
        self.holes.iter().map(|h| h.size).sum()
    }
    /// Largest hole (0 when none).
    pub fn largest_hole(&self) -> u64 {
        self.holes.first().map_or(0, |h| h.size)
    }
}

fn is_default_pool(m: &MempoolId) -> bool {
    !m.is_private()
}

/// One memory pool at the moment (PyTorch's `PrivatePool`, or the default pool): what its segments
/// reserve and hold. Only requests made while the pool is active can use its holes, and ordinary
/// requests only the default pool's (`get_pool`, `c10/cuda/CUDACachingAllocator.cpp`). Bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
#[doc(hidden)]
pub struct PoolState {
    /// The memory pool.
    pub mempool: MempoolId,
    /// Its segments.
    pub segments: usize,
    /// Reserved bytes: the sum of its segments' sizes.
    pub reserved: u64,
    /// Bytes of live blocks in its segments.
    pub allocated: u64,
    /// Reserved but unallocated bytes: the sum of its holes.
    pub hole_bytes: u64,
    /// Its largest hole.
    pub largest_hole: u64,
}

impl PoolState {
    /// A pool without segments.
    pub fn empty(mempool: MempoolId) -> Self {
        PoolState { mempool, segments: 0, reserved: 0, allocated: 0, hole_bytes: 0, largest_hole: 0 }
    }
}

/// PyTorch's allocator state at one moment. Bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct HeapState {
    /// The state after this event (`None`: before the first event, or the final state of a snapshot
    /// without events).
    pub event: Option<usize>,
    /// Reserved bytes: the sum of segment sizes (PyTorch's `reserved_bytes`).
    pub reserved: u64,
    /// Bytes of live blocks (PyTorch's `allocated_bytes`).
    pub allocated: u64,
    /// Requested bytes of live blocks.
    pub requested: u64,
    /// `reserved − allocated` counted inside segments: the sum of all holes.
    pub hole_bytes: u64,
    /// Largest hole over all segments.
    pub largest_hole: u64,
    /// Segments by address.
    pub segments: Vec<SegmentView>,
    /// Live blocks, largest requested size first.
    pub live: Vec<SnapshotBlock>,
    /// Per memory pool, the default pool first, then private pools in ascending id (one entry per pool
    /// that has segments; the default pool always).
    pub pools: Vec<PoolState>,
}

impl HeapState {
    /// The state of memory pool `mempool` (zeros when it has no segment).
    #[doc(hidden)]
    pub fn pool(&self, mempool: MempoolId) -> PoolState {
        self.pools.iter().find(|p| p.mempool == mempool).cloned().unwrap_or_else(|| PoolState::empty(mempool))
    }

    /// Reserved but unallocated bytes of the private pools: cached memory no ordinary request can use.
    #[doc(hidden)]
    pub fn private_hole_bytes(&self) -> u64 {
        self.pools.iter().filter(|p| p.mempool.is_private()).map(|p| p.hole_bytes).sum()
    }
}

/// A sum that does not fit in 64 bits (possible only with corrupt or hostile sizes).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("event {event:?}: {what} exceed 2^64 - 1 bytes")]
#[non_exhaustive]
#[doc(hidden)]
pub struct StateError {
    /// The event after which the sum overflowed (`None`: the initial state).
    pub event: Option<usize>,
    /// Which sum: "reserved bytes", "allocated bytes".
    pub what: &'static str,
}

fn pool_name(p: Pool) -> &'static str {
    match p {
        Pool::Small => "small",
        Pool::Large => "large",
        Pool::Unknown => "unknown",
    }
}

fn to_u64(v: u128, event: Option<usize>, what: &'static str) -> Result<u64, StateError> {
    u64::try_from(v).map_err(|_| StateError { event, what })
}

/// Adds `[start, end)` to a set of disjoint ranges (`start → end`), merging neighbours.
pub(crate) fn map_range(set: &mut BTreeMap<u64, u64>, mut start: u64, mut end: u64) {
    let touching: Vec<(u64, u64)> =
        set.range(..=end).rev().take_while(|&(_, &e)| e >= start).map(|(&s, &e)| (s, e)).collect();
    for (s, e) in touching {
        set.remove(&s);
        start = start.min(s);
        end = end.max(e);
    }
    if end > start {
        set.insert(start, end);
    }
}

/// Removes `[start, end)` from a set of disjoint ranges.
pub(crate) fn unmap_range(set: &mut BTreeMap<u64, u64>, start: u64, end: u64) {
    let hit: Vec<(u64, u64)> = set.range(..end).rev().take_while(|&(_, &e)| e > start).map(|(&s, &e)| (s, e)).collect();
    for (s, e) in hit {
        set.remove(&s);
        if s < start {
            set.insert(s, start);
        }
        if e > end {
            set.insert(end, e);
        }
    }
}

/// The state of `dev` after event `after` (`None`: before the first event). O(events + blocks log
/// blocks).
///
/// # Errors
/// [`StateError`] when reserved or allocated bytes exceed 2^64 − 1.
#[doc(hidden)]
pub fn state_after(dev: &DeviceTrace, after: Option<usize>) -> Result<HeapState, StateError> {
    // Segment id → (addr, size, pool, memory pool); expandable ranges apart (their memory pool by start).
    let mut segs: HashMap<u32, (u64, u64, Pool, MempoolId)> = HashMap::new();
    let mut mapped: BTreeMap<u64, u64> = BTreeMap::new();
    let mut mapped_pool: HashMap<u64, MempoolId> = HashMap::new();
    for s in &dev.initial_segments {
        if s.is_expandable {
            map_range(&mut mapped, s.addr, s.addr.saturating_add(s.size));
            mapped_pool.insert(s.addr, dev.mempool(s.mempool));
        } else {
            segs.insert(s.id, (s.addr, s.size, s.pool, dev.mempool(s.mempool)));
        }
    }
    let mut blocks: HashMap<u32, SnapshotBlock> = HashMap::with_capacity(dev.initial_blocks.len());
    for b in &dev.initial_blocks {
        let lb = SnapshotBlock { addr: b.addr, size: 0, requested: b.size, stream: b.stream, alloc_event: None };
        blocks.insert(b.id, lb);
    }
    let end = after.map_or(0, |a| a.saturating_add(1).min(dev.events.len()));
    for (i, e) in dev.events[..end].iter().enumerate() {
        match e.kind {
            EventKind::Alloc => {
                let lb =
                    SnapshotBlock { addr: e.addr, size: 0, requested: e.size, stream: e.stream, alloc_event: Some(i) };
                blocks.insert(e.id, lb);
            }
            EventKind::Free => {
                blocks.remove(&e.id);
            }
            EventKind::SegmentAlloc => {
                segs.insert(e.id, (e.addr, e.size, Pool::Unknown, dev.mempool(e.mempool)));
            }
            EventKind::SegmentFree => {
                segs.remove(&e.id);
            }
            EventKind::SegmentMap => {
                map_range(&mut mapped, e.addr, e.addr.saturating_add(e.size));
                mapped_pool.insert(e.addr, dev.mempool(e.mempool));
            }
            EventKind::SegmentUnmap => unmap_range(&mut mapped, e.addr, e.addr.saturating_add(e.size)),
            _ => {}
        }
    }
    // Block sizes and pools from the final state where it still has the block.
    let fin: HashMap<u64, (u64, u64)> = dev
        .final_state
        .iter()
        .flat_map(|f| f.blocks())
        .filter(|b| b.state != BlockStatus::Inactive)
        .map(|b| (b.addr, (b.size, b.requested_size)))
        .collect();
    let fin_pool: HashMap<u64, Pool> =
        dev.final_state.iter().flat_map(|f| f.segments.iter()).map(|s| (s.addr, s.pool)).collect();
    let mut live: Vec<SnapshotBlock> = blocks.into_values().collect();
    for b in &mut live {
        b.size = match fin.get(&b.addr) {
            Some(&(size, req)) if req == b.requested || req == 0 => size,
            _ => caching::round_size(b.requested).unwrap_or(b.requested),
        };
    }
    let mut views: Vec<View> = segs
        .into_values()
        .map(|(a, s, p, m)| {
            (a, s, if p == Pool::Unknown { fin_pool.get(&a).copied().unwrap_or(p) } else { p }, m, false)
        })
        .collect();
    // A mapped range takes the memory pool of the mapping that starts at or before it (one reservation
    // belongs to one pool).
    let mut starts: Vec<(u64, MempoolId)> = mapped_pool.into_iter().collect();
    starts.sort_unstable();
    views.extend(mapped.iter().map(|(&s, &e)| {
        let k = starts.partition_point(|x| x.0 <= s);
        let m = k.checked_sub(1).map_or(MempoolId::DEFAULT, |k| starts[k].1);
        (s, e - s, fin_pool.get(&s).copied().unwrap_or(Pool::Unknown), m, true)
    }));
    build(after, views, live)
}

/// The state a snapshot records at its end (`segments`), exact block sizes included.
///
/// # Errors
/// [`StateError`] when reserved or allocated bytes exceed 2^64 − 1.
pub fn final_state(state: &SnapshotState, event: Option<usize>) -> Result<HeapState, StateError> {
    let mut views = Vec::with_capacity(state.segments.len());
    let mut live = Vec::new();
    for s in &state.segments {
        views.push((s.addr, s.size, s.pool, s.mempool, s.is_expandable));
        live.extend(s.blocks.iter().filter(|b| b.state != BlockStatus::Inactive).map(|b| SnapshotBlock {
            addr: b.addr,
            size: b.size,
            requested: b.requested_size,
            stream: s.stream,
            alloc_event: None,
        }));
    }
    build(event, views, live)
}

/// A segment to build a [`SegmentView`] of: (address, size, pool, memory pool, expandable).
type View = (u64, u64, Pool, MempoolId, bool);

fn build(event: Option<usize>, mut views: Vec<View>, mut live: Vec<SnapshotBlock>) -> Result<HeapState, StateError> {
    views.sort_unstable_by_key(|v| v.0);
    live.sort_unstable_by_key(|b| b.addr);
    let reserved = to_u64(views.iter().map(|v| v.1 as u128).sum(), event, "reserved bytes")?;
    let allocated = to_u64(live.iter().map(|b| b.size as u128).sum(), event, "allocated bytes")?;
    let requested = to_u64(live.iter().map(|b| b.requested as u128).sum(), event, "requested bytes")?;
    let mut segments = Vec::with_capacity(views.len());
    let mut k = 0;
    for (addr, size, pool, mempool, expandable) in views {
        let end = addr.saturating_add(size);
        while k < live.len() && live[k].addr < addr {
            k += 1;
        }
        let (mut cursor, mut in_use, mut holes) = (addr, 0u64, Vec::new());
        while k < live.len() && live[k].addr < end {
            let b = &live[k];
            if b.addr > cursor {
                holes.push(Hole { addr: cursor, size: b.addr - cursor });
            }
            let b_end = b.addr.saturating_add(b.size).min(end);
            in_use = in_use.saturating_add(b_end - b.addr);
            cursor = cursor.max(b_end);
            k += 1;
        }
        if end > cursor {
            holes.push(Hole { addr: cursor, size: end - cursor });
        }
        holes.sort_unstable_by(|a, b| b.size.cmp(&a.size).then(a.addr.cmp(&b.addr)));
        segments.push(SegmentView { addr, size, pool: pool_name(pool), mempool, expandable, allocated: in_use, holes });
    }
    let mut pools: Vec<PoolState> = Vec::new();
    for s in &segments {
        let k = match pools.iter().position(|p| p.mempool == s.mempool) {
            Some(k) => k,
            None => {
                pools.push(PoolState::empty(s.mempool));
                pools.len() - 1
            }
        };
        let p = &mut pools[k];
        p.segments += 1;
        p.reserved = p.reserved.saturating_add(s.size);
        p.allocated = p.allocated.saturating_add(s.allocated);
        p.hole_bytes = p.hole_bytes.saturating_add(s.hole_bytes());
        p.largest_hole = p.largest_hole.max(s.largest_hole());
    }
    if !pools.iter().any(|p| p.mempool == MempoolId::DEFAULT) {
        pools.push(PoolState::empty(MempoolId::DEFAULT));
    }
    pools.sort_unstable_by_key(|p| (p.mempool.is_private(), p.mempool));
    let hole_bytes = to_u64(segments.iter().map(|s| s.hole_bytes() as u128).sum(), event, "reserved bytes")?;
    let largest_hole = segments.iter().map(SegmentView::largest_hole).max().unwrap_or(0);
    live.sort_unstable_by(|a, b| b.requested.cmp(&a.requested).then(a.addr.cmp(&b.addr)));
    Ok(HeapState { event, reserved, allocated, requested, hole_bytes, largest_hole, segments, live, pools })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_and_split() {
        let mut s = BTreeMap::new();
        map_range(&mut s, 0, 10);
        map_range(&mut s, 10, 20);
        map_range(&mut s, 5, 15);
        assert_eq!(s.iter().map(|(&a, &b)| (a, b)).collect::<Vec<_>>(), vec![(0, 20)]);
        unmap_range(&mut s, 4, 8);
        assert_eq!(s.iter().map(|(&a, &b)| (a, b)).collect::<Vec<_>>(), vec![(0, 4), (8, 20)]);
        unmap_range(&mut s, 0, 30);
        assert!(s.is_empty());
    }
}
