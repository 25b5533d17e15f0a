//! The page of `gpuheap tune`, and the timelines of the settings worth drawing (shared with the page
//! of `gpuheap explain`).

use super::{markers_of, pytorch_series, recorded_oom_markers, series_of};
use crate::explain::tune::{self, RowKind, RowTrace, Setting, TuneReport};
use crate::facts::Capacity;
use crate::html::{HtmlReport, Marker, Series, Table};
use crate::replay::{ReplayError, DEFAULT_TIMELINE_POINTS};
use crate::trace::{DeviceTrace, Trace};
use crate::units::fmt_bytes;

/// Timeline series of the settings worth drawing: the snapshot's own, the best PyTorch setting and the
/// top-ranked row of `t` (when `t` is given), replayed at `capacity`. A setting that cannot run at the
/// capacity (e.g. the caching model below 2 MiB) is left out and named in the returned notes.
pub(super) fn settings_timeline(
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
            Setting::Pytorch { .. } if l == grid[0].label() && dev.allocator_settings.is_none() => {
                format!("{l} [defaults: no settings recorded]")
            }
            Setting::Pytorch { .. } if l == grid[0].label() => format!("{l} [snapshot's own]"),
            _ => l.clone(),
        };
        let row = RowTrace::new(dev, s);
        match row.replay(trace, s, capacity, DEFAULT_TIMELINE_POINTS) {
            Ok(r) => {
                let map = row.map;
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
pub(super) struct Timeline {
    pub(super) series: Vec<Series>,
    pub(super) markers: Vec<Marker>,
    pub(super) notes: Vec<String>,
}

/// The ranked tables of `t`: PyTorch settings, then gpuheap's own strategies (ranked apart), as the text
/// page gives them.
pub(super) fn tune_tables(t: &TuneReport, oom: bool) -> Vec<Table> {
    let member = |pytorch: bool, k: RowKind| (k == RowKind::Pytorch) == pytorch;
    tune::ROW_GROUPS
        .iter()
        .filter(|(_, pytorch)| t.rows.iter().any(|r| member(*pytorch, r.kind)))
        .map(|(title, pytorch)| {
            let rows = t
                .rows
                .iter()
                .filter(|r| member(*pytorch, r.kind))
                .map(|r| {
                    let kind = match r.kind {
                        RowKind::Pytorch if r.own && t.scope.no_settings => "PyTorch's defaults (no settings recorded)",
                        RowKind::Pytorch if r.own => "PyTorch setting (snapshot's own)",
                        RowKind::Pytorch => "PyTorch setting",
                        RowKind::Compacting => "a compacting allocator",
                        RowKind::Host => "host strategy",
                    };
                    vec![
                        r.rank.to_string(),
                        r.setting.clone(),
                        kind.into(),
                        fmt_bytes(r.peak_reserved),
                        r.failed.to_string(),
                        r.min_capacity.map_or_else(|| "none".to_string(), fmt_bytes),
                        crate::explain::row_verdict(r, oom).into(),
                        r.note.clone().unwrap_or_default(),
                        r.why.clone().unwrap_or_default(),
                    ]
                })
                .collect();
            Table {
                caption: format!(
                    "{title}, ranked by the least GPU memory that replays the whole trace without a failed request \
                     (bisection at 2 MiB); failed = requests that fail at {}",
                    fmt_bytes(t.capacity.bytes)
                ),
                header: ["rank", "setting", "kind", "peak reserved", "failed", "min capacity", "", "note", "why tried"]
                    .map(String::from)
                    .to_vec(),
                rows,
            }
        })
        .collect()
}

pub(super) fn tune_parameters(trace: &Trace, dev: &DeviceTrace, capacity: &Capacity) -> Vec<(String, String)> {
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
        format!(
            "gpuheap tune: the trace replayed under a grid of PYTORCH_CUDA_ALLOC_CONF settings, the caching model \
             with compaction on OOM and every host strategy. The timeline replays {}, the best PyTorch setting and \
             the top-ranked row at the capacity.",
            crate::explain::tune::own_settings_words(t.scope.no_settings)
        ),
    );
    notes.splice(1..1, super::conclusion_notes(t));
    Ok(HtmlReport {
        title: title.to_string(),
        notes,
        parameters: tune_parameters(trace, dev, capacity),
        series,
        markers,
        tables: tune_tables(t, !dev.ooms.is_empty()),
    })
}
