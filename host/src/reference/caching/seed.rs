//! The model and a recorded PyTorch trace: its settings ([`config_for_trace`]), its state before the first
//! event ([`seed_from_trace`]), and a replay that measures how closely the model follows what PyTorch
//! reserved, event by event ([`fidelity`]).

use super::releases::{recorded_releases, ReleaseCause};
use super::{CachingAllocator, CachingConfig, ConfigWarning, Pool, SMALL_BUFFER};
use crate::reference::{AllocError, Allocation, SubAllocator};
use crate::trace::{guess_expandable_pool, BlockStatus, DeviceTrace, Event, EventKind, Pool as TracePool};

/// The model's configuration for `dev` on a device of `capacity` bytes, with a warning for every recorded
/// option the model does not implement ([`CachingConfig::from_settings`]). Besides the recorded
/// `allocator_settings`, the snapshot's own evidence is used: expandable segments in the final state or
/// `segment_map`/`segment_unmap` events turn expandable segments on (snapshots without settings, such as
/// torch_npu's), and block sizes that show torch_npu's 32-byte request pad select torch_npu's rules
/// ([`CachingConfig::torch_npu`], [`crate::trace::SnapshotState::request_pad`]).
#[doc(hidden)]
pub fn config_for_trace(dev: &DeviceTrace, capacity: u64) -> (CachingConfig, Vec<ConfigWarning>) {
    config_for_scanned(dev, capacity, &TraceScan::mapped_only(dev))
}

/// What the model's replays of a trace read from its whole event list, whatever the capacity and the
/// settings: made once by [`TraceScan::new`] and handed to [`config_for_scanned`], [`seed_from_scanned`]
/// and [`RecordedSegments::from_scan`], so that a search that replays one trace hundreds of times
/// (`gpuheap tune`) does not walk the events again for each replay. Measured by `perf` on `tune` of a
/// 1,008,246-event snapshot: those walks (the two scans for `segment_map`/`segment_unmap` and
/// [`recorded_releases`]) took 23 % of its samples once its failing replays stopped at their first
/// failure.
#[derive(Clone, Debug)]
pub(crate) struct TraceScan {
    /// Indices of the `segment_map` and `segment_unmap` events, ascending.
    map_events: Vec<usize>,
    /// The runs of releases the model decides itself (see [`RecordedSegments`]).
    decided: Vec<(usize, usize)>,
}

impl TraceScan {
    /// The scan of `dev` (one walk of its events and [`recorded_releases`]).
    pub(crate) fn new(dev: &DeviceTrace) -> Self {
        let decided = recorded_releases(dev)
            .into_iter()
            .filter(|r| r.cause == ReleaseCause::Allocator)
            .map(|r| (r.first_event, r.last_event))
            .collect();
        TraceScan { decided, ..Self::mapped_only(dev) }
    }

    /// The `segment_map`/`segment_unmap` events only (what the configuration and the seeding read).
    fn mapped_only(dev: &DeviceTrace) -> Self {
        let map_events = dev
            .events
            .iter()
            .enumerate()
            .filter(|(_, e)| matches!(e.kind, EventKind::SegmentMap | EventKind::SegmentUnmap))
            .map(|(i, _)| i)
            .collect();
        TraceScan { map_events, decided: Vec::new() }
    }
}

/// [`config_for_trace`] with the events' evidence read from `scan` (made of `dev`).
pub(crate) fn config_for_scanned(
    dev: &DeviceTrace,
    capacity: u64,
    scan: &TraceScan,
) -> (CachingConfig, Vec<ConfigWarning>) {
    let (mut cfg, warnings) = match &dev.allocator_settings {
        Some(s) => CachingConfig::from_settings(s, capacity),
        None => (CachingConfig::new(capacity), Vec::new()),
    };
    let mapped = !scan.map_events.is_empty();
    if mapped || dev.final_state.as_ref().is_some_and(|f| f.segments.iter().any(|s| s.is_expandable)) {
        cfg.expandable_segments = true;
    }
    if dev.final_state.as_ref().is_some_and(|f| f.request_pad() == 32) {
        // torch_npu (its allocator pads requests); its expandable segments align large blocks to 16 KiB.
        cfg = cfg.torch_npu();
    }
    (cfg, warnings)
}

/// A model seeded with a trace's state before its first event.
#[derive(Debug)]
#[doc(hidden)]
pub struct Seeded {
    /// The model.
    pub model: CachingAllocator,
    /// Initial blocks placed at their recorded positions: (block id, the model's allocation).
    pub blocks: Vec<(u32, Allocation)>,
    /// Indices into [`DeviceTrace::initial_blocks`] that could not be placed that way (outside any seeded
    /// segment); a caller allocates them normally.
    pub unplaced: Vec<usize>,
    /// Segments (or expandable mapped ranges) seeded.
    pub segments: u64,
    /// Seeded segments as (segment id of the trace, the model's offset).
    pub segment_offsets: Vec<(u32, u64)>,
    /// Expandable reservations the trace shows: (stream, pool, lowest address, highest end), addresses of
    /// the trace. The model's reservation of (stream, pool) starts where the lowest address is.
    pub reservations: Vec<(i64, Pool, u64, u64)>,
}

fn model_pool(p: TracePool, size: u64) -> Pool {
    match p {
        TracePool::Small => Pool::Small,
        TracePool::Large => Pool::Large,
        TracePool::Unknown if size <= SMALL_BUFFER => Pool::Small,
        TracePool::Unknown => Pool::Large,
    }
}

/// Builds a model with `config` and seeds it with `dev`'s segments and blocks that existed before the
/// first event ([`DeviceTrace::initial_segments`], [`DeviceTrace::initial_blocks`]): non-expandable
/// segments with [`CachingAllocator::seed_segment_in`], in their memory pool (the model's memory pool
/// indices are the trace's, [`DeviceTrace::mempools`]); expandable mapped ranges with
/// [`CachingAllocator::seed_mapped`], at their offset from the lowest address the trace shows for their
/// (stream, pool) reservation; live blocks at their recorded offsets inside them, with the rounded size the
/// final state records (else the model's rounding of the request).
///
/// # Errors
/// [`AllocError::InvalidConfig`] for a configuration the model refuses. Segments that do not fit the
/// capacity are skipped (their blocks end up in [`Seeded::unplaced`]).
#[doc(hidden)]
pub fn seed_from_trace(dev: &DeviceTrace, config: CachingConfig) -> Result<Seeded, AllocError> {
    seed_from_scanned(dev, config, &TraceScan::mapped_only(dev))
}

/// [`seed_from_trace`] with the `segment_map`/`segment_unmap` events read from `scan` (made of `dev`).
///
/// # Errors
/// As [`seed_from_trace`].
pub(crate) fn seed_from_scanned(
    dev: &DeviceTrace,
    config: CachingConfig,
    scan: &TraceScan,
) -> Result<Seeded, AllocError> {
    let mut model = CachingAllocator::new(config)?;
    // (trace address, size, model offset), sorted by address below.
    let mut placed: Vec<(u64, u64, u64)> = Vec::with_capacity(dev.initial_segments.len());
    // Expandable reservations: (stream, pool) -> (lowest address, highest end) the trace shows.
    let mut known: Vec<(i64, u64, TracePool)> = Vec::new();
    known.extend(dev.initial_segments.iter().filter(|s| s.is_expandable).map(|s| (s.stream, s.addr, s.pool)));
    if let Some(f) = &dev.final_state {
        known.extend(f.segments.iter().filter(|s| s.is_expandable).map(|s| (s.stream, s.addr, s.pool)));
    }
    let mut spans: Vec<(i64, TracePool, u64, u64)> = Vec::new();
    let mut widen =
        |stream: i64, pool: TracePool, a: u64, b: u64| match spans.iter_mut().find(|s| s.0 == stream && s.1 == pool) {
            Some(s) => (s.2, s.3) = (s.2.min(a), s.3.max(b)),
            None => spans.push((stream, pool, a, b)),
        };
    for s in dev.initial_segments.iter().filter(|s| s.is_expandable) {
        widen(s.stream, s.pool, s.addr, s.addr.saturating_add(s.size));
    }
    if let Some(f) = &dev.final_state {
        for s in f.segments.iter().filter(|s| s.is_expandable) {
            widen(s.stream, s.pool, s.addr, s.addr.saturating_add(s.size));
        }
    }
    for e in scan.map_events.iter().filter_map(|&i| dev.events.get(i)) {
        let pool = guess_expandable_pool(&known, e.stream, e.addr, e.size);
        widen(e.stream, pool, e.addr, e.addr.saturating_add(e.size));
    }
    let mut segment_offsets = Vec::new();
    let mut segs: Vec<_> = dev.initial_segments.iter().collect();
    segs.sort_by_key(|s| s.addr);
    for s in segs {
        let pool = model_pool(s.pool, s.size);
        // At the recorded addresses where the model's address range allows (see `hint_next_segment`).
        let off = if s.is_expandable && config.expandable_segments {
            let Some(&(_, _, base, end)) = spans.iter().find(|x| x.0 == s.stream && x.1 == s.pool) else { continue };
            model.hint_next_segment(Some(base));
            model.seed_mapped(pool, s.stream, s.addr - base, s.size, end - base)
        } else {
            model.hint_next_segment(Some(s.addr));
            model.seed_segment_in(s.size, pool, s.stream, s.mempool)
        };
        model.hint_next_segment(None);
        if let Ok(off) = off {
            placed.push((s.addr, s.size, off));
            segment_offsets.push((s.id, off));
        }
    }
    placed.sort_unstable();
    // Final-state block sizes by address.
    let mut sizes: Vec<(u64, u64)> = dev
        .final_state
        .iter()
        .flat_map(|f| f.blocks())
        .filter(|b| b.state != BlockStatus::Inactive)
        .map(|b| (b.addr, b.size))
        .collect();
    sizes.sort_unstable();
    let mut order: Vec<usize> = (0..dev.initial_blocks.len()).collect();
    order.sort_by_key(|&i| dev.initial_blocks[i].addr);
    let (mut blocks, mut unplaced) = (Vec::with_capacity(order.len()), Vec::new());
    for i in order {
        let b = &dev.initial_blocks[i];
        let seg = placed.partition_point(|p| p.0 <= b.addr).checked_sub(1).map(|k| placed[k]);
        let size = sizes
            .binary_search_by_key(&b.addr, |x| x.0)
            .ok()
            .map(|k| sizes[k].1)
            .or_else(|| config.round_size(b.size))
            .unwrap_or(u64::MAX);
        let ok = seg
            .filter(|&(a, l, _)| b.addr - a < l)
            .and_then(|(a, _, off)| model.seed_block(off + (b.addr - a), size, b.size.max(1)).ok());
        match ok {
            Some(a) => blocks.push((b.id, a)),
            None => unplaced.push(i),
        }
    }
    let reservations = spans.into_iter().map(|(st, p, a, b)| (st, model_pool(p, b - a), a, b)).collect();
    Ok(Seeded { model, blocks, unplaced, segments: placed.len() as u64, segment_offsets, reservations })
}

/// Drives a seeded model through a trace's segment events, so that it reserves and releases where PyTorch
/// did: a `segment_alloc` (or `segment_map`) hints its address for the model's next new segment
/// ([`CachingAllocator::hint_next_segment`]); the model's segment created by the `alloc` that follows is
/// matched to it; a `segment_free` releases that segment and a `segment_unmap` unmaps those pages
/// ([`CachingAllocator::release_segment`], [`CachingAllocator::unmap_range`]) when the model has them
/// free, else the model's whole cache is emptied, once per run of releases (PyTorch's `empty_cache`).
/// Releases that PyTorch's allocator made while serving a request ([`ReleaseCause::Allocator`],
/// [`super::recorded_releases`]) are not applied: the model releases when its own allocation fails at its
/// capacity, as `malloc` does. Allocation-free per event.
///
/// Use: [`RecordedSegments::new`] after [`seed_from_trace`]; per event, [`RecordedSegments::before_alloc`]
/// and [`RecordedSegments::after_alloc`] around the model's `alloc_on` of an `alloc` event, and
/// [`RecordedSegments::on_segment_event`] for the four segment kinds.
#[derive(Debug)]
#[doc(hidden)]
pub struct RecordedSegments {
    /// The runs of releases the model decides itself, `(first, last)` event, ascending.
    decided: Vec<(usize, usize)>,
    seg_off: Vec<u64>,
    reservations: Vec<(i64, Pool, u64, u64)>,
    pending: Option<u32>,
    segment_allocs: u64,
    emptied_in_run: bool,
    prev: EventKind,
}

impl RecordedSegments {
    /// For `dev` seeded as `seeded` (its segment offsets and reservations are taken over).
    pub fn new(dev: &DeviceTrace, seeded: &Seeded) -> Self {
        Self::from_scan(dev, seeded, &TraceScan::new(dev))
    }

    /// [`RecordedSegments::new`] with the releases read from `scan` (made of `dev`).
    pub(crate) fn from_scan(dev: &DeviceTrace, seeded: &Seeded, scan: &TraceScan) -> Self {
        let mut seg_off = vec![u64::MAX; dev.segment_ids as usize];
        for &(id, off) in &seeded.segment_offsets {
            if let Some(s) = seg_off.get_mut(id as usize) {
                *s = off;
            }
        }
        RecordedSegments {
            decided: scan.decided.clone(),
            seg_off,
            reservations: seeded.reservations.clone(),
            pending: None,
            segment_allocs: 0,
            emptied_in_run: false,
            prev: EventKind::Other,
        }
    }

    /// Call before the model serves an `alloc` event.
    pub fn before_alloc(&mut self, m: &CachingAllocator) {
        self.segment_allocs = m.counters().segment_allocs;
    }

    /// Call after the model served an `alloc` event (`placed`: the block's offset, `None` if it failed).
    pub fn after_alloc(&mut self, m: &mut CachingAllocator, placed: Option<u64>) {
        if let (Some(id), Some(off)) = (self.pending.take(), placed) {
            if m.counters().segment_allocs > self.segment_allocs {
                if let (Some((start, _, false)), Some(slot)) = (m.segment_at(off), self.seg_off.get_mut(id as usize)) {
                    *slot = start;
                }
            }
        }
        m.hint_next_segment(None);
        self.prev = EventKind::Alloc;
    }

    /// Whether event `i` is a release the model decides itself (one of PyTorch's allocator's own).
    pub fn decided_by_model(&self, i: usize) -> bool {
        let k = self.decided.partition_point(|r| r.1 < i);
        self.decided.get(k).is_some_and(|r| r.0 <= i)
    }

    /// Applies the segment event `e` at index `i` (`segment_alloc`, `segment_free`, `segment_map` or
    /// `segment_unmap`) to the model (other kinds only end a run of releases). Returns the bytes the model
    /// released.
    pub fn on_segment_event(&mut self, m: &mut CachingAllocator, i: usize, e: &Event) -> u64 {
        let before = m.reserved_bytes();
        if self.decided_by_model(i) {
            self.prev = e.kind;
            return 0;
        }
        match e.kind {
            EventKind::SegmentAlloc => {
                self.pending = Some(e.id);
                m.hint_next_segment(Some(e.addr));
            }
            // The first mapping of a new reservation is at its start.
            EventKind::SegmentMap => m.hint_next_segment(Some(e.addr)),
            EventKind::SegmentFree | EventKind::SegmentUnmap => {
                if !matches!(self.prev, EventKind::SegmentFree | EventKind::SegmentUnmap) {
                    self.emptied_in_run = false;
                }
                let exact = if e.kind == EventKind::SegmentFree {
                    self.seg_off
                        .get(e.id as usize)
                        .filter(|&&o| o != u64::MAX)
                        .is_some_and(|&o| m.release_segment(o).is_ok())
                } else {
                    self.expandable_offset(m, e.stream, e.addr).is_some_and(|o| m.unmap_range(o, e.size) == e.size)
                };
                if !exact && !self.emptied_in_run {
                    m.empty_cache();
                    self.emptied_in_run = true;
                }
            }
            _ => {}
        }
        self.prev = e.kind;
        before.saturating_sub(m.reserved_bytes())
    }

    fn expandable_offset(&self, model: &CachingAllocator, stream: i64, addr: u64) -> Option<u64> {
        let r = self.reservations.iter().find(|r| r.0 == stream && (r.2..r.3).contains(&addr))?;
        Some(model.reservation_start(r.1, stream)? + (addr - r.2))
    }
}

/// How closely the model follows PyTorch's reserved bytes over one trace ([`fidelity`]). Bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
#[doc(hidden)]
pub struct Fidelity {
    /// Events replayed.
    pub events: usize,
    /// Device capacity used.
    pub capacity: u64,
    /// PyTorch's reserved bytes before the first event, at its peak and after the last event, from the
    /// segment events counted once.
    pub pytorch_initial: u64,
    /// PyTorch's peak reserved bytes.
    pub pytorch_peak: u64,
    /// PyTorch's reserved bytes at the end.
    pub pytorch_end: u64,
    /// Segments of the snapshot's final state (expandable: contiguous mapped ranges).
    pub pytorch_segments: Option<u64>,
    /// The model's reserved bytes before the first event, at its peak, at the end.
    pub model_initial: u64,
    /// The model's peak reserved bytes.
    pub model_peak: u64,
    /// The model's reserved bytes at the end.
    pub model_end: u64,
    /// The model's segments at the end (as a snapshot lists them).
    pub model_segments: u64,
    /// Largest `|model − PyTorch|` reserved bytes after any event.
    pub max_deviation: u64,
    /// The first event where it was reached.
    pub max_deviation_event: Option<usize>,
    /// Recorded `oom` events (indices).
    pub recorded_ooms: Vec<usize>,
    /// Recorded OOMs at which the model also failed the request.
    pub reproduced_ooms: usize,
    /// Alloc events PyTorch served that the model failed (indices).
    pub invented_failures: Vec<usize>,
    /// Alloc events the model placed at another address than PyTorch (the model uses PyTorch's segment
    /// addresses, so a faithful replay places every block where PyTorch did).
    pub placement_mismatches: usize,
    /// The first of them.
    pub first_placement_mismatch: Option<usize>,
}

impl Fidelity {
    /// `max_deviation` as a fraction of PyTorch's peak reserved bytes.
    pub fn max_deviation_fraction(&self) -> f64 {
        self.max_deviation as f64 / self.pytorch_peak.max(1) as f64
    }
    /// `|model_end − pytorch_end|` as a fraction of PyTorch's peak reserved bytes.
    pub fn end_deviation_fraction(&self) -> f64 {
        self.model_end.abs_diff(self.pytorch_end) as f64 / self.pytorch_peak.max(1) as f64
    }
}

/// The capacity the recorded trace gives evidence for: at the first `oom` event with `device_free`,
/// PyTorch's reserved bytes at that moment plus `device_free`; `None` without one.
#[doc(hidden)]
pub fn capacity_at_oom(dev: &DeviceTrace) -> Option<u64> {
    let info = dev.ooms.iter().find(|o| o.device_free.is_some())?;
    let mut r: u64 = dev.initial_segments.iter().map(|s| s.size).sum();
    for e in &dev.events[..info.event] {
        match e.kind {
            EventKind::SegmentAlloc | EventKind::SegmentMap => r = r.saturating_add(e.size),
            EventKind::SegmentFree | EventKind::SegmentUnmap => r = r.saturating_sub(e.size),
            _ => {}
        }
    }
    r.checked_add(info.device_free?)
}

/// Replays `dev` through the model seeded with its initial state ([`seed_from_trace`]) under `config`,
/// and compares the model's reserved bytes with PyTorch's after every event. Allocs go to the event's
/// stream; a block is freed at its `free_completed`; segment events drive the model as
/// [`RecordedSegments`] describes; at an `oom` event the model is asked for the same request on the same stream (and gives it
/// back if it succeeds). Reserved bytes are compared between allocator calls: not right after a
/// `segment_alloc`/`segment_map` (the `alloc` it serves follows) nor inside a run of releases. Allocation-free
/// per event.
///
/// # Errors
/// [`AllocError::InvalidConfig`] for a configuration the model refuses; a free the model refuses (a bug)
/// is returned as is.
#[doc(hidden)]
pub fn fidelity(dev: &DeviceTrace, config: CachingConfig) -> Result<Fidelity, AllocError> {
    fidelity_until(dev, config, dev.events.len()).map(|r| r.0)
}

/// [`fidelity`] over the first `events` events, with the model as it is after them.
///
/// # Errors
/// As [`fidelity`].
#[doc(hidden)]
pub fn fidelity_until(
    dev: &DeviceTrace,
    config: CachingConfig,
    events: usize,
) -> Result<(Fidelity, CachingAllocator), AllocError> {
    let seeded = seed_from_trace(dev, config)?;
    let mut rec = RecordedSegments::new(dev, &seeded);
    let mut m = seeded.model;
    // The live allocation of each block id (freed through its handle: no offset lookup).
    let mut live: Vec<Option<Allocation>> = vec![None; dev.block_ids as usize];
    for (id, a) in &seeded.blocks {
        live[*id as usize] = Some(*a);
    }
    for &i in &seeded.unplaced {
        let b = &dev.initial_blocks[i];
        if let Ok(a) = m.alloc_on(b.size.max(1), b.stream) {
            live[b.id as usize] = Some(a);
        }
    }
    let mut pt: u64 = dev.initial_segments.iter().map(|s| s.size).sum();
    let mut f = Fidelity {
        events: dev.events.len(),
        capacity: config.device_capacity,
        pytorch_initial: pt,
        pytorch_peak: pt,
        model_initial: m.reserved_bytes(),
        pytorch_segments: dev.final_state.as_ref().map(|s| s.segment_count() as u64),
        max_deviation: pt.abs_diff(m.reserved_bytes()),
        ..Fidelity::default()
    };
    for (i, e) in dev.events.iter().enumerate().take(events) {
        match e.kind {
            EventKind::Alloc => {
                if let Some(slot) = live.get_mut(e.id as usize) {
                    rec.before_alloc(&m);
                    let r = m.alloc_in(e.size.max(1), e.stream, e.mempool);
                    rec.after_alloc(&mut m, r.as_ref().ok().map(|a| a.offset));
                    match r {
                        Ok(a) => {
                            *slot = Some(a);
                            if a.offset != e.addr {
                                f.placement_mismatches += 1;
                                f.first_placement_mismatch.get_or_insert(i);
                            }
                        }
                        Err(AllocError::OutOfMemory { .. }) => f.invented_failures.push(i),
                        Err(err) => return Err(err),
                    }
                }
            }
            EventKind::Free => {
                if let Some(a) = live.get_mut(e.id as usize).and_then(Option::take) {
                    m.free(a)?;
                }
            }
            EventKind::SegmentAlloc | EventKind::SegmentMap => {
                pt = pt.saturating_add(e.size);
                rec.on_segment_event(&mut m, i, e);
            }
            EventKind::SegmentFree | EventKind::SegmentUnmap => {
                pt = pt.saturating_sub(e.size);
                rec.on_segment_event(&mut m, i, e);
            }
            EventKind::Oom => {
                f.recorded_ooms.push(i);
                match m.alloc_in(e.size.max(1), e.stream, e.mempool) {
                    Ok(a) => m.free(a)?,
                    Err(_) => f.reproduced_ooms += 1,
                }
            }
            _ => {}
        }
        f.pytorch_peak = f.pytorch_peak.max(pt);
        // Compared between allocator calls: PyTorch records a `segment_alloc`/`segment_map` just before the
        // `alloc` it serves, and a release as a run of `segment_free`/`segment_unmap` events.
        let next = dev.events.get(i + 1).map(|n| n.kind);
        // A release of PyTorch's allocator is inside the `alloc` that follows it (the model releases there).
        let mid_call = matches!(e.kind, EventKind::SegmentAlloc | EventKind::SegmentMap)
            || (matches!(e.kind, EventKind::SegmentFree | EventKind::SegmentUnmap)
                && (matches!(next, Some(EventKind::SegmentFree | EventKind::SegmentUnmap)) || rec.decided_by_model(i)));
        let d = pt.abs_diff(m.reserved_bytes());
        if !mid_call && d > f.max_deviation {
            (f.max_deviation, f.max_deviation_event) = (d, Some(i));
        }
    }
    f.pytorch_end = pt;
    f.model_peak = m.counters().peak_reserved;
    f.model_end = m.reserved_bytes();
    f.model_segments = m.segment_count() as u64;
    Ok((f, m))
}
