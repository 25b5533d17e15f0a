//! A model of PyTorch's `CUDACachingAllocator` (one device), for comparing trace replays with what PyTorch
//! itself reserved, and for asking what other allocator settings would have done.
//!
//! Every rule cites the function of `c10/cuda/CUDACachingAllocator.cpp` (`DeviceCachingAllocator`) it
//! follows; options are parsed as `CUDAAllocatorConfig` / `AllocatorConfig` does ([`config`]).
//!
//! - **Rounding** (`round_size`): requests below 512 B (`kMinBlockSize`) become 512 B; with
//!   `roundup_power2_divisions` `d > 0` for the request's interval and a request above `512 × d`, the
//!   request is rounded up to the next of `d` equal divisions of its power-of-two interval
//!   (`roundup_power2_next_division`); otherwise to a multiple of 512 B. (`d = 1` rounds up to the next power
//!   of two, as PyTorch up to 2.8 does and as the BL-31 snapshot records; PyTorch ≥ 2.9 tests `d > 1` and
//!   ignores 1, pytorch/pytorch#161139.)
//! - **Pools** (`get_pool`, `BlockComparatorSize`): rounded requests ≤ 1 MiB (`kSmallSize`) use the small
//!   pool, larger ones the large pool; within a pool, free blocks are ordered by `(stream, size, address)`
//!   and a block is only ever reused by the stream it was allocated on.
//! - **Segment size** (`get_allocation_size`): 2 MiB (`kSmallBuffer`) for small requests, 20 MiB
//!   (`kLargeBuffer`) below 10 MiB (`kMinLargeAlloc`), else the request rounded up to 2 MiB (`kRoundLarge`).
//! - **Search** (`get_free_block`): best fit `(stream, size, address)`; a request below `max_split_size`
//!   never takes a block at or above it, and a request at or above it never takes a block
//!   `max_non_split_rounding` (default 20 MiB) or more larger. With expandable segments, among equal-stream
//!   candidates the one whose size plus the unmapped space right after it is smallest is taken.
//! - **Split** (`should_split`): the remainder is split off if ≥ 512 B (small pool, or expandable segments),
//!   else (large pool) if it is > 1 MiB and the request is below `max_split_size`.
//! - **Free** (`free_block`, `try_merge_blocks`): the block merges with free neighbours of the same segment
//!   that are in the same mapped state. `free_completed` is when this happens; a `free_requested` block
//!   stays allocated until then (a replay frees at `free_completed`).
//! - **When no cached block fits** (`malloc`): garbage collection if active; a new segment (`alloc_block`);
//!   then release oversize cached blocks (`release_available_cached_blocks`, only with `max_split_size`)
//!   and retry; then release every cached whole segment and unmap every free expandable page
//!   (`release_cached_blocks`, i.e. `empty_cache`) and retry; then out of memory.
//! - **Garbage collection** (`garbage_collect_cached_blocks`): only with a per-process memory fraction set
//!   and `garbage_collection_threshold > 0`; when reserved bytes exceed `threshold × allowed maximum`, whole
//!   free segments of the large pool whose age (calls to `get_free_block` since they were freed) is at
//!   least the average are released, repeatedly, until the excess is reclaimed.
//! - **Memory fraction** (`alloc_block`): with a fraction set, a new segment that would take reserved bytes
//!   above `fraction × capacity` fails.
//! - **Expandable segments** (`try_allocate_expandable_block`, `find_expandable_block`, `map_block`,
//!   `unmap_block`, `release_blocks`): one virtual reservation of 1⅛ × device memory per (stream, pool),
//!   mapped in pages of 2 MiB (small pool) or 20 MiB (large pool). A request takes the lowest unmapped range
//!   (with the free block right before it) that has room, and maps just the pages it needs; `empty_cache`
//!   unmaps every whole free page anywhere in the segment, and a reservation with nothing mapped is released.
//!   Snapshots list each contiguous mapped range as a segment; so does [`CachingAllocator::segments`].
//!
//! **Device model.** A new segment or mapping succeeds iff the device's free memory, `capacity − reserved`
//! counted in whole 2 MiB pages, covers it (a GPU maps physical pages into a fresh virtual range, so there is
//! no address-range fragmentation of the device). Virtual addresses come from a 2^48-byte range
//! ([`SubAllocator::capacity`]); [`SubAllocator::free_blocks`] lists the device's free bytes as the lowest
//! unused virtual ranges, `capacity − reserved` bytes in all.
//!
//! **torch_npu** (`NPUCachingAllocator`, Ascend NPUs, e.g. the MemSnapDump snapshot) is a port of this
//! allocator: same constants, pools, search, split, free and expandable-segment rules. It differs in
//! `round_size`, which first adds a pad (`AddPadSize`, 32 B by default) to every request, so a request of
//! `k × 512` bytes takes one more 512-byte unit; [`CachingConfig::request_pad`] models it. With expandable
//! segments it also starts every block of 2 MiB or more on a 16 KiB boundary (`base_addr_aligned_kb`,
//! `kAlignRoundLarge`), leaving the bytes before it cached ([`CachingConfig::base_addr_align`]). Both are
//! inferred from a snapshot's block sizes and addresses ([`config_for_trace`]) and tested on the MemSnapDump
//! snapshot (`host/tests/caching_model.rs`).
//!
//! **Compaction** ([`SubAllocator::apply_relocation`]) models a compacting caching allocator: blocks slide
//! toward the start of their segment (of their mapped range, expandable), each segment is then trimmed to
//! its live extent rounded up to 2 MiB (non-expandable: a re-`cudaMalloc` and copy; expandable: unmapping
//! whole pages), and segments left without live blocks are released.
//!
//! # Data structures
//! Blocks are records in a slab, each linked to the adjacent blocks of its segment (PyTorch's `Block::prev`
//! and `next`), so splitting and merging with free neighbours read and write no index; a record fills one
//! 64-byte cache line. An [`Allocation`]'s handle is its record index: `free` checks that the record still
//! holds the live block at the allocation's offset, else looks the offset up. There is no index by block
//! offset: a segment (by start, `seg_index`) knows its first block's record (`seg_first`), and `free_at`
//! and the cold paths walk that segment's chain; unmapped blocks are indexed with their records. The
//! free set of each pool is, per stream, a `ClassIndex` (`class_index.rs`, shared with best-fit): TLSF
//! size classes with a two-level bitmap,
//! each class an exact `(size, address)`-ordered set kept as sorted chunks of at most 32 keys behind a
//! directory of their first keys: best fit in `BlockComparatorSize` order with one binary search over a
//! class's directory and one within a chunk, and no tree node per block. The search returns the position
//! of the block it found, and `alloc` takes the block out at that position (no second search).
//!
//! # Invariants
//! - Blocks tile each segment's virtual range; each segment's blocks form one chain by address (`prev`,
//!   `next`); `seg_index` maps every segment's start to its id, `seg_first[id]` is the record of the block
//!   at the segment's start (splits and merges keep the front block's record); a block is in
//!   `free_sets[pool]` under `(stream, size, offset)` iff it is free and mapped, in `unmapped[pool]` under
//!   `(stream, offset)` (with its record) iff it is unmapped; no two adjacent blocks of one segment are
//!   both free or both unmapped.
//! - Each stream's `ClassIndex` keeps its own invariants (chunks, directory, bitmaps: see
//!   `class_index.rs`).
//! - `reserved` = sizes of non-expandable segments + mapped bytes of expandable ones ≤ capacity.
//!
//! # Time complexity
//! `alloc`/`free`: O(log k) comparisons for a size class of k cached blocks, plus moving at most 32 keys
//! within one chunk and, rarely, shifting the class's directory (a full chunk splits, two light neighbours
//! merge: a class of k blocks has at most 4k / 32 + 1 chunks); O(1) neighbour work and no hashing; plus
//! O(segments) on the release-and-retry path. `free_at` and the cold paths that look a block up by offset
//! (`release_segment` excepted: O(log segments)) walk the chain of the segment concerned: O(log segments
//! + blocks of that segment).
//!
//! A new or released segment updates the unused virtual ranges (`va_holes`) and the segments by start
//! (`SegIndex`), both sorted flat ring buffers: O(log segments) to find the place plus moving the shorter
//! side, O(segments) words at worst (seeding in address order appends).

use std::collections::{BTreeMap, VecDeque};

use super::block_list::size_class;
use super::class_index::{key, key_offset, key_record, key_size, ClassIndex, Pos};
use super::compact::{check_plan_matches, CompactBlock, CompactionLayout, CompactionPlan, Region};
use super::{
    align_down, align_up, check_request, oom, AllocError, AllocatedBlock, Allocation, Handle, Stats, SubAllocator,
};

pub mod config;
pub mod seed;
mod seg_index;

use seg_index::SegIndex;

pub use config::{CachingConfig, ConfigError, ConfigWarning, ROUNDUP_INTERVALS};
pub use seed::{
    capacity_at_oom, config_for_trace, fidelity, fidelity_until, seed_from_trace, Fidelity, RecordedSegments, Seeded,
};

/// `kMinBlockSize`: rounding and alignment of every block, bytes.
pub const MIN_BLOCK: u64 = 512;
/// `kSmallSize`: largest request of the small pool, bytes.
pub const SMALL_SIZE: u64 = 1 << 20;
/// `kSmallBuffer`: small-pool segment size, small expandable page and device page, bytes.
pub const SMALL_BUFFER: u64 = 2 << 20;
/// `kLargeBuffer`: segment size for requests below [`MIN_LARGE_ALLOC`] and large expandable page, bytes.
pub const LARGE_BUFFER: u64 = 20 << 20;
/// `kMinLargeAlloc`: requests at or above it get a segment of their own size, bytes.
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// `kRoundLarge`: rounding of large segments, bytes.
pub const ROUND_LARGE: u64 = 2 << 20;
/// Size of the model's virtual address range, bytes ([`SubAllocator::capacity`]).
pub const ADDRESS_RANGE: u64 = super::MAX_BYTES;

/// The two pools.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pool {
    /// Requests ≤ 1 MiB.
    Small = 0,
    /// Requests > 1 MiB.
    Large = 1,
}

impl Pool {
    /// The expandable page size of the pool, bytes (2 MiB small, 20 MiB large).
    pub fn page(self) -> u64 {
        match self {
            Pool::Small => SMALL_BUFFER,
            Pool::Large => LARGE_BUFFER,
        }
    }
}

/// A segment as reported by [`CachingAllocator::segments`]: a `cudaMalloc`ed segment, or one contiguous
/// mapped range of an expandable segment (as PyTorch's snapshot lists them). Bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentInfo {
    /// Start offset.
    pub offset: u64,
    /// Size (the mapped range for an expandable segment).
    pub size: u64,
    /// Pool.
    pub pool: Pool,
    /// Stream (as given to [`CachingAllocator::alloc_on`]).
    pub stream: i64,
    /// Part of an expandable segment.
    pub expandable: bool,
    /// Bytes of live blocks in it.
    pub in_use: u64,
    /// Blocks as `(offset, size, live)`, ascending.
    pub blocks: Vec<(u64, u64, bool)>,
}

/// Counters beyond [`Stats`]. Bytes unless named as counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CachingCounters {
    /// Highest requested bytes live at once.
    pub peak_allocated: u64,
    /// Highest block bytes live at once.
    pub peak_in_use: u64,
    /// Highest reserved (segment) bytes.
    pub peak_reserved: u64,
    /// Times the allocator released all cached segments and retried (PyTorch's `num_alloc_retries`).
    pub alloc_retries: u64,
    /// Out-of-memory errors returned.
    pub ooms: u64,
    /// Segments allocated (`cudaMalloc`) and page ranges mapped (`segment_map`).
    pub segment_allocs: u64,
    /// Segments released (`cudaFree`) and page ranges unmapped (`segment_unmap`).
    pub segment_frees: u64,
    /// Segments released by the garbage collector (also counted in `segment_frees`).
    pub gc_releases: u64,
}

const LIVE: u8 = 0;
const FREE: u8 = 1;
const UNMAPPED: u8 = 2;
/// State of a record slot that holds no block (on the spare list).
const SPARE: u8 = 3;
/// No block: the end of a segment's chain.
const NIL: u32 = u32::MAX;

/// A block, a node of its segment's chain of blocks in address order (PyTorch's `Block::prev`/`next`):
/// `prev` and `next` are the adjacent blocks of the same segment, [`NIL`] at the segment's ends.
/// Aligned to a 64-byte cache line: the record is 50 bytes, so unaligned, 7 records in 8 straddle two lines.
#[derive(Clone, Copy, Debug)]
#[repr(align(64))]
struct Block {
    off: u64,
    size: u64,
    requested: u64,
    /// `gc_count_base`: the pool's `get_free_block` call count when the block was cached.
    gc_base: u64,
    seg: u32,
    stream: u32,
    prev: u32,
    next: u32,
    state: u8,
    /// The segment's pool (`Pool as u8`), kept here so that caching a block reads no segment record.
    pool: u8,
}

/// The cached blocks of one pool in `BlockComparatorSize` order (stream, size, address): per stream, a
/// [`ClassIndex`] of keys `(size, address, record)` (TLSF size classes of the block sizes in bytes, each an
/// exact-ordered set of sorted chunks, with a two-level bitmap over the non-empty classes). A search is one
/// lookup in the request's class and, when nothing there is large enough, the first entry of the next
/// non-empty class: the same best fit as one ordered set of all blocks, on sets that stay small (one narrow
/// size band each). Keys fit: blocks lie in the virtual range `[0, ADDRESS_RANGE)`, 2^48 bytes.
#[derive(Debug, Default)]
struct FreeSet {
    streams: Vec<ClassIndex>,
}

/// The size class of a block of `size` bytes.
fn class_of(size: u64) -> (usize, usize) {
    size_class(size.max(1))
}

/// The search key of a request of `size` bytes: below every key of a block of `size` bytes or more (None
/// above [`ADDRESS_RANGE`], where no block is).
fn search_key(size: u64) -> Option<u128> {
    (size <= ADDRESS_RANGE).then(|| key(size.max(1), 0, 0))
}

/// `(size, offset, record)` of a key.
fn entry(k: u128) -> (u64, u64, u32) {
    (key_size(k), key_offset(k), key_record(k))
}

impl FreeSet {
    fn insert(&mut self, stream: u32, size: u64, off: u64, n: u32) {
        let s = stream as usize;
        if self.streams.len() <= s {
            self.streams.resize_with(s + 1, ClassIndex::default);
        }
        self.streams[s].insert(class_of(size), key(size, off, n));
    }

    /// Removes block `n`, cached as `(size, off)` on `stream` (no change if it is not there).
    fn remove(&mut self, stream: u32, size: u64, off: u64, n: u32) {
        if let Some(index) = self.streams.get_mut(stream as usize) {
            index.remove(class_of(size), key(size, off, n));
        }
    }

    /// Removes the entry at `at` of `stream`'s classes (a position [`FreeSet::first_at_least`] found, with
    /// no change to the set since).
    fn remove_at(&mut self, stream: u32, at: Pos) {
        self.streams[stream as usize].remove_at(at);
    }

    /// The first of [`FreeSet::at_least`] (best fit) and its position, without building the iterator: one
    /// lookup in the request's class, else the first block of the next non-empty class.
    #[inline]
    fn first_at_least(&self, stream: u32, size: u64) -> Option<((u64, u64, u32), Pos)> {
        let (k, at) = self.streams.get(stream as usize)?.first_at_least(class_of(size), search_key(size)?)?;
        Some((entry(k), at))
    }

    /// The free blocks of `stream` of at least `size` bytes as `(size, offset, record)`, in `(size, offset)` order.
    fn at_least(&self, stream: u32, size: u64) -> impl Iterator<Item = (u64, u64, u32)> + '_ {
        let from = search_key(size);
        let index = self.streams.get(stream as usize).filter(|_| from.is_some());
        let (fl, sl) = class_of(size);
        let first = index.and_then(|index| index.class_at_or_above(fl, sl));
        let classes = std::iter::successors(first, move |&(fl, sl)| index?.class_at_or_above(fl, sl + 1));
        classes.flat_map(move |class| {
            index.into_iter().flat_map(move |index| index.class_from(class, from.unwrap_or(0)).map(entry))
        })
    }

    /// Every block as `(stream, size, offset, record)`, in order.
    fn iter(&self) -> impl Iterator<Item = (u32, u64, u64, u32)> + '_ {
        self.streams.iter().enumerate().flat_map(move |(s, index)| {
            index.keys().map(move |k| {
                let (z, o, n) = entry(k);
                (s as u32, z, o, n)
            })
        })
    }

    /// The largest block's size (0 without blocks).
    fn largest(&self) -> u64 {
        self.streams.iter().filter_map(ClassIndex::last).map(key_size).max().unwrap_or(0)
    }
}

#[derive(Clone, Copy, Debug)]
struct Segment {
    start: u64,
    size: u64,
    pool: Pool,
    stream: u32,
    expandable: bool,
}

/// The caching allocator model. See the [module docs](self).
#[derive(Debug)]
pub struct CachingAllocator {
    config: CachingConfig,
    /// Unused virtual ranges `(start, len)`, sorted by start, merged (no two touch). A flat ring buffer: a
    /// lookup is one binary search, and an insertion or removal moves the shorter side (seeding segments in
    /// address order splits the last range; a replay releases mostly low segments, near the front).
    va_holes: VecDeque<(u64, u64)>,
    /// Block records (a slab: `spare` lists the unused slots); a block's record index is its handle.
    blocks: Vec<Block>,
    spare: Vec<u32>,
    /// Record of the first block of each segment (by segment id; stale for ids not in use).
    seg_first: Vec<u32>,
    /// A block record to start `block_containing`'s walk from (the block `seed_block` placed last), or
    /// [`NIL`]: seeding a segment's blocks in address order then walks one step per block, not the chain.
    walk_hint: u32,
    /// Start -> id of every segment (non-expandable segments and expandable reservations).
    seg_index: SegIndex,
    /// Cached (free, mapped) blocks per pool.
    free_sets: [FreeSet; 2],
    /// Unmapped blocks per pool: `(stream, offset) -> record`.
    unmapped: [BTreeMap<(u32, u64), u32>; 2],
    segments: Vec<Option<Segment>>,
    /// Every segment id below this one is in use (`new_segment` takes the lowest free id from here on,
    /// without rescanning the ids in use: seeding 820 segments was quadratic).
    segment_hint: usize,
    /// Stream handles by dense index.
    streams: Vec<i64>,
    /// `get_free_blocks_call_count` per pool.
    gc_calls: [u64; 2],
    /// Virtual address for the next new segment or reservation ([`CachingAllocator::hint_next_segment`]).
    va_hint: Option<u64>,
    allocated: u64,
    in_use: u64,
    reserved: u64,
    cached_free: u64,
    cached_free_count: usize,
    live: usize,
    counters: CachingCounters,
}

fn pool_of(size: u64) -> Pool {
    if size <= SMALL_SIZE {
        Pool::Small
    } else {
        Pool::Large
    }
}

/// `x` rounded up to a multiple of `m` (not necessarily a power of two), or `None` on overflow.
fn round_up_to(x: u64, m: u64) -> Option<u64> {
    x.div_ceil(m).checked_mul(m)
}

/// `x` rounded down to a multiple of `m` (not necessarily a power of two).
fn round_down_to(x: u64, m: u64) -> u64 {
    x - x % m
}

/// PyTorch's `round_size` with default options: at least 512, a multiple of 512.
pub fn round_size(size: u64) -> Option<u64> {
    align_up(size.max(1), MIN_BLOCK)
}

/// PyTorch's `roundup_power2_next_division`: `size` rounded up to the next of `divisions` equal steps
/// between the powers of two around it (a power of two stays; steps of zero give the next power of two).
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
}

/// PyTorch's `get_allocation_size`: the segment size for a rounded request.
pub fn segment_size(rounded: u64) -> Option<u64> {
    if rounded <= SMALL_SIZE {
        Some(SMALL_BUFFER)
    } else if rounded < MIN_LARGE_ALLOC {
        Some(LARGE_BUFFER)
    } else {
        align_up(rounded, ROUND_LARGE)
    }
}

impl CachingAllocator {
    /// A caching allocator over `config.device_capacity` bytes of device memory.
    ///
    /// # Errors
    /// [`AllocError::InvalidConfig`] if the capacity is below 2 MiB or above 2^48 bytes, `max_split_size`
    /// is not above 1 MiB (PyTorch's limit is 20 MiB; the model accepts smaller values for experiments),
    /// the garbage-collection threshold is outside `[0, 1)`, a memory fraction is outside `(0, 1]`, a
    /// division count is not 0 or a power of two, or the request pad exceeds 2^20.
    pub fn new(config: CachingConfig) -> Result<Self, AllocError> {
        let cap = config.device_capacity;
        if !(SMALL_BUFFER..=super::MAX_BYTES).contains(&cap) {
            return Err(AllocError::InvalidConfig("device capacity must lie in [2 MiB, 2^48]"));
        }
        if config.max_split_size <= SMALL_SIZE {
            return Err(AllocError::InvalidConfig("max_split_size must exceed 1 MiB"));
        }
        if !(0.0..1.0).contains(&config.garbage_collection_threshold) {
            return Err(AllocError::InvalidConfig("garbage_collection_threshold must lie in [0, 1)"));
        }
        if config.memory_fraction.is_some_and(|f| !(f > 0.0 && f <= 1.0)) {
            return Err(AllocError::InvalidConfig("the memory fraction must lie in (0, 1]"));
        }
        if config.roundup_power2_divisions.iter().any(|&d| d != 0 && !d.is_power_of_two()) {
            return Err(AllocError::InvalidConfig("roundup_power2_divisions must be 0 or powers of two"));
        }
        if config.request_pad > SMALL_SIZE {
            return Err(AllocError::InvalidConfig("the request pad must not exceed 1 MiB"));
        }
        Ok(CachingAllocator {
            config,
            va_holes: VecDeque::from([(0, ADDRESS_RANGE)]),
            blocks: Vec::new(),
            spare: Vec::new(),
            seg_first: Vec::new(),
            walk_hint: NIL,
            seg_index: SegIndex::default(),
            free_sets: [FreeSet::default(), FreeSet::default()],
            unmapped: [BTreeMap::new(), BTreeMap::new()],
            segments: Vec::new(),
            segment_hint: 0,
            streams: vec![0],
            gc_calls: [0, 0],
            va_hint: None,
            allocated: 0,
            in_use: 0,
            reserved: 0,
            cached_free: 0,
            cached_free_count: 0,
            live: 0,
            counters: CachingCounters::default(),
        })
    }
    /// The options.
    pub fn config(&self) -> CachingConfig {
        self.config
    }

    /// Reserved bytes: non-expandable segments plus mapped pages, PyTorch's `reserved_bytes.all.current`.
    pub fn reserved_bytes(&self) -> u64 {
        self.reserved
    }

    /// Bytes of live blocks (rounding included), PyTorch's `allocated_bytes.all.current`.
    pub fn allocated_bytes(&self) -> u64 {
        self.in_use
    }

    /// Requested bytes live, PyTorch's `requested_bytes.all.current`.
    pub fn requested_bytes(&self) -> u64 {
        self.allocated
    }

    /// Free device memory a new segment or mapping can take: `capacity − reserved` in whole 2 MiB pages.
    pub fn device_free_bytes(&self) -> u64 {
        align_down(self.config.device_capacity.saturating_sub(self.reserved), SMALL_BUFFER)
    }

    /// Number of segments as a snapshot lists them (each contiguous mapped range of an expandable segment
    /// counts as one). O(blocks) for expandable segments.
    pub fn segment_count(&self) -> usize {
        self.segments.iter().flatten().filter(|s| !s.expandable).count() + self.mapped_runs().len()
    }

    /// Peaks and event counters.
    pub fn counters(&self) -> CachingCounters {
        self.counters
    }

    /// `torch.cuda.empty_cache()` (`release_cached_blocks`): releases every wholly free cached segment and
    /// unmaps every whole free page of expandable segments. Returns the bytes released.
    pub fn empty_cache(&mut self) -> u64 {
        let before = self.reserved;
        for pool in [Pool::Large, Pool::Small] {
            self.release_blocks(pool);
        }
        before - self.reserved
    }

    /// The segment holding `offset` as `(start, size, expandable)` (an expandable segment's whole virtual
    /// reservation), if any.
    pub fn segment_at(&self, offset: u64) -> Option<(u64, u64, bool)> {
        let (_, id) = self.seg_index.at_or_before(offset)?;
        let s = self.seg(id);
        (offset < s.start + s.size).then_some((s.start, s.size, s.expandable))
    }

    /// Start of the expandable reservation of (`pool`, `stream`), if it exists.
    pub fn reservation_start(&self, pool: Pool, stream: i64) -> Option<u64> {
        let st = self.streams.iter().position(|&s| s == stream)? as u32;
        self.segments.iter().flatten().find(|s| s.expandable && s.pool == pool && s.stream == st).map(|s| s.start)
    }

    /// Releases the non-expandable segment that starts at `start` if it is wholly free (`release_block`, as
    /// a replay does at a recorded `segment_free`). Returns its size.
    ///
    /// # Errors
    /// [`AllocError::InvalidFree`] when no wholly free non-expandable segment starts there.
    pub fn release_segment(&mut self, start: u64) -> Result<u64, AllocError> {
        let id = self.seg_index.get(start).ok_or(AllocError::InvalidFree { offset: start })?;
        let n = self.seg_first[id as usize];
        let b = self.blocks[n as usize];
        if b.state != FREE || !self.releasable(n) {
            return Err(AllocError::InvalidFree { offset: start });
        }
        self.release_block(n);
        Ok(b.size)
    }

    /// Unmaps the whole pages of `[offset, offset + size)` that lie in free blocks of an expandable segment
    /// (`unmap_block` on that part of each free block, as a replay does at a recorded `segment_unmap`).
    /// Returns the bytes unmapped.
    pub fn unmap_range(&mut self, offset: u64, size: u64) -> u64 {
        let end = offset.saturating_add(size);
        let mut unmapped = 0;
        let mut at = offset;
        while at < end {
            let Some(n) = self.find_block(at, end, |b| b.state == FREE) else {
                break;
            };
            let b = self.blocks[n as usize];
            let b_end = b.off + b.size;
            at = b_end;
            if !self.seg(b.seg).expandable {
                continue;
            }
            let (lo, hi) = (b.off.max(offset), b_end.min(end));
            self.uncache(n);
            let mut mid = n;
            if lo > b.off {
                mid = self.split(n, lo - b.off);
                self.cache(n);
            }
            if b_end > hi {
                let tail = self.split(mid, hi - lo);
                self.cache(tail);
            }
            self.cache(mid);
            unmapped += self.unmap_block(mid);
            // Pieces that stayed mapped merge back with their free neighbours.
            for p in [lo, hi] {
                if let Some(k) = self.block_at(p).filter(|&k| self.blocks[k as usize].state == FREE) {
                    self.uncache(k);
                    self.merge_free(k);
                }
            }
        }
        unmapped
    }

    /// The first block (ascending) that overlaps `[a, e)` and satisfies `pred`. Walks the chains of the
    /// segments that overlap the range: O(blocks of those segments), for the cold paths.
    fn find_block(&self, a: u64, e: u64, pred: impl Fn(&Block) -> bool) -> Option<u32> {
        let first = self.seg_index.at_or_before(a).map_or(a, |(s, _)| s);
        for (_, id) in self.seg_index.starting_in(first, e) {
            let mut n = self.seg_first[id as usize];
            while n != NIL {
                let b = &self.blocks[n as usize];
                if b.off >= e {
                    break;
                }
                if b.off + b.size > a && pred(b) {
                    return Some(n);
                }
                n = b.next;
            }
        }
        None
    }

    /// The block that holds `offset`, if any: a walk from `walk_hint` when that block lies at or before
    /// `offset` in the same segment, else from the segment's first block. O(blocks of its segment).
    fn block_containing(&self, offset: u64) -> Option<u32> {
        // Any block record in use is a valid start: blocks tile their segment, so the first block from it
        // that ends after `offset` holds it; the chain's end (NIL) means another segment.
        let mut n = self.walk_hint;
        if self.blocks.get(n as usize).is_some_and(|b| b.state != SPARE && b.off <= offset) {
            while n != NIL {
                let b = &self.blocks[n as usize];
                if offset - b.off < b.size {
                    return Some(n);
                }
                n = b.next;
            }
        }
        self.find_block(offset, offset.checked_add(1)?, |_| true)
    }

    /// The block that starts at `offset`, if any: a walk of its segment's chain, O(blocks of the segment),
    /// for `free_at` and the cold paths (`alloc`/`free` never look a block up by offset).
    fn block_at(&self, offset: u64) -> Option<u32> {
        let (_, id) = self.seg_index.at_or_before(offset)?;
        let mut n = self.seg_first[id as usize];
        while n != NIL {
            let b = &self.blocks[n as usize];
            if b.off >= offset {
                return (b.off == offset).then_some(n);
            }
            n = b.next;
        }
        None
    }

    /// The dense index of stream handle `stream`.
    fn stream_index(&mut self, stream: i64) -> u32 {
        match self.streams.iter().position(|&s| s == stream) {
            Some(i) => i as u32,
            None => {
                self.streams.push(stream);
                (self.streams.len() - 1) as u32
            }
        }
    }

    /// Seeds a segment that existed before a trace replay began (a trace recorded mid-run): `size` bytes
    /// (a multiple of 512) in `pool` on stream 0, wholly free. See [`CachingAllocator::seed_segment_on`].
    ///
    /// # Errors
    /// As [`CachingAllocator::seed_segment_on`].
    pub fn seed_segment(&mut self, size: u64, pool: Pool) -> Result<u64, AllocError> {
        self.seed_segment_on(size, pool, 0)
    }

    /// Seeds a non-expandable segment of `size` bytes (a multiple of 512) in `pool` on `stream`, wholly
    /// free, at the lowest free virtual address. Not counted in [`CachingCounters::segment_allocs`].
    /// Returns its offset; replay maps the recorded segment there and its blocks to the same relative
    /// positions ([`CachingAllocator::seed_block`]).
    ///
    /// # Errors
    /// [`AllocError::SizeOverflow`] for a zero or unaligned size; [`AllocError::OutOfMemory`] when the
    /// device has fewer free bytes.
    pub fn seed_segment_on(&mut self, size: u64, pool: Pool, stream: i64) -> Result<u64, AllocError> {
        if size == 0 || !size.is_multiple_of(MIN_BLOCK) || size > super::MAX_BYTES {
            return Err(AllocError::SizeOverflow { size });
        }
        if size > self.config.device_capacity - self.reserved {
            return Err(oom(size, self.config.device_capacity - self.reserved, 0));
        }
        let st = self.stream_index(stream);
        let start = self.va_alloc(size).ok_or(oom(size, 0, 0))?;
        let id = self.new_segment(Segment { start, size, pool, stream: st, expandable: false });
        self.add_reserved(size);
        let n = self.segment_block(id);
        self.cache(n);
        Ok(start)
    }

    /// Seeds a mapped range of the expandable segment of (`pool`, `stream`) that existed before a trace
    /// replay began: `size` bytes at `rel` bytes from the start of the segment's virtual reservation (both
    /// multiples of the pool's page), wholly free. The reservation is created on first use with
    /// `max(1⅛ × capacity, span)` bytes. Not counted in [`CachingCounters::segment_allocs`]. Returns the
    /// offset of the range.
    ///
    /// # Errors
    /// [`AllocError::InvalidRelocation`] for unaligned values or a range that is not wholly unmapped;
    /// [`AllocError::OutOfMemory`] when the device has fewer free bytes.
    pub fn seed_mapped(&mut self, pool: Pool, stream: i64, rel: u64, size: u64, span: u64) -> Result<u64, AllocError> {
        let page = pool.page();
        let bad = AllocError::InvalidRelocation("seeded mapped range not page-aligned inside unmapped space");
        if size == 0 || !rel.is_multiple_of(page) || !size.is_multiple_of(page) {
            return Err(bad);
        }
        if size > self.config.device_capacity - self.reserved {
            return Err(oom(size, self.config.device_capacity - self.reserved, 0));
        }
        let st = self.stream_index(stream);
        let existing =
            self.segments.iter().position(|s| s.is_some_and(|s| s.expandable && s.pool == pool && s.stream == st));
        let id = match existing {
            Some(id) => id as u32,
            None => {
                let len = self.reservation_size(pool).max(round_up_to(span, page).ok_or(bad.clone())?);
                self.new_reservation(pool, st, len).ok_or(oom(size, 0, 0))?
            }
        };
        let seg = self.seg(id);
        let off = seg.start.checked_add(rel).ok_or(bad.clone())?;
        let end = off.checked_add(size).ok_or(bad.clone())?;
        let n = self.block_containing(off).ok_or(bad.clone())?;
        let ub = self.blocks[n as usize];
        if ub.state != UNMAPPED || ub.seg != id || end > ub.off + ub.size {
            return Err(bad);
        }
        self.unpark(n);
        let mut mid = n;
        if off > ub.off {
            mid = self.split(n, off - ub.off);
            self.park(n);
        }
        if ub.off + ub.size > end {
            let tail = self.split(mid, size);
            self.park(tail);
        }
        self.add_reserved(size);
        self.merge_free(mid);
        Ok(off)
    }

    /// Seeds a live block of `size` bytes (the block's rounded size as the snapshot records it, a multiple
    /// of 512) at `offset`, inside a free block of a seeded segment, with `requested` bytes asked for. The
    /// free rest of that block stays free on both sides (within the segment). The block belongs to its
    /// segment's stream.
    ///
    /// # Errors
    /// [`AllocError::InvalidRelocation`] when `[offset, offset + size)` is not inside one free block or is
    /// unaligned; [`AllocError::ZeroSize`] for `size == 0`.
    pub fn seed_block(&mut self, offset: u64, size: u64, requested: u64) -> Result<Allocation, AllocError> {
        if size == 0 {
            return Err(AllocError::ZeroSize);
        }
        let bad = AllocError::InvalidRelocation("seeded block not inside one free block of a segment");
        if !offset.is_multiple_of(MIN_BLOCK) || !size.is_multiple_of(MIN_BLOCK) {
            return Err(bad);
        }
        let n = self.block_containing(offset).ok_or(bad.clone())?;
        let fb = self.blocks[n as usize];
        let end = offset.checked_add(size).ok_or(bad.clone())?;
        if fb.state != FREE || end > fb.off + fb.size {
            return Err(bad);
        }
        self.uncache(n);
        let mut mid = n;
        if offset > fb.off {
            mid = self.split(n, offset - fb.off);
            self.cache(n);
        }
        if fb.off + fb.size > end {
            let tail = self.split(mid, size);
            self.cache(tail);
        }
        self.make_live(mid, requested.min(size));
        self.walk_hint = mid;
        Ok(Allocation { offset, size, handle: Handle::new(mid, 0) })
    }

    /// The blocks of `[a, e)` in address order; `a` must be a block's start.
    fn chain(&self, a: u64, e: u64) -> impl Iterator<Item = &Block> + '_ {
        let mut n = self.block_at(a).unwrap_or(NIL);
        std::iter::from_fn(move || {
            let b = self.blocks.get(n as usize).filter(|b| b.off < e)?;
            n = b.next;
            Some(b)
        })
    }

    /// Segments with their blocks, ascending by offset (expandable segments: one entry per contiguous
    /// mapped range, as in a snapshot).
    pub fn segments(&self) -> Vec<SegmentInfo> {
        let mut ranges: Vec<(u64, u64, u32)> = self
            .segments
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.filter(|s| !s.expandable).map(|s| (s.start, s.start + s.size, i as u32)))
            .collect();
        ranges.extend(self.mapped_runs());
        ranges.sort_unstable();
        ranges
            .into_iter()
            .map(|(a, b, id)| {
                let s = self.seg(id);
                let blocks: Vec<(u64, u64, bool)> =
                    self.chain(a, b).map(|k| (k.off, k.size, k.state == LIVE)).collect();
                let in_use = blocks.iter().filter(|b| b.2).map(|b| b.1).sum();
                SegmentInfo {
                    offset: a,
                    size: b - a,
                    pool: s.pool,
                    stream: self.streams[s.stream as usize],
                    expandable: s.expandable,
                    in_use,
                    blocks,
                }
            })
            .collect()
    }

    /// Contiguous mapped ranges of expandable segments as `(start, end, segment id)`, ascending.
    fn mapped_runs(&self) -> Vec<(u64, u64, u32)> {
        let mut runs: Vec<(u64, u64, u32)> = Vec::new();
        for (start, id) in self.seg_index.iter() {
            let s = self.seg(id);
            if !s.expandable {
                continue;
            }
            for b in self.chain(start, start + s.size) {
                if b.state == UNMAPPED {
                    continue;
                }
                match runs.last_mut() {
                    Some(r) if r.1 == b.off && r.2 == id => r.1 = b.off + b.size,
                    _ => runs.push((b.off, b.off + b.size, id)),
                }
            }
        }
        runs
    }

    fn seg(&self, id: u32) -> Segment {
        self.segments[id as usize].expect("live segment id")
    }

    fn add_reserved(&mut self, bytes: u64) {
        self.reserved += bytes;
        self.counters.peak_reserved = self.counters.peak_reserved.max(self.reserved);
    }

    /// A new record for `b` (a spare slot if any). Links are the caller's.
    fn new_block(&mut self, b: Block) -> u32 {
        match self.spare.pop() {
            Some(n) => {
                self.blocks[n as usize] = b;
                n
            }
            None => {
                self.blocks.push(b);
                (self.blocks.len() - 1) as u32
            }
        }
    }

    /// Frees the record `n` (its block is in no set; the caller has unlinked it or drops its whole chain).
    fn drop_block(&mut self, n: u32) {
        self.blocks[n as usize].state = SPARE;
        self.spare.push(n);
    }

    /// The single block that covers segment `id` (a new segment or reservation), in no set yet; it is the
    /// segment's first block.
    fn segment_block(&mut self, id: u32) -> u32 {
        let s = self.seg(id);
        let n = self.new_block(Block {
            off: s.start,
            size: s.size,
            requested: 0,
            gc_base: 0,
            seg: id,
            stream: s.stream,
            prev: NIL,
            next: NIL,
            state: FREE,
            pool: s.pool as u8,
        });
        if self.seg_first.len() <= id as usize {
            self.seg_first.resize(id as usize + 1, NIL);
        }
        self.seg_first[id as usize] = n;
        n
    }

    /// Splits block `n` (in no set) `k` bytes after its start: `n` keeps `[off, off + k)`, a new block of the
    /// same segment, stream and state (returned, in no set) takes the rest.
    fn split(&mut self, n: u32, k: u64) -> u32 {
        let b = self.blocks[n as usize];
        debug_assert!(k > 0 && k < b.size);
        let m = self.new_block(Block { off: b.off + k, size: b.size - k, prev: n, next: b.next, ..b });
        if b.next != NIL {
            self.blocks[b.next as usize].prev = m;
        }
        let bn = &mut self.blocks[n as usize];
        bn.size = k;
        bn.next = m;
        m
    }

    /// Block `n` takes over the next block of its segment (in no set), whose record is freed.
    fn absorb_next(&mut self, n: u32) {
        let m = self.blocks[n as usize].next;
        let bm = self.blocks[m as usize];
        let bn = &mut self.blocks[n as usize];
        bn.size += bm.size;
        bn.next = bm.next;
        if bm.next != NIL {
            self.blocks[bm.next as usize].prev = n;
        }
        self.drop_block(m);
    }

    /// Block `n` becomes live with `requested` bytes asked for.
    fn make_live(&mut self, n: u32, requested: u64) {
        let b = &mut self.blocks[n as usize];
        b.state = LIVE;
        b.requested = requested;
        b.gc_base = 0;
        self.allocated += requested;
        self.in_use += b.size;
        self.live += 1;
        let c = &mut self.counters;
        c.peak_allocated = c.peak_allocated.max(self.allocated);
        c.peak_in_use = c.peak_in_use.max(self.in_use);
    }

    /// `BlockPool::insert_into_blocks`: caches block `n` as free (its age starts now).
    fn cache(&mut self, n: u32) {
        let b = &mut self.blocks[n as usize];
        let pool = b.pool as usize;
        b.state = FREE;
        b.requested = 0;
        b.gc_base = self.gc_calls[pool];
        self.free_sets[pool].insert(b.stream, b.size, b.off, n);
        self.cached_free += b.size;
        self.cached_free_count += 1;
    }

    /// Takes the free block `n` out of its free set (it stays a block for the caller to change).
    fn uncache(&mut self, n: u32) {
        let b = &self.blocks[n as usize];
        debug_assert_eq!(b.state, FREE);
        self.free_sets[b.pool as usize].remove(b.stream, b.size, b.off, n);
        self.cached_free -= b.size;
        self.cached_free_count -= 1;
    }

    /// [`CachingAllocator::uncache`] of the free block `n` found at `at` in its free set.
    fn uncache_at(&mut self, n: u32, at: Pos) {
        let b = &self.blocks[n as usize];
        debug_assert_eq!(b.state, FREE);
        self.free_sets[b.pool as usize].remove_at(b.stream, at);
        self.cached_free -= b.size;
        self.cached_free_count -= 1;
    }

    /// Block `n` becomes unmapped, in its pool's unmapped set.
    fn park(&mut self, n: u32) {
        let b = &mut self.blocks[n as usize];
        b.state = UNMAPPED;
        b.requested = 0;
        b.gc_base = 0;
        self.unmapped[b.pool as usize].insert((b.stream, b.off), n);
    }

    /// Takes the unmapped block `n` out of its unmapped set.
    fn unpark(&mut self, n: u32) {
        let b = &self.blocks[n as usize];
        debug_assert_eq!(b.state, UNMAPPED);
        self.unmapped[b.pool as usize].remove(&(b.stream, b.off));
    }

    /// `free_block` / `try_merge_blocks`: block `n` (in no set) is cached as free, merged with the free
    /// (mapped) neighbours of its segment. Returns the merged block.
    fn merge_free(&mut self, mut n: u32) -> u32 {
        let next = self.blocks[n as usize].next;
        if next != NIL && self.blocks[next as usize].state == FREE {
            self.uncache(next);
            self.absorb_next(n);
        }
        let prev = self.blocks[n as usize].prev;
        if prev != NIL && self.blocks[prev as usize].state == FREE {
            self.uncache(prev);
            self.absorb_next(prev);
            n = prev;
        }
        self.cache(n);
        n
    }

    /// Block `n` (in no set) merged with the unmapped neighbours of its segment; the result is in no set.
    fn merge_unmapped(&mut self, mut n: u32) -> u32 {
        let next = self.blocks[n as usize].next;
        if next != NIL && self.blocks[next as usize].state == UNMAPPED {
            self.unpark(next);
            self.absorb_next(n);
        }
        let prev = self.blocks[n as usize].prev;
        if prev != NIL && self.blocks[prev as usize].state == UNMAPPED {
            self.unpark(prev);
            self.absorb_next(prev);
            n = prev;
        }
        n
    }

    fn new_segment(&mut self, s: Segment) -> u32 {
        let free = self.segments[self.segment_hint..].iter().position(Option::is_none);
        let id = if let Some(i) = free.map(|i| i + self.segment_hint) {
            self.segments[i] = Some(s);
            i
        } else {
            self.segments.push(Some(s));
            self.segments.len() - 1
        };
        self.segment_hint = id + 1;
        let id = id as u32;
        self.seg_index.insert(s.start, id);
        id
    }

    fn drop_segment(&mut self, id: u32) {
        let s = self.seg(id);
        self.seg_index.remove(s.start);
        self.segments[id as usize] = None;
        self.segment_hint = self.segment_hint.min(id as usize);
    }
    /// Places the next new segment (or expandable reservation) at virtual address `addr` when that range is
    /// unused, instead of the lowest unused range. A replay passes the address a recorded `segment_alloc`
    /// (or first `segment_map`) shows, so that the model's addresses, and with them the address order that
    /// breaks ties between equal-size cached blocks (`BlockComparatorSize`), are PyTorch's. The hint is
    /// used by the next segment created and dropped by the next [`CachingAllocator::alloc_on`].
    pub fn hint_next_segment(&mut self, addr: Option<u64>) {
        self.va_hint = addr;
    }

    /// The unused virtual range of `size` bytes at the hint if possible, else the lowest one.
    fn va_alloc(&mut self, size: u64) -> Option<u64> {
        if let Some(a) = self.va_hint.take() {
            // The last range starting at or before `a` (when seeding in address order: the last range).
            let n = self.va_holes.len();
            let k = if self.va_holes.back().is_some_and(|h| h.0 <= a) {
                n.checked_sub(1)
            } else {
                self.va_holes.partition_point(|h| h.0 <= a).checked_sub(1)
            };
            if let Some(k) = k {
                let (hs, hl) = self.va_holes[k];
                if a.checked_add(size).is_some_and(|e| e <= hs + hl) && a.is_multiple_of(MIN_BLOCK) {
                    self.va_take(k, a, size);
                    return Some(a);
                }
            }
        }
        let k = self.va_holes.iter().position(|h| h.1 >= size)?;
        let start = self.va_holes[k].0;
        self.va_take(k, start, size);
        Some(start)
    }

    /// Takes `[a, a + size)` out of the unused range `va_holes[k]`, which holds it.
    fn va_take(&mut self, k: usize, a: u64, size: u64) {
        let (hs, hl) = self.va_holes[k];
        let (front, back) = (a - hs, hs + hl - (a + size));
        match (front > 0, back > 0) {
            (true, true) => {
                self.va_holes[k].1 = front;
                self.va_holes.insert(k + 1, (a + size, back));
            }
            (true, false) => self.va_holes[k].1 = front,
            (false, true) => self.va_holes[k] = (a + size, back),
            (false, false) => {
                self.va_holes.remove(k);
            }
        }
    }

    /// Returns `[start, start + len)` to the unused ranges, merged with the ranges it touches.
    fn va_free(&mut self, start: u64, len: u64) {
        // The first range starting at or after `start`, and the one before it.
        let i = self.va_holes.partition_point(|h| h.0 < start);
        let next = self.va_holes.get(i).is_some_and(|h| h.0 == start + len);
        let prev = i.checked_sub(1).is_some_and(|p| self.va_holes[p].0 + self.va_holes[p].1 == start);
        match (prev, next) {
            (true, true) => {
                let n = self.va_holes.remove(i).map_or(0, |h| h.1);
                self.va_holes[i - 1].1 += len + n;
            }
            (true, false) => self.va_holes[i - 1].1 += len,
            (false, true) => self.va_holes[i] = (start, self.va_holes[i].1 + len),
            (false, false) => self.va_holes.insert(i, (start, len)),
        }
    }

    /// Virtual bytes of an expandable reservation: `totalGlobalMem + totalGlobalMem / 8` in whole pages
    /// (`ExpandableSegment`).
    fn reservation_size(&self, pool: Pool) -> u64 {
        let cap = self.config.device_capacity;
        round_up_to(cap + cap / 8, pool.page())
            .unwrap_or(ADDRESS_RANGE)
            .min(round_down_to(ADDRESS_RANGE / 4, pool.page()))
    }

    fn new_reservation(&mut self, pool: Pool, stream: u32, len: u64) -> Option<u32> {
        let start = self.va_alloc(len)?;
        let id = self.new_segment(Segment { start, size: len, pool, stream, expandable: true });
        let n = self.segment_block(id);
        self.park(n);
        Some(id)
    }

    /// `get_free_block`: the cached block to use for a rounded request, still in the free set, with its
    /// position there when the search found it directly (not through the expandable-segment rule).
    fn get_free_block(&mut self, pool: Pool, stream: u32, size: u64) -> Option<(u32, Option<Pos>)> {
        if self.config.gc_active() {
            self.gc_calls[pool as usize] += 1;
        }
        let ((_, _, mut cur), at) = self.free_sets[pool as usize].first_at_least(stream, size)?;
        let mut at = Some(at);
        if self.config.expandable_segments && self.seg(self.blocks[cur as usize].seg).expandable {
            let it = self.free_sets[pool as usize].at_least(stream, size).skip(1);
            let room = |n: u32| {
                let b = &self.blocks[n as usize];
                let next = self.blocks.get(b.next as usize).filter(|x| x.state == UNMAPPED);
                b.size + next.map_or(0, |x| x.size)
            };
            for (_, _, next) in it {
                if room(next) >= room(cur) {
                    break;
                }
                cur = next;
                at = None;
                if !self.seg(self.blocks[cur as usize].seg).expandable {
                    break;
                }
            }
        }
        let cur_size = self.blocks[cur as usize].size;
        let max_split = self.config.max_split_size;
        if size < max_split && cur_size >= max_split {
            return None;
        }
        if size >= max_split && cur_size >= size.saturating_add(self.config.max_non_split_rounding) {
            return None;
        }
        Some((cur, at))
    }

    /// `alloc_block`: a new segment (or expandable mapping) for a rounded request; returns a cached block
    /// that holds it, still in the free set.
    fn alloc_block(&mut self, pool: Pool, stream: u32, size: u64, alloc_size: u64) -> Option<u32> {
        if self.config.memory_fraction.is_some()
            && self.reserved.saturating_add(alloc_size) > self.config.allowed_memory_maximum()
        {
            return None;
        }
        if self.config.expandable_segments {
            return self.try_allocate_expandable_block(pool, stream, size);
        }
        if alloc_size > self.device_free_bytes() {
            return None;
        }
        let start = self.va_alloc(alloc_size)?;
        let id = self.new_segment(Segment { start, size: alloc_size, pool, stream, expandable: false });
        self.add_reserved(alloc_size);
        self.counters.segment_allocs += 1;
        let n = self.segment_block(id);
        self.cache(n);
        Some(n)
    }

    /// `try_allocate_expandable_block`.
    fn try_allocate_expandable_block(&mut self, pool: Pool, stream: u32, size: u64) -> Option<u32> {
        let mut cand = self.find_expandable_block(pool, stream, size)?;
        if self.blocks[cand as usize].state == UNMAPPED {
            let len = self.blocks[cand as usize].size.min(size);
            cand = self.map_block(cand, len)?;
        }
        while self.blocks[cand as usize].size < size {
            let b = self.blocks[cand as usize];
            let next = self.blocks.get(b.next as usize).filter(|n| n.state == UNMAPPED)?;
            let len = (size - b.size).min(next.size);
            cand = self.map_block(b.next, len)?;
        }
        Some(cand)
    }

    /// `find_expandable_block`: the lowest unmapped range of the stream's reservation (with the free block
    /// before it) with room for `size` bytes, or a new reservation. Returns the first block of it.
    fn find_expandable_block(&mut self, pool: Pool, stream: u32, size: u64) -> Option<u32> {
        let p = pool as usize;
        let mut key = (stream, 0u64);
        while let Some((&(st, off), &n)) = self.unmapped[p].range(key..).next() {
            if st != stream {
                break;
            }
            key = (stream, off + 1);
            let prev = self.blocks[n as usize].prev;
            let c = if prev != NIL && self.blocks[prev as usize].state == FREE { prev } else { n };
            let (mut bytes, mut at) = (0u64, c);
            while bytes < size && at != NIL {
                let b = &self.blocks[at as usize];
                if b.state == LIVE {
                    break;
                }
                bytes += b.size;
                at = b.next;
            }
            if bytes >= size {
                return Some(c);
            }
        }
        let len = self.reservation_size(pool);
        let id = self.new_reservation(pool, stream, len)?;
        Some(self.seg_first[id as usize])
    }

    /// `map_block`: maps the pages covering the first `size` bytes of the unmapped block `n` if the device
    /// has them; returns the resulting cached block (merged with free neighbours).
    fn map_block(&mut self, n: u32, size: u64) -> Option<u32> {
        let b = self.blocks[n as usize];
        let page = self.seg(b.seg).pool.page();
        let bytes = round_up_to(size, page)?.min(b.size);
        if bytes > self.device_free_bytes() {
            return None;
        }
        self.unpark(n);
        if bytes < b.size {
            let tail = self.split(n, bytes);
            self.park(tail);
        }
        self.add_reserved(bytes);
        self.counters.segment_allocs += 1;
        Some(self.merge_free(n))
    }

    /// `unmap_block`: unmaps the whole pages inside the cached free block `n`. Returns the bytes unmapped.
    fn unmap_block(&mut self, n: u32) -> u64 {
        let b = self.blocks[n as usize];
        let seg = self.seg(b.seg);
        let page = seg.pool.page();
        let rel = b.off - seg.start;
        let begin = seg.start + round_up_to(rel, page).expect("inside the range");
        let end = seg.start + round_down_to(rel + b.size, page);
        if begin >= end {
            return 0;
        }
        self.uncache(n);
        let mut mid = n;
        if begin > b.off {
            mid = self.split(n, begin - b.off);
            self.cache(n);
        }
        if b.off + b.size > end {
            let tail = self.split(mid, end - begin);
            self.cache(tail);
        }
        let m = self.merge_unmapped(mid);
        self.reserved -= end - begin;
        self.counters.segment_frees += 1;
        let mb = self.blocks[m as usize];
        if mb.off == seg.start && mb.size == seg.size {
            // `release_expandable_segment`: nothing mapped any more.
            self.drop_block(m);
            self.va_free(seg.start, seg.size);
            self.drop_segment(b.seg);
        } else {
            self.park(m);
        }
        end - begin
    }

    /// `release_block`: returns the wholly free non-expandable segment of the cached block `n` to the device.
    fn release_block(&mut self, n: u32) {
        let b = self.blocks[n as usize];
        self.uncache(n);
        let seg = self.seg(b.seg);
        debug_assert!(!seg.expandable && seg.start == b.off && seg.size == b.size);
        self.drop_block(n);
        self.va_free(seg.start, seg.size);
        self.drop_segment(b.seg);
        self.reserved -= seg.size;
        self.counters.segment_frees += 1;
    }

    fn is_whole_segment(&self, n: u32) -> bool {
        let b = &self.blocks[n as usize];
        b.prev == NIL && b.next == NIL
    }

    /// Whether the cached block `n` is a whole non-expandable segment. With PyTorch's smallest
    /// `max_split_size` (20 MiB) every cached block at or above it is one; the model also accepts smaller
    /// values, and then skips split blocks instead of releasing part of a segment.
    fn releasable(&self, n: u32) -> bool {
        !self.seg(self.blocks[n as usize].seg).expandable && self.is_whole_segment(n)
    }

    /// `release_blocks` of one pool: whole free segments are released, free expandable pages unmapped.
    fn release_blocks(&mut self, pool: Pool) {
        let nodes: Vec<u32> = self.free_sets[pool as usize].iter().map(|x| x.3).collect();
        let mut to_unmap = Vec::new();
        for n in nodes {
            if self.seg(self.blocks[n as usize].seg).expandable {
                to_unmap.push(n);
            } else if self.is_whole_segment(n) {
                self.release_block(n);
            }
        }
        for n in to_unmap {
            self.unmap_block(n);
        }
    }

    /// `release_available_cached_blocks`: with `max_split_size` set, releases one cached oversize block
    /// that holds the request, else oversize blocks from the largest down until their bytes cover it.
    fn release_available_cached_blocks(&mut self, pool: Pool, stream: u32, size: u64) -> bool {
        let max_split = self.config.max_split_size;
        if max_split == u64::MAX {
            return false;
        }
        let key = size.max(max_split);
        let first = self.free_sets[pool as usize].first_at_least(stream, key);
        if let Some(((_, _, n), _)) = first {
            if self.releasable(n) {
                self.release_block(n);
                return true;
            }
        }
        // The stream's blocks of `max_split ..key` bytes, from the largest down.
        let mut below: Vec<(u64, u32)> = self.free_sets[pool as usize]
            .iter()
            .filter(|x| x.0 == stream && x.1 >= max_split && x.1 < key)
            .map(|x| (x.1, x.3))
            .collect();
        below.reverse();
        let mut released = 0u64;
        for (size, n) in below {
            if released >= key {
                break;
            }
            if self.releasable(n) {
                self.release_block(n);
                released += size;
            }
        }
        released >= key
    }

    /// `garbage_collect_cached_blocks`.
    fn garbage_collect(&mut self) {
        let threshold = (self.config.garbage_collection_threshold * self.config.allowed_memory_maximum() as f64) as u64;
        if self.reserved <= threshold {
            return;
        }
        let target = self.reserved - threshold;
        let now = self.gc_calls[Pool::Large as usize];
        // (record, size, age, releasable): whole (unsplit) free blocks of the large pool.
        let mut cands: Vec<(u32, u64, u64, bool)> = self.free_sets[Pool::Large as usize]
            .iter()
            .map(|x| x.3)
            .filter(|&n| self.is_whole_segment(n))
            .map(|n| {
                let b = self.blocks[n as usize];
                (n, b.size, now - b.gc_base, !self.seg(b.seg).expandable)
            })
            .collect();
        let mut total_age: u64 = cands.iter().map(|c| c.2).sum();
        let mut count = cands.len() as u64;
        let (mut reclaimed, mut freed) = (0u64, true);
        while reclaimed < target && freed && count > 0 {
            let age_threshold = total_age as f64 / count as f64;
            freed = false;
            for c in cands.iter_mut().filter(|c| c.3) {
                if c.2 as f64 >= age_threshold {
                    freed = true;
                    reclaimed += c.1;
                    total_age -= c.2;
                    count -= 1;
                    c.3 = false;
                    c.1 = 0;
                    self.release_block(c.0);
                    self.counters.gc_releases += 1;
                }
            }
            cands.retain(|c| c.1 > 0);
        }
    }

    /// Allocates `size` bytes on `stream` (PyTorch's `malloc`). The block is 512-byte aligned; its size is
    /// the rounded request, or a whole cached block when the remainder is not split off.
    ///
    /// # Errors
    /// [`AllocError::ZeroSize`], [`AllocError::SizeOverflow`], and [`AllocError::OutOfMemory`] after the
    /// release-and-retry steps, with the device's free bytes plus the cached free bytes and the largest of
    /// the device's free bytes and the largest cached block.
    pub fn alloc_on(&mut self, size: u64, stream: i64) -> Result<Allocation, AllocError> {
        check_request(size, 1, MIN_BLOCK)?;
        let rounded =
            self.config.round_size(size).filter(|&r| r <= super::MAX_BYTES).ok_or(AllocError::SizeOverflow { size })?;
        let pool = pool_of(rounded);
        let alloc_size = segment_size(rounded).ok_or(AllocError::SizeOverflow { size })?;
        let st = self.stream_index(stream);
        let mut found = self.get_free_block(pool, st, rounded);
        if found.is_none() {
            if self.config.gc_active() {
                self.garbage_collect();
            }
            let mut new = self.alloc_block(pool, st, rounded, alloc_size);
            if new.is_none() && self.release_available_cached_blocks(pool, st, rounded) {
                new = self.alloc_block(pool, st, rounded, alloc_size);
            }
            if new.is_none() {
                self.counters.alloc_retries += 1;
                self.empty_cache();
                new = self.alloc_block(pool, st, rounded, alloc_size);
            }
            found = new.map(|n| (n, None));
        }
        let Some((mut n, at)) = found else {
            self.va_hint = None;
            self.counters.ooms += 1;
            let dev = self.config.device_capacity - self.reserved;
            return Err(oom(size, dev + self.cached_free, dev.max(self.largest_cached())));
        };
        match at {
            // The search's own position: no second lookup.
            Some(at) => self.uncache_at(n, at),
            None => self.uncache(n),
        }
        let b = self.blocks[n as usize];
        let align = self.config.base_addr_align;
        if align != 0 && rounded >= ROUND_LARGE && self.config.expandable_segments && !b.off.is_multiple_of(align) {
            // torch_npu: start large blocks on an `align` boundary; the bytes before stay cached.
            let front = align - b.off % align;
            if front + rounded <= b.size {
                let m = self.split(n, front);
                self.cache(n);
                n = m;
            }
        }
        let remaining = self.blocks[n as usize].size - rounded;
        let split = if pool == Pool::Small || self.config.expandable_segments {
            remaining >= MIN_BLOCK
        } else {
            rounded < self.config.max_split_size && remaining > SMALL_SIZE
        };
        if split {
            let rest = self.split(n, rounded);
            self.cache(rest);
        }
        self.make_live(n, size);
        self.va_hint = None;
        let b = &self.blocks[n as usize];
        Ok(Allocation { offset: b.off, size: b.size, handle: Handle::new(n, 0) })
    }

    /// Device free bytes listed as the lowest unused virtual ranges, `capacity − reserved` bytes in all.
    fn device_ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let mut left = self.config.device_capacity - self.reserved;
        self.va_holes.iter().map_while(move |&(o, l)| {
            let take = l.min(left);
            left -= take;
            (take > 0).then_some((o, take))
        })
    }

    fn largest_cached(&self) -> u64 {
        self.free_sets.iter().map(FreeSet::largest).max().unwrap_or(0)
    }

    /// Frees the live block `n` (`free_block`).
    fn free_block(&mut self, n: u32) {
        let b = &self.blocks[n as usize];
        self.allocated -= b.requested;
        self.in_use -= b.size;
        self.live -= 1;
        self.merge_free(n);
    }
}

impl SubAllocator for CachingAllocator {
    fn name(&self) -> &'static str {
        "caching"
    }

    /// Its segments: [`CachingAllocator::reserved_bytes`].
    fn segment_bytes(&self) -> Option<u64> {
        Some(self.reserved_bytes())
    }

    /// The model's virtual address range, [`ADDRESS_RANGE`] bytes (the device's memory is
    /// [`CachingConfig::device_capacity`], [`Stats::capacity`]).
    fn capacity(&self) -> u64 {
        ADDRESS_RANGE
    }

    /// Allocates on the default stream (0); see [`CachingAllocator::alloc_on`].
    ///
    /// # Errors
    /// As [`CachingAllocator::alloc_on`]; alignments above 512 B are rejected with
    /// [`AllocError::BadAlignment`] (PyTorch guarantees 512 B and takes no alignment argument).
    fn alloc(&mut self, size: u64, align: u64) -> Result<Allocation, AllocError> {
        check_request(size, align, MIN_BLOCK)?;
        if align > MIN_BLOCK {
            return Err(AllocError::BadAlignment { align });
        }
        self.alloc_on(size, 0)
    }
    /// Finds the block through `a.handle` (its record) when the record still holds the live block at
    /// `a.offset`, else by `a.offset` ([`SubAllocator::free_at`]).
    fn free(&mut self, a: Allocation) -> Result<(), AllocError> {
        let n = a.handle.index();
        if self.blocks.get(n).is_some_and(|b| b.state == LIVE && b.off == a.offset) {
            self.free_block(n as u32);
            return Ok(());
        }
        self.free_at(a.offset)
    }

    /// Walks the chain of the segment holding `offset` (O(blocks of the segment); `free` is O(1)).
    fn free_at(&mut self, offset: u64) -> Result<(), AllocError> {
        match self.block_at(offset) {
            Some(n) if self.blocks[n as usize].state == LIVE => {
                self.free_block(n);
                Ok(())
            }
            _ => {
                let in_free = self.free_blocks().any(|(o, l)| offset >= o && offset - o < l);
                Err(if in_free { AllocError::DoubleFree { offset } } else { AllocError::InvalidFree { offset } })
            }
        }
    }

    fn stats(&self) -> Stats {
        let (mut dfree, mut dlargest, mut dcount) = (0, 0, 0);
        for (_, l) in self.device_ranges() {
            dfree += l;
            dlargest = dlargest.max(l);
            dcount += 1;
        }
        let free = dfree + self.cached_free;
        Stats {
            capacity: self.config.device_capacity,
            allocated: self.allocated,
            reserved_in_use: self.in_use,
            reserved: self.reserved,
            free,
            largest_free: dlargest.max(self.largest_cached()),
            stranded: self.config.device_capacity - self.in_use - free,
            free_blocks: dcount + self.cached_free_count,
            live_blocks: self.live,
        }
    }

    /// Cached free blocks inside segments and the device's free bytes (as the lowest unused virtual
    /// ranges), ascending (adjacent ranges are listed separately: blocks never merge across segments).
    fn free_blocks(&self) -> Box<dyn Iterator<Item = (u64, u64)> + '_> {
        let mut v: Vec<(u64, u64)> = self.blocks.iter().filter(|b| b.state == FREE).map(|b| (b.off, b.size)).collect();
        v.extend(self.device_ranges());
        v.sort_unstable();
        Box::new(v.into_iter())
    }

    fn live_blocks(&self) -> Vec<AllocatedBlock> {
        let mut v: Vec<AllocatedBlock> = self
            .blocks
            .iter()
            .filter(|b| b.state == LIVE)
            .map(|b| AllocatedBlock { offset: b.off, size: b.size, requested: b.requested })
            .collect();
        v.sort_unstable_by_key(|b| b.offset);
        v
    }

    fn reset(&mut self) {
        *self = CachingAllocator::new(self.config).expect("config was valid");
    }

    fn release_cached(&mut self) -> u64 {
        self.empty_cache()
    }

    /// Regions: each non-expandable segment and each contiguous mapped range of an expandable segment.
    fn compaction_layout(&self) -> CompactionLayout {
        let mut layout = CompactionLayout::default();
        for s in self.segments.iter().flatten().filter(|s| !s.expandable) {
            layout.regions.push(Region { start: s.start, end: s.start + s.size, toward_end: false });
        }
        for (a, b, _) in self.mapped_runs() {
            layout.regions.push(Region { start: a, end: b, toward_end: false });
        }
        layout.regions.sort_by_key(|r| r.start);
        layout.blocks = self
            .live_blocks()
            .into_iter()
            .map(|b| CompactBlock { id: b.offset, offset: b.offset, len: b.size, align: MIN_BLOCK, pinned: false })
            .collect();
        layout
    }

    fn apply_relocation(&mut self, plan: &CompactionPlan) -> Result<(), AllocError> {
        let live = self.live_blocks();
        let units: Vec<(u64, u64)> = live.iter().map(|b| (b.offset, b.size)).collect();
        check_plan_matches(&units, plan)?;
        // Regions (start, end, segment id), ascending; each live block must stay in its own.
        let mut regions: Vec<(u64, u64, u32)> = self
            .segments
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.filter(|s| !s.expandable).map(|s| (s.start, s.start + s.size, i as u32)))
            .collect();
        regions.extend(self.mapped_runs());
        regions.sort_unstable();
        // Per region: (destination, size, requested) of each live block.
        let mut per_region: Vec<Vec<(u64, u64, u64)>> = vec![Vec::new(); regions.len()];
        for (m, b) in plan.moves.iter().zip(live.iter()) {
            let r = regions.partition_point(|r| r.0 <= b.offset) - 1;
            let (a, e, _) = regions[r];
            if m.dst < a || m.dst + m.len > e || m.dst % MIN_BLOCK != 0 {
                return Err(AllocError::InvalidRelocation("a block would leave its segment"));
            }
            per_region[r].push((m.dst, b.size, b.requested));
        }
        for v in &mut per_region {
            v.sort_by_key(|x| x.0);
            if v.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0) {
                return Err(AllocError::InvalidRelocation("blocks would overlap"));
            }
        }
        // Each region: its blocks are dropped, then it is laid out again, trimmed.
        for ((a, e, id), v) in regions.into_iter().zip(per_region) {
            let seg = self.seg(id);
            let first = self.block_at(a).expect("a region starts with a block");
            let before = self.blocks[first as usize].prev;
            let (mut n, mut after) = (first, NIL);
            while n != NIL {
                let b = self.blocks[n as usize];
                if b.off >= e {
                    after = n;
                    break;
                }
                if b.state == FREE {
                    self.uncache(n);
                }
                self.drop_block(n);
                n = b.next;
            }
            let gran = if seg.expandable { seg.pool.page() } else { ROUND_LARGE };
            let last = v.last().map_or(a, |x| x.0 + x.1);
            let cut = (a + round_up_to(last - a, gran).expect("below 2^48")).min(e);
            // The new chain of [a, e): (offset, size, state, requested).
            let mut pieces: Vec<(u64, u64, u8, u64)> = Vec::with_capacity(2 * v.len() + 2);
            let mut cursor = a;
            for &(o, size, requested) in &v {
                if o > cursor {
                    pieces.push((cursor, o - cursor, FREE, 0));
                }
                pieces.push((o, size, LIVE, requested));
                cursor = o + size;
            }
            if cursor < cut {
                pieces.push((cursor, cut - cursor, FREE, 0));
            }
            if cut < e && seg.expandable {
                pieces.push((cut, e - cut, UNMAPPED, 0));
            }
            let mut prev = before;
            let mut nodes = Vec::with_capacity(pieces.len());
            for &(off, size, state, requested) in &pieces {
                let k = self.new_block(Block {
                    off,
                    size,
                    requested,
                    gc_base: 0,
                    seg: id,
                    stream: seg.stream,
                    prev,
                    next: NIL,
                    state,
                    pool: seg.pool as u8,
                });
                if prev != NIL {
                    self.blocks[prev as usize].next = k;
                }
                prev = k;
                nodes.push(k);
            }
            if let (true, Some(&k)) = (a == seg.start, nodes.first()) {
                self.seg_first[id as usize] = k;
            }
            if prev != NIL {
                self.blocks[prev as usize].next = after;
            }
            if after != NIL {
                self.blocks[after as usize].prev = prev;
            }
            for (&k, p) in nodes.iter().zip(&pieces) {
                if p.2 == FREE {
                    self.cache(k);
                }
            }
            if cut < e {
                self.reserved -= e - cut;
                self.counters.segment_frees += 1;
                if seg.expandable {
                    // Unmapped pages join the unmapped neighbours.
                    let u = self.merge_unmapped(*nodes.last().expect("the unmapped piece"));
                    let ub = self.blocks[u as usize];
                    if ub.off == seg.start && ub.size == seg.size {
                        self.drop_block(u);
                        self.va_free(seg.start, seg.size);
                        self.drop_segment(id);
                    } else {
                        self.park(u);
                    }
                } else {
                    self.va_free(cut, e - cut);
                    if cut == a {
                        self.drop_segment(id);
                    } else {
                        self.segments[id as usize] = Some(Segment { size: cut - a, ..seg });
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The free set against one ordered set of `(stream, size, offset)` (`BlockComparatorSize`): random
    /// insertions and removals (by key and at a found position) on two streams; after each step the best
    /// fit of one stream, and at the end every stream's `at_least` walk across its classes, the full order
    /// and the largest. (The chunked classes themselves are checked against a `BTreeSet` in
    /// `class_index.rs`.)
    #[test]
    fn free_set_keeps_block_comparator_order_per_stream() {
        let mut rng = crate::bench::SplitMix64::new(11);
        let mut fs = FreeSet::default();
        let mut reference = BTreeMap::new();
        for step in 0..5_000u32 {
            // Few sizes (so classes hold many blocks), two streams.
            let (stream, size) = ((rng.next_u64() % 2) as u32, 512 * (1 + rng.next_u64() % 40));
            if !rng.next_u64().is_multiple_of(3) || reference.is_empty() {
                let off = 512 * (rng.next_u64() % 1_000_000);
                if reference.insert((stream, size, off), step).is_none() {
                    fs.insert(stream, size, off, step);
                }
            } else {
                let (&(st, z, o), &n) =
                    reference.range((stream, size, 0)..).next().unwrap_or(reference.first_key_value().unwrap());
                reference.remove(&(st, z, o));
                if step % 2 == 0 {
                    fs.remove(st, z, o, n);
                } else {
                    let (found, at) = fs.first_at_least(st, z).unwrap();
                    assert_eq!(found, (z, o, n));
                    fs.remove_at(st, at);
                }
            }
            let want =
                reference.range((stream, size, 0)..).next().filter(|x| x.0 .0 == stream).map(|(x, &n)| (x.1, x.2, n));
            assert_eq!(fs.first_at_least(stream, size).map(|(e, _)| e), want, "step {step}");
        }
        for stream in 0..3 {
            let got: Vec<_> = fs.at_least(stream, 4096).collect();
            let want: Vec<_> =
                reference.range((stream, 4096, 0)..(stream + 1, 0, 0)).map(|(x, &n)| (x.1, x.2, n)).collect();
            assert_eq!(got, want, "stream {stream}");
        }
        let got: Vec<_> = fs.iter().collect();
        assert_eq!(got, reference.iter().map(|(x, &n)| (x.0, x.1, x.2, n)).collect::<Vec<_>>());
        let largest = reference.keys().map(|x| x.1).max().unwrap_or(0);
        assert_eq!(fs.largest(), largest);
        assert_eq!(fs.first_at_least(0, ADDRESS_RANGE + 1), None);
    }

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
    fn allocation_order_matters_without_expandable_segments() {
        // The devlog example: 8 x 16 MiB then 4 x 32 MiB reserves 256 MiB; the reverse order 128 MiB.
        let run = |first: u64, n1: usize, second: u64, n2: usize, expandable: bool| {
            let mut c = CachingAllocator::new(CachingConfig::new(1 << 30).expandable(expandable)).unwrap();
            let v: Vec<u64> = (0..n1).map(|_| c.alloc(first, 1).unwrap().offset).collect();
            v.into_iter().for_each(|o| c.free_at(o).unwrap());
            let w: Vec<u64> = (0..n2).map(|_| c.alloc(second, 1).unwrap().offset).collect();
            w.into_iter().for_each(|o| c.free_at(o).unwrap());
            c.counters().peak_reserved
        };
        assert_eq!(run(16 * MIB, 8, 32 * MIB, 4, false), 256 * MIB);
        assert_eq!(run(32 * MIB, 4, 16 * MIB, 8, false), 128 * MIB);
        assert_eq!(run(16 * MIB, 8, 32 * MIB, 4, true), 140 * MIB);
    }

    #[test]
    fn small_blocks_split_at_512_large_above_1_mib() {
        let mut c = CachingAllocator::new(CachingConfig::new(1 << 30)).unwrap();
        let big = c.alloc(12 * MIB, 1).unwrap();
        c.free_at(big.offset).unwrap();
        // 11.5 MiB from the cached 12 MiB block: the 0.5 MiB remainder is not split off.
        let x = c.alloc(11 * MIB + MIB / 2, 1).unwrap();
        assert_eq!((x.offset, x.size), (big.offset, 12 * MIB));
        let s = c.alloc(1000, 1).unwrap();
        let t = c.alloc(1000, 1).unwrap();
        assert_eq!(t.offset, s.offset + 1024);
    }

    #[test]
    fn expandable_unmap_in_the_middle_and_remap() {
        // Large pages are 20 MiB (`kLargeBuffer`); the segment's blocks split at 512 B (`should_split` with
        // expandable segments); `empty_cache` unmaps whole free pages anywhere (`release_blocks`,
        // `unmap_block`); a request maps the lowest unmapped range with the free block before it
        // (`find_expandable_block`, `map_block`).
        let mut c = CachingAllocator::new(CachingConfig::new(1 << 30).expandable(true)).unwrap();
        let a = c.alloc(30 * MIB, 1).unwrap();
        let base = a.offset;
        assert_eq!(c.reserved_bytes(), 40 * MIB, "30 MiB maps two 20 MiB pages");
        let b = c.alloc(30 * MIB, 1).unwrap();
        assert_eq!(
            (b.offset - base, c.reserved_bytes()),
            (30 * MIB, 60 * MIB),
            "the free 10 MiB tail grows by one page"
        );
        let d = c.alloc(20 * MIB, 1).unwrap();
        assert_eq!((d.offset - base, c.reserved_bytes()), (60 * MIB, 80 * MIB));
        c.free_at(b.offset).unwrap();
        assert_eq!(c.empty_cache(), 20 * MIB, "only the page [40, 60) MiB is wholly free");
        assert_eq!(c.reserved_bytes(), 60 * MIB);
        let segs: Vec<(u64, u64)> = c.segments().iter().map(|s| (s.offset - base, s.size)).collect();
        assert_eq!(segs, vec![(0, 40 * MIB), (60 * MIB, 20 * MIB)], "two mapped ranges around the hole");
        assert_eq!(c.segment_count(), 2);
        let e = c.alloc(20 * MIB, 1).unwrap();
        assert_eq!((e.offset - base, c.reserved_bytes()), (30 * MIB, 80 * MIB), "the hole is mapped again");
        assert_eq!(c.segment_count(), 1);
        // The device model: 1 GiB minus 80 MiB reserved leaves 944 MiB, 47 whole 20 MiB pages.
        assert!(c.alloc(941 * MIB, 1).is_err());
        assert!(c.alloc(940 * MIB, 1).is_ok());
    }

    #[test]
    fn expandable_reservation_whose_first_mapping_failed_stays_reserved() {
        // `try_allocate_expandable_block` creates the `ExpandableSegment` before it maps; when the map fails
        // the segment stays, and `release_blocks` releases only expandable segments that hold a cached block
        // (c10/cuda/CUDACachingAllocator.cpp), so `empty_cache` keeps the empty reservation. Found by the
        // property test `caching_expandable_matches_model`.
        let mut c = CachingAllocator::new(CachingConfig::new(60 * MIB).expandable(true)).unwrap();
        let small = c.alloc(1, 1).unwrap();
        let small_res = c.segment_at(small.offset).unwrap();
        let big: Vec<Allocation> = (0..2).map(|_| c.alloc(16 * MIB, 1).unwrap()).collect();
        c.free(small).unwrap();
        // A third 16 MiB maps a third 20 MiB page: 62 MiB with the small page, so the cached small page is
        // unmapped and its reservation released (it held a cached block).
        let third = c.alloc(16 * MIB, 1).unwrap();
        assert_eq!(c.reserved_bytes(), 60 * MIB);
        assert_eq!(c.segment_at(small_res.0), None);
        // A small request: a new small reservation, whose 2 MiB page does not fit.
        assert!(matches!(c.alloc(20_379, 1), Err(AllocError::OutOfMemory { .. })));
        let empty = c.segment_at(small_res.0).expect("the new reservation at the lowest unused range");
        for a in big.into_iter().chain([third]) {
            c.free(a).unwrap();
        }
        c.empty_cache();
        assert_eq!(c.reserved_bytes(), 0);
        assert_eq!(c.segment_at(empty.0), Some(empty), "never mapped: kept");
        // The device's 60 MiB are all free, listed after the kept reservation.
        assert_eq!(c.free_blocks().collect::<Vec<_>>(), vec![(empty.0 + empty.1, 60 * MIB)]);
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

    #[test]
    fn max_non_split_rounding_lets_an_oversize_block_serve_a_large_request() {
        // `get_free_block`: a request at or above max_split_size takes a cached block only if it is less than
        // `max_non_split_rounding` larger.
        let run = |conf: &str| {
            let (cfg, _) = CachingConfig::from_env(conf, 4 << 30).unwrap();
            let mut c = CachingAllocator::new(cfg).unwrap();
            let a = c.alloc(300 * MIB, 1).unwrap();
            c.free_at(a.offset).unwrap();
            let b = c.alloc(250 * MIB, 1).unwrap();
            (b.size, c.reserved_bytes())
        };
        assert_eq!(run("max_split_size_mb:100,max_non_split_rounding_mb:64"), (300 * MIB, 300 * MIB));
        assert_eq!(run("max_split_size_mb:100"), (250 * MIB, 550 * MIB), "300 >= 250 + 20: a new segment");
    }

    #[test]
    fn garbage_collection_frees_old_cached_segments_only_with_a_memory_fraction() {
        // `garbage_collect_cached_blocks`: fraction 0.5 of 1 GiB allows 512 MiB; threshold 0.6 starts
        // collecting above 307.2 MiB. Ages in `get_free_block` calls: A 3, B 2, C 1, average 2: A and B go.
        let run = |fraction: Option<f64>| {
            let cfg = CachingConfig::new(1 << 30).gc_threshold(0.6).memory_fraction(fraction);
            let mut c = CachingAllocator::new(cfg).unwrap();
            for s in [100, 150, 200] {
                let x = c.alloc(s * MIB, 1).unwrap();
                c.free_at(x.offset).unwrap();
            }
            c.alloc(250 * MIB, 1).unwrap();
            (c.reserved_bytes(), c.counters().gc_releases, c.counters().alloc_retries)
        };
        assert_eq!(run(Some(0.5)), (450 * MIB, 2, 0), "C (200) stays cached next to D (250)");
        assert_eq!(run(None), (700 * MIB, 0, 0), "without a fraction PyTorch never collects");
        let cfg = CachingConfig::new(1 << 30).memory_fraction(Some(0.5));
        let mut c = CachingAllocator::new(cfg).unwrap();
        for s in [100, 150, 200] {
            let x = c.alloc(s * MIB, 1).unwrap();
            c.free_at(x.offset).unwrap();
        }
        c.alloc(250 * MIB, 1).unwrap();
        assert_eq!((c.reserved_bytes(), c.counters().alloc_retries), (250 * MIB, 1), "fraction alone: empty_cache");
    }

    #[test]
    fn blocks_are_reused_only_by_their_stream() {
        // `BlockComparatorSize` orders by stream first; `get_free_block` stops at another stream's block.
        let mut c = CachingAllocator::new(CachingConfig::new(1 << 30)).unwrap();
        let a = c.alloc_on(4 * MIB, 1).unwrap();
        c.free_at(a.offset).unwrap();
        let b = c.alloc_on(4 * MIB, 2).unwrap();
        assert_ne!(b.offset, a.offset);
        assert_eq!(c.reserved_bytes(), 40 * MIB, "stream 2 gets its own 20 MiB segment");
        let a2 = c.alloc_on(4 * MIB, 1).unwrap();
        assert_eq!((a2.offset, c.reserved_bytes()), (a.offset, 40 * MIB), "stream 1 reuses its block");
        let segs = c.segments();
        assert_eq!(segs.iter().map(|s| s.stream).collect::<Vec<_>>(), vec![1, 2]);
    }

    #[test]
    fn a_new_segment_needs_free_pages_not_a_free_address_range() {
        // Five 12 MiB segments on a 64 MiB device, three of them cached: a 40 MiB segment fits once they are
        // released (`release_cached_blocks`), although no 40 MiB range of [0, 64 MiB) is free around the two
        // live ones: the device counts free pages, and virtual addresses go past the device size.
        let mut c = CachingAllocator::new(CachingConfig::new(64 * MIB)).unwrap();
        let v: Vec<u64> = (0..5).map(|_| c.alloc(12 * MIB, 1).unwrap().offset).collect();
        assert_eq!(v, (0..5).map(|i| i * 12 * MIB).collect::<Vec<_>>());
        for i in [0, 2, 4] {
            c.free_at(v[i]).unwrap();
        }
        let big = c.alloc(40 * MIB, 1).unwrap();
        assert_eq!((c.reserved_bytes(), c.counters().alloc_retries), (64 * MIB, 1));
        assert_eq!(big.offset, 48 * MIB, "[48, 88) MiB: past the 64 MiB device size");
    }
}
