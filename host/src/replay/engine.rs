//! The one replay driver: the event loop and the report builder, over a [`ReplayTarget`] (what is
//! replayed: a host strategy or the caching model ([`super::strategy`]), the device heap on a backend
//! ([`super::device`])).
//!
//! The engine owns everything that does not depend on the target: the walk over the initial blocks and
//! the events, the counts, the bookkeeping of allocated bytes and peaks ([`Ledger`]), the timeline
//! buckets, PyTorch's reserved series, the snapshots at the demand peak and at the end, the timing, and
//! the [`ReplayReport`]. A target serves (or queues) requests, frees blocks, reacts to segment events,
//! and reports its footprint, fragmentation and end state.
//!
//! Order per event: the target handles the event; at a timeline sampling point or the demand peak it is
//! synchronised ([`ReplayTarget::sync`], a target that batches requests launches them); the bucket takes
//! the allocated and footprint bytes of the last observation; the peak snapshot is taken; at a sampling
//! point the bucket is closed with the target's external fragmentation.

use std::time::Instant;

use super::device::DeviceHeapEnd;
use super::report::{CachingEnd, CompactionRecord, FailedRequest, ReplayReport, Sample, TierStats};
use super::ReplayError;
use crate::analysis::Fragmentation;
use crate::analysis::PeakTracker;
use crate::cancel::Cancel;
use crate::facts::peaks::SeriesTracker;
use crate::facts::Capacity;
use crate::trace::{DeviceTrace, Event, EventKind, Trace};

/// One allocation request of the trace.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Request {
    /// Event index (`None`: an initial block).
    pub event: Option<usize>,
    /// Dense block id ([`crate::trace::Event::id`]), below [`DeviceTrace::block_ids`].
    pub id: u32,
    /// Requested bytes, as recorded (not rounded).
    pub requested: u64,
    /// The stream it was made on.
    pub stream: i64,
    /// The memory pool it was made in ([`crate::trace::Event::mempool`]; 0: the default pool).
    pub mempool: u16,
}

/// What every target shares: allocated bytes, peaks, failures, compactions, excluded time, and the
/// current timeline bucket.
#[derive(Default)]
pub(crate) struct Ledger {
    /// Requested bytes live (as far as the target has served them).
    pub allocated: u64,
    /// Footprint at the last observation, bytes.
    pub footprint: u64,
    /// Peaks of allocated and footprint bytes.
    pub peaks: PeakTracker,
    /// Event after which the highest footprint was first observed.
    pub peak_fp_event: Option<usize>,
    /// The timeline bucket being filled.
    pub bucket: Sample,
    /// Failed requests.
    pub failed: Vec<FailedRequest>,
    /// Compactions.
    pub compactions: Vec<CompactionRecord>,
    /// Time inside the event loop that is not replay time (compactions, metadata read-backs), ns.
    pub excluded_ns: u64,
}

impl Ledger {
    /// Records the state after `event`: `self.allocated` and the target's `footprint` (bytes).
    #[inline]
    pub fn observe(&mut self, event: Option<usize>, footprint: u64) {
        if footprint > self.peaks.max_footprint {
            self.peak_fp_event = event;
        }
        self.peaks.observe(self.allocated, footprint);
        self.footprint = footprint;
        self.bucket.allocated = self.bucket.allocated.max(self.allocated);
        self.bucket.footprint = self.bucket.footprint.max(footprint);
    }

    /// Adds the time since `t` to the excluded time.
    #[inline]
    pub fn exclude_since(&mut self, t: Instant) {
        self.excluded_ns += t.elapsed().as_nanos() as u64;
    }
}

/// What a target adds to the report at the end.
pub(crate) struct TargetSummary {
    /// Row name (strategy name, `device heap (scaled 1/N)`).
    pub strategy: String,
    /// Capacity used.
    pub capacity: Capacity,
    /// Compaction policy, as text.
    pub policy: String,
    /// The caching model's end state.
    pub caching_end: Option<CachingEnd>,
    /// The device heap's figures.
    pub device_heap: Option<DeviceHeapEnd>,
    /// Per-tier figures (tiered strategy).
    pub tiers: Option<Vec<TierStats>>,
}

/// What is replayed. Every method that changes the target's state calls [`Ledger::observe`] once the
/// change is visible (a batching target: when the batch is launched).
pub(crate) trait ReplayTarget {
    /// Places what is alive before the first event by the target's own means (the caching model of a
    /// snapshot: its recorded segments and blocks); returns the indices into
    /// [`DeviceTrace::initial_blocks`] left for the engine to allocate, in that order.
    ///
    /// # Errors
    /// [`ReplayError::Config`] when the state cannot be placed.
    fn seed(&mut self, l: &mut Ledger, dev: &DeviceTrace) -> Result<Vec<usize>, ReplayError> {
        let _ = l;
        let mut v: Vec<usize> = (0..dev.initial_blocks.len()).collect();
        v.sort_by_key(|&i| dev.initial_blocks[i].addr);
        Ok(v)
    }
    /// Serves (or queues) a request; a refused request goes to [`Ledger::failed`].
    fn alloc(&mut self, l: &mut Ledger, r: Request) -> Result<(), ReplayError>;
    /// Frees block `id` at `event` (nothing when it is not live).
    fn free(&mut self, l: &mut Ledger, event: usize, id: u32) -> Result<(), ReplayError>;
    /// A segment event of a PyTorch snapshot (`prev`: the kind of the event before it).
    fn segment_event(&mut self, l: &mut Ledger, event: usize, e: &Event, prev: EventKind) -> Result<(), ReplayError> {
        let _ = (l, event, e, prev);
        Ok(())
    }
    /// Makes every queued operation visible (after `event`).
    fn sync(&mut self, l: &mut Ledger, event: Option<usize>) -> Result<(), ReplayError> {
        let _ = (l, event);
        Ok(())
    }
    /// The footprint now ([`crate::analysis::footprint`]), bytes.
    fn footprint(&mut self) -> u64;
    /// External fragmentation now, `1 − largest free / free`.
    fn external(&mut self, l: &mut Ledger, event: Option<usize>) -> Result<f64, ReplayError>;
    /// The fragmentation metrics now (after `event`).
    fn snapshot(&mut self, l: &mut Ledger, event: Option<usize>) -> Result<Fragmentation, ReplayError>;
    /// Checks before the end snapshot (after the last event).
    fn before_end(&mut self, l: &mut Ledger, last: Option<usize>) -> Result<(), ReplayError> {
        let _ = (l, last);
        Ok(())
    }
    /// The target's part of the report.
    fn finish(
        &mut self,
        l: &mut Ledger,
        at_end: &Fragmentation,
        last: Option<usize>,
    ) -> Result<TargetSummary, ReplayError>;
}

/// The run's inputs besides the target.
/// The replays check their cancellation flag ([`crate::cancel`]) every `CANCEL_STRIDE + 1` = 16,384
/// events: one relaxed atomic load, and at most a few milliseconds of replay between two checks.
const CANCEL_STRIDE: usize = 0x3FFF;

pub(crate) struct Setup<'a> {
    pub trace: &'a Trace,
    pub dev: &'a DeviceTrace,
    /// Alignment of the requests, bytes.
    pub align: u64,
    /// Where it comes from.
    pub align_source: String,
    /// Most timeline samples.
    pub timeline_points: usize,
    /// Whether PyTorch's own reserved series is comparable with this replay (a snapshot replayed at full
    /// size): it is then reported and sampled into the timeline.
    pub pytorch_comparable: bool,
    /// The event of the demand peak ([`crate::facts::demand_peak`]'s event, computed by the caller with the capacity).
    pub demand_peak_event: Option<usize>,
    /// Checked every 16,384 events ([`crate::cancel`]).
    pub cancel: Cancel,
}

/// Hands event `i` (`e`; `prev`: the kind of the event before it) to `target`: the one dispatch of
/// [`run`] and [`run_search`].
#[inline(always)]
fn step(
    target: &mut dyn ReplayTarget,
    l: &mut Ledger,
    n_blocks: usize,
    i: usize,
    e: &Event,
    prev: EventKind,
) -> Result<(), ReplayError> {
    match e.kind {
        EventKind::Alloc => {
            if (e.id as usize) < n_blocks {
                let r = Request { event: Some(i), id: e.id, requested: e.size, stream: e.stream, mempool: e.mempool };
                target.alloc(l, r)?;
            }
        }
        EventKind::Free => {
            if (e.id as usize) < n_blocks {
                target.free(l, i, e.id)?;
            }
        }
        EventKind::SegmentAlloc | EventKind::SegmentMap | EventKind::SegmentFree | EventKind::SegmentUnmap => {
            target.segment_event(l, i, e, prev)?;
        }
        EventKind::FreeRequested | EventKind::Oom | EventKind::Snapshot | EventKind::Other => {}
    }
    Ok(())
}

/// Seeds `target` with what is alive before the first event ([`ReplayTarget::seed`], then the initial
/// blocks left to the engine) and observes the state: the start of [`run`] and [`run_search`].
fn seed(target: &mut dyn ReplayTarget, l: &mut Ledger, dev: &DeviceTrace) -> Result<(), ReplayError> {
    let n_blocks = dev.block_ids as usize;
    for i in target.seed(l, dev)? {
        let b = &dev.initial_blocks[i];
        if (b.id as usize) < n_blocks {
            let r = Request { event: None, id: b.id, requested: b.size, stream: b.stream, mempool: 0 };
            target.alloc(l, r)?;
        }
    }
    target.sync(l, None)?;
    let f = target.footprint();
    l.observe(None, f);
    Ok(())
}

/// What [`run_search`] reports: the figures of a [`ReplayReport`] that the settings search reads.
#[derive(Clone, Debug)]
pub(crate) struct SearchOutcome {
    /// Highest footprint observed (the report's `peak_reserved`), bytes; up to the first failure when the
    /// run stopped there.
    pub peak_reserved: u64,
    /// The failed requests (the report's `failed`); only the first when the run stopped there.
    pub failed: Vec<FailedRequest>,
}

/// The event loop of [`run`] without what the settings search does not read (timeline, PyTorch's
/// reserved series, the snapshots at the demand peak and at the end, the report). It makes the calls of
/// [`run`] that change a target's state, in the same order (seeding, requests, frees, segment events;
/// [`ReplayTarget::sync`] only at the end), so for a target whose `sync`, `external` and `snapshot`
/// change nothing (the host strategies and the caching model, `super::strategy`) `peak_reserved` and
/// `failed` are those of [`run`]'s report. With `stop_at_failure` it returns at the first failed
/// request (a minimum-capacity probe needs only to know whether one fails). `cancel` is checked at the
/// start and every 16,384 events.
///
/// # Errors
/// Those of the target; [`ReplayError::Cancelled`] once `cancel` is set.
pub(crate) fn run_search(
    target: &mut dyn ReplayTarget,
    dev: &DeviceTrace,
    stop_at_failure: bool,
    cancel: &Cancel,
) -> Result<SearchOutcome, ReplayError> {
    cancel.check()?;
    let n_blocks = dev.block_ids as usize;
    let mut l = Ledger::default();
    seed(target, &mut l, dev)?;
    let stopped = |l: &Ledger| stop_at_failure && !l.failed.is_empty();
    if !stopped(&l) {
        let mut prev_kind = EventKind::Other;
        for (i, e) in dev.events.iter().enumerate() {
            step(target, &mut l, n_blocks, i, e, prev_kind)?;
            prev_kind = e.kind;
            if stopped(&l) {
                break;
            }
            if (i + 1) & CANCEL_STRIDE == 0 {
                cancel.check()?;
            }
        }
    }
    if !stopped(&l) {
        target.sync(&mut l, dev.events.len().checked_sub(1))?;
    }
    Ok(SearchOutcome { peak_reserved: l.peaks.max_footprint, failed: l.failed })
}

/// Replays `setup.dev` through `target`. `progress` is called with the number of events done, every
/// 65,536 events and at the end; `setup.cancel` is checked at the start and every 16,384 events.
///
/// # Errors
/// Those of the target; [`ReplayError::Cancelled`] once `setup.cancel` is set.
pub(crate) fn run(
    target: &mut dyn ReplayTarget,
    setup: &Setup<'_>,
    progress: &mut dyn FnMut(usize),
) -> Result<ReplayReport, ReplayError> {
    setup.cancel.check()?;
    let (trace, dev) = (setup.trace, setup.dev);
    let n_blocks = dev.block_ids as usize;
    let pytorch_snapshot =
        setup.pytorch_comparable && matches!(trace.format, crate::trace::TraceFormat::PytorchSnapshot(_));
    let has_segments =
        pytorch_snapshot && (!dev.initial_segments.is_empty() || dev.events.iter().any(|e| e.kind.is_segment()));
    let mut l = Ledger::default();
    seed(target, &mut l, dev)?;
    let peak_event = setup.demand_peak_event;
    let mut at_peak = None;
    if peak_event.is_none() {
        at_peak = Some(target.snapshot(&mut l, None)?);
    }
    l.excluded_ns = 0;
    l.bucket = Sample::default();
    let start = Instant::now();

    let mut pt = SeriesTracker::new(dev);
    let stride = dev.events.len().div_ceil(setup.timeline_points.max(1)).max(1);
    let mut timeline: Vec<Sample> = Vec::with_capacity(dev.events.len().div_ceil(stride) + 1);
    let (mut allocs, mut frees, mut free_requests) = (0usize, 0usize, 0usize);
    let mut prev_kind = EventKind::Other;
    // The next event closing a timeline bucket by the stride (`(i + 1) % stride == 0`, without a division
    // per event).
    let mut next_stride_sample = stride - 1;
    for (i, e) in dev.events.iter().enumerate() {
        pt.event(i, e);
        match e.kind {
            EventKind::Alloc => allocs += 1,
            EventKind::Free => frees += 1,
            EventKind::FreeRequested => free_requests += 1,
            _ => {}
        }
        step(target, &mut l, n_blocks, i, e, prev_kind)?;
        prev_kind = e.kind;
        let at_peak_event = Some(i) == peak_event;
        let by_stride = i == next_stride_sample;
        if by_stride {
            next_stride_sample += stride;
        }
        let sample = by_stride || i + 1 == dev.events.len();
        if at_peak_event || sample {
            target.sync(&mut l, Some(i))?;
        }
        l.bucket.allocated = l.bucket.allocated.max(l.allocated);
        l.bucket.footprint = l.bucket.footprint.max(l.footprint);
        if has_segments {
            l.bucket.pytorch_reserved = Some(l.bucket.pytorch_reserved.unwrap_or(0).max(pt.reserved()));
        }
        if at_peak_event {
            let t = Instant::now();
            at_peak = Some(target.snapshot(&mut l, Some(i))?);
            l.exclude_since(t);
        }
        if sample {
            let mut b = std::mem::take(&mut l.bucket);
            b.event = i;
            b.time = e.time_us;
            b.external = target.external(&mut l, Some(i))?;
            timeline.push(b);
        }
        if (i + 1) & CANCEL_STRIDE == 0 {
            setup.cancel.check()?;
            if (i + 1) & 0xFFFF == 0 {
                progress(i + 1);
            }
        }
    }
    let last = dev.events.len().checked_sub(1);
    target.sync(&mut l, last)?;
    let replay_ns = (start.elapsed().as_nanos() as u64).saturating_sub(l.excluded_ns).max(1);
    progress(dev.events.len());

    target.before_end(&mut l, last)?;
    let at_end = target.snapshot(&mut l, last)?;
    let s = target.finish(&mut l, &at_end, last)?;
    let peaks = l.peaks;
    Ok(ReplayReport {
        trace: trace.source.display().to_string(),
        format: trace.format.to_string(),
        device: dev.device,
        strategy: s.strategy,
        capacity: s.capacity,
        align: setup.align,
        align_source: setup.align_source.clone(),
        policy: s.policy,
        events: dev.events.len(),
        allocs,
        frees,
        free_requests,
        initial_blocks: dev.initial_blocks.len(),
        peak_allocated: peaks.max_live,
        peak_reserved: peaks.max_footprint,
        peak_reserved_event: l.peak_fp_event,
        utilisation: peaks.utilisation(),
        johnstone_wilson: peaks.johnstone_wilson(),
        failed: l.failed,
        at_peak: at_peak.unwrap_or_default(),
        at_end,
        compactions: l.compactions,
        replay_ns,
        events_per_s: dev.events.len() as f64 / (replay_ns as f64 * 1e-9),
        pytorch: pytorch_snapshot.then(|| pt.finish(dev)),
        recorded_releases: if pytorch_snapshot {
            crate::reference::caching::recorded_releases(dev)
        } else {
            Vec::new()
        },
        history: crate::facts::history_completeness(dev),
        caching_end: s.caching_end,
        device_heap: s.device_heap,
        tiers: s.tiers,
        timeline,
    })
}
