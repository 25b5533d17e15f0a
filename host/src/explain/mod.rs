//! Answers for a person holding a PyTorch memory snapshot of a run that died with "CUDA out of memory":
//! *what happened at the OOM* (was the GPU full, or was the memory there but in pieces?), *how much
//! memory does the run need*, and (with [`tune`]) *which allocator setting would have saved it*.
//!
//! The answers are built on what the trace records ([`crate::facts`]: the devices and the one
//! reported, the GPU's memory from the evidence, PyTorch's state at a moment):
//!
//! * [`explain_oom`] (module `oom`): for a recorded `oom` event, the request, allocated and reserved
//!   bytes at that moment, where the reserved-but-unallocated bytes sit, the driver's free bytes and a
//!   [`Verdict`] by the rule of DESIGN.md §3.8 (bug scenario BL-02): *fragmentation* iff
//!   `device_free + holes ≥ request > largest free extent`, *capacity* iff
//!   `device_free + holes < request` (then no defragmentation can help);
//! * [`explain`]: the whole answer page (also for snapshots dumped without history, such as the
//!   state an OOM observer writes, and for runs that did not fail: then the page describes the
//!   moment of peak reserved memory), rendered as text by [`Explanation::render_text`], with what holds
//!   the memory then by site and by kind ([`breakdown`]);
//! * [`what_if_without`] (module `without`): the trace replayed without the allocations of a site
//!   (`explain --without SITE`).
//!
//! ```
//! let trace = gpuheap::trace::read_trace(concat!(env!("CARGO_MANIFEST_DIR"), "/../data/equivariant-posteriors_oom_snapshot_new.pickle"))?;
//! let answer = gpuheap::explain::explain(&trace, None, None)?;
//! print!("{}", answer.render_text());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::path::Path;

use serde::Serialize;

use crate::facts::RequestBounds;
use crate::facts::{
    self, capacity_from_evidence, choose_device, final_state, gpu_capacity_at_oom, oom_capacity, peaks, state_after,
    summarize, Capacity, CapacityRangeError, DeviceChoice, DeviceError, DeviceSummary, SegmentView, SnapshotBlock,
    StateError,
};
use crate::reference::caching;
use crate::trace::pytorch::{self, Frame};
use crate::trace::{DeviceTrace, Location, MempoolId, Trace, TraceError, TraceFormat};

pub mod breakdown;
mod oom;
mod render;
pub mod tune;
#[doc(hidden)]
pub mod without;

pub use breakdown::{Breakdown, Kind, Site, SiteOrigin};
pub use oom::{explain_oom, reproduce, with_oom_requests, OomExplanation, Reproduction, Verdict};
pub(crate) use render::{best_setting_lines, row_verdict};
pub use render::{capacity_text, devices_text, settings_warnings_text, warnings_text};
pub use without::{what_if_without, WithoutReport};

/// Which moment the detail of an [`Explanation`] describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
#[doc(hidden)]
pub enum Moment {
    /// The first recorded `oom` event.
    RecordedOom,
    /// The state a snapshot holds when its history holds no other moment: no events (e.g. dumped by an
    /// OOM observer), or a one-entry ring buffer ([`crate::facts::History`]).
    DumpedState,
    /// No OOM recorded: the event after which PyTorch's reserved bytes peak (of those, the one with the
    /// most live requested bytes).
    PeakReserved,
    /// No OOM and no reserved bytes recorded (formats without segments): the event after which the
    /// live requested bytes peak.
    PeakAllocated,
}

/// A live tensor with the top user frames of the code that allocated it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[doc(hidden)]
pub struct Tensor {
    /// The block.
    #[serde(flatten)]
    pub block: SnapshotBlock,
    /// Up to [`TOP_FRAMES`] user frames ([`Frame::is_user`]), innermost first; empty when the snapshot
    /// records none (history not recorded) or the stack has no user frame.
    pub frames: Vec<Frame>,
    /// The code that allocated it ([`breakdown::site_of`]): the innermost user frame, else a library's
    /// Python frame, else the innermost C++ function that is not allocation machinery.
    pub site: Site,
    /// What it is, inferred from its frames ([`breakdown::kind_of`]).
    pub kind: Kind,
}

/// How many largest live tensors and segments with holes an [`Explanation`] lists.
#[doc(hidden)]
pub const TOP_ITEMS: usize = 8;
/// How many recorded `oom` events an [`Explanation`] explains one by one (each replays the trace up to
/// it, so explaining all of a file with thousands of OOMs would take time quadratic in its length).
#[doc(hidden)]
pub const MAX_EXPLAINED_OOMS: usize = 32;
/// How many user frames a [`Tensor`] keeps.
#[doc(hidden)]
pub const TOP_FRAMES: usize = 3;

/// The answer page for one device of a trace.
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct Explanation {
    /// The trace file.
    pub trace: String,
    /// Its format.
    pub format: String,
    /// Every device of the file.
    pub devices: Vec<DeviceSummary>,
    /// The device explained.
    pub device: DeviceChoice,
    /// The capacity of the replays (and of [`RequestBounds`]).
    pub capacity: Capacity,
    /// The GPU's memory at the first recorded OOM, when the trace records one with `device_free`.
    pub gpu_capacity: Option<u64>,
    /// Allocator settings the snapshot records, as `PYTORCH_CUDA_ALLOC_CONF` (empty: defaults).
    pub allocator_settings: Option<String>,
    /// Options of those settings that the caching model does not implement or that have no effect as
    /// recorded (a `garbage_collection_threshold` without a memory fraction), each with the reason
    /// ([`caching::config_for_trace`]): the replays run without them (bug scenario BL-31, DESIGN.md §3.9).
    pub warnings: Vec<caching::ConfigWarning>,
    /// The first [`MAX_EXPLAINED_OOMS`] recorded `oom` events, explained.
    pub ooms: Vec<OomExplanation>,
    /// Recorded `oom` events after those (not explained one by one: each costs a replay of the trace,
    /// and a retry loop can record thousands).
    pub ooms_not_explained: usize,
    /// What the detail below describes.
    pub moment: Moment,
    /// Event of the moment (`None`: the dumped state).
    pub event: Option<usize>,
    /// Reserved bytes at the moment.
    pub reserved: u64,
    /// Allocated (block) bytes at the moment.
    pub allocated: u64,
    /// Requested bytes of the live blocks at the moment (`allocated` less PyTorch's rounding).
    pub requested: u64,
    /// Reserved but unallocated bytes at the moment (the holes).
    pub reserved_unallocated: u64,
    /// Largest hole at the moment.
    pub largest_hole: u64,
    /// Segments at the moment.
    pub segments: usize,
    /// Live blocks at the moment.
    pub live_blocks: usize,
    /// The largest live tensors at the moment, largest first (at most [`TOP_ITEMS`]).
    pub largest_tensors: Vec<Tensor>,
    /// Segments holding the most reserved-but-unallocated bytes (at most [`TOP_ITEMS`]), each with all
    /// its holes.
    pub segments_with_holes: Vec<SegmentView>,
    /// Per memory pool at the moment, the default pool first (serialised when the trace has a private
    /// pool): reserved, allocated and hole bytes; only requests of a pool can use its holes.
    #[serde(skip_serializing_if = "only_default_pool")]
    pub pools: Vec<facts::PoolState>,
    /// For a dumped state without an `oom` event: the requests of the default pool (ordinary requests)
    /// it would have served.
    pub request_bounds: Option<RequestBounds>,
    /// The settings search, when run ([`tune::tune`]).
    pub tune: Option<tune::TuneReport>,
    /// How complete the device's history is and what that costs the answer (serialised when not
    /// complete).
    #[serde(skip_serializing_if = "facts::HistoryCompleteness::is_complete")]
    pub history: facts::HistoryCompleteness,
    /// The live bytes at the moment by site and by kind, and what must go for the failed request.
    pub breakdown: Breakdown,
    /// The what-if of `explain --without SITE` ([`what_if_without`]), when asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub without: Option<WithoutReport>,
    /// For a dumped state ([`Moment::DumpedState`]): what such a dump can and cannot tell and whether an
    /// OOM is known, worded once for every form of the page (JSON key `dump_caveat`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) dump_caveat: Option<String>,
}

/// What a page may say of the dumped state of device `device` whose history is `h`: which state it is,
/// what it can tell (what was live and cached when it was dumped) and what it cannot (the peak before the
/// dump, a request, the driver's free bytes), and that nothing in the file says whether an OOM happened
/// (the moment is a dumped state only when no `oom` event is recorded).
fn dump_caveat(device: i64, h: &facts::HistoryCompleteness) -> String {
    let which = match h.history {
        facts::History::None => format!(
            "The snapshot has no history on device {device}: below, only the allocator state when it was dumped."
        ),
        facts::History::OneEntry => format!(
            "The snapshot keeps one history entry on device {device} (a one-entry ring buffer, as \
             `_record_memory_history(enabled=True)` records): below, only the allocator state when it was dumped."
        ),
        _ => format!(
            "The history of device {device} cannot place its moments (see the warnings above): below, only the \
             allocator state when it was dumped."
        ),
    };
    which
        + " That state tells what was live and cached then (segments, blocks, holes); it cannot tell the peak \
           before the dump, a request that failed, nor the driver's free bytes. Nothing in the file records an \
           OOM: a dump written by an OOM observer looks the same as one written after `empty_cache()` or mid-run."
}

fn only_default_pool(pools: &[facts::PoolState]) -> bool {
    pools.iter().all(|p| !p.mempool.is_private())
}

/// Errors of [`explain`] and [`tune::tune`]; all are bad input (exit code 2) except
/// [`ExplainError::Replay`] run-time failures.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExplainError {
    /// The trace is unusable (a sum that cannot be represented, frames that cannot be read).
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// The device asked for is not in the trace, or no device has anything to report.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// A given capacity outside the range the strategies model.
    #[error(transparent)]
    Capacity(#[from] CapacityRangeError),
    /// `settings` ([`tune::TuneReport::retain_settings`]) names rows the grid does not have.
    #[error("settings: {unknown:?} are not rows of the grid (rows: {rows:?})")]
    UnknownSettings {
        /// The labels that are no row.
        unknown: Vec<String>,
        /// The grid's row labels.
        rows: Vec<String>,
    },
    /// A replay failed.
    #[error(transparent)]
    Replay(#[from] crate::replay::ReplayError),
    /// A `--without` pattern ([`what_if_without`]) that no allocation's frames match.
    #[error("without {pattern:?}: no allocation of device {device} has a frame that matches it{hint}")]
    WithoutMatchesNothing {
        /// The pattern.
        pattern: String,
        /// The device explained.
        device: i64,
        /// What the file lacks, when it records no frames at all.
        hint: &'static str,
    },
}

impl ExplainError {
    /// `true` for bad input (exit code 2).
    #[doc(hidden)]
    pub fn is_input(&self) -> bool {
        match self {
            ExplainError::Trace(_)
            | ExplainError::Device(_)
            | ExplainError::Capacity(_)
            | ExplainError::UnknownSettings { .. }
            | ExplainError::WithoutMatchesNothing { .. } => true,
            ExplainError::Replay(r) => r.is_input(),
        }
    }
}

/// `allocator_settings` as the `PYTORCH_CUDA_ALLOC_CONF` value that sets them: the recorded variable
/// when it is set, else the non-default values of the structured fields (empty: PyTorch's defaults).
/// `None` when the snapshot records no settings.
#[doc(hidden)]
pub fn settings_env(dev: &DeviceTrace) -> Option<String> {
    let s = dev.allocator_settings.as_ref()?;
    if let Some(c) = s.alloc_conf.as_ref().filter(|c| !c.trim().is_empty()) {
        return Some(c.clone());
    }
    let mut parts = Vec::new();
    if let Some(m) = s.max_split_size.filter(|&m| m > 0) {
        parts.push(format!("max_split_size_mb:{}", m >> 20));
    }
    if s.expandable_segments == Some(true) {
        parts.push("expandable_segments:True".into());
    }
    if let Some(t) = s.garbage_collection_threshold.filter(|&t| t > 0.0) {
        parts.push(format!("garbage_collection_threshold:{t}"));
    }
    let rd: Vec<String> =
        s.roundup_power2_divisions.iter().filter(|p| p.1 > 0).map(|(mb, d)| format!("{mb}:{d}")).collect();
    if !rd.is_empty() {
        parts.push(format!("roundup_power2_divisions:[{}]", rd.join(",")));
    }
    Some(parts.join(","))
}

fn trace_error(trace: &Trace, dev: &DeviceTrace, e: StateError) -> TraceError {
    TraceError::Schema {
        path: trace.source.clone(),
        at: match e.event {
            Some(i) => trace.event_location(dev, i),
            None => Location::Key("segments"),
        },
        message: format!("{} exceed 2^64 - 1 bytes", e.what),
    }
}

/// Explains device `device` (default: [`choose_device`]) of `trace`: recorded OOMs, the state at the
/// moment that matters, the largest live tensors with their frames (read again from the snapshot file
/// [`Trace::source`]), where the cached holes sit. `capacity` is the user's, if any. The settings
/// search is not run here (set [`Explanation::tune`] from [`tune::tune`]).
///
/// # Errors
/// [`ExplainError::Device`] for a device the file lacks or a file with no allocation at all,
/// [`ExplainError::Capacity`] for a `capacity` outside the range the strategies model;
/// [`ExplainError::Trace`] for sums that cannot be represented or a snapshot that cannot be read again.
pub fn explain(trace: &Trace, device: Option<i64>, capacity: Option<u64>) -> Result<Explanation, ExplainError> {
    explain_with_bytes(trace, None, device, capacity)
}

/// [`explain`] with the content of the trace file already read (`bytes`, from
/// [`crate::trace::read_trace_and_bytes`]): the stack frames are read from it instead of the file
/// [`Trace::source`] names, which is read again when `bytes` is `None`.
///
/// # Errors
/// As [`explain`].
#[doc(hidden)]
pub fn explain_with_bytes(
    trace: &Trace,
    bytes: Option<&[u8]>,
    device: Option<i64>,
    capacity: Option<u64>,
) -> Result<Explanation, ExplainError> {
    capacity.map(facts::check_capacity).transpose()?;
    let devices = summarize(trace);
    let choice = choose_device(trace, &devices, device)?;
    let dev = &trace.devices[choice.index];
    let cap = capacity_from_evidence(trace, dev, capacity)?;
    let gpu = gpu_capacity_at_oom(trace, dev)?.map(|c| c.bytes);
    let (settings, warnings) = caching::config_for_trace(dev, cap.bytes);
    let mut ooms = Vec::with_capacity(dev.ooms.len().min(MAX_EXPLAINED_OOMS));
    for o in dev.ooms.iter().take(MAX_EXPLAINED_OOMS) {
        // With a capacity of the user's, the driver's free bytes are what that capacity leaves.
        let free = match (capacity, o.device_free) {
            (Some(c), _) => {
                let r = state_after(dev, Some(o.event)).map_err(|e| trace_error(trace, dev, e))?.reserved;
                Some(c.saturating_sub(r))
            }
            (None, f) => f,
        };
        let mut x = explain_oom(dev, o.event, free, &settings).map_err(|e| trace_error(trace, dev, e))?;
        let replay_capacity = match (capacity, x.device_free) {
            // A given capacity is at least MIN_CAPACITY (`facts::check_capacity`).
            (Some(_), _) => x.capacity,
            (None, Some(f)) => Some(oom_capacity(trace, dev, o.event, x.reserved, f)?),
            (None, None) => None,
        };
        // The caching model needs a device of at least one 2 MiB segment; below that the recorded verdict
        // stands alone (no segment fits, so the request fails whatever the settings).
        if let Some(c) = replay_capacity.filter(|&c| c >= caching::SMALL_BUFFER) {
            x.replay = Some(reproduce(trace, dev, o.event, c)?);
        }
        ooms.push(x);
    }
    let history = facts::history_completeness(dev);
    let (moment, st) = if let Some(first) = ooms.first() {
        (Moment::RecordedOom, first.state.clone())
    } else if !history.moments_known() && (dev.final_state.is_some() || dev.events.is_empty()) {
        let st = match &dev.final_state {
            Some(f) => final_state(f, None),
            None => state_after(dev, None),
        };
        (Moment::DumpedState, st.map_err(|e| trace_error(trace, dev, e))?)
    } else {
        let p = peaks(dev);
        let (moment, at) = if p.reserved > 0 {
            (Moment::PeakReserved, p.reserved_event)
        } else {
            (Moment::PeakAllocated, p.allocated_event)
        };
        (moment, state_after(dev, at).map_err(|e| trace_error(trace, dev, e))?)
    };
    // The frames of every live block: the breakdown groups them all.
    let frames = if matches!(trace.format, TraceFormat::PytorchSnapshot(_)) && !st.live.is_empty() {
        let events: Vec<usize> = st.live.iter().filter_map(|b| b.alloc_event).collect();
        let blocks: Vec<u64> = st.live.iter().filter(|b| b.alloc_event.is_none()).map(|b| b.addr).collect();
        read_frames(trace, bytes, dev, &events, &blocks)?
    } else {
        pytorch::SnapshotFrames::default()
    };
    let live_frames: Vec<&[Frame]> = st.live.iter().map(|b| frames_of_block(&frames, b)).collect();
    let largest: Vec<Tensor> = st
        .live
        .iter()
        .zip(&live_frames)
        .take(TOP_ITEMS)
        .map(|(b, f)| Tensor {
            block: b.clone(),
            frames: f.iter().filter(|fr| fr.is_user()).take(TOP_FRAMES).cloned().collect(),
            site: breakdown::site_of(f),
            kind: breakdown::kind_of(f),
        })
        .collect();
    let sized: Vec<(u64, &[Frame])> = st.live.iter().zip(&live_frames).map(|(b, f)| (b.size, *f)).collect();
    let first_oom = ooms.first();
    let breakdown = breakdown::breakdown(
        &sized,
        cap.bytes,
        first_oom.map(|o| o.request),
        first_oom.filter(|o| o.device_free.is_some()).map(|o| o.shortfall),
    );
    let mut with_holes: Vec<SegmentView> = st.segments.iter().filter(|s| s.hole_bytes() > 0).cloned().collect();
    with_holes.sort_by(|a, b| b.hole_bytes().cmp(&a.hole_bytes()).then(a.addr.cmp(&b.addr)));
    with_holes.truncate(TOP_ITEMS);
    // Ordinary requests: the default pool's holes only.
    let request_bounds =
        (moment == Moment::DumpedState).then(|| facts::request_bounds(&st, &settings, MempoolId::DEFAULT));
    Ok(Explanation {
        trace: trace.source.display().to_string(),
        format: trace.format.to_string(),
        devices,
        device: choice,
        capacity: cap,
        gpu_capacity: gpu,
        allocator_settings: settings_env(dev),
        warnings,
        moment,
        event: match moment {
            Moment::DumpedState => None,
            _ => st.event,
        },
        reserved: st.reserved,
        allocated: st.allocated,
        requested: st.requested,
        reserved_unallocated: st.hole_bytes,
        largest_hole: st.largest_hole,
        segments: st.segments.len(),
        live_blocks: st.live.len(),
        largest_tensors: largest,
        segments_with_holes: with_holes,
        pools: st.pools.clone(),
        request_bounds,
        ooms_not_explained: dev.ooms.len() - ooms.len(),
        ooms,
        tune: None,
        breakdown,
        without: None,
        dump_caveat: (moment == Moment::DumpedState).then(|| dump_caveat(dev.device, &history)),
        history,
    })
}

/// The stack frames the snapshot file records for the `alloc` events `events` and the final-state
/// blocks at `blocks` of `dev` ([`pytorch::read_frames`]), read from `bytes` (else from the file again).
pub(crate) fn read_frames(
    trace: &Trace,
    bytes: Option<&[u8]>,
    dev: &DeviceTrace,
    events: &[usize],
    blocks: &[u64],
) -> Result<pytorch::SnapshotFrames, TraceError> {
    let path: &Path = &trace.source;
    let again;
    let bytes = match bytes {
        Some(b) => b,
        None => {
            again = std::fs::read(path).map_err(|source| TraceError::Io { path: path.to_path_buf(), source })?;
            &again[..]
        }
    };
    pytorch::read_frames(path, bytes, dev.device, events, blocks)
}

/// The frames of live block `b`: those of its `alloc` event, else (a block alive before the first
/// event) those the final-state block at its address records; empty when none are recorded.
pub(crate) fn frames_of_block<'f>(f: &'f pytorch::SnapshotFrames, b: &SnapshotBlock) -> &'f [Frame] {
    let found = match b.alloc_event {
        Some(i) => f.events.binary_search_by_key(&i, |e| e.0).ok().map(|k| &f.events[k].1),
        // A final-state block at the same address is the same tensor only if no later alloc reused it.
        None => f.blocks.iter().find(|x| x.0 == b.addr).map(|x| &x.1),
    };
    found.map_or(&[], |v| &v[..])
}

/// The sentence every page (text, HTML; the JSON carries [`RequestBounds`] itself) says about the bounds of
/// a dumped state: per pool, with PyTorch's release before failing, and the same hedge ("may fail") for
/// the requests between the bounds.
#[doc(hidden)]
pub fn bounds_sentence(b: &RequestBounds) -> String {
    use crate::units::fmt_bytes;
    let release = if b.released_segments == 0 {
        String::new()
    } else {
        format!(
            ", and {} more once PyTorch releases the {} entirely free cached segment{} before failing",
            fmt_bytes(b.released_before_failure),
            b.released_segments,
            if b.released_segments == 1 { "" } else { "s" }
        )
    };
    let small = match b.small_pool_up_to {
        0 => "no request fits (no cached hole of 512 B and no 2 MiB segment free for the smallest)".to_string(),
        f if f >= crate::reference::caching::SMALL_SIZE => "every request fits".to_string(),
        f => format!("a request up to {} fits", fmt_bytes(f)),
    };
    let large = match b.large_pool_up_to {
        0 => "no request fits".to_string(),
        f => format!("a request up to {} fits", fmt_bytes(f)),
    };
    format!(
        "With {} of GPU memory ({} free on the device{release}): in the small pool (requests up to 1 MiB) {small}; \
         in the large pool (larger requests) {large}; one up to {} may fail although the bytes are there (in \
         pieces, or fewer than the segment PyTorch asks the driver for); a larger one fails for capacity.",
        fmt_bytes(b.capacity),
        fmt_bytes(b.device_free),
        fmt_bytes(b.fragmentation_up_to)
    )
}
