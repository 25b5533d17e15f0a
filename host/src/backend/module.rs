//! A PTX module loaded with the driver's JIT log, and its kernels with their launch limits.
//!
//! Why not `cudarc`'s `CudaContext::load_module`: it calls `cuModuleLoadData` without options, so
//! a JIT failure is a bare `CUDA_ERROR_INVALID_PTX` and nothing records what the driver's JIT (not
//! the `ptxas` of the PTX check) allocated, and `cudarc` 0.19's `CudaModule` cannot wrap a module
//! loaded any other way. So this module calls `cuModuleLoadDataEx` with `CU_JIT_INFO_LOG_BUFFER`,
//! `CU_JIT_ERROR_LOG_BUFFER`, `CU_JIT_LOG_VERBOSE` and `CU_JIT_WALL_TIME`, keeps the module handle,
//! reads every entry's attributes once at load (`cuFuncGetAttribute`), and launches through
//! `cudarc`'s driver-call layer (`cudarc::driver::result`), everything else (context, stream,
//! events, memory) staying `cudarc`'s.

use std::ffi::{c_void, CString};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::result;
use cudarc::driver::sys::{self, CUfunction_attribute_enum as Attr, CUjit_option_enum as Jit};
use cudarc::driver::{CudaContext, CudaStream};

use super::gpu::driver;
use super::limits::{ptx_entries, KernelInfo};
use super::{BackendError, LaunchConfig, Result};

/// Bytes of the JIT's info log buffer (the verbose log is a few lines per kernel).
const INFO_LOG_BYTES: usize = 64 << 10;
/// Bytes of the JIT's error log buffer.
const ERROR_LOG_BYTES: usize = 16 << 10;

/// How a module was loaded: the time and what the driver's JIT said.
#[derive(Clone, Debug, serde::Serialize)]
#[doc(hidden)]
pub struct ModuleLoad {
    /// Wall time of `cuModuleLoadDataEx` as the host saw it (JIT included; a driver compute cache
    /// hit makes it short).
    pub load_time: Duration,
    /// The JIT's own wall time (`CU_JIT_WALL_TIME`), milliseconds.
    pub jit_ms: f32,
    /// Bytes of PTX loaded.
    pub ptx_bytes: usize,
    /// The JIT's info log (`CU_JIT_LOG_VERBOSE`: per kernel, the registers and memory it used).
    pub info_log: String,
}

/// A loaded PTX module: its kernels, each with its attributes, and how it was loaded.
#[derive(Clone)]
pub struct KernelModule {
    inner: Arc<Inner>,
}

struct Inner {
    ctx: Arc<CudaContext>,
    module: sys::CUmodule,
    kernels: Vec<(KernelInfo, sys::CUfunction)>,
    load: ModuleLoad,
}

// SAFETY: `CUmodule` and `CUfunction` are driver handles, valid on any host thread while the
// context (held by `ctx`) is alive; every driver call made with them binds the context first. The
// driver API is thread-safe.
unsafe impl Send for Inner {}
// SAFETY: see `Send`; `Inner` is never mutated after construction.
unsafe impl Sync for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        // A failure here (the context already lost) leaves nothing to clean up.
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: the module was loaded by `load` and is unloaded once, here; no function
            // handle outlives `Inner`.
            let _ = unsafe { result::module::unload(self.module) };
        }
    }
}

fn log_text(buf: &[u8], written: usize) -> String {
    let end = buf[..written.min(buf.len())].iter().position(|&b| b == 0).unwrap_or(written.min(buf.len()));
    String::from_utf8_lossy(&buf[..end]).trim_end().to_string()
}

fn attribute(f: sys::CUfunction, a: Attr) -> Result<u32> {
    // SAFETY: `f` comes from `cuModuleGetFunction` on a loaded module.
    let v = unsafe { result::function::get_function_attribute(f, a) }.map_err(|e| driver("cuFuncGetAttribute", e))?;
    Ok(v.max(0) as u32)
}

/// Loads `ptx` into `ctx` with the JIT log, and reads the attributes of every `.entry`.
///
/// # Errors
/// [`BackendError::ModuleLoad`] with the JIT's error log when the driver refuses the PTX;
/// `InvalidArgument` for PTX with a NUL byte; driver errors.
pub(super) fn load(ctx: &Arc<CudaContext>, ptx: &str) -> Result<KernelModule> {
    let src =
        CString::new(ptx).map_err(|_| BackendError::InvalidArgument("the PTX text contains a NUL byte".into()))?;
    ctx.bind_to_thread().map_err(|e| driver("cuCtxSetCurrent", e))?;
    let mut info = vec![0u8; INFO_LOG_BYTES];
    let mut error = vec![0u8; ERROR_LOG_BYTES];
    let mut options = [
        Jit::CU_JIT_INFO_LOG_BUFFER,
        Jit::CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
        Jit::CU_JIT_ERROR_LOG_BUFFER,
        Jit::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        Jit::CU_JIT_LOG_VERBOSE,
        Jit::CU_JIT_WALL_TIME,
    ];
    // Scalar options travel in the pointer-sized value words; the driver writes the bytes of each
    // log it filled, and the JIT time as an `f32`, back into the same words.
    let mut values: [*mut c_void; 6] = [
        info.as_mut_ptr().cast(),
        std::ptr::without_provenance_mut(INFO_LOG_BYTES),
        error.as_mut_ptr().cast(),
        std::ptr::without_provenance_mut(ERROR_LOG_BYTES),
        std::ptr::without_provenance_mut(1),
        std::ptr::null_mut(),
    ];
    let mut module: sys::CUmodule = std::ptr::null_mut();
    let start = Instant::now();
    // SAFETY: `src` is a NUL-terminated PTX image; `options` and `values` have the same length,
    // each log buffer is as long as its size option says and outlives the call, and the
    // context is current on this thread.
    let r = unsafe {
        sys::cuModuleLoadDataEx(
            &mut module,
            src.as_ptr().cast(),
            options.len() as u32,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
        )
    };
    let load_time = start.elapsed();
    let info_log = log_text(&info, values[1].addr());
    if let Err(e) = r.result() {
        let what = driver("cuModuleLoadDataEx", e).to_string();
        let mut log = log_text(&error, values[3].addr());
        if log.is_empty() {
            log = info_log;
        }
        return Err(BackendError::ModuleLoad { error: what, log });
    }
    let jit_ms = f32::from_bits(values[5].addr() as u32);
    let mut inner = Inner {
        ctx: ctx.clone(),
        module,
        kernels: Vec::new(),
        load: ModuleLoad { load_time, jit_ms, ptx_bytes: ptx.len(), info_log },
    };
    for name in ptx_entries(ptx) {
        let c = CString::new(name.as_str()).expect("entry names have no NUL");
        // SAFETY: `module` was loaded above and is alive (`inner` unloads it on an early return).
        let f = unsafe { result::module::get_function(module, c) }.map_err(|e| driver("cuModuleGetFunction", e))?;
        let info = KernelInfo {
            registers: attribute(f, Attr::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
            local_bytes: attribute(f, Attr::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
            static_shared_bytes: attribute(f, Attr::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
            const_bytes: attribute(f, Attr::CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES)?,
            max_threads_per_block: attribute(f, Attr::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
            max_dynamic_shared_bytes: attribute(f, Attr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)?,
            name,
        };
        inner.kernels.push((info, f));
    }
    Ok(KernelModule { inner: Arc::new(inner) })
}

impl KernelModule {
    /// How the module was loaded.
    #[doc(hidden)]
    pub fn load_info(&self) -> &ModuleLoad {
        &self.inner.load
    }

    /// Every kernel of the module with its attributes, in PTX order.
    #[doc(hidden)]
    pub fn kernels(&self) -> impl Iterator<Item = &KernelInfo> {
        self.inner.kernels.iter().map(|(k, _)| k)
    }

    /// The attributes of kernel `name`.
    ///
    /// # Errors
    /// `InvalidArgument` when the module has no such entry.
    pub fn kernel(&self, name: &str) -> Result<&KernelInfo> {
        self.function(name).map(|(k, _)| k)
    }

    fn function(&self, name: &str) -> Result<(&KernelInfo, sys::CUfunction)> {
        self.inner
            .kernels
            .iter()
            .find(|(k, _)| k.name == name)
            .map(|(k, f)| (k, *f))
            .ok_or_else(|| BackendError::InvalidArgument(format!("kernel {name} is not an entry of the loaded module")))
    }

    /// Resident blocks per SM of kernel `name` at `block` threads and `dynamic_shared` bytes, as
    /// the driver computes it (`cuOccupancyMaxActiveBlocksPerMultiprocessor`).
    ///
    /// # Errors
    /// `InvalidArgument` for an unknown kernel; driver errors.
    #[doc(hidden)]
    pub fn max_active_blocks(&self, name: &str, block: u32, dynamic_shared: u32) -> Result<u32> {
        let (_, f) = self.function(name)?;
        self.inner.ctx.bind_to_thread().map_err(|e| driver("cuCtxSetCurrent", e))?;
        let block = i32::try_from(block).map_err(|_| BackendError::InvalidArgument(format!("block of {block}")))?;
        // SAFETY: `f` belongs to this live module.
        let n = unsafe { result::occupancy::max_active_block_per_multiprocessor(f, block, dynamic_shared as usize) }
            .map_err(|e| driver("cuOccupancyMaxActiveBlocksPerMultiprocessor", e))?;
        Ok(n.max(0) as u32)
    }

    /// Launches kernel `name` with the parameter struct `params` on `stream` after checking `cfg`
    /// against the kernel's limits ([`KernelInfo::check`]) — unless `checked` is false (the
    /// launch-limit probe, which asks the driver itself) — and returns the kernel time measured
    /// with CUDA events after waiting for it.
    ///
    /// # Safety
    /// `P` is the kernel's parameter struct (the same Rust type compiled for nvptx64), and every
    /// device address in it is valid for what the kernel does with it.
    pub(super) unsafe fn launch<P: bytemuck::Pod>(
        &self,
        stream: &Arc<CudaStream>,
        name: &str,
        cfg: LaunchConfig,
        params: &P,
        checked: bool,
    ) -> Result<Duration> {
        let (info, f) = self.function(name)?;
        if checked {
            info.check(&cfg)?;
        }
        let ctx = &self.inner.ctx;
        let event =
            || ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)).map_err(|e| driver("cuEventCreate", e));
        let (start, end) = (event()?, event()?);
        start.record(stream).map_err(|e| driver("cuEventRecord", e))?;
        let mut arg = *params;
        let mut args = [(&mut arg as *mut P).cast::<c_void>()];
        // SAFETY: `f` belongs to this live module; the one kernel parameter is a `P` by value (the
        // `.param` aggregate of the same `repr(C)` struct: both targets are 64-bit little-endian),
        // alive until the call returns (the driver copies parameters at launch); the caller
        // vouches for the addresses inside it.
        unsafe {
            result::launch_kernel(
                f,
                (cfg.grid, 1, 1),
                (cfg.block, 1, 1),
                cfg.shared_bytes,
                stream.cu_stream(),
                &mut args,
            )
        }
        .map_err(|e| driver("cuLaunchKernel", e))?;
        end.record(stream).map_err(|e| driver("cuEventRecord", e))?;
        stream.synchronize().map_err(|e| driver("cuStreamSynchronize", e))?;
        let ms = start.elapsed_ms(&end).map_err(|e| driver("cuEventElapsedTime", e))?;
        Ok(Duration::from_secs_f64(ms.max(0.0) as f64 / 1e3))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn logs_stop_at_the_terminator_and_the_written_length() {
        assert_eq!(super::log_text(b"ptxas info: 93 registers\n\0junk", 40), "ptxas info: 93 registers");
        assert_eq!(super::log_text(b"abcdef", 3), "abc");
        assert_eq!(super::log_text(b"", 10), "");
    }
}
