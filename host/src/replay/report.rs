//! What a replay reports: one [`ReplayReport`] for every target (host strategy, caching model, device
//! heap), built by the engine (`super::engine`).

use std::fmt;

use serde::Serialize;

use crate::analysis::{FailureClass, Fragmentation};

use super::device::DeviceHeapEnd;
use super::materialize::MeasureOutcome;
use crate::facts::{Capacity, HistoryCompleteness, PytorchReserved};
use crate::reference::caching::RecordedRelease;

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// A request the strategy could not serve.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[doc(hidden)]
pub struct FailedRequest {
    /// Event index (`None`: an initial block).
    pub event: Option<usize>,
    /// Requested bytes.
    pub size: u64,
    /// Capacity, fragmentation (would fit after a perfect compaction) or rejected.
    pub class: FailureClass,
    /// Free bytes at the failure (all free extents, cached memory included).
    pub free: u64,
    /// Largest free extent at the failure, bytes.
    pub largest_free: u64,
}

/// What made a compaction run (serialised as `on-oom` or `threshold`, the policy's names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
#[doc(hidden)]
pub enum CompactionTrigger {
    /// A request failed although it would fit after a perfect compaction (policy `on-oom`).
    OnOom,
    /// A free left external fragmentation above the threshold (policy `threshold=F`).
    Threshold,
}

impl CompactionTrigger {
    /// `on-oom` or `threshold`.
    pub fn as_str(self) -> &'static str {
        match self {
            CompactionTrigger::OnOom => "on-oom",
            CompactionTrigger::Threshold => "threshold",
        }
    }
}

impl fmt::Display for CompactionTrigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl PartialEq<&str> for CompactionTrigger {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// One compaction.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[doc(hidden)]
pub struct CompactionRecord {
    /// Event index at which it ran.
    pub event: usize,
    /// What made it run.
    pub trigger: CompactionTrigger,
    /// The failed request's bytes (on-oom).
    pub request: Option<u64>,
    /// Whether the retried request then succeeded (on-oom).
    pub retry_succeeded: Option<bool>,
    /// Live units (blocks, slab pages) in the layout.
    pub units: usize,
    /// Bytes the reference plan moves at full size.
    pub planned_bytes_moved: u64,
    /// Units the reference plan moves.
    pub planned_units_moved: usize,
    /// External fragmentation before.
    pub external_before: f64,
    /// External fragmentation after.
    pub external_after: f64,
    /// Footprint before, bytes.
    pub footprint_before: u64,
    /// Footprint after, bytes.
    pub footprint_after: u64,
    /// The kernel measurement, or why there is none.
    pub measurement: MeasureOutcome,
}

/// One timeline sample: the maxima over a bucket of consecutive events (bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
#[doc(hidden)]
pub struct Sample {
    /// Last event of the bucket.
    pub event: usize,
    /// Its time stamp (see [`crate::trace::Trace::time_unit`]).
    pub time: Option<i64>,
    /// Highest requested bytes live in the bucket.
    pub allocated: u64,
    /// Highest footprint in the bucket.
    pub footprint: u64,
    /// Highest PyTorch reserved bytes in the bucket (snapshots with segments only).
    pub pytorch_reserved: Option<u64>,
    /// External fragmentation at the end of the bucket.
    pub external: f64,
}

/// One tier of the tiered strategy over a replay (bytes unless named otherwise). A request goes to the
/// small (slab) tier when its aligned size is at most `small_max`, to the large (top-down) tier from
/// `large_min`, to the medium tier (first-fit from the bottom of the shared range) in between.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[doc(hidden)]
pub struct TierStats {
    /// `small`, `medium` or `large`.
    pub tier: String,
    /// Smallest aligned request size of the tier.
    pub min_size: u64,
    /// Largest aligned request size of the tier (`u64::MAX` for the large tier).
    pub max_size: u64,
    /// Requests routed to the tier (served or failed).
    pub requests: u64,
    /// Of those, failed.
    pub failed: u64,
    /// Requested bytes of the served requests.
    pub requested_bytes: u64,
    /// Block bytes of the served requests (the strategy's rounding included).
    pub block_bytes: u64,
    /// Highest requested bytes live in the tier.
    pub peak_live: u64,
    /// Internal fragmentation of the tier: `1 − requested_bytes / block_bytes` (0 when nothing served).
    pub internal_fragmentation: f64,
}

/// The caching model's state at the end, for the fidelity check against the snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
#[doc(hidden)]
pub struct CachingEnd {
    /// Reserved bytes (segments).
    pub reserved: u64,
    /// Segments.
    pub segments: u64,
    /// Segments seeded from the snapshot.
    pub seeded_segments: u64,
    /// Times the model released its cache because an allocation failed and retried (PyTorch's
    /// `num_alloc_retries`; serialised when not 0).
    #[serde(skip_serializing_if = "is_zero")]
    pub alloc_retries: u64,
}

/// `(a − b) / b`, or `None` when `b` is 0 and `a` is not (no ratio to nothing; 0 against 0 is 0).
#[doc(hidden)]
pub fn relative_difference(a: u64, b: u64) -> Option<f64> {
    match (a, b) {
        (0, 0) => Some(0.0),
        (_, 0) => None,
        _ => Some((a as f64 - b as f64) / b as f64),
    }
}

/// The caching model's end state against the snapshot's ([`ReplayReport::end_fidelity`]).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[non_exhaustive]
#[doc(hidden)]
pub struct EndFidelity {
    /// The model's reserved bytes at the end.
    pub model_reserved: u64,
    /// The snapshot's (its final state, else the segment events' end).
    pub snapshot_reserved: u64,
    /// `(model − snapshot) / snapshot` reserved bytes; `None` when the snapshot reserves 0 B and the model
    /// does not.
    pub reserved: Option<f64>,
    /// The model's segments at the end.
    pub model_segments: u64,
    /// The snapshot's.
    pub snapshot_segments: u64,
    /// `(model − snapshot) / snapshot` segments; `None` when the snapshot has none and the model has.
    pub segments: Option<f64>,
}

/// What a replay reports. Bytes, ns, events/s unless named otherwise.
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct ReplayReport {
    /// The trace file.
    pub trace: String,
    /// Its format.
    pub format: String,
    /// Device ordinal of the trace.
    pub device: i64,
    /// Strategy name.
    pub strategy: String,
    /// Capacity used; serialised with its source in words (`{"bytes": N, "source": "..."}`,
    /// [`Capacity::serialize_described`]).
    #[serde(serialize_with = "Capacity::serialize_described")]
    pub capacity: Capacity,
    /// Alignment of the requests, bytes.
    pub align: u64,
    /// Where `align` comes from (`given`, or the format's default and why).
    pub align_source: String,
    /// Compaction policy.
    pub policy: String,
    /// Events replayed (all kinds).
    pub events: usize,
    /// Alloc events.
    pub allocs: usize,
    /// `free_completed` events.
    pub frees: usize,
    /// `free_requested` events (counted only).
    pub free_requests: usize,
    /// Blocks alive before the first event.
    pub initial_blocks: usize,
    /// Highest requested bytes live.
    pub peak_allocated: u64,
    /// Highest footprint.
    pub peak_reserved: u64,
    /// Event after which `peak_reserved` was first reached.
    pub peak_reserved_event: Option<usize>,
    /// `peak_allocated / peak_reserved`.
    pub utilisation: f64,
    /// Johnstone–Wilson #4 `(peak_reserved − peak_allocated) / peak_allocated`.
    pub johnstone_wilson: f64,
    /// Failed requests (every one).
    pub failed: Vec<FailedRequest>,
    /// Metrics at the demand peak.
    pub at_peak: Fragmentation,
    /// Metrics after the last event.
    pub at_end: Fragmentation,
    /// Compactions.
    pub compactions: Vec<CompactionRecord>,
    /// Wall time of the event loop, ns.
    pub replay_ns: u64,
    /// `events / replay time`.
    pub events_per_s: f64,
    /// PyTorch's own reserved bytes (snapshots with segments).
    pub pytorch: Option<PytorchReserved>,
    /// The caching model's end state (caching strategy only).
    pub caching_end: Option<CachingEnd>,
    /// The device heap's figures (device allocator only, see `super::device`).
    pub device_heap: Option<DeviceHeapEnd>,
    /// Per-tier figures (tiered strategy only): small, medium, large.
    pub tiers: Option<Vec<TierStats>>,
    /// The releases the trace records (PyTorch snapshots), each classified: PyTorch's allocator's own
    /// (left to the model, which releases when its own allocation fails at this capacity) or the
    /// program's (`empty_cache()`, replayed as recorded), with the evidence
    /// (`crate::reference::caching::releases`). Serialised when not empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub recorded_releases: Vec<RecordedRelease>,
    /// How complete the trace's history is and what that costs (serialised when not complete).
    #[serde(skip_serializing_if = "HistoryCompleteness::is_complete")]
    pub history: HistoryCompleteness,
    /// Timeline samples.
    pub timeline: Vec<Sample>,
}

impl ReplayReport {
    /// The caching model's end state against the snapshot's (caching model of a snapshot only).
    #[doc(hidden)]
    pub fn end_fidelity(&self) -> Option<EndFidelity> {
        let (c, pt) = (self.caching_end.as_ref()?, self.pytorch.as_ref()?);
        let (pr, ps) = (pt.snapshot_reserved.unwrap_or(pt.end), pt.snapshot_segments.unwrap_or(pt.end_segments));
        Some(EndFidelity {
            model_reserved: c.reserved,
            snapshot_reserved: pr,
            reserved: relative_difference(c.reserved, pr),
            model_segments: c.segments,
            snapshot_segments: ps,
            segments: relative_difference(c.segments, ps),
        })
    }
}
