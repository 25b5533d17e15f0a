//! gpuheap's own PTX module and the device library for CUDA C/C++, embedded at
//! build time by `host/build.rs`.

use crate::backend::BackendError;

/// The PTX text of `gpuheap-kernels` (`.target sm_80`, loads on Ampere and
/// Hopper), or an empty string when the build had no nvptx toolchain.
pub const KERNELS_PTX: &str = include_str!(env!("GPUHEAP_PTX_PATH"));

/// Why [`KERNELS_PTX`] is empty (empty when it was built).
pub const PTX_MISSING_REASON: &str = env!("GPUHEAP_PTX_MISSING");

/// The relocatable device library for CUDA C/C++ kernels: `gpuheap-kernels`
/// built with its feature `device-library`, a PTX module (`.target sm_80`)
/// whose only symbols are the `.visible .func`s `gpuheap_malloc`,
/// `gpuheap_free`, `gpuheap_handle_alloc`, `gpuheap_handle_resolve` and
/// `gpuheap_handle_free` (`gpuheap_kernels::capi`). Link it as a PTX input
/// with a kernel compiled with `-rdc=true` (nvJitLink, `cuLinkAddData`, or
/// `ptxas -c` and nvlink); [`CUDA_HEADER`] declares the functions. Empty when
/// the build had no nvptx toolchain (as [`KERNELS_PTX`]).
pub const DEVICE_LIBRARY_PTX: &str = include_str!(env!("GPUHEAP_DEVICE_LIBRARY_PATH"));

/// `gpuheap.cuh`, the CUDA C/C++ header of [`DEVICE_LIBRARY_PTX`]: the
/// functions, their contract and the heap descriptor `gpuheap_heap` (the
/// bytes of [`crate::device_heap::DeviceHeap::handle`]).
pub const CUDA_HEADER: &str = include_str!(env!("GPUHEAP_CUDA_HEADER_PATH"));

/// The rustup command that installs the nvptx kernel toolchain (the same as
/// `gpuheap_builder::INSTALL_COMMAND`, which is a build dependency only).
pub const INSTALL_COMMAND: &str = "rustup component add rust-src llvm-tools llvm-bitcode-linker";

/// The PTX, or [`BackendError::NoPtx`] naming the reason and the install command.
pub fn kernels_ptx() -> Result<&'static str, BackendError> {
    if KERNELS_PTX.is_empty() {
        Err(BackendError::NoPtx {
            reason: if PTX_MISSING_REASON.is_empty() { "unknown".into() } else { PTX_MISSING_REASON.into() },
            install: INSTALL_COMMAND,
        })
    } else {
        Ok(KERNELS_PTX)
    }
}
