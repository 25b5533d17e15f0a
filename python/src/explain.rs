//! `explain` and `tune` bindings (`gpuheap explain --json`, `gpuheap tune --json`).
//!
//! Built with the cargo feature `explain`, which needs the library's `gpuheap::explain` module (the
//! explain/tune work, not yet on main when this was written). Without the feature the Python
//! functions `gpuheap.explain` and `gpuheap.tune` raise NotImplementedError.

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::prelude::*;
use serde::Serialize;

use gpuheap::explain::{self, ExplainError};
use gpuheap::replay;
use gpuheap::trace::Trace;

use super::{detached, to_json, ConfigError, Failure, Snapshot};

fn explain_failure(e: ExplainError) -> Failure {
    match e {
        ExplainError::Trace(e) => Failure::Trace(e.to_string()),
        ExplainError::Input(m) => Failure::Config(m),
        ExplainError::Replay(e) => e.into(),
    }
}

fn opt_bytes(what: &str, s: Option<&str>) -> PyResult<Option<u64>> {
    s.map(|s| replay::parse_bytes(s).map_err(|e| ConfigError::new_err(format!("{what}: {e}")))).transpose()
}

/// A snapshot loaded from memory, written to a temporary file for the length of a call (removed on
/// drop): `explain` reads the snapshot file again for the stack frames of the largest tensors.
struct TempFile(PathBuf);

impl TempFile {
    fn write(bytes: &[u8]) -> Result<TempFile, Failure> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("gpuheap-{}-{n}.pickle", std::process::id()));
        std::fs::write(&p, bytes)
            .map_err(|e| Failure::Backend(format!("cannot write the snapshot to {}: {e}", p.display())))?;
        Ok(TempFile(p))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Runs `f` on `trace` with a `source` that names a readable file: the trace itself when it was read
/// from one, else a copy whose source is a temporary file holding `bytes`. Messages name the original
/// source (`<dict>`, `<bytes>`), not the temporary file.
fn with_source_file<T>(
    trace: &Trace,
    bytes: Option<&[u8]>,
    f: impl FnOnce(&Trace) -> Result<T, Failure>,
) -> Result<T, Failure> {
    let Some(bytes) = bytes else { return f(trace) };
    let tmp = TempFile::write(bytes)?;
    let copy = Trace { source: tmp.0.clone(), ..trace.clone() };
    let (tmp_name, name) = (tmp.0.display().to_string(), trace.source.display().to_string());
    f(&copy).map_err(|e| match e {
        Failure::Trace(m) => Failure::Trace(m.replace(&tmp_name, &name)),
        Failure::Config(m) => Failure::Config(m.replace(&tmp_name, &name)),
        Failure::Backend(m) => Failure::Backend(m.replace(&tmp_name, &name)),
    })
}

/// `gpuheap explain --json` (with `tune`: the settings search too, as the CLI without `--no-tune`).
#[pyfunction]
#[pyo3(signature = (snapshot, device, capacity, tune))]
pub(crate) fn explain_json(
    py: Python<'_>,
    snapshot: &Snapshot,
    device: Option<i64>,
    capacity: Option<&str>,
    tune: bool,
) -> PyResult<String> {
    let (trace, bytes) = (Arc::clone(&snapshot.trace), snapshot.bytes.clone());
    let capacity = opt_bytes("capacity", capacity)?;
    detached(py, move || {
        with_source_file(&trace, bytes.as_deref(), |t| {
            let mut page = explain::explain(t, device, capacity).map_err(explain_failure)?;
            if tune {
                let dev = &t.devices[page.device.index];
                page.tune = Some(explain::tune::tune(t, dev, &page.capacity, &|| {}).map_err(explain_failure)?);
            }
            page.trace = trace.source.display().to_string();
            to_json(&page)
        })
    })
}

/// The JSON object of `gpuheap tune --json`, plus the trace's `format`. The device choice is under
/// `device_choice`: the CLI's object names it `device`, a key the flattened report repeats (its
/// device ordinal), so a JSON reader keeps only the ordinal.
#[derive(Serialize)]
struct TuneOutput<'a> {
    trace: String,
    format: String,
    devices: Vec<explain::DeviceSummary>,
    device_choice: explain::DeviceChoice,
    gpu_capacity: Option<u64>,
    recorded_ooms: usize,
    wall_s: f64,
    #[serde(flatten)]
    tune: &'a explain::tune::TuneReport,
}

/// `gpuheap tune --json`: the settings search over one device.
#[pyfunction]
#[pyo3(signature = (snapshot, device, capacity))]
pub(crate) fn tune_json(
    py: Python<'_>,
    snapshot: &Snapshot,
    device: Option<i64>,
    capacity: Option<&str>,
) -> PyResult<String> {
    let trace = Arc::clone(&snapshot.trace);
    let capacity = opt_bytes("capacity", capacity)?;
    detached(py, move || {
        let devices = explain::summarize(&trace);
        let choice = explain::choose_device(&trace, &devices, device).map_err(Failure::Config)?;
        let dev = &trace.devices[choice.index];
        let trace_err = |e: gpuheap::trace::TraceError| Failure::Trace(e.to_string());
        let cap = explain::capacity_from_evidence(&trace, dev, capacity).map_err(trace_err)?;
        let gpu = explain::gpu_capacity_at_oom(&trace, dev).map_err(trace_err)?.map(|c| c.bytes);
        let t = std::time::Instant::now();
        let report = explain::tune::tune(&trace, dev, &cap, &|| {}).map_err(explain_failure)?;
        to_json(&TuneOutput {
            trace: trace.source.display().to_string(),
            format: trace.format.to_string(),
            devices,
            device_choice: choice,
            gpu_capacity: gpu,
            recorded_ooms: dev.ooms.len(),
            wall_s: t.elapsed().as_secs_f64(),
            tune: &report,
        })
    })
}
