//! `gpuheap bench compact`: compaction throughput against a plain copy of the
//! same bytes, on the same backend, in the same run.
//!
//! For each synthetic layout the benchmark builds a region, then alternates
//! `reps` times: one compaction (the two plan launches and the move launch of
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

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::backend::Backend;
use crate::compaction::{reference, CompactTuning, CompactionError, Compactor, LiveBlock, GRANULE};

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

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
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

/// The synthetic layouts: about 256 MiB each (32 MiB with `quick`).
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
    let mut r = Rng(42);
    let mut v = Vec::new();
    {
        let mut a = Rng(1);
        let mut b = Rng(2);
        v.push(build(
            "uniform",
            target,
            || a.range(16, 64 << 10),
            || if b.next().is_multiple_of(2) { b.range(16, 64 << 10) } else { 0 },
        ));
    }
    {
        let mut a = Rng(3);
        let mut b = Rng(4);
        let pareto = move |r: &mut Rng| ((256.0 * (1.0 - r.unit()).powf(-1.0 / 1.2)) as u64).min(16 << 20);
        let mut b2 = Rng(5);
        v.push(build(
            "power-law",
            target,
            || pareto(&mut a),
            || if b.next().is_multiple_of(3) { pareto(&mut b2) } else { 0 },
        ));
    }
    {
        let tiny_target = if quick { 5 << 20 } else { 40 << 20 };
        let mut a = Rng(6);
        v.push(build(
            "tiny",
            tiny_target,
            || a.range(16, 64),
            || if r.next().is_multiple_of(3) { r.range(16, 64) } else { 0 },
        ));
    }
    {
        let (lo, hi) = if quick { (2 << 20, 4 << 20) } else { (16 << 20, 32 << 20) };
        let mut a = Rng(7);
        let mut b = Rng(8);
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

/// One row of the benchmark.
#[derive(Clone, Debug, Serialize)]
pub struct CompactBenchRow {
    /// Layout name.
    pub layout: String,
    /// Live blocks.
    pub blocks: u64,
    /// Live bytes.
    pub live_bytes: u64,
    /// Bytes moved by the compaction (`M`).
    pub bytes_moved: u64,
    /// Median kernel time of the plan (two launches), ms.
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
pub struct CompactBenchReport {
    /// The backend, in words.
    pub backend: String,
    /// The tuning used.
    pub tile_bytes: u32,
    /// Threads per block.
    pub block_threads: u32,
    /// Blocks in the grid.
    pub grid: u32,
    /// Repetitions per layout (medians reported).
    pub reps: usize,
    /// Rows, one per layout.
    pub rows: Vec<CompactBenchRow>,
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
    let moved = reference::slide_plan(&layout.blocks)?.bytes_moved;
    let live: u64 = layout.blocks.iter().map(|b| b.size).sum();
    // Touch every page first (the CPU backend's buffers are lazily zeroed).
    let fill: Vec<u8> = (0..layout.capacity).map(|i| i as u8).collect();
    let mut region = backend.upload(&fill)?;
    drop(fill);
    let src = backend.upload(&vec![1u8; moved.max(16) as usize])?;
    let mut dst = backend.upload(&vec![2u8; moved.max(16) as usize])?;
    let mut host = vec![3u8; 2 * moved.max(16) as usize];
    let (mut plans, mut moves, mut totals, mut copies, mut memmoves) = (vec![], vec![], vec![], vec![], vec![]);
    for _ in 0..reps.max(1) {
        let r = compactor.compact(backend, &mut region, &layout.blocks, None)?;
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
        layout: layout.name.to_string(),
        blocks: layout.blocks.len() as u64,
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

/// Runs every layout of [`layouts`] on `backend` (`reps` repetitions each;
/// 0 picks 3 with `quick`, else 7), with `tile_bytes` overriding the
/// backend's default tile size when given.
///
/// # Errors
/// Backend and compaction errors.
pub fn run(
    backend: &Backend,
    quick: bool,
    reps: usize,
    tile_bytes: Option<u32>,
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
    let rows =
        layouts(quick).iter().map(|l| measure(backend, &mut compactor, l, reps)).collect::<Result<Vec<_>, _>>()?;
    Ok(CompactBenchReport {
        backend: backend.describe(),
        tile_bytes: tuning.tile_bytes,
        block_threads: tuning.block_threads,
        grid: tuning.grid,
        reps,
        rows,
    })
}

/// The report as a Markdown table.
pub fn table(r: &CompactBenchReport) -> String {
    let mut s = format!(
        "backend: {}\ntile {} B, {} threads x {} blocks, median of {} runs\n\n",
        r.backend, r.tile_bytes, r.block_threads, r.grid, r.reps
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
    s
}
