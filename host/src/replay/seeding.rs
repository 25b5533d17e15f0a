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
