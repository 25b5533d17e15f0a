//! Per-thread growable arrays on the gpuheap device heap (a user kernel in
//! its own crate).
//!
//! Thread `i` pushes `pushes(i)` `u32` values into an array that starts with
//! room for 4 and doubles when full: allocate the larger block, copy with
//! 16-byte loads/stores (vectorised copies need the heap's 16-byte
//! alignment), free the old block. At the end it checks every element,
//! stores a checksum and its final capacity, and frees the array.
//!
//! `malloc` is warp-collective, so the growth step is made warp-uniform: in
//! each iteration the warp votes whether any lane must grow, and if so every
//! lane calls `malloc` (with 0 bytes when it needs nothing). `free` is not
//! collective.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]

use gpuheap_kernels::arch::index::{global_thread_id, global_thread_id_reread};
use gpuheap_kernels::arch::warp::{active_mask, ballot};
use gpuheap_kernels::fill::pattern;
use gpuheap_kernels::heap::{self, Heap};

/// Parameters of [`GROW`].
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct GrowParams {
    /// The device heap.
    pub heap: Heap,
    /// Threads that take part.
    pub threads: u64,
    /// Thread `i` pushes `1 + (i * 7919) % max_pushes` values (at most
    /// `u32::MAX`: above it every thread reports a failure).
    pub max_pushes: u64,
    /// Device address of `threads` `u64` checksums (0 = a failure happened).
    pub checksums: u64,
    /// Device address of `threads` `u64` final capacities (elements).
    pub capacities: u64,
}

/// Values thread `i` pushes.
pub fn pushes(i: u64, max_pushes: u64) -> u64 {
    1 + (i.wrapping_mul(7919)) % max_pushes.max(1)
}

/// The checksum thread `i` reports (computed the same way on the host).
pub fn checksum(i: u64, n: u64) -> u64 {
    let mut s = n;
    let mut r = 0;
    while r < n {
        s = s.wrapping_mul(31).wrapping_add(pattern(i, r) as u64);
        r += 1;
    }
    s | 1
}

/// The kernel body. `#[inline(always)]`: a body that calls `malloc` is
/// inlined into its entry, so that the heap's geometry is read from the
/// kernel parameter (a body that is not inlined receives the parameters
/// through local memory: a stack frame).
///
/// # Safety
/// `heap` is a live heap; `checksums` and `capacities` address `threads`
/// writable `u64`s.
#[inline(always)]
pub unsafe fn grow(p: &GrowParams) {
    let i = global_thread_id();
    if i >= p.threads {
        return;
    }
    let mask = active_mask();
    let mut cap = 4u32;
    // Allocated in the loop's first iteration: one `malloc` call site (each
    // site is a copy of the allocator, and registers are the kernel's most).
    let mut data = core::ptr::null_mut::<u32>();
    // 32-bit round and capacity: fewer registers live across `malloc` (an
    // array of 2^32 `u32`s would be 16 GiB per thread; more pushes fail).
    let mut ok = p.max_pushes <= u32::MAX as u64;
    // Warp-uniform loop: every lane runs until the longest array is done
    // (at least once: `n >= 1`).
    let mut r = 0u32;
    let longest = p.max_pushes.clamp(1, u32::MAX as u64) as u32;
    // Only the array's state and the round are kept across `malloc`: the
    // thread index and its push count are read again after it (a kernel
    // pays `malloc`'s registers plus what it keeps live across the call).
    while r < longest {
        let pushing = (r as u64) < pushes(global_thread_id_reread(), p.max_pushes);
        let first = data.is_null();
        let grow_me = ok && (first || (pushing && r == cap));
        // SAFETY: `mask` holds the lanes that executed the `active_mask`
        // above together, this one among them; each of them runs this loop
        // for the same `longest` iterations (no `return` or `break` inside)
        // and so executes this ballot on every iteration.
        if unsafe { ballot(mask, grow_me) } != 0 {
            // (A capacity that would wrap asks for 0 bytes: null, a failure.)
            let want = if first { cap } else { cap.wrapping_mul(2) };
            // SAFETY: live heap; every lane of `mask` calls malloc here.
            let bigger = unsafe { heap::malloc(&p.heap, if grow_me { want as u64 * 4 } else { 0 }) } as *mut u32;
            if grow_me {
                if bigger.is_null() {
                    ok = false;
                } else {
                    // Copy 16 bytes at a time (cap is a multiple of 4).
                    let mut k = 0;
                    while !first && k < cap / 4 {
                        // SAFETY: both blocks are 16-byte aligned and hold
                        // at least `cap` u32s.
                        unsafe {
                            (bigger as *mut u128).add(k as usize).write((data as *const u128).add(k as usize).read())
                        };
                        k += 1;
                    }
                    // SAFETY: the old block is ours and no longer used
                    // (null, the first time, is ignored).
                    unsafe { heap::free(&p.heap, data as *mut u8) };
                    data = bigger;
                    cap = want;
                }
            }
        }
        if ok && pushing {
            // SAFETY: `r < cap` after growing.
            unsafe { data.add(r as usize).write(pattern(global_thread_id_reread(), r as u64)) };
        }
        r += 1;
    }
    let i = global_thread_id_reread();
    let n = pushes(i, p.max_pushes);
    let mut sum = 0;
    if ok {
        let mut s = n;
        let mut k = 0;
        while k < n {
            // SAFETY: `k < n <= cap`.
            s = s.wrapping_mul(31).wrapping_add(unsafe { data.add(k as usize).read() } as u64);
            k += 1;
        }
        sum = s | 1;
    }
    // SAFETY: ours (null is ignored).
    unsafe { heap::free(&p.heap, data as *mut u8) };
    // SAFETY: `i < threads`.
    unsafe {
        (p.checksums as *mut u64).add(i as usize).write(sum);
        (p.capacities as *mut u64).add(i as usize).write(cap as u64);
    }
}

gpuheap_kernels::kernel_entry! {
    /// [`grow`] as a kernel.
    pub static GROW: GrowParams = growable_arrays_grow => grow;
}
