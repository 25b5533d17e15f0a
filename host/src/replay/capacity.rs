//! The capacity a replay uses: the one definition of the default capacity of every replay target (host
//! strategies, the caching model, the device heap).

use serde::Serialize;

use super::report::fmt_bytes;
use super::ReplayError;
use crate::explain::Peaks;
use crate::trace::{DeviceTrace, Trace};

/// Smallest capacity accepted by the host strategies, bytes. (The device heap's own minimum is
/// [`crate::device_heap::MIN_HEAP_BYTES`].)
pub const MIN_CAPACITY: u64 = 4096;

/// A capacity and where it came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CapacityChoice {
    /// Bytes.
    pub bytes: u64,
    /// How it was chosen.
    pub source: String,
}

/// The capacity a replay of `dev` uses when none is given, from the evidence
/// ([`crate::explain::capacity_from_evidence`]):
///
/// * at a recorded OOM: the GPU's memory then (PyTorch's reserved bytes plus the event's `device_free`);
/// * PyTorch snapshots otherwise: PyTorch's recorded peak reserved bytes (segment events, and the
///   snapshot's final state), rounded up to a whole GiB — the memory PyTorch itself used, plus the slack
///   of a partly used last GiB (said in the source text);
/// * minimalloc CSV files named `NAME.CAPACITY.csv` (minimalloc's convention, e.g. `K.1048576.csv`):
///   that capacity;
/// * otherwise twice the peak of live requested bytes, rounded up to 2 MiB.
///
/// Never below [`MIN_CAPACITY`].
///
/// # Errors
/// [`ReplayError::Config`] (bad input) naming the event or CSV line when no capacity can be derived: a
/// size beyond the largest device modelled (bug scenario BL-23, DESIGN.md §3.9); `--capacity` then replays the rest.
pub fn default_capacity(trace: &Trace, dev: &DeviceTrace) -> Result<CapacityChoice, ReplayError> {
    default_capacity_from(trace, dev, &crate::explain::peaks(dev))
}

/// [`default_capacity`] with the trace's peaks `p` already computed.
fn default_capacity_from(trace: &Trace, dev: &DeviceTrace, p: &Peaks) -> Result<CapacityChoice, ReplayError> {
    use crate::explain::{capacity_from_peaks, CapacitySource};
    let c = capacity_from_peaks(trace, dev, p).map_err(|e| ReplayError::Config(e.to_string()))?;
    let choice = match c.source {
        CapacitySource::PeakReserved => {
            let gib = 1u64 << 30;
            CapacityChoice {
                bytes: c.bytes.div_ceil(gib).max(1).saturating_mul(gib),
                source: format!("PyTorch peak reserved {} rounded up to a whole GiB", fmt_bytes(c.bytes)),
            }
        }
        _ => CapacityChoice { bytes: c.bytes, source: c.describe() },
    };
    Ok(CapacityChoice { bytes: choice.bytes.max(MIN_CAPACITY), ..choice })
}

/// `given` (source "given") when set, else [`default_capacity`].
///
/// # Errors
/// As [`default_capacity`].
pub fn choose_capacity(trace: &Trace, dev: &DeviceTrace, given: Option<u64>) -> Result<CapacityChoice, ReplayError> {
    choose_capacity_and_demand_peak(trace, dev, given).map(|(c, _)| c)
}

/// [`choose_capacity`] and the event of [`demand_peak`], from one pass of the trace's peaks (a replay
/// needs both).
///
/// # Errors
/// As [`default_capacity`].
pub(crate) fn choose_capacity_and_demand_peak(
    trace: &Trace,
    dev: &DeviceTrace,
    given: Option<u64>,
) -> Result<(CapacityChoice, Option<usize>), ReplayError> {
    let peaks = crate::explain::peaks(dev);
    let capacity = match given {
        Some(c) => CapacityChoice { bytes: c, source: "given".into() },
        None => default_capacity_from(trace, dev, &peaks)?,
    };
    Ok((capacity, peaks.allocated_event))
}

/// The event after which the trace's live requested bytes are highest (`None`: before the first
/// event, i.e. the initial blocks), and that peak in bytes (summed in 128 bits; a peak above
/// 2^64 − 1 B, possible only with sizes no device holds, is reported as 2^64 − 1).
pub fn demand_peak(dev: &DeviceTrace) -> (Option<usize>, u64) {
    let p = crate::explain::peaks(dev);
    (p.allocated_event, u64::try_from(p.allocated).unwrap_or(u64::MAX))
}
