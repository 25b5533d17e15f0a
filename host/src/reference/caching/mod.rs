//! A model of PyTorch's `CUDACachingAllocator` (one device), for comparing trace replays with what PyTorch
//! itself reserved, and for asking what other allocator settings would have done.
//!
//! Every rule cites the function of `c10/cuda/CUDACachingAllocator.cpp` (`DeviceCachingAllocator`) it
//! follows; options are parsed as `CUDAAllocatorConfig` / `AllocatorConfig` does (`config`).
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
//! - **Memory pools** (`MempoolId_t`, `PrivatePool`, `beginAllocateToPool`, `get_pool`): each private pool (a
//!   CUDA graph's, a `torch.cuda.MemPool`'s) has its own small and large pools. A request made while a
//!   private pool is active ([`CachingAllocator::alloc_in`]) is served from that pool's cached blocks or a
//!   new segment of that pool, and its blocks are freed back to it (`free_block`: `block->pool`); an
//!   ordinary request uses the default pool only. `release_cached_blocks(context, {0, 0})` (`empty_cache`,
//!   the retry of `malloc`) releases the default pool's cache; a private pool's segments are released only
//!   once the pool is freeable (its graph or `MemPool` destroyed, `graph_pools_freeable`), which a trace
//!   records as its own `segment_free` events.
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
//!   both free or both unmapped. `pool` is the pair (memory pool, small/large) of the block's segment
//!   (`rules::set_index`): a block is never in another memory pool's set.
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
//!
//! # Files
//! One concern per file, each an `impl CachingAllocator` block: `config` (the options and their
//! parsing), `rules.rs` (rounding, pools, segment sizes), `blocks.rs` (block records and chain surgery),
//! `free_set.rs` (the cached blocks of each pool of each memory pool and the search), `vspace.rs` (segments,
//! virtual addresses, the device model), `expandable.rs` (expandable segments), `release.rs` (release and
//! garbage collection), `relocate.rs` (relocation for compaction), `releases` (a trace's recorded
//! releases: the allocator's or the program's), `seed` (a model seeded from a trace, and fidelity). This file holds the model's state and its `malloc` and `free`.

use std::collections::{BTreeMap, VecDeque};

use super::compact::{CompactionLayout, CompactionPlan};
use super::{align_down, check_request, oom, AllocError, AllocatedBlock, Allocation, Handle, Stats, SubAllocator};

mod blocks;
pub(crate) mod config;
mod expandable;
mod free_set;
#[doc(hidden)]
pub mod options;
mod release;
pub(crate) mod releases;
mod relocate;
mod rules;
pub(crate) mod seed;
mod vspace;

use blocks::{Block, FREE, LIVE, NIL, UNMAPPED};
use free_set::FreeSet;
use rules::pool_of;
use vspace::{SegIndex, Segment};

pub use config::{CachingConfig, ConfigError, ConfigWarning, ROUNDUP_INTERVALS};
pub use releases::{recorded_releases, RecordedRelease, ReleaseCause, ReleaseEvidence};
pub use rules::{
    round_size, roundup_power2_next_division, segment_size, Pool, ADDRESS_RANGE, LARGE_BUFFER, MIN_BLOCK,
    MIN_LARGE_ALLOC, ROUND_LARGE, SMALL_BUFFER, SMALL_SIZE,
};
pub use seed::{
    capacity_at_oom, config_for_trace, fidelity, fidelity_until, seed_from_trace, Fidelity, RecordedSegments, Seeded,
};
pub(crate) use seed::{config_for_scanned, seed_from_scanned, TraceScan};
pub use vspace::SegmentInfo;

/// Counters beyond [`Stats`]. Bytes unless named as counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[doc(hidden)]
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
    /// Cached (free, mapped) blocks per pool of each memory pool (`rules::set_index`; indexed only in
    /// `free_set.rs`).
    free_sets: Vec<FreeSet>,
    /// Unmapped blocks per pool of each memory pool (`rules::set_index`): `(stream, offset) -> record`.
    unmapped: Vec<BTreeMap<(u32, u64), u32>>,
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

impl CachingAllocator {
    /// A caching allocator over `config.device_capacity` bytes of device memory.
    ///
    /// # Errors
    /// [`AllocError::InvalidConfig`] if the capacity is below 2 MiB or above 2^48 bytes, `max_split_size`
    /// is not above 1 MiB (PyTorch's limit is 20 MiB; the model accepts smaller values for experiments),
    /// the garbage-collection threshold is outside `[0, 1)`, a memory fraction is outside `[0, 1]`, a
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
        if config.memory_fraction.is_some_and(|f| !(0.0..=1.0).contains(&f)) {
            return Err(AllocError::InvalidConfig("the memory fraction must lie in [0, 1]"));
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
            free_sets: vec![FreeSet::default(), FreeSet::default()],
            unmapped: vec![BTreeMap::new(), BTreeMap::new()],
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
    #[doc(hidden)]
    pub fn requested_bytes(&self) -> u64 {
        self.allocated
    }

    /// Free device memory a new segment or mapping can take: `capacity − reserved` in whole 2 MiB pages.
    #[doc(hidden)]
    pub fn device_free_bytes(&self) -> u64 {
        align_down(self.config.device_capacity.saturating_sub(self.reserved), SMALL_BUFFER)
    }

    /// Number of segments as a snapshot lists them (each contiguous mapped range of an expandable segment
    /// counts as one). O(blocks) for expandable segments.
    #[doc(hidden)]
    pub fn segment_count(&self) -> usize {
        self.segments.iter().flatten().filter(|s| !s.expandable).count() + self.mapped_runs().len()
    }

    /// Peaks and event counters.
    #[doc(hidden)]
    pub fn counters(&self) -> CachingCounters {
        self.counters
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

    /// Allocates `size` bytes on `stream` (PyTorch's `malloc`). The block is 512-byte aligned; its size is
    /// the rounded request, or a whole cached block when the remainder is not split off.
    ///
    /// # Errors
    /// [`AllocError::ZeroSize`], [`AllocError::SizeOverflow`], and [`AllocError::OutOfMemory`] after the
    /// release-and-retry steps, with the device's free bytes plus the cached free bytes and the largest of
    /// the device's free bytes and the largest cached block.
    #[doc(hidden)]
    pub fn alloc_on(&mut self, size: u64, stream: i64) -> Result<Allocation, AllocError> {
        self.alloc_in(size, stream, 0)
    }

    /// [`CachingAllocator::alloc_on`] for a request made while memory pool `mempool` was active (0: the
    /// default pool, an ordinary request; another: a private pool, as for an allocation during a CUDA graph
    /// capture or under `torch.cuda.use_mem_pool`). `get_pool` serves it from that pool's cached blocks only,
    /// and a new segment for it belongs to that pool, so its blocks are freed back to it (`free_block`:
    /// `block->pool`). When no cached block fits and no new segment can be had, the retry releases the
    /// default pool's cache ([`CachingAllocator::empty_cache`]) as PyTorch's `release_cached_blocks(context,
    /// {0, 0})` does.
    ///
    /// # Errors
    /// As [`CachingAllocator::alloc_on`].
    #[doc(hidden)]
    pub fn alloc_in(&mut self, size: u64, stream: i64, mempool: u16) -> Result<Allocation, AllocError> {
        check_request(size, 1, MIN_BLOCK)?;
        let rounded =
            self.config.round_size(size).filter(|&r| r <= super::MAX_BYTES).ok_or(AllocError::SizeOverflow { size })?;
        let pool = pool_of(rounded);
        let alloc_size = segment_size(rounded).ok_or(AllocError::SizeOverflow { size })?;
        let st = self.stream_index(stream);
        let mut found = self.get_free_block(mempool, pool, st, rounded);
        if found.is_none() {
            if self.config.gc_active() {
                self.garbage_collect();
            }
            let mut new = self.alloc_block(mempool, pool, st, rounded, alloc_size);
            if new.is_none() && self.release_available_cached_blocks(mempool, pool, st, rounded) {
                new = self.alloc_block(mempool, pool, st, rounded, alloc_size);
            }
            if new.is_none() {
                self.counters.alloc_retries += 1;
                self.empty_cache();
                new = self.alloc_block(mempool, pool, st, rounded, alloc_size);
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
        self.relocation_layout()
    }

    fn apply_relocation(&mut self, plan: &CompactionPlan) -> Result<(), AllocError> {
        self.relocate(plan)
    }
}
