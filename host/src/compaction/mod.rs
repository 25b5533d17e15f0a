//! Relocatable blocks and in-place compaction of a region.
//!
//! * [`CompactHeap`]: a region of device memory whose layout is managed on
//!   the host (first fit), whose blocks are named by [`Handle`]s through a
//!   device handle table, and which [`compact`] defragments in place.
//! * The device heap's *movable region*
//!   ([`DeviceHeap::with_movable`](crate::device_heap::DeviceHeap::with_movable)):
//!   handle blocks allocated by kernels (`gpuheap_kernels::compact::movable::handle_alloc`)
//!   or the host beside raw `malloc`, which [`compact_heap`] defragments in
//!   place with the same core. Raw `malloc` blocks lie outside the movable region and
//!   never move (they count as pinned).
//! * [`Compactor`]: the compaction core (plan and move kernels over any
//!   region and layout), which the device heap will reuse.
//! * [`mod@oracle`]: the kernels' view of the one reference plan
//!   ([`crate::reference::compact::plan_slide`], through [`oracle::plan`])
//!   and the reference bytes ([`oracle::apply`]).
//!
//! # Handle model and guarantees
//!
//! A block is named by a [`Handle`], never by its address. Kernels receive
//! the [`DeviceHandleTable`] (from [`CompactHeap::device_table`]) in their
//! parameters and call `gpuheap_kernels::compact::handle::resolve(&table,
//! handle)` when they run; host code calls [`CompactHeap::resolve`].
//!
//! * **What moves:** the bytes of live, unpinned blocks, towards the start of
//!   their segment, in address order, when [`compact`] runs (and only then:
//!   allocation and free never move anything). Handles, sizes and contents
//!   stay the same.
//! * **What never moves:** pinned blocks ([`CompactHeap::pin`]; pins nest).
//!   Nothing moves *over* a pinned block: each run of blocks between pinned
//!   blocks slides to its own start. Blocks before the first hole of their
//!   segment are not copied either.
//! * **What a kernel must not do:** keep a resolved pointer (or a
//!   [`CompactHeap::device_ptr`]) across a compaction, or run during one.
//!   Resolve the handle in the kernel that uses it. Work queued before a
//!   compaction stays correct when it resolves its handle at execution time
//!   (bug scenario BL-16, test `bl_16_pending_op_sees_data_after_compaction`).
//!   Pin a block for as long as something holds its address.
//! * After [`compact`], each segment's free space is one range at its end;
//!   without pinned blocks the whole free space is one range and external
//!   fragmentation is 0.
//!
//! The algorithm, its correctness (hazards F1/F2) and forward-progress
//! arguments are documented in `gpuheap_kernels::compact`.

mod compactor;
pub mod oracle;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

pub use compactor::{CompactTuning, Compactor, LayoutCompaction, MAX_SHARED_BYTES};
use gpuheap_kernels::compact::handle::{
    make_handle, split_handle, DeviceHandleTable, HandleEntry, HandleFillParams, ENTRY_LIVE, ENTRY_PINNED, HANDLE_FILL,
};
pub use gpuheap_kernels::compact::{LiveBlock, BLOCK_PINNED, GRANULE};

pub use crate::analysis::Fragmentation;

use crate::backend::{Backend, BackendError, DeviceBuffer, LaunchConfig};

/// Errors of the compaction API.
#[derive(Debug, thiserror::Error)]
pub enum CompactionError {
    /// A backend operation failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// No free range of the region holds the request.
    #[error("region out of memory: {requested} bytes requested, largest free range {largest_free} of {total_free} free bytes")]
    OutOfMemory {
        /// Bytes requested (rounded up to [`GRANULE`]).
        requested: u64,
        /// Largest free range, bytes.
        largest_free: u64,
        /// All free bytes.
        total_free: u64,
    },
    /// The handle is not live (never allocated, freed, or from another heap).
    #[error("invalid or stale handle {0:?}")]
    InvalidHandle(Handle),
    /// A pinned block cannot be freed.
    #[error("handle {0:?} is pinned")]
    Pinned(Handle),
    /// `unpin` of a block that is not pinned.
    #[error("handle {0:?} is not pinned")]
    NotPinned(Handle),
    /// Every handle-table entry is in use.
    #[error("all {0} handle-table entries are in use")]
    TooManyHandles(u32),
    /// `alloc(0)`.
    #[error("zero-byte allocation")]
    ZeroSize,
    /// A layout given to the compaction core breaks its rules.
    #[error("invalid layout: {0}")]
    InvalidLayout(String),
    /// A [`CompactTuning`] the kernels cannot run with.
    #[error("invalid tuning: {0}")]
    InvalidTuning(String),
}

/// Result of the compaction API.
pub type Result<T, E = CompactionError> = std::result::Result<T, E>;

/// A relocatable block's name: table index (low 32 bits) and generation
/// (high 32 bits). Copy it freely; it stays valid across compactions until
/// the block is freed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Handle(pub u64);

impl Handle {
    /// Table index.
    pub fn index(self) -> u32 {
        split_handle(self.0).0
    }
    /// Generation.
    pub fn generation(self) -> u32 {
        split_handle(self.0).1
    }
}

/// Where a live block is now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockInfo {
    /// Byte offset in the region.
    pub offset: u64,
    /// Requested size in bytes (the block occupies it rounded up to
    /// [`GRANULE`]).
    pub size: u64,
    /// Pinned at the moment.
    pub pinned: bool,
}

/// The [`Fragmentation`] of a region of `capacity` bytes tiled by live blocks of `allocated` requested
/// bytes and the free ranges `free` (`(offset, len)`, address order): in use is every byte not free, the
/// [`footprint`](crate::analysis::footprint) the end of the highest live block.
pub fn region_fragmentation(
    capacity: u64,
    allocated: u64,
    free: impl IntoIterator<Item = (u64, u64)>,
) -> Fragmentation {
    let free: Vec<(u64, u64)> = free.into_iter().collect();
    let f = Fragmentation::of_free(free.iter().map(|r| r.1));
    let free_top = free.last().filter(|r| r.0.saturating_add(r.1) == capacity).map_or(0, |r| r.1);
    let footprint = crate::analysis::footprint(capacity - free_top, capacity, capacity);
    let in_use = capacity.saturating_sub(f.free);
    f.with_live(allocated, in_use, footprint)
}

/// What [`compact`] did.
#[derive(Clone, Debug, Default)]
pub struct CompactionReport {
    /// Live blocks in the region.
    pub blocks: u64,
    /// Blocks whose offset changed.
    pub blocks_moved: u64,
    /// Bytes that changed address (`M`; the kernels read and write each once).
    pub bytes_moved: u64,
    /// Kernel time of the plan launch.
    pub plan_time: Duration,
    /// Kernel time of the move launch.
    pub move_time: Duration,
    /// `plan_time + move_time`.
    pub kernel_time: Duration,
    /// Wall time of the whole call (uploads, launches, read-back, host
    /// metadata), measured on the host.
    pub wall_time: Duration,
    /// `bytes_moved / kernel_time`, in GB/s (10^9 bytes per second; 0 when
    /// nothing moved).
    pub gbps: f64,
    /// Kernels launched (0 when the region was already compact).
    pub launches: u32,
    /// Fragmentation before.
    pub before: Fragmentation,
    /// Fragmentation after.
    pub after: Fragmentation,
}

/// A region of device memory with relocatable blocks (see the module docs).
///
/// The layout is managed on the host by first fit over a map of free ranges;
/// the handle table lives on the device (mirrored on the host and uploaded
/// lazily when dirty).
pub struct CompactHeap<'b> {
    backend: &'b Backend,
    region: DeviceBuffer,
    capacity: u64,
    entries: Vec<HandleEntry>,
    pins: Vec<u32>,
    free_ids: Vec<u32>,
    max_handles: u32,
    table: DeviceBuffer,
    table_dirty: bool,
    live: BTreeMap<u64, u32>,
    holes: BTreeMap<u64, u64>,
    compactor: Compactor,
}

fn round(size: u64) -> u64 {
    size.div_ceil(GRANULE) * GRANULE
}

impl<'b> CompactHeap<'b> {
    /// A heap of `capacity` bytes (rounded down to [`GRANULE`]) with room for
    /// `max_handles` handles, on `backend`, with the backend's default
    /// [`CompactTuning`].
    ///
    /// # Errors
    /// Backend errors (allocation).
    pub fn new(backend: &'b Backend, capacity: u64, max_handles: u32) -> Result<Self> {
        let capacity = capacity / GRANULE * GRANULE;
        let region = backend.alloc_zeroed(capacity as usize)?;
        let table = backend.alloc_zeroed(max_handles as usize * size_of::<HandleEntry>())?;
        let mut holes = BTreeMap::new();
        if capacity > 0 {
            holes.insert(0, capacity);
        }
        Ok(Self {
            backend,
            region,
            capacity,
            entries: Vec::new(),
            pins: Vec::new(),
            free_ids: Vec::new(),
            max_handles,
            table,
            table_dirty: false,
            live: BTreeMap::new(),
            holes,
            compactor: Compactor::new(CompactTuning::for_backend(backend)),
        })
    }

    /// The backend.
    pub fn backend(&self) -> &'b Backend {
        self.backend
    }

    /// Region size, bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The compaction tuning.
    pub fn tuning(&self) -> CompactTuning {
        self.compactor.tuning()
    }

    /// Replaces the compaction tuning (tile size, geometry).
    pub fn set_tuning(&mut self, t: CompactTuning) {
        self.compactor.set_tuning(t);
    }

    /// Number of live blocks.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// `true` when no block is live.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// Allocates `size` bytes (first fit; the block occupies `size` rounded up
    /// to [`GRANULE`], at a 16-byte aligned offset). Never moves anything.
    ///
    /// # Errors
    /// [`CompactionError::ZeroSize`], [`CompactionError::TooManyHandles`],
    /// [`CompactionError::OutOfMemory`] (compacting may make room when
    /// `total_free ≥ requested`).
    pub fn alloc(&mut self, size: u64) -> Result<Handle> {
        if size == 0 {
            return Err(CompactionError::ZeroSize);
        }
        let need = round(size);
        let Some((&off, &len)) = self.holes.iter().find(|(_, &l)| l >= need) else {
            let f = self.fragmentation();
            return Err(CompactionError::OutOfMemory {
                requested: need,
                largest_free: f.largest_free,
                total_free: f.free,
            });
        };
        let index = match self.free_ids.pop() {
            Some(i) => i,
            None if (self.entries.len() as u64) < self.max_handles as u64 => {
                self.entries.push(HandleEntry::default());
                self.pins.push(0);
                (self.entries.len() - 1) as u32
            }
            None => return Err(CompactionError::TooManyHandles(self.max_handles)),
        };
        self.holes.remove(&off);
        if len > need {
            self.holes.insert(off + need, len - need);
        }
        let e = &mut self.entries[index as usize];
        e.generation = e.generation.wrapping_add(1).max(1);
        e.offset = off;
        e.size = size;
        e.flags = ENTRY_LIVE;
        self.live.insert(off, index);
        self.table_dirty = true;
        Ok(Handle(make_handle(index, e.generation)))
    }

    fn check(&self, h: Handle) -> Result<usize> {
        let (i, gen) = split_handle(h.0);
        match self.entries.get(i as usize) {
            Some(e) if e.flags & ENTRY_LIVE != 0 && e.generation == gen => Ok(i as usize),
            _ => Err(CompactionError::InvalidHandle(h)),
        }
    }

    /// Frees the block of `h`; its range becomes free (merged with free
    /// neighbours) and `h` becomes invalid.
    ///
    /// # Errors
    /// [`CompactionError::InvalidHandle`], [`CompactionError::Pinned`].
    pub fn free(&mut self, h: Handle) -> Result<()> {
        let i = self.check(h)?;
        if self.pins[i] > 0 {
            return Err(CompactionError::Pinned(h));
        }
        let e = &mut self.entries[i];
        let (mut off, mut len) = (e.offset, round(e.size));
        e.flags = 0;
        self.live.remove(&off);
        self.free_ids.push(i as u32);
        self.table_dirty = true;
        if let Some((&po, &pl)) = self.holes.range(..off).next_back() {
            if po + pl == off {
                self.holes.remove(&po);
                off = po;
                len += pl;
            }
        }
        if let Some(nl) = self.holes.remove(&(off + len)) {
            len += nl;
        }
        self.holes.insert(off, len);
        Ok(())
    }

    /// Pins the block of `h`: it never moves until unpinned as many times.
    ///
    /// # Errors
    /// [`CompactionError::InvalidHandle`].
    pub fn pin(&mut self, h: Handle) -> Result<()> {
        let i = self.check(h)?;
        self.pins[i] += 1;
        self.entries[i].flags |= ENTRY_PINNED;
        self.table_dirty = true;
        Ok(())
    }

    /// Undoes one [`pin`](Self::pin).
    ///
    /// # Errors
    /// [`CompactionError::InvalidHandle`], [`CompactionError::NotPinned`].
    pub fn unpin(&mut self, h: Handle) -> Result<()> {
        let i = self.check(h)?;
        if self.pins[i] == 0 {
            return Err(CompactionError::NotPinned(h));
        }
        self.pins[i] -= 1;
        if self.pins[i] == 0 {
            self.entries[i].flags &= !ENTRY_PINNED;
        }
        self.table_dirty = true;
        Ok(())
    }

    /// Where the block of `h` is now (host side of `resolve`).
    ///
    /// # Errors
    /// [`CompactionError::InvalidHandle`].
    pub fn resolve(&self, h: Handle) -> Result<BlockInfo> {
        let e = &self.entries[self.check(h)?];
        Ok(BlockInfo { offset: e.offset, size: e.size, pinned: e.flags & ENTRY_PINNED != 0 })
    }

    /// The device address of the block of `h` now. Valid until the next
    /// compaction only (unless pinned).
    ///
    /// # Errors
    /// [`CompactionError::InvalidHandle`].
    pub fn device_ptr(&self, h: Handle) -> Result<u64> {
        Ok(self.region.device_ptr() + self.resolve(h)?.offset)
    }

    /// The handle table for kernel parameters (uploaded first if the host
    /// changed it).
    ///
    /// # Errors
    /// Backend errors.
    pub fn device_table(&mut self) -> Result<DeviceHandleTable> {
        self.flush_table()?;
        Ok(DeviceHandleTable {
            entries: self.table.device_ptr(),
            region: self.region.device_ptr(),
            len: self.entries.len() as u32,
            reserved: 0,
        })
    }

    fn flush_table(&mut self) -> Result<()> {
        if self.table_dirty {
            self.table.write(&self.entries)?;
            self.table_dirty = false;
        }
        Ok(())
    }

    /// The device handle table read back (for checks): one entry per handle
    /// index ever used.
    ///
    /// # Errors
    /// Backend errors.
    pub fn read_device_table(&mut self) -> Result<Vec<HandleEntry>> {
        self.flush_table()?;
        let mut v = vec![HandleEntry::default(); self.entries.len()];
        self.table.read_into(0, bytemuck::cast_slice_mut(&mut v))?;
        Ok(v)
    }

    /// The live blocks in address order, as the compaction kernels take them
    /// (sizes rounded up to [`GRANULE`]).
    pub fn layout(&self) -> Vec<LiveBlock> {
        self.live
            .iter()
            .map(|(&off, &i)| {
                let e = &self.entries[i as usize];
                LiveBlock {
                    offset: off,
                    size: round(e.size),
                    handle: i,
                    flags: if e.flags & ENTRY_PINNED != 0 { BLOCK_PINNED } else { 0 },
                }
            })
            .collect()
    }

    /// The handle of the block whose table index is `index`, if live.
    pub fn handle_of(&self, index: u32) -> Option<Handle> {
        let e = self.entries.get(index as usize)?;
        (e.flags & ENTRY_LIVE != 0).then(|| Handle(make_handle(index, e.generation)))
    }

    /// The free ranges `(offset, len)` in address order.
    pub fn free_ranges(&self) -> Vec<(u64, u64)> {
        self.holes.iter().map(|(&o, &l)| (o, l)).collect()
    }

    /// Fragmentation of the region now ([`region_fragmentation`]).
    pub fn fragmentation(&self) -> Fragmentation {
        region_fragmentation(self.capacity, self.allocated(), self.holes.iter().map(|(&o, &l)| (o, l)))
    }

    /// Requested bytes of the live blocks.
    fn allocated(&self) -> u64 {
        self.live.values().map(|&i| self.entries[i as usize].size).sum()
    }

    /// The region's memory (for whole-region reads and writes).
    pub fn region(&self) -> &DeviceBuffer {
        &self.region
    }

    /// The region's memory, writable (for example to poison free ranges).
    pub fn region_mut(&mut self) -> &mut DeviceBuffer {
        &mut self.region
    }

    /// Writes `data` into the block of `h` at byte `at`.
    ///
    /// # Errors
    /// [`CompactionError::InvalidHandle`]; `InvalidArgument` past the block's
    /// rounded size.
    pub fn write(&mut self, h: Handle, at: u64, data: &[u8]) -> Result<()> {
        let b = self.resolve(h)?;
        if at + data.len() as u64 > round(b.size) {
            return Err(BackendError::InvalidArgument(format!("write past a {}-byte block", b.size)).into());
        }
        Ok(self.region.write_at((b.offset + at) as usize, data)?)
    }

    /// The block of `h` (its rounded size), read back.
    ///
    /// # Errors
    /// [`CompactionError::InvalidHandle`], backend errors.
    pub fn read(&self, h: Handle) -> Result<Vec<u8>> {
        let b = self.resolve(h)?;
        let mut v = vec![0u8; round(b.size) as usize];
        self.region.read_into(b.offset as usize, &mut v)?;
        Ok(v)
    }

    /// Runs the example user kernel `gpuheap_handle_fill` *now*: it resolves
    /// `h` on the device when it executes and writes `value` into every byte
    /// of the block (its requested size).
    ///
    /// # Errors
    /// [`CompactionError::InvalidHandle`] when the device could not resolve
    /// `h`; backend errors.
    pub fn fill_on_device(&mut self, h: Handle, value: u8) -> Result<()> {
        let table = self.device_table()?;
        let failed = self.backend.alloc_zeroed(8)?;
        let p = HandleFillParams { table, handle: h.0, value: value as u32, reserved: 0, failed: failed.device_ptr() };
        // SAFETY: the table and region are live buffers of this heap, the
        // table was just flushed, `failed` is a live u64; `&mut self` keeps
        // the heap from being compacted or changed during the launch.
        unsafe { self.backend.launch(&HANDLE_FILL, LaunchConfig { grid: 4, block: 64, shared_bytes: 0 }, &p)? };
        if failed.read::<u64>()?[0] != 0 {
            return Err(CompactionError::InvalidHandle(h));
        }
        Ok(())
    }

    /// Compacts the region in place (see [`compact`]).
    ///
    /// # Errors
    /// Backend errors, [`CompactionError::InvalidTuning`].
    pub fn compact(&mut self) -> Result<CompactionReport> {
        let start = Instant::now();
        let before = self.fragmentation();
        let layout = self.layout();
        let mut report = CompactionReport { blocks: layout.len() as u64, before, after: before, ..Default::default() };
        if oracle::is_packed(&layout) {
            report.wall_time = start.elapsed();
            return Ok(report);
        }
        self.flush_table()?;
        let n = self.entries.len() as u32;
        let run = self.compactor.compact(self.backend, &mut self.region, &layout, Some((&mut self.table, n)))?;
        let (bytes, moved) = oracle::moved(&layout, &run.new_offsets);
        // The kernels updated the device table; mirror it and rebuild the
        // free map.
        self.live.clear();
        for (b, &d) in layout.iter().zip(&run.new_offsets) {
            self.entries[b.handle as usize].offset = d;
            self.live.insert(d, b.handle);
        }
        self.holes = oracle::free_ranges(&layout, Some(&run.new_offsets), self.capacity).into_iter().collect();
        report.blocks_moved = moved;
        report.bytes_moved = bytes;
        report.plan_time = run.plan_time;
        report.move_time = run.move_time;
        report.kernel_time = run.plan_time + run.move_time;
        report.launches = run.launches;
        let secs = report.kernel_time.as_secs_f64();
        report.gbps = if secs > 0.0 { bytes as f64 / secs / 1e9 } else { 0.0 };
        report.after = self.fragmentation();
        report.wall_time = start.elapsed();
        Ok(report)
    }
}

/// Compacts the movable region of a device heap in place (see
/// [`DeviceHeap::compact`](crate::device_heap::DeviceHeap::compact)): the
/// live, unpinned handle blocks slide towards the start of their segment,
/// the device handle table is rewritten by the plan kernel, and the movable region's
/// allocator state (bump cursor, index pool) is rebuilt in the same call, so
/// that afterwards the free space outside pinned islands is one range at the
/// end. Raw `malloc` blocks are outside the movable region and never move. `backend`
/// is the one the heap was made on.
///
/// # Errors
/// When the heap has no movable region (`InvalidArgument`); backend errors,
/// [`CompactionError::InvalidTuning`].
pub fn compact_heap(backend: &Backend, heap: &mut crate::device_heap::DeviceHeap) -> Result<CompactionReport> {
    heap.compact(backend)
}

/// Compacts `heap` in place: slides every unpinned live block towards the
/// start of its segment (pinned blocks split the region into segments),
/// updates the device handle table and the host metadata, and reports what
/// moved. Returns at once, launching nothing, when no block would move.
///
/// # Errors
/// Backend errors, [`CompactionError::InvalidTuning`].
pub fn compact(heap: &mut CompactHeap<'_>) -> Result<CompactionReport> {
    heap.compact()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn region_fragmentation_tiles_the_region() {
        // 1024 bytes: live [0, 256) and [512, 768) holding 300 requested bytes; free [256, 512) and
        // [768, 1024).
        let f = region_fragmentation(1024, 300, [(256, 256), (768, 256)]);
        assert_eq!((f.free, f.largest_free, f.free_blocks, f.external), (512, 256, 2, 0.5));
        assert_eq!((f.allocated, f.in_use, f.footprint), (300, 512, 768));
        assert_eq!((f.rounding_waste, f.holes, f.reserved_unallocated), (212, 256, 468));
        let empty = region_fragmentation(1024, 0, [(0, 1024)]);
        assert_eq!((empty.footprint, empty.in_use, empty.external), (0, 0, 0.0));
    }
}
