//! The page of `gpuheap explain`.

use super::tune::{settings_timeline, tune_parameters, tune_tables, Timeline};
use crate::explain::{Explanation, Site, SiteOrigin, Verdict};
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
    if let Some(c) = &page.dump_caveat {
        notes.insert(1, c.clone());
    }
    if let Some(b) = &page.request_bounds {
        notes.push(crate::explain::bounds_sentence(b));
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
                    t.frames.iter().map(|f| format!("{} ({}:{})", f.name, f.path().path, f.line)).collect();
                vec![
                    fmt_bytes(t.block.size),
                    fmt_bytes(t.block.requested),
                    t.block.alloc_event.map_or_else(|| "before trace".into(), |e| format!("event {e}")),
                    if frames.is_empty() { site_cell(&t.site) } else { frames.join("; ") },
                ]
            })
            .collect(),
    });
    let b = &page.breakdown;
    if b.tensors > 0 {
        let rows = |groups: &[crate::explain::breakdown::Group], site: bool| -> Vec<Vec<String>> {
            groups
                .iter()
                .map(|g| {
                    let label = match (site, g.origin) {
                        (true, Some(o)) => site_cell(&Site { label: g.label.clone(), origin: o }),
                        _ => g.label.clone(),
                    };
                    let mut r =
                        vec![label, fmt_bytes(g.bytes), format!("{:.1} %", g.share_of_capacity), g.tensors.to_string()];
                    if site {
                        r.push(g.kind.label().into());
                    }
                    r
                })
                .collect()
        };
        tables.push(Table {
            caption: format!(
                "Live bytes by kind (inferred from the frames; share of the {} capacity)",
                fmt_bytes(b.capacity)
            ),
            header: ["kind", "bytes", "share", "tensors"].map(String::from).to_vec(),
            rows: rows(&b.by_kind, false),
        });
        let mut site_rows = rows(&b.by_site, true);
        if b.other_sites > 0 {
            site_rows.push(vec![
                format!("{} more sites", b.other_sites),
                fmt_bytes(b.other_bytes),
                String::new(),
                b.other_tensors.to_string(),
                String::new(),
            ]);
        }
        tables.push(Table {
            caption: "Live bytes by site (innermost user frame; PyTorch, library and C++ frames folded)".into(),
            header: ["site", "bytes", "share", "tensors", "kind (most bytes)"].map(String::from).to_vec(),
            rows: site_rows,
        });
        if let (Some(r), Some(m)) = (b.request, b.must_free.filter(|&m| m > 0)) {
            notes.push(format!(
                "For the failed {} request to fit, at least {} of the live bytes must go (with every cached byte released too).",
                fmt_bytes(r),
                fmt_bytes(m)
            ));
        }
    }
    if let Some(w) = &page.without {
        notes.push(format!(
            "Without {:?}: {} live tensors ({}) and {} allocations over the trace taken out; the run needs {} (with them: {}); {}.",
            w.patterns,
            w.live_tensors,
            fmt_bytes(w.live_bytes),
            w.allocations,
            w.min_capacity.map_or_else(|| "more than any device modelled".into(), fmt_bytes),
            w.min_capacity_before.map_or_else(|| "more than any device modelled".into(), fmt_bytes),
            if w.fits { format!("it fits on this GPU ({})", fmt_bytes(w.capacity)) } else { format!("it still does not fit on {}", fmt_bytes(w.capacity)) }
        ));
    }
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
        tables.extend(tune_tables(t, !page.ooms.is_empty()));
        let at = notes.len().min(1 + usize::from(page.dump_caveat.is_some()));
        notes.splice(at..at, super::conclusion_notes(t));
    }
    Ok(HtmlReport { title: title.to_string(), notes, parameters, series, markers, tables })
}

/// A site in a cell: its label, marked when it is not a user frame.
fn site_cell(site: &Site) -> String {
    match site.origin {
        SiteOrigin::User => site.label.clone(),
        SiteOrigin::Library => format!("{} (library)", site.label),
        SiteOrigin::Cpp => format!("allocated by {} (C++)", site.label),
        _ => crate::explain::breakdown::NO_FRAMES.into(),
    }
}
