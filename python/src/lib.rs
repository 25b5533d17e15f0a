//! `gpuheap._gpuheap`: the native half of the `gpuheap` Python package (PyO3, abi3): the front door
//! `gpuheap`'s front door (`gpuheap::run_explain`, …) with typed keyword arguments, mapped onto `gpuheap::Options` and nothing else.
//!
//! This module is private: the public API is the pure-Python package `gpuheap` (python/python/gpuheap),
//! which checks the types of its arguments and calls the functions here. Every function here:
//!
//! * releases the GIL for the work (reading, replaying), so other Python threads run meanwhile;
//! * returns the command's `Output` (the JSON `--json` prints, the text page, the HTML page, the
//!   title): the same function computes them for the command line, so both agree by construction;
//! * raises only the exceptions of `gpuheap._errors`, mapped from `gpuheap::Error`'s kind: `TraceError`
//!   for a trace that cannot be read, `ConfigError` for an option that does not fit, `BackendError` for
//!   a run-time failure, and `InternalError` for a bug, a panic included (caught, so that it never takes
//!   the interpreter down).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

use gpuheap::options::OptionError;
use gpuheap::{Options, Quiet};

/// The library's front door and its option parsers, under one name here.
mod app {
    pub(crate) use gpuheap::options::*;
    pub(crate) use gpuheap::{run_compare, run_explain, run_replay, run_tune, Output, Snapshot};
}
use gpuheap::backend::BackendChoice;
use gpuheap::{Error, ErrorKind};
use pyo3::prelude::*;

#[cfg(feature = "cli")]
mod cli;

pyo3::import_exception!(gpuheap._errors, TraceError);
pyo3::import_exception!(gpuheap._errors, ConfigError);
pyo3::import_exception!(gpuheap._errors, BackendError);
pyo3::import_exception!(gpuheap._errors, InternalError);

/// The Python exception of a front-door error.
fn py_err(e: Error) -> PyErr {
    match e.kind() {
        ErrorKind::Input if e.is_trace() => TraceError::new_err(e.to_string()),
        ErrorKind::Input => ConfigError::new_err(e.to_string()),
        ErrorKind::Runtime => BackendError::new_err(e.to_string()),
        _ => InternalError::new_err(e.to_string()),
    }
}

/// Runs `f` without the GIL, catching a panic as `gpuheap.InternalError`.
fn detached<T: Send>(py: Python<'_>, f: impl FnOnce() -> Result<T, Error> + Send) -> PyResult<T> {
    match py.detach(|| catch_unwind(AssertUnwindSafe(f))) {
        Ok(r) => r.map_err(py_err),
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(no message)".to_string());
            Err(InternalError::new_err(format!(
                "internal error in gpuheap (a Rust panic, caught): {what}; please report it with the input"
            )))
        }
    }
}

/// A trace read into memory (`gpuheap::Snapshot`); made by `gpuheap.load`, immutable and shared.
#[pyclass(frozen, module = "gpuheap", name = "Snapshot")]
struct Snapshot(app::Snapshot);

#[pymethods]
impl Snapshot {
    /// Where it was read from: the file path, `<bytes>` or `<dict>`.
    #[getter]
    fn source(&self) -> String {
        self.0.trace().source.display().to_string()
    }
    /// The format, as the CLI names it (e.g. "PyTorch memory snapshot").
    #[getter]
    fn format(&self) -> String {
        self.0.trace().format.to_string()
    }
    /// The device ordinals in the trace, ascending.
    #[getter]
    fn devices(&self) -> Vec<i64> {
        self.0.trace().devices.iter().map(|d| d.device).collect()
    }
    /// Number of events over all devices.
    #[getter]
    fn event_count(&self) -> usize {
        self.0.trace().event_count()
    }
    fn __repr__(&self) -> String {
        let (s, f, d, n) = (self.source(), self.format(), self.devices(), self.event_count());
        format!("<gpuheap.Snapshot {s:?}: {f}, devices {d:?}, {n} events>")
    }
}

/// What a command produced (`gpuheap::Output`).
#[pyclass(frozen, module = "gpuheap", name = "Output", get_all)]
struct Output {
    title: String,
    json: String,
    text: String,
    html: Option<String>,
    tune_table: Option<String>,
}

impl From<app::Output> for Output {
    fn from(o: app::Output) -> Self {
        Output { title: o.title, json: o.json, text: o.text, html: o.html, tune_table: o.tune_table }
    }
}

/// A byte count as Python gives it: an int, a float (`1.5e9`) or a str with a unit (`"80GiB"`).
#[derive(FromPyObject)]
enum Size {
    Int(u64),
    Float(f64),
    Str(String),
}

/// The tiered strategy's thresholds: `(SMALL_MAX, LARGE_MIN)` or `"SMALL_MAX,LARGE_MIN"`.
#[derive(FromPyObject)]
enum Tiers {
    Pair(Size, Size),
    Str(String),
}

type Check = fn(u64) -> Result<u64, OptionError>;
type Parse = fn(&str) -> Result<u64, OptionError>;

/// The byte-valued option `name` through its checker (a number) or its parser (a str).
fn size(name: &str, v: Option<Size>, check: Check, parse: Parse) -> PyResult<Option<u64>> {
    let bad = |e: OptionError| ConfigError::new_err(format!("{name}: {e}"));
    v.map(|v| match v {
        Size::Int(n) => check(n).map_err(bad),
        Size::Float(f) => gpuheap::units::bytes_of_float(f)
            .ok_or_else(|| bad(gpuheap::units::ParseError::OutOfRange(f.to_string()).into()))
            .and_then(|n| check(n).map_err(bad)),
        Size::Str(s) => parse(&s).map_err(bad),
    })
    .transpose()
}

/// A text option `name` through its parser.
fn text<T>(name: &str, v: Option<&str>, parse: fn(&str) -> Result<T, OptionError>) -> PyResult<Option<T>> {
    v.map(|s| parse(s).map_err(|e| ConfigError::new_err(format!("{name}: {e}")))).transpose()
}

/// The options every command shares, from the keyword arguments of the Python functions.
#[allow(clippy::too_many_arguments, reason = "the commands' keyword arguments, one each")]
fn options(
    capacity: Option<Size>,
    align: Option<Size>,
    tiers: Option<Tiers>,
    compact: Option<&str>,
    backend: Option<&str>,
    device: Option<i64>,
    materialize_limit: Option<Size>,
    device_heap_limit: Option<Size>,
) -> PyResult<Options> {
    let mut o = Options::default();
    o.capacity = size("capacity", capacity, app::check_capacity, app::parse_capacity)?;
    o.align = size("align", align, app::check_align, app::parse_align)?;
    o.tiers = match tiers {
        Some(Tiers::Pair(a, b)) => {
            let (a, b) = (size("tiers", Some(a), Ok, app::parse_bytes)?, size("tiers", Some(b), Ok, app::parse_bytes)?);
            let tiers = a.zip(b).map(|(a, b)| app::check_tiers(a, b));
            tiers.transpose().map_err(|e| ConfigError::new_err(format!("tiers: {e}")))?
        }
        Some(Tiers::Str(s)) => text("tiers", Some(&s), app::parse_tiers)?,
        None => None,
    };
    o.policy = text("compact", compact, app::parse_policy)?.unwrap_or(o.policy);
    o.backend = match text("backend", backend, app::parse_backend)? {
        Some(b) => b,
        None => BackendChoice::from_env().map_err(|e| ConfigError::new_err(format!("GPUHEAP_BACKEND: {e}")))?,
    };
    o.device = device;
    o.materialize_limit = size("materialize_limit", materialize_limit, Ok, app::parse_bytes)?;
    o.device_heap_limit = size("device_heap_limit", device_heap_limit, Ok, app::parse_bytes)?;
    o.html = true;
    Ok(o)
}

/// Reads the trace file at `path` (format detected from the content).
#[pyfunction]
fn load_path(py: Python<'_>, path: PathBuf) -> PyResult<Snapshot> {
    detached(py, move || app::Snapshot::read(&path).map(Snapshot))
}

/// Parses trace bytes (a pickle or a CSV); `name` stands for the file in messages (`<bytes>`, `<dict>`).
#[pyfunction]
fn load_bytes(py: Python<'_>, data: &[u8], name: &str) -> PyResult<Snapshot> {
    let name = PathBuf::from(name);
    detached(py, move || app::Snapshot::parse(&name, data).map(Snapshot))
}

/// `gpuheap replay`: one strategy over one device of the trace.
#[pyfunction]
#[pyo3(signature = (snapshot, strategy, *, capacity=None, align=None, tiers=None, compact="never", backend=None,
    device=None, materialize_limit=None))]
#[allow(clippy::too_many_arguments, reason = "the command's keyword arguments, one each")]
fn replay(
    py: Python<'_>,
    snapshot: &Snapshot,
    strategy: &str,
    capacity: Option<Size>,
    align: Option<Size>,
    tiers: Option<Tiers>,
    compact: &str,
    backend: Option<&str>,
    device: Option<i64>,
    materialize_limit: Option<Size>,
) -> PyResult<Output> {
    let mut o = options(capacity, align, tiers, Some(compact), backend, device, materialize_limit, None)?;
    o.strategy = text("strategy", Some(strategy), app::parse_strategy)?;
    let snap = snapshot.0.clone();
    detached(py, move || app::run_replay(&snap, &o, &Quiet).map(Output::from))
}

/// `gpuheap compare`: every host strategy, then the device allocator, over the same device.
#[pyfunction]
#[pyo3(signature = (snapshot, *, capacity=None, align=None, tiers=None, compact="never", backend=None,
    device=None, materialize_limit=None, device_heap_limit=None, verbose=false))]
#[allow(clippy::too_many_arguments, reason = "the command's keyword arguments, one each")]
fn compare(
    py: Python<'_>,
    snapshot: &Snapshot,
    capacity: Option<Size>,
    align: Option<Size>,
    tiers: Option<Tiers>,
    compact: &str,
    backend: Option<&str>,
    device: Option<i64>,
    materialize_limit: Option<Size>,
    device_heap_limit: Option<Size>,
    verbose: bool,
) -> PyResult<Output> {
    let mut o = options(capacity, align, tiers, Some(compact), backend, device, materialize_limit, device_heap_limit)?;
    o.verbose = verbose;
    let snap = snapshot.0.clone();
    detached(py, move || app::run_compare(&snap, &o, &Quiet).map(Output::from))
}

/// `gpuheap explain` (`tune=False`: `--no-tune`; `without`: `--without SITE` per pattern).
#[pyfunction]
#[pyo3(signature = (snapshot, *, capacity=None, device=None, tune=true, without=None))]
fn explain(
    py: Python<'_>,
    snapshot: &Snapshot,
    capacity: Option<Size>,
    device: Option<i64>,
    tune: bool,
    without: Option<Vec<String>>,
) -> PyResult<Output> {
    let mut o = options(capacity, None, None, None, None, device, None, None)?;
    o.tune = tune;
    o.without = without.unwrap_or_default();
    let snap = snapshot.0.clone();
    detached(py, move || app::run_explain(&snap, &o, &Quiet).map(Output::from))
}

/// `gpuheap tune`; `settings`: keep only the rows with these labels.
#[pyfunction]
#[pyo3(signature = (snapshot, *, capacity=None, device=None, settings=None))]
fn tune(
    py: Python<'_>,
    snapshot: &Snapshot,
    capacity: Option<Size>,
    device: Option<i64>,
    settings: Option<Vec<String>>,
) -> PyResult<Output> {
    let mut o = options(capacity, None, None, None, None, device, None, None)?;
    o.settings = settings;
    let snap = snapshot.0.clone();
    detached(py, move || app::run_tune(&snap, &o, &Quiet).map(Output::from))
}

/// A row of [`option_table`]: key, help, value name (`None`: a switch), repeated, commands.
type OptionRow = (&'static str, &'static str, Option<&'static str>, bool, Vec<String>);

/// The option table of the commands (`gpuheap::options::OPTIONS`), one `(key, help, value, repeated,
/// commands)` per row: the keyword, its help text (the one the command line's `--help` prints), the
/// name of its value (`None`: a switch), whether it takes a list, and the commands that take it
/// (`"replay"`, `"compare"`, `"explain"`, `"tune"`).
#[pyfunction]
fn option_table() -> Vec<OptionRow> {
    gpuheap::options::OPTIONS
        .iter()
        .map(|r| {
            (r.key, r.help, r.value, r.repeated, r.commands.iter().map(|c| format!("{c:?}").to_lowercase()).collect())
        })
        .collect()
}

/// The strategy names `replay` accepts, in the CLI's order.
#[pyfunction]
fn strategies() -> Vec<&'static str> {
    gpuheap::reference::StrategyKind::ALL.iter().map(|k| k.as_str()).collect()
}

/// Bytes in the largest fitting binary unit, as every page prints them (`7.09 GiB`).
#[pyfunction]
fn fmt_bytes(b: u64) -> String {
    gpuheap::units::fmt_bytes(b)
}

/// Parses a byte count as the CLI does (`80GiB`, `1.5e9`, `1048576`).
#[pyfunction]
fn parse_bytes(s: &str) -> PyResult<u64> {
    gpuheap::units::parse_bytes(s).map_err(|e| ConfigError::new_err(e.to_string()))
}

/// Only for the tests of the panic guard: panics inside the guarded, GIL-free section.
#[pyfunction]
fn _panic_for_test(py: Python<'_>) -> PyResult<()> {
    detached(py, || -> Result<(), Error> { panic!("test panic") })
}

/// The native module `gpuheap._gpuheap`.
#[pymodule]
fn _gpuheap(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Snapshot>()?;
    m.add_class::<Output>()?;
    m.add_function(wrap_pyfunction!(load_path, m)?)?;
    m.add_function(wrap_pyfunction!(load_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(replay, m)?)?;
    m.add_function(wrap_pyfunction!(compare, m)?)?;
    m.add_function(wrap_pyfunction!(explain, m)?)?;
    m.add_function(wrap_pyfunction!(tune, m)?)?;
    m.add_function(wrap_pyfunction!(strategies, m)?)?;
    m.add_function(wrap_pyfunction!(option_table, m)?)?;
    m.add_function(wrap_pyfunction!(fmt_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(parse_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(_panic_for_test, m)?)?;
    #[cfg(feature = "cli")]
    m.add_function(wrap_pyfunction!(cli::cli_main, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
