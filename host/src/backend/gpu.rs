//! The GPU backend: the CUDA driver API through `cudarc` (dynamic loading).
//!
//! `cudarc`'s `CudaContext::new` panics when `libcuda.so` is missing, so
//! [`GpuBackend::new`] checks, in order, that the library loads, that the
//! driver reports a device, and only then creates the context. It loads
//! gpuheap's own PTX at once, with the JIT log ([`KernelModule`]), and
//! checks every launch against the kernel's limits ([`super::limits`]).

use std::sync::Arc;

use cudarc::driver::sys::CUdevice_attribute as Dev;
use cudarc::driver::{CudaContext, CudaStream, DriverError};
use gpuheap_kernels::Kernel;

use super::limits::Arch;
use super::module::{self, KernelModule};
use super::{BackendError, BackendId, DeviceBuffer, LaunchConfig, LaunchTiming, Result};

pub(crate) fn driver(call: &'static str, e: DriverError) -> BackendError {
    let name = e.error_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let text = e.error_string().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    BackendError::Driver { call, error: format!("{name}: {text}") }
}

/// `true` when the NVIDIA driver library can be loaded (never panics).
#[doc(hidden)]
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the driver library; no CUDA call is made.
    let present = std::panic::catch_unwind(|| unsafe { cudarc::driver::sys::is_culib_present() });
    present.unwrap_or(false)
}

/// Why the built-in module is not usable (kept to answer each later request with a fresh error).
#[derive(Clone, Debug)]
enum BuiltinError {
    /// The build had no PTX.
    Missing(String),
    /// Loading failed: the error and the JIT log (empty when the JIT did not run).
    Refused { error: String, log: String },
}

/// The GPU backend: one device, its primary context and one stream.
///
/// Cloning shares the context, the stream and the loaded module.
#[derive(Clone)]
pub struct GpuBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    builtin: std::result::Result<KernelModule, BuiltinError>,
    name: String,
}

impl GpuBackend {
    /// Device `ordinal`, or why it is not usable.
    #[doc(hidden)]
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
        let builtin = match crate::ptx::kernels_ptx() {
            Err(e) => Err(BuiltinError::Missing(e.to_string())),
            Ok(src) => module::load(&ctx, src).map_err(|e| match e {
                BackendError::ModuleLoad { error, log } => BuiltinError::Refused { error, log },
                e => BuiltinError::Refused { error: e.to_string(), log: String::new() },
            }),
        };
        Ok(Self { ctx, stream, builtin, name })
    }

    /// The context (for callers that need raw cudarc access).
    #[doc(hidden)]
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The identity of this backend's memory: the device and its context (see [`BackendId`]).
    #[doc(hidden)]
    pub fn id(&self) -> BackendId {
        BackendId::cuda(self.ctx.ordinal(), self.ctx.cu_ctx() as usize)
    }

    /// The stream every gpuheap operation uses.
    #[doc(hidden)]
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Device name as the driver reports it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Compute capability (major, minor).
    #[doc(hidden)]
    pub fn compute_capability(&self) -> Result<(i32, i32)> {
        self.ctx.compute_capability().map_err(|e| driver("cuDeviceGetAttribute", e))
    }

    /// Free and total device memory, bytes.
    #[doc(hidden)]
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.ctx.mem_get_info().map_err(|e| driver("cuMemGetInfo", e))
    }

    /// Number of streaming multiprocessors.
    #[doc(hidden)]
    pub fn sm_count(&self) -> Result<i32> {
        self.ctx.attribute(Dev::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).map_err(|e| driver("cuDeviceGetAttribute", e))
    }

    /// The device's per-SM and per-block resources: the driver's attributes, with the allocation
    /// units of [`Arch::for_compute_capability`] (those of sm_90 for an architecture it does not
    /// list).
    pub fn arch(&self) -> Result<Arch> {
        let (major, minor) = self.compute_capability()?;
        let (major, minor) = (major.max(0) as u32, minor.max(0) as u32);
        let base = Arch::for_compute_capability(major, minor)
            .unwrap_or(Arch { compute_capability: (major, minor), ..Arch::SM90 });
        let a = |attr: Dev| {
            self.ctx.attribute(attr).map(|v| v.max(0) as u32).map_err(|e| driver("cuDeviceGetAttribute", e))
        };
        Ok(Arch {
            regs_per_sm: a(Dev::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR)?,
            regs_per_block: a(Dev::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK)?,
            max_threads_per_block: a(Dev::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
            max_threads_per_sm: a(Dev::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)?,
            max_blocks_per_sm: a(Dev::CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR)?,
            shared_per_sm: a(Dev::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)?,
            shared_per_block: a(Dev::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK)?,
            shared_reserved_per_block: a(Dev::CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK)?,
            ..base
        })
    }

    /// gpuheap's own module as the driver loaded it (its JIT log, its kernels' attributes).
    ///
    /// # Errors
    /// [`BackendError::NoPtx`] when the build had no PTX; [`BackendError::ModuleLoad`] with the
    /// JIT's log when the driver refused it.
    #[doc(hidden)]
    pub fn builtin(&self) -> Result<&KernelModule> {
        self.builtin.as_ref().map_err(|e| match e.clone() {
            BuiltinError::Missing(reason) => BackendError::NoPtx { reason, install: crate::ptx::INSTALL_COMMAND },
            BuiltinError::Refused { error, log } => BackendError::ModuleLoad { error, log },
        })
    }

    pub(super) fn describe(&self) -> String {
        let cc = self.compute_capability().map(|(a, b)| format!("sm_{a}{b}")).unwrap_or_default();
        let mem =
            self.mem_info().map(|(_, t)| format!("{:.1} GiB", t as f64 / (1u64 << 30) as f64)).unwrap_or_default();
        format!("GPU {} ({cc}, {mem})", self.name)
    }

    pub(super) fn load_module(&self, ptx: &str) -> Result<KernelModule> {
        module::load(&self.ctx, ptx)
    }

    pub(super) fn alloc_zeroed(&self, bytes: usize) -> Result<DeviceBuffer> {
        let slice = self.stream.alloc_zeros::<u8>(bytes.max(1)).map_err(|e| driver("cuMemAlloc", e))?;
        Ok(DeviceBuffer::gpu(slice, self.stream.clone(), bytes, self.id()))
    }

    pub(super) fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(|e| driver("cuStreamSynchronize", e))
    }

    /// Launches `k` from module `m` after checking `cfg` against the kernel's limits, waits, and
    /// times it with CUDA events.
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
        // SAFETY: forwarded contract.
        let elapsed = unsafe { m.launch(&self.stream, k.name(), cfg, params, true)? };
        Ok(LaunchTiming { elapsed })
    }

    /// Like [`launch`](Self::launch) on the built-in module, without gpuheap's own launch-limit
    /// check: the driver alone decides. Only the launch-limit probe uses it, to compare the
    /// driver's verdict with [`KernelInfo::check`](super::limits::KernelInfo::check)'s.
    ///
    /// # Safety
    /// As for [`super::Backend::launch`].
    #[doc(hidden)]
    pub unsafe fn launch_unchecked<P: bytemuck::Pod>(
        &self,
        k: &Kernel<P>,
        cfg: LaunchConfig,
        params: &P,
    ) -> Result<LaunchTiming> {
        cfg.validate()?;
        // SAFETY: forwarded contract.
        let elapsed = unsafe { self.builtin()?.launch(&self.stream, k.name(), cfg, params, false)? };
        Ok(LaunchTiming { elapsed })
    }
}
