//! A recorded `oom` event explained from the trace itself: the request, PyTorch's allocated and
//! reserved bytes at that moment, where the reserved-but-unallocated bytes sit
//! ([`crate::facts::state`]), the driver's free bytes and a [`Verdict`] by the rule of DESIGN.md §3.8
//! (bug scenario BL-02); and whether the caching model with the snapshot's own settings fails the
//! request where PyTorch did ([`reproduce`]).

use serde::Serialize;

use super::ExplainError;
use crate::analysis::{self, OomClass};
use crate::facts::{state_after, HeapState, StateError};
use crate::reference::caching::CachingConfig;
use crate::trace::{DeviceTrace, EventKind, Trace};

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
#[non_exhaustive]
pub struct OomExplanation {
    /// Index of the `oom` event in the device's trace.
    pub event: usize,
    /// The request (the event's `size`: PyTorch records the request rounded to its block size).
    pub request: u64,
    /// What PyTorch asks the driver for when no cached block fits ([`CachingConfig::new_memory`]): the
    /// segment size for the request (`get_allocation_size`: 2 MiB up to 1 MiB, 20 MiB below 10 MiB, else
    /// rounded up to 2 MiB), or with expandable segments the request in whole 2 MiB or 20 MiB pages.
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
    /// The largest hole of the request's own memory pool (the holes the verdict counts; 0 when none).
    pub largest_pool_hole: u64,
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
/// event's own, or capacity − reserved when the user gives a capacity), under the allocator settings
/// `settings` (the trace's own: [`crate::reference::caching::config_for_trace`]).
///
/// # Errors
/// [`StateError`] when the state's sums exceed 2^64 − 1.
#[doc(hidden)]
pub fn explain_oom(
    dev: &DeviceTrace,
    event: usize,
    device_free: Option<u64>,
    settings: &CachingConfig,
) -> Result<OomExplanation, StateError> {
    let st = state_after(dev, Some(event))?;
    let request = dev.events.get(event).map_or(0, |e| e.size);
    // Only the request's own memory pool's holes could have served it.
    let pool = dev.events.get(event).map_or_else(Default::default, |e| dev.mempool(e.mempool));
    let holes = crate::facts::usable_holes(&st, pool);
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
        segment_request: settings.new_memory(request).unwrap_or(request),
        allocated: st.allocated,
        reserved: st.reserved,
        reserved_unallocated: st.hole_bytes,
        largest_hole: st.largest_hole,
        device_free,
        capacity: device_free.and_then(|f| st.reserved.checked_add(f)),
        free_total,
        largest_extent,
        largest_pool_hole: holes.iter().copied().max().unwrap_or(0),
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
#[doc(hidden)]
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
#[doc(hidden)]
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
#[doc(hidden)]
pub fn reproduce(trace: &Trace, dev: &DeviceTrace, event: usize, capacity: u64) -> Result<Reproduction, ExplainError> {
    let (d, map) = with_oom_requests(dev);
    let mut opts = crate::replay::ReplayOptions::new(crate::reference::StrategyKind::Caching);
    opts.capacity = Some(capacity);
    opts.timeline_points = 1;
    let r = crate::replay::replay(trace, &d, &opts, None, &mut |_| {})?;
    let first_failure = r.failed.first().and_then(|f| f.event).and_then(|e| map.get(e).copied());
    Ok(Reproduction { capacity, first_failure, reproduced: first_failure == Some(event) })
}
