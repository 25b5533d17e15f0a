//! The page of `gpuheap replay`.

use super::{compactions_table, failed_table, markers_of, pytorch_series, replay_parameters, series_of};
use crate::html::{HtmlReport, Table};
use crate::replay::render::ev;
use crate::replay::ReplayReport;
use crate::units::{fmt_bytes, pct};

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
                    format!("{} (event {})", fmt_bytes(r.peak_reserved), ev(r.peak_reserved_event)),
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
                format!("at peak (event {})", ev(p.event)),
                format!("at end (event {})", ev(e.event)),
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
