//! Replaying a trace through the **device allocator** ([`crate::device_heap::DeviceHeap`], the
//! `malloc`/`free` kernels callers use from their own kernels) on a backend, with the same report as the
//! host strategies ([`ReplayReport`]), so that `gpuheap compare` shows it as one more row.
//!
//! # Semantics
//!
//! * **Requests** are those the host strategies receive ([`super`]'s module docs): the trace's requested
//!   bytes (zero as one byte) rounded up to the alignment ([`super::round_request`]; the trace's own,
//!   [`super::alignment_for`], unless [`DeviceReplayOptions::align`] is given). The heap
//!   rounds them once more by its own rule: slab slots of 16 B..4 KiB (next power of two), buddy blocks of
//!   a power-of-two number of 4 KiB units above that.
//! * **Batches.** A run of consecutive alloc events is one `malloc` launch with one thread per request
//!   ([`ops::malloc_batch`], thread `i` = the run's `i`-th request); a run of consecutive frees is one
//!   `free` launch ([`ops::free_ptrs`]). Where a block lands inside a batch is the allocator's business
//!   (warp aggregation, hints). Events of other kinds do not end a run. A run is also cut where the replay
//!   needs the heap's state: at the timeline sampling points, at the demand peak and at the end. Blocks
//!   alive before the first event are allocated first, as one batch, in address order. A free of a block
//!   whose allocation returned null is skipped.
//! * **Checks** (always on; a violation is [`ReplayError::Device`], a bug in the heap): every returned
//!   pointer lies in the data region, is 16-byte aligned (large blocks: aligned to their size), and its block
//!   (requested size rounded by the heap's rule) overlaps no live block; at the demand peak and at the end
//!   the metadata read back agrees with the host's view (the live large blocks of
//!   [`DeviceHeap::live_blocks`] are exactly the host's, every live slot lies in a slab page of its class
//!   ([`DeviceHeap::slab_pages`]), and [`crate::device_heap::HeapStats::bytes_in_use`] equals the host's
//!   sum). With [`DeviceReplayOptions::verify_bytes`] every block is also filled with a pattern derived
//!   from its id when it is allocated and checked when it is freed (and at the end).
//! * **Footprint** (the device heap's "reserved"): the address high-water mark of the memory holding live
//!   requests at the heap's granularity: the end (bytes from the data-region base) of the highest live large
//!   block or of the highest 64 KiB slab page that holds a live slot. It is exact after every launch
//!   (computed on the host from the returned pointers and the size rule, the same way the host strategies'
//!   high-water marks are). Empty pages the heap keeps formatted (current pages, reclaimed by its
//!   scavenger on demand) are not counted; [`DeviceHeapEnd::metadata_high_water`] reports the high-water
//!   mark the metadata shows at the end, those pages included.
//! * **Free memory and fragmentation** are the buddy allocator's: free bytes and the largest free buddy
//!   block, read back with [`DeviceHeap::free_blocks`] (free slots inside slab pages are not free memory
//!   for other classes or large blocks, and are not counted). External fragmentation
//!   `1 − largest free block / free bytes` and the RMS metric over the free buddy blocks; *in blocks* is
//!   the heap's own `bytes_in_use` (slots plus large blocks).
//! * **Failed requests** (null returns) are classified after their launch by the heap itself,
//!   [`DeviceHeap::diagnose_failure`] over the free buddy blocks: *capacity* when the heap can never hold
//!   the request or its free buddy bytes are fewer than the buddy block it needs (a whole 64 KiB page for
//!   a slab request), else *fragmentation* (a compaction would make room); a capacity failure while
//!   the live requested bytes and the request fit in the capacity (at the replay's scale) is *rounding*
//!   ([`FailureClass::of_request`]).
//! * **Compaction** does not apply: raw `malloc` blocks are pinned by design (only handle blocks of the
//!   heap's movable region move); the report's policy says `n/a` and it has no compactions.
//! * **Capacity** is [`super::default_capacity`] unless given, as for the host strategies; it must be at
//!   least [`MIN_HEAP_BYTES`] (after scaling). When a heap of
//!   that size is larger than [`DeviceReplayOptions::heap_limit`] (default
//!   [`DEFAULT_DEVICE_HEAP_LIMIT_CPU`] on the CPU backend, whose buffers are ordinary zeroed host memory;
//!   75 % of the free device memory on a GPU) or cannot be allocated, a **scaled trace** is replayed
//!   instead: the capacity and every request are divided by the smallest power of two `N` that makes the
//!   heap fit (requests rounded up, at least one byte). The row is then named `device heap (scaled 1/N)`
//!   and *every byte figure of the report is the scaled replay's* (nothing is multiplied back); the
//!   ratios (utilisation, Johnstone–Wilson, fragmentation) are comparable with the other rows, the byte
//!   figures are not. The heap's granularities (16 B slots, 4 KiB units, 64 KiB pages) do not scale, so
//!   a scaled replay puts more requests into slabs than the real one would.
//! * **Speed.** `replay_ns` is the wall time of the event loop: the launches, the pointer read-backs and
//!   the host bookkeeping; the metadata read-backs (timeline samples, failure diagnoses, the peak and end
//!   snapshots) and the byte verification are excluded.
//! * The event loop, the timeline and the report are the engine's (`super::engine`), shared with the
//!   host strategies; this module is the device heap's `ReplayTarget`. On the CPU backend every launch runs the kernel
//!   on host threads.

use std::collections::BTreeMap;
use std::time::Instant;

use gpuheap_kernels::fill::pattern;
use gpuheap_kernels::heap::layout::{class_of, class_size, order_of, PAGE, UNIT};
use serde::Serialize;

use super::capacity::choose_capacity_and_demand_peak;
use super::engine::{self, Ledger, ReplayTarget, Request, Setup, TargetSummary};
use super::options::{choose_alignment, round_request, DEFAULT_TIMELINE_POINTS};
use super::report::{FailedRequest, ReplayReport};
use super::{DeviceFailure, Refusal, ReplayError};
use crate::analysis::{self, external_ratio, FailureClass, Fragmentation};
use crate::backend::{Backend, BackendError};
use crate::device_heap::ops::{self, Sizes};
use crate::device_heap::{DeviceHeap, MIN_HEAP_BYTES};
use crate::facts::{Capacity, CapacitySource};
use crate::trace::{DeviceTrace, Trace};
use crate::units::fmt_bytes;

/// Default largest heap data region (bytes) the device replay creates on the CPU backend: 8 GiB. A larger
/// capacity is replayed scaled (see the [module docs](self)). The CPU backend's buffers are lazily
/// zeroed host pages and `malloc` never writes into the data region, so such a heap commits little more than
/// its metadata (about 0.9 % of the data region) unless blocks are filled
/// ([`DeviceReplayOptions::verify_bytes`]).
pub const DEFAULT_DEVICE_HEAP_LIMIT_CPU: u64 = 8 << 30;

/// Name of the device allocator's row (`device heap`, or `device heap (scaled 1/N)`).
#[doc(hidden)]
pub const DEVICE_HEAP: &str = "device heap";

/// The policy string of a device replay (compaction does not apply to raw `malloc` blocks).
#[doc(hidden)]
pub const POLICY_NA: &str = "n/a (raw malloc blocks are pinned)";

/// Seed of the byte patterns of [`DeviceReplayOptions::verify_bytes`].
const PATTERN_SEED: u64 = 0x0064_6576_6865_6170;

/// Options of [`replay_device`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct DeviceReplayOptions {
    /// Capacity in bytes of the trace's scale; `None`: [`super::default_capacity`].
    pub capacity: Option<u64>,
    /// Alignment of the requests in bytes (a power of two); `None`: the format's own
    /// ([`super::alignment_for`]).
    pub align: Option<u64>,
    /// Largest heap data region (bytes) to create before the trace is scaled; `None`:
    /// `DEFAULT_DEVICE_HEAP_LIMIT_CPU` on the CPU, 75 % of the free device memory on a GPU.
    pub heap_limit: Option<u64>,
    /// Most timeline samples kept (each one cuts the current batch and reads the buddy levels back).
    pub timeline_points: usize,
    /// Fill every block with a pattern when it is allocated and check it when it is freed (costs the
    /// bytes allocated over the whole trace in host writes and reads; meant for tests).
    pub verify_bytes: bool,
}

impl Default for DeviceReplayOptions {
    fn default() -> Self {
        DeviceReplayOptions {
            capacity: None,
            align: None,
            heap_limit: None,
            timeline_points: DEFAULT_TIMELINE_POINTS,
            verify_bytes: false,
        }
    }
}

/// What a device replay adds to its [`ReplayReport`] (bytes of the replayed, possibly scaled, heap;
/// ns).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[doc(hidden)]
pub struct DeviceHeapEnd {
    /// The backend, described.
    pub backend: String,
    /// 1: the trace at full size; otherwise the factor the capacity and every request were divided by.
    pub scaled_by: u64,
    /// Why the trace was scaled (`None` at full size).
    pub scale_reason: Option<String>,
    /// The capacity at the trace's scale, bytes.
    pub trace_capacity: u64,
    /// Data-region bytes of the heap replayed (the capacity divided by `scaled_by`, rounded down to 4 KiB).
    pub heap_capacity: u64,
    /// `malloc` launches (batches of alloc events).
    pub malloc_launches: u64,
    /// `free` launches (batches of frees).
    pub free_launches: u64,
    /// Kernel time of all launches, ns.
    pub kernel_ns: u64,
    /// Non-null pointers checked (in the data region, aligned, disjoint from every live block).
    pub checked_allocations: u64,
    /// Bytes whose pattern was verified (`None` without [`DeviceReplayOptions::verify_bytes`]).
    pub verified_bytes: Option<u64>,
    /// Formatted slab pages at the end (64 KiB each), from the metadata.
    pub slab_pages: u64,
    /// Live large blocks at the end, from the metadata.
    pub large_blocks: u64,
    /// Free buddy bytes at the end.
    pub free_bytes: u64,
    /// Largest free buddy block at the end, bytes.
    pub largest_free: u64,
    /// End of the highest formatted slab page or live large block at the end, from the metadata
    /// (empty pages kept formatted included), bytes from the data-region base.
    pub metadata_high_water: u64,
    /// Null returns the heap counted itself (its `failed_requests` counter).
    pub heap_failed_counter: u64,
}

// Slot states (0: never allocated).
const LIVE: u8 = 1;
const FAILED: u8 = 2;
const FREED: u8 = 3;

#[derive(Clone, Copy, Default)]
struct Slot {
    /// Offset from the data-region base.
    off: u64,
    /// Block bytes (the heap's rounding of `size`).
    block: u64,
    /// Bytes sent to `malloc`.
    size: u64,
    /// Requested bytes (scaled), for the allocated series.
    requested: u64,
    state: u8,
}

/// One pending allocation.
struct Req {
    event: Option<usize>,
    id: u32,
    size: u64,
    requested: u64,
}

enum Pending {
    None,
    Alloc(Vec<Req>),
    Free(Vec<u32>),
}

/// The heap's rounding of a request of `size` bytes (`size ≥ 1`).
fn block_of(size: u64) -> u64 {
    match class_of(size) {
        Some(c) => class_size(c),
        None => UNIT.checked_shl(order_of(size)).unwrap_or(u64::MAX),
    }
}

/// End of the footprint unit (slab page or large block) of a block at `off`.
fn unit_end(off: u64, block: u64) -> u64 {
    if class_of(block).is_some() {
        (off / PAGE + 1) * PAGE
    } else {
        off + block
    }
}

/// A failed launch, read-back or write of the device heap at `event`.
fn dev_err(event: Option<usize>, e: BackendError) -> ReplayError {
    ReplayError::Device { event, source: DeviceFailure::Backend(e) }
}

/// A returned block that failed a check at `event`.
fn check_err(event: Option<usize>, what: String) -> ReplayError {
    ReplayError::Device { event, source: DeviceFailure::Check(what) }
}

/// The replay target of a [`DeviceHeap`]: requests batched into `malloc` / `free` launches.
struct DeviceTarget<'a> {
    backend: &'a Backend,
    heap: DeviceHeap,
    align: u64,
    scale: u64,
    scale_reason: Option<String>,
    capacity: Capacity,
    slots: Vec<Slot>,
    /// Live blocks: start offset -> end offset.
    extents: BTreeMap<u64, u64>,
    /// Footprint units (slab page or large block) by end offset -> live blocks in them.
    ends: BTreeMap<u64, u32>,
    in_use: u64,
    pending: Pending,
    kernel_ns: u64,
    malloc_launches: u64,
    free_launches: u64,
    checked: u64,
    verify: bool,
    verified: u64,
    /// Metadata high-water mark at the last snapshot.
    high: u64,
}

impl DeviceTarget<'_> {
    fn pattern_bytes(id: u32, len: u64) -> Vec<u8> {
        let seed = PATTERN_SEED ^ id as u64;
        let mut v: Vec<u8> = (0..len.div_ceil(4)).flat_map(|w| pattern(seed, w).to_le_bytes()).collect();
        v.truncate(len as usize);
        v
    }

    fn check_bytes(&mut self, l: &mut Ledger, id: u32, event: Option<usize>) -> Result<(), ReplayError> {
        let t = Instant::now();
        let s = self.slots[id as usize];
        let mut got = vec![0u8; s.size as usize];
        let base = self.heap.data_offset() + s.off as usize;
        self.heap.data().read_into(base, &mut got).map_err(|e| dev_err(event, e))?;
        if got != Self::pattern_bytes(id, s.size) {
            let at = got.iter().zip(Self::pattern_bytes(id, s.size)).position(|(a, b)| *a != b).unwrap_or(0);
            return Err(check_err(
                event,
                format!("block {id} at data-region offset {}: byte {at} was overwritten while it was live", s.off),
            ));
        }
        self.verified += s.size;
        l.exclude_since(t);
        Ok(())
    }

    /// Launches the pending batch; the state is then the one after `event`.
    fn flush(&mut self, l: &mut Ledger, event: Option<usize>) -> Result<(), ReplayError> {
        match std::mem::replace(&mut self.pending, Pending::None) {
            Pending::None => Ok(()),
            Pending::Alloc(reqs) => self.flush_alloc(l, event, reqs),
            Pending::Free(ids) => self.flush_free(l, event, ids),
        }
    }

    fn flush_alloc(&mut self, l: &mut Ledger, event: Option<usize>, reqs: Vec<Req>) -> Result<(), ReplayError> {
        let first = reqs.first().and_then(|r| r.event);
        let sizes: Vec<u64> = reqs.iter().map(|r| r.size).collect();
        let batch = ops::malloc_batch(&self.heap, &Sizes::PerThread(sizes), reqs.len() as u64, false)
            .map_err(|e| dev_err(first, e))?;
        self.kernel_ns += batch.timing().elapsed.as_nanos() as u64;
        self.malloc_launches += 1;
        let ptrs = batch.read_ptrs().map_err(|e| dev_err(first, e))?;
        let (base, cap) = (self.heap.base(), self.heap.capacity());
        let mut failed = Vec::new();
        for (r, &ptr) in reqs.iter().zip(&ptrs) {
            if ptr == 0 {
                self.slots[r.id as usize].state = FAILED;
                failed.push(r);
                continue;
            }
            let block = block_of(r.size);
            let off = ptr.wrapping_sub(base);
            let bad = |m: String| check_err(r.event, format!("malloc({}) returned {ptr:#x}: {m}", r.size));
            if ptr < base || off.checked_add(block).is_none_or(|e| e > cap) {
                return Err(bad(format!("its {block}-byte block is not inside the data region [{base:#x}, +{cap})")));
            }
            let align = if class_of(r.size).is_some() { 16 } else { block };
            if off % align != 0 {
                return Err(bad(format!("offset {off} is not aligned to {align} bytes")));
            }
            let end = off + block;
            if let Some((&ps, &pe)) = self.extents.range(..=off).next_back() {
                if pe > off {
                    return Err(bad(format!("[{off}, {end}) overlaps the live block [{ps}, {pe})")));
                }
            }
            if let Some((&ns, &ne)) = self.extents.range(off..).next() {
                if ns < end {
                    return Err(bad(format!("[{off}, {end}) overlaps the live block [{ns}, {ne})")));
                }
            }
            self.extents.insert(off, end);
            *self.ends.entry(unit_end(off, block)).or_insert(0) += 1;
            self.slots[r.id as usize] = Slot { off, block, size: r.size, requested: r.requested, state: LIVE };
            l.allocated += r.requested;
            self.in_use += block;
            self.checked += 1;
            if self.verify {
                let t = Instant::now();
                let bytes = Self::pattern_bytes(r.id, r.size);
                let at = self.heap.data_offset() + off as usize;
                self.heap.write_data(at, &bytes).map_err(|e| dev_err(r.event, e))?;
                l.exclude_since(t);
            }
        }
        if !failed.is_empty() {
            let t = Instant::now();
            let free = self.heap.free_blocks().map_err(|e| dev_err(first, e))?;
            // The capacity a failure is judged against: the trace's, at the replay's scale (the heap's data
            // region is that rounded down to 4 KiB, which is the heap's own rounding).
            let capacity = self.capacity.bytes.div_ceil(self.scale);
            for r in failed {
                let d = self.heap.diagnose_failure(r.size, &free);
                // `Fits` (a free block would hold it, yet `malloc` returned null) counts as fragmentation; a
                // capacity failure while the heap holds the live requests and this one byte for byte is
                // the heap's rounding (slab classes, pages, buddy blocks).
                l.failed.push(FailedRequest {
                    event: r.event,
                    size: r.requested,
                    class: FailureClass::of_request(d.class, r.requested, l.allocated, capacity),
                    free: d.free,
                    largest_free: d.largest_free,
                });
            }
            l.exclude_since(t);
        }
        let f = self.footprint();
        l.observe(event, f);
        Ok(())
    }

    fn flush_free(&mut self, l: &mut Ledger, event: Option<usize>, ids: Vec<u32>) -> Result<(), ReplayError> {
        let mut ptrs = Vec::with_capacity(ids.len());
        for id in ids {
            let s = self.slots[id as usize];
            if s.state != LIVE {
                continue;
            }
            if self.verify {
                self.check_bytes(l, id, event)?;
            }
            self.slots[id as usize].state = FREED;
            self.extents.remove(&s.off);
            let e = unit_end(s.off, s.block);
            if let Some(c) = self.ends.get_mut(&e) {
                *c -= 1;
                if *c == 0 {
                    self.ends.remove(&e);
                }
            }
            l.allocated -= s.requested;
            self.in_use -= s.block;
            ptrs.push(self.heap.base() + s.off);
        }
        if !ptrs.is_empty() {
            // SAFETY: every pointer was returned by `malloc` on this heap and is live (state LIVE, set to
            // FREED above), so each is freed exactly once.
            let t = unsafe { ops::free_ptrs(&self.heap, &ptrs) }.map_err(|e| dev_err(event, e))?;
            self.kernel_ns += t.elapsed.as_nanos() as u64;
            self.free_launches += 1;
        }
        let f = self.footprint();
        l.observe(event, f);
        Ok(())
    }

    fn request(&self, r: Request) -> Req {
        Req {
            event: r.event,
            id: r.id,
            size: round_request(r.requested, self.align).div_ceil(self.scale).max(1),
            requested: r.requested.div_ceil(self.scale),
        }
    }
}

impl ReplayTarget for DeviceTarget<'_> {
    fn alloc(&mut self, l: &mut Ledger, r: Request) -> Result<(), ReplayError> {
        if matches!(self.pending, Pending::Free(_)) {
            // The state after the previous event.
            self.flush(l, r.event.and_then(|i| i.checked_sub(1)))?;
        }
        let q = self.request(r);
        match &mut self.pending {
            Pending::Alloc(v) => v.push(q),
            _ => self.pending = Pending::Alloc(vec![q]),
        }
        Ok(())
    }

    fn free(&mut self, l: &mut Ledger, event: usize, id: u32) -> Result<(), ReplayError> {
        if matches!(self.pending, Pending::Alloc(_)) {
            self.flush(l, event.checked_sub(1))?;
        }
        match &mut self.pending {
            Pending::Free(v) => v.push(id),
            _ => self.pending = Pending::Free(vec![id]),
        }
        Ok(())
    }

    fn sync(&mut self, l: &mut Ledger, event: Option<usize>) -> Result<(), ReplayError> {
        self.flush(l, event)
    }

    /// [`analysis::footprint`] with slab pages and large blocks as units, all placed bottom-up.
    fn footprint(&mut self) -> u64 {
        let cap = self.heap.capacity();
        analysis::footprint(self.ends.last_key_value().map_or(0, |(&e, _)| e), cap, cap)
    }

    /// External fragmentation of the buddy levels now (a metadata read-back, excluded from the time).
    fn external(&mut self, l: &mut Ledger, event: Option<usize>) -> Result<f64, ReplayError> {
        let t = Instant::now();
        let free = self.heap.free_blocks().map_err(|e| dev_err(event, e))?;
        l.exclude_since(t);
        Ok(external_ratio(free.iter().map(|b| b.1).sum(), free.iter().map(|b| b.1).max().unwrap_or(0)))
    }

    /// Metrics now, from the metadata (and the consistency check of the host's view against it).
    fn snapshot(&mut self, l: &mut Ledger, event: Option<usize>) -> Result<Fragmentation, ReplayError> {
        let err = |e: BackendError| dev_err(event, e);
        let stats = self.heap.stats().map_err(err)?;
        let free = self.heap.free_blocks().map_err(err)?;
        let live = self.heap.live_blocks().map_err(err)?;
        let pages = self.heap.slab_pages().map_err(err)?;
        // The host's large blocks and slots against the metadata.
        let mut host_large: Vec<(u64, u64)> = Vec::new();
        for (&off, &end) in &self.extents {
            let block = end - off;
            if class_of(block).is_none() {
                host_large.push((off, block));
            } else {
                let page = off / PAGE * PAGE;
                let k = pages.partition_point(|p| p.0 < page);
                if pages.get(k) != Some(&(page, block)) {
                    return Err(check_err(
                        event,
                        format!("the live {block}-byte slot at offset {off} is not in a slab page of its class"),
                    ));
                }
            }
        }
        let meta_large: Vec<(u64, u64)> = live.iter().map(|b| (b.offset, b.size)).collect();
        if meta_large != host_large {
            return Err(check_err(
                event,
                format!(
                    "the heap's metadata lists {} live large blocks, the replay holds {}",
                    meta_large.len(),
                    host_large.len()
                ),
            ));
        }
        if stats.bytes_in_use() != self.in_use {
            return Err(check_err(
                event,
                format!(
                    "the heap counts {} bytes in use, the replay's blocks add up to {}",
                    stats.bytes_in_use(),
                    self.in_use
                ),
            ));
        }
        let footprint = self.footprint();
        self.high = live.last().map_or(0, |b| b.offset + b.size).max(pages.last().map_or(0, |p| p.0 + PAGE));
        Ok(Fragmentation::of_free(free.iter().map(|b| b.1)).with_live(l.allocated, self.in_use, footprint).at(event))
    }

    fn before_end(&mut self, l: &mut Ledger, last: Option<usize>) -> Result<(), ReplayError> {
        if self.verify {
            let live: Vec<u32> =
                self.slots.iter().enumerate().filter(|(_, s)| s.state == LIVE).map(|(id, _)| id as u32).collect();
            for id in live {
                self.check_bytes(l, id, last)?;
            }
        }
        Ok(())
    }

    fn finish(
        &mut self,
        _l: &mut Ledger,
        at_end: &Fragmentation,
        last: Option<usize>,
    ) -> Result<TargetSummary, ReplayError> {
        let stats = self.heap.stats().map_err(|e| dev_err(last, e))?;
        let scale = self.scale;
        let strategy = if scale == 1 { DEVICE_HEAP.to_string() } else { format!("{DEVICE_HEAP} (scaled 1/{scale})") };
        let heap_capacity = self.heap.capacity();
        let source = if scale == 1 {
            self.capacity.source.clone()
        } else {
            CapacitySource::Scaled { of: Box::new(self.capacity.clone()), by: scale }
        };
        let end = DeviceHeapEnd {
            backend: self.backend.describe(),
            scaled_by: scale,
            scale_reason: self.scale_reason.take(),
            trace_capacity: self.capacity.bytes,
            heap_capacity,
            malloc_launches: self.malloc_launches,
            free_launches: self.free_launches,
            kernel_ns: self.kernel_ns,
            checked_allocations: self.checked,
            verified_bytes: self.verify.then_some(self.verified),
            slab_pages: stats.slab_pages(),
            large_blocks: stats.large_blocks,
            free_bytes: at_end.free,
            largest_free: at_end.largest_free,
            metadata_high_water: self.high,
            heap_failed_counter: stats.failed_requests,
        };
        Ok(TargetSummary {
            strategy,
            capacity: Capacity { bytes: heap_capacity, source },
            policy: POLICY_NA.to_string(),
            caching_end: None,
            device_heap: Some(end),
            tiers: None,
        })
    }
}

/// The heap limit for `backend` (see [`DeviceReplayOptions::heap_limit`]).
pub fn default_heap_limit(backend: &Backend) -> u64 {
    match backend {
        Backend::Gpu(g) => g.mem_info().map_or(DEFAULT_DEVICE_HEAP_LIMIT_CPU, |(free, _)| free as u64 / 4 * 3),
        Backend::Cpu(_) => DEFAULT_DEVICE_HEAP_LIMIT_CPU,
    }
}

/// Creates the heap: the capacity divided by the smallest power of two that fits `limit`, doubled again
/// while the backend refuses the allocation. Returns the heap, the factor and why it is not 1.
fn make_heap(backend: &Backend, capacity: u64, limit: u64) -> Result<(DeviceHeap, u64, Option<String>), ReplayError> {
    let mut n = 1u64;
    let mut reason = None;
    while capacity / n > limit.max(MIN_HEAP_BYTES) {
        n *= 2;
        reason =
            Some(format!("a heap of {} is above the device-heap limit of {}", fmt_bytes(capacity), fmt_bytes(limit)));
    }
    loop {
        if capacity / n < MIN_HEAP_BYTES {
            return Err(Refusal::HeapScaledTooSmall { capacity, scale: n }.into());
        }
        match DeviceHeap::new(backend, capacity / n) {
            Ok(h) => return Ok((h, n, reason)),
            Err(e) if n < 1 << 20 && capacity / n >= 2 * MIN_HEAP_BYTES => {
                reason = Some(format!("the backend refused a heap of {}: {e}", fmt_bytes(capacity / n)));
                n *= 2;
            }
            Err(source) => {
                let bytes = capacity / n;
                return Err(ReplayError::Device { event: None, source: DeviceFailure::Create { bytes, source } });
            }
        }
    }
}

/// Replays `dev` (a device of `trace`) through a [`DeviceHeap`] on `backend` (see the
/// module docs). `progress` is called with the number of events done, every 65,536 events and at
/// the end.
///
/// # Errors
/// [`ReplayError::Config`] for a capacity below [`MIN_HEAP_BYTES`] (after scaling) or a bad alignment;
/// [`ReplayError::Device`] when the heap cannot be created at any scale, a launch or read-back fails, or a
/// check of the returned blocks fails.
pub fn replay_device(
    trace: &Trace,
    dev: &DeviceTrace,
    backend: &Backend,
    opts: &DeviceReplayOptions,
    progress: &mut dyn FnMut(usize),
) -> Result<ReplayReport, ReplayError> {
    let (capacity, demand_peak_event) = choose_capacity_and_demand_peak(trace, dev, opts.capacity)?;
    if capacity.bytes < MIN_HEAP_BYTES {
        return Err(Refusal::HeapTooSmall(capacity.bytes).into());
    }
    let align = choose_alignment(trace, opts.align).map_err(Refusal::Alignment)?;
    let limit = opts.heap_limit.unwrap_or_else(|| default_heap_limit(backend));
    let (heap, scale, scale_reason) = make_heap(backend, capacity.bytes, limit)?;
    let mut target = DeviceTarget {
        backend,
        heap,
        align,
        scale,
        scale_reason,
        capacity,
        slots: vec![Slot::default(); dev.block_ids as usize],
        extents: BTreeMap::new(),
        ends: BTreeMap::new(),
        in_use: 0,
        pending: Pending::None,
        kernel_ns: 0,
        malloc_launches: 0,
        free_launches: 0,
        checked: 0,
        verify: opts.verify_bytes,
        verified: 0,
        high: 0,
    };
    let setup = Setup {
        trace,
        dev,
        align,
        align_source: super::options::alignment_source(trace, opts.align),
        timeline_points: opts.timeline_points,
        pytorch_comparable: scale == 1,
        demand_peak_event,
    };
    engine::run(&mut target, &setup, progress)
}
