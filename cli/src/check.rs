//! `gpuheap check`: runs the basic kernels and checks their results.

use gpuheap::ops;

use super::args::BackendArgs;
use gpuheap::Error;

#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    backend: BackendArgs,
    /// Buffer size for fill/verify, bytes.
    #[arg(long, default_value_t = 64 << 20)]
    bytes: usize,
    /// Threads for the bump allocator check.
    #[arg(long, default_value_t = 1 << 20)]
    threads: u64,
}

pub(crate) fn run(a: Args) -> Result<(), Error> {
    let size = 16;
    // The bump allocator's region holds `threads` blocks of `size` bytes.
    let region = a.threads.checked_mul(size).ok_or_else(|| {
        Error::input(format!("--threads {}: a bump region of {} × {size} B exceeds 2^64 B", a.threads, a.threads))
    })?;
    let b = a.backend.select()?;
    let rt = Error::from;
    println!("backend: {}", b.describe());
    let buf = b.alloc_zeroed(a.bytes).map_err(rt)?;
    let t_fill = ops::fill(&b, &buf, 1).map_err(rt)?;
    let (r, t_verify) = ops::verify(&b, &buf, 1).map_err(rt)?;
    let gbs = |ms: f64| a.bytes as f64 / (ms * 1e-3) / 1e9;
    println!("fill   {:>10} B  {:>9.3} ms  {:>8.2} GB/s", a.bytes, t_fill.ms(), gbs(t_fill.ms()));
    println!(
        "verify {:>10} B  {:>9.3} ms  {:>8.2} GB/s  mismatches {}",
        a.bytes,
        t_verify.ms(),
        gbs(t_verify.ms()),
        r.mismatches
    );
    let run = ops::bump_alloc(&b, a.threads, size, region).map_err(rt)?;
    let failed = run.offsets.iter().filter(|o| o.is_none()).count();
    let mut offs: Vec<u64> = run.offsets.iter().flatten().copied().collect();
    offs.sort_unstable();
    let disjoint = offs.windows(2).all(|w| w[1] >= w[0] + size);
    println!(
        "bump   {:>10} x {size} B  {:>7.3} ms  {:>8.1} Mallocs/s  failed {failed}  disjoint {disjoint}",
        a.threads,
        run.timing.ms(),
        a.threads as f64 / (run.timing.ms() * 1e-3) / 1e6
    );
    if r.mismatches != 0 || failed != 0 || !disjoint {
        return Err(Error::runtime("self-check failed"));
    }
    println!("ok");
    Ok(())
}
