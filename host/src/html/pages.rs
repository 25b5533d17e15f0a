//! The pages of the reports: an [`HtmlReport`] built from a replay ([`replay_page`]), a comparison
//! ([`compare_page`]), an explanation ([`explain_page`]) or a settings search ([`tune_page`]). The CLI's
//! `--html FILE` and the Python package's notebook view (`_repr_html_`) render the same pages.
//!
//! Timeline series: a replay's samples ([`crate::replay::Sample`]: the maxima of allocated and
//! reserved bytes over a bucket of events, the external fragmentation at its end); PyTorch's own
//! reserved bytes as one more series when the snapshot records segments. `tune` and `explain` keep no
//! timeline of their own (their replays are bisections): the page replays the snapshot's own setting and
//! the best one found at the capacity, as `tune` replays a row (recorded OOM requests tried where they
//! failed, events numbered as in the file).

use crate::explain::tune::{self, RowKind, Setting, TuneReport};
use crate::explain::{self, Explanation, Verdict};
use crate::facts::Capacity;
use crate::reference::StrategyKind;
use crate::replay::{self, CompactPolicy, MeasureOutcome, ReplayError, ReplayOptions, ReplayReport};
use crate::trace::{DeviceTrace, Trace};
use crate::units::{fmt_bytes, fmt_ns, pct};

use super::{HtmlReport, Marker, MarkerKind, Point, Series, Table};

/// Failed requests marked per series (the tables and `--json` list every one).
const MAX_FAILED_MARKERS: usize = 1000;

/// The timeline series of a replay: reserved = the strategy's footprint.
fn series_of(r: &ReplayReport, name: String, map: Option<&[usize]>) -> Series {
    let ev = |e: usize| map.and_then(|m| m.get(e).copied()).unwrap_or(e) as u64;
    Series {
        name,
        points: r
            .timeline
            .iter()
            .map(|s| Point {
                event: ev(s.event),
                allocated: s.allocated,
                reserved: s.footprint,
                fragmentation: Some(s.external),
            })
            .collect(),
    }
}

/// PyTorch's own reserved bytes (segment events of the snapshot), when recorded.
fn pytorch_series(r: &ReplayReport, map: Option<&[usize]>) -> Option<Series> {
    if !r.timeline.iter().any(|s| s.pytorch_reserved.is_some()) {
        return None;
    }
    let ev = |e: usize| map.and_then(|m| m.get(e).copied()).unwrap_or(e) as u64;
    Some(Series {
        name: "PyTorch (snapshot)".into(),
        points: r
            .timeline
            .iter()
            .map(|s| Point {
                event: ev(s.event),
                allocated: s.allocated,
                reserved: s.pytorch_reserved.unwrap_or(0),
                fragmentation: None,
            })
            .collect(),
    })
}

/// Failed requests (OOM markers, at most [`MAX_FAILED_MARKERS`]) and compactions of series `k`.
fn markers_of(r: &ReplayReport, k: usize, map: Option<&[usize]>) -> Vec<Marker> {
    let ev = |e: usize| map.and_then(|m| m.get(e).copied()).unwrap_or(e) as u64;
    let mut v: Vec<Marker> = r
        .failed
        .iter()
        .filter_map(|f| f.event.map(|e| (e, f)))
        .take(MAX_FAILED_MARKERS)
        .map(|(e, f)| Marker {
            series: Some(k),
            event: ev(e),
            kind: MarkerKind::Oom,
            bytes: None,
            label: format!(
                "{}: event {}: request of {} failed ({}; free {}, largest free extent {})",
                r.strategy,
                ev(e),
                fmt_bytes(f.size),
                f.class,
                fmt_bytes(f.free),
                fmt_bytes(f.largest_free)
            ),
        })
        .collect();
    v.extend(r.compactions.iter().map(|c| Marker {
        series: Some(k),
        event: ev(c.event),
        kind: MarkerKind::Compaction,
        bytes: Some(c.footprint_after),
        label: format!(
            "{}: event {}: compaction ({}), planned {} moved; F_ext {:.3} -> {:.3}; reserved {} -> {}",
            r.strategy,
            ev(c.event),
            c.trigger,
            fmt_bytes(c.planned_bytes_moved),
            c.external_before,
            c.external_after,
            fmt_bytes(c.footprint_before),
            fmt_bytes(c.footprint_after)
        ),
    }));
    v
}

/// OOM markers for the `oom` events the trace itself records (PyTorch's failures).
fn recorded_oom_markers(dev: &DeviceTrace) -> Vec<Marker> {
    dev.ooms
        .iter()
        .map(|o| Marker {
            series: None,
            event: o.event as u64,
            kind: MarkerKind::Oom,
            bytes: None,
            label: format!(
                "event {}: PyTorch's recorded OOM, request {}{}",
                o.event,
                fmt_bytes(dev.events.get(o.event).map_or(0, |e| e.size)),
                o.device_free.map_or_else(String::new, |f| format!(", driver free {}", fmt_bytes(f)))
            ),
        })
        .collect()
}

fn ev_text(e: Option<usize>) -> String {
    e.map_or_else(|| "start".to_string(), |i| i.to_string())
}

/// The parameters shared by every replay of one run.
fn replay_parameters(r: &ReplayReport) -> Vec<(String, String)> {
    vec![
        ("trace".into(), format!("{} ({})", r.trace, r.format)),
        ("device".into(), r.device.to_string()),
        (
            "capacity".into(),
            format!("{} ({} B): {}", fmt_bytes(r.capacity.bytes), r.capacity.bytes, r.capacity.describe()),
        ),
        ("request alignment".into(), format!("{} B", r.align)),
        ("compaction policy".into(), r.policy.clone()),
        (
            "events".into(),
            format!(
                "{} ({} alloc, {} free_completed, {} free_requested) after {} initial blocks",
                r.events, r.allocs, r.frees, r.free_requests, r.initial_blocks
            ),
        ),
        ("gpuheap".into(), env!("CARGO_PKG_VERSION").into()),
    ]
}

fn failed_table(reports: &[&ReplayReport]) -> Option<Table> {
    let rows: Vec<Vec<String>> = reports
        .iter()
        .flat_map(|r| {
            r.failed.iter().take(100).map(move |f| {
                vec![
                    r.strategy.clone(),
                    ev_text(f.event),
                    fmt_bytes(f.size),
                    f.class.to_string(),
                    fmt_bytes(f.free),
                    fmt_bytes(f.largest_free),
                ]
            })
        })
        .collect();
    (!rows.is_empty()).then(|| Table {
        caption: "Failed requests (first 100 per strategy; --json has all)".into(),
        header: ["strategy", "event", "request", "class", "free", "largest free extent"].map(String::from).to_vec(),
        rows,
    })
}

fn compactions_table(reports: &[&ReplayReport]) -> Option<Table> {
    let rows: Vec<Vec<String>> = reports
        .iter()
        .flat_map(|r| {
            r.compactions.iter().map(move |c| {
                let measured = match &c.measurement {
                    MeasureOutcome::Measured(m) => format!(
                        "{} on {}: {} moved, kernel {}",
                        if m.scaled_by == 1 { "full size".to_string() } else { format!("scaled 1/{}", m.scaled_by) },
                        m.backend,
                        fmt_bytes(m.bytes_moved),
                        fmt_ns(m.kernel_ns)
                    ),
                    MeasureOutcome::NotMeasured { reason } => format!("not measured: {reason}"),
                };
                vec![
                    r.strategy.clone(),
                    c.event.to_string(),
                    c.trigger.to_string(),
                    fmt_bytes(c.planned_bytes_moved),
                    format!("{:.3} -> {:.3}", c.external_before, c.external_after),
                    format!("{} -> {}", fmt_bytes(c.footprint_before), fmt_bytes(c.footprint_after)),
                    c.retry_succeeded.map_or_else(String::new, |ok| if ok { "succeeded" } else { "failed" }.into()),
                    measured,
                ]
            })
        })
        .collect();
    (!rows.is_empty()).then(|| Table {
        caption: "Compactions".into(),
        header: ["strategy", "event", "trigger", "planned moved", "F_ext", "reserved", "retry", "kernel"]
            .map(String::from)
            .to_vec(),
        rows,
    })
}

/// The page of `gpuheap replay` (one strategy).
pub fn replay_page(title: &str, r: &ReplayReport) -> HtmlReport {
    let mut series = vec![series_of(r, r.strategy.clone(), None)];
    series.extend(pytorch_series(r, None));
    let (p, e) = (&r.at_peak, &r.at_end);
    let rows = [
        ("allocated (requested)", fmt_bytes(p.allocated), fmt_bytes(e.allocated)),
        ("in blocks (rounded)", fmt_bytes(p.in_use), fmt_bytes(e.in_use)),
        ("reserved (footprint)", fmt_bytes(p.footprint), fmt_bytes(e.footprint)),
        ("reserved-unallocated", fmt_bytes(p.reserved_unallocated), fmt_bytes(e.reserved_unallocated)),
        ("  rounding waste", fmt_bytes(p.rounding_waste), fmt_bytes(e.rounding_waste)),
        ("  holes", fmt_bytes(p.holes), fmt_bytes(e.holes)),
        ("free (all extents)", fmt_bytes(p.free), fmt_bytes(e.free)),
        ("largest free extent", fmt_bytes(p.largest_free), fmt_bytes(e.largest_free)),
        ("free extents (count)", p.free_blocks.to_string(), e.free_blocks.to_string()),
        (
            "external fragmentation",
            format!("{:.3} ({})", p.external, p.level),
            format!("{:.3} ({})", e.external, e.level),
        ),
        ("RMS fragmentation", format!("{:.3}", p.rms), format!("{:.3}", e.rms)),
    ];
    let mut tables = vec![
        Table {
            caption: "Summary".into(),
            header: ["", "value"].map(String::from).to_vec(),
            rows: vec![
                vec!["peak allocated".into(), fmt_bytes(r.peak_allocated)],
                vec![
                    "peak reserved".into(),
                    format!("{} (event {})", fmt_bytes(r.peak_reserved), ev_text(r.peak_reserved_event)),
                ],
                vec!["utilisation (peak allocated / peak reserved)".into(), pct(r.utilisation)],
                vec!["Johnstone-Wilson #4".into(), format!("{:.3}", r.johnstone_wilson)],
                vec!["failed requests".into(), r.failed.len().to_string()],
                vec!["compactions".into(), r.compactions.len().to_string()],
                vec!["replay speed".into(), format!("{:.2} M events/s", r.events_per_s / 1e6)],
            ],
        },
        Table {
            caption: "Fragmentation at the demand peak and at the end".into(),
            header: vec![
                String::new(),
                format!("at peak (event {})", ev_text(p.event)),
                format!("at end (event {})", ev_text(e.event)),
            ],
            rows: rows.into_iter().map(|(a, b, c)| vec![a.to_string(), b, c]).collect(),
        },
    ];
    tables.extend(failed_table(&[r]));
    tables.extend(compactions_table(&[r]));
    let mut parameters = replay_parameters(r);
    parameters.insert(2, ("strategy".into(), r.strategy.clone()));
    HtmlReport {
        title: title.to_string(),
        notes: vec![format!(
            "gpuheap replay: the trace replayed through {}; reserved = the bytes the strategy holds (its footprint), \
             allocated = the requested bytes live.",
            r.strategy
        )],
        parameters,
        series,
        markers: markers_of(r, 0, None),
        tables,
    }
}

/// The page of `gpuheap compare` (every strategy). `demand`: the trace's peak of live requested bytes.
pub fn compare_page(title: &str, reports: &[&ReplayReport], not_run: &[(String, String)], demand: u64) -> HtmlReport {
    let mut series: Vec<Series> = reports.iter().map(|r| series_of(r, r.strategy.clone(), None)).collect();
    let mut markers = Vec::new();
    for (k, r) in reports.iter().enumerate() {
        markers.extend(markers_of(r, k, None));
    }
    if let Some(pt) = reports.first().and_then(|r| pytorch_series(r, None)) {
        series.push(pt);
    }
    let mut rows: Vec<Vec<String>> = reports
        .iter()
        .map(|r| {
            let cap = r.failed.iter().filter(|f| f.class == "capacity").count();
            let frag = r.failed.iter().filter(|f| f.class == "fragmentation").count();
            vec![
                r.strategy.clone(),
                fmt_bytes(r.peak_allocated),
                fmt_bytes(r.peak_reserved),
                pct(r.utilisation),
                format!("{:.3}", r.johnstone_wilson),
                format!("{cap} / {frag} / {}", r.failed.len() - cap - frag),
                fmt_bytes(r.at_peak.reserved_unallocated),
                format!("{:.3} ({})", r.at_peak.external, r.at_peak.level),
                fmt_bytes(r.at_end.footprint),
                format!("{:.3} ({})", r.at_end.external, r.at_end.level),
                if r.device_heap.is_some() { "n/a".into() } else { r.compactions.len().to_string() },
            ]
        })
        .collect();
    if let Some(pt) = reports.first().and_then(|r| r.pytorch.as_ref()) {
        // No ratio from what the history is missing (`facts::pytorch_ratios`).
        let history = &reports[0].history;
        let util = crate::facts::pytorch_ratios(demand, pt.peak, history).0;
        rows.push(vec![
            "PyTorch (snapshot)".into(),
            fmt_bytes(demand),
            fmt_bytes(pt.peak),
            util.map_or_else(|| "n/a".into(), pct),
            String::new(),
            format!("{} oom", pt.ooms),
            String::new(),
            String::new(),
            fmt_bytes(pt.snapshot_reserved.unwrap_or(pt.end)),
            String::new(),
            String::new(),
        ]);
    }
    rows.extend(not_run.iter().map(|(strategy, reason)| vec![strategy.clone(), format!("not run: {reason}")]));
    let mut tables = vec![Table {
        caption: "Strategies side by side".into(),
        header: [
            "strategy",
            "peak allocated",
            "peak reserved",
            "utilisation",
            "J-W #4",
            "failed capacity / fragmentation / rejected",
            "reserved-unallocated at peak",
            "F_ext at peak",
            "reserved at end",
            "F_ext at end",
            "compactions",
        ]
        .map(String::from)
        .to_vec(),
        rows,
    }];
    tables.extend(failed_table(reports));
    tables.extend(compactions_table(reports));
    HtmlReport {
        title: title.to_string(),
        notes: vec![
            "gpuheap compare: the same trace replayed through every strategy. Fragmentation levels: low < 0.1, \
             medium < 0.3, high < 0.6, severe otherwise."
                .into(),
        ],
        parameters: reports.first().map(|r| replay_parameters(r)).unwrap_or_default(),
        series,
        markers,
        tables,
    }
}

/// Replays `setting` (found in [`tune::grid`] by its label) at `capacity` with a full timeline, as
/// `tune` replays a row: recorded OOM requests tried where they failed; returns the report and the map
/// from its event indices to the file's.
fn replay_setting(
    trace: &Trace,
    dev: &DeviceTrace,
    setting: &Setting,
    capacity: u64,
) -> Result<(ReplayReport, Vec<usize>), ReplayError> {
    let (mut d, map) = explain::with_oom_requests(dev);
    let (strategy, policy) = match setting {
        Setting::Pytorch { settings, .. } => {
            d.allocator_settings = Some(settings.clone());
            (StrategyKind::Caching, CompactPolicy::Never)
        }
        Setting::CompactingCaching => (StrategyKind::Caching, CompactPolicy::OnOom),
        Setting::Host(k) => (*k, CompactPolicy::Never),
    };
    let mut opts = ReplayOptions::new(strategy);
    opts.capacity = Some(capacity);
    opts.policy = policy;
    let r = replay::replay(trace, &d, &opts, None, &mut |_| {})?;
    Ok((r, map))
}

/// Timeline series of the settings worth drawing: the snapshot's own, the best PyTorch setting and the
/// top-ranked row of `t` (when `t` is given), replayed at `capacity`. A setting that cannot run at the
/// capacity (e.g. the caching model below 2 MiB) is left out and named in the returned notes.
fn settings_timeline(
    trace: &Trace,
    dev: &DeviceTrace,
    t: Option<&TuneReport>,
    capacity: u64,
) -> Result<Timeline, ReplayError> {
    let grid = tune::grid(dev);
    let mut labels: Vec<String> = vec![grid[0].label()];
    if let Some(t) = t {
        labels.extend(t.best.map(|b| t.rows[b].setting.clone()));
        labels.extend(t.rows.first().filter(|r| r.min_capacity.is_some()).map(|r| r.setting.clone()));
    }
    labels.dedup();
    let mut seen: Vec<String> = Vec::new();
    let (mut series, mut markers, mut notes) = (Vec::new(), recorded_oom_markers(dev), Vec::new());
    let mut pt_done = false;
    for l in labels {
        if seen.contains(&l) {
            continue;
        }
        seen.push(l.clone());
        let Some(s) = grid.iter().find(|s| s.label() == l) else { continue };
        let name = match s {
            Setting::Pytorch { .. } if l == grid[0].label() => format!("{l} [snapshot's own]"),
            _ => l.clone(),
        };
        match replay_setting(trace, dev, s, capacity) {
            Ok((r, map)) => {
                let k = series.len();
                markers.extend(markers_of(&r, k, Some(&map)).into_iter().map(|mut m| {
                    m.label = m.label.replacen(&r.strategy, &name, 1);
                    m
                }));
                series.push(series_of(&r, name, Some(&map)));
                if !pt_done {
                    if let Some(p) = pytorch_series(&r, Some(&map)) {
                        series.push(p);
                        pt_done = true;
                    }
                }
            }
            Err(e) if e.is_input() => notes.push(format!("{name}: not drawn: {e}")),
            Err(e) => return Err(e),
        }
    }
    Ok(Timeline { series, markers, notes })
}

/// What [`settings_timeline`] draws, and the settings it could not (as notes).
struct Timeline {
    series: Vec<Series>,
    markers: Vec<Marker>,
    notes: Vec<String>,
}

fn tune_table(t: &TuneReport, oom: bool) -> Table {
    let rows = t
        .rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let kind = match r.kind {
                RowKind::Pytorch if r.own => "PyTorch setting (snapshot's own)",
                RowKind::Pytorch => "PyTorch setting",
                RowKind::Compacting => "a compacting allocator",
                RowKind::Host => "host strategy",
            };
            let verdict = match (r.min_capacity, r.fits, oom) {
                (None, _, _) => "not run".to_string(),
                (Some(_), true, true) => "would have avoided the OOM".into(),
                (Some(_), true, false) => "fits".into(),
                (Some(_), false, _) => String::new(),
            };
            vec![
                (i + 1).to_string(),
                r.setting.clone(),
                kind.into(),
                fmt_bytes(r.peak_reserved),
                r.failed.to_string(),
                r.min_capacity.map_or_else(|| "none".to_string(), fmt_bytes),
                verdict,
                r.note.clone().unwrap_or_default(),
            ]
        })
        .collect();
    Table {
        caption: format!(
            "Settings ranked by the least GPU memory that replays the whole trace without a failed request \
             (bisection at 2 MiB); failed = requests that fail at {}",
            fmt_bytes(t.capacity.bytes)
        ),
        header: ["rank", "setting", "kind", "peak reserved", "failed", "min capacity", "", "note"]
            .map(String::from)
            .to_vec(),
        rows,
    }
}

fn tune_parameters(trace: &Trace, dev: &DeviceTrace, capacity: &Capacity) -> Vec<(String, String)> {
    vec![
        ("trace".into(), format!("{} ({})", trace.source.display(), trace.format)),
        ("device".into(), dev.device.to_string()),
        ("capacity".into(), format!("{} ({} B): {}", fmt_bytes(capacity.bytes), capacity.bytes, capacity.describe())),
        ("allocator settings (snapshot)".into(), {
            let e = tune::own_env(dev);
            if e.is_empty() {
                "PyTorch's defaults".into()
            } else {
                e
            }
        }),
        ("events".into(), dev.events.len().to_string()),
        ("gpuheap".into(), env!("CARGO_PKG_VERSION").into()),
    ]
}

/// The page of `gpuheap tune`.
pub fn tune_page(
    title: &str,
    trace: &Trace,
    dev: &DeviceTrace,
    t: &TuneReport,
    capacity: &Capacity,
) -> Result<HtmlReport, ReplayError> {
    let Timeline { series, markers, mut notes } = settings_timeline(trace, dev, Some(t), capacity.bytes)?;
    notes.insert(
        0,
        "gpuheap tune: the trace replayed under a grid of PYTORCH_CUDA_ALLOC_CONF settings, the caching model with \
         compaction on OOM and every host strategy. The timeline replays the snapshot's own setting, the best \
         PyTorch setting and the top-ranked row at the capacity."
            .into(),
    );
    if let Some(env) = &t.best_env {
        notes.push(format!("Best PyTorch setting: {env}"));
    }
    Ok(HtmlReport {
        title: title.to_string(),
        notes,
        parameters: tune_parameters(trace, dev, capacity),
        series,
        markers,
        tables: vec![tune_table(t, !dev.ooms.is_empty())],
    })
}

/// The page of `gpuheap explain`.
pub fn explain_page(title: &str, trace: &Trace, page: &Explanation) -> Result<HtmlReport, ReplayError> {
    let dev = &trace.devices[page.device.index];
    let Timeline { series, markers, mut notes } =
        settings_timeline(trace, dev, page.tune.as_ref(), page.capacity.bytes)?;
    notes.insert(
        0,
        format!(
            "gpuheap explain: at the {} PyTorch reserved {} and allocated {} ({} requested); {} reserved but \
             unallocated in {} segments, the largest hole {}.",
            match page.event {
                Some(e) => format!("described moment (event {e})"),
                None => "dumped state".into(),
            },
            fmt_bytes(page.reserved),
            fmt_bytes(page.allocated),
            fmt_bytes(page.requested),
            fmt_bytes(page.reserved_unallocated),
            page.segments,
            fmt_bytes(page.largest_hole)
        ),
    );
    if let Some(b) = &page.request_bounds {
        notes.push(format!(
            "With {} of GPU memory: a request up to {} fits; one up to {} fails for fragmentation; a larger one \
             fails for capacity.",
            fmt_bytes(b.capacity),
            fmt_bytes(b.fits_up_to),
            fmt_bytes(b.fragmentation_up_to)
        ));
    }
    let mut parameters = tune_parameters(trace, dev, &page.capacity);
    if let Some(g) = page.gpu_capacity {
        parameters.push(("GPU memory at the recorded OOM".into(), fmt_bytes(g)));
    }
    let mut tables = Vec::new();
    if !page.ooms.is_empty() {
        let opt = |v: Option<u64>| v.map_or_else(|| "not recorded".to_string(), fmt_bytes);
        tables.push(Table {
            caption: "Recorded OOMs".into(),
            header: [
                "event",
                "request",
                "verdict",
                "allocated",
                "reserved",
                "reserved-unallocated",
                "largest hole",
                "driver free",
                "shortfall",
            ]
            .map(String::from)
            .to_vec(),
            rows: page
                .ooms
                .iter()
                .map(|o| {
                    vec![
                        o.event.to_string(),
                        fmt_bytes(o.request),
                        match o.verdict {
                            Verdict::Capacity => "capacity",
                            Verdict::Fragmentation => "fragmentation",
                            Verdict::Fits => "fits (a PyTorch rule)",
                            Verdict::Undetermined => "undetermined",
                        }
                        .into(),
                        fmt_bytes(o.allocated),
                        fmt_bytes(o.reserved),
                        fmt_bytes(o.reserved_unallocated),
                        fmt_bytes(o.largest_hole),
                        opt(o.device_free),
                        fmt_bytes(o.shortfall),
                    ]
                })
                .collect(),
        });
    }
    tables.push(Table {
        caption: "Largest live tensors".into(),
        header: ["block", "requested", "allocated at", "top user frames"].map(String::from).to_vec(),
        rows: page
            .largest_tensors
            .iter()
            .map(|t| {
                let frames: Vec<String> =
                    t.frames.iter().map(|f| format!("{} ({}:{})", f.name, f.filename, f.line)).collect();
                vec![
                    fmt_bytes(t.block.size),
                    fmt_bytes(t.block.requested),
                    t.block.alloc_event.map_or_else(|| "before trace".into(), |e| format!("event {e}")),
                    if frames.is_empty() { "(no frames recorded)".into() } else { frames.join("; ") },
                ]
            })
            .collect(),
    });
    tables.push(Table {
        caption: "Where the reserved-but-unallocated bytes sit (segments with the most)".into(),
        header: ["segment", "pool", "size", "free", "holes"].map(String::from).to_vec(),
        rows: page
            .segments_with_holes
            .iter()
            .map(|s| {
                let holes: Vec<String> = s.holes.iter().map(|h| fmt_bytes(h.size)).collect();
                vec![
                    format!("{:#x}", s.addr),
                    s.pool.to_string(),
                    fmt_bytes(s.size),
                    fmt_bytes(s.hole_bytes()),
                    holes.join(", "),
                ]
            })
            .collect(),
    });
    if let Some(t) = &page.tune {
        tables.push(tune_table(t, !page.ooms.is_empty()));
        if let Some(env) = &t.best_env {
            notes.push(format!("Best PyTorch setting: {env}"));
        }
    }
    Ok(HtmlReport { title: title.to_string(), notes, parameters, series, markers, tables })
}
