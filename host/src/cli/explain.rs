//! `gpuheap explain TRACE [--device N] [--capacity C] [--no-tune] [--json]`: the answer page for a
//! snapshot of a run that died with "CUDA out of memory": what happened at the OOM (capacity or
//! fragmentation, with the numbers that decide it), the largest live tensors with the code that
//! allocated them, where the reserved-but-unallocated bytes sit, and the best allocator setting found
//! by `gpuheap tune`, as the `PYTORCH_CUDA_ALLOC_CONF=...` line to set.
//!
//! Bad input (an unreadable trace, a device the file lacks, sizes that cannot be represented) exits
//! with code 2 and one line on stderr.

use std::fmt::Write as _;
use std::path::PathBuf;

use gpuheap::explain::{
    self, Capacity, CapacitySource, DeviceChoice, DeviceReason, DeviceSummary, Explanation, Moment, OomExplanation,
    Verdict,
};
use gpuheap::replay::fmt_bytes;

use super::tune::{self as cli_tune, load_trace, parse_bytes_arg};
use super::CliError;

/// Arguments of `gpuheap explain`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// PyTorch memory snapshot (`torch.cuda.memory._dump_snapshot`), or any trace `replay` reads.
    pub trace: PathBuf,
    /// Device to explain (default: the one with a recorded OOM, else the most allocation events).
    #[arg(long)]
    pub device: Option<i64>,
    /// The GPU's memory: bytes or with a unit (80GiB). Default: PyTorch's reserved bytes at a recorded
    /// OOM plus the driver's free bytes then; else PyTorch's peak reserved bytes.
    #[arg(long, value_parser = parse_bytes_arg)]
    pub capacity: Option<u64>,
    /// Skip the settings search (`gpuheap tune`).
    #[arg(long)]
    pub no_tune: bool,
    /// Print a JSON report on stdout instead of the page.
    #[arg(long)]
    pub json: bool,
    /// Write a self-contained HTML report: interactive timeline, the tables, parameters.
    #[arg(long)]
    pub html: Option<PathBuf>,
}

pub fn run(a: &Args) -> Result<(), CliError> {
    a.html.as_deref().map(super::html::check_path).transpose()?;
    let trace = load_trace(&a.trace)?;
    let mut page = explain::explain(&trace, a.device, a.capacity).map_err(cli_tune::explain_error)?;
    if !a.no_tune {
        let dev = &trace.devices[page.device.index];
        page.tune = Some(cli_tune::search(&trace, dev, &page.capacity, a.json)?);
    }
    if let Some(p) = &a.html {
        let title = format!("{} — explain", super::replay::file_name(&a.trace));
        super::html::write(p, &super::html::explain_page(&title, &trace, &page)?)?;
    }
    if a.json {
        let s = serde_json::to_string_pretty(&page).map_err(|e| CliError::Runtime(e.to_string()))?;
        println!("{s}");
    } else {
        print!("{}", render(&page));
    }
    Ok(())
}

/// One line per device of the file.
pub(crate) fn devices_text(devices: &[DeviceSummary], choice: &DeviceChoice) -> String {
    let mut s = String::new();
    let opt = |v: Option<u64>| v.map_or_else(|| "over 2^64 B".to_string(), fmt_bytes);
    for d in devices {
        let mark = if d.device == choice.device { "*" } else { " " };
        let ooms = match d.recorded_ooms {
            0 => "no OOM recorded".to_string(),
            1 => "1 OOM recorded".to_string(),
            n => format!("{n} OOMs recorded"),
        };
        let _ = writeln!(
            s,
            " {mark} device {}: {}, {}, peak allocated {}, peak reserved {}, {ooms}{}",
            d.device,
            plural(d.events, "event"),
            plural(d.alloc_events, "allocation"),
            opt(d.peak_allocated),
            opt(d.peak_reserved),
            if d.events == 0 && d.final_blocks > 0 {
                format!(" (no history: the state when dumped, {} live blocks)", d.final_blocks)
            } else {
                String::new()
            }
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
pub(crate) fn capacity_text(c: &Capacity) -> String {
    let why = match c.source {
        CapacitySource::Given => "given with --capacity".into(),
        _ => c.describe(),
    };
    format!("capacity {} ({} B): {why}", fmt_bytes(c.bytes), c.bytes)
}

/// `1 segment`, `2 segments`.
pub(crate) fn plural(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        "0.0 %".into()
    } else {
        format!("{:.1} %", part as f64 * 100.0 / whole as f64)
    }
}

fn oom_text(o: &OomExplanation) -> String {
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
    let verdict = match o.verdict {
        Verdict::Capacity => format!(
            "capacity: the GPU was full. Even with every cached byte released and compacted, only {} would be free \
             (driver {} + holes {}), {} short of the {} request. No allocator setting or defragmentation helps: the \
             step needs less memory (smaller batch, activation checkpointing, lower precision) or a larger GPU.",
            fmt_bytes(free),
            fmt_bytes(o.device_free.unwrap_or(0)),
            fmt_bytes(o.reserved_unallocated),
            fmt_bytes(o.shortfall),
            fmt_bytes(o.request)
        ),
        Verdict::Fragmentation => format!(
            "fragmentation: the memory was there, but in pieces. {} was free in total (driver {} + holes {}) >= the \
             {} request > the largest free extent {}. Releasing or compacting the cached holes (expandable \
             segments, max_split_size_mb, a compacting allocator) would have served it.",
            fmt_bytes(free),
            fmt_bytes(o.device_free.unwrap_or(0)),
            fmt_bytes(o.reserved_unallocated),
            fmt_bytes(o.request),
            fmt_bytes(largest)
        ),
        Verdict::Fits => format!(
            "the request ({}) is no larger than the largest free extent ({}); PyTorch still failed: it asks the \
             driver for a whole segment of {} when no cached block of the request's pool fits.",
            fmt_bytes(o.request),
            fmt_bytes(largest),
            fmt_bytes(o.segment_request)
        ),
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
        let _ = writeln!(
            s,
            "  Replay: the caching model with the snapshot's own settings on {} {what}.",
            fmt_bytes(r.capacity)
        );
    }
    s
}

/// The page.
pub(crate) fn render(p: &Explanation) -> String {
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
    let _ = writeln!(s, "{}", capacity_text(&p.capacity));
    s += "\n";
    for o in &p.ooms {
        s += &oom_text(o);
    }
    let d = p.device.device;
    let moment = match p.moment {
        Moment::RecordedOom => format!("At the OOM (event {}):", p.event.unwrap_or(0)),
        Moment::DumpedState => {
            let _ = writeln!(
                s,
                "The snapshot has no history on device {d}: only the allocator state when it was dumped (an OOM \
                 observer's dump records no request and no driver free bytes)."
            );
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
        let _ = writeln!(
            s,
            "With {} of GPU memory ({} free on the device): a request up to {} fits; one up to {} fails for \
             fragmentation (the bytes are there, in pieces); a larger one fails for capacity.",
            fmt_bytes(b.capacity),
            fmt_bytes(b.device_free),
            fmt_bytes(b.fits_up_to),
            fmt_bytes(b.fragmentation_up_to)
        );
    }
    if !p.largest_tensors.is_empty() {
        s += "\nLargest live tensors:\n";
        let _ = writeln!(s, "  {:>12} {:>12}  {:<14} top user frames", "block", "requested", "allocated at");
        for t in &p.largest_tensors {
            let at = t.block.alloc_event.map_or_else(|| "before trace".to_string(), |e| format!("event {e}"));
            let frames = if t.frames.is_empty() {
                "(no frames recorded)".to_string()
            } else {
                t.frames.iter().map(|f| format!("{}:{} {}", f.filename, f.line, f.name)).collect::<Vec<_>>().join(" < ")
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
        if p.moment == Moment::DumpedState {
            s += "The dump records no request: below, a setting \"fits\" when it holds the dumped live tensors in the \
                  capacity, and its minimum capacity is what they need under it; the difference to PyTorch's \
                  reserved bytes is headroom the failed request would have had.\n";
        }
        s += &cli_tune::table(t, !p.ooms.is_empty());
    }
    s
}
