//! Measuring a compaction with the real kernel: the live layout a strategy has when the policy fires is
//! materialised on a backend, filled with a pattern, compacted by [`Compactor`] and checked.
//!
//! # What is materialised
//!
//! Only what moves: in each region (a strategy's range or a caching segment) the span from the first
//! moving unit's destination to the end of the last moving unit. The spans are laid end to end in one
//! device buffer, each followed by a pinned 16-byte separator, so that the kernel (which slides every
//! unpinned block to the start of its run, a run ending at a pinned block) slides each span to its own
//! start, exactly as the reference slide does in the strategy's region. Units before the first hole of a
//! region do not move and are not copied by either.
//!
//! When that image is larger than the limit (1 GiB by default on the CPU), a **scaled image** is compacted
//! instead: every unit and every gap is divided by a power-of-two factor and rounded up to 16 bytes (the
//! kernel's granule; a non-empty gap stays non-empty). The measurement then says `scaled_by` = the factor,
//! and its bytes, time and GB/s are those of the scaled image: nothing is extrapolated.
//!
//! # What is checked
//!
//! * the kernel's new offsets equal [`compaction::oracle::plan`] of the image (the kernel's reference),
//!   and, at full size, map back exactly onto the destinations of the strategy's reference plan
//!   ([`crate::reference::compact::plan_slide`]);
//! * every unit's bytes at its new place equal the pattern written at its old place.
//!
//! A layout the kernel cannot reproduce is not measured, with the reason: a region that slides toward
//! its end (expandable small pool), or a plan with alignment gaps (buddy blocks are aligned to their
//! size; the kernel packs at 16 bytes).

use std::time::Instant;

use gpuheap_kernels::compact::{LiveBlock, BLOCK_PINNED, GRANULE, NO_HANDLE};
use gpuheap_kernels::fill::pattern;
use serde::Serialize;

use crate::backend::Backend;
use crate::compaction::{self, CompactTuning, CompactionError, Compactor};
use crate::ops;
use crate::reference::compact::{CompactionLayout, CompactionPlan};

/// A kernel measurement (bytes, ns, GB/s = 10^9 bytes/s).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[doc(hidden)]
pub struct Measured {
    /// The backend, described.
    pub backend: String,
    /// 1: the full-size layout; otherwise the factor every unit and gap was divided by.
    pub scaled_by: u64,
    /// Bytes of the materialised image.
    pub image_bytes: u64,
    /// Bytes the kernel moved (of the image).
    pub bytes_moved: u64,
    /// Blocks the kernel moved.
    pub blocks_moved: u64,
    /// Kernel time of the plan launches, ns.
    pub plan_ns: u64,
    /// Kernel time of the move launch, ns.
    pub move_ns: u64,
    /// `plan_ns + move_ns`.
    pub kernel_ns: u64,
    /// Host wall time of the compaction call (uploads, launches, read-back), ns.
    pub wall_ns: u64,
    /// `bytes_moved / kernel time`, GB/s.
    pub gbps: f64,
    /// The new layout equals the reference plan (always true in a report: a mismatch is an error).
    pub layout_checked: bool,
    /// Every moved byte was checked against the pattern (always true in a report).
    pub bytes_checked: bool,
}

/// A measurement, or why there is none.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
#[doc(hidden)]
pub enum MeasureOutcome {
    /// Measured with the kernel.
    Measured(Measured),
    /// Not measured.
    NotMeasured {
        /// Why.
        reason: String,
    },
}

impl MeasureOutcome {
    /// The measurement, if any.
    pub fn measured(&self) -> Option<&Measured> {
        match self {
            MeasureOutcome::Measured(m) => Some(m),
            MeasureOutcome::NotMeasured { .. } => None,
        }
    }
}

/// One region's cropped span: the units (old offset, length, planned destination) that lie in it.
struct Span {
    crop_start: u64,
    units: Vec<(u64, u64, u64)>,
}

fn up16(x: u64) -> u64 {
    x.div_ceil(GRANULE) * GRANULE
}

/// Image layout of `spans` scaled down by `f` (1 = full size): the kernel blocks (separators pinned)
/// and, per unit, its index into the block list.
fn image(spans: &[Span], f: u64) -> (Vec<LiveBlock>, u64) {
    let mut blocks = Vec::new();
    let mut cursor = 0u64;
    for s in spans {
        let mut prev_end = s.crop_start;
        for &(src, len, _) in &s.units {
            let gap = src - prev_end;
            cursor += if f == 1 {
                gap
            } else if gap > 0 {
                up16(gap / f).max(GRANULE)
            } else {
                0
            };
            let l = if f == 1 { len } else { up16(len / f).max(GRANULE) };
            blocks.push(LiveBlock { offset: cursor, size: l, handle: NO_HANDLE, flags: 0 });
            cursor += l;
            prev_end = src + len;
        }
        blocks.push(LiveBlock { offset: cursor, size: GRANULE, handle: NO_HANDLE, flags: BLOCK_PINNED });
        cursor += GRANULE;
    }
    (blocks, cursor)
}

/// Measures the compaction `plan` of `layout` with the real kernel on `backend`, materialising at most
/// `limit` bytes (see the [module docs](self)); `seed` seeds the fill pattern.
///
/// # Errors
/// Backend and kernel errors, and a failed check (wrong layout or bytes): run-time failures.
pub fn measure(
    backend: &Backend,
    layout: &CompactionLayout,
    plan: &CompactionPlan,
    limit: u64,
    seed: u64,
) -> Result<MeasureOutcome, CompactionError> {
    let not = |r: &str| Ok(MeasureOutcome::NotMeasured { reason: r.to_string() });
    let mut regions = layout.regions.clone();
    regions.sort_by_key(|r| r.start);
    let mut spans: Vec<Span> = Vec::new();
    let mut i = 0;
    let moves = &plan.moves;
    for r in &regions {
        let first = i;
        while i < moves.len() && moves[i].src < r.end {
            i += 1;
        }
        let ms = &moves[first..i];
        let Some(k) = ms.iter().position(|m| m.src != m.dst) else { continue };
        if r.toward_end {
            return not(
                "a region slides toward its end (expandable small pool); the kernel slides toward region starts",
            );
        }
        let l = ms.iter().rposition(|m| m.src != m.dst).expect("k exists");
        let crop_start = ms[k].dst;
        let mut cursor = crop_start;
        for m in &ms[k..=l] {
            if m.dst != cursor || m.src % GRANULE != 0 || m.len % GRANULE != 0 {
                return not(
                    "the strategy's plan keeps alignment gaps (e.g. buddy blocks aligned to their size) that the \
                     kernel's 16-byte slide does not reproduce",
                );
            }
            cursor += m.len;
        }
        spans.push(Span { crop_start, units: ms[k..=l].iter().map(|m| (m.src, m.len, m.dst)).collect() });
    }
    if spans.is_empty() {
        return not("nothing to move");
    }
    let mut f = 1u64;
    let (mut blocks, mut bytes) = image(&spans, f);
    while bytes > limit {
        if f >= 1 << 40 {
            return not("the layout has too many blocks to fit the materialisation limit even scaled");
        }
        f *= 2;
        (blocks, bytes) = image(&spans, f);
    }
    let len = usize::try_from(bytes).map_err(|_| CompactionError::InvalidLayout("image too large".into()))?;
    let mut region = backend.alloc_zeroed(len)?;
    ops::fill(backend, &mut region, seed)?;
    let mut compactor = Compactor::new(CompactTuning::for_backend(backend));
    let t = Instant::now();
    let run = compactor.compact(backend, &mut region, &blocks, None)?;
    let wall_ns = t.elapsed().as_nanos() as u64;

    // Layout check: the kernel's reference, and at full size the strategy's plan.
    let expected = compaction::oracle::plan(&blocks)?;
    if run.new_offsets != expected {
        let bad = run.new_offsets.iter().zip(&expected).position(|(a, b)| a != b).unwrap_or(0);
        return Err(CompactionError::InvalidLayout(format!(
            "kernel placed image block {bad} at {} but the reference plan says {}",
            run.new_offsets[bad], expected[bad]
        )));
    }
    if f == 1 {
        let mut b = 0;
        for s in &spans {
            let span_base = blocks[b].offset - (s.units[0].0 - s.crop_start);
            for &(_, _, dst) in &s.units {
                if run.new_offsets[b] - span_base + s.crop_start != dst {
                    return Err(CompactionError::InvalidLayout(format!(
                        "kernel destination of a unit differs from the strategy's plan ({dst})"
                    )));
                }
                b += 1;
            }
            b += 1; // separator
        }
    }
    // Byte check: each moved block holds the pattern of its old place.
    let mut buf: Vec<u8> = Vec::new();
    for (blk, &d) in blocks.iter().zip(&run.new_offsets) {
        if blk.pinned() || d == blk.offset {
            continue;
        }
        let mut done = 0u64;
        while done < blk.size {
            let chunk = (blk.size - done).min(64 << 20);
            buf.resize(chunk as usize, 0);
            region.read_into((d + done) as usize, &mut buf)?;
            let w0 = (blk.offset + done) / 4;
            for (j, w) in buf.chunks_exact(4).enumerate() {
                let v = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
                if v != pattern(seed, w0 + j as u64) {
                    return Err(CompactionError::InvalidLayout(format!(
                        "moved block from image offset {} to {d}: byte {} differs from the pattern",
                        blk.offset,
                        done + 4 * j as u64
                    )));
                }
            }
            done += chunk;
        }
    }
    let (bytes_moved, blocks_moved) = compaction::oracle::moved(&blocks, &run.new_offsets);
    let kernel = run.plan_time + run.move_time;
    let secs = kernel.as_secs_f64();
    Ok(MeasureOutcome::Measured(Measured {
        backend: backend.describe(),
        scaled_by: f,
        image_bytes: bytes,
        bytes_moved,
        blocks_moved,
        plan_ns: run.plan_time.as_nanos() as u64,
        move_ns: run.move_time.as_nanos() as u64,
        kernel_ns: kernel.as_nanos() as u64,
        wall_ns,
        gbps: if secs > 0.0 { bytes_moved as f64 / secs / 1e9 } else { 0.0 },
        layout_checked: true,
        bytes_checked: true,
    }))
}
