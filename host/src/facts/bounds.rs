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

use super::state::HeapState;
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
    /// Requests up to this size fit in one free extent: `max(device_free, the pool's largest hole)`.
    pub fits_up_to: u64,
    /// Requests above `fits_up_to` and up to this size would have failed for fragmentation
    /// (`device_free + the pool's holes`); larger ones for capacity.
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
    RequestBounds {
        capacity,
        device_free,
        fits_up_to: device_free.max(pool.largest_hole),
        fragmentation_up_to: device_free.saturating_add(pool.hole_bytes),
        mempool,
        other_pools_hole_bytes: st.hole_bytes.saturating_sub(pool.hole_bytes),
    }
}

/// The holes a request of `mempool` could use in the state `st` (the sizes of its pool's holes).
pub fn usable_holes(st: &HeapState, mempool: MempoolId) -> Vec<u64> {
    st.segments.iter().filter(|s| s.mempool == mempool).flat_map(|s| s.holes.iter().map(|h| h.size)).collect()
}
