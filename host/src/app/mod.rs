//! The front door (its items are re-exported at the crate root): the commands `replay`, `compare`, `explain` and `tune` as functions
//! ([`run_replay`], [`run_compare`], [`run_explain`], [`run_tune`]) over a read trace ([`Snapshot`])
//! and the options of every command ([`Options`]), each returning its [`Output`]: the JSON the
//! command line prints with `--json`, the text page it prints without, the HTML page of `--html` and
//! the page's title. The command line (`gpuheap-cli`) and the Python package (`python/src`) call these
//! and only map their arguments, so both give the same answer by construction; errors are the front
//! door's [`crate::Error`].
//!
//! ```no_run
//! use gpuheap::{run_explain, Options, Quiet, Snapshot};
//!
//! let snap = Snapshot::read("oom_snapshot.pickle")?;
//! let out = run_explain(&snap, &Options::default(), &Quiet)?;
//! print!("{}", out.text);
//! # Ok::<(), gpuheap::Error>(())
//! ```
//!
//! A long command reports to an [`Observer`]: the notes a person should see before the answer (which
//! device is reported, the allocator settings the model does not replay) and its progress.

use std::path::Path;
use std::sync::Arc;

use crate::trace::{self, Trace, TraceFormat};
use crate::Error;

pub mod options;
mod run;

pub use options::{OptionError, Options};
pub use run::{run_compare, run_explain, run_replay, run_tune};

/// A trace read into memory, shared (not copied) by every command run on it.
#[derive(Clone, Debug)]
pub struct Snapshot {
    trace: Arc<Trace>,
    /// The bytes a snapshot pickle was parsed from: `explain` reads the stack frames from them, so the
    /// file is not read twice (a pipe cannot be; a file may have changed). `None`: read again from
    /// [`Trace::source`] when needed.
    bytes: Option<Arc<[u8]>>,
}

impl Snapshot {
    /// Reads the trace file at `path` (format detected from the content), keeping the bytes of a PyTorch
    /// snapshot for its stack frames.
    ///
    /// # Errors
    /// [`crate::ErrorKind::Input`] with the [`crate::trace::TraceError`].
    pub fn read(path: impl AsRef<Path>) -> Result<Self, Error> {
        let (t, bytes) = trace::read_trace_and_bytes(path)?;
        let keep = matches!(t.format, TraceFormat::PytorchSnapshot(_));
        Ok(Snapshot { trace: Arc::new(t), bytes: keep.then(|| Arc::from(bytes)) })
    }

    /// Parses trace `bytes`; `name` stands for the file in messages and reports (`<bytes>`, `<dict>`).
    ///
    /// # Errors
    /// As [`Snapshot::read`].
    pub fn parse(name: impl AsRef<Path>, bytes: &[u8]) -> Result<Self, Error> {
        let t = trace::parse_trace(name.as_ref(), bytes)?;
        Ok(Snapshot { trace: Arc::new(t), bytes: Some(Arc::from(bytes)) })
    }

    /// The trace of `t`, without its bytes (`explain` reads the stack frames from [`Trace::source`]).
    #[doc(hidden)]
    pub fn from_trace(t: Trace) -> Self {
        Snapshot { trace: Arc::new(t), bytes: None }
    }

    /// The trace.
    pub fn trace(&self) -> &Trace {
        &self.trace
    }

    /// The bytes the trace was parsed from, when kept.
    #[doc(hidden)]
    pub fn bytes(&self) -> Option<&[u8]> {
        self.bytes.as_deref()
    }

    /// The file name of the trace's source (the whole source when it has none), for a page title.
    #[doc(hidden)]
    pub fn file_name(&self) -> String {
        let p = &self.trace.source;
        p.file_name().map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into_owned())
    }
}

/// What a command produced.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Output {
    /// The page's title: the trace's file name and the command (`oom.pickle — explain`).
    pub title: String,
    /// The report as JSON (pretty-printed, no final newline): what `--json` prints.
    pub json: String,
    /// The text page the command line prints.
    pub text: String,
    /// The self-contained HTML page of `--html`, when [`Options::html`] asked for it.
    pub html: Option<String>,
    /// `explain` with the settings search: the ranked table alone
    /// ([`crate::explain::tune::TuneReport::render_table`]).
    pub tune_table: Option<String>,
    /// The replays behind a `replay` or `compare` page (the command line plots them with `--plot`);
    /// empty for the other commands.
    pub replays: Vec<crate::replay::ReplayReport>,
}

/// What a command reports while it runs. Every method does nothing by default ([`Quiet`]); the command
/// line writes the notes on stderr and draws progress bars.
pub trait Observer: Sync {
    /// Lines for the person running the command, before the answer: which device is reported and how
    /// to pick another, the allocator settings the model does not replay. Whole lines, each ending in
    /// a newline.
    fn note(&self, lines: &str) {
        let _ = lines;
    }
    /// A replay of `events` events, named `label`, begins (`replay`, each row of `compare`).
    fn replay_started(&self, label: &str, events: u64) {
        let _ = (label, events);
    }
    /// `done` events of the replay are done.
    fn replay_progress(&self, done: u64) {
        let _ = done;
    }
    /// A settings search begins (`tune`, `explain`); its number of replays is not known in advance.
    fn search_started(&self) {}
    /// One replay of the search is done (called from several threads).
    fn search_step(&self) {}
    /// The command's work is done (the output follows).
    fn finished(&self) {}
}

/// An [`Observer`] that reports nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct Quiet;

impl Observer for Quiet {}
