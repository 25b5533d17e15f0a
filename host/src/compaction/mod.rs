//! Relocatable blocks and in-place compaction of a region.
//!
//! * [`HandleRegion`]: the one set of verbs over a region of blocks named by
//!   [`Handle`]s (`alloc`, `free`, `pin`, `unpin`, `resolve`, `device_ptr`,
//!   `device_table`, `layout`, `read`, `write`, `compact`, ...). Two regions
//!   implement it:
//!   * [`CompactHeap`]: a buffer of its own whose layout is managed on the
//!     host (first fit), the handle table mirrored on the host;
//!   * [`MovableRegion`](crate::device_heap::MovableRegion): the movable
//!     region of a device heap, whose blocks kernels allocate
//!     (`gpuheap_kernels::compact::movable::handle_alloc`) beside raw `malloc`,
//!     the handle table on the device only. Raw `malloc` blocks lie outside
//!     it and never move (they count as pinned).
//! * [`Compactor`]: the compaction core (plan and move kernels over any
//!   region and layout), which both regions use.
//! * [`mod@oracle`]: the kernels' view of the one reference plan
//!   ([`crate::reference::compact::plan_slide`], through [`oracle::plan`])
//!   and the reference bytes ([`oracle::apply`]).
//!
//! # Handle model and guarantees
//!
//! They are written once, in the kernels crate: [`gpuheap_kernels::compact`'s
//! handle model](gpuheap_kernels::compact#handle-model) says what moves (live,
//! unpinned blocks, towards the start of their segment, only when
//! [`HandleRegion::compact`] runs), what never moves (pinned blocks; nothing
//! moves over one) and what a kernel must not do (keep a resolved pointer, or
//! a [`HandleRegion::device_ptr`], across a compaction, or run during one).
//! Kernels receive the [`DeviceHandleTable`] (from
//! [`HandleRegion::device_table`]) and resolve handles with
//! `gpuheap_kernels::compact::handle::resolve` when they run; host code calls
//! [`HandleRegion::resolve`]. The algorithm, its correctness (hazards F1/F2)
//! and forward-progress arguments are documented there too.
//!
//! ```
//! use gpuheap::backend::Backend;
//! use gpuheap::compaction::{CompactHeap, HandleRegion};
//! let mut heap = CompactHeap::new(&Backend::cpu(), 1 << 16, 16)?;
//! let (a, b) = (heap.alloc(4096)?, heap.alloc(100)?);
//! heap.write(b, 0, b"kept")?;
//! heap.free(a)?;
//! let report = heap.compact()?;
//! assert_eq!((report.blocks_moved, heap.resolve(b)?.offset), (1, 0));
//! assert_eq!(&heap.read(b)?[..4], b"kept");
//! # Ok::<(), gpuheap::compaction::CompactionError>(())
//! ```

mod compactor;
#[doc(hidden)]
pub mod oracle;
mod region;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

pub use compactor::{CompactTuning, Compactor, LayoutCompaction, MAX_SHARED_BYTES};
use gpuheap_kernels::compact::handle::{
    make_handle, split_handle, DeviceHandleTable, HandleEntry, HandleFillParams, ENTRY_LIVE, ENTRY_PINNED, HANDLE_FILL,
};
use gpuheap_kernels::compact::movable::PIN_SHIFT;
pub use gpuheap_kernels::compact::{LiveBlock, BLOCK_PINNED, GRANULE};
pub use region::HandleRegion;
pub(crate) use region::{block_bytes, occupied};

use crate::analysis::Fragmentation;
use crate::backend::{Backend, BackendError, DeviceBuffer, LaunchConfig};

/// Errors of the compaction API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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
    #[doc(hidden)]
    pub fn index(self) -> u32 {
        split_handle(self.0).0
    }
    /// Generation.
    #[doc(hidden)]
    pub fn generation(self) -> u32 {
        split_handle(self.0).1
    }
}

/// Where a live block is now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[doc(hidden)]
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
#[doc(hidden)]
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

/// What a compaction ([`HandleRegion::compact`]) did.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
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
/// A region of device memory with relocatable blocks, in a buffer of its own, whose layout is
/// managed on the host: a [`HandleRegion`] (see the module docs).
///
/// The layout is managed by first fit over a map of free ranges; the handle table lives on the
/// device (mirrored on the host and uploaded lazily when dirty). It keeps a clone of the backend it
/// was made on.
pub struct CompactHeap {
    backend: Backend,
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

impl CompactHeap {
    /// A heap of `capacity` bytes (rounded down to [`GRANULE`]) with room for
    /// `max_handles` handles, on `backend` (kept, as a clone), with the
    /// backend's default [`CompactTuning`].
    ///
    /// # Errors
    /// Backend errors (allocation).
    pub fn new(backend: &Backend, capacity: u64, max_handles: u32) -> Result<Self> {
        let capacity = capacity / GRANULE * GRANULE;
        let bytes = |n: u64| {
            usize::try_from(n).map_err(|_| BackendError::InvalidArgument(format!("{n} bytes exceed the address space")))
        };
        let region = backend.alloc_zeroed(bytes(capacity)?)?;
        let table = backend.alloc_zeroed(bytes(max_handles as u64 * size_of::<HandleEntry>() as u64)?)?;
        let mut holes = BTreeMap::new();
        if capacity > 0 {
            holes.insert(0, capacity);
        }
        Ok(Self {
            backend: backend.clone(),
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

    /// Number of live blocks.
    #[doc(hidden)]
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// `true` when no block is live.
    #[doc(hidden)]
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// The region's memory (for whole-region reads).
    pub fn region(&self) -> &DeviceBuffer {
        &self.region
    }

    /// Copies `src` into the region at byte `offset`, whatever blocks lie there (for example to
    /// poison free ranges).
    ///
    /// # Errors
    /// `InvalidArgument` past the region; backend errors.
    #[doc(hidden)]
    pub fn write_region(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        Ok(self.region.write_at(offset, src)?)
    }

    /// Runs the example user kernel `gpuheap_handle_fill` *now*: it resolves
    /// `h` on the device when it executes and writes `value` into every byte
    /// of the block (its requested size).
    ///
    /// # Errors
    /// [`CompactionError::InvalidHandle`] when the device could not resolve
    /// `h`; backend errors.
    #[doc(hidden)]
    pub fn fill_on_device(&mut self, h: Handle, value: u8) -> Result<()> {
        let table = self.device_table()?;
        let failed = self.backend.alloc_zeroed(8)?;
        let p = HandleFillParams { table, handle: h.0, value: value as u32, reserved: 0, failed: failed.device_ptr() };
        // SAFETY: the table and region are live buffers of this heap, allocated on
        // `self.backend`, the table was just flushed, `failed` is a live u64 of the same
        // backend; `&mut self` keeps the heap from being compacted or changed during the launch.
        unsafe { self.backend.launch(&HANDLE_FILL, LaunchConfig { grid: 4, block: 64, shared_bytes: 0 }, &p)? };
        if failed.read::<u64>()?[0] != 0 {
            return Err(CompactionError::InvalidHandle(h));
        }
        Ok(())
    }

    fn check(&self, h: Handle) -> Result<usize> {
        let (i, gen) = split_handle(h.0);
        match self.entries.get(i as usize) {
            Some(e) if e.flags & ENTRY_LIVE != 0 && e.generation == gen => Ok(i as usize),
            _ => Err(CompactionError::InvalidHandle(h)),
        }
    }

    fn flush_table(&mut self) -> Result<()> {
        if self.table_dirty {
            self.table.write(&self.entries)?;
            self.table_dirty = false;
        }
        Ok(())
    }

    fn host_layout(&self) -> Vec<LiveBlock> {
        self.live
            .iter()
            .map(|(&off, &i)| {
                let e = &self.entries[i as usize];
                LiveBlock {
                    offset: off,
                    size: occupied(e.size),
                    handle: i,
                    flags: if e.flags & ENTRY_PINNED != 0 { BLOCK_PINNED } else { 0 },
                }
            })
            .collect()
    }

    fn host_fragmentation(&self) -> Fragmentation {
        let allocated = self.live.values().map(|&i| self.entries[i as usize].size).sum();
        region_fragmentation(self.capacity, allocated, self.holes.iter().map(|(&o, &l)| (o, l)))
    }
}

/// The verbs over the host-managed layout: first fit over the free-range map, the host mirror of
/// the table uploaded when it changed.
impl HandleRegion for CompactHeap {
    fn backend(&self) -> &Backend {
        &self.backend
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn max_handles(&self) -> u32 {
        self.max_handles
    }

    fn base(&self) -> u64 {
        self.region.device_ptr()
    }

    fn tuning(&self) -> CompactTuning {
        self.compactor.tuning()
    }

    fn set_tuning(&mut self, t: CompactTuning) {
        self.compactor.set_tuning(t);
    }

    /// First fit: the block takes the lowest free range that holds it (at a 16-byte aligned
    /// offset).
    fn alloc(&mut self, size: u64) -> Result<Handle> {
        if size == 0 {
            return Err(CompactionError::ZeroSize);
        }
        let need = occupied(size);
        let Some((&off, &len)) = self.holes.iter().find(|(_, &l)| l >= need) else {
            let f = self.host_fragmentation();
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

    /// The block's range becomes free at once (merged with free neighbours).
    fn free(&mut self, h: Handle) -> Result<()> {
        let i = self.check(h)?;
        if self.pins[i] > 0 {
            return Err(CompactionError::Pinned(h));
        }
        let e = &mut self.entries[i];
        let (mut off, mut len) = (e.offset, occupied(e.size));
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

    fn pin(&mut self, h: Handle) -> Result<()> {
        let i = self.check(h)?;
        if self.pins[i] + 1 >= 1 << (32 - PIN_SHIFT) {
            return Err(BackendError::InvalidArgument(format!("too many nested pins of {h:?}")).into());
        }
        self.pins[i] += 1;
        self.entries[i].flags |= ENTRY_PINNED;
        self.table_dirty = true;
        Ok(())
    }

    fn unpin(&mut self, h: Handle) -> Result<()> {
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

    fn resolve(&self, h: Handle) -> Result<BlockInfo> {
        let e = &self.entries[self.check(h)?];
        Ok(BlockInfo { offset: e.offset, size: e.size, pinned: e.flags & ENTRY_PINNED != 0 })
    }

    /// Uploads the host mirror first if it changed. `len` is the entries ever used.
    fn device_table(&mut self) -> Result<DeviceHandleTable> {
        self.flush_table()?;
        Ok(DeviceHandleTable {
            entries: self.table.device_ptr(),
            region: self.region.device_ptr(),
            len: self.entries.len() as u32,
            reserved: 0,
        })
    }

    /// One entry per handle index ever used (uploaded first if the host changed it).
    fn read_table(&mut self) -> Result<Vec<HandleEntry>> {
        self.flush_table()?;
        let mut v = vec![HandleEntry::default(); self.entries.len()];
        self.table.read_into(0, bytemuck::cast_slice_mut(&mut v))?;
        Ok(v)
    }

    fn layout(&self) -> Result<Vec<LiveBlock>> {
        Ok(self.host_layout())
    }

    fn handle_of(&self, index: u32) -> Result<Option<Handle>> {
        let e = self.entries.get(index as usize);
        Ok(e.filter(|e| e.flags & ENTRY_LIVE != 0).map(|e| Handle(make_handle(index, e.generation))))
    }

    fn free_ranges(&self) -> Result<Vec<(u64, u64)>> {
        Ok(self.holes.iter().map(|(&o, &l)| (o, l)).collect())
    }

    fn fragmentation(&self) -> Result<Fragmentation> {
        Ok(self.host_fragmentation())
    }

    fn read(&self, h: Handle) -> Result<Vec<u8>> {
        let b = self.resolve(h)?;
        let mut v = vec![0u8; occupied(b.size) as usize];
        self.region.read_into(b.offset as usize, &mut v)?;
        Ok(v)
    }

    fn write(&mut self, h: Handle, at: u64, data: &[u8]) -> Result<()> {
        let off = block_bytes(self.resolve(h)?, at, data.len())?;
        Ok(self.region.write_at(off as usize, data)?)
    }

    /// Afterwards the host mirror and the free-range map follow the new offsets the kernels wrote.
    fn compact(&mut self) -> Result<CompactionReport> {
        let start = Instant::now();
        let before = self.host_fragmentation();
        let layout = self.host_layout();
        let mut report = CompactionReport { blocks: layout.len() as u64, before, after: before, ..Default::default() };
        if oracle::is_packed(&layout) {
            report.wall_time = start.elapsed();
            return Ok(report);
        }
        self.flush_table()?;
        let n = self.entries.len() as u32;
        let run = self.compactor.compact(&self.backend, &mut self.region, &layout, Some((&mut self.table, n)))?;
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
        report.after = self.host_fragmentation();
        report.wall_time = start.elapsed();
        Ok(report)
    }
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
