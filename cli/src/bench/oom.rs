//! `gpuheap bench oom`: how long the device heap takes to say "out of memory", against how long
//! the same launch takes when every request succeeds.
//!
//! For each request size and thread count: a heap of [`POOL_BYTES`] is first filled with requests
//! of that size until one comes back null (untimed; the class and the buddy are then dry), and then
//! `threads` threads each call `malloc(size)` on it in one launch: every request fails. That
//! launch's kernel time (median of `reps`) is the out-of-memory latency; the same launch on a fresh
//! heap large enough for all of them (when one fits [`success_limit`]) is the success time beside
//! it. DESIGN §2.2 promises a null "about as fast as a success": the ratio column measures it.
//!
//! The default sizes are 16 B (the smallest slab class: a failing request there runs the slab's
//! page search and the buddy search) and 64 KiB (a buddy block: the contrast), at 2^12, 2^16 and
//! 2^20 threads on a GPU (2^12, 2^14, 2^16 on the CPU backend, whose figures time the emulation,
//! not a GPU). Rows stream to the caller as they finish, so a run stopped by a time limit keeps
//! what it measured.

use serde::Serialize;

use super::median_p99;
use gpuheap::backend::{Backend, Result};
use gpuheap::device_heap::ops::{self, Sizes};
use gpuheap::device_heap::DeviceHeap;

/// Data region of the heap that is run dry, bytes (16 slab pages).
pub const POOL_BYTES: u64 = 1 << 20;

/// The largest heap built for the success baseline, bytes: 1 GiB on a GPU, 64 MiB on the CPU.
pub fn success_limit(backend: &Backend) -> u64 {
    if backend.is_gpu() {
        1 << 30
    } else {
        64 << 20
    }
}

/// What to run.
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct OomConfig {
    /// Request sizes, bytes.
    pub sizes: Vec<u64>,
    /// Thread counts of the failing launch, as log2.
    pub threads_log2: Vec<u32>,
    /// Timed launches per row (medians reported).
    pub reps: usize,
}

impl OomConfig {
    /// 64 KiB then 16 B (the contrast first: it is the fast one), at 2^12, 2^16 and 2^20 threads
    /// on a GPU and 2^12, 2^14 and 2^16 on the CPU; 3 repetitions.
    pub fn for_backend(backend: &Backend) -> Self {
        let threads_log2 = if backend.is_gpu() { vec![12, 16, 20] } else { vec![12, 14, 16] };
        Self { sizes: vec![64 << 10, 16], threads_log2, reps: 3 }
    }

    /// Checks that every size is 1 B … [`POOL_BYTES`], every thread count 2^0 … 2^24, and reps ≥ 1.
    ///
    /// # Errors
    /// `InvalidArgument` naming the field and its value.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(gpuheap::backend::BackendError::InvalidArgument(m));
        if let Some(s) = self.sizes.iter().find(|&&s| s == 0 || s > POOL_BYTES) {
            return bad(format!("size {s} B is outside [1 B, {POOL_BYTES} B]"));
        }
        if let Some(k) = self.threads_log2.iter().find(|&&k| k > 24) {
            return bad(format!("threads 2^{k} is over 2^24"));
        }
        if self.reps == 0 {
            return bad("reps must be at least 1".into());
        }
        Ok(())
    }
}

/// One row: `threads` failing requests of `size` bytes in one launch.
#[derive(Clone, Debug, Serialize)]
pub struct OomRow {
    /// Request size, bytes.
    pub size: u64,
    /// Threads in the failing launch.
    pub threads: u64,
    /// Bytes handed out before the first null while the heap was filled.
    pub filled_bytes: u64,
    /// Median kernel time of the launch in which every request fails, ms.
    pub fail_ms: f64,
    /// 99th percentile of the same, ms.
    pub fail_p99_ms: f64,
    /// Nulls in the last failing launch (every thread's, when the heap is dry).
    pub nulls: u64,
    /// Requests the heap counted as failed over the failing launches (`HeapStats::failed_requests`).
    pub failed_requests: u64,
    /// Median kernel time of the same launch on a fresh heap that holds every request, ms (`None`
    /// when that heap would exceed [`success_limit`]).
    pub success_ms: Option<f64>,
    /// `fail_ms / success_ms`.
    pub ratio: Option<f64>,
}

/// The whole run.
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct OomReport {
    /// The backend, in words.
    pub backend: String,
    /// The configuration run.
    pub config: OomConfig,
    /// The rows, in the order they ran.
    pub rows: Vec<OomRow>,
}

/// Fills `heap` with `size`-byte requests until one fails; returns the bytes handed out and the
/// batches that hold them.
fn fill(heap: &DeviceHeap, size: u64) -> Result<(u64, Vec<ops::Batch>)> {
    let threads = (heap.capacity() / size).clamp(32, 1 << 16);
    let (mut handed, mut batches) = (0, Vec::new());
    loop {
        let batch = ops::malloc_batch(heap, &Sizes::Uniform(size), threads, false)?;
        let ok = batch.read_ptrs()?.iter().filter(|&&p| p != 0).count() as u64;
        handed += ok * size;
        batches.push(batch);
        if ok < threads {
            return Ok((handed, batches));
        }
    }
}

/// Runs the probe; `progress` sees each row as it finishes.
///
/// # Errors
/// `InvalidArgument` for a configuration [`OomConfig::validate`] refuses; backend failures.
pub fn run(backend: &Backend, cfg: &OomConfig, mut progress: impl FnMut(&OomRow)) -> Result<OomReport> {
    cfg.validate()?;
    let mut rows = Vec::new();
    for &size in &cfg.sizes {
        for &k in &cfg.threads_log2 {
            let threads = 1u64 << k;
            let heap = DeviceHeap::new(backend, POOL_BYTES)?;
            let (filled_bytes, _held) = fill(&heap, size)?;
            let before = heap.stats()?.failed_requests;
            let (mut times, mut nulls) = (Vec::new(), 0);
            for _ in 0..cfg.reps {
                let batch = ops::malloc_batch(&heap, &Sizes::Uniform(size), threads, false)?;
                times.push(batch.timing().ms());
                nulls = batch.read_ptrs()?.iter().filter(|&&p| p == 0).count() as u64;
                // Whatever did succeed (nothing, on a dry heap) goes back, so every repetition
                // meets the same heap.
                ops::free_batch(&heap, batch, 1)?;
            }
            let failed_requests = heap.stats()?.failed_requests - before;
            let (fail_ms, fail_p99_ms) = median_p99(&times);
            let success_ms = match threads.checked_mul(size).and_then(|b| b.checked_mul(2)) {
                Some(bytes) if bytes <= success_limit(backend) => {
                    let fresh = DeviceHeap::new(backend, bytes.max(POOL_BYTES))?;
                    let mut t = Vec::new();
                    for _ in 0..cfg.reps {
                        let batch = ops::malloc_batch(&fresh, &Sizes::Uniform(size), threads, false)?;
                        t.push(batch.timing().ms());
                        ops::free_batch(&fresh, batch, 1)?;
                    }
                    Some(median_p99(&t).0)
                }
                _ => None,
            };
            let row = OomRow {
                size,
                threads,
                filled_bytes,
                fail_ms,
                fail_p99_ms,
                nulls,
                failed_requests,
                success_ms,
                ratio: success_ms.filter(|&s| s > 0.0).map(|s| fail_ms / s),
            };
            progress(&row);
            rows.push(row);
        }
    }
    Ok(OomReport { backend: backend.describe(), config: cfg.clone(), rows })
}

/// The header of [`row_line`]'s table.
pub const TABLE_HEADER: &str = "| size B | threads | filled MiB | fail ms | fail p99 ms | nulls | failed requests | success ms | fail/success |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|";

/// One row as a line of the Markdown table.
pub fn row_line(r: &OomRow) -> String {
    let opt = |v: Option<f64>, p: usize| v.map_or("-".to_string(), |x| format!("{x:.p$}"));
    format!(
        "| {} | {} | {:.2} | {:.3} | {:.3} | {} | {} | {} | {} |",
        r.size,
        r.threads,
        r.filled_bytes as f64 / (1u64 << 20) as f64,
        r.fail_ms,
        r.fail_p99_ms,
        r.nulls,
        r.failed_requests,
        opt(r.success_ms, 3),
        opt(r.ratio, 2)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On the CPU backend: a dry heap fails every request of the launch, counts each, and the
    /// 64 KiB rows fill the pool with whole blocks.
    #[test]
    fn a_dry_heap_fails_every_request_and_counts_them() {
        let b = Backend::cpu();
        let cfg = OomConfig { sizes: vec![64 << 10, 16], threads_log2: vec![6], reps: 2 };
        let mut seen = 0;
        let r = run(&b, &cfg, |_| seen += 1).unwrap();
        assert_eq!((seen, r.rows.len()), (2, 2));
        for row in &r.rows {
            assert_eq!(row.threads, 64);
            assert_eq!(row.nulls, 64, "{row:?}");
            assert_eq!(row.failed_requests, 2 * 64, "{row:?}");
            assert!(row.filled_bytes > POOL_BYTES / 2 && row.filled_bytes <= POOL_BYTES, "{row:?}");
            assert!(row.success_ms.is_some() && row.ratio.is_some(), "{row:?}");
            assert!(row_line(row).starts_with(&format!("| {} | 64 |", row.size)));
        }
        assert!(OomConfig { reps: 0, ..cfg.clone() }.validate().is_err());
        assert!(OomConfig { sizes: vec![0], ..cfg.clone() }.validate().is_err());
        assert!(OomConfig { threads_log2: vec![25], ..cfg }.validate().is_err());
    }
}
