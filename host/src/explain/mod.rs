//! Answers for a person holding a PyTorch memory snapshot of a run that died with "CUDA out of memory":
//! *what happened at the OOM* (was the GPU full, or was the memory there but in pieces?), *how much
//! memory does the run need*, and (with [`tune`]) *which allocator setting would have saved it*.
//!
//! Everything here is computed from what the trace records, not from a model:
//!
//! * [`summarize`]: per device, allocation events, peak allocated and peak reserved bytes and recorded
//!   OOMs; [`choose_device`] picks the device a report is about (the one with a recorded OOM, else
//!   the one with the most allocation events) and says why;
//! * [`capacity_from_evidence`]: the GPU's memory as the file shows it: at a recorded OOM, PyTorch's
//!   reserved bytes at that moment plus the event's `device_free` (what the driver still had); else
//!   the capacity the user gives; else the recorded peak reserved, said as such. Every sum is
//!   checked: a size that cannot be represented rejects the file naming the event or line;
//! * [`explain_oom`]: for a recorded `oom` event, the request, allocated and reserved bytes at that
//!   moment, where the reserved-but-unallocated bytes sit ([`state`]), the driver's free bytes and a
//!   [`Verdict`] by the rule of DESIGN.md §3.8 (bug scenario BL-02): *fragmentation* iff
//!   `device_free + holes ≥ request > largest free extent`, *capacity* iff
//!   `device_free + holes < request` (then no defragmentation can help);
//! * [`explain`]: the whole answer page (also for snapshots dumped without history, such as the
//!   state an OOM observer writes, and for runs that did not fail: then the page describes the
//!   moment of peak reserved memory).

use std::path::Path;

use serde::Serialize;

use crate::analysis::{self, OomClass};
use crate::reference::{caching, MAX_BYTES};
use crate::trace::pytorch::{self, Frame};
use crate::trace::{DeviceTrace, EventKind, Location, Trace, TraceError, TraceFormat};

mod render;
pub mod state;
pub mod tune;

pub use render::{capacity_text, devices_text, settings_warnings_text, warnings_text};

pub use state::{final_state, state_after, HeapState, Hole, SegmentView, SnapshotBlock, StateError};

/// What one device of a trace holds. Bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceSummary {
    /// Device ordinal.
    pub device: i64,
    /// Events of every kind.
    pub events: usize,
    /// `alloc` events.
    pub alloc_events: usize,
    /// Highest requested bytes live at once (blocks alive before the first event included; for a
    /// snapshot without events, its final state). `None`: the sum exceeds 2^64 − 1.
    pub peak_allocated: Option<u64>,
    /// Highest PyTorch reserved bytes (segments; 0 for formats without segments). `None`: the sum
    /// exceeds 2^64 − 1.
    pub peak_reserved: Option<u64>,
    /// Recorded `oom` events.
    pub recorded_ooms: usize,
    /// Live blocks in the snapshot's final state (0 without one).
    pub final_blocks: usize,
}

/// The demand and reserved peaks of `dev` (bytes, 128-bit sums), with the events after which they are
/// first reached (`None`: before the first event).
pub(crate) struct Peaks {
    pub(crate) allocated: u128,
    pub(crate) allocated_event: Option<usize>,
    pub(crate) reserved: u128,
    pub(crate) reserved_event: Option<usize>,
}

pub(crate) fn peaks(dev: &DeviceTrace) -> Peaks {
    let mut size = vec![0u64; dev.block_ids as usize];
    let mut live: u128 = 0;
    for b in &dev.initial_blocks {
        if let Some(s) = size.get_mut(b.id as usize) {
            *s = b.size;
            live += b.size as u128;
        }
    }
    let mut p = Peaks { allocated: live, allocated_event: None, reserved: 0, reserved_event: None };
    // Non-expandable segments by id; expandable ones as mapped ranges (counted once).
    let mut seg_size = vec![0u64; dev.segment_ids as usize];
    let mut fixed: u128 = 0;
    let mut mapped = std::collections::BTreeMap::new();
    for s in &dev.initial_segments {
        if s.is_expandable {
            state::map_range(&mut mapped, s.addr, s.addr.saturating_add(s.size));
        } else if let Some(x) = seg_size.get_mut(s.id as usize) {
            *x = s.size;
            fixed += s.size as u128;
        }
    }
    let mapped_bytes =
        |m: &std::collections::BTreeMap<u64, u64>| m.iter().map(|(&s, &e)| (e - s) as u128).sum::<u128>();
    let mut mapped_total = mapped_bytes(&mapped);
    p.reserved = fixed + mapped_total;
    // Live bytes at `reserved_event`: among the moments at peak reserved, the one with the most live.
    let mut live_at_reserved = live;
    for (i, e) in dev.events.iter().enumerate() {
        match e.kind {
            EventKind::Alloc => {
                if let Some(s) = size.get_mut(e.id as usize) {
                    *s = e.size;
                    live += e.size as u128;
                }
                if live > p.allocated {
                    (p.allocated, p.allocated_event) = (live, Some(i));
                }
            }
            EventKind::Free => {
                if let Some(s) = size.get_mut(e.id as usize) {
                    live -= std::mem::take(s) as u128;
                }
            }
            EventKind::SegmentAlloc | EventKind::SegmentFree => {
                if let Some(x) = seg_size.get_mut(e.id as usize) {
                    if e.kind == EventKind::SegmentAlloc {
                        *x = e.size;
                        fixed += e.size as u128;
                    } else {
                        fixed -= std::mem::take(x) as u128;
                    }
                }
            }
            EventKind::SegmentMap | EventKind::SegmentUnmap => {
                let end = e.addr.saturating_add(e.size);
                if e.kind == EventKind::SegmentMap {
                    state::map_range(&mut mapped, e.addr, end);
                } else {
                    state::unmap_range(&mut mapped, e.addr, end);
                }
                mapped_total = mapped_bytes(&mapped);
            }
            _ => continue,
        }
        if (fixed + mapped_total, live) > (p.reserved, live_at_reserved) {
            (p.reserved, p.reserved_event, live_at_reserved) = (fixed + mapped_total, Some(i), live);
        }
    }
    if let Some(f) = &dev.final_state {
        // The final state is a recorded moment too (it is the only one of a snapshot without events).
        let fin: u128 = f.segments.iter().map(|s| s.size as u128).sum();
        if fin > p.reserved {
            p.reserved = fin;
            p.reserved_event = dev.events.len().checked_sub(1);
        }
        if dev.events.is_empty() {
            let req: u128 = f
                .blocks()
                .filter(|b| b.state != crate::trace::BlockStatus::Inactive)
                .map(|b| b.requested_size as u128)
                .sum();
            p.allocated = p.allocated.max(req);
        }
    }
    p
}

/// Summarises every device of `trace` that has events or segments, by ascending ordinal.
pub fn summarize(trace: &Trace) -> Vec<DeviceSummary> {
    trace
        .devices
        .iter()
        .map(|d| {
            let p = peaks(d);
            DeviceSummary {
                device: d.device,
                events: d.events.len(),
                alloc_events: d.count(EventKind::Alloc),
                peak_allocated: u64::try_from(p.allocated).ok(),
                peak_reserved: u64::try_from(p.reserved).ok(),
                recorded_ooms: d.ooms.len(),
                final_blocks: d
                    .final_state
                    .as_ref()
                    .map_or(0, |f| f.blocks().filter(|b| b.state != crate::trace::BlockStatus::Inactive).count()),
            }
        })
        .collect()
}

/// Why a device was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceReason {
    /// The user asked for it (`--device`).
    Given,
    /// The first device with a recorded `oom` event.
    RecordedOom,
    /// The device with the most `alloc` events.
    MostAllocations,
    /// No device has allocation events; the one whose final state holds the most live blocks.
    FinalState,
}

/// The device a report is about.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceChoice {
    /// Index into [`Trace::devices`].
    pub index: usize,
    /// Device ordinal.
    pub device: i64,
    /// Why.
    pub reason: DeviceReason,
    /// The other devices of the file (ordinals), for "pick another with --device N".
    pub others: Vec<i64>,
}

/// Picks the device: `given` if any (it must exist), else the first with a recorded OOM, else the one
/// with the most `alloc` events (lowest ordinal on a tie), else the one whose final state holds the
/// most live blocks.
///
/// # Errors
/// A one-line message (bad input) when `given` names no device of the file, or when no device has
/// allocation events or live blocks (a report would be all zeros).
pub fn choose_device(trace: &Trace, summaries: &[DeviceSummary], given: Option<i64>) -> Result<DeviceChoice, String> {
    let describe = || {
        summaries
            .iter()
            .map(|s| format!("device {}: {} events, {} allocations", s.device, s.events, s.alloc_events))
            .collect::<Vec<_>>()
            .join("; ")
    };
    let pick = |index: usize, reason| DeviceChoice {
        index,
        device: summaries[index].device,
        reason,
        others: summaries.iter().filter(|s| s.device != summaries[index].device).map(|s| s.device).collect(),
    };
    if let Some(d) = given {
        let i = summaries
            .iter()
            .position(|s| s.device == d)
            .ok_or_else(|| format!("{}: no device {d} in the trace ({})", trace.source.display(), describe()))?;
        return Ok(pick(i, DeviceReason::Given));
    }
    if let Some(i) = summaries.iter().position(|s| s.recorded_ooms > 0) {
        return Ok(pick(i, DeviceReason::RecordedOom));
    }
    let most = summaries
        .iter()
        .enumerate()
        .filter(|(_, s)| s.alloc_events > 0)
        .max_by(|a, b| a.1.alloc_events.cmp(&b.1.alloc_events).then(b.0.cmp(&a.0)));
    if let Some((i, _)) = most {
        return Ok(pick(i, DeviceReason::MostAllocations));
    }
    let most = summaries
        .iter()
        .enumerate()
        .filter(|(_, s)| s.final_blocks > 0)
        .max_by(|a, b| a.1.final_blocks.cmp(&b.1.final_blocks).then(b.0.cmp(&a.0)));
    if let Some((i, _)) = most {
        return Ok(pick(i, DeviceReason::FinalState));
    }
    Err(format!(
        "{}: no device has allocation events or live blocks, nothing to report ({})",
        trace.source.display(),
        if summaries.is_empty() { "no devices".to_string() } else { describe() }
    ))
}

/// Where a capacity comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum CapacitySource {
    /// The GPU's memory at a recorded OOM: PyTorch's reserved bytes at that moment plus the driver's
    /// free bytes the event records.
    RecordedOom {
        /// Index of the `oom` event.
        event: usize,
        /// PyTorch reserved bytes at the event.
        reserved: u64,
        /// `device_free` of the event.
        device_free: u64,
    },
    /// Given by the user.
    Given,
    /// The snapshot's peak reserved bytes: the least memory the run had; the GPU's may be larger.
    PeakReserved,
    /// minimalloc's `NAME.CAPACITY.csv` file name.
    FileName,
    /// No reserved bytes are recorded: twice the peak of live requested bytes, rounded up to 2 MiB.
    TwiceDemandPeak,
}

/// A capacity in bytes and where it comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Capacity {
    /// Bytes.
    pub bytes: u64,
    /// Its source.
    pub source: CapacitySource,
}

impl Capacity {
    /// Where the capacity comes from, in words (one line).
    pub fn describe(&self) -> String {
        use crate::replay::fmt_bytes;
        match &self.source {
            CapacitySource::RecordedOom { event, reserved, device_free } => format!(
                "the GPU's memory at the recorded OOM (event {event}): PyTorch reserved {} + {} the driver still \
                 had free",
                fmt_bytes(*reserved),
                fmt_bytes(*device_free)
            ),
            CapacitySource::Given => "given".into(),
            CapacitySource::PeakReserved => {
                "PyTorch's recorded peak reserved bytes: the least the GPU had (its real size is not recorded; give \
                 it with --capacity)"
                    .into()
            }
            CapacitySource::FileName => "from the file name (minimalloc NAME.CAPACITY.csv)".into(),
            CapacitySource::TwiceDemandPeak => {
                "no reserved bytes recorded: twice the peak of live requested bytes, rounded up to 2 MiB".into()
            }
        }
    }
}

/// The location of event `index` of `dev` for a message: the CSV line of a minimalloc buffer (its
/// data row + 2), else the device and event index.
pub fn event_location(trace: &Trace, dev: &DeviceTrace, index: usize) -> Location {
    match (trace.format, dev.events.get(index)) {
        (TraceFormat::LifetimeCsv, Some(e)) => Location::Line(e.addr.saturating_add(2)),
        _ => Location::Event { device: dev.device, index, field: None },
    }
}

/// The GPU's memory at `dev`'s first recorded OOM that carries `device_free`: `(event, reserved at
/// it, device_free)`. `None` when no OOM is recorded with `device_free`.
///
/// # Errors
/// [`TraceError::Schema`] naming the event when reserved + `device_free` exceeds 2^64 − 1.
pub fn gpu_capacity_at_oom(trace: &Trace, dev: &DeviceTrace) -> Result<Option<Capacity>, TraceError> {
    let Some((event, device_free)) = dev.ooms.iter().find_map(|o| o.device_free.map(|f| (o.event, f))) else {
        return Ok(None);
    };
    let bad = |m: String| TraceError::Schema {
        path: trace.source.clone(),
        at: Location::Event { device: dev.device, index: event, field: Some("device_free") },
        message: m,
    };
    let st = state_after(dev, Some(event)).map_err(|e| bad(e.to_string()))?;
    let bytes = oom_capacity(trace, dev, event, st.reserved, device_free)?;
    Ok(Some(Capacity { bytes, source: CapacitySource::RecordedOom { event, reserved: st.reserved, device_free } }))
}

/// The GPU's memory at the `oom` event `event` of `dev`: PyTorch's `reserved` bytes then plus the event's
/// `device_free`.
///
/// # Errors
/// [`TraceError::Schema`] naming the event's `device_free` when the sum exceeds 2^64 − 1 or lies outside
/// [4 KiB, 2^48 B] (the least capacity a replay models, [`crate::replay::MIN_CAPACITY`], and the largest,
/// [`MAX_BYTES`]). A GPU of a few MiB is valid: PyTorch reserved nothing and another process holds the
/// rest.
pub fn oom_capacity(
    trace: &Trace,
    dev: &DeviceTrace,
    event: usize,
    reserved: u64,
    device_free: u64,
) -> Result<u64, TraceError> {
    let bad = |m: String| TraceError::Schema {
        path: trace.source.clone(),
        at: Location::Event { device: dev.device, index: event, field: Some("device_free") },
        message: m,
    };
    let bytes = reserved
        .checked_add(device_free)
        .ok_or_else(|| bad(format!("reserved {reserved} B + device_free {device_free} B exceeds 2^64 - 1 bytes")))?;
    if !(crate::replay::MIN_CAPACITY..=MAX_BYTES).contains(&bytes) {
        return Err(bad(format!(
            "the GPU's memory at this OOM, reserved {reserved} B + device_free {device_free} B = {bytes} B, is \
             outside [4 KiB, 2^48 B], the devices modelled; give --capacity"
        )));
    }
    Ok(bytes)
}

/// Checks a capacity the user gives ([`explain`], [`tune::tune_page`]): it must lie in the range the
/// strategies model, [`crate::replay::MIN_CAPACITY`] to [`MAX_BYTES`] (2^48 B), as `--capacity` does.
///
/// # Errors
/// [`ExplainError::Input`] naming the capacity and the range.
pub(crate) fn check_given_capacity(given: Option<u64>) -> Result<(), ExplainError> {
    let min = crate::replay::MIN_CAPACITY;
    match given {
        Some(c) if !(min..=MAX_BYTES).contains(&c) => Err(ExplainError::Input(format!(
            "capacity {c} B is outside [{min} B, 2^48 B], the range the strategies model"
        ))),
        _ => Ok(()),
    }
}

/// The capacity a replay of `dev` uses: `given` when the user gives one; else the GPU's memory at a
/// recorded OOM ([`gpu_capacity_at_oom`]); else, for snapshots, the recorded peak reserved bytes; for
/// minimalloc files named `NAME.CAPACITY.csv`, that capacity; else twice the peak of live requested
/// bytes, rounded up to 2 MiB. Never below [`crate::replay::MIN_CAPACITY`] when derived.
///
/// # Errors
/// [`TraceError::Schema`] (bad input, exit code 2) naming the event or CSV line when a derived capacity
/// cannot be represented or exceeds the largest device modelled ([`MAX_BYTES`]), or when a file name's
/// capacity lies outside [`crate::replay::MIN_CAPACITY`]..=[`MAX_BYTES`] ([`Location::FileName`]); with `given`, huge
/// sizes are left to the replay, which refuses them as capacity failures.
pub fn capacity_from_evidence(trace: &Trace, dev: &DeviceTrace, given: Option<u64>) -> Result<Capacity, TraceError> {
    match given {
        Some(bytes) => Ok(Capacity { bytes, source: CapacitySource::Given }),
        None => capacity_from_peaks(trace, dev, &peaks(dev)),
    }
}

/// [`capacity_from_evidence`] without a given capacity, with the trace's [`peaks`] already computed as
/// `p` (a replay needs them for the demand peak as well).
///
/// # Errors
/// As [`capacity_from_evidence`].
pub(crate) fn capacity_from_peaks(trace: &Trace, dev: &DeviceTrace, p: &Peaks) -> Result<Capacity, TraceError> {
    if let Some(c) = gpu_capacity_at_oom(trace, dev)? {
        return Ok(c);
    }
    let min = crate::replay::MIN_CAPACITY;
    let too_big = |event: Option<usize>, what: &str, v: u128| {
        let at = match event {
            Some(i) => event_location(trace, dev, i),
            None => Location::Key("segments"),
        };
        TraceError::Schema {
            path: trace.source.clone(),
            at,
            message: format!(
                "{what} {v} B: no capacity can be derived within the largest device modelled (2^48 B); give \
                 --capacity to replay the rest with the oversized requests refused as capacity failures"
            ),
        }
    };
    if matches!(trace.format, TraceFormat::PytorchSnapshot(_)) && p.reserved > 0 {
        if p.reserved > MAX_BYTES as u128 {
            return Err(too_big(p.reserved_event, "PyTorch's reserved bytes peak at", p.reserved));
        }
        return Ok(Capacity { bytes: (p.reserved as u64).max(min), source: CapacitySource::PeakReserved });
    }
    if let Some(bytes) = capacity_from_name(trace) {
        if !(min..=MAX_BYTES).contains(&bytes) {
            return Err(TraceError::schema(
                &trace.source,
                Location::FileName,
                format!(
                    "capacity {bytes} B (minimalloc NAME.CAPACITY.csv) is outside [{min} B, 2^48 B], the range the \
                     strategies model; give --capacity"
                ),
            ));
        }
        return Ok(Capacity { bytes, source: CapacitySource::FileName });
    }
    let two_mib = 2u128 << 20;
    let twice = (p.allocated * 2).div_ceil(two_mib).max(1) * two_mib;
    if twice > MAX_BYTES as u128 {
        // Name the first buffer that alone is larger than any device, else the event at the peak.
        let huge = dev.events.iter().position(|e| e.kind == EventKind::Alloc && e.size > MAX_BYTES / 2);
        return Err(match huge {
            Some(i) => too_big(Some(i), "a buffer of", dev.events[i].size as u128),
            None => too_big(p.allocated_event, "live requested bytes peak at", p.allocated),
        });
    }
    Ok(Capacity { bytes: (twice as u64).max(min), source: CapacitySource::TwiceDemandPeak })
}

fn capacity_from_name(trace: &Trace) -> Option<u64> {
    if trace.format != TraceFormat::LifetimeCsv {
        return None;
    }
    let stem = trace.source.file_stem()?.to_str()?;
    stem.rsplit('.').next().filter(|s| !s.is_empty() && s.len() < stem.len())?.parse().ok()
}

/// The answer to "why did this request fail?".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Not enough memory even if every cached byte were released and compacted: the GPU was full.
    /// Defragmenting, releasing the cache or expandable segments cannot help.
    Capacity,
    /// Enough bytes were free (driver free plus cached holes), but no single extent held the request:
    /// releasing or compacting the cached holes (or expandable segments) would have served it.
    Fragmentation,
    /// The request is no larger than the largest free extent: PyTorch failed for a rule of its own
    /// (the segment size it asks the driver for, a hole in the other pool, `max_split_size`).
    Fits,
    /// The driver's free bytes are not recorded; the verdict cannot be decided.
    Undetermined,
}

impl From<OomClass> for Verdict {
    fn from(c: OomClass) -> Self {
        match c {
            OomClass::Capacity => Verdict::Capacity,
            OomClass::Fragmentation => Verdict::Fragmentation,
            OomClass::Fits => Verdict::Fits,
        }
    }
}

/// A recorded `oom` event, explained. Bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OomExplanation {
    /// Index of the `oom` event in the device's trace.
    pub event: usize,
    /// The request (the event's `size`: PyTorch records the request rounded to its block size).
    pub request: u64,
    /// What PyTorch asks the driver for when no cached block fits: the segment size for the request
    /// (`get_allocation_size`: 2 MiB up to 1 MiB, 20 MiB below 10 MiB, else rounded up to 2 MiB).
    pub segment_request: u64,
    /// PyTorch allocated bytes (live blocks) at the event.
    pub allocated: u64,
    /// PyTorch reserved bytes (segments) at the event.
    pub reserved: u64,
    /// Reserved but unallocated: the cached holes inside segments.
    pub reserved_unallocated: u64,
    /// Largest cached hole.
    pub largest_hole: u64,
    /// Free bytes the driver reported (`device_free`), when recorded.
    pub device_free: Option<u64>,
    /// The GPU's memory: `reserved + device_free`.
    pub capacity: Option<u64>,
    /// `device_free + reserved_unallocated`: what a perfect compaction would have had.
    pub free_total: Option<u64>,
    /// The largest free extent: `max(device_free, largest_hole)` (a GPU maps free pages into any
    /// virtual range, so the driver's free bytes are one extent).
    pub largest_extent: Option<u64>,
    /// `request − free_total` when positive: bytes missing even after compaction.
    pub shortfall: u64,
    /// The verdict.
    pub verdict: Verdict,
    /// The caching model's replay with the snapshot's own settings at `capacity` ([`reproduce`]);
    /// `None` without a capacity.
    pub replay: Option<Reproduction>,
    /// The allocator state at the event.
    #[serde(skip)]
    pub state: HeapState,
}

/// Explains the `oom` event at index `event` of `dev` with the driver's free bytes `device_free` (the
/// event's own, or capacity − reserved when the user gives a capacity).
///
/// # Errors
/// [`StateError`] when the state's sums exceed 2^64 − 1.
pub fn explain_oom(dev: &DeviceTrace, event: usize, device_free: Option<u64>) -> Result<OomExplanation, StateError> {
    let st = state_after(dev, Some(event))?;
    let request = dev.events.get(event).map_or(0, |e| e.size);
    let holes: Vec<u64> = st.segments.iter().flat_map(|s| s.holes.iter().map(|h| h.size)).collect();
    let (verdict, free_total, largest_extent, shortfall) = match device_free {
        Some(f) => {
            let d = analysis::diagnose_heap(request, &[f], &holes);
            (Verdict::from(d.class), Some(d.free), Some(d.largest_free), d.shortfall)
        }
        None => (Verdict::Undetermined, None, None, 0),
    };
    Ok(OomExplanation {
        event,
        request,
        segment_request: caching::segment_size(caching::round_size(request).unwrap_or(request)).unwrap_or(request),
        allocated: st.allocated,
        reserved: st.reserved,
        reserved_unallocated: st.hole_bytes,
        largest_hole: st.largest_hole,
        device_free,
        capacity: device_free.and_then(|f| st.reserved.checked_add(f)),
        free_total,
        largest_extent,
        shortfall,
        verdict,
        replay: None,
        state: st,
    })
}

/// `dev` with the request of every `oom` event tried where it failed: the event becomes an `alloc` of
/// its size, followed by the `free_completed` of that block (PyTorch never served it, so it must not
/// hold memory afterwards). Also returns, per event of the new trace, the index of the event of `dev` it
/// comes from (an inserted free maps to its `oom` event).
pub fn with_oom_requests(dev: &DeviceTrace) -> (DeviceTrace, Vec<usize>) {
    if dev.ooms.is_empty() {
        return (dev.clone(), (0..dev.events.len()).collect());
    }
    let mut out = DeviceTrace { events: Vec::with_capacity(dev.events.len() + dev.ooms.len()), ..dev.clone() };
    let mut map = Vec::with_capacity(out.events.capacity());
    for (i, e) in dev.events.iter().enumerate() {
        if e.kind == EventKind::Oom {
            let id = out.block_ids;
            out.block_ids = out.block_ids.saturating_add(1);
            let alloc = crate::trace::Event { kind: EventKind::Alloc, id, ..*e };
            out.events.push(alloc);
            out.events.push(crate::trace::Event { kind: EventKind::Free, ..alloc });
            map.extend([i, i]);
        } else {
            out.events.push(*e);
            map.push(i);
        }
    }
    (out, map)
}

/// Whether the caching model, with the snapshot's own settings, fails a recorded OOM's request where
/// PyTorch did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Reproduction {
    /// The capacity of the replay (the GPU's memory at the OOM), bytes.
    pub capacity: u64,
    /// The first request the model failed (event index in the file); `None`: none failed.
    pub first_failure: Option<usize>,
    /// `first_failure` is the recorded OOM itself.
    pub reproduced: bool,
}

/// Replays `dev` (with [`with_oom_requests`]) through the caching model with the snapshot's own
/// settings at `capacity` and reports whether the first failure is the `oom` event `event`.
///
/// # Errors
/// [`ExplainError::Replay`] when the replay cannot run.
pub fn reproduce(trace: &Trace, dev: &DeviceTrace, event: usize, capacity: u64) -> Result<Reproduction, ExplainError> {
    let (d, map) = with_oom_requests(dev);
    let mut opts = crate::replay::ReplayOptions::new(crate::reference::StrategyKind::Caching);
    opts.capacity = Some(capacity);
    opts.timeline_points = 1;
    let r = crate::replay::replay(trace, &d, &opts, None, &mut |_| {})?;
    let first_failure = r.failed.first().and_then(|f| f.event).and_then(|e| map.get(e).copied());
    Ok(Reproduction { capacity, first_failure, reproduced: first_failure == Some(event) })
}

/// Which moment the detail of an [`Explanation`] describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Moment {
    /// The first recorded `oom` event.
    RecordedOom,
    /// The state a snapshot without events holds (e.g. dumped by an OOM observer).
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
pub struct Tensor {
    /// The block.
    #[serde(flatten)]
    pub block: SnapshotBlock,
    /// Up to [`TOP_FRAMES`] user frames (Python files outside `torch/`), innermost first; empty when
    /// the snapshot records none (history not recorded).
    pub frames: Vec<Frame>,
}

/// For a snapshot without an `oom` event: which requests its state would have served, at a capacity.
/// Bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct RequestBounds {
    /// The capacity assumed.
    pub capacity: u64,
    /// `capacity − reserved` (0 when reserved exceeds it).
    pub device_free: u64,
    /// Requests up to this size fit in one free extent (`max(device_free, largest hole)`).
    pub fits_up_to: u64,
    /// Requests above `fits_up_to` and up to this size would have failed for fragmentation
    /// (`device_free + holes`); larger ones for capacity.
    pub fragmentation_up_to: u64,
}

/// How many largest live tensors and segments with holes an [`Explanation`] lists.
pub const TOP_ITEMS: usize = 8;
/// How many recorded `oom` events an [`Explanation`] explains one by one (each replays the trace up to
/// it, so explaining all of a file with thousands of OOMs would take time quadratic in its length).
pub const MAX_EXPLAINED_OOMS: usize = 32;
/// How many user frames a [`Tensor`] keeps.
pub const TOP_FRAMES: usize = 3;

/// The answer page for one device of a trace.
#[derive(Clone, Debug, Serialize)]
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
    /// For a dumped state without an `oom` event: the requests it would have served.
    pub request_bounds: Option<RequestBounds>,
    /// The settings search, when run ([`tune::tune`]).
    pub tune: Option<tune::TuneReport>,
}

/// Errors of [`explain`] and [`tune::tune`]; all are bad input (exit code 2) except
/// [`ExplainError::Replay`] run-time failures.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// The trace is unusable (a sum that cannot be represented, frames that cannot be read).
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// The options do not fit the trace (a device it does not have...).
    #[error("{0}")]
    Input(String),
    /// A replay failed.
    #[error(transparent)]
    Replay(#[from] crate::replay::ReplayError),
}

impl ExplainError {
    /// `true` for bad input (exit code 2).
    pub fn is_input(&self) -> bool {
        match self {
            ExplainError::Trace(_) | ExplainError::Input(_) => true,
            ExplainError::Replay(r) => r.is_input(),
        }
    }
}

/// `allocator_settings` as the `PYTORCH_CUDA_ALLOC_CONF` value that sets them: the recorded variable
/// when it is set, else the non-default values of the structured fields (empty: PyTorch's defaults).
/// `None` when the snapshot records no settings.
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
            Some(i) => event_location(trace, dev, i),
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
/// [`ExplainError::Input`] for a device the file lacks, a file with no allocation at all or a
/// `capacity` outside the range the strategies model; [`ExplainError::Trace`] for sums that cannot be
/// represented or a snapshot that cannot be read again.
pub fn explain(trace: &Trace, device: Option<i64>, capacity: Option<u64>) -> Result<Explanation, ExplainError> {
    explain_with_bytes(trace, None, device, capacity)
}

/// [`explain`] with the content of the trace file already read (`bytes`, from
/// [`crate::trace::read_trace_and_bytes`]): the stack frames are read from it instead of the file
/// [`Trace::source`] names, which is read again when `bytes` is `None`.
///
/// # Errors
/// As [`explain`].
pub fn explain_with_bytes(
    trace: &Trace,
    bytes: Option<&[u8]>,
    device: Option<i64>,
    capacity: Option<u64>,
) -> Result<Explanation, ExplainError> {
    check_given_capacity(capacity)?;
    let devices = summarize(trace);
    let choice = choose_device(trace, &devices, device).map_err(ExplainError::Input)?;
    let dev = &trace.devices[choice.index];
    let cap = capacity_from_evidence(trace, dev, capacity)?;
    let gpu = gpu_capacity_at_oom(trace, dev)?.map(|c| c.bytes);
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
        let mut x = explain_oom(dev, o.event, free).map_err(|e| trace_error(trace, dev, e))?;
        let replay_capacity = match (capacity, x.device_free) {
            // A given capacity is at least MIN_CAPACITY (`check_given_capacity`).
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
    let (moment, st) = if let Some(first) = ooms.first() {
        (Moment::RecordedOom, first.state.clone())
    } else if dev.events.is_empty() {
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
    let mut largest: Vec<Tensor> =
        st.live.iter().take(TOP_ITEMS).map(|b| Tensor { block: b.clone(), frames: Vec::new() }).collect();
    if matches!(trace.format, TraceFormat::PytorchSnapshot(_)) && !largest.is_empty() {
        attach_frames(&trace.source, bytes, dev, &mut largest)?;
    }
    let mut with_holes: Vec<SegmentView> = st.segments.iter().filter(|s| s.hole_bytes() > 0).cloned().collect();
    with_holes.sort_by(|a, b| b.hole_bytes().cmp(&a.hole_bytes()).then(a.addr.cmp(&b.addr)));
    with_holes.truncate(TOP_ITEMS);
    let request_bounds = (moment == Moment::DumpedState).then(|| {
        let device_free = cap.bytes.saturating_sub(st.reserved);
        RequestBounds {
            capacity: cap.bytes,
            device_free,
            fits_up_to: device_free.max(st.largest_hole),
            fragmentation_up_to: device_free.saturating_add(st.hole_bytes),
        }
    });
    let warnings = caching::config_for_trace(dev, cap.bytes).1;
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
        request_bounds,
        ooms_not_explained: dev.ooms.len() - ooms.len(),
        ooms,
        tune: None,
    })
}

/// Fills the frames of `tensors` from the snapshot file: the frames of each block's `alloc` event,
/// else those its final-state block records.
fn attach_frames(
    path: &Path,
    bytes: Option<&[u8]>,
    dev: &DeviceTrace,
    tensors: &mut [Tensor],
) -> Result<(), TraceError> {
    let again;
    let bytes = match bytes {
        Some(b) => b,
        None => {
            again = std::fs::read(path).map_err(|source| TraceError::Io { path: path.to_path_buf(), source })?;
            &again[..]
        }
    };
    let events: Vec<usize> = tensors.iter().filter_map(|t| t.block.alloc_event).collect();
    let blocks: Vec<u64> = tensors.iter().map(|t| t.block.addr).collect();
    let f = pytorch::read_frames(path, bytes, dev.device, &events, &blocks)?;
    for t in tensors {
        let from_event = t.block.alloc_event.and_then(|i| f.events.iter().find(|e| e.0 == i)).map(|e| &e.1);
        // A final-state block at the same address is the same tensor only if no later alloc reused it;
        // its frames are used for blocks alive before the first event.
        let from_block = || {
            (t.block.alloc_event.is_none())
                .then(|| f.blocks.iter().find(|b| b.0 == t.block.addr))
                .flatten()
                .map(|b| &b.1)
        };
        if let Some(frames) = from_event.or_else(from_block) {
            t.frames = frames.iter().filter(|fr| fr.is_user()).take(TOP_FRAMES).cloned().collect();
        }
    }
    Ok(())
}
