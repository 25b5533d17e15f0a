//! The initial state of a heap: every unit free, in maximal buddy blocks.
//!
//! Run on the host over an [`InitImage`] (whose bytes are then
//! uploaded) and in the model-checking tests; a fresh heap and a `reset()`
//! heap are this state exactly. Everything not written here is zero: no page
//! is formatted, no tag is set, all counters are 0.
//!
//! `free_runs` is also the rebuild step after a compaction: given the unit
//! ranges that are *not* live, it recreates a valid buddy state over them.

//!
//! The host's images of a heap's metadata live here too, above the layout they fill: [`VecHeap`] (every
//! section in host vectors: the unit and model-checking tests) and [`InitImage`] (the non-zero part of a
//! fresh or rebuilt heap, uploaded by the host). `layout` knows nothing of this module.

use super::buddy;
use super::layout::*;
use crate::arch::atomic::Ordering;
#[cfg(not(target_arch = "nvptx64"))]
use crate::arch::atomic::{GlobalU32, GlobalU64};

/// Writes the control block (magic, buddy level table) and sets all of
/// `[0, units)` free. Expects zeroed metadata.
pub(crate) fn init<M: HeapMem>(m: &M) {
    write_ctrl(m);
    let units = m.geom().units;
    free_runs(m, core::iter::once((0, units)));
}

/// Writes the magic and the buddy level table (for the host's decoding;
/// device code reads the geometry from the handle) into the control block.
pub(crate) fn write_ctrl<M: HeapMem>(m: &M) {
    let g = *m.geom();
    m.word(MetaSection::Ctrl, CTRL_MAGIC as u64).store(MAGIC, Ordering::Relaxed);
    for k in 0..=g.max_order as u32 {
        m.word(MetaSection::Ctrl, CTRL_LEVELS as u64 + k as u64).store(g.level_offset(k), Ordering::Relaxed);
    }
}

/// Sets every unit range `[start, end)` free, each decomposed greedily into
/// maximal aligned power-of-two blocks. Greedy maximal blocks never leave two
/// free buddies unmerged (the left one of such a pair would have been taken
/// one order larger), so the result is a valid buddy state as long as the
/// ranges are disjoint and everything outside them is live or a slab page.
/// Expects the buddy levels to be zero over these ranges.
pub(crate) fn free_runs<M: HeapMem>(m: &M, runs: impl Iterator<Item = (u64, u64)>) {
    let g = *m.geom();
    for (start, end) in runs {
        let mut u = start;
        let end = end.min(g.units);
        while u < end {
            let mut k = g.max_order as u32;
            while k > 0 && (u % (1 << k) != 0 || u + (1 << k) > end) {
                k -= 1;
            }
            buddy::level(m, k).set(m, (u >> k) as u32);
            u += 1 << k;
        }
    }
}

/// Heap metadata in host `Vec`s: the model checkers' `HeapMem`, and the
/// host's way to build the initial metadata image ([`VecHeap::image`]).
#[cfg(not(target_arch = "nvptx64"))]
pub struct VecHeap {
    /// Geometry; `base` is an arbitrary address (the allocator never
    /// dereferences the data region), `meta` is 0.
    pub heap: Heap,
    ctrl: std::vec::Vec<GlobalU64>,
    hdr: std::vec::Vec<GlobalU64>,
    bits: std::vec::Vec<GlobalU32>,
    avail: std::vec::Vec<GlobalU32>,
    buddy: std::vec::Vec<GlobalU32>,
    current: std::vec::Vec<GlobalU32>,
    tags: std::vec::Vec<GlobalU32>,
}

#[cfg(not(target_arch = "nvptx64"))]
impl VecHeap {
    /// Initialised metadata (every unit free, see `init`) for an
    /// data region of `capacity` bytes at address `base`. `None` if `capacity` is
    /// below one unit.
    pub fn new(capacity: u64, base: u64) -> Option<Self> {
        let mut heap = Heap::layout(capacity)?;
        heap.base = base;
        let v64 = |n: u64| (0..n).map(|_| GlobalU64::new(0)).collect::<std::vec::Vec<_>>();
        let v32 = |n: u64| (0..n).map(|_| GlobalU32::new(0)).collect::<std::vec::Vec<_>>();
        let h = VecHeap {
            ctrl: v64(CTRL_WORDS),
            hdr: v64(heap.pages),
            bits: v32(heap.pages * WORDS_PER_PAGE),
            avail: v32(CLASSES as u64 * heap.avail_stride),
            buddy: v32(heap.buddy_words),
            current: v32((CLASSES * CURRENT_SLOTS * CURRENT_STRIDE) as u64),
            tags: v32(heap.units),
            heap,
        };
        init(&h);
        Some(h)
    }

    /// The metadata as the bytes of the device buffer at `meta`
    /// (`heap.meta_bytes` long), for upload.
    pub fn image(&self) -> std::vec::Vec<u8> {
        use crate::arch::atomic::Ordering::Relaxed;
        let h = &self.heap;
        let mut out = std::vec![0u8; h.meta_bytes as usize];
        let mut put64 = |off: u64, v: &[GlobalU64]| {
            for (i, w) in v.iter().enumerate() {
                let x = w.load(Relaxed);
                if x != 0 {
                    let o = off as usize + i * 8;
                    out[o..o + 8].copy_from_slice(&x.to_le_bytes());
                }
            }
        };
        put64(0, &self.ctrl);
        put64(h.hdr_off, &self.hdr);
        let mut put32 = |off: u64, v: &[GlobalU32]| {
            for (i, w) in v.iter().enumerate() {
                let x = w.load(Relaxed);
                if x != 0 {
                    let o = off as usize + i * 4;
                    out[o..o + 4].copy_from_slice(&x.to_le_bytes());
                }
            }
        };
        put32(h.current_off, &self.current);
        put32(h.tags_off, &self.tags);
        put32(h.bits_off, &self.bits);
        put32(h.avail_off, &self.avail);
        put32(h.buddy_off, &self.buddy);
        out
    }
}

// SAFETY: the vectors are sized from `heap` by `new` (indexing checks bounds),
// and `heap` is only read afterwards by the protocols.
#[cfg(not(target_arch = "nvptx64"))]
unsafe impl HeapMem for VecHeap {
    fn geom(&self) -> &Heap {
        &self.heap
    }
    fn word(&self, r: MetaSection, i: u64) -> &GlobalU64 {
        let v = match r {
            MetaSection::Ctrl => &self.ctrl,
            MetaSection::Hdr => &self.hdr,
        };
        &v[i as usize]
    }
    fn word32(&self, r: MetaSection32, i: u64) -> &GlobalU32 {
        let v = match r {
            MetaSection32::Current => &self.current,
            MetaSection32::Tags => &self.tags,
            MetaSection32::Bits => &self.bits,
            MetaSection32::Avail => &self.avail,
            MetaSection32::Buddy => &self.buddy,
        };
        &v[i as usize]
    }
}

/// The non-zero part of a fresh heap's metadata, computed on the host
/// without materialising the (zero) page bitmaps: the control block and the
/// buddy section. Only `init` runs over it.
#[cfg(not(target_arch = "nvptx64"))]
pub struct InitImage {
    /// Geometry.
    pub heap: Heap,
    ctrl: std::vec::Vec<GlobalU64>,
    buddy: std::vec::Vec<GlobalU32>,
    current: std::vec::Vec<GlobalU32>,
    tags: std::vec::Vec<GlobalU32>,
}

#[cfg(not(target_arch = "nvptx64"))]
impl InitImage {
    /// The initial image of heap `heap` (its geometry fields; addresses are
    /// not used).
    pub fn new(heap: Heap) -> Self {
        Self::with_free_runs(heap, core::iter::once((0, heap.units)))
    }

    /// The control block and buddy levels of a heap whose free memory is
    /// exactly the unit ranges `runs` (see `free_runs`): the
    /// rebuild step after a compaction.
    pub fn with_free_runs(heap: Heap, runs: impl Iterator<Item = (u64, u64)>) -> Self {
        let v64 = |n: u64| (0..n).map(|_| GlobalU64::new(0)).collect::<std::vec::Vec<_>>();
        let v32 = |n: u64| (0..n).map(|_| GlobalU32::new(0)).collect::<std::vec::Vec<_>>();
        let img = InitImage {
            ctrl: v64(CTRL_WORDS),
            buddy: v32(heap.buddy_words),
            current: std::vec::Vec::new(),
            tags: std::vec::Vec::new(),
            heap,
        };
        write_ctrl(&img);
        free_runs(&img, runs);
        img
    }

    /// Little-endian bytes of the control block (offset 0 of the metadata).
    pub fn ctrl_bytes(&self) -> std::vec::Vec<u8> {
        self.ctrl.iter().flat_map(|w| w.load(crate::arch::atomic::Ordering::Relaxed).to_le_bytes()).collect()
    }

    /// Little-endian bytes of the buddy section (offset `heap.buddy_off`).
    pub fn buddy_bytes(&self) -> std::vec::Vec<u8> {
        self.buddy.iter().flat_map(|w| w.load(crate::arch::atomic::Ordering::Relaxed).to_le_bytes()).collect()
    }
}

// SAFETY: owned vectors, bounds-checked indexing; other sections panic.
#[cfg(not(target_arch = "nvptx64"))]
unsafe impl HeapMem for InitImage {
    fn geom(&self) -> &Heap {
        &self.heap
    }
    fn word(&self, r: MetaSection, i: u64) -> &GlobalU64 {
        match r {
            MetaSection::Ctrl => &self.ctrl[i as usize],
            MetaSection::Hdr => unreachable!("initialisation writes only the control block and the buddy levels"),
        }
    }
    fn word32(&self, r: MetaSection32, i: u64) -> &GlobalU32 {
        match r {
            MetaSection32::Buddy => &self.buddy[i as usize],
            MetaSection32::Current => &self.current[i as usize],
            MetaSection32::Tags => &self.tags[i as usize],
            _ => unreachable!("initialisation writes only the control block and the buddy levels"),
        }
    }
}
