//! Allocation traces: readers for real-world trace files and one event model for replay.
//!
//! Three formats are read, detected from the file's content:
//!
//! * PyTorch CUDA memory snapshots (`torch.cuda.memory._dump_snapshot` pickles), both the
//!   PyTorch 2.0 layout (per-block `history`, implicit block addresses) and the recent layout
//!   (`device_traces`, `allocator_settings`), every device in the file ([`pytorch`]);
//! * buffer-lifetime CSV `id,lower,upper,size` as used by minimalloc ([`csv_lifetime`]);
//! * RMM `logging_resource_adaptor` CSV `Thread,Time,Action,Pointer,Size,Stream` ([`rmm`]).
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

use std::fmt;
use std::path::{Path, PathBuf};

pub mod csv_lifetime;
mod pickle;
pub mod pickle_write;
pub mod pytorch;
pub mod repeat;
pub mod rmm;
mod validate;

pub use validate::{validate, ValidationError, ValidationErrorKind};

/// Marks an [`Event::id`] that names no block or segment (`oom`, `snapshot`, `segment_map`, ...).
pub const NO_ID: u32 = u32::MAX;

/// The file format a [`Trace`] was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceFormat {
    /// A PyTorch CUDA memory snapshot pickle.
    PytorchSnapshot(SnapshotLayout),
    /// minimalloc's buffer-lifetime CSV `id,lower,upper,size`.
    LifetimeCsv,
    /// RMM `logging_resource_adaptor` CSV `Thread,Time,Action,Pointer,Size,Stream`.
    RmmLog,
}

impl fmt::Display for TraceFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TraceFormat::PytorchSnapshot(SnapshotLayout::Legacy2_0) => "PyTorch memory snapshot (2.0 layout)",
            TraceFormat::PytorchSnapshot(SnapshotLayout::Recent) => "PyTorch memory snapshot",
            TraceFormat::LifetimeCsv => "buffer-lifetime CSV (id,lower,upper,size)",
            TraceFormat::RmmLog => "RMM logging CSV",
        })
    }
}

/// Which generation of the PyTorch snapshot schema a file uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotLayout {
    /// PyTorch 2.0: blocks carry `history` and no `address` (addresses are implicit).
    Legacy2_0,
    /// PyTorch 2.1 and later: blocks carry `address`; may have `allocator_settings`.
    Recent,
}

/// What [`Event::addr`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressKind {
    /// Real device virtual addresses, in bytes.
    Device,
    /// No addresses in the file: `addr` is a buffer handle (for [`TraceFormat::LifetimeCsv`], the
    /// 0-based data row). A replay must choose placements.
    Handle,
}

/// The unit of [`Event::time_us`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeUnit {
    /// Microseconds (PyTorch `time_us`: since the epoch; RMM: since midnight of the first row).
    Microseconds,
    /// Abstract, unit-less ticks (minimalloc `lower`/`upper`).
    Ticks,
}

/// What an [`Event`] does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum EventKind {
    /// A block of `size` requested bytes was allocated at `addr`.
    Alloc,
    /// The user released the block at `addr` (PyTorch `free_requested`); it is still allocated
    /// until the matching [`EventKind::Free`] (they differ when other streams still use it).
    FreeRequested,
    /// The block at `addr` went back to the pool (PyTorch `free_completed`, RMM `free`).
    Free,
    /// A segment of `size` bytes was reserved from the driver at `addr` (`cudaMalloc`).
    SegmentAlloc,
    /// The segment at `addr` was returned to the driver (`cudaFree`).
    SegmentFree,
    /// Expandable segments: `size` bytes of physical memory were mapped at `addr`.
    SegmentMap,
    /// Expandable segments: `size` bytes at `addr` were unmapped.
    SegmentUnmap,
    /// An allocation of `size` bytes failed (PyTorch `oom`, RMM `allocate failure`).
    Oom,
    /// The user took a snapshot here (marker only).
    Snapshot,
    /// An action this model does not use (PyTorch `annotate`, `workspace_snapshot`, ...);
    /// kept so that event indices match the file. Replay ignores it.
    Other,
}

impl EventKind {
    /// The block-level kinds: alloc and the two frees.
    pub fn is_block(self) -> bool {
        matches!(self, EventKind::Alloc | EventKind::FreeRequested | EventKind::Free)
    }
    /// The segment kinds (alloc/free/map/unmap).
    pub fn is_segment(self) -> bool {
        matches!(
            self,
            EventKind::SegmentAlloc | EventKind::SegmentFree | EventKind::SegmentMap | EventKind::SegmentUnmap
        )
    }
    /// The name PyTorch uses in `device_traces` for this kind.
    pub fn pytorch_name(self) -> &'static str {
        match self {
            EventKind::Alloc => "alloc",
            EventKind::FreeRequested => "free_requested",
            EventKind::Free => "free_completed",
            EventKind::SegmentAlloc => "segment_alloc",
            EventKind::SegmentFree => "segment_free",
            EventKind::SegmentMap => "segment_map",
            EventKind::SegmentUnmap => "segment_unmap",
            EventKind::Oom => "oom",
            EventKind::Snapshot => "snapshot",
            EventKind::Other => "other",
        }
    }

    /// The name files of `format` give this kind: PyTorch's ([`pytorch_name`](Self::pytorch_name)), RMM's
    /// `Action` as `logging_resource_adaptor` writes it (`allocate`, `free`, `allocate failure`), or a lifetime CSV's `alloc`/`free` (its
    /// rows' `lower`/`upper` ends). Kinds a format cannot produce keep PyTorch's name.
    pub fn name_in(self, format: TraceFormat) -> &'static str {
        match (format, self) {
            (TraceFormat::RmmLog, EventKind::Alloc) => "allocate",
            (TraceFormat::RmmLog | TraceFormat::LifetimeCsv, EventKind::Free) => "free",
            (TraceFormat::RmmLog, EventKind::Oom) => "allocate failure",
            _ => self.pytorch_name(),
        }
    }
}

/// One trace event (48 bytes, `Copy`; stack frames are not kept).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Event {
    /// What happened.
    pub kind: EventKind,
    /// Dense number of the block (block kinds) or segment (`SegmentAlloc`/`SegmentFree`) this
    /// event is about: ids `0..DeviceTrace::block_ids` for blocks, `0..DeviceTrace::segment_ids`
    /// for segments, counting the initial ones first. An alloc and its frees share the id.
    /// [`NO_ID`] for the other kinds.
    pub id: u32,
    /// Device address in bytes (see [`AddressKind`]); 0 when the event has none (`oom`).
    pub addr: u64,
    /// Bytes: the *requested* size for block events and `oom`, the segment or range size for
    /// segment events.
    pub size: u64,
    /// CUDA stream as an integer (`cudaStream_t`); 0 = default stream.
    pub stream: i64,
    /// Time stamp (see [`Trace::time_unit`]); `None` when the file has none.
    pub time_us: Option<i64>,
}

/// Which allocator pool a segment belongs to (PyTorch `segment_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pool {
    /// Small-request pool (requests ≤ 1 MiB, 2 MiB segments).
    Small,
    /// Large-request pool.
    Large,
    /// Not recorded.
    Unknown,
}

/// A segment that exists before the first event.
#[derive(Debug, Clone, PartialEq)]
pub struct SegmentSeed {
    /// Segment id (see [`Event::id`]).
    pub id: u32,
    /// Start address, bytes.
    pub addr: u64,
    /// Size, bytes.
    pub size: u64,
    /// Stream the segment belongs to.
    pub stream: i64,
    /// Pool.
    pub pool: Pool,
    /// Whether it is an expandable segment.
    pub is_expandable: bool,
}

/// A block that is allocated before the first event (recording began mid-run).
#[derive(Debug, Clone, PartialEq)]
pub struct BlockSeed {
    /// Block id (see [`Event::id`]).
    pub id: u32,
    /// Address, bytes.
    pub addr: u64,
    /// Requested size, bytes (as an alloc event would carry).
    pub size: u64,
    /// Stream.
    pub stream: i64,
    /// Already released by the user (`free_requested` happened before recording), waiting for its
    /// `free_completed`.
    pub pending_free: bool,
}

/// State of one block in a snapshot's `segments`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockStatus {
    /// Allocated to a tensor.
    ActiveAllocated,
    /// Freed by the user, still in use by another stream.
    ActivePendingFree,
    /// Free (a hole in its segment).
    Inactive,
}

/// One block of a [`SegmentState`].
#[derive(Debug, Clone, PartialEq)]
pub struct BlockState {
    /// Address, bytes (explicit in recent files; segment address plus earlier block sizes in 2.0).
    pub addr: u64,
    /// Bytes the block occupies (rounded).
    pub size: u64,
    /// Bytes the user asked for (≤ `size`; 0 for inactive blocks in recent files).
    pub requested_size: u64,
    /// State.
    pub state: BlockStatus,
}

/// One segment of a [`SnapshotState`].
#[derive(Debug, Clone, PartialEq)]
pub struct SegmentState {
    /// Start address, bytes.
    pub addr: u64,
    /// `total_size`, bytes.
    pub size: u64,
    /// Stream.
    pub stream: i64,
    /// Pool.
    pub pool: Pool,
    /// Expandable segment.
    pub is_expandable: bool,
    /// Blocks in address order; they tile the segment.
    pub blocks: Vec<BlockState>,
}

/// The allocator state a snapshot records at its end, for one device.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SnapshotState {
    /// Segments in file order.
    pub segments: Vec<SegmentState>,
}

impl SnapshotState {
    /// Reserved bytes: the sum of segment sizes.
    pub fn reserved_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.size).sum()
    }
    /// Allocated bytes: the sum of the (rounded) sizes of active blocks, as PyTorch's
    /// `allocated_size` counts them.
    pub fn allocated_bytes(&self) -> u64 {
        self.blocks().filter(|b| b.state != BlockStatus::Inactive).map(|b| b.size).sum()
    }
    /// Requested bytes of active blocks.
    pub fn requested_bytes(&self) -> u64 {
        self.blocks().filter(|b| b.state != BlockStatus::Inactive).map(|b| b.requested_size).sum()
    }
    /// Number of segments.
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }
    /// Number of blocks, all states.
    pub fn block_count(&self) -> usize {
        self.segments.iter().map(|s| s.blocks.len()).sum()
    }
    /// Bytes the allocator added to every request before rounding to 512 B, inferred from the active
    /// blocks: 32 when some block's size is `round512(requested + 32)` but not `round512(requested)` and
    /// none is the reverse (torch_npu's `AddPadSize`), else 0 (PyTorch).
    pub fn request_pad(&self) -> u64 {
        let r = |x: u64| x.max(1).div_ceil(512).saturating_mul(512);
        let mut padded = false;
        for b in self.blocks().filter(|b| b.state != BlockStatus::Inactive && b.requested_size > 0) {
            let (p, n) = (b.size == r(b.requested_size + 32), b.size == r(b.requested_size));
            if n && !p {
                // A block that only the plain rounding explains: no pad (no need to look further).
                return 0;
            }
            padded |= p && !n;
        }
        if padded {
            32
        } else {
            0
        }
    }
    /// Size of the largest inactive block, bytes.
    pub fn largest_free_block(&self) -> u64 {
        self.blocks().filter(|b| b.state == BlockStatus::Inactive).map(|b| b.size).max().unwrap_or(0)
    }
    /// All blocks of all segments.
    pub fn blocks(&self) -> impl Iterator<Item = &BlockState> {
        self.segments.iter().flat_map(|s| s.blocks.iter())
    }
}

/// PyTorch caching-allocator settings recorded in a snapshot (`allocator_settings`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AllocatorSettings {
    /// `PYTORCH_CUDA_ALLOC_CONF` as set ("" when unset).
    pub alloc_conf: Option<String>,
    /// `max_split_size` in bytes; -1 = unlimited.
    pub max_split_size: Option<i64>,
    /// `garbage_collection_threshold` (fraction of memory, 0 = off).
    pub garbage_collection_threshold: Option<f64>,
    /// `expandable_segments`.
    pub expandable_segments: Option<bool>,
    /// `roundup_power2_divisions` as (interval start in MiB, divisions) pairs.
    pub roundup_power2_divisions: Vec<(u64, u64)>,
    /// Every other scalar setting, as `(key, value rendered as text)`.
    pub other: Vec<(String, String)>,
}

/// The mapped ranges of expandable segments before the first event of `trace`, one [`SegmentSeed`]
/// (with `is_expandable`, id unset) per maximal contiguous range: the final state's expandable segments
/// (each a contiguous mapped range, as PyTorch's `snapshot()` lists them), walked back through the
/// events — a `segment_map` was not mapped before it, a `segment_unmap` was. So reserved bytes are
/// counted once: initial ranges + maps − unmaps = the final state (a snapshot whose segments were
/// all mapped during the trace starts at 0). Ranges met only in `segment_unmap` events take the pool
/// of the nearest known range of their stream ([`guess_expandable_pool`]).
pub fn expandable_initial_ranges(trace: &DeviceTrace) -> Vec<SegmentSeed> {
    // (stream, start, end, pool), disjoint, kept sorted by (stream, start).
    let mut m: Vec<(i64, u64, u64, Pool)> = Vec::new();
    let mut known: Vec<(i64, u64, Pool)> = Vec::new();
    if let Some(fin) = &trace.final_state {
        for s in fin.segments.iter().filter(|s| s.is_expandable) {
            m.push((s.stream, s.addr, s.addr.saturating_add(s.size), s.pool));
            known.push((s.stream, s.addr, s.pool));
        }
    }
    for e in trace.events.iter().rev() {
        let end = e.addr.saturating_add(e.size);
        match e.kind {
            EventKind::SegmentMap => {
                let mut out = Vec::with_capacity(m.len() + 1);
                for &(st, a, b, p) in &m {
                    if st != e.stream || b <= e.addr || a >= end {
                        out.push((st, a, b, p));
                        continue;
                    }
                    if a < e.addr {
                        out.push((st, a, e.addr, p));
                    }
                    if b > end {
                        out.push((st, end, b, p));
                    }
                }
                m = out;
            }
            EventKind::SegmentUnmap => {
                let pool = guess_expandable_pool(&known, e.stream, e.addr, e.size);
                known.push((e.stream, e.addr, pool));
                m.retain(|&(st, a, b, _)| st != e.stream || b <= e.addr || a >= end);
                m.push((e.stream, e.addr, end, pool));
            }
            _ => {}
        }
    }
    m.sort_unstable_by_key(|r| (r.0, r.1));
    let mut merged: Vec<(i64, u64, u64, Pool)> = Vec::with_capacity(m.len());
    for r in m {
        match merged.last_mut() {
            Some(l) if l.0 == r.0 && l.2 == r.1 && l.3 == r.3 => l.2 = r.2,
            _ => merged.push(r),
        }
    }
    merged
        .into_iter()
        .map(|(stream, a, b, pool)| SegmentSeed { id: NO_ID, addr: a, size: b - a, stream, pool, is_expandable: true })
        .collect()
}

/// The pool of an expandable range at `addr` of `size` bytes on `stream`: the pool of the nearest
/// range of `known` (`(stream, address, pool)`) on the same stream; with none, large if `size` is a
/// multiple of the large page (20 MiB), else small. (Each pool's ranges lie in one virtual reservation,
/// far from the other pool's.)
pub fn guess_expandable_pool(known: &[(i64, u64, Pool)], stream: i64, addr: u64, size: u64) -> Pool {
    known
        .iter()
        .filter(|k| k.0 == stream && k.2 != Pool::Unknown)
        .min_by_key(|k| k.1.abs_diff(addr))
        .map(|k| k.2)
        .unwrap_or(if size.is_multiple_of(20 << 20) { Pool::Large } else { Pool::Small })
}

/// An `oom` event's extra datum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OomInfo {
    /// Index of the `oom` event in [`DeviceTrace::events`].
    pub event: usize,
    /// Bytes the driver reported free at the failure (`device_free`), when recorded.
    pub device_free: Option<u64>,
}

/// The trace of one device.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceTrace {
    /// Device ordinal.
    pub device: i64,
    /// Events, oldest first.
    pub events: Vec<Event>,
    /// Segments that exist before event 0 (seeded from the snapshot's `segments` and from
    /// `segment_free` events of segments the trace never allocated).
    pub initial_segments: Vec<SegmentSeed>,
    /// Blocks allocated before event 0 (seeded from the snapshot's active blocks that no event
    /// allocates, and from frees of blocks the trace never allocated).
    pub initial_blocks: Vec<BlockSeed>,
    /// Number of block ids in use: `initial_blocks.len()` plus one per `Alloc` event.
    pub block_ids: u32,
    /// Number of segment ids in use: `initial_segments.len()` plus one per `SegmentAlloc` event.
    pub segment_ids: u32,
    /// The state the snapshot records at its end (PyTorch files only).
    pub final_state: Option<SnapshotState>,
    /// Allocator settings (recent PyTorch files only).
    pub allocator_settings: Option<AllocatorSettings>,
    /// Extra data of `oom` events.
    pub ooms: Vec<OomInfo>,
}

impl DeviceTrace {
    /// An empty trace for `device`.
    pub fn new(device: i64) -> Self {
        DeviceTrace {
            device,
            events: Vec::new(),
            initial_segments: Vec::new(),
            initial_blocks: Vec::new(),
            block_ids: 0,
            segment_ids: 0,
            final_state: None,
            allocator_settings: None,
            ooms: Vec::new(),
        }
    }

    /// Number of events of `kind`.
    pub fn count(&self, kind: EventKind) -> usize {
        self.events.iter().filter(|e| e.kind == kind).count()
    }
}

/// A trace file, read.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// The file it was read from.
    pub source: PathBuf,
    /// Its format.
    pub format: TraceFormat,
    /// What `Event::addr` holds.
    pub addresses: AddressKind,
    /// Unit of `Event::time_us`.
    pub time_unit: TimeUnit,
    /// One entry per device that has events or segments, by ascending ordinal.
    pub devices: Vec<DeviceTrace>,
}

impl Trace {
    /// Total number of events over all devices.
    pub fn event_count(&self) -> usize {
        self.devices.iter().map(|d| d.events.len()).sum()
    }
}

/// Where in a file a [`TraceError`] was found.
#[derive(Debug, Clone, PartialEq)]
pub enum Location {
    /// Byte offset from the start of the file.
    Byte(usize),
    /// 1-based line of a text file.
    Line(u64),
    /// Event `index` of device `device` (0-based index into `device_traces[device]` and into
    /// [`DeviceTrace::events`]); `field` names the offending key, if any.
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
}

impl TraceError {
    /// Exit code a command-line tool should use for any `TraceError` (bad input).
    pub const EXIT_CODE: i32 = 2;

    /// The same as [`TraceError::EXIT_CODE`], for `map_err` chains.
    pub fn exit_code(&self) -> i32 {
        Self::EXIT_CODE
    }

    /// The file the error is about.
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
            | TraceError::Event { path, .. } => path,
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
    let bytes = std::fs::read(path).map_err(io)?;
    Ok((parse_trace(path, &bytes)?, bytes))
}

/// Parses trace `bytes` (the content of the file `path`, which is only used in messages and in
/// [`Trace::source`]), detecting the format.
pub fn parse_trace(path: &Path, bytes: &[u8]) -> Result<Trace, TraceError> {
    match detect(path, bytes)? {
        TraceFormat::PytorchSnapshot(_) => pytorch::parse(path, bytes),
        TraceFormat::LifetimeCsv => csv_lifetime::parse(path, &lone_cr_to_lf(bytes)),
        TraceFormat::RmmLog => rmm::parse(path, &lone_cr_to_lf(bytes)),
    }
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

/// Detects the format of `bytes` (PyTorch layout is refined by the reader).
pub fn detect(path: &Path, bytes: &[u8]) -> Result<TraceFormat, TraceError> {
    if bytes.is_empty() {
        return Err(TraceError::Empty { path: path.to_path_buf() });
    }
    if bytes[0] == 0x80 {
        return Ok(TraceFormat::PytorchSnapshot(SnapshotLayout::Recent));
    }
    let text = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    // Lines end in `\n`, `\r\n` or a lone `\r` (the CSV reader takes all three).
    let first = text.split(|&b| b == b'\n' || b == b'\r').next().unwrap_or(b"");
    let header: Vec<String> =
        String::from_utf8_lossy(first).split(',').map(|c| c.trim().to_ascii_lowercase()).collect();
    if header.len() >= 4 && header[..4] == ["id", "lower", "upper", "size"] {
        return Ok(TraceFormat::LifetimeCsv);
    }
    if header == ["thread", "time", "action", "pointer", "size", "stream"] {
        return Ok(TraceFormat::RmmLog);
    }
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
    if matches!(ext.as_str(), "pickle" | "pkl") {
        return Ok(TraceFormat::PytorchSnapshot(SnapshotLayout::Recent));
    }
    let start = one_line(String::from_utf8_lossy(&bytes[..bytes.len().min(24)]).into_owned());
    Err(TraceError::UnknownFormat { path: path.to_path_buf(), start })
}

#[cfg(test)]
mod tests {
    #[test]
    fn event_is_compact() {
        assert_eq!(std::mem::size_of::<super::Event>(), 48);
    }
}
