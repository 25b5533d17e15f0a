//! The settings search behind `gpuheap tune`: replays one device's trace under a grid of PyTorch
//! caching-allocator settings (`PYTORCH_CUDA_ALLOC_CONF`), under the caching model with compaction on
//! OOM ("what a compacting allocator would do") and under every host strategy, and reports for each
//! the peak reserved bytes, the requests that fail at the capacity, and the **minimum device capacity**
//! that replays the whole trace without a failed request (bisection at 2 MiB, [`GRANULE`]).
//!
//! # The grid ([`grid`])
//! The snapshot's own settings; `expandable_segments:True`; `max_split_size_mb` at values derived from
//! the trace's request sizes (just above the quartiles of the distinct request sizes above 20 MiB,
//! PyTorch's lower limit `kLargeBuffer`, `c10/cuda/CUDAAllocatorConfig.cpp`);
//! `roundup_power2_divisions` 1, 2, 4, 8, 16 and the list form `[256:1,512:2,1024:4,>:8]` (the
//! example of PyTorch's documentation); `garbage_collection_threshold` 0.6 and 0.8; and combinations
//! of expandable segments and of the median `max_split_size_mb` with the 0.8 threshold. Each setting
//! is applied on top of the snapshot's own, as a user would change one option at a time.
//!
//! The caching model reads its options from the trace's `allocator_settings`
//! ([`crate::replay::replay`]); a setting is a copy of them with the setting applied. Options the model
//! does not implement are named by the replay's own warnings.
//!
//! # Minimum capacity
//! The capacity search assumes that a replay which succeeds at capacity `c` succeeds at any larger
//! capacity. It starts from the replay's own peak reserved bytes at an unconstrained capacity (a
//! replay whose device never runs out makes the same choices at any capacity above that peak), and
//! bisects between the peak of live requested bytes (a lower bound for every allocator) and it.
//!
//! # Recorded OOMs
//! The request of each recorded `oom` event is tried where it failed and released right after
//! ([`super::with_oom_requests`]): a row that serves it would have avoided that OOM.
//!
//! Settings run in parallel (rayon); a callback reports each finished replay.

use rayon::prelude::*;
use serde::Serialize;

use super::{Capacity, ExplainError};
use crate::reference::{StrategyKind, MAX_BYTES};
use crate::replay::{self, CompactPolicy, ReplayOptions, ReplayReport, MIN_CAPACITY};
use crate::trace::{AllocatorSettings, DeviceTrace, EventKind, Trace};

/// Granularity of the minimum-capacity search: 2 MiB, the GPU's large page and PyTorch's segment
/// rounding (`kRoundLarge`).
pub const GRANULE: u64 = 2 << 20;

/// PyTorch's interval starts (MiB) of `roundup_power2_divisions`, as snapshots record them.
const ROUNDUP_INTERVALS: [u64; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768];

/// What a grid row replays.
#[derive(Clone, Debug, PartialEq)]
pub enum Setting {
    /// PyTorch's caching allocator with these settings; `env` is the `PYTORCH_CUDA_ALLOC_CONF` value
    /// that sets them ("" for the defaults).
    Pytorch {
        /// `PYTORCH_CUDA_ALLOC_CONF` value.
        env: String,
        /// The settings as the snapshot would record them.
        settings: AllocatorSettings,
    },
    /// The caching model with the snapshot's own settings, compacting (sliding blocks within their
    /// segments) when a request fails although the free bytes would hold it: what a compacting
    /// allocator would do.
    CompactingCaching,
    /// A host reference strategy over one flat range of the capacity.
    Host(StrategyKind),
}

/// The kind of a [`TuneRow`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RowKind {
    /// A `PYTORCH_CUDA_ALLOC_CONF` setting.
    Pytorch,
    /// The caching model with compaction on OOM.
    Compacting,
    /// A host reference strategy.
    Host,
}

impl Setting {
    /// The row label: the env value (or "defaults"/"snapshot's own"), "caching + compaction on OOM", or
    /// the strategy's name.
    pub fn label(&self) -> String {
        match self {
            Setting::Pytorch { env, .. } if env.is_empty() => "(defaults)".into(),
            Setting::Pytorch { env, .. } => env.clone(),
            Setting::CompactingCaching => "caching + compaction on OOM".into(),
            Setting::Host(k) => k.to_string(),
        }
    }

    fn kind(&self) -> RowKind {
        match self {
            Setting::Pytorch { .. } => RowKind::Pytorch,
            Setting::CompactingCaching => RowKind::Compacting,
            Setting::Host(_) => RowKind::Host,
        }
    }
}

/// One row of the search. Bytes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TuneRow {
    /// Label (see [`Setting::label`]).
    pub setting: String,
    /// Kind.
    pub kind: RowKind,
    /// The `PYTORCH_CUDA_ALLOC_CONF=...` line to set (PyTorch rows only).
    pub env: Option<String>,
    /// Whether this is the snapshot's own setting.
    pub own: bool,
    /// Peak reserved bytes of the replay at the capacity.
    pub peak_reserved: u64,
    /// Requests that failed at the capacity.
    pub failed: usize,
    /// Event index (in the file) of the first failed request at the capacity.
    pub first_failure: Option<usize>,
    /// The least capacity (a multiple of [`GRANULE`]) at which the whole trace replays without a failed
    /// request; `None` when none up to 2^48 B does (a request larger than any device, or a replay
    /// error: see `note`).
    pub min_capacity: Option<u64>,
    /// `min_capacity <= capacity`: with an OOM recorded (or a dumped state), "this setting would have
    /// avoided the OOM".
    pub fits: bool,
    /// Why the row could not run, or what it could not model.
    pub note: Option<String>,
    /// Replays this row ran.
    pub replays: usize,
}

/// What [`tune`] reports.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TuneReport {
    /// Device ordinal.
    pub device: i64,
    /// The capacity of the "failed" column.
    pub capacity: Capacity,
    /// Rows ranked: fitting rows first, then by minimum capacity, failures, peak reserved.
    pub rows: Vec<TuneRow>,
    /// The PyTorch row with the least minimum capacity (ties: the snapshot's own first, then grid
    /// order; rows with a note are left out): its `PYTORCH_CUDA_ALLOC_CONF=...` line.
    pub best_env: Option<String>,
    /// Index into `rows` of that row.
    pub best: Option<usize>,
    /// Replays run in total.
    pub replays: usize,
}

fn with_roundup(mut s: AllocatorSettings, div: impl Fn(u64) -> u64) -> AllocatorSettings {
    s.roundup_power2_divisions = ROUNDUP_INTERVALS.iter().map(|&mb| (mb, div(mb))).collect();
    s
}

/// The `PYTORCH_CUDA_ALLOC_CONF` value of the snapshot's own settings ([`super::settings_env`]; empty
/// for PyTorch's defaults or when none are recorded).
pub fn own_env(dev: &DeviceTrace) -> String {
    super::settings_env(dev).unwrap_or_default()
}

/// `max_split_size_mb` values derived from the request sizes of `dev`: the smallest whole MiB above the
/// quartiles (25, 50, 75, 100 %) of the distinct request sizes above 20 MiB (PyTorch refuses values
/// ≤ 20), without duplicates, ascending.
pub fn max_split_candidates(dev: &DeviceTrace) -> Vec<u64> {
    let mib = 1u64 << 20;
    let mut sizes: Vec<u64> = dev
        .events
        .iter()
        .filter(|e| e.kind == EventKind::Alloc)
        .map(|e| e.size)
        .chain(dev.initial_blocks.iter().map(|b| b.size))
        .filter(|&s| s > 20 * mib && s <= MAX_BYTES)
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    if sizes.is_empty() {
        return Vec::new();
    }
    let mut v: Vec<u64> =
        [1usize, 2, 3, 4].iter().map(|q| sizes[(sizes.len() * q).div_ceil(4) - 1] / mib + 1).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The settings of the search for `dev` (see the module docs), PyTorch rows first, the snapshot's own
/// first of all.
pub fn grid(dev: &DeviceTrace) -> Vec<Setting> {
    let own = dev.allocator_settings.clone().unwrap_or_default();
    let own_env = own_env(dev);
    let join = |extra: &str| if own_env.is_empty() { extra.to_string() } else { format!("{own_env},{extra}") };
    let mut out = vec![Setting::Pytorch { env: own_env.clone(), settings: own.clone() }];
    let mut push = |env: String, settings: AllocatorSettings| {
        if !out.iter().any(|s| matches!(s, Setting::Pytorch { env: e, .. } if *e == env)) {
            out.push(Setting::Pytorch { env, settings });
        }
    };
    let expandable = AllocatorSettings { expandable_segments: Some(true), ..own.clone() };
    push(join("expandable_segments:True"), expandable.clone());
    let splits = max_split_candidates(dev);
    for &mb in &splits {
        push(
            join(&format!("max_split_size_mb:{mb}")),
            AllocatorSettings { max_split_size: Some((mb << 20) as i64), ..own.clone() },
        );
    }
    for d in [1u64, 2, 4, 8, 16] {
        push(join(&format!("roundup_power2_divisions:{d}")), with_roundup(own.clone(), |_| d));
    }
    push(
        join("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]"),
        with_roundup(own.clone(), |mb| match mb {
            0..=256 => 1,
            257..=512 => 2,
            513..=1024 => 4,
            _ => 8,
        }),
    );
    for t in [0.6, 0.8] {
        push(
            join(&format!("garbage_collection_threshold:{t}")),
            AllocatorSettings { garbage_collection_threshold: Some(t), ..own.clone() },
        );
    }
    push(
        join("expandable_segments:True,garbage_collection_threshold:0.8"),
        AllocatorSettings { garbage_collection_threshold: Some(0.8), ..expandable },
    );
    if let Some(&mb) = splits.get(splits.len() / 2) {
        push(
            join(&format!("max_split_size_mb:{mb},garbage_collection_threshold:0.8")),
            AllocatorSettings {
                max_split_size: Some((mb << 20) as i64),
                garbage_collection_threshold: Some(0.8),
                ..own
            },
        );
    }
    out.push(Setting::CompactingCaching);
    out.extend(StrategyKind::ALL.iter().filter(|&&k| k != StrategyKind::Caching).map(|&k| Setting::Host(k)));
    out
}

/// Options of a PyTorch row that the caching model of this build does not implement
/// ([`crate::reference::caching`] models `expandable_segments` and `max_split_size_mb`): such a row
/// replays as if they were unset, and says so.
fn unmodelled(setting: &Setting) -> Option<String> {
    let Setting::Pytorch { settings, .. } = setting else { return None };
    let mut v = Vec::new();
    if settings.roundup_power2_divisions.iter().any(|&(_, d)| d > 0) {
        v.push("roundup_power2_divisions");
    }
    if settings.garbage_collection_threshold.is_some_and(|t| t > 0.0) {
        v.push("garbage_collection_threshold");
    }
    (!v.is_empty()).then(|| format!("{} not modelled by this build: replayed as unset", v.join(" and ")))
}

/// The trace a row replays: the OOM requests tried where they failed ([`super::with_oom_requests`]),
/// and for PyTorch rows the row's settings in place of the snapshot's.
fn row_trace(dev: &DeviceTrace, setting: &Setting) -> DeviceTrace {
    let mut d = super::with_oom_requests(dev).0;
    if let Setting::Pytorch { settings, .. } = setting {
        d.allocator_settings = Some(settings.clone());
    }
    d
}

/// One replay of `dev` (a [`row_trace`]) under `setting` at `capacity` bytes.
fn run(trace: &Trace, dev: &DeviceTrace, setting: &Setting, capacity: u64) -> Result<ReplayReport, ExplainError> {
    let (strategy, policy) = match setting {
        Setting::Pytorch { .. } => (StrategyKind::Caching, CompactPolicy::Never),
        Setting::CompactingCaching => (StrategyKind::Caching, CompactPolicy::OnOom),
        Setting::Host(k) => (*k, CompactPolicy::Never),
    };
    let mut opts = ReplayOptions::new(strategy);
    opts.capacity = Some(capacity);
    opts.policy = policy;
    opts.timeline_points = 1;
    Ok(replay::replay(trace, dev, &opts, None, &mut |_| {})?)
}

/// Searches the least capacity (a multiple of [`GRANULE`]) at which `setting` replays `dev` without a
/// failed request. Returns it (`None`: none up to [`MAX_BYTES`]) and the replays run.
fn min_capacity(
    trace: &Trace,
    dev: &DeviceTrace,
    setting: &Setting,
    peak_live: u64,
    hint: u64,
    progress: &(dyn Fn() + Sync),
) -> Result<(Option<u64>, usize), ExplainError> {
    let cap_max = MAX_BYTES / GRANULE * GRANULE;
    // A capacity the allocator cannot be built with (the caching model below 2 MiB) fails like an OOM.
    let ok = |c: u64| -> Result<bool, ExplainError> {
        let r = run(trace, dev, setting, c);
        progress();
        match r {
            Ok(r) => Ok(r.failed.is_empty()),
            Err(e) if e.is_input() => Ok(false),
            Err(e) => Err(e),
        }
    };
    let mut replays = 0;
    // An upper bound that succeeds: the hint (a peak reserved), doubled until it does.
    let mut hi = hint.div_ceil(GRANULE).saturating_mul(GRANULE).clamp(GRANULE.max(MIN_CAPACITY), cap_max);
    loop {
        replays += 1;
        if ok(hi)? {
            break;
        }
        if hi == cap_max {
            return Ok((None, replays));
        }
        hi = hi.saturating_mul(2).min(cap_max);
    }
    // Invariant: hi succeeds; every capacity ≤ lo fails (lo = a granule below the live peak).
    let mut lo = (peak_live / GRANULE * GRANULE).saturating_sub(GRANULE).min(hi.saturating_sub(GRANULE));
    if lo < GRANULE {
        lo = 0;
    }
    while hi - lo > GRANULE {
        let mid = lo + (hi - lo) / GRANULE / 2 * GRANULE;
        replays += 1;
        if mid >= MIN_CAPACITY && ok(mid)? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok((Some(hi), replays))
}

/// Replays `dev` under every setting of [`grid`] (in parallel), at `capacity` and in a minimum-capacity
/// search each; `progress` is called after every replay (from several threads). The number of replays
/// is not known in advance: about 2 + log2(range / 2 MiB) per row.
///
/// # Errors
/// [`ExplainError::Replay`] when a replay fails at run time (a strategy refusing a valid free, a
/// failed compaction check). A configuration a row cannot use (a capacity below a strategy's
/// minimum) is the row's `note`, not an error.
pub fn tune(
    trace: &Trace,
    dev: &DeviceTrace,
    capacity: &Capacity,
    progress: &(dyn Fn() + Sync),
) -> Result<TuneReport, ExplainError> {
    let settings = grid(dev);
    let peak_live = super::peaks(dev).allocated.min(MAX_BYTES as u128) as u64;
    let index_map = super::with_oom_requests(dev).1;
    let rows: Vec<Result<TuneRow, ExplainError>> = settings
        .par_iter()
        .enumerate()
        .map(|(i, s)| {
            let owned = row_trace(dev, s);
            let dev = &owned;
            let row = |note: Option<String>| TuneRow {
                setting: s.label(),
                kind: s.kind(),
                env: match s {
                    Setting::Pytorch { env, .. } => Some(format!("PYTORCH_CUDA_ALLOC_CONF={env}")),
                    _ => None,
                },
                own: i == 0,
                peak_reserved: 0,
                failed: 0,
                first_failure: None,
                min_capacity: None,
                fits: false,
                note,
                replays: 0,
            };
            // At the capacity; a capacity the row cannot use (below the caching model's 2 MiB) is its note,
            // and the search still runs.
            let mut r = row(unmodelled(s));
            match run(trace, dev, s, capacity.bytes) {
                Ok(at) => {
                    r.peak_reserved = at.peak_reserved;
                    r.failed = at.failed.len();
                    r.first_failure = at.failed.first().and_then(|f| f.event).and_then(|e| index_map.get(e).copied());
                }
                Err(e) if e.is_input() => r.note = Some(format!("cannot run at the capacity: {e}")),
                Err(e) => return Err(e),
            }
            progress();
            // The unconstrained peak: a replay on the largest device modelled.
            let free_run = run(trace, dev, s, MAX_BYTES / GRANULE * GRANULE);
            progress();
            let hint = match &free_run {
                Ok(x) if x.failed.is_empty() => x.peak_reserved,
                _ => r.peak_reserved,
            };
            let (min, replays) = match min_capacity(trace, dev, s, peak_live, hint, progress) {
                Ok(v) => v,
                Err(e) if e.is_input() => {
                    r.note.get_or_insert_with(|| e.to_string());
                    (None, 0)
                }
                Err(e) => return Err(e),
            };
            r.min_capacity = min;
            r.fits = min.is_some_and(|m| m <= capacity.bytes);
            r.replays = replays + 2;
            Ok(r)
        })
        .collect();
    let mut rows = rows.into_iter().collect::<Result<Vec<_>, _>>()?;
    // Stable sort: grid order (the snapshot's own first) breaks ties.
    rows.sort_by(|a, b| {
        let key =
            |r: &TuneRow| (r.min_capacity.is_none(), r.min_capacity.unwrap_or(u64::MAX), r.failed, r.peak_reserved);
        key(a).cmp(&key(b))
    });
    let best = rows.iter().position(|r| r.kind == RowKind::Pytorch && r.min_capacity.is_some() && r.note.is_none());
    let replays = rows.iter().map(|r| r.replays).sum();
    Ok(TuneReport {
        device: dev.device,
        capacity: capacity.clone(),
        best_env: best.and_then(|i| rows[i].env.clone()),
        best,
        rows,
        replays,
    })
}
