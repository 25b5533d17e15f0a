//! The trace formats gpuheap reads: one row of [`FORMATS`] each. A new format is a reader module and
//! one row (plus its [`TraceFormat`] variant): how a file is recognised, how it is parsed, and what
//! the format implies for every caller (the alignment of its requests and why, the allocator whose
//! decisions it records, the names it gives events in messages, the capacity its file name carries,
//! the line an event comes from).
//!
//! Detection ([`detect`]) tries every row's content test in table order, then the file extensions
//! (a PyTorch pickle of protocol 0 or 1 has no header byte; it is recognised by its first container, and
//! a `.pickle`/`.pkl` name is taken as a pickle whatever it starts with).

use std::path::Path;

use super::{csv_lifetime, pytorch, rmm};
use super::{Event, EventKind, SnapshotLayout, Trace, TraceError, TraceFormat};

/// Alignment (bytes) of replayed PyTorch requests: PyTorch's `kMinBlockSize`.
#[doc(hidden)]
pub const PYTORCH_ALIGN: u64 = 512;
/// Alignment (bytes) of replayed requests of RMM logs (`cudaMalloc`'s and RMM's 256 B).
#[doc(hidden)]
pub const DEFAULT_ALIGN: u64 = 256;
/// Alignment (bytes) of replayed minimalloc CSV requests: minimalloc instances are defined at byte
/// granularity, so a feasible instance stays feasible.
#[doc(hidden)]
pub const CSV_ALIGN: u64 = 1;

/// The allocator whose decisions a format records (its segments, its placements), when it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
#[doc(hidden)]
pub enum Recorder {
    /// PyTorch's CUDA caching allocator (`c10/cuda/CUDACachingAllocator.cpp`), which gpuheap models:
    /// a replay's default strategy is that model.
    PytorchCaching,
    /// No allocator's decisions are recorded (a list of lifetimes, a log of requests).
    None,
}

/// What gpuheap knows of one trace format.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
#[doc(hidden)]
pub struct FormatRow {
    /// The format (for PyTorch snapshots, the recent layout; the reader tells the 2.0 layout apart).
    pub format: TraceFormat,
    /// Its name in messages and reports.
    pub name: &'static str,
    /// Recognises the format from the file's content.
    pub detect: fn(&[u8]) -> bool,
    /// File extensions (lowercase) that identify it when no row recognises the content.
    pub extensions: &'static [&'static str],
    /// The reader: parses the content of the file at the path (the path is used in messages).
    pub parse: fn(&Path, &[u8]) -> Result<Trace, TraceError>,
    /// The natural alignment of its requests, bytes.
    pub align: u64,
    /// Why, for the replay report.
    pub align_source: &'static str,
    /// The allocator whose decisions it records.
    pub recorder: Recorder,
    /// The names its files give event kinds where they are not PyTorch's
    /// ([`EventKind::pytorch_name`]): messages quote the file's own words.
    pub action_names: &'static [(EventKind, &'static str)],
    /// A capacity the file's name carries (minimalloc's `NAME.CAPACITY.csv`).
    pub capacity_hint: Option<fn(&Path) -> Option<u64>>,
    /// The file line an event comes from, when events are lines (a message names the line).
    pub event_line: Option<fn(&Event) -> u64>,
}

/// Every format, in detection order.
#[doc(hidden)]
pub const FORMATS: [FormatRow; 3] = [
    FormatRow {
        format: TraceFormat::PytorchSnapshot(SnapshotLayout::Recent),
        name: "PyTorch memory snapshot",
        // Pickle protocol 2 and later start with the PROTO opcode; 0 and 1 by their first container.
        detect: |b| b.first() == Some(&0x80) || is_pickle_0_1(b),
        extensions: &["pickle", "pkl"],
        parse: pytorch::parse,
        align: PYTORCH_ALIGN,
        align_source: "the PyTorch default, kMinBlockSize",
        recorder: Recorder::PytorchCaching,
        action_names: &[],
        capacity_hint: None,
        event_line: None,
    },
    FormatRow {
        format: TraceFormat::LifetimeCsv,
        name: "buffer-lifetime CSV (id,lower,upper,size)",
        detect: |b| {
            let h = csv_header(b);
            h.len() >= 4 && h[..4] == ["id", "lower", "upper", "size"]
        },
        extensions: &[],
        parse: |p, b| csv_lifetime::parse(p, &lone_cr_to_lf(b)),
        align: CSV_ALIGN,
        align_source: "the minimalloc default: instances are defined at byte granularity",
        recorder: Recorder::None,
        action_names: &[(EventKind::Free, "free")],
        capacity_hint: Some(capacity_in_name),
        // An event's `addr` is its buffer's 0-based data row; the header is line 1.
        event_line: Some(|e| e.addr.saturating_add(2)),
    },
    FormatRow {
        format: TraceFormat::RmmLog,
        name: "RMM logging CSV",
        detect: |b| csv_header(b) == ["thread", "time", "action", "pointer", "size", "stream"],
        extensions: &[],
        parse: |p, b| rmm::parse(p, &lone_cr_to_lf(b)),
        align: DEFAULT_ALIGN,
        align_source: "the default of cudaMalloc and RMM",
        recorder: Recorder::None,
        // `logging_resource_adaptor`'s `Action` column.
        action_names: &[
            (EventKind::Alloc, "allocate"),
            (EventKind::Free, "free"),
            (EventKind::Oom, "allocate failure"),
        ],
        capacity_hint: None,
        event_line: None,
    },
];

impl TraceFormat {
    /// This format's row of [`FORMATS`].
    #[doc(hidden)]
    pub fn row(self) -> &'static FormatRow {
        let key = match self {
            TraceFormat::PytorchSnapshot(_) => TraceFormat::PytorchSnapshot(SnapshotLayout::Recent),
            f => f,
        };
        FORMATS.iter().find(|r| r.format == key).expect("every TraceFormat has a row of FORMATS (tested below)")
    }
}

/// Whether `b` starts as a pickle of protocol 0 or 1 of a dict or list (a snapshot, or the bare list of
/// segments) does: protocol 0 `(dp0\n`, `(lp0\n` (Python 3) or `(dp1\n` (Python 2) opens with MARK and
/// DICT/LIST then a PUT or the first item; protocol 1 opens with EMPTY_DICT/EMPTY_LIST and a BINPUT, a
/// MARK or the first item. No CSV header of a known format starts so.
fn is_pickle_0_1(b: &[u8]) -> bool {
    match b {
        [b'(', b'd' | b'l', third, ..] => b"pVS(IFLNsa.".contains(third),
        [b'}' | b']', second, ..] => b"qr(X\x8cUTKJMN}]hjsuae.".contains(second),
        _ => false,
    }
}

/// The lowercased, trimmed cells of the first line of a text file (a UTF-8 byte-order mark skipped;
/// lines end in `\n`, `\r\n` or a lone `\r`, as the CSV reader takes all three).
fn csv_header(bytes: &[u8]) -> Vec<String> {
    let text = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    let first = text.split(|&b| b == b'\n' || b == b'\r').next().unwrap_or(b"");
    String::from_utf8_lossy(first).split(',').map(|c| c.trim().to_ascii_lowercase()).collect()
}

/// The capacity of a minimalloc file named `NAME.CAPACITY.csv` (e.g. `K.1048576.csv`), bytes.
fn capacity_in_name(path: &Path) -> Option<u64> {
    let stem = path.file_stem()?.to_str()?;
    stem.rsplit('.').next().filter(|s| !s.is_empty() && s.len() < stem.len())?.parse().ok()
}

/// `bytes` with every `\r` that does not start a `\r\n` turned into `\n`: the CSV reader takes a lone
/// `\r` as a line end but counts lines by `\n`, so without this every error in a file with classic Mac
/// line ends would name line 1.
fn lone_cr_to_lf(bytes: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    let lone = |i: usize| bytes[i] == b'\r' && bytes.get(i + 1) != Some(&b'\n');
    if !(0..bytes.len()).any(lone) {
        return std::borrow::Cow::Borrowed(bytes);
    }
    std::borrow::Cow::Owned((0..bytes.len()).map(|i| if lone(i) { b'\n' } else { bytes[i] }).collect())
}

/// The row of the format of `bytes`, the content of the file `path`: the first row whose content test
/// accepts them, else the first whose extensions include the path's (the PyTorch layout is refined by
/// the reader).
///
/// # Errors
/// [`TraceError::Empty`] for no bytes; [`TraceError::UnknownFormat`] when no row recognises the file.
#[doc(hidden)]
pub fn detect_row(path: &Path, bytes: &[u8]) -> Result<&'static FormatRow, TraceError> {
    if bytes.is_empty() {
        return Err(TraceError::Empty { path: path.to_path_buf() });
    }
    if let Some(r) = FORMATS.iter().find(|r| (r.detect)(bytes)) {
        return Ok(r);
    }
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
    if let Some(r) = FORMATS.iter().find(|r| r.extensions.contains(&ext.as_str())) {
        return Ok(r);
    }
    let start = super::one_line(String::from_utf8_lossy(&bytes[..bytes.len().min(24)]).into_owned());
    Err(TraceError::UnknownFormat { path: path.to_path_buf(), start })
}

/// Detects the format of `bytes` ([`detect_row`]).
///
/// # Errors
/// As [`detect_row`].
#[doc(hidden)]
pub fn detect(path: &Path, bytes: &[u8]) -> Result<TraceFormat, TraceError> {
    detect_row(path, bytes).map(|r| r.format)
}

impl Trace {
    /// The location of event `index` of device `dev` for a message: its file line when the format's
    /// events are lines (a minimalloc buffer), else the device and event index.
    #[doc(hidden)]
    pub fn event_location(&self, dev: &super::DeviceTrace, index: usize) -> super::Location {
        match (self.format.row().event_line, dev.events.get(index)) {
            (Some(line), Some(e)) => super::Location::Line(line(e)),
            _ => super::Location::Event { device: dev.device, index, field: None },
        }
    }

    /// The capacity the file's name carries, when its format has such a convention
    /// ([`FormatRow::capacity_hint`]).
    #[doc(hidden)]
    pub fn capacity_hint(&self) -> Option<u64> {
        self.format.row().capacity_hint.and_then(|h| h(&self.source))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_format_has_its_row() {
        for f in [
            TraceFormat::PytorchSnapshot(SnapshotLayout::Recent),
            TraceFormat::PytorchSnapshot(SnapshotLayout::Legacy2_0),
            TraceFormat::LifetimeCsv,
            TraceFormat::RmmLog,
        ] {
            let key = match f {
                TraceFormat::PytorchSnapshot(_) => TraceFormat::PytorchSnapshot(SnapshotLayout::Recent),
                f => f,
            };
            assert_eq!(f.row().format, key, "{f:?}");
        }
        assert_eq!(capacity_in_name(Path::new("data/K.1048576.csv")), Some(1_048_576));
        assert_eq!(capacity_in_name(Path::new("1048576.csv")), None);
    }

    /// Pickles of protocol 0 and 1 (as `pickle.dumps(..., protocol)` of Python 3 and 2 writes a dict or a
    /// list) are recognised from their content, without a `.pickle` name; the CSV headers are not.
    #[test]
    fn protocol_0_and_1_pickles_are_recognised_by_content() {
        let pickle = TraceFormat::PytorchSnapshot(SnapshotLayout::Recent);
        for start in
            [&b"(dp0\nVsegments\n"[..], b"(lp0\n(dp1\n", b"(dp1\nS'segments'\n", b"}q\x00X\x08", b"]q\x00}q\x01"]
        {
            assert_eq!(detect(Path::new("<bytes>"), start).unwrap(), pickle, "{start:?}");
        }
        for csv in [&b"id,lower,upper,size\n"[..], b"Thread,Time,Action,Pointer,Size,Stream\n", b"(d,x\n", b"}\n"] {
            assert_ne!(detect(Path::new("<bytes>"), csv).ok(), Some(pickle), "{csv:?}");
        }
    }
}
