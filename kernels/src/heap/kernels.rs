//! Thin kernels over [`super::malloc`] and [`super::free`], used by the host
//! wrappers (`gpuheap::device_heap`), the tests, the benchmarks and the PTX
//! budget check (`gpuheap_heap_malloc` and `gpuheap_heap_free` are the
//! register counts to watch).
//!
//! Every kernel is a grid over `threads` threads (extra threads return at
//! once); device addresses travel as `u64`.

use super::Heap;
use crate::arch::atomic::{GlobalU64, Ordering};
use crate::arch::index::{global_thread_id, global_thread_id_reread};
use crate::fill::pattern;

/// Parameters of [`HEAP_MALLOC`] (and of the CUDA-malloc baseline kernels).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct MallocParams {
    /// The heap.
    pub heap: Heap,
    /// Device address of `threads` `u64` sizes, or 0 to use `size` for all.
    pub sizes: u64,
    /// Bytes per allocation when `sizes` is 0.
    pub size: u64,
    /// Threads in the grid that take part.
    pub threads: u64,
    /// Device address of `threads` `u64` results (pointer or 0).
    pub out: u64,
    /// 1: warp-based (only threads `i % 32 == 0` allocate; the others store 0).
    pub warp_mode: u64,
}

/// Parameters of [`HEAP_FREE`].
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct FreeParams {
    /// The heap.
    pub heap: Heap,
    /// Device address of `threads` `u64` pointers (0 entries are skipped by `free`).
    pub ptrs: u64,
    /// Threads that take part.
    pub threads: u64,
    /// Thread `i` frees `ptrs[(i * stride) % threads]` (`stride` coprime with
    /// `threads` makes it a permutation: frees by other threads and blocks
    /// than the allocating ones).
    pub stride: u64,
}

/// Parameters of [`HEAP_TOUCH`].
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct TouchParams {
    /// Device address of `threads` `u64` pointers (0 = skip).
    pub ptrs: u64,
    /// Device address of `threads` `u64` sizes, or 0 to use `size`.
    pub sizes: u64,
    /// Bytes per block when `sizes` is 0.
    pub size: u64,
    /// Threads that take part.
    pub threads: u64,
    /// Pattern seed (thread `i` uses `seed ^ i`).
    pub seed: u64,
    /// 0: write the pattern over the whole block; 1: count mismatching words.
    pub verify: u64,
    /// Device address of a `u64` mismatch counter (verify mode).
    pub errors: u64,
}

/// Parameters of [`HEAP_CHURN`].
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ChurnParams {
    /// The heap.
    pub heap: Heap,
    /// Threads that take part.
    pub threads: u64,
    /// Rounds per thread.
    pub rounds: u64,
    /// Smallest request, bytes (≥ 4).
    pub min_size: u64,
    /// Largest request, bytes.
    pub max_size: u64,
    /// Seed of the size sequence and the patterns.
    pub seed: u64,
    /// Device address of `threads * CHURN_LIVE` `u64` pointers (zeroed): the
    /// blocks each thread keeps alive across rounds.
    pub live: u64,
    /// Device address of `threads * CHURN_LIVE` `u64` sizes.
    pub live_sizes: u64,
    /// Device address of `[u64; 3]`: successful allocations, null results,
    /// corrupted words found.
    pub counters: u64,
    /// 1: free every live block at the end (the heap should then be empty).
    pub free_at_end: u64,
}

/// Parameters of [`HEAP_LOOP`].
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct LoopParams {
    /// The heap.
    pub heap: Heap,
    /// Threads that take part.
    pub threads: u64,
    /// Iterations per thread.
    pub iters: u64,
    /// Bytes per allocation.
    pub size: u64,
    /// Device address of `[u64; 6]`: outstanding (live) blocks, the highest
    /// outstanding count seen, violations (outstanding below 0, or a block
    /// whose first word another thread overwrote), successes, nulls, and the
    /// limit above which an outstanding count is a violation (input).
    pub counters: u64,
}

/// Blocks each churn thread keeps alive (a ring).
pub const CHURN_LIVE: u64 = 4;

#[inline(always)]
fn hash(x: u64) -> u64 {
    super::hash(x)
}

/// Writes (`verify == false`) or checks the pattern of `bytes` bytes at `p`;
/// returns mismatching words.
///
/// # Safety
/// `p` addresses `bytes` bytes owned by the caller, 4-byte aligned.
#[inline(always)]
unsafe fn touch(p: u64, bytes: u64, seed: u64, verify: bool) -> u64 {
    let words = bytes / 4;
    let mut bad = 0;
    let mut w = 0;
    while w < words {
        let q = (p + 4 * w) as *mut u32;
        let v = pattern(seed, w);
        if verify {
            // SAFETY: `w < words`, inside the caller's block.
            if unsafe { q.read_volatile() } != v {
                bad += 1;
            }
        } else {
            // SAFETY: as above.
            unsafe { q.write_volatile(v) };
        }
        // Through the barrier: LLVM would unroll the loop by 8 and keep
        // eight patterns in flight, more registers than `malloc` itself.
        w = crate::arch::opaque_u64(w + 1);
    }
    bad
}

/// Thread `i < threads` stores `malloc(size_i)` in `out[i]`.
///
/// # Safety
/// `heap` is live; `sizes` (if non-zero) and `out` address `threads` `u64`s.
#[inline(always)]
pub unsafe fn malloc_kernel(p: &MallocParams) {
    let i = global_thread_id();
    if i >= p.threads {
        return;
    }
    let out = (p.out as *mut u64).wrapping_add(i as usize);
    if p.warp_mode != 0 && !i.is_multiple_of(32) {
        // SAFETY: `i < threads`, inside `out`.
        unsafe { out.write(0) };
        return;
    }
    let size = if p.sizes != 0 {
        // SAFETY: `i < threads`, inside `sizes`.
        unsafe { (p.sizes as *const u64).add(i as usize).read() }
    } else {
        p.size
    };
    // SAFETY: the caller guarantees a live heap.
    let ptr = unsafe { super::malloc(&p.heap, size) };
    // The output address is recomputed rather than kept live across
    // `malloc` (a register pair less under its whole call chain, DESIGN.md
    // §4.1); the index is the same.
    let i = global_thread_id_reread();
    let out = (p.out as *mut u64).wrapping_add(i as usize);
    // SAFETY: `i < threads`, inside `out`.
    unsafe { out.write(ptr as u64) };
}

/// Thread `i < threads` frees `ptrs[(i * stride) % threads]`.
///
/// # Safety
/// `heap` is live; `ptrs` addresses `threads` `u64`s, each null or a live
/// allocation of `heap` freed by no one else.
#[inline(always)]
pub unsafe fn free_kernel(p: &FreeParams) {
    let i = global_thread_id();
    if i >= p.threads {
        return;
    }
    let j = ((i as u128 * p.stride.max(1) as u128) % p.threads as u128) as usize;
    // SAFETY: `j < threads`, inside `ptrs`.
    let ptr = unsafe { (p.ptrs as *const u64).add(j).read() };
    // SAFETY: the caller guarantees the pointer's provenance.
    unsafe { super::free(&p.heap, ptr as *mut u8) };
}

/// Thread `i < threads` writes or verifies `pattern(seed ^ i, w)` over every
/// word `w` of its block `ptrs[i]`.
///
/// # Safety
/// `ptrs`/`sizes` address `threads` `u64`s; each non-null block has at least
/// its size in bytes and belongs to thread `i` alone; `errors` is a `u64`.
pub unsafe fn touch_kernel(p: &TouchParams) {
    let i = global_thread_id();
    if i >= p.threads {
        return;
    }
    // SAFETY: `i < threads`.
    let ptr = unsafe { (p.ptrs as *const u64).add(i as usize).read() };
    if ptr == 0 {
        return;
    }
    let size = if p.sizes != 0 {
        // SAFETY: `i < threads`.
        unsafe { (p.sizes as *const u64).add(i as usize).read() }
    } else {
        p.size
    };
    // SAFETY: the block is this thread's and has `size` bytes.
    let bad = unsafe { touch(ptr, size, p.seed ^ i, p.verify != 0) };
    if bad != 0 {
        // SAFETY: `errors` is an aligned `u64` used only atomically.
        unsafe { GlobalU64::from_ptr(p.errors as *mut u64) }.fetch_add(bad, Ordering::Relaxed);
    }
}

/// Gallatin-style churn: each thread, for `rounds` rounds, verifies and frees
/// the block in ring slot `r % CHURN_LIVE` (written rounds ago, so other
/// threads had time to overwrite it if a slot were handed out twice), then
/// allocates a block of a pseudo-random size in `[min_size, max_size]` and
/// writes its pattern over all of it.
///
/// # Safety
/// `heap` is live; `live`/`live_sizes` address `threads * CHURN_LIVE` zeroed
/// `u64`s; `counters` addresses three `u64`s.
#[inline(always)]
pub unsafe fn churn_kernel(p: &ChurnParams) {
    if global_thread_id() >= p.threads {
        return;
    }
    // Only the round is kept across `malloc`: the thread index, its ring
    // slot and the request size are recomputed after it (a kernel that
    // calls `malloc` pays `malloc`'s registers plus what it keeps live
    // across the call; DESIGN.md §4.1).
    let mut r = 0;
    while r < p.rounds + if p.free_at_end != 0 { CHURN_LIVE } else { 0 } {
        // SAFETY: forwarded contract (this thread's ring, a live heap).
        unsafe { churn_free(p, r) };
        // Every thread calls malloc every round (warp-uniform); the final
        // drain rounds ask for 0 bytes.
        // SAFETY: live heap.
        let ptr = unsafe { super::malloc(&p.heap, churn_size(p, r)) } as u64;
        // SAFETY: as above.
        unsafe { churn_keep(p, r, ptr) };
        r += 1;
    }
}

/// The request of churn round `r` of this thread (0 in the drain rounds).
#[inline(always)]
fn churn_size(p: &ChurnParams, r: u64) -> u64 {
    let i = global_thread_id_reread();
    let span = p.max_size.saturating_sub(p.min_size) + 1;
    if r < p.rounds {
        p.min_size + hash(p.seed ^ (i << 24) ^ r) % span
    } else {
        0
    }
}

/// This thread's ring slot of round `r`: the pointer and the size words.
#[inline(always)]
fn churn_slot(p: &ChurnParams, r: u64) -> (*mut u64, *mut u64) {
    let j = (global_thread_id_reread() * CHURN_LIVE + r % CHURN_LIVE) as usize;
    ((p.live as *mut u64).wrapping_add(j), (p.live_sizes as *mut u64).wrapping_add(j))
}

#[inline(always)]
fn churn_counter(p: &ChurnParams, k: usize) -> &GlobalU64 {
    // SAFETY: `counters` addresses three aligned u64s used only atomically.
    unsafe { GlobalU64::from_ptr((p.counters as *mut u64).add(k)) }
}

/// Churn round `r`, before its `malloc`: verifies and frees the block the
/// ring slot holds from `CHURN_LIVE` rounds ago.
///
/// # Safety
/// As for [`churn_kernel`].
#[inline(always)]
unsafe fn churn_free(p: &ChurnParams, r: u64) {
    let (slot, slot_size) = churn_slot(p, r);
    // SAFETY: `j < threads * CHURN_LIVE`, this thread's ring.
    let old = unsafe { slot.read() };
    if old != 0 {
        let i = global_thread_id_reread();
        // SAFETY: our block, of the recorded size.
        let (bytes, seed) = unsafe { (slot_size.read(), p.seed ^ (i << 24) ^ (r - CHURN_LIVE)) };
        // SAFETY: the block is ours until the free below.
        let bad = unsafe { touch(old, bytes, seed, true) };
        if bad != 0 {
            churn_counter(p, 2).fetch_add(bad, Ordering::Relaxed);
        }
        // SAFETY: a live allocation of this heap, freed once.
        unsafe { super::free(&p.heap, old as *mut u8) };
        // SAFETY: our ring slot.
        unsafe { slot.write(0) };
    }
}

/// Churn round `r`, after its `malloc` returned `ptr`: counts it, writes the
/// pattern over the block and keeps it in the ring slot.
///
/// # Safety
/// As for [`churn_kernel`].
#[inline(always)]
unsafe fn churn_keep(p: &ChurnParams, r: u64, ptr: u64) {
    let size = churn_size(p, r);
    if size == 0 {
        return;
    }
    if ptr == 0 {
        churn_counter(p, 1).fetch_add(1, Ordering::Relaxed);
        return;
    }
    churn_counter(p, 0).fetch_add(1, Ordering::Relaxed);
    let i = global_thread_id_reread();
    // SAFETY: a fresh block of `size` bytes, ours.
    unsafe { touch(ptr, size, p.seed ^ (i << 24) ^ r, false) };
    let (slot, slot_size) = churn_slot(p, r);
    // SAFETY: our ring slot.
    unsafe {
        slot.write(ptr);
        slot_size.write(size);
    }
}

/// BL-10(b): each thread loops `iters` times: allocate `size` bytes; on
/// success count it outstanding (a violation if that exceeds the limit),
/// stamp the block with the thread id, check the stamp, un-count, free.
///
/// # Safety
/// `heap` is live; `counters` addresses six `u64`s (the sixth is the limit).
#[inline(always)]
pub unsafe fn loop_kernel(p: &LoopParams) {
    if global_thread_id() >= p.threads {
        return;
    }
    // Only the iteration count is kept across `malloc`; the thread index
    // and the limit are read again after it (see `churn_kernel`).
    let mut n = 0;
    while n < p.iters {
        // SAFETY: live heap.
        let ptr = unsafe { super::malloc(&p.heap, p.size) } as u64;
        // SAFETY: forwarded contract.
        unsafe { loop_check(p, ptr) };
        n += 1;
    }
}

/// One iteration of [`loop_kernel`] after its `malloc` returned `ptr`.
///
/// # Safety
/// As for [`loop_kernel`].
#[inline(always)]
unsafe fn loop_check(p: &LoopParams, ptr: u64) {
    // SAFETY: `counters` addresses six aligned u64s used only atomically.
    let counter = |k: usize| unsafe { GlobalU64::from_ptr((p.counters as *mut u64).add(k)) };
    if ptr == 0 {
        counter(4).fetch_add(1, Ordering::Relaxed);
        return;
    }
    counter(3).fetch_add(1, Ordering::Relaxed);
    let out = counter(0).fetch_add(1, Ordering::AcqRel) + 1;
    counter(1).fetch_max(out, Ordering::Relaxed);
    let stamp = (ptr as *mut u64, global_thread_id_reread() + 1);
    // SAFETY: a fresh block of at least 8 bytes, ours.
    unsafe { stamp.0.write_volatile(stamp.1) };
    crate::arch::time::nanosleep(0);
    // SAFETY: as above.
    let seen = unsafe { stamp.0.read_volatile() };
    if out > counter(5).load(Ordering::Relaxed) || seen != stamp.1 {
        counter(2).fetch_add(1, Ordering::Relaxed);
    }
    if counter(0).fetch_sub(1, Ordering::AcqRel) == 0 {
        counter(2).fetch_add(1, Ordering::Relaxed);
    }
    // SAFETY: our live block, freed once.
    unsafe { super::free(&p.heap, ptr as *mut u8) };
}

/// Parameters of [`HEAP_USER_LIST`].
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct UserListParams {
    /// The heap.
    pub heap: Heap,
    /// Threads that take part.
    pub threads: u64,
    /// Nodes each thread pushes (16 bytes each: the next node, the value).
    pub nodes: u64,
    /// Device address of `threads` `u64`s: thread `i` stores
    /// [`user_list_checksum`]`(i, pushed)` when every value it pushed read
    /// back, else 0 (also 0 when it pushed nothing).
    pub out: u64,
}

/// The value of node `k` of thread `i`'s list.
#[inline(always)]
pub fn user_list_value(i: u64, k: u64) -> u64 {
    hash(i ^ k << 32)
}

/// What thread `i` of [`user_list_kernel`] stores after pushing `n >= 1`
/// nodes whose values all read back (the host's reference).
pub fn user_list_checksum(i: u64, n: u64) -> u64 {
    let mut sum = n;
    let mut k = 0;
    while k < n {
        sum = sum.wrapping_mul(31).wrapping_add(user_list_value(i, k));
        k += 1;
    }
    sum | 1
}

/// A kernel shaped like a user's, not tuned like the heap's own benchmark
/// kernels: each thread builds a linked list by calling `malloc` in a loop
/// while it keeps its state live across the call (the list head, its
/// thread index, the count pushed, the loop counter), then reverses the
/// list, walks it oldest first, checks and sums each value and frees each
/// node. The PTX check holds it to the same 64 registers as `malloc` (what
/// a kernel author gets).
///
/// # Safety
/// `heap` is live; `out` addresses `threads` writable `u64`s.
#[inline(always)]
pub unsafe fn user_list_kernel(p: &UserListParams) {
    let i = global_thread_id();
    if i >= p.threads {
        return;
    }
    let mut head = 0u64;
    let mut pushed = 0u64;
    let mut k = 0;
    // Every thread calls malloc on every iteration (warp-uniform).
    while k < p.nodes {
        // SAFETY: live heap.
        let node = unsafe { super::malloc(&p.heap, 16) } as *mut u64;
        if !node.is_null() {
            // SAFETY: a fresh 16-byte block, ours.
            unsafe {
                node.write(head);
                node.add(1).write(user_list_value(i, pushed));
            }
            head = node as u64;
            pushed += 1;
        }
        k += 1;
    }
    // Reverse the list (newest first) in place.
    let mut prev = 0u64;
    while head != 0 {
        let node = head as *mut u64;
        // SAFETY: a node of this thread's list.
        let next = unsafe { node.read() };
        // SAFETY: as above.
        unsafe { node.write(prev) };
        prev = head;
        head = next;
    }
    let mut sum = pushed;
    let mut good = true;
    let mut j = 0;
    while prev != 0 {
        let node = prev as *mut u64;
        // SAFETY: a node of this thread's list (oldest first now).
        let (next, v) = unsafe { (node.read(), node.add(1).read()) };
        good &= v == user_list_value(i, j);
        sum = sum.wrapping_mul(31).wrapping_add(v);
        // SAFETY: our live node, freed once, not read again.
        unsafe { super::free(&p.heap, node as *mut u8) };
        prev = next;
        j += 1;
    }
    let res = if pushed == 0 || !good { 0 } else { sum | 1 };
    // SAFETY: `i < threads`, the caller's array.
    unsafe { (p.out as *mut u64).add(i as usize).write(res) };
}

/// Does nothing: the launch floor of a grid (benchmarks).
///
/// # Safety
/// None needed; `unsafe` for the kernel ABI.
pub unsafe fn noop_kernel(_: &MallocParams) {}

/// CUDA's device `malloc` (the built-in heap; raise its limit first) for the
/// benchmark baseline. On the CPU backend it stores 0 (there is no CUDA heap).
///
/// # Safety
/// As for [`malloc_kernel`].
pub unsafe fn cuda_malloc_kernel(p: &MallocParams) {
    let i = global_thread_id();
    if i >= p.threads {
        return;
    }
    let out = (p.out as *mut u64).wrapping_add(i as usize);
    if p.warp_mode != 0 && !i.is_multiple_of(32) {
        // SAFETY: inside `out`.
        unsafe { out.write(0) };
        return;
    }
    let size = if p.sizes != 0 {
        // SAFETY: `i < threads`, inside `sizes`.
        unsafe { (p.sizes as *const u64).add(i as usize).read() }
    } else {
        p.size
    };
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: CUDA's device malloc has no preconditions.
    let ptr = unsafe { core::arch::nvptx::malloc(size as usize) } as u64;
    #[cfg(not(target_arch = "nvptx64"))]
    let ptr = {
        let _ = size;
        0u64
    };
    // SAFETY: inside `out`.
    unsafe { out.write(ptr) };
}

/// CUDA's device `free` of `ptrs[(i * stride) % threads]` (no-op on the CPU).
///
/// # Safety
/// As for [`free_kernel`], with pointers from [`cuda_malloc_kernel`].
pub unsafe fn cuda_free_kernel(p: &FreeParams) {
    let i = global_thread_id();
    if i >= p.threads {
        return;
    }
    let j = ((i as u128 * p.stride.max(1) as u128) % p.threads as u128) as usize;
    // SAFETY: `j < threads`, inside `ptrs`.
    let ptr = unsafe { (p.ptrs as *const u64).add(j).read() };
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: a pointer from CUDA's malloc (or null, which it ignores).
    unsafe {
        core::arch::nvptx::free(ptr as *mut core::ffi::c_void)
    };
    #[cfg(not(target_arch = "nvptx64"))]
    let _ = ptr;
}

crate::kernel_entry! {
    /// [`malloc_kernel`] as a kernel.
    pub static HEAP_MALLOC: MallocParams = gpuheap_heap_malloc => malloc_kernel;
}
crate::kernel_entry! {
    /// [`free_kernel`] as a kernel.
    pub static HEAP_FREE: FreeParams = gpuheap_heap_free => free_kernel;
}
crate::kernel_entry! {
    /// [`touch_kernel`] as a kernel.
    pub static HEAP_TOUCH: TouchParams = gpuheap_heap_touch => touch_kernel;
}
crate::kernel_entry! {
    /// [`churn_kernel`] as a kernel.
    pub static HEAP_CHURN: ChurnParams = gpuheap_heap_churn => churn_kernel;
}
crate::kernel_entry! {
    /// [`user_list_kernel`] as a kernel.
    pub static HEAP_USER_LIST: UserListParams = gpuheap_heap_user_list => user_list_kernel;
}
crate::kernel_entry! {
    /// [`loop_kernel`] as a kernel.
    pub static HEAP_LOOP: LoopParams = gpuheap_heap_loop => loop_kernel;
}
crate::kernel_entry! {
    /// [`noop_kernel`] as a kernel.
    pub static NOOP: MallocParams = gpuheap_noop => noop_kernel;
}
crate::kernel_entry! {
    /// [`cuda_malloc_kernel`] as a kernel.
    pub static CUDA_MALLOC: MallocParams = gpuheap_cuda_malloc => cuda_malloc_kernel;
}
crate::kernel_entry! {
    /// [`cuda_free_kernel`] as a kernel.
    pub static CUDA_FREE: FreeParams = gpuheap_cuda_free => cuda_free_kernel;
}
