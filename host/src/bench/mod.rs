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

/// SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
/// generators", OOPSLA 2014): the small seeded generator behind every
/// reproducible workload and layout of the benchmarks and tests. Not for
/// anything that needs unpredictability.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator seeded with `seed` (every seed, 0 included, is fine).
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, n)` (`n > 0`; the modulo bias is negligible for the
    /// small `n` used here).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Uniform in `[lo, hi]` (`lo <= hi`).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

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
