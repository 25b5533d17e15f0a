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
///
/// Built only by [`kernel_entry!`](crate::kernel_entry), which declares the
/// PTX entry and the descriptor from the same tokens, so the name the GPU
/// backend launches and the body the CPU backend runs cannot disagree. The
/// fields are private; a descriptor cannot be written by hand:
///
/// ```compile_fail,E0451
/// # use gpuheap_kernels::Kernel;
/// unsafe fn body(_: &u64) {}
/// // error[E0451]: the fields of `Kernel` are private
/// static K: Kernel<u64> = Kernel { name: "gpuheap_fill", body, block_sync: false };
/// ```
pub struct Kernel<P: 'static> {
    name: &'static str,
    body: unsafe fn(&P),
    block_sync: bool,
}

impl<P: 'static> Kernel<P> {
    /// The constructor behind [`kernel_entry!`](crate::kernel_entry); not
    /// for direct use.
    ///
    /// # Safety
    /// `name` is the unmangled name of a PTX `.entry` that takes `P` by
    /// value and calls `body` with it, and `block_sync` is `true` when `body`
    /// calls [`crate::arch::block::sync_threads`].
    #[doc(hidden)]
    pub const unsafe fn from_entry(name: &'static str, body: unsafe fn(&P), block_sync: bool) -> Self {
        Kernel { name, body, block_sync }
    }

    /// Name of the PTX `.entry` (unmangled).
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// The kernel body, called once per emulated thread with the launch
    /// parameters by the CPU backend.
    pub const fn body(&self) -> unsafe fn(&P) {
        self.body
    }

    /// The body calls [`crate::arch::block::sync_threads`], so the CPU
    /// backend must run each block's threads concurrently.
    pub const fn block_sync(&self) -> bool {
        self.block_sync
    }
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
        // SAFETY: the entry below is named `$entry`, takes `$p` by value and
        // calls `$body`; `block_sync` is declared by the kernel's author.
        $vis static $k: $crate::Kernel<$p> = unsafe {
            $crate::Kernel::from_entry(stringify!($entry), $body, $crate::kernel_entry!(@bs $($bs)?))
        };

        $crate::__ptx_entry! {
            #[cfg(target_arch = "nvptx64")]
            #[no_mangle]
            #[doc(hidden)]
            pub unsafe extern "ptx-kernel" fn $entry(params: $p) {
                // SAFETY: forwarded to the kernel body, whose contract the host
                // launcher upholds.
                unsafe { $body(&params) }
            }
        }
    };
    (@bs) => { false };
    (@bs block_sync) => { true };
}

/// The PTX `.entry` of a [`kernel_entry!`](crate::kernel_entry): expands to
/// its input, or to nothing when this crate is built with the feature
/// `device-library` (the relocatable device library for CUDA C/C++ exports
/// the C ABI functions of [`crate::capi`] and no kernel). A macro of this
/// crate, so the feature is read here and not in a dependent crate.
#[cfg(not(feature = "device-library"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __ptx_entry {
    ($($item:tt)*) => { $($item)* };
}

/// See the other definition (this one: the `device-library` build).
#[cfg(feature = "device-library")]
#[doc(hidden)]
#[macro_export]
macro_rules! __ptx_entry {
    ($($item:tt)*) => {};
}
