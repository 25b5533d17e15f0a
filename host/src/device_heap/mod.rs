//! The device heap from the host: create it, hand its [`Heap`] handle to
//! kernels, read statistics back, list live blocks, reset it.
//!
//! ```
//! use gpuheap::backend::Backend;
//! use gpuheap::device_heap::ops::{self, Sizes};
//! use gpuheap::device_heap::DeviceHeap;
//! let heap = DeviceHeap::new(&Backend::cpu(), 64 << 20)?;
//! let batch = ops::malloc_batch(&heap, &Sizes::Uniform(48), 10_000, false)?;
//! assert_eq!(heap.stats()?.classes[2].slots_in_use, 10_000); // 48 B -> 64 B class
//! ops::free_batch(&heap, batch, 1)?;
//! # Ok::<(), gpuheap::backend::BackendError>(())
//! ```
//!
//! The same code runs on the CPU and the GPU backend: the heap is two
//! [`DeviceBuffer`]s (the data region and the metadata), initialised from an image
//! computed on the host by the kernels crate's own init code
//! (`gpuheap_kernels::heap::init`), and everything this module reports is
//! decoded from a copy of the metadata (no counters are kept on the hot
//! paths of the device code). The heap keeps the backend it was made on
//! ([`DeviceHeap::backend`]): nothing over it takes a `&Backend` (the owner
//! rule of [`crate::backend`]).
//!
//! # Movable blocks
//!
//! A heap made by [`DeviceHeap::with_movable`] also has a *movable region*: a
//! span of its data region, taken out of the buddy allocator, whose blocks are
//! named by [`Handle`](crate::compaction::Handle)s and which compacts in place.
//! Kernels allocate them with `gpuheap_kernels::compact::movable::{handle_alloc,
//! handle_free, resolve}` beside raw `malloc`/`free`; the host through
//! [`DeviceHeap::movable`], a [`MovableRegion`]: the
//! [`HandleRegion`](crate::compaction::HandleRegion) verbs (`alloc`, `free`,
//! `pin`, `unpin`, `resolve`, `compact`, ...) that
//! [`CompactHeap`](crate::compaction::CompactHeap) has too. What moves and
//! what never moves is [`gpuheap_kernels::compact`'s handle
//! model](gpuheap_kernels::compact#handle-model). The span is not a large
//! block: it is not in [`DeviceHeap::live_blocks`], [`HeapStats::movable_bytes`]
//! counts it, and [`DeviceHeap::rebuild`] and [`DeviceHeap::reset`] keep it.

mod movable;
pub mod ops;

use gpuheap_kernels::heap::init::InitImage;
use gpuheap_kernels::heap::layout::*;
use gpuheap_kernels::heap::slab;
pub use gpuheap_kernels::heap::Heap;
pub use movable::{MovableRegion, MovableStats};

use crate::analysis::{self, OomClass, OomDiagnosis};
use crate::backend::{Backend, BackendError, DeviceBuffer, Result};

/// The smallest data region a [`DeviceHeap`] accepts: one 64 KiB slab page.
///
/// Requests of up to 4 KiB are served from slab pages, which are 64 KiB
/// buddy blocks; a smaller data region could serve none of them (a 4 KiB data region
/// would refuse `malloc(16)`). With at least one whole page every request of
/// up to 64 KiB can be served by an empty heap, and a data region of any larger
/// size serves every request up to its largest buddy block (the largest
/// power of two of 4 KiB units that fits).
pub const MIN_HEAP_BYTES: u64 = PAGE;

/// A heap in device memory that kernels allocate from with
/// `gpuheap_kernels::heap::{malloc, free}`, on the backend it was made on (kept, as a clone).
pub struct DeviceHeap {
    backend: Backend,
    data: DeviceBuffer,
    meta: DeviceBuffer,
    handle: Heap,
    movable: Option<movable::Movable>,
    /// Names this heap's current allocations: fresh at creation and at every reset and rebuild, so
    /// that an [`ops::Batch`] of another heap, or of before, is refused.
    generation: u64,
}

/// A generation no heap had before.
fn next_generation() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Per-class figures of [`HeapStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClassStats {
    /// Slot size, bytes.
    pub size: u64,
    /// Pages formatted for this class.
    pub pages: u64,
    /// Slots allocated (bits set in the pages' bitmaps).
    pub slots_in_use: u64,
    /// `slots_in_use * size`.
    pub bytes_in_use: u64,
    /// Reservations (one per warp group of the class) that the slot's
    /// current page did not serve: refills, pages from the available
    /// bitmap, private fresh pages (the slow path;
    /// `gpuheap_kernels::heap::layout::CTRL_SLOW_GRANTS`). Since the heap's
    /// creation or last [`DeviceHeap::reset`]. Every other successful
    /// reservation was a fast-path hit on the current page, so for a given
    /// workload this is the same on a heap that recovered from an
    /// out-of-memory as on a fresh one.
    pub slow_grants: u64,
}

/// A snapshot of the heap's state, decoded from its metadata. Exact when no
/// kernel is running on the heap.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeapStats {
    /// Data-region bytes.
    pub capacity: u64,
    /// The 9 slab classes (16 B .. 4 KiB).
    pub classes: Vec<ClassStats>,
    /// Live large blocks.
    pub large_blocks: u64,
    /// Bytes of live large blocks (their power-of-two block sizes).
    pub large_bytes: u64,
    /// Bytes free in the buddy levels.
    pub free_bytes: u64,
    /// `malloc` calls that returned null for a non-zero size.
    pub failed_requests: u64,
    /// Searches made by the requests that returned null: each one a pass
    /// over the class's available pages and the buddy (or, for a large
    /// request, over the buddy levels) followed by a check of the transit
    /// counter (`gpuheap_kernels::heap::transit`). A request that fails in
    /// an exhausted heap makes one; a search is repeated only when
    /// concurrent operations may have hidden memory from it. Divided by
    /// [`failed_requests`](Self::failed_requests):
    /// [`searches_per_failure`](Self::searches_per_failure).
    pub failed_searches: u64,
    /// Double frees detected (counted with the `debug-free` feature only).
    pub double_frees: u64,
    /// Invalid frees detected (counted with the `debug-free` feature only).
    pub invalid_frees: u64,
    /// Operations in flight that hide free memory (buddy splits and
    /// merges, page formats and retirements; summed over the transit
    /// counter's shards; 0 when no kernel runs).
    pub transit_in_flight: u32,
    /// Bytes of the movable region (taken out of the buddy for handle blocks,
    /// see [`DeviceHeap::with_movable`]; 0 without one).
    pub movable_bytes: u64,
}

impl HeapStats {
    /// Bytes handed out: slots of every class plus large blocks.
    pub fn bytes_in_use(&self) -> u64 {
        self.classes.iter().map(|c| c.bytes_in_use).sum::<u64>() + self.large_bytes
    }

    /// Searches per null result (`failed_searches / failed_requests`; 0
    /// when no request failed): the cost of an out-of-memory answer in
    /// passes over the heap. 1 in an exhausted heap with nothing in flight.
    #[doc(hidden)]
    pub fn searches_per_failure(&self) -> f64 {
        if self.failed_requests == 0 {
            0.0
        } else {
            self.failed_searches as f64 / self.failed_requests as f64
        }
    }

    /// Slab pages in total.
    #[doc(hidden)]
    pub fn slab_pages(&self) -> u64 {
        self.classes.iter().map(|c| c.pages).sum()
    }

    /// `slab pages * 64 KiB + large bytes + free bytes + movable bytes`:
    /// equals [`capacity`](Self::capacity) in a consistent heap (nothing
    /// lost, nothing counted twice).
    #[doc(hidden)]
    pub fn accounted_bytes(&self) -> u64 {
        self.slab_pages() * PAGE + self.large_bytes + self.free_bytes + self.movable_bytes
    }
}

/// A live large block (a buddy allocation of more than 4 KiB).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[doc(hidden)]
pub struct BuddyBlock {
    /// Byte offset from the data-region base (a multiple of `size`).
    pub offset: u64,
    /// Block size, bytes (`4096 << order`; the request was rounded up to it).
    pub size: u64,
}

impl BuddyBlock {
    /// Buddy order (`size = 4096 << order`).
    pub fn order(&self) -> u32 {
        (self.size >> UNIT_SHIFT).trailing_zeros()
    }
}

/// Errors of [`DeviceHeap::rebuild`].
fn invalid(msg: String) -> BackendError {
    BackendError::InvalidArgument(msg)
}

impl DeviceHeap {
    /// A heap with a data region of `bytes` bytes (rounded down to 4 KiB; at least
    /// [`MIN_HEAP_BYTES`] = 64 KiB), every byte free.
    ///
    /// # Errors
    /// `InvalidArgument` when `bytes` is below [`MIN_HEAP_BYTES`] or beyond the
    /// largest supported data region; allocation errors of the backend.
    pub fn new(backend: &Backend, bytes: u64) -> Result<Self> {
        if bytes < MIN_HEAP_BYTES {
            return Err(invalid(format!(
                "a device heap needs at least {MIN_HEAP_BYTES} bytes (one 64 KiB slab page: requests of up to \
                 4 KiB are carved from whole pages), got {bytes}"
            )));
        }
        let layout = Heap::layout(bytes).ok_or_else(|| {
            invalid(format!("a device heap of {bytes} bytes exceeds the largest supported data region"))
        })?;
        let data_len = usize::try_from(layout.capacity + PAGE)
            .map_err(|_| invalid(format!("{bytes} bytes do not fit the host's address space")))?;
        // One extra page so that the base can be aligned to a page: pages and
        // large blocks are then aligned to their size in absolute addresses.
        let data = backend.alloc_zeroed(data_len)?;
        let meta = backend.alloc_zeroed(layout.meta_bytes as usize)?;
        let base = (data.device_ptr() + PAGE - 1) & !(PAGE - 1);
        let handle = Heap { base, meta: meta.device_ptr(), ..layout };
        let mut heap =
            DeviceHeap { backend: backend.clone(), data, meta, handle, movable: None, generation: next_generation() };
        heap.write_initial_metadata()?;
        Ok(heap)
    }

    /// Unit range `[start, end)` of the movable region (empty without one).
    fn movable_units(&self) -> (u64, u64) {
        let h = &self.handle;
        (h.movable_off >> UNIT_SHIFT, (h.movable_off + h.movable_bytes) >> UNIT_SHIFT)
    }

    fn write_initial_metadata(&mut self) -> Result<()> {
        let (s, e) = self.movable_units();
        let img = if s == e {
            InitImage::new(self.handle)
        } else {
            InitImage::with_free_runs(self.handle, [(0, s), (e, self.handle.units)].into_iter().filter(|r| r.0 < r.1))
        };
        self.meta.write_at(0, &img.ctrl_bytes())?;
        self.meta.write_at(self.handle.buddy_off as usize, &img.buddy_bytes())?;
        Ok(())
    }

    /// The handle to put in kernel parameter structs. Valid while `self` lives.
    ///
    /// It is also the heap descriptor of CUDA C/C++ kernels: the same 152 bytes
    /// are `gpuheap_heap` in `gpuheap.cuh` ([`crate::ptx::CUDA_HEADER`]), passed
    /// by value as a kernel argument (`examples/cuda-cpp`).
    #[doc(hidden)]
    pub fn handle(&self) -> Heap {
        self.handle
    }

    /// The backend the heap was made on (its memory's owner; kernels that use the heap must run
    /// there).
    #[doc(hidden)]
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// Data-region bytes.
    pub fn capacity(&self) -> u64 {
        self.handle.capacity
    }

    /// The buddy block a `malloc(size)` takes when it cannot reuse a slot
    /// of a formatted slab page, bytes: a whole 64 KiB page for sizes of 1
    /// to 4096, `4096 << order` above (the next power of two of 4 KiB
    /// units). `None` for 0 and when that block is larger than any block
    /// this heap's buddy allocator can ever hold (larger than its largest
    /// power of two of units; sizes near `u64::MAX` included, computed
    /// without wrapping).
    #[doc(hidden)]
    pub fn buddy_block_of(&self, size: u64) -> Option<u64> {
        let block = match class_of(size) {
            _ if size == 0 => return None,
            Some(_) => PAGE,
            None => UNIT.checked_mul(1u64.checked_shl(order_of(size))?)?,
        };
        let largest = UNIT << self.handle.max_order;
        (block <= largest && (class_of(size).is_none() || self.handle.units >= 1 << PAGE_ORDER)).then_some(block)
    }

    /// Why a `malloc(size)` of this heap returned null, given the free
    /// buddy blocks at that moment (`(offset, bytes)` from
    /// [`free_blocks`](Self::free_blocks)):
    ///
    /// * [`OomClass::Capacity`] when the heap can never hold the request
    ///   ([`buddy_block_of`](Self::buddy_block_of) is `None`; `requested` is
    ///   then `size`), or when the free bytes in the buddy levels are fewer
    ///   than the block it needs;
    /// * [`OomClass::Fragmentation`] when they are enough but no free block
    ///   is large enough (a compaction would make room);
    /// * [`OomClass::Fits`] when a free block would hold it (the request
    ///   failed for another reason, e.g. concurrent use).
    ///
    /// `requested` is the block the request needs (a 64 KiB page for slab
    /// sizes), so a 1 KiB request into an empty heap whose free memory is
    /// not a whole page is capacity, not fragmentation. Free slots inside
    /// slab pages of other classes are not counted: only the buddy can serve
    /// a new page. The replay's device-heap row uses this classification.
    #[doc(hidden)]
    pub fn diagnose_failure(&self, size: u64, free_blocks: &[(u64, u64)]) -> OomDiagnosis {
        let free = free_blocks.iter().fold(0u64, |a, b| a.saturating_add(b.1));
        let largest = free_blocks.iter().map(|b| b.1).max().unwrap_or(0);
        match self.buddy_block_of(size) {
            Some(block) => analysis::diagnose(block, free, largest),
            None => {
                let mut d = analysis::diagnose(u64::MAX, free, largest);
                d.requested = size;
                d.shortfall = size.saturating_sub(free);
                debug_assert_eq!(d.class, OomClass::Capacity);
                d
            }
        }
    }

    /// Device address of the data region (page aligned).
    #[doc(hidden)]
    pub fn base(&self) -> u64 {
        self.handle.base
    }

    /// The data-region buffer (for copying block contents back).
    #[doc(hidden)]
    pub fn data(&self) -> &DeviceBuffer {
        &self.data
    }

    /// Copies `src` into the data-region buffer at byte `offset` (of [`data`](Self::data); the
    /// data region starts at [`data_offset`](Self::data_offset)): fills blocks from the host while
    /// no kernel uses the heap. The metadata is not reachable through it.
    ///
    /// # Errors
    /// `InvalidArgument` past the buffer; backend errors.
    #[doc(hidden)]
    pub fn write_data(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        self.data.write_at(offset, src)
    }

    /// Byte offset of the data-region base inside [`data`](Self::data).
    #[doc(hidden)]
    pub fn data_offset(&self) -> usize {
        (self.handle.base - self.data.device_ptr()) as usize
    }

    /// Frees everything: the heap returns to the state of [`DeviceHeap::new`]
    /// (counters included). Pointers from before are invalid afterwards (and
    /// [`ops`] refuses batches from before). With
    /// a movable region, every handle is freed too (handles from before stay
    /// invalid: entry generations are kept) and the data region stays reserved.
    #[doc(hidden)]
    pub fn reset(&mut self) -> Result<()> {
        self.generation = next_generation();
        self.meta.zero()?;
        self.write_initial_metadata()?;
        self.reset_movable()
    }

    /// Copies the metadata to the host.
    fn read_meta(&self) -> Result<Vec<u8>> {
        let mut v = vec![0u8; self.handle.meta_bytes as usize];
        self.meta.read_into(0, &mut v)?;
        Ok(v)
    }

    /// Statistics decoded from a copy of the metadata.
    pub fn stats(&self) -> Result<HeapStats> {
        let m = MetaView { h: self.handle, bytes: self.read_meta()? };
        let h = &self.handle;
        let mut classes: Vec<ClassStats> =
            (0..CLASSES).map(|c| ClassStats { size: class_size(c), ..Default::default() }).collect();
        for p in 0..h.pages {
            let hdr = m.u64(h.hdr_off, p);
            if let Some(c) = slab::hdr_class(hdr) {
                let cs = &mut classes[c as usize];
                cs.pages += 1;
                let used: u64 = (0..class_words(c) as u64)
                    .map(|w| m.u32(h.bits_off, p * WORDS_PER_PAGE + w).count_ones() as u64)
                    .sum();
                cs.slots_in_use += used;
            }
        }
        for (i, c) in classes.iter_mut().enumerate() {
            c.bytes_in_use = c.slots_in_use * c.size;
            c.slow_grants = m.u64(0, (CTRL_SLOW_GRANTS + i) as u64);
        }
        let live = m.live_blocks();
        let mut free_bytes = 0;
        for k in 0..=h.max_order as u32 {
            let off = m.u64(0, (CTRL_LEVELS as u32 + k) as u64);
            let words = level_bits(h.units, k).div_ceil(WORD_BITS as u64);
            for w in 0..words {
                free_bytes += m.u32(h.buddy_off, off + w).count_ones() as u64 * (UNIT << k);
            }
        }
        Ok(HeapStats {
            capacity: h.capacity,
            classes,
            large_blocks: live.len() as u64,
            large_bytes: live.iter().map(|b| b.size).sum(),
            free_bytes,
            failed_requests: m.u64(0, CTRL_FAILED as u64),
            failed_searches: m.u64(0, CTRL_FAILED_SEARCHES as u64),
            double_frees: m.u64(0, CTRL_DOUBLE_FREES as u64),
            invalid_frees: m.u64(0, CTRL_INVALID_FREES as u64),
            transit_in_flight: (0..TRANSIT_SHARDS as usize)
                .map(|s| m.u64(0, (CTRL_TRANSIT + s * TRANSIT_STRIDE) as u64) as u32)
                .sum(),
            movable_bytes: h.movable_bytes,
        })
    }

    /// The live large blocks in address order, read from the tags (unit `u`
    /// starts a live block of order `k` iff `tags[u] = k + 1`). This is the
    /// list a compaction pass relocates; slab pages (listed by
    /// [`slab_pages`](Self::slab_pages)) are not in it.
    #[doc(hidden)]
    pub fn live_blocks(&self) -> Result<Vec<BuddyBlock>> {
        Ok(MetaView { h: self.handle, bytes: self.read_meta()? }.live_blocks())
    }

    /// Byte offsets of the formatted slab pages (64 KiB each) and their slot
    /// sizes, in address order.
    #[doc(hidden)]
    pub fn slab_pages(&self) -> Result<Vec<(u64, u64)>> {
        let m = MetaView { h: self.handle, bytes: self.read_meta()? };
        Ok((0..self.handle.pages)
            .filter_map(|p| slab::hdr_class(m.u64(self.handle.hdr_off, p)).map(|c| (p * PAGE, class_size(c))))
            .collect())
    }

    /// The free buddy blocks as `(byte offset from the data-region base, bytes)`, in
    /// address order: every block that is free as a whole at some buddy level
    /// (adjacent free blocks that are not buddies are listed separately: the
    /// buddy allocator cannot serve one request from both). Free slots inside
    /// slab pages are not listed. Reads only the control words and the buddy
    /// region of the metadata (a few hundred KiB for a 4 GiB heap), so it is
    /// cheap enough to call between launches; exact when no kernel runs.
    ///
    /// # Errors
    /// Backend errors of the read-back.
    #[doc(hidden)]
    pub fn free_blocks(&self) -> Result<Vec<(u64, u64)>> {
        let h = self.handle;
        let mut ctrl = vec![0u8; CTRL_WORDS as usize * 8];
        self.meta.read_into(0, &mut ctrl)?;
        let mut buddy = vec![0u8; h.buddy_words as usize * 4];
        self.meta.read_into(h.buddy_off as usize, &mut buddy)?;
        let word = |v: &[u8], i: u64| -> u64 {
            let o = i as usize * 8;
            v.get(o..o + 8).map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        };
        let word32 = |v: &[u8], i: u64| -> u32 {
            let o = i as usize * 4;
            v.get(o..o + 4).map_or(0, |b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
        };
        let mut out = Vec::new();
        for k in 0..=h.max_order as u32 {
            let off = word(&ctrl, (CTRL_LEVELS as u32 + k) as u64);
            let n = level_bits(h.units, k);
            for w in 0..n.div_ceil(WORD_BITS as u64) {
                let mut v = word32(&buddy, off + w);
                while v != 0 {
                    let i = w * WORD_BITS as u64 + v.trailing_zeros() as u64;
                    if i < n {
                        out.push(((i << k) << UNIT_SHIFT, UNIT << k));
                    }
                    v &= v - 1;
                }
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    /// Rewrites the large-block metadata after a relocation: afterwards the
    /// live large blocks are exactly `blocks` and every unit that is neither
    /// in one of them nor in a slab page is free (decomposed into maximal
    /// buddy blocks by `gpuheap_kernels::heap::init::free_runs`). Slab pages,
    /// their bitmaps, the counters and the movable region are kept. Run it
    /// while no kernel uses the heap. [`ops`] refuses batches from before it
    /// (their pointers may have moved).
    ///
    /// # Errors
    /// `InvalidArgument` when a block is not a power-of-two multiple of 4 KiB,
    /// is not aligned to its size, overlaps another block, a slab page or the
    /// movable region, or lies outside the data region.
    #[doc(hidden)]
    pub fn rebuild(&mut self, blocks: &[BuddyBlock]) -> Result<()> {
        let h = self.handle;
        let mut occupied: Vec<(u64, u64)> = Vec::with_capacity(blocks.len());
        for b in blocks {
            let ok = b.size >= 2 * UNIT
                && b.size.is_power_of_two()
                && b.offset % b.size == 0
                && b.offset.checked_add(b.size).is_some_and(|e| e <= h.capacity);
            if !ok {
                return Err(invalid(format!("{b:?} is not an aligned power-of-two block inside the data region")));
            }
            occupied.push((b.offset >> UNIT_SHIFT, (b.offset + b.size) >> UNIT_SHIFT));
        }
        let (ms, me) = self.movable_units();
        if ms < me {
            occupied.push((ms, me));
        }
        let meta = self.read_meta()?;
        let m = MetaView { h, bytes: meta };
        for p in 0..h.pages {
            if slab::hdr_class(m.u64(h.hdr_off, p)).is_some() {
                occupied.push((p << PAGE_ORDER, (p + 1) << PAGE_ORDER));
            }
        }
        occupied.sort_unstable();
        for w in occupied.windows(2) {
            if w[0].1 > w[1].0 {
                return Err(invalid(format!("units {:?} and {:?} overlap", w[0], w[1])));
            }
        }
        let mut runs = Vec::new();
        let mut at = 0;
        for &(s, e) in &occupied {
            if s > at {
                runs.push((at, s));
            }
            at = e;
        }
        if at < h.units {
            runs.push((at, h.units));
        }
        self.generation = next_generation();
        let img = InitImage::with_free_runs(h, runs.into_iter());
        self.meta.write_at(h.buddy_off as usize, &img.buddy_bytes())?;
        let mut tags = vec![0u8; h.units as usize * 4];
        for b in blocks {
            let u = (b.offset >> UNIT_SHIFT) as usize;
            tags[4 * u..4 * u + 4].copy_from_slice(&(b.order() + 1).to_le_bytes());
        }
        self.meta.write_at(h.tags_off as usize, &tags)?;
        for s in 0..TRANSIT_SHARDS as usize {
            self.meta.write_at((CTRL_TRANSIT + s * TRANSIT_STRIDE) * 8, &0u64.to_le_bytes())?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for DeviceHeap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceHeap({} bytes @ {:#x}, {} metadata bytes)",
            self.capacity(),
            self.base(),
            self.handle.meta_bytes
        )
    }
}

/// A host copy of the metadata, decoded by offsets.
struct MetaView {
    h: Heap,
    bytes: Vec<u8>,
}

impl MetaView {
    fn u64(&self, region_off: u64, i: u64) -> u64 {
        let o = (region_off + 8 * i) as usize;
        u64::from_le_bytes(self.bytes[o..o + 8].try_into().expect("8 bytes"))
    }

    fn u32(&self, region_off: u64, i: u64) -> u32 {
        let o = (region_off + 4 * i) as usize;
        u32::from_le_bytes(self.bytes[o..o + 4].try_into().expect("4 bytes"))
    }

    fn live_blocks(&self) -> Vec<BuddyBlock> {
        (0..self.h.units)
            .filter_map(|u| {
                let t = self.u32(self.h.tags_off, u);
                (t != 0).then(|| BuddyBlock { offset: u << UNIT_SHIFT, size: UNIT << (t - 1) })
            })
            .collect()
    }
}
