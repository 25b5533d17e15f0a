//! The options of every command, in one struct ([`Options`]), and one parser per option for the
//! front ends that take text (the command line's flags, and the Python package's strings).
//!
//! A new option is a field here (with its parser below when it takes a value), one argument of the
//! command line (`cli/args.rs`) and one keyword of the Python package (`python/src/lib.rs`); the
//! commands ([`super::run_replay`] ...) read the field.

use crate::backend::BackendChoice;
use crate::facts;
use crate::reference::StrategyKind;
use crate::replay::{CompactPolicy, ReplayOptions};
use crate::units;

/// The options of [`super::run_replay`], [`super::run_compare`], [`super::run_explain`] and
/// [`super::run_tune`]; each command reads those that apply to it. [`Options::default`] is every
/// command's default.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Options {
    /// `replay`: the strategy; `None`: the format's own ([`crate::replay::default_strategy`]).
    pub strategy: Option<StrategyKind>,
    /// The capacity (the GPU's memory), bytes, in [`facts::MIN_CAPACITY`]..=2^48; `None`: from the
    /// evidence ([`facts::capacity_from_evidence`], and for replays [`crate::replay::default_capacity`]).
    pub capacity: Option<u64>,
    /// `replay`, `compare`: the alignment of every request, bytes (a power of two up to 1 GiB); `None`:
    /// the format's own.
    pub align: Option<u64>,
    /// `replay --strategy tiered`, `compare`'s tiered row: `(SMALL_MAX, LARGE_MIN)`, bytes.
    pub tiers: Option<(u64, u64)>,
    /// `replay`, `compare`: when to compact.
    pub policy: CompactPolicy,
    /// Where kernels run (compaction measurements, the device allocator's row of `compare`).
    pub backend: BackendChoice,
    /// The trace's device to report on; `None`: [`facts::choose_device`]'s choice.
    pub device: Option<i64>,
    /// `replay`, `compare`: the largest image a compaction materialises on the backend, bytes.
    pub materialize_limit: Option<u64>,
    /// `compare`: the largest device heap the device allocator's row creates before it replays a scaled
    /// trace, bytes.
    pub device_heap_limit: Option<u64>,
    /// `compare`'s text: every compaction of every strategy (else one summary line each).
    pub verbose: bool,
    /// `explain`: run the settings search too.
    pub tune: bool,
    /// `explain`: frame patterns (`FILE:LINE`, `FILE:LINE FUNCTION`, a function) whose allocations the
    /// what-if replays without ([`crate::explain::what_if_without`]); empty: no what-if.
    pub without: Vec<String>,
    /// `tune`: keep only the rows with these labels ([`crate::explain::tune::TuneReport::retain_settings`]).
    pub settings: Option<Vec<String>>,
    /// Build the HTML page too (`explain` and `tune` replay the settings they draw for it).
    pub html: bool,
    /// Messages name the command line's flags (`--strategy`, `--capacity`, `--tiers`) where they say
    /// what to change.
    pub flag_advice: bool,
    /// Stops the command when set from another thread ([`super::Cancel`]): it then returns an error of
    /// kind [`crate::ErrorKind::Cancelled`] at the next check of its replays (every 16,384 events);
    /// never set by default.
    pub cancel: super::Cancel,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            strategy: None,
            capacity: None,
            align: None,
            tiers: None,
            policy: CompactPolicy::Never,
            backend: BackendChoice::Auto,
            device: None,
            materialize_limit: None,
            device_heap_limit: None,
            verbose: false,
            tune: true,
            without: Vec::new(),
            settings: None,
            html: false,
            flag_advice: false,
            cancel: super::Cancel::default(),
        }
    }
}

impl Options {
    /// The replay options of these options for `strategy` (the tiers are the tiered strategy's; other
    /// strategies ignore them).
    pub fn replay_options(&self, strategy: StrategyKind) -> ReplayOptions {
        ReplayOptions {
            capacity: self.capacity,
            align: self.align,
            tiers: self.tiers.filter(|_| strategy == StrategyKind::Tiered),
            policy: self.policy,
            materialize_limit: self.materialize_limit,
            cancel: self.cancel.clone(),
            ..ReplayOptions::new(strategy)
        }
    }
}

/// An option's value that cannot be used. `Display` is the reason, one line (the command line adds
/// the flag, the Python package the keyword).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OptionError {
    /// A byte count, alignment or tiers that cannot be parsed.
    #[error(transparent)]
    Parse(#[from] units::ParseError),
    /// A capacity outside the range the strategies model.
    #[error(transparent)]
    Capacity(#[from] facts::CapacityRangeError),
    /// An unknown compaction policy.
    #[error(transparent)]
    Policy(#[from] crate::replay::PolicyError),
    /// An unknown strategy.
    #[error(transparent)]
    Strategy(#[from] crate::reference::UnknownStrategy),
    /// An unknown backend.
    #[error(transparent)]
    Backend(#[from] crate::backend::BackendError),
}

/// `capacity`: a byte count ([`units::parse_bytes`]) that [`check_capacity`] accepts.
///
/// # Errors
/// [`OptionError`] naming the value.
pub fn parse_capacity(s: &str) -> Result<u64, OptionError> {
    check_capacity(units::parse_bytes(s)?)
}

/// `capacity` given as a number of bytes: in [`facts::MIN_CAPACITY`]..=2^48 B, the range the strategies
/// model.
///
/// # Errors
/// [`OptionError::Capacity`] naming the value and the range.
pub fn check_capacity(bytes: u64) -> Result<u64, OptionError> {
    Ok(facts::check_capacity(bytes)?)
}

/// `align`: [`units::parse_align`].
///
/// # Errors
/// [`OptionError::Parse`] naming the value.
pub fn parse_align(s: &str) -> Result<u64, OptionError> {
    Ok(units::parse_align(s)?)
}

/// `align` given as a number of bytes: [`units::check_align`].
///
/// # Errors
/// [`OptionError::Parse`] naming the value.
pub fn check_align(bytes: u64) -> Result<u64, OptionError> {
    Ok(units::check_align(bytes)?)
}

/// `tiers`: `SMALL_MAX,LARGE_MIN` ([`units::parse_tiers`]).
///
/// # Errors
/// [`OptionError::Parse`] naming the value.
pub fn parse_tiers(s: &str) -> Result<(u64, u64), OptionError> {
    Ok(units::parse_tiers(s)?)
}

/// `tiers` given as two numbers of bytes: [`units::check_tiers`].
///
/// # Errors
/// [`OptionError::Parse`] naming them.
pub fn check_tiers(small_max: u64, large_min: u64) -> Result<(u64, u64), OptionError> {
    Ok(units::check_tiers(small_max, large_min)?)
}

/// `materialize_limit`, `device_heap_limit` and other byte counts: [`units::parse_bytes`].
///
/// # Errors
/// [`OptionError::Parse`] naming the value.
pub fn parse_bytes(s: &str) -> Result<u64, OptionError> {
    Ok(units::parse_bytes(s)?)
}

/// `compact`: `never`, `on-oom` or `threshold=F` ([`CompactPolicy`]).
///
/// # Errors
/// [`OptionError::Policy`] naming the value.
pub fn parse_policy(s: &str) -> Result<CompactPolicy, OptionError> {
    Ok(s.parse()?)
}

/// `strategy`: one of [`StrategyKind::ALL`] by name.
///
/// # Errors
/// [`OptionError::Strategy`] naming the value and the strategies.
pub fn parse_strategy(s: &str) -> Result<StrategyKind, OptionError> {
    Ok(s.parse()?)
}

/// `backend`: `auto`, `cpu` or `gpu`.
///
/// # Errors
/// [`OptionError::Backend`] naming the value.
pub fn parse_backend(s: &str) -> Result<BackendChoice, OptionError> {
    Ok(s.parse()?)
}
