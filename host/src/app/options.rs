//! The options of every command, in one struct ([`Options`]), and one table of them, [`OPTIONS`]: a
//! row per option with its key, its help text (written here only), the commands that take it and how
//! it sets [`Options`] from text. The command line builds its flags from the table
//! (`cli/src/args.rs`: `--KEY` with `-` for `_`, the row's help) and the Python package its keywords
//! and docstrings (`python/src/lib.rs`, `gpuheap/_api.py`), so both read an option alike and say the
//! same about it.
//!
//! A new option is a field of [`Options`] (with its default), one row of [`OPTIONS`] (with its parser
//! below when it takes a value), the command that reads the field ([`super::run_replay`] ...) and the
//! keyword in the signature of the Python wrapper of each command that takes it (`gpuheap/_api.py`).

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
    /// evidence ([`facts::capacity_from_evidence`], every command's rule).
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
    /// Stops the command when set from another thread ([`crate::Cancel`]): it then returns an error of
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
    #[doc(hidden)]
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
    /// A device that is not an integer.
    #[error("device `{0}` is not an integer")]
    Device(String),
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

/// The commands of [`Options`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Command {
    /// [`super::run_replay`].
    Replay,
    /// [`super::run_compare`].
    Compare,
    /// [`super::run_explain`].
    Explain,
    /// [`super::run_tune`].
    Tune,
}

/// One option of [`OPTIONS`].
#[derive(Clone, Copy)]
pub struct OptionRow {
    /// The Python keyword; the command line's flag is `--` and the key with `-` for `_`.
    pub key: &'static str,
    /// The name of its value in the help (`BYTES`, `SITE`); `None`: a switch, set by `true`.
    pub value: Option<&'static str>,
    /// What it does and its default, one paragraph: the command line's `--help` and the Python
    /// docstrings print it as it is.
    pub help: &'static str,
    /// The commands that take it.
    pub commands: &'static [Command],
    /// Given more than once, each value adds to the list (`--without A --without B`).
    pub repeated: bool,
    /// The environment variable the command line reads when the flag is absent.
    pub env: Option<&'static str>,
    /// The values it takes, when it takes one of a few names.
    pub choices: &'static [&'static str],
    /// Sets the option in [`Options`] from its text (a switch: from `""`).
    pub set: fn(&mut Options, &str) -> Result<(), OptionError>,
}

impl std::fmt::Debug for OptionRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OptionRow").field("key", &self.key).field("commands", &self.commands).finish_non_exhaustive()
    }
}

impl OptionRow {
    /// The command line's flag: `--` and the key with `-` for `_`.
    pub fn flag(&self) -> String {
        format!("--{}", self.key.replace('_', "-"))
    }
}

const REPLAYS: &[Command] = &[Command::Replay, Command::Compare];
const EVERY: &[Command] = &[Command::Replay, Command::Compare, Command::Explain, Command::Tune];

/// A row that takes a value, with the defaults of the others.
const fn row(
    key: &'static str,
    value: &'static str,
    commands: &'static [Command],
    help: &'static str,
    set: fn(&mut Options, &str) -> Result<(), OptionError>,
) -> OptionRow {
    OptionRow { key, value: Some(value), help, commands, repeated: false, env: None, choices: &[], set }
}

/// Every option of the commands, one row each, in the order the help lists them.
pub const OPTIONS: &[OptionRow] = &[
    row(
        "strategy",
        "STRATEGY",
        &[Command::Replay],
        "Strategy: first-fit, best-fit, buddy, tlsf, slab, tiered or caching (PyTorch's model). Default: caching \
         for PyTorch snapshots, best-fit for the other formats.",
        |o, s| {
            o.strategy = Some(parse_strategy(s)?);
            Ok(())
        },
    ),
    row(
        "device",
        "DEVICE",
        EVERY,
        "Device of the trace to report on. Default: the one with a recorded OOM, else the one with the most \
         allocation events, else the one whose final state holds the most live blocks.",
        |o, s| {
            let d = s.trim().parse::<i64>().map_err(|_| OptionError::Device(s.to_owned()))?;
            o.device = Some(d);
            Ok(())
        },
    ),
    row(
        "capacity",
        "BYTES",
        EVERY,
        "The GPU's memory: bytes (1073741824), a float (1.5e9) or with a unit (80GiB, 512MiB, 2GB). Default: \
         PyTorch's reserved bytes at a recorded OOM plus the driver's free bytes then; else PyTorch's recorded \
         peak reserved bytes (snapshots); else the capacity in a minimalloc file name (NAME.CAPACITY.csv); \
         else twice the peak of live requested bytes.",
        |o, s| {
            o.capacity = Some(parse_capacity(s)?);
            Ok(())
        },
    ),
    row(
        "align",
        "BYTES",
        REPLAYS,
        "Alignment of every request, bytes (a power of two). Default: the format's own: 512 B for PyTorch \
         snapshots (PyTorch's kMinBlockSize), 1 B for minimalloc CSV (defined at byte granularity), 256 B for \
         RMM logs (cudaMalloc's alignment). The output states which was used.",
        |o, s| {
            o.align = Some(parse_align(s)?);
            Ok(())
        },
    ),
    row(
        "tiers",
        "SMALL_MAX,LARGE_MIN",
        REPLAYS,
        "Tier thresholds of the tiered strategy (bytes or with units, e.g. 1KiB,1MiB): requests up to \
         SMALL_MAX go to the slab tier, from LARGE_MIN to the top-down large tier. Default: 64 KiB and \
         min(10 MiB, capacity/16).",
        |o, s| {
            o.tiers = Some(parse_tiers(s)?);
            Ok(())
        },
    ),
    row(
        "compact",
        "POLICY",
        REPLAYS,
        "Compaction policy: never (the default), on-oom (compact and retry a request that fails for \
         fragmentation) or threshold=F (compact when a free leaves external fragmentation above F in [0, 1]).",
        |o, s| {
            o.policy = parse_policy(s)?;
            Ok(())
        },
    ),
    OptionRow {
        env: Some("GPUHEAP_BACKEND"),
        choices: &["auto", "cpu", "gpu"],
        ..row(
            "backend",
            "BACKEND",
            REPLAYS,
            "Where kernels run: auto (the GPU when usable, else the CPU; the default), cpu or gpu (an error when \
             no GPU is usable).",
            |o, s| {
                o.backend = parse_backend(s)?;
                Ok(())
            },
        )
    },
    row(
        "materialize_limit",
        "BYTES",
        REPLAYS,
        "Largest image a compaction materialises on the backend before it compacts a scaled image. Default: \
         1GiB on the CPU, 80 % of free memory on the GPU.",
        |o, s| {
            o.materialize_limit = Some(parse_bytes(s)?);
            Ok(())
        },
    ),
    row(
        "device_heap_limit",
        "BYTES",
        &[Command::Compare],
        "Largest device heap the device allocator's row creates before it replays a scaled trace (all sizes \
         divided by a power of two; the row is then labelled \"scaled 1/N\"): bytes or with a unit. Default: \
         8GiB on the CPU backend, 75 % of free memory on a GPU.",
        |o, s| {
            o.device_heap_limit = Some(parse_bytes(s)?);
            Ok(())
        },
    ),
    OptionRow {
        value: None,
        ..row(
            "verbose",
            "",
            &[Command::Compare],
            "List every compaction of every strategy (default: one summary line per strategy).",
            |o, _| {
                o.verbose = true;
                Ok(())
            },
        )
    },
    OptionRow {
        value: None,
        ..row("no_tune", "", &[Command::Explain], "Skip the settings search (`gpuheap tune`).", |o, _| {
            o.tune = false;
            Ok(())
        })
    },
    OptionRow {
        repeated: true,
        ..row(
            "without",
            "SITE",
            &[Command::Explain],
            "Replay the trace without the allocations whose stack has a frame matching SITE (`FILE:LINE`, \
             `FILE:LINE FUNCTION` as the breakdown prints it, or a function) and their frees: does the OOM go \
             away, and how much GPU memory does the run then need? Repeatable (the union).",
            |o, s| {
                o.without.push(s.to_owned());
                Ok(())
            },
        )
    },
    OptionRow {
        repeated: true,
        ..row(
            "settings",
            "LABEL",
            &[Command::Tune],
            "Keep only the rows of the settings search with these labels (as the table prints them, e.g. \
             `expandable_segments:True`). Repeatable. Default: every row.",
            |o, s| {
                o.settings.get_or_insert_with(Vec::new).push(s.to_owned());
                Ok(())
            },
        )
    },
];

/// The row of [`OPTIONS`] whose key is `key`.
pub fn option(key: &str) -> Option<&'static OptionRow> {
    OPTIONS.iter().find(|r| r.key == key)
}

/// The rows of [`OPTIONS`] that `command` takes, in the table's order.
pub fn options_of(command: Command) -> impl Iterator<Item = &'static OptionRow> {
    OPTIONS.iter().filter(move |r| r.commands.contains(&command))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value each row takes.
    fn sample(r: &OptionRow) -> &'static str {
        match r.key {
            "strategy" => "buddy",
            "device" => "1",
            "tiers" => "1KiB,1MiB",
            "compact" => "on-oom",
            "backend" => "cpu",
            "without" => "model.py:42",
            "settings" => "(defaults)",
            _ if r.value.is_none() => "",
            _ => "64MiB",
        }
    }

    /// Each row has its own key and sets an option of its own: applied to the defaults, each changes
    /// them, and no two rows change the same field (told apart by the defaults' `Debug` form).
    #[test]
    fn each_row_sets_one_option_of_its_own() {
        let base = format!("{:?}", Options::default());
        let mut changed: Vec<String> = Vec::new();
        for r in OPTIONS {
            assert_eq!(OPTIONS.iter().filter(|o| o.key == r.key).count(), 1, "{}", r.key);
            assert!(!r.help.is_empty() && !r.commands.is_empty(), "{}", r.key);
            let mut o = Options::default();
            (r.set)(&mut o, sample(r)).unwrap_or_else(|e| panic!("{}: {e}", r.key));
            let after = format!("{o:?}");
            assert_ne!(after, base, "{} changes nothing", r.key);
            assert!(!changed.contains(&after), "{} sets what another row sets", r.key);
            changed.push(after);
            if r.repeated {
                (r.set)(&mut o, sample(r)).unwrap();
                assert_ne!(format!("{o:?}"), changed[changed.len() - 1], "{}: a second value adds", r.key);
            }
        }
    }

    /// A value a row's parser refuses is an [`OptionError`] naming it, never a panic.
    #[test]
    fn a_bad_value_is_an_error_naming_it() {
        for r in OPTIONS.iter().filter(|r| r.value.is_some() && !r.repeated) {
            let e = (r.set)(&mut Options::default(), "x\u{0}y").expect_err(r.key);
            assert!(e.to_string().contains('x'), "{}: {e}", r.key);
        }
    }
}
