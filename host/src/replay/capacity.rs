//! The capacity a replay uses: the one definition of the default capacity of every replay target (host
//! strategies, the caching model, the device heap), from the evidence of [`crate::facts::capacity`].

use super::{Refusal, ReplayError};
use crate::facts::{capacity::capacity_from_peaks, peaks, Capacity, CapacitySource, Peaks, MIN_CAPACITY};
use crate::trace::{DeviceTrace, Trace};

/// The capacity a replay of `dev` uses when none is given, from the evidence
/// ([`crate::facts::capacity_from_evidence`]):
///
/// * at a recorded OOM: the GPU's memory then (PyTorch's reserved bytes plus the event's `device_free`);
/// * PyTorch snapshots otherwise: PyTorch's recorded peak reserved bytes (segment events, and the
///   snapshot's final state), rounded up to a whole GiB ([`CapacitySource::PeakReservedRoundedUp`]) —
///   the memory PyTorch itself used, plus the slack of a partly used last GiB;
/// * minimalloc CSV files named `NAME.CAPACITY.csv` (minimalloc's convention, e.g. `K.1048576.csv`):
///   that capacity;
/// * otherwise twice the peak of live requested bytes, rounded up to 2 MiB.
///
/// Never below [`MIN_CAPACITY`].
///
/// # Errors
/// [`ReplayError::Config`] (bad input) naming the event or CSV line when no capacity can be derived: a
/// size beyond the largest device modelled (bug scenario BL-23, DESIGN.md §3.9); `--capacity` then replays the rest.
pub fn default_capacity(trace: &Trace, dev: &DeviceTrace) -> Result<Capacity, ReplayError> {
    default_capacity_from(trace, dev, &peaks(dev))
}

/// [`default_capacity`] with the trace's peaks `p` already computed.
fn default_capacity_from(trace: &Trace, dev: &DeviceTrace, p: &Peaks) -> Result<Capacity, ReplayError> {
    let c = capacity_from_peaks(trace, dev, p).map_err(Refusal::NoCapacity)?;
    let c = match c.source {
        CapacitySource::PeakReserved => {
            let gib = 1u64 << 30;
            Capacity {
                bytes: c.bytes.div_ceil(gib).max(1).saturating_mul(gib),
                source: CapacitySource::PeakReservedRoundedUp { peak: c.bytes },
            }
        }
        _ => c,
    };
    Ok(Capacity { bytes: c.bytes.max(MIN_CAPACITY), ..c })
}

/// `given` ([`CapacitySource::Given`]) when set, else [`default_capacity`].
///
/// # Errors
/// As [`default_capacity`].
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
        None => default_capacity_from(trace, dev, &peaks)?,
    };
    Ok((capacity, peaks.allocated_event))
}
