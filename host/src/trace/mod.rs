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
pub mod limits;
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
///
/// The format is recognised from the first [`HEAD_BYTES`] before the rest is read (a file of no known
/// format is refused after 4 KiB, whatever its size), and the input is read up to
/// [`limits::max_input`] of the memory ceiling ([`limits::max_memory`]): a larger regular file is refused
/// before it is read, a pipe or other stream once it passes the cap ([`TraceError::Limit`]).
#[doc(hidden)]
pub fn read_trace_and_bytes(path: impl AsRef<Path>) -> Result<(Trace, Vec<u8>), TraceError> {
    let path = path.as_ref();
    let bytes = read_input(path, limits::max_memory())?;
    Ok((parse_trace(path, &bytes)?, bytes))
}

/// How many bytes of an input are read to recognise its format before the rest is read.
#[doc(hidden)]
pub const HEAD_BYTES: usize = 4096;

/// The content of the trace input `path` under the memory ceiling `max_memory` ([`read_trace_and_bytes`]),
/// into a buffer on huge pages ([`pages::advise_huge`]).
fn read_input(path: &Path, max_memory: u64) -> Result<Vec<u8>, TraceError> {
    use std::io::Read;
    let io = |source| TraceError::Io { path: path.to_path_buf(), source };
    let cap = limits::max_input(max_memory);
    // The checks below are of the file opened, not of the name (which could change in between). A
    // directory opens on Unix (and fails to read); a FIFO's open waits for a writer, as `cat` does.
    let meta = std::fs::metadata(path).map_err(io)?;
    if meta.is_dir() {
        return Err(TraceError::IsDirectory { path: path.to_path_buf() });
    }
    let mut file = std::fs::File::open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
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
    let regular = meta.is_file();
    if regular && meta.len() > cap {
        return Err(limits::too_large(path, meta.len(), max_memory));
    }
    // The metadata's length (a regular file) plus one byte, so that reading to the end needs no second
    // allocation; a stream grows as it is read.
    let hint = if regular { usize::try_from(meta.len()).unwrap_or(usize::MAX).saturating_add(1) } else { HEAD_BYTES };
    let mut bytes = Vec::new();
    bytes
        .try_reserve_exact(hint.max(HEAD_BYTES))
        .map_err(|e| io(std::io::Error::new(std::io::ErrorKind::OutOfMemory, e)))?;
    pages::advise_huge(&mut bytes);
    (&mut file).take(HEAD_BYTES as u64).read_to_end(&mut bytes).map_err(io)?;
    if bytes.is_empty() {
        return Err(TraceError::Empty { path: path.to_path_buf() });
    }
    // A head that holds its whole first line (or the whole input) decides the format now; a first line
    // longer than the head is left to the full read.
    if bytes.len() < HEAD_BYTES || bytes.contains(&b'\n') {
        detect_row(path, &bytes)?;
    }
    let left = cap.saturating_sub(bytes.len() as u64).saturating_add(1);
    file.take(left).read_to_end(&mut bytes).map_err(io)?;
    if bytes.len() as u64 > cap {
        return Err(limits::too_large(path, bytes.len() as u64, max_memory));
    }
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
