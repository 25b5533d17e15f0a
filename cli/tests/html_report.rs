//! The `--html FILE` reports, opened in headless Chromium: the page must run without a console message
//! or script error, and the timeline it draws must be the `--json` report's timeline (downsampled as
//! [`gpuheap::html::downsample`] documents), with the lines' vertices where the data puts them, one
//! marker per compaction and failed request, and a tooltip that names the event and the bytes.
//!
//! The page's own self-check (the `#selftest` fragment, see `gpuheap::html`) writes what it drew into
//! the DOM, which `chromium --dump-dom` prints. Without Chromium these tests print why and pass, unless
//! `GPUHEAP_REQUIRE_CHROMIUM=1` (`.ci/run` installs Debian's `chromium` and sets it). `GPUHEAP_CHROMIUM`
//! names another browser binary.
//!
//! The bad-path cases need no browser: one line, exit code 2, nothing written.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use gpuheap::html::{downsample, Point, MAX_PAGE_MARKERS, MAX_PAGE_POINTS};
use serde_json::Value;

#[path = "../../host/tests/common/mod.rs"]
mod common;
use common::workspace;

fn gpuheap(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpuheap"))
        .args(args)
        .current_dir(workspace())
        .env("GPUHEAP_BACKEND", "cpu")
        .output()
        .expect("runs")
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpuheap-html-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The browser binary, or `None` after printing why the browser part is skipped (a panic instead under
/// `GPUHEAP_REQUIRE_CHROMIUM=1`).
fn chromium(test: &str) -> Option<PathBuf> {
    let given = std::env::var_os("GPUHEAP_CHROMIUM").map(PathBuf::from);
    let found = given.or_else(|| {
        let path = std::env::var_os("PATH")?;
        ["chromium", "chromium-browser", "google-chrome", "google-chrome-stable"]
            .iter()
            .flat_map(|n| std::env::split_paths(&path).map(move |d| d.join(n)))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        let why = "no chromium on PATH (apt-get install chromium, or set GPUHEAP_CHROMIUM)";
        if std::env::var("GPUHEAP_REQUIRE_CHROMIUM").as_deref() == Ok("1") {
            panic!("{test}: GPUHEAP_REQUIRE_CHROMIUM=1 but {why}");
        }
        eprintln!("{test}: skipped: {why}");
    }
    found
}

/// What the page drew (its `#selftest` output) and Chromium's console lines.
struct Drawn {
    selftest: Value,
    console: Vec<String>,
}

/// Opens `page` in headless Chromium with the `#selftest` fragment and returns what it drew.
fn open(browser: &Path, page: &Path) -> Drawn {
    let profile = page.with_extension("profile");
    let url = format!("file://{}#selftest", page.canonicalize().unwrap().display());
    let mut child = Command::new(browser)
        .args([
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            "--no-first-run",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=10000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(&url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("chromium starts");
    // Read both pipes on threads (a full pipe would block the browser), with a time limit.
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut out, &mut s).ok();
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut err, &mut s).ok();
        s
    });
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if start.elapsed() > Duration::from_secs(180) {
            child.kill().ok();
            child.wait().ok();
            panic!("chromium did not finish within 180 s on {url}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let dom = t_out.join().unwrap();
    let stderr = t_err.join().unwrap();
    std::fs::remove_dir_all(&profile).ok();
    // Chromium logs every console message and uncaught error of the page as `...:CONSOLE...] "msg",
    // source: URL (line)`. The page logs nothing itself, so any such line is a failure.
    let console: Vec<String> = stderr.lines().filter(|l| l.contains(":CONSOLE")).map(String::from).collect();
    let key = "id=\"gpuheap-selftest\"";
    let at = dom.rfind(key).unwrap_or_else(|| panic!("no self-check in the DOM of {url}; console: {console:?}"));
    let open_end = at + dom[at..].find('>').unwrap() + 1;
    let close = open_end + dom[open_end..].find("</pre>").unwrap();
    let text = dom[open_end..close]
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&nbsp;", "\u{a0}")
        .replace("&amp;", "&");
    let selftest = serde_json::from_str(&text).unwrap_or_else(|e| panic!("self-check JSON: {e}: {text}"));
    Drawn { selftest, console }
}

fn no_errors(d: &Drawn, what: &str) {
    assert!(d.console.is_empty(), "{what}: console messages: {:#?}", d.console);
    assert_eq!(d.selftest["errors"], Value::Array(vec![]), "{what}: script errors caught by the page");
}

/// A JSON timeline sample as a page point (the report's reserved bytes are the strategy's footprint).
fn point(s: &Value) -> Point {
    Point {
        event: s["event"].as_u64().unwrap(),
        allocated: s["allocated"].as_u64().unwrap(),
        reserved: s["footprint"].as_u64().unwrap(),
        fragmentation: s["external"].as_f64(),
    }
}

/// The page's series `name` as points.
fn page_points(series: &Value) -> Vec<Point> {
    series["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| Point {
            event: p[0].as_u64().unwrap(),
            allocated: p[1].as_u64().unwrap(),
            reserved: p[2].as_u64().unwrap(),
            fragmentation: p[3].as_f64(),
        })
        .collect()
}

/// Checks one page series against the JSON report's timeline of the same strategy: the points are the
/// timeline downsampled by the documented rule (exactly), and the drawn vertices map back to them.
fn check_series(d: &Drawn, name: &str, timeline: &[Value]) {
    let s = d.selftest["series"].as_array().unwrap().iter().find(|s| s["name"] == name);
    let s = s.unwrap_or_else(|| panic!("series {name} on the page"));
    let json: Vec<Point> = timeline.iter().map(point).collect();
    let page = page_points(s);
    assert_eq!(s["source_points"].as_u64().unwrap() as usize, json.len(), "{name}: source points");
    assert_eq!(page, downsample(&json, MAX_PAGE_POINTS), "{name}: the page's points are the JSON timeline's");
    assert!(page.len() <= MAX_PAGE_POINTS);
    if let Some(peak) = json.iter().map(|p| p.reserved).max() {
        assert_eq!(page.iter().map(|p| p.reserved).max(), Some(peak), "{name}: the peak is drawn");
    }
    // The drawn lines: one vertex per point, mapped back through the inverse scales to within 0.1 % of
    // the axes' spans (the page writes pixel coordinates with two decimals).
    let y_top = d.selftest["y_top"].as_f64().unwrap();
    let span = d.selftest["series"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["points"].as_array().unwrap().iter().map(|p| p[0].as_f64().unwrap()))
        .fold((f64::MAX, f64::MIN), |(l, h), e| (l.min(e), h.max(e)));
    let xtol = ((span.1 - span.0).max(1.0)) * 1e-3;
    for (metric, value, ytol) in [
        ("reserved_vertices", (|p: &Point| p.reserved as f64) as fn(&Point) -> f64, y_top * 1e-3),
        ("allocated_vertices", |p: &Point| p.allocated as f64, y_top * 1e-3),
        ("fragmentation_vertices", |p: &Point| p.fragmentation.unwrap(), 1e-3),
    ] {
        let v = s[metric].as_array().unwrap();
        assert_eq!(v.len(), page.len(), "{name} {metric}: one vertex per point");
        for (p, xy) in page.iter().zip(v) {
            let (x, y) = (xy[0].as_f64().unwrap(), xy[1].as_f64().unwrap());
            assert!((x - p.event as f64).abs() <= xtol, "{name} {metric}: x {x} for event {}", p.event);
            assert!((y - value(p)).abs() <= ytol, "{name} {metric}: y {y} for {} at event {}", value(p), p.event);
        }
    }
}

fn markers_of_kind(d: &Drawn, kind: &str) -> usize {
    d.selftest["markers"].as_array().unwrap().iter().filter(|m| m["kind"] == kind).count()
}

fn tooltip_names_the_peak(d: &Drawn) {
    let s0 = d.selftest["series"].as_array().unwrap().iter().find(|s| !s["points"].as_array().unwrap().is_empty());
    let s0 = s0.expect("a series with points");
    let pts = page_points(s0);
    let peak = pts.iter().fold(pts[0], |a, p| if p.reserved > a.reserved { *p } else { a });
    let t = &d.selftest["tooltip"];
    assert_eq!(t["event"].as_u64(), Some(peak.event));
    let text = t["text"].as_str().unwrap();
    assert!(text.starts_with(&format!("event {}\n", peak.event)), "{text}");
    assert!(text.contains("reserved ") && text.contains(&format!("({} B)", peak.reserved)), "{text}");
    assert!(text.contains(&format!("({} B)", peak.allocated)), "{text}");
    let hover = d.selftest["hover_tooltip"].as_str().expect("a mouse move over the plot shows a tooltip");
    assert!(hover.starts_with("event "), "{hover}");
}

#[test]
fn compare_page_draws_the_json_timelines_with_compaction_and_oom_markers() {
    let Some(browser) = chromium("compare_page") else { return };
    let dir = temp_dir("compare");
    let html = dir.join("k.html");
    let out =
        gpuheap(&["compare", "data/K.1048576.csv", "--compact", "on-oom", "--json", "--html", html.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let d = open(&browser, &html);
    no_errors(&d, "compare");
    let strategies = v["strategies"].as_array().unwrap();
    let (mut compactions, mut failed) = (0, 0);
    for s in strategies {
        check_series(&d, s["strategy"].as_str().unwrap(), s["timeline"].as_array().unwrap());
        compactions += s["compactions"].as_array().unwrap().len().min(MAX_PAGE_MARKERS);
        failed +=
            s["failed"].as_array().unwrap().iter().filter(|f| !f["event"].is_null()).count().min(MAX_PAGE_MARKERS);
    }
    assert!(compactions > 0, "the trace compacts on OOM at its 1 MiB capacity");
    assert_eq!(markers_of_kind(&d, "compaction"), compactions);
    assert_eq!(markers_of_kind(&d, "oom"), failed);
    tooltip_names_the_peak(&d);
    let page = std::fs::read_to_string(&html).unwrap();
    for name in strategies.iter().map(|s| s["strategy"].as_str().unwrap()) {
        assert!(page.contains(&format!("<td>{name}</td>")), "the table has a row for {name}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn replay_page_of_a_long_snapshot_is_downsampled_as_documented() {
    let Some(browser) = chromium("replay_page") else { return };
    let dir = temp_dir("replay");
    let html = dir.join("r.html");
    let out = gpuheap(&[
        "replay",
        "data/decomfl_opt_zo_federated_memory.pickle",
        "--strategy",
        "best-fit",
        "--json",
        "--html",
        html.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let timeline = v["timeline"].as_array().unwrap();
    assert!(timeline.len() > MAX_PAGE_POINTS, "long enough to be downsampled: {}", timeline.len());
    let d = open(&browser, &html);
    no_errors(&d, "replay");
    check_series(&d, "best-fit", timeline);
    // PyTorch's own reserved bytes (the snapshot records segments) are drawn too.
    let pt = d.selftest["series"].as_array().unwrap().iter().find(|s| s["name"] == "PyTorch (snapshot)");
    let pt = page_points(pt.expect("PyTorch's series"));
    let want: Vec<Point> = timeline
        .iter()
        .map(|s| Point { reserved: s["pytorch_reserved"].as_u64().unwrap(), fragmentation: None, ..point(s) })
        .collect();
    assert_eq!(pt, downsample(&want, MAX_PAGE_POINTS));
    tooltip_names_the_peak(&d);
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("id=\"downsampled\""), "the page says it was downsampled");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn tune_and_explain_pages_render() {
    let Some(browser) = chromium("tune_and_explain_pages") else { return };
    let dir = temp_dir("tune");
    let html = dir.join("t.html");
    let out = gpuheap(&["tune", "data/decomfl_opt_zo_federated_memory.pickle", "--html", html.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let d = open(&browser, &html);
    no_errors(&d, "tune");
    let names: Vec<&str> =
        d.selftest["series"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert!(names.iter().any(|n| n.ends_with("[snapshot's own]")), "{names:?}");
    assert!(names.contains(&"expandable_segments:True"), "the best PyTorch setting: {names:?}");
    tooltip_names_the_peak(&d);
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("<td>expandable_segments:True</td>"), "the ranked table");

    // A snapshot without history: no timeline to draw, the page says so and still runs cleanly.
    let html = dir.join("e.html");
    let trace = "data/equivariant-posteriors_oom_snapshot_new.pickle";
    let out = gpuheap(&["explain", trace, "--no-tune", "--html", html.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let d = open(&browser, &html);
    no_errors(&d, "explain");
    assert!(d.selftest["series"].as_array().unwrap().iter().all(|s| s["points"].as_array().unwrap().is_empty()));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("no events to draw"));
    assert!(page.contains("Largest live tensors") && page.contains("<td>3.39 GiB</td>"), "the tensors table");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_html_path_exits_2_before_any_work_and_leaves_nothing() {
    let dir = temp_dir("bad");
    let missing = dir.join("no-such-folder").join("x.html");
    for (path, needle) in [(&missing, "does not exist"), (&dir, "is a directory")] {
        for cmd in [
            &["replay", "data/K.1048576.csv", "--strategy", "best-fit"][..],
            &["compare", "data/K.1048576.csv"][..],
            &["tune", "data/K.1048576.csv"][..],
            &["explain", "data/K.1048576.csv", "--no-tune"][..],
        ] {
            let mut args = cmd.to_vec();
            args.extend(["--html", path.to_str().unwrap()]);
            let out = gpuheap(&args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
            assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: one line: {err:?}");
            assert!(err.contains(path.to_str().unwrap()) && err.contains(needle), "{args:?}: {err}");
            assert!(out.stdout.is_empty(), "{args:?}: no report printed");
        }
    }
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert!(left.is_empty(), "nothing written: {left:?}");
    std::fs::remove_dir_all(&dir).ok();
}
