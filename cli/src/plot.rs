//! Timeline plots of replays (plotters): allocated vs reserved bytes over the trace's events (top
//! panel) and external fragmentation (bottom panel), compaction points marked with red circles, and
//! PyTorch's own reserved bytes when the trace records segments.
//!
//! The format follows the file extension: `.svg` (text as SVG `<text>`) or `.png` (rasterised). Text
//! layout needs a TrueType font for its metrics (plotters' `ab_glyph` feature: no fontconfig or other
//! system library); one is looked up in the usual system font folders ([`FONT_PATHS`]). Without one the
//! plot is drawn without text and a note says so.

use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;

use gpuheap::replay::ReplayReport;

/// TrueType fonts tried, in order, for the plots' text.
pub const FONT_PATHS: [&str; 5] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
];

/// Registers a system font for plotters once; `true` when one was found.
fn font_available() -> bool {
    static FOUND: OnceLock<bool> = OnceLock::new();
    *FOUND.get_or_init(|| {
        for p in FONT_PATHS {
            if let Ok(bytes) = std::fs::read(p) {
                let leaked: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, leaked).is_ok() {
                    return true;
                }
            }
        }
        false
    })
}

/// Plot output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlotFormat {
    /// SVG.
    Svg,
    /// PNG.
    Png,
}

/// Why a plot cannot be written. `Display` is one line.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlotError {
    /// The path's extension names no format.
    #[error("{}: plot file must end in .svg or .png", .0.display())]
    Extension(std::path::PathBuf),
    /// Drawing or writing failed (plotters' error, as text: its errors are not `Send`).
    #[error("cannot draw the plot: {0}")]
    Draw(String),
}

impl PlotFormat {
    /// The format of `path` from its extension (`svg`, `png`; case-insensitive).
    ///
    /// # Errors
    /// [`PlotError::Extension`] for any other extension.
    pub fn of(path: &Path) -> Result<Self, PlotError> {
        match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
            Some("svg") => Ok(PlotFormat::Svg),
            Some("png") => Ok(PlotFormat::Png),
            _ => Err(PlotError::Extension(path.to_path_buf())),
        }
    }
}

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
    RGBColor(188, 189, 34),
];

const GIB: f64 = (1u64 << 30) as f64;
const MIB: f64 = (1u64 << 20) as f64;
const KIB: f64 = 1024.0;

/// The timeline of `reports` (one or more strategies over the same trace) as the bytes of a file in
/// `format`, and a note when the plot had to be drawn without text. Drawn in memory (plotters'
/// `SVGBackend::with_string`, `BitMapBackend::with_buffer` then the `png` encoder) rather than by
/// plotters' backends that open a path, so that the caller writes the bytes to the file it created
/// itself (`O_CREAT|O_EXCL`, [`crate::output::write_atomically`]): a path opened by name a second time
/// could meanwhile have become a link.
///
/// # Errors
/// [`PlotError::Draw`] when drawing or encoding fails.
pub fn render_timeline(
    format: PlotFormat,
    title: &str,
    reports: &[&ReplayReport],
) -> Result<(Vec<u8>, Option<String>), PlotError> {
    let (w, h) = (1200u32, 800u32);
    let text = font_available();
    let draw_err = |e: &dyn std::fmt::Display| PlotError::Draw(e.to_string());
    let bytes = match format {
        PlotFormat::Svg => {
            let mut svg = String::new();
            draw(SVGBackend::with_string(&mut svg, (w, h)).into_drawing_area(), title, reports, text)
                .map_err(|e| draw_err(&e))?;
            svg.into_bytes()
        }
        PlotFormat::Png => {
            // RGB, 3 bytes a pixel, as `BitMapBackend::with_buffer` draws.
            let mut rgb = vec![0u8; w as usize * h as usize * 3];
            draw(BitMapBackend::with_buffer(&mut rgb, (w, h)).into_drawing_area(), title, reports, text)
                .map_err(|e| draw_err(&e))?;
            let mut png_bytes = Vec::new();
            let mut enc = png::Encoder::new(&mut png_bytes, w, h);
            enc.set_color(png::ColorType::Rgb);
            enc.set_depth(png::BitDepth::Eight);
            let mut writer = enc.write_header().map_err(|e| draw_err(&e))?;
            writer.write_image_data(&rgb).map_err(|e| draw_err(&e))?;
            writer.finish().map_err(|e| draw_err(&e))?;
            png_bytes
        }
    };
    Ok((bytes, (!text).then(|| "no TrueType font found (see FONT_PATHS): the plot has no text".to_string())))
}

type DrawResult<T> = Result<T, Box<dyn std::error::Error>>;

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    title: &str,
    reports: &[&ReplayReport],
    text: bool,
) -> DrawResult<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    if reports.iter().all(|r| r.timeline.len() < 2) {
        return draw_final_state(root, title, reports, text);
    }
    let root = if text { root.titled(title, ("sans-serif", 22))? } else { root };
    let (top, bottom) = root.split_vertically((root.dim_in_pixel().1 as f64 * 0.68) as u32);
    let x_max = reports.iter().flat_map(|r| r.timeline.last()).map(|s| s.event + 1).max().unwrap_or(1) as f64;
    let peak = reports
        .iter()
        .flat_map(|r| r.timeline.iter())
        .map(|s| s.footprint.max(s.allocated).max(s.pytorch_reserved.unwrap_or(0)))
        .max()
        .unwrap_or(1)
        .max(1);
    // The byte axis in the largest binary unit that keeps the peak at or above 1.
    let (unit, unit_name) = [(GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")]
        .into_iter()
        .find(|(u, _)| peak as f64 >= *u)
        .unwrap_or((1.0, "bytes"));
    let y_max = peak as f64 / unit * 1.05;

    let label = if text { 60 } else { 0 };
    let mut c = ChartBuilder::on(&top);
    c.margin(10).x_label_area_size(label / 2).y_label_area_size(label + 20);
    let mut chart = c.build_cartesian_2d(0f64..x_max, 0f64..y_max)?;
    if text {
        chart
            .configure_mesh()
            .y_desc(unit_name)
            .x_desc("event")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .light_line_style(WHITE.mix(0.0))
            .draw()?;
    } else {
        chart.configure_mesh().disable_mesh().x_labels(0).y_labels(0).draw()?;
    }
    let first = reports.first().copied();
    if let Some(r) = first {
        let alloc: Vec<(f64, f64)> = r.timeline.iter().map(|s| (s.event as f64, s.allocated as f64 / unit)).collect();
        let s = chart.draw_series(LineSeries::new(alloc, BLACK.stroke_width(2)))?;
        if text {
            s.label("allocated (requested)").legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK));
        }
        if r.timeline.iter().any(|s| s.pytorch_reserved.is_some()) {
            let pt: Vec<(f64, f64)> =
                r.timeline.iter().map(|s| (s.event as f64, s.pytorch_reserved.unwrap_or(0) as f64 / unit)).collect();
            let gray = RGBColor(120, 120, 120);
            let s = chart.draw_series(LineSeries::new(pt, gray.stroke_width(2)))?;
            if text {
                s.label("PyTorch reserved (snapshot)")
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], gray));
            }
        }
    }
    for (k, r) in reports.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        let pts: Vec<(f64, f64)> = r.timeline.iter().map(|s| (s.event as f64, s.footprint as f64 / unit)).collect();
        let s = chart.draw_series(LineSeries::new(pts, color.stroke_width(1)))?;
        if text {
            s.label(format!("{} reserved", r.strategy))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
        }
        let marks: Vec<(f64, f64)> =
            r.compactions.iter().map(|c| (c.event as f64, c.footprint_after as f64 / unit)).collect();
        let m = chart.draw_series(marks.into_iter().map(|p| Circle::new(p, 5, RED.filled())))?;
        if text && k == 0 && !r.compactions.is_empty() {
            m.label("compaction (footprint after)").legend(|(x, y)| Circle::new((x + 9, y), 4, RED.filled()));
        }
    }
    if text {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 14))
            .draw()?;
    }

    let mut c = ChartBuilder::on(&bottom);
    c.margin(10).x_label_area_size(label / 2 + 10).y_label_area_size(label + 20);
    let mut chart = c.build_cartesian_2d(0f64..x_max, 0f64..1.0f64)?;
    if text {
        chart
            .configure_mesh()
            .y_desc("external fragmentation")
            .x_desc("event")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .light_line_style(WHITE.mix(0.0))
            .draw()?;
    } else {
        chart.configure_mesh().disable_mesh().x_labels(0).y_labels(0).draw()?;
    }
    for (k, r) in reports.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        let pts: Vec<(f64, f64)> = r.timeline.iter().map(|s| (s.event as f64, s.external)).collect();
        chart.draw_series(LineSeries::new(pts, color.stroke_width(1)))?;
        let marks: Vec<(f64, f64)> = r.compactions.iter().map(|c| (c.event as f64, c.external_after)).collect();
        chart.draw_series(marks.into_iter().map(|p| Circle::new(p, 4, RED.filled())))?;
    }
    root.present()?;
    Ok(())
}

/// The plot of a trace without allocation history (a snapshot of the final heap, one event): a line over
/// one event would be an empty chart, so the final state is drawn as bars instead: allocated bytes,
/// PyTorch's reserved bytes (snapshots) and each strategy's footprint (top), and each strategy's
/// external fragmentation (bottom).
fn draw_final_state<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    title: &str,
    reports: &[&ReplayReport],
    text: bool,
) -> DrawResult<()>
where
    DB::ErrorType: 'static,
{
    let title = format!("{title} — final state (the trace has no allocation history)");
    let root = if text { root.titled(&title, ("sans-serif", 22))? } else { root };
    let (top, bottom) = root.split_vertically((root.dim_in_pixel().1 as f64 * 0.68) as u32);
    let gray = RGBColor(120, 120, 120);
    // (name, bytes, colour) per bar.
    let mut bars: Vec<(String, u64, RGBColor)> = Vec::new();
    if let Some(r) = reports.first() {
        bars.push(("allocated".into(), r.at_end.allocated, BLACK));
        if let Some(pt) = &r.pytorch {
            bars.push(("PyTorch reserved".into(), pt.snapshot_reserved.unwrap_or(pt.end), gray));
        }
    }
    for (k, r) in reports.iter().enumerate() {
        bars.push((r.strategy.clone(), r.at_end.footprint, COLORS[k % COLORS.len()]));
    }
    let peak = bars.iter().map(|b| b.1).max().unwrap_or(1).max(1);
    let (unit, unit_name) = [(GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")]
        .into_iter()
        .find(|(u, _)| peak as f64 >= *u)
        .unwrap_or((1.0, "bytes"));
    let label = if text { 60 } else { 0 };
    let n = bars.len().max(1);
    let mut c = ChartBuilder::on(&top);
    c.margin(10).x_label_area_size(label / 2 + 10).y_label_area_size(label + 20);
    let mut chart = c.build_cartesian_2d(0f64..n as f64, 0f64..peak as f64 / unit * 1.1)?;
    if text {
        chart
            .configure_mesh()
            .y_desc(format!("{unit_name}: allocated, then reserved (footprint) at the end"))
            .x_labels(0)
            .light_line_style(WHITE.mix(0.0))
            .draw()?;
    } else {
        chart.configure_mesh().disable_mesh().x_labels(0).y_labels(0).draw()?;
    }
    chart.draw_series(
        bars.iter()
            .enumerate()
            .map(|(i, b)| Rectangle::new([(i as f64 + 0.15, 0.0), (i as f64 + 0.85, b.1 as f64 / unit)], b.2.filled())),
    )?;
    if text {
        let dy = peak as f64 / unit * 0.035;
        for (i, b) in bars.iter().enumerate() {
            let y = b.1 as f64 / unit;
            chart.draw_series([
                Text::new(b.0.clone(), (i as f64 + 0.1, y + 2.0 * dy), ("sans-serif", 12)),
                Text::new(format!("{:.2} {unit_name}", y), (i as f64 + 0.1, y + dy), ("sans-serif", 12)),
            ])?;
        }
    }
    let m = reports.len().max(1);
    let mut c = ChartBuilder::on(&bottom);
    c.margin(10).x_label_area_size(label / 2 + 10).y_label_area_size(label + 20);
    let mut chart = c.build_cartesian_2d(0f64..m as f64, 0f64..1.0f64)?;
    if text {
        chart.configure_mesh().y_desc("external fragmentation").x_labels(0).light_line_style(WHITE.mix(0.0)).draw()?;
    } else {
        chart.configure_mesh().disable_mesh().x_labels(0).y_labels(0).draw()?;
    }
    chart.draw_series(reports.iter().enumerate().map(|(k, r)| {
        Rectangle::new(
            [(k as f64 + 0.15, 0.0), (k as f64 + 0.85, r.at_end.external)],
            COLORS[k % COLORS.len()].filled(),
        )
    }))?;
    if text {
        for (k, r) in reports.iter().enumerate() {
            let y = (r.at_end.external + 0.06).min(0.88);
            chart.draw_series([
                Text::new(r.strategy.clone(), (k as f64 + 0.1, y + 0.08), ("sans-serif", 12)),
                Text::new(
                    format!("{:.3} ({})", r.at_end.external, r.at_end.level),
                    (k as f64 + 0.1, y),
                    ("sans-serif", 12),
                ),
            ])?;
        }
    }
    root.present()?;
    Ok(())
}
