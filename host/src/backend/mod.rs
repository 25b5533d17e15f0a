//! Backends: where kernels run.
//!
//! A [`Backend`] is either the **GPU** (CUDA driver API through `cudarc`,
//! loaded dynamically, so nothing CUDA is needed to build or to run without a
//! GPU) or the **CPU** (the same kernel bodies, compiled for the host, run on a
//! thread pool with emulated grid/block/thread indices; see
//! [`gpuheap_kernels::arch::emu`]).
//!
//! Selection: [`Backend::select`] takes a [`BackendChoice`] (`auto`, `cpu`,
//! `gpu`), which the command line's `--backend` flag and the `GPUHEAP_BACKEND`
//! environment variable set. `auto` picks the GPU when a driver and a device
//! are present and the PTX was built, else the CPU.
//!
//! Memory is a [`DeviceBuffer`]: device memory on the GPU, a 256-byte aligned
//! host allocation on the CPU. Kernels see it through its device address
//! ([`DeviceBuffer::device_ptr`]), a `u64` in their parameter struct.
//!
//! # Which backend may use a buffer (the owner rule)
//!
//! A buffer knows its owner ([`DeviceBuffer::owner`], a [`BackendId`]), and a
//! backend its own identity ([`Backend::id`]); a buffer may be used with a
//! backend of the same identity only (see [`BackendId`] for which those are).
//! A kernel given an address of another owner would read and write memory of
//! another kind or of another CUDA context through it: a CPU kernel body
//! writing through a device address into host memory, a GPU kernel faulting
//! on a host address. gpuheap's safe API never lets that happen, by one
//! convention:
//!
//! * **What is made on a backend keeps it.** A
//!   [`DeviceHeap`](crate::device_heap::DeviceHeap) (with its movable
//!   region) and a [`CompactHeap`](crate::compaction::CompactHeap), the two
//!   [`HandleRegion`](crate::compaction::HandleRegion)s, are made on a
//!   backend, allocate all their memory there and keep a clone of it: their
//!   methods and the functions over them ([`crate::device_heap::ops`]) take no
//!   `&Backend`, so a mismatch cannot be written.
//! * **What takes bare buffers checks them.** A function that launches over
//!   [`DeviceBuffer`]s it is handed ([`crate::ops::fill`],
//!   [`crate::ops::verify`], [`Compactor`](crate::compaction::Compactor)'s
//!   `compact`, `compact_at` and `copy`) takes the `&Backend` that launches
//!   and checks every buffer against it first ([`Backend::check_owner`]): a
//!   mismatch is a [`BackendError::WrongBackend`] naming the entry point,
//!   the buffer's owner and the backend given, before anything runs.
//!
//! Only the `unsafe` launches ([`Backend::launch`], [`Backend::launch_in`])
//! take raw addresses; their contract is the same rule.
//!
//! On the GPU every launch is first checked against the kernel's limits as
//! the driver reported them at module load (`limits`): a block the
//! kernel's registers cannot fit is a [`BackendError::LaunchLimit`], not the
//! driver's `CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES`.
//!
//! ```
//! use gpuheap::backend::Backend;
//! use gpuheap::ops;
//!
//! let backend = Backend::cpu(); // or Backend::select(BackendChoice::Auto)
//! let mut buf = backend.alloc_zeroed(1 << 20)?;
//! ops::fill(&backend, &mut buf, 7)?;
//! let (report, _timing) = ops::verify(&backend, &buf, 7)?;
//! assert_eq!(report.mismatches, 0);
//! # Ok::<(), gpuheap::backend::BackendError>(())
//! ```

mod buffer;
pub(crate) mod cpu;
pub(crate) mod gpu;
pub(crate) mod limits;
mod module;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

pub use buffer::DeviceBuffer;
pub use cpu::{CpuBackend, CpuMode};
pub use gpu::{driver_present, GpuBackend};
use gpuheap_kernels::Kernel;
pub use limits::{Arch, KernelInfo, Limiter, Occupancy};
pub use module::{KernelModule, ModuleLoad};

/// Errors of the backends.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// No NVIDIA driver library (`libcuda.so`) could be loaded.
    #[error("no NVIDIA driver found (libcuda.so is not loadable); use the CPU backend (--backend cpu)")]
    NoDriver,
    /// The driver is present but reports no usable device.
    #[error("the NVIDIA driver reports no CUDA device ({0})")]
    NoDevice(String),
    /// The crate was built without PTX (the nvptx toolchain was missing).
    #[error("gpuheap was built without its PTX kernels ({reason}); rebuild after: {install}")]
    NoPtx {
        /// Why the build skipped the PTX.
        reason: String,
        /// The command that installs the toolchain.
        install: &'static str,
    },
    /// A CUDA driver call failed.
    #[error("CUDA driver call {call} failed: {error}")]
    Driver {
        /// What was being done.
        call: &'static str,
        /// The driver's error (name and description).
        error: String,
    },
    /// A kernel body panicked on the CPU backend (a bug in the kernel).
    #[error("kernel {kernel} panicked on the CPU backend: {message}")]
    KernelPanic {
        /// Kernel name.
        kernel: &'static str,
        /// The panic message.
        message: String,
    },
    /// A launch that the kernel's resources cannot fit (checked before the driver would refuse it
    /// with `CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES`; see [`KernelInfo::check`]).
    #[error("kernel {kernel} cannot launch: {requested} {resource} requested, at most {limit} ({reason})")]
    LaunchLimit {
        /// Kernel name.
        kernel: String,
        /// What is over the limit (`threads per block`, `bytes of dynamic shared memory per block`).
        resource: &'static str,
        /// What the launch asked for.
        requested: u64,
        /// The kernel's limit.
        limit: u64,
        /// Where the limit comes from.
        reason: String,
    },
    /// The driver refused a PTX module.
    #[error("{error}; JIT log: {}", if log.is_empty() { "(empty)" } else { log })]
    ModuleLoad {
        /// The driver call and its error.
        error: String,
        /// The JIT's error log (or its info log when the error log is empty).
        log: String,
    },
    /// A launch or copy was given an invalid argument.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A `GPUHEAP_BACKEND` / `--backend` value other than auto, cpu or gpu.
    #[error("unknown backend {0:?} (expected auto, cpu or gpu)")]
    UnknownBackend(String),
    /// A buffer given to a backend it does not belong to (the owner rule, [`BackendId`]), refused
    /// before anything ran.
    #[error("{entry}: the buffer is memory of {buffer}, but the backend given is {backend}")]
    WrongBackend {
        /// The entry point that refused it (`ops::fill`, `Compactor::compact`, ...).
        entry: &'static str,
        /// The buffer's owner ([`DeviceBuffer::owner`]).
        buffer: BackendId,
        /// The backend given ([`Backend::id`]).
        backend: BackendId,
    },
    /// A [`Batch`](crate::device_heap::ops::Batch) given to a device heap that did not make it, or
    /// that was reset or rebuilt since, or to the free of another allocator: its pointers are no
    /// live blocks there, so freeing or touching them was refused before anything ran.
    #[error(
        "{entry}: the batch of {threads} pointers was allocated on another device heap or by another allocator, \
         or on this heap before its last reset or rebuild: its pointers are not live blocks here"
    )]
    ForeignBatch {
        /// The entry point that refused it (`ops::free_batch`, `ops::touch_batch`, ...).
        entry: &'static str,
        /// Threads (pointers) of the batch.
        threads: u64,
    },
    /// A free of a batch whose stride does not visit each pointer exactly once (thread `i` frees
    /// pointer `(i * stride) % threads`, a permutation only when `stride` (0 read as 1) is coprime
    /// with `threads`). Refused before anything ran: nothing was freed, and the batch's blocks stay
    /// allocated until the heap's next reset ([`crate::device_heap::ops::stride_visits_each_once`]
    /// checks a stride first).
    #[error(
        "{entry}: stride {stride} does not visit each of the {threads} pointers exactly once (it must be coprime \
         with the pointer count); nothing was freed"
    )]
    BadStride {
        /// The entry point that refused it (`ops::free_batch`, ...).
        entry: &'static str,
        /// The stride given.
        stride: u64,
        /// Threads (pointers) of the batch.
        threads: u64,
    },
}

/// The identity of a backend's memory: which backends may use a [`DeviceBuffer`] (the owner rule;
/// [`DeviceBuffer::owner`], [`Backend::id`], [`Backend::check_owner`]).
///
/// * **Every CPU backend is [`BackendId::HOST`]**, whatever its [`CpuMode`]: its buffers are host
///   memory, and every mode runs the same kernel bodies, compiled for the host, over host addresses
///   (the modes differ in how they schedule threads only). A buffer of one CPU backend is valid on
///   every other.
/// * **A GPU backend is its CUDA context** (device ordinal and `CUcontext`): a device address is
///   valid in the context that allocated it only. [`GpuBackend::new`] retains the device's primary
///   context, so GPU backends of one device share one identity (and their buffers); backends of two
///   devices, or a non-primary context, do not.
/// * A buffer is valid on a backend of the same identity and nowhere else: CPU ↔ GPU and context A ↔
///   context B are mismatches ([`BackendError::WrongBackend`]).
///
/// The context a buffer names stays alive while the buffer lives (it holds the context's stream), so
/// two live identities are equal exactly when they are the same memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[doc(hidden)]
pub struct BackendId(Owner);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Owner {
    Host,
    Cuda {
        ordinal: usize,
        context: usize,
    },
    /// A backend of host memory that claims another identity, for the tests of the owner checks
    /// (no GPU buffer can exist without a GPU).
    #[cfg(test)]
    Test(u32),
}

impl BackendId {
    /// Host memory: the identity of every CPU backend.
    pub const HOST: BackendId = BackendId(Owner::Host);

    /// `true` for host memory (a CPU backend's).
    pub fn is_host(self) -> bool {
        self == Self::HOST
    }

    /// The CUDA device ordinal of a GPU backend's memory (`None` for host memory).
    pub fn cuda_ordinal(self) -> Option<usize> {
        match self.0 {
            Owner::Cuda { ordinal, .. } => Some(ordinal),
            _ => None,
        }
    }

    pub(crate) fn cuda(ordinal: usize, context: usize) -> Self {
        BackendId(Owner::Cuda { ordinal, context })
    }

    /// An identity no real backend has (number `n`), for the owner-check tests.
    #[cfg(test)]
    pub(crate) fn test(n: u32) -> Self {
        BackendId(Owner::Test(n))
    }
}

impl fmt::Display for BackendId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Owner::Host => f.write_str("host memory (a CPU backend)"),
            Owner::Cuda { ordinal, context } => write!(f, "CUDA device {ordinal} (context {context:#x})"),
            #[cfg(test)]
            Owner::Test(n) => write!(f, "test owner {n}"),
        }
    }
}

/// Result of backend operations.
pub type Result<T, E = BackendError> = std::result::Result<T, E>;

/// Which backend to use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BackendChoice {
    /// The GPU when usable, else the CPU.
    #[default]
    Auto,
    /// The CPU backend.
    Cpu,
    /// The GPU backend (an error when no GPU is usable).
    Gpu,
}

impl FromStr for BackendChoice {
    type Err = BackendError;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "gpu" | "cuda" => Ok(Self::Gpu),
            _ => Err(BackendError::UnknownBackend(s.to_string())),
        }
    }
}

impl BackendChoice {
    /// The choice in `GPUHEAP_BACKEND`, `Auto` when unset.
    #[doc(hidden)]
    pub fn from_env() -> Result<Self> {
        std::env::var("GPUHEAP_BACKEND").map_or(Ok(Self::Auto), |v| v.parse())
    }
}

/// Launch geometry of a 1-D grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in the grid (≥ 1).
    pub grid: u32,
    /// Threads per block (1..=1024).
    pub block: u32,
    /// Dynamic shared memory per block, bytes.
    pub shared_bytes: u32,
}

impl LaunchConfig {
    /// Enough blocks of `block` threads to cover `threads` threads.
    #[doc(hidden)]
    pub fn for_threads(threads: u64, block: u32) -> Result<Self> {
        let block = block.clamp(1, 1024);
        let grid = threads.div_ceil(block as u64).max(1);
        let grid = u32::try_from(grid)
            .map_err(|_| BackendError::InvalidArgument(format!("{threads} threads need more than 2^32 blocks")))?;
        Ok(Self { grid, block, shared_bytes: 0 })
    }

    /// Total threads launched.
    #[doc(hidden)]
    pub fn threads(&self) -> u64 {
        self.grid as u64 * self.block as u64
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.grid == 0 || self.block == 0 || self.block > 1024 {
            return Err(BackendError::InvalidArgument(format!(
                "launch of {} blocks x {} threads (need grid >= 1, 1 <= block <= 1024)",
                self.grid, self.block
            )));
        }
        Ok(())
    }
}

/// How long a launch took: CUDA events around the kernel on the GPU, wall
/// clock around the whole launch on the CPU.
#[derive(Clone, Copy, Debug, PartialEq)]
#[doc(hidden)]
pub struct LaunchTiming {
    /// Kernel time.
    pub elapsed: Duration,
}

impl LaunchTiming {
    /// Kernel time in milliseconds.
    pub fn ms(&self) -> f64 {
        self.elapsed.as_secs_f64() * 1e3
    }
}

/// Where kernels run: the GPU or the CPU emulation.
///
/// Cloning is cheap (reference counts) and gives the same backend: the same [`id`](Self::id),
/// context, stream and module on the GPU, the same launch counter on the CPU (so the seeds of
/// [`CpuMode::Independent`] continue across clones). What is made on a backend keeps a clone (see
/// the [module docs](self) for the convention).
#[derive(Clone)]
pub enum Backend {
    /// The CPU backend.
    Cpu(CpuBackend),
    /// The GPU backend.
    Gpu(GpuBackend),
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

impl Backend {
    /// The CPU backend (sequential blocks of one-lane warps; see [`CpuMode`]).
    pub fn cpu() -> Self {
        Backend::Cpu(CpuBackend::new(CpuMode::Sequential))
    }

    /// The CPU backend in lockstep mode: 32-lane warps of OS threads that meet
    /// at every warp intrinsic (slower; exercises warp-cooperative code).
    #[doc(hidden)]
    pub fn cpu_lockstep() -> Self {
        Backend::Cpu(CpuBackend::new(CpuMode::Lockstep))
    }

    /// The CPU backend in independent-thread-scheduling mode with schedule
    /// seed `seed` (see [`CpuMode::Independent`]): lanes diverge, reconverge
    /// and are preempted adversarially; a failing run replays from `seed`.
    #[doc(hidden)]
    pub fn cpu_independent(seed: u64) -> Self {
        Backend::Cpu(CpuBackend::new(CpuMode::Independent { seed }))
    }

    /// The CPU backend in the mode of `GPUHEAP_CPU_WARPS` (see
    /// [`CpuMode::from_env`]).
    ///
    /// # Errors
    /// An invalid `GPUHEAP_CPU_WARPS` or `GPUHEAP_CPU_SEED`.
    #[doc(hidden)]
    pub fn cpu_from_env() -> Result<Self> {
        Ok(Backend::Cpu(CpuBackend::new(CpuMode::from_env()?)))
    }

    /// The first GPU, or why there is none usable.
    pub fn gpu() -> Result<Self> {
        Ok(Backend::Gpu(GpuBackend::new(0)?))
    }

    /// The backend for `choice`. `Auto` falls back to the CPU when the GPU is
    /// not usable; `Gpu` returns the reason instead. The CPU backend runs in
    /// the mode of `GPUHEAP_CPU_WARPS` (default sequential).
    pub fn select(choice: BackendChoice) -> Result<Self> {
        match choice {
            BackendChoice::Cpu => Self::cpu_from_env(),
            BackendChoice::Gpu => Self::gpu(),
            BackendChoice::Auto => match Self::gpu() {
                Ok(g) => Ok(g),
                Err(_) => Self::cpu_from_env(),
            },
        }
    }

    /// The backend chosen by `GPUHEAP_BACKEND` (default `auto`).
    #[doc(hidden)]
    pub fn from_env() -> Result<Self> {
        Self::select(BackendChoice::from_env()?)
    }

    /// `true` for the GPU backend.
    pub fn is_gpu(&self) -> bool {
        matches!(self, Backend::Gpu(_))
    }

    /// The identity of this backend's memory (see [`BackendId`]): the buffers it allocates have it
    /// as their [`owner`](DeviceBuffer::owner).
    #[doc(hidden)]
    pub fn id(&self) -> BackendId {
        match self {
            Backend::Cpu(c) => c.id(),
            Backend::Gpu(g) => g.id(),
        }
    }

    /// Checks that `buf` is memory of this backend (the owner rule, [`BackendId`]). Every safe
    /// function that launches over a buffer it was handed calls it first; so should a safe wrapper
    /// of [`launch`](Self::launch) written outside gpuheap.
    ///
    /// # Errors
    /// [`BackendError::WrongBackend`] naming `entry` (the function checking), the buffer's owner
    /// and this backend's identity.
    #[doc(hidden)]
    pub fn check_owner(&self, entry: &'static str, buf: &DeviceBuffer) -> Result<()> {
        let (buffer, backend) = (buf.owner(), self.id());
        if buffer == backend {
            Ok(())
        } else {
            Err(BackendError::WrongBackend { entry, buffer, backend })
        }
    }

    /// One line: the device name and key properties.
    #[doc(hidden)]
    pub fn describe(&self) -> String {
        match self {
            Backend::Cpu(c) => c.describe(),
            Backend::Gpu(g) => g.describe(),
        }
    }

    /// A zero-filled buffer of `bytes` bytes (at least 256-byte aligned).
    pub fn alloc_zeroed(&self, bytes: usize) -> Result<DeviceBuffer> {
        match self {
            Backend::Cpu(c) => DeviceBuffer::cpu_zeroed(bytes, c.id()),
            Backend::Gpu(g) => g.alloc_zeroed(bytes),
        }
    }

    /// A buffer holding a copy of `data`.
    pub fn upload<T: bytemuck::Pod>(&self, data: &[T]) -> Result<DeviceBuffer> {
        let mut b = self.alloc_zeroed(std::mem::size_of_val(data))?;
        b.write(data)?;
        Ok(b)
    }

    /// Waits for all launched work to finish.
    #[doc(hidden)]
    pub fn synchronize(&self) -> Result<()> {
        match self {
            Backend::Cpu(_) => Ok(()),
            Backend::Gpu(g) => g.synchronize(),
        }
    }

    /// Runs kernel `k` of gpuheap's own PTX module with `params` and waits for
    /// it to finish.
    ///
    /// # Safety
    /// Every device address in `params` must be valid for what the kernel
    /// body does with it (each kernel documents this), on this backend: in a
    /// [`DeviceBuffer`] whose [`owner`](DeviceBuffer::owner) is this backend's
    /// [`id`](Self::id) ([`check_owner`](Self::check_owner)), alive until the
    /// launch returns; and memory the kernel writes must not be read or
    /// written by anyone else during the launch (the safe wrappers borrow
    /// such a buffer, or the heap that owns it, mutably).
    pub unsafe fn launch<P: bytemuck::Pod + Sync>(
        &self,
        k: &Kernel<P>,
        cfg: LaunchConfig,
        params: &P,
    ) -> Result<LaunchTiming> {
        cfg.validate()?;
        match self {
            // SAFETY: forwarded contract.
            Backend::Cpu(c) => unsafe { c.launch(k, cfg, params) },
            // SAFETY: forwarded contract.
            Backend::Gpu(g) => unsafe { g.launch(g.builtin()?, k, cfg, params) },
        }
    }

    /// Loads a user PTX module (built by `gpuheap-builder` from a crate that
    /// depends on `gpuheap-kernels`). On the CPU backend there is nothing to
    /// load: kernels run from their [`Kernel`] descriptors.
    pub fn load_module(&self, ptx: &str) -> Result<Option<KernelModule>> {
        match self {
            Backend::Cpu(_) => Ok(None),
            Backend::Gpu(g) => g.load_module(ptx).map(Some),
        }
    }

    /// Like [`Backend::launch`], for a kernel of a user module from
    /// [`Backend::load_module`] (`None` on the CPU backend).
    ///
    /// # Safety
    /// As for [`Backend::launch`].
    #[doc(hidden)]
    pub unsafe fn launch_in<P: bytemuck::Pod + Sync>(
        &self,
        module: Option<&KernelModule>,
        k: &Kernel<P>,
        cfg: LaunchConfig,
        params: &P,
    ) -> Result<LaunchTiming> {
        cfg.validate()?;
        match (self, module) {
            // SAFETY: forwarded contract.
            (Backend::Cpu(c), _) => unsafe { c.launch(k, cfg, params) },
            // SAFETY: forwarded contract.
            (Backend::Gpu(g), Some(m)) => unsafe { g.launch(m, k, cfg, params) },
            (Backend::Gpu(_), None) => {
                Err(BackendError::InvalidArgument(format!("kernel {}: no module given on the GPU backend", k.name())))
            }
        }
    }
}
