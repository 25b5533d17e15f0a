//! The compaction core: runs the plan and move kernels over a region and a
//! layout, independent of who manages the layout (the two
//! [`HandleRegion`](super::HandleRegion)s each keep one).
//!
//! It works over bare [`DeviceBuffer`]s, so it takes the `&Backend` that
//! launches and checks every buffer it is given against it first (the owner
//! rule of [`crate::backend`]); its own scratch buffers are reallocated on a
//! backend of another identity.

use std::time::Duration;

use gpuheap_kernels::compact::mover::{CopyParams, MoveParams, COPY, MOVE};
use gpuheap_kernels::compact::plan::{PlanParams, PLAN};
use gpuheap_kernels::compact::{LiveBlock, GRANULE};

use super::{oracle, CompactionError};
use crate::backend::{Backend, DeviceBuffer, LaunchConfig, LaunchTiming};

/// Largest dynamic shared memory per block without an opt-in, bytes.
#[doc(hidden)]
pub const MAX_SHARED_BYTES: u32 = 48 * 1024;

/// Launch geometry and tile sizes of the compaction kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompactTuning {
    /// Threads per block (a multiple of 32).
    pub block_threads: u32,
    /// Blocks in the grid of the move and copy kernels (the kernels are persistent: any number
    /// ≥ 1 works; more than are resident at once only adds blocks that find no tile left).
    pub grid: u32,
    /// Blocks in the grid of the plan kernel (persistent too).
    pub plan_grid: u32,
    /// Bytes per move tile and per copy chunk (a multiple of 16). Each warp
    /// stages one tile in shared memory.
    pub tile_bytes: u32,
    /// Blocks per lane in a plan-scan tile.
    pub items_per_lane: u32,
}

impl CompactTuning {
    /// Defaults for `backend`. On the GPU: 256 threads, 4 KiB tiles (32 KiB of shared memory per
    /// block), 8 items per lane, and grids of exactly the blocks that are resident at once: the
    /// SMs times `cuOccupancyMaxActiveBlocksPerMultiprocessor` of the move kernel with its shared
    /// memory (for the move and copy grids) and of the plan kernel (for the plan grid), so that no
    /// block starts after the tiles are gone (one block per SM when the module is not loaded). On
    /// the CPU in sequential mode one 32-thread block per worker thread and 256 KiB tiles
    /// (one-lane warps stage whole tiles in cache); in lockstep and independent mode (32-lane
    /// warps) 2 blocks of 64 threads and 16 KiB tiles.
    #[doc(hidden)]
    pub fn for_backend(backend: &Backend) -> Self {
        match backend {
            Backend::Gpu(g) => {
                let sms = g.sm_count().unwrap_or(1).max(1) as u32;
                let (block_threads, tile_bytes) = (256, 4096);
                let shared = tile_bytes * block_threads / 32;
                let resident = |kernel: &str, shared: u32| {
                    let per_sm = g.builtin().and_then(|m| m.max_active_blocks(kernel, block_threads, shared));
                    sms * per_sm.unwrap_or(1).max(1)
                };
                Self {
                    block_threads,
                    grid: resident(MOVE.name(), shared),
                    plan_grid: resident(PLAN.name(), 0),
                    tile_bytes,
                    items_per_lane: 8,
                }
            }
            Backend::Cpu(c) if c.mode().warp_lanes() > 1 => {
                Self { block_threads: 64, grid: 2, plan_grid: 2, tile_bytes: 16 << 10, items_per_lane: 256 }
            }
            Backend::Cpu(_) => {
                let grid = rayon::current_num_threads().max(1) as u32;
                Self { block_threads: 32, grid, plan_grid: grid, tile_bytes: 256 << 10, items_per_lane: 1024 }
            }
        }
    }

    /// Dynamic shared memory of a move block: one tile per warp, bytes.
    #[doc(hidden)]
    pub fn shared_bytes(&self) -> u64 {
        self.tile_bytes as u64 * self.block_threads.div_ceil(32) as u64
    }

    fn validate(&self, backend: &Backend) -> Result<(), CompactionError> {
        let bad = |why: String| Err(CompactionError::InvalidTuning(why));
        if self.block_threads == 0 || !self.block_threads.is_multiple_of(32) || self.block_threads > 1024 {
            return bad(format!("block_threads {} is not a multiple of 32 in 32..=1024", self.block_threads));
        }
        if self.grid == 0 || self.plan_grid == 0 || self.items_per_lane == 0 {
            return bad("grid, plan_grid and items_per_lane must be ≥ 1".into());
        }
        if self.tile_bytes == 0 || !(self.tile_bytes as u64).is_multiple_of(GRANULE) {
            return bad(format!("tile_bytes {} is not a nonzero multiple of 16", self.tile_bytes));
        }
        let limit = if backend.is_gpu() { MAX_SHARED_BYTES as u64 } else { u32::MAX as u64 };
        if self.shared_bytes() > limit {
            return bad(format!("{} bytes of shared memory per block (limit {limit})", self.shared_bytes()));
        }
        Ok(())
    }

    fn config(&self, shared_bytes: u32) -> LaunchConfig {
        LaunchConfig { grid: self.grid, block: self.block_threads, shared_bytes }
    }

    fn plan_config(&self) -> LaunchConfig {
        LaunchConfig { grid: self.plan_grid, block: self.block_threads, shared_bytes: 0 }
    }
}

/// What one run of the kernels did.
#[derive(Clone, Debug, Default)]
#[doc(hidden)]
pub struct LayoutCompaction {
    /// New offset of each block of the layout.
    pub new_offsets: Vec<u64>,
    /// Time of the plan launch.
    pub plan_time: Duration,
    /// Time of the move launch.
    pub move_time: Duration,
    /// Kernels launched.
    pub launches: u32,
}

/// Device buffers reused across compactions (grown on demand, reallocated when
/// the backend of a call is not theirs), and the tuning.
pub struct Compactor {
    tuning: CompactTuning,
    blocks: Option<DeviceBuffer>,
    new_offset: Option<DeviceBuffer>,
    status: Option<DeviceBuffer>,
    flags: Option<DeviceBuffer>,
    control: Option<DeviceBuffer>,
    epoch: u32,
}

/// `buf` holding at least `bytes` of `backend`, reallocated (zeroed) when too small or of another
/// backend; `true` when it was reallocated.
fn ensure<'a>(
    backend: &Backend,
    buf: &'a mut Option<DeviceBuffer>,
    bytes: usize,
) -> Result<(&'a mut DeviceBuffer, bool), CompactionError> {
    let fresh = buf.as_ref().is_none_or(|b| b.len() < bytes || b.owner() != backend.id());
    if fresh {
        *buf = Some(backend.alloc_zeroed(bytes.max(16).next_power_of_two())?);
    }
    Ok((buf.as_mut().expect("set above"), fresh))
}

// Control words: [plan tile counter, move tile counter] (the copy uses the first).
const CONTROL_WORDS: usize = 2;

impl Compactor {
    /// A compactor with `tuning` (see [`CompactTuning::for_backend`]).
    pub fn new(tuning: CompactTuning) -> Self {
        Self { tuning, blocks: None, new_offset: None, status: None, flags: None, control: None, epoch: 0 }
    }

    /// The tuning.
    #[doc(hidden)]
    pub fn tuning(&self) -> CompactTuning {
        self.tuning
    }

    /// Replaces the tuning.
    #[doc(hidden)]
    pub fn set_tuning(&mut self, tuning: CompactTuning) {
        self.tuning = tuning;
    }

    /// Compacts `region` in place: uploads `layout`, runs the plan (updating
    /// the handle table `table`, an array of `table_len` entries, when given)
    /// and the move, and returns the new offsets read back from the device.
    ///
    /// # Errors
    /// [`BackendError::WrongBackend`](crate::backend::BackendError::WrongBackend)
    /// when `region` or the table is not memory of `backend`,
    /// [`CompactionError::InvalidLayout`] / [`CompactionError::InvalidTuning`],
    /// all before anything runs; backend errors.
    pub fn compact(
        &mut self,
        backend: &Backend,
        region: &mut DeviceBuffer,
        layout: &[LiveBlock],
        table: Option<(&mut DeviceBuffer, u32)>,
    ) -> Result<LayoutCompaction, CompactionError> {
        let len = region.len() as u64;
        self.run("Compactor::compact", backend, region, 0, len, layout, table.map(|(b, n)| (b, 0, n)))
    }

    /// Like [`compact`](Self::compact), for the region `[at, at + len)` of
    /// `buffer` (layout offsets are relative to `at`) and a handle table of
    /// `n` entries starting `table_at` bytes into its buffer. The device
    /// heap's movable region is such a sub-range of the heap's data region, and its
    /// table lives after a control block.
    ///
    /// # Errors
    /// As for [`compact`](Self::compact); [`CompactionError::InvalidLayout`]
    /// when the region or the table does not lie inside its buffer or is not
    /// aligned (16 bytes for the region, 8 for the table).
    #[doc(hidden)]
    pub fn compact_at(
        &mut self,
        backend: &Backend,
        buffer: &mut DeviceBuffer,
        at: u64,
        len: u64,
        layout: &[LiveBlock],
        table: Option<(&mut DeviceBuffer, u64, u32)>,
    ) -> Result<LayoutCompaction, CompactionError> {
        self.run("Compactor::compact_at", backend, buffer, at, len, layout, table)
    }

    /// [`compact_at`](Self::compact_at), its owner checks naming `entry`.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &mut self,
        entry: &'static str,
        backend: &Backend,
        buffer: &mut DeviceBuffer,
        at: u64,
        len: u64,
        layout: &[LiveBlock],
        table: Option<(&mut DeviceBuffer, u64, u32)>,
    ) -> Result<LayoutCompaction, CompactionError> {
        backend.check_owner(entry, buffer)?;
        if let Some((b, _, _)) = &table {
            backend.check_owner(entry, b)?;
        }
        let bad = |why: String| Err(CompactionError::InvalidLayout(why));
        if at.checked_add(len).is_none_or(|e| e > buffer.len() as u64)
            || !(buffer.device_ptr() + at).is_multiple_of(GRANULE)
        {
            return bad(format!(
                "region [{at}, +{len}) does not lie 16-byte aligned in a {}-byte buffer",
                buffer.len()
            ));
        }
        let entry = std::mem::size_of::<gpuheap_kernels::compact::handle::HandleEntry>() as u64;
        if let Some((b, t, n)) = &table {
            if t.checked_add(*n as u64 * entry).is_none_or(|e| e > b.len() as u64) || !t.is_multiple_of(8) {
                return bad(format!("a table of {n} entries at byte {t} does not fit a {}-byte buffer", b.len()));
            }
        }
        oracle::validate(layout, len)?;
        self.tuning.validate(backend)?;
        let t = self.tuning;
        let k = layout.len();
        if k == 0 {
            return Ok(LayoutCompaction::default());
        }
        // The move's tiles cover the destinations from the first hole (blocks
        // before it stay put) to the end of the last block (nothing after it
        // moves).
        let mut start = 0;
        for b in layout {
            if b.offset != start {
                break;
            }
            start = b.offset + b.size;
        }
        let end = layout.last().map_or(0, |b| b.offset + b.size).max(start);
        let move_tiles = (end - start).div_ceil(t.tile_bytes as u64) as usize;
        let scan_tiles = k.div_ceil(t.items_per_lane as usize) + 1;

        ensure(backend, &mut self.blocks, std::mem::size_of_val(layout))?.0.write(layout)?;
        let new_offset = ensure(backend, &mut self.new_offset, k * 8)?.0.device_ptr();
        let status = ensure(backend, &mut self.status, scan_tiles * 8)?.0;
        status.zero()?;
        let status = status.device_ptr();
        let control = ensure(backend, &mut self.control, CONTROL_WORDS * 8)?.0;
        control.write(&[0u64; CONTROL_WORDS])?;
        let control = control.device_ptr();
        let flags_len = move_tiles.max(1) * 4;
        let (flags, fresh) = ensure(backend, &mut self.flags, flags_len)?;
        if fresh {
            self.epoch = 0;
        }
        if self.epoch == u32::MAX {
            flags.zero()?;
            self.epoch = 0;
        }
        self.epoch += 1;
        let flags = flags.device_ptr();
        let blocks = self.blocks.as_ref().expect("ensured").device_ptr();
        let (table_ptr, table_len) = table.map_or((0, 0), |(b, at, n)| (b.device_ptr() + at, n as u64));

        let p = PlanParams {
            blocks,
            count: k as u64,
            new_offset,
            tile_status: status,
            tile_counter: control,
            table: table_ptr,
            table_len,
            items_per_lane: t.items_per_lane,
            reserved: 0,
        };
        // SAFETY: every address in `p` is a live buffer of `backend` (the region's and the table's
        // owners were checked, the scratch buffers are reallocated on another backend) sized as
        // `PlanParams` documents: `k` blocks and offsets, `scan_tiles` zeroed
        // status words (≥ ceil(k / items_per_lane)), a zeroed counter, the
        // handle table of `table_len` entries; the launch is synchronous.
        let plan = unsafe { backend.launch(&PLAN, t.plan_config(), &p)? };
        let m = MoveParams {
            region: buffer.device_ptr() + at,
            blocks,
            new_offset,
            count: k as u64,
            start,
            end,
            tile_bytes: t.tile_bytes as u64,
            flags,
            tile_counter: control + 8,
            epoch: self.epoch,
            reserved: 0,
        };
        // SAFETY: the region holds the validated layout, `start` is its first
        // hole and `end` its last block's end; the plan wrote `new_offset`;
        // `flags` holds a flag for each of the ceil((end - start) / tile_bytes)
        // tiles, none equal to the fresh epoch; shared memory holds one tile
        // per warp; the region lies inside `buffer` (checked), which is
        // borrowed mutably, so nothing else touches it.
        let moved = unsafe { backend.launch(&MOVE, t.config(t.shared_bytes() as u32), &m)? };
        let mut new_offsets = vec![0u64; k];
        self.new_offset.as_ref().expect("ensured").read_into(0, bytemuck::cast_slice_mut(&mut new_offsets))?;
        Ok(LayoutCompaction { new_offsets, plan_time: plan.elapsed, move_time: moved.elapsed, launches: 2 })
    }

    /// The plain-copy baseline: copies `bytes` (a multiple of 16) from `src`
    /// to `dst` with [`COPY`], the same persistent warps and chunk size as
    /// the mover.
    ///
    /// # Errors
    /// [`BackendError::WrongBackend`](crate::backend::BackendError::WrongBackend)
    /// when `dst` or `src` is not memory of `backend`; `InvalidArgument` when
    /// `bytes` exceeds a buffer or is not a multiple of 16; backend errors.
    #[doc(hidden)]
    pub fn copy(
        &mut self,
        backend: &Backend,
        dst: &mut DeviceBuffer,
        src: &DeviceBuffer,
        bytes: u64,
    ) -> Result<LaunchTiming, CompactionError> {
        backend.check_owner("Compactor::copy", dst)?;
        backend.check_owner("Compactor::copy", src)?;
        self.tuning.validate(backend)?;
        if !bytes.is_multiple_of(GRANULE) || bytes > dst.len() as u64 || bytes > src.len() as u64 {
            return Err(crate::backend::BackendError::InvalidArgument(format!(
                "copy of {bytes} bytes between buffers of {} and {} bytes",
                src.len(),
                dst.len()
            ))
            .into());
        }
        let control = ensure(backend, &mut self.control, CONTROL_WORDS * 8)?.0;
        control.write(&[0u64; CONTROL_WORDS])?;
        let p = CopyParams {
            dst: dst.device_ptr(),
            src: src.device_ptr(),
            bytes,
            chunk_bytes: self.tuning.tile_bytes as u64,
            chunk_counter: control.device_ptr(),
        };
        // SAFETY: two distinct live buffers of `backend` (checked) of at least `bytes` bytes (`dst`
        // is borrowed mutably, so it is not `src`), 256-byte aligned; a zeroed counter of
        // `backend`.
        Ok(unsafe { backend.launch(&COPY, self.tuning.config(0), &p)? })
    }
}

#[cfg(test)]
mod tests {
    use gpuheap_kernels::compact::NO_HANDLE;

    use super::*;
    use crate::backend::{BackendError, BackendId, CpuBackend, CpuMode};

    /// A CPU backend claiming the identity [`BackendId::test`]`(1)`: its buffers are not the host
    /// identity's.
    fn other() -> Backend {
        Backend::Cpu(CpuBackend::with_test_id(CpuMode::Sequential, 1))
    }

    /// 4 KiB holding a block at 1024 (bytes 0xAB) that slides to 0.
    fn region(backend: &Backend) -> (DeviceBuffer, Vec<LiveBlock>) {
        let mut buf = backend.alloc_zeroed(4096).unwrap();
        buf.write_at(1024, &[0xAB; 256]).unwrap();
        (buf, vec![LiveBlock { offset: 1024, size: 256, handle: NO_HANDLE, flags: 0 }])
    }

    fn assert_wrong_backend<T: std::fmt::Debug>(r: Result<T, CompactionError>, name: &str, buffer: BackendId) {
        match r {
            Err(CompactionError::Backend(e @ BackendError::WrongBackend { entry, buffer: b, backend })) => {
                assert_eq!((entry, b, backend), (name, buffer, BackendId::HOST));
                assert!(e.to_string().starts_with(name), "{e}");
            }
            other => panic!("{name}: expected WrongBackend, got {other:?}"),
        }
    }

    fn compactor() -> Compactor {
        Compactor::new(CompactTuning::for_backend(&Backend::cpu()))
    }

    #[test]
    fn compact_refuses_a_region_or_table_of_another_backend() {
        let host = Backend::cpu();
        let (mut foreign, layout) = region(&other());
        let r = compactor().compact(&host, &mut foreign, &layout, None);
        assert_wrong_backend(r, "Compactor::compact", BackendId::test(1));
        // Nothing moved.
        assert_eq!(foreign.read::<u8>().unwrap()[1024], 0xAB);
        let (mut own, _) = region(&host);
        let mut table = other().alloc_zeroed(64).unwrap();
        let r = compactor().compact(&host, &mut own, &layout, Some((&mut table, 1)));
        assert_wrong_backend(r, "Compactor::compact", BackendId::test(1));
    }

    #[test]
    fn compact_at_refuses_a_buffer_of_another_backend() {
        let (mut foreign, layout) = region(&other());
        let r = compactor().compact_at(&Backend::cpu(), &mut foreign, 0, 4096, &layout, None);
        assert_wrong_backend(r, "Compactor::compact_at", BackendId::test(1));
        assert_eq!(foreign.read::<u8>().unwrap()[1024], 0xAB);
    }

    #[test]
    fn copy_refuses_a_buffer_of_another_backend() {
        let host = Backend::cpu();
        let mut c = compactor();
        let (mut dst, src) = (host.alloc_zeroed(256).unwrap(), other().upload(&[7u8; 256]).unwrap());
        assert_wrong_backend(c.copy(&host, &mut dst, &src, 256), "Compactor::copy", BackendId::test(1));
        let (mut dst, src) = (other().alloc_zeroed(256).unwrap(), host.upload(&[7u8; 256]).unwrap());
        assert_wrong_backend(c.copy(&host, &mut dst, &src, 256), "Compactor::copy", BackendId::test(1));
        assert!(dst.read::<u8>().unwrap().iter().all(|&b| b == 0));
    }

    #[test]
    fn scratch_buffers_follow_the_backend_of_each_call() {
        // One compactor used on two backends: its scratch buffers of the first are reallocated on
        // the second, and both compactions are right.
        let mut c = compactor();
        for backend in [Backend::cpu(), other(), Backend::cpu()] {
            let (mut buf, layout) = region(&backend);
            let run = c.compact(&backend, &mut buf, &layout, None).unwrap();
            assert_eq!(run.new_offsets, vec![0]);
            assert_eq!(&buf.read::<u8>().unwrap()[..256], &[0xAB; 256][..]);
            for s in [&c.blocks, &c.new_offset, &c.status, &c.control, &c.flags] {
                assert_eq!(s.as_ref().map(|b| b.owner()), Some(backend.id()));
            }
        }
    }
}
