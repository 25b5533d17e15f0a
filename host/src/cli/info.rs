//! `gpuheap info`: the GPU's memory (NVML, else the driver) and the backends.

use gpuheap::backend::gpu::driver_present;
use gpuheap::backend::GpuBackend;
use nvml_wrapper::enum_wrappers::device::Clock;
use nvml_wrapper::Nvml;

use super::CliError;

#[derive(clap::Args)]
pub struct Args {
    /// Device index.
    #[arg(long, default_value_t = 0)]
    device: u32,
}

const GIB: f64 = (1u64 << 30) as f64;

pub fn run(a: Args) -> Result<(), CliError> {
    match gpuheap::ptx::kernels_ptx() {
        Ok(p) => println!("PTX kernels: embedded ({} bytes, loads on sm_80 and newer)", p.len()),
        Err(e) => println!("PTX kernels: {e}"),
    }
    if !driver_present() {
        println!("no NVIDIA driver found: gpuheap runs its kernels on the CPU backend");
        return Ok(());
    }
    match Nvml::init() {
        Ok(nvml) => nvml_report(&nvml, a.device).map_err(|e| CliError::Runtime(format!("NVML: {e}")))?,
        Err(e) => {
            println!("NVML unavailable ({e}); the driver's own figures:");
            match GpuBackend::new(a.device as usize) {
                Ok(g) => {
                    let (free, total) = g.mem_info().map_err(|e| CliError::Runtime(e.to_string()))?;
                    println!("device {}: {}", a.device, g.name());
                    println!("  memory total {:.2} GiB, free {:.2} GiB", total as f64 / GIB, free as f64 / GIB);
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
    println!(
        "  memory total {:.2} GiB, used {:.2} GiB, free {:.2} GiB",
        m.total as f64 / GIB,
        m.used as f64 / GIB,
        m.free as f64 / GIB
    );
    if let Ok(u) = d.utilization_rates() {
        println!("  utilisation: gpu {} %, memory {} %", u.gpu, u.memory);
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
