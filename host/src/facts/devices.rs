//! The devices of a trace: what each records ([`summarize`]) and which one a report is about
//! ([`choose_device`]: the one asked for, else the one with a recorded OOM, else the one with the most
//! allocation events, else the one whose final state holds the most live blocks). Every front end
//! (replay, compare, explain, tune; the CLI and Python) picks the device here.

use std::path::PathBuf;

use serde::Serialize;

use super::peaks::peaks;
use crate::trace::{BlockStatus, EventKind, Trace};

/// What one device of a trace holds. Bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
#[doc(hidden)]
pub struct DeviceSummary {
    /// Device ordinal.
    pub device: i64,
    /// Events of every kind.
    pub events: usize,
    /// `alloc` events.
    pub alloc_events: usize,
    /// Highest requested bytes live at once (blocks alive before the first event included; for a
    /// snapshot without events, its final state). `None`: the sum exceeds 2^64 − 1.
    pub peak_allocated: Option<u64>,
    /// Highest PyTorch reserved bytes (segments; 0 for formats without segments). `None`: the sum
    /// exceeds 2^64 − 1.
    pub peak_reserved: Option<u64>,
    /// Recorded `oom` events.
    pub recorded_ooms: usize,
    /// Live blocks in the snapshot's final state (0 without one).
    pub final_blocks: usize,
}

/// Summarises every device of `trace` that has events or segments, by ascending ordinal.
pub fn summarize(trace: &Trace) -> Vec<DeviceSummary> {
    trace
        .devices
        .iter()
        .map(|d| {
            let p = peaks(d);
            DeviceSummary {
                device: d.device,
                events: d.events.len(),
                alloc_events: d.count(EventKind::Alloc),
                peak_allocated: u64::try_from(p.allocated).ok(),
                peak_reserved: u64::try_from(p.reserved).ok(),
                recorded_ooms: d.ooms.len(),
                final_blocks: d
                    .final_state
                    .as_ref()
                    .map_or(0, |f| f.blocks().filter(|b| b.state != BlockStatus::Inactive).count()),
            }
        })
        .collect()
}

/// Why a device was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
#[doc(hidden)]
pub enum DeviceReason {
    /// The user asked for it (`--device`).
    Given,
    /// The first device with a recorded `oom` event.
    RecordedOom,
    /// The device with the most `alloc` events.
    MostAllocations,
    /// No device has allocation events; the one whose final state holds the most live blocks.
    FinalState,
}

/// The device a report is about.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceChoice {
    /// Index into [`Trace::devices`].
    pub index: usize,
    /// Device ordinal.
    pub device: i64,
    /// Why.
    pub reason: DeviceReason,
    /// The other devices of the file (ordinals), for "pick another with --device N".
    pub others: Vec<i64>,
}

/// Why no device can be reported on (bad input). `Display` is one line naming the file and listing its
/// devices.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
#[doc(hidden)]
pub enum DeviceError {
    /// The device asked for is not in the file.
    #[error("{}: no device {device} in the trace ({devices})", .path.display())]
    NotInTrace {
        /// The trace file.
        path: PathBuf,
        /// The ordinal asked for.
        device: i64,
        /// The file's devices, described.
        devices: String,
    },
    /// No device has allocation events or live blocks: a report would be all zeros.
    #[error("{}: no device has allocation events or live blocks, nothing to report ({devices})", .path.display())]
    NothingToReport {
        /// The trace file.
        path: PathBuf,
        /// The file's devices, described (when it has none with a segment or a history entry: that no
        /// device recorded anything).
        devices: String,
    },
}

/// Picks the device: `given` if any (it must exist), else the first with a recorded OOM, else the one
/// with the most `alloc` events (lowest ordinal on a tie), else the one whose final state holds the
/// most live blocks. `summaries` are [`summarize`]'s.
///
/// # Errors
/// [`DeviceError`] (bad input) when `given` names no device of the file, or when no device has
/// allocation events or live blocks.
pub fn choose_device(
    trace: &Trace,
    summaries: &[DeviceSummary],
    given: Option<i64>,
) -> Result<DeviceChoice, DeviceError> {
    let describe = || {
        summaries
            .iter()
            .map(|s| format!("device {}: {} events, {} allocations", s.device, s.events, s.alloc_events))
            .collect::<Vec<_>>()
            .join("; ")
    };
    let pick = |index: usize, reason| DeviceChoice {
        index,
        device: summaries[index].device,
        reason,
        others: summaries.iter().filter(|s| s.device != summaries[index].device).map(|s| s.device).collect(),
    };
    if let Some(d) = given {
        let i = summaries.iter().position(|s| s.device == d).ok_or_else(|| DeviceError::NotInTrace {
            path: trace.source.clone(),
            device: d,
            devices: describe(),
        })?;
        return Ok(pick(i, DeviceReason::Given));
    }
    if let Some(i) = summaries.iter().position(|s| s.recorded_ooms > 0) {
        return Ok(pick(i, DeviceReason::RecordedOom));
    }
    let most = summaries
        .iter()
        .enumerate()
        .filter(|(_, s)| s.alloc_events > 0)
        .max_by(|a, b| a.1.alloc_events.cmp(&b.1.alloc_events).then(b.0.cmp(&a.0)));
    if let Some((i, _)) = most {
        return Ok(pick(i, DeviceReason::MostAllocations));
    }
    let most = summaries
        .iter()
        .enumerate()
        .filter(|(_, s)| s.final_blocks > 0)
        .max_by(|a, b| a.1.final_blocks.cmp(&b.1.final_blocks).then(b.0.cmp(&a.0)));
    if let Some((i, _)) = most {
        return Ok(pick(i, DeviceReason::FinalState));
    }
    Err(DeviceError::NothingToReport {
        path: trace.source.clone(),
        devices: if summaries.is_empty() {
            "no device recorded anything: the file holds no segment and no history entry on any device".to_string()
        } else {
            describe()
        },
    })
}
