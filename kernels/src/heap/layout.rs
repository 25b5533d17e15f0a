//! Geometry of the device heap: units, pages, size classes, the [`Heap`]
//! handle and where each piece of metadata lives.
//!
//! # Why these numbers
//!
//! * **Unit = 4 KiB** is the smallest buddy block. Large requests (> 4 KiB)
//!   round up to a power of two of units, so a power-of-two request of any
//!   size uses 100 % of its block (the survey's out-of-memory test uses powers
//!   of two; the worst case for other sizes is the usual buddy 2x).
//! * **Page = 64 KiB** (buddy order 4) is what a size class carves. A page of
//!   16-byte slots has 4096 of them, which is 128 `u32` bitmap words; a page of
//!   4 KiB slots has 16. Gallatin uses 4096 slices per block and a block size
//!   that grows with the slice size; a fixed page keeps one bitmap stride and
//!   one header per page, and makes `ptr -> page` a shift.
//! * **Classes = 16 B .. 4 KiB, powers of two** (9 classes, like Gallatin and
//!   Ouroboros). Power-of-two slots keep every slot 16-byte aligned and make
//!   `size -> class` a leading-zero count.
//! * **Metadata lives outside the data region** (headers, bitmaps and the buddy tree
//!   are in a separate buffer). The data region is only ever written by the users of
//!   the blocks: the allocator never touches it, so a failing request writes
//!   nothing into the heap (BL-11) and a page of 16-byte slots is 100 % usable.

use crate::arch::atomic::{GlobalU32, GlobalU64};

/// log2 of [`UNIT`].
pub const UNIT_SHIFT: u32 = 12;
/// Smallest buddy block, bytes.
pub const UNIT: u64 = 1 << UNIT_SHIFT;
/// log2 of [`PAGE`].
pub const PAGE_SHIFT: u32 = 16;
/// Bytes of one slab page.
pub const PAGE: u64 = 1 << PAGE_SHIFT;
/// Buddy order of a slab page (`PAGE = UNIT << PAGE_ORDER`).
pub const PAGE_ORDER: u32 = PAGE_SHIFT - UNIT_SHIFT;
/// log2 of the smallest slot (16 B, the CUDA alignment contract).
pub const MIN_CLASS_SHIFT: u32 = 4;
/// Number of slab size classes (16 B, 32 B, ..., 4 KiB).
pub const CLASSES: u32 = 9;
/// Largest request served by a slab; larger ones go to the buddy allocator.
pub const MAX_SMALL: u64 = 1 << (MIN_CLASS_SHIFT + CLASSES - 1);
/// Bits per bitmap word: every bitmap (slot bitmaps, available pages,
/// buddy levels) is made of `u32` words, so a word, its masks and its old
/// value each take one register, and one word holds a warp's worth of slots.
pub const WORD_BITS: u32 = 32;
/// `u32` bitmap words per page (enough for 4096 slots of 16 B).
pub const WORDS_PER_PAGE: u64 = (PAGE >> MIN_CLASS_SHIFT) / WORD_BITS as u64;
/// "Current page" slots per class. Warps pick one by SM id (a hint), so up to
/// this many pages of one class are carved from concurrently (Gallatin pins
/// one block per SM and class; an H200 has 132 SMs).
pub const CURRENT_SLOTS: u32 = 128;
/// `u32` words per "current page" entry: each entry has its own 32-byte L2
/// sector, so the SMs that carve one class do not serialise on one line.
pub const CURRENT_STRIDE: u32 = 8;
/// Largest supported buddy order: the data region has fewer than 2^32 units
/// (16 TiB), so every unit, page and bit index is a `u32`.
pub const MAX_ORDER_LIMIT: u32 = 31;
/// Alignment of every pointer `malloc` returns, bytes.
pub const ALIGN: u64 = 16;

/// Words of the control block at the start of the metadata.
pub const CTRL_WORDS: u64 = 256;
/// Control word: a magic number (`MAGIC`) written by the host at init.
pub const CTRL_MAGIC: usize = 0;
/// Control word: requests that returned null although their size was valid.
pub const CTRL_FAILED: usize = 2;
/// Control word: double frees detected (feature `debug-free`).
pub const CTRL_DOUBLE_FREES: usize = 3;
/// Control word: invalid frees detected (feature `debug-free`).
pub const CTRL_INVALID_FREES: usize = 4;
/// Control word: empty pages kept formatted because they were current (a
/// hint that `super::slab::scavenge` has something to find; it is reset by
/// each scavenge, so failing requests do not rescan for nothing).
pub const CTRL_KEPT: usize = 5;
/// Control word: searches made by requests that returned null (each one a
/// complete pass over the class or buddy order followed by a check of the
/// transit counter; see [`super::transit`]). Divided by [`CTRL_FAILED`], the
/// cost of a null in searches.
pub const CTRL_FAILED_SEARCHES: usize = 6;
/// Control word: waits for a slot's refiller (a warp that found its slot's
/// `current` entry `REFILLING` probed the available pages, found none and
/// backed off; at most [`super::slab::REFILL_WAITS`] per request, then it
/// searches on its own), counted once for each request of the warp group
/// that waited.
pub const CTRL_REFILL_WAITS: usize = 40;
/// Control word: the waits for a refiller made by requests that returned
/// null (counted per null like [`CTRL_FAILED_SEARCHES`]). Divided by
/// [`CTRL_FAILED`], the waits per null.
pub const CTRL_FAILED_WAITS: usize = 41;
const _: () = assert!(CTRL_REFILL_WAITS > CTRL_LEVELS + MAX_ORDER_LIMIT as usize);
const _: () = assert!(CTRL_FAILED_WAITS < CTRL_SLOW_GRANTS);
/// Control words `CTRL_SLOW_GRANTS + c` for each class `c`: reservations
/// that the slot's current page did not serve (the slow path: a refill, a
/// page from the available bitmap, a private fresh page). Every other
/// reservation was a fast-path hit. A slot left `REFILLING` would send
/// every later request of its class here.
pub const CTRL_SLOW_GRANTS: usize = 48;
const _: () = assert!(CTRL_SLOW_GRANTS > CTRL_LEVELS + MAX_ORDER_LIMIT as usize);
const _: () = assert!(CTRL_SLOW_GRANTS + CLASSES as usize <= CTRL_TRANSIT);
/// Control words `CTRL_LEVELS + k`: word offset of buddy level `k` in the
/// buddy section ([`Heap::level_offset`], written by the host at init for
/// the host's decoding; device code computes it).
pub const CTRL_LEVELS: usize = 8;
/// Control words of the transit counter's shards: shard `s` is word
/// `CTRL_TRANSIT + s * TRANSIT_STRIDE` (low 32 bits: operations in flight
/// that hide free memory; high 32 bits: completed ones). See
/// [`super::transit`].
pub const CTRL_TRANSIT: usize = 128;
/// Shards of the transit counter (an operation uses the shard of its SM).
pub const TRANSIT_SHARDS: u32 = 8;
/// Words between two transit shards (one 128-byte line each).
pub const TRANSIT_STRIDE: usize = 16;
/// The value of `CTRL_MAGIC` in an initialised heap ("gpuheap1").
pub const MAGIC: u64 = 0x3170_6165_6875_7067;

/// Size of slot class `c`, bytes.
#[inline(always)]
pub const fn class_size(c: u32) -> u64 {
    1 << (MIN_CLASS_SHIFT + c)
}

/// Slots in one page of class `c`.
#[inline(always)]
pub const fn class_slots(c: u32) -> u32 {
    (PAGE >> (MIN_CLASS_SHIFT + c)) as u32
}

/// Bitmap words used by a page of class `c`.
#[inline(always)]
pub const fn class_words(c: u32) -> u32 {
    let s = class_slots(c);
    if s >= WORD_BITS {
        s / WORD_BITS
    } else {
        1
    }
}

/// The slab class serving `size` bytes, `None` for 0 and for sizes above
/// [`MAX_SMALL`].
#[inline(always)]
pub const fn class_of(size: u64) -> Option<u32> {
    if size == 0 || size > MAX_SMALL {
        return None;
    }
    if size <= 1 << MIN_CLASS_SHIFT {
        return Some(0);
    }
    // ceil(log2(size)) - MIN_CLASS_SHIFT
    Some(64 - (size - 1).leading_zeros() - MIN_CLASS_SHIFT)
}

/// Buddy order (log2 of units) of a large request of `size` bytes (any
/// `size >= 1`; no overflow for `u64::MAX`).
#[inline(always)]
pub const fn order_of(size: u64) -> u32 {
    let units = ((size.saturating_sub(1)) >> UNIT_SHIFT) + 1;
    64 - (units - 1).leading_zeros()
}

/// `u32` words of a hierarchical bitmap over `n` bits (see [`super::bitmap`]).
pub const fn hb_words(n: u64) -> u64 {
    let mut total = 0;
    let mut m = n;
    loop {
        let w = if m == 0 { 1 } else { m.div_ceil(WORD_BITS as u64) };
        total += w;
        if w <= 1 {
            return total;
        }
        m = w;
    }
}

/// Bit positions at buddy level `k` of a heap of `units` units.
#[inline(always)]
pub const fn level_bits(units: u64, k: u32) -> u64 {
    (units + (1 << k) - 1) >> k
}

/// log2 of the buddy section's level-0 slot, in words (see
/// [`Heap::level_offset`]): `max(max_order, 8) - 3`.
#[inline(always)]
pub const fn level_slot_shift(max_order: u32) -> u32 {
    (if max_order > 8 { max_order } else { 8 }) - 3
}

/// Word offset of buddy level `k` in the buddy section of a heap whose
/// largest order is `max_order`: level `j` has a slot of `(P >> j) + 8`
/// words with `P = 2^level_slot_shift(max_order)`, so the offset is a closed
/// form, `2P - max(2P >> k, 1) + 8k` (device code computes it instead of
/// reading a table). A slot holds its level: the level has
/// `n = ceil(units / 2^k)` bits and `hb_words(n) <= n / 31 + depth + 1`
/// words, with `units < 2^(max_order + 1) <= 16P` and `depth <= 7`.
#[inline(always)]
pub const fn level_offset_of(max_order: u32, k: u32) -> u64 {
    // `u32` arithmetic (fewer registers on the device): `2P <= 2^30` and
    // `k <= 32`; `k` may exceed 31 for the end of the last slot only.
    let p2 = 2u32 << level_slot_shift(max_order);
    let tail = if k < 32 { p2 >> k } else { 0 };
    (p2 - if tail > 1 { tail } else { 1 } + 8 * k) as u64
}

/// The handle kernels receive: where the data region and the metadata are, and the
/// geometry. Plain old data, `#[repr(C)]`, passed by value in a kernel's
/// parameter struct (152 bytes). Device code reads the geometry from here
/// (a kernel parameter lives in the constant bank: no memory traffic, no
/// register, unaffected by the L1 invalidations of acquire operations),
/// never from the metadata.
///
/// Build it on the host with `gpuheap::device_heap::DeviceHeap::handle`; any
/// other value is a contract violation for [`super::malloc`] and
/// [`super::free`]. All offsets are **bytes from `meta`**.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Heap {
    /// Device address of the data region (aligned to [`PAGE`]).
    pub base: u64,
    /// Data-region bytes (`units * UNIT`).
    pub capacity: u64,
    /// Device address of the metadata (8-byte aligned).
    pub meta: u64,
    /// Buddy units in the data region.
    pub units: u64,
    /// Pages (`ceil(units / 16)`; a trailing partial page is never a slab page).
    pub pages: u64,
    /// Largest buddy order present (`floor(log2(units))`).
    pub max_order: u64,
    /// `u32 current[CLASSES][CURRENT_SLOTS][CURRENT_STRIDE]` (word 0 of each
    /// entry is used): page index + 1, 0 = none, `u32::MAX` = being refilled.
    pub current_off: u64,
    /// `u64 header[pages]` (see [`super::slab`] for the bit layout).
    pub hdr_off: u64,
    /// `u32 bits[pages][WORDS_PER_PAGE]`: slot bitmaps, 1 = allocated.
    pub bits_off: u64,
    /// `u32 avail[CLASSES][avail_stride]`: per class, a hierarchical bitmap of
    /// pages that may have free slots.
    pub avail_off: u64,
    /// Words per class in `avail` (`hb_words(pages)`).
    pub avail_stride: u64,
    /// Buddy levels `0..=max_order`, each a hierarchical bitmap of free
    /// blocks, level `k` at word [`Heap::level_offset`]`(k)`.
    pub buddy_off: u64,
    /// `u32` words of the buddy section.
    pub buddy_words: u64,
    /// `u32 tags[units]`: `order + 1` at the first unit of every live large
    /// block, 0 elsewhere. The live-block list for compaction.
    pub tags_off: u64,
    /// Bytes of metadata in total.
    pub meta_bytes: u64,
    /// Device address of the movable region's control block, handle table and
    /// index pool (see `crate::compact::movable`); 0 when the heap has no
    /// movable region.
    pub movable_ctrl: u64,
    /// Entries of the movable region's handle table (0 without one).
    pub max_handles: u64,
    /// Byte offset of the movable region from `base` (a multiple of [`UNIT`]).
    pub movable_off: u64,
    /// Bytes of the movable region (a multiple of [`UNIT`]; 0 without one).
    /// Its units are never in the buddy levels, never tagged and never slab
    /// pages: `malloc` never returns them and `free` ignores them.
    pub movable_bytes: u64,
}

const fn align8(x: u64) -> u64 {
    (x + 7) & !7
}

impl Heap {
    /// The geometry of a heap whose data region has `capacity` bytes (rounded down
    /// to a multiple of [`UNIT`]), with `base` and `meta` left at 0. `None`
    /// when fewer than one unit remains, or 2^32 units (16 TiB) or more.
    pub const fn layout(capacity: u64) -> Option<Heap> {
        let units = capacity >> UNIT_SHIFT;
        if units == 0 {
            return None;
        }
        let pages = units.div_ceil(1 << PAGE_ORDER);
        let max_order = 63 - units.leading_zeros() as u64;
        if max_order > MAX_ORDER_LIMIT as u64 {
            return None;
        }
        let current_off = CTRL_WORDS * 8;
        let hdr_off = align8(current_off + (CLASSES * CURRENT_SLOTS * CURRENT_STRIDE) as u64 * 4);
        let bits_off = hdr_off + pages * 8;
        let avail_off = bits_off + pages * WORDS_PER_PAGE * 4;
        let avail_stride = hb_words(pages);
        let buddy_off = align8(avail_off + CLASSES as u64 * avail_stride * 4);
        let buddy_words = level_offset_of(max_order as u32, max_order as u32 + 1);
        let tags_off = buddy_off + buddy_words * 4;
        let meta_bytes = align8(tags_off + units * 4);
        Some(Heap {
            base: 0,
            capacity: units << UNIT_SHIFT,
            meta: 0,
            units,
            pages,
            max_order,
            current_off,
            hdr_off,
            bits_off,
            avail_off,
            avail_stride,
            buddy_off,
            buddy_words,
            tags_off,
            meta_bytes,
            movable_ctrl: 0,
            max_handles: 0,
            movable_off: 0,
            movable_bytes: 0,
        })
    }

    /// Word offset of buddy level `k` inside the buddy section (the value the
    /// host stores in control word `CTRL_LEVELS + k`; [`level_offset_of`]).
    pub const fn level_offset(&self, k: u32) -> u64 {
        level_offset_of(self.max_order as u32, k)
    }
}

/// The device-side [`HeapMem`]: a reference to the [`Heap`] handle, which
/// device code reads from where the kernel received it.
///
/// When the handle is a field of the kernel's parameter struct (the usual
/// `heap::malloc(&p.heap, n)`), every geometry read is a constant-bank
/// operand: no load, no register, untouched by the L1 invalidations that
/// acquire operations cause. That holds because every protocol function
/// over it is inlined into the kernel: a reference to a kernel parameter
/// passed to a function that is not inlined makes the compiler copy the
/// parameter into local memory (a stack frame, which the PTX check
/// forbids), so the heap has no `#[inline(never)]` function.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DevHeap<'a> {
    #[cfg_attr(any(loom, shuttle), allow(dead_code))] // the model checks use `VecHeap`
    heap: &'a Heap,
}

impl<'a> DevHeap<'a> {
    /// The device view of `heap`.
    ///
    /// # Safety
    /// `heap` is the handle of a live, initialised heap.
    #[inline(always)]
    pub(crate) unsafe fn new(heap: &'a Heap) -> Self {
        DevHeap { heap }
    }
}

// SAFETY: `DevHeap::new`'s contract: `heap` describes the metadata of a live,
// initialised heap, and the handle does not change while kernels run.
#[cfg(not(any(loom, shuttle)))]
unsafe impl HeapMem for DevHeap<'_> {
    #[inline(always)]
    fn geom(&self) -> &Heap {
        self.heap
    }

    #[inline(always)]
    fn word(&self, r: MetaSection, i: u64) -> &GlobalU64 {
        let g = self.heap;
        let off = match r {
            MetaSection::Ctrl => 0,
            MetaSection::Hdr => g.hdr_off,
        };
        // SAFETY: as for `Heap`'s implementation: indices are inside their
        // sections by construction, the metadata is live device memory.
        unsafe { GlobalU64::from_ptr((crate::arch::opaque_u64(g.meta) + off + i * 8) as *mut u64) }
    }

    #[inline(always)]
    fn word32(&self, r: MetaSection32, i: u64) -> &GlobalU32 {
        let g = self.heap;
        let off = match r {
            MetaSection32::Current => g.current_off,
            MetaSection32::Tags => g.tags_off,
            MetaSection32::Bits => g.bits_off,
            MetaSection32::Avail => g.avail_off,
            MetaSection32::Buddy => g.buddy_off,
        };
        // SAFETY: as for `word`.
        unsafe { GlobalU32::from_ptr((crate::arch::opaque_u64(g.meta) + off + i * 4) as *mut u32) }
    }
}

// SAFETY: never returns (model-checking builds do not use device handles).
#[cfg(any(loom, shuttle))]
unsafe impl HeapMem for DevHeap<'_> {
    fn geom(&self) -> &Heap {
        unreachable!("device handles are not used in model-checking builds; use VecHeap")
    }
    fn word(&self, _: MetaSection, _: u64) -> &GlobalU64 {
        unreachable!("device handles are not used in model-checking builds; use VecHeap")
    }
    fn word32(&self, _: MetaSection32, _: u64) -> &GlobalU32 {
        unreachable!("device handles are not used in model-checking builds; use VecHeap")
    }
}

/// The 64-bit metadata sections (`HeapMem::word`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetaSection {
    /// The control block.
    Ctrl,
    /// Page headers.
    Hdr,
}

/// The 32-bit metadata sections (`HeapMem::word32`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetaSection32 {
    /// Current page per class and slot.
    Current,
    /// Large-block tags per unit.
    Tags,
    /// Slot bitmaps.
    Bits,
    /// Per-class available-page bitmaps.
    Avail,
    /// Buddy levels.
    Buddy,
}

/// Where the protocols find their atomics.
///
/// The allocator's protocols are written against this trait so that the same
/// code runs on the device ([`DevHeap`], whose words are views of device
/// memory) and in the model checkers, where loom's atomics cannot be made
/// from raw pointers and live in `Vec`s instead ([`VecHeap`], host only).
///
/// Crate-private, like every protocol function generic over it: the device
/// implementation does no bounds checks (they would cost registers on the
/// hot path), so a caller outside the protocols could reach undefined
/// behaviour with an out-of-range index. From outside the crate the heap is
/// reached only through the `unsafe fn`s [`super::malloc`] and
/// [`super::free`]. The plain [`Heap`] handle is not a `HeapMem`: any `Heap`
/// value can be built in safe code.
///
/// # Safety
/// An implementation guarantees that, for the geometry `g = self.geom()`,
/// `word(r, i)` and `word32(r, i)` return a reference to a live atomic for
/// every `i` inside section `r` (`Ctrl`: `CTRL_WORDS`; `Hdr`: `g.pages`;
/// `Bits`: `g.pages * WORDS_PER_PAGE`; `Avail`: `CLASSES * g.avail_stride`;
/// `Buddy`: `g.buddy_words`; `Current`: `CLASSES * CURRENT_SLOTS * CURRENT_STRIDE`; `Tags`:
/// `g.units`), shared by every thread using the same heap, and that `geom()`
/// does not change while the heap is in use. The protocols only pass
/// indices inside those ranges.
pub(crate) unsafe trait HeapMem {
    /// The geometry (and, on the device, the addresses).
    fn geom(&self) -> &Heap;
    /// Word `i` of section `r`.
    fn word(&self, r: MetaSection, i: u64) -> &GlobalU64;
    /// Word `i` of 32-bit section `r`.
    fn word32(&self, r: MetaSection32, i: u64) -> &GlobalU32;

    /// The geometry's largest buddy order, through an optimisation barrier
    /// (as every geometry value below): computed where it is used, not once
    /// and kept in a register across the allocator (DESIGN.md §4.1).
    #[inline(always)]
    fn max_order(&self) -> u32 {
        crate::arch::opaque_u64(self.geom().max_order) as u32
    }
    /// Units in the data region (fewer than 2^32, see [`MAX_ORDER_LIMIT`]).
    #[inline(always)]
    fn units(&self) -> u32 {
        crate::arch::opaque_u64(self.geom().units) as u32
    }
    /// Pages in the data region.
    #[inline(always)]
    fn pages(&self) -> u32 {
        crate::arch::opaque_u64(self.geom().pages) as u32
    }
    /// Words per class of the available bitmaps.
    #[inline(always)]
    fn avail_stride(&self) -> u32 {
        crate::arch::opaque_u64(self.geom().avail_stride) as u32
    }
    /// Device address of the data region.
    #[inline(always)]
    fn base(&self) -> u64 {
        crate::arch::opaque_u64(self.geom().base)
    }
}

#[cfg(all(test, not(loom), not(shuttle)))]
mod tests {
    use super::*;

    #[test]
    fn classes_cover_16_to_4096_with_aligned_slots() {
        assert_eq!(class_of(0), None);
        assert_eq!(class_of(1), Some(0));
        assert_eq!(class_of(16), Some(0));
        assert_eq!(class_of(17), Some(1));
        assert_eq!(class_of(4096), Some(8));
        assert_eq!(class_of(4097), None);
        for c in 0..CLASSES {
            assert_eq!(class_size(c) % ALIGN, 0);
            assert_eq!(class_slots(c) as u64 * class_size(c), PAGE);
            assert!(class_words(c) as u64 <= WORDS_PER_PAGE);
        }
    }

    #[test]
    fn orders_round_up_without_overflow() {
        assert_eq!(order_of(4097), 1);
        assert_eq!(order_of(8192), 1);
        assert_eq!(order_of(8193), 2);
        assert_eq!(order_of(1 << 20), 8);
        assert_eq!(order_of(u64::MAX), 52);
    }

    /// The closed-form buddy level offsets (`level_offset_of`): every level
    /// fits its slot, for every heap size class of the allocator (small
    /// counts exhaustively, then both sides of every power of two).
    #[test]
    fn every_buddy_level_fits_its_closed_form_slot() {
        let units = (1u64..4200).chain((12..32).flat_map(|b| [(1u64 << b) - 1, 1 << b, (1 << b) + 1, (3 << b) / 2]));
        for u in units.filter(|&u| u < 1 << 32) {
            let h = Heap::layout(u << UNIT_SHIFT).unwrap();
            for k in 0..=h.max_order as u32 {
                let need = hb_words(level_bits(u, k));
                let slot = h.level_offset(k + 1) - h.level_offset(k);
                assert!(need <= slot, "units {u}, level {k}: {need} words in a slot of {slot}");
            }
        }
    }

    #[test]
    fn layout_sections_do_not_overlap() {
        for cap in [4096u64, 3 * 4096, 2 * PAGE, (1 << 20) + 12345, 1 << 30] {
            let h = Heap::layout(cap).unwrap();
            assert!(h.hdr_off >= h.current_off + (CLASSES * CURRENT_SLOTS * CURRENT_STRIDE) as u64 * 4);
            for k in 0..=h.max_order as u32 {
                let n = level_bits(h.units, k);
                assert!(h.level_offset(k) + hb_words(n) <= h.level_offset(k + 1), "level {k} fits its slot");
            }
            assert_eq!(h.level_offset(h.max_order as u32 + 1), h.buddy_words);
            assert!(h.bits_off >= h.hdr_off + h.pages * 8);
            assert!(h.tags_off + h.units * 4 <= h.meta_bytes);
            assert!(1u64 << h.max_order <= h.units);
            assert!(2 * (1u64 << h.max_order) > h.units);
        }
        assert!(Heap::layout(4095).is_none());
        assert!(Heap::layout(((1u64 << 32) - 1) << UNIT_SHIFT).is_some());
        assert!(Heap::layout(1u64 << 44).is_none(), "2^32 units do not fit u32 indices");
    }
}
