//! `gpuheap info [--backend auto|cpu|gpu] [--device N]`: the embedded PTX, the backend kernels run on,
//! and the GPU's memory: used / total as a percentage (the occupancy), with the exact bytes, from NVML
//! or, without NVML, from the driver (`cuMemGetInfo`: used = total − free).
//!
//! NVML's "utilisation rates" are the share of the last sample period in which a kernel ran or the
//! memory controller was busy: activity, not occupancy; they are printed as such.
//!
//! `--backend cpu` reports the CPU backend and does not touch the GPU; `--backend gpu` without a usable
//! GPU is a run-time error (exit 1), as in the other commands; `auto` reports the GPU when there is a
//! driver and says that kernels run on the CPU otherwise (exit 0).

use crate::backend::gpu::driver_present;
use crate::backend::GpuBackend;
use crate::BackendChoice;
use nvml_wrapper::enum_wrappers::device::Clock;
use nvml_wrapper::Nvml;

use super::args::BackendArgs;
use crate::Error;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Device index.
    #[arg(long, default_value_t = 0)]
    device: u32,
    #[command(flatten)]
    backend: BackendArgs,
}

const GIB: f64 = (1u64 << 30) as f64;

/// One line of memory figures: used / total in % (occupancy), free, and the exact bytes. `used` may
/// come from NVML (which counts the driver's reservations) or be `total − free`.
pub(crate) fn memory_line(total: u64, used: u64, free: u64) -> String {
    let pct = if total == 0 { 0.0 } else { used as f64 / total as f64 * 100.0 };
    format!(
        "  memory: {:.2} GiB used of {:.2} GiB ({pct:.1} % occupied), {:.2} GiB free ({used} B used, {total} B total, \
         {free} B free)",
        used as f64 / GIB,
        total as f64 / GIB,
        free as f64 / GIB
    )
}

pub(crate) fn run(a: Args) -> Result<(), Error> {
    match crate::ptx::kernels_ptx() {
        Ok(p) => println!("PTX kernels: embedded ({} bytes, loads on sm_80 and newer)", p.len()),
        Err(e) => println!("PTX kernels: {e}"),
    }
    match a.backend.backend {
        BackendChoice::Cpu => {
            let b = a.backend.select()?;
            println!("backend cpu: {}", b.describe());
            return Ok(());
        }
        BackendChoice::Gpu => {
            // The same check as every command given `--backend gpu`: an error without a usable GPU.
            let b = a.backend.select()?;
            println!("backend gpu: {}", b.describe());
        }
        BackendChoice::Auto => {
            if !driver_present() {
                println!("no NVIDIA driver found: gpuheap runs its kernels on the CPU backend");
                return Ok(());
            }
        }
    }
    match Nvml::init() {
        Ok(nvml) => nvml_report(&nvml, a.device).map_err(|e| Error::runtime(format!("NVML: {e}")))?,
        Err(e) => {
            println!("NVML unavailable ({e}); the driver's own figures:");
            match GpuBackend::new(a.device as usize) {
                Ok(g) => {
                    let (free, total) = g.mem_info().map_err(Error::runtime)?;
                    let (free, total) = (free as u64, total as u64);
                    println!("device {}: {}", a.device, g.name());
                    println!("{}", memory_line(total, total.saturating_sub(free), free));
                }
                Err(e) => println!("GPU backend unavailable: {e}"),
            }
        }
    }
    Ok(())
}

fn nvml_report(nvml: &Nvml, index: u32) -> Result<(), nvml_wrapper::error::NvmlError> {
    println!("driver {}", nvml.sys_driver_version()?);
    let d = nvml.device_by_index(index)?;
    println!("device {index}: {}", d.name()?);
    let m = d.memory_info()?;
    println!("{}", memory_line(m.total, m.used, m.free));
    if let Ok(u) = d.utilization_rates() {
        println!(
            "  activity (NVML utilisation rates, last sample period; not occupancy): kernels running {} % of the \
             time, memory controller busy {} %",
            u.gpu, u.memory
        );
    }
    let clock = d.max_clock_info(Clock::Memory).ok();
    let bus = d.memory_bus_width().ok();
    if let Some(c) = clock {
        println!("  memory clock (max) {c} MHz");
    }
    if let Some(w) = bus {
        println!("  memory bus width {w} bit");
    }
    if let (Some(c), Some(w)) = (clock, bus) {
        // Double data rate: two transfers per clock on each bus bit.
        let gbs = c as f64 * 1e6 * 2.0 * w as f64 / 8.0 / 1e9;
        println!("  theoretical bandwidth {gbs:.0} GB/s (2 x clock x bus width)");
    }
    Ok(())
}
