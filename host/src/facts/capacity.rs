//! The GPU's memory as a trace shows it: one [`Capacity`] type, bytes and a typed [`CapacitySource`],
//! for every caller (explain's verdicts and bounds, tune's search, every replay's default capacity).
//!
//! The evidence, in order ([`capacity_from_evidence`]): the capacity the user gives; at a recorded OOM,
//! PyTorch's reserved bytes at that moment plus the event's `device_free` (what the driver still had);
//! for snapshots, PyTorch's recorded peak reserved bytes, said as such; a format's own hint (minimalloc's
//! `NAME.CAPACITY.csv`); else twice the peak of live requested bytes, rounded up to 2 MiB. Every sum is
//! checked: a size that cannot be represented rejects the file naming the event or line.

use serde::{Serialize, Serializer};

use super::peaks::{peaks, Peaks};
use super::state::state_after;
use crate::reference::MAX_BYTES;
use crate::trace::{DeviceTrace, EventKind, Location, Trace, TraceError, TraceFormat};
use crate::units::fmt_bytes;

/// Smallest capacity a replay models, bytes (the host strategies' least; the device heap's own minimum
/// is [`crate::device_heap::MIN_HEAP_BYTES`]). The largest is [`MAX_BYTES`] (2^48 B).
#[doc(hidden)]
pub const MIN_CAPACITY: u64 = 4096;

/// A capacity outside the range the strategies model, [`MIN_CAPACITY`] to [`MAX_BYTES`] (bad input).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("capacity {0} B is outside [{MIN_CAPACITY} B, 2^48 B], the range the strategies model")]
#[non_exhaustive]
#[doc(hidden)]
pub struct CapacityRangeError(pub u64);

/// Checks a capacity the user gives: it must lie in [`MIN_CAPACITY`]..=[`MAX_BYTES`].
///
/// # Errors
/// [`CapacityRangeError`] naming the capacity and the range.
#[doc(hidden)]
pub fn check_capacity(bytes: u64) -> Result<u64, CapacityRangeError> {
    if (MIN_CAPACITY..=MAX_BYTES).contains(&bytes) {
        Ok(bytes)
    } else {
        Err(CapacityRangeError(bytes))
    }
}

/// Where a capacity comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum CapacitySource {
    /// The GPU's memory at a recorded OOM: PyTorch's reserved bytes at that moment plus the driver's
    /// free bytes the event records.
    RecordedOom {
        /// Index of the `oom` event.
        event: usize,
        /// PyTorch reserved bytes at the event.
        reserved: u64,
        /// `device_free` of the event.
        device_free: u64,
    },
    /// Given by the user.
    Given,
    /// The snapshot's peak reserved bytes: the least memory the run had; the GPU's may be larger.
    PeakReserved,
    /// minimalloc's `NAME.CAPACITY.csv` file name.
    FileName,
    /// No reserved bytes are recorded: twice the peak of live requested bytes, rounded up to 2 MiB.
    TwiceDemandPeak,
    /// A capacity divided by `by` (a device-heap replay of a scaled trace).
    Scaled {
        /// The capacity at the trace's scale.
        of: Box<Capacity>,
        /// The factor (a power of two).
        by: u64,
    },
}

/// A capacity in bytes and where it comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Capacity {
    /// Bytes.
    pub bytes: u64,
    /// Its source.
    pub source: CapacitySource,
}

impl Capacity {
    /// A capacity the user gives.
    #[doc(hidden)]
    pub fn given(bytes: u64) -> Self {
        Capacity { bytes, source: CapacitySource::Given }
    }

    /// Where the capacity comes from, in words (one line).
    pub fn describe(&self) -> String {
        match &self.source {
            CapacitySource::RecordedOom { event, reserved, device_free } => format!(
                "the GPU's memory at the recorded OOM (event {event}): PyTorch reserved {} + {} the driver still \
                 had free",
                fmt_bytes(*reserved),
                fmt_bytes(*device_free)
            ),
            CapacitySource::Given => "given".into(),
            CapacitySource::PeakReserved => {
                "PyTorch's recorded peak reserved bytes: the least the GPU had (its real size is not recorded; give \
                 it with --capacity)"
                    .into()
            }
            CapacitySource::FileName => "from the file name (minimalloc NAME.CAPACITY.csv)".into(),
            CapacitySource::TwiceDemandPeak => {
                "no reserved bytes recorded: twice the peak of live requested bytes, rounded up to 2 MiB".into()
            }
            CapacitySource::Scaled { of, by } => format!("{} ({}), scaled 1/{by}", fmt_bytes(of.bytes), of.describe()),
        }
    }

    /// Serialises `c` as `{"bytes": N, "source": "in words"}` ([`Capacity::describe`]): the form of a
    /// replay report (`gpuheap replay --json`), whose source is read by people.
    ///
    /// # Errors
    /// Those of the serializer.
    #[doc(hidden)]
    pub fn serialize_described<S: Serializer>(c: &Capacity, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Described<'a> {
            bytes: u64,
            source: &'a str,
        }
        Described { bytes: c.bytes, source: &c.describe() }.serialize(s)
    }
}

/// The GPU's memory at `dev`'s first recorded OOM that carries `device_free` ([`oom_capacity`]), its
/// source naming the event, the reserved bytes then and `device_free`. `None` when no OOM is recorded
/// with `device_free`.
///
/// # Errors
/// [`TraceError::Schema`] naming the event as [`oom_capacity`] does.
#[doc(hidden)]
pub fn gpu_capacity_at_oom(trace: &Trace, dev: &DeviceTrace) -> Result<Option<Capacity>, TraceError> {
    let Some((event, device_free)) = dev.ooms.iter().find_map(|o| o.device_free.map(|f| (o.event, f))) else {
        return Ok(None);
    };
    let bad = |m: String| TraceError::Schema {
        path: trace.source.clone(),
        at: Location::Event { device: dev.device, index: event, field: Some("device_free") },
        message: m,
    };
    let st = state_after(dev, Some(event)).map_err(|e| bad(e.to_string()))?;
    let bytes = oom_capacity(trace, dev, event, st.reserved, device_free)?;
    Ok(Some(Capacity { bytes, source: CapacitySource::RecordedOom { event, reserved: st.reserved, device_free } }))
}

/// The GPU's memory at the `oom` event `event` of `dev`: PyTorch's `reserved` bytes then plus the event's
/// `device_free`.
///
/// # Errors
/// [`TraceError::Schema`] naming the event's `device_free` when the sum exceeds 2^64 − 1 or lies outside
/// [4 KiB, 2^48 B] (the least capacity a replay models, [`MIN_CAPACITY`], and the largest,
/// [`MAX_BYTES`]). A GPU of a few MiB is valid: PyTorch reserved nothing and another process holds the
/// rest.
#[doc(hidden)]
pub fn oom_capacity(
    trace: &Trace,
    dev: &DeviceTrace,
    event: usize,
    reserved: u64,
    device_free: u64,
) -> Result<u64, TraceError> {
    let bad = |m: String| TraceError::Schema {
        path: trace.source.clone(),
        at: Location::Event { device: dev.device, index: event, field: Some("device_free") },
        message: m,
    };
    let bytes = reserved
        .checked_add(device_free)
        .ok_or_else(|| bad(format!("reserved {reserved} B + device_free {device_free} B exceeds 2^64 - 1 bytes")))?;
    if check_capacity(bytes).is_err() {
        return Err(bad(format!(
            "the GPU's memory at this OOM, reserved {reserved} B + device_free {device_free} B = {bytes} B, is \
             outside [4 KiB, 2^48 B], the devices modelled; give --capacity"
        )));
    }
    Ok(bytes)
}

/// The capacity a replay of `dev` uses: `given` when the user gives one; else the GPU's memory at a
/// recorded OOM ([`gpu_capacity_at_oom`]); else, for snapshots, the recorded peak reserved bytes; the
/// capacity a file's name carries ([`Trace::capacity_hint`]: minimalloc's `NAME.CAPACITY.csv`); else twice the peak of live requested
/// bytes, rounded up to 2 MiB. Never below [`MIN_CAPACITY`] when derived.
///
/// # Errors
/// [`TraceError::Schema`] (bad input, exit code 2) naming the event or CSV line when a derived capacity
/// cannot be represented or exceeds the largest device modelled ([`MAX_BYTES`]), or when a file name's
/// capacity lies outside [`MIN_CAPACITY`]..=[`MAX_BYTES`] ([`Location::FileName`]); with `given`, huge
/// sizes are left to the replay, which refuses them as capacity failures.
pub fn capacity_from_evidence(trace: &Trace, dev: &DeviceTrace, given: Option<u64>) -> Result<Capacity, TraceError> {
    match given {
        Some(bytes) => Ok(Capacity::given(bytes)),
        None => capacity_from_peaks(trace, dev, &peaks(dev)),
    }
}

/// [`capacity_from_evidence`] without a given capacity, with the trace's [`peaks`] already computed as
/// `p` (a replay needs them for the demand peak as well).
///
/// # Errors
/// As [`capacity_from_evidence`].
pub(crate) fn capacity_from_peaks(trace: &Trace, dev: &DeviceTrace, p: &Peaks) -> Result<Capacity, TraceError> {
    if let Some(c) = gpu_capacity_at_oom(trace, dev)? {
        return Ok(c);
    }
    let too_big = |event: Option<usize>, what: &str, v: u128| {
        let at = match event {
            Some(i) => trace.event_location(dev, i),
            None => Location::Key("segments"),
        };
        TraceError::Schema {
            path: trace.source.clone(),
            at,
            message: format!(
                "{what} {v} B: no capacity can be derived within the largest device modelled (2^48 B); give \
                 --capacity to replay the rest with the oversized requests refused as capacity failures"
            ),
        }
    };
    if matches!(trace.format, TraceFormat::PytorchSnapshot(_)) && p.reserved > 0 {
        if p.reserved > MAX_BYTES as u128 {
            return Err(too_big(p.reserved_event, "PyTorch's reserved bytes peak at", p.reserved));
        }
        return Ok(Capacity { bytes: (p.reserved as u64).max(MIN_CAPACITY), source: CapacitySource::PeakReserved });
    }
    if let Some(bytes) = trace.capacity_hint() {
        if check_capacity(bytes).is_err() {
            return Err(TraceError::schema(
                &trace.source,
                Location::FileName,
                format!(
                    "capacity {bytes} B (minimalloc NAME.CAPACITY.csv) is outside [{MIN_CAPACITY} B, 2^48 B], the \
                     range the strategies model; give --capacity"
                ),
            ));
        }
        return Ok(Capacity { bytes, source: CapacitySource::FileName });
    }
    let two_mib = 2u128 << 20;
    let twice = (p.allocated * 2).div_ceil(two_mib).max(1) * two_mib;
    if twice > MAX_BYTES as u128 {
        // Name the first buffer that alone is larger than any device, else the event at the peak.
        let huge = dev.events.iter().position(|e| e.kind == EventKind::Alloc && e.size > MAX_BYTES / 2);
        return Err(match huge {
            Some(i) => too_big(Some(i), "a buffer of", dev.events[i].size as u128),
            None => too_big(p.allocated_event, "live requested bytes peak at", p.allocated),
        });
    }
    Ok(Capacity { bytes: (twice as u64).max(MIN_CAPACITY), source: CapacitySource::TwiceDemandPeak })
}
