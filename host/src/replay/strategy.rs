//! The replay target of a host strategy or the PyTorch caching model ([`super::replay`]).
//!
//! Requests are served one by one; frees go through the handle API ([`SubAllocator::free`] with the
//! block's [`Allocation`], kept per block id). The footprint ([`analysis::footprint`]) is the caching model's reserved bytes, or the
//! address high-water mark kept by [`HighWater`] (both ends for the tiered strategy's top-down large
//! tier). Compaction (on-oom, threshold) plans the reference slide, measures it with the real kernel on
//! the backend ([`super::materialize`]) and applies it with [`SubAllocator::apply_relocation`].

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

use super::engine::{Ledger, ReplayTarget, Request, TargetSummary};
use super::materialize::{self, MeasureOutcome};
use super::options::{round_request, CompactPolicy, ReplayOptions, DEFAULT_MATERIALIZE_LIMIT_CPU};
use super::report::{CachingEnd, CompactionRecord, CompactionTrigger, FailedRequest, TierStats};
use super::seeding::seed_caching;
use super::{CompactionFailure, Refusal, ReplayError};
use crate::analysis::FailureClass;
use crate::analysis::{self, external_ratio, Fragmentation};
use crate::backend::Backend;
use crate::facts::{Capacity, MIN_CAPACITY};
use crate::reference::caching::{self, CachingAllocator, RecordedSegments, TraceScan};
use crate::reference::compact::plan_slide;
use crate::reference::{
    build_with_granule, AllocError, AllocatedBlock, Allocation, Handle, StrategyKind, SubAllocator, Tiered,
    TieredConfig, DEFAULT_GRANULE,
};
use crate::trace::{DeviceTrace, Event, EventKind};

// Slot states (0, the default, is "never allocated").
const LIVE: u8 = 1;
const FAILED: u8 = 2;
const FREED: u8 = 3;

/// One block id's state.
#[derive(Clone, Copy)]
struct Slot {
    /// The strategy's allocation (offset, reserved size, handle); freed through it.
    alloc: Allocation,
    /// Requested bytes.
    requested: u64,
    state: u8,
    /// Placed top-down (the tiered strategy's large tier).
    top: bool,
    /// Tier index (tiered strategy: 0 small, 1 medium, 2 large).
    tier: u8,
}

impl Default for Slot {
    fn default() -> Self {
        Slot {
            alloc: Allocation { offset: 0, size: 0, handle: Handle::NONE },
            requested: 0,
            state: 0,
            top: false,
            tier: 0,
        }
    }
}

impl Slot {
    #[inline]
    fn end(&self) -> u64 {
        self.alloc.offset + self.alloc.size
    }
}

/// The address high-water mark of a non-caching strategy: lazy heaps over block ends (bottom-up blocks)
/// and starts (top-down blocks), allocation-free once reserved.
struct HighWater {
    ends: BinaryHeap<(u64, u32)>,
    starts: BinaryHeap<Reverse<(u64, u32)>>,
    capacity: u64,
}

impl HighWater {
    fn new(n: usize, capacity: u64) -> Self {
        HighWater { ends: BinaryHeap::with_capacity(n), starts: BinaryHeap::with_capacity(n), capacity }
    }
    fn push(&mut self, id: u32, s: &Slot) {
        if s.top {
            self.starts.push(Reverse((s.alloc.offset, id)));
        } else {
            self.ends.push((s.end(), id));
        }
    }
    fn current(&mut self, slots: &[Slot]) -> u64 {
        let alive = |slots: &[Slot], id: u32| slots.get(id as usize).is_some_and(|s| s.state == LIVE);
        while let Some(&(end, id)) = self.ends.peek() {
            let s = &slots[id as usize];
            if alive(slots, id) && s.end() == end && !s.top {
                break;
            }
            self.ends.pop();
        }
        while let Some(&Reverse((start, id))) = self.starts.peek() {
            let s = &slots[id as usize];
            if alive(slots, id) && s.alloc.offset == start && s.top {
                break;
            }
            self.starts.pop();
        }
        let bottom_end = self.ends.peek().map_or(0, |x| x.0);
        let top_start = self.starts.peek().map_or(self.capacity, |x| x.0 .0);
        // Interleaved ends (a large block placed low) span the whole range.
        analysis::footprint(bottom_end, top_start, self.capacity)
    }
    fn rebuild(&mut self, slots: &[Slot]) {
        self.ends.clear();
        self.starts.clear();
        for (id, s) in slots.iter().enumerate() {
            if s.state == LIVE {
                self.push(id as u32, s);
            }
        }
    }
}

/// The allocator under replay; the caching model is kept as its concrete type for O(1) reserved bytes.
enum Model {
    Caching(Box<CachingAllocator>),
    Strategy(Box<dyn SubAllocator + Send>),
}

impl std::ops::Deref for Model {
    type Target = dyn SubAllocator + Send;
    fn deref(&self) -> &Self::Target {
        match self {
            Model::Caching(c) => &**c,
            Model::Strategy(b) => &**b,
        }
    }
}

impl std::ops::DerefMut for Model {
    fn deref_mut(&mut self) -> &mut Self::Target {
        match self {
            Model::Caching(c) => &mut **c,
            Model::Strategy(b) => &mut **b,
        }
    }
}

/// Per-tier bookkeeping of the tiered strategy.
struct Tiers {
    small_max: u64,
    large_min: u64,
    stats: [TierStats; 3],
    live: [u64; 3],
}

impl Tiers {
    fn new(small_max: u64, large_min: u64) -> Self {
        let t = |tier: &str, min_size: u64, max_size: u64| TierStats {
            tier: tier.into(),
            min_size,
            max_size,
            ..TierStats::default()
        };
        Tiers {
            small_max,
            large_min,
            stats: [
                t("small", 1, small_max),
                t("medium", small_max + 1, large_min - 1),
                t("large", large_min, u64::MAX),
            ],
            live: [0; 3],
        }
    }
    #[inline]
    fn of(&self, size: u64) -> u8 {
        if size <= self.small_max {
            0
        } else if size >= self.large_min {
            2
        } else {
            1
        }
    }
}

/// Builds the allocator: the caching model with the snapshot's own settings
/// ([`caching::config_for_trace`]), the tiered strategy with `tiers` when given, else
/// [`build_with_granule`]. A host strategy's granule is the requests' alignment `align` up to
/// [`DEFAULT_GRANULE`]: a byte-granular trace (minimalloc's, 1 B) is not rounded to 256 B, so that its
/// buffers that fit byte for byte fit here too; PyTorch's (512 B) and RMM's (256 B) keep 256 B.
/// Returns it and the tiered strategy's `large_min` (`u64::MAX` for the others).
fn make_model(
    kind: StrategyKind,
    capacity: u64,
    align: u64,
    dev: &DeviceTrace,
    tiers: Option<(u64, u64)>,
    scan: Option<&TraceScan>,
) -> Result<(Model, u64), ReplayError> {
    let granule = if align.is_power_of_two() { align.min(DEFAULT_GRANULE) } else { DEFAULT_GRANULE };
    if !(MIN_CAPACITY..=crate::reference::MAX_BYTES).contains(&capacity) {
        return Err(Refusal::CapacityRange(capacity).into());
    }
    match kind {
        StrategyKind::Caching => {
            let (cfg, _) = match scan {
                Some(scan) => caching::config_for_scanned(dev, capacity, scan),
                None => caching::config_for_trace(dev, capacity),
            };
            let c = CachingAllocator::new(cfg).map_err(|source| Refusal::Caching { capacity, source })?;
            Ok((Model::Caching(Box::new(c)), u64::MAX))
        }
        StrategyKind::Tiered => {
            let mut cfg = TieredConfig { granule, ..TieredConfig::for_capacity(capacity) };
            if let Some((small_max, large_min)) = tiers {
                // A threshold above the capacity names a tier no request can reach: refused, as the README
                // says the tiers are capped by the capacity (`--tiers 1,1e19` was accepted and reported a
                // large tier starting at 8 EiB).
                if large_min > capacity {
                    return Err(Refusal::TiersAboveCapacity { small_max, large_min, capacity }.into());
                }
                cfg.small_max = small_max;
                cfg.large_min = large_min;
                cfg.page_size = cfg.page_size.max(small_max.checked_next_power_of_two().unwrap_or(u64::MAX));
            }
            let t = Tiered::with_config(capacity, cfg).map_err(|source| Refusal::Tiered { capacity, source })?;
            Ok((Model::Strategy(Box::new(t)), cfg.large_min))
        }
        _ if tiers.is_some() => Err(Refusal::TiersNotTiered(kind).into()),
        _ => Ok((Model::Strategy(build_with_granule(kind, capacity, granule)), u64::MAX)),
    }
}

/// The replay target of one host strategy (or the caching model) over one device trace.
pub(crate) struct StrategyTarget<'a> {
    kind: StrategyKind,
    capacity: Capacity,
    model: Model,
    slots: Vec<Slot>,
    high_water: HighWater,
    align: u64,
    policy: CompactPolicy,
    /// Threshold policy: armed until it fires, re-armed when fragmentation falls back.
    armed: bool,
    backend: Option<&'a Backend>,
    limit: u64,
    /// Caching model of a snapshot: the recorded segment events drive its releases.
    recorded: Option<RecordedSegments>,
    seeded_segments: u64,
    /// Whether to seed the caching model from the snapshot's state.
    seed_from_snapshot: bool,
    /// Tiered strategy: per-tier figures.
    tiers: Option<Box<Tiers>>,
    /// The trace's scan, when the caller made it once for many replays.
    scan: Option<&'a TraceScan>,
}

impl<'a> StrategyTarget<'a> {
    /// A target for `opts` over `dev` at `capacity`, requests aligned to `align` bytes; `scan`: the caching
    /// model's scan of `dev` when the caller made it ([`TraceScan`]; `None`: made here).
    ///
    /// # Errors
    /// [`ReplayError::Config`] for a capacity or tiers the strategy cannot use.
    pub(crate) fn new(
        dev: &DeviceTrace,
        opts: &ReplayOptions,
        capacity: Capacity,
        align: u64,
        pytorch_snapshot: bool,
        backend: Option<&'a Backend>,
        scan: Option<&'a TraceScan>,
    ) -> Result<Self, ReplayError> {
        let (model, large_min) = make_model(opts.strategy, capacity.bytes, align, dev, opts.tiers, scan)?;
        let caching = matches!(model, Model::Caching(_));
        let limit = opts.materialize_limit.unwrap_or_else(|| match backend {
            Some(Backend::Gpu(g)) => {
                g.mem_info().map_or(DEFAULT_MATERIALIZE_LIMIT_CPU, |(free, _)| free as u64 / 10 * 8)
            }
            _ => DEFAULT_MATERIALIZE_LIMIT_CPU,
        });
        let n = dev.block_ids as usize;
        let tiers = match &model {
            Model::Strategy(_) if opts.strategy == StrategyKind::Tiered => {
                let small_max =
                    opts.tiers.map_or_else(|| TieredConfig::for_capacity(capacity.bytes).small_max, |t| t.0);
                Some(Box::new(Tiers::new(small_max, large_min)))
            }
            _ => None,
        };
        Ok(StrategyTarget {
            tiers,
            kind: opts.strategy,
            high_water: HighWater::new(if caching { 0 } else { n }, capacity.bytes),
            capacity,
            model,
            slots: Vec::new(),
            align,
            policy: opts.policy,
            armed: true,
            backend,
            limit,
            recorded: None,
            seeded_segments: 0,
            seed_from_snapshot: caching && pytorch_snapshot,
            scan,
        })
    }

    /// The slot of block `id`, the vector grown to hold it: slots are made as ids are first used
    /// rather than for every id of the trace up front, so that a replay that stops at its first failed
    /// request ([`super::replay_search`]) does not fill the slots of a whole long trace (40 B each,
    /// 20 MB per replay at 10^6 events).
    #[inline]
    fn slot(&mut self, id: u32) -> &mut Slot {
        let i = id as usize;
        if i >= self.slots.len() {
            self.slots.resize(i + 1, Slot::default());
        }
        &mut self.slots[i]
    }

    #[inline]
    fn caching(&self) -> bool {
        matches!(self.model, Model::Caching(_))
    }

    /// Allocates block `id`; returns `Err(OutOfMemory...)` unchanged for the caller to handle.
    #[inline]
    fn try_alloc(&mut self, l: &mut Ledger, r: Request) -> Result<(), AllocError> {
        let (id, requested, stream) = (r.id, r.requested, r.stream);
        // `size`: the rounded request (the tiers of the tiered strategy are chosen by it).
        let (a, size, top) = match &mut self.model {
            // The model rounds the request itself (roundup divisions, torch_npu's pad) on its stream; it
            // places nothing top-down.
            Model::Caching(c) => {
                if let Some(r) = self.recorded.as_mut() {
                    r.before_alloc(c);
                }
                let a = c.alloc_in(requested.max(1), stream, r.mempool);
                if let Some(r) = self.recorded.as_mut() {
                    r.after_alloc(c, a.as_ref().ok().map(|a| a.offset));
                }
                (a?, requested, false)
            }
            Model::Strategy(h) => {
                let size = round_request(requested, self.align);
                let a = h.alloc(size, self.align)?;
                // Top-down placement as the strategy reports it (the tiered strategy's large tier).
                let top = h.placed_top_down(&AllocatedBlock { offset: a.offset, size: a.size, requested });
                (a, size, top)
            }
        };
        let mut s = Slot { alloc: a, requested, state: LIVE, top, tier: 0 };
        if let Some(t) = self.tiers.as_mut() {
            let k = t.of(size);
            s.tier = k;
            let st = &mut t.stats[k as usize];
            st.requested_bytes += requested;
            st.block_bytes += a.size;
            t.live[k as usize] += requested;
            st.peak_live = st.peak_live.max(t.live[k as usize]);
        }
        *self.slot(id) = s;
        if !self.caching() {
            self.high_water.push(id, &s);
        }
        l.allocated += requested;
        Ok(())
    }

    /// Compacts now; `None` (nothing done) when the reference plan moves nothing.
    fn compact(&mut self, event: usize, trigger: CompactionTrigger) -> Result<Option<CompactionRecord>, ReplayError> {
        let cerr = |e: CompactionFailure| ReplayError::Compaction { event, source: e };
        let before = self.model.stats();
        let footprint_before = self.footprint();
        let layout = self.model.compaction_layout();
        let plan = plan_slide(&layout).map_err(|e| cerr(e.into()))?;
        if plan.bytes_moved == 0 {
            return Ok(None);
        }
        let measurement = match self.backend {
            Some(b) => materialize::measure(b, &layout, &plan, self.limit, event as u64).map_err(|e| cerr(e.into()))?,
            None => MeasureOutcome::NotMeasured { reason: "no backend given".into() },
        };
        self.model.apply_relocation(&plan).map_err(|e| cerr(e.into()))?;
        // Handles stay valid across a relocation; only the offsets move.
        for s in self.slots.iter_mut().filter(|s| s.state == LIVE) {
            if let Some(d) = plan.translate(s.alloc.offset) {
                s.alloc.offset = d;
            }
        }
        if !self.caching() {
            self.high_water.rebuild(&self.slots);
        }
        let after = self.model.stats();
        Ok(Some(CompactionRecord {
            event,
            trigger,
            request: None,
            retry_succeeded: None,
            units: plan.moves.len(),
            planned_bytes_moved: plan.bytes_moved,
            planned_units_moved: plan.blocks_moved,
            external_before: external_ratio(before.free, before.largest_free),
            external_after: external_ratio(after.free, after.largest_free),
            footprint_before,
            footprint_after: self.footprint(),
            measurement,
        }))
    }

    fn serve(&mut self, l: &mut Ledger, r: Request) -> Result<(), ReplayError> {
        if let Some(t) = self.tiers.as_mut() {
            let k = t.of(round_request(r.requested, self.align));
            t.stats[k as usize].requests += 1;
        }
        let err = match self.try_alloc(l, r) {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        let mut diag = analysis::diagnose_error(&err);
        if let (CompactPolicy::OnOom, Some(d), Some(i)) = (self.policy, &diag, r.event) {
            if d.fits_after_compaction || d.class == analysis::OomClass::Fits {
                let t = Instant::now();
                // A layout that is already compact is left alone (no record, no retry).
                if let Some(mut rec) = self.compact(i, CompactionTrigger::OnOom)? {
                    rec.request = Some(r.requested);
                    let retry = self.try_alloc(l, r);
                    rec.retry_succeeded = Some(retry.is_ok());
                    l.compactions.push(rec);
                    l.exclude_since(t);
                    match retry {
                        Ok(()) => return Ok(()),
                        Err(e) => diag = analysis::diagnose_error(&e),
                    }
                } else {
                    l.exclude_since(t);
                }
            }
        }
        self.slot(r.id).state = FAILED;
        if let Some(t) = self.tiers.as_mut() {
            let k = t.of(round_request(r.requested, self.align));
            t.stats[k as usize].failed += 1;
        }
        let (class, free, largest_free) = match diag {
            // `Fits` (the largest extent is large enough, but the strategy could not use it: alignment,
            // slab pages) counts as fragmentation: the free bytes would hold the request once compacted.
            Some(d) => (
                FailureClass::of_request(d.class, r.requested, l.allocated, self.capacity.bytes),
                d.free,
                d.largest_free,
            ),
            None => {
                let s = self.model.stats();
                (FailureClass::Rejected, s.free, s.largest_free)
            }
        };
        l.failed.push(FailedRequest { event: r.event, size: r.requested, class, free, largest_free });
        Ok(())
    }
}

impl ReplayTarget for StrategyTarget<'_> {
    fn seed(&mut self, l: &mut Ledger, dev: &DeviceTrace) -> Result<Vec<usize>, ReplayError> {
        let Model::Caching(c) = &self.model else {
            let mut v: Vec<usize> = (0..dev.initial_blocks.len()).collect();
            v.sort_by_key(|&i| dev.initial_blocks[i].addr);
            return Ok(v);
        };
        if !self.seed_from_snapshot {
            let mut v: Vec<usize> = (0..dev.initial_blocks.len()).collect();
            v.sort_by_key(|&i| dev.initial_blocks[i].addr);
            return Ok(v);
        }
        let seeded = seed_caching(dev, c, self.scan)?;
        for &(id, a) in &seeded.blocks {
            let requested = dev.initial_blocks[id as usize].size;
            *self.slot(id) = Slot { alloc: a, requested, state: LIVE, top: false, tier: 0 };
            l.allocated += requested;
        }
        self.seeded_segments = seeded.segments;
        self.recorded = Some(seeded.recorded);
        self.model = Model::Caching(Box::new(seeded.model));
        Ok(seeded.unplaced)
    }

    fn alloc(&mut self, l: &mut Ledger, r: Request) -> Result<(), ReplayError> {
        self.serve(l, r)?;
        let f = self.footprint();
        l.observe(r.event, f);
        Ok(())
    }

    fn free(&mut self, l: &mut Ledger, event: usize, id: u32) -> Result<(), ReplayError> {
        if let Some(s) = self.slots.get_mut(id as usize) {
            if s.state == LIVE {
                s.state = FREED;
                let (a, requested, tier) = (s.alloc, s.requested, s.tier);
                self.model.free(a).map_err(|source| ReplayError::Strategy { event, source })?;
                if let Some(t) = self.tiers.as_mut() {
                    t.live[tier as usize] -= requested;
                }
                l.allocated -= requested;
            }
        }
        let f = self.footprint();
        l.observe(Some(event), f);
        if let CompactPolicy::Threshold(th) = self.policy {
            let st = self.model.stats();
            if external_ratio(st.free, st.largest_free) <= th {
                self.armed = true;
            } else if self.armed && st.live_blocks > 0 {
                self.armed = false;
                let t = Instant::now();
                if let Some(rec) = self.compact(event, CompactionTrigger::Threshold)? {
                    l.compactions.push(rec);
                }
                l.exclude_since(t);
                let f = self.footprint();
                l.observe(Some(event), f);
            }
        }
        Ok(())
    }

    fn segment_event(&mut self, l: &mut Ledger, event: usize, e: &Event, prev: EventKind) -> Result<(), ReplayError> {
        // The caching model releases what PyTorch released (`RecordedSegments`); a strategy without a cache
        // is asked to release at the first event of each run of releases.
        let released = match (&mut self.model, self.recorded.as_mut()) {
            (Model::Caching(c), Some(r)) => r.on_segment_event(c, event, e),
            (m, _) => {
                let first = !matches!(prev, EventKind::SegmentFree | EventKind::SegmentUnmap);
                if first && matches!(e.kind, EventKind::SegmentFree | EventKind::SegmentUnmap) {
                    m.release_cached()
                } else {
                    0
                }
            }
        };
        if released > 0 {
            let f = self.footprint();
            l.observe(Some(event), f);
        }
        Ok(())
    }

    /// [`analysis::footprint`], kept incrementally: O(1) for the caching model, amortised O(log n) else.
    #[inline]
    fn footprint(&mut self) -> u64 {
        match &self.model {
            Model::Caching(c) => c.reserved_bytes(),
            Model::Strategy(_) => self.high_water.current(&self.slots),
        }
    }

    fn external(&mut self, _l: &mut Ledger, _event: Option<usize>) -> Result<f64, ReplayError> {
        let st = self.model.stats();
        Ok(external_ratio(st.free, st.largest_free))
    }

    fn snapshot(&mut self, l: &mut Ledger, event: Option<usize>) -> Result<Fragmentation, ReplayError> {
        let footprint = self.footprint();
        let r = analysis::analyze(&*self.model);
        let in_use = r.in_use;
        Ok(r.with_live(l.allocated, in_use, footprint).at(event))
    }

    fn finish(
        &mut self,
        _l: &mut Ledger,
        _at_end: &Fragmentation,
        _last: Option<usize>,
    ) -> Result<TargetSummary, ReplayError> {
        let caching_end = match &self.model {
            Model::Caching(c) => Some(CachingEnd {
                reserved: c.reserved_bytes(),
                segments: c.segment_count() as u64,
                seeded_segments: self.seeded_segments,
                alloc_retries: c.counters().alloc_retries,
            }),
            Model::Strategy(_) => None,
        };
        Ok(TargetSummary {
            strategy: self.kind.to_string(),
            capacity: self.capacity.clone(),
            policy: self.policy.to_string(),
            caching_end,
            device_heap: None,
            tiers: self.tiers.as_ref().map(|t| {
                t.stats
                    .iter()
                    .map(|s| TierStats {
                        internal_fragmentation: if s.block_bytes == 0 {
                            0.0
                        } else {
                            1.0 - s.requested_bytes as f64 / s.block_bytes as f64
                        },
                        ..s.clone()
                    })
                    .collect()
            }),
        })
    }
}
