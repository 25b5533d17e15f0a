//! `gpuheap bench compact`: compaction throughput against a plain copy of the
//! same bytes, on the same backend, in the same run.
//!
//! For each synthetic layout the benchmark builds a region, then alternates
//! `reps` times: one compaction (the plan launch and the move launch of
//! [`Compactor::compact`], kernel time) and one plain copy of the same `M`
//! moved bytes between two other buffers with the copy kernel
//! ([`Compactor::copy`]: the same persistent warps, chunk size and 16-byte
//! copy loop, without staging, flags or layout). On the CPU backend it also
//! times a single-threaded `memmove` of `M` bytes. Reported times are medians.
//!
//! The compaction re-runs on the same layout each time (the region then holds
//! different bytes, which changes nothing in the work done). The layout
//! upload and the read-back of the new offsets are not in the kernel time
//! (they disappear when the device heap supplies its layout on the device).
//!
//! Target (issue 5): compaction time ≤ 1.25 × the copy time.
//!
//! # Layouts from real traces
//!
//! Besides the synthetic layouts, [`trace_layout`] takes the final state that a PyTorch memory snapshot
//! records (its `segments`): `active_allocated` blocks are live and movable, `inactive` blocks are holes,
//! `active_pending_free` blocks (still used by another stream) are live and **pinned**. The segments are
//! laid end to end in address order and compacted two ways, one row each ([`TraceMode`]):
//!
//! * **per segment**: segments are separate `cudaMalloc` ranges, so each is followed by a pinned 16-byte
//!   separator and one compaction (one plan, one move launch) slides every segment's blocks to that
//!   segment's start, as a caching allocator that defragments its own segments in place would; nothing
//!   crosses a segment boundary. When a snapshot's holes are the tails of its segments (PyTorch splits
//!   blocks from a segment's start), this moves little: the fragmentation is *between* segments;
//! * **one region**: the segments as one contiguous range (what expandable segments or a heap that maps
//!   its pages into one virtual range see): every live block slides toward the start of the whole range,
//!   which frees the segments' tails as one extent.
//!
//! When the layout is larger than
//! the limit ([`trace_limit`]: 512 MiB on the CPU, 64 MiB with `quick`; 4 GiB / 1 GiB on a GPU), every
//! block and hole is divided by the smallest power of two that makes it fit, rounded up to 16 bytes (a
//! non-empty hole stays non-empty); the row's name says `scaled 1/N` and all its figures are the scaled
//! layout's. The copy it is compared with is a plain copy of the same number of bytes, in the same run.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::SplitMix64;
use gpuheap::backend::Backend;
use gpuheap::compaction::{oracle, CompactTuning, CompactionError, Compactor, LiveBlock, BLOCK_PINNED, GRANULE};
use gpuheap::trace::{read_trace, BlockStatus};
use gpuheap_kernels::compact::NO_HANDLE;

/// One synthetic layout.
#[derive(Clone, Debug)]
pub struct SyntheticLayout {
    /// Name (`uniform`, `power-law`, `tiny`, `huge`, `hole-at-start`).
    pub name: &'static str,
    /// Region size, bytes.
    pub capacity: u64,
    /// Live blocks in address order.
    pub blocks: Vec<LiveBlock>,
}

fn granules(bytes: u64) -> u64 {
    bytes.div_ceil(GRANULE).max(1) * GRANULE
}

/// Builds a layout of about `target` bytes: blocks of `size()` bytes, each
/// preceded by a hole of `hole()` bytes (0 for none).
fn build(
    name: &'static str,
    target: u64,
    mut size: impl FnMut() -> u64,
    mut hole: impl FnMut() -> u64,
) -> SyntheticLayout {
    let mut blocks = Vec::new();
    let mut off = 0;
    while off < target {
        off += hole() / GRANULE * GRANULE;
        let s = granules(size());
        blocks.push(LiveBlock { offset: off, size: s, handle: blocks.len() as u32, flags: 0 });
        off += s;
    }
    SyntheticLayout { name, capacity: off, blocks }
}

/// The names of [`layouts`], in order.
pub const LAYOUT_NAMES: [&str; 5] = ["uniform", "power-law", "tiny", "huge", "hole-at-start"];

/// The synthetic layouts: about 256 MiB each (32 MiB with `quick`), named as [`LAYOUT_NAMES`].
///
/// * `uniform`: sizes uniform in 16 B–64 KiB, a hole (uniform, same range)
///   before half the blocks;
/// * `power-law`: Pareto sizes (α = 1.2, from 256 B, capped at 16 MiB),
///   holes likewise before a third of the blocks;
/// * `tiny`: 16–64 B blocks (2^20 of them at full size), a 16–64 B hole
///   before a third;
/// * `huge`: 16–32 MiB blocks (2–4 MiB with `quick`) with 1–4 MiB holes;
/// * `hole-at-start`: one 512 B hole, then 1 MiB blocks (the longest
///   dependency chain, hazard F4).
pub fn layouts(quick: bool) -> Vec<SyntheticLayout> {
    let target: u64 = if quick { 32 << 20 } else { 256 << 20 };
    let mut r = SplitMix64::new(42);
    let mut v = Vec::new();
    {
        let mut a = SplitMix64::new(1);
        let mut b = SplitMix64::new(2);
        v.push(build(
            "uniform",
            target,
            || a.range(16, 64 << 10),
            || if b.next_u64().is_multiple_of(2) { b.range(16, 64 << 10) } else { 0 },
        ));
    }
    {
        let mut a = SplitMix64::new(3);
        let mut b = SplitMix64::new(4);
        let pareto = move |r: &mut SplitMix64| ((256.0 * (1.0 - r.unit()).powf(-1.0 / 1.2)) as u64).min(16 << 20);
        let mut b2 = SplitMix64::new(5);
        v.push(build(
            "power-law",
            target,
            || pareto(&mut a),
            || if b.next_u64().is_multiple_of(3) { pareto(&mut b2) } else { 0 },
        ));
    }
    {
        let tiny_target = if quick { 5 << 20 } else { 40 << 20 };
        let mut a = SplitMix64::new(6);
        v.push(build(
            "tiny",
            tiny_target,
            || a.range(16, 64),
            || if r.next_u64().is_multiple_of(3) { r.range(16, 64) } else { 0 },
        ));
    }
    {
        let (lo, hi) = if quick { (2 << 20, 4 << 20) } else { (16 << 20, 32 << 20) };
        let mut a = SplitMix64::new(7);
        let mut b = SplitMix64::new(8);
        v.push(build("huge", target, || a.range(lo, hi), || b.range(1 << 20, 4 << 20)));
    }
    {
        let mut first = true;
        v.push(build(
            "hole-at-start",
            target,
            || 1 << 20,
            || {
                let h = if first { 512 } else { 0 };
                first = false;
                h
            },
        ));
    }
    v
}

/// How a trace layout is compacted (see the [module docs](self)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceMode {
    /// Each segment alone (a pinned separator after each).
    PerSegment,
    /// All segments as one region.
    OneRegion,
}

/// A layout taken from a trace's final snapshot state (see the [module docs](self)).
#[derive(Clone, Debug)]
pub struct TraceLayout {
    /// Row name: the file name, the segment count and the scale (`1.3b_snapshot.pickle (257 segments,
    /// scaled 1/128)`).
    pub name: String,
    /// The trace file.
    pub source: PathBuf,
    /// Segments.
    pub segments: usize,
    /// How it is compacted.
    pub mode: TraceMode,
    /// Pinned 16-byte separators added (one per segment in [`TraceMode::PerSegment`], else none).
    pub separators: usize,
    /// Live blocks that are pinned (`active_pending_free`), separators excluded.
    pub pinned: usize,
    /// 1: full size; otherwise the factor every block and hole was divided by.
    pub scaled_by: u64,
    /// Bytes of the segments at full size (PyTorch's reserved bytes).
    pub full_bytes: u64,
    /// Bytes of the layout (region size), separators included.
    pub capacity: u64,
    /// Live blocks (separators included, pinned) in address order.
    pub blocks: Vec<LiveBlock>,
}

/// The largest trace layout materialised on `backend` before it is scaled (bytes): 512 MiB on the CPU
/// (64 MiB with `quick`), 4 GiB on a GPU (1 GiB with `quick`).
pub fn trace_limit(backend: &Backend, quick: bool) -> u64 {
    match (backend.is_gpu(), quick) {
        (false, true) => 64 << 20,
        (false, false) => 512 << 20,
        (true, true) => 1 << 30,
        (true, false) => 4 << 30,
    }
}

/// The traces [`run`] takes layouts from by default: `data/1.3b_snapshot.pickle` (shipped with the
/// project) and `../shared/traces/memory_ctx512_fullstep_.pickle` when it exists, each looked up from the
/// current folder, then from the workspace the binary was built in. The shipped one is always listed (a
/// missing file becomes a note in the report).
pub fn default_traces() -> Vec<PathBuf> {
    let ws = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let find = |rel: &str| [PathBuf::from(rel), ws.join(rel)].into_iter().find(|p| p.exists());
    let mut v = vec![find("data/1.3b_snapshot.pickle").unwrap_or_else(|| PathBuf::from("data/1.3b_snapshot.pickle"))];
    v.extend(find("../shared/traces/memory_ctx512_fullstep_.pickle"));
    v
}

/// Why [`trace_layout`] has no layout for a file. `Display` is one line naming it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceLayoutError {
    /// The file cannot be read as a trace.
    #[error(transparent)]
    Trace(#[from] gpuheap::trace::TraceError),
    /// It records no segments.
    #[error("{}: no snapshot segments (not a PyTorch snapshot with a final state)", .0.display())]
    NoSegments(PathBuf),
}

/// The layout of the final state recorded in the PyTorch snapshot at `path` (every device's segments),
/// compacted as `mode` says, scaled to at most `limit` bytes (see the [module docs](self)).
///
/// # Errors
/// [`TraceLayoutError`] when the file cannot be read, is not a PyTorch snapshot with a final state, or has
/// no segments.
pub fn trace_layout(path: &Path, limit: u64, mode: TraceMode) -> Result<TraceLayout, TraceLayoutError> {
    let trace = read_trace(path)?;
    let mut segs: Vec<_> =
        trace.devices.iter().filter_map(|d| d.final_state.as_ref()).flat_map(|f| &f.segments).collect();
    if segs.is_empty() {
        return Err(TraceLayoutError::NoSegments(path.to_path_buf()));
    }
    segs.sort_by_key(|s| s.addr);
    let full_bytes: u64 = segs.iter().map(|s| s.size).sum();
    let pinned = segs.iter().flat_map(|s| &s.blocks).filter(|b| b.state == BlockStatus::ActivePendingFree).count();
    let build = |f: u64| -> (Vec<LiveBlock>, u64) {
        let scale = |x: u64| {
            if f == 1 {
                x
            } else if x == 0 {
                0
            } else {
                granules(x / f)
            }
        };
        let mut blocks = Vec::new();
        let mut cursor = 0u64;
        for s in &segs {
            let mut at = s.addr;
            for b in &s.blocks {
                // Gaps between recorded blocks (none in a well-formed file) and inactive blocks are holes.
                cursor += scale(b.addr.saturating_sub(at));
                let len = scale(b.size);
                if b.state != BlockStatus::Inactive && len > 0 {
                    let flags = if b.state == BlockStatus::ActivePendingFree { BLOCK_PINNED } else { 0 };
                    blocks.push(LiveBlock { offset: cursor, size: len, handle: blocks.len() as u32, flags });
                }
                cursor += len;
                at = b.addr.saturating_add(b.size).max(at);
            }
            cursor += scale((s.addr + s.size).saturating_sub(at));
            if mode == TraceMode::PerSegment {
                blocks.push(LiveBlock { offset: cursor, size: GRANULE, handle: NO_HANDLE, flags: BLOCK_PINNED });
                cursor += GRANULE;
            }
        }
        (blocks, cursor)
    };
    let mut f = 1u64;
    let (mut blocks, mut bytes) = build(f);
    while bytes > limit && f < 1 << 40 {
        f *= 2;
        (blocks, bytes) = build(f);
    }
    let file = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    let scale = if f == 1 { "full size".to_string() } else { format!("scaled 1/{f}") };
    let how = match mode {
        TraceMode::PerSegment => "per segment",
        TraceMode::OneRegion => "as one region",
    };
    Ok(TraceLayout {
        name: format!("{file}: {} segments {how}, {scale}", segs.len()),
        source: path.to_path_buf(),
        segments: segs.len(),
        mode,
        separators: if mode == TraceMode::PerSegment { segs.len() } else { 0 },
        pinned,
        scaled_by: f,
        full_bytes,
        capacity: bytes,
        blocks,
    })
}

/// One row of the benchmark.
#[derive(Clone, Debug, Serialize)]
pub struct CompactBenchRow {
    /// Layout name (trace layouts: file, segments and scale).
    pub layout: String,
    /// 1 for synthetic and full-size trace layouts; otherwise the factor a trace layout was divided by.
    pub scaled_by: u64,
    /// Live blocks.
    pub blocks: u64,
    /// Live bytes.
    pub live_bytes: u64,
    /// Bytes moved by the compaction (`M`).
    pub bytes_moved: u64,
    /// Median kernel time of the plan launch, ms.
    pub plan_ms: f64,
    /// Median kernel time of the move launch, ms.
    pub move_ms: f64,
    /// Median compaction kernel time (plan + move), ms.
    pub compact_ms: f64,
    /// `bytes_moved / compact time`, GB/s.
    pub compact_gbps: f64,
    /// Median time of the copy kernel over `bytes_moved` bytes, ms.
    pub copy_ms: f64,
    /// `bytes_moved / copy time`, GB/s.
    pub copy_gbps: f64,
    /// `compact_ms / copy_ms` (target ≤ 1.25).
    pub ratio: f64,
    /// Median single-threaded host `memmove` of `bytes_moved` bytes, ms (CPU
    /// backend only).
    pub memmove_ms: Option<f64>,
}

/// The whole run.
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct CompactBenchReport {
    /// The backend, in words.
    pub backend: String,
    /// The tuning used.
    pub tile_bytes: u32,
    /// Threads per block.
    pub block_threads: u32,
    /// Blocks in the grid of the move and copy kernels.
    pub grid: u32,
    /// Blocks in the grid of the plan kernel.
    pub plan_grid: u32,
    /// Repetitions per layout (medians reported).
    pub reps: usize,
    /// Rows, one per layout: the synthetic ones, then those from traces.
    pub rows: Vec<CompactBenchRow>,
    /// Traces that gave no layout, with the reason.
    pub trace_notes: Vec<String>,
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v.get(v.len() / 2).map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

fn gbps(bytes: u64, ms: f64) -> f64 {
    if ms > 0.0 {
        bytes as f64 / (ms * 1e-3) / 1e9
    } else {
        0.0
    }
}

/// Measures one layout: `reps` alternating compactions and copies.
///
/// # Errors
/// Backend and compaction errors.
pub fn measure(
    backend: &Backend,
    compactor: &mut Compactor,
    layout: &SyntheticLayout,
    reps: usize,
) -> Result<CompactBenchRow, CompactionError> {
    measure_blocks(backend, compactor, layout.name, layout.capacity, &layout.blocks, reps)
}

/// [`measure`] for a layout from a trace ([`trace_layout`]).
///
/// # Errors
/// Backend and compaction errors.
pub fn measure_trace(
    backend: &Backend,
    compactor: &mut Compactor,
    layout: &TraceLayout,
    reps: usize,
) -> Result<CompactBenchRow, CompactionError> {
    let mut row = measure_blocks(backend, compactor, &layout.name, layout.capacity, &layout.blocks, reps)?;
    row.scaled_by = layout.scaled_by;
    // Separators are not blocks of the trace.
    row.blocks -= layout.separators as u64;
    row.live_bytes -= layout.separators as u64 * GRANULE;
    Ok(row)
}

fn measure_blocks(
    backend: &Backend,
    compactor: &mut Compactor,
    name: &str,
    capacity: u64,
    blocks: &[LiveBlock],
    reps: usize,
) -> Result<CompactBenchRow, CompactionError> {
    let moved = oracle::slide_plan(blocks)?.bytes_moved;
    let live: u64 = blocks.iter().map(|b| b.size).sum();
    // Touch every page first (the CPU backend's buffers are lazily zeroed).
    let fill: Vec<u8> = (0..capacity).map(|i| i as u8).collect();
    let mut region = backend.upload(&fill)?;
    drop(fill);
    let src = backend.upload(&vec![1u8; moved.max(16) as usize])?;
    let mut dst = backend.upload(&vec![2u8; moved.max(16) as usize])?;
    let mut host = vec![3u8; 2 * moved.max(16) as usize];
    let (mut plans, mut moves, mut totals, mut copies, mut memmoves) = (vec![], vec![], vec![], vec![], vec![]);
    for _ in 0..reps.max(1) {
        let r = compactor.compact(backend, &mut region, blocks, None)?;
        plans.push(r.plan_time);
        moves.push(r.move_time);
        totals.push(r.plan_time + r.move_time);
        copies.push(compactor.copy(backend, &mut dst, &src, moved)?.elapsed);
        if !backend.is_gpu() {
            let t = Instant::now();
            host.copy_within(..moved as usize, moved as usize);
            memmoves.push(t.elapsed());
            std::hint::black_box(&mut host);
        }
    }
    let compact_ms = median(totals);
    let copy_ms = median(copies);
    Ok(CompactBenchRow {
        layout: name.to_string(),
        scaled_by: 1,
        blocks: blocks.len() as u64,
        live_bytes: live,
        bytes_moved: moved,
        plan_ms: median(plans),
        move_ms: median(moves),
        compact_ms,
        compact_gbps: gbps(moved, compact_ms),
        copy_ms,
        copy_gbps: gbps(moved, copy_ms),
        ratio: if copy_ms > 0.0 { compact_ms / copy_ms } else { 0.0 },
        memmove_ms: (!memmoves.is_empty()).then(|| median(memmoves)),
    })
}

/// Runs every layout of [`layouts`] (those named in `only`, when it is not empty), then the two layouts of each trace in `traces` ([`trace_layout`]
/// per segment and as one region, limited by [`trace_limit`]), on `backend` (`reps` repetitions each; 0 picks 3 with `quick`, else 7),
/// with `tile_bytes` overriding the backend's default tile size when given. A trace that cannot be read
/// or has no segments is a note in the report, not an error.
///
/// # Errors
/// Backend and compaction errors.
pub fn run(
    backend: &Backend,
    quick: bool,
    reps: usize,
    tile_bytes: Option<u32>,
    only: &[String],
    traces: &[PathBuf],
) -> Result<CompactBenchReport, CompactionError> {
    let mut tuning = CompactTuning::for_backend(backend);
    if let Some(t) = tile_bytes {
        tuning.tile_bytes = t;
    }
    let mut compactor = Compactor::new(tuning);
    let reps = if reps == 0 {
        if quick {
            3
        } else {
            7
        }
    } else {
        reps
    };
    let mut rows = layouts(quick)
        .iter()
        .filter(|l| only.is_empty() || only.iter().any(|n| n == l.name))
        .map(|l| measure(backend, &mut compactor, l, reps))
        .collect::<Result<Vec<_>, _>>()?;
    let mut trace_notes = Vec::new();
    for t in traces {
        for mode in [TraceMode::PerSegment, TraceMode::OneRegion] {
            match trace_layout(t, trace_limit(backend, quick), mode) {
                Ok(l) => rows.push(measure_trace(backend, &mut compactor, &l, reps)?),
                Err(e) => {
                    trace_notes.push(e.to_string());
                    break;
                }
            }
        }
    }
    Ok(CompactBenchReport {
        backend: backend.describe(),
        tile_bytes: tuning.tile_bytes,
        block_threads: tuning.block_threads,
        grid: tuning.grid,
        plan_grid: tuning.plan_grid,
        reps,
        rows,
        trace_notes,
    })
}

/// The report as a Markdown table.
pub fn table(r: &CompactBenchReport) -> String {
    let mut s = format!(
        "backend: {}\ntile {} B, {} threads x {} blocks (plan: x {} blocks), median of {} runs\n\n",
        r.backend, r.tile_bytes, r.block_threads, r.grid, r.plan_grid, r.reps
    );
    s += "| layout | blocks | moved MiB | plan ms | move ms | compact ms | compact GB/s | copy ms | copy GB/s | compact/copy | memmove ms |\n";
    s += "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for w in &r.rows {
        s += &format!(
            "| {} | {} | {:.1} | {:.3} | {:.3} | {:.3} | {:.2} | {:.3} | {:.2} | {:.2} | {} |\n",
            w.layout,
            w.blocks,
            w.bytes_moved as f64 / (1u64 << 20) as f64,
            w.plan_ms,
            w.move_ms,
            w.compact_ms,
            w.compact_gbps,
            w.copy_ms,
            w.copy_gbps,
            w.ratio,
            w.memmove_ms.map_or("-".into(), |m| format!("{m:.3}")),
        );
    }
    if r.rows.iter().any(|w| w.layout.contains(" segments ")) {
        s += "\nRows from traces: a snapshot's final segments (active_allocated blocks movable, inactive blocks \
              holes, active_pending_free pinned), compacted per segment (a pinned separator after each) or as \
              one region; a scaled row's figures are the scaled layout's.\n";
    }
    for n in &r.trace_notes {
        s += &format!("no trace layout: {n}\n");
    }
    s
}
