//! The kernels part of `gpuheap info --kernels` ([`write_kernels`]): gpuheap's PTX module as the driver loaded it: the load and JIT time,
//! the JIT's log, and per kernel the registers, local, static shared and constant memory, the
//! largest block (the driver's figure and the occupancy arithmetic's), and the resident blocks per
//! SM at the project's 256-thread launches (the driver's `cuOccupancyMaxActiveBlocksPerMultiprocessor`
//! and the arithmetic's); then the compaction grid that follows from it.

use std::io::Write;

use gpuheap_kernels::compact::mover::MOVE;

use gpuheap::backend::{Backend, GpuBackend};
use gpuheap::compaction::CompactTuning;
use gpuheap::Error;

/// `writeln!` to the report, a failed write a run-time failure.
macro_rules! w {
    ($out:expr, $($arg:tt)*) => {
        writeln!($out, $($arg)*).map_err(|e| Error::runtime(format!("cannot write the report: {e}")))?
    };
}

/// Threads per block of the occupancy columns (the heap's and the compaction's launches).
const BLOCK: u32 = 256;

/// Writes the report for the GPU backend `b` to `out`; on the CPU backend says that there is nothing to load.
///
/// # Errors
/// A module the driver refused (with its JIT log) or a failing driver query (exit code 1).
pub fn write_kernels(out: &mut dyn Write, b: &Backend) -> Result<(), Error> {
    let Backend::Gpu(g) = b else {
        w!(out, "kernels: the CPU backend runs the kernel bodies natively; registers, occupancy and the JIT log are GPU facts");
        return Ok(());
    };
    let rt = |e: gpuheap::backend::BackendError| Error::runtime(e);
    let m = g.builtin().map_err(rt)?;
    let l = m.load_info();
    w!(
        out,
        "PTX module: {} bytes, loaded in {:.1} ms (the JIT's own time {:.1} ms)",
        l.ptx_bytes,
        l.load_time.as_secs_f64() * 1e3,
        l.jit_ms
    );
    if l.info_log.is_empty() {
        w!(out, "JIT log: (empty)");
    } else {
        w!(out, "JIT log:");
        for line in l.info_log.lines() {
            w!(out, "    {line}");
        }
    }
    let arch = g.arch().map_err(rt)?;
    let sms = g.sm_count().map_err(rt)?;
    w!(
        out,
        "\n{} SMs, compute capability {}.{}: {} registers per SM, {} threads, {} blocks, {} B shared memory per SM\n",
        sms,
        arch.compute_capability.0,
        arch.compute_capability.1,
        arch.regs_per_sm,
        arch.max_threads_per_sm,
        arch.max_blocks_per_sm,
        arch.shared_per_sm
    );
    let tuning = CompactTuning::for_backend(b);
    w!(out,
        "| kernel | registers | local B | static shared B | const B | largest block (driver) | largest block (computed) | \
         blocks/SM at {BLOCK} (driver) | blocks/SM at {BLOCK} (computed) | warps/SM | limited by |"
    );
    w!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for k in m.kernels() {
        // The move kernel stages one tile per warp in dynamic shared memory.
        let shared = if k.name == MOVE.name() { tuning.shared_bytes() as u32 } else { 0 };
        let driver = m.max_active_blocks(&k.name, BLOCK, shared).map_or_else(|e| e.to_string(), |n| n.to_string());
        let o = arch.occupancy(k.registers, k.static_shared_bytes, BLOCK, shared);
        w!(
            out,
            "| {}{} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:?} |",
            k.name,
            if shared > 0 { format!(" (+{shared} B dynamic)") } else { String::new() },
            k.registers,
            k.local_bytes,
            k.static_shared_bytes,
            k.const_bytes,
            k.max_threads_per_block,
            arch.max_block_threads(k.registers),
            driver,
            o.blocks_per_sm,
            o.warps_per_sm,
            o.limited_by
        );
    }
    w!(out,
        "\ncompaction: {} threads per block, move/copy grid {} blocks, plan grid {} blocks (resident blocks per SM x {sms} SMs)",
        tuning.block_threads, tuning.grid, tuning.plan_grid
    );
    Ok(())
}

/// [`write_kernels`] for device `device` when the GPU backend is usable, else one line saying why.
///
/// # Errors
/// As for [`write_kernels`].
pub fn write_kernels_of_device(out: &mut dyn Write, device: u32) -> Result<(), Error> {
    match GpuBackend::new(device as usize) {
        Ok(g) => write_kernels(out, &Backend::Gpu(g)),
        Err(e) => {
            w!(out, "kernels: GPU backend unavailable: {e}");
            Ok(())
        }
    }
}
