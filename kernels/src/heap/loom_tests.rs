//! Model checking of the heap's protocols with loom (every interleaving, C11
//! weak memory within loom's limits) on tiny heaps.
//!
//! ```text
//! CARGO_TARGET_DIR=target/loom RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 \
//!     cargo test -p gpuheap-kernels --release --lib heap::loom_tests
//! ```
//!
//! Each model builds a [`VecHeap`] (loom atomics cannot be made from raw
//! pointers), runs 2–3 threads over one protocol core with exactly the
//! orderings the device uses, and checks the final state against the
//! sequential model: no slot or block handed out twice, nothing lost (the
//! buddy is fully merged when everything is free), summaries exact, no
//! transit left open, and, for the null guarantee, no spurious null and no
//! more than one search per null on an exhausted heap.

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;

use super::init::VecHeap;
use super::layout::*;
use super::{bitmap::Hb, buddy, init, slab, transit};
use crate::arch::atomic::Ordering;

const BASE: u64 = 1 << 40;

fn new_heap(bytes: u64) -> Arc<VecHeap> {
    Arc::new(VecHeap::new(bytes, BASE).unwrap())
}

/// A buddy block of order `k` through the allocator's one search loop (the
/// large-request path of `slab::acquire`): its first unit, or the null's
/// error (its searches: `slab::failure_searches`).
fn alloc_block(h: &VecHeap, k: u32) -> Result<u32, u32> {
    slab::acquire(h, slab::LARGE + k, 0, 1).map(|g| g.page())
}

fn fresh_blocks(h: &VecHeap) -> std::vec::Vec<(u64, u32)> {
    // The decomposition `init` produces, computed on the side.
    let mut v = std::vec::Vec::new();
    let g = h.heap;
    let mut u = 0;
    while u < g.units {
        let mut k = g.max_order as u32;
        while k > 0 && (u % (1 << k) != 0 || u + (1 << k) > g.units) {
            k -= 1;
        }
        v.push((u, k));
        u += 1 << k;
    }
    let _ = init::init::<VecHeap>;
    v
}

fn check_all_summaries(h: &VecHeap) {
    for k in 0..=h.heap.max_order as u32 {
        buddy::level(h, k).check_summary(h).expect("buddy summary exact");
    }
    for c in 0..CLASSES {
        slab::avail(h, c).check_summary(h).expect("avail summary exact");
    }
}

fn current_entry(class: u32, slot: u32) -> u64 {
    ((class * CURRENT_SLOTS + slot) * CURRENT_STRIDE) as u64
}

/// Summary bits: an emptying clear races with a set in the same leaf word;
/// at the end the set bit must be reachable from the top (the parent
/// `fetch_or` release against the clearer's parent `fetch_and` acquire).
#[test]
fn bitmap_clear_vs_set_keeps_summary_exact() {
    loom::model(|| {
        let h = new_heap(64 * UNIT); // level 0 has 64 bits: 2 leaf words + 1 summary word
        let hb = buddy::level(&*h, 0);
        // Start from a clean slate at level 0: only bit 3 set.
        for b in 0..64 {
            hb.clear(&*h, b, Ordering::Relaxed);
        }
        hb.set(&*h, 3);
        let h1 = h.clone();
        let t = thread::spawn(move || {
            let hb = buddy::level(&*h1, 0);
            assert!(hb.clear(&*h1, 3, Ordering::Relaxed).0);
        });
        let hb2 = buddy::level(&*h, 0);
        hb2.set(&*h, 9);
        t.join().unwrap();
        hb2.check_summary(&*h).unwrap();
        assert_eq!(hb2.find(&*h, 0), Some(9));
    });
}

/// Two claimers of the only set bit: exactly one wins.
#[test]
fn bitmap_claim_is_exclusive() {
    loom::model(|| {
        let h = new_heap(32 * UNIT);
        let hb = Hb { section: MetaSection32::Buddy, off: buddy::level(&*h, 0).off, n: 32 };
        hb.set(&*h, 17);
        let h1 = h.clone();
        let t = thread::spawn(move || hb.claim(&*h1, 5).0);
        let mine = hb.claim(&*h, 40).0;
        let theirs = t.join().unwrap();
        assert_eq!(mine.is_some() as u32 + theirs.is_some() as u32, 1, "{mine:?} {theirs:?}");
        assert_eq!(mine.or(theirs), Some(17));
    });
}

/// Buddy split under contention (BL-10(a) in miniature): two threads each
/// want one unit of a heap that starts as one 2-unit block. Both must
/// succeed (the transit mark held around the split keeps the loser of the
/// split race from reporting out-of-memory) with distinct units; freeing
/// both merges back, and no transit is left open.
#[test]
fn buddy_concurrent_split_never_fails_spuriously() {
    loom::model(|| {
        let h = new_heap(2 * UNIT);
        let h1 = h.clone();
        let t = thread::spawn(move || alloc_block(&h1, 0));
        let a = alloc_block(&h, 0);
        let b = t.join().unwrap();
        let (a, b) = (a.expect("first unit"), b.expect("second unit"));
        assert_ne!(a, b);
        let h2 = h.clone();
        let t = thread::spawn(move || buddy::free(&*h2, b, 0));
        buddy::free(&*h, a, 0);
        t.join().unwrap();
        assert_eq!(buddy::free_blocks(&*h), fresh_blocks(&h));
        assert_eq!(transit::in_flight(&*h), 0, "no transit left open");
        check_all_summaries(&h);
    });
}

/// Concurrent frees of two buddies always merge (one CAS decides).
#[test]
fn buddy_concurrent_frees_merge() {
    loom::model(|| {
        let h = new_heap(4 * UNIT);
        let a = alloc_block(&h, 0).unwrap();
        let b = alloc_block(&h, 0).unwrap();
        assert_eq!((a, b), (0, 1));
        let h1 = h.clone();
        let t = thread::spawn(move || buddy::free(&*h1, 1, 0));
        buddy::free(&*h, 0, 0);
        t.join().unwrap();
        assert_eq!(buddy::free_blocks(&*h), [(0, 2)]);
        check_all_summaries(&h);
    });
}

/// A large allocation racing a merge: it always finds the unit (one is free
/// at every moment), through the merge's transit mark.
#[test]
fn buddy_alloc_during_merge_sees_the_memory() {
    loom::model(|| {
        let h = new_heap(2 * UNIT);
        let a = alloc_block(&h, 0).unwrap();
        let b = alloc_block(&h, 0).unwrap();
        buddy::free(&*h, b, 0);
        let h1 = h.clone();
        let t = thread::spawn(move || alloc_block(&h1, 0));
        buddy::free(&*h, a, 0);
        let got = t.join().unwrap();
        assert!(got.is_ok(), "one unit is free at every moment");
        buddy::free(&*h, got.unwrap(), 0);
        assert_eq!(buddy::free_blocks(&*h), [(0, 1)]);
    });
}

/// The out-of-memory path (item: a null as fast as a success): on an
/// exhausted heap, concurrent failing requests make no claim, hold no
/// transit mark, and so each returns null after exactly one search,
/// whatever the interleaving (a failed claim would otherwise keep the other
/// searcher's check from ever being quiet).
#[test]
fn failing_searches_hold_no_mark_and_search_once() {
    loom::model(|| {
        let h = new_heap(UNIT);
        assert_eq!(alloc_block(&h, 0), Ok(0));
        let h1 = h.clone();
        let t = thread::spawn(move || alloc_block(&h1, 0));
        let mine = alloc_block(&h, 0);
        let theirs = t.join().unwrap();
        // A large request's first search takes no snapshot (a success
        // needs none), so its null is that search plus one checked search.
        let searches = (mine.map_err(slab::failure_searches), theirs.map_err(slab::failure_searches));
        assert_eq!(searches, (Err(2), Err(2)), "two searches per large null");
        assert_eq!(transit::in_flight(&*h), 0);
    });
}

/// Slab: two threads each reserve, claim and free a slot of a 16-slot page
/// while a third frees the page's last pre-existing slot. Slots are never
/// shared, and the payload a freer wrote happens-before the next owner's
/// access (the free's bitmap `fetch_and` release, the claim's `fetch_or`
/// acquire; the reservation itself is relaxed): loom reports a data race on
/// the slot's payload cell otherwise. At the end the page is retired (not
/// current) and the buddy is whole again.
#[test]
fn slab_claim_free_and_retire() {
    // Three threads with a retirement at the end: two preemptions keep the
    // model to seconds (three take minutes) and still interleave each
    // reservation with the last free.
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(2);
    model.check(|| {
        let h = new_heap(2 * PAGE);
        let class = CLASSES - 1; // 4 KiB slots, 16 per page, one bitmap word
        let payload: Arc<std::vec::Vec<UnsafeCell<u32>>> =
            Arc::new((0..class_slots(class)).map(|_| UnsafeCell::new(0)).collect());
        // Carve a page (slot 0 of `current`, then un-install it so that
        // emptying retires it).
        let (page, got) = slab::acquire(&*h, class, 0, 1).unwrap().get().unwrap();
        assert_eq!(got, 1);
        let mut cur = 0;
        let (w0, b0) = slab::claim_bits(&*h, page, class, &mut cur, 1);
        h.word32(MetaSection32::Current, current_entry(class, 0)).store(0, Ordering::Relaxed);
        let first = w0 * 32 + b0.trailing_zeros();
        // SAFETY: (all payload accesses) the slot is owned by this thread
        // between its claim and its free, which loom checks.
        payload[first as usize].with_mut(|p| unsafe { *p = 1 });

        let worker = |h: Arc<VecHeap>, payload: Arc<std::vec::Vec<UnsafeCell<u32>>>, hint: u32| {
            move || {
                let r = slab::reserve(&*h, page, class, 1);
                if r.emptied {
                    slab::retire_if_empty(&*h, page, true);
                }
                if r.got == 0 {
                    return None; // the page was retired under us: allowed
                }
                let mut cur = hint;
                let (w, bits) = slab::claim_bits(&*h, page, class, &mut cur, 1);
                assert_eq!(bits.count_ones(), 1);
                let slot = w * 32 + bits.trailing_zeros();
                payload[slot as usize].with_mut(|p| unsafe { *p += 1 });
                let hdr = h.word(MetaSection::Hdr, page as u64).load(Ordering::Relaxed);
                assert_eq!(slab::free_slot(&*h, page, hdr, slot * class_size(class) as u32), slab::SlotFree::Freed);
                Some(slot)
            }
        };
        let t1 = thread::spawn(worker(h.clone(), payload.clone(), 0));
        let t2 = thread::spawn(worker(h.clone(), payload.clone(), 0));
        let hdr = h.word(MetaSection::Hdr, page as u64).load(Ordering::Relaxed);
        assert_eq!(slab::free_slot(&*h, page, hdr, first * class_size(class) as u32), slab::SlotFree::Freed);
        let _ = (t1.join().unwrap(), t2.join().unwrap());
        // Everything was freed: the page must be back in the buddy.
        let hdr = h.word(MetaSection::Hdr, page as u64).load(Ordering::Relaxed);
        assert_eq!(slab::hdr_class(hdr), None, "empty page retired");
        assert_eq!(buddy::free_blocks(&*h), fresh_blocks(&h));
        assert_eq!(transit::in_flight(&*h), 0);
    });
}

/// Takes a page of `class` from the buddy, claims one slot of it and clears
/// the class's current-page slot, so the next free of that slot retires the
/// page. Returns the page and the slot's byte offset in it.
fn one_slot_in_a_non_current_page(h: &VecHeap, class: u32) -> (u32, u32) {
    let (page, _) = slab::acquire(h, class, 0, 1).unwrap().get().unwrap();
    let mut cur = 0;
    let (w0, b0) = slab::claim_bits(h, page, class, &mut cur, 1);
    h.word32(MetaSection32::Current, current_entry(class, 0)).store(0, Ordering::Relaxed);
    (page, (w0 * 32 + b0.trailing_zeros()) * class_size(class) as u32)
}

/// Recycle race (BL-10, kokkos#452): the last free of a page races with a
/// new reservation. Either the reservation wins (the page stays formatted and
/// holds exactly that slot) or the retire wins (the reservation gets 0 and
/// the page is in the buddy); never both.
#[test]
fn slab_reservation_vs_retire_is_exclusive() {
    loom::model(|| {
        let h = new_heap(PAGE);
        let class = CLASSES - 1;
        let (page, off) = one_slot_in_a_non_current_page(&h, class);
        let h1 = h.clone();
        let t = thread::spawn(move || {
            let r = slab::reserve(&*h1, page, class, 1);
            if r.emptied {
                slab::retire_if_empty(&*h1, page, true);
            }
            r.got
        });
        let hdr = h.word(MetaSection::Hdr, page as u64).load(Ordering::Relaxed);
        assert_eq!(slab::free_slot(&*h, page, hdr, off), slab::SlotFree::Freed);
        let got = t.join().unwrap();
        let hdr = h.word(MetaSection::Hdr, page as u64).load(Ordering::Relaxed);
        let in_buddy = !buddy::free_blocks(&*h).is_empty();
        if got == 1 {
            assert_eq!((slab::hdr_class(hdr), slab::hdr_used(hdr), in_buddy), (Some(class), 1, false));
        } else {
            assert_eq!((slab::hdr_class(hdr), in_buddy), (None, true));
        }
    });
}

/// Slab transit, format side (BL-26 in miniature): two warps of one class on
/// a fresh one-page heap, through different current-page slots. The first
/// takes the only page from the buddy; until its format publishes the page in
/// the available bitmap the page is in neither place. The second must not
/// return null meanwhile: the claim's transit mark (held until the format)
/// makes its final scan retry. Both get a distinct slot of the same page.
#[test]
fn slab_acquire_during_page_format_never_fails_spuriously() {
    loom::model(|| {
        let h = new_heap(PAGE);
        let class = CLASSES - 1; // 16 slots of 4 KiB
        let h1 = h.clone();
        let t = thread::spawn(move || slab::acquire(&*h1, class, 1, 1).ok().and_then(|g| g.get()));
        let mine = slab::acquire(&*h, class, 0, 1).ok().and_then(|g| g.get());
        let theirs = t.join().unwrap();
        let (p0, n0) = mine.expect("first reservation: one page of 16 slots is free");
        let (p1, n1) = theirs.expect("second reservation: 15 slots left (no spurious null)");
        assert_eq!((p0, p1, n0, n1), (0, 0, 1, 1));
        let hdr = h.word(MetaSection::Hdr, 0).load(Ordering::Relaxed);
        assert_eq!((slab::hdr_class(hdr), slab::hdr_used(hdr)), (Some(class), 2));
        assert_eq!(transit::in_flight(&*h), 0, "no transit left open");
        check_all_summaries(&h);
    });
}

/// Slab transit, retire side: the last free of a (non-current) page retires
/// it (header CAS, available bit cleared, buddy free) while another warp of
/// the same class asks for a slot. Between the CAS and the buddy free the
/// page is neither a slab page nor free in the buddy; the retire's transit
/// bracket makes the searcher's final scan retry instead of returning null.
/// The searcher gets a slot of the page in either incarnation.
#[test]
fn slab_acquire_during_retire_never_fails_spuriously() {
    loom::model(|| {
        let h = new_heap(PAGE);
        let class = CLASSES - 1;
        let (page, off) = one_slot_in_a_non_current_page(&h, class);
        let h1 = h.clone();
        let t = thread::spawn(move || {
            let hdr = h1.word(MetaSection::Hdr, page as u64).load(Ordering::Relaxed);
            assert_eq!(slab::free_slot(&*h1, page, hdr, off), slab::SlotFree::Freed);
        });
        let got = slab::acquire(&*h, class, 1, 1).ok().and_then(|g| g.get());
        t.join().unwrap();
        assert_eq!(got, Some((page, 1)), "a slot was free at every moment");
        let hdr = h.word(MetaSection::Hdr, page as u64).load(Ordering::Relaxed);
        assert_eq!((slab::hdr_class(hdr), slab::hdr_used(hdr)), (Some(class), 1));
        assert_eq!(transit::in_flight(&*h), 0, "no transit left open");
    });
}

/// The available bit against a free (store buffering): a full page's bit is
/// dropped (clear, then re-read the header) while a free makes the page
/// non-full (header `fetch_sub`, then set the bit). The dropper's clear is
/// the acquire and the freer's set the release: at the end the page, which
/// has a free slot, is in the available bitmap.
#[test]
fn slab_drop_if_full_vs_free_keeps_the_page_findable() {
    loom::model(|| {
        let h = new_heap(PAGE);
        let class = CLASSES - 1; // 16 slots
        let slots = class_slots(class);
        let (page, got) = slab::acquire(&*h, class, 0, slots).unwrap().get().unwrap();
        assert_eq!(got, slots, "the whole page");
        let mut cur = 0;
        let mut left = slots;
        while left > 0 {
            let (_, bits) = slab::claim_bits(&*h, page, class, &mut cur, left);
            left -= bits.count_ones();
        }
        // Full: drop the page's bit first, as the reservation that took the
        // last slot does, then set it again to race the real drop below.
        slab::recheck_avail(&*h, page, class, false);
        slab::avail(&*h, class).set(&*h, page);
        let h1 = h.clone();
        let t = thread::spawn(move || {
            let hdr = h1.word(MetaSection::Hdr, page as u64).load(Ordering::Relaxed);
            assert_eq!(slab::free_slot(&*h1, page, hdr, 0), slab::SlotFree::Freed);
        });
        slab::recheck_avail(&*h, page, class, false);
        t.join().unwrap();
        assert!(slab::avail(&*h, class).get(&*h, page), "a page with a free slot is findable");
        assert_eq!(transit::in_flight(&*h), 0);
        check_all_summaries(&h);
    });
}

/// The replacer against the freer (store buffering, `install` against
/// `retire_if_empty`): a refill un-installs the current page P (its store of
/// the new entry over P's, then its header RMW) while the free of P's last
/// slot empties it (its header `fetch_sub`, then its header load and its
/// read of the entry). The freer sees P current and keeps it, or sees it
/// replaced and retires it; the replacer sees the free and retires P, or
/// not. The replacer's header RMW (release) and the freer's header load
/// (acquire) make sure that at least one of them retires: P always ends in
/// the buddy (each model fails with either made relaxed).
#[test]
fn slab_install_vs_last_free_retires_the_page() {
    loom::model(|| {
        let h = new_heap(2 * PAGE);
        let class = CLASSES - 1;
        let (page, _) = slab::acquire(&*h, class, 0, 1).unwrap().get().unwrap();
        let mut cur = 0;
        let (w, b) = slab::claim_bits(&*h, page, class, &mut cur, 1);
        let off = (w * 32 + b.trailing_zeros()) * class_size(class) as u32;
        // P is the current page of slot 0.
        let entry = current_entry(class, 0);
        assert_eq!(h.word32(MetaSection32::Current, entry).load(Ordering::Relaxed), page + 1);
        let h1 = h.clone();
        let t = thread::spawn(move || {
            let hdr = h1.word(MetaSection::Hdr, page as u64).load(Ordering::Relaxed);
            assert_eq!(slab::free_slot(&*h1, page, hdr, off), slab::SlotFree::Freed);
        });
        // The end of a refill of slot 0 that found no page (its claim of
        // the slot, `REFILLING`, changes nothing the freer decides on).
        let old = slab::install(&*h, class, 0, slab::Grant::NONE, page + 1);
        assert_eq!(old, page);
        slab::retire_if_empty(&*h, old, true);
        t.join().unwrap();
        let hdr = h.word(MetaSection::Hdr, page as u64).load(Ordering::Relaxed);
        assert_eq!(slab::hdr_class(hdr), None, "the emptied, un-installed page went back");
        assert_eq!(buddy::free_blocks(&*h), fresh_blocks(&h));
    });
}

/// The failing scavenge (issue 40): a heap of one page P of the largest
/// class, P the current page of slot 0, emptied once (kept: `CTRL_KEPT` is
/// 1) and then filled again. Thread A requests one more slot: P is full, so
/// A takes over the slot's refill (`REFILLING`), finds the buddy dry, and
/// scavenges, which retires nothing (the only kept page is P, full, and its
/// entry reads `REFILLING`). Thread B meanwhile frees one of P's slots. In
/// every interleaving A's refill ends: the slot is not left `REFILLING`
/// (a null used to leave it so), no transit mark stays open, A's grant (if
/// any) is B's freed slot, and once everything is freed the next request
/// is served and installs its page in the slot again.
#[test]
fn a_refill_that_ends_in_a_failing_scavenge_ends_the_refill() {
    // The scavenge reads every `current` entry (`CLASSES * CURRENT_SLOTS`
    // loads): more branches per execution than loom's default allows.
    let mut model = loom::model::Builder::new();
    model.max_branches = 20_000;
    // Executions in which A's request returned null: the failing scavenge
    // is explored (it is every execution where B frees after A's search).
    static NULLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    model.check(|| {
        let h = new_heap(PAGE);
        let class = CLASSES - 1;
        let slots = class_slots(class);
        let entry = current_entry(class, 0);
        let cur = |h: &VecHeap| h.word32(MetaSection32::Current, entry).load(Ordering::Relaxed);
        let claim = |h: &VecHeap, page: u32, n: u32| -> std::vec::Vec<u32> {
            let mut offs = std::vec::Vec::new();
            let mut c = 0;
            while (offs.len() as u32) < n {
                let (w, mut b) = slab::claim_bits(h, page, class, &mut c, n - offs.len() as u32);
                while b != 0 {
                    offs.push((w * 32 + b.trailing_zeros()) * class_size(class) as u32);
                    b &= b - 1;
                }
            }
            offs
        };
        let free = |h: &VecHeap, page: u32, off: u32| {
            let hdr = h.word(MetaSection::Hdr, page as u64).load(Ordering::Relaxed);
            assert_eq!(slab::free_slot(h, page, hdr, off), slab::SlotFree::Freed);
        };
        let (page, _) = slab::acquire(&*h, class, 0, 1).unwrap().get().unwrap();
        let first = claim(&h, page, 1);
        free(&h, page, first[0]);
        assert_eq!(h.word(MetaSection::Ctrl, CTRL_KEPT as u64).load(Ordering::Relaxed), 1, "P was kept");
        let (again, n) = slab::acquire(&*h, class, 0, slots).unwrap().get().unwrap();
        assert_eq!((again, n), (page, slots), "the kept page serves its slot again, whole");
        let mut offs = claim(&h, page, slots);
        let theirs = offs.pop().unwrap();
        let h1 = h.clone();
        let t = thread::spawn(move || free(&h1, page, theirs));
        let mine = slab::acquire(&*h, class, 0, 1);
        t.join().unwrap();
        assert_ne!(cur(&h), slab::REFILLING, "the refill ended");
        assert_eq!(transit::in_flight(&*h), 0, "no transit left open");
        match mine {
            Ok(g) => {
                assert_eq!(g.get(), Some((page, 1)), "the one free slot is B's");
                offs.extend(claim(&h, page, 1));
            }
            Err(_) => {
                NULLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        for off in offs {
            free(&h, page, off);
        }
        slab::scavenge_all(&*h);
        assert_eq!(buddy::free_blocks(&*h), fresh_blocks(&h), "everything went back");
        let (p, _) = slab::acquire(&*h, class, 0, 1).expect("served after the recovery").get().unwrap();
        assert_eq!(cur(&h), p + 1, "and installed in the slot");
    });
    assert!(NULLS.load(std::sync::atomic::Ordering::Relaxed) > 0, "no execution reached the failing scavenge");
}
