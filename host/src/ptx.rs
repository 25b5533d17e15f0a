//! gpuheap's own PTX module, embedded at build time by `host/build.rs`.

use crate::backend::BackendError;

/// The PTX text of `gpuheap-kernels` (`.target sm_80`, loads on Ampere and
/// Hopper), or an empty string when the build had no nvptx toolchain.
pub const KERNELS_PTX: &str = include_str!(env!("GPUHEAP_PTX_PATH"));

/// Why [`KERNELS_PTX`] is empty (empty when it was built).
pub const PTX_MISSING_REASON: &str = env!("GPUHEAP_PTX_MISSING");

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
