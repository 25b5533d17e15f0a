//! Allocation traces: readers for real-world trace files and one event model for replay.
//!
//! Three formats are read, detected from the file's content by the format table ([`FORMATS`], module
//! `format`: a new format is a reader and one row):
//!
//! * PyTorch CUDA memory snapshots (`torch.cuda.memory._dump_snapshot` pickles), both the
//!   PyTorch 2.0 layout (per-block `history`, implicit block addresses) and the recent layout
//!   (`device_traces`, `allocator_settings`), every device in the file (module `pytorch`);
//! * buffer-lifetime CSV `id,lower,upper,size` as used by minimalloc (module `csv_lifetime`);
//! * RMM `logging_resource_adaptor` CSV `Thread,Time,Action,Pointer,Size,Stream` (module `rmm`).
//!
//! Every reader returns a [`Trace`]: per device, a flat `Vec<Event>` of 48-byte events whose
//! [`Event::id`] is a dense block (or segment) number, so a replay can keep its per-block state in
//! a `Vec` indexed by id instead of a hash map. Blocks and segments that already existed when the
//! recording started are listed in [`DeviceTrace::initial_blocks`] and
//! [`DeviceTrace::initial_segments`]; the end state a snapshot records is in
//! [`DeviceTrace::final_state`].
//!
//! Errors are [`TraceError`]s: one line, naming the file and the event index or line number.
//! They all mean "bad input" ([`TraceError::EXIT_CODE`] = 2).
//!
//! Layout: `model` (the event model), `error` (the errors and their locations), `format` (the table and
//! detection), the readers, and `validate` (the checks and id assignment every reader runs).
//!
//! ```
//! let trace = gpuheap::trace::read_trace(concat!(env!("CARGO_MANIFEST_DIR"), "/../data/equivariant-posteriors_oom_snapshot_new.pickle"))?;
//! // A snapshot dumped at the OOM without history: the allocator state, no events.
//! let dev = &trace.devices[0];
//! assert!(dev.final_state.is_some() && dev.events.is_empty());
//! # Ok::<(), gpuheap::trace::TraceError>(())
//! ```

use std::path::Path;

pub(crate) mod csv_lifetime;
mod error;
mod format;
mod model;
pub(crate) mod pages;
pub(crate) mod pytorch;
pub mod repeat;
pub(crate) mod rmm;
mod validate;

pub(crate) use error::{excerpt, excerpt_plain, one_line};
pub use error::{Location, TraceError};
pub use format::{detect, detect_row, FormatRow, Recorder, CSV_ALIGN, DEFAULT_ALIGN, FORMATS, PYTORCH_ALIGN};
pub use model::{
    AddressKind, BlockSeed, BlockState, BlockStatus, DeviceTrace, Event, EventKind, HistoryRecording, MempoolId,
    OomInfo, Pool, ReleaseCaller, SegmentSeed, SegmentState, SnapshotLayout, SnapshotState, TimeUnit, Trace,
    TraceFormat, NO_ID,
};
pub use pytorch::pickle_write::rewrite_frame_filenames;
pub use pytorch::settings::{expandable_initial_ranges, guess_expandable_pool, AllocatorSettings};
pub use pytorch::{normalise, read_frames, FileOrigin, Frame, FramePath, SnapshotFrames};
pub use validate::{validate, ValidationError, ValidationErrorKind};

/// Reads a trace file, detecting its format from the content.
///
/// PyTorch pickles are recognised by their protocol header (or a `.pickle`/`.pkl` extension for
/// protocol 0/1), the CSV formats by their header line.
pub fn read_trace(path: impl AsRef<Path>) -> Result<Trace, TraceError> {
    read_trace_and_bytes(path).map(|(t, _)| t)
}

/// [`read_trace`], also returning the bytes read: the file is read once, so a caller that needs its
/// content again (the stack frames `explain` shows) need not read it a second time, which a pipe
/// (`/dev/stdin`, `<(...)`) does not allow and a file rewritten in between would answer wrongly.
pub fn read_trace_and_bytes(path: impl AsRef<Path>) -> Result<(Trace, Vec<u8>), TraceError> {
    let path = path.as_ref();
    let io = |source| TraceError::Io { path: path.to_path_buf(), source };
    let meta = std::fs::metadata(path).map_err(io)?;
    if meta.is_dir() {
        return Err(TraceError::IsDirectory { path: path.to_path_buf() });
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if meta.file_type().is_char_device() || meta.file_type().is_block_device() {
            return Err(TraceError::IsDevice { path: path.to_path_buf() });
        }
    }
    let bytes = read_file(path, meta.len()).map_err(io)?;
    Ok((parse_trace(path, &bytes)?, bytes))
}

/// The content of `path`, `len` bytes by its metadata (a file that grew since is read to its end), into
/// a buffer on huge pages ([`pages::advise_huge`]).
fn read_file(path: &Path, len: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut bytes = Vec::new();
    // The metadata's length plus one byte, so that reading to the end needs no second allocation.
    let hint = usize::try_from(len).unwrap_or(usize::MAX).saturating_add(1);
    bytes.try_reserve_exact(hint).map_err(|e| std::io::Error::new(std::io::ErrorKind::OutOfMemory, e))?;
    pages::advise_huge(&mut bytes);
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Parses trace `bytes` (the content of the file `path`, which is only used in messages and in
/// [`Trace::source`]), detecting the format ([`detect_row`]) and running its reader.
///
/// # Errors
/// Those of [`detect_row`] and of the format's reader.
pub fn parse_trace(path: &Path, bytes: &[u8]) -> Result<Trace, TraceError> {
    (detect_row(path, bytes)?.parse)(path, bytes)
}
