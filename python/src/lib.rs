//! `gpuheap._gpuheap`: the native half of the `gpuheap` Python package (PyO3, abi3).
//!
//! This module is private: the public API is the pure-Python package `gpuheap` (python/python/gpuheap),
//! which checks and converts its arguments and calls the functions here. Every function here:
//!
//! * releases the GIL for the work (reading, replaying), so other Python threads run meanwhile;
//! * returns reports as the same JSON text the command line prints with `--json` (same serialisation,
//!   so the Python numbers and the CLI's are the same by construction);
//! * raises only the exceptions of `gpuheap._errors` (all subclasses of `gpuheap.Error`): `TraceError`
//!   for an input that cannot be read, `ConfigError` for an option that does not fit, `BackendError`
//!   for a run-time failure (a kernel, the driver, a failed compaction check), and `InternalError` for a
//!   panic in the Rust code, which is caught so that it never takes the interpreter down.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Arc;

use pyo3::prelude::*;
use serde::Serialize;

use gpuheap::backend::{Backend, BackendChoice};
use gpuheap::reference::StrategyKind;
use gpuheap::replay::compare::{compare, CompareOptions};
use gpuheap::replay::{self, CompactPolicy, ReplayError, ReplayOptions, ReplayReport};
use gpuheap::trace::{self, DeviceTrace, Trace};

#[cfg(feature = "cli")]
mod cli;
mod explain;

pyo3::import_exception!(gpuheap._errors, TraceError);
pyo3::import_exception!(gpuheap._errors, ConfigError);
pyo3::import_exception!(gpuheap._errors, BackendError);
pyo3::import_exception!(gpuheap._errors, InternalError);

/// Why a call failed, before it becomes a Python exception (built without the GIL).
#[derive(Debug)]
enum Failure {
    /// The input cannot be read (`gpuheap.TraceError`; the CLI's exit code 2).
    Trace(String),
    /// An option does not fit the input (`gpuheap.ConfigError`; exit code 2).
    Config(String),
    /// A run-time failure (`gpuheap.BackendError`; exit code 1).
    Backend(String),
}

impl From<Failure> for PyErr {
    fn from(f: Failure) -> PyErr {
        match f {
            Failure::Trace(m) => TraceError::new_err(m),
            Failure::Config(m) => ConfigError::new_err(m),
            Failure::Backend(m) => BackendError::new_err(m),
        }
    }
}

impl From<ReplayError> for Failure {
    fn from(e: ReplayError) -> Failure {
        if e.is_input() {
            Failure::Config(e.to_string())
        } else {
            Failure::Backend(e.to_string())
        }
    }
}

/// Runs `f` without the GIL, catching a panic as `gpuheap.InternalError`.
fn detached<T: Send>(py: Python<'_>, f: impl FnOnce() -> Result<T, Failure> + Send) -> PyResult<T> {
    match py.detach(|| catch_unwind(AssertUnwindSafe(f))) {
        Ok(r) => r.map_err(PyErr::from),
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

/// A trace read into memory: a PyTorch memory snapshot, a minimalloc CSV or an RMM log.
///
/// Made by `gpuheap.load`; immutable, and shared (not copied) by every call that takes it.
#[pyclass(frozen, module = "gpuheap", name = "Snapshot")]
struct Snapshot {
    trace: Arc<Trace>,
    /// The bytes a snapshot pickle was parsed from (`explain` reads the stack frames from them; a
    /// file is not read twice). `None` for the CSV formats, which record no frames.
    bytes: Option<Arc<[u8]>>,
}

#[pymethods]
impl Snapshot {
    /// Where it was read from: the file path, `<bytes>` or `<dict>`.
    #[getter]
    fn source(&self) -> String {
        self.trace.source.display().to_string()
    }

    /// The format, as the CLI names it (e.g. "PyTorch memory snapshot").
    #[getter]
    fn format(&self) -> String {
        self.trace.format.to_string()
    }

    /// The device ordinals in the trace, ascending.
    #[getter]
    fn devices(&self) -> Vec<i64> {
        self.trace.devices.iter().map(|d| d.device).collect()
    }

    /// Number of events over all devices.
    #[getter]
    fn event_count(&self) -> usize {
        self.trace.event_count()
    }

    fn __repr__(&self) -> String {
        format!(
            "<gpuheap.Snapshot {:?}: {}, devices {:?}, {} events>",
            self.source(),
            self.format(),
            self.devices(),
            self.event_count()
        )
    }
}

impl Snapshot {
    fn new(trace: Trace, bytes: Option<Arc<[u8]>>) -> Self {
        Snapshot { trace: Arc::new(trace), bytes }
    }
}

/// Reads the trace file at `path` (format detected from the content).
#[pyfunction]
fn load_path(py: Python<'_>, path: PathBuf) -> PyResult<Snapshot> {
    detached(py, move || {
        let (t, bytes) = trace::read_trace_and_bytes(&path).map_err(|e| Failure::Trace(e.to_string()))?;
        let keep = matches!(t.format, trace::TraceFormat::PytorchSnapshot(_));
        Ok(Snapshot::new(t, keep.then(|| Arc::from(bytes))))
    })
}

/// Parses trace bytes (a pickle or a CSV); `name` stands for the file in messages (`<bytes>`, `<dict>`).
#[pyfunction]
fn load_bytes(py: Python<'_>, data: &[u8], name: &str) -> PyResult<Snapshot> {
    let name = PathBuf::from(name);
    detached(py, move || {
        let t = trace::parse_trace(&name, data).map_err(|e| Failure::Trace(e.to_string()))?;
        Ok(Snapshot::new(t, Some(Arc::from(data))))
    })
}

/// Parses a byte count as the CLI does (`80GiB`, `1.5e9`, `1048576`).
#[pyfunction]
fn parse_bytes(s: &str) -> PyResult<u64> {
    replay::parse_bytes(s).map_err(ConfigError::new_err)
}

/// The options that `replay` and `compare` share with the CLI's `Common` arguments, parsed.
struct Common {
    capacity: Option<u64>,
    align: Option<u64>,
    tiers: Option<(u64, u64)>,
    policy: CompactPolicy,
    backend: BackendChoice,
    device: Option<i64>,
    materialize_limit: Option<u64>,
}

impl Common {
    #[allow(clippy::too_many_arguments, reason = "the CLI's shared options, one argument each")]
    fn parse(
        capacity: Option<&str>,
        align: Option<&str>,
        tiers: Option<&str>,
        compact: &str,
        backend: Option<&str>,
        device: Option<i64>,
        materialize_limit: Option<&str>,
    ) -> Result<Common, Failure> {
        let config = |what: &'static str| move |e: String| Failure::Config(format!("{what}: {e}"));
        let bytes = |what: &str, s: Option<&str>| {
            s.map(|s| replay::parse_bytes(s).map_err(|e| Failure::Config(format!("{what}: {e}")))).transpose()
        };
        let backend = match backend {
            Some(b) => b.parse(),
            None => BackendChoice::from_env(),
        }
        .map_err(|e| Failure::Config(e.to_string()))?;
        Ok(Common {
            capacity: bytes("capacity", capacity)?,
            align: align.map(replay::parse_align).transpose().map_err(config("align"))?,
            tiers: tiers.map(replay::parse_tiers).transpose().map_err(config("tiers"))?,
            policy: compact.parse().map_err(Failure::Config)?,
            backend,
            device,
            materialize_limit: bytes("materialize_limit", materialize_limit)?,
        })
    }

    /// The device to replay, as the CLI picks it ([`gpuheap::explain::choose_device`]): the one asked
    /// for, else the one with a recorded OOM, else the one with the most allocation events. A trace
    /// with nothing to report, or a device it lacks, is a `ConfigError` (as in `explain`).
    fn device<'t>(&self, trace: &'t Trace) -> Result<&'t DeviceTrace, Failure> {
        let summaries = gpuheap::explain::summarize(trace);
        let choice = gpuheap::explain::choose_device(trace, &summaries, self.device).map_err(Failure::Config)?;
        Ok(&trace.devices[choice.index])
    }

    /// The backend for compaction measurements: none when the policy never compacts, unless a GPU was
    /// asked for explicitly (so that a missing GPU is an error, as in the CLI).
    fn measuring_backend(&self) -> Result<Option<Backend>, Failure> {
        if self.policy == CompactPolicy::Never && self.backend != BackendChoice::Gpu {
            return Ok(None);
        }
        self.backend().map(Some)
    }

    fn backend(&self) -> Result<Backend, Failure> {
        Backend::select(self.backend).map_err(|e| Failure::Backend(e.to_string()))
    }

    fn replay(
        &self,
        trace: &Trace,
        dev: &DeviceTrace,
        strategy: StrategyKind,
        backend: Option<&Backend>,
    ) -> Result<ReplayReport, Failure> {
        Ok(replay::replay(trace, dev, &self.options(strategy), backend, &mut |_| {})?)
    }

    fn options(&self, strategy: StrategyKind) -> ReplayOptions {
        ReplayOptions {
            capacity: self.capacity,
            align: self.align,
            tiers: self.tiers,
            policy: self.policy,
            materialize_limit: self.materialize_limit,
            ..ReplayOptions::new(strategy)
        }
    }
}

fn to_json(v: &impl Serialize) -> Result<String, Failure> {
    serde_json::to_string(v).map_err(|e| Failure::Backend(format!("cannot serialise the report: {e}")))
}

/// `gpuheap replay --json`: one strategy over one device of the trace; the report as JSON text.
#[pyfunction]
#[pyo3(signature = (snapshot, strategy, capacity, align, tiers, compact, backend, device, materialize_limit))]
#[allow(clippy::too_many_arguments, reason = "the CLI's options, one argument each")]
fn replay_json(
    py: Python<'_>,
    snapshot: &Snapshot,
    strategy: &str,
    capacity: Option<&str>,
    align: Option<&str>,
    tiers: Option<&str>,
    compact: &str,
    backend: Option<&str>,
    device: Option<i64>,
    materialize_limit: Option<&str>,
) -> PyResult<String> {
    let trace = Arc::clone(&snapshot.trace);
    let strategy: StrategyKind =
        strategy.parse().map_err(|e: gpuheap::reference::UnknownStrategy| ConfigError::new_err(e.to_string()))?;
    let common = Common::parse(capacity, align, tiers, compact, backend, device, materialize_limit)?;
    detached(py, move || {
        let dev = common.device(&trace)?;
        let backend = common.measuring_backend()?;
        to_json(&common.replay(&trace, dev, strategy, backend.as_ref())?)
    })
}

/// `gpuheap compare --json`: every host strategy, then the device allocator, over the same device of
/// the trace; a contender that cannot take the options is listed under `not_run` with the reason.
#[pyfunction]
#[pyo3(signature = (snapshot, capacity, align, tiers, compact, backend, device, materialize_limit, device_heap_limit))]
#[allow(clippy::too_many_arguments, reason = "the CLI's options, one argument each")]
fn compare_json(
    py: Python<'_>,
    snapshot: &Snapshot,
    capacity: Option<&str>,
    align: Option<&str>,
    tiers: Option<&str>,
    compact: &str,
    backend: Option<&str>,
    device: Option<i64>,
    materialize_limit: Option<&str>,
    device_heap_limit: Option<&str>,
) -> PyResult<String> {
    let trace = Arc::clone(&snapshot.trace);
    let common = Common::parse(capacity, align, tiers, compact, backend, device, materialize_limit)?;
    let heap_limit = device_heap_limit
        .map(|s| replay::parse_bytes(s).map_err(|e| ConfigError::new_err(format!("device_heap_limit: {e}"))))
        .transpose()?;
    detached(py, move || {
        let dev = common.device(&trace)?;
        let backend = common.measuring_backend()?;
        // The device allocator's row always runs on a backend, whatever the compaction policy.
        let owned;
        let device_backend = match &backend {
            Some(b) => b,
            None => {
                owned = common.backend()?;
                &owned
            }
        };
        let opts = CompareOptions::new(common.options(StrategyKind::BestFit), heap_limit);
        let cmp =
            compare(&trace, dev, |c| c.replay(&trace, dev, &opts, backend.as_ref(), device_backend, &mut |_| {}))?;
        to_json(&cmp)
    })
}

/// The strategy names `replay` accepts, in the CLI's order.
#[pyfunction]
fn strategies() -> Vec<&'static str> {
    StrategyKind::ALL.iter().map(|k| k.as_str()).collect()
}

/// Only for the tests of the panic guard: panics inside the guarded, GIL-free section.
#[pyfunction]
fn _panic_for_test(py: Python<'_>) -> PyResult<()> {
    detached(py, || -> Result<(), Failure> { panic!("test panic") })
}

/// The native module `gpuheap._gpuheap`.
#[pymodule]
fn _gpuheap(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Snapshot>()?;
    m.add_function(wrap_pyfunction!(load_path, m)?)?;
    m.add_function(wrap_pyfunction!(load_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(parse_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(replay_json, m)?)?;
    m.add_function(wrap_pyfunction!(compare_json, m)?)?;
    m.add_function(wrap_pyfunction!(explain::explain_json, m)?)?;
    m.add_function(wrap_pyfunction!(explain::tune_json, m)?)?;
    m.add_function(wrap_pyfunction!(strategies, m)?)?;
    m.add_function(wrap_pyfunction!(_panic_for_test, m)?)?;
    #[cfg(feature = "cli")]
    m.add_function(wrap_pyfunction!(cli::cli_main, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
