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
use crate::reference::caching::{LARGE_BUFFER, MIN_BLOCK, MIN_LARGE_ALLOC, ROUND_LARGE, SMALL_BUFFER, SMALL_SIZE};
use crate::trace::MempoolId;

fn is_default_pool(m: &MempoolId) -> bool {
    !m.is_private()
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// For a state without a recorded failure: which requests of one memory pool it would have served, at
/// a capacity. Bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct RequestBounds {
    /// The capacity assumed.
    pub capacity: u64,
    /// `capacity − reserved` (0 when reserved exceeds it).
    pub device_free: u64,
    /// Every request of 1 B up to this size is served, by PyTorch's rules with default settings
    /// (`served_up_to`: from a hole of its size class, or from a new segment the device's free bytes
    /// hold).
    pub fits_up_to: u64,
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

/// The [`RequestBounds`] of requests of `mempool` in the state `st` on a GPU of `capacity` bytes.
pub fn request_bounds(st: &HeapState, capacity: u64, mempool: MempoolId) -> RequestBounds {
    let device_free = capacity.saturating_sub(st.reserved);
    let pool = st.pool(mempool);
    let largest = |small: bool| {
        st.segments
            .iter()
            .filter(|s| s.mempool == mempool && is_small_segment(s) == small)
            .map(SegmentView::largest_hole)
            .max()
            .unwrap_or(0)
    };
    RequestBounds {
        capacity,
        device_free,
        fits_up_to: served_up_to(device_free, largest(true), largest(false)),
        fragmentation_up_to: device_free.saturating_add(pool.hole_bytes),
        mempool,
        other_pools_hole_bytes: st.hole_bytes.saturating_sub(pool.hole_bytes),
    }
}

/// The holes a request of `mempool` could use in the state `st` (the sizes of its pool's holes).
pub fn usable_holes(st: &HeapState, mempool: MempoolId) -> Vec<u64> {
    st.segments.iter().filter(|s| s.mempool == mempool).flat_map(|s| s.holes.iter().map(|h| h.size)).collect()
}

/// A segment of the small pool: recorded as one, or, where the snapshot does not say, of at most 2 MiB (as
/// the caching model seeds it).
fn is_small_segment(s: &SegmentView) -> bool {
    s.pool == "small" || s.pool == "unknown" && s.size <= SMALL_BUFFER
}

/// The largest `x` such that every request of 1 B to `x` is served, by PyTorch's rules with default
/// settings (`c10/cuda/CUDACachingAllocator.cpp`: `get_pool`, `round_size`, `get_allocation_size`), given
/// the device's free bytes and the largest holes of the request pool's small- and large-pool segments.
/// A request of at most 1 MiB (`kSmallSize`) is served from a small-pool hole or a new 2 MiB segment
/// (`kSmallBuffer`); a larger one from a large-pool hole or a new segment of 20 MiB (`kLargeBuffer`)
/// below 10 MiB (`kMinLargeAlloc`), else of its size rounded up to 2 MiB (`kRoundLarge`), which the
/// device's free bytes must hold. Requests and holes are counted in PyTorch's 512 B blocks. So the free
/// bytes alone are no bound: with 15 MiB free and no hole, a 2 MiB request fails (it needs 20 MiB) while
/// a 12 MiB one fits.
pub fn served_up_to(device_free: u64, small_hole: u64, large_hole: u64) -> u64 {
    let blocks = |b: u64| b - b % MIN_BLOCK;
    let from_device_small = if device_free >= SMALL_BUFFER { SMALL_SIZE } else { 0 };
    let small = blocks(small_hole).min(SMALL_SIZE).max(from_device_small);
    if small < SMALL_SIZE {
        return small;
    }
    let mut up_to = SMALL_SIZE.max(blocks(large_hole));
    // New large segments: the largest the device holds, for every request above 1 MiB when that is at
    // least 20 MiB, else for those from 10 MiB (rounded to 512 B: from 10 MiB − 511 B) up to it.
    let largest_segment = device_free - device_free % ROUND_LARGE;
    let first = if device_free >= LARGE_BUFFER { SMALL_SIZE + 1 } else { MIN_LARGE_ALLOC - MIN_BLOCK + 1 };
    if largest_segment >= MIN_LARGE_ALLOC && up_to + 1 >= first {
        up_to = up_to.max(largest_segment);
    }
    up_to
}

#[cfg(test)]
mod tests {
    use super::served_up_to;

    const MIB: u64 = 1 << 20;

    #[test]
    fn served_up_to_follows_pytorchs_segment_sizes() {
        // No hole: 2 MiB free serves the small pool only; 15 MiB cannot make a 20 MiB segment; 23 MiB can.
        assert_eq!(served_up_to(2 * MIB, 0, 0), MIB);
        assert_eq!(served_up_to(2 * MIB - 512, 0, 0), 0);
        assert_eq!(served_up_to(15 * MIB, 0, 0), MIB);
        assert_eq!(served_up_to(23 * MIB, 0, 0), 22 * MIB);
        // A small-pool hole serves up to its size; without it nothing larger, whatever the large holes.
        assert_eq!(served_up_to(0, 4096, 100 * MIB), 4096);
        assert_eq!(served_up_to(0, 2 * MIB, 100 * MIB), 100 * MIB);
        // A large hole of 9.5 MiB, 15 MiB free: up to 9.5 MiB from the hole, then 10 MiB to 14 MiB from the
        // device is not contiguous with it (9.5 MiB + 512 B needs a 20 MiB segment).
        assert_eq!(served_up_to(15 * MIB, 2 * MIB, 9 * MIB + MIB / 2), 9 * MIB + MIB / 2);
        assert_eq!(served_up_to(15 * MIB, 2 * MIB, 10 * MIB - 512), 14 * MIB);
    }
}
