//! The event model every reader produces: a [`Trace`] of per-device [`DeviceTrace`]s, each a flat
//! vector of 48-byte [`Event`]s with dense block and segment ids, the blocks and segments alive before
//! the first event, and the end state a snapshot records.

use std::fmt;
use std::path::PathBuf;

use super::AllocatorSettings;

/// Marks an [`Event::id`] that names no block or segment (`oom`, `snapshot`, `segment_map`, ...).
#[doc(hidden)]
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
    /// The format's name ([`FormatRow::name`](super::FormatRow::name)), with the PyTorch 2.0 layout said.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.row().name)?;
        if *self == TraceFormat::PytorchSnapshot(SnapshotLayout::Legacy2_0) {
            f.write_str(" (2.0 layout)")?;
        }
        Ok(())
    }
}

/// Which generation of the PyTorch snapshot schema a file uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[doc(hidden)]
pub enum SnapshotLayout {
    /// PyTorch 2.0: blocks carry `history` and no `address` (addresses are implicit).
    Legacy2_0,
    /// PyTorch 2.1 and later: blocks carry `address`; may have `allocator_settings`.
    Recent,
}

/// What [`Event::addr`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[doc(hidden)]
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
    #[doc(hidden)]
    pub fn is_block(self) -> bool {
        matches!(self, EventKind::Alloc | EventKind::FreeRequested | EventKind::Free)
    }
    /// The segment kinds (alloc/free/map/unmap).
    #[doc(hidden)]
    pub fn is_segment(self) -> bool {
        matches!(
            self,
            EventKind::SegmentAlloc | EventKind::SegmentFree | EventKind::SegmentMap | EventKind::SegmentUnmap
        )
    }
    /// The name PyTorch uses in `device_traces` for this kind.
    #[doc(hidden)]
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

    /// The name files of `format` give this kind ([`FormatRow::action_names`](super::FormatRow::action_names)):
    /// RMM's `Action` as `logging_resource_adaptor` writes it (`allocate`, `free`, `allocate failure`), a
    /// lifetime CSV's `free` (its rows' `upper` end); PyTorch's ([`pytorch_name`](Self::pytorch_name))
    /// otherwise.
    #[doc(hidden)]
    pub fn name_in(self, format: TraceFormat) -> &'static str {
        format.row().action_names.iter().find(|(k, _)| *k == self).map_or_else(|| self.pytorch_name(), |(_, n)| n)
    }
}

/// One trace event (48 bytes, `Copy`; stack frames are not kept).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Event {
    /// What happened.
    pub kind: EventKind,
    /// The memory pool the event belongs to: an index into [`DeviceTrace::mempools`] (0: the default
    /// pool). From the entry's own `pool_id` where the file records one (PyTorch ≥ 2.11, PR#177717),
    /// else the pool of the segment that holds the address at that moment ([`DeviceTrace::mempools`]).
    pub mempool: u16,
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

/// A memory pool of PyTorch's caching allocator (`MempoolId_t`, a pair of integers; a snapshot's
/// `segment_pool_id`, an entry's `pool_id`): `(0, 0)` is the default pool, which ordinary requests use;
/// any other is a private pool (a CUDA graph's, a `torch.cuda.MemPool`'s, or a serving engine's such as
/// vLLM's sleep-mode pools) that only allocations made while it is active use
/// (`c10/cuda/CUDACachingAllocator.cpp`: `get_pool`, `beginAllocateToPool`, `PrivatePool`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, serde::Serialize)]
pub struct MempoolId(pub i64, pub i64);

impl MempoolId {
    /// The default pool `(0, 0)`.
    #[doc(hidden)]
    pub const DEFAULT: MempoolId = MempoolId(0, 0);

    /// Whether this is a private pool (not `(0, 0)`).
    #[doc(hidden)]
    pub fn is_private(self) -> bool {
        self != MempoolId::DEFAULT
    }
}

impl fmt::Display for MempoolId {
    /// `(0, 1)`, as PyTorch prints a `MempoolId_t`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({}, {})", self.0, self.1)
    }
}

/// A segment that exists before the first event.
#[derive(Debug, Clone, PartialEq)]
#[doc(hidden)]
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
    /// Memory pool: an index into [`DeviceTrace::mempools`] (0: the default pool).
    pub mempool: u16,
    /// Whether it is an expandable segment.
    pub is_expandable: bool,
}

/// A block that is allocated before the first event (recording began mid-run).
#[derive(Debug, Clone, PartialEq)]
#[doc(hidden)]
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
    /// Memory pool (`segment_pool_id`; a block's `pool_id` where the segment records none; else the
    /// default pool).
    pub mempool: MempoolId,
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
    #[doc(hidden)]
    pub fn reserved_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.size).sum()
    }
    /// Allocated bytes: the sum of the (rounded) sizes of active blocks, as PyTorch's
    /// `allocated_size` counts them.
    #[doc(hidden)]
    pub fn allocated_bytes(&self) -> u64 {
        self.blocks().filter(|b| b.state != BlockStatus::Inactive).map(|b| b.size).sum()
    }
    /// Requested bytes of active blocks.
    #[doc(hidden)]
    pub fn requested_bytes(&self) -> u64 {
        self.blocks().filter(|b| b.state != BlockStatus::Inactive).map(|b| b.requested_size).sum()
    }
    /// Number of segments.
    #[doc(hidden)]
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }
    /// Number of blocks, all states.
    #[doc(hidden)]
    pub fn block_count(&self) -> usize {
        self.segments.iter().map(|s| s.blocks.len()).sum()
    }
    /// Bytes the allocator added to every request before rounding to 512 B, inferred from the active
    /// blocks: 32 when some block's size is `round512(requested + 32)` but not `round512(requested)` and
    /// none is the reverse (torch_npu's `AddPadSize`), else 0 (PyTorch).
    #[doc(hidden)]
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
    #[doc(hidden)]
    pub fn largest_free_block(&self) -> u64 {
        self.blocks().filter(|b| b.state == BlockStatus::Inactive).map(|b| b.size).max().unwrap_or(0)
    }
    /// All blocks of all segments.
    #[doc(hidden)]
    pub fn blocks(&self) -> impl Iterator<Item = &BlockState> {
        self.segments.iter().flat_map(|s| s.blocks.iter())
    }
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
    /// The memory pools of this device, indexed by [`Event::mempool`] and [`SegmentSeed::mempool`]:
    /// element 0 is always the default pool `(0, 0)`, then the private pools in the order the file first
    /// names them.
    pub mempools: Vec<MempoolId>,
    /// What the stack frames of each `segment_free` / `segment_unmap` event show about who released it,
    /// `(event index, caller)` ascending by index, for the events whose frames say
    /// ([`ReleaseCaller`]; stack frames are otherwise not kept).
    pub release_callers: Vec<(usize, ReleaseCaller)>,
    /// What the file says of how its history was recorded ([`HistoryRecording`]).
    pub recording: HistoryRecording,
}

/// Who released a segment, as the stack frames of its `segment_free` / `segment_unmap` event show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
#[doc(hidden)]
pub enum ReleaseCaller {
    /// A frame is PyTorch's `DeviceCachingAllocator::malloc` (or the `release_cached_blocks` /
    /// `release_available_cached_blocks` / `garbage_collect_cached_blocks` it calls) and none is
    /// `empty_cache`: the allocator released while serving a request (after a failed `cudaMalloc`, or
    /// its garbage collection).
    Malloc,
    /// A frame is `empty_cache` (Python, `torch/cuda/memory.py`) or `emptyCache` (C++): the program
    /// asked for it.
    EmptyCache,
}

/// What a snapshot says of how its history (`device_traces`) was recorded, beyond the events
/// themselves. Every field is `None` where the file does not say.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[doc(hidden)]
pub struct HistoryRecording {
    /// The ring buffer's size in entries (`allocator_settings.trace_alloc_max_entries`, PyTorch
    /// PR#179276).
    pub max_entries: Option<u64>,
    /// Whether the ring buffer overflowed, i.e. older entries were overwritten
    /// (`allocator_settings.trace_alloc_overflowed`, PyTorch PR#179276).
    pub overflowed: Option<bool>,
    /// Actions the recording skipped (`_record_memory_history(skip_actions=[...])`, PyTorch PR#168183),
    /// as the file names them (`allocator_settings.skip_actions` or a top-level `skip_actions`).
    pub skip_actions: Option<Vec<String>>,
}

impl DeviceTrace {
    /// An empty trace for `device`.
    #[doc(hidden)]
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
            mempools: vec![MempoolId::DEFAULT],
            release_callers: Vec::new(),
            recording: HistoryRecording::default(),
        }
    }

    /// The memory pool of index `i` ([`Event::mempool`], [`SegmentSeed::mempool`]); the default pool
    /// for an index out of range.
    #[doc(hidden)]
    pub fn mempool(&self, i: u16) -> MempoolId {
        self.mempools.get(i as usize).copied().unwrap_or_default()
    }

    /// The index of memory pool `id` in [`DeviceTrace::mempools`], added if new (saturating at
    /// `u16::MAX` pools, the last index then standing for every further pool).
    #[doc(hidden)]
    pub fn mempool_index(&mut self, id: MempoolId) -> u16 {
        match self.mempools.iter().position(|&m| m == id) {
            Some(i) => i as u16,
            None if self.mempools.len() < u16::MAX as usize => {
                self.mempools.push(id);
                (self.mempools.len() - 1) as u16
            }
            None => u16::MAX - 1,
        }
    }

    /// Number of events of `kind`.
    #[doc(hidden)]
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

#[cfg(test)]
mod tests {
    #[test]
    fn event_is_compact() {
        assert_eq!(std::mem::size_of::<super::Event>(), 48);
    }
}
