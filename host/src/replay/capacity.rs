//! The capacity a replay uses: the one rule of every command ([`crate::facts::capacity_from_evidence`]),
//! with the trace's peaks computed once for the capacity and the demand peak.

use super::{Refusal, ReplayError};
use crate::facts::{capacity::capacity_from_peaks, peaks, Capacity};
use crate::trace::{DeviceTrace, Trace};

/// The capacity a replay of `dev` uses when none is given: the capacity every command uses
/// ([`crate::facts::capacity_from_evidence`]: at a recorded OOM the GPU's memory then; for PyTorch
/// snapshots otherwise PyTorch's recorded peak reserved bytes, never rounded up, so that a replay
/// reports no free memory the run never had; a file name's capacity; else twice the peak of live
/// requested bytes, rounded up to 2 MiB).
///
/// # Errors
/// [`ReplayError::Config`] (bad input) naming the event or CSV line when no capacity can be derived: a
/// size beyond the largest device modelled (bug scenario BL-23, DESIGN.md §3.9); `--capacity` then replays the rest.
pub fn default_capacity(trace: &Trace, dev: &DeviceTrace) -> Result<Capacity, ReplayError> {
    choose_capacity(trace, dev, None)
}

/// `given` ([`crate::facts::CapacitySource::Given`]) when set, else [`default_capacity`].
///
/// # Errors
/// As [`default_capacity`].
#[doc(hidden)]
pub fn choose_capacity(trace: &Trace, dev: &DeviceTrace, given: Option<u64>) -> Result<Capacity, ReplayError> {
    choose_capacity_and_demand_peak(trace, dev, given).map(|(c, _)| c)
}

/// [`choose_capacity`] and the event of [`crate::facts::demand_peak`], from one pass of the trace's
/// peaks (a replay needs both).
///
/// # Errors
/// As [`default_capacity`].
pub(crate) fn choose_capacity_and_demand_peak(
    trace: &Trace,
    dev: &DeviceTrace,
    given: Option<u64>,
) -> Result<(Capacity, Option<usize>), ReplayError> {
    let peaks = peaks(dev);
    let capacity = match given {
        Some(c) => Capacity::given(c),
        None => capacity_from_peaks(trace, dev, &peaks).map_err(Refusal::NoCapacity)?,
    };
    Ok((capacity, peaks.allocated_event))
}
