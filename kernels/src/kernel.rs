//! The kernel ABI shared by the PTX build and the CPU backend.
//!
//! A gpuheap kernel is a body `unsafe fn(&P)` over one `#[repr(C)]`,
//! plain-old-data parameter struct `P` (device addresses travel as `u64`).
//! [`kernel_entry!`](crate::kernel_entry) turns the body into both
//!
//! * a PTX `.entry` named after the kernel (on `nvptx64`), taking `P` by value,
//!   which the host launches through the CUDA driver; and
//! * a [`Kernel`] descriptor that the host's CPU backend calls once per
//!   emulated thread.
//!
//! User crates that depend on `gpuheap-kernels` use the same macro; their
//! crate root needs `#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]`
//! because the PTX kernel ABI is still unstable (the builder sets
//! `RUSTC_BOOTSTRAP=1` for the nested build only).

/// Describes one kernel: its PTX entry name and its body for the CPU backend.
pub struct Kernel<P: 'static> {
    /// Name of the PTX `.entry` (unmangled).
    pub name: &'static str,
    /// The kernel body; called once per thread with the launch parameters.
    pub body: unsafe fn(&P),
    /// The body calls [`crate::arch::block::sync_threads`], so the CPU backend
    /// must run each block's threads concurrently (lockstep mode).
    pub block_sync: bool,
}

/// Declares a kernel: a [`Kernel`] static for the host and, on `nvptx64`, an
/// `extern "ptx-kernel"` entry point calling the body.
///
/// ```ignore
/// gpuheap_kernels::kernel_entry! {
///     /// Fills a buffer.
///     pub static FILL: FillParams = gpuheap_fill => fill;
/// }
/// ```
/// Add `, block_sync` after the body path when the body uses `sync_threads`.
///
/// # Safety contract of the body
/// The body is an `unsafe fn`: the launcher guarantees only the launch
/// geometry; the parameter struct's pointers must be valid for what the body
/// does with them, which each kernel documents.
#[macro_export]
macro_rules! kernel_entry {
    ($(#[$m:meta])* $vis:vis static $k:ident : $p:ty = $entry:ident => $body:path $(, $bs:ident)? ;) => {
        $(#[$m])*
        $vis static $k: $crate::Kernel<$p> = $crate::Kernel {
            name: stringify!($entry),
            body: $body,
            block_sync: $crate::kernel_entry!(@bs $($bs)?),
        };

        #[cfg(target_arch = "nvptx64")]
        #[no_mangle]
        #[doc(hidden)]
        pub unsafe extern "ptx-kernel" fn $entry(params: $p) {
            // SAFETY: forwarded to the kernel body, whose contract the host
            // launcher upholds.
            unsafe { $body(&params) }
        }
    };
    (@bs) => { false };
    (@bs block_sync) => { true };
}
