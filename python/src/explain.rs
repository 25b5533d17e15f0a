//! `explain` and `tune` bindings (`gpuheap explain --json`, `gpuheap tune --json`): each returns the
//! library's report as JSON and its text page as the library renders it
//! ([`gpuheap::explain::Explanation::render_text`], [`gpuheap::explain::tune::TunePage::render_text`]),
//! the same page the command line prints.

use std::sync::Arc;

use pyo3::prelude::*;

use gpuheap::explain::{self, ExplainError};
use gpuheap::trace::Trace;

use super::{detached, to_json, ConfigError, Failure, Snapshot};

fn explain_failure(e: ExplainError) -> Failure {
    match e {
        ExplainError::Trace(e) => Failure::Trace(e.to_string()),
        ExplainError::Replay(e) => e.into(),
        e => Failure::Config(e.to_string()),
    }
}

/// The file name of the trace's source, for a page title.
fn file_name(trace: &gpuheap::trace::Trace) -> String {
    trace.source.file_name().map_or_else(|| trace.source.display().to_string(), |n| n.to_string_lossy().into_owned())
}

fn render_html(r: &gpuheap::html::HtmlReport) -> Result<String, Failure> {
    r.render().map_err(|e| Failure::Backend(format!("cannot render the HTML report: {e}")))
}

fn opt_bytes(what: &str, s: Option<&str>) -> PyResult<Option<u64>> {
    s.map(|s| gpuheap::units::parse_bytes(s).map_err(|e| ConfigError::new_err(format!("{what}: {e}")))).transpose()
}

/// `gpuheap explain --json` (with `tune`: the settings search too, as the CLI without `--no-tune`):
/// `(json, text, tune_text, html)`: the report, its page, the settings table alone (`None` without the
/// search), and the self-contained HTML page of `gpuheap explain --html` ([`gpuheap::html::pages`]).
#[pyfunction]
#[pyo3(signature = (snapshot, device, capacity, tune))]
pub(crate) fn explain_json(
    py: Python<'_>,
    snapshot: &Snapshot,
    device: Option<i64>,
    capacity: Option<&str>,
    tune: bool,
) -> PyResult<(String, String, Option<String>, String)> {
    let (trace, bytes) = (Arc::clone(&snapshot.trace), snapshot.bytes.clone());
    let capacity = opt_bytes("capacity", capacity)?;
    detached(py, move || {
        // The stack frames come from the bytes the snapshot was parsed from (no second read of its file,
        // which may have changed since or be a pipe).
        let t: &Trace = &trace;
        {
            let mut page =
                explain::explain_with_bytes(t, bytes.as_deref(), device, capacity).map_err(explain_failure)?;
            if tune {
                let dev = &t.devices[page.device.index];
                page.tune = Some(explain::tune::tune(t, dev, &page.capacity, &|| {}).map_err(explain_failure)?);
            }
            page.trace = trace.source.display().to_string();
            let tune_text = page.tune.as_ref().map(|r| r.render_table(!page.ooms.is_empty()));
            let html = gpuheap::html::pages::explain_page(&format!("{} — explain", file_name(&trace)), t, &page)?;
            Ok((to_json(&page)?, page.render_text(), tune_text, render_html(&html)?))
        }
    })
}

/// `gpuheap tune --json` over one device: `(json, text, html)` (`html`: the page of `gpuheap tune
/// --html`). The JSON is the CLI's object (the device
/// ordinal under `device`, the choice and its reason under `device_choice`) plus the trace's
/// `format`. `settings`: keep only the rows with these labels ([`explain::tune::TuneReport::retain_settings`]).
#[pyfunction]
#[pyo3(signature = (snapshot, device, capacity, settings))]
pub(crate) fn tune_json(
    py: Python<'_>,
    snapshot: &Snapshot,
    device: Option<i64>,
    capacity: Option<&str>,
    settings: Option<Vec<String>>,
) -> PyResult<(String, String, String)> {
    let trace = Arc::clone(&snapshot.trace);
    let capacity = opt_bytes("capacity", capacity)?;
    detached(py, move || {
        let mut page = explain::tune::tune_page(&trace, device, capacity, &|| {}).map_err(explain_failure)?;
        if let Some(s) = &settings {
            page.tune.retain_settings(s).map_err(explain_failure)?;
        }
        let mut v =
            serde_json::to_value(&page).map_err(|e| Failure::Backend(format!("cannot serialise the report: {e}")))?;
        if let Some(o) = v.as_object_mut() {
            o.insert("format".into(), page.format.clone().into());
        }
        let dev = &trace.devices[page.device.index];
        let html = gpuheap::html::pages::tune_page(
            &format!("{} — tune", file_name(&trace)),
            &trace,
            dev,
            &page.tune,
            &page.tune.capacity,
        )?;
        Ok((to_json(&v)?, page.render_text(), render_html(&html)?))
    })
}
