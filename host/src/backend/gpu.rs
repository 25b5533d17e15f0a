//! The GPU backend: the CUDA driver API through `cudarc` (dynamic loading).
//!
//! `cudarc`'s `CudaContext::new` panics when `libcuda.so` is missing, so
//! [`GpuBackend::new`] checks, in order, that the library loads, that the
//! driver reports a device, and only then creates the context.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cudarc::driver::sys::{CUdevice_attribute, CUevent_flags};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, DeviceRepr, DriverError, PushKernelArg};
use gpuheap_kernels::Kernel;

use super::{BackendError, DeviceBuffer, LaunchConfig, LaunchTiming, Result};

pub(crate) fn driver(call: &'static str, e: DriverError) -> BackendError {
    let name = e.error_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let text = e.error_string().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    BackendError::Driver { call, error: format!("{name}: {text}") }
}

/// `true` when the NVIDIA driver library can be loaded (never panics).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the driver library; no CUDA call is made.
    let present = std::panic::catch_unwind(|| unsafe { cudarc::driver::sys::is_culib_present() });
    present.unwrap_or(false)
}

/// A loaded PTX module.
#[derive(Clone)]
pub struct KernelModule {
    module: Arc<CudaModule>,
}

/// The GPU backend: one device, its primary context and one stream.
pub struct GpuBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    builtin: std::result::Result<KernelModule, String>,
    functions: Mutex<HashMap<(usize, &'static str), CudaFunction>>,
    name: String,
}

/// A kernel parameter struct passed by value.
#[repr(transparent)]
struct PodArg<P>(P);

// SAFETY: `P: Pod` is plain bytes without pointers to host memory or padding,
// laid out `repr(C)` exactly as the PTX `.param` aggregate of the same Rust
// struct compiled for nvptx64 (both targets are 64-bit little-endian).
unsafe impl<P: bytemuck::Pod> DeviceRepr for PodArg<P> {}

impl GpuBackend {
    /// Device `ordinal`, or why it is not usable.
    pub fn new(ordinal: usize) -> Result<Self> {
        if !driver_present() {
            return Err(BackendError::NoDriver);
        }
        let count = CudaContext::device_count().map_err(|e| BackendError::NoDevice(format!("{e:?}")))?;
        if count <= ordinal as i32 {
            return Err(BackendError::NoDevice(format!("{count} device(s), asked for #{ordinal}")));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| driver("cuCtxCreate", e))?;
        // SAFETY: gpuheap uses one stream per context and synchronises after
        // every launch and copy, so cudarc's per-slice event tracking is not
        // needed.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.default_stream();
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let builtin = crate::ptx::kernels_ptx()
            .map_err(|e| e.to_string())
            .and_then(|src| load(&ctx, src).map_err(|e| e.to_string()));
        Ok(Self { ctx, stream, builtin, functions: Mutex::new(HashMap::new()), name })
    }

    /// The context (for callers that need raw cudarc access).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream every gpuheap operation uses.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Device name as the driver reports it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Compute capability (major, minor).
    pub fn compute_capability(&self) -> Result<(i32, i32)> {
        self.ctx.compute_capability().map_err(|e| driver("cuDeviceGetAttribute", e))
    }

    /// Free and total device memory, bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.ctx.mem_get_info().map_err(|e| driver("cuMemGetInfo", e))
    }

    /// Number of streaming multiprocessors.
    pub fn sm_count(&self) -> Result<i32> {
        self.ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| driver("cuDeviceGetAttribute", e))
    }

    pub(super) fn describe(&self) -> String {
        let cc = self.compute_capability().map(|(a, b)| format!("sm_{a}{b}")).unwrap_or_default();
        let mem =
            self.mem_info().map(|(_, t)| format!("{:.1} GiB", t as f64 / (1u64 << 30) as f64)).unwrap_or_default();
        format!("GPU {} ({cc}, {mem})", self.name)
    }

    pub(super) fn builtin_module(&self) -> Result<&KernelModule> {
        self.builtin
            .as_ref()
            .map_err(|reason| BackendError::NoPtx { reason: reason.clone(), install: crate::ptx::INSTALL_COMMAND })
    }

    pub(super) fn load_module(&self, ptx: &str) -> Result<KernelModule> {
        load(&self.ctx, ptx)
    }

    pub(super) fn alloc_zeroed(&self, bytes: usize) -> Result<DeviceBuffer> {
        let slice = self.stream.alloc_zeros::<u8>(bytes.max(1)).map_err(|e| driver("cuMemAlloc", e))?;
        Ok(DeviceBuffer::gpu(slice, self.stream.clone(), bytes))
    }

    pub(super) fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(|e| driver("cuStreamSynchronize", e))
    }

    fn function(&self, m: &KernelModule, name: &'static str) -> Result<CudaFunction> {
        let key = (Arc::as_ptr(&m.module) as usize, name);
        let mut cache = self.functions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = cache.get(&key) {
            return Ok(f.clone());
        }
        let f = m.module.load_function(name).map_err(|e| driver("cuModuleGetFunction", e))?;
        cache.insert(key, f.clone());
        Ok(f)
    }

    /// Launches `k` from module `m`, waits, and times it with CUDA events.
    ///
    /// # Safety
    /// As for [`super::Backend::launch`].
    pub(super) unsafe fn launch<P: bytemuck::Pod>(
        &self,
        m: &KernelModule,
        k: &Kernel<P>,
        cfg: LaunchConfig,
        params: &P,
    ) -> Result<LaunchTiming> {
        let f = self.function(m, k.name())?;
        let arg = PodArg(*params);
        let mut b = self.stream.launch_builder(&f);
        b.arg(&arg);
        b.record_kernel_launch(CUevent_flags::CU_EVENT_DEFAULT);
        let c = cudarc::driver::LaunchConfig {
            grid_dim: (cfg.grid, 1, 1),
            block_dim: (cfg.block, 1, 1),
            shared_mem_bytes: cfg.shared_bytes,
        };
        // SAFETY: the parameter struct matches the kernel's (same Rust type on
        // both sides); the caller vouches for the addresses inside it.
        let events = unsafe { b.launch(c) }.map_err(|e| driver("cuLaunchKernel", e))?;
        self.synchronize()?;
        let ms = match events {
            Some((start, end)) => start.elapsed_ms(&end).map_err(|e| driver("cuEventElapsedTime", e))?,
            None => 0.0,
        };
        Ok(LaunchTiming { elapsed: Duration::from_secs_f64(ms as f64 / 1e3) })
    }
}

fn load(ctx: &Arc<CudaContext>, ptx: &str) -> Result<KernelModule> {
    let module = ctx.load_module(cudarc::nvrtc::Ptx::from_src(ptx)).map_err(|e| driver("cuModuleLoadData", e))?;
    Ok(KernelModule { module })
}
