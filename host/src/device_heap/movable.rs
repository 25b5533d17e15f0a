//! The movable region of a [`DeviceHeap`], host side: creation
//! ([`DeviceHeap::with_movable`]) and the [`MovableRegion`], the region's
//! [`HandleRegion`] (allocation, free, pin, unpin, resolve, compaction).
//!
//! The device side and its design are documented in
//! `gpuheap_kernels::compact::movable`, the guarantees in
//! [`gpuheap_kernels::compact`'s handle model](gpuheap_kernels::compact#handle-model).
//! This file keeps no host mirror of the handle table (kernels allocate and
//! free handles, so the device copy is the only truth): every query reads it
//! back, every host allocation or free launches the same kernel code that
//! user kernels call.
//!
//! Compaction reads the table back to list the live handles (the device has
//! no sort by offset; the host sorts them): `O(max_handles)` bytes of
//! transfer and `O(n log n)` host work per compaction, documented in
//! [`MovableRegion`]'s `compact`.

use std::time::Instant;

use gpuheap_kernels::compact::handle::{
    make_handle, split_handle, DeviceHandleTable, HandleEntry, ENTRY_LIVE, ENTRY_PINNED,
};
use gpuheap_kernels::compact::movable::{
    self, buffer_bytes, pool_offset, HandleAllocParams, HandleFreeParams, HandleTouchParams, CTRL_CURSOR, CTRL_FAILED,
    CTRL_POOL_LEN, CTRL_POOL_NEXT, HEAP_HANDLE_ALLOC, HEAP_HANDLE_FREE, HEAP_HANDLE_TOUCH, MOVABLE_CTRL_BYTES,
    PIN_SHIFT, TABLE_OFFSET,
};
use gpuheap_kernels::compact::{LiveBlock, BLOCK_PINNED};
use gpuheap_kernels::heap::layout::{UNIT, UNIT_SHIFT};

use super::ops::BLOCK;
use super::{DeviceHeap, Heap};
use crate::analysis::Fragmentation;
use crate::backend::{Backend, BackendError, DeviceBuffer, LaunchConfig, Result as BackendResult};
use crate::compaction::{
    block_bytes, occupied, oracle, region_fragmentation, BlockInfo, CompactTuning, CompactionError, CompactionReport,
    Compactor, Handle, HandleRegion, Result,
};

/// Host state of a movable region: the device buffer of control words, table
/// and pool, and the compaction core (its buffers are reused).
pub(super) struct Movable {
    buf: DeviceBuffer,
    compactor: Compactor,
}

/// A snapshot of the movable region, read back from the device. Exact when no
/// kernel is running on the heap.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
#[doc(hidden)]
pub struct MovableStats {
    /// Bytes of the movable region.
    pub capacity: u64,
    /// The bump cursor: bytes handed out since the last compaction (live and
    /// freed blocks; may exceed `capacity` after failed requests).
    pub cursor: u64,
    /// Live handles.
    pub live_handles: u64,
    /// Bytes of live handle blocks (sizes rounded up to 16).
    pub live_bytes: u64,
    /// Entries of the handle table.
    pub max_handles: u32,
    /// Handle-table entries that can still be handed out before the next
    /// compaction.
    pub handles_available: u64,
    /// `handle_alloc` calls (device or host) that returned no handle for a nonzero
    /// size.
    pub failed_requests: u64,
}

fn no_movable() -> CompactionError {
    BackendError::InvalidArgument("the device heap has no movable region (see DeviceHeap::with_movable)".into()).into()
}

const ENTRY_BYTES: usize = size_of::<HandleEntry>();

impl DeviceHeap {
    /// A heap with a data region of `bytes` bytes of which `movable_bytes`
    /// (rounded up to 4 KiB) form the *movable region* for handle blocks, with
    /// a handle table of `max_handles` entries. The movable region is taken out
    /// of the buddy allocator (at the start of the data region); raw `malloc` serves
    /// the rest. Its verbs are [`DeviceHeap::movable`]'s.
    ///
    /// # Errors
    /// `InvalidArgument` when `bytes < 4096`, `movable_bytes` is 0 or larger
    /// than the data region, or `max_handles` is 0; allocation errors.
    pub fn with_movable(backend: &Backend, bytes: u64, movable_bytes: u64, max_handles: u32) -> BackendResult<Self> {
        let mut heap = DeviceHeap::new(backend, bytes)?;
        // Checked: any `u64` is accepted and refused with a typed error, never a panic.
        let span = movable_bytes.checked_next_multiple_of(UNIT).unwrap_or(u64::MAX);
        if movable_bytes == 0 || span > heap.capacity() || max_handles == 0 {
            return Err(BackendError::InvalidArgument(format!(
                "a movable region of {movable_bytes} bytes with {max_handles} handles in a {}-byte heap",
                heap.capacity()
            )));
        }
        let buf = backend.alloc_zeroed(buffer_bytes(max_handles as u64) as usize)?;
        heap.handle.movable_ctrl = buf.device_ptr();
        heap.handle.max_handles = max_handles as u64;
        heap.handle.movable_off = 0;
        heap.handle.movable_bytes = span;
        debug_assert_eq!(span >> UNIT_SHIFT << UNIT_SHIFT, span);
        heap.movable = Some(Movable { buf, compactor: Compactor::new(CompactTuning::for_backend(backend)) });
        heap.meta.zero()?;
        heap.write_initial_metadata()?;
        heap.reset_movable()?;
        Ok(heap)
    }

    /// `true` when the heap has a movable region.
    #[doc(hidden)]
    pub fn has_movable(&self) -> bool {
        self.movable.is_some()
    }

    /// The movable region: its [`HandleRegion`] verbs and the device-side batches
    /// ([`MovableRegion::alloc_batch`], [`free_batch`](MovableRegion::free_batch),
    /// [`touch_handles`](MovableRegion::touch_handles)).
    ///
    /// # Errors
    /// `InvalidArgument` when the heap has no movable region.
    pub fn movable(&mut self) -> Result<MovableRegion<'_>> {
        let DeviceHeap { backend, data, handle, movable, .. } = self;
        let mv = movable.as_mut().ok_or_else(no_movable)?;
        Ok(MovableRegion { backend, data, heap: *handle, mv })
    }

    /// Frees every handle (generations kept, so old handles stay invalid) and
    /// empties the movable region.
    pub(super) fn reset_movable(&mut self) -> BackendResult<()> {
        if self.movable.is_none() {
            return Ok(());
        }
        self.movable().and_then(|mut m| m.clear_handles()).map_err(|e| match e {
            CompactionError::Backend(b) => b,
            other => BackendError::InvalidArgument(other.to_string()),
        })
    }
}

/// The movable region of a [`DeviceHeap`] ([`DeviceHeap::movable`]): a [`HandleRegion`] whose
/// allocator is the device's (a bump cursor and a pool of free table indices, `handle_alloc` and
/// `handle_free` in `gpuheap_kernels::compact::movable`), shared with the kernels that allocate
/// handles beside raw `malloc`. Offsets are bytes from [`base`](HandleRegion::base), the start of
/// the movable region. The handle table lives on the device only: every query reads it back, every
/// host allocation or free is a launch of the device code.
///
/// It borrows the heap mutably: drop it (or make a new one per call, `heap.movable()?.alloc(n)`)
/// to launch raw `malloc` batches ([`super::ops`]) between handle calls.
pub struct MovableRegion<'h> {
    backend: &'h Backend,
    data: &'h mut DeviceBuffer,
    heap: Heap,
    mv: &'h mut Movable,
}

impl MovableRegion<'_> {
    fn ctrl_words(&self) -> Result<[u64; 8]> {
        let mut w = [0u64; 8];
        self.mv.buf.read_into(0, bytemuck::cast_slice_mut(&mut w))?;
        Ok(w)
    }

    fn device_table_entries(&self) -> Result<Vec<HandleEntry>> {
        let mut v = vec![HandleEntry::default(); self.heap.max_handles as usize];
        self.mv.buf.read_into(TABLE_OFFSET as usize, bytemuck::cast_slice_mut(&mut v))?;
        Ok(v)
    }

    fn read_entry(&self, index: u32) -> Result<HandleEntry> {
        let mut e = [HandleEntry::default()];
        self.mv
            .buf
            .read_into(TABLE_OFFSET as usize + index as usize * ENTRY_BYTES, bytemuck::cast_slice_mut(&mut e))?;
        Ok(e[0])
    }

    /// Index of a live handle and its entry.
    fn live_entry(&self, h: Handle) -> Result<(u32, HandleEntry)> {
        let (i, gen) = split_handle(h.0);
        if i as u64 >= self.heap.max_handles {
            return Err(CompactionError::InvalidHandle(h));
        }
        let e = self.read_entry(i)?;
        if e.flags & ENTRY_LIVE == 0 || e.generation != gen {
            return Err(CompactionError::InvalidHandle(h));
        }
        Ok((i, e))
    }

    /// Byte offset of the movable region inside the data-region buffer.
    fn data_at(&self) -> u64 {
        self.heap.base - self.data.device_ptr() + self.heap.movable_off
    }

    /// Thread `i` of one launch calls the device `handle_alloc(sizes[i])`; `None`
    /// where it returned 0 (0 bytes, movable region or table exhausted).
    ///
    /// # Errors
    /// Backend errors.
    pub fn alloc_batch(&mut self, sizes: &[u64]) -> Result<Vec<Option<Handle>>> {
        let n = sizes.len() as u64;
        if n == 0 {
            return Ok(Vec::new());
        }
        let sizes_buf = self.backend.upload(sizes)?;
        let out = self.backend.alloc_zeroed(sizes.len() * 8)?;
        let p = HandleAllocParams {
            heap: self.heap,
            sizes: sizes_buf.device_ptr(),
            size: 0,
            threads: n,
            out: out.device_ptr(),
        };
        // SAFETY: the heap and every buffer here are of `self.backend` (the heap's); the heap is
        // borrowed mutably for the launch, which is synchronous, so no compaction runs; `sizes`
        // and `out` hold `n` u64s.
        unsafe { self.backend.launch(&HEAP_HANDLE_ALLOC, LaunchConfig::for_threads(n, BLOCK)?, &p)? };
        Ok(out.read::<u64>()?.into_iter().map(|h| (h != 0).then_some(Handle(h))).collect())
    }

    /// Thread `i` of one launch calls the device `handle_free(handles[i])`; `false`
    /// where it was rejected (not live, or pinned).
    ///
    /// # Errors
    /// Backend errors.
    pub fn free_batch(&mut self, handles: &[Handle]) -> Result<Vec<bool>> {
        let n = handles.len() as u64;
        if n == 0 {
            return Ok(Vec::new());
        }
        let raw: Vec<u64> = handles.iter().map(|h| h.0).collect();
        let hbuf = self.backend.upload(&raw)?;
        let out = self.backend.alloc_zeroed(handles.len() * 8)?;
        let p = HandleFreeParams { heap: self.heap, handles: hbuf.device_ptr(), threads: n, out: out.device_ptr() };
        // SAFETY: a live heap of `self.backend`, borrowed mutably for a synchronous launch;
        // `handles` and `out` hold `n` u64s of the same backend; `handle_free` rejects handles
        // that are not live.
        unsafe { self.backend.launch(&HEAP_HANDLE_FREE, LaunchConfig::for_threads(n, BLOCK)?, &p)? };
        Ok(out.read::<u64>()?.into_iter().map(|r| r != 0).collect())
    }

    /// Runs the example user kernel `gpuheap_heap_handle_touch` over `handles`
    /// now: thread `i` resolves `handles[i]` on the device when it runs and
    /// writes (`verify = false`) or checks `pattern(handle ^ seed, word)` over
    /// every word of the block (its size rounded up to 16). Returns the
    /// mismatching words and the handles that did not resolve (stale, freed).
    ///
    /// # Errors
    /// `InvalidArgument` for a handle listed twice in write mode; backend errors.
    #[doc(hidden)]
    pub fn touch_handles(&mut self, handles: &[Handle], seed: u64, verify: bool) -> Result<(u64, u64)> {
        if !verify {
            let mut seen = std::collections::HashSet::new();
            if let Some(h) = handles.iter().find(|h| !seen.insert(h.index())) {
                return Err(BackendError::InvalidArgument(format!("{h:?}: two writers of one block")).into());
            }
        }
        let n = handles.len() as u64;
        if n == 0 {
            return Ok((0, 0));
        }
        let raw: Vec<u64> = handles.iter().map(|h| h.0).collect();
        let hbuf = self.backend.upload(&raw)?;
        let counters = self.backend.alloc_zeroed(16)?;
        let p = HandleTouchParams {
            heap: self.heap,
            handles: hbuf.device_ptr(),
            threads: n,
            seed,
            verify: verify as u64,
            counters: counters.device_ptr(),
        };
        // SAFETY: a live heap of `self.backend`, borrowed mutably for a synchronous launch (no
        // compaction runs); `handles` holds `n` u64s, distinct table indices when writing
        // (checked), so each block has one writer; `counters` two u64s; all of the same backend.
        unsafe { self.backend.launch(&HEAP_HANDLE_TOUCH, LaunchConfig::for_threads(n, BLOCK)?, &p)? };
        let c: Vec<u64> = counters.read()?;
        Ok((c[0], c[1]))
    }

    /// Counters of the movable region.
    ///
    /// # Errors
    /// Backend errors.
    #[doc(hidden)]
    pub fn stats(&self) -> Result<MovableStats> {
        let w = self.ctrl_words()?;
        let layout = self.layout()?;
        Ok(MovableStats {
            capacity: self.heap.movable_bytes,
            cursor: w[CTRL_CURSOR as usize],
            live_handles: layout.len() as u64,
            live_bytes: layout.iter().map(|b| b.size).sum(),
            max_handles: self.max_handles(),
            handles_available: w[CTRL_POOL_LEN as usize].saturating_sub(w[CTRL_POOL_NEXT as usize]),
            failed_requests: w[CTRL_FAILED as usize],
        })
    }

    fn write_state(&mut self, index: u32, flags: u32, generation: u32) -> Result<()> {
        let word = (generation as u64) << 32 | flags as u64;
        let at = TABLE_OFFSET as usize + index as usize * ENTRY_BYTES + 16;
        Ok(self.mv.buf.write_at(at, &word.to_le_bytes())?)
    }

    /// Rewrites the movable region's allocator state after a compaction (or a reset):
    /// the cursor at `cursor`, the pool = every entry that is not live
    /// (ascending), the failed counter kept unless `clear_failed`.
    fn write_allocator_state(&mut self, table: &[HandleEntry], cursor: u64, clear_failed: bool) -> Result<()> {
        let max = self.heap.max_handles;
        let mut w = self.ctrl_words()?;
        let pool: Vec<u32> = (0..max as u32).filter(|&i| table[i as usize].flags & ENTRY_LIVE == 0).collect();
        w[CTRL_CURSOR as usize] = cursor;
        w[CTRL_POOL_NEXT as usize] = 0;
        w[CTRL_POOL_LEN as usize] = pool.len() as u64;
        if clear_failed {
            w[CTRL_FAILED as usize] = 0;
        }
        self.mv.buf.write_at(pool_offset(max) as usize, bytemuck::cast_slice(&pool))?;
        self.mv.buf.write_at(0, bytemuck::cast_slice(&w))?;
        Ok(())
    }

    fn clear_handles(&mut self) -> Result<()> {
        let mut table = self.device_table_entries()?;
        for e in &mut table {
            e.flags = 0;
        }
        self.mv.buf.write_at(TABLE_OFFSET as usize, bytemuck::cast_slice(&table))?;
        self.write_allocator_state(&table, 0, true)
    }
}

/// The verbs over the device's allocator: allocation and free launch the device code, queries read
/// the device table back.
impl HandleRegion for MovableRegion<'_> {
    fn backend(&self) -> &Backend {
        self.backend
    }

    // The region's capacity is the heap's movable part (clippy reads the name as a getter of `capacity`).
    #[allow(clippy::misnamed_getters)]
    fn capacity(&self) -> u64 {
        self.heap.movable_bytes
    }

    fn max_handles(&self) -> u32 {
        self.heap.max_handles as u32
    }

    /// The device address of the movable region (inside the heap's data region).
    fn base(&self) -> u64 {
        self.heap.base + self.heap.movable_off
    }

    fn tuning(&self) -> CompactTuning {
        self.mv.compactor.tuning()
    }

    fn set_tuning(&mut self, t: CompactTuning) {
        self.mv.compactor.set_tuning(t);
    }

    /// The device `handle_alloc` in a one-thread launch: the block takes the bytes after the bump
    /// cursor; a freed block's bytes come back at the next compaction only.
    fn alloc(&mut self, size: u64) -> Result<Handle> {
        if size == 0 {
            return Err(CompactionError::ZeroSize);
        }
        let w = self.ctrl_words()?;
        let cap = self.heap.movable_bytes;
        let need = occupied(size);
        if size > cap || need > cap.saturating_sub(w[CTRL_CURSOR as usize]) {
            let f = self.fragmentation()?;
            return Err(CompactionError::OutOfMemory {
                requested: need,
                largest_free: f.largest_free,
                total_free: f.free,
            });
        }
        if w[CTRL_POOL_NEXT as usize] >= w[CTRL_POOL_LEN as usize] {
            return Err(CompactionError::TooManyHandles(self.max_handles()));
        }
        match self.alloc_batch(&[size])?[0] {
            Some(h) => Ok(h),
            None => {
                Err(BackendError::InvalidArgument(format!("handle_alloc of {size} bytes failed unexpectedly")).into())
            }
        }
    }

    /// The device `handle_free`: the handle stops resolving at once; its bytes and its table entry
    /// are reclaimed by the next compaction.
    fn free(&mut self, h: Handle) -> Result<()> {
        let (_, e) = self.live_entry(h)?;
        if e.flags & ENTRY_PINNED != 0 {
            return Err(CompactionError::Pinned(h));
        }
        match self.free_batch(&[h])?[0] {
            true => Ok(()),
            false => Err(CompactionError::InvalidHandle(h)),
        }
    }

    /// The pin count lives in the device entry's flags (bits 8.., `movable::PIN_SHIFT`).
    fn pin(&mut self, h: Handle) -> Result<()> {
        let (i, e) = self.live_entry(h)?;
        let pins = (e.flags >> PIN_SHIFT) + 1;
        if pins >= 1 << (32 - PIN_SHIFT) {
            return Err(BackendError::InvalidArgument(format!("too many nested pins of {h:?}")).into());
        }
        self.write_state(i, ENTRY_LIVE | ENTRY_PINNED | pins << PIN_SHIFT, e.generation)
    }

    fn unpin(&mut self, h: Handle) -> Result<()> {
        let (i, e) = self.live_entry(h)?;
        let pins = e.flags >> PIN_SHIFT;
        if pins == 0 {
            return Err(CompactionError::NotPinned(h));
        }
        let flags = if pins == 1 { ENTRY_LIVE } else { ENTRY_LIVE | ENTRY_PINNED | (pins - 1) << PIN_SHIFT };
        self.write_state(i, flags, e.generation)
    }

    /// The host side of `movable::resolve` (one table entry read back).
    fn resolve(&self, h: Handle) -> Result<BlockInfo> {
        let (_, e) = self.live_entry(h)?;
        Ok(BlockInfo { offset: e.offset, size: e.size, pinned: e.flags & ENTRY_PINNED != 0 })
    }

    /// For kernels written against `gpuheap_kernels::compact::handle::resolve`; kernels that have
    /// the heap's [`Heap`] use `movable::resolve` instead. `len` is [`max_handles`](Self::max_handles).
    fn device_table(&mut self) -> Result<DeviceHandleTable> {
        Ok(movable::table(&self.heap))
    }

    fn read_table(&mut self) -> Result<Vec<HandleEntry>> {
        self.device_table_entries()
    }

    fn layout(&self) -> Result<Vec<LiveBlock>> {
        Ok(layout_of(&self.device_table_entries()?))
    }

    fn handle_of(&self, index: u32) -> Result<Option<Handle>> {
        if index as u64 >= self.heap.max_handles {
            return Ok(None);
        }
        let e = self.read_entry(index)?;
        Ok((e.flags & ENTRY_LIVE != 0).then(|| Handle(make_handle(index, e.generation))))
    }

    fn free_ranges(&self) -> Result<Vec<(u64, u64)>> {
        Ok(oracle::free_ranges(&self.layout()?, None, self.heap.movable_bytes))
    }

    fn fragmentation(&self) -> Result<Fragmentation> {
        let table = self.device_table_entries()?;
        let cap = self.heap.movable_bytes;
        Ok(region_fragmentation(cap, allocated_of(&table), oracle::free_ranges(&layout_of(&table), None, cap)))
    }

    fn read(&self, h: Handle) -> Result<Vec<u8>> {
        let b = self.resolve(h)?;
        let mut v = vec![0u8; occupied(b.size) as usize];
        self.data.read_into((self.data_at() + b.offset) as usize, &mut v)?;
        Ok(v)
    }

    fn write(&mut self, h: Handle, at: u64, data: &[u8]) -> Result<()> {
        let off = block_bytes(self.resolve(h)?, at, data.len())?;
        let at = (self.data_at() + off) as usize;
        Ok(self.data.write_at(at, data)?)
    }

    /// Steps: read the handle table back and list the live entries in address order (a host
    /// read-back of `max_handles` entries and a host sort: the device has no sort by offset);
    /// unless they are already packed, run the plan kernels (which write the new offsets into the
    /// device table) and the in-place mover over the movable region; then, in the same call, set
    /// the bump cursor to the end of the last live block and refill the index pool with every
    /// entry that is not live. Afterwards the free space of the movable region is one range after
    /// the last block, plus one range before each pinned block (its segment's tail). Raw `malloc`
    /// blocks are outside the movable region and never move.
    fn compact(&mut self) -> Result<CompactionReport> {
        let start = Instant::now();
        let cap = self.heap.movable_bytes;
        let table = self.device_table_entries()?;
        let layout = layout_of(&table);
        oracle::validate(&layout, cap)?;
        let allocated = allocated_of(&table);
        let before = region_fragmentation(cap, allocated, oracle::free_ranges(&layout, None, cap));
        let mut report = CompactionReport { blocks: layout.len() as u64, before, after: before, ..Default::default() };
        let new_offsets = if oracle::is_packed(&layout) {
            layout.iter().map(|b| b.offset).collect()
        } else {
            let at = self.data_at();
            let n = self.heap.max_handles as u32;
            let MovableRegion { backend, data, mv, .. } = self;
            let table = Some((&mut mv.buf, TABLE_OFFSET, n));
            let run = mv.compactor.compact_at(backend, data, at, cap, &layout, table)?;
            report.plan_time = run.plan_time;
            report.move_time = run.move_time;
            report.kernel_time = run.plan_time + run.move_time;
            report.launches = run.launches;
            run.new_offsets
        };
        let (bytes, moved) = oracle::moved(&layout, &new_offsets);
        let end = layout.iter().zip(&new_offsets).map(|(b, &d)| d + b.size).max().unwrap_or(0);
        self.write_allocator_state(&table, end, false)?;
        report.blocks_moved = moved;
        report.bytes_moved = bytes;
        let secs = report.kernel_time.as_secs_f64();
        report.gbps = if secs > 0.0 { bytes as f64 / secs / 1e9 } else { 0.0 };
        report.after = region_fragmentation(cap, allocated, oracle::free_ranges(&layout, Some(&new_offsets), cap));
        report.wall_time = start.elapsed();
        Ok(report)
    }
}

/// Requested bytes of the live entries of a handle table.
fn allocated_of(table: &[HandleEntry]) -> u64 {
    table.iter().filter(|e| e.flags & ENTRY_LIVE != 0).map(|e| e.size).sum()
}

/// Live entries of `table` as a layout sorted by offset.
fn layout_of(table: &[HandleEntry]) -> Vec<LiveBlock> {
    let mut v: Vec<LiveBlock> = table
        .iter()
        .enumerate()
        .filter(|(_, e)| e.flags & ENTRY_LIVE != 0)
        .map(|(i, e)| LiveBlock {
            offset: e.offset,
            size: occupied(e.size),
            handle: i as u32,
            flags: if e.flags & ENTRY_PINNED != 0 { BLOCK_PINNED } else { 0 },
        })
        .collect();
    v.sort_unstable_by_key(|b| b.offset);
    v
}

const _: () = assert!(MOVABLE_CTRL_BYTES == 64 && ENTRY_BYTES == 24);
