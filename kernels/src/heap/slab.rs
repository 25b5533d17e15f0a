//! Slab pages: 64 KiB pages carved into slots of one size class.
//!
//! # State of a page
//!
//! * a **header** word (`u64`): `used` (bits 0..32: slots reserved or
//!   allocated, plus transient over-reservations), `class + 1` (bits 32..36;
//!   0 = not a slab page: free in the buddy, part of a large block, or split),
//!   `slot` (bits 36..44: the current-page slot it was installed in, a hint),
//!   `gen` (bits 44..64: incremented on every format and retire; the ABA tag);
//! * a **bitmap** of `slots` bits (1 = allocated) in up to 64 `u64` words;
//! * a bit in its class's **available** bitmap (probably has free slots);
//! * possibly an entry in `current[class][slot]` (the page warps of that slot
//!   carve from first; Gallatin's per-SM pinned blocks).
//!
//! # Allocation: reserve, then claim (ScatterAlloc's counter + bitmap, with
//! Gallatin's one-atomic-per-warp reservation)
//!
//! 1. **Reserve** `n` slots for a whole warp group with one `fetch_add(n)` on
//!    the header. The returned old value says whether the page was of our
//!    class and how many slots were left; we keep `min(n, slots - used)` and
//!    give the excess back with `fetch_sub`. A reservation on a page that is
//!    full, of another class, or not a slab page at all only touches the
//!    header's `used` field and undoes itself, and every decrement (free or
//!    give-back) runs the same `after_release` bookkeeping, so strays are
//!    harmless. `fetch_add` never fails, unlike a CAS loop that would
//!    serialise the warps of one SM on a hot header.
//! 2. **Claim** that many bits: scan the page's words from a hashed start,
//!    `fetch_or` the lowest free bits wanted; bits that were set already (by
//!    another claimer) stay theirs (`got = take & !old`). The reservation
//!    guarantees enough clear bits exist, so the scan always succeeds.
//!
//! Invariant: `used >= set bits` at all times (frees clear the bit before
//! decrementing, allocations increment before setting the bit), hence a page
//! whose `used` reaches 0 has an all-zero bitmap and nobody inside it.
//!
//! # Free
//!
//! `fetch_and` clears the slot's bit (its old value detects double frees),
//! then `fetch_sub(1)` on the header. The decrement that takes `used` from
//! `>= slots` to `< slots` sets the page's available bit; the decrement that
//! takes it to 0 retires the page unless it is its slot's current page.
//!
//! # Retire (empty pages go back to the buddy: BL-09, mallocMC#256)
//!
//! A CAS from exactly `{used 0, class c, slot s, gen g}` to
//! `{0, none, 0, g + 1}`, then a buddy free of the page. A concurrent
//! reservation makes `used != 0` and the CAS fail (the reserver then owns the
//! next "reached 0" event); the generation makes the CAS fail if the page was
//! retired and re-formatted in between, so exactly one thread returns each
//! incarnation to the buddy (BL-10: no allocation completes on a page that is
//! being recycled, because allocation is decided by the same header word).
//!
//! Current pages are kept formatted when they empty (a warm heap does not
//! re-carve its hot pages); whoever replaces a current page re-checks it and
//! retires it if empty, and an allocation that finds the buddy exhausted
//! retires every empty current page first (`scavenge`). The freer reads
//! `current` after its header RMW and the replacer reads the header (with an
//! RMW) after its `current` RMW: the header RMWs are ordered, so at least one
//! of the two sees the other and retires.
//!
//! # Memory ordering of the payload
//!
//! A slot's previous owner writes its data, then frees with `AcqRel` RMWs;
//! the next claimer's `fetch_or` (`AcqRel`) on the same word reads from that
//! release sequence. In a warp-aggregated claim the leader does that RMW, so
//! every lane that receives a slot then performs its own `Acquire` load of
//! the slot's bitmap word ([`super::malloc`]), which reads from the same
//! release sequence: the previous owner's writes happen-before the new
//! owner's, with no reliance on shuffles ordering memory.

use super::bitmap::Hb;
use super::buddy;
use super::layout::*;
use crate::arch::atomic::Ordering;

/// `used` field mask.
pub const USED_MASK: u64 = 0xFFFF_FFFF;
const CLASS_SHIFT: u32 = 32;
const SLOT_SHIFT: u32 = 36;
const GEN_SHIFT: u32 = 44;
/// `current` entry of a slot being refilled.
pub const REFILLING: u32 = u32::MAX;
/// Probes of the available bitmap per refill.
pub const AVAIL_PROBES: u32 = 4;
/// Attempts to get a reservation through the current-page slot before
/// falling back to a private page.
pub const ACQUIRE_ATTEMPTS: u32 = 32;

/// Slots reserved or allocated (plus transient over-reservations).
#[inline(always)]
pub const fn hdr_used(h: u64) -> u32 {
    (h & USED_MASK) as u32
}
/// The page's class, `None` when it is not a slab page.
#[inline(always)]
pub const fn hdr_class(h: u64) -> Option<u32> {
    let c = ((h >> CLASS_SHIFT) & 0xF) as u32;
    if c == 0 {
        None
    } else {
        Some(c - 1)
    }
}
/// The current-page slot the page was installed in.
#[inline(always)]
pub const fn hdr_slot(h: u64) -> u32 {
    ((h >> SLOT_SHIFT) & 0xFF) as u32
}
/// The generation (ABA tag).
#[inline(always)]
pub const fn hdr_gen(h: u64) -> u32 {
    (h >> GEN_SHIFT) as u32
}

/// A reservation: `count` (1..=255) slots on `page`, packed in one `u64`
/// (`page << 8 | count`, 0 = none) so that it is returned in a register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant(u64);

impl Grant {
    /// No reservation.
    pub const NONE: Grant = Grant(0);

    #[inline(always)]
    fn new(page: u64, count: u32) -> Self {
        Grant(page << 8 | count as u64)
    }

    /// The page.
    #[inline(always)]
    pub fn page(self) -> u64 {
        self.0 >> 8
    }

    /// Slots reserved (0 for [`Grant::NONE`]).
    #[inline(always)]
    pub fn count(self) -> u32 {
        (self.0 & 0xFF) as u32
    }

    /// `Some((page, count))`, `None` for [`Grant::NONE`].
    #[inline(always)]
    pub fn get(self) -> Option<(u64, u32)> {
        if self.0 == 0 {
            None
        } else {
            Some((self.page(), self.count()))
        }
    }
}

/// The warp's search hint (a spread only: any value is correct), computed
/// where it is used rather than passed down the call chain, where every
/// frame would keep it live (DESIGN.md §4.1). 0 in the model checkers,
/// which run outside a launch.
#[inline(always)]
pub(crate) fn warp_hint() -> u64 {
    #[cfg(not(any(loom, shuttle)))]
    return super::hash(crate::arch::index::global_warp_id());
    #[cfg(any(loom, shuttle))]
    return 0;
}

/// The class's available-page bitmap.
#[inline(always)]
pub(crate) fn avail<M: HeapMem>(m: &M, class: u32) -> Hb {
    let g = m.geom();
    Hb { section: MetaSection::Avail, off: class as u64 * g.avail_stride, n: g.pages }
}

#[inline(always)]
fn current<M: HeapMem>(m: &M, class: u32, slot: u32) -> &crate::arch::atomic::AtomicU32 {
    m.word32(MetaSection32::Current, (class * CURRENT_SLOTS + slot) as u64)
}

/// Reserves up to `need` slots of class `class` on `page`; returns how many.
#[inline(always)]
pub(crate) fn reserve<M: HeapMem>(m: &M, page: u64, class: u32, need: u32) -> u32 {
    let hdr = m.word(MetaSection::Hdr, page);
    let slots = class_slots(class);
    // A plain look first avoids stray reservations on pages that are
    // obviously full or of another class.
    let h = hdr.load(Ordering::Relaxed);
    if hdr_class(h) != Some(class) || hdr_used(h) >= slots {
        return 0;
    }
    let old = hdr.fetch_add(need as u64, Ordering::AcqRel);
    let used = hdr_used(old);
    let got = if hdr_class(old) == Some(class) && used < slots { need.min(slots - used) } else { 0 };
    if got < need {
        let excess = need - got;
        let old2 = hdr.fetch_sub(excess as u64, Ordering::AcqRel);
        after_release(m, page, old2, excess);
    }
    if got > 0 && used + got >= slots {
        // We took the last free slot: drop the page from the available
        // bitmap, so that searchers are not sent to full pages.
        drop_if_full(m, page, class);
    }
    got
}

/// Clears `page`'s bit in `class`'s available bitmap, then re-checks the
/// header and sets the bit back if the page has a free slot again (a free
/// that made it non-full between must not be lost: the freer sets the bit
/// after its header RMW, we read the header after our bitmap RMW, and the
/// two bitmap RMWs are ordered, so one of us sees the other). Bracketed as
/// a transit: a searcher that ran while the bit was wrongly clear retries.
#[inline(never)]
fn drop_if_full<M: HeapMem>(m: &M, page: u64, class: u32) {
    buddy::transit_begin(m);
    avail(m, class).clear(m, page);
    let h = m.word(MetaSection::Hdr, page).load(Ordering::Acquire);
    if hdr_class(h) == Some(class) && hdr_used(h) < class_slots(class) {
        avail(m, class).set(m, page);
    }
    buddy::transit_end(m);
}

/// Bookkeeping after `n` was subtracted from a header whose previous value
/// was `old`: the available bit on leaving "full", retirement on reaching 0.
#[inline(never)]
pub(crate) fn after_release<M: HeapMem>(m: &M, page: u64, old: u64, n: u32) {
    let Some(class) = hdr_class(old) else { return };
    let slots = class_slots(class);
    let used = hdr_used(old);
    let now = used.wrapping_sub(n);
    if used >= slots && now < slots {
        avail(m, class).set(m, page);
    }
    if now == 0 {
        let h = old - n as u64;
        if current(m, class, hdr_slot(h)).load(Ordering::Acquire) != page as u32 + 1 {
            retire(m, page, h);
        } else {
            m.word(MetaSection::Ctrl, CTRL_KEPT as u64).fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// Returns the empty page whose header is exactly `h` to the buddy; `false`
/// when the header changed (someone reserved, or it was retired already).
pub(crate) fn retire<M: HeapMem>(m: &M, page: u64, h: u64) -> bool {
    if hdr_used(h) != 0 || hdr_class(h).is_none() {
        return false;
    }
    let new = ((hdr_gen(h) as u64 + 1) & 0xF_FFFF) << GEN_SHIFT;
    // Between the CAS and the buddy free the page is in neither place.
    buddy::transit_begin(m);
    if m.word(MetaSection::Hdr, page).compare_exchange(h, new, Ordering::AcqRel).is_ok() {
        if let Some(class) = hdr_class(h) {
            avail(m, class).clear(m, page);
        }
        buddy::free(m, page << PAGE_ORDER, PAGE_ORDER);
        buddy::transit_end(m);
        true
    } else {
        buddy::transit_cancel(m);
        false
    }
}

/// Formats a page just taken from the buddy for `class`, with `reserve`
/// slots already reserved for the caller. An RMW, not a store, so that
/// stray reservations in flight on the unformatted header stay balanced.
#[inline(always)]
pub(crate) fn format<M: HeapMem>(m: &M, page: u64, class: u32, slot: u32, reserve: u32) {
    let delta = reserve as u64
        + (((class + 1) as u64) << CLASS_SHIFT)
        + ((slot as u64 & 0xFF) << SLOT_SHIFT)
        + (1u64 << GEN_SHIFT);
    m.word(MetaSection::Hdr, page).fetch_add(delta, Ordering::AcqRel);
    if reserve < class_slots(class) {
        avail(m, class).set(m, page);
    }
}

/// Takes a fresh page from the buddy (retiring empty current pages and
/// retrying once if the buddy is exhausted) and formats it. The page is in
/// transit from the buddy's claim to the available bit that `format` sets,
/// so a searcher of this class that failed meanwhile retries.
#[inline(never)]
fn fresh_page<M: HeapMem>(m: &M, class: u32, slot: u32, need: u32) -> Grant {
    let hint = warp_hint();
    buddy::transit_begin(m);
    let unit = match buddy::alloc_in_transit(m, PAGE_ORDER, hint, 1) {
        Some(u) => Some(u),
        None if scavenge(m) => buddy::alloc_in_transit(m, PAGE_ORDER, hint, 1),
        None => None,
    };
    let Some(unit) = unit else {
        buddy::transit_cancel(m);
        return Grant::NONE;
    };
    let page = unit >> PAGE_ORDER;
    let got = need.min(class_slots(class));
    format(m, page, class, slot, got);
    buddy::transit_end(m);
    Grant::new(page, got)
}

/// Looks for a page of `class` with free slots in the available bitmap.
#[inline(never)]
fn from_avail<M: HeapMem>(m: &M, class: u32, need: u32) -> Grant {
    let hint = warp_hint();
    let mut t = 0;
    while t < AVAIL_PROBES {
        // The bitmap's geometry is re-read for each probe (loads after the
        // previous probe's atomics), not kept live across the loop: fewer
        // registers (DESIGN.md §4.1).
        let Some(page) = avail(m, class).find(m, hint.wrapping_add(t as u64 * 0x9E37_79B9)) else { return Grant::NONE };
        let got = reserve(m, page, class, need);
        if got > 0 {
            return Grant::new(page, got);
        }
        // Full or recycled: drop the hint (re-checked, see `drop_if_full`).
        drop_if_full(m, page, class);
        t += 1;
    }
    Grant::NONE
}

/// Retires every empty current page (on buddy exhaustion); returns whether
/// any page went back to the buddy. Scans only when some page was kept
/// since the last scan (`CTRL_KEPT`), so a heap that is really full fails
/// fast: the swap reads from the increment of every keep it resets, whose
/// header RMW therefore happens-before the scan's loads.
#[inline(never)]
pub(crate) fn scavenge<M: HeapMem>(m: &M) -> bool {
    // From the swap until the scan has retired the kept pages, they are
    // neither findable by their count nor back in the buddy: a transit.
    buddy::transit_begin(m);
    if m.word(MetaSection::Ctrl, CTRL_KEPT as u64).swap(0, Ordering::AcqRel) == 0 {
        buddy::transit_cancel(m);
        return false;
    }
    let mut any = false;
    let mut i = 0;
    while i < CLASSES * CURRENT_SLOTS {
        let v = m.word32(MetaSection32::Current, i as u64).load(Ordering::Acquire);
        if v != 0 && v != REFILLING {
            let page = (v - 1) as u64;
            let h = m.word(MetaSection::Hdr, page).load(Ordering::Acquire);
            if hdr_class(h) == Some(i / CURRENT_SLOTS) && hdr_used(h) == 0 {
                any |= retire(m, page, h);
            }
        }
        i += 1;
    }
    buddy::transit_end(m);
    any
}

/// Reserves up to `need` (≥ 1) slots of `class` for the caller, through the
/// current page of `slot`, the available pages, or a fresh page; returns the
/// page and the count, or [`Grant::NONE`] when the heap cannot provide any.
/// `need` is at most 32 (one warp).
///
/// A failure is final only after a *final scan* (the available pages, then
/// a fresh page from the buddy) that ran while no operation hid free slots
/// or pages (the transit counter of [`buddy`] showed none in flight at its
/// end and none completed since its start); otherwise the scan is repeated,
/// at most [`FINAL_SCANS`] times. Every operation that can hide a free slot
/// or page from that scan is bracketed by the counter: a buddy split or
/// merge, a page between the buddy and its format ([`fresh_page`]), a page
/// between its retirement and the buddy ([`retire`], [`scavenge`]), and a
/// page whose available bit is cleared and re-checked (`drop_if_full`).
pub(crate) fn acquire<M: HeapMem>(m: &M, class: u32, slot: u32, need: u32) -> Grant {
    // One frame, one search site: the current-page attempts, then searches
    // (the refill's or the fallback's, then the final scans) each followed
    // by the same check. No nested calls keep this frame's values live
    // under another frame's (DESIGN.md §4.1: registers add up along a call
    // chain in `ptxas`).
    // `old + 1` of the slot's entry we replaced with `REFILLING` (0: we are
    // not refilling; `old` is never `REFILLING`, so this does not wrap).
    let mut refill = 0u32;
    let mut attempt = 0;
    while attempt < ACQUIRE_ATTEMPTS {
        // Through an optimisation barrier, so that what is derived from them
        // (the slot count, the reservation's 64-bit addend, the `current`
        // row) is computed in the iteration that uses it rather than once
        // before the loop and kept live across its calls (DESIGN.md §4.1).
        let (class, need) = (crate::arch::opaque_u32(class), crate::arch::opaque_u32(need));
        let cur = current(m, class, slot);
        let v = cur.load(Ordering::Acquire);
        if v == REFILLING {
            // Another warp is refilling this slot: use any page with room,
            // else wait a little.
            let r = from_avail(m, class, need);
            if r != Grant::NONE {
                return r;
            }
            crate::arch::time::backoff(attempt.min(5));
        } else {
            if v != 0 {
                let got = reserve(m, (v - 1) as u64, class, need);
                if got > 0 {
                    return Grant::new((v - 1) as u64, got);
                }
            }
            if cur.compare_exchange(v, REFILLING, Ordering::AcqRel).is_ok() {
                refill = v + 1;
                break;
            }
        }
        attempt += 1;
    }
    // Here we refill the slot, or the refiller is slow and we do not wait
    // longer: either way, search for a page of our own. The transit
    // snapshot is taken here, right before the first scan (the window a
    // final scan is checked over is the scan itself), not before the
    // current-page attempts: nothing is live across them (DESIGN.md §4.1).
    let mut scan = 0;
    let mut t0 = buddy::transit_now(m);
    loop {
        let mut r = from_avail(m, class, need);
        if r == Grant::NONE {
            r = fresh_page(m, class, slot, need);
        }
        if refill != 0 {
            install(m, class, slot, r, refill - 1);
            refill = 0;
        }
        if r != Grant::NONE {
            return r;
        }
        let t1 = buddy::transit_now(m);
        if buddy::transit_quiet(t0, t1, 0) || scan == FINAL_SCANS {
            return Grant::NONE;
        }
        crate::arch::time::backoff(scan.min(6));
        t0 = t1;
        scan += 1;
    }
}

/// Final scans of a failing `acquire` that ran while free memory was in
/// transit (each one follows a completed or in-flight transit).
pub const FINAL_SCANS: u32 = 64;

/// The end of a slot's refill (`current` holds [`REFILLING`], set by the
/// caller; `old` was the entry before): installs the page of `r` (none: 0)
/// and retires the page un-installed if it emptied while it was current.
#[inline(never)]
fn install<M: HeapMem>(m: &M, class: u32, slot: u32, r: Grant, old: u32) {
    let new = match r.get() {
        Some((page, _)) => page as u32 + 1,
        None => 0,
    };
    current(m, class, slot).store(new, Ordering::Release);
    if old != 0 && old != new {
        // The page we un-installed may have emptied while it was current.
        let page = (old - 1) as u64;
        let h = m.word(MetaSection::Hdr, page).fetch_add(0, Ordering::AcqRel);
        if hdr_class(h) == Some(class) && hdr_used(h) == 0 {
            retire(m, page, h);
        }
    }
}

/// Claims up to `want` reserved slots on `page` (class `class`), scanning
/// from word `*cursor`: returns the word index and the bits obtained (never 0
/// when the reservation holds). Updates `*cursor`.
#[inline(always)]
pub(crate) fn claim_bits<M: HeapMem>(m: &M, page: u64, class: u32, cursor: &mut u32, want: u32) -> (u32, u64) {
    let words = class_words(class);
    let slots = class_slots(class);
    let valid = if slots >= 64 { u64::MAX } else { (1u64 << slots) - 1 };
    let mut scanned = 0;
    // The reservation guarantees `want` clear bits; each failed pass means
    // other reservers progressed. Bound the scan anyway.
    while scanned < words * 64 {
        let idx = *cursor % words;
        let word = m.word(MetaSection::Bits, page * WORDS_PER_PAGE + idx as u64);
        let v = word.load(Ordering::Relaxed);
        let mut free = !v & valid;
        if free != 0 {
            let mut take = 0u64;
            let mut k = 0;
            while k < want && free != 0 {
                let low = free & free.wrapping_neg();
                take |= low;
                free ^= low;
                k += 1;
            }
            let old = word.fetch_or(take, Ordering::AcqRel);
            let got = take & !old;
            if got != 0 {
                *cursor = idx;
                return (idx, got);
            }
        } else {
            *cursor = idx + 1;
        }
        scanned += 1;
    }
    (0, 0)
}

/// Outcome of `free_slot`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotFree {
    /// Freed.
    Freed,
    /// The slot was not allocated (double free).
    Double,
    /// The pointer is not a slot boundary of this page's class.
    Invalid,
}

/// Frees the slot at byte `off_in_page` of `page`, whose header read `h`
/// (a slab page of some class).
#[inline(always)]
pub(crate) fn free_slot<M: HeapMem>(m: &M, page: u64, h: u64, off_in_page: u64) -> SlotFree {
    let Some(class) = hdr_class(h) else { return SlotFree::Invalid };
    let size_shift = MIN_CLASS_SHIFT + class;
    if off_in_page & ((1 << size_shift) - 1) != 0 {
        return SlotFree::Invalid;
    }
    let slot = off_in_page >> size_shift;
    let bit = 1u64 << (slot % 64);
    let old = m.word(MetaSection::Bits, page * WORDS_PER_PAGE + slot / 64).fetch_and(!bit, Ordering::AcqRel);
    if old & bit == 0 {
        return SlotFree::Double;
    }
    let old_h = m.word(MetaSection::Hdr, page).fetch_sub(1, Ordering::AcqRel);
    after_release(m, page, old_h, 1);
    SlotFree::Freed
}

/// Gives back `n` reserved but unclaimed slots (never happens when the
/// reservation invariant holds; kept so that every path is balanced).
#[inline(never)]
pub(crate) fn unreserve<M: HeapMem>(m: &M, page: u64, n: u32) {
    if n > 0 {
        let old = m.word(MetaSection::Hdr, page).fetch_sub(n as u64, Ordering::AcqRel);
        after_release(m, page, old, n);
    }
}
