//! Slab pages: 64 KiB pages carved into slots of one size class.
//!
//! # State of a page
//!
//! * a **header** word (`u64`): `used` (bits 0..32: slots reserved or
//!   allocated, plus transient over-reservations), `class + 1` (bits 32..36;
//!   0 = not a slab page: free in the buddy, part of a large block, or split),
//!   `slot` (bits 36..44: the current-page slot it was installed in, a hint),
//!   `gen` (bits 44..64: incremented on every format and retire; the ABA tag);
//! * a **bitmap** of `slots` bits (1 = allocated) in up to 128 `u32` words;
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
//!    guarantees enough clear bits exist, so the scan succeeds (lock-free: a
//!    lost word means another claimer took its bits).
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
//! RMW) after its `current` store: the header RMWs are ordered, so at least
//! one of the two sees the other and retires.
//!
//! # Refills end (the recovery property)
//!
//! A warp that replaces `current[class][slot]` with [`REFILLING`] owns the
//! slot until it ends the refill with `install` (its page, or 0 when its
//! search failed). Every path out of `acquire` that holds a refill goes
//! through that install: a grant, a failed search of the buddy, and a
//! scavenge that retired nothing (which fails like any other search, after
//! the install). So no null leaves a slot `REFILLING`, and once memory is
//! freed the class's fast path serves again. Reservations that the current
//! page did not serve are counted per class (`CTRL_SLOW_GRANTS`).
//!
//! # Memory ordering: the one operation that carries each edge
//!
//! | edge | release | acquire |
//! |---|---|---|
//! | a slot's payload, previous owner → next owner | the free's bitmap `fetch_and` | the claim's bitmap `fetch_or` (the leader's), then `bar.warp.sync` to the lanes ([`super::malloc`]) |
//! | a page's payload, its slots' owners → whoever gets the page from the buddy | each free's header `fetch_sub` (the bitmap clear is before it) | the retirement's header CAS, then the buddy's own edge ([`super::buddy`]) |
//! | the replacer's `current` store → the freer that empties the page (`install` against `after_release`) | the replacer's header `fetch_add(0)` | the freer's header load after its `fetch_sub` (it reads from the release sequence of the replacer's RMW: every header write is an RMW) |
//! | a free that leaves "full" → a `recheck_avail` that clears the available bit (store buffering) | the freer's available-bit `fetch_or` | the dropper's available-bit `fetch_and` (then its header read sees the free) |
//! | a kept page's emptying → `scavenge` | the keeper's `CTRL_KEPT` `fetch_add` | the scavenger's `swap` |
//!
//! Everything else is `Relaxed`: the reservation `fetch_add` and its
//! give-back only count (a reserver copes with any header it meets), the
//! format's header RMW publishes nothing a reserver needs (its reservation
//! reads the latest header anyway), the `current` entry is a hint that every
//! reservation re-checks, and the searches are ordered by the transit
//! counter ([`super::transit`]).

use super::bitmap::Hb;
use super::buddy;
use super::layout::*;
use super::transit;
use crate::arch::atomic::{GlobalU32, Ordering};
use crate::arch::time::backoff;
use crate::arch::{nonuniform_one, opaque_u32};

/// `used` field mask.
pub const USED_MASK: u64 = 0xFFFF_FFFF;
const CLASS_SHIFT: u32 = 32;
const SLOT_SHIFT: u32 = 36;
const GEN_SHIFT: u32 = 44;
/// `current` entry of a slot being refilled.
pub const REFILLING: u32 = u32::MAX;
/// Probes of the available bitmap per search (and per wait for a slot's
/// refiller).
pub const AVAIL_PROBES: u32 = 4;
/// Attempts to get a reservation through the current-page slot before
/// falling back to a private page.
pub const ACQUIRE_ATTEMPTS: u32 = 32;
/// Waits (each an available-bitmap probe and a backoff of at most
/// 1,024 ns nominal: about 4 µs in all) for a slot's refiller before a warp
/// searches on its own. Each wait is counted once per request of the warp
/// group (`CTRL_REFILL_WAITS`, and for nulls `CTRL_FAILED_WAITS`), so that the latency of a null shows in the
/// statistics and not only its searches.
pub const REFILL_WAITS: u32 = 8;
/// `acquire`'s `attempt` holds the current-page attempts in its low byte
/// and the waits for a refiller above it.
const WAIT_SHIFT: u32 = 8;
const ATTEMPTS_MASK: u32 = (1 << WAIT_SHIFT) - 1;
const _: () = assert!(ACQUIRE_ATTEMPTS <= ATTEMPTS_MASK);
/// `acquire`'s error: the searches in the low 16 bits, the waits for a
/// refiller above them ([`failure_searches`], [`failure_waits`]).
const ERR_WAIT_SHIFT: u32 = 16;
const _: () = assert!(FINAL_SCANS < 1 << ERR_WAIT_SHIFT);

/// The searches of a failed `acquire` (its `Err`).
#[inline(always)]
pub const fn failure_searches(err: u32) -> u32 {
    err & ((1 << ERR_WAIT_SHIFT) - 1)
}

/// The waits for a slot's refiller of a failed `acquire` (its `Err`).
#[inline(always)]
pub const fn failure_waits(err: u32) -> u32 {
    err >> ERR_WAIT_SHIFT
}

/// Searches of a failing `acquire` (each one a pass over the available
/// pages and the buddy; all but the last followed by a transit completed or
/// in flight).
pub const FINAL_SCANS: u32 = 64;

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
    pub(crate) fn new(page: u32, count: u32) -> Self {
        Grant((page as u64) << 8 | count as u64)
    }

    /// The page.
    #[inline(always)]
    pub fn page(self) -> u32 {
        (self.0 >> 8) as u32
    }

    /// Slots reserved (0 for [`Grant::NONE`]).
    #[inline(always)]
    pub fn count(self) -> u32 {
        (self.0 & 0xFF) as u32
    }

    /// `Some((page, count))`, `None` for [`Grant::NONE`].
    #[inline(always)]
    pub fn get(self) -> Option<(u32, u32)> {
        if self.0 == 0 {
            None
        } else {
            Some((self.page(), self.count()))
        }
    }
}

/// The warp's search hint (a spread only: any value is correct), computed
/// where it is used rather than kept live (DESIGN.md §4.1). 0 in the model
/// checkers, which run outside a launch.
#[inline(always)]
pub(crate) fn warp_hint() -> u32 {
    #[cfg(not(any(loom, shuttle)))]
    return super::hash32(crate::arch::index::global_warp_id_reread() as u32);
    #[cfg(any(loom, shuttle))]
    return 0;
}

/// The class's available-page bitmap.
#[inline(always)]
pub(crate) fn avail<M: HeapMem>(m: &M, class: u32) -> Hb {
    Hb { section: MetaSection32::Avail, off: class * m.avail_stride(), n: m.pages() }
}

/// The `current` entry of `class` and `slot` (its own 32-byte sector).
#[inline(always)]
fn current<M: HeapMem>(m: &M, class: u32, slot: u32) -> &GlobalU32 {
    m.word32(MetaSection32::Current, ((class * CURRENT_SLOTS + slot) * CURRENT_STRIDE) as u64)
}

#[inline(always)]
fn hdr<M: HeapMem>(m: &M, page: u32) -> &crate::arch::atomic::GlobalU64 {
    m.word(MetaSection::Hdr, page as u64)
}

/// What a reservation ([`reserve`]) got and what the caller must do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reserved {
    /// Slots reserved (0..=need).
    pub got: u32,
    /// They were the page's last free slots: drop the page from the
    /// available bitmap ([`recheck_avail`]).
    pub full: bool,
    /// Giving back an over-reservation made the page leave "full": its
    /// available bit must be set ([`recheck_avail`] with `force`).
    pub left_full: bool,
    /// Giving back an over-reservation emptied the page: the caller owns
    /// its emptiness ([`retire_if_empty`]).
    pub emptied: bool,
}

/// Reserves up to `need` slots of class `class` on `page` (see
/// [`Reserved`]).
#[inline(always)]
pub(crate) fn reserve<M: HeapMem>(m: &M, page: u32, class: u32, need: u32) -> Reserved {
    let hdr = hdr(m, page);
    let slots = class_slots(class);
    let mut r = Reserved { got: 0, full: false, left_full: false, emptied: false };
    // A plain look first avoids stray reservations on pages that are
    // obviously full or of another class.
    let h = hdr.load(Ordering::Relaxed);
    if hdr_class(h) != Some(class) || hdr_used(h) >= slots {
        return r;
    }
    let old = hdr.fetch_add(need as u64, Ordering::Relaxed);
    let used = hdr_used(old);
    r.got = if hdr_class(old) == Some(class) && used < slots { need.min(slots - used) } else { 0 };
    if r.got < need {
        let excess = need - r.got;
        // `Relaxed`: the give-back releases nothing (the page's history
        // travels in the release sequence of its frees, which this RMW
        // continues).
        let old2 = hdr.fetch_sub(excess as u64, Ordering::Relaxed);
        (r.left_full, r.emptied) = after_release(old2, excess);
    }
    r.full = r.got > 0 && used + r.got >= slots;
    r
}

/// Clears `page`'s bit in `class`'s available bitmap, then re-checks the
/// header and sets the bit back if the page has a free slot (a free that
/// made it non-full between must not be lost: see the ordering table).
/// Bracketed as a transit while the bit may be wrongly clear. Without
/// `force` (dropping a page that looked full) nothing is done, and no mark
/// taken, when the bit is clear already; with it (a page that left "full",
/// or was just formatted) the bit ends set whenever the page has room.
#[inline(always)]
pub(crate) fn recheck_avail<M: HeapMem>(m: &M, page: u32, class: u32, force: bool) {
    let av = avail(m, class);
    if !force && !av.get(m, page) {
        return;
    }
    let s = transit::shard();
    transit::begin(m, s);
    let (was_set, restored) = av.clear(m, page, Ordering::Acquire);
    let h = hdr(m, page).load(Ordering::Relaxed);
    let back = (was_set || force) && hdr_class(h) == Some(class) && hdr_used(h) < class_slots(class);
    if back {
        av.set(m, page);
    }
    if back || restored {
        transit::end(m, s);
    } else {
        transit::cancel(m, s);
    }
}

/// What a decrement of `n` from a header whose previous value was `old`
/// leaves to do: whether the page left "full" (its available bit must be
/// set) and whether its `used` reached 0 (the decrementer then owns the
/// page's emptiness: [`retire_if_empty`]).
#[inline(always)]
pub(crate) fn after_release(old: u64, n: u32) -> (bool, bool) {
    let Some(class) = hdr_class(old) else { return (false, false) };
    let used = hdr_used(old);
    let now = used.wrapping_sub(n);
    (used >= class_slots(class) && now < class_slots(class), now == 0)
}

/// Retires `page` if it is (still) an empty slab page, unless `keep_current`
/// and it is its slot's current page: then it is kept formatted and counted
/// for `scavenge` (`CTRL_KEPT`). Returns whether it went back to the buddy.
/// The header load is the acquire that pairs with `install`'s release (see
/// the ordering table), and its value is the header retired.
#[inline(always)]
pub(crate) fn retire_if_empty<M: HeapMem>(m: &M, page: u32, keep_current: bool) -> bool {
    let h = hdr(m, page).load(Ordering::Acquire);
    let Some(c) = hdr_class(h) else { return false };
    if hdr_used(h) != 0 {
        return false;
    }
    if keep_current && current(m, c, hdr_slot(h)).load(Ordering::Relaxed) == page + 1 {
        m.word(MetaSection::Ctrl, CTRL_KEPT as u64).fetch_add(nonuniform_one() as u64, Ordering::Release);
        return false;
    }
    retire(m, page, h)
}

/// Returns the empty page whose header is exactly `h` to the buddy; `false`
/// when the header changed (someone reserved, or it was retired already).
#[inline(always)]
pub(crate) fn retire<M: HeapMem>(m: &M, page: u32, h: u64) -> bool {
    let Some(class) = hdr_class(h) else { return false };
    if hdr_used(h) != 0 {
        return false;
    }
    let new = ((hdr_gen(h) as u64 + 1) & 0xF_FFFF) << GEN_SHIFT;
    // Between the CAS and the buddy free the page is in neither place.
    let s = transit::shard();
    transit::begin(m, s);
    if hdr(m, page).compare_exchange(h, new, Ordering::Acquire).is_ok() {
        avail(m, class).clear(m, page, Ordering::Relaxed);
        buddy::free_marked(m, page << PAGE_ORDER, PAGE_ORDER);
        transit::end(m, s);
        true
    } else {
        transit::cancel(m, s);
        false
    }
}

/// Formats a page just taken from the buddy for `class`, with `reserve`
/// slots already reserved for the caller. An RMW, not a store, so that
/// stray reservations in flight on the unformatted header stay balanced.
/// The caller then publishes the page ([`recheck_avail`] with `force`: the
/// bit is set when slots are left) before it ends the page's transit.
#[inline(always)]
pub(crate) fn format<M: HeapMem>(m: &M, page: u32, class: u32, slot: u32, reserve: u32) {
    let delta = reserve as u64
        + (((class + 1) as u64) << CLASS_SHIFT)
        + ((slot as u64 & 0xFF) << SLOT_SHIFT)
        + (1u64 << GEN_SHIFT);
    hdr(m, page).fetch_add(delta, Ordering::Relaxed);
}

/// Entry `i` of the `current` table (class `i / CURRENT_SLOTS`): its page if
/// that is an empty page of the entry's class, else `NO_PAGE`. The scan of
/// `scavenge` (a phase of [`acquire`], one entry per step), which retires
/// every empty current page when the buddy is exhausted. It runs only when
/// some page was kept since the last scan (`CTRL_KEPT`), so a heap that is
/// really full fails fast; the scan's `swap` of `CTRL_KEPT` reads from the
/// increment of every keep it resets, whose header RMW therefore
/// happens-before the scan's loads.
#[inline(always)]
fn scavenge_entry<M: HeapMem>(m: &M, i: u32) -> u32 {
    let v = m.word32(MetaSection32::Current, (i * CURRENT_STRIDE) as u64).load(Ordering::Relaxed);
    if v != 0 && v != REFILLING {
        let h = hdr(m, v - 1).load(Ordering::Relaxed);
        if hdr_class(h) == Some(i / CURRENT_SLOTS) && hdr_used(h) == 0 {
            return v - 1;
        }
    }
    NO_PAGE
}

/// No page (a `u32` page index that is never valid: pages are fewer than
/// 2^28).
const NO_PAGE: u32 = u32::MAX;

/// Host-side: retires every empty current page, as a failing `acquire`'s
/// scavenge does (tests use it to check that everything went back).
#[cfg(not(target_arch = "nvptx64"))]
#[cfg_attr(any(not(test), loom), allow(dead_code))] // used by the unit tests
pub(crate) fn scavenge_all<M: HeapMem>(m: &M) {
    for i in 0..CLASSES * CURRENT_SLOTS {
        let page = scavenge_entry(m, i);
        if page != NO_PAGE {
            retire_if_empty(m, page, false);
        }
    }
}

/// The request of an `acquire` for a large block of buddy order `k`:
/// `LARGE + k` (slab classes are `0..CLASSES`).
pub const LARGE: u32 = 16;

/// The allocator's one search loop. For a slab class (`req < CLASSES`):
/// reserves up to `need` (1..=32) slots of class `req` for the caller,
/// through the current page of `slot`, the available pages, or a fresh page,
/// and returns the page and the count. For a large block (`req = LARGE +
/// k`, `need = 1`): takes a buddy block of order `k` and returns its first
/// unit as the grant's page. `Err(e)` when the heap cannot provide any:
/// [`failure_searches`]`(e)` searches made (0 for an order the heap can
/// never hold) and [`failure_waits`]`(e)` waits for the slot's refiller, for
/// the heap's statistics.
///
/// A warp that finds its slot `REFILLING` waits for the refiller at most
/// [`REFILL_WAITS`] times, probing the available pages between waits, then
/// searches on its own. A large request takes no snapshot before its first
/// search (a success needs none); a first search that fails is followed by
/// a snapshot and a second, checked one.
///
/// A failure is final only after a *search* (for a class: the available
/// pages, then a fresh page from the buddy; for a large block: one pass
/// over the buddy levels) around which the transit counter
/// ([`super::transit`]) was quiet: no operation that can hide a free slot
/// or block was in flight at its end and none completed since its start;
/// otherwise the search is repeated, at most [`FINAL_SCANS`] times. Every
/// operation that can hide a free slot or block from a search is bracketed
/// by the counter: a buddy split or merge, a page between the buddy and its
/// format, a page between its retirement and the buddy ([`retire`],
/// the scavenge), a page whose available bit is cleared and re-checked
/// ([`recheck_avail`]), a summary bit cleared and re-checked.
///
/// One loop whose steps each have one site (the current-page read, the
/// available bitmap's search, the reservation, the refill's claim of the
/// slot, the buddy's claim, the format, the scavenge, the install), so that
/// everything it calls is inlined once and only its few counters are live
/// across the steps (DESIGN.md §4.1).
#[inline(always)]
pub(crate) fn acquire<M: HeapMem>(m: &M, req: u32, slot: u32, need: u32) -> Result<Grant, u32> {
    const CUR: u32 = 0;
    const START: u32 = 1;
    const PROBE: u32 = 2;
    const FRESH: u32 = 3;
    const SCAV: u32 = 4;
    const SCAV_END: u32 = CLASSES * CURRENT_SLOTS;
    const SCAV_ANY: u32 = 1 << 31;
    if req >= LARGE && req - LARGE > m.max_order() {
        return Err(0);
    }
    // A large request searches at once, without a snapshot (`t0`).
    let mut phase = if req < CLASSES { CUR } else { FRESH };
    // Current-page attempts (low byte); `ACQUIRE_ATTEMPTS` once we search
    // for a page of our own (we refill the slot, or its refiller is slow).
    // Above it, the waits for the slot's refiller (`WAIT_SHIFT`).
    let mut attempt = 0u32;
    // The available-bitmap probes of this search; in the scavenge, the
    // entry to scan next, with `SCAV_ANY` once a page went back.
    let mut probe = 0;
    // Searches that failed (the last one is the final scan).
    let mut scan = 0;
    // `old + 1` of the slot's entry we replaced with `REFILLING` (0: we are
    // not refilling; `old` is never `REFILLING`, so this does not wrap).
    let mut refill = 0u32;
    let mut t0 = transit::NO_SNAPSHOT;
    loop {
        // Through the barrier, so that what is derived from them (the
        // `current` entry's address, the slot count, the bitmap's offset) is
        // computed in the step that uses it, not once and kept live across
        // the loop (DESIGN.md §4.1).
        let (req, slot, need) = (opaque_u32(req), opaque_u32(slot), opaque_u32(need));
        let slab = req < CLASSES;
        // What this step hands to the tail: a page whose emptiness it owns
        // (retired there: the one retire site), the grant, a failed search.
        let mut ret = NO_PAGE;
        let mut keep_current = true;
        // A page whose available bit the tail re-checks (the one site of
        // the available bitmap's set): `force` for a page that left "full"
        // or was just formatted; `fresh` when the tail also ends the fresh
        // page's transit (after the bit is set).
        let mut fix = NO_PAGE;
        let mut force = false;
        let mut fresh = false;
        let mut r = Grant::NONE;
        let mut failed = false;
        let mut start = false;
        'step: {
            if phase == SCAV {
                if probe & !SCAV_ANY != SCAV_END {
                    ret = scavenge_entry(m, probe & !SCAV_ANY);
                    keep_current = false;
                    probe += 1;
                    break 'step;
                }
                // The scavenge is over: search again if a page went back
                // (its retirement completed a transit), else this search
                // failed, and it fails below like any other: through the
                // end of the refill, so that no path out of a search
                // leaves the slot `REFILLING`.
                if probe & SCAV_ANY != 0 {
                    transit::end(m, transit::shard_of(slot));
                    scan += 1;
                    phase = START;
                    break 'step;
                }
                transit::cancel(m, transit::shard_of(slot));
            }
            if phase == START {
                // A search begins: the snapshot it is checked against is
                // taken (in the tail) right before it.
                probe = 0;
                phase = if slab { PROBE } else { FRESH };
                start = true;
                break 'step;
            }
            let mut page = NO_PAGE;
            let mut from_current = false;
            if phase == CUR {
                let v = current(m, req, slot).load(Ordering::Relaxed);
                if v == REFILLING {
                    // Another warp refills this slot: use any page with
                    // room, else wait a little.
                    phase = PROBE;
                } else if v != 0 {
                    page = v - 1;
                    from_current = true;
                }
            }
            if phase == PROBE {
                if probe < AVAIL_PROBES {
                    match avail(m, req).find(m, warp_hint().wrapping_add(probe.wrapping_mul(0x9E37_79B9))) {
                        Some(p) => page = p,
                        None => probe = AVAIL_PROBES,
                    }
                }
                if page == NO_PAGE {
                    if attempt & ATTEMPTS_MASK == ACQUIRE_ATTEMPTS {
                        phase = FRESH;
                    } else {
                        // A wait for the slot's refiller: counted, and
                        // bounded (then the warp searches on its own).
                        let waits = attempt >> WAIT_SHIFT;
                        m.word(MetaSection::Ctrl, CTRL_REFILL_WAITS as u64).fetch_add(need as u64, Ordering::Relaxed);
                        backoff(waits.min(5));
                        attempt += 1 << WAIT_SHIFT;
                        probe = 0;
                        phase = CUR;
                        if waits + 1 == REFILL_WAITS {
                            attempt = (attempt & !ATTEMPTS_MASK) | ACQUIRE_ATTEMPTS;
                            phase = START;
                        }
                        break 'step;
                    }
                }
            }
            if page != NO_PAGE {
                let got = reserve(m, page, req, need);
                if got.emptied {
                    ret = page;
                }
                if got.full || got.left_full || (got.got == 0 && !from_current) {
                    // Took its last slot, or full or recycled: drop the
                    // hint; or left "full": publish it.
                    fix = page;
                    force = got.left_full;
                }
                if got.got > 0 {
                    r = Grant::new(page, got.got);
                } else if !from_current {
                    probe += 1;
                    break 'step;
                }
            }
            if r == Grant::NONE && phase == CUR {
                // The slot is empty, or its page is full: take over its
                // refill.
                let v = if from_current { page + 1 } else { 0 };
                if current(m, req, slot).compare_exchange(v, REFILLING, Ordering::Relaxed).is_ok() {
                    refill = v + 1;
                    attempt = (attempt & !ATTEMPTS_MASK) | ACQUIRE_ATTEMPTS;
                } else {
                    attempt += 1;
                }
                if attempt & ATTEMPTS_MASK == ACQUIRE_ATTEMPTS {
                    phase = START;
                }
                break 'step;
            }
            if phase == FRESH {
                // A block from the buddy: a page for the class (marked in
                // transit from its claim until `format` publishes it), or
                // the large block itself.
                let k = if slab { PAGE_ORDER } else { req - LARGE };
                let hint = warp_hint().wrapping_add(crate::arch::index::lane_id());
                if let Some(unit) = buddy::take(m, k, hint, transit::shard_of(slot)) {
                    if slab {
                        let page = unit >> PAGE_ORDER;
                        let got = need.min(class_slots(req));
                        format(m, page, req, slot, got);
                        r = Grant::new(page, got);
                        // Published by the tail, which then ends the
                        // claim's mark.
                        (fix, force, fresh) = (page, true, true);
                    } else {
                        // The block is handed out: the claim's mark ends.
                        r = Grant::new(unit, 1);
                        transit::end(m, transit::shard_of(slot));
                    }
                } else if scan < FINAL_SCANS {
                    // The buddy is exhausted: retire the empty current
                    // pages if some were kept. From the swap until the scan
                    // has retired them they are neither findable by their
                    // count nor back in the buddy: a transit.
                    let kept = m.word(MetaSection::Ctrl, CTRL_KEPT as u64);
                    if kept.load(Ordering::Relaxed) != 0 {
                        transit::begin(m, transit::shard_of(slot));
                        if kept.swap(0, Ordering::Acquire) != 0 {
                            phase = SCAV;
                            probe = 0;
                            break 'step;
                        }
                        transit::cancel(m, transit::shard_of(slot));
                    }
                }
            }
            // A grant, or a failed search.
            if refill != 0 {
                ret = install(m, req, slot, r, refill - 1);
                refill = 0;
            }
            failed = r == Grant::NONE;
        }
        // The tail: the one site of the available bit's re-check, the end
        // of a fresh page's transit (after its bit is set), the one retire
        // site, then the answer.
        if fix != NO_PAGE {
            recheck_avail(m, fix, req, force);
        }
        if fresh {
            transit::end(m, transit::shard_of(slot));
        }
        if ret != NO_PAGE && retire_if_empty(m, ret, keep_current) {
            probe |= SCAV_ANY;
        }
        if r != Grant::NONE {
            if slab && phase != CUR {
                // Not the slot's current page: the slow path (a refill, a
                // page from the available bitmap, a private page).
                m.word(MetaSection::Ctrl, (CTRL_SLOW_GRANTS as u32 + req) as u64).fetch_add(1, Ordering::Relaxed);
            }
            return Ok(r);
        }
        if start || failed {
            // The one snapshot site: before a search, and after a failed
            // one (where it is also the next search's start).
            let t1 = transit::snapshot(m);
            if failed {
                // Every failed search ended a refill it held (the install
                // before `failed` is set), so a null never leaves its slot
                // `REFILLING` (the recovery property).
                debug_assert_eq!(refill, 0);
                if transit::quiet(t0, t1) || scan == FINAL_SCANS {
                    return Err((scan + 1) | (attempt >> WAIT_SHIFT) << ERR_WAIT_SHIFT);
                }
                if t0 != transit::NO_SNAPSHOT {
                    // (A large request's unchecked first search is
                    // checked at once.)
                    backoff(scan.min(6));
                }
                scan += 1;
                probe = 0;
                phase = if slab { PROBE } else { FRESH };
            }
            t0 = t1;
        }
    }
}

/// The end of a slot's refill (`current` holds [`REFILLING`], set by the
/// caller; `old` was the entry before): installs the page of `r` (none: 0).
/// Returns the page it un-installed (`NO_PAGE` if none): it may have
/// emptied while it was current, so the caller owns its emptiness
/// ([`retire_if_empty`]). The header RMW's release pairs with the freer's
/// acquire in `retire_if_empty`.
#[inline(always)]
pub(crate) fn install<M: HeapMem>(m: &M, class: u32, slot: u32, r: Grant, old: u32) -> u32 {
    let new = match r.get() {
        Some((page, _)) => page + 1,
        None => 0,
    };
    current(m, class, slot).store(new, Ordering::Relaxed);
    if old != 0 && old != new {
        hdr(m, old - 1).fetch_or(0, Ordering::Release);
        return old - 1;
    }
    NO_PAGE
}

/// Claims up to `want` (>= 1) reserved slots on `page` (class `class`),
/// scanning from word `*cursor`: returns the word index and the bits
/// obtained (at least one). The claim is an `Acquire` RMW: it reads from
/// the release sequence of the previous owners' frees. Updates `*cursor`.
///
/// Lock-free, not bounded: the reservation guarantees at least `want`
/// clear bits in the page at every moment (`used >= set bits`, and the
/// caller's reservation is counted in `used`), so a pass that finds none
/// or loses a word's bits means other claimers took bits in between, each
/// of them for a reservation of its own.
#[inline(always)]
pub(crate) fn claim_bits<M: HeapMem>(m: &M, page: u32, class: u32, cursor: &mut u32, want: u32) -> (u32, u32) {
    let words = class_words(class);
    let slots = class_slots(class);
    let valid = if slots >= WORD_BITS { u32::MAX } else { (1u32 << slots) - 1 };
    loop {
        let idx = *cursor % words;
        let word = m.word32(MetaSection32::Bits, page as u64 * WORDS_PER_PAGE + idx as u64);
        let v = word.load(Ordering::Relaxed);
        let mut free = !v & valid;
        if free != 0 {
            let mut take = 0u32;
            let mut k = 0;
            while k < want && free != 0 {
                let low = free & free.wrapping_neg();
                take |= low;
                free ^= low;
                // Through the barrier: not unrolled (DESIGN.md §4.1).
                k = opaque_u32(k + 1);
            }
            let old = word.fetch_or(take, Ordering::Acquire);
            let got = take & !old;
            if got != 0 {
                *cursor = idx;
                return (idx, got);
            }
        } else {
            *cursor = idx + 1;
        }
    }
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
/// (a slab page of some class). The bitmap `fetch_and` releases the slot's
/// payload to its next owner, the header `fetch_sub` the page's to whoever
/// retires it.
#[inline(always)]
pub(crate) fn free_slot<M: HeapMem>(m: &M, page: u32, h: u64, off_in_page: u32) -> SlotFree {
    let Some(class) = hdr_class(h) else { return SlotFree::Invalid };
    let size_shift = MIN_CLASS_SHIFT + class;
    if off_in_page & ((1 << size_shift) - 1) != 0 {
        return SlotFree::Invalid;
    }
    let slot = off_in_page >> size_shift;
    let bit = 1u32 << (slot % WORD_BITS);
    let old = m
        .word32(MetaSection32::Bits, page as u64 * WORDS_PER_PAGE + (slot / WORD_BITS) as u64)
        .fetch_and(!bit, Ordering::Release);
    if old & bit == 0 {
        return SlotFree::Double;
    }
    let old_h = hdr(m, page).fetch_sub(1, Ordering::Release);
    let (left_full, emptied) = after_release(old_h, 1);
    if left_full {
        avail(m, class).set(m, page);
    }
    if emptied {
        retire_if_empty(m, page, true);
    }
    SlotFree::Freed
}
