//! Why a trace file could not be read ([`TraceError`], with the [`Location`] of the fault), and the
//! helpers that keep every message on one line and short.

use std::fmt;
use std::path::{Path, PathBuf};

use super::{TraceFormat, ValidationError};

/// Where in a file a [`TraceError`] was found.
#[derive(Debug, Clone, PartialEq)]
pub enum Location {
    /// Byte offset from the start of the file.
    Byte(usize),
    /// 1-based line of a text file.
    Line(u64),
    /// Event `index` of device `device` (0-based index into `device_traces[device]` and into
    /// [`DeviceTrace::events`](super::DeviceTrace::events)); `field` names the offending key, if any.
    Event {
        /// Device ordinal.
        device: i64,
        /// Event index.
        index: usize,
        /// Field name.
        field: Option<&'static str>,
    },
    /// Block `block` of segment `segment` of the snapshot's `segments` list (block `None`: the
    /// segment itself).
    Segment {
        /// Index into `segments`.
        segment: usize,
        /// Index into that segment's `blocks`.
        block: Option<usize>,
        /// Field name.
        field: Option<&'static str>,
    },
    /// A top-level key of the snapshot.
    Key(&'static str),
    /// The file's name (a minimalloc `NAME.CAPACITY.csv` capacity).
    FileName,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Byte(b) => write!(f, "byte {b}"),
            Location::Line(l) => write!(f, "line {l}"),
            Location::Event { device, index, field } => {
                write!(f, "device {device}, event {index}")?;
                field.map_or(Ok(()), |k| write!(f, ", field `{k}`"))
            }
            Location::Segment { segment, block, field } => {
                write!(f, "segment {segment}")?;
                if let Some(b) = block {
                    write!(f, ", block {b}")?;
                }
                field.map_or(Ok(()), |k| write!(f, ", field `{k}`"))
            }
            Location::Key(k) => write!(f, "key `{k}`"),
            Location::FileName => write!(f, "file name"),
        }
    }
}

/// Why a trace file could not be read. `Display` is one line that names the file and, where
/// it applies, the byte, line or event at fault. Every variant is a problem with the input: a
/// command-line tool should exit with [`TraceError::EXIT_CODE`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// The file could not be opened or read.
    #[error("{}: cannot read: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The path names a directory.
    #[error("{}: is a directory, not a trace file", .path.display())]
    IsDirectory {
        /// The path.
        path: PathBuf,
    },
    /// The path names a character or block device (such as `/dev/zero`, which would be read without end),
    /// not a file.
    #[error("{}: is a device, not a trace file", .path.display())]
    IsDevice {
        /// The path.
        path: PathBuf,
    },
    /// The file is empty.
    #[error("{}: empty file", .path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// No reader recognises the content.
    #[error(
        "{}: unknown trace format (not a pickle, and the first line is not `id,lower,upper,size` nor \
         `Thread,Time,Action,Pointer,Size,Stream`): starts with {start:?}",
        .path.display()
    )]
    UnknownFormat {
        /// The file.
        path: PathBuf,
        /// Its first bytes, lossily decoded.
        start: String,
    },
    /// The pickle would import or call Python code; it is refused unread.
    #[error("{}: byte {offset}: the pickle asks to run code ({what}); refusing to load it", .path.display())]
    PickleRunsCode {
        /// The file.
        path: PathBuf,
        /// Offset of the opcode, bytes.
        offset: usize,
        /// "global `os.system`" or "opcode REDUCE".
        what: String,
    },
    /// The pickle ends before its `STOP` opcode: an opcode, or the length it announces, runs past the
    /// end of the data.
    #[error("{}: truncated pickle: the opcode at byte {offset} needs more bytes than the data holds", .path.display())]
    PickleTruncated {
        /// The file.
        path: PathBuf,
        /// Offset of the opcode being read when the data ran out, bytes.
        offset: usize,
    },
    /// The pickle stream is malformed (unknown opcode, stack underflow, bad memo reference...).
    #[error("{}: byte {offset}: corrupt pickle: {message}", .path.display())]
    PickleCorrupt {
        /// The file.
        path: PathBuf,
        /// Offset of the opcode, bytes.
        offset: usize,
        /// What is wrong.
        message: String,
    },
    /// A value has the wrong type or is out of range (e.g. a string where a size belongs, a
    /// negative or over-64-bit size, a CSV cell that is not a number).
    #[error("{}: {at}: {message}", .path.display())]
    Schema {
        /// The file.
        path: PathBuf,
        /// Where.
        at: Location,
        /// What is wrong.
        message: String,
    },
    /// The event stream is inconsistent (alloc of a live address, free of an unknown address,
    /// double free, an RMM free naming another size than its allocation, a block that overflows the address
    /// space).
    #[error("{}: {at}: {}", .path.display(), .source.kind.display_in(*.format))]
    Event {
        /// The file.
        path: PathBuf,
        /// The file's format, whose names the message uses for events.
        format: TraceFormat,
        /// Where: an event (PyTorch) or a line (CSV).
        at: Location,
        /// What is wrong (boxed: it is the largest variant, and `TraceError` travels in every `Result`).
        source: Box<ValidationError>,
    },
    /// Reading the file would pass one of the reader's limits (module `limits`): its size, the work or
    /// the memory of reading it, from the file's size and the memory ceiling (`--max-memory`).
    #[error("{}: {at}: the file passes a reading limit: {limit}", .path.display())]
    Limit {
        /// The file.
        path: PathBuf,
        /// Where reading stopped: the byte offset (size limits) or the event or segment being read.
        at: Location,
        /// The limit, its value and how it is derived.
        limit: String,
    },
}

impl TraceError {
    /// Exit code a command-line tool should use for any `TraceError` (bad input).
    #[doc(hidden)]
    pub const EXIT_CODE: i32 = 2;

    /// The same as [`TraceError::EXIT_CODE`], for `map_err` chains.
    pub fn exit_code(&self) -> i32 {
        Self::EXIT_CODE
    }

    /// The file the error is about.
    #[doc(hidden)]
    pub fn path(&self) -> &Path {
        match self {
            TraceError::Io { path, .. }
            | TraceError::IsDirectory { path }
            | TraceError::IsDevice { path }
            | TraceError::Empty { path }
            | TraceError::UnknownFormat { path, .. }
            | TraceError::PickleRunsCode { path, .. }
            | TraceError::PickleTruncated { path, .. }
            | TraceError::PickleCorrupt { path, .. }
            | TraceError::Schema { path, .. }
            | TraceError::Event { path, .. }
            | TraceError::Limit { path, .. } => path,
        }
    }

    pub(crate) fn schema(path: &Path, at: Location, message: impl Into<String>) -> Self {
        TraceError::Schema { path: path.to_path_buf(), at, message: one_line(message.into()) }
    }
}

/// A value quoted from the file for a message: `"text"` (escaped as `{:?}` does), at most
/// [`EXCERPT_CHARS`] characters of it, then `…` and the value's length, so that a cell or string of
/// megabytes does not make a message of megabytes.
pub(crate) fn excerpt(s: &str) -> String {
    match excerpt_cut(s) {
        None => format!("{s:?}"),
        Some(cut) => format!("{:?}… ({} bytes)", &s[..cut], s.len()),
    }
}

/// Where [`excerpt`] cuts `s` (a byte index), or `None` when `s` is short enough to quote whole.
fn excerpt_cut(s: &str) -> Option<usize> {
    s.char_indices().nth(EXCERPT_CHARS).map(|(cut, _)| cut)
}

/// How many characters of a value [`excerpt`] quotes.
pub(crate) const EXCERPT_CHARS: usize = 40;

/// [`excerpt`] unquoted (a number too large to read, a global's name).
pub(crate) fn excerpt_plain(s: &str) -> String {
    match excerpt_cut(s) {
        None => s.to_string(),
        Some(cut) => format!("{}… ({} bytes)", &s[..cut], s.len()),
    }
}

/// Replaces control characters (newlines...) so that a message stays on one line.
pub(crate) fn one_line(s: String) -> String {
    if s.chars().any(char::is_control) {
        s.chars().map(|c| if c.is_control() { ' ' } else { c }).collect()
    } else {
        s
    }
}
