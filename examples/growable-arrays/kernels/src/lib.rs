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

use gpuheap_kernels::arch::index::global_thread_id;
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
    /// Thread `i` pushes `1 + (i * 7919) % max_pushes` values.
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
    let n = pushes(i, p.max_pushes);
    let mask = active_mask();
    let mut cap = 4u64;
    // SAFETY: the caller guarantees a live heap; 16 bytes for 4 u32s.
    let mut data = unsafe { heap::malloc(&p.heap, cap * 4) } as *mut u32;
    let mut ok = !data.is_null();
    // Warp-uniform loop: every lane runs until the longest array is done.
    let mut r = 0u64;
    let longest = p.max_pushes;
    while r < longest {
        let grow_me = ok && r < n && r == cap;
        // SAFETY: `mask` holds the lanes that executed the `active_mask`
        // above together, this one among them; each of them runs this loop
        // for the same `longest` iterations (no `return` or `break` inside)
        // and so executes this ballot on every iteration.
        if unsafe { ballot(mask, grow_me) } != 0 {
            // SAFETY: live heap; every lane of `mask` calls malloc here.
            let bigger = unsafe { heap::malloc(&p.heap, if grow_me { cap * 8 } else { 0 }) } as *mut u32;
            if grow_me {
                if bigger.is_null() {
                    ok = false;
                } else {
                    // Copy 16 bytes at a time (cap is a multiple of 4).
                    let mut k = 0;
                    while k < cap / 4 {
                        // SAFETY: both blocks are 16-byte aligned and hold
                        // at least `cap` u32s.
                        unsafe {
                            (bigger as *mut u128).add(k as usize).write((data as *const u128).add(k as usize).read())
                        };
                        k += 1;
                    }
                    // SAFETY: the old block is ours and no longer used.
                    unsafe { heap::free(&p.heap, data as *mut u8) };
                    data = bigger;
                    cap *= 2;
                }
            }
        }
        if ok && r < n {
            // SAFETY: `r < cap` after growing.
            unsafe { data.add(r as usize).write(pattern(i, r)) };
        }
        r += 1;
    }
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
        (p.capacities as *mut u64).add(i as usize).write(cap);
    }
}

gpuheap_kernels::kernel_entry! {
    /// [`grow`] as a kernel.
    pub static GROW: GrowParams = growable_arrays_grow => grow;
}
