//! The peaks a trace records and PyTorch's reserved bytes over it: one arithmetic for every walk.
//!
//! *Reserved bytes* (PyTorch's `reserved_bytes`) are the segments alive before the first event, plus
//! `segment_alloc`, minus `segment_free` (by segment id: a free takes back what its segment was
//! allocated with), with expandable segments counted as the union of their mapped ranges
//! (`segment_map` adds `[addr, addr + size)`, `segment_unmap` removes it; a range mapped twice, such as
//! a seeded segment and its own `segment_map`, counts once). Sums are 128-bit. One tracker
//! (`ReservedTracker`) follows them event by event; [`peaks`] (explain's moments, the default capacity) and the replay
//! engine's *PyTorch reserved* series ([`PytorchReserved`], the timeline) both walk with it.
//!
//! *Live bytes* are the requested bytes of the blocks alive before the first event plus `alloc`,
//! minus `free_completed`.

use std::collections::BTreeMap;

use serde::Serialize;

use super::state::{map_range, unmap_range};
use crate::trace::{BlockStatus, DeviceTrace, Event, EventKind};

/// PyTorch's reserved bytes of one device, followed event by event (see the [module docs](self)).
pub(crate) struct ReservedTracker {
    /// Bytes of each non-expandable segment alive, by segment id (0: not alive).
    seg_size: Vec<u64>,
    /// Sum of `seg_size`.
    fixed: u128,
    /// Mapped ranges of expandable segments, disjoint (`start → end`).
    mapped: BTreeMap<u64, u64>,
    /// Bytes of `mapped`.
    mapped_total: u128,
    /// Segments: the initial ones, plus `segment_alloc`, minus `segment_free` events.
    segments: u64,
}

impl ReservedTracker {
    /// Before the first event of `dev` (its initial segments and mapped ranges).
    pub(crate) fn new(dev: &DeviceTrace) -> Self {
        let mut t = ReservedTracker {
            seg_size: vec![0; dev.segment_ids as usize],
            fixed: 0,
            mapped: BTreeMap::new(),
            mapped_total: 0,
            segments: dev.initial_segments.len() as u64,
        };
        for s in &dev.initial_segments {
            if s.is_expandable {
                map_range(&mut t.mapped, s.addr, s.addr.saturating_add(s.size));
            } else if let Some(x) = t.seg_size.get_mut(s.id as usize) {
                *x = s.size;
                t.fixed += s.size as u128;
            }
        }
        t.mapped_total = t.mapped_bytes();
        t
    }

    fn mapped_bytes(&self) -> u128 {
        self.mapped.iter().map(|(&s, &e)| (e - s) as u128).sum()
    }

    /// Reserved bytes now.
    #[inline]
    pub(crate) fn reserved(&self) -> u128 {
        self.fixed + self.mapped_total
    }

    /// [`reserved`](Self::reserved), saturated to 2^64 − 1 (possible only with sizes no device holds).
    #[inline]
    pub(crate) fn reserved_u64(&self) -> u64 {
        u64::try_from(self.reserved()).unwrap_or(u64::MAX)
    }

    /// Segments now.
    pub(crate) fn segments(&self) -> u64 {
        self.segments
    }

    /// Takes event `e`; `true` when it is a segment event (reserved bytes may have changed).
    #[inline]
    pub(crate) fn event(&mut self, e: &Event) -> bool {
        match e.kind {
            EventKind::SegmentAlloc => {
                self.segments += 1;
                if let Some(x) = self.seg_size.get_mut(e.id as usize) {
                    *x = e.size;
                    self.fixed += e.size as u128;
                }
            }
            EventKind::SegmentFree => {
                self.segments = self.segments.saturating_sub(1);
                if let Some(x) = self.seg_size.get_mut(e.id as usize) {
                    self.fixed -= std::mem::take(x) as u128;
                }
            }
            EventKind::SegmentMap | EventKind::SegmentUnmap => {
                let end = e.addr.saturating_add(e.size);
                if e.kind == EventKind::SegmentMap {
                    map_range(&mut self.mapped, e.addr, end);
                } else {
                    unmap_range(&mut self.mapped, e.addr, end);
                }
                self.mapped_total = self.mapped_bytes();
            }
            _ => return false,
        }
        true
    }
}

/// The demand and reserved peaks of a device (bytes, 128-bit sums), with the events after which they are
/// reached (`None`: before the first event).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
#[doc(hidden)]
pub struct Peaks {
    /// Highest live requested bytes (for a snapshot without events, its final state's).
    pub allocated: u128,
    /// The event after which `allocated` is first reached.
    pub allocated_event: Option<usize>,
    /// Highest PyTorch reserved bytes, the snapshot's final state included (a recorded moment too).
    pub reserved: u128,
    /// Among the moments at `reserved`, the one with the most live bytes.
    pub reserved_event: Option<usize>,
}

/// The [`Peaks`] of `dev`, in one walk over its events.
#[doc(hidden)]
pub fn peaks(dev: &DeviceTrace) -> Peaks {
    let mut size = vec![0u64; dev.block_ids as usize];
    let mut live: u128 = 0;
    for b in &dev.initial_blocks {
        if let Some(s) = size.get_mut(b.id as usize) {
            *s = b.size;
            live += b.size as u128;
        }
    }
    let mut reserved = ReservedTracker::new(dev);
    let mut p = Peaks { allocated: live, allocated_event: None, reserved: reserved.reserved(), reserved_event: None };
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
            _ => {
                if !reserved.event(e) {
                    continue;
                }
            }
        }
        if (reserved.reserved(), live) > (p.reserved, live_at_reserved) {
            (p.reserved, p.reserved_event, live_at_reserved) = (reserved.reserved(), Some(i), live);
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
            let req: u128 =
                f.blocks().filter(|b| b.state != BlockStatus::Inactive).map(|b| b.requested_size as u128).sum();
            p.allocated = p.allocated.max(req);
        }
    }
    p
}

/// The event after which the trace's live requested bytes are highest (`None`: before the first
/// event, i.e. the initial blocks), and that peak in bytes (a peak above 2^64 − 1 B, possible only with
/// sizes no device holds, is reported as 2^64 − 1).
#[doc(hidden)]
pub fn demand_peak(dev: &DeviceTrace) -> (Option<usize>, u64) {
    let p = peaks(dev);
    (p.allocated_event, u64::try_from(p.allocated).unwrap_or(u64::MAX))
}

/// PyTorch's own reserved bytes over a trace, from its segments (the walk of the module docs). Bytes; sums above
/// 2^64 − 1 (sizes no device holds) are reported as 2^64 − 1.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
#[doc(hidden)]
pub struct PytorchReserved {
    /// Reserved bytes before the first event (initial segments).
    pub initial: u64,
    /// Highest reserved bytes over the events.
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

/// [`PytorchReserved`] built event by event: [`pytorch_series`], and the replay engine's own walk over
/// the events (one pass for both).
pub(crate) struct SeriesTracker {
    tracker: ReservedTracker,
    initial: u64,
    peak: u64,
    peak_event: Option<usize>,
    ooms: u64,
}

impl SeriesTracker {
    /// Before the first event of `dev` (its initial segments).
    pub(crate) fn new(dev: &DeviceTrace) -> Self {
        let tracker = ReservedTracker::new(dev);
        let initial = tracker.reserved_u64();
        SeriesTracker { tracker, initial, peak: initial, peak_event: None, ooms: 0 }
    }

    /// Reserved bytes after the last event taken.
    #[inline]
    pub(crate) fn reserved(&self) -> u64 {
        self.tracker.reserved_u64()
    }

    /// Takes event `i`, `e`.
    #[inline]
    pub(crate) fn event(&mut self, i: usize, e: &Event) {
        if e.kind == EventKind::Oom {
            self.ooms += 1;
        } else if self.tracker.event(e) {
            let r = self.tracker.reserved_u64();
            if r > self.peak {
                (self.peak, self.peak_event) = (r, Some(i));
            }
        }
    }

    /// The summary, after every event of `dev`.
    pub(crate) fn finish(&self, dev: &DeviceTrace) -> PytorchReserved {
        let fin = dev.final_state.as_ref();
        PytorchReserved {
            initial: self.initial,
            peak: self.peak,
            peak_event: self.peak_event,
            end: self.tracker.reserved_u64(),
            end_segments: self.tracker.segments(),
            snapshot_reserved: fin.map(|s| s.reserved_bytes()),
            snapshot_segments: fin.map(|s| s.segment_count() as u64),
            snapshot_allocated: fin.map(|s| s.allocated_bytes()),
            ooms: self.ooms,
        }
    }
}

/// PyTorch's reserved-bytes series summary of `dev`.
#[doc(hidden)]
pub fn pytorch_series(dev: &DeviceTrace) -> PytorchReserved {
    let mut t = SeriesTracker::new(dev);
    for (i, e) in dev.events.iter().enumerate() {
        t.event(i, e);
    }
    t.finish(dev)
}
