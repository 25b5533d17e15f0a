//! The settings search behind `gpuheap tune`: replays one device's trace under a grid of PyTorch
//! caching-allocator settings (`PYTORCH_CUDA_ALLOC_CONF`), under the caching model with compaction on
//! OOM ("what a compacting allocator would do") and under every host strategy, and reports for each
//! the peak reserved bytes, the requests that fail at the capacity, and the **minimum device capacity**
//! that replays the whole trace without a failed request (bisection at 2 MiB, [`GRANULE`]).
//!
//! # The grid ([`grid`])
//! The snapshot's own settings; `expandable_segments:True`; `max_split_size_mb` where it changes a
//! decision: at the quartiles of the distinct request sizes of 21 MiB and more, in whole MiB rounded
//! down, so that those requests become oversize (PyTorch's `get_free_block` and `should_split` treat
//! a block of `max_split_size` bytes or more so; values ≤ 20 are refused, `kLargeBuffer`,
//! `c10/cuda/CUDAAllocatorConfig.cpp`); `roundup_power2_divisions` 1, 2, 4, 8, 16 and the list form
//! `[256:1,512:2,1024:4,>:8]` (the example of PyTorch's documentation), each only when it moves a
//! request of the trace into another block size (`round_size`); `garbage_collection_threshold` 0.6
//! and 0.8; and combinations of expandable segments and of the median `max_split_size_mb` with the
//! 0.8 threshold. Each setting is applied on top of the snapshot's own, as a user would change one
//! option at a time, and each row says why it was tried ([`TuneRow`]'s `why` in the JSON).
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
//! # Cost
//! Settings run in parallel (rayon; the report is the same on any number of threads); a callback
//! reports each finished replay. The search's replays compute only what a row reports (peak reserved
//! bytes and failed requests: `RowTrace::search`, no timeline, series or fragmentation snapshots), a
//! probe of the capacity search stops at its first failed request, and what the caching model reads
//! from the whole event list is scanned once per row ([`crate::reference::caching`]'s `TraceScan`).
//! The rows, ranks, figures and replay counts are those of full replays.

use rayon::prelude::*;
use serde::Serialize;

use super::ExplainError;
use crate::cancel::Cancel;
use crate::facts::{self, Capacity, DeviceChoice, DeviceSummary, MIN_CAPACITY};
use crate::reference::caching::config::ConfigWarning;
use crate::reference::MAX_BYTES;
use crate::replay::ReplayError;
use crate::trace::{DeviceTrace, Trace};

mod grid;
mod row;

pub use grid::{grid, max_split_candidates, own_env, row_warnings, RowKind, Setting, GC_MEMORY_FRACTION};
pub use row::RowTrace;

/// Granularity of the minimum-capacity search: 2 MiB, the GPU's large page and PyTorch's segment
/// rounding (`kRoundLarge`).
#[doc(hidden)]
pub const GRANULE: u64 = 2 << 20;

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
    /// Rank within its group (1 = best): PyTorch settings are ranked apart from gpuheap's own
    /// strategies (the compacting caching model and the host strategies), which PyTorch cannot use.
    pub(crate) rank: usize,
    /// Why the row was tried: where the setting changes a decision for this trace's requests (`None`
    /// for the snapshot's own row and gpuheap's own strategies).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) why: Option<String>,
}

/// What [`tune`] reports.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
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
    /// effect as recorded ([`crate::reference::caching::CachingConfig::from_settings`]): the snapshot's own row replays without them.
    pub warnings: Vec<ConfigWarning>,
    /// What the search concludes, in the words every form of the page gives (JSON key `conclusion`).
    pub(crate) conclusion: Conclusion,
    /// What the replays stand for (not serialised: the pages say it).
    #[serde(skip)]
    pub(crate) scope: Scope,
}

/// The two groups the pages rank apart, each with its title: PyTorch settings (`true`), then gpuheap's
/// own strategies (the compacting caching model and the host strategies), which PyTorch cannot use.
pub(crate) const ROW_GROUPS: [(&str, bool); 2] = [
    ("PyTorch settings (PYTORCH_CUDA_ALLOC_CONF)", true),
    ("gpuheap's own strategies, for comparison (PyTorch cannot use them; ranked apart)", false),
];

/// What a [`TuneReport`]'s replays stand for, which bounds what its conclusion may claim.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Scope {
    /// The trace records an OOM (a row that fits "would have avoided" it, in the model's replay).
    pub(crate) recorded_oom: bool,
    /// The trace has no history: the replays pack only the tensors live when it was dumped.
    pub(crate) dumped_state: bool,
    /// For a dumped state: its live tensors, their bytes, and PyTorch's reserved bytes then.
    pub(crate) dumped: Option<(usize, u64, u64)>,
    /// The snapshot records no allocator settings: its row is PyTorch's defaults, assumed, not settings
    /// of the snapshot's own.
    pub(crate) no_settings: bool,
}

/// The words for the settings of a snapshot's own row: "the snapshot's own settings", or, when it
/// records none, PyTorch's defaults said to be assumed.
pub(crate) fn own_settings_words(no_settings: bool) -> &'static str {
    if no_settings {
        "PyTorch's defaults (assumed: the snapshot records no allocator settings)"
    } else {
        "the snapshot's own settings"
    }
}

/// The conclusion of a settings search, worded once here and rendered as is by the text page
/// ([`TuneReport::render_table`]), the HTML pages and the Python package (`conclusion` of the JSON):
/// a setting is recommended only when it fits in the capacity the page names.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub(crate) struct Conclusion {
    /// The `PYTORCH_CUDA_ALLOC_CONF=...` line recommended: the best PyTorch row's, only when its least
    /// memory fits in the capacity (`None` otherwise: nothing of the grid is recommended).
    pub(crate) recommended_env: Option<String>,
    /// The sentence the pages lead with.
    pub(crate) headline: String,
    /// The lines under it: the setting and the PyTorch releases that read each of its keys (for a
    /// recommendation), and what the snapshot's own settings need.
    pub(crate) lines: Vec<String>,
    /// What the replays stand for when it is not the whole run (a dump without history: only the
    /// tensors live when it was dumped), said before the tables.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) scope: Option<String>,
}

/// Searches the least capacity (a multiple of [`GRANULE`]) at which `setting` replays `row` without a
/// failed request. Returns it (`None`: none up to [`MAX_BYTES`]) and the replays run.
fn min_capacity(
    trace: &Trace,
    row: &RowTrace,
    setting: &Setting,
    peak_live: u64,
    hint: u64,
    progress: &(dyn Fn() + Sync),
) -> Result<(Option<u64>, usize), ExplainError> {
    let cap_max = MAX_BYTES / GRANULE * GRANULE;
    // A capacity the allocator cannot be built with (the caching model below 2 MiB) fails like an OOM.
    let ok = |c: u64| -> Result<bool, ExplainError> {
        let r = row.search(trace, setting, c, true);
        progress();
        match r {
            Ok(r) => Ok(r.failed.is_empty()),
            Err(e) if e.is_input() => Ok(false),
            Err(e) => Err(e.into()),
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

/// The least capacity (a multiple of [`GRANULE`]) at which `setting` replays `row` without a failed
/// request, and the replays run: a replay on the largest device modelled gives the bisection's upper
/// hint (its peak reserved bytes; `fallback_hint` when it fails), then the bisection above the live
/// peak `peak_live` (module docs). `None`: no capacity up to [`MAX_BYTES`] does. `progress` is called
/// after every replay.
///
/// # Errors
/// [`ExplainError::Replay`] when a replay fails at run time; a capacity the allocator cannot be built
/// with counts as a failed replay.
#[doc(hidden)]
pub fn least_capacity(
    trace: &Trace,
    row: &RowTrace,
    setting: &Setting,
    peak_live: u64,
    fallback_hint: u64,
    progress: &(dyn Fn() + Sync),
) -> Result<(Option<u64>, usize), ExplainError> {
    // The unconstrained peak: a replay on the largest device modelled.
    let free_run = row.search(trace, setting, MAX_BYTES / GRANULE * GRANULE, false);
    progress();
    let hint = match &free_run {
        Ok(x) if x.failed.is_empty() => x.peak_reserved,
        Err(ReplayError::Cancelled) => return Err(ReplayError::Cancelled.into()),
        _ => fallback_hint,
    };
    let (min, replays) = min_capacity(trace, row, setting, peak_live, hint, progress)?;
    Ok((min, replays + 1))
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
    tune_cancellable(trace, dev, capacity, progress, &Cancel::default())
}

/// [`tune`], stopped with [`ReplayError::Cancelled`] once `cancel` is set: every replay of every row
/// checks it (at its start and every 65,536 events).
pub(crate) fn tune_cancellable(
    trace: &Trace,
    dev: &DeviceTrace,
    capacity: &Capacity,
    progress: &(dyn Fn() + Sync),
    cancel: &Cancel,
) -> Result<TuneReport, ExplainError> {
    let (settings, reasons): (Vec<Setting>, Vec<Option<String>>) = grid::grid_with_reasons(dev).into_iter().unzip();
    let peak_live = facts::peaks(dev).allocated.min(MAX_BYTES as u128) as u64;
    let rows: Vec<Result<TuneRow, ExplainError>> = settings
        .par_iter()
        .enumerate()
        .map(|(i, s)| {
            // Before the row's trace is made (a copy of the device's events): a cancelled search skips
            // the rows it has not begun.
            cancel.check()?;
            let row_trace = RowTrace::new(dev, s).with_cancel(cancel);
            let row = |note: Option<String>| TuneRow {
                setting: s.label(),
                kind: s.kind(),
                env: match s {
                    Setting::Pytorch { env, .. } => Some(format!("PYTORCH_CUDA_ALLOC_CONF={env}")),
                    _ => None,
                },
                memory_fraction: match s {
                    Setting::Pytorch { settings, .. } => grid::base_config(settings).memory_fraction,
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
                rank: 0,
                why: reasons[i].clone(),
            };
            // At the capacity; a capacity the row cannot use (below the caching model's 2 MiB) is its note,
            // and the search still runs.
            let mut r = row(None);
            match row_trace.search(trace, s, capacity.bytes, false) {
                Ok(at) => {
                    r.peak_reserved = at.peak_reserved;
                    r.failed = at.failed.len();
                    r.first_failure =
                        at.failed.first().and_then(|f| f.event).and_then(|e| row_trace.map.get(e).copied());
                }
                Err(e) if e.is_input() => r.note = Some(format!("cannot run at the capacity: {e}")),
                Err(e) => return Err(e.into()),
            }
            progress();
            let (min, replays) = match least_capacity(trace, &row_trace, s, peak_live, r.peak_reserved, progress) {
                Ok(v) => v,
                Err(e) if e.is_input() => {
                    r.note.get_or_insert_with(|| e.to_string());
                    // The replay on the largest device ran.
                    (None, 1)
                }
                Err(e) => return Err(e),
            };
            r.min_capacity = min;
            r.fits = min.is_some_and(|m| m <= capacity.bytes);
            r.replays = replays + 1;
            Ok(r)
        })
        .collect();
    let mut rows = rows.into_iter().collect::<Result<Vec<_>, _>>()?;
    // PyTorch settings first, ranked apart from gpuheap's own strategies; a stable sort: grid order
    // (the snapshot's own first) breaks ties.
    rows.sort_by(|a, b| {
        let key = |r: &TuneRow| {
            (
                r.kind != RowKind::Pytorch,
                r.min_capacity.is_none(),
                r.min_capacity.unwrap_or(u64::MAX),
                r.failed,
                r.peak_reserved,
            )
        };
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
        conclusion: Conclusion::default(),
        scope: dump_scope(dev),
    };
    report.rank();
    Ok(report)
}

impl TuneReport {
    /// Sets `best`, `best_env` and `replays` from the (ranked) rows.
    fn rank(&mut self) {
        let mut n = [0usize; 2];
        for r in &mut self.rows {
            let g = usize::from(r.kind != RowKind::Pytorch);
            n[g] += 1;
            r.rank = n[g];
        }
        let rows = &self.rows;
        self.best =
            rows.iter().position(|r| r.kind == RowKind::Pytorch && r.min_capacity.is_some() && r.note.is_none());
        self.best_env = self.best.and_then(|i| rows[i].env.clone());
        self.replays = rows.iter().map(|r| r.replays).sum();
        self.conclusion = conclude(self);
    }

    /// Keeps only the rows whose `setting` label is one of `settings` (in rank order); the best row and
    /// the replay count are then among them.
    ///
    /// # Errors
    /// [`ExplainError::UnknownSettings`] naming the labels that are no row of the report (and listing the rows);
    /// the report is then unchanged.
    #[doc(hidden)]
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

/// What `dev`'s replays stand for: a dumped state when its history cannot place its moments and a
/// dumped state (or nothing but initial blocks) is what it holds, as [`crate::explain::explain`] decides.
fn dump_scope(dev: &DeviceTrace) -> Scope {
    let h = facts::history_completeness(dev);
    let dumped_state = !h.moments_known() && (dev.final_state.is_some() || dev.events.is_empty());
    let dumped = if dumped_state {
        let st = match &dev.final_state {
            Some(f) => facts::final_state(f, None),
            None => facts::state_after(dev, None),
        };
        st.ok().map(|st| (st.live.len(), st.allocated, st.reserved))
    } else {
        None
    };
    Scope { recorded_oom: !dev.ooms.is_empty(), dumped_state, dumped, no_settings: dev.allocator_settings.is_none() }
}

/// The [`Conclusion`] of ranked report `t` (its `best` set).
fn conclude(t: &TuneReport) -> Conclusion {
    let mut c = conclude_best(t);
    if t.scope.dumped_state {
        use crate::units::fmt_bytes;
        let what = match t.scope.dumped {
            Some((n, bytes, reserved)) => format!(
                "the {n} tensors live when it was dumped ({}; PyTorch held {} then)",
                fmt_bytes(bytes),
                fmt_bytes(reserved)
            ),
            None => "the tensors live when it was dumped".into(),
        };
        c.scope = Some(format!(
            "The file has no history to replay on this device: each setting packs only {what}, not the run that \
             led there. A row's least memory is what those tensors need under the setting, not what the run \
             needed: the peak before the dump and the request that failed, if one did, are not recorded."
        ));
    }
    c
}

fn conclude_best(t: &TuneReport) -> Conclusion {
    use crate::units::fmt_bytes;
    let cap = fmt_bytes(t.capacity.bytes);
    let own = t.rows.iter().find(|r| r.own);
    let Some(b) = t.best else {
        return Conclusion {
            recommended_env: None,
            headline: "No PyTorch setting of the grid replays the whole trace on any device modelled.".into(),
            lines: Vec::new(),
            scope: None,
        };
    };
    let r = &t.rows[b];
    let env = r.env.clone().unwrap_or_default();
    let need = r.min_capacity.unwrap_or(0);
    let what = if t.scope.dumped_state { "the tensors live in the dump" } else { "the whole trace" };
    let mut lines = Vec::new();
    let own_line = |lines: &mut Vec<String>| match own {
        Some(o) if o.env.as_ref().is_none_or(|e| *e != env) => lines.push(format!(
            "({} need {})",
            own_settings_words(t.scope.no_settings),
            o.min_capacity.map_or_else(|| "more than any device modelled".to_string(), fmt_bytes)
        )),
        _ => lines.push(format!(
            "(that is {}: no PyTorch setting of the grid needs less)",
            own_settings_words(t.scope.no_settings)
        )),
    };
    if r.fits {
        let hedge = if t.scope.recorded_oom && !t.scope.dumped_state {
            "; in the caching model's replay it would have avoided the recorded OOM"
        } else {
            ""
        };
        let headline = format!(
            "Best PyTorch setting (least memory needed for {what}: {}, within the {cap} capacity{hedge}):",
            fmt_bytes(need)
        );
        lines.extend(crate::explain::best_setting_lines(&env));
        own_line(&mut lines);
        Conclusion { recommended_env: Some(env), headline, lines, scope: None }
    } else {
        let named =
            if env.trim_end() == "PYTORCH_CUDA_ALLOC_CONF=" { "PyTorch's defaults".to_string() } else { env.clone() };
        let headline = format!(
            "No PyTorch setting of the grid fits in the {cap} capacity, so none is recommended: the one needing the \
             least memory for {what} ({named}) still needs {}, {} more.",
            fmt_bytes(need),
            fmt_bytes(need.saturating_sub(t.capacity.bytes))
        );
        own_line(&mut lines);
        let ours = t.rows.iter().filter(|r| r.kind != RowKind::Pytorch && r.fits).count();
        if ours > 0 {
            lines.push(format!("({ours} of gpuheap's own strategies fit, ranked apart: PyTorch cannot use them.)"));
        }
        Conclusion { recommended_env: None, headline, lines, scope: None }
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
    tune_page_cancellable(trace, device, capacity, progress, &Cancel::default())
}

/// [`tune_page`], stopped with [`ReplayError::Cancelled`] once `cancel` is set ([`tune_cancellable`]).
pub(crate) fn tune_page_cancellable(
    trace: &Trace,
    device: Option<i64>,
    capacity: Option<u64>,
    progress: &(dyn Fn() + Sync),
    cancel: &Cancel,
) -> Result<TunePage, ExplainError> {
    capacity.map(facts::check_capacity).transpose()?;
    let devices = facts::summarize(trace);
    let choice = facts::choose_device(trace, &devices, device)?;
    let dev = &trace.devices[choice.index];
    let cap = facts::capacity_from_evidence(trace, dev, capacity)?;
    let gpu = facts::gpu_capacity_at_oom(trace, dev)?.map(|c| c.bytes);
    let t = std::time::Instant::now();
    let report = tune_cancellable(trace, dev, &cap, progress, cancel)?;
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
