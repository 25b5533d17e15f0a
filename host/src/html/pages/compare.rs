//! The page of `gpuheap compare`.

use super::{compactions_table, failed_table, markers_of, pytorch_series, replay_parameters, series_of};
use crate::html::{HtmlReport, Series, Table};
use crate::replay::compare::Comparison;
use crate::replay::ReplayReport;
use crate::units::{fmt_bytes, pct};

/// The page of `gpuheap compare` (every strategy of `cmp`). `demand`: the trace's peak of live requested
/// bytes ([`crate::facts::demand_peak`]).
pub fn compare_page(title: &str, cmp: &Comparison, demand: u64) -> HtmlReport {
    let reports: Vec<&ReplayReport> = cmp.strategies.iter().collect();
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
            let count = |c: &str| r.failed.iter().filter(|f| f.class == c).count();
            let (cap, frag, rnd) = (count("capacity"), count("fragmentation"), count("rounding"));
            let failed = if rnd > 0 {
                format!("{cap} / {frag} / {} (+{rnd} rounding)", r.failed.len() - cap - frag - rnd)
            } else {
                format!("{cap} / {frag} / {}", r.failed.len() - cap - frag)
            };
            vec![
                r.strategy.clone(),
                fmt_bytes(r.peak_allocated),
                fmt_bytes(r.peak_reserved),
                pct(r.utilisation),
                format!("{:.3}", r.johnstone_wilson),
                failed,
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
    rows.extend(cmp.not_run.iter().map(|n| vec![n.strategy.clone(), format!("not run: {}", n.reason)]));
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
    tables.extend(failed_table(&reports));
    tables.extend(compactions_table(&reports));
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
