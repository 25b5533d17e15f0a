//! The report of `gpuheap info` ([`write_info`]): the embedded PTX, the backend kernels run on,
//! and the GPU's memory: used / total as a percentage (the occupancy), with the exact bytes, from NVML
//! or, without NVML, from the driver (`cuMemGetInfo`: used = total − free).
//!
//! NVML's "utilisation rates" are the share of the last sample period in which a kernel ran or the
//! memory controller was busy: activity, not occupancy; they are printed as such.
//!
//! `--backend cpu` reports the CPU backend and does not touch the GPU; `--backend gpu` without a usable
//! GPU is a run-time error (exit 1), as in the other commands; `auto` reports the GPU when there is a
//! driver and says that kernels run on the CPU otherwise (exit 0).

use std::io::Write;

use nvml_wrapper::enum_wrappers::device::Clock;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;

use super::kernels::{write_kernels, write_kernels_of_device};
use gpuheap::backend::driver_present;
use gpuheap::backend::{Backend, BackendChoice, GpuBackend};
use gpuheap::Error;

/// `writeln!` to the report, a failed write a run-time failure.
macro_rules! w {
    ($out:expr, $($arg:tt)*) => {
        writeln!($out, $($arg)*).map_err(|e| Error::runtime(format!("cannot write the report: {e}")))?
    };
}

const GIB: f64 = (1u64 << 30) as f64;

/// One line of memory figures: used / total in % (occupancy), free, and the exact bytes. `used` may
/// come from NVML (which counts the driver's reservations) or be `total − free`.
fn memory_line(total: u64, used: u64, free: u64) -> String {
    let pct = if total == 0 { 0.0 } else { used as f64 / total as f64 * 100.0 };
    format!(
        "  memory: {:.2} GiB used of {:.2} GiB ({pct:.1} % occupied), {:.2} GiB free ({used} B used, {total} B total, \
         {free} B free)",
        used as f64 / GIB,
        total as f64 / GIB,
        free as f64 / GIB
    )
}

/// Writes the report of `gpuheap info` to `out`: the embedded PTX, the backend `choice` selects, the
/// memory of GPU `device` (see the [module docs](self)) and, with `kernels`, the kernels' report of
/// [`super::kernels::write_kernels`].
///
/// # Errors
/// A run-time failure when `choice` is `gpu` without a usable GPU, NVML or the driver fails, the
/// driver refuses the module (with `kernels`), or `out` cannot be written.
pub fn write_info(out: &mut dyn Write, choice: BackendChoice, device: u32, kernels: bool) -> Result<(), Error> {
    match gpuheap::ptx::kernels_ptx() {
        Ok(p) => w!(out, "PTX kernels: embedded ({} bytes, loads on sm_80 and newer)", p.len()),
        Err(e) => w!(out, "PTX kernels: {e}"),
    }
    // The GPU backend `--backend gpu` created: `kernels` reports its module (loaded once).
    let mut gpu = None;
    match choice {
        BackendChoice::Cpu => {
            let b = Backend::select(choice).map_err(Error::runtime)?;
            w!(out, "backend cpu: {}", b.describe());
            return if kernels { write_kernels(out, &b) } else { Ok(()) };
        }
        BackendChoice::Gpu => {
            // The same check as every command given `--backend gpu`: an error without a usable GPU.
            let b = Backend::select(choice).map_err(Error::runtime)?;
            w!(out, "backend gpu: {}", b.describe());
            gpu = Some(b);
        }
        BackendChoice::Auto => {
            if !driver_present() {
                w!(out, "no NVIDIA driver found: gpuheap runs its kernels on the CPU backend");
                return if kernels { write_kernels(out, &Backend::cpu()) } else { Ok(()) };
            }
        }
    }
    match Nvml::init() {
        Ok(nvml) => nvml_report(out, &nvml, device)?,
        Err(e) => {
            w!(out, "NVML unavailable ({e}); the driver's own figures:");
            match GpuBackend::new(device as usize) {
                Ok(g) => {
                    let (free, total) = g.mem_info().map_err(Error::runtime)?;
                    let (free, total) = (free as u64, total as u64);
                    w!(out, "device {}: {}", device, g.name());
                    w!(out, "{}", memory_line(total, total.saturating_sub(free), free));
                }
                Err(e) => w!(out, "GPU backend unavailable: {e}"),
            }
        }
    }
    match (kernels, &gpu) {
        (false, _) => Ok(()),
        (true, Some(b)) => write_kernels(out, b),
        (true, None) => write_kernels_of_device(out, device),
    }
}

fn nvml_report(out: &mut dyn Write, nvml: &Nvml, index: u32) -> Result<(), Error> {
    let nv = |e: NvmlError| Error::runtime(format!("NVML: {e}"));
    w!(out, "driver {}", nvml.sys_driver_version().map_err(nv)?);
    let d = nvml.device_by_index(index).map_err(nv)?;
    w!(out, "device {index}: {}", d.name().map_err(nv)?);
    let m = d.memory_info().map_err(nv)?;
    w!(out, "{}", memory_line(m.total, m.used, m.free));
    if let Ok(u) = d.utilization_rates() {
        w!(
            out,
            "  activity (NVML utilisation rates, last sample period; not occupancy): kernels running {} % of the \
             time, memory controller busy {} %",
            u.gpu,
            u.memory
        );
    }
    let clock = d.max_clock_info(Clock::Memory).ok();
    let bus = d.memory_bus_width().ok();
    if let Some(c) = clock {
        w!(out, "  memory clock (max) {c} MHz");
    }
    if let Some(w) = bus {
        w!(out, "  memory bus width {w} bit");
    }
    if let (Some(c), Some(w)) = (clock, bus) {
        // Double data rate: two transfers per clock on each bus bit.
        let gbs = c as f64 * 1e6 * 2.0 * w as f64 / 8.0 / 1e9;
        w!(out, "  theoretical bandwidth {gbs:.0} GB/s (2 x clock x bus width)");
    }
    Ok(())
}
