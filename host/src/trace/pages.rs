//! Transparent huge pages for the reader's large buffers.
//!
//! Reading a long snapshot writes a few hundred MB to memory the process has never touched (the file's
//! bytes, the pickle's nodes, the trace's events), and on this project's build machine most of the
//! reader's time went into the page faults behind it: `perf record` of `gpuheap explain --no-tune` on a
//! 1,005,465-event snapshot (67 MB of pickle) put 46 % of the samples in the kernel's `clear_page_erms`
//! and 3 % in `exc_page_fault`, one fault per 4 KiB page. Asking for transparent huge pages
//! (`madvise(MADV_HUGEPAGE)`, honoured where `/sys/kernel/mm/transparent_hugepage/enabled` is `always`
//! or `madvise`, the common defaults) makes it one fault per 2 MiB. The advice changes no content and no
//! validity of the memory; where the kernel refuses it, or off Linux, nothing changes.

/// Below this many bytes a buffer is left as it is (a huge page is 2 MiB).
const MIN_BYTES: usize = 4 << 20;

/// An empty vector with room for `n` items (when the allocator grants it: a refusal leaves it empty, to
/// grow as usual), its room on huge pages ([`advise_huge`]). For buffers whose final length is only
/// estimated: room reserved and never written costs address space, not memory.
pub(crate) fn reserve_huge<T>(n: usize) -> Vec<T> {
    let mut v = Vec::new();
    if v.try_reserve_exact(n).is_ok() {
        advise_huge(&mut v);
    }
    v
}

/// Advises the kernel to back the spare and used capacity of `v` with transparent huge pages, when it is
/// at least 4 MiB. Call it right after reserving the capacity, before the buffer is written.
pub(crate) fn advise_huge<T>(v: &mut Vec<T>) {
    #[cfg(target_os = "linux")]
    {
        let bytes = v.capacity().saturating_mul(std::mem::size_of::<T>());
        if bytes < MIN_BYTES {
            return;
        }
        const HUGE: usize = 2 << 20;
        let start = v.as_mut_ptr() as usize;
        // Whole huge pages inside the buffer only: madvise needs a page-aligned start, and advising
        // memory beyond the allocation would change pages the allocator may hand to others.
        let first = start.div_ceil(HUGE) * HUGE;
        let end = (start + bytes) / HUGE * HUGE;
        if end > first {
            // SAFETY: `[first, end)` lies inside `v`'s allocation (rounded inwards to 2 MiB pages), which
            // `v` owns and keeps alive across the call; MADV_HUGEPAGE only changes how the kernel backs
            // those pages, never their content or whether they are mapped, so no Rust reference or
            // invariant is affected. The return value is ignored: a refusal leaves 4 KiB pages.
            unsafe {
                libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = v;
}
