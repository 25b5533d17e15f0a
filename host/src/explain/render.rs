//! The text pages of `gpuheap explain` and `gpuheap tune` ([`Explanation::render_text`],
//! [`TunePage::render_text`], also their `Display`), rendered from the same fields as their JSON: the
//! command line and the Python package print these.

use std::fmt::{self, Write as _};

use super::breakdown::{Breakdown, NO_FRAMES};
use super::tune::{RowKind, TunePage, TuneReport};
use super::{Explanation, Moment, OomExplanation, Site, SiteOrigin, Verdict, WithoutReport};
use crate::facts::{Capacity, CapacitySource, DeviceChoice, DeviceReason, DeviceSummary};
use crate::reference::caching::{options, ConfigWarning};
use crate::units::{fmt_bytes, pct_of as pct};

/// One line per [`ConfigWarning`] of the snapshot's allocator settings ("" without any).
#[doc(hidden)]
pub fn warnings_text(warnings: &[ConfigWarning]) -> String {
    let mut s = String::new();
    for w in warnings {
        let _ = writeln!(s, "warning: {w}");
    }
    s
}

/// [`warnings_text`] of the [`ConfigWarning`]s of `dev`'s recorded allocator settings
/// ([`crate::reference::caching::config_for_trace`]), then one line per live block its history contradicts
/// ([`crate::facts::blocks_outside_segments`]); "" without any.
#[doc(hidden)]
pub fn settings_warnings_text(dev: &crate::trace::DeviceTrace) -> String {
    warnings_text(&crate::reference::caching::config_for_trace(dev, 0).1) + &history_warnings_text(dev)
}

/// One `warning:` line per live block `dev`'s history contradicts ("" without any).
fn history_warnings_text(dev: &crate::trace::DeviceTrace) -> String {
    let mut s = String::new();
    for b in crate::facts::blocks_outside_segments(dev) {
        let _ = writeln!(s, "warning: {b}");
    }
    s
}

/// One line per device of the file.
#[doc(hidden)]
pub fn devices_text(devices: &[DeviceSummary], choice: &DeviceChoice) -> String {
    let mut s = String::new();
    let opt = |v: Option<u64>| v.map_or_else(|| "over 2^64 B".to_string(), fmt_bytes);
    for d in devices {
        let mark = if d.device == choice.device { "*" } else { " " };
        let ooms = match d.recorded_ooms {
            0 => "no OOM recorded".to_string(),
            1 => "1 OOM recorded".to_string(),
            n => format!("{n} OOMs recorded"),
        };
        if d.events == 0 && d.final_blocks > 0 {
            // No history: the figures are those of the dumped state, not peaks.
            let _ = writeln!(
                s,
                " {mark} device {}: no history (no event recorded): when dumped, {} live blocks, allocated {}, \
                 reserved {} (no peak is recorded), {ooms}",
                d.device,
                d.final_blocks,
                opt(d.peak_allocated),
                opt(d.peak_reserved),
            );
            continue;
        }
        let _ = writeln!(
            s,
            " {mark} device {}: {}, {}, peak allocated {}, peak reserved {}, {ooms}",
            d.device,
            plural(d.events, "event"),
            plural(d.alloc_events, "allocation"),
            opt(d.peak_allocated),
            opt(d.peak_reserved),
        );
    }
    let why = match choice.reason {
        DeviceReason::Given => "as asked",
        DeviceReason::RecordedOom => "it has a recorded OOM",
        DeviceReason::MostAllocations => "it has the most allocation events",
        DeviceReason::FinalState => "no device has allocation events; it holds the most live blocks",
    };
    let others = if choice.others.is_empty() {
        String::new()
    } else {
        let o: Vec<String> = choice.others.iter().map(i64::to_string).collect();
        format!("; the file also has device {} (pick one with --device N)", o.join(", "))
    };
    let _ = writeln!(s, "device {} is reported ({why}){others}", choice.device);
    s
}

/// The capacity and where it comes from, in words.
#[doc(hidden)]
pub fn capacity_text(c: &Capacity) -> String {
    let why = match c.source {
        CapacitySource::Given => "given with --capacity".into(),
        _ => c.describe(),
    };
    format!("capacity {} ({} B): {why}", fmt_bytes(c.bytes), c.bytes)
}

/// `1 segment`, `2 segments`.
fn plural(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

fn oom_text(o: &OomExplanation, own: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "OOM at event {}: a request of {} failed.", o.event, fmt_bytes(o.request));
    let _ = writeln!(
        s,
        "  PyTorch had reserved {} and allocated {}: {} reserved but unallocated (largest hole {}){}",
        fmt_bytes(o.reserved),
        fmt_bytes(o.allocated),
        fmt_bytes(o.reserved_unallocated),
        fmt_bytes(o.largest_hole),
        match (o.device_free, o.capacity) {
            (Some(f), Some(c)) =>
                format!("; the driver had {} free; the GPU's memory: {}.", fmt_bytes(f), fmt_bytes(c)),
            _ => "; the driver's free bytes are not recorded.".into(),
        }
    );
    let (free, largest) = (o.free_total.unwrap_or(0), o.largest_extent.unwrap_or(0));
    // The holes the verdict counts are those of the request's own pool (`facts::usable_holes`): the free
    // total less the driver's bytes, not every pool's reserved-but-unallocated bytes.
    let holes = free.saturating_sub(o.device_free.unwrap_or(0));
    let verdict = match o.verdict {
        Verdict::Capacity => {
            format!(
            "capacity: the GPU was full. Even with every cached byte released and compacted, only {} would be free \
             (driver {} + holes {}), {} short of the {} request. No allocator setting or defragmentation helps: the \
             step needs less memory (smaller batch, activation checkpointing, lower precision) or a larger GPU.",
            fmt_bytes(free),
            fmt_bytes(o.device_free.unwrap_or(0)),
            fmt_bytes(holes),
            fmt_bytes(o.shortfall),
            fmt_bytes(o.request)
        ) + if o.reserved == 0 {
                " PyTorch had reserved nothing: the GPU's memory was held outside its cache (another process, or this \
             process's CUDA context and other libraries)."
            } else {
                ""
            }
        }
        Verdict::Fragmentation => format!(
            "fragmentation: the memory was there, but in pieces. {} was free in total (driver {} + holes {}) >= the \
             {} request > the largest free extent {}. Releasing or compacting the cached holes (expandable \
             segments, max_split_size_mb, a compacting allocator) would have served it.",
            fmt_bytes(free),
            fmt_bytes(o.device_free.unwrap_or(0)),
            fmt_bytes(holes),
            fmt_bytes(o.request),
            fmt_bytes(largest)
        ),
        Verdict::Fits => {
            let mut v = format!(
                "the request ({}) is no larger than the largest free extent ({}); PyTorch still failed: ",
                fmt_bytes(o.request),
                fmt_bytes(largest)
            );
            let driver = o.device_free.unwrap_or(0);
            // Said only as the numbers stand: a hole of the request's pool that holds it is named, not denied.
            if o.largest_pool_hole >= o.request {
                let _ = write!(
                    v,
                    "a cached hole of the request's pool holds it by size ({}), but PyTorch takes a cached block \
                     only of the request's size class (small up to 1 MiB, else large) and stream, and a block \
                     above max_split_size only for a request as large; ",
                    fmt_bytes(o.largest_pool_hole)
                );
            } else {
                v += "no cached hole of the request's pool holds it; ";
            }
            if o.segment_request > driver {
                let _ = write!(
                    v,
                    "it asks the driver for a whole segment of {}, more than the {} free.",
                    fmt_bytes(o.segment_request),
                    fmt_bytes(driver)
                );
            } else {
                let _ = write!(
                    v,
                    "the segment of {} it asks the driver for is within the {} free, so the driver refused it for \
                     a reason of its own (a memory fraction, another process).",
                    fmt_bytes(o.segment_request),
                    fmt_bytes(driver)
                );
            }
            v
        }
        Verdict::Undetermined => format!(
            "undetermined: the driver's free bytes are not recorded (give the GPU's memory with --capacity); the \
             cached holes alone hold {}, the largest {}.",
            fmt_bytes(o.reserved_unallocated),
            fmt_bytes(o.largest_hole)
        ),
    };
    let _ = writeln!(s, "  Verdict: {verdict}");
    if let Some(r) = &o.replay {
        let what = match (r.reproduced, r.first_failure) {
            (true, _) => "fails this request too: the OOM is reproduced".to_string(),
            (false, Some(e)) => format!("fails earlier, at event {e}: the model differs from PyTorch there"),
            (false, None) => "serves this request: the OOM is not reproduced".to_string(),
        };
        let _ = writeln!(s, "  Replay: the caching model with {own} on {} {what}.", fmt_bytes(r.capacity));
    }
    s
}

impl Explanation {
    /// The page `gpuheap explain` prints (and `str()` of the Python report): the same fields as the
    /// JSON, in words.
    pub fn render_text(&self) -> String {
        render(self)
    }
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&render(self))
    }
}

fn render(p: &Explanation) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "trace {} ({})", p.trace, p.format);
    s += &devices_text(&p.devices, &p.device);
    match p.allocator_settings.as_deref() {
        Some("") => s += "allocator settings: PyTorch's defaults (PYTORCH_CUDA_ALLOC_CONF unset)\n",
        Some(e) => {
            let _ = writeln!(s, "allocator settings: PYTORCH_CUDA_ALLOC_CONF={e}");
        }
        None => {}
    }
    s += &warnings_text(&p.warnings);
    for b in &p.history.blocks_outside_segments {
        let _ = writeln!(s, "warning: {b}");
    }
    let _ = writeln!(s, "{}", capacity_text(&p.capacity));
    s += "\n";
    for o in &p.ooms {
        s += &oom_text(o, super::tune::own_settings_words(p.allocator_settings.is_none()));
    }
    if p.ooms_not_explained > 0 {
        let _ = writeln!(
            s,
            "{} more recorded OOM events are not explained one by one (the first {} are).\n",
            p.ooms_not_explained,
            p.ooms.len()
        );
    }
    let d = p.device.device;
    let moment = match p.moment {
        Moment::RecordedOom => format!("At the OOM (event {}):", p.event.unwrap_or(0)),
        Moment::DumpedState => {
            let _ = writeln!(s, "{}", p.dump_caveat.as_deref().unwrap_or_default());
            "In that state:".into()
        }
        Moment::PeakReserved => {
            let at = p.event.map_or_else(|| "before the first event".to_string(), |e| format!("after event {e}"));
            let _ = writeln!(s, "No OOM is recorded on device {d}; below, the moment of peak reserved memory ({at}).");
            "At that moment:".into()
        }
        Moment::PeakAllocated => {
            let at = p.event.map_or_else(|| "before the first event".to_string(), |e| format!("after event {e}"));
            let _ = writeln!(
                s,
                "No OOM and no reserved bytes are recorded on device {d}; below, the moment of peak live bytes ({at})."
            );
            "At that moment:".into()
        }
    };
    if p.moment == Moment::PeakAllocated {
        let _ = writeln!(s, "{moment} {} live in {}.", fmt_bytes(p.allocated), plural(p.live_blocks, "block"));
    } else {
        let _ = writeln!(
            s,
            "{moment} PyTorch reserved {} in {} and allocated {} in {} ({} requested); {} ({} of \
             reserved) reserved but unallocated, the largest hole {}.",
            fmt_bytes(p.reserved),
            plural(p.segments, "segment"),
            fmt_bytes(p.allocated),
            plural(p.live_blocks, "block"),
            fmt_bytes(p.requested),
            fmt_bytes(p.reserved_unallocated),
            pct(p.reserved_unallocated, p.reserved),
            fmt_bytes(p.largest_hole)
        );
    }
    if let Some(b) = &p.request_bounds {
        let _ = writeln!(s, "{}", crate::explain::bounds_sentence(b));
    }
    if !p.largest_tensors.is_empty() {
        s += "\nLargest live tensors:\n";
        let _ = writeln!(s, "  {:>12} {:>12}  {:<14} top user frames", "block", "requested", "allocated at");
        for t in &p.largest_tensors {
            let at = t.block.alloc_event.map_or_else(|| "before trace".to_string(), |e| format!("event {e}"));
            let frames = if t.frames.is_empty() {
                site_text(&t.site)
            } else {
                t.frames.iter().map(super::breakdown::frame_label).collect::<Vec<_>>().join(" < ")
            };
            let _ = writeln!(
                s,
                "  {:>12} {:>12}  {:<14} {frames}",
                fmt_bytes(t.block.size),
                fmt_bytes(t.block.requested),
                at
            );
        }
    }
    s += &breakdown_text(&p.breakdown);
    if let Some(w) = &p.without {
        s += &without_text(w, super::tune::own_settings_words(p.allocator_settings.is_none()));
    }
    if !p.segments_with_holes.is_empty() {
        s += "\nWhere the reserved-but-unallocated bytes sit (segments with the most):\n";
        for g in &p.segments_with_holes {
            let mut holes: Vec<String> = g.holes.iter().take(4).map(|h| fmt_bytes(h.size)).collect();
            if g.holes.len() > 4 {
                holes.push("...".into());
            }
            let _ = writeln!(
                s,
                "  segment {:#x} ({} pool{}, {}): {} free in {} ({})",
                g.addr,
                g.pool,
                if g.expandable { ", expandable" } else { "" },
                fmt_bytes(g.size),
                fmt_bytes(g.hole_bytes()),
                if g.holes.len() == 1 { "1 hole".to_string() } else { format!("{} holes", g.holes.len()) },
                holes.join(", ")
            );
        }
    }
    if let Some(t) = &p.tune {
        s += "\n";
        s += &t.render_table(!p.ooms.is_empty());
    }
    s
}

impl TuneReport {
    /// The ranked table and the best setting's `PYTORCH_CUDA_ALLOC_CONF` line; `oom`: the trace records
    /// an OOM (rows that fit are then marked "would have avoided the OOM").
    pub fn render_table(&self, oom: bool) -> String {
        table(self, oom)
    }
}

impl TunePage {
    /// The page `gpuheap tune` prints (and `str()` of the Python result).
    pub fn render_text(&self) -> String {
        let mut s = format!("trace {} ({})\n", self.trace, self.format);
        s += &devices_text(&self.devices, &self.device);
        s += &warnings_text(&self.tune.warnings);
        s += &capacity_text(&self.tune.capacity);
        let _ =
            writeln!(s, "\n{} settings, {} replays in {:.1} s", self.tune.rows.len(), self.tune.replays, self.wall_s);
        s += "\n";
        s += &table(&self.tune, self.recorded_ooms > 0);
        s
    }
}

impl fmt::Display for TunePage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render_text())
    }
}

/// The ranked tables (PyTorch settings, then gpuheap's own strategies, ranked apart) and the search's
/// conclusion ([`TuneReport`]'s, worded once for every form of the page); `oom`: the trace records an OOM
/// (rows that fit are then marked "would have avoided the OOM").
fn table(t: &TuneReport, oom: bool) -> String {
    let mut s = String::new();
    if let Some(scope) = &t.conclusion.scope {
        let _ = writeln!(s, "{scope}");
    }
    let _ = writeln!(
        s,
        "Settings ranked by the least GPU memory that replays the whole trace without a failed request \
         (bisection at 2 MiB); failed = requests that fail at {}.",
        fmt_bytes(t.capacity.bytes)
    );
    for (title, pytorch) in super::tune::ROW_GROUPS {
        let member = |k: RowKind| (k == RowKind::Pytorch) == pytorch;
        if !t.rows.iter().any(|r| member(r.kind)) {
            continue;
        }
        let _ = writeln!(s, "{title}:");
        let _ =
            writeln!(s, "{:>4}  {:<64} {:>11} {:>7} {:>13}", "rank", "setting", "peak resv", "failed", "min capacity");
        for r in t.rows.iter().filter(|r| member(r.kind)) {
            let kind = match r.kind {
                RowKind::Pytorch if r.own && t.scope.no_settings => " [defaults: no settings recorded]",
                RowKind::Pytorch if r.own => " [snapshot's own]",
                RowKind::Pytorch => "",
                RowKind::Compacting => " [a compacting allocator]",
                RowKind::Host => " [host strategy]",
            };
            let label = format!("{}{kind}", r.setting);
            let min = r.min_capacity.map_or_else(|| "none".to_string(), fmt_bytes);
            let mut mark = format!("  {}", row_verdict(r, oom)).trim_end().to_string();
            if let Some(n) = &r.note {
                mark += &format!(" ({n})");
            }
            let _ = writeln!(
                s,
                "{:>4}  {:<64} {:>11} {:>7} {:>13}{mark}",
                r.rank,
                label,
                fmt_bytes(r.peak_reserved),
                r.failed,
                min
            );
        }
    }
    let tried: Vec<&super::tune::TuneRow> = t.rows.iter().filter(|r| r.why.is_some()).collect();
    if !tried.is_empty() {
        s += "\nWhy each PyTorch setting was tried (where it changes a decision for this trace's requests):\n";
        for r in tried {
            let _ = writeln!(s, "  {}: {}", r.setting, r.why.as_deref().unwrap_or_default());
        }
    }
    if let Some(f) = t.rows.iter().find_map(|r| r.memory_fraction) {
        let _ = writeln!(
            s,
            "\nRows with garbage_collection_threshold also set a per-process memory fraction ({f:?}): PyTorch collects \
             only with one (c10/cuda/CUDACachingAllocator.cpp, malloc: `set_fraction && \
             garbage_collection_threshold() > 0`). {}.",
            options::key_support("per_process_memory_fraction", &f.to_string()).unwrap_or_default()
        );
    }
    let _ = writeln!(s, "\n{}", t.conclusion.headline);
    for line in &t.conclusion.lines {
        let _ = writeln!(s, "  {line}");
    }
    s
}

/// The verdict of one row as every page gives it ("" when it does not fit).
pub(crate) fn row_verdict(r: &super::tune::TuneRow, oom: bool) -> &'static str {
    match (r.min_capacity, r.fits, oom) {
        (None, _, _) => "not run",
        (Some(_), true, true) => "would have avoided the OOM",
        (Some(_), true, false) => "fits",
        (Some(_), false, _) => "",
    }
}

/// The best PyTorch setting `env` (a `PYTORCH_CUDA_ALLOC_CONF=…` line, [`TuneReport::best_env`]) as the
/// text and HTML pages give it: the line (or "PyTorch's defaults" when it sets nothing), then for each key
/// the PyTorch versions that read it ([`options::env_support`]).
pub(crate) fn best_setting_lines(env: &str) -> Vec<String> {
    if env.trim_end() == "PYTORCH_CUDA_ALLOC_CONF=" {
        return vec!["PyTorch's defaults (PYTORCH_CUDA_ALLOC_CONF unset)".to_string()];
    }
    std::iter::once(env.to_string()).chain(options::env_support(env).into_iter().map(|l| format!("{l}."))).collect()
}

/// A site in words: its label, marked when it is not a user frame.
fn site_text(site: &Site) -> String {
    match site.origin {
        SiteOrigin::User => site.label.clone(),
        SiteOrigin::Library => format!("{} (library; no user frame)", site.label),
        SiteOrigin::Cpp => format!("allocated by {} (C++; no Python frame)", site.label),
        _ => NO_FRAMES.into(),
    }
}

/// `12.5 %` of a share in percent.
fn share(p: f64) -> String {
    format!("{p:.1} %")
}

/// The live bytes by site and by kind, and what must go for the failed request ("" without live tensors).
fn breakdown_text(b: &Breakdown) -> String {
    let mut s = String::new();
    if b.tensors == 0 {
        return s;
    }
    let _ = writeln!(
        s,
        "\nWhat holds the memory: {} in {} ({} of the {} capacity); {} with frames recorded.",
        fmt_bytes(b.bytes),
        plural(b.tensors, "live tensor"),
        share(if b.capacity == 0 { 0.0 } else { b.bytes as f64 * 100.0 / b.capacity as f64 }),
        fmt_bytes(b.capacity),
        b.tensors_with_frames
    );
    s += "  By kind (inferred from the frames):\n";
    for g in &b.by_kind {
        let _ =
            writeln!(s, "  {:>12} {:>7} {:>8}  {}", fmt_bytes(g.bytes), share(g.share_of_capacity), g.tensors, g.label);
    }
    s += "  By site (innermost user frame; PyTorch, library and C++ frames folded):\n";
    for g in &b.by_site {
        let site = Site { label: g.label.clone(), origin: g.origin.unwrap_or(SiteOrigin::None) };
        let _ = writeln!(
            s,
            "  {:>12} {:>7} {:>8}  {} [{}]",
            fmt_bytes(g.bytes),
            share(g.share_of_capacity),
            g.tensors,
            site_text(&site),
            g.kind.label()
        );
    }
    if b.other_sites > 0 {
        let _ = writeln!(
            s,
            "  {:>12} {:>7} {:>8}  {} more sites",
            fmt_bytes(b.other_bytes),
            share(if b.capacity == 0 { 0.0 } else { b.other_bytes as f64 * 100.0 / b.capacity as f64 }),
            b.other_tensors,
            b.other_sites
        );
    }
    match (b.request, b.must_free) {
        (Some(r), Some(0)) => {
            let _ = writeln!(
                s,
                "  The failed {} request needs no live tensor to go: the bytes were there (see the verdict).",
                fmt_bytes(r)
            );
        }
        (Some(r), Some(m)) => {
            let _ = writeln!(
                s,
                "  For the failed {} request to fit, at least {} of these must go (with every cached byte \
                 released too); try `gpuheap explain --without SITE` with a site above.",
                fmt_bytes(r),
                fmt_bytes(m)
            );
        }
        _ => {}
    }
    s
}

/// The what-if of `--without` in words: "the N tensors from SITE hold X; without them the run needs Y
/// and fits on this GPU".
fn without_text(w: &WithoutReport, own: &str) -> String {
    let mut s = String::new();
    let sites: Vec<String> = match &w.sites[..] {
        [(l, _)] => vec![l.clone()],
        many => many.iter().map(|(l, n)| format!("{l} ({n} allocations)")).collect(),
    };
    let need = |m: Option<u64>| m.map_or_else(|| "more than any device modelled".to_string(), fmt_bytes);
    let verdict = if w.fits {
        format!(
            "fits on this GPU ({}){}",
            fmt_bytes(w.capacity),
            if w.recorded_oom { ": the OOM goes away" } else { "" }
        )
    } else {
        format!(
            "still does not fit on {}: {} fail, the first at event {}",
            fmt_bytes(w.capacity),
            plural(w.failed_at_capacity, "request"),
            w.first_failure.map_or_else(|| "?".to_string(), |e| e.to_string())
        )
    };
    let _ = writeln!(
        s,
        "\nWithout {}: the {} from {} hold {} at the moment ({} over the trace, {} requested); without them the \
         run needs {} (with them: {}) and {verdict}. (The caching model with {own}, the \
         trace replayed without those allocations and their frees.)",
        w.patterns.iter().map(|p| format!("{p:?}")).collect::<Vec<_>>().join(", "),
        plural(w.live_tensors, "live tensor"),
        sites.join(", "),
        fmt_bytes(w.live_bytes),
        plural(w.allocations, "allocation"),
        fmt_bytes(w.allocated_bytes),
        need(w.min_capacity),
        need(w.min_capacity_before)
    );
    s
}
