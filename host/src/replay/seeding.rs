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
/// ([`caching::seed_from_trace`]).
///
/// # Errors
/// [`ReplayError::Config`] when the state cannot be seeded at this capacity.
pub(crate) fn seed_caching(dev: &DeviceTrace, model: &CachingAllocator) -> Result<SeededModel, ReplayError> {
    let seeded = caching::seed_from_trace(dev, model.config()).map_err(Refusal::Seed)?;
    let recorded = caching::RecordedSegments::new(dev, &seeded);
    let mut unplaced = seeded.unplaced;
    unplaced.sort_by_key(|&i| dev.initial_blocks[i].addr);
    Ok(SeededModel { model: seeded.model, blocks: seeded.blocks, unplaced, segments: seeded.segments, recorded })
}
