//! [`DeviceBuffer`]: memory that kernels address by a `u64` device pointer.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use super::{BackendError, BackendId, Result};

/// Alignment of CPU-backend buffers, bytes (`cudaMalloc` guarantees 256).
pub const CPU_BUFFER_ALIGN: usize = 256;

/// A buffer of device memory (GPU) or of emulated device memory (CPU).
///
/// Kernels receive its [`device_ptr`](Self::device_ptr). Host access is by
/// copy ([`read`](Self::read), [`write`](Self::write)), never by reference,
/// because kernels may write it concurrently from other threads.
///
/// It knows its owner ([`owner`](Self::owner)): the backends it may be used
/// with are those of that identity (see [`BackendId`]).
pub struct DeviceBuffer {
    inner: Inner,
    len: usize,
    owner: BackendId,
}

enum Inner {
    /// `ptr` is `alloc` rounded up to [`CPU_BUFFER_ALIGN`]; `alloc` was allocated with `layout`.
    Cpu {
        ptr: NonNull<u8>,
        alloc: NonNull<u8>,
        layout: Layout,
    },
    Gpu {
        slice: CudaSlice<u8>,
        stream: Arc<CudaStream>,
    },
}

// SAFETY: a CPU buffer is a plain heap allocation owned by this value and only
// accessed through raw pointers (by kernels during launches, by copies
// otherwise); a GPU buffer is a cudarc slice, itself Send + Sync.
unsafe impl Send for DeviceBuffer {}
// SAFETY: see `Send`; `&DeviceBuffer` only hands out the address and copies.
unsafe impl Sync for DeviceBuffer {}

impl DeviceBuffer {
    /// A zeroed host buffer aligned to [`CPU_BUFFER_ALIGN`]. It is allocated
    /// with the system's natural alignment and `CPU_BUFFER_ALIGN` spare bytes
    /// (then aligned by hand), so that the allocator can use `calloc`: large
    /// buffers come as fresh, lazily zeroed pages, and memory no kernel
    /// touches (most of a device heap's data region) is never committed. An
    /// over-aligned `alloc_zeroed` would write every byte instead.
    pub(super) fn cpu_zeroed(len: usize, owner: BackendId) -> Result<Self> {
        let too_large = || BackendError::InvalidArgument(format!("buffer of {len} bytes is too large"));
        let size = len.max(1).checked_add(CPU_BUFFER_ALIGN).ok_or_else(too_large)?;
        let layout = Layout::from_size_align(size, 16).map_err(|_| too_large())?;
        // SAFETY: `layout` has a non-zero size.
        let alloc = unsafe { std::alloc::alloc_zeroed(layout) };
        let alloc = NonNull::new(alloc)
            .ok_or_else(|| BackendError::InvalidArgument(format!("host allocation of {len} bytes failed")))?;
        let pad = alloc.as_ptr().align_offset(CPU_BUFFER_ALIGN);
        // SAFETY: `pad < CPU_BUFFER_ALIGN`, so `ptr .. ptr + len` lies inside the `size`-byte allocation.
        let ptr = unsafe { NonNull::new_unchecked(alloc.as_ptr().add(pad)) };
        Ok(Self { inner: Inner::Cpu { ptr, alloc, layout }, len, owner })
    }

    pub(super) fn gpu(slice: CudaSlice<u8>, stream: Arc<CudaStream>, len: usize, owner: BackendId) -> Self {
        Self { inner: Inner::Gpu { slice, stream }, len, owner }
    }

    /// The identity of the backend that allocated the buffer: it may be used with backends of this
    /// identity only ([`Backend::check_owner`](super::Backend::check_owner)).
    #[doc(hidden)]
    pub fn owner(&self) -> BackendId {
        self.owner
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` when the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address kernels use (a host address on the CPU backend).
    pub fn device_ptr(&self) -> u64 {
        match &self.inner {
            Inner::Cpu { ptr, .. } => ptr.as_ptr() as u64,
            Inner::Gpu { slice, stream } => slice.device_ptr(stream).0,
        }
    }

    /// The device address of byte `offset` (checked against the length).
    #[doc(hidden)]
    pub fn device_ptr_at(&self, offset: usize) -> Result<u64> {
        if offset > self.len {
            return Err(BackendError::InvalidArgument(format!("offset {offset} past a {}-byte buffer", self.len)));
        }
        Ok(self.device_ptr() + offset as u64)
    }

    /// Copies the whole buffer to the host as `T`s (`len` must be a multiple
    /// of `size_of::<T>()`).
    pub fn read<T: bytemuck::Pod>(&self) -> Result<Vec<T>> {
        let n = self.elems::<T>()?;
        let mut out = vec![T::zeroed(); n];
        self.read_into(0, bytemuck::cast_slice_mut(&mut out))?;
        Ok(out)
    }

    /// Copies `dst.len()` bytes starting at byte `offset` to `dst`.
    #[doc(hidden)]
    pub fn read_into(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check_range(offset, dst.len())?;
        match &self.inner {
            // SAFETY: the range was checked. Nobody writes it now: host
            // writes take `&mut self`, and a launch that writes a buffer
            // needs it (or the heap that owns it) borrowed mutably by the
            // safe wrappers (`ops::fill`, `ops::touch_batch`, `ops::churn`),
            // or the caller's promise under `Backend::launch`'s contract.
            Inner::Cpu { ptr, .. } => unsafe {
                std::ptr::copy_nonoverlapping(ptr.as_ptr().add(offset), dst.as_mut_ptr(), dst.len())
            },
            Inner::Gpu { slice, stream } => {
                let view = slice.slice(offset..offset + dst.len());
                stream.memcpy_dtoh(&view, dst).map_err(|e| super::gpu::driver("cuMemcpyDtoH", e))?;
                stream.synchronize().map_err(|e| super::gpu::driver("cuStreamSynchronize", e))?;
            }
        }
        Ok(())
    }

    /// Overwrites the start of the buffer with `data`.
    pub fn write<T: bytemuck::Pod>(&mut self, data: &[T]) -> Result<()> {
        self.write_at(0, bytemuck::cast_slice(data))
    }

    /// Copies `src` into the buffer at byte `offset`.
    #[doc(hidden)]
    pub fn write_at(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        self.check_range(offset, src.len())?;
        match &mut self.inner {
            // SAFETY: the range was checked and `&mut self` excludes launches.
            Inner::Cpu { ptr, .. } => unsafe {
                std::ptr::copy_nonoverlapping(src.as_ptr(), ptr.as_ptr().add(offset), src.len())
            },
            Inner::Gpu { slice, stream } => {
                let mut view = slice.slice_mut(offset..offset + src.len());
                stream.memcpy_htod(src, &mut view).map_err(|e| super::gpu::driver("cuMemcpyHtoD", e))?;
                stream.synchronize().map_err(|e| super::gpu::driver("cuStreamSynchronize", e))?;
            }
        }
        Ok(())
    }

    /// Sets every byte to zero.
    #[doc(hidden)]
    pub fn zero(&mut self) -> Result<()> {
        match &mut self.inner {
            // SAFETY: the allocation holds `len` bytes; `&mut self` excludes launches.
            Inner::Cpu { ptr, .. } => unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, self.len) },
            Inner::Gpu { slice, stream } => {
                stream.memset_zeros(slice).map_err(|e| super::gpu::driver("cuMemsetD8", e))?;
                stream.synchronize().map_err(|e| super::gpu::driver("cuStreamSynchronize", e))?;
            }
        }
        Ok(())
    }

    fn elems<T>(&self) -> Result<usize> {
        let s = std::mem::size_of::<T>().max(1);
        if !self.len.is_multiple_of(s) {
            return Err(BackendError::InvalidArgument(format!(
                "{}-byte buffer is not a whole number of {s}-byte items",
                self.len
            )));
        }
        Ok(self.len / s)
    }

    fn check_range(&self, offset: usize, n: usize) -> Result<()> {
        match offset.checked_add(n) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(BackendError::InvalidArgument(format!("bytes {offset}..+{n} out of a {}-byte buffer", self.len))),
        }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if let Inner::Cpu { alloc, layout, .. } = &self.inner {
            // SAFETY: allocated in `cpu_zeroed` with this layout, freed once.
            unsafe { std::alloc::dealloc(alloc.as_ptr(), *layout) }
        }
    }
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.inner {
            Inner::Cpu { .. } => "cpu",
            Inner::Gpu { .. } => "gpu",
        };
        write!(f, "DeviceBuffer({kind}, {} bytes @ {:#x})", self.len, self.device_ptr())
    }
}
