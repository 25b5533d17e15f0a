//! Benchmark suites run by `gpuheap bench ...` and by the criterion benches.
//!
//! * [`alloc`]: the device allocator against the survey's workloads
//!   (DESIGN.md §3.5), with the bump allocator and,
//!   on a GPU, CUDA's device `malloc` measured side by side in the same run.
//! * [`compact`]: compaction throughput against a plain copy of the same
//!   bytes on the same backend.
//! * [`oom`]: the out-of-memory latency of the device heap against a success.
//! * [`launch`]: the launch-limit probe (GPU only): gpuheap's launch check
//!   against the driver's verdict.

pub mod alloc;
pub mod compact;
pub mod launch;
pub mod oom;

pub use gpuheap::testing::SplitMix64;

/// Median and 99th percentile of `v` (milliseconds), `(0, 0)` when empty.
pub fn median_p99(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let p99 = ((s.len() as f64 * 0.99).ceil() as usize).clamp(1, s.len()) - 1;
    (s[s.len() / 2], s[p99])
}

#[cfg(test)]
mod tests {
    #[test]
    fn percentiles_of_small_samples() {
        assert_eq!(super::median_p99(&[]), (0.0, 0.0));
        assert_eq!(super::median_p99(&[3.0]), (3.0, 3.0));
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(super::median_p99(&v), (51.0, 99.0));
    }
}
