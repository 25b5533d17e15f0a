//! Why a replay failed ([`ReplayError`]), its causes kept as their own types: a refused configuration
//! ([`Refusal`], bad input), a failed compaction ([`CompactionFailure`]) or device heap
//! ([`DeviceFailure`]), both run-time failures, or a strategy refusing a valid operation (a bug).

use std::fmt;
use std::path::PathBuf;

use super::compare::NotRun;
use crate::backend::BackendError;
use crate::compaction::CompactionError;
use crate::device_heap::MIN_HEAP_BYTES;
use crate::facts::{Capacity, MIN_CAPACITY};
use crate::reference::{AllocError, StrategyKind};
use crate::trace::TraceError;
use crate::units::{fmt_bytes, ParseError};

/// Errors of [`super::replay`] and [`super::replay_device`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// The options do not fit the trace (a capacity the strategy cannot use...): bad input.
    #[error(transparent)]
    Config(Box<Refused>),
    /// A compaction failed or its check failed: a run-time failure.
    #[error("compaction at event {event}: {source}")]
    Compaction {
        /// Event index.
        event: usize,
        /// What went wrong.
        source: CompactionFailure,
    },
    /// The device heap failed ([`super::replay_device`]): it could not be created, a launch or a
    /// read-back failed, or a returned block failed a check (outside the data region, misaligned,
    /// overlapping a live block, disagreeing with the heap's metadata, bytes overwritten): a run-time
    /// failure.
    #[error("device heap{}: {source}", event.map_or_else(String::new, |e| format!(" at event {e}")))]
    Device {
        /// Event index (`None`: before the first event or not tied to one).
        event: Option<usize>,
        /// What went wrong.
        source: DeviceFailure,
    },
    /// The strategy refused an operation the trace makes valid (a bug in the strategy).
    #[error("event {event}: the strategy refused a valid operation: {source}")]
    Strategy {
        /// Event index.
        event: usize,
        /// Its error.
        source: AllocError,
    },
}

impl ReplayError {
    /// `true` for bad input (exit code 2), `false` for run-time failures (exit code 1).
    #[doc(hidden)]
    pub fn is_input(&self) -> bool {
        matches!(self, ReplayError::Config(_))
    }

    /// The refusal of a configuration, when this is one.
    #[doc(hidden)]
    pub fn refused(&self) -> Option<&Refused> {
        match self {
            ReplayError::Config(r) => Some(r),
            _ => None,
        }
    }

    /// A refused configuration with `advice` (what to change, in the front end's words) added to its
    /// message; any other error unchanged.
    #[must_use]
    #[doc(hidden)]
    pub fn with_advice(self, advice: &'static str) -> Self {
        match self {
            ReplayError::Config(mut r) => {
                r.advice = Some(advice);
                ReplayError::Config(r)
            }
            e => e,
        }
    }

    /// A refused configuration about the file `path` (named first in the message) and, when the capacity
    /// was derived rather than given, with where it came from; any other error unchanged.
    pub(crate) fn in_file(self, path: &std::path::Path, derived: Option<&Capacity>) -> Self {
        match self {
            ReplayError::Config(mut r) => {
                r.path = Some(path.to_path_buf());
                r.derived = derived.cloned();
                ReplayError::Config(r)
            }
            e => e,
        }
    }
}

impl From<Refusal> for ReplayError {
    fn from(r: Refusal) -> Self {
        ReplayError::Config(Box::new(Refused { refusal: r, path: None, derived: None, advice: None }))
    }
}

/// A refused configuration: the [`Refusal`], the file it is about, the derived capacity it was refused at
/// and advice. `Display`: `FILE: REFUSAL; the capacity, X, is derived: SOURCE (ADVICE)`, each part when
/// known.
#[derive(Debug)]
#[non_exhaustive]
#[doc(hidden)]
pub struct Refused {
    /// Why.
    pub refusal: Refusal,
    /// The trace file, when the message names it.
    pub path: Option<PathBuf>,
    /// The capacity, when it was derived rather than given.
    pub derived: Option<Capacity>,
    /// What to change, in the front end's words (the command line names its flags).
    pub advice: Option<&'static str>,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(p) = &self.path {
            write!(f, "{}: ", p.display())?;
        }
        write!(f, "{}", self.refusal)?;
        if let Some(c) = &self.derived {
            write!(f, "; the capacity, {}, is derived: {}", fmt_bytes(c.bytes), c.describe())?;
        }
        if let Some(a) = self.advice {
            write!(f, " ({a})")?;
        }
        Ok(())
    }
}

impl std::error::Error for Refused {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.refusal)
    }
}

/// Why a replay refuses its options.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
#[doc(hidden)]
pub enum Refusal {
    /// A capacity outside the range the strategies model.
    #[error("capacity {0} B is outside [{MIN_CAPACITY} B, 2^48 B]")]
    CapacityRange(u64),
    /// No capacity can be derived from the trace (a size beyond the largest device modelled).
    #[error(transparent)]
    NoCapacity(TraceError),
    /// An alignment that is not a power of two from 1 B to 1 GiB.
    #[error(transparent)]
    Alignment(ParseError),
    /// The caching model cannot be built at this capacity.
    #[error("caching allocator with {capacity} B: {source}")]
    Caching {
        /// Capacity, bytes.
        capacity: u64,
        /// Its error.
        source: AllocError,
    },
    /// The caching model cannot be seeded with the snapshot's state at this capacity.
    #[error(transparent)]
    Seed(AllocError),
    /// Tiers whose `LARGE_MIN` is above the capacity: no request could reach the large tier.
    #[error(
        "tiers {small_max} B, {large_min} B: LARGE_MIN is above the capacity of {capacity} B, so no request could \
         reach the large tier; give LARGE_MIN of at most the capacity"
    )]
    TiersAboveCapacity {
        /// `SMALL_MAX`, bytes.
        small_max: u64,
        /// `LARGE_MIN`, bytes.
        large_min: u64,
        /// Capacity, bytes.
        capacity: u64,
    },
    /// The tiered strategy cannot be built with these tiers at this capacity.
    #[error("tiered allocator with {capacity} B: {source}")]
    Tiered {
        /// Capacity, bytes.
        capacity: u64,
        /// Its error.
        source: AllocError,
    },
    /// Tiers given to another strategy than the tiered one.
    #[error("tiers apply to the tiered strategy only, not {0}")]
    TiersNotTiered(StrategyKind),
    /// A capacity below the device heap's minimum.
    #[error("capacity {0} B is below the device heap's minimum of {MIN_HEAP_BYTES} B")]
    HeapTooSmall(u64),
    /// A capacity that, scaled to the device-heap limit, falls below the heap's minimum.
    #[error("capacity {capacity} B scaled by 1/{scale} is below the device heap's minimum of {MIN_HEAP_BYTES} B")]
    HeapScaledTooSmall {
        /// Capacity, bytes.
        capacity: u64,
        /// The scale factor.
        scale: u64,
    },
    /// No contender of a comparison could run (`super::compare::compare`): each with its reason.
    #[error("{}", .0.iter().map(|n| format!("{}: {}", n.strategy, n.reason)).collect::<Vec<_>>().join("; "))]
    NoneRan(Vec<NotRun>),
}

/// Why a compaction failed (a run-time failure).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
#[doc(hidden)]
pub enum CompactionFailure {
    /// The reference plan or its application to the strategy failed.
    #[error(transparent)]
    Strategy(#[from] AllocError),
    /// The kernel measurement failed, or its result failed the check against the reference plan.
    #[error(transparent)]
    Kernel(#[from] CompactionError),
}

/// Why the device heap failed (a run-time failure).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
#[doc(hidden)]
pub enum DeviceFailure {
    /// A launch, read-back or write failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The heap could not be created at any scale.
    #[error("cannot create a device heap of {bytes} B: {source}")]
    Create {
        /// Data-region bytes asked for.
        bytes: u64,
        /// The backend's error.
        source: BackendError,
    },
    /// A returned block failed a check: outside the data region, misaligned, overlapping a live block,
    /// disagreeing with the heap's metadata, or bytes overwritten while it was live.
    #[error("{0}")]
    Check(String),
}
