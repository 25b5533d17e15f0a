//! Trace replay: runs one device's allocation trace ([`crate::trace::DeviceTrace`]) through a host
//! strategy ([`crate::reference`]), optionally compacting with the real compaction kernel, and reports
//! what happened.
//!
//! # Semantics
//!
//! * **Requests.** Every `alloc` event becomes `alloc(size rounded up to align, align)`. For PyTorch
//!   snapshots the alignment is [`PYTORCH_ALIGN`] = 512 B, like PyTorch's CUDA caching allocator
//!   (`kMinBlockSize`), so every strategy sees the block sizes PyTorch itself would carve; for the other
//!   formats it is [`DEFAULT_ALIGN`] = 256 B (`cudaMalloc`'s and RMM's alignment). A zero-byte request is
//!   sent as one byte. The *allocated* series counts the requested (unrounded) bytes of the trace.
//! * **Frees.** `free_completed` (RMM `free`, CSV end of lifetime) frees the block with the same dense
//!   id ([`crate::trace::Event::id`]); `free_requested` is only counted. A free of a block whose alloc
//!   failed is skipped.
//! * **Initial state.** Blocks alive before the first event ([`crate::trace::DeviceTrace::initial_blocks`])
//!   are allocated first, in address order. For the caching model of a PyTorch snapshot the model is built
//!   with the snapshot's own settings ([`caching::config_for_trace`]) and seeded with the segments (and
//!   expandable mapped ranges) alive before the first event, with those blocks at their recorded places
//!   ([`caching::seed_from_trace`]), so the model starts from PyTorch's own state.
//! * **Streams.** The caching model serves each `alloc` on the event's stream (per-stream pools).
//! * **Segment events** drive the *PyTorch reserved* series (initial segments, plus `segment_alloc` /
//!   `segment_map`, minus `segment_free` / `segment_unmap`, counted once: expandable ranges mapped during the
//!   trace are not initial). For the caching model they also place its segments at PyTorch's addresses and
//!   release or unmap what PyTorch released, at the same event ([`caching::RecordedSegments`]); another
//!   strategy's [`SubAllocator::release_cached`] is called at the first event of each run of releases (a
//!   no-op for strategies without a cache).
//! * **Footprint** ("reserved" of a strategy, bytes): for the caching model its reserved bytes (the sum
//!   of its segments, PyTorch's `reserved_bytes`); for tiered, the bytes spanned by its two ends (end of
//!   the highest block placed bottom-up plus capacity minus the start of the lowest large block placed
//!   top-down); for every other strategy the address high-water mark (end of the highest live block).
//!   *Peak reserved* is its maximum over the run.
//! * **Metrics** (`shared/research/compaction-defrag.md` §4.3, reported together): peak allocated, peak
//!   reserved, peak utilisation and Johnstone–Wilson #4 `(max footprint − max live) / max live`
//!   ([`PeakTracker`]); at the demand peak (the event after which the trace's live requested bytes are
//!   highest, the same event for every strategy) and at the end: external fragmentation
//!   `1 − largest free / total free` over all free extents (device memory outside the heap included),
//!   reserved-but-unallocated = footprint − allocated split into rounding waste (block bytes − requested
//!   bytes) and holes (footprint − block bytes), the RMS metric and a [`FragLevel`].
//! * **Failed requests** are classified with [`analysis::diagnose`]: *fragmentation* when the free bytes
//!   would hold the request after a perfect compaction, else *capacity*; other refusals (a size over the
//!   strategy's limit) are *rejected*.
//! * **Compaction** ([`CompactPolicy`]): `on-oom` compacts when a request fails for fragmentation and
//!   retries it; `threshold=F` compacts after a free that leaves external fragmentation above `F` (once,
//!   re-armed when it falls to `F` or below). Each compaction plans the reference slide
//!   ([`crate::reference::compact::plan_slide`]), measures it with the real kernel on the chosen backend
//!   ([`materialize`]), then updates the strategy with [`SubAllocator::apply_relocation`].
//! * **Speed.** `replay_ns` is the wall time of the event loop alone: reading the file, the fragmentation
//!   analyses at the peak and at the end and the compactions are excluded.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;
use std::str::FromStr;
use std::time::Instant;

use serde::Serialize;

use crate::analysis::{self, FragLevel, PeakTracker};
use crate::backend::Backend;
use crate::reference::caching::{self, CachingAllocator};
use crate::reference::compact::plan_slide;
use crate::reference::{build, AllocError, StrategyKind, SubAllocator, TieredConfig};
use crate::trace::{DeviceTrace, EventKind, Trace, TraceFormat};

pub mod device;
pub mod materialize;
#[cfg(feature = "cli")]
pub mod plot;

pub use device::{replay_device, DeviceHeapEnd, DeviceReplayOptions};
pub use materialize::{MeasureOutcome, Measured};

/// Alignment (bytes) of replayed PyTorch requests: PyTorch's `kMinBlockSize`.
pub const PYTORCH_ALIGN: u64 = 512;
/// Alignment (bytes) of replayed requests of the other formats (`cudaMalloc`, RMM).
pub const DEFAULT_ALIGN: u64 = 256;
/// Default number of timeline samples (the timeline is downsampled to at most this many points).
pub const DEFAULT_TIMELINE_POINTS: usize = 2000;
/// Default materialisation limit on the CPU backend, bytes (1 GiB).
pub const DEFAULT_MATERIALIZE_LIMIT_CPU: u64 = 1 << 30;
/// Smallest capacity accepted, bytes.
pub const MIN_CAPACITY: u64 = 4096;

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

impl FromStr for CompactPolicy {
    type Err = String;
    /// `never`, `on-oom` or `threshold=F` with `F` in `[0, 1]`.
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim().to_ascii_lowercase().replace('_', "-");
        match t.as_str() {
            "never" | "none" => Ok(CompactPolicy::Never),
            "on-oom" | "oom" => Ok(CompactPolicy::OnOom),
            _ => {
                let v = t.strip_prefix("threshold=").ok_or_else(|| {
                    format!("unknown compaction policy `{s}` (expected never, on-oom or threshold=F)")
                })?;
                match v.parse::<f64>() {
                    Ok(f) if (0.0..=1.0).contains(&f) => Ok(CompactPolicy::Threshold(f)),
                    _ => Err(format!("compaction threshold `{v}` is not a fraction in [0, 1]")),
                }
            }
        }
    }
}

/// Parses a byte count: plain bytes (`1048576`), a float (`1.5e9`), or a number with a unit
/// (`80GiB`, `512 MiB`, `2GB`, `4k`; binary units KiB/MiB/GiB/TiB and K/M/G/T = powers of 1024,
/// decimal units kB/MB/GB/TB = powers of 1000). The result is rounded down to whole bytes.
///
/// # Errors
/// A one-line message for an empty, negative, non-finite or unparsable value or one above 2^64 − 1.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E').unwrap_or(t.len());
    // `1e9` has an `e` that is part of the number; a unit never starts with `e`.
    let (num, unit) = t.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let mult: f64 = match unit.as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024f64.powi(2),
        "g" | "gib" => 1024f64.powi(3),
        "t" | "tib" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return Err(format!("unknown unit `{}` in byte count `{s}`", unit)),
    };
    let v: f64 = num.trim().parse().map_err(|_| format!("`{s}` is not a byte count (e.g. 80GiB, 1.5e9, 1048576)"))?;
    let bytes = v * mult;
    if !bytes.is_finite() || !(0.0..18_446_744_073_709_551_615.0).contains(&bytes) {
        return Err(format!("byte count `{s}` is negative or out of range"));
    }
    Ok(bytes as u64)
}

/// Options of [`replay`].
#[derive(Clone, Debug)]
pub struct ReplayOptions {
    /// The strategy.
    pub strategy: StrategyKind,
    /// Managed capacity in bytes; `None`: [`default_capacity`].
    pub capacity: Option<u64>,
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
    /// Defaults for `strategy`: derived capacity, no compaction, default limits.
    pub fn new(strategy: StrategyKind) -> Self {
        ReplayOptions {
            strategy,
            capacity: None,
            policy: CompactPolicy::Never,
            materialize_limit: None,
            timeline_points: DEFAULT_TIMELINE_POINTS,
        }
    }
}

/// Errors of [`replay`].
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The options do not fit the trace (a capacity the strategy cannot use...): bad input.
    #[error("{0}")]
    Config(String),
    /// A compaction failed or its check failed: a run-time failure.
    #[error("compaction at event {event}: {message}")]
    Compaction {
        /// Event index.
        event: usize,
        /// What went wrong.
        message: String,
    },
    /// The device heap failed ([`device::replay_device`]): it could not be created, a launch or a
    /// read-back failed, or a returned block failed a check (outside the arena, misaligned, overlapping a
    /// live block, disagreeing with the heap's metadata, bytes overwritten): a run-time failure.
    #[error("device heap{}: {message}", event.map_or_else(String::new, |e| format!(" at event {e}")))]
    Device {
        /// Event index (`None`: before the first event or not tied to one).
        event: Option<usize>,
        /// What went wrong.
        message: String,
    },
    /// The strategy refused an operation the trace makes valid (a bug in the strategy).
    #[error("event {event}: the strategy refused a valid operation: {source}")]
    Strategy {
        /// Event index.
        event: usize,
        /// Its error.
        source: AllocError,
    },
}

impl ReplayError {
    /// `true` for bad input (exit code 2), `false` for run-time failures (exit code 1).
    pub fn is_input(&self) -> bool {
        matches!(self, ReplayError::Config(_))
    }
}

/// A capacity and where it came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CapacityChoice {
    /// Bytes.
    pub bytes: u64,
    /// How it was chosen.
    pub source: String,
}

/// The capacity a replay of `dev` uses when none is given, from the evidence
/// ([`crate::explain::capacity_from_evidence`]):
///
/// * at a recorded OOM: the GPU's memory then (PyTorch's reserved bytes plus the event's `device_free`);
/// * PyTorch snapshots otherwise: PyTorch's recorded peak reserved bytes (segment events, and the
///   snapshot's final state), rounded up to a whole GiB — the memory PyTorch itself used, plus the slack
///   of a partly used last GiB (said in the source text);
/// * minimalloc CSV files named `NAME.CAPACITY.csv` (minimalloc's convention, e.g. `K.1048576.csv`):
///   that capacity;
/// * otherwise twice the peak of live requested bytes, rounded up to 2 MiB.
///
/// Never below [`MIN_CAPACITY`].
///
/// # Errors
/// [`ReplayError::Config`] (bad input) naming the event or CSV line when no capacity can be derived: a
/// size beyond the largest device modelled (shared/cases BL-23); `--capacity` then replays the rest.
pub fn default_capacity(trace: &Trace, dev: &DeviceTrace) -> Result<CapacityChoice, ReplayError> {
    use crate::explain::{capacity_from_evidence, CapacitySource};
    let c = capacity_from_evidence(trace, dev, None).map_err(|e| ReplayError::Config(e.to_string()))?;
    let choice = match c.source {
        CapacitySource::PeakReserved => {
            let gib = 1u64 << 30;
            CapacityChoice {
                bytes: c.bytes.div_ceil(gib).max(1).saturating_mul(gib),
                source: format!("PyTorch peak reserved {} rounded up to a whole GiB", fmt_bytes(c.bytes)),
            }
        }
        _ => CapacityChoice { bytes: c.bytes, source: c.describe() },
    };
    Ok(CapacityChoice { bytes: choice.bytes.max(MIN_CAPACITY), ..choice })
}

/// Alignment used for `trace`'s requests (see the module docs).
pub fn alignment_for(trace: &Trace) -> u64 {
    if matches!(trace.format, TraceFormat::PytorchSnapshot(_)) {
        PYTORCH_ALIGN
    } else {
        DEFAULT_ALIGN
    }
}

/// PyTorch's own reserved bytes over the trace, from its segments.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PytorchReserved {
    /// Reserved bytes before the first event (initial segments).
    pub initial: u64,
    /// Highest reserved bytes.
    pub peak: u64,
    /// Event after which the peak was first reached (`None`: before the first event).
    pub peak_event: Option<usize>,
    /// Reserved bytes after the last event, from the segment events.
    pub end: u64,
    /// Segments after the last event, from the segment events.
    pub end_segments: u64,
    /// Reserved bytes in the snapshot's final state (`segments`), when the file has one.
    pub snapshot_reserved: Option<u64>,
    /// Segments in the snapshot's final state.
    pub snapshot_segments: Option<u64>,
    /// Allocated (active block) bytes in the snapshot's final state, rounding included.
    pub snapshot_allocated: Option<u64>,
    /// `oom` events in the trace.
    pub ooms: u64,
}

/// PyTorch's reserved-bytes series summary of `dev`.
pub fn pytorch_series(dev: &DeviceTrace) -> PytorchReserved {
    let initial: u64 = dev.initial_segments.iter().map(|s| s.size).sum();
    let mut r = initial;
    let mut segs = dev.initial_segments.len() as u64;
    let (mut peak, mut peak_event) = (r, None);
    for (i, e) in dev.events.iter().enumerate() {
        match e.kind {
            EventKind::SegmentAlloc => {
                r = r.saturating_add(e.size);
                segs += 1;
            }
            EventKind::SegmentMap => r = r.saturating_add(e.size),
            EventKind::SegmentFree => {
                r = r.saturating_sub(e.size);
                segs = segs.saturating_sub(1);
            }
            EventKind::SegmentUnmap => r = r.saturating_sub(e.size),
            _ => continue,
        }
        if r > peak {
            (peak, peak_event) = (r, Some(i));
        }
    }
    let fin = dev.final_state.as_ref();
    PytorchReserved {
        initial,
        peak,
        peak_event,
        end: r,
        end_segments: segs,
        snapshot_reserved: fin.map(|s| s.reserved_bytes()),
        snapshot_segments: fin.map(|s| s.segment_count() as u64),
        snapshot_allocated: fin.map(|s| s.allocated_bytes()),
        ooms: dev.count(EventKind::Oom) as u64,
    }
}

/// The event after which the trace's live requested bytes are highest (`None`: before the first
/// event, i.e. the initial blocks), and that peak in bytes (summed in 128 bits; a peak above
/// 2^64 − 1 B, possible only with sizes no device holds, is reported as 2^64 − 1).
pub fn demand_peak(dev: &DeviceTrace) -> (Option<usize>, u64) {
    let p = crate::explain::peaks(dev);
    (p.allocated_event, u64::try_from(p.allocated).unwrap_or(u64::MAX))
}

/// A request the strategy could not serve.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FailedRequest {
    /// Event index (`None`: an initial block).
    pub event: Option<usize>,
    /// Requested bytes.
    pub size: u64,
    /// `capacity`, `fragmentation` (would fit after a perfect compaction) or `rejected`.
    pub class: String,
    /// Free bytes at the failure (all free extents, cached memory included).
    pub free: u64,
    /// Largest free extent at the failure, bytes.
    pub largest_free: u64,
}

/// Fragmentation metrics at one moment (bytes unless named otherwise).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct FragSnapshot {
    /// After this event (`None`: before the first event).
    pub event: Option<usize>,
    /// Requested bytes live.
    pub allocated: u64,
    /// Bytes of live blocks, rounding included.
    pub in_use: u64,
    /// Footprint (see the module docs).
    pub footprint: u64,
    /// `footprint − allocated`.
    pub reserved_unallocated: u64,
    /// `in_use − allocated`: rounding waste.
    pub rounding_waste: u64,
    /// `footprint − in_use`: holes.
    pub holes: u64,
    /// All free bytes (inside and outside the footprint).
    pub free: u64,
    /// Largest free extent.
    pub largest_free: u64,
    /// Number of free extents.
    pub free_blocks: usize,
    /// External fragmentation `1 − largest_free / free`.
    pub external: f64,
    /// RMS fragmentation `1 − sqrt(Σ f²) / Σ f`.
    pub rms: f64,
    /// Level of `external`.
    pub level: String,
}

/// One compaction.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CompactionRecord {
    /// Event index at which it ran.
    pub event: usize,
    /// `on-oom` or `threshold`.
    pub trigger: String,
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

/// The caching model's state at the end, for the fidelity check against the snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CachingEnd {
    /// Reserved bytes (segments).
    pub reserved: u64,
    /// Segments.
    pub segments: u64,
    /// Segments seeded from the snapshot.
    pub seeded_segments: u64,
}

/// What [`replay`] reports. Bytes, ns, events/s unless named otherwise.
#[derive(Clone, Debug, Serialize)]
pub struct ReplayReport {
    /// The trace file.
    pub trace: String,
    /// Its format.
    pub format: String,
    /// Device ordinal of the trace.
    pub device: i64,
    /// Strategy name.
    pub strategy: String,
    /// Capacity used.
    pub capacity: CapacityChoice,
    /// Alignment of the requests.
    pub align: u64,
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
    pub at_peak: FragSnapshot,
    /// Metrics after the last event.
    pub at_end: FragSnapshot,
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
    /// The device heap's figures (device allocator only, see [`device`]).
    pub device_heap: Option<DeviceHeapEnd>,
    /// Timeline samples.
    pub timeline: Vec<Sample>,
}

/// Formats bytes with a binary unit (`58.52 GiB`).
pub fn fmt_bytes(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", U[i])
    }
}

// Slot states (0, the default, is "never allocated").
const LIVE: u8 = 1;
const FAILED: u8 = 2;
const FREED: u8 = 3;

#[derive(Clone, Copy, Default)]
struct Slot {
    offset: u64,
    size: u64,
    requested: u64,
    state: u8,
    top: bool,
}

/// How the footprint of a non-caching strategy is tracked: lazy heaps over block ends (bottom-up
/// blocks) and starts (top-down blocks), allocation-free once reserved.
struct Footprint {
    ends: BinaryHeap<(u64, u32)>,
    starts: BinaryHeap<Reverse<(u64, u32)>>,
    capacity: u64,
}

impl Footprint {
    fn new(n: usize, capacity: u64) -> Self {
        Footprint { ends: BinaryHeap::with_capacity(n), starts: BinaryHeap::with_capacity(n), capacity }
    }
    fn push(&mut self, id: u32, s: &Slot) {
        if s.top {
            self.starts.push(Reverse((s.offset, id)));
        } else {
            self.ends.push((s.offset + s.size, id));
        }
    }
    fn current(&mut self, slots: &[Slot]) -> u64 {
        let alive = |slots: &[Slot], id: u32| slots.get(id as usize).is_some_and(|s| s.state == LIVE);
        while let Some(&(end, id)) = self.ends.peek() {
            let s = &slots[id as usize];
            if alive(slots, id) && s.offset + s.size == end && !s.top {
                break;
            }
            self.ends.pop();
        }
        while let Some(&Reverse((start, id))) = self.starts.peek() {
            let s = &slots[id as usize];
            if alive(slots, id) && s.offset == start && s.top {
                break;
            }
            self.starts.pop();
        }
        let low = self.ends.peek().map_or(0, |x| x.0);
        let high = self.starts.peek().map_or(0, |x| self.capacity - x.0 .0);
        // Interleaved ends (a large block placed low) span the whole range.
        (low + high).min(self.capacity)
    }
    fn rebuild(&mut self, slots: &[Slot]) {
        self.ends.clear();
        self.starts.clear();
        for (id, s) in slots.iter().enumerate() {
            if s.state == LIVE {
                self.push(id as u32, s);
            }
        }
    }
}

/// The strategy under replay; the caching model is kept as its concrete type for O(1) reserved bytes.
enum Heap {
    Caching(Box<CachingAllocator>),
    Other(Box<dyn SubAllocator + Send>),
}

impl std::ops::Deref for Heap {
    type Target = dyn SubAllocator + Send;
    fn deref(&self) -> &Self::Target {
        match self {
            Heap::Caching(c) => &**c,
            Heap::Other(b) => &**b,
        }
    }
}

impl std::ops::DerefMut for Heap {
    fn deref_mut(&mut self) -> &mut Self::Target {
        match self {
            Heap::Caching(c) => &mut **c,
            Heap::Other(b) => &mut **b,
        }
    }
}

fn make_heap(kind: StrategyKind, capacity: u64, dev: &DeviceTrace) -> Result<Heap, ReplayError> {
    if !(MIN_CAPACITY..=crate::reference::MAX_BYTES).contains(&capacity) {
        return Err(ReplayError::Config(format!("capacity {capacity} B is outside [{MIN_CAPACITY} B, 2^48 B]")));
    }
    if kind != StrategyKind::Caching {
        return Ok(Heap::Other(build(kind, capacity)));
    }
    // The snapshot's own settings and evidence (expandable segments, torch_npu), see `config_for_trace`.
    let (cfg, _) = caching::config_for_trace(dev, capacity);
    CachingAllocator::new(cfg)
        .map(|c| Heap::Caching(Box::new(c)))
        .map_err(|e| ReplayError::Config(format!("caching allocator with {capacity} B: {e}")))
}

fn snapshot(heap: &dyn SubAllocator, event: Option<usize>, allocated: u64, footprint: u64) -> FragSnapshot {
    let r = analysis::analyze(heap);
    FragSnapshot {
        event,
        allocated,
        in_use: r.in_use,
        footprint,
        reserved_unallocated: footprint.saturating_sub(allocated),
        rounding_waste: r.in_use.saturating_sub(allocated),
        holes: footprint.saturating_sub(r.in_use),
        free: r.free,
        largest_free: r.largest_free,
        free_blocks: r.free_blocks,
        external: r.external,
        rms: r.rms,
        level: r.level.to_string(),
    }
}

fn ext_of(free: u64, largest: u64) -> f64 {
    if free == 0 {
        0.0
    } else {
        1.0 - largest as f64 / free as f64
    }
}

/// The replay state machine (one strategy, one device trace).
struct Engine<'a> {
    heap: Heap,
    caching: bool,
    slots: Vec<Slot>,
    fp: Footprint,
    align: u64,
    large_min: u64,
    allocated: u64,
    peaks: PeakTracker,
    peak_fp_event: Option<usize>,
    failed: Vec<FailedRequest>,
    compactions: Vec<CompactionRecord>,
    backend: Option<&'a Backend>,
    limit: u64,
    excluded_ns: u64,
    /// Stream of the request being served (caching model: per-stream pools).
    stream: i64,
    /// Caching model of a snapshot: the recorded segment events drive its releases.
    recorded: Option<caching::RecordedSegments>,
}

impl Engine<'_> {
    #[inline]
    fn footprint(&mut self) -> u64 {
        if let Heap::Caching(c) = &self.heap {
            c.reserved_bytes()
        } else {
            self.fp.current(&self.slots)
        }
    }

    #[inline]
    fn observe(&mut self, event: Option<usize>) -> u64 {
        let f = self.footprint();
        if f > self.peaks.max_footprint {
            self.peak_fp_event = event;
        }
        self.peaks.observe(self.allocated, f);
        f
    }

    /// Allocates block `id`; returns `Err(OutOfMemory...)` unchanged for the caller to handle.
    #[inline]
    fn try_alloc(&mut self, id: u32, requested: u64) -> Result<(), AllocError> {
        let size = requested.max(1).div_ceil(self.align).saturating_mul(self.align);
        let a = match &mut self.heap {
            // The model rounds the request itself (roundup divisions, torch_npu's pad) on its stream.
            Heap::Caching(c) => {
                if let Some(r) = self.recorded.as_mut() {
                    r.before_alloc(c);
                }
                let a = c.alloc_on(requested.max(1), self.stream);
                if let Some(r) = self.recorded.as_mut() {
                    r.after_alloc(c, a.as_ref().ok().map(|a| a.offset));
                }
                a?
            }
            Heap::Other(h) => h.alloc(size, self.align)?,
        };
        let top = size >= self.large_min;
        let s = Slot { offset: a.offset, size: a.size, requested, state: LIVE, top };
        self.slots[id as usize] = s;
        if !self.caching {
            self.fp.push(id, &s);
        }
        self.allocated += requested;
        Ok(())
    }

    fn alloc(
        &mut self,
        event: Option<usize>,
        id: u32,
        requested: u64,
        policy: CompactPolicy,
    ) -> Result<(), ReplayError> {
        if id as usize >= self.slots.len() {
            return Ok(());
        }
        let err = match self.try_alloc(id, requested) {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        let mut diag = analysis::diagnose_error(&err);
        if let (CompactPolicy::OnOom, Some(d), Some(i)) = (policy, &diag, event) {
            if d.fits_after_compaction || d.class == analysis::OomClass::Fits {
                let t = Instant::now();
                // A layout that is already compact is left alone (no record, no retry).
                if let Some(mut rec) = self.compact(i, "on-oom")? {
                    rec.request = Some(requested);
                    let retry = self.try_alloc(id, requested);
                    rec.retry_succeeded = Some(retry.is_ok());
                    self.compactions.push(rec);
                    self.excluded_ns += t.elapsed().as_nanos() as u64;
                    match retry {
                        Ok(()) => return Ok(()),
                        Err(e) => diag = analysis::diagnose_error(&e),
                    }
                } else {
                    self.excluded_ns += t.elapsed().as_nanos() as u64;
                }
            }
        }
        self.slots[id as usize].state = FAILED;
        let (class, free, largest_free) = match diag {
            // `Fits` (the largest extent is large enough, but the strategy could not use it: alignment,
            // slab pages) counts as fragmentation: the free bytes would hold the request once compacted.
            Some(d) if d.class == analysis::OomClass::Capacity => ("capacity".to_string(), d.free, d.largest_free),
            Some(d) => ("fragmentation".to_string(), d.free, d.largest_free),
            None => {
                let s = self.heap.stats();
                ("rejected".to_string(), s.free, s.largest_free)
            }
        };
        self.failed.push(FailedRequest { event, size: requested, class, free, largest_free });
        Ok(())
    }

    /// Compacts now; `None` (nothing done) when the reference plan moves nothing.
    fn compact(&mut self, event: usize, trigger: &str) -> Result<Option<CompactionRecord>, ReplayError> {
        let cerr = |message: String| ReplayError::Compaction { event, message };
        let before = self.heap.stats();
        let footprint_before = self.footprint();
        let layout = self.heap.compaction_layout();
        let plan = plan_slide(&layout).map_err(|e| cerr(e.to_string()))?;
        if plan.bytes_moved == 0 {
            return Ok(None);
        }
        let measurement = match self.backend {
            Some(b) => {
                materialize::measure(b, &layout, &plan, self.limit, event as u64).map_err(|e| cerr(e.to_string()))?
            }
            None => MeasureOutcome::NotMeasured { reason: "no backend given".into() },
        };
        self.heap.apply_relocation(&plan).map_err(|e| cerr(e.to_string()))?;
        for s in self.slots.iter_mut().filter(|s| s.state == LIVE) {
            if let Some(d) = plan.translate(s.offset) {
                s.offset = d;
            }
        }
        if !self.caching {
            self.fp.rebuild(&self.slots);
        }
        let after = self.heap.stats();
        Ok(Some(CompactionRecord {
            event,
            trigger: trigger.into(),
            request: None,
            retry_succeeded: None,
            units: plan.moves.len(),
            planned_bytes_moved: plan.bytes_moved,
            planned_units_moved: plan.blocks_moved,
            external_before: ext_of(before.free, before.largest_free),
            external_after: ext_of(after.free, after.largest_free),
            footprint_before,
            footprint_after: self.footprint(),
            measurement,
        }))
    }
}

/// Replays `dev` (a device of `trace`) with `opts`. Compactions run their kernel measurement on
/// `backend` (none: compactions are planned and applied, but not measured). `progress` is called with
/// the number of events done, every 65,536 events and at the end.
///
/// # Errors
/// [`ReplayError::Config`] for a capacity the strategy cannot use; [`ReplayError::Compaction`] when a
/// compaction fails or its check fails; [`ReplayError::Strategy`] when a strategy refuses a free the
/// trace makes valid.
pub fn replay(
    trace: &Trace,
    dev: &DeviceTrace,
    opts: &ReplayOptions,
    backend: Option<&Backend>,
    progress: &mut dyn FnMut(usize),
) -> Result<ReplayReport, ReplayError> {
    let capacity = match opts.capacity {
        Some(c) => CapacityChoice { bytes: c, source: "given".into() },
        None => default_capacity(trace, dev)?,
    };
    let align = alignment_for(trace);
    let caching = opts.strategy == StrategyKind::Caching;
    let pytorch_snapshot = matches!(trace.format, TraceFormat::PytorchSnapshot(_));
    let mut heap = make_heap(opts.strategy, capacity.bytes, dev)?;
    let large_min = if opts.strategy == StrategyKind::Tiered {
        TieredConfig::for_capacity(capacity.bytes.clamp(4096, crate::reference::MAX_BYTES)).large_min
    } else {
        u64::MAX
    };
    let limit = opts.materialize_limit.unwrap_or_else(|| match backend {
        Some(Backend::Gpu(g)) => g.mem_info().map_or(DEFAULT_MATERIALIZE_LIMIT_CPU, |(free, _)| free as u64 / 10 * 8),
        _ => DEFAULT_MATERIALIZE_LIMIT_CPU,
    });
    let n_blocks = dev.block_ids as usize;
    let (peak_event, _) = demand_peak(dev);
    let has_segments =
        pytorch_snapshot && (!dev.initial_segments.is_empty() || dev.events.iter().any(|e| e.kind.is_segment()));

    let mut seeded_segments = 0;
    let mut eng = Engine {
        heap: Heap::Other(build(StrategyKind::FirstFit, MIN_CAPACITY)),
        caching,
        slots: vec![Slot::default(); n_blocks],
        fp: Footprint::new(if caching { 0 } else { n_blocks }, capacity.bytes),
        align,
        large_min,
        allocated: 0,
        peaks: PeakTracker::default(),
        peak_fp_event: None,
        failed: Vec::new(),
        compactions: Vec::new(),
        backend,
        limit,
        excluded_ns: 0,
        stream: 0,
        recorded: None,
    };
    let mut initial: Vec<usize> = (0..dev.initial_blocks.len()).collect();
    initial.sort_by_key(|&i| dev.initial_blocks[i].addr);
    if let (true, Heap::Caching(c)) = (pytorch_snapshot, &heap) {
        let cfg = c.config();
        let seeded = caching::seed_from_trace(dev, cfg).map_err(|e| ReplayError::Config(e.to_string()))?;
        eng.recorded = Some(caching::RecordedSegments::new(dev, &seeded));
        for &(id, a) in &seeded.blocks {
            let requested = dev.initial_blocks[id as usize].size;
            eng.slots[id as usize] = Slot { offset: a.offset, size: a.size, requested, state: LIVE, top: false };
            eng.allocated += requested;
        }
        seeded_segments = seeded.segments;
        initial = seeded.unplaced;
        initial.sort_by_key(|&i| dev.initial_blocks[i].addr);
        heap = Heap::Caching(Box::new(seeded.model));
    }
    eng.heap = heap;
    for i in initial {
        let b = &dev.initial_blocks[i];
        eng.stream = b.stream;
        eng.alloc(None, b.id, b.size, CompactPolicy::Never)?;
    }
    eng.observe(None);
    let start = Instant::now();

    let mut pt_reserved: u64 = dev.initial_segments.iter().map(|s| s.size).sum();
    let points = opts.timeline_points.max(1);
    let stride = dev.events.len().div_ceil(points).max(1);
    let mut timeline: Vec<Sample> = Vec::with_capacity(dev.events.len().div_ceil(stride) + 1);
    let mut bucket = Sample::default();
    let mut at_peak = None;
    if peak_event.is_none() {
        let t = Instant::now();
        let f = eng.footprint();
        at_peak = Some(snapshot(&*eng.heap, None, eng.allocated, f));
        eng.excluded_ns += t.elapsed().as_nanos() as u64;
    }
    let (mut allocs, mut frees, mut free_requests) = (0usize, 0usize, 0usize);
    let mut armed = true;
    let mut prev_kind = EventKind::Other;
    let mut fp = eng.peaks.max_footprint;
    for (i, e) in dev.events.iter().enumerate() {
        match e.kind {
            EventKind::Alloc => {
                allocs += 1;
                eng.stream = e.stream;
                eng.alloc(Some(i), e.id, e.size, opts.policy)?;
                fp = eng.observe(Some(i));
            }
            EventKind::Free => {
                frees += 1;
                if let Some(s) = eng.slots.get_mut(e.id as usize) {
                    if s.state == LIVE {
                        s.state = FREED;
                        let (off, req) = (s.offset, s.requested);
                        eng.heap.free_at(off).map_err(|source| ReplayError::Strategy { event: i, source })?;
                        eng.allocated -= req;
                    }
                }
                fp = eng.observe(Some(i));
                if let CompactPolicy::Threshold(th) = opts.policy {
                    let st = eng.heap.stats();
                    let ext = ext_of(st.free, st.largest_free);
                    if ext <= th {
                        armed = true;
                    } else if armed && st.live_blocks > 0 {
                        armed = false;
                        let t = Instant::now();
                        if let Some(rec) = eng.compact(i, "threshold")? {
                            eng.compactions.push(rec);
                        }
                        eng.excluded_ns += t.elapsed().as_nanos() as u64;
                        fp = eng.observe(Some(i));
                    }
                }
            }
            EventKind::FreeRequested => free_requests += 1,
            EventKind::SegmentAlloc | EventKind::SegmentMap | EventKind::SegmentFree | EventKind::SegmentUnmap => {
                if matches!(e.kind, EventKind::SegmentAlloc | EventKind::SegmentMap) {
                    pt_reserved = pt_reserved.saturating_add(e.size);
                } else {
                    pt_reserved = pt_reserved.saturating_sub(e.size);
                }
                // The caching model releases what PyTorch released (`RecordedSegments`); a strategy without
                // a cache is asked to release at the first event of each run of releases.
                let released = match (&mut eng.heap, eng.recorded.as_mut()) {
                    (Heap::Caching(c), Some(r)) => r.on_segment_event(c, e),
                    (h, _) => {
                        let first = !matches!(prev_kind, EventKind::SegmentFree | EventKind::SegmentUnmap);
                        if first && matches!(e.kind, EventKind::SegmentFree | EventKind::SegmentUnmap) {
                            h.release_cached()
                        } else {
                            0
                        }
                    }
                };
                if released > 0 {
                    fp = eng.observe(Some(i));
                }
            }
            EventKind::Oom | EventKind::Snapshot | EventKind::Other => {}
        }
        prev_kind = e.kind;
        bucket.allocated = bucket.allocated.max(eng.allocated);
        bucket.footprint = bucket.footprint.max(fp);
        if has_segments {
            bucket.pytorch_reserved = Some(bucket.pytorch_reserved.unwrap_or(0).max(pt_reserved));
        }
        if Some(i) == peak_event {
            let t = Instant::now();
            at_peak = Some(snapshot(&*eng.heap, Some(i), eng.allocated, fp));
            eng.excluded_ns += t.elapsed().as_nanos() as u64;
        }
        if (i + 1) % stride == 0 || i + 1 == dev.events.len() {
            let st = eng.heap.stats();
            bucket.event = i;
            bucket.time = e.time_us;
            bucket.external = ext_of(st.free, st.largest_free);
            timeline.push(bucket);
            bucket = Sample::default();
        }
        if (i + 1) & 0xFFFF == 0 {
            progress(i + 1);
        }
    }
    let replay_ns = (start.elapsed().as_nanos() as u64).saturating_sub(eng.excluded_ns).max(1);
    progress(dev.events.len());

    let last = dev.events.len().checked_sub(1);
    let end_fp = eng.footprint();
    let at_end = snapshot(&*eng.heap, last, eng.allocated, end_fp);
    let caching_end = match &eng.heap {
        Heap::Caching(c) => {
            Some(CachingEnd { reserved: c.reserved_bytes(), segments: c.segment_count() as u64, seeded_segments })
        }
        Heap::Other(_) => None,
    };
    let peaks = eng.peaks;
    Ok(ReplayReport {
        trace: trace.source.display().to_string(),
        format: trace.format.to_string(),
        device: dev.device,
        strategy: opts.strategy.to_string(),
        capacity,
        align,
        policy: opts.policy.to_string(),
        events: dev.events.len(),
        allocs,
        frees,
        free_requests,
        initial_blocks: dev.initial_blocks.len(),
        peak_allocated: peaks.max_live,
        peak_reserved: peaks.max_footprint,
        peak_reserved_event: eng.peak_fp_event,
        utilisation: peaks.utilisation(),
        johnstone_wilson: peaks.johnstone_wilson(),
        failed: eng.failed,
        at_peak: at_peak.unwrap_or_default(),
        at_end,
        compactions: eng.compactions,
        replay_ns,
        events_per_s: dev.events.len() as f64 / (replay_ns as f64 * 1e-9),
        pytorch: pytorch_snapshot.then(|| pytorch_series(dev)),
        caching_end,
        device_heap: None,
        timeline,
    })
}

/// The level name of a fraction (re-exported for tables).
pub fn level(fraction: f64) -> FragLevel {
    FragLevel::of(fraction)
}
