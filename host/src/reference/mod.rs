//! Host reference sub-allocators for a device memory range `[0, capacity)`.
//!
//! Every strategy hands out *offsets* into an abstract range of device memory; nothing here touches
//! the memory itself. They validate the device kernels, drive trace replay, and are what users compare.
//!
//! | strategy | module | search | free | notes |
//! |---|---|---|---|---|
//! | first-fit | `first_fit` | 4 cache lines of keys (max tree over address regions), one region's list | O(1) unlink, then the max tree's update | lowest-address fit, immediate coalescing |
//! | best-fit | `best_fit` | O(log64 capacity) (bitmap over exact sizes, address tries); O(log n) from 4096 granules | O(1) unlink, then one insertion | smallest fitting block, ties to lowest address |
//! | TLSF | `tlsf` | O(1) (two-level bitmaps) | O(1) | good fit (exact-size holes first), immediate coalescing |
//! | buddy | `buddy` | O(log capacity) | O(log capacity) | power-of-two blocks, any capacity |
//! | slab | `slab` | O(slots / 64) | O(1) | size classes over pages of a backing strategy |
//! | tiered | `tiered` | O(log n) | O(log n) | small → slab, medium → lowest fit, large → highest fit |
//! | caching | [`caching`] | O(log n) | O(log n) | model of PyTorch's `CUDACachingAllocator` |
//!
//! (n = number of blocks; "free" is [`SubAllocator::free`], which finds the block through the
//! allocation's [`Handle`] in O(1) and then coalesces.) All sizes and offsets are bytes in `u64`; all arithmetic is overflow-checked,
//! sizes up to 2^48 work, and bad input returns an [`AllocError`] instead of panicking.
//!
//! Compaction ([`compact`]) works on every strategy through [`SubAllocator::compaction_layout`] and
//! [`SubAllocator::apply_relocation`].
//!
//! ```
//! use gpuheap::reference::{build, AllocError, StrategyKind};
//! let mut heap = build(StrategyKind::Tlsf, 1 << 30);
//! let a = heap.alloc(1000, 256).unwrap();
//! assert!(a.size >= 1000 && a.offset % 256 == 0);
//! let b = heap.alloc(1000, 256).unwrap();
//! heap.free(a).unwrap(); // by handle: O(1), no offset lookup
//! heap.free_at(b.offset).unwrap(); // by address
//! assert_eq!(heap.free(a), Err(AllocError::DoubleFree { offset: a.offset }));
//! assert_eq!(heap.free_blocks().collect::<Vec<_>>(), vec![(0, 1 << 30)]);
//! ```

use std::collections::HashMap;
use std::fmt;
use std::num::NonZeroU64;
use std::str::FromStr;

pub(crate) mod address_index;
pub(crate) mod best_fit;
pub(crate) mod block_list;
pub(crate) mod buckets;
pub(crate) mod buddy;
pub mod caching;
pub(crate) mod class_index;
pub(crate) mod compact;
pub(crate) mod first_fit;
pub(crate) mod live_slots;
pub(crate) mod offset_table;
pub mod sizes;
pub(crate) mod slab;
pub(crate) mod tiered;
pub(crate) mod tlsf;

pub use best_fit::BestFit;
pub use buddy::{Buddy, DEFAULT_MIN_BLOCK};
pub use compact::{compact, plan_slide, CompactBlock, CompactionLayout, CompactionPlan, Move, Region};
pub use first_fit::FirstFit;
pub use slab::{Slab, SlabConfig};
pub use tiered::{Tiered, TieredConfig};
pub use tlsf::Tlsf;

use caching::{CachingAllocator, CachingConfig};

/// Default granule in bytes for the block-list strategies (first-fit, best-fit, TLSF): every offset and
/// reserved size is a multiple of it. 256 B is the alignment `cudaMalloc` guarantees.
#[doc(hidden)]
pub const DEFAULT_GRANULE: u64 = 256;

/// Largest capacity, size or alignment in bytes that the strategies accept (2^48 = 256 TiB).
#[doc(hidden)]
pub const MAX_BYTES: u64 = 1 << 48;

/// Opaque name of a live block, carried in its [`Allocation`]: the index of the strategy's record of the
/// block (a block-list node, a slot) and a stamp of the record's current use, so that
/// [`SubAllocator::free`] finds the block in O(1) without hashing its offset.
///
/// A handle is only meaningful to the allocator that returned it, and only while its block is live.
/// First-fit, best-fit and TLSF stamp every allocation in every build (a counter over about 2^29.6
/// values, kept in the block's own record, so checking it loads nothing more): a handle kept past its free is rejected even
/// after the record was reused for a block at the same offset, and their `free_handle` frees by the
/// handle alone (8 bytes, `Option<Handle>` too). The other strategies carry a generation in debug
/// builds only and in release builds check that the record is live and starts at the allocation's
/// offset. Either way a stale handle gives an [`AllocError`], never undefined behaviour or a panic; so
/// does a handle of another allocator, unless it happens to name a live block there (two allocators with
/// the same history hand out the same handles: a handle is not a capability). Handles survive
/// [`SubAllocator::apply_relocation`] (only offsets change).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Handle(NonZeroU64);

impl fmt::Debug for Handle {
    /// `Handle(index/generation)`, or `Handle::NONE`; the stored complement is not shown.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == Handle::NONE {
            write!(f, "Handle::NONE")
        } else {
            write!(f, "Handle({}/{:#x})", self.index(), self.generation())
        }
    }
}

impl Handle {
    /// The handle of strategies that find blocks by offset (no record index): [`SubAllocator::free`] then
    /// uses the allocation's offset.
    #[doc(hidden)]
    pub const NONE: Handle = Handle(NonZeroU64::new(!(u32::MAX as u64)).unwrap());

    /// Record `index` at generation (or stamp) `generation`. Stored complemented, so that the value 0, the
    /// niche of `Option<Handle>`, is index and generation `u32::MAX`, which no record has (indices stay
    /// below 2^31; that pair gives [`Handle::NONE`]). Any handle of index `u32::MAX` names no record.
    #[inline(always)]
    pub(crate) fn new(index: u32, generation: u32) -> Self {
        let raw = index as u64 | (generation as u64) << 32;
        NonZeroU64::new(!raw).map_or(Handle::NONE, Handle)
    }

    /// The record index (`u32::MAX` for [`Handle::NONE`], which names no record).
    #[inline(always)]
    pub(crate) fn index(self) -> usize {
        !self.0.get() as u32 as usize
    }

    /// The generation or stamp given to [`Handle::new`].
    #[inline(always)]
    pub(crate) fn generation(self) -> u32 {
        (!self.0.get() >> 32) as u32
    }
}

impl Default for Handle {
    /// [`Handle::NONE`].
    fn default() -> Self {
        Handle::NONE
    }
}

/// A block handed out by [`SubAllocator::alloc`]; give it back to [`SubAllocator::free`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Allocation {
    /// Offset of the block in bytes from the start of the managed range.
    pub offset: u64,
    /// Reserved size in bytes (`>=` the requested size; includes rounding).
    pub size: u64,
    /// The allocator's name for the block (see [`Handle`]).
    pub handle: Handle,
}

/// A live allocation as reported by [`SubAllocator::live_blocks`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AllocatedBlock {
    /// Offset in bytes.
    pub offset: u64,
    /// Reserved size in bytes.
    pub size: u64,
    /// Requested size in bytes (`<= size`).
    pub requested: u64,
}

/// Errors of the reference allocators. Every fallible operation reports one of these instead of panicking.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AllocError {
    /// No block can serve the request. `free` is the total of free bytes (all free blocks, cached memory
    /// included) and `largest_free` the largest single free block, both in bytes, so a caller can tell a
    /// capacity failure (`free < requested`) from a fragmentation failure (`free >= requested`).
    #[error("out of memory: requested {requested} B, {free} B free, largest free block {largest_free} B")]
    OutOfMemory {
        /// Requested size in bytes.
        requested: u64,
        /// Total free bytes.
        free: u64,
        /// Largest free block in bytes.
        largest_free: u64,
    },
    /// `offset` is not the start of a live block (never allocated, inside a block, or out of range).
    #[error("invalid free: no live block starts at offset {offset}")]
    InvalidFree {
        /// Offending offset in bytes.
        offset: u64,
    },
    /// `offset` lies in free memory: the block was already freed.
    #[error("double free at offset {offset}")]
    DoubleFree {
        /// Offending offset in bytes.
        offset: u64,
    },
    /// A live block starts at `offset`, but the allocation's [`Handle`] does not name it: the allocation
    /// was freed before and its offset handed out again, or it comes from another allocator.
    #[error("stale handle: the live block at offset {offset} was not allocated under this handle")]
    StaleHandle {
        /// Offset of the allocation in bytes.
        offset: u64,
    },
    /// [`free_handle`](BestFit::free_handle) was given a handle that names no live block of this
    /// allocator: its block was freed already (its record may hold another block now), or the handle
    /// comes from another allocator.
    #[error("unknown handle: it names no live block of this allocator (freed already, or foreign)")]
    UnknownHandle,
    /// A zero-byte request.
    #[error("zero-size request")]
    ZeroSize,
    /// The alignment is zero, not a power of two, or above [`MAX_BYTES`].
    #[error("alignment {align} is not a power of two in [1, 2^48]")]
    BadAlignment {
        /// Offending alignment in bytes.
        align: u64,
    },
    /// The size (after rounding) exceeds [`MAX_BYTES`] or overflows `u64`.
    #[error("size {size} B overflows the 2^48-byte limit")]
    SizeOverflow {
        /// Offending size in bytes.
        size: u64,
    },
    /// A constructor argument is invalid (e.g. a capacity too small for one block).
    #[error("invalid configuration: {0}")]
    InvalidConfig(&'static str),
    /// A compaction plan does not match the allocator's live layout.
    #[error("invalid relocation: {0}")]
    InvalidRelocation(&'static str),
}

/// A snapshot of an allocator's counters. All values are bytes unless named as counts.
///
/// Identity: `capacity == reserved_in_use + free + stranded`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Size of the managed range in bytes.
    pub capacity: u64,
    /// Requested bytes of the live allocations.
    pub allocated: u64,
    /// Bytes of the blocks handed out, rounding included (`>= allocated`).
    pub reserved_in_use: u64,
    /// Bytes the strategy has taken for its own structures (slab pages, caching segments) plus blocks
    /// handed out directly; equals `reserved_in_use` for strategies without such structures.
    pub reserved: u64,
    /// Total bytes of the free blocks listed by [`SubAllocator::free_blocks`].
    pub free: u64,
    /// Largest free block in bytes.
    pub largest_free: u64,
    /// Bytes neither handed out nor in a listed free block (free slab slots, a buddy tail below the
    /// minimum block).
    pub stranded: u64,
    /// Number of free blocks.
    pub free_blocks: usize,
    /// Number of live allocations.
    pub live_blocks: usize,
}

/// Sub-allocation of the device range `[0, capacity)`.
///
/// [`alloc`](SubAllocator::alloc) returns an [`Allocation`] (offset, reserved size, [`Handle`]);
/// [`free`](SubAllocator::free) takes it back and finds the block through the handle in O(1), without
/// hashing. [`free_at`](SubAllocator::free_at) frees by offset for callers that only have an address; the
/// strategies build their offset index on its first use, so callers that free by handle never pay for one.
///
/// The trait is object-safe; [`build`] returns `Box<dyn SubAllocator + Send>`.
pub trait SubAllocator {
    /// Strategy name as accepted by [`StrategyKind::from_str`].
    fn name(&self) -> &'static str;

    /// Size of the managed range in bytes.
    fn capacity(&self) -> u64;

    /// Allocates `size` bytes aligned to `align` bytes.
    ///
    /// # Errors
    /// [`AllocError::ZeroSize`], [`AllocError::BadAlignment`] (not a power of two), [`AllocError::SizeOverflow`],
    /// [`AllocError::OutOfMemory`] (with the free totals, for capacity/fragmentation classification).
    fn alloc(&mut self, size: u64, align: u64) -> Result<Allocation, AllocError>;

    /// Frees the block `a` (returned by this allocator's `alloc`), found through its handle: O(1), plus the
    /// strategy's coalescing.
    ///
    /// # Errors
    /// When the handle does not name a live block at `a.offset`: [`AllocError::DoubleFree`] if `a.offset`
    /// lies in free memory, [`AllocError::StaleHandle`] if another live block starts there, else
    /// [`AllocError::InvalidFree`]. The allocator is unchanged on error.
    fn free(&mut self, a: Allocation) -> Result<(), AllocError>;

    /// Frees the block that starts at `offset` (bytes). The first call builds an offset index (O(n)), which
    /// is then kept up to date (O(1) expected per `alloc` and `free`).
    ///
    /// # Errors
    /// [`AllocError::DoubleFree`] if `offset` lies in free memory, else [`AllocError::InvalidFree`] if no live
    /// block starts at `offset`. The allocator is unchanged on error.
    fn free_at(&mut self, offset: u64) -> Result<(), AllocError>;

    /// Current counters.
    fn stats(&self) -> Stats;

    /// Free blocks of the strategy's own free structures as `(offset, len)` in bytes, ascending by offset.
    /// Each one can serve one request of its length (modulo alignment). Adjacent blocks are listed
    /// separately when the strategy cannot merge them (buddies of different parents, segment borders).
    fn free_blocks(&self) -> Box<dyn Iterator<Item = (u64, u64)> + '_>;

    /// Live allocations, ascending by offset.
    fn live_blocks(&self) -> Vec<AllocatedBlock>;

    /// The bytes of the segments the strategy obtains its memory as (the caching model: PyTorch's
    /// `reserved_bytes`), which are its [`crate::analysis::footprint`]; `None` for a strategy that carves
    /// one range (the default).
    #[doc(hidden)]
    fn segment_bytes(&self) -> Option<u64> {
        None
    }

    /// Whether the live block `b` was placed from the top of the range down (the tiered strategy's large
    /// tier): it counts from the top in the [`crate::analysis::footprint`]. False for every other strategy.
    #[doc(hidden)]
    fn placed_top_down(&self, b: &AllocatedBlock) -> bool {
        let _ = b;
        false
    }

    /// Returns to the freshly constructed state (everything free).
    fn reset(&mut self);

    /// Releases cached but unused memory to the underlying range (PyTorch's `empty_cache`); returns the
    /// bytes released. Strategies without a cache return 0.
    #[doc(hidden)]
    fn release_cached(&mut self) -> u64 {
        0
    }

    /// What compaction may move: the movable units (live blocks, or whole pages/segments where the
    /// strategy needs them kept intact) and the regions they slide within. See [`compact`].
    fn compaction_layout(&self) -> CompactionLayout;

    /// Applies a plan computed from [`SubAllocator::compaction_layout`]: every unit moves to its destination
    /// and the free structures are rebuilt from the new layout. Live allocations keep their handles: an
    /// [`Allocation`] stays valid with its offset replaced by [`CompactionPlan::translate`] of it.
    ///
    /// # Errors
    /// [`AllocError::InvalidRelocation`] if the plan does not match the current layout; the allocator is then
    /// unchanged.
    fn apply_relocation(&mut self, plan: &CompactionPlan) -> Result<(), AllocError>;
}

impl<T: SubAllocator + ?Sized> SubAllocator for Box<T> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn capacity(&self) -> u64 {
        (**self).capacity()
    }
    fn alloc(&mut self, size: u64, align: u64) -> Result<Allocation, AllocError> {
        (**self).alloc(size, align)
    }
    fn free(&mut self, a: Allocation) -> Result<(), AllocError> {
        (**self).free(a)
    }
    fn free_at(&mut self, offset: u64) -> Result<(), AllocError> {
        (**self).free_at(offset)
    }
    fn stats(&self) -> Stats {
        (**self).stats()
    }
    fn free_blocks(&self) -> Box<dyn Iterator<Item = (u64, u64)> + '_> {
        (**self).free_blocks()
    }
    fn live_blocks(&self) -> Vec<AllocatedBlock> {
        (**self).live_blocks()
    }
    fn reset(&mut self) {
        (**self).reset()
    }
    fn release_cached(&mut self) -> u64 {
        (**self).release_cached()
    }
    fn segment_bytes(&self) -> Option<u64> {
        (**self).segment_bytes()
    }
    fn placed_top_down(&self, b: &AllocatedBlock) -> bool {
        (**self).placed_top_down(b)
    }
    fn compaction_layout(&self) -> CompactionLayout {
        (**self).compaction_layout()
    }
    fn apply_relocation(&mut self, plan: &CompactionPlan) -> Result<(), AllocError> {
        (**self).apply_relocation(plan)
    }
}

/// The strategy registry: one line per strategy (variant, docs, name, constructor from a capacity in
/// bytes). Adding a strategy is one line here; [`StrategyKind`], its names, parsing, [`StrategyKind::ALL`]
/// and [`build`] all come from it.
macro_rules! strategies {
    ($($(#[$doc:meta])* $variant:ident = $name:literal => |$cap:ident, $granule:ident| $ctor:expr;)*) => {
        /// The strategies [`build`] can construct.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum StrategyKind {
            $($(#[$doc])* $variant,)*
        }

        impl StrategyKind {
            /// All strategies, in a stable order.
            pub const ALL: [StrategyKind; [$($name),*].len()] = [$(StrategyKind::$variant),*];

            /// The kebab-case name, as [`FromStr`] accepts it and [`SubAllocator::name`] reports it.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(StrategyKind::$variant => $name,)*
                }
            }

            /// The strategy with default options over `capacity` bytes (not clamped), in units of `granule`.
            fn construct(self, capacity: u64, granule: u64) -> Result<Box<dyn SubAllocator + Send>, AllocError> {
                match self {
                    $(StrategyKind::$variant => {
                        let ($cap, $granule) = (capacity, granule);
                        $ctor.map(|a| Box::new(a) as Box<dyn SubAllocator + Send>)
                    })*
                }
            }
        }
    };
}

strategies! {
    /// [`FirstFit`]: `first-fit`.
    FirstFit = "first-fit" => |cap, granule| FirstFit::with_granule(cap, granule);
    /// [`BestFit`]: `best-fit`.
    BestFit = "best-fit" => |cap, granule| BestFit::with_granule(cap, granule);
    /// [`Buddy`]: `buddy` (its minimum block is the granule).
    Buddy = "buddy" => |cap, granule| Buddy::with_min_block(cap, granule);
    /// [`Tlsf`]: `tlsf`.
    Tlsf = "tlsf" => |cap, granule| Tlsf::with_granule(cap, granule);
    /// [`Slab`] over [`BestFit`]: `slab`.
    Slab = "slab" => |cap, granule| BestFit::with_granule(cap, granule).and_then(|b| Slab::with_backing(Box::new(b)));
    /// [`Tiered`]: `tiered`.
    Tiered = "tiered" => |cap, granule| Tiered::with_config(cap, TieredConfig { granule, ..TieredConfig::for_capacity(cap) });
    /// [`CachingAllocator`]: `caching` (PyTorch's own rounding; no granule).
    Caching = "caching" => |cap, _granule| CachingAllocator::new(CachingConfig::new(cap));
}

impl StrategyKind {
    /// Every name, comma-separated (for messages).
    #[doc(hidden)]
    pub fn names() -> String {
        StrategyKind::ALL.map(StrategyKind::as_str).join(", ")
    }
}

impl fmt::Display for StrategyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Error of [`StrategyKind::from_str`].
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
#[error("unknown strategy `{0}` (expected one of {names})", names = StrategyKind::names())]
#[non_exhaustive]
#[doc(hidden)]
pub struct UnknownStrategy(pub String);

impl FromStr for StrategyKind {
    type Err = UnknownStrategy;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim().to_ascii_lowercase().replace('_', "-");
        StrategyKind::ALL.into_iter().find(|k| k.as_str() == t).ok_or_else(|| UnknownStrategy(s.to_string()))
    }
}

/// Builds a strategy with default options over `[0, capacity)` (bytes).
///
/// Capacities a strategy cannot use completely are handled as its module describes (the buddy system
/// ignores a tail below its minimum block; the block-list strategies round the capacity down to their granule).
/// A capacity below 4 KiB or above [`MAX_BYTES`] is clamped into range, and a capacity a strategy rejects
/// (the caching model needs 2 MiB) is raised to the smallest it accepts, so that this never fails; use the
/// strategies' `new` constructors to get errors instead.
pub fn build(kind: StrategyKind, capacity: u64) -> Box<dyn SubAllocator + Send> {
    build_with_granule(kind, capacity, DEFAULT_GRANULE)
}

/// [`build`] whose offsets and sizes are multiples of `granule` bytes where the strategy has a granule:
/// the block-list strategies' granule, the buddy system's minimum block, the granule of the slab's
/// backing best-fit and of the tiered strategy's shared range (the caching model keeps PyTorch's own
/// rounding). A replay passes the trace's alignment up to [`DEFAULT_GRANULE`], so that a byte-granular
/// instance (minimalloc's) is not rounded to 256 B. A `granule` that is not a power of two in
/// `[1, DEFAULT_GRANULE]` is replaced by [`DEFAULT_GRANULE`].
#[doc(hidden)]
pub fn build_with_granule(kind: StrategyKind, capacity: u64, granule: u64) -> Box<dyn SubAllocator + Send> {
    let granule = if granule.is_power_of_two() && granule <= DEFAULT_GRANULE { granule } else { DEFAULT_GRANULE };
    let cap = capacity.clamp(4096, MAX_BYTES);
    kind.construct(cap, granule)
        .or_else(|_| kind.construct(cap.max(caching::SMALL_BUFFER), granule))
        .expect("defaults are valid for a clamped capacity of at least 2 MiB")
}

// ---------------------------------------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------------------------------------

/// Hasher for offset-keyed maps: one 128-bit multiply folded (foldhash), far cheaper than SipHash.
pub(crate) type OffsetMap<V> = HashMap<u64, V, foldhash::fast::FixedState>;

pub(crate) fn offset_map<V>() -> OffsetMap<V> {
    HashMap::with_hasher(foldhash::fast::FixedState::with_seed(0x9e37_79b9_7f4a_7c15))
}

/// Validates `align` (a power of two in `[1, 2^48]`).
pub(crate) fn check_align(align: u64) -> Result<(), AllocError> {
    if align == 0 || !align.is_power_of_two() || align > MAX_BYTES {
        Err(AllocError::BadAlignment { align })
    } else {
        Ok(())
    }
}

/// Validates a request and returns `size` rounded up to `granule` (a power of two).
pub(crate) fn check_request(size: u64, align: u64, granule: u64) -> Result<u64, AllocError> {
    if size == 0 {
        return Err(AllocError::ZeroSize);
    }
    check_align(align)?;
    let rounded = align_up(size, granule).ok_or(AllocError::SizeOverflow { size })?;
    if rounded > MAX_BYTES {
        return Err(AllocError::SizeOverflow { size });
    }
    Ok(rounded)
}

/// `x` rounded up to a multiple of the power of two `a`, or `None` on overflow.
#[inline]
pub(crate) fn align_up(x: u64, a: u64) -> Option<u64> {
    debug_assert!(a.is_power_of_two());
    x.checked_add(a - 1).map(|v| v & !(a - 1))
}

/// `x` rounded down to a multiple of the power of two `a`.
#[inline]
pub(crate) fn align_down(x: u64, a: u64) -> u64 {
    debug_assert!(a.is_power_of_two());
    x & !(a - 1)
}

/// Does a block `(offset, len)` hold `size` bytes at an `align`-aligned start? Returns the start.
#[inline]
pub(crate) fn fit_front(offset: u64, len: u64, size: u64, align: u64) -> Option<u64> {
    let start = align_up(offset, align)?;
    let end = offset.checked_add(len)?;
    (start.checked_add(size)? <= end).then_some(start)
}

/// Highest `align`-aligned start in `(offset, len)` that holds `size` bytes.
#[inline]
pub(crate) fn fit_back(offset: u64, len: u64, size: u64, align: u64) -> Option<u64> {
    let end = offset.checked_add(len)?;
    let start = align_down(end.checked_sub(size)?, align);
    (start >= offset).then_some(start)
}

/// Out-of-memory error from the given free totals.
pub(crate) fn oom(requested: u64, free: u64, largest_free: u64) -> AllocError {
    AllocError::OutOfMemory { requested, free, largest_free }
}

/// Merges address-ordered `(offset, len)` ranges that touch into maximal runs.
#[doc(hidden)]
pub fn merge_adjacent(blocks: impl IntoIterator<Item = (u64, u64)>) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (o, l) in blocks {
        match out.last_mut() {
            Some(last) if last.0 + last.1 == o => last.1 += l,
            _ => out.push((o, l)),
        }
    }
    out
}

/// Validates a target layout for rebuilding: ascending, disjoint, in `[0, capacity)`, sizes non-zero and
/// multiples of `granule`.
pub(crate) fn check_layout(live: &[AllocatedBlock], capacity: u64, granule: u64) -> Result<(), AllocError> {
    let mut cursor = 0u64;
    for b in live {
        if b.size == 0 || b.offset % granule != 0 || b.size % granule != 0 || b.requested > b.size {
            return Err(AllocError::InvalidRelocation("block not a multiple of the granule"));
        }
        let end = b.offset.checked_add(b.size).ok_or(AllocError::InvalidRelocation("block end overflows"))?;
        if b.offset < cursor || end > capacity {
            return Err(AllocError::InvalidRelocation("blocks overlap or leave the range"));
        }
        cursor = end;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_show_index_and_generation() {
        assert_eq!(format!("{:?}", Handle::NONE), "Handle::NONE");
        assert_eq!(format!("{:?}", Handle::new(3, 0xD000_0005)), "Handle(3/0xd0000005)");
        assert_eq!((Handle::new(3, 7).index(), Handle::new(3, 7).generation()), (3, 7));
        assert_eq!(Handle::new(u32::MAX, u32::MAX), Handle::NONE);
        assert_eq!(Handle::default(), Handle::NONE);
    }

    #[test]
    fn strategy_names_round_trip() {
        for k in StrategyKind::ALL {
            assert_eq!(k.to_string().parse::<StrategyKind>().unwrap(), k);
            assert_eq!(build(k, 1 << 26).name(), k.as_str());
        }
        assert!("nope".parse::<StrategyKind>().is_err());
        assert_eq!("First_Fit".parse::<StrategyKind>().unwrap(), StrategyKind::FirstFit);
    }

    #[test]
    fn helpers_are_overflow_checked() {
        assert_eq!(align_up(u64::MAX, 256), None);
        assert_eq!(check_request(0, 1, 256), Err(AllocError::ZeroSize));
        assert_eq!(check_request(1, 3, 256), Err(AllocError::BadAlignment { align: 3 }));
        assert_eq!(check_request(u64::MAX, 1, 256), Err(AllocError::SizeOverflow { size: u64::MAX }));
        assert_eq!(check_request(MAX_BYTES + 1, 1, 1), Err(AllocError::SizeOverflow { size: MAX_BYTES + 1 }));
        assert_eq!(fit_front(10, 20, 8, 8), Some(16));
        assert_eq!(fit_front(10, 10, 8, 8), None);
        assert_eq!(fit_back(10, 20, 8, 8), Some(16));
        assert_eq!(fit_back(u64::MAX - 4, 4, 8, 8), None);
    }
}
