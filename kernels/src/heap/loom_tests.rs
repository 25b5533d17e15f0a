//! Model checking of the heap's protocols with loom (every interleaving, C11
//! weak memory within loom's limits) on tiny heaps.
//!
//! ```text
//! CARGO_TARGET_DIR=target/loom RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 \
//!     cargo test -p gpuheap-kernels --release --lib heap::loom_tests
//! ```
//!
//! Each model builds a [`VecHeap`] (loom atomics cannot be made from raw
//! pointers), runs 2–3 threads over one protocol, and checks the final state
//! against the sequential model: no slot or block handed out twice, nothing
//! lost (the buddy is fully merged when everything is free), summaries exact.

use loom::sync::Arc;
use loom::thread;

use super::layout::*;
use super::{bitmap::Hb, buddy, init, slab};
use crate::arch::atomic::Ordering;

const BASE: u64 = 1 << 40;

fn new_heap(bytes: u64) -> Arc<VecHeap> {
    Arc::new(VecHeap::new(bytes, BASE).unwrap())
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

/// Summary bits: an emptying clear races with a set in the same leaf word;
/// at the end the set bit must be reachable from the top.
#[test]
fn bitmap_clear_vs_set_keeps_summary_exact() {
    loom::model(|| {
        let h = new_heap(128 * UNIT); // level 0 has 128 bits: 2 leaf words + 1 summary word
        let hb = buddy::level(&*h, 0);
        // Start from a clean slate at level 0: only bit 3 set.
        for b in 0..128 {
            hb.clear(&*h, b);
        }
        hb.set(&*h, 3);
        let h1 = h.clone();
        let t = thread::spawn(move || {
            let hb = buddy::level(&*h1, 0);
            assert!(hb.clear(&*h1, 3));
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
        let h = new_heap(64 * UNIT);
        let hb = Hb { section: MetaSection::Buddy, off: buddy::level(&*h, 0).off, n: 64 };
        hb.set(&*h, 17);
        let h1 = h.clone();
        let t = thread::spawn(move || hb.claim(&*h1, 5));
        let mine = hb.claim(&*h, 40);
        let theirs = t.join().unwrap();
        assert_eq!(mine.is_some() as u32 + theirs.is_some() as u32, 1, "{mine:?} {theirs:?}");
        assert_eq!(mine.or(theirs), Some(17));
    });
}

/// Buddy split under contention (BL-10(a) in miniature): two threads each
/// want one unit of a heap that starts as one 2-unit block. Both must
/// succeed (the transit counter keeps the loser of the split race from
/// reporting out-of-memory) with distinct units; freeing both merges back.
#[test]
fn buddy_concurrent_split_never_fails_spuriously() {
    loom::model(|| {
        let h = new_heap(2 * UNIT);
        let h1 = h.clone();
        let t = thread::spawn(move || buddy::alloc(&*h1, 0, 0));
        let a = buddy::alloc(&*h, 0, 1);
        let b = t.join().unwrap();
        let (a, b) = (a.expect("first unit"), b.expect("second unit"));
        assert_ne!(a, b);
        let h2 = h.clone();
        let t = thread::spawn(move || buddy::free(&*h2, b, 0));
        buddy::free(&*h, a, 0);
        t.join().unwrap();
        assert_eq!(buddy::free_blocks(&*h), fresh_blocks(&h));
        check_all_summaries(&h);
    });
}

/// Concurrent frees of two buddies always merge (one CAS decides), and an
/// allocation racing with the merge gets a correct block.
#[test]
fn buddy_concurrent_frees_merge() {
    loom::model(|| {
        let h = new_heap(4 * UNIT);
        let a = buddy::alloc(&*h, 0, 0).unwrap();
        let b = buddy::alloc(&*h, 0, 0).unwrap();
        assert_eq!((a, b), (0, 1));
        let h1 = h.clone();
        let t = thread::spawn(move || buddy::free(&*h1, 1, 0));
        buddy::free(&*h, 0, 0);
        t.join().unwrap();
        assert_eq!(buddy::free_blocks(&*h), [(0, 2)]);
        check_all_summaries(&h);
    });
}

/// A large allocation racing a merge: it either finds the merged block or
/// fails only if memory really was not there (here it always is).
#[test]
fn buddy_alloc_during_merge_sees_the_memory() {
    loom::model(|| {
        let h = new_heap(2 * UNIT);
        let a = buddy::alloc(&*h, 0, 0).unwrap();
        let b = buddy::alloc(&*h, 0, 0).unwrap();
        buddy::free(&*h, b, 0);
        let h1 = h.clone();
        let t = thread::spawn(move || buddy::alloc(&*h1, 0, 0));
        buddy::free(&*h, a, 0);
        let got = t.join().unwrap();
        assert!(got.is_some(), "one unit is free at every moment");
        buddy::free(&*h, got.unwrap(), 0);
        assert_eq!(buddy::free_blocks(&*h), [(0, 1)]);
    });
}

/// Slab: two threads each reserve, claim and free a slot of a 16-slot page
/// while a third frees the page's last pre-existing slot. Slots are never
/// shared; at the end the page is retired (not current) and the buddy is
/// whole again.
#[test]
fn slab_claim_free_and_retire() {
    loom::model(|| {
        let h = new_heap(2 * PAGE);
        let class = CLASSES - 1; // 4 KiB slots, 16 per page, one bitmap word
                                 // Carve a page (slot 0 of `current`, then un-install it so that
                                 // emptying retires it).
        let (page, got) = slab::acquire(&*h, class, 0, 1).get().unwrap();
        assert_eq!(got, 1);
        let mut cur = 0;
        let (w0, b0) = slab::claim_bits(&*h, page, class, &mut cur, 1);
        h.word32(MetaSection32::Current, (class * CURRENT_SLOTS) as u64).store(0, Ordering::Relaxed);
        let first_off = (w0 as u64 * 64 + b0.trailing_zeros() as u64) * class_size(class);

        let worker = |h: Arc<VecHeap>, hint: u32| {
            move || {
                let got = slab::reserve(&*h, page, class, 1);
                if got == 0 {
                    return None; // the page was retired under us: allowed
                }
                let mut cur = hint;
                let (w, bits) = slab::claim_bits(&*h, page, class, &mut cur, 1);
                assert_eq!(bits.count_ones(), 1);
                let off = (w as u64 * 64 + bits.trailing_zeros() as u64) * class_size(class);
                let hdr = h.word(MetaSection::Hdr, page).load(Ordering::Acquire);
                assert_eq!(slab::free_slot(&*h, page, hdr, off), slab::SlotFree::Freed);
                Some(off)
            }
        };
        let t1 = thread::spawn(worker(h.clone(), 0));
        let t2 = thread::spawn(worker(h.clone(), 0));
        let hdr = h.word(MetaSection::Hdr, page).load(Ordering::Acquire);
        assert_eq!(slab::free_slot(&*h, page, hdr, first_off), slab::SlotFree::Freed);
        let _ = (t1.join().unwrap(), t2.join().unwrap());
        // Everything was freed: the page must be back in the buddy.
        let hdr = h.word(MetaSection::Hdr, page).load(Ordering::Relaxed);
        assert_eq!(slab::hdr_class(hdr), None, "empty page retired");
        assert_eq!(buddy::free_blocks(&*h), fresh_blocks(&h));
    });
}

/// Takes a page of `class` from the buddy, claims one slot of it and clears
/// the class's current-page slot, so the next free of that slot retires the
/// page. Returns the page and the slot's byte offset in it.
fn one_slot_in_a_non_current_page(h: &VecHeap, class: u32) -> (u64, u64) {
    let (page, _) = slab::acquire(h, class, 0, 1).get().unwrap();
    let mut cur = 0;
    let (w0, b0) = slab::claim_bits(h, page, class, &mut cur, 1);
    h.word32(MetaSection32::Current, (class * CURRENT_SLOTS) as u64).store(0, Ordering::Relaxed);
    (page, (w0 as u64 * 64 + b0.trailing_zeros() as u64) * class_size(class))
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
        let t = thread::spawn(move || slab::reserve(&*h1, page, class, 1));
        let hdr = h.word(MetaSection::Hdr, page).load(Ordering::Acquire);
        assert_eq!(slab::free_slot(&*h, page, hdr, off), slab::SlotFree::Freed);
        let got = t.join().unwrap();
        let hdr = h.word(MetaSection::Hdr, page).load(Ordering::Relaxed);
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
/// return null meanwhile: `fresh_page`'s transit bracket makes its final
/// scan retry. Both get a distinct slot of the same page.
#[test]
fn slab_acquire_during_page_format_never_fails_spuriously() {
    loom::model(|| {
        let h = new_heap(PAGE);
        let class = CLASSES - 1; // 16 slots of 4 KiB
        let h1 = h.clone();
        let t = thread::spawn(move || slab::acquire(&*h1, class, 1, 1).get());
        let mine = slab::acquire(&*h, class, 0, 1).get();
        let theirs = t.join().unwrap();
        let (p0, n0) = mine.expect("first reservation: one page of 16 slots is free");
        let (p1, n1) = theirs.expect("second reservation: 15 slots left (no spurious null)");
        assert_eq!((p0, p1, n0, n1), (0, 0, 1, 1));
        let hdr = h.word(MetaSection::Hdr, 0).load(Ordering::Relaxed);
        assert_eq!((slab::hdr_class(hdr), slab::hdr_used(hdr)), (Some(class), 2));
        assert_eq!(
            h.word(MetaSection::Ctrl, CTRL_TRANSIT as u64).load(Ordering::Relaxed) as u32,
            0,
            "no transit left open"
        );
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
            let hdr = h1.word(MetaSection::Hdr, page).load(Ordering::Acquire);
            assert_eq!(slab::free_slot(&*h1, page, hdr, off), slab::SlotFree::Freed);
        });
        let got = slab::acquire(&*h, class, 1, 1).get();
        t.join().unwrap();
        assert_eq!(got, Some((page, 1)), "a slot was free at every moment");
        let hdr = h.word(MetaSection::Hdr, page).load(Ordering::Relaxed);
        assert_eq!((slab::hdr_class(hdr), slab::hdr_used(hdr)), (Some(class), 1));
        assert_eq!(
            h.word(MetaSection::Ctrl, CTRL_TRANSIT as u64).load(Ordering::Relaxed) as u32,
            0,
            "no transit left open"
        );
    });
}
