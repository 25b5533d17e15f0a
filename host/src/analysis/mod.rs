//! Fragmentation analysis: metrics, levels, free-block histograms and out-of-memory classification.
//!
//! Metrics follow DESIGN.md §3.3 and are meant to be reported together:
//! - external fragmentation `F_ext = 1 - largest_free / total_free` ([`external_fragmentation`]), with the
//!   absolute largest free block;
//! - reserved-but-unallocated bytes split into rounding waste and free holes ([`Fragmentation`]), against the
//!   [`footprint`] (its one definition);
//! - peak utilisation `peak allocated / peak reserved` and Johnstone–Wilson fragmentation #4
//!   `(max footprint - max live) / max live` ([`PeakTracker`]);
//! - the RMS metric `1 - sqrt(Σ f_i²) / Σ f_i`, a free-block size [`Histogram`], and a [`FragLevel`].
//!
//! A failed request is classified by [`diagnose`] as a capacity or a fragmentation failure: it is a
//! fragmentation failure iff the free bytes would hold it after a perfect compaction (`free >= requested`)
//! but no single free extent does. The compaction oracle itself is [`crate::reference::compact`].
//!
//! ```
//! use gpuheap::analysis::{external_fragmentation, Fragmentation};
//!
//! // Three free extents of 1, 1 and 2 bytes: the largest is half of the free bytes.
//! assert_eq!(external_fragmentation([1, 1, 2]), 0.5);
//! assert_eq!(Fragmentation::of_free([1, 1, 2]).external, 0.5);
//! ```

use std::fmt;

use crate::reference::{AllocError, SubAllocator};

/// Fragmentation levels of a ratio in `[0, 1]`: low (< 0.1), medium (< 0.3), high (< 0.6), severe.
/// Serialised as its lower-case name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FragLevel {
    /// Below 0.1.
    #[default]
    Low,
    /// In `[0.1, 0.3)`.
    Medium,
    /// In `[0.3, 0.6)`.
    High,
    /// 0.6 and above.
    Severe,
}

impl FragLevel {
    /// Level of `ratio` (NaN counts as low).
    #[doc(hidden)]
    pub fn of(ratio: f64) -> FragLevel {
        if ratio >= 0.6 {
            FragLevel::Severe
        } else if ratio >= 0.3 {
            FragLevel::High
        } else if ratio >= 0.1 {
            FragLevel::Medium
        } else {
            FragLevel::Low
        }
    }
}

impl FragLevel {
    /// The level's name (`low`, `medium`, `high`, `severe`).
    #[doc(hidden)]
    pub fn as_str(self) -> &'static str {
        match self {
            FragLevel::Low => "low",
            FragLevel::Medium => "medium",
            FragLevel::High => "high",
            FragLevel::Severe => "severe",
        }
    }
}

impl fmt::Display for FragLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl PartialEq<&str> for FragLevel {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// Why a request failed, as reported by a replay (serialised as its lower-case name).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FailureClass {
    /// The live requested bytes and the request exceed the capacity: no allocator could have served it.
    Capacity,
    /// The free bytes would have held it after a perfect compaction ([`diagnose`]); also a request a free
    /// extent could hold that the allocator could not use (alignment, slab pages: [`OomClass::Fits`]).
    Fragmentation,
    /// The capacity holds every live request and this one byte for byte, but not as the allocator
    /// rounds them (its granule, power-of-two blocks, size classes, PyTorch's 512 B blocks): the free
    /// extents are fewer bytes than its rounded request. Compaction cannot help; finer rounding would.
    Rounding,
    /// Refused for another reason (a size over the strategy's limit).
    Rejected,
}

impl FailureClass {
    /// The class of a diagnosis: [`OomClass::Capacity`] is capacity, the others fragmentation.
    #[doc(hidden)]
    pub fn of(class: OomClass) -> FailureClass {
        if class == OomClass::Capacity {
            FailureClass::Capacity
        } else {
            FailureClass::Fragmentation
        }
    }

    /// The class of a failed request of `requested` bytes with the allocator's diagnosis `class` (of its
    /// rounded request against its free extents), when `live` requested bytes are live in `capacity`
    /// bytes: [`Capacity`](Self::Capacity) only when `live + requested > capacity`; a diagnosed capacity
    /// failure inside that is [`Rounding`](Self::Rounding).
    #[doc(hidden)]
    pub fn of_request(class: OomClass, requested: u64, live: u64, capacity: u64) -> FailureClass {
        match FailureClass::of(class) {
            FailureClass::Capacity if live.checked_add(requested).is_some_and(|n| n <= capacity) => {
                FailureClass::Rounding
            }
            c => c,
        }
    }

    /// The class's name (`capacity`, `fragmentation`, `rounding`, `rejected`).
    #[doc(hidden)]
    pub fn as_str(self) -> &'static str {
        match self {
            FailureClass::Capacity => "capacity",
            FailureClass::Fragmentation => "fragmentation",
            FailureClass::Rounding => "rounding",
            FailureClass::Rejected => "rejected",
        }
    }
}

impl fmt::Display for FailureClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl PartialEq<&str> for FailureClass {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// External fragmentation `1 - largest_free / free` (bytes; 0 when nothing is free): the one definition
/// every report uses (analysis, replay, compaction).
#[inline]
#[doc(hidden)]
pub fn external_ratio(free: u64, largest_free: u64) -> f64 {
    external_ratio_wide(free as u128, largest_free)
}

#[inline]
fn external_ratio_wide(free: u128, largest_free: u64) -> f64 {
    if free == 0 {
        0.0
    } else {
        1.0 - largest_free as f64 / free as f64
    }
}

/// [`external_ratio`] over free block lengths (bytes, summed without overflow).
#[doc(hidden)]
pub fn external_fragmentation(lengths: impl IntoIterator<Item = u64>) -> f64 {
    let (total, largest) = lengths.into_iter().fold((0u128, 0u64), |(t, m), l| (t + l as u128, m.max(l)));
    external_ratio_wide(total, largest)
}

/// `1 - sqrt(Σ f_i²) / Σ f_i` over free block lengths (bytes); 0 when nothing is free.
#[doc(hidden)]
pub fn rms_fragmentation(lengths: impl IntoIterator<Item = u64>) -> f64 {
    let (sum, sq) = lengths.into_iter().fold((0f64, 0f64), |(s, q), l| (s + l as f64, q + (l as f64) * (l as f64)));
    if sum == 0.0 {
        0.0
    } else {
        1.0 - sq.sqrt() / sum
    }
}

/// One power-of-two bucket of a [`Histogram`]: blocks with `lower <= len < 2 * lower` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[doc(hidden)]
pub struct Bucket {
    /// Lower bound in bytes (a power of two).
    pub lower: u64,
    /// Number of free blocks.
    pub count: usize,
    /// Their total bytes.
    pub bytes: u64,
}

/// Free-block sizes in power-of-two buckets, ascending; empty buckets are omitted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[doc(hidden)]
pub struct Histogram {
    /// Non-empty buckets, ascending.
    pub buckets: Vec<Bucket>,
}

impl Histogram {
    /// Histogram of free block lengths (bytes); zero lengths are ignored.
    pub fn of(lengths: impl IntoIterator<Item = u64>) -> Histogram {
        let mut counts = [(0usize, 0u64); 64];
        for l in lengths.into_iter().filter(|&l| l > 0) {
            let k = 63 - l.leading_zeros() as usize;
            counts[k].0 += 1;
            counts[k].1 += l;
        }
        let buckets = counts
            .iter()
            .enumerate()
            .filter(|(_, c)| c.0 > 0)
            .map(|(k, &(count, bytes))| Bucket { lower: 1 << k, count, bytes })
            .collect();
        Histogram { buckets }
    }
}

/// Fragmentation metrics of one allocator at one moment: the one fragmentation type of gpuheap, used by
/// [`analyze`], the replay report (`at_peak`, `at_end`) and the compaction reports (`before`, `after`).
/// Bytes unless named otherwise. Serialised with these field names (the replay's JSON).
///
/// Built from the free extents ([`Fragmentation::of_free`]) and the live bytes
/// ([`Fragmentation::with_live`]); a free-block [`Histogram`] is `Histogram::of` the same lengths.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Fragmentation {
    /// The event after which the metrics were taken (`None`: before the first event, or outside a replay).
    pub event: Option<usize>,
    /// Requested bytes live.
    pub allocated: u64,
    /// Bytes of live blocks, rounding included.
    pub in_use: u64,
    /// The footprint, as defined by [`footprint`].
    pub footprint: u64,
    /// `footprint − allocated`: reserved but unallocated.
    pub reserved_unallocated: u64,
    /// `in_use − allocated`: internal (rounding) waste.
    pub rounding_waste: u64,
    /// `footprint − in_use`: free holes inside the footprint.
    pub holes: u64,
    /// All free bytes (inside and outside the footprint).
    pub free: u64,
    /// Largest free extent.
    pub largest_free: u64,
    /// Number of free extents.
    pub free_blocks: u64,
    /// External fragmentation `1 − largest_free / free` ([`external_ratio`]).
    pub external: f64,
    /// RMS fragmentation `1 − sqrt(Σ f²) / Σ f` ([`rms_fragmentation`]).
    pub rms: f64,
    /// Level of `external`.
    pub level: FragLevel,
}

impl Fragmentation {
    /// The free-space metrics of free extents of `lengths` bytes (free, largest, count, external, RMS,
    /// level); the live-bytes fields stay 0 until [`with_live`](Self::with_live).
    pub fn of_free(lengths: impl IntoIterator<Item = u64>) -> Fragmentation {
        let lens: Vec<u64> = lengths.into_iter().collect();
        let external = external_fragmentation(lens.iter().copied());
        Fragmentation {
            free: lens.iter().fold(0u64, |a, &l| a.saturating_add(l)),
            largest_free: lens.iter().copied().max().unwrap_or(0),
            free_blocks: lens.len() as u64,
            external,
            rms: rms_fragmentation(lens.iter().copied()),
            level: FragLevel::of(external),
            ..Fragmentation::default()
        }
    }

    /// Sets the live bytes: `allocated` requested bytes in blocks of `in_use` bytes, and the
    /// [`footprint`]; derives reserved-but-unallocated, rounding waste and holes from them.
    #[doc(hidden)]
    pub fn with_live(self, allocated: u64, in_use: u64, footprint: u64) -> Fragmentation {
        Fragmentation {
            allocated,
            in_use,
            footprint,
            reserved_unallocated: footprint.saturating_sub(allocated),
            rounding_waste: in_use.saturating_sub(allocated),
            holes: footprint.saturating_sub(in_use),
            ..self
        }
    }

    /// The same metrics, taken after `event`.
    pub fn at(self, event: Option<usize>) -> Fragmentation {
        Fragmentation { event, ..self }
    }
}

/// The footprint in bytes of a strategy that carves one range of `capacity` bytes: the one definition every
/// report uses (analysis, replay, compaction; DESIGN.md §3.3). It is the part of the range its live memory
/// reaches from the end(s) it grows from: `bottom_end`, the end of the highest unit placed bottom-up, plus
/// `capacity − top_start`, where `top_start` is the start of the lowest unit placed top-down (the tiered
/// strategy's large tier; `capacity` when there is none), at most `capacity`. A unit is a live block, or for
/// the device heap a slab page or large block. With nothing live the footprint is 0.
///
/// A strategy that obtains its memory as separate segments (the PyTorch caching model,
/// [`SubAllocator::segment_bytes`]) has the sum of its segments as footprint instead (PyTorch's
/// `reserved_bytes`).
#[inline]
#[doc(hidden)]
pub fn footprint(bottom_end: u64, top_start: u64, capacity: u64) -> u64 {
    bottom_end.saturating_add(capacity.saturating_sub(top_start)).min(capacity)
}

/// [`footprint`] of `alloc` now: its [`SubAllocator::segment_bytes`] when it obtains memory as segments
/// (the caching model), else the span of its live blocks from the end(s) they grow from, the blocks
/// placed top-down being those [`SubAllocator::placed_top_down`] names. O(n) in the live blocks.
#[doc(hidden)]
pub fn allocator_footprint(alloc: &dyn SubAllocator) -> u64 {
    let capacity = alloc.capacity();
    if let Some(segments) = alloc.segment_bytes() {
        return segments;
    }
    let (mut bottom_end, mut top_start) = (0, capacity);
    for b in alloc.live_blocks() {
        if alloc.placed_top_down(&b) {
            top_start = top_start.min(b.offset);
        } else {
            bottom_end = bottom_end.max(b.offset + b.size);
        }
    }
    footprint(bottom_end, top_start, capacity)
}

/// Analyses the current state of `alloc`. O(n log n) in the number of blocks.
#[doc(hidden)]
pub fn analyze(alloc: &dyn SubAllocator) -> Fragmentation {
    let s = alloc.stats();
    Fragmentation {
        free: s.free,
        largest_free: s.largest_free,
        free_blocks: s.free_blocks as u64,
        ..Fragmentation::of_free(alloc.free_blocks().map(|b| b.1))
    }
    .with_live(s.allocated, s.reserved_in_use, allocator_footprint(alloc))
}

/// Tracks peaks over a run (trace replay): feed it after every operation. Bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeakTracker {
    /// Highest live (allocated) bytes seen.
    pub max_live: u64,
    /// Highest [`footprint`] bytes seen.
    pub max_footprint: u64,
}

impl PeakTracker {
    /// Records one observation of live and footprint bytes.
    #[doc(hidden)]
    pub fn observe(&mut self, live: u64, footprint: u64) {
        self.max_live = self.max_live.max(live);
        self.max_footprint = self.max_footprint.max(footprint);
    }

    /// Records the state of `alloc` (live = requested bytes, [`allocator_footprint`]).
    #[doc(hidden)]
    pub fn observe_allocator(&mut self, alloc: &dyn SubAllocator) {
        self.observe(alloc.stats().allocated, allocator_footprint(alloc));
    }

    /// Peak utilisation `max_live / max_footprint` (1 when nothing was reserved).
    #[doc(hidden)]
    pub fn utilisation(&self) -> f64 {
        if self.max_footprint == 0 {
            1.0
        } else {
            self.max_live as f64 / self.max_footprint as f64
        }
    }

    /// Johnstone–Wilson fragmentation #4: `(max_footprint - max_live) / max_live` (0 when nothing was live).
    #[doc(hidden)]
    pub fn johnstone_wilson(&self) -> f64 {
        if self.max_live == 0 {
            0.0
        } else {
            (self.max_footprint as f64 - self.max_live as f64) / self.max_live as f64
        }
    }
}

/// Why a request does or does not fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OomClass {
    /// The largest free extent holds the request: not an out-of-memory condition.
    Fits,
    /// Enough free bytes in total, but no extent large enough: compaction (or releasing cached holes,
    /// or expandable segments) would let it succeed.
    Fragmentation,
    /// Not enough free bytes even after a perfect compaction; defragmenting cannot help.
    Capacity,
}

impl fmt::Display for OomClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OomClass::Fits => "fits",
            OomClass::Fragmentation => "fragmentation",
            OomClass::Capacity => "capacity",
        })
    }
}

/// Diagnosis of a request against free memory. Bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OomDiagnosis {
    /// The class.
    pub class: OomClass,
    /// Requested bytes.
    pub requested: u64,
    /// Total free bytes (device-free plus cached holes).
    pub free: u64,
    /// Largest free extent.
    pub largest_free: u64,
    /// Bytes missing even after compaction (`requested - free`, 0 unless [`OomClass::Capacity`]).
    pub shortfall: u64,
    /// Whether a perfect compaction would let the request succeed.
    pub fits_after_compaction: bool,
    /// One line of advice; never suggests defragmentation for a capacity failure.
    pub advice: &'static str,
}

/// Classifies `requested` bytes against `free` total bytes whose largest extent is `largest_free`.
pub fn diagnose(requested: u64, free: u64, largest_free: u64) -> OomDiagnosis {
    let class = if largest_free >= requested {
        OomClass::Fits
    } else if free >= requested {
        OomClass::Fragmentation
    } else {
        OomClass::Capacity
    };
    let advice = match class {
        OomClass::Fits => "the request fits in the largest free extent",
        OomClass::Fragmentation => {
            "enough memory is free but not in one piece: compact, release cached segments, or use expandable segments"
        }
        OomClass::Capacity => "not enough free memory in total: reduce the working set or add memory",
    };
    OomDiagnosis {
        class,
        requested,
        free,
        largest_free,
        shortfall: requested.saturating_sub(free),
        fits_after_compaction: free >= requested,
        advice,
    }
}

/// [`diagnose`] for a heap described by its device-free extents and its cached (reserved but unallocated)
/// holes, as PyTorch's OOM message reports them. Bytes.
#[doc(hidden)]
pub fn diagnose_heap(requested: u64, device_free: &[u64], holes: &[u64]) -> OomDiagnosis {
    let all = device_free.iter().chain(holes);
    let free = all.clone().fold(0u64, |a, &b| a.saturating_add(b));
    diagnose(requested, free, all.copied().max().unwrap_or(0))
}

/// The diagnosis carried by an [`AllocError::OutOfMemory`]; `None` for other errors.
#[doc(hidden)]
pub fn diagnose_error(err: &AllocError) -> Option<OomDiagnosis> {
    match *err {
        AllocError::OutOfMemory { requested, free, largest_free } => Some(diagnose(requested, free, largest_free)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::{build, StrategyKind};

    #[test]
    fn levels_and_metrics() {
        assert_eq!(
            [0.0, 0.1, 0.29, 0.3, 0.59, 0.6, 1.0].map(FragLevel::of),
            [
                FragLevel::Low,
                FragLevel::Medium,
                FragLevel::Medium,
                FragLevel::High,
                FragLevel::High,
                FragLevel::Severe,
                FragLevel::Severe
            ]
        );
        assert_eq!(external_fragmentation([]), 0.0);
        assert_eq!(external_fragmentation([10, 30]), 0.25);
        assert_eq!(rms_fragmentation([5]), 0.0);
        assert!((rms_fragmentation([1, 1, 1, 1]) - 0.5).abs() < 1e-12);
        let h = Histogram::of([1, 3, 2, 1024, 1500, 0]);
        assert_eq!(
            h.buckets,
            vec![
                Bucket { lower: 1, count: 1, bytes: 1 },
                Bucket { lower: 2, count: 2, bytes: 5 },
                Bucket { lower: 1024, count: 2, bytes: 2524 }
            ]
        );
        let mut p = PeakTracker::default();
        p.observe(100, 150);
        p.observe(80, 200);
        assert_eq!((p.utilisation(), p.johnstone_wilson()), (0.5, 1.0));
    }

    #[test]
    fn footprint_counts_top_down_blocks_from_the_top() {
        use crate::reference::{AllocatedBlock, Tiered, TieredConfig};
        let cfg = TieredConfig { small_max: 1024, large_min: 64 << 10, page_size: 8192, granule: 256 };
        let cap = 1 << 20;
        let mut t = Tiered::with_config(cap, cfg).unwrap();
        assert_eq!(allocator_footprint(&t), 0, "nothing live");
        let medium = t.alloc(4096, 1).unwrap();
        let large = t.alloc(128 << 10, 1).unwrap();
        assert!(t.placed_top_down(&AllocatedBlock { offset: large.offset, size: large.size, requested: 0 }));
        assert_eq!(large.offset + large.size, cap, "the large block sits at the top");
        let want = (medium.offset + medium.size) + (cap - large.offset);
        assert_eq!(allocator_footprint(&t), want);
        assert_eq!(footprint(medium.offset + medium.size, large.offset, cap), want);
        assert_eq!(footprint(150, 100, 200), 200, "interleaved ends span the range");
    }

    #[test]
    fn report_splits_waste_and_holes() {
        let mut a = build(StrategyKind::FirstFit, 1 << 20);
        let x = a.alloc(100, 1).unwrap(); // 256 reserved
        let _y = a.alloc(1000, 1).unwrap(); // 1024
        a.free(x).unwrap();
        let r = analyze(&*a);
        assert_eq!((r.footprint, r.allocated, r.in_use, r.rounding_waste, r.holes), (1280, 1000, 1024, 24, 256));
        assert_eq!(r.free_blocks, 2);
        assert_eq!(r.level, FragLevel::Low);
        let d = diagnose_error(&a.alloc(1 << 20, 1).unwrap_err()).unwrap();
        assert_eq!(d.class, OomClass::Capacity);
        assert_eq!(d.shortfall, (1 << 20) - r.free);
    }
}
