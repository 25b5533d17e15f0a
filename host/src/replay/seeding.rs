//! PyTorch snapshots: seeding the caching model with the state before the first event.

use super::{Refusal, ReplayError};
use crate::reference::caching::{self, CachingAllocator};
use crate::reference::Allocation;
use crate::trace::DeviceTrace;

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
/// ([`caching::seed_from_trace`]), reading the events from `scan` when given ([`caching::TraceScan`],
/// made of `dev`; `None`: made here).
///
/// # Errors
/// [`ReplayError::Config`] when the state cannot be seeded at this capacity.
pub(crate) fn seed_caching(
    dev: &DeviceTrace,
    model: &CachingAllocator,
    scan: Option<&caching::TraceScan>,
) -> Result<SeededModel, ReplayError> {
    let owned;
    let scan = match scan {
        Some(s) => s,
        None => {
            owned = caching::TraceScan::new(dev);
            &owned
        }
    };
    let seeded = caching::seed_from_scanned(dev, model.config(), scan).map_err(Refusal::Seed)?;
    let recorded = caching::RecordedSegments::from_scan(dev, &seeded, scan);
    let mut unplaced = seeded.unplaced;
    unplaced.sort_by_key(|&i| dev.initial_blocks[i].addr);
    Ok(SeededModel { model: seeded.model, blocks: seeded.blocks, unplaced, segments: seeded.segments, recorded })
}
