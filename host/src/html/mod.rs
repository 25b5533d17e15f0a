//! Self-contained HTML reports: one file that opens in any browser without network access, with an
//! interactive timeline of allocated and reserved bytes per strategy or setting, the report's tables and
//! the run's parameters.
//!
//! The page is rendered from [`HtmlReport`], a small data model that knows nothing of the replay's
//! internals: the CLI builds one from a replay, a comparison, an explanation or a settings search. The
//! tables and parameters are rendered here as HTML (escaped); the timeline is drawn in the browser by an
//! inline script (SVG, no library, no CDN) from the report's data, embedded in the page as JSON in a
//! `<script type="application/json">` element (every `<`, `>` and `&` in it written as a `\u` escape,
//! so no string in the data can close the element or open another).
//!
//! # Downsampling
//! A series longer than [`MAX_PAGE_POINTS`] points is downsampled for the page ([`downsample`]): the
//! points are cut into consecutive buckets and each bucket keeps its first and last point and the points
//! with the least and the most allocated and reserved bytes (up to six points per bucket, in event
//! order), so every peak and trough of both lines is on the page. The page says when a series was
//! downsampled and from how many points. Markers beyond [`MAX_PAGE_MARKERS`] per series and kind are
//! left off the timeline (the page says how many); the tables keep them.
//!
//! # Self-check
//! Opened with the fragment `#selftest`, the page writes what it drew into a `<pre id="gpuheap-selftest">`
//! element as JSON: per series the data points behind the lines and the tooltip, the lines' vertices
//! mapped back to bytes and fragmentation through the inverse scales, the markers drawn, the tooltip
//! text at the first series' peak, and every script error caught. The headless-browser test
//! (`cli/tests/html_report.rs`) reads it with `chromium --dump-dom`.

pub mod pages;

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

/// Most points of one series drawn on the page; longer series are [`downsample`]d.
pub const MAX_PAGE_POINTS: usize = 1200;

/// Most markers of one kind drawn per series (the rest are counted on the page).
pub const MAX_PAGE_MARKERS: usize = 200;

/// The timeline script (drawn in the browser from the embedded JSON).
const SCRIPT: &str = include_str!("report.js");
/// The page's style sheet.
const STYLE: &str = include_str!("report.css");

/// What one page shows.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HtmlReport {
    /// Page title (also the `<title>`).
    pub title: String,
    /// Paragraphs of plain text under the title (what the report is, how to read it).
    pub notes: Vec<String>,
    /// The run's parameters as (name, value) pairs, in order.
    pub parameters: Vec<(String, String)>,
    /// Timeline series: one per strategy or setting, over the same event axis.
    pub series: Vec<Series>,
    /// Points marked on the timeline (failed requests, compactions).
    pub markers: Vec<Marker>,
    /// Tables under the timeline, in order.
    pub tables: Vec<Table>,
}

/// One line pair of the timeline (allocated and reserved bytes) and its fragmentation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Series {
    /// Legend name (a strategy or a setting).
    pub name: String,
    /// Samples in increasing event order.
    pub points: Vec<Point>,
}

/// One timeline sample. Bytes are drawn exactly up to 2^53 (JavaScript numbers).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// Event index in the trace (the x axis).
    pub event: u64,
    /// Requested bytes live, bytes.
    pub allocated: u64,
    /// Reserved bytes (the allocator's footprint), bytes.
    pub reserved: u64,
    /// External fragmentation `1 − largest free extent / free bytes` in [0, 1]; `None` where the
    /// series has no such figure (then the fragmentation panel has no line for it).
    pub fragmentation: Option<f64>,
}

/// What a [`Marker`] marks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MarkerKind {
    /// A request that failed (out of memory), replayed or recorded.
    Oom,
    /// A compaction.
    Compaction,
}

/// A point marked on the timeline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Marker {
    /// Index into [`HtmlReport::series`] of the series it belongs to; `None`: the trace itself (e.g. an
    /// OOM PyTorch recorded).
    pub series: Option<usize>,
    /// Event index (x).
    pub event: u64,
    /// Kind.
    pub kind: MarkerKind,
    /// Height in bytes; `None`: the series' reserved bytes at the nearest sample (or the top of the
    /// panel without a series).
    pub bytes: Option<u64>,
    /// Hover text.
    pub label: String,
}

/// A table of text cells.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Table {
    /// Caption above the table.
    pub caption: String,
    /// Column names.
    pub header: Vec<String>,
    /// Rows of cells (a row may be shorter than the header).
    pub rows: Vec<Vec<String>>,
}

/// Downsamples `points` to at most `max` points (`max` is raised to 6 at least): consecutive buckets
/// each keep their first and last point and those with the least and most `allocated` and `reserved`
/// bytes (the first such point on ties), in event order. Returns `points` unchanged when it has at most
/// `max` points. Every returned point is one of `points`; the overall extremes of both byte figures are
/// always kept.
pub fn downsample(points: &[Point], max: usize) -> Vec<Point> {
    const PER_BUCKET: usize = 6;
    let max = max.max(PER_BUCKET);
    if points.len() <= max {
        return points.to_vec();
    }
    let size = points.len().div_ceil(max / PER_BUCKET);
    let mut out = Vec::with_capacity(max);
    for chunk in points.chunks(size) {
        let arg = |key: fn(&Point) -> u64, most: bool| {
            let mut best = 0;
            for (i, p) in chunk.iter().enumerate() {
                let (k, b) = (key(p), key(&chunk[best]));
                if (most && k > b) || (!most && k < b) {
                    best = i;
                }
            }
            best
        };
        let mut keep = [
            0,
            chunk.len() - 1,
            arg(|p| p.allocated, false),
            arg(|p| p.allocated, true),
            arg(|p| p.reserved, false),
            arg(|p| p.reserved, true),
        ];
        keep.sort_unstable();
        let mut last = None;
        for i in keep {
            if last != Some(i) {
                out.push(chunk[i]);
                last = Some(i);
            }
        }
    }
    out
}

/// A note as HTML: escaped, its `` `code` `` spans (the settings and calls the text pages quote so) as
/// `<code>`; a note with an odd number of backticks is escaped as it is.
fn note_html(n: &str) -> String {
    if n.matches('`').count() % 2 != 0 {
        return escape(n);
    }
    n.split('`')
        .enumerate()
        .map(|(i, part)| if i % 2 == 1 { format!("<code>{}</code>", escape(part)) } else { escape(part) })
        .collect()
}

/// Escapes text for HTML element content and attribute values.
pub fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

/// JSON for a `<script type="application/json">` element: `<`, `>`, `&` and the line separators
/// U+2028/U+2029 written as `\u` escapes (they only occur inside JSON strings, where the escape means
/// the same character), so the text can never contain `</script>` or `<!--`.
fn script_json(v: &impl Serialize) -> Result<String, serde_json::Error> {
    let s = serde_json::to_string(v)?;
    let mut o = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        match c {
            '<' => o.push_str("\\u003c"),
            '>' => o.push_str("\\u003e"),
            '&' => o.push_str("\\u0026"),
            '\u{2028}' => o.push_str("\\u2028"),
            '\u{2029}' => o.push_str("\\u2029"),
            c => o.push(c),
        }
    }
    Ok(o)
}

/// The data the script draws: the report's series downsampled and markers capped for the page.
#[derive(Serialize)]
struct PageData<'a> {
    series: Vec<PageSeries<'a>>,
    markers: Vec<&'a Marker>,
}

#[derive(Serialize)]
struct PageSeries<'a> {
    name: &'a str,
    /// Points in the report before downsampling.
    source_points: usize,
    points: Vec<Point>,
}

impl HtmlReport {
    /// Renders the page: one self-contained HTML document (inline style and script, no external
    /// resource). Non-finite fragmentation values are drawn as missing.
    ///
    /// # Errors
    /// Only if the data cannot be serialised to JSON (it always can: kept for the signature's honesty
    /// towards `serde_json`).
    pub fn render(&self) -> Result<String, serde_json::Error> {
        let mut notes_downsampled = Vec::new();
        let series: Vec<PageSeries<'_>> = self
            .series
            .iter()
            .map(|s| {
                let mut points = downsample(&s.points, MAX_PAGE_POINTS);
                for p in &mut points {
                    p.fragmentation = p.fragmentation.filter(|f| f.is_finite());
                }
                if points.len() < s.points.len() {
                    notes_downsampled.push(format!("{}: {} of {} points", s.name, points.len(), s.points.len()));
                }
                PageSeries { name: &s.name, source_points: s.points.len(), points }
            })
            .collect();
        let mut markers = Vec::new();
        let mut left_off = 0usize;
        let mut counts: Vec<(Option<usize>, MarkerKind, usize)> = Vec::new();
        for m in &self.markers {
            let n = match counts.iter_mut().find(|(s, k, _)| *s == m.series && *k == m.kind) {
                Some(e) => {
                    e.2 += 1;
                    e.2
                }
                None => {
                    counts.push((m.series, m.kind, 1));
                    1
                }
            };
            if n <= MAX_PAGE_MARKERS {
                markers.push(m);
            } else {
                left_off += 1;
            }
        }
        let data = script_json(&PageData { series, markers })?;

        let mut h = String::with_capacity(data.len() + SCRIPT.len() + 16 * 1024);
        h += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
        h += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
        let _ = writeln!(h, "<meta name=\"generator\" content=\"gpuheap {}\">", env!("CARGO_PKG_VERSION"));
        let _ = writeln!(h, "<title>{}</title>", escape(&self.title));
        let _ = writeln!(h, "<style>\n{STYLE}</style>\n</head>\n<body>");
        let _ = writeln!(h, "<h1>{}</h1>", escape(&self.title));
        for n in &self.notes {
            let _ = writeln!(h, "<p>{}</p>", note_html(n));
        }
        if !self.parameters.is_empty() {
            h += "<h2>Parameters</h2>\n<table class=\"params\">\n";
            for (k, v) in &self.parameters {
                let _ = writeln!(h, "<tr><th scope=\"row\">{}</th><td>{}</td></tr>", escape(k), escape(v));
            }
            h += "</table>\n";
        }
        h += "<h2>Timeline</h2>\n";
        if self.series.iter().all(|s| s.points.is_empty()) {
            h += "<p class=\"note\">The trace has no events to draw (a snapshot without history holds only the \
                  state when it was dumped): the tables below describe that state.</p>\n";
        }
        h += "<div id=\"legend\"></div>\n<div id=\"chart\"><noscript>The timeline needs JavaScript; the tables \
              below do not.</noscript></div>\n<div id=\"tooltip\" hidden></div>\n";
        h += "<p class=\"note\">Solid lines: reserved bytes; dashed: allocated (requested) bytes; lower panel: \
              external fragmentation 1 &minus; largest free extent / free bytes. Hover for the event, bytes and \
              fragmentation; click a legend entry to hide or show its series. &#9650; marks a failed request \
              (out of memory), &#9679; a compaction.</p>\n";
        if !notes_downsampled.is_empty() {
            let _ = writeln!(
                h,
                "<p class=\"note\" id=\"downsampled\">Downsampled for this page ({}): each bucket of consecutive \
                 samples keeps its first and last sample and those with the least and most allocated and reserved \
                 bytes, so every peak and trough is drawn.</p>",
                escape(&notes_downsampled.join("; "))
            );
        }
        if left_off > 0 {
            let _ = writeln!(
                h,
                "<p class=\"note\">{left_off} markers left off the timeline (at most {MAX_PAGE_MARKERS} per series \
                 and kind); the tables list them.</p>"
            );
        }
        for t in &self.tables {
            h += &table_html(t);
        }
        let _ = writeln!(h, "<script type=\"application/json\" id=\"gpuheap-data\">{data}</script>");
        let _ = writeln!(h, "<script>\n{SCRIPT}</script>\n</body>\n</html>");
        Ok(h)
    }
}

fn table_html(t: &Table) -> String {
    let mut h = String::new();
    let _ = writeln!(h, "<h2>{}</h2>\n<div class=\"scroll\"><table class=\"data\">", escape(&t.caption));
    if !t.header.is_empty() {
        h += "<thead><tr>";
        for c in &t.header {
            let _ = write!(h, "<th>{}</th>", escape(c));
        }
        h += "</tr></thead>\n";
    }
    h += "<tbody>\n";
    for r in &t.rows {
        h += "<tr>";
        for c in r {
            let _ = write!(h, "<td>{}</td>", escape(c));
        }
        h += "</tr>\n";
    }
    h += "</tbody></table></div>\n";
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_show_quoted_settings_as_code() {
        assert_eq!(
            note_html("`max_split_size_mb:129` is read <here>"),
            "<code>max_split_size_mb:129</code> is read &lt;here&gt;"
        );
        assert_eq!(note_html("one ` tick"), "one ` tick");
    }

    fn pts(v: &[(u64, u64)]) -> Vec<Point> {
        v.iter()
            .enumerate()
            .map(|(i, &(a, r))| Point { event: i as u64, allocated: a, reserved: r, fragmentation: Some(0.5) })
            .collect()
    }

    #[test]
    fn downsample_keeps_extremes_in_order_within_budget() {
        // A deterministic sawtooth (allocated never 0, so the dip at 777 is the unique minimum) with a spike
        // in reserved and a dip and a spike in allocated.
        let mut v: Vec<(u64, u64)> = (0..10_000u64).map(|i| (1 + i % 97 * 10, 5_000 + i % 89)).collect();
        v[4321].1 = 1_000_000;
        v[777].0 = 0;
        v[9000].0 = 99_999;
        let p = pts(&v);
        let d = downsample(&p, 600);
        assert!(d.len() <= 600, "{}", d.len());
        assert!(d.len() >= 300, "uses its budget: {}", d.len());
        assert!(d.windows(2).all(|w| w[0].event < w[1].event), "strictly increasing events");
        assert!(d.iter().all(|q| p[q.event as usize] == *q), "every point is an input point");
        for e in [4321, 777, 9000, 0, 9999] {
            assert!(d.iter().any(|q| q.event == e), "event {e} kept");
        }
        // Each bucket's max reserved is kept: the envelope is the same as the input's, bucket by bucket.
        let size = p.len().div_ceil(600 / 6);
        for (b, chunk) in p.chunks(size).enumerate() {
            let maxr = chunk.iter().map(|q| q.reserved).max().unwrap();
            let kept = d.iter().filter(|q| q.event as usize / size == b).map(|q| q.reserved).max().unwrap();
            assert_eq!(kept, maxr, "bucket {b}");
        }
        assert_eq!(downsample(&p[..500], 600), p[..500].to_vec(), "short series unchanged");
    }

    #[test]
    fn page_is_self_contained_and_script_safe() {
        let r = HtmlReport {
            title: "a </script><script>alert(1)</script> & b".into(),
            notes: vec!["<b>not bold</b>".into()],
            parameters: vec![("trace".into(), "x</script>.csv".into())],
            series: vec![Series { name: "best-fit </script>".into(), points: pts(&[(1, 2), (3, 4)]) }],
            markers: vec![Marker {
                series: Some(0),
                event: 1,
                kind: MarkerKind::Oom,
                bytes: None,
                label: "<!-- </script>".into(),
            }],
            tables: vec![Table { caption: "t".into(), header: vec!["<h>".into()], rows: vec![vec!["<c>".into()]] }],
        };
        let h = r.render().unwrap();
        // Exactly the page's own two script elements close; the data's `</script>` is escaped.
        assert_eq!(h.matches("</script>").count(), 2, "{h}");
        assert_eq!(h.matches("<script").count(), 2);
        assert!(!h.contains("<!-- "), "no comment opener from the data");
        assert!(h.contains("&lt;b&gt;not bold&lt;/b&gt;"));
        assert!(h.contains("<td>&lt;c&gt;</td>"));
        // No external resource: nothing is fetched.
        for needle in ["http://", "https://", "src=", "href=", "@import", "url("] {
            let hits: Vec<&str> =
                h.match_indices(needle).map(|(i, _)| &h[i.saturating_sub(40)..(i + 60).min(h.len())]).collect();
            // The SVG namespace URI is an identifier, not a fetch.
            assert!(hits.iter().all(|c| c.contains("http://www.w3.org/2000/svg")), "{needle}: {hits:?}");
        }
        // The embedded JSON parses back to the same data.
        let start = h.find("id=\"gpuheap-data\">").unwrap() + "id=\"gpuheap-data\">".len();
        let end = start + h[start..].find("</script>").unwrap();
        let v: serde_json::Value = serde_json::from_str(&h[start..end]).unwrap();
        assert_eq!(v["series"][0]["name"], "best-fit </script>");
        assert_eq!(v["markers"][0]["label"], "<!-- </script>");
        assert_eq!(v["series"][0]["points"][1]["reserved"], 4);
    }
}
