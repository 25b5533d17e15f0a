//! Back-off and clocks.

/// Suspends the thread for about `ns` nanoseconds (`nanosleep.u32`, sm_70+;
/// the hardware picks a delay in `[0, 2*ns]`). On the host: yields the OS
/// thread, so spinning emulated threads let the others run.
#[inline(always)]
pub fn nanosleep(ns: u32) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: suspends this thread; no memory is touched.
    unsafe {
        core::arch::asm!("nanosleep.u32 {ns};", ns = in(reg32) ns, options(nomem, nostack))
    };
    #[cfg(all(not(target_arch = "nvptx64"), not(loom), not(shuttle)))]
    {
        let _ = ns;
        // Independent mode: a scheduling point (another lane runs).
        if !super::emu::spin() {
            std::thread::yield_now();
        }
    }
    // Under the model checkers a spinning thread must yield to the scheduler.
    #[cfg(all(not(target_arch = "nvptx64"), loom))]
    {
        let _ = ns;
        loom::thread::yield_now();
    }
    #[cfg(all(not(target_arch = "nvptx64"), shuttle, not(loom)))]
    {
        let _ = ns;
        shuttle::thread::yield_now();
    }
}

/// Exponential back-off for retry loops: sleeps `base << min(attempt, 8)` ns.
#[inline(always)]
pub fn backoff(attempt: u32) {
    nanosleep(32u32 << attempt.min(8));
}

/// A per-SM cycle counter (`%clock64`); on the host, nanoseconds since an
/// arbitrary origin. Only differences taken on one thread are meaningful.
#[inline(always)]
pub fn clock64() -> u64 {
    #[cfg(target_arch = "nvptx64")]
    {
        let r: u64;
        // SAFETY: reads a special register.
        unsafe { core::arch::asm!("mov.u64 {r}, %clock64;", r = out(reg64) r, options(nomem, nostack)) };
        r
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        use std::sync::OnceLock;
        static ORIGIN: OnceLock<std::time::Instant> = OnceLock::new();
        ORIGIN.get_or_init(std::time::Instant::now).elapsed().as_nanos() as u64
    }
}
