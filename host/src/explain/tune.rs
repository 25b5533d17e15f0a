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

use super::ExplainError;
use crate::facts::{self, Capacity, DeviceChoice, DeviceSummary, MIN_CAPACITY};
use crate::reference::caching::config::{ConfigWarning, ROUNDUP_INTERVALS};
use crate::reference::{CachingConfig, StrategyKind, MAX_BYTES};
use crate::replay::{self, CompactPolicy, ReplayOptions, ReplayReport};
use crate::trace::{AllocatorSettings, DeviceTrace, EventKind, Trace};

/// Granularity of the minimum-capacity search: 2 MiB, the GPU's large page and PyTorch's segment
/// rounding (`kRoundLarge`).
pub const GRANULE: u64 = 2 << 20;

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
    /// The per-process memory fraction of the row (PyTorch rows whose garbage collection needs one,
    /// [`GC_MEMORY_FRACTION`]), set in its `env` as `per_process_memory_fraction`: PyTorch reads that key
    /// from 2.10 on, and older releases need `torch.cuda.set_per_process_memory_fraction`
    /// ([`crate::reference::caching::options::key_support`]).
    pub memory_fraction: Option<f64>,
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
    /// Options of the snapshot's own settings that the caching model does not implement or that have no
    /// effect as recorded ([`CachingConfig::from_settings`]): the snapshot's own row replays without them.
    pub warnings: Vec<ConfigWarning>,
}

/// The per-process memory fraction the garbage-collection rows set: 1.0, the whole GPU. PyTorch's
/// `malloc` runs `garbage_collect_cached_blocks` only when `set_fraction &&
/// garbage_collection_threshold() > 0` (`c10/cuda/CUDACachingAllocator.cpp`; the threshold is read in
/// `c10/cuda/CUDAAllocatorConfig.cpp`, `parseGarbageCollectionThreshold`), and `set_fraction` becomes
/// true only through `setMemoryFraction` (`torch.cuda.set_per_process_memory_fraction`): without it a
/// threshold has no effect. With 1.0 the collector's limit (`threshold × allowed_memory_maximum`) is a
/// fraction of the whole GPU, and no memory is withheld.
pub const GC_MEMORY_FRACTION: f64 = 1.0;

/// The configuration `settings` record (PyTorch's `CUDAAllocatorConfig` of the snapshot), for the
/// `PYTORCH_CUDA_ALLOC_CONF` strings of the grid. The device capacity is set by each replay.
fn base_config(settings: &AllocatorSettings) -> CachingConfig {
    CachingConfig::from_settings(settings, 0).0
}

/// The snapshot's settings that [`CachingConfig::from_settings`] reads back as exactly `cfg`: the
/// `PYTORCH_CUDA_ALLOC_CONF` string alone ([`CachingConfig::to_env`]), no structured field.
fn settings_of(cfg: &CachingConfig) -> AllocatorSettings {
    AllocatorSettings { alloc_conf: Some(cfg.to_env()), ..AllocatorSettings::default() }
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
/// first of all. Every other PyTorch row is the snapshot's configuration ([`CachingConfig::from_settings`])
/// changed with the [`CachingConfig`] builders; its `env` is [`CachingConfig::to_env`] of the result, and
/// its replay reads exactly that string back. Rows whose configuration equals an earlier one are left out.
pub fn grid(dev: &DeviceTrace) -> Vec<Setting> {
    let own = dev.allocator_settings.clone().unwrap_or_default();
    let base = base_config(&own);
    let mut out = vec![Setting::Pytorch { env: base.to_env(), settings: own }];
    let mut push = |cfg: CachingConfig| {
        let env = cfg.to_env();
        if !out.iter().any(|s| matches!(s, Setting::Pytorch { env: e, .. } if *e == env)) {
            out.push(Setting::Pytorch { env, settings: settings_of(&cfg) });
        }
    };
    let gc = |c: CachingConfig, t: f64| c.gc_threshold(t).memory_fraction(Some(GC_MEMORY_FRACTION));
    push(base.expandable(true));
    let splits = max_split_candidates(dev);
    for &mb in &splits {
        push(base.max_split(mb << 20));
    }
    for d in [1u64, 2, 4, 8, 16] {
        push(base.roundup_divisions(d));
    }
    // `[256:1,512:2,1024:4,>:8]`, the example of PyTorch's documentation, as PyTorch parses it (the
    // first interval also fills those below it; `>` fills from the last named interval inclusive).
    let mut list = [1u64; ROUNDUP_INTERVALS];
    list[9] = 2;
    list[10..].iter_mut().for_each(|d| *d = 8);
    push(base.roundup_divisions_per_interval(list));
    for t in [0.6, 0.8] {
        push(gc(base, t));
    }
    push(gc(base.expandable(true), 0.8));
    if let Some(&mb) = splits.get(splits.len() / 2) {
        push(gc(base.max_split(mb << 20), 0.8));
    }
    out.push(Setting::CompactingCaching);
    out.extend(StrategyKind::ALL.iter().filter(|&&k| k != StrategyKind::Caching).map(|&k| Setting::Host(k)));
    out
}

/// The [`ConfigWarning`]s of a PyTorch row: options its settings name that the caching model does not
/// implement or that have no effect as set (a `garbage_collection_threshold` without a memory fraction).
/// Only the snapshot's own row can have any: the other rows are built from [`CachingConfig`].
pub fn row_warnings(setting: &Setting) -> Vec<ConfigWarning> {
    match setting {
        Setting::Pytorch { settings, .. } => CachingConfig::from_settings(settings, 0).1,
        _ => Vec::new(),
    }
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
    let peak_live = facts::peaks(dev).allocated.min(MAX_BYTES as u128) as u64;
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
                memory_fraction: match s {
                    Setting::Pytorch { settings, .. } => base_config(settings).memory_fraction,
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
            let mut r = row(None);
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
    let mut report = TuneReport {
        device: dev.device,
        capacity: capacity.clone(),
        best_env: None,
        best: None,
        rows,
        replays: 0,
        warnings: row_warnings(&settings[0]),
    };
    report.rank();
    Ok(report)
}

impl TuneReport {
    /// Sets `best`, `best_env` and `replays` from the (ranked) rows.
    fn rank(&mut self) {
        let rows = &self.rows;
        self.best =
            rows.iter().position(|r| r.kind == RowKind::Pytorch && r.min_capacity.is_some() && r.note.is_none());
        self.best_env = self.best.and_then(|i| rows[i].env.clone());
        self.replays = rows.iter().map(|r| r.replays).sum();
    }

    /// Keeps only the rows whose `setting` label is one of `settings` (in rank order); the best row and
    /// the replay count are then among them.
    ///
    /// # Errors
    /// [`ExplainError::UnknownSettings`] naming the labels that are no row of the report (and listing the rows);
    /// the report is then unchanged.
    pub fn retain_settings(&mut self, settings: &[String]) -> Result<(), ExplainError> {
        let unknown: Vec<String> =
            settings.iter().filter(|s| !self.rows.iter().any(|r| &r.setting == *s)).cloned().collect();
        if !unknown.is_empty() {
            let rows = self.rows.iter().map(|r| r.setting.clone()).collect();
            return Err(ExplainError::UnknownSettings { unknown, rows });
        }
        self.rows.retain(|r| settings.contains(&r.setting));
        self.rank();
        Ok(())
    }
}

/// What `gpuheap tune` reports: the search over one device ([`TuneReport`], flattened into the JSON)
/// with the file's devices and the choice among them. Render with [`TunePage::render_text`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TunePage {
    /// The trace file.
    pub trace: String,
    /// Its format (in the text page; the JSON of the command line does not carry it).
    #[serde(skip)]
    pub format: String,
    /// Every device of the file.
    pub devices: Vec<DeviceSummary>,
    /// The device searched and why (JSON key `device_choice`: the flattened report's `device` is the
    /// ordinal, and a JSON object has each key once).
    #[serde(rename = "device_choice")]
    pub device: DeviceChoice,
    /// The GPU's memory at the first recorded OOM, when the trace records one with `device_free`.
    pub gpu_capacity: Option<u64>,
    /// Recorded `oom` events on the device.
    pub recorded_ooms: usize,
    /// Wall-clock seconds of the search.
    pub wall_s: f64,
    /// The search.
    #[serde(flatten)]
    pub tune: TuneReport,
}

/// `gpuheap tune`: picks the device ([`facts::choose_device`]; `device` given or not), the capacity from
/// the evidence ([`facts::capacity_from_evidence`]; `capacity` in bytes, given or not) and runs
/// [`tune`] on it (`progress` as there).
///
/// # Errors
/// [`ExplainError::Device`] for a device the file lacks, [`ExplainError::Capacity`] for a `capacity`
/// outside the range the strategies model; [`ExplainError::Trace`] for sums that cannot be represented; those of [`tune`].
pub fn tune_page(
    trace: &Trace,
    device: Option<i64>,
    capacity: Option<u64>,
    progress: &(dyn Fn() + Sync),
) -> Result<TunePage, ExplainError> {
    capacity.map(facts::check_capacity).transpose()?;
    let devices = facts::summarize(trace);
    let choice = facts::choose_device(trace, &devices, device)?;
    let dev = &trace.devices[choice.index];
    let cap = facts::capacity_from_evidence(trace, dev, capacity)?;
    let gpu = facts::gpu_capacity_at_oom(trace, dev)?.map(|c| c.bytes);
    let t = std::time::Instant::now();
    let report = tune(trace, dev, &cap, progress)?;
    Ok(TunePage {
        trace: trace.source.display().to_string(),
        format: trace.format.to_string(),
        devices,
        device: choice,
        gpu_capacity: gpu,
        recorded_ooms: dev.ooms.len(),
        wall_s: t.elapsed().as_secs_f64(),
        tune: report,
    })
}
