//! GPU-scoped atomics with explicit memory semantics.
//!
//! On `nvptx64` every operation is one inline-PTX instruction with `.gpu`
//! scope and the semantics you name (`atom.acq_rel.gpu.add.u32`,
//! `ld.acquire.gpu.u32`, `fence.acq_rel.gpu`, …). [`AtomicU32`] and
//! [`AtomicU64`] take a *generic* address, so the same cell works in global
//! and shared memory; ptxas then emits, for every operation, a test of the
//! address space with a shared-memory emulation (`ATOMS.CAST.SPIN`) and a
//! local-memory path beside the global atomic. [`GlobalU32`] and
//! [`GlobalU64`] are the same API for cells known to be in global memory
//! (`atom.*.gpu.global`, the address converted with `cvta.to.global`, which
//! costs nothing): one instruction each, no fallback paths. The device heap's
//! metadata is always global memory and uses them. We do not use
//! `core::sync::atomic` there: rustc/LLVM drops the ordering of every
//! read-modify-write except compare-and-swap and makes every ordered access
//! system-scoped (rust-lang/rust#136480; see
//! DESIGN.md §3.6).
//!
//! On the host the same API maps to `core::sync::atomic` (or to `loom` under
//! `--cfg loom`, to `shuttle` under `--cfg shuttle`), whose C++20 model is at
//! least as strong as PTX's scoped model for a single `.gpu` scope.
//!
//! All four have the layout of `u32` / `u64` (except under loom or shuttle),
//! so a kernel can view device memory as atomics with [`AtomicU32::from_ptr`]
//! (or [`GlobalU64::from_ptr`], whose contract adds: the cell is in global
//! memory).

/// Memory semantics of an atomic operation (PTX `.relaxed`, `.acquire`,
/// `.release`, `.acq_rel`; all with `.gpu` scope on the device).
///
/// A load given `Release` or `AcqRel` is performed as `Acquire`; a store given
/// `Acquire` or `AcqRel` as `Release` (PTX has no other forms).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ordering {
    /// No ordering; atomicity only.
    Relaxed,
    /// Later accesses of this thread are not moved before it.
    Acquire,
    /// Earlier accesses of this thread are not moved after it.
    Release,
    /// Both acquire and release.
    AcqRel,
}

#[cfg(not(any(target_arch = "nvptx64", loom, shuttle)))]
use core::sync::atomic as host_atomic;
#[cfg(all(loom, not(target_arch = "nvptx64")))]
use loom::sync::atomic as host_atomic;
#[cfg(all(shuttle, not(loom), not(target_arch = "nvptx64")))]
use shuttle::sync::atomic as host_atomic;

#[cfg(not(target_arch = "nvptx64"))]
impl Ordering {
    fn rmw(self) -> host_atomic::Ordering {
        match self {
            Ordering::Relaxed => host_atomic::Ordering::Relaxed,
            Ordering::Acquire => host_atomic::Ordering::Acquire,
            Ordering::Release => host_atomic::Ordering::Release,
            Ordering::AcqRel => host_atomic::Ordering::AcqRel,
        }
    }
    fn load(self) -> host_atomic::Ordering {
        match self {
            Ordering::Relaxed => host_atomic::Ordering::Relaxed,
            _ => host_atomic::Ordering::Acquire,
        }
    }
    fn store(self) -> host_atomic::Ordering {
        match self {
            Ordering::Relaxed => host_atomic::Ordering::Relaxed,
            _ => host_atomic::Ordering::Release,
        }
    }
    fn cas_failure(self) -> host_atomic::Ordering {
        match self {
            Ordering::Acquire | Ordering::AcqRel => host_atomic::Ordering::Acquire,
            _ => host_atomic::Ordering::Relaxed,
        }
    }
}

/// Emits `$asm` with the semantics suffix chosen by `$ord` (a constant after
/// inlining, so only one arm survives). `$space` is `generic` (a generic
/// address) or `global`; a global access first converts the generic pointer
/// operand `{p}` with `cvta.to.global` (free) into the block-local register
/// `%g`, which the instruction addresses either way.
#[cfg(target_arch = "nvptx64")]
macro_rules! by_sem {
    ($space:ident, $ord:expr, $pre:literal, $post:expr, $($args:tt)*) => {
        match $ord {
            Ordering::Relaxed => by_sem!(@one $space, $pre, ".relaxed.gpu", $post, $($args)*),
            Ordering::Acquire => by_sem!(@one $space, $pre, ".acquire.gpu", $post, $($args)*),
            Ordering::Release => by_sem!(@one $space, $pre, ".release.gpu", $post, $($args)*),
            Ordering::AcqRel => by_sem!(@one $space, $pre, ".acq_rel.gpu", $post, $($args)*),
        }
    };
    (@one generic, $pre:literal, $sem:literal, $post:expr, $($args:tt)*) => {
        core::arch::asm!(concat!("{{ .reg .b64 %g; mov.b64 %g, {p}; ", $pre, $sem, $post, " }}"), $($args)*)
    };
    (@one global, $pre:literal, $sem:literal, $post:expr, $($args:tt)*) => {
        core::arch::asm!(concat!("{{ .reg .b64 %g; cvta.to.global.u64 %g, {p}; ", $pre, $sem, ".global", $post, " }}"), $($args)*)
    };
}

macro_rules! atomic_int {
    ($name:ident, $int:ty, $host:ident, $reg:ident, $b:literal, $u:literal, $space:ident, $what:literal, $where:literal) => {
        #[doc = concat!("A `", stringify!($int), "` updated with GPU-scoped atomics on a ", $what, " address (see the [module docs](self)).")]
        #[cfg_attr(not(any(loom, shuttle)), repr(transparent))]
        pub struct $name {
            #[cfg(target_arch = "nvptx64")]
            v: core::cell::UnsafeCell<$int>,
            #[cfg(not(target_arch = "nvptx64"))]
            v: host_atomic::$host,
        }

        // SAFETY: every access to the cell goes through an atomic instruction.
        unsafe impl Sync for $name {}

        impl $name {
            /// A new atomic holding `v`.
            #[cfg(not(any(loom, shuttle)))]
            pub const fn new(v: $int) -> Self {
                Self {
                    #[cfg(target_arch = "nvptx64")]
                    v: core::cell::UnsafeCell::new(v),
                    #[cfg(not(target_arch = "nvptx64"))]
                    v: host_atomic::$host::new(v),
                }
            }

            /// A new atomic holding `v` (model-checking build).
            #[cfg(any(loom, shuttle))]
            pub fn new(v: $int) -> Self {
                Self { v: host_atomic::$host::new(v) }
            }

            /// Views the integer at `p` as an atomic.
            ///
            /// # Safety
            #[doc = concat!("`p` is non-null, aligned to `align_of::<", stringify!($int), ">()`, valid for reads and")]
            #[doc = concat!("writes for `'a`, ", $where, "and every concurrent access to it is atomic.")]
            #[cfg(not(any(loom, shuttle)))]
            #[inline(always)]
            pub unsafe fn from_ptr<'a>(p: *mut $int) -> &'a Self {
                // SAFETY: `Self` is `repr(transparent)` over a cell of the
                // same layout as the integer; the caller vouches for `p`.
                unsafe { &*(p as *const Self) }
            }

            #[cfg(target_arch = "nvptx64")]
            #[inline(always)]
            fn ptr(&self) -> *mut $int {
                self.v.get()
            }

            /// Atomic load (`ld.{relaxed,acquire}.gpu`).
            #[inline(always)]
            pub fn load(&self, ord: Ordering) -> $int {
                #[cfg(target_arch = "nvptx64")]
                {
                    let r: $int;
                    let p = self.ptr();
                    let ord = match ord { Ordering::Relaxed => Ordering::Relaxed, _ => Ordering::Acquire };
                    // SAFETY: `p` points to this live, aligned cell.
                    unsafe { by_sem!($space, ord, "ld", concat!(".", $u, " {r}, [%g];"), r = out($reg) r, p = in(reg64) p, options(nostack)) };
                    r
                }
                #[cfg(not(target_arch = "nvptx64"))]
                {
                    #[cfg(not(any(loom, shuttle)))]
                    super::emu::preempt();
                    self.v.load(ord.load())
                }
            }

            /// Atomic store (`st.{relaxed,release}.gpu`).
            #[inline(always)]
            pub fn store(&self, v: $int, ord: Ordering) {
                #[cfg(target_arch = "nvptx64")]
                {
                    let p = self.ptr();
                    let ord = match ord { Ordering::Relaxed => Ordering::Relaxed, _ => Ordering::Release };
                    // SAFETY: `p` points to this live, aligned cell.
                    unsafe { by_sem!($space, ord, "st", concat!(".", $u, " [%g], {v};"), p = in(reg64) p, v = in($reg) v, options(nostack)) };
                }
                #[cfg(not(target_arch = "nvptx64"))]
                {
                    #[cfg(not(any(loom, shuttle)))]
                    super::emu::preempt();
                    self.v.store(v, ord.store())
                }
            }

            atomic_int!(@rmw $space, $int, $reg, fetch_add, "add", $u, "Adds `v` (wrapping); returns the previous value.");
            atomic_int!(@rmw $space, $int, $reg, fetch_or, "or", $b, "Bitwise or with `v`; returns the previous value.");
            atomic_int!(@rmw $space, $int, $reg, fetch_and, "and", $b, "Bitwise and with `v`; returns the previous value.");
            atomic_int!(@rmw $space, $int, $reg, fetch_max, "max", $u, "Unsigned maximum with `v`; returns the previous value.");
            atomic_int!(@rmw $space, $int, $reg, fetch_min, "min", $u, "Unsigned minimum with `v`; returns the previous value.");
            atomic_int!(@rmw $space, $int, $reg, swap, "exch", $b, "Stores `v`; returns the previous value.");

            /// Subtracts `v` (wrapping); returns the previous value.
            #[inline(always)]
            pub fn fetch_sub(&self, v: $int, ord: Ordering) -> $int {
                self.fetch_add(v.wrapping_neg(), ord)
            }

            /// Stores `new` if the value is `current` (`atom.cas`). Returns
            /// `Ok(previous)` on success and `Err(actual)` otherwise. The
            /// semantics apply to both outcomes (on the host, a failed exchange
            /// is an acquire when `ord` includes acquire, else relaxed).
            #[inline(always)]
            pub fn compare_exchange(&self, current: $int, new: $int, ord: Ordering) -> Result<$int, $int> {
                #[cfg(target_arch = "nvptx64")]
                {
                    let r: $int;
                    let p = self.ptr();
                    // SAFETY: `p` points to this live, aligned cell.
                    unsafe { by_sem!($space, ord, "atom", concat!(".cas.", $b, " {r}, [%g], {c}, {n};"), r = out($reg) r, p = in(reg64) p, c = in($reg) current, n = in($reg) new, options(nostack)) };
                    if r == current { Ok(r) } else { Err(r) }
                }
                #[cfg(not(target_arch = "nvptx64"))]
                {
                    #[cfg(not(any(loom, shuttle)))]
                    super::emu::preempt();
                    self.v.compare_exchange(current, new, ord.rmw(), ord.cas_failure())
                }
            }
        }
    };
    (@rmw $space:ident, $int:ty, $reg:ident, $fn:ident, $op:literal, $ty:literal, $doc:literal) => {
        #[doc = $doc]
        #[inline(always)]
        pub fn $fn(&self, v: $int, ord: Ordering) -> $int {
            #[cfg(target_arch = "nvptx64")]
            {
                let r: $int;
                let p = self.ptr();
                // SAFETY: `p` points to this live, aligned cell.
                unsafe { by_sem!($space, ord, "atom", concat!(".", $op, ".", $ty, " {r}, [%g], {v};"), r = out($reg) r, p = in(reg64) p, v = in($reg) v, options(nostack)) };
                r
            }
            #[cfg(not(target_arch = "nvptx64"))]
            {
                #[cfg(not(any(loom, shuttle)))]
                super::emu::preempt();
                self.v.$fn(v, ord.rmw())
            }
        }
    };
}

atomic_int!(AtomicU32, u32, AtomicU32, reg32, "b32", "u32", generic, "generic (global or shared)", "");
atomic_int!(AtomicU64, u64, AtomicU64, reg64, "b64", "u64", generic, "generic (global or shared)", "");
atomic_int!(
    GlobalU32,
    u32,
    AtomicU32,
    reg32,
    "b32",
    "u32",
    global,
    "global-memory",
    "in global memory (device memory from the driver's allocator), "
);
atomic_int!(
    GlobalU64,
    u64,
    AtomicU64,
    reg64,
    "b64",
    "u64",
    global,
    "global-memory",
    "in global memory (device memory from the driver's allocator), "
);

/// A memory fence with `.gpu` scope: `fence.acq_rel.gpu` for every ordering
/// but `Relaxed`, which emits nothing.
#[inline(always)]
pub fn fence(ord: Ordering) {
    if ord == Ordering::Relaxed {
        return;
    }
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: a fence has no operands and no preconditions.
    unsafe {
        core::arch::asm!("fence.acq_rel.gpu;", options(nostack))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    host_atomic::fence(ord.rmw());
}

/// A sequentially consistent fence with `.gpu` scope (`fence.sc.gpu`).
#[inline(always)]
pub fn fence_seq_cst() {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: a fence has no operands and no preconditions.
    unsafe {
        core::arch::asm!("fence.sc.gpu;", options(nostack))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    host_atomic::fence(host_atomic::Ordering::SeqCst);
}

#[cfg(all(test, not(loom), not(shuttle)))]
mod tests {
    use super::*;

    #[test]
    fn rmw_operations_return_previous_value() {
        let a = AtomicU32::new(5);
        assert_eq!(a.fetch_add(3, Ordering::AcqRel), 5);
        assert_eq!(a.fetch_sub(1, Ordering::Relaxed), 8);
        assert_eq!(a.fetch_or(0x10, Ordering::Release), 7);
        assert_eq!(a.fetch_and(0x13, Ordering::Acquire), 0x17);
        assert_eq!(a.fetch_max(100, Ordering::Relaxed), 0x13);
        assert_eq!(a.fetch_min(9, Ordering::Relaxed), 100);
        assert_eq!(a.swap(1, Ordering::AcqRel), 9);
        assert_eq!(a.compare_exchange(2, 3, Ordering::AcqRel), Err(1));
        assert_eq!(a.compare_exchange(1, 3, Ordering::AcqRel), Ok(1));
        assert_eq!(a.load(Ordering::Acquire), 3);
    }

    #[test]
    fn from_ptr_aliases_plain_memory() {
        let mut words = [0u64; 2];
        // SAFETY: `words[1]` is aligned, live for the borrow and only
        // accessed through the atomic view below.
        let a = unsafe { AtomicU64::from_ptr(words.as_mut_ptr().add(1)) };
        a.store(u64::MAX - 1, Ordering::Release);
        assert_eq!(a.fetch_add(2, Ordering::Relaxed), u64::MAX - 1);
        assert_eq!(words, [0, 0]);
    }
}
