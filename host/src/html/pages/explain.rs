//! The page of `gpuheap explain`.

use super::tune::{settings_timeline, tune_parameters, tune_table, Timeline};
use crate::explain::{Explanation, Verdict};
use crate::html::{HtmlReport, Table};
use crate::replay::ReplayError;
use crate::trace::Trace;
use crate::units::fmt_bytes;

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
