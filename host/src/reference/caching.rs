//! A model of PyTorch's `CUDACachingAllocator` (one device, one stream), for comparing trace replays with
//! what PyTorch itself reserved.
//!
//! Constants and rules follow `c10/cuda/CUDACachingAllocator.cpp`:
//! - every request is rounded up to a multiple of 512 B (`kMinBlockSize`); requests ≤ 1 MiB (`kSmallSize`)
//!   use the *small* pool, larger ones the *large* pool;
//! - a new segment is 2 MiB (`kSmallBuffer`) for small requests, 20 MiB (`kLargeBuffer`) for requests below
//!   10 MiB (`kMinLargeAlloc`), else the request rounded up to 2 MiB (`kRoundLarge`);
//! - the search is best fit over `(size, address)` within the pool; with `max_split_size` set, a request
//!   below it never takes a block at or above it, and a request at or above it never takes a block more
//!   than 20 MiB larger;
//! - a chosen block is split if the remainder is ≥ 512 B (small pool, or any pool with expandable
//!   segments) or > 1 MiB and the request is below `max_split_size` (large pool);
//! - a freed block merges with free neighbours *in the same segment* only; segments stay cached;
//! - when no cached block fits and the device cannot supply a new segment, wholly free oversize segments
//!   are released (with `max_split_size`), then all wholly free segments (`empty_cache`), and the segment
//!   allocation is retried once before reporting out of memory.
//!
//! **Device model.** Without expandable segments, segments are `cudaMalloc`ed from `[0, capacity)` by an
//! address-ordered first fit (512-byte granule). With expandable segments each pool has one segment that
//! grows by mapping pages (2 MiB small pool, 20 MiB large pool) at its growth end: the large pool's segment
//! grows up from 0 and the small pool's grows down from the top (a mirror image of PyTorch's separate
//! virtual reservations, which keeps every address in `[0, capacity)` and mapped bytes equal to used address
//! range). Growth extends the free block at the growth end, as PyTorch's `try_allocate_expandable_block`
//! does. Deviation: `empty_cache` unmaps free pages only at the growth end, not in the segment's interior.
//!
//! **Compaction** ([`SubAllocator::apply_relocation`]) models a compacting caching allocator: blocks slide
//! within their segment (toward its base; toward the top for the downward-growing small segment), each
//! segment is then trimmed to its live extent rounded up to 2 MiB (non-expandable: a re-`cudaMalloc` and
//! copy; expandable: unmapping whole pages), and segments left without live blocks are released.
//!
//! # Invariants
//! - Blocks tile each segment; `blocks` is keyed by offset; a block is in `free_sets[pool]` under
//!   `(size, offset)` iff it is free; no two adjacent free blocks of one segment exist.
//! - Non-expandable: every segment is a live block of `device` of exactly its size.
//! - Expandable: the large segment is `[0, large_end)`, the small one `[small_start, top)`,
//!   `large_end <= small_start`, both multiples of their page size from their base.
//!
//! # Time complexity
//! `alloc`/`free`: O(log n) (ordered maps; n = blocks), plus O(segments) on the release-and-retry path.

use std::collections::{BTreeMap, BTreeSet};

use super::compact::{check_plan_matches, CompactBlock, CompactionLayout, CompactionPlan, Region};
use super::first_fit::FirstFit;
use super::{align_down, align_up, check_request, oom, AllocError, Allocation, Handle, LiveBlock, Stats, SubAllocator};

/// `kMinBlockSize`: rounding and alignment of every block, bytes.
pub const MIN_BLOCK: u64 = 512;
/// `kSmallSize`: largest request of the small pool, bytes.
pub const SMALL_SIZE: u64 = 1 << 20;
/// `kSmallBuffer`: small-pool segment (and expandable page) size, bytes.
pub const SMALL_BUFFER: u64 = 2 << 20;
/// `kLargeBuffer`: segment size for requests below [`MIN_LARGE_ALLOC`] (and large expandable page), bytes.
pub const LARGE_BUFFER: u64 = 20 << 20;
/// `kMinLargeAlloc`: requests at or above it get a segment of their own size, bytes.
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// `kRoundLarge`: rounding of large segments, bytes.
pub const ROUND_LARGE: u64 = 2 << 20;

/// Options of [`CachingAllocator`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CachingConfig {
    /// Device memory in bytes.
    pub device_capacity: u64,
    /// PyTorch's `expandable_segments:True`.
    pub expandable_segments: bool,
    /// PyTorch's `max_split_size_mb` in bytes (`u64::MAX`: unlimited, the default).
    pub max_split_size: u64,
}

impl CachingConfig {
    /// Defaults (no expandable segments, unlimited split size) for `device_capacity` bytes.
    pub fn new(device_capacity: u64) -> Self {
        CachingConfig { device_capacity, expandable_segments: false, max_split_size: u64::MAX }
    }

    /// With expandable segments on or off.
    pub fn expandable(mut self, on: bool) -> Self {
        self.expandable_segments = on;
        self
    }

    /// With `max_split_size` bytes.
    pub fn max_split(mut self, bytes: u64) -> Self {
        self.max_split_size = bytes;
        self
    }
}

/// The two pools.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pool {
    /// Requests ≤ 1 MiB.
    Small = 0,
    /// Requests > 1 MiB.
    Large = 1,
}

/// A segment as reported by [`CachingAllocator::segments`]. Bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentInfo {
    /// Start offset.
    pub offset: u64,
    /// Size (mapped size for an expandable segment).
    pub size: u64,
    /// Pool.
    pub pool: Pool,
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
    /// Times the allocator released cached segments and retried (PyTorch's `num_alloc_retries`).
    pub alloc_retries: u64,
    /// Out-of-memory errors returned.
    pub ooms: u64,
    /// Segments allocated (`cudaMalloc` or page-mapping growth events).
    pub segment_allocs: u64,
    /// Segments released (or page-unmapping events).
    pub segment_frees: u64,
}

#[derive(Clone, Copy, Debug)]
struct Block {
    size: u64,
    seg: u32,
    requested: u64,
    live: bool,
}

#[derive(Clone, Copy, Debug)]
struct Segment {
    start: u64,
    size: u64,
    pool: Pool,
}

/// The caching allocator model. See the [module docs](self).
#[derive(Debug)]
pub struct CachingAllocator {
    config: CachingConfig,
    /// Non-expandable mode: where segments come from.
    device: Option<FirstFit>,
    /// Expandable mode: the address below which the small segment may not grow (a 2 MiB multiple).
    top: u64,
    blocks: BTreeMap<u64, Block>,
    free_sets: [BTreeSet<(u64, u64)>; 2],
    segments: Vec<Option<Segment>>,
    /// Expandable mode: segment id of each pool's segment.
    expandable_seg: [Option<u32>; 2],
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

/// PyTorch's `round_size`: at least 512, a multiple of 512.
pub fn round_size(size: u64) -> Option<u64> {
    align_up(size.max(1), MIN_BLOCK)
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
    /// [`AllocError::InvalidConfig`] if the capacity is below 2 MiB or above 2^48 bytes, or
    /// `max_split_size` is below 1 MiB (PyTorch's limit: it must exceed `kSmallSize`).
    pub fn new(config: CachingConfig) -> Result<Self, AllocError> {
        let cap = config.device_capacity;
        if !(SMALL_BUFFER..=super::MAX_BYTES).contains(&cap) {
            return Err(AllocError::InvalidConfig("device capacity must lie in [2 MiB, 2^48]"));
        }
        if config.max_split_size <= SMALL_SIZE {
            return Err(AllocError::InvalidConfig("max_split_size must exceed 1 MiB"));
        }
        let device = if config.expandable_segments { None } else { Some(FirstFit::with_granule(cap, MIN_BLOCK)?) };
        Ok(CachingAllocator {
            config,
            device,
            top: align_down(cap, SMALL_BUFFER),
            blocks: BTreeMap::new(),
            free_sets: [BTreeSet::new(), BTreeSet::new()],
            segments: Vec::new(),
            expandable_seg: [None, None],
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

    /// Reserved bytes: the sum of segment (mapped) sizes, PyTorch's `reserved_bytes.all.current`.
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

    /// Number of segments.
    pub fn segment_count(&self) -> usize {
        self.segments.iter().flatten().count()
    }

    /// Peaks and event counters.
    pub fn counters(&self) -> CachingCounters {
        self.counters
    }

    /// Releases every wholly free cached segment (and, with expandable segments, free pages at each segment's
    /// growth end), like `torch.cuda.empty_cache()`. Returns the bytes released.
    pub fn empty_cache(&mut self) -> u64 {
        self.release_segments(|_| true)
    }

    /// Seeds a segment that existed before a trace replay began (a trace recorded mid-run): `size` bytes
    /// (a multiple of 512) in `pool`, placed like a new segment (lowest device offset where it fits), wholly
    /// free. Not counted in [`CachingCounters::segment_allocs`]. Returns its offset.
    ///
    /// PyTorch's segments are `cudaMalloc` results at arbitrary device addresses; replay maps each recorded
    /// segment to the offset returned here and its blocks to the same relative positions
    /// ([`CachingAllocator::seed_block`]).
    ///
    /// # Errors
    /// [`AllocError::InvalidConfig`] with expandable segments (their mapped ranges are not seeded);
    /// [`AllocError::SizeOverflow`] for a zero or unaligned size; [`AllocError::OutOfMemory`] when the device
    /// range has no room.
    pub fn seed_segment(&mut self, size: u64, pool: Pool) -> Result<u64, AllocError> {
        if self.config.expandable_segments {
            return Err(AllocError::InvalidConfig("segments cannot be seeded with expandable segments"));
        }
        if size == 0 || !size.is_multiple_of(MIN_BLOCK) || size > super::MAX_BYTES {
            return Err(AllocError::SizeOverflow { size });
        }
        let a = self.device.as_mut().expect("non-expandable").alloc(size, MIN_BLOCK)?;
        let id = self.new_segment(a.offset, a.size, pool);
        self.counters.segment_allocs -= 1;
        self.insert_free(a.offset, a.size, id);
        Ok(a.offset)
    }

    /// Seeds a live block of `size` bytes (the block's rounded size as the snapshot records it, a multiple
    /// of 512) at `offset`, inside a free block of a seeded segment, with `requested` bytes asked for. The
    /// free rest of that block stays free on both sides (within the segment).
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
        let (&fo, &fb) = self.blocks.range(..=offset).next_back().ok_or(bad.clone())?;
        let end = offset.checked_add(size).ok_or(bad.clone())?;
        if fb.live || end > fo + fb.size {
            return Err(bad);
        }
        let b = self.remove_free(fo);
        if offset > fo {
            self.insert_free(fo, offset - fo, b.seg);
        }
        if fo + b.size > end {
            self.insert_free(end, fo + b.size - end, b.seg);
        }
        self.blocks.insert(offset, Block { size, seg: b.seg, requested: requested.min(size), live: true });
        self.allocated += requested.min(size);
        self.in_use += size;
        self.live += 1;
        let c = &mut self.counters;
        c.peak_allocated = c.peak_allocated.max(self.allocated);
        c.peak_in_use = c.peak_in_use.max(self.in_use);
        Ok(Allocation { offset, size, handle: Handle::NONE })
    }

    /// Segments with their blocks, ascending by offset.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        let mut v: Vec<SegmentInfo> = self
            .segments
            .iter()
            .flatten()
            .map(|s| {
                let blocks: Vec<(u64, u64, bool)> =
                    self.blocks.range(s.start..s.start + s.size).map(|(&o, b)| (o, b.size, b.live)).collect();
                let in_use = blocks.iter().filter(|b| b.2).map(|b| b.1).sum();
                SegmentInfo { offset: s.start, size: s.size, pool: s.pool, in_use, blocks }
            })
            .collect();
        v.sort_by_key(|s| s.offset);
        v
    }

    fn seg(&self, id: u32) -> Segment {
        self.segments[id as usize].expect("live segment id")
    }

    fn insert_free(&mut self, off: u64, size: u64, seg: u32) {
        let pool = self.seg(seg).pool as usize;
        self.blocks.insert(off, Block { size, seg, requested: 0, live: false });
        self.free_sets[pool].insert((size, off));
        self.cached_free += size;
        self.cached_free_count += 1;
    }

    fn remove_free(&mut self, off: u64) -> Block {
        let b = self.blocks.remove(&off).expect("free block exists");
        debug_assert!(!b.live);
        self.free_sets[self.seg(b.seg).pool as usize].remove(&(b.size, off));
        self.cached_free -= b.size;
        self.cached_free_count -= 1;
        b
    }

    fn new_segment(&mut self, start: u64, size: u64, pool: Pool) -> u32 {
        let s = Some(Segment { start, size, pool });
        self.reserved += size;
        self.counters.peak_reserved = self.counters.peak_reserved.max(self.reserved);
        self.counters.segment_allocs += 1;
        if let Some(i) = self.segments.iter().position(Option::is_none) {
            self.segments[i] = s;
            i as u32
        } else {
            self.segments.push(s);
            (self.segments.len() - 1) as u32
        }
    }

    /// Best fit in `pool` with PyTorch's `max_split_size` filters (only the best candidate is considered).
    fn get_free_block(&self, pool: Pool, size: u64) -> Option<u64> {
        let &(bsize, off) = self.free_sets[pool as usize].range((size, 0)..).next()?;
        let max_split = self.config.max_split_size;
        if size < max_split && bsize >= max_split {
            return None;
        }
        if size >= max_split && bsize >= size.saturating_add(LARGE_BUFFER) {
            return None;
        }
        Some(off)
    }

    /// Gets a new free block that holds `size` bytes: a new segment, or expandable growth.
    fn alloc_block(&mut self, pool: Pool, size: u64) -> Option<u64> {
        if self.config.expandable_segments {
            return self.grow_expandable(pool, size);
        }
        let seg_size = segment_size(size)?;
        let a = self.device.as_mut()?.alloc(seg_size, MIN_BLOCK).ok()?;
        let id = self.new_segment(a.offset, a.size, pool);
        self.insert_free(a.offset, a.size, id);
        Some(a.offset)
    }

    fn large_end(&self) -> u64 {
        self.expandable_seg[1].map_or(0, |s| {
            let s = self.seg(s);
            s.start + s.size
        })
    }

    fn small_start(&self) -> u64 {
        self.expandable_seg[0].map_or(self.top, |s| self.seg(s).start)
    }

    fn grow_expandable(&mut self, pool: Pool, size: u64) -> Option<u64> {
        let page = if pool == Pool::Small { SMALL_BUFFER } else { LARGE_BUFFER };
        let (large_end, small_start) = (self.large_end(), self.small_start());
        let id = match self.expandable_seg[pool as usize] {
            Some(id) => id,
            None => {
                let start = if pool == Pool::Small { small_start } else { large_end };
                let id = self.new_segment(start, 0, pool);
                self.counters.segment_allocs -= 1; // counted when pages are mapped below
                self.expandable_seg[pool as usize] = Some(id);
                id
            }
        };
        let seg = self.seg(id);
        // The free block at the growth end (top of the large segment, bottom of the small one).
        let edge = match pool {
            Pool::Large => self.blocks.range(seg.start..seg.start + seg.size).next_back(),
            Pool::Small => self.blocks.range(seg.start..seg.start + seg.size).next(),
        }
        .filter(|(_, b)| !b.live)
        .map(|(&o, b)| (o, b.size));
        let need = size - edge.map_or(0, |e| e.1.min(size));
        let bytes = round_up_to(need, page)?;
        let fits = match pool {
            Pool::Large => large_end.checked_add(bytes).is_some_and(|e| e <= small_start),
            Pool::Small => small_start.checked_sub(bytes).is_some_and(|s| s >= large_end),
        };
        if !fits {
            if seg.size == 0 {
                self.segments[id as usize] = None;
                self.expandable_seg[pool as usize] = None;
            }
            return None;
        }
        let (off, len) = match (pool, edge) {
            (Pool::Large, Some((o, l))) => {
                self.remove_free(o);
                (o, l + bytes)
            }
            (Pool::Large, None) => (seg.start + seg.size, bytes),
            (Pool::Small, Some((o, l))) => {
                self.remove_free(o);
                (o - bytes, l + bytes)
            }
            (Pool::Small, None) => (seg.start - bytes, bytes),
        };
        let s = self.segments[id as usize].as_mut().expect("live");
        if pool == Pool::Small {
            s.start -= bytes;
        }
        s.size += bytes;
        self.reserved += bytes;
        self.counters.peak_reserved = self.counters.peak_reserved.max(self.reserved);
        self.counters.segment_allocs += 1;
        self.insert_free(off, len, id);
        Some(off)
    }

    /// Releases wholly free segments for which `pick(segment)` holds (non-expandable), or unmaps free pages
    /// at the growth ends (expandable). Returns bytes released.
    fn release_segments(&mut self, pick: impl Fn(&Segment) -> bool) -> u64 {
        let mut released = 0;
        if self.config.expandable_segments {
            for pool in [Pool::Small, Pool::Large] {
                released += self.unmap_edge(pool);
            }
            return released;
        }
        for id in 0..self.segments.len() {
            let Some(seg) = self.segments[id] else { continue };
            let whole = self.blocks.get(&seg.start).is_some_and(|b| !b.live && b.size == seg.size);
            if whole && pick(&seg) {
                self.remove_free(seg.start);
                self.device.as_mut().expect("non-expandable").free_at(seg.start).expect("segment is a device block");
                self.segments[id] = None;
                self.reserved -= seg.size;
                self.counters.segment_frees += 1;
                released += seg.size;
            }
        }
        released
    }

    fn unmap_edge(&mut self, pool: Pool) -> u64 {
        let Some(id) = self.expandable_seg[pool as usize] else { return 0 };
        let seg = self.seg(id);
        let range = seg.start..seg.start + seg.size;
        let edge = match pool {
            Pool::Large => self.blocks.range(range).next_back(),
            Pool::Small => self.blocks.range(range).next(),
        };
        let Some((&o, b)) = edge.filter(|(_, b)| !b.live) else { return 0 };
        let end = o + b.size;
        let (keep_off, keep_len, unmapped) = match pool {
            Pool::Large => {
                let cut = round_up_to(o, LARGE_BUFFER).expect("below 2^48");
                (o, cut.saturating_sub(o).min(b.size), end.saturating_sub(cut.max(o)))
            }
            Pool::Small => {
                let cut = align_down(end, SMALL_BUFFER).max(o);
                (cut, end - cut, cut - o)
            }
        };
        if unmapped == 0 {
            return 0;
        }
        self.remove_free(o);
        let s = self.segments[id as usize].as_mut().expect("live");
        if pool == Pool::Small {
            s.start += unmapped;
        }
        s.size -= unmapped;
        let empty = s.size == 0;
        self.reserved -= unmapped;
        self.counters.segment_frees += 1;
        if keep_len > 0 {
            self.insert_free(keep_off, keep_len, id);
        }
        if empty {
            self.segments[id as usize] = None;
            self.expandable_seg[pool as usize] = None;
        }
        unmapped
    }

    fn should_split(&self, pool: Pool, block: u64, size: u64) -> bool {
        let remaining = block - size;
        if pool == Pool::Small || self.config.expandable_segments {
            remaining >= MIN_BLOCK
        } else {
            size < self.config.max_split_size && remaining > SMALL_SIZE
        }
    }

    fn device_free(&self) -> (u64, u64, usize) {
        match &self.device {
            Some(d) => {
                let s = d.stats();
                (s.free, s.largest_free, s.free_blocks)
            }
            None => {
                let gap = self.small_start() - self.large_end();
                (gap, gap, usize::from(gap > 0))
            }
        }
    }

    fn largest_cached(&self) -> u64 {
        self.free_sets.iter().filter_map(|s| s.last().map(|k| k.0)).max().unwrap_or(0)
    }
}

impl SubAllocator for CachingAllocator {
    fn name(&self) -> &'static str {
        "caching"
    }

    fn capacity(&self) -> u64 {
        self.config.device_capacity
    }

    /// # Errors
    /// As [`SubAllocator::alloc`]; alignments above 512 B are rejected with [`AllocError::BadAlignment`]
    /// (PyTorch guarantees 512 B and takes no alignment argument).
    fn alloc(&mut self, size: u64, align: u64) -> Result<Allocation, AllocError> {
        check_request(size, align, MIN_BLOCK)?;
        if align > MIN_BLOCK {
            return Err(AllocError::BadAlignment { align });
        }
        let rounded = round_size(size).ok_or(AllocError::SizeOverflow { size })?;
        let pool = pool_of(rounded);
        let mut found = self.get_free_block(pool, rounded).or_else(|| self.alloc_block(pool, rounded));
        if found.is_none() {
            self.counters.alloc_retries += 1;
            if self.config.max_split_size != u64::MAX {
                let max_split = self.config.max_split_size;
                self.release_segments(|s| s.size >= max_split);
                found = self.alloc_block(pool, rounded);
            }
            if found.is_none() {
                self.empty_cache();
                found = self.alloc_block(pool, rounded);
            }
        }
        let Some(off) = found else {
            self.counters.ooms += 1;
            let (dfree, dlargest, _) = self.device_free();
            return Err(oom(size, dfree + self.cached_free, dlargest.max(self.largest_cached())));
        };
        let b = self.remove_free(off);
        let taken = if self.should_split(pool, b.size, rounded) {
            self.insert_free(off + rounded, b.size - rounded, b.seg);
            rounded
        } else {
            b.size
        };
        self.blocks.insert(off, Block { size: taken, seg: b.seg, requested: size, live: true });
        self.allocated += size;
        self.in_use += taken;
        self.live += 1;
        let c = &mut self.counters;
        c.peak_allocated = c.peak_allocated.max(self.allocated);
        c.peak_in_use = c.peak_in_use.max(self.in_use);
        Ok(Allocation { offset: off, size: taken, handle: Handle::NONE })
    }

    /// Finds the block by `a.offset` (the model keeps its blocks by offset; its allocations carry
    /// [`Handle::NONE`]).
    fn free(&mut self, a: Allocation) -> Result<(), AllocError> {
        self.free_at(a.offset)
    }

    fn free_at(&mut self, offset: u64) -> Result<(), AllocError> {
        let b = match self.blocks.get(&offset) {
            Some(b) if b.live => *b,
            _ => {
                let in_free = self.free_blocks().any(|(o, l)| offset >= o && offset - o < l);
                return Err(if in_free {
                    AllocError::DoubleFree { offset }
                } else {
                    AllocError::InvalidFree { offset }
                });
            }
        };
        self.blocks.remove(&offset);
        self.allocated -= b.requested;
        self.in_use -= b.size;
        self.live -= 1;
        let (mut off, mut size) = (offset, b.size);
        if let Some(n) = self.blocks.get(&(offset + b.size)).filter(|n| !n.live && n.seg == b.seg).copied() {
            self.remove_free(offset + b.size);
            size += n.size;
        }
        if let Some((&po, p)) = self.blocks.range(..offset).next_back() {
            if !p.live && p.seg == b.seg && po + p.size == offset {
                self.remove_free(po);
                off = po;
                size += offset - po;
            }
        }
        self.insert_free(off, size, b.seg);
        Ok(())
    }

    fn stats(&self) -> Stats {
        let (dfree, dlargest, dcount) = self.device_free();
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

    /// Cached free blocks inside segments and device memory not in any segment, ascending (adjacent ranges
    /// are listed separately: blocks never merge across segments).
    fn free_blocks(&self) -> Box<dyn Iterator<Item = (u64, u64)> + '_> {
        let mut v: Vec<(u64, u64)> = self.blocks.iter().filter(|(_, b)| !b.live).map(|(&o, b)| (o, b.size)).collect();
        match &self.device {
            Some(d) => v.extend(d.free_blocks()),
            None => {
                let (lo, hi) = (self.large_end(), self.small_start());
                if hi > lo {
                    v.push((lo, hi - lo));
                }
            }
        }
        v.sort_unstable();
        Box::new(v.into_iter())
    }

    fn live_blocks(&self) -> Vec<LiveBlock> {
        self.blocks
            .iter()
            .filter(|(_, b)| b.live)
            .map(|(&offset, b)| LiveBlock { offset, size: b.size, requested: b.requested })
            .collect()
    }

    fn reset(&mut self) {
        *self = CachingAllocator::new(self.config).expect("config was valid");
    }

    fn release_cached(&mut self) -> u64 {
        self.empty_cache()
    }

    fn compaction_layout(&self) -> CompactionLayout {
        let mut layout = CompactionLayout::default();
        for s in self.segments.iter().flatten() {
            let toward_end = self.config.expandable_segments && s.pool == Pool::Small;
            layout.regions.push(Region { start: s.start, end: s.start + s.size, toward_end });
        }
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
        // New live blocks per segment, checked to stay inside their segment.
        let mut per_seg: Vec<Vec<(u64, Block)>> = vec![Vec::new(); self.segments.len()];
        for (m, b) in plan.moves.iter().zip(live.iter()) {
            let blk = self.blocks[&b.offset];
            let s = self.seg(blk.seg);
            if m.dst < s.start || m.dst + m.len > s.start + s.size || m.dst % MIN_BLOCK != 0 {
                return Err(AllocError::InvalidRelocation("a block would leave its segment"));
            }
            per_seg[blk.seg as usize].push((m.dst, blk));
        }
        for v in &mut per_seg {
            v.sort_by_key(|x| x.0);
            if v.windows(2).any(|w| w[0].0 + w[0].1.size > w[1].0) {
                return Err(AllocError::InvalidRelocation("blocks would overlap"));
            }
        }
        self.blocks.clear();
        self.free_sets.iter_mut().for_each(BTreeSet::clear);
        (self.cached_free, self.cached_free_count) = (0, 0);
        for (id, v) in per_seg.into_iter().enumerate() {
            let Some(mut s) = self.segments[id] else { continue };
            // Trim to the live extent: whole 2 MiB units (pages for expandable segments) from the base.
            let (new_start, new_end) = if v.is_empty() {
                (s.start, s.start)
            } else if self.config.expandable_segments && s.pool == Pool::Small {
                (align_down(v[0].0, SMALL_BUFFER).max(s.start), s.start + s.size)
            } else {
                let gran = if self.config.expandable_segments { LARGE_BUFFER } else { ROUND_LARGE };
                let last = v.last().map(|x| x.0 + x.1.size).unwrap_or(s.start);
                let end = s.start + round_up_to(last - s.start, gran).expect("below 2^48");
                (s.start, end.min(s.start + s.size))
            };
            let released = s.size - (new_end - new_start);
            if released > 0 {
                self.reserved -= released;
                self.counters.segment_frees += 1;
            }
            (s.start, s.size) = (new_start, new_end - new_start);
            if s.size == 0 {
                self.segments[id] = None;
                if let Some(p) = self.expandable_seg.iter_mut().find(|p| **p == Some(id as u32)) {
                    *p = None;
                }
                continue;
            }
            self.segments[id] = Some(s);
            let mut cursor = s.start;
            for (o, blk) in v {
                if o > cursor {
                    self.insert_free(cursor, o - cursor, id as u32);
                }
                cursor = o + blk.size;
                self.blocks.insert(o, blk);
            }
            if cursor < s.start + s.size {
                self.insert_free(cursor, s.start + s.size - cursor, id as u32);
            }
        }
        if let Some(d) = self.device.as_mut() {
            let mut segs: Vec<(LiveBlock, u8)> = self
                .segments
                .iter()
                .flatten()
                .map(|s| (LiveBlock { offset: s.start, size: s.size, requested: s.size }, 9))
                .collect();
            segs.sort_by_key(|x| x.0.offset);
            d.0.rebuild(&segs).expect("segments are disjoint device blocks");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        c.free(b).unwrap();
        c.free(a).unwrap();
        assert_eq!(c.reserved_bytes(), 22 * MIB, "segments stay cached");
        assert_eq!(c.empty_cache(), 22 * MIB);
        assert_eq!((c.reserved_bytes(), c.segment_count()), (0, 0));
        assert_eq!(c.free(a), Err(AllocError::DoubleFree { offset: a.offset }));
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
        c.free(big).unwrap();
        // 11.5 MiB from the cached 12 MiB block: the 0.5 MiB remainder is not split off.
        let x = c.alloc(11 * MIB + MIB / 2, 1).unwrap();
        assert_eq!((x.offset, x.size), (big.offset, 12 * MIB));
        let s = c.alloc(1000, 1).unwrap();
        let t = c.alloc(1000, 1).unwrap();
        assert_eq!(t.offset, s.offset + 1024);
    }
}
