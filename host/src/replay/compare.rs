//! Every contender over the same trace: the loop behind `gpuheap compare` and `gpuheap.compare`.
//!
//! The rows come from [`contenders`]: the host strategies, then the device allocator
//! ([`Contender::Device`], replayed by [`super::replay_device`], scaled when its heap would exceed
//! [`DeviceReplayOptions::heap_limit`]). [`compare`] runs each one and collects the reports; a contender
//! that cannot take the options (a [`ReplayError::Config`], e.g. the caching model below 2 MiB) is a
//! [`NotRun`] row with the reason, not a failure of the whole comparison. The [`Comparison`] serialises
//! as the JSON of `gpuheap compare --json`.

use serde::Serialize;

use super::{replay, replay_device, DeviceReplayOptions, Refusal, ReplayError, ReplayOptions, ReplayReport};
use crate::backend::Backend;
use crate::facts::PytorchReserved;
use crate::reference::StrategyKind;
use crate::trace::{DeviceTrace, Trace};

/// One row of the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Contender {
    /// A host reference strategy.
    Host(StrategyKind),
    /// The device allocator (`gpuheap_kernels::heap::malloc`/`free`), replayed on a backend.
    Device,
}

impl Contender {
    /// The row's base name (a scaled device replay adds "(scaled 1/N)" to its report's name).
    pub fn name(self) -> String {
        match self {
            Contender::Host(k) => k.to_string(),
            Contender::Device => super::device::DEVICE_HEAP.to_string(),
        }
    }

    /// Replays this contender: a host row with `host` (its strategy set, `tiers` kept for the tiered
    /// row only), compactions measured on `backend` when given; the device row with `device` on
    /// `device_backend` (it always runs on a backend, whatever the compaction policy). `progress` is
    /// called with the number of events done.
    ///
    /// # Errors
    /// As [`replay`] and [`replay_device`].
    pub fn replay(
        self,
        trace: &Trace,
        dev: &DeviceTrace,
        opts: &CompareOptions,
        backend: Option<&Backend>,
        device_backend: &Backend,
        progress: &mut dyn FnMut(usize),
    ) -> Result<ReplayReport, ReplayError> {
        match self {
            Contender::Host(k) => {
                let o = ReplayOptions {
                    strategy: k,
                    tiers: opts.host.tiers.filter(|_| k == StrategyKind::Tiered),
                    ..opts.host.clone()
                };
                replay(trace, dev, &o, backend, progress)
            }
            Contender::Device => replay_device(trace, dev, device_backend, &opts.device, progress),
        }
    }
}

/// The rows, in order: every host strategy ([`StrategyKind::ALL`]), then the device allocator.
pub fn contenders() -> Vec<Contender> {
    StrategyKind::ALL.iter().map(|&k| Contender::Host(k)).chain([Contender::Device]).collect()
}

/// The options of a comparison.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct CompareOptions {
    /// Options of the host rows (`strategy` is replaced by each row's; `tiers` applies to tiered only).
    pub host: ReplayOptions,
    /// Options of the device allocator's row.
    pub device: DeviceReplayOptions,
}

impl CompareOptions {
    /// The options of a comparison with `host` for the host rows; the device row takes the same capacity and
    /// alignment, and `heap_limit` ([`DeviceReplayOptions::heap_limit`]).
    pub fn new(host: ReplayOptions, heap_limit: Option<u64>) -> Self {
        let device = DeviceReplayOptions {
            capacity: host.capacity,
            align: host.align,
            heap_limit,
            cancel: host.cancel.clone(),
            ..DeviceReplayOptions::default()
        };
        CompareOptions { host, device }
    }
}

/// A contender that could not run with the given options.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NotRun {
    /// Its name.
    pub strategy: String,
    /// Why.
    pub reason: String,
}

/// What [`compare`] produced; serialised as `gpuheap compare --json` prints it.
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct Comparison {
    /// The trace file.
    pub trace: String,
    /// Device ordinal of the trace.
    pub device: i64,
    /// PyTorch's own reserved bytes (snapshots with segments; from the first report).
    pub pytorch: Option<PytorchReserved>,
    /// One report per contender that ran, in [`contenders`] order.
    pub strategies: Vec<ReplayReport>,
    /// The contenders that could not run, with the reasons.
    pub not_run: Vec<NotRun>,
}

/// Runs every contender of [`contenders`] over `dev` (a device of `trace`) through `run` (typically
/// [`Contender::replay`], with the caller's progress display). A contender whose run fails with
/// [`ReplayError::Config`] becomes a [`NotRun`] row with the message as the reason.
///
/// # Errors
/// The first other error of `run`; [`ReplayError::Config`] with every reason when no contender ran.
pub fn compare(
    trace: &Trace,
    dev: &DeviceTrace,
    mut run: impl FnMut(Contender) -> Result<ReplayReport, ReplayError>,
) -> Result<Comparison, ReplayError> {
    let mut strategies = Vec::new();
    let mut not_run = Vec::new();
    for c in contenders() {
        match run(c) {
            Ok(r) => strategies.push(r),
            Err(e @ ReplayError::Config(_)) => not_run.push(NotRun { strategy: c.name(), reason: e.to_string() }),
            Err(e) => return Err(e),
        }
    }
    if strategies.is_empty() {
        return Err(Refusal::NoneRan(not_run).into());
    }
    Ok(Comparison {
        trace: trace.source.display().to_string(),
        device: dev.device,
        pytorch: strategies.first().and_then(|r| r.pytorch.clone()),
        strategies,
        not_run,
    })
}
