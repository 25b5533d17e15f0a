//! The memory pool of every segment and event of a snapshot ([`crate::trace::MempoolId`]).
//!
//! PyTorch records a segment's pool as `segment_pool_id` (`SegmentInfo::owner_private_pool_id`,
//! `torch/csrc/cuda/memory_snapshot.cpp`), and since PR#177717 each trace entry's as `pool_id`
//! (`TraceEntry::mempool_`). Older files record pools of segments only, so an entry without its own is
//! given the pool of the segment that holds its address at that moment: a block lives in one segment and a
//! segment in one pool (`Block::pool`, `get_pool`), so this is exact whenever the segment is known. The
//! walk keeps the live segment ranges: the segments alive before the first event (their pools from the
//! final state), plus `segment_alloc` / `segment_map` (their pool: recorded, else the final state's
//! segment at that address, else the pool of the allocation they serve, the next `alloc`), minus
//! `segment_free`. A free takes the pool of its block's `alloc`. What no segment holds is in the default
//! pool.

use std::collections::BTreeMap;

use crate::trace::{DeviceTrace, EventKind, MempoolId};

/// Sets [`crate::trace::Event::mempool`] of every event and [`crate::trace::SegmentSeed::mempool`] of every
/// initial segment of `dev` (ids already linked), from `recorded`: `(event index, pool)` of the entries
/// that record their own pool, ascending by index.
pub(super) fn link(dev: &mut DeviceTrace, recorded: &[(usize, MempoolId)]) {
    // Final-state segments: start -> (end, pool).
    let fin: BTreeMap<u64, (u64, MempoolId)> = dev
        .final_state
        .iter()
        .flat_map(|f| f.segments.iter())
        .map(|s| (s.addr, (s.addr.saturating_add(s.size), s.mempool)))
        .collect();
    if recorded.is_empty() && fin.values().all(|v| !v.1.is_private()) {
        return; // Everything is in the default pool, index 0 (set by the reader).
    }
    let containing = |m: &BTreeMap<u64, (u64, u16)>, addr: u64| {
        m.range(..=addr).next_back().filter(|(_, v)| addr < v.0).map(|(_, v)| v.1)
    };
    let fin_pool = |addr: u64| fin.range(..=addr).next_back().filter(|(_, v)| addr < v.0).map(|(_, v)| v.1);
    let mut live: BTreeMap<u64, (u64, u16)> = BTreeMap::new();
    for k in 0..dev.initial_segments.len() {
        let s = &dev.initial_segments[k];
        let (addr, end) = (s.addr, s.addr.saturating_add(s.size));
        let m = fin_pool(addr).unwrap_or_default();
        let i = dev.mempool_index(m);
        dev.initial_segments[k].mempool = i;
        live.insert(addr, (end, i));
    }
    let own = |i: usize| recorded.binary_search_by_key(&i, |r| r.0).ok().map(|k| recorded[k].1);
    let mut block_pool: Vec<u16> = vec![0; dev.block_ids as usize];
    for i in 0..dev.events.len() {
        let e = dev.events[i];
        let pool = match e.kind {
            EventKind::SegmentAlloc | EventKind::SegmentMap => {
                let m = own(i)
                    .or_else(|| fin.get(&e.addr).map(|v| v.1))
                    .or_else(|| {
                        // The allocation this segment serves, recorded with its pool.
                        let next = dev.events[i + 1..].iter().position(|n| n.kind == EventKind::Alloc);
                        next.and_then(|j| own(i + 1 + j))
                    })
                    .unwrap_or_default();
                let p = dev.mempool_index(m);
                live.insert(e.addr, (e.addr.saturating_add(e.size), p));
                p
            }
            EventKind::SegmentFree | EventKind::SegmentUnmap => {
                let p = match own(i) {
                    Some(m) => dev.mempool_index(m),
                    None => containing(&live, e.addr).unwrap_or(0),
                };
                if e.kind == EventKind::SegmentFree {
                    live.remove(&e.addr);
                }
                p
            }
            EventKind::Alloc => {
                let p = match own(i) {
                    Some(m) => dev.mempool_index(m),
                    None => containing(&live, e.addr)
                        .or_else(|| fin_pool(e.addr).map(|m| dev.mempool_index(m)))
                        .unwrap_or(0),
                };
                if let Some(b) = block_pool.get_mut(e.id as usize) {
                    *b = p;
                }
                p
            }
            EventKind::FreeRequested | EventKind::Free => match own(i) {
                Some(m) => dev.mempool_index(m),
                None => block_pool
                    .get(e.id as usize)
                    .copied()
                    .filter(|&p| p != 0)
                    .or_else(|| containing(&live, e.addr))
                    .unwrap_or(0),
            },
            _ => own(i).map_or(0, |m| dev.mempool_index(m)),
        };
        dev.events[i].mempool = pool;
    }
}
