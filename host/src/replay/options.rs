//! Options of a replay: the strategy, capacity, alignment, compaction policy and limits, and the one
//! rounding rule every replay target applies to a request.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use crate::reference::StrategyKind;
use crate::trace::{Recorder, Trace};
use crate::units::{check_align, ParseError};

/// Default number of timeline samples (the timeline is downsampled to at most this many points).
#[doc(hidden)]
pub const DEFAULT_TIMELINE_POINTS: usize = 2000;
/// Default materialisation limit on the CPU backend, bytes (1 GiB).
#[doc(hidden)]
pub const DEFAULT_MATERIALIZE_LIMIT_CPU: u64 = 1 << 30;

/// When to compact.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CompactPolicy {
    /// Never.
    Never,
    /// When a request fails although it would fit after a perfect compaction; the request is retried.
    OnOom,
    /// After a free that leaves external fragmentation above the fraction (in `[0, 1]`).
    Threshold(f64),
}

impl fmt::Display for CompactPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CompactPolicy::Never => f.write_str("never"),
            CompactPolicy::OnOom => f.write_str("on-oom"),
            CompactPolicy::Threshold(t) => write!(f, "threshold={t}"),
        }
    }
}

/// A compaction policy that cannot be parsed ([`CompactPolicy::from_str`]). `Display` is one line
/// naming the value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
#[doc(hidden)]
pub enum PolicyError {
    /// Not `never`, `on-oom` nor `threshold=F`.
    #[error("unknown compaction policy `{0}` (expected never, on-oom or threshold=F)")]
    Unknown(String),
    /// A threshold that is not a fraction in `[0, 1]`.
    #[error("compaction threshold `{0}` is not a fraction in [0, 1]")]
    Threshold(String),
}

impl FromStr for CompactPolicy {
    type Err = PolicyError;
    /// `never`, `on-oom` or `threshold=F` with `F` in `[0, 1]`.
    fn from_str(s: &str) -> Result<Self, PolicyError> {
        let t = s.trim().to_ascii_lowercase().replace('_', "-");
        match t.as_str() {
            "never" | "none" => Ok(CompactPolicy::Never),
            "on-oom" | "oom" => Ok(CompactPolicy::OnOom),
            _ => {
                let v = t.strip_prefix("threshold=").ok_or_else(|| PolicyError::Unknown(s.to_string()))?;
                match v.parse::<f64>() {
                    Ok(f) if (0.0..=1.0).contains(&f) => Ok(CompactPolicy::Threshold(f)),
                    _ => Err(PolicyError::Threshold(v.to_string())),
                }
            }
        }
    }
}

/// Options of [`super::replay`] (a host strategy or the caching model).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ReplayOptions {
    /// The strategy.
    pub strategy: StrategyKind,
    /// Managed capacity in bytes; `None`: [`super::default_capacity`].
    pub capacity: Option<u64>,
    /// Alignment of the requests in bytes (a power of two); `None`: the format's own
    /// ([`alignment_for`]).
    pub align: Option<u64>,
    /// Tiered strategy only: `(small_max, large_min)` in bytes (requests up to `small_max` go to the
    /// small tier, from `large_min` to the large tier); `None`: [`crate::reference::TieredConfig::for_capacity`].
    pub tiers: Option<(u64, u64)>,
    /// Compaction policy.
    pub policy: CompactPolicy,
    /// Largest image (bytes) a compaction materialises on the backend before it compacts a scaled image
    /// instead; `None`: [`DEFAULT_MATERIALIZE_LIMIT_CPU`] on the CPU, 80 % of the free device memory on the
    /// GPU.
    pub materialize_limit: Option<u64>,
    /// Most timeline samples kept.
    pub timeline_points: usize,
}

impl ReplayOptions {
    /// Defaults for `strategy`: derived capacity, the format's alignment, no compaction, default limits.
    pub fn new(strategy: StrategyKind) -> Self {
        ReplayOptions {
            strategy,
            capacity: None,
            align: None,
            tiers: None,
            policy: CompactPolicy::Never,
            materialize_limit: None,
            timeline_points: DEFAULT_TIMELINE_POINTS,
        }
    }
}

/// The strategy a replay of `trace` uses when none is given: the model of the allocator the format
/// records when gpuheap has one (the PyTorch caching model for PyTorch snapshots,
/// [`Recorder::PytorchCaching`]), best-fit otherwise (it runs at any capacity; the caching model needs at
/// least one 2 MiB segment).
#[doc(hidden)]
pub fn default_strategy(trace: &Trace) -> StrategyKind {
    match trace.format.row().recorder {
        Recorder::PytorchCaching => StrategyKind::Caching,
        _ => StrategyKind::BestFit,
    }
}

/// The natural alignment (bytes) of `trace`'s requests, its format's ([`crate::trace::FormatRow::align`]):
/// [`PYTORCH_ALIGN`](crate::trace::PYTORCH_ALIGN) for PyTorch snapshots, [`CSV_ALIGN`](crate::trace::CSV_ALIGN) for minimalloc (buffer-lifetime) CSV files,
/// [`DEFAULT_ALIGN`](crate::trace::DEFAULT_ALIGN) for RMM logs.
#[doc(hidden)]
pub fn alignment_for(trace: &Trace) -> u64 {
    trace.format.row().align
}

/// The alignment a replay uses: `given` when set, else [`alignment_for`] the trace.
///
/// # Errors
/// [`ParseError::Alignment`] when `given` is zero, not a power of two, or above 1 GiB.
#[doc(hidden)]
pub fn choose_alignment(trace: &Trace, given: Option<u64>) -> Result<u64, ParseError> {
    given.map_or(Ok(alignment_for(trace)), check_align)
}

/// Where the alignment of a replay comes from, for the report: `given`, or the format's default and why.
#[doc(hidden)]
pub fn alignment_source(trace: &Trace, given: Option<u64>) -> String {
    if given.is_some() {
        return "given".into();
    }
    trace.format.row().align_source.into()
}

/// The block a request of `requested` bytes is sent as: zero counts as one byte, rounded up to `align`
/// (saturating; a size no strategy holds is then refused by the strategy as too large).
#[inline]
#[doc(hidden)]
pub fn round_request(requested: u64, align: u64) -> u64 {
    let r = requested.max(1);
    if align.is_power_of_two() {
        // The same value without a division (the smallest multiple of `align` at or above `r`; when
        // `r + align − 1` overflows, that multiple is 2^64 or more: saturated as below).
        r.checked_add(align - 1).map_or(u64::MAX, |x| x & !(align - 1))
    } else {
        r.div_ceil(align).saturating_mul(align)
    }
}

#[cfg(test)]
mod tests {
    use super::round_request;

    /// The power-of-two path (a mask) gives the division's value, saturation at 2^64 − 1 included.
    #[test]
    fn round_request_mask_matches_the_division() {
        let division = |r: u64, a: u64| r.max(1).div_ceil(a).saturating_mul(a);
        let sizes = [0, 1, 2, 511, 512, 513, 4095, 4096, 255_983, 3_160_320, u64::MAX / 2, u64::MAX - 512, u64::MAX];
        for shift in 0..64 {
            let a = 1u64 << shift;
            for &r in &sizes {
                assert_eq!(round_request(r, a), division(r, a), "requested {r} align {a}");
            }
        }
        assert_eq!(round_request(1000, 3), 1002);
        assert_eq!(round_request(0, 512), 512);
        assert_eq!(round_request(u64::MAX - 100, 1 << 20), u64::MAX);
    }
}
