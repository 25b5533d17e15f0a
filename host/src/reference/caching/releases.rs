//! The releases a PyTorch trace records (runs of `segment_free` / `segment_unmap` events), each classified:
//! made by the allocator while serving a request, or asked for by the program.
//!
//! PyTorch returns cached segments to the driver in two ways (`c10/cuda/CUDACachingAllocator.cpp`):
//!
//! - **The allocator's own**, inside `DeviceCachingAllocator::malloc`: when `alloc_block`'s `cudaMalloc`
//!   fails, `release_available_cached_blocks` (with `max_split_size`) and then `release_cached_blocks(context,
//!   {0, 0})` release cached segments and `alloc_block` is retried; with a memory fraction and a
//!   `garbage_collection_threshold`, `garbage_collect_cached_blocks` releases before the first try. These
//!   happen because of the GPU's size at that moment: on a larger GPU the `cudaMalloc` would have succeeded
//!   and nothing would have been released. A replay leaves them to the model, which releases exactly when
//!   its own allocation fails at the replay's capacity ([`super::CachingAllocator::alloc_in`]).
//! - **The program's**: `torch.cuda.empty_cache()` (`emptyCache` → `release_cached_blocks`). These are
//!   events of the program and are replayed as recorded at every capacity.
//!
//! The evidence, in order ([`ReleaseEvidence`]): the stack frames PyTorch records with each entry (an
//! `empty_cache` / `emptyCache` frame: the program; a `DeviceCachingAllocator::malloc` frame: the
//! allocator, [`crate::trace::ReleaseCaller`]); without frames, the order of events: a run directly
//! followed by the `segment_alloc` (or `segment_map`) of the request it made room for, where that new
//! segment would not have fitted beside the reserved bytes before the run within the largest reserved bytes
//! the trace shows (so `cudaMalloc` must have failed on that GPU); else the program's (as recorded).

use serde::Serialize;

use crate::trace::{DeviceTrace, EventKind, ReleaseCaller};

/// Who made a recorded release.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
#[doc(hidden)]
pub enum ReleaseCause {
    /// PyTorch's allocator, while serving a request (`malloc`: after a failed `cudaMalloc`, or its garbage
    /// collection). A replay lets the model decide at its own capacity.
    Allocator,
    /// The program (`torch.cuda.empty_cache()`), or no evidence of the allocator. Replayed as recorded.
    Program,
}

/// Why a release was classified so.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
#[doc(hidden)]
pub enum ReleaseEvidence {
    /// Its stack frames pass through `empty_cache` / `emptyCache`.
    EmptyCacheFrames,
    /// Its stack frames pass through `DeviceCachingAllocator::malloc` (and no `empty_cache`).
    MallocFrames,
    /// No frames say; the run is directly followed by a new segment that would not have fitted on a GPU
    /// holding no more than the largest reserved bytes the trace shows beside the bytes reserved before the
    /// run.
    FollowedByNewSegment,
    /// No frames say and the order of events does not show a failed `cudaMalloc`.
    NoEvidence,
}

/// One recorded release: a run of consecutive `segment_free` / `segment_unmap` events. Bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[doc(hidden)]
pub struct RecordedRelease {
    /// Index of its first event.
    pub first_event: usize,
    /// Index of its last event.
    pub last_event: usize,
    /// Segments (or mapped ranges) released.
    pub segments: usize,
    /// Bytes released.
    pub bytes: u64,
    /// PyTorch's reserved bytes before it.
    pub reserved_before: u64,
    /// The new segment (or mapping) that directly follows it: `(event index, bytes)`.
    pub next_segment: Option<(usize, u64)>,
    /// Who made it.
    pub cause: ReleaseCause,
    /// Why.
    pub evidence: ReleaseEvidence,
}

impl RecordedRelease {
    /// For a release of the allocator followed by its retry's new segment: the bytes PyTorch asked the
    /// driver for in all, `reserved_before + next segment`, which the GPU could not give (its memory for
    /// PyTorch was below this). `None` otherwise.
    pub fn failed_request_bound(&self) -> Option<u64> {
        match (self.cause, self.next_segment) {
            (ReleaseCause::Allocator, Some((_, s))) => self.reserved_before.checked_add(s),
            _ => None,
        }
    }

    /// Whether event `i` is one of its events.
    pub fn contains(&self, i: usize) -> bool {
        (self.first_event..=self.last_event).contains(&i)
    }
}

/// Every recorded release of `dev`, in event order, classified (see the module docs). Reserved
/// bytes are walked as the segment events add and remove them (initial segments, `+` allocs and maps,
/// `−` frees and unmaps), and the largest is compared with the final state's too.
#[doc(hidden)]
pub fn recorded_releases(dev: &DeviceTrace) -> Vec<RecordedRelease> {
    let initial: u128 = dev.initial_segments.iter().map(|s| s.size as u128).sum();
    // Reserved bytes after event `e` from `r` before it.
    let after = |r: u128, e: &crate::trace::Event| match e.kind {
        EventKind::SegmentAlloc | EventKind::SegmentMap => r + e.size as u128,
        EventKind::SegmentFree | EventKind::SegmentUnmap => r.saturating_sub(e.size as u128),
        _ => r,
    };
    // The largest reserved bytes reached; the walk below recomputes the bytes before each release (no
    // vector of the bytes before every event: this runs once per replay of the caching model).
    let mut peak = initial;
    let mut r = initial;
    for e in &dev.events {
        r = after(r, e);
        peak = peak.max(r);
    }
    if let Some(f) = &dev.final_state {
        peak = peak.max(f.segments.iter().map(|s| s.size as u128).sum());
    }
    let caller =
        |i: usize| dev.release_callers.binary_search_by_key(&i, |c| c.0).ok().map(|k| dev.release_callers[k].1);
    let is_release = |k: EventKind| matches!(k, EventKind::SegmentFree | EventKind::SegmentUnmap);
    let mut out = Vec::new();
    let mut i = 0;
    // Reserved bytes before event `i`.
    let mut r = initial;
    while i < dev.events.len() {
        if !is_release(dev.events[i].kind) {
            r = after(r, &dev.events[i]);
            i += 1;
            continue;
        }
        let first = i;
        let reserved_before = r;
        r = after(r, &dev.events[i]);
        while i + 1 < dev.events.len() && is_release(dev.events[i + 1].kind) {
            i += 1;
            r = after(r, &dev.events[i]);
        }
        let last = i;
        i += 1;
        let callers: Vec<ReleaseCaller> = (first..=last).filter_map(caller).collect();
        let next_segment = dev
            .events
            .get(last + 1)
            .filter(|n| matches!(n.kind, EventKind::SegmentAlloc | EventKind::SegmentMap))
            .map(|n| (last + 1, n.size));
        let (cause, evidence) = if callers.contains(&ReleaseCaller::EmptyCache) {
            (ReleaseCause::Program, ReleaseEvidence::EmptyCacheFrames)
        } else if callers.contains(&ReleaseCaller::Malloc) {
            (ReleaseCause::Allocator, ReleaseEvidence::MallocFrames)
        } else if next_segment.is_some_and(|(_, s)| reserved_before + s as u128 > peak) {
            (ReleaseCause::Allocator, ReleaseEvidence::FollowedByNewSegment)
        } else {
            (ReleaseCause::Program, ReleaseEvidence::NoEvidence)
        };
        let bytes = dev.events[first..=last].iter().map(|e| e.size as u128).sum::<u128>();
        out.push(RecordedRelease {
            first_event: first,
            last_event: last,
            segments: last - first + 1,
            bytes: u64::try_from(bytes).unwrap_or(u64::MAX),
            reserved_before: u64::try_from(reserved_before).unwrap_or(u64::MAX),
            next_segment,
            cause,
            evidence,
        });
    }
    out
}
