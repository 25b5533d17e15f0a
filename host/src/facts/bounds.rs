//! Which requests an allocator state would have served, per memory pool: the "fits / fails for
//! fragmentation / fails for capacity" bounds of a state without a recorded failure, and the free extents a
//! failed request could have used.
//!
//! A request is served from its own pool only (`get_pool`, `c10/cuda/CUDACachingAllocator.cpp`): an
//! ordinary request from the default pool's cached blocks, one made while a private pool is active (a CUDA
//! graph capture, `torch.cuda.use_mem_pool`) from that pool's; both from the device's free memory through a
//! new segment. So the holes of the other pools are no free memory for it, and PyTorch's own OOM message
//! reports private-pool memory separately for that reason (pytorch/pytorch#121932, PR#124673).

use serde::Serialize;

use super::state::{HeapState, SegmentView};
use crate::reference::caching::{CachingConfig, MIN_BLOCK, MIN_LARGE_ALLOC, SMALL_BUFFER, SMALL_SIZE};
use crate::trace::MempoolId;

fn is_default_pool(m: &MempoolId) -> bool {
    !m.is_private()
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// For a state without a recorded failure: which requests of one memory pool it would have served, at
/// a capacity and under allocator settings. Bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
#[doc(hidden)]
pub struct RequestBounds {
    /// The capacity assumed.
    pub capacity: u64,
    /// The bytes a new segment may take: `capacity − reserved`, or with `per_process_memory_fraction`
    /// `fraction × capacity − reserved` when that is less (0 when reserved exceeds it).
    pub device_free: u64,
    /// Every request of 1 B up to this size is served, by PyTorch's rules under the settings
    /// (`served_up_to`: from a hole its rounded size may use, or from new device memory, after the
    /// release of [`RequestBounds::released_before_failure`] where it takes that).
    pub fits_up_to: u64,
    /// The small pool's bound (requests of at most 1 MiB, `kSmallSize`): every request of 1 B up to this
    /// size is served (at most 1 MiB).
    pub small_pool_up_to: u64,
    /// The large pool's bound: every request above 1 MiB up to this size is served; 0 when the smallest
    /// of them is not. It can exceed [`RequestBounds::fits_up_to`], which stops at the small pool's.
    pub large_pool_up_to: u64,
    /// Bytes of the default pool's cached segments that are entirely free (one free block, not
    /// expandable): what PyTorch's `malloc` releases (`release_available_cached_blocks`, then
    /// `release_cached_blocks`) before it raises out-of-memory, so new segments may use them too.
    pub released_before_failure: u64,
    /// How many such segments.
    pub released_segments: usize,
    /// Requests above `fits_up_to` and up to this size may fail although the bytes are there (in pieces,
    /// or fewer than the segment PyTorch asks the driver for): `device_free + the pool's holes`; larger
    /// ones fail for capacity.
    pub fragmentation_up_to: u64,
    /// The memory pool of the requests (the default pool: ordinary requests; serialised when private).
    #[serde(skip_serializing_if = "is_default_pool")]
    pub mempool: MempoolId,
    /// Reserved but unallocated bytes of the other pools, which these requests cannot use and the bounds
    /// leave out (serialised when not 0).
    #[serde(skip_serializing_if = "is_zero")]
    pub other_pools_hole_bytes: u64,
}

/// The [`RequestBounds`] of requests of `mempool` in the state `st` under the settings `cfg` (its
/// `device_capacity` is the capacity assumed).
#[doc(hidden)]
pub fn request_bounds(st: &HeapState, cfg: &CachingConfig, mempool: MempoolId) -> RequestBounds {
    let capacity = cfg.device_capacity;
    let limit = capacity.min(cfg.allowed_memory_maximum());
    let device_free = limit.saturating_sub(st.reserved);
    // `DeviceCachingAllocator::malloc` (c10/cuda/CUDACachingAllocator.cpp): get_free_block, then
    // alloc_block; failing that, release_available_cached_blocks (oversize blocks, with max_split_size)
    // and release_cached_blocks (every cached block that is a whole segment, `release_blocks` skips split
    // ones) of the default pool, then alloc_block again. Whole free segments are what both release.
    let whole_free: Vec<u64> = st
        .segments
        .iter()
        .filter(|s| {
            !s.mempool.is_private()
                && !s.expandable
                && s.allocated == 0
                && s.holes.len() == 1
                && s.holes[0].size == s.size
        })
        .map(|s| s.size)
        .collect();
    let released: u64 = whole_free.iter().sum();
    let free_after_release = limit.saturating_sub(st.reserved.saturating_sub(released));
    let pool = st.pool(mempool);
    let holes = |small: bool| {
        st.segments
            .iter()
            .filter(move |s| s.mempool == mempool && is_small_segment(s) == small)
            .flat_map(|s| s.holes.iter().map(|h| h.size))
    };
    let small_hole = holes(true).max().unwrap_or(0);
    let large_holes: Vec<u64> = holes(false).collect();
    let served = served_intervals(cfg, free_after_release, small_hole, &large_holes);
    let small_pool_up_to = request_below(cfg, first_unserved(&served, MIN_BLOCK)).min(SMALL_SIZE);
    let large_start = cfg.round_size(SMALL_SIZE + 1).unwrap_or(SMALL_SIZE + MIN_BLOCK);
    let large_first_unserved = first_unserved(&served, large_start);
    let large_pool_up_to =
        if large_first_unserved == large_start { 0 } else { request_below(cfg, large_first_unserved) };
    RequestBounds {
        capacity,
        device_free,
        fits_up_to: served_up_to(cfg, free_after_release, small_hole, &large_holes),
        small_pool_up_to,
        large_pool_up_to,
        released_before_failure: released,
        released_segments: whole_free.len(),
        fragmentation_up_to: device_free.saturating_add(pool.hole_bytes),
        mempool,
        other_pools_hole_bytes: st.hole_bytes.saturating_sub(pool.hole_bytes),
    }
}

/// The holes a request of `mempool` could use in the state `st` (the sizes of its pool's holes).
#[doc(hidden)]
pub fn usable_holes(st: &HeapState, mempool: MempoolId) -> Vec<u64> {
    st.segments.iter().filter(|s| s.mempool == mempool).flat_map(|s| s.holes.iter().map(|h| h.size)).collect()
}

/// A segment of the small pool: recorded as one, or, where the snapshot does not say, of at most 2 MiB (as
/// the caching model seeds it).
fn is_small_segment(s: &SegmentView) -> bool {
    s.pool == "small" || s.pool == "unknown" && s.size <= SMALL_BUFFER
}

/// The largest `x` such that every request of 1 B to `x` is served under the settings `cfg`, given the
/// bytes new memory may take (`device_free`), the largest hole of the request pool's small-pool segments
/// and the holes of its large-pool segments. The rules (`c10/cuda/CUDACachingAllocator.cpp`):
///
/// - A request is rounded first (`round_size`: 512 B blocks, or `roundup_power2_divisions`;
///   [`CachingConfig::round_size`]) and served by its rounded size `r`, from the pool `get_pool` picks:
///   the small pool up to 1 MiB (`kSmallSize`), else the large pool.
/// - From a cached block (`get_free_block`): any small-pool hole of at least `r`; a large-pool hole `h ≥ r`
///   that is below `max_split_size` when `r` is, or else less than `r + max_non_split_rounding`.
/// - From new memory (`alloc_block`, `get_allocation_size`): a 2 MiB segment (`kSmallBuffer`) for the
///   small pool; for the large pool 20 MiB (`kLargeBuffer`) below 10 MiB (`kMinLargeAlloc`), else `r`
///   rounded up to 2 MiB (`kRoundLarge`). With `expandable_segments`, pages of 2 MiB (small) or 20 MiB
///   (large) mapped for `r` (`ExpandableSegment::map`), here counted whole: a free tail of an expandable
///   segment that would also serve is left out, so the bound is a lower one there.
///
/// What PyTorch releases after a first failure (`release_cached_blocks`) is counted by the caller in
/// `device_free` ([`request_bounds`]). The free bytes alone are no bound: with 15 MiB free and no hole, a
/// 2 MiB request fails (it needs 20 MiB) while a 12 MiB one fits.
pub fn served_up_to(cfg: &CachingConfig, device_free: u64, small_hole: u64, large_holes: &[u64]) -> u64 {
    let served = served_intervals(cfg, device_free, small_hole, large_holes);
    request_below(cfg, first_unserved(&served, MIN_BLOCK))
}

/// The rounded sizes served (closed intervals of 512 B multiples, sorted) under the rules of [`served_up_to`].
fn served_intervals(cfg: &CachingConfig, device_free: u64, small_hole: u64, large_holes: &[u64]) -> Vec<(u64, u64)> {
    let blocks = |b: u64| b - b % MIN_BLOCK;
    let max_split = cfg.max_split_size;
    // The rounded sizes served, as closed intervals of 512 B multiples.
    let mut served: Vec<(u64, u64)> = Vec::with_capacity(large_holes.len() + 4);
    let mut add = |lo: u64, hi: u64| {
        if lo <= hi {
            served.push((lo, hi));
        }
    };
    add(MIN_BLOCK, blocks(small_hole).min(SMALL_SIZE));
    let large = SMALL_SIZE + MIN_BLOCK;
    let below_split = large_holes.iter().copied().filter(|&h| h < max_split).max().unwrap_or(0);
    add(large, blocks(below_split).min(max_split.saturating_sub(1)));
    for &h in large_holes.iter().filter(|&&h| h >= max_split) {
        // `r ≥ max_split_size` with `r ≤ h < r + max_non_split_rounding`.
        let lo = max_split.max(h.saturating_sub(cfg.max_non_split_rounding).saturating_add(1));
        add(lo.div_ceil(MIN_BLOCK).saturating_mul(MIN_BLOCK), blocks(h));
    }
    // New memory ([`CachingConfig::new_memory`]) grows with `r` within each of these ranges (a segment of
    // 2 MiB; of 20 MiB below 10 MiB, else `r` rounded up to 2 MiB; or whole pages when expandable), so
    // the sizes it serves are a prefix of each.
    let fits_new = |r: u64| cfg.new_memory(r).is_some_and(|m| m <= device_free);
    let top = blocks(device_free);
    for (lo, hi) in [(MIN_BLOCK, SMALL_SIZE), (large, MIN_LARGE_ALLOC - MIN_BLOCK), (MIN_LARGE_ALLOC, top)] {
        if lo <= hi.min(top) && fits_new(lo) {
            add(lo, last_where(lo, hi.min(top), MIN_BLOCK, fits_new));
        }
    }
    served.sort_unstable();
    served
}

/// The first rounded size at or above `start` that the sorted intervals `served` leave out.
fn first_unserved(served: &[(u64, u64)], start: u64) -> u64 {
    let mut first = start;
    for &(lo, hi) in served {
        if lo > first {
            break;
        }
        if hi >= first {
            first = hi.saturating_add(MIN_BLOCK);
        }
    }
    first
}

/// The largest request whose rounded size is below `rounded` (`round_size` is monotone).
fn request_below(cfg: &CachingConfig, rounded: u64) -> u64 {
    last_where(0, rounded, 1, |x| cfg.round_size(x).is_some_and(|r| r < rounded))
}

/// The largest `lo + k × step ≤ hi` at which `pred` holds, for a `pred` that holds up to some value and
/// not after it (`lo` when it holds at no later one). `lo ≤ hi`, `step > 0`.
fn last_where(lo: u64, hi: u64, step: u64, pred: impl Fn(u64) -> bool) -> u64 {
    let (mut a, mut b) = (0u64, (hi - lo) / step);
    while a < b {
        let m = a + (b - a).div_ceil(2);
        if pred(lo + m * step) {
            a = m;
        } else {
            b = m - 1;
        }
    }
    lo + a * step
}

#[cfg(test)]
mod tests {
    use super::served_up_to;
    use crate::reference::caching::CachingConfig;

    const MIB: u64 = 1 << 20;

    fn dflt() -> CachingConfig {
        CachingConfig::new(80 << 30)
    }

    /// The bound with default settings as it was written before settings were read: the reference
    /// the interval sweep must agree with.
    fn default_rule(device_free: u64, small_hole: u64, large_hole: u64) -> u64 {
        let blocks = |b: u64| b - b % 512;
        let small = blocks(small_hole).min(MIB).max(if device_free >= 2 * MIB { MIB } else { 0 });
        if small < MIB {
            return small;
        }
        let mut up_to = MIB.max(blocks(large_hole));
        let largest_segment = device_free - device_free % (2 * MIB);
        let first = if device_free >= 20 * MIB { MIB + 1 } else { 10 * MIB - 511 };
        if largest_segment >= 10 * MIB && up_to + 1 >= first {
            up_to = up_to.max(largest_segment);
        }
        up_to
    }

    #[test]
    fn served_up_to_follows_pytorchs_segment_sizes() {
        let c = dflt();
        // No hole: 2 MiB free serves the small pool only; 15 MiB cannot make a 20 MiB segment; 23 MiB can.
        assert_eq!(served_up_to(&c, 2 * MIB, 0, &[]), MIB);
        assert_eq!(served_up_to(&c, 2 * MIB - 512, 0, &[]), 0);
        assert_eq!(served_up_to(&c, 15 * MIB, 0, &[]), MIB);
        assert_eq!(served_up_to(&c, 23 * MIB, 0, &[]), 22 * MIB);
        // A small-pool hole serves up to its size; without it nothing larger, whatever the large holes.
        assert_eq!(served_up_to(&c, 0, 4096, &[100 * MIB]), 4096);
        assert_eq!(served_up_to(&c, 0, 2 * MIB, &[100 * MIB]), 100 * MIB);
        // A large hole of 9.5 MiB, 15 MiB free: up to 9.5 MiB from the hole, then 10 MiB to 14 MiB from the
        // device is not contiguous with it (9.5 MiB + 512 B needs a 20 MiB segment).
        assert_eq!(served_up_to(&c, 15 * MIB, 2 * MIB, &[9 * MIB + MIB / 2]), 9 * MIB + MIB / 2);
        assert_eq!(served_up_to(&c, 15 * MIB, 2 * MIB, &[10 * MIB - 512]), 14 * MIB);
    }

    #[test]
    fn default_settings_give_the_closed_rule() {
        let c = dflt();
        let sizes = [
            0,
            511,
            512,
            MIB - 512,
            MIB,
            2 * MIB - 1,
            2 * MIB,
            9 * MIB,
            10 * MIB - 512,
            10 * MIB,
            15 * MIB,
            20 * MIB,
            20 * MIB + 1,
            23 * MIB,
            64 * MIB + 700,
        ];
        for &free in &sizes {
            for &small in &sizes {
                for &large in &sizes {
                    let holes: &[u64] = if large == 0 { &[] } else { &[large, large / 3] };
                    assert_eq!(
                        served_up_to(&c, free, small, holes),
                        default_rule(free, small, large),
                        "free {free}, small hole {small}, large hole {large}"
                    );
                }
            }
        }
    }

    #[test]
    fn max_split_size_keeps_requests_below_it_out_of_larger_holes() {
        // `get_free_block`: with max_split_size 100 MiB, a 500 MiB hole serves no request below 100 MiB,
        // and above it only those within max_non_split_rounding (20 MiB) of its size.
        let (c, _) = CachingConfig::from_env("max_split_size_mb:100", 80 << 30).unwrap();
        assert_eq!(served_up_to(&c, 0, 2 * MIB, &[500 * MIB]), MIB);
        assert_eq!(served_up_to(&dflt(), 0, 2 * MIB, &[500 * MIB]), 500 * MIB);
        // A 90 MiB hole serves up to 90 MiB; a 110 MiB one also (100..=110 MiB are within 20 MiB of it),
        // after a 99 MiB hole that covers up to it.
        assert_eq!(served_up_to(&c, 0, 2 * MIB, &[90 * MIB]), 90 * MIB);
        assert_eq!(served_up_to(&c, 0, 2 * MIB, &[100 * MIB - 512, 110 * MIB]), 110 * MIB);
        // 130 MiB free makes a segment of any size up to 130 MiB: the hole does not matter then.
        assert_eq!(served_up_to(&c, 130 * MIB, 2 * MIB, &[500 * MIB]), 130 * MIB);
    }

    #[test]
    fn expandable_segments_map_whole_pages() {
        // Large pages are 20 MiB: 23 MiB free maps one page, so requests up to 20 MiB.
        let c = dflt().expandable(true);
        assert_eq!(served_up_to(&c, 23 * MIB, 0, &[]), 20 * MIB);
        assert_eq!(served_up_to(&c, 15 * MIB, 0, &[]), MIB);
        assert_eq!(served_up_to(&c, 45 * MIB, 2 * MIB, &[]), 40 * MIB);
    }

    #[test]
    fn rounding_settings_bound_the_requests_not_the_rounded_sizes() {
        // 25 MiB free makes segments up to 24 MiB. With roundup_power2_divisions:1 a request rounds to the
        // next power of two: up to 16 MiB rounds to at most 16 MiB, 16 MiB + 1 B to 32 MiB, which fails.
        let c = dflt().roundup_divisions(1);
        assert_eq!(served_up_to(&c, 25 * MIB, 2 * MIB, &[]), 16 * MIB);
        assert_eq!(served_up_to(&dflt(), 25 * MIB, 2 * MIB, &[]), 24 * MIB);
    }

    #[test]
    fn extreme_inputs_give_a_bound_without_overflow() {
        let big = u64::MAX;
        for cfg in [
            dflt(),
            dflt().max_split(0).max_non_split_rounding(0),
            dflt().max_split(big).expandable(true).roundup_divisions(1).request_pad(big),
        ] {
            for free in [0, big] {
                let got = served_up_to(&cfg, free, big, &[big, 0, big - 1]);
                assert!(cfg.round_size(got).is_some() || got == 0, "{cfg:?}: {got}");
            }
        }
    }
}
