//! The pages of the reports: an [`HtmlReport`](crate::html::HtmlReport) built from a replay ([`replay_page`]), a comparison
//! ([`compare_page`]), an explanation ([`explain_page`]) or a settings search ([`tune_page`]). The CLI's
//! `--html FILE` and the Python package's notebook view (`_repr_html_`) render the same pages.
//!
//! Timeline series: a replay's samples ([`crate::replay::Sample`]: the maxima of allocated and
//! reserved bytes over a bucket of events, the external fragmentation at its end); PyTorch's own
//! reserved bytes as one more series when the snapshot records segments. `tune` and `explain` keep no
//! timeline of their own (their replays are bisections): the page replays the snapshot's own setting and
//! the best one found at the capacity, as `tune` replays a row (recorded OOM requests tried where they
//! failed, events numbered as in the file: [`crate::explain::tune::RowTrace`]).
//!
//! One file per page (`replay`, `compare`, `tune`, `explain`); this module holds what they share: the
//! series, markers, parameters and tables of replays.

use crate::replay::render::ev;
use crate::replay::{MeasureOutcome, ReplayReport};
use crate::trace::DeviceTrace;
use crate::units::{fmt_bytes, fmt_ns};

use super::{Marker, MarkerKind, Point, Series, Table};

mod compare;
mod explain;
mod replay;
mod tune;

pub use compare::compare_page;
pub use explain::explain_page;
pub use replay::replay_page;
pub use tune::tune_page;

/// Failed requests marked per series (the tables and `--json` list every one).
const MAX_FAILED_MARKERS: usize = 1000;

/// The timeline series of a replay: reserved = the strategy's footprint.
pub(super) fn series_of(r: &ReplayReport, name: String, map: Option<&[usize]>) -> Series {
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
pub(super) fn pytorch_series(r: &ReplayReport, map: Option<&[usize]>) -> Option<Series> {
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
pub(super) fn markers_of(r: &ReplayReport, k: usize, map: Option<&[usize]>) -> Vec<Marker> {
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
pub(super) fn recorded_oom_markers(dev: &DeviceTrace) -> Vec<Marker> {
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

/// The parameters shared by every replay of one run.
pub(super) fn replay_parameters(r: &ReplayReport) -> Vec<(String, String)> {
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

pub(super) fn failed_table(reports: &[&ReplayReport]) -> Option<Table> {
    let rows: Vec<Vec<String>> = reports
        .iter()
        .flat_map(|r| {
            r.failed.iter().take(100).map(move |f| {
                vec![
                    r.strategy.clone(),
                    ev(f.event),
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

pub(super) fn compactions_table(reports: &[&ReplayReport]) -> Option<Table> {
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

/// The notes of a settings search's conclusion: its headline and lines, worded once in the page model
/// ([`crate::explain::tune::TuneReport`]) and given as the text page gives them.
fn conclusion_notes(t: &crate::explain::tune::TuneReport) -> Vec<String> {
    t.conclusion
        .scope
        .iter()
        .cloned()
        .chain(std::iter::once(t.conclusion.headline.clone()))
        .chain(t.conclusion.lines.iter().cloned())
        .collect()
}

#[cfg(test)]
mod tests {
    use crate::explain::best_setting_lines;

    /// The pages give the recommended setting with the PyTorch versions that read each of its keys, and
    /// PyTorch's defaults in words.
    #[test]
    fn best_setting_lines_name_the_versions_of_each_key() {
        let lines = best_setting_lines("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,max_split_size_mb:129");
        assert_eq!(lines[0], "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,max_split_size_mb:129");
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines[1].starts_with("`expandable_segments:True` is read by PyTorch 2.1 and later"), "{lines:?}");
        assert!(lines[2].starts_with("`max_split_size_mb:129` is read by PyTorch"), "{lines:?}");
        assert_eq!(
            best_setting_lines("PYTORCH_CUDA_ALLOC_CONF="),
            ["PyTorch's defaults (PYTORCH_CUDA_ALLOC_CONF unset)"]
        );
    }
}
