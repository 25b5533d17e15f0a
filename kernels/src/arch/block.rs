//! Block-level primitives: the block barrier and dynamic shared memory.

/// Waits until every thread of the block arrives (`bar.sync 0`), and makes
/// their earlier shared- and global-memory writes visible to the block.
///
/// On the CPU backend this needs a lockstep launch; in a sequential launch it
/// panics with a message saying so (a barrier there would deadlock).
#[inline(always)]
pub fn sync_threads() {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: a block barrier; all threads of the block reach it by contract.
    unsafe {
        core::arch::nvptx::_syncthreads()
    };
    #[cfg(not(target_arch = "nvptx64"))]
    if super::emu::its_sync_threads() {
        return;
    }
    #[cfg(not(target_arch = "nvptx64"))]
    super::emu::with_block(|b| match b {
        Some(b) => b.sync(),
        None => panic!("sync_threads() outside a lockstep CPU launch"),
    })
}

#[cfg(target_arch = "nvptx64")]
core::arch::global_asm!(".extern .shared .align 16 .b8 gpuheap_dyn_smem[];");

/// The block's dynamic shared memory: a 16-byte aligned pointer and its size
/// in bytes (the `shared_mem_bytes` of the launch; 0 if none).
///
/// Shared memory is declared with `global_asm!` because
/// `#[link_section = ".shared"]` is silently ignored on nvptx (the static lands
/// in global memory).
#[inline(always)]
pub fn dyn_shared() -> (*mut u8, usize) {
    #[cfg(target_arch = "nvptx64")]
    {
        let p: u64;
        let n: u32;
        // SAFETY: converts the address of the block's shared array to a
        // generic pointer and reads its size register; nothing is accessed.
        unsafe {
            core::arch::asm!("cvta.shared.u64 {p}, gpuheap_dyn_smem;", p = out(reg64) p, options(pure, nomem, nostack));
            core::arch::asm!("mov.u32 {n}, %dynamic_smem_size;", n = out(reg32) n, options(pure, nomem, nostack));
        }
        (p as *mut u8, n as usize)
    }
    #[cfg(not(target_arch = "nvptx64"))]
    super::emu::with_block(|b| b.map(|b| b.shared_ptr()).unwrap_or((core::ptr::null_mut(), 0)))
}
