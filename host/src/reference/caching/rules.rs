//! Rounding and segment-size rules of `c10/cuda/CUDACachingAllocator.cpp`: the constants
//! (`kMinBlockSize`, `kSmallSize`, `kSmallBuffer`, `kLargeBuffer`, `kMinLargeAlloc`, `kRoundLarge`), the two
//! pools (`get_pool`), `round_size` with `roundup_power2_next_division`, and `get_allocation_size`.

use super::CachingConfig;
use crate::reference::align_up;

/// `kMinBlockSize`: rounding and alignment of every block, bytes.
#[doc(hidden)]
pub const MIN_BLOCK: u64 = 512;
/// `kSmallSize`: largest request of the small pool, bytes.
#[doc(hidden)]
pub const SMALL_SIZE: u64 = 1 << 20;
/// `kSmallBuffer`: small-pool segment size, small expandable page and device page, bytes.
#[doc(hidden)]
pub const SMALL_BUFFER: u64 = 2 << 20;
/// `kLargeBuffer`: segment size for requests below [`MIN_LARGE_ALLOC`] and large expandable page, bytes.
#[doc(hidden)]
pub const LARGE_BUFFER: u64 = 20 << 20;
/// `kMinLargeAlloc`: requests at or above it get a segment of their own size, bytes.
#[doc(hidden)]
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// `kRoundLarge`: rounding of large segments, bytes.
#[doc(hidden)]
pub const ROUND_LARGE: u64 = 2 << 20;
/// Size of the model's virtual address range, bytes
/// ([`SubAllocator::capacity`](crate::reference::SubAllocator::capacity)).
#[doc(hidden)]
pub const ADDRESS_RANGE: u64 = crate::reference::MAX_BYTES;

/// The two pools.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pool {
    /// Requests ≤ 1 MiB.
    Small = 0,
    /// Requests > 1 MiB.
    Large = 1,
}

impl Pool {
    /// The pool of a block record's `pool` byte (`Pool as u8`).
    pub(super) fn of_index(i: u8) -> Pool {
        if i == Pool::Small as u8 {
            Pool::Small
        } else {
            Pool::Large
        }
    }

    /// The expandable page size of the pool, bytes (2 MiB small, 20 MiB large).
    #[doc(hidden)]
    pub fn page(self) -> u64 {
        match self {
            Pool::Small => SMALL_BUFFER,
            Pool::Large => LARGE_BUFFER,
        }
    }
}

/// The index of the free set (and unmapped set) of `pool` in memory pool `mempool`: each memory pool has
/// its own pair of `BlockPool`s (`PrivatePool::large_blocks` / `small_blocks`; the default pool's are the
/// allocator's own `large_blocks` / `small_blocks`).
pub(super) fn set_index(mempool: u16, pool: Pool) -> usize {
    mempool as usize * 2 + pool as usize
}

pub(super) fn pool_of(size: u64) -> Pool {
    if size <= SMALL_SIZE {
        Pool::Small
    } else {
        Pool::Large
    }
}

/// `x` rounded up to a multiple of `m` (not necessarily a power of two), or `None` on overflow.
pub(super) fn round_up_to(x: u64, m: u64) -> Option<u64> {
    x.div_ceil(m).checked_mul(m)
}

/// `x` rounded down to a multiple of `m` (not necessarily a power of two).
pub(super) fn round_down_to(x: u64, m: u64) -> u64 {
    x - x % m
}

/// PyTorch's `round_size` with default options: at least 512, a multiple of 512.
#[doc(hidden)]
pub fn round_size(size: u64) -> Option<u64> {
    align_up(size.max(1), MIN_BLOCK)
}

/// PyTorch's `roundup_power2_next_division`: `size` rounded up to the next of `divisions` equal steps
/// between the powers of two around it (a power of two stays; steps of zero give the next power of two).
#[doc(hidden)]
pub fn roundup_power2_next_division(size: u64, divisions: u64) -> Option<u64> {
    if size.is_power_of_two() || size == 0 {
        return Some(size);
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.max(1).leading_zeros());
    if step == 0 {
        return floor.checked_mul(2);
    }
    let down = size & !(step - 1);
    if down == size {
        Some(size)
    } else {
        down.checked_add(step)
    }
}

impl CachingConfig {
    /// PyTorch's `round_size` under these options (torch_npu's pad first, when set); `None` on overflow.
    pub fn round_size(&self, size: u64) -> Option<u64> {
        let size = size.checked_add(self.request_pad)?;
        if size < MIN_BLOCK {
            return Some(MIN_BLOCK);
        }
        let d = self.divisions_for(size);
        if d > 0 && size > MIN_BLOCK.saturating_mul(d) {
            roundup_power2_next_division(size, d)
        } else {
            align_up(size, MIN_BLOCK)
        }
    }

    /// What `alloc_block` asks the driver for when no cached block serves a request of `rounded` bytes
    /// (already rounded by [`CachingConfig::round_size`]): the segment of [`segment_size`], or with
    /// expandable segments the request in whole pages of its pool ([`Pool::page`]: 2 MiB small, 20 MiB
    /// large; `ExpandableSegment::map`), counting no free tail of an existing segment. `None` on overflow.
    #[doc(hidden)]
    pub fn new_memory(&self, rounded: u64) -> Option<u64> {
        if self.expandable_segments {
            round_up_to(rounded.max(1), pool_of(rounded).page())
        } else {
            segment_size(rounded)
        }
    }
}

/// PyTorch's `get_allocation_size`: the segment size for a rounded request.
#[doc(hidden)]
pub fn segment_size(rounded: u64) -> Option<u64> {
    if rounded <= SMALL_SIZE {
        Some(SMALL_BUFFER)
    } else if rounded < MIN_LARGE_ALLOC {
        Some(LARGE_BUFFER)
    } else {
        align_up(rounded, ROUND_LARGE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::caching::{CachingAllocator, CachingConfig};
    use crate::reference::{AllocError, SubAllocator};

    const MIB: u64 = 1 << 20;

    #[test]
    fn rounding_pools_and_segments() {
        assert_eq!(round_size(1), Some(512));
        assert_eq!(round_size(513), Some(1024));
        assert_eq!(segment_size(SMALL_SIZE), Some(2 * MIB));
        assert_eq!(segment_size(SMALL_SIZE + 512), Some(20 * MIB));
        assert_eq!(segment_size(10 * MIB), Some(10 * MIB));
        assert_eq!(segment_size(11 * MIB + 1), Some(12 * MIB));
        let mut c = CachingAllocator::new(CachingConfig::new(1 << 30)).unwrap();
        let a = c.alloc(100, 1).unwrap();
        assert_eq!(a.size, 512);
        assert_eq!((c.reserved_bytes(), c.segment_count()), (2 * MIB, 1));
        let b = c.alloc(3 * MIB, 1).unwrap();
        assert_eq!((b.size, c.reserved_bytes()), (3 * MIB, 22 * MIB));
        c.free_at(b.offset).unwrap();
        c.free_at(a.offset).unwrap();
        assert_eq!(c.reserved_bytes(), 22 * MIB, "segments stay cached");
        assert_eq!(c.empty_cache(), 22 * MIB);
        assert_eq!((c.reserved_bytes(), c.segment_count()), (0, 0));
        assert_eq!(c.free_at(a.offset), Err(AllocError::DoubleFree { offset: a.offset }));
    }

    #[test]
    fn new_memory_is_a_segment_or_whole_expandable_pages() {
        let c = CachingConfig::new(1 << 30);
        assert_eq!(c.new_memory(512), Some(2 * MIB));
        assert_eq!(c.new_memory(3 * MIB), Some(20 * MIB));
        assert_eq!(c.new_memory(31 * MIB), Some(32 * MIB));
        let e = c.expandable(true);
        assert_eq!(e.new_memory(512), Some(2 * MIB), "one small page");
        assert_eq!(e.new_memory(3 * MIB), Some(20 * MIB), "one large page");
        assert_eq!(e.new_memory(31 * MIB), Some(40 * MIB), "two large pages, not a 32 MiB segment");
        assert_eq!(e.new_memory(u64::MAX - 1), None);
    }

    #[test]
    fn roundup_power2_divisions_list_and_single_forms() {
        // `round_size` / `roundup_power2_next_division`; `[256:1,512:2,>:4]` gives 1 division up to 512 MiB
        // and 4 from 512 MiB on (`>` fills from the last named interval inclusive).
        let (cfg, _) = CachingConfig::from_env("roundup_power2_divisions:[256:1,512:2,>:4]", 4 << 30).unwrap();
        assert_eq!(cfg.round_size(1000), Some(1024), "1 division: next power of two");
        assert_eq!(cfg.round_size(300 * MIB), Some(512 * MIB));
        assert_eq!(cfg.round_size(600 * MIB), Some(640 * MIB), "4 divisions of [512, 1024) MiB: steps of 128");
        assert_eq!(cfg.round_size(512 * MIB), Some(512 * MIB), "a power of two stays");
        let mut c = CachingAllocator::new(cfg).unwrap();
        let a = c.alloc(300 * MIB, 1).unwrap();
        assert_eq!((a.size, c.reserved_bytes()), (512 * MIB, 512 * MIB));
        let single = CachingConfig::new(1 << 30).roundup_divisions(4);
        assert_eq!(single.round_size(1_153_434), Some(1_310_720), "1.1 MiB: steps of 256 KiB above 1 MiB");
        assert_eq!(single.round_size(2000), Some(2048), "not above 512 x 4: multiple of 512");
        assert_eq!(CachingConfig::new(1 << 30).request_pad(32).round_size(512), Some(1024), "torch_npu's pad");
    }
}
