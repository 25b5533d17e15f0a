//! Wide (16-byte) memory accesses.
//!
//! On `nvptx64` one `ld.v4.u32` / `st.v4.u32` on a generic address (global
//! or shared memory), ordinary coherent accesses (never `.nc`: data may be
//! written by other threads of the same kernel). LLVM lowers a 16-byte
//! aggregate copy through local memory, so kernels that move data use these.
//! On the host, plain 16-byte reads and writes.

/// Loads the 16 bytes at `p`.
///
/// # Safety
/// `p` is 16-byte aligned and readable for 16 bytes; no other thread writes
/// them concurrently.
#[inline(always)]
pub unsafe fn load_v4(p: *const [u32; 4]) -> [u32; 4] {
    #[cfg(target_arch = "nvptx64")]
    {
        let (a, b, c, d): (u32, u32, u32, u32);
        // SAFETY: the caller guarantees an aligned, readable 16-byte location.
        unsafe {
            core::arch::asm!(
                "ld.v4.u32 {{{a}, {b}, {c}, {d}}}, [{p}];",
                a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
                p = in(reg64) p, options(nostack, readonly))
        };
        [a, b, c, d]
    }
    #[cfg(not(target_arch = "nvptx64"))]
    // SAFETY: the caller guarantees an aligned, readable 16-byte location.
    unsafe {
        p.read()
    }
}

/// Stores `v` into the 16 bytes at `p`.
///
/// # Safety
/// `p` is 16-byte aligned and writable for 16 bytes; no other thread accesses
/// them concurrently.
#[inline(always)]
pub unsafe fn store_v4(p: *mut [u32; 4], v: [u32; 4]) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller guarantees an aligned, writable 16-byte location.
    unsafe {
        core::arch::asm!(
            "st.v4.u32 [{p}], {{{a}, {b}, {c}, {d}}};",
            a = in(reg32) v[0], b = in(reg32) v[1], c = in(reg32) v[2], d = in(reg32) v[3],
            p = in(reg64) p, options(nostack))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    // SAFETY: the caller guarantees an aligned, writable 16-byte location.
    unsafe {
        p.write(v)
    };
}
