//! Reader for PyTorch CUDA memory snapshots (`torch.cuda.memory._dump_snapshot` pickles).
//!
//! Both schema generations are read (see DESIGN.md §3.4):
//!
//! * PyTorch 2.0: blocks have `size`, `requested_size`, `state` and `history`, but no `address`:
//!   a block's address is its segment's `address` plus the sizes of the blocks before it;
//! * PyTorch 2.1 and later: blocks have `address`; `device_traces` events carry `time_us`
//!   (≥ 2.2); `allocator_settings` (≥ 2.3).
//!
//! Every key is optional except the ones an event or block cannot do without (`action`;
//! `addr` and `size` of block and segment events; a segment's `address` and `total_size`; a
//! block's `size` and `state`). Unknown keys and actions are ignored (unknown actions become
//! [`EventKind::Other`] so that event indices match the file). Stack frames are skipped, except those of
//! `segment_free` / `segment_unmap` entries, whose function names say who released
//! ([`crate::trace::ReleaseCaller`]).
//!
//! Memory pools: a segment's `segment_pool_id` (else a block's `pool_id`), an entry's `pool_id`; each
//! event's pool is linked in `mempools` ([`crate::trace::Event::mempool`]). The history's recording:
//! `allocator_settings`' `trace_alloc_max_entries`, `trace_alloc_overflowed` (a value, or one per device)
//! and `skip_actions` (there or at the top level) ([`crate::trace::HistoryRecording`]).
//!
//! The pickle is decoded by a data-only decoder that refuses every opcode that imports or calls
//! Python code (`GLOBAL`, `STACK_GLOBAL`, `REDUCE`, `BUILD`, `INST`, `OBJ`, `NEWOBJ`...).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

mod frame_path;
mod mempools;
pub(crate) mod pickle;
pub mod pickle_write;
pub(super) mod settings;

use super::limits::{Budget, Exceeded};
use super::validate::{seed_and_link, ValidationErrorKind};
use super::{
    AddressKind, AllocatorSettings, BlockState, BlockStatus, DeviceTrace, Event, EventKind, HistoryRecording, Location,
    MempoolId, OomInfo, Pool, ReleaseCaller, SegmentState, SnapshotLayout, SnapshotState, TimeUnit, Trace, TraceError,
    TraceFormat, NO_ID,
};
pub use frame_path::{normalise, FileOrigin, FramePath};
use pickle::{Node, NodeId, Pickle, PickleErrorKind};

/// Parses the snapshot pickle `bytes` (the content of `path`, used in messages).
pub fn parse(path: &Path, bytes: &[u8]) -> Result<Trace, TraceError> {
    if bytes.is_empty() {
        return Err(TraceError::Empty { path: path.to_path_buf() });
    }
    let p = pickle::decode(bytes).map_err(|e| match e.kind {
        PickleErrorKind::Truncated => TraceError::PickleTruncated { path: path.to_path_buf(), offset: e.offset },
        PickleErrorKind::RunsCode { opcode, global } => TraceError::PickleRunsCode {
            path: path.to_path_buf(),
            offset: e.offset,
            what: match global {
                Some(g) => super::one_line(format!("global `{}`", super::excerpt_plain(&g))),
                None => format!("opcode {opcode}"),
            },
        },
        PickleErrorKind::UnknownOpcode(op) => TraceError::PickleCorrupt {
            path: path.to_path_buf(),
            offset: e.offset,
            message: format!("unknown opcode {op:#04x}"),
        },
        PickleErrorKind::Malformed(m) => {
            TraceError::PickleCorrupt { path: path.to_path_buf(), offset: e.offset, message: super::one_line(m) }
        }
        PickleErrorKind::Limit(limit) => {
            TraceError::Limit { path: path.to_path_buf(), at: Location::Byte(e.offset), limit }
        }
    })?;
    let budget = Budget::for_input(bytes.len(), super::limits::max_memory());
    Reader { p: &p, path, budget }.snapshot()
}

/// The schema walk: every dict entry and list item it visits, and every event and block it makes, is
/// charged to `budget` (module `limits`: the memo lets a small pickle refer to one list many times).
struct Reader<'p, 'a> {
    p: &'p Pickle<'a>,
    path: &'p Path,
    budget: Budget,
}

/// The largest `max_split_size` the caching model refuses (1 MiB, its small-block limit); PyTorch never
/// records one below 20 MiB.
const MIN_MAX_SPLIT_SIZE: i64 = 1 << 20;

/// A raw segment before it is split by device.
struct RawSegment {
    device: i64,
    state: SegmentState,
}

/// What an entry of `device_traces` records besides its [`Event`].
#[derive(Default)]
struct EventExtras {
    /// Its `pool_id` (or `segment_pool_id`), when recorded.
    mempool: Option<MempoolId>,
    /// Who released, for a `segment_free` / `segment_unmap` whose frames say.
    caller: Option<ReleaseCaller>,
}

impl<'p, 'a> Reader<'p, 'a> {
    fn node(&self, id: NodeId) -> Node<'p> {
        self.p.node(id)
    }

    fn bad(&self, at: Location, msg: impl Into<String>) -> TraceError {
        TraceError::schema(self.path, at, msg)
    }

    fn expected(&self, at: Location, what: &str, id: NodeId) -> TraceError {
        let found = match self.node(id) {
            Node::Str(s) if s.len() <= 40 => format!("str {:?}", String::from_utf8_lossy(s)),
            n => n.type_name().to_string(),
        };
        self.bad(at, format!("expected {what}, found {found}"))
    }

    /// The dict `id`, its entries charged to the budget as visited.
    fn dict(&self, id: NodeId, at: impl Fn() -> Location) -> Result<&'p [(NodeId, NodeId)], TraceError> {
        match self.node(id) {
            Node::Dict(d) => {
                self.budget.visit(d.len()).map_err(|e| self.budget.error(e, self.path, at()))?;
                Ok(d)
            }
            _ => Err(self.expected(at(), "a dict", id)),
        }
    }

    /// The list (or tuple) `id`, its items charged to the budget as visited.
    fn list(&self, id: NodeId, at: impl Fn() -> Location) -> Result<&'p [NodeId], TraceError> {
        match self.node(id) {
            Node::List(l) | Node::Tuple(l) => {
                self.budget.visit(l.len()).map_err(|e| self.budget.error(e, self.path, at()))?;
                Ok(l)
            }
            _ => Err(self.expected(at(), "a list", id)),
        }
    }

    /// Charges `n` values of type `T` made at `at` to the budget.
    fn materialise<T>(&self, n: usize, at: impl Fn() -> Location) -> Result<(), TraceError> {
        self.budget.materialise(n.saturating_mul(size_of::<T>())).map_err(|e| self.budget.error(e, self.path, at()))
    }

    fn int(&self, id: NodeId, at: &Location) -> Result<i128, TraceError> {
        match self.node(id) {
            Node::Int(v) => Ok(v),
            Node::BigInt => Err(self.bad(at.clone(), "integer does not fit in 64 bits")),
            _ => Err(self.expected(at.clone(), "an integer", id)),
        }
    }

    /// A size or address: a non-negative integer below 2^64.
    fn u64(&self, id: NodeId, at: Location) -> Result<u64, TraceError> {
        let v = self.int(id, &at)?;
        if v < 0 {
            return Err(self.bad(at, format!("negative value {v} where a size or address belongs")));
        }
        u64::try_from(v).map_err(|_| self.bad(at, format!("value {v} does not fit in 64 bits")))
    }

    /// A signed 64-bit integer; a value in `2^63..2^64` (a pointer-sized handle) wraps.
    fn i64(&self, id: NodeId, at: Location) -> Result<i64, TraceError> {
        let v = self.int(id, &at)?;
        i64::try_from(v)
            .or_else(|_| u64::try_from(v).map(|u| u as i64))
            .map_err(|_| self.bad(at, format!("value {v} does not fit in 64 bits")))
    }

    fn str(&self, id: NodeId, at: Location) -> Result<&'p [u8], TraceError> {
        match self.node(id) {
            Node::Str(s) => Ok(s),
            _ => Err(self.expected(at, "a string", id)),
        }
    }

    fn bool(&self, id: NodeId, at: Location) -> Result<bool, TraceError> {
        match self.node(id) {
            Node::Bool(b) => Ok(b),
            Node::Int(v @ (0 | 1)) => Ok(v == 1),
            _ => Err(self.expected(at, "a bool", id)),
        }
    }

    fn key(&self, k: NodeId) -> &'p [u8] {
        match self.node(k) {
            Node::Str(s) => s,
            _ => b"",
        }
    }

    fn snapshot(&self) -> Result<Trace, TraceError> {
        let root = self.p.root;
        let (segments_node, traces_node, settings_node, skip_node) = match self.node(root) {
            Node::Dict(d) => (
                self.p.get(d, "segments"),
                self.p.get(d, "device_traces"),
                self.p.get(d, "allocator_settings"),
                self.p.get(d, "skip_actions"),
            ),
            // `torch.cuda.memory_snapshot()` (a bare list of segments) pickled on its own.
            Node::List(_) => (Some(root), None, None, None),
            _ => return Err(self.expected(Location::Byte(0), "a dict (a memory snapshot) at the top level", root)),
        };

        let mut legacy = false;
        let mut segments = Vec::new();
        if let Some(n) = segments_node {
            let list = self.list(n, || Location::Key("segments"))?;
            self.materialise::<RawSegment>(list.len(), || Location::Key("segments"))?;
            for (si, &s) in list.iter().enumerate() {
                segments.push(self.segment(si, s, &mut legacy)?);
            }
        }

        let mut traces: Vec<Vec<Event>> = Vec::new();
        let mut extras: Vec<Vec<(usize, EventExtras)>> = Vec::new();
        let mut ooms: Vec<Vec<OomInfo>> = Vec::new();
        if let Some(n) = traces_node {
            for (d, &t) in self.list(n, || Location::Key("device_traces"))?.iter().enumerate() {
                let entries = self.list(t, || Location::Key("device_traces"))?;
                let at = || Location::Event { device: d as i64, index: 0, field: None };
                self.materialise::<Event>(entries.len(), at)?;
                let mut events = Vec::with_capacity(entries.len());
                crate::trace::pages::advise_huge(&mut events);
                let mut dev_extras = Vec::new();
                let mut dev_ooms = Vec::new();
                for (i, &e) in entries.iter().enumerate() {
                    let (ev, x) = self.event(d as i64, i, e, &mut dev_ooms)?;
                    events.push(ev);
                    if x.mempool.is_some() || x.caller.is_some() {
                        dev_extras.push((i, x));
                    }
                }
                traces.push(events);
                extras.push(dev_extras);
                ooms.push(dev_ooms);
            }
        }

        let (settings, mut recording) = match settings_node {
            Some(n) if !matches!(self.node(n), Node::None) => {
                let (s, r) = self.settings(n)?;
                (Some(s), r)
            }
            _ => (None, Vec::new()),
        };
        if let Some(n) = skip_node {
            let skip = self.skip_actions(n);
            for r in recording.iter_mut() {
                r.skip_actions = r.skip_actions.take().or_else(|| skip.clone());
            }
            if recording.is_empty() {
                recording.push(HistoryRecording { skip_actions: skip, ..HistoryRecording::default() });
            }
        }

        // Segments by device, each device's in address order (one pass, not one per device: a file may
        // name many devices). Two segments of one device never share bytes.
        let mut by_device: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
        for (si, s) in segments.iter().enumerate() {
            by_device.entry(s.device).or_default().push(si);
        }
        for (device, list) in &by_device {
            let mut sorted = list.clone();
            sorted.sort_by_key(|&si| (segments[si].state.addr, si));
            for w in sorted.windows(2) {
                let (a, b) = (&segments[w[0]].state, &segments[w[1]].state);
                if b.addr < a.addr + a.size {
                    return Err(self.bad(
                        Location::Segment { segment: w[0].max(w[1]), block: None, field: Some("address") },
                        format!(
                            "device {device}: segments {} [{:#x}, {:#x}) and {} [{:#x}, {:#x}) overlap",
                            w[0],
                            a.addr,
                            a.addr + a.size,
                            w[1],
                            b.addr,
                            b.addr + b.size
                        ),
                    ));
                }
            }
        }
        let mut devices: BTreeSet<i64> = by_device.keys().copied().collect();
        devices.extend(traces.iter().enumerate().filter(|(_, t)| !t.is_empty()).map(|(d, _)| d as i64));
        let mut out = Vec::with_capacity(devices.len());
        // Each device gets a copy of the settings and of the recording's facts: charged as visits, so that a
        // file naming many devices and long settings (both cheap through the memo) stays linear.
        let copy_cost = |s: &str| s.len() / 16 + 1;
        let per_device =
            1 + settings.as_ref().map_or(0, |s| {
                s.roundup_power2_divisions.len()
                    + s.other.iter().map(|(k, v)| copy_cost(k) + copy_cost(v)).sum::<usize>()
                    + s.alloc_conf.as_deref().map_or(0, copy_cost)
            }) + recording
                .iter()
                .map(|r| r.skip_actions.as_ref().map_or(0, |v| v.iter().map(|a| copy_cost(a)).sum()))
                .max()
                .unwrap_or(0);
        for device in devices {
            self.budget
                .visit(per_device)
                .map_err(|e| self.budget.error(e, self.path, Location::Key("allocator_settings")))?;
            let idx = usize::try_from(device).ok().filter(|&d| d < traces.len());
            let mut dt = DeviceTrace::new(device);
            let mut dev_extras = Vec::new();
            if let Some(d) = idx {
                dt.events = std::mem::take(&mut traces[d]);
                dt.ooms = std::mem::take(&mut ooms[d]);
                dev_extras = std::mem::take(&mut extras[d]);
            }
            // The recording's facts are per device where the file lists them so, else one for all.
            dt.recording = match recording.len() {
                0 => HistoryRecording::default(),
                1 => recording[0].clone(),
                _ => idx.and_then(|d| recording.get(d)).cloned().unwrap_or_default(),
            };
            dt.release_callers = dev_extras.iter().filter_map(|(i, x)| x.caller.map(|c| (*i, c))).collect();
            if segments_node.is_some() {
                let segs = by_device
                    .get(&device)
                    .map_or_else(Vec::new, |l| l.iter().map(|&si| segments[si].state.clone()).collect());
                dt.final_state = Some(SnapshotState { segments: segs });
            }
            dt.allocator_settings = settings.clone();
            seed_and_link(&mut dt).map_err(|e| match e.kind {
                ValidationErrorKind::DuplicateSeed { addr } => self.bad(
                    Location::Key("segments"),
                    format!("device {device}: two allocated blocks or two segments at address {addr:#x}"),
                ),
                _ => TraceError::Event {
                    path: self.path.to_path_buf(),
                    format: TraceFormat::PytorchSnapshot(if legacy {
                        SnapshotLayout::Legacy2_0
                    } else {
                        SnapshotLayout::Recent
                    }),
                    at: Location::Event { device, index: e.index, field: None },
                    source: Box::new(e),
                },
            })?;
            let recorded: Vec<(usize, MempoolId)> =
                dev_extras.iter().filter_map(|(i, x)| x.mempool.map(|m| (*i, m))).collect();
            mempools::link(&mut dt, &recorded);
            out.push(dt);
        }

        let layout = if legacy { SnapshotLayout::Legacy2_0 } else { SnapshotLayout::Recent };
        Ok(Trace {
            source: self.path.to_path_buf(),
            format: TraceFormat::PytorchSnapshot(layout),
            addresses: AddressKind::Device,
            time_unit: TimeUnit::Microseconds,
            devices: out,
        })
    }

    fn segment(&self, si: usize, s: NodeId, legacy: &mut bool) -> Result<RawSegment, TraceError> {
        let at = |field| Location::Segment { segment: si, block: None, field };
        let d = self.dict(s, || at(None))?;
        let (mut device, mut addr, mut size, mut stream, mut pool, mut expandable, mut blocks) =
            (0i64, None, None, 0i64, Pool::Unknown, false, None);
        let mut mempool = None;
        for &(k, v) in d {
            match self.key(k) {
                b"device" => device = self.i64(v, at(Some("device")))?,
                b"address" => addr = Some(self.u64(v, at(Some("address")))?),
                b"total_size" => size = Some(self.u64(v, at(Some("total_size")))?),
                b"stream" => stream = self.i64(v, at(Some("stream")))?,
                b"segment_type" => {
                    pool = match self.str(v, at(Some("segment_type")))? {
                        b"small" => Pool::Small,
                        b"large" => Pool::Large,
                        _ => Pool::Unknown,
                    }
                }
                b"is_expandable" => expandable = self.bool(v, at(Some("is_expandable")))?,
                b"segment_pool_id" => mempool = self.mempool_id(v, at(Some("segment_pool_id")))?,
                b"blocks" => blocks = Some(v),
                _ => {}
            }
        }
        let addr = addr.ok_or_else(|| self.bad(at(None), "missing `address`"))?;
        let size = size.ok_or_else(|| self.bad(at(None), "missing `total_size`"))?;
        if addr.checked_add(size).is_none() {
            return Err(self.bad(at(None), format!("address {addr:#x} + total_size {size} overflows 64 bits")));
        }
        let mut out = Vec::new();
        if let Some(b) = blocks {
            let list = self.list(b, || at(Some("blocks")))?;
            self.materialise::<BlockState>(list.len(), || at(Some("blocks")))?;
            out.reserve(list.len());
            let mut cursor = addr;
            for (bi, &b) in list.iter().enumerate() {
                let at = |field| Location::Segment { segment: si, block: Some(bi), field };
                let bd = self.dict(b, || at(None))?;
                let (mut baddr, mut bsize, mut req, mut state) = (None, None, None, None);
                for &(k, v) in bd {
                    match self.key(k) {
                        b"address" => baddr = Some(self.u64(v, at(Some("address")))?),
                        b"size" => bsize = Some(self.u64(v, at(Some("size")))?),
                        b"requested_size" => req = Some(self.u64(v, at(Some("requested_size")))?),
                        b"state" => {
                            state = Some(match self.str(v, at(Some("state")))? {
                                b"active_allocated" => BlockStatus::ActiveAllocated,
                                b"active_pending_free" | b"active_awaiting_free" => BlockStatus::ActivePendingFree,
                                b"inactive" => BlockStatus::Inactive,
                                other => {
                                    let s = String::from_utf8_lossy(other);
                                    return Err(self.bad(
                                        at(Some("state")),
                                        format!("unknown block state {}", super::excerpt(&s)),
                                    ));
                                }
                            })
                        }
                        b"history" => *legacy = true,
                        b"pool_id" => {
                            if let Some(m) = self.mempool_id(v, at(Some("pool_id")))? {
                                mempool.get_or_insert(m);
                            }
                        }
                        _ => {}
                    }
                }
                let bsize = bsize.ok_or_else(|| self.bad(at(None), "missing `size`"))?;
                let state = state.ok_or_else(|| self.bad(at(None), "missing `state`"))?;
                let baddr = match baddr {
                    Some(a) => a,
                    None => {
                        *legacy = true;
                        cursor
                    }
                };
                // Blocks tile their segment in address order (PyTorch lists them by walking the
                // segment's `next` links), so a block before the previous one's end, or outside its
                // segment, is a corrupt file; accepting it would count bytes twice.
                if baddr < cursor || baddr < addr {
                    return Err(self.bad(
                        at(Some("address")),
                        format!("block at {baddr:#x} starts before the end of the previous block or segment start ({cursor:#x})"),
                    ));
                }
                let end = baddr.checked_add(bsize).ok_or_else(|| {
                    self.bad(at(None), format!("address {baddr:#x} + size {bsize} overflows 64 bits"))
                })?;
                if end > addr + size {
                    return Err(self.bad(
                        at(Some("size")),
                        format!("block [{baddr:#x}, {end:#x}) ends past its segment's end {:#x}", addr + size),
                    ));
                }
                cursor = end;
                let requested_size = req.unwrap_or(0);
                // An inactive block keeps the request of its last user (often larger: the block was
                // split since), but a live block holds its request.
                if state != BlockStatus::Inactive && requested_size > bsize {
                    return Err(self.bad(
                        at(Some("requested_size")),
                        format!("live block of {bsize} B has requested_size {requested_size} B, more than its size"),
                    ));
                }
                out.push(BlockState { addr: baddr, size: bsize, requested_size, state });
            }
        }
        Ok(RawSegment {
            device,
            state: SegmentState {
                addr,
                size,
                stream,
                pool,
                mempool: mempool.unwrap_or_default(),
                is_expandable: expandable,
                blocks: out,
            },
        })
    }

    fn event(
        &self,
        device: i64,
        index: usize,
        e: NodeId,
        ooms: &mut Vec<OomInfo>,
    ) -> Result<(Event, EventExtras), TraceError> {
        let at = |field| Location::Event { device, index, field };
        let d = self.dict(e, || at(None))?;
        let (mut kind, mut addr, mut size, mut stream, mut time, mut device_free) =
            (None, None, None, 0i64, None, None);
        let (mut mempool, mut frames) = (None, None);
        for &(k, v) in d {
            match self.key(k) {
                b"action" => {
                    kind = Some(match self.str(v, at(Some("action")))? {
                        b"alloc" => EventKind::Alloc,
                        b"free_requested" => EventKind::FreeRequested,
                        b"free_completed" => EventKind::Free,
                        b"segment_alloc" => EventKind::SegmentAlloc,
                        b"segment_free" => EventKind::SegmentFree,
                        b"segment_map" => EventKind::SegmentMap,
                        b"segment_unmap" => EventKind::SegmentUnmap,
                        b"oom" => EventKind::Oom,
                        b"snapshot" => EventKind::Snapshot,
                        _ => EventKind::Other,
                    })
                }
                b"addr" => addr = Some(v),
                b"size" => size = Some(v),
                b"stream" => stream = self.i64(v, at(Some("stream")))?,
                b"time_us" => {
                    time = match self.node(v) {
                        Node::None => None,
                        Node::Float(f) if f.is_finite() => Some(f as i64),
                        Node::Float(f) => {
                            return Err(
                                self.bad(at(Some("time_us")), format!("{f} is not a time (a finite number of µs)"))
                            )
                        }
                        // PyTorch writes a signed 64-bit count of µs (`TraceEntry::time_`): a value at or
                        // above 2^63 is no time (read as a wrapped i64 it would reorder the history).
                        _ => {
                            let t = self.int(v, &at(Some("time_us")))?;
                            Some(i64::try_from(t).map_err(|_| {
                                self.bad(at(Some("time_us")), format!("value {t} is not a signed 64-bit time in µs"))
                            })?)
                        }
                    }
                }
                b"device_free" => device_free = Some(v),
                // PR#177717 names it `pool_id`; PyTorch's MemoryViz reads `segment_pool_id` too.
                b"pool_id" | b"segment_pool_id" => mempool = self.mempool_id(v, at(Some("pool_id")))?,
                b"frames" => frames = Some(v),
                _ => {}
            }
        }
        let kind = kind.ok_or_else(|| self.bad(at(None), "missing `action`"))?;
        let caller = match (kind, frames) {
            (EventKind::SegmentFree | EventKind::SegmentUnmap, Some(f)) => {
                self.release_caller(f, || at(Some("frames")))?
            }
            _ => None,
        };
        let needs_both = kind.is_block() || kind.is_segment();
        let addr = match addr {
            Some(v) if needs_both => self.u64(v, at(Some("addr")))?,
            Some(v) => self.u64(v, at(Some("addr"))).unwrap_or(0),
            None if needs_both => return Err(self.bad(at(None), "missing `addr`")),
            None => 0,
        };
        let size = match size {
            Some(v) if needs_both || kind == EventKind::Oom => self.u64(v, at(Some("size")))?,
            Some(v) => self.u64(v, at(Some("size"))).unwrap_or(0),
            None if needs_both => return Err(self.bad(at(None), "missing `size`")),
            None => 0,
        };
        if kind == EventKind::Oom {
            let device_free = device_free.map(|v| self.u64(v, at(Some("device_free")))).transpose()?;
            ooms.push(OomInfo { event: index, device_free });
        }
        let addr = if kind == EventKind::Oom { 0 } else { addr };
        Ok((Event { kind, mempool: 0, id: NO_ID, addr, size, stream, time_us: time }, EventExtras { mempool, caller }))
    }

    /// A `MempoolId_t` as PyTorch pickles it: a tuple (or list) of two integers. `None` (no pool said) for
    /// `None`; anything else is a schema error.
    fn mempool_id(&self, v: NodeId, at: Location) -> Result<Option<MempoolId>, TraceError> {
        match self.node(v) {
            Node::None => Ok(None),
            Node::Tuple(l) | Node::List(l) if l.len() == 2 => {
                Ok(Some(MempoolId(self.i64(l[0], at.clone())?, self.i64(l[1], at)?)))
            }
            _ => Err(self.expected(at, "a pool id (a pair of integers)", v)),
        }
    }

    /// Who released a segment, from the frame names of its `segment_free` / `segment_unmap` entry
    /// ([`ReleaseCaller`]); `None` when the frames name neither (or are not a list of frames).
    fn release_caller(&self, frames: NodeId, at: impl Fn() -> Location) -> Result<Option<ReleaseCaller>, TraceError> {
        let (Node::List(list) | Node::Tuple(list)) = self.node(frames) else { return Ok(None) };
        let charge = |n: usize| self.budget.visit(n).map_err(|e| self.budget.error(e, self.path, at()));
        charge(list.len())?;
        let (mut malloc, mut empty) = (false, false);
        for &f in list {
            let Node::Dict(fd) = self.node(f) else { continue };
            // `get` scans the frame's entries; the name's bytes are scanned below (a memo can repeat both).
            charge(fd.len())?;
            let Some(Node::Str(name)) = self.p.get(fd, "name").map(|n| self.node(n)) else { continue };
            charge(name.len() / 16)?;
            let name = String::from_utf8_lossy(name);
            // `empty_cache` (torch/cuda/memory.py, torch_npu/npu/memory.py) or the C++ `emptyCache`.
            empty |= name == "empty_cache" || name.contains("emptyCache");
            // `DeviceCachingAllocator::malloc` and the release steps it calls (CUDACachingAllocator.cpp).
            malloc |= name.contains("CachingAllocator::malloc")
                || name.contains("release_cached_blocks")
                || name.contains("release_available_cached_blocks")
                || name.contains("garbage_collect_cached_blocks");
        }
        Ok(if empty {
            Some(ReleaseCaller::EmptyCache)
        } else if malloc {
            Some(ReleaseCaller::Malloc)
        } else {
            None
        })
    }

    /// `skip_actions` as the file lists them (a list of action names); `None` for anything else.
    fn skip_actions(&self, n: NodeId) -> Option<Vec<String>> {
        let (Node::List(l) | Node::Tuple(l)) = self.node(n) else { return None };
        Some(
            l.iter()
                .filter_map(|&a| match self.node(a) {
                    Node::Str(s) => Some(String::from_utf8_lossy(s).into_owned()),
                    _ => None,
                })
                .collect(),
        )
    }

    /// The settings and what they say of the history's recording (one [`HistoryRecording`] per device
    /// where `trace_alloc_max_entries` / `trace_alloc_overflowed` are lists, else one for all).
    fn settings(&self, n: NodeId) -> Result<(AllocatorSettings, Vec<HistoryRecording>), TraceError> {
        let at = || Location::Key("allocator_settings");
        let d = self.dict(n, at)?;
        let mut s = AllocatorSettings::default();
        let (mut max_entries, mut overflowed, mut skip): (Vec<Option<u64>>, Vec<Option<bool>>, _) =
            (Vec::new(), Vec::new(), None);
        // A scalar, or a list of one value per device.
        let each = |v: NodeId| -> Vec<NodeId> {
            match self.node(v) {
                Node::List(l) | Node::Tuple(l) => l.to_vec(),
                _ => vec![v],
            }
        };
        for &(k, v) in d {
            match self.key(k) {
                b"trace_alloc_max_entries" => {
                    for x in each(v) {
                        max_entries.push(self.u64(x, at()).ok());
                    }
                }
                b"trace_alloc_overflowed" => {
                    for x in each(v) {
                        overflowed.push(self.bool(x, at()).ok());
                    }
                }
                b"skip_actions" => skip = self.skip_actions(v),
                b"PYTORCH_CUDA_ALLOC_CONF" => {
                    if let Node::Str(t) = self.node(v) {
                        s.alloc_conf = Some(String::from_utf8_lossy(t).into_owned());
                    }
                }
                b"max_split_size" => {
                    // PyTorch records `max_split_size_mb` in bytes, at least 20 MiB (it raises smaller
                    // values to that), or SIZE_MAX (unlimited) as -1.
                    let m = self.i64(v, at())?;
                    if (0..=MIN_MAX_SPLIT_SIZE).contains(&m) {
                        return Err(self.bad(
                            at(),
                            format!(
                                "max_split_size {m} B is not above 1 MiB (PyTorch records at least 20 MiB, or -1 for \
                                 unlimited)"
                            ),
                        ));
                    }
                    s.max_split_size = Some(m)
                }
                b"garbage_collection_threshold" => {
                    let g = match self.node(v) {
                        Node::Float(f) => f,
                        _ => self.i64(v, at())? as f64,
                    };
                    // PyTorch accepts a threshold strictly between 0 and 1 (0: off).
                    if !(0.0..1.0).contains(&g) {
                        return Err(self.bad(at(), format!("garbage_collection_threshold {g} is outside [0, 1)")));
                    }
                    s.garbage_collection_threshold = Some(g)
                }
                b"expandable_segments" => s.expandable_segments = Some(self.bool(v, at())?),
                b"roundup_power2_divisions" => {
                    // A dict `interval start in MiB (as text) -> divisions`; anything else is kept in `other`
                    // so that a reader of the settings can name it.
                    let mut kept = false;
                    if let Node::Dict(pairs) = self.node(v) {
                        kept = true;
                        for &(rk, rv) in pairs {
                            let interval = std::str::from_utf8(self.key(rk)).ok().and_then(|t| t.parse::<u64>().ok());
                            match (interval, self.node(rv)) {
                                (Some(interval), Node::Int(_)) => {
                                    let d = self.u64(rv, at())?;
                                    // PyTorch refuses a division count that is not a power of two (0: off).
                                    if d != 0 && !d.is_power_of_two() {
                                        return Err(self.bad(
                                            at(),
                                            format!(
                                                "roundup_power2_divisions: {d} divisions for the interval from \
                                                 {interval} MiB is not 0 or a power of two"
                                            ),
                                        ));
                                    }
                                    s.roundup_power2_divisions.push((interval, d))
                                }
                                _ => kept = false,
                            }
                        }
                        s.roundup_power2_divisions.sort_unstable();
                    }
                    if !kept {
                        s.other.push(("roundup_power2_divisions".into(), format!("<{}>", self.node(v).type_name())));
                    }
                }
                key => {
                    let value = match self.node(v) {
                        Node::None => "None".to_string(),
                        Node::Bool(b) => if b { "True" } else { "False" }.to_string(),
                        Node::Int(i) => i.to_string(),
                        Node::Float(f) => f.to_string(),
                        Node::Str(t) => String::from_utf8_lossy(t).into_owned(),
                        other => format!("<{}>", other.type_name()),
                    };
                    s.other.push((String::from_utf8_lossy(key).into_owned(), value));
                }
            }
        }
        let n = max_entries.len().max(overflowed.len()).max(usize::from(skip.is_some()));
        let recording = (0..n)
            .map(|i| HistoryRecording {
                max_entries: max_entries
                    .get(i)
                    .or(max_entries.first().filter(|_| max_entries.len() == 1))
                    .copied()
                    .flatten(),
                overflowed: overflowed
                    .get(i)
                    .or(overflowed.first().filter(|_| overflowed.len() == 1))
                    .copied()
                    .flatten(),
                skip_actions: skip.clone(),
            })
            .collect();
        Ok((s, recording))
    }
}

/// One stack frame a snapshot records (`frames` entries of events and blocks).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Frame {
    /// Function name (`name`).
    pub name: String,
    /// Source file (`filename`), as the snapshot stores it.
    pub filename: String,
    /// Line number (`line`; 0 when not recorded, as for C++ frames).
    pub line: i64,
}

/// Top-level packages of libraries whose frames [`Frame::is_user`] folds (besides PyTorch's ecosystem:
/// every first component starting with `torch`, such as `torch_geometric`, `torchvision`), by the first
/// component of a frame's normalised path ([`normalise`]: `transformers/models/opt/modeling_opt.py`),
/// for files that are not under `site-packages` (a relative or shortened path, a source checkout).
#[rustfmt::skip]
pub const LIBRARY_PACKAGES: &[&str] = &[
    "torch", "torchvision", "torchaudio", "torchtext", "torchao", "torchtune", "functorch", "triton", "transformers",
    "accelerate", "peft", "trl", "bitsandbytes", "deepspeed", "diffusers", "optimum", "flash_attn", "xformers",
    "apex", "transformer_engine", "megatron", "fairscale", "timm", "lightning", "pytorch_lightning", "lightning_fabric", "vllm",
    "safetensors", "huggingface_hub", "datasets", "einops", "numpy", "IPython", "ipykernel", "tqdm",
    "sentence_transformers", "tornado", "traitlets", "jupyter_client", "jupyter_core", "zmq", "ray", "hydra",
    "omegaconf", "click", "typer", "fire", "wandb", "mlflow", "python-stdlib", "asyncio", "concurrent", "multiprocessing",
    "threading.py", "runpy.py", "contextlib.py", "functools.py", "copy.py", "ipykernel_launcher.py",
];

impl Frame {
    /// The frame's file, normalised ([`normalise`]): what every rule on files reads.
    #[doc(hidden)]
    pub fn path(&self) -> FramePath<'_> {
        normalise(&self.filename)
    }

    /// Whether the frame is user code: a Python file ([`Frame::is_python`]) whose normalised path
    /// ([`Frame::path`]) is the program's own ([`FileOrigin::Other`]): not an installed package
    /// (`site-packages/`, `dist-packages/`, PyTorch's ecosystem, `LIBRARY_PACKAGES`), not the standard
    /// library, not a `<…>` pseudo-file; C++ and `??` frames are not.
    #[doc(hidden)]
    pub fn is_user(&self) -> bool {
        let p = self.path();
        p.origin == FileOrigin::Other && p.path.ends_with(".py")
    }

    /// Whether the frame is a Python one (its file ends in `.py`, or is a `<…>` pseudo-file such as
    /// `<frozen runpy>`); the others are C/C++ frames (the interpreter's, PyTorch's, a library's).
    #[doc(hidden)]
    pub fn is_python(&self) -> bool {
        let p = self.path();
        p.origin == FileOrigin::Pseudo || p.path.ends_with(".py")
    }

    /// The function a C++ frame names, without its return type, template and function arguments and
    /// `(anonymous namespace)::` parts: `void at::native::gpu_reduce_kernel<bool, …>(…)` is
    /// `at::native::gpu_reduce_kernel`.
    #[doc(hidden)]
    pub fn function(&self) -> String {
        let n = self.name.replace("(anonymous namespace)::", "");
        let mut out = String::with_capacity(n.len());
        let mut depth = 0usize;
        for c in n.chars() {
            match c {
                '<' => depth += 1,
                '>' => depth = depth.saturating_sub(1),
                '(' if depth == 0 => break,
                // A return type before the name (`at::Tensor at::native::f`): keep what follows it.
                ' ' if depth == 0 => out.clear(),
                _ if depth == 0 => out.push(c),
                _ => {}
            }
        }
        if out.is_empty() {
            n
        } else {
            out
        }
    }
}

/// The stack frames of chosen events and blocks of one device, read by [`read_frames`].
#[derive(Debug, Clone, Default, PartialEq)]
#[doc(hidden)]
pub struct SnapshotFrames {
    /// `(event index, frames)` for each asked event that has frames, ascending by index.
    pub events: Vec<(usize, Vec<Frame>)>,
    /// `(block address, frames)` for each asked block of the snapshot's `segments` that has frames (its
    /// own `frames`, else, in the PyTorch 2.0 layout, those of its `history` entry).
    pub blocks: Vec<(u64, Vec<Frame>)>,
}

/// Reads the stack frames the snapshot `bytes` (the content of `path`) records for the events at
/// `events` (indices into `device_traces[device]`) and for the blocks of device `device`'s segments
/// at the addresses `blocks`. Frames are skipped by `parse` to keep traces small; this decodes the
/// pickle again (the cost of one `parse`).
///
/// Frames are supplementary: an entry that is not a dict of `name`/`filename`/`line` is left out.
///
/// # Errors
/// The [`TraceError`]s of `parse` for a pickle that cannot be decoded.
#[doc(hidden)]
pub fn read_frames(
    path: &Path,
    bytes: &[u8],
    device: i64,
    events: &[usize],
    blocks: &[u64],
) -> Result<SnapshotFrames, TraceError> {
    let p = pickle::decode(bytes).map_err(|e| TraceError::PickleCorrupt {
        path: path.to_path_buf(),
        offset: e.offset,
        message: "cannot decode the pickle again to read stack frames (was the file changed since it was read, or is \
                  it a pipe, which can be read once?)"
            .into(),
    })?;
    // Every frame list, frame dict and string read is charged to a budget (module `limits`): the memo
    // can make each asked event's frames the same long list of one frame with a long name.
    let budget = &Budget::for_input(bytes.len(), super::limits::max_memory());
    let frames_of = |d: &[(NodeId, NodeId)]| -> Result<Vec<Frame>, Exceeded> {
        budget.visit(d.len())?;
        let Some(Node::List(list) | Node::Tuple(list)) = p.get(d, "frames").map(|f| p.node(f)) else {
            return Ok(Vec::new());
        };
        budget.visit(list.len())?;
        let mut out = Vec::new();
        for &f in list {
            let Node::Dict(fd) = p.node(f) else { continue };
            budget.visit(fd.len().saturating_mul(3))?;
            let text = |k: &str| -> Result<Option<String>, Exceeded> {
                match p.get(fd, k).map(|v| p.node(v)) {
                    Some(Node::Str(s)) => {
                        budget.materialise(s.len())?;
                        Ok(Some(String::from_utf8_lossy(s).into_owned()))
                    }
                    _ => Ok(None),
                }
            };
            let line = match p.get(fd, "line").map(|v| p.node(v)) {
                Some(Node::Int(v)) => i64::try_from(v).unwrap_or(0),
                _ => 0,
            };
            let Some(name) = text("name")? else { continue };
            budget.materialise(size_of::<Frame>())?;
            out.push(Frame { name, filename: text("filename")?.unwrap_or_default(), line });
        }
        Ok(out)
    };
    let limit = |at: Location| move |e: Exceeded| budget.error(e, path, at);
    // PyTorch 2.0 keeps a block's frames in its `history`: a list of `{addr, real_size, frames}`, the
    // newest allocation first (`HistoryChain`, c10/cuda/CUDACachingAllocator.cpp of 2.0); the entry at
    // the block's own address is the live tensor's, else the newest.
    let history_frames = |bd: &[(NodeId, NodeId)], addr: u64| -> Result<Vec<Frame>, Exceeded> {
        let Some(Node::List(h) | Node::Tuple(h)) = p.get(bd, "history").map(|v| p.node(v)) else {
            return Ok(Vec::new());
        };
        budget.visit(h.len())?;
        let entries: Vec<&[(NodeId, NodeId)]> =
            h.iter().filter_map(|&e| if let Node::Dict(d) = p.node(e) { Some(d) } else { None }).collect();
        for d in &entries {
            budget.visit(d.len())?;
        }
        let at_addr = entries.iter().find(|d| {
            matches!(p.get(d, "addr").map(|v| p.node(v)), Some(Node::Int(v)) if u64::try_from(v).ok() == Some(addr))
        });
        at_addr.or(entries.first()).map_or_else(|| Ok(Vec::new()), |d| frames_of(d))
    };
    let mut out = SnapshotFrames::default();
    let Node::Dict(root) = p.node(p.root) else { return Ok(out) };
    if let Some(Node::List(devs)) = p.get(root, "device_traces").map(|n| p.node(n)) {
        let trace = usize::try_from(device).ok().and_then(|d| devs.get(d)).map(|&t| p.node(t));
        if let Some(Node::List(entries)) = trace {
            let mut want: Vec<usize> = events.to_vec();
            want.sort_unstable();
            want.dedup();
            for i in want {
                if let Some(Node::Dict(d)) = entries.get(i).map(|&e| p.node(e)) {
                    let f = frames_of(d).map_err(limit(Location::Event { device, index: i, field: Some("frames") }))?;
                    if !f.is_empty() {
                        out.events.push((i, f));
                    }
                }
            }
        }
    }
    if let Some(Node::List(segs)) = p.get(root, "segments").map(|n| p.node(n)) {
        let want: std::collections::HashSet<u64> = blocks.iter().copied().collect();
        budget.visit(segs.len()).map_err(limit(Location::Key("segments")))?;
        for (si, &s) in segs.iter().enumerate() {
            let Node::Dict(sd) = p.node(s) else { continue };
            let at = |block| Location::Segment { segment: si, block, field: Some("frames") };
            budget.visit(sd.len()).map_err(limit(at(None)))?;
            let dev = match p.get(sd, "device").map(|v| p.node(v)) {
                Some(Node::Int(v)) => i64::try_from(v).unwrap_or(-1),
                _ => 0,
            };
            if dev != device {
                continue;
            }
            let Some(Node::List(bl)) = p.get(sd, "blocks").map(|v| p.node(v)) else { continue };
            budget.visit(bl.len()).map_err(limit(at(None)))?;
            let int = |d: &[(NodeId, NodeId)], k: &str| match p.get(d, k).map(|v| p.node(v)) {
                Some(Node::Int(v)) => u64::try_from(v).ok(),
                _ => None,
            };
            // The PyTorch 2.0 layout records no block address: a block starts where the one before it ends
            // (as `parse` reads it).
            let mut cursor = int(sd, "address");
            for (bi, &b) in bl.iter().enumerate() {
                let Node::Dict(bd) = p.node(b) else { continue };
                budget.visit(bd.len().saturating_mul(2)).map_err(limit(at(Some(bi))))?;
                let addr = int(bd, "address").or(cursor);
                cursor = addr.zip(int(bd, "size")).and_then(|(a, s)| a.checked_add(s));
                if let Some(a) = addr.filter(|a| want.contains(a)) {
                    let mut f = frames_of(bd).map_err(limit(at(Some(bi))))?;
                    if f.is_empty() {
                        f = history_frames(bd, a).map_err(limit(at(Some(bi))))?;
                    }
                    if !f.is_empty() {
                        out.blocks.push((a, f));
                    }
                }
            }
        }
    }
    Ok(out)
}
