//! PyTorch snapshots: seeding the caching model with the state before the first event, and PyTorch's own
//! reserved-bytes series from the segment events.

use serde::Serialize;

use super::ReplayError;
use crate::reference::caching::{self, CachingAllocator};
use crate::reference::Allocation;
use crate::trace::{DeviceTrace, EventKind};

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
    let mut t = SeriesTracker::new(dev);
    for (i, e) in dev.events.iter().enumerate() {
        t.event(i, e.kind, e.size);
    }
    t.finish(dev)
}

/// PyTorch's reserved bytes followed event by event: [`pytorch_series`], and the replay engine's own
/// walk over the events (one pass for both).
pub(crate) struct SeriesTracker {
    initial: u64,
    /// Reserved bytes after the last event seen.
    pub reserved: u64,
    segments: u64,
    peak: u64,
    peak_event: Option<usize>,
    ooms: u64,
}

impl SeriesTracker {
    /// Before the first event of `dev` (its initial segments).
    pub fn new(dev: &DeviceTrace) -> Self {
        let initial: u64 = dev.initial_segments.iter().map(|s| s.size).sum();
        SeriesTracker {
            initial,
            reserved: initial,
            segments: dev.initial_segments.len() as u64,
            peak: initial,
            peak_event: None,
            ooms: 0,
        }
    }

    /// Event `i`, of `kind`, of `size` bytes.
    #[inline]
    pub fn event(&mut self, i: usize, kind: EventKind, size: u64) {
        let r = &mut self.reserved;
        match kind {
            EventKind::SegmentAlloc => {
                *r = r.saturating_add(size);
                self.segments += 1;
            }
            EventKind::SegmentMap => *r = r.saturating_add(size),
            EventKind::SegmentFree => {
                *r = r.saturating_sub(size);
                self.segments = self.segments.saturating_sub(1);
            }
            EventKind::SegmentUnmap => *r = r.saturating_sub(size),
            EventKind::Oom => {
                self.ooms += 1;
                return;
            }
            _ => return,
        }
        if *r > self.peak {
            (self.peak, self.peak_event) = (*r, Some(i));
        }
    }

    /// The summary, after every event of `dev`.
    pub fn finish(&self, dev: &DeviceTrace) -> PytorchReserved {
        let fin = dev.final_state.as_ref();
        PytorchReserved {
            initial: self.initial,
            peak: self.peak,
            peak_event: self.peak_event,
            end: self.reserved,
            end_segments: self.segments,
            snapshot_reserved: fin.map(|s| s.reserved_bytes()),
            snapshot_segments: fin.map(|s| s.segment_count() as u64),
            snapshot_allocated: fin.map(|s| s.allocated_bytes()),
            ooms: self.ooms,
        }
    }
}

/// The caching model of a snapshot seeded with the state before the first event.
pub(crate) struct SeededModel {
    /// The model, with the seeded segments and blocks.
    pub model: CachingAllocator,
    /// Initial blocks placed at their recorded positions: (block id, the model's allocation).
    pub blocks: Vec<(u32, Allocation)>,
    /// Indices into [`DeviceTrace::initial_blocks`] left to allocate normally, in address order.
    pub unplaced: Vec<usize>,
    /// Segments seeded.
    pub segments: u64,
    /// The recorded segment events that drive the model's releases.
    pub recorded: caching::RecordedSegments,
}

/// Seeds `model`'s configuration with `dev`'s segments and blocks alive before the first event
/// ([`caching::seed_from_trace`]).
///
/// # Errors
/// [`ReplayError::Config`] when the state cannot be seeded at this capacity.
pub(crate) fn seed_caching(dev: &DeviceTrace, model: &CachingAllocator) -> Result<SeededModel, ReplayError> {
    let seeded = caching::seed_from_trace(dev, model.config()).map_err(|e| ReplayError::Config(e.to_string()))?;
    let recorded = caching::RecordedSegments::new(dev, &seeded);
    let mut unplaced = seeded.unplaced;
    unplaced.sort_by_key(|&i| dev.initial_blocks[i].addr);
    Ok(SeededModel { model: seeded.model, blocks: seeded.blocks, unplaced, segments: seeded.segments, recorded })
}
