//! `gpuheap bench alloc`: the survey's allocation workloads re-implemented
//! (DESIGN.md §3.5, with the changes listed there).
//!
//! | id | workload | what is timed | reported |
//! |---|---|---|---|
//! | T1 | thread-based: N threads × `malloc(S)`, S = powers of two | alloc kernel, free kernel | median, p99 ms; allocs/s; bytes/s |
//! | T2 | warp-based: one `malloc(S)` per warp (lane 0) | same | same |
//! | T3 | mixed: thread i asks `align4(16 + U·(hi − 16))`, hi = 64 … 4096 | same | same |
//! | T4 | scaling: T1 at 2^0 … 2^k threads, S = 16 and 512 | same | same |
//! | T5 | fragmentation: rounds of N × S alloc/free; static address range of all rounds ÷ N·S | — | range ratio |
//! | T6 | out-of-memory: rounds of N × S without free until a null; handed-out bytes ÷ pool | — | usable fraction |
//! | churn | Gallatin-style: rounds of verify/free/alloc(16..4096)/write per thread, one kernel | kernel | allocs/s |
//! | floor | an empty kernel over N threads | kernel | ms |
//!
//! Every heap figure is measured **warm** (the heap reused: iteration i
//! reuses what iteration i−1 freed; one untimed warm-up) and **cold** (a
//! fresh heap before each iteration, `DeviceHeap::reset`, not timed).
//! Baselines in the same run: the warp-aggregated **bump** allocator (speed
//! of light, no reuse) and, on a GPU, **CUDA's device malloc** (its heap limit
//! raised to the pool size before its first launch). On the CPU backend the
//! figures are wall-clock times of the emulation: regressions show, absolute
//! values mean nothing for a GPU.

use serde::Serialize;

use super::median_p99;
use gpuheap::backend::{Backend, Result};
use gpuheap::device_heap::ops::{self, Allocator, Sizes};
use gpuheap::device_heap::DeviceHeap;

/// What to run.
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct AllocBenchConfig {
    /// Timed iterations per figure (≥ 50 for a real run).
    pub iterations: usize,
    /// N: threads of T1/T2/T3/T5/T6 and churn.
    pub threads: u64,
    /// Sizes of T1/T2/T5/T6, bytes.
    pub sizes: Vec<u64>,
    /// Upper bounds of T3's ranges.
    pub mixed_hi: Vec<u64>,
    /// T4 runs 2^0 … 2^`scaling_max_log2` threads.
    pub scaling_max_log2: u32,
    /// Data region of the heap (and CUDA's heap limit), bytes.
    pub heap_bytes: u64,
    /// Pool of the out-of-memory test, bytes.
    pub oom_pool: u64,
    /// Rounds of T5.
    pub frag_rounds: usize,
    /// Rounds per thread of the churn kernel.
    pub churn_rounds: u64,
    /// Measure CUDA's device malloc (GPU only).
    pub cuda_malloc: bool,
}

impl AllocBenchConfig {
    /// Checks that the suite can run this configuration: N (`threads`) at least 1 and at most 2^32,
    /// every size of `sizes` at least 1 B, every bound of `mixed_hi` at least 16 B (T3 asks
    /// 16 … hi), and an out-of-memory pool of at least one block of the largest size.
    ///
    /// # Errors
    /// `InvalidArgument` naming the field and its value.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(gpuheap::backend::BackendError::InvalidArgument(m));
        if self.threads == 0 || self.threads > 1 << 32 {
            return bad(format!("threads {} is outside [1, 2^32]", self.threads));
        }
        if let Some(s) = self.sizes.iter().find(|&&s| s == 0 || s > self.oom_pool) {
            return bad(format!("size {s} B is outside [1 B, oom_pool {} B]", self.oom_pool));
        }
        if let Some(h) = self.mixed_hi.iter().find(|&&h| h < 16) {
            return bad(format!("mixed_hi {h} B is below 16 B (T3 asks 16 B up to it)"));
        }
        Ok(())
    }

    /// The survey's parameters on a GPU (2^20 threads, 50 iterations); on
    /// the CPU backend sizes that finish in minutes; `quick` cuts both down
    /// (fewer than 50 iterations: for smoke runs only).
    pub fn for_backend(backend: &Backend, quick: bool) -> Self {
        let gpu = backend.is_gpu();
        let pow2 = |lo: u32, hi: u32| (lo..=hi).map(|k| 1u64 << k).collect::<Vec<_>>();
        match (gpu, quick) {
            (true, false) => Self {
                iterations: 50,
                threads: 1 << 20,
                sizes: pow2(4, 12),
                mixed_hi: pow2(6, 12),
                scaling_max_log2: 20,
                heap_bytes: 8 << 30,
                oom_pool: 2 << 30,
                frag_rounds: 100,
                churn_rounds: 100,
                cuda_malloc: true,
            },
            (true, true) => Self {
                iterations: 10,
                threads: 1 << 20,
                sizes: vec![16, 512, 4096],
                mixed_hi: vec![4096],
                scaling_max_log2: 20,
                heap_bytes: 8 << 30,
                oom_pool: 1 << 30,
                frag_rounds: 10,
                churn_rounds: 20,
                cuda_malloc: true,
            },
            (false, false) => Self {
                iterations: 50,
                threads: 1 << 14,
                sizes: pow2(4, 12),
                mixed_hi: vec![64, 512, 4096],
                scaling_max_log2: 14,
                heap_bytes: 256 << 20,
                oom_pool: 32 << 20,
                frag_rounds: 20,
                churn_rounds: 20,
                cuda_malloc: false,
            },
            (false, true) => Self {
                iterations: 5,
                threads: 1 << 12,
                sizes: vec![16, 64, 512, 4096],
                mixed_hi: vec![4096],
                scaling_max_log2: 12,
                heap_bytes: 64 << 20,
                oom_pool: 8 << 20,
                frag_rounds: 5,
                churn_rounds: 5,
                cuda_malloc: false,
            },
        }
    }
}

/// One line of the report.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// T1, T2, T3, T4, T5, T6, churn, floor.
    pub workload: String,
    /// heap, bump, cuda-malloc.
    pub allocator: String,
    /// Request size (`16`, `16..4096`, …).
    pub size: String,
    /// Threads launched (T2: warps × 32).
    pub threads: u64,
    /// warm, cold or "-".
    pub state: String,
    /// Allocation kernel, median ms.
    pub alloc_ms: f64,
    /// Allocation kernel, p99 ms.
    pub alloc_p99_ms: f64,
    /// Free kernel, median ms (0 when not applicable).
    pub free_ms: f64,
    /// Free kernel, p99 ms.
    pub free_p99_ms: f64,
    /// Allocations per second at the median.
    pub allocs_per_s: f64,
    /// Bytes handed out per second at the median.
    pub bytes_per_s: f64,
    /// Null results over all iterations.
    pub nulls: u64,
    /// Iterations measured.
    pub iterations: usize,
    /// T5: static address range ÷ N·S; T6: usable fraction of the pool.
    pub ratio: Option<f64>,
}

/// The whole report.
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct AllocBenchReport {
    /// `Backend::describe()`.
    pub backend: String,
    /// The configuration run.
    pub config: AllocBenchConfig,
    /// The figures.
    pub rows: Vec<Row>,
    /// Baselines that could not run, and why.
    pub notes: Vec<String>,
}

struct Series {
    alloc: Vec<f64>,
    free: Vec<f64>,
    nulls: u64,
    allocs: u64,
    bytes: u64,
}

fn sizes_mixed(n: u64, hi: u64, seed: u64) -> Vec<u64> {
    (0..n)
        .map(|i| {
            let mut z = (i ^ (seed << 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            z ^= z >> 29;
            let u = (z >> 11) as f64 / (1u64 << 53) as f64;
            (16 + (u * (hi - 16) as f64) as u64 + 3) & !3
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn series(
    heap: &mut DeviceHeap,
    alloc: Allocator,
    sizes: &Sizes,
    threads: u64,
    warp: bool,
    iters: usize,
    cold: bool,
) -> Result<Series> {
    let mut s = Series { alloc: vec![], free: vec![], nulls: 0, allocs: 0, bytes: 0 };
    let requested: (u64, u64) = match sizes {
        Sizes::Uniform(x) => {
            let n = if warp { threads.div_ceil(32) } else { threads };
            (n, n * x)
        }
        Sizes::PerThread(v) => (v.len() as u64, v.iter().sum()),
    };
    for it in 0..=iters {
        if cold && alloc == Allocator::Heap {
            heap.reset()?;
        }
        let batch = ops::malloc_batch_with(heap, sizes, threads, warp, alloc)?;
        let nulls = match warp {
            false => batch.read_ptrs()?.iter().filter(|&&p| p == 0).count() as u64,
            true => batch.read_ptrs()?.iter().step_by(32).filter(|&&p| p == 0).count() as u64,
        };
        let a = batch.timing().ms();
        let f = ops::free_batch_with(heap, batch, 1, alloc)?.ms();
        // Iteration 0 is the warm-up (cold runs time it too: every one is cold).
        if (it > 0 || cold) && s.alloc.len() < iters {
            s.alloc.push(a);
            s.free.push(f);
            s.nulls += nulls;
        }
    }
    s.allocs = requested.0;
    s.bytes = requested.1;
    Ok(s)
}

fn row(workload: &str, allocator: &str, size: String, threads: u64, state: &str, s: &Series) -> Row {
    let (am, ap) = median_p99(&s.alloc);
    let (fm, fp) = median_p99(&s.free);
    let per_s = |x: u64| if am > 0.0 { x as f64 / (am / 1e3) } else { 0.0 };
    Row {
        workload: workload.into(),
        allocator: allocator.into(),
        size,
        threads,
        state: state.into(),
        alloc_ms: am,
        alloc_p99_ms: ap,
        free_ms: fm,
        free_p99_ms: fp,
        allocs_per_s: per_s(s.allocs),
        bytes_per_s: per_s(s.bytes),
        nulls: s.nulls,
        iterations: s.alloc.len(),
        ratio: None,
    }
}

fn bump_row(b: &Backend, workload: &str, size: u64, threads: u64, iters: usize, capacity: u64) -> Result<Row> {
    let mut t = Vec::new();
    let mut nulls = 0;
    for _ in 0..=iters {
        let r = gpuheap::ops::bump_alloc(b, threads, size, capacity)?;
        nulls += r.offsets.iter().filter(|o| o.is_none()).count() as u64;
        t.push(r.timing.ms());
    }
    t.remove(0);
    let s = Series { alloc: t, free: vec![], nulls, allocs: threads, bytes: threads * size };
    Ok(row(workload, "bump", size.to_string(), threads, "-", &s))
}

/// Runs the suite on `backend`; `progress` is called with each finished row.
///
/// # Errors
/// `InvalidArgument` naming the field when `cfg` cannot be run ([`AllocBenchConfig::validate`]);
/// backend failures.
pub fn run(backend: &Backend, cfg: &AllocBenchConfig, mut progress: impl FnMut(&Row)) -> Result<AllocBenchReport> {
    cfg.validate()?;
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    let mut push = |r: Row, rows: &mut Vec<Row>| {
        progress(&r);
        rows.push(r);
    };
    let mut heap = DeviceHeap::new(backend, cfg.heap_bytes)?;
    let n = cfg.threads;
    let iters = cfg.iterations;

    // CUDA's heap limit must be raised before the first kernel using malloc.
    let cuda = match backend {
        Backend::Gpu(g) if cfg.cuda_malloc => {
            match g
                .context()
                .set_limit(cudarc::driver::sys::CUlimit::CU_LIMIT_MALLOC_HEAP_SIZE, cfg.heap_bytes as usize)
            {
                Ok(()) => true,
                Err(e) => {
                    notes.push(format!("CUDA device malloc not measured: cuCtxSetLimit failed: {e:?}"));
                    false
                }
            }
        }
        _ => {
            notes.push("CUDA device malloc: GPU backend only".into());
            false
        }
    };

    // Launch floor.
    let mut t = Vec::new();
    for _ in 0..iters.max(1) {
        t.push(ops::noop(&heap, n)?.ms());
    }
    let s = Series { alloc: t, free: vec![], nulls: 0, allocs: 0, bytes: 0 };
    push(row("floor", "-", "-".into(), n, "-", &s), &mut rows);

    // T1 and T2.
    for (wl, warp) in [("T1", false), ("T2", true)] {
        let threads = if warp { n * 32 } else { n };
        for &size in &cfg.sizes {
            if threads / if warp { 32 } else { 1 } * size > cfg.heap_bytes {
                continue;
            }
            for cold in [false, true] {
                let s = series(&mut heap, Allocator::Heap, &Sizes::Uniform(size), threads, warp, iters, cold)?;
                push(row(wl, "heap", size.to_string(), threads, if cold { "cold" } else { "warm" }, &s), &mut rows);
            }
            if !warp {
                push(bump_row(backend, wl, size, threads, iters, cfg.heap_bytes)?, &mut rows);
            }
            if cuda {
                let s = series(&mut heap, Allocator::CudaMalloc, &Sizes::Uniform(size), threads, warp, iters, false)?;
                push(row(wl, "cuda-malloc", size.to_string(), threads, "warm", &s), &mut rows);
            }
        }
    }

    // T3 mixed sizes.
    for &hi in &cfg.mixed_hi {
        let sizes = Sizes::PerThread(sizes_mixed(n, hi, hi));
        for cold in [false, true] {
            let s = series(&mut heap, Allocator::Heap, &sizes, n, false, iters, cold)?;
            push(row("T3", "heap", format!("16..{hi}"), n, if cold { "cold" } else { "warm" }, &s), &mut rows);
        }
        if cuda {
            let s = series(&mut heap, Allocator::CudaMalloc, &sizes, n, false, iters, false)?;
            push(row("T3", "cuda-malloc", format!("16..{hi}"), n, "warm", &s), &mut rows);
        }
    }

    // T4 scaling.
    for size in [16u64, 512] {
        for k in 0..=cfg.scaling_max_log2 {
            let threads = 1u64 << k;
            for cold in [false, true] {
                let s = series(&mut heap, Allocator::Heap, &Sizes::Uniform(size), threads, false, iters, cold)?;
                push(row("T4", "heap", size.to_string(), threads, if cold { "cold" } else { "warm" }, &s), &mut rows);
            }
            if cuda {
                let s = series(&mut heap, Allocator::CudaMalloc, &Sizes::Uniform(size), threads, false, iters, false)?;
                push(row("T4", "cuda-malloc", size.to_string(), threads, "warm", &s), &mut rows);
            }
        }
    }

    // T5 fragmentation: static address range over all rounds vs N*S.
    for &size in &cfg.sizes {
        if n * size > cfg.heap_bytes {
            continue;
        }
        heap.reset()?;
        let (mut lo, mut hi) = (u64::MAX, 0u64);
        let mut t = Vec::new();
        for _ in 0..cfg.frag_rounds {
            let batch = ops::malloc_batch(&heap, &Sizes::Uniform(size), n, false)?;
            t.push(batch.timing().ms());
            for p in batch.read_ptrs()?.into_iter().filter(|&p| p != 0) {
                lo = lo.min(p);
                hi = hi.max(p + size);
            }
            ops::free_batch(&heap, batch, 1)?;
        }
        let s = Series { alloc: t, free: vec![], nulls: 0, allocs: n, bytes: n * size };
        let mut r = row("T5", "heap", size.to_string(), n, "warm", &s);
        r.ratio = Some(hi.saturating_sub(lo) as f64 / (n * size) as f64);
        push(r, &mut rows);
    }

    // T6 out-of-memory: fraction of the pool handed out before the first null.
    let mut pool = DeviceHeap::new(backend, cfg.oom_pool)?;
    for &size in &cfg.sizes {
        pool.reset()?;
        // At least 32 threads per round (fewer when N is smaller), at most N.
        let threads = (cfg.oom_pool / size / 16).clamp(32.min(n), n);
        let mut handed = 0u64;
        let mut t = Vec::new();
        let mut batches = Vec::new();
        loop {
            let batch = ops::malloc_batch(&pool, &Sizes::Uniform(size), threads, false)?;
            t.push(batch.timing().ms());
            let ok = batch.read_ptrs()?.iter().filter(|&&p| p != 0).count() as u64;
            handed += ok * size;
            batches.push(batch);
            if ok < threads {
                break;
            }
        }
        for b in batches {
            ops::free_batch(&pool, b, 1)?;
        }
        let s = Series { alloc: t, free: vec![], nulls: 0, allocs: threads, bytes: threads * size };
        let mut r = row("T6", "heap", size.to_string(), threads, "-", &s);
        r.ratio = Some(handed as f64 / cfg.oom_pool as f64);
        push(r, &mut rows);
    }
    drop(pool);

    // Churn.
    let mut t = Vec::new();
    let mut total = 0;
    let mut nulls = 0;
    for _ in 0..iters.clamp(1, 5) {
        heap.reset()?;
        let r = ops::churn(&heap, n, cfg.churn_rounds, (16, 4096), 1, true)?;
        assert_eq!(r.corrupted_words, 0, "churn found overwritten blocks");
        t.push(r.timing.ms());
        total = r.allocations + r.failures;
        nulls += r.failures;
    }
    let s = Series { alloc: t, free: vec![], nulls, allocs: total, bytes: 0 };
    push(row("churn", "heap", "16..4096".into(), n, "-", &s), &mut rows);

    Ok(AllocBenchReport { backend: backend.describe(), config: cfg.clone(), rows, notes })
}

impl AllocBenchReport {
    /// The report as a plain-text table.
    pub fn table(&self) -> String {
        let mut out = format!("# gpuheap bench alloc — {}\n", self.backend);
        out += &format!(
            "{:<6} {:<12} {:>9} {:>8} {:>5} {:>10} {:>10} {:>10} {:>10} {:>11} {:>11} {:>6} {:>7}\n",
            "test",
            "allocator",
            "size",
            "threads",
            "state",
            "alloc ms",
            "p99 ms",
            "free ms",
            "p99 ms",
            "allocs/s",
            "bytes/s",
            "nulls",
            "ratio"
        );
        for r in &self.rows {
            out += &format!(
                "{:<6} {:<12} {:>9} {:>8} {:>5} {:>10.4} {:>10.4} {:>10.4} {:>10.4} {:>11.3e} {:>11.3e} {:>6} {:>7}\n",
                r.workload,
                r.allocator,
                r.size,
                r.threads,
                r.state,
                r.alloc_ms,
                r.alloc_p99_ms,
                r.free_ms,
                r.free_p99_ms,
                r.allocs_per_s,
                r.bytes_per_s,
                r.nulls,
                r.ratio.map(|x| format!("{x:.3}")).unwrap_or_default()
            );
        }
        for n in &self.notes {
            out += &format!("note: {n}\n");
        }
        out
    }
}
