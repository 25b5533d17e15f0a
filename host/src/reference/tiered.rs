//! Tiered allocation: requests routed by size to different strategies over one shared range.
//!
//! - **small** (`size <= small_max`): a [`Slab`] of size classes; its pages come from the shared range;
//! - **medium** (`small_max < size < large_min`): lowest-address fit in the shared range (first-fit);
//! - **large** (`size >= large_min`): highest-address fit, carved from the top of the range.
//!
//! Small and medium blocks therefore grow from the bottom and large blocks from the top, which keeps
//! short-lived small blocks from splitting the extents large tensors need, while free space stays one
//! pool: all tiers share one address-ordered free structure (the chunked address index,
//! [`AddressIndex`]), so freed memory coalesces across tiers and any tier can use it.
//!
//! # Invariants
//! Those of [`Slab`] and of the first-fit block list; a block of the shared range is a slab page, a medium block
//! or a large block.
//!
//! # Time complexity
//! Medium and large requests: scans of the address index's maxima (from the top for the large tier);
//! small requests as [`Slab`].

use super::address_index::AddressIndex;
use super::block_list::{block_list_strategy, BlockList};
use super::compact::{CompactionLayout, CompactionPlan};
use super::slab::{Slab, SlabConfig};
use super::{AllocError, AllocatedBlock, Allocation, Stats, SubAllocator, DEFAULT_GRANULE};

/// Tier thresholds and slab geometry. All values are bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TieredConfig {
    /// Largest request served by the small (slab) tier; a power of two.
    pub small_max: u64,
    /// Smallest request served by the large (top-down) tier.
    pub large_min: u64,
    /// Slab page size (a power of two, `>= small_max`).
    pub page_size: u64,
    /// Granule of the shared range (a power of two).
    pub granule: u64,
}

impl TieredConfig {
    /// Defaults for `capacity` bytes: small ≤ 64 KiB on 2 MiB pages, large ≥ 10 MiB (PyTorch's large-request
    /// threshold), all scaled down for capacities under 128 MiB.
    #[doc(hidden)]
    pub fn for_capacity(capacity: u64) -> Self {
        let slab = SlabConfig::for_capacity(capacity);
        TieredConfig {
            small_max: slab.max_class,
            large_min: (10 << 20u64).min((capacity / 16).max(slab.page_size * 2)),
            page_size: slab.page_size,
            granule: DEFAULT_GRANULE,
        }
    }
}

/// The shared range: first-fit below `large_min`, highest fit at and above it.
#[derive(Debug)]
struct SharedRange(BlockList<AddressIndex>);

block_list_strategy!(SharedRange, "tiered-shared");

/// Tiered allocator. See the module docs.
#[derive(Debug)]
pub struct Tiered {
    slab: Slab,
    config: TieredConfig,
}

impl Tiered {
    /// Tiered allocator over `capacity` bytes with [`TieredConfig::for_capacity`].
    ///
    /// # Errors
    /// As [`Tiered::with_config`].
    pub fn new(capacity: u64) -> Result<Self, AllocError> {
        Self::with_config(capacity, TieredConfig::for_capacity(capacity))
    }

    /// Tiered allocator over `capacity` bytes.
    ///
    /// # Errors
    /// [`AllocError::InvalidConfig`] if `small_max` is not a power of two, `small_max > page_size`,
    /// `large_min <= small_max`, or the capacity/granule are invalid.
    #[doc(hidden)]
    pub fn with_config(capacity: u64, config: TieredConfig) -> Result<Self, AllocError> {
        if config.large_min <= config.small_max || !config.small_max.is_power_of_two() {
            return Err(AllocError::InvalidConfig("need a power-of-two small_max < large_min"));
        }
        let shared = SharedRange(BlockList::new(capacity, config.granule, AddressIndex::new(config.large_min))?);
        let slab_cfg = SlabConfig {
            page_size: config.page_size,
            min_class: 64.min(config.small_max),
            max_class: config.small_max,
        };
        Ok(Tiered { slab: Slab::named(Box::new(shared), slab_cfg, "tiered")?, config })
    }

    /// The thresholds.
    #[doc(hidden)]
    pub fn config(&self) -> TieredConfig {
        self.config
    }
}

impl SubAllocator for Tiered {
    fn name(&self) -> &'static str {
        "tiered"
    }
    fn capacity(&self) -> u64 {
        self.slab.capacity()
    }
    fn alloc(&mut self, size: u64, align: u64) -> Result<Allocation, AllocError> {
        self.slab.alloc(size, align)
    }
    fn free(&mut self, a: Allocation) -> Result<(), AllocError> {
        self.slab.free(a)
    }
    fn free_at(&mut self, offset: u64) -> Result<(), AllocError> {
        self.slab.free_at(offset)
    }
    fn stats(&self) -> Stats {
        self.slab.stats()
    }
    fn free_blocks(&self) -> Box<dyn Iterator<Item = (u64, u64)> + '_> {
        self.slab.free_blocks()
    }
    fn live_blocks(&self) -> Vec<AllocatedBlock> {
        self.slab.live_blocks()
    }
    /// Blocks of the large tier (`size >= large_min`) are carved from the top.
    fn placed_top_down(&self, b: &AllocatedBlock) -> bool {
        b.size >= self.config.large_min
    }
    fn reset(&mut self) {
        self.slab.reset()
    }
    fn compaction_layout(&self) -> CompactionLayout {
        self.slab.compaction_layout()
    }
    fn apply_relocation(&mut self, plan: &CompactionPlan) -> Result<(), AllocError> {
        self.slab.apply_relocation(plan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_grow_from_opposite_ends() {
        let cfg = TieredConfig { small_max: 1024, large_min: 64 << 10, page_size: 8192, granule: 256 };
        let mut t = Tiered::with_config(1 << 20, cfg).unwrap();
        let small = t.alloc(100, 1).unwrap();
        let medium = t.alloc(10_000, 1).unwrap();
        let large = t.alloc(100_000, 1).unwrap();
        assert_eq!(small.offset, 0, "first slab page at the bottom");
        assert_eq!(medium.offset, 8192);
        assert_eq!(large.offset + large.size, 1 << 20);
        t.free(medium).unwrap();
        t.free_at(large.offset).unwrap();
        t.free(small).unwrap();
        assert_eq!(t.free_blocks().collect::<Vec<_>>(), vec![(0, 1 << 20)]);
    }
}
