//! What a PyTorch snapshot records of the allocator's configuration and of its expandable segments:
//! the settings ([`AllocatorSettings`]) and the mapped ranges alive before the first event.

use crate::trace::{DeviceTrace, EventKind, Pool, SegmentSeed, NO_ID};

/// PyTorch caching-allocator settings recorded in a snapshot (`allocator_settings`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AllocatorSettings {
    /// `PYTORCH_CUDA_ALLOC_CONF` as set ("" when unset).
    pub alloc_conf: Option<String>,
    /// `max_split_size` in bytes; -1 = unlimited.
    pub max_split_size: Option<i64>,
    /// `garbage_collection_threshold` (fraction of memory, 0 = off).
    pub garbage_collection_threshold: Option<f64>,
    /// `expandable_segments`.
    pub expandable_segments: Option<bool>,
    /// `roundup_power2_divisions` as (interval start in MiB, divisions) pairs.
    pub roundup_power2_divisions: Vec<(u64, u64)>,
    /// Every other scalar setting, as `(key, value rendered as text)`.
    pub other: Vec<(String, String)>,
}

/// The mapped ranges of expandable segments before the first event of `trace`, one [`SegmentSeed`]
/// (with `is_expandable`, id unset) per maximal contiguous range: the final state's expandable segments
/// (each a contiguous mapped range, as PyTorch's `snapshot()` lists them), walked back through the
/// events — a `segment_map` was not mapped before it, a `segment_unmap` was. So reserved bytes are
/// counted once: initial ranges + maps − unmaps = the final state (a snapshot whose segments were
/// all mapped during the trace starts at 0). Ranges met only in `segment_unmap` events take the pool
/// of the nearest known range of their stream ([`guess_expandable_pool`]).
#[doc(hidden)]
pub fn expandable_initial_ranges(trace: &DeviceTrace) -> Vec<SegmentSeed> {
    // (stream, start, end, pool), disjoint, kept sorted by (stream, start).
    let mut m: Vec<(i64, u64, u64, Pool)> = Vec::new();
    let mut known: Vec<(i64, u64, Pool)> = Vec::new();
    if let Some(fin) = &trace.final_state {
        for s in fin.segments.iter().filter(|s| s.is_expandable) {
            m.push((s.stream, s.addr, s.addr.saturating_add(s.size), s.pool));
            known.push((s.stream, s.addr, s.pool));
        }
    }
    for e in trace.events.iter().rev() {
        let end = e.addr.saturating_add(e.size);
        match e.kind {
            EventKind::SegmentMap => {
                let mut out = Vec::with_capacity(m.len() + 1);
                for &(st, a, b, p) in &m {
                    if st != e.stream || b <= e.addr || a >= end {
                        out.push((st, a, b, p));
                        continue;
                    }
                    if a < e.addr {
                        out.push((st, a, e.addr, p));
                    }
                    if b > end {
                        out.push((st, end, b, p));
                    }
                }
                m = out;
            }
            EventKind::SegmentUnmap => {
                let pool = guess_expandable_pool(&known, e.stream, e.addr, e.size);
                known.push((e.stream, e.addr, pool));
                m.retain(|&(st, a, b, _)| st != e.stream || b <= e.addr || a >= end);
                m.push((e.stream, e.addr, end, pool));
            }
            _ => {}
        }
    }
    m.sort_unstable_by_key(|r| (r.0, r.1));
    let mut merged: Vec<(i64, u64, u64, Pool)> = Vec::with_capacity(m.len());
    for r in m {
        match merged.last_mut() {
            Some(l) if l.0 == r.0 && l.2 == r.1 && l.3 == r.3 => l.2 = r.2,
            _ => merged.push(r),
        }
    }
    merged
        .into_iter()
        .map(|(stream, a, b, pool)| SegmentSeed {
            id: NO_ID,
            addr: a,
            size: b - a,
            stream,
            pool,
            mempool: 0,
            is_expandable: true,
        })
        .collect()
}

/// The pool of an expandable range at `addr` of `size` bytes on `stream`: the pool of the nearest
/// range of `known` (`(stream, address, pool)`) on the same stream; with none, large if `size` is a
/// multiple of the large page (20 MiB), else small. (Each pool's ranges lie in one virtual reservation,
/// far from the other pool's.)
#[doc(hidden)]
pub fn guess_expandable_pool(known: &[(i64, u64, Pool)], stream: i64, addr: u64, size: u64) -> Pool {
    known
        .iter()
        .filter(|k| k.0 == stream && k.2 != Pool::Unknown)
        .min_by_key(|k| k.1.abs_diff(addr))
        .map(|k| k.2)
        .unwrap_or(if size.is_multiple_of(20 << 20) { Pool::Large } else { Pool::Small })
}
