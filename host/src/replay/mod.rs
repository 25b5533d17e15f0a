//! Trace replay: runs one device's allocation trace ([`crate::trace::DeviceTrace`]) through a host
//! strategy ([`crate::reference`]), optionally compacting with the real compaction kernel, and reports
//! what happened.
//!
//! # Semantics
//!
//! * **Requests.** Every `alloc` event becomes `alloc(size rounded up to align, align)`
//!   ([`round_request`]). The alignment is [`ReplayOptions::align`] when given, else the format's own
//!   ([`alignment_for`], from the format table [`crate::trace::FORMATS`]): for PyTorch snapshots
//!   512 B, like PyTorch's CUDA caching allocator (`kMinBlockSize`), so every strategy sees the block
//!   sizes PyTorch itself would carve; for minimalloc CSV files 1 B (instances are defined at byte
//!   granularity, so a feasible instance is not made infeasible by rounding); for RMM logs 256 B
//!   (`cudaMalloc`'s and RMM's alignment). A zero-byte request is sent as one byte. The report states
//!   the alignment and where it came from. The *allocated* series counts the requested (unrounded) bytes
//!   of the trace.
//! * **Frees.** `free_completed` (RMM `free`, CSV end of lifetime) frees the block with the same dense
//!   id ([`crate::trace::Event::id`]) through the handle API: the replay keeps each id's [`Allocation`]
//!   and gives it back to [`SubAllocator::free`] (no offset lookup). `free_requested` is only counted. A
//!   free of a block whose alloc failed is skipped.
//! * **Initial state.** Blocks alive before the first event ([`crate::trace::DeviceTrace::initial_blocks`])
//!   are allocated first, in address order. For the caching model of a PyTorch snapshot the model is built
//!   with the snapshot's own settings ([`crate::reference::caching::config_for_trace`]) and seeded with the segments (and
//!   expandable mapped ranges) alive before the first event, with those blocks at their recorded places
//!   ([`crate::reference::caching::seed_from_trace`]), so the model starts from PyTorch's own state.
//! * **Streams.** The caching model serves each `alloc` on the event's stream (per-stream pools).
//! * **Memory pools.** The caching model serves each `alloc` in the event's memory pool
//!   ([`crate::trace::Event::mempool`]: the entry's `pool_id`, else the pool of the segment holding its
//!   address; 0, the default pool, for ordinary requests), and seeds each recorded segment in its pool, so a
//!   default-pool tensor never fills a private pool's hole (PyTorch's `get_pool`).
//! * **Segment events** drive the *PyTorch reserved* series (initial segments, plus `segment_alloc` /
//!   `segment_map`, minus `segment_free` / `segment_unmap`, counted once: expandable ranges mapped during the
//!   trace are not initial). For the caching model they also place its segments at PyTorch's addresses and
//!   release or unmap what PyTorch released, at the same event ([`crate::reference::caching::RecordedSegments`]),
//!   except the releases PyTorch's allocator made itself after a failed `cudaMalloc`
//!   ([`crate::reference::caching::recorded_releases`], [`ReplayReport::recorded_releases`]): those the model
//!   makes when its own allocation fails at the replay's capacity, so on a larger GPU they do not happen; another
//!   strategy's [`SubAllocator::release_cached`] is called at the first event of each run of releases (a
//!   no-op for strategies without a cache).
//! * **Footprint** ("reserved" of a strategy, bytes): [`crate::analysis::footprint`], the one definition:
//!   for the caching model its reserved bytes (the sum of its segments, PyTorch's `reserved_bytes`); for
//!   tiered, the bytes spanned by its two ends (end of the highest block placed bottom-up plus capacity
//!   minus the start of the lowest large block placed top-down); for the device heap the end of its
//!   highest slab page or large block; for every other strategy the address high-water mark (end of the
//!   highest live block). *Peak reserved* is its maximum over the run.
//! * **Metrics** (DESIGN.md §3.3, reported together): peak allocated, peak
//!   reserved, peak utilisation and Johnstone–Wilson #4 `(max footprint − max live) / max live`
//!   ([`crate::analysis::PeakTracker`]); at the demand peak (the event after which the trace's live requested bytes are
//!   highest, the same event for every strategy) and at the end: external fragmentation
//!   `1 − largest free / total free` over all free extents (device memory outside the heap included),
//!   reserved-but-unallocated = footprint − allocated split into rounding waste (block bytes − requested
//!   bytes) and holes (footprint − block bytes), the RMS metric and a [`crate::analysis::FragLevel`].
//! * **Failed requests** are classified with [`crate::analysis::diagnose`]: *fragmentation* when the free bytes
//!   would hold the request after a perfect compaction, else *capacity* when the live requested bytes and
//!   the request exceed the capacity, else *rounding* (the strategy's rounding left too few free bytes:
//!   `FailureClass::of_request`); other refusals (a size over the strategy's limit) are *rejected*. A
//!   host strategy's granule is the requests' alignment up to 256 B (1 B for a minimalloc instance).
//! * **Compaction** ([`CompactPolicy`]): `on-oom` compacts when a request fails for fragmentation and
//!   retries it; `threshold=F` compacts after a free that leaves external fragmentation above `F` (once,
//!   re-armed when it falls to `F` or below). Each compaction plans the reference slide
//!   ([`crate::reference::compact::plan_slide`]), measures it with the real kernel on the chosen backend
//!   (`materialize`), then updates the strategy with [`SubAllocator::apply_relocation`].
//! * **Speed.** `replay_ns` is the wall time of the event loop alone: reading the file, the fragmentation
//!   analyses at the peak and at the end and the compactions are excluded.
//!
//! # Layout
//!
//! One driver (`engine`: the event loop, timeline, peaks and report builder) runs every target: a
//! host strategy or the caching model (`strategy`, [`replay`]) and the device heap on a backend
//! (`device`, [`replay_device`]). `options` holds the options and the request rounding rule,
//! `capacity` the one default-capacity rule, `mod@compare` every contender over one trace,
//! `seeding` the caching model seeded from a snapshot, `report` the report types and `render` their
//! text pages ([`ReplayReport::render_text`], `compare::Comparison::render_text`).
//!
//! ```
//! use gpuheap::reference::StrategyKind;
//! use gpuheap::replay::{replay, ReplayOptions};
//!
//! let trace = gpuheap::trace::read_trace(concat!(env!("CARGO_MANIFEST_DIR"), "/../data/equivariant-posteriors_oom_snapshot_new.pickle"))?;
//! let report = replay(&trace, &trace.devices[0], &ReplayOptions::new(StrategyKind::BestFit), None, &mut |_| {})?;
//! assert!(report.peak_reserved >= report.peak_allocated);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::backend::Backend;
#[allow(unused_imports)] // Named in the module docs.
use crate::reference::{Allocation, SubAllocator};
use crate::trace::{DeviceTrace, Trace, TraceFormat};

pub(crate) mod capacity;
pub(crate) mod compare;
pub(crate) mod device;
mod engine;
mod error;
pub(crate) mod materialize;
pub(crate) mod options;
pub(crate) mod render;
pub(crate) mod report;
mod seeding;
mod strategy;

pub use capacity::{choose_capacity, default_capacity};
pub use device::{replay_device, DeviceHeapEnd, DeviceReplayOptions, DEVICE_HEAP, POLICY_NA};
pub(crate) use engine::SearchOutcome;
pub use error::{CompactionFailure, DeviceFailure, Refusal, Refused, ReplayError};
pub use materialize::{MeasureOutcome, Measured};
pub use options::{
    alignment_for, alignment_source, choose_alignment, default_strategy, round_request, CompactPolicy, PolicyError,
    ReplayOptions, DEFAULT_MATERIALIZE_LIMIT_CPU, DEFAULT_TIMELINE_POINTS,
};
pub use report::{
    relative_difference, CachingEnd, CompactionRecord, CompactionTrigger, EndFidelity, FailedRequest, ReplayReport,
    Sample, TierStats,
};

/// Replays `dev` (a device of `trace`) with `opts` through a host strategy or the caching model.
/// Compactions run their kernel measurement on `backend` (none: compactions are planned and applied, but
/// not measured). `progress` is called with the number of events done, every 65,536 events and at the end.
///
/// # Errors
/// [`ReplayError::Config`] for a capacity, alignment or tiers the strategy cannot use;
/// [`ReplayError::Compaction`] when a compaction fails or its check fails; [`ReplayError::Strategy`] when
/// a strategy refuses a free the trace makes valid.
pub fn replay(
    trace: &Trace,
    dev: &DeviceTrace,
    opts: &ReplayOptions,
    backend: Option<&Backend>,
    progress: &mut dyn FnMut(usize),
) -> Result<ReplayReport, ReplayError> {
    let (capacity, demand_peak_event) = capacity::choose_capacity_and_demand_peak(trace, dev, opts.capacity)?;
    let align = choose_alignment(trace, opts.align).map_err(Refusal::Alignment)?;
    let pytorch_snapshot = matches!(trace.format, TraceFormat::PytorchSnapshot(_));
    // A capacity the strategy cannot use names the file and, when derived, where the capacity came from
    // (a snapshot's OOM on a GPU another process fills derives 1 MiB, below the caching model's least).
    let mut target = strategy::StrategyTarget::new(dev, opts, capacity.clone(), align, pytorch_snapshot, backend, None)
        .map_err(|e| e.in_file(&trace.source, opts.capacity.is_none().then_some(&capacity)))?;
    let setup = engine::Setup {
        trace,
        dev,
        align,
        align_source: options::alignment_source(trace, opts.align),
        timeline_points: opts.timeline_points,
        pytorch_comparable: true,
        demand_peak_event,
    };
    engine::run(&mut target, &setup, progress)
}

/// The replay of [`replay`] at `opts.capacity` (required: a search always names it) reduced to what the
/// settings search reads ([`crate::explain::tune`]): the peak reserved bytes and the failed requests,
/// with the same target and the same calls into it, so both equal those of [`replay`]'s report. `scan`
/// is the caching model's scan of `dev` ([`crate::reference::caching::TraceScan`]), made once per
/// searched trace. Neither
/// the timeline, nor PyTorch's reserved series, nor the fragmentation snapshots are made, and the demand
/// peak is not searched. With `stop_at_failure` it returns at the first failed request (then
/// `peak_reserved` is the peak up to it and `failed` holds that one).
///
/// # Errors
/// As [`replay`]; a missing capacity is [`ReplayError::Config`] as the default capacity's.
pub(crate) fn replay_search(
    trace: &Trace,
    dev: &DeviceTrace,
    opts: &ReplayOptions,
    scan: &crate::reference::caching::TraceScan,
    stop_at_failure: bool,
) -> Result<SearchOutcome, ReplayError> {
    let capacity = match opts.capacity {
        Some(c) => crate::facts::Capacity::given(c),
        None => default_capacity(trace, dev)?,
    };
    let align = choose_alignment(trace, opts.align).map_err(Refusal::Alignment)?;
    let pytorch_snapshot = matches!(trace.format, TraceFormat::PytorchSnapshot(_));
    let mut target =
        strategy::StrategyTarget::new(dev, opts, capacity.clone(), align, pytorch_snapshot, None, Some(scan))
            .map_err(|e| e.in_file(&trace.source, opts.capacity.is_none().then_some(&capacity)))?;
    engine::run_search(&mut target, dev, stop_at_failure)
}

/// The level name of a fraction (re-exported for tables).
#[doc(hidden)]
pub fn level(fraction: f64) -> crate::analysis::FragLevel {
    crate::analysis::FragLevel::of(fraction)
}
