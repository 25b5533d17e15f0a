//! Hierarchical bitmaps: "is there a set bit, and where" in a few loads.
//!
//! Used twice: every buddy level is one (bit = free block), and every size
//! class has one over pages (bit = the page may have free slots).
//!
//! # Layout
//!
//! For `n` bits (`1 <= n < 2^32`), level 0 holds the bits themselves in
//! `ceil(n / 32)` `u32` words; level `l + 1` has one *summary* bit per word of
//! level `l` (set: that word is probably non-zero), up to a level of one word
//! (at most 7 levels). Levels are stored leaf-first, contiguously
//! ([`super::layout::hb_words`] words in all). Level `l` has
//! `((n - 1) >> 5(l + 1)) + 1` words: every offset is a shift and an add on
//! `u32`s, computed where it is used (no table, no 64-bit arithmetic), and
//! every word, mask and old value is one register. A 2^21-bit level (an
//! 8 GiB buddy level 0) is 5 levels deep, so finding a set bit is five loads
//! from the top, not a scan of 65 536 words (the linear scans
//! of ScatterAlloc and Halloc are what makes them slow when nearly full; LLVM
//! libc's allocator needed a "search known-empty bits" fix for the same cliff).
//!
//! # Protocol (summary bits)
//!
//! The summary is a *hint* kept eventually exact by one rule per transition:
//!
//! * whoever turns a word from zero to non-zero (its RMW returned 0) sets the
//!   parent bit, and if that parent word was zero, continues upwards;
//! * whoever turns a word non-zero to zero (its RMW returned exactly the bit it
//!   cleared) clears the parent bit, **then re-reads the word** and, if it is
//!   non-zero again, sets the parent bit back (and continues upwards only if
//!   its clear emptied the parent).
//!
//! Memory ordering: the race that matters is a setter S (word RMW, then
//! parent RMW) against a clearer C (parent RMW, then word re-read), the
//! store-buffering shape. The parent RMWs are totally ordered: if S's comes
//! after C's, the bit ends set; if it comes before, C's RMW reads from S's
//! (or from a later RMW in its release sequence: every write of a bitmap
//! word is an RMW). **S's parent `fetch_or` is the `Release` and C's parent
//! `fetch_and` the `Acquire`** that make S's word RMW happen before C's
//! re-read, which then sees the word non-zero and sets the bit back. The
//! re-read and every load of a descent are `Relaxed`. So in a quiescent
//! state a non-zero word always has its summary bit set: no free bit is ever
//! hidden. The converse can fail (a set summary bit over an empty word, when
//! S's and C's RMWs interleave the other way); searchers that meet such a
//! stale bit clear it with the same clear-then-recheck step and restart.
//!
//! The clear-then-recheck hides a bit for a moment when the word refilled
//! in between. It therefore runs under a transit mark ([`super::transit`]):
//! a find's descent over a stale bit brackets it here (cancelled unless the
//! re-check found the word refilled); `Hb::claim`, `Hb::clear` and
//! `Hb::set_or_take_buddy` run inside their caller's mark.
//!
//! What the bits themselves publish is the caller's protocol: `Hb::set`
//! is a `Release` RMW (a freed block or a page with room, published with
//! its history) and `Hb::claim`'s RMW an `Acquire` (the new owner sees the
//! previous owner's writes); `Hb::clear` takes the ordering its caller
//! needs.
//!
//! All decisions are made on the current value of one word, never on a
//! remembered pointer, so there is no ABA problem to tag against.

use super::layout::{hb_words, HeapMem, MetaSection32};
use super::transit;
use crate::arch::atomic::{GlobalU32, Ordering};
use crate::arch::opaque_u32;

/// Descents a search may restart (each restart follows a concurrent change
/// or cleans one stale summary bit), so every search is bounded.
pub const MAX_RESTARTS: u32 = 24;

/// A hierarchical bitmap of `n` bits (`1 <= n < 2^32`) at word offset `off`
/// of metadata section `section`.
#[derive(Clone, Copy, Debug)]
pub struct Hb {
    /// Which metadata section holds it.
    pub section: MetaSection32,
    /// Word offset of level 0 in the section.
    pub off: u32,
    /// Number of bits.
    pub n: u32,
}

/// Words of level `l` of a bitmap of `n >= 1` bits: `ceil(n / 32^(l+1))`.
#[inline(always)]
fn level_len(n: u32, l: u32) -> u32 {
    let s = 5 * (l + 1);
    if s >= 32 {
        1
    } else {
        ((n - 1) >> s) + 1
    }
}

/// Picks a set bit of `v` (non-zero) at or cyclically after position `start`.
#[inline(always)]
fn pick(v: u32, start: u32) -> u32 {
    let s = start & 31;
    (v.rotate_right(s).trailing_zeros() + s) & 31
}

impl Hb {
    /// The bit count, through an optimisation barrier: what is derived from
    /// it (the depth, the level lengths) is recomputed where it is used, not
    /// kept live across the loops (DESIGN.md §4.1). A few integer
    /// instructions each time.
    #[inline(always)]
    fn n(&self) -> u32 {
        opaque_u32(self.n)
    }

    /// The level-0 offset, through the barrier (see [`n`](Self::n)).
    #[inline(always)]
    fn off(&self) -> u32 {
        opaque_u32(self.off)
    }

    /// Number of levels (1 for up to 32 bits): `max(1, ceil(bits(n - 1) / 5))`.
    #[inline(always)]
    pub fn depth(&self) -> u32 {
        let bits = 32 - (self.n() - 1).leading_zeros();
        if bits <= 5 {
            1
        } else {
            bits.div_ceil(5)
        }
    }

    /// Word offset (in the section) of level `l`.
    #[inline(always)]
    fn level_off(&self, l: u32) -> u32 {
        let mut off = self.off();
        let mut i = 0;
        while i < l {
            off += level_len(self.n(), i);
            // Through the barrier: LLVM would unroll this loop of at most 6
            // trips by 8 and keep the unrolled trip counts live.
            i = opaque_u32(i + 1);
        }
        off
    }

    #[inline(always)]
    fn at<'m, M: HeapMem>(&self, m: &'m M, w: u32) -> &'m GlobalU32 {
        m.word32(self.section, w as u64)
    }

    /// Total words (for tests and layout checks).
    pub fn words(&self) -> u64 {
        hb_words(self.n() as u64)
    }

    /// Reads bit `i` (a `Relaxed` load: a hint).
    #[inline(always)]
    pub(crate) fn get<M: HeapMem>(&self, m: &M, i: u32) -> bool {
        self.at(m, self.off() + i / 32).load(Ordering::Relaxed) & (1 << (i % 32)) != 0
    }

    /// Sets bit `i` (a `Release` RMW: whoever claims or finds it sees what
    /// came before); returns whether it was already set.
    #[inline(always)]
    pub(crate) fn set<M: HeapMem>(&self, m: &M, i: u32) -> bool {
        let bit = 1u32 << (i % 32);
        let old = self.at(m, self.off() + i / 32).fetch_or(bit, Ordering::Release);
        if old == 0 {
            self.propagate_set(m, 0, self.off(), i / 32);
        }
        old & bit != 0
    }

    /// Clears bit `i` with an RMW of ordering `ord`; returns whether it was
    /// set, and whether the summary clean-up found a word refilled (a bit
    /// was hidden for a moment). Runs inside the caller's transit mark.
    #[inline(always)]
    pub(crate) fn clear<M: HeapMem>(&self, m: &M, i: u32, ord: Ordering) -> (bool, bool) {
        let bit = 1u32 << (i % 32);
        let old = self.at(m, self.off() + i / 32).fetch_and(!bit, ord);
        let restored = old == bit && self.propagate_empty(m, 0, self.off(), i / 32);
        (old & bit != 0, restored)
    }

    /// Word `w` of level `l` (at word offset `loff`) became non-zero: set its
    /// summary bit (`Release`), and continue while summary words turn
    /// non-zero.
    #[inline(always)]
    fn propagate_set<M: HeapMem>(&self, m: &M, mut l: u32, mut loff: u32, mut w: u32) {
        let depth = self.depth();
        while l + 1 < depth {
            let poff = loff + level_len(self.n(), l);
            if self.at(m, poff + w / 32).fetch_or(1 << (w % 32), Ordering::Release) != 0 {
                return;
            }
            l = opaque_u32(l + 1);
            loff = poff;
            w /= 32;
        }
    }

    /// Word `w` of level `l` was seen empty (by the RMW that emptied it, or by
    /// a searcher over a stale summary bit): clear its summary bit
    /// (`Acquire`), re-check the word (`Relaxed`), and continue upwards
    /// while summary words become empty. When the word refilled, sets the
    /// bit back (and upwards while words turn non-zero, as
    /// [`propagate_set`](Self::propagate_set)) and returns `true`: the bit
    /// was hidden for a moment. One loop for both phases.
    #[inline(always)]
    fn propagate_empty<M: HeapMem>(&self, m: &M, mut l: u32, mut loff: u32, mut w: u32) -> bool {
        let depth = self.depth();
        let mut setting = false;
        while l + 1 < depth {
            let poff = loff + level_len(self.n(), l);
            let parent = self.at(m, poff + w / 32);
            let bit = 1u32 << (w % 32);
            if !setting {
                let old = parent.fetch_and(!bit, Ordering::Acquire);
                if self.at(m, loff + w).load(Ordering::Relaxed) == 0 {
                    if old != bit {
                        return false;
                    }
                    l = opaque_u32(l + 1);
                    loff = poff;
                    w /= 32;
                    continue;
                }
                // Refilled meanwhile: put the summary bit back.
                setting = true;
            }
            if parent.fetch_or(bit, Ordering::Release) != 0 {
                return true;
            }
            l = opaque_u32(l + 1);
            loff = poff;
            w /= 32;
        }
        setting
    }

    /// [`propagate_empty`](Self::propagate_empty) under a transit mark of
    /// its own, for callers that hold none.
    #[inline(always)]
    fn clean_up<M: HeapMem>(&self, m: &M, l: u32, loff: u32, w: u32) {
        let s = transit::shard();
        transit::begin(m, s);
        if self.propagate_empty(m, l, loff, w) {
            transit::end(m, s);
        } else {
            transit::cancel(m, s);
        }
    }

    /// A set bit (`u32::MAX`: none found within [`MAX_RESTARTS`] descents),
    /// and whether a summary clean-up found a word refilled. Each descent
    /// goes from the top to a leaf word with a set bit (`Relaxed` loads); at
    /// each level `l` the bit is chosen cyclically from the low 5 bits of
    /// `hint` rotated right by `5 * l` (a hint of 0 walks lowest-first;
    /// hashes spread concurrent searchers). With `claim`, the bit is cleared
    /// (an `Acquire` RMW) and the caller owns it. A descent that ends at an
    /// empty word under a set summary bit (a stale bit, or a word emptied by
    /// the claim or by others) cleans the summary up (one site for all
    /// three): a claim runs inside its caller's transit mark, a find
    /// brackets the clean-up itself.
    #[inline(always)]
    fn search<M: HeapMem>(&self, m: &M, hint: u32, claim: bool) -> (u32, bool) {
        let mut restored = false;
        let mut r = 0;
        while r < MAX_RESTARTS {
            let h = hint.wrapping_add(r);
            let depth = self.depth();
            let mut l = depth - 1;
            let mut loff = self.level_off(l);
            let mut w = 0u32;
            let mut v = self.at(m, loff).load(Ordering::Relaxed);
            while v != 0 && l > 0 {
                w = w * 32 + pick(v, h.rotate_right(5 * l));
                l -= 1;
                loff -= level_len(self.n(), l);
                v = self.at(m, loff + w).load(Ordering::Relaxed);
            }
            // The descent ended at word `w` of level `l` (at `loff`), which
            // read `v`: a leaf with a set bit, or an empty word.
            let mut found = u32::MAX;
            if v != 0 {
                if !claim {
                    return (w * 32 + pick(v, hint), false);
                }
                // One RMW per descent: a bit taken meanwhile restarts the
                // descent (fewer nested loops, DESIGN.md §4.1).
                let bit = 1u32 << pick(v, hint);
                let old = self.at(m, self.off() + w).fetch_and(!bit, Ordering::Acquire);
                v = old & !bit;
                if old & bit != 0 {
                    found = w * 32 + bit.trailing_zeros();
                }
            }
            if v == 0 && l + 1 < self.depth() {
                if claim {
                    restored |= self.propagate_empty(m, l, loff, w);
                } else {
                    self.clean_up(m, l, loff, w);
                }
            }
            if found != u32::MAX || self.is_empty(m) {
                return (found, restored);
            }
            r += 1;
        }
        (u32::MAX, restored)
    }

    /// A set bit (not claimed), or `None` when none was found within
    /// [`MAX_RESTARTS`] descents (see [`search`](Self::search)).
    #[inline(always)]
    pub(crate) fn find<M: HeapMem>(&self, m: &M, hint: u32) -> Option<u32> {
        let (i, _) = self.search(m, hint, false);
        (i != u32::MAX).then_some(i)
    }

    /// Finds a set bit and clears it (an `Acquire` RMW): the caller owns
    /// that bit. `None` when the bitmap is (or stays, over [`MAX_RESTARTS`]
    /// tries) empty. Runs inside the caller's transit mark; the flag says
    /// whether a summary clean-up hid a bit for a moment (then the mark
    /// must end as a completion, not be cancelled).
    #[inline(always)]
    pub(crate) fn claim<M: HeapMem>(&self, m: &M, hint: u32) -> (Option<u32>, bool) {
        let (i, restored) = self.search(m, hint, true);
        ((i != u32::MAX).then_some(i), restored)
    }

    /// The buddy step: if the buddy of block `i` (bit `i ^ 1`, in the same
    /// word) is set, clear it and return `true` (the caller now owns both and
    /// merges them); otherwise set bit `i` and return `false`. One CAS
    /// (`AcqRel`: taking acquires the buddy's history, setting releases
    /// ours) decides between the two, so two buddies freed concurrently
    /// always merge: the second CAS sees the first one's bit. Lock-free, not
    /// bounded: a failed CAS means another thread changed the word. Runs
    /// inside the caller's transit mark.
    #[inline(always)]
    pub(crate) fn set_or_take_buddy<M: HeapMem>(&self, m: &M, i: u32) -> bool {
        let w = i / 32;
        let word = self.at(m, self.off() + w);
        let me = 1u32 << (i % 32);
        let buddy = 1u32 << ((i ^ 1) % 32);
        let mut v = word.load(Ordering::Relaxed);
        loop {
            let (new, took) = if v & buddy != 0 { (v & !buddy, true) } else { (v | me, false) };
            match word.compare_exchange(v, new, Ordering::AcqRel) {
                Ok(_) => {
                    if took && new == 0 {
                        self.propagate_empty(m, 0, self.off(), w);
                    } else if !took && v == 0 {
                        self.propagate_set(m, 0, self.off(), w);
                    }
                    return took;
                }
                Err(actual) => v = actual,
            }
        }
    }

    /// `true` when the top word is zero (then, at quiescence, no bit is
    /// set). A `Relaxed` load.
    #[inline(always)]
    pub(crate) fn is_empty<M: HeapMem>(&self, m: &M) -> bool {
        let top = self.depth() - 1;
        self.at(m, self.level_off(top)).load(Ordering::Relaxed) == 0
    }

    /// Calls `f` with every set bit, in increasing order (host-side
    /// inspection; not atomic as a whole).
    #[cfg_attr(not(test), allow(dead_code))] // host-side inspection, used by the tests
    pub(crate) fn for_each_set<M: HeapMem>(&self, m: &M, mut f: impl FnMut(u32)) {
        for w in 0..self.n().div_ceil(32) {
            let mut v = self.at(m, self.off() + w).load(Ordering::Relaxed);
            while v != 0 {
                let b = v.trailing_zeros();
                let i = w * 32 + b;
                if i < self.n() {
                    f(i);
                }
                v &= v - 1;
            }
        }
    }

    /// Checks the quiescent invariant "non-zero word ⇒ summary bit set" at
    /// every level; returns the first violating `(level, word)`.
    #[cfg_attr(not(test), allow(dead_code))] // host-side inspection, used by the tests
    pub(crate) fn check_summary<M: HeapMem>(&self, m: &M) -> Result<(), (u32, u32)> {
        let depth = self.depth();
        for l in 0..depth.saturating_sub(1) {
            let loff = self.level_off(l);
            let poff = self.level_off(l + 1);
            for w in 0..level_len(self.n(), l) {
                let v = self.at(m, loff + w).load(Ordering::Relaxed);
                let p = self.at(m, poff + w / 32).load(Ordering::Relaxed);
                if v != 0 && p & (1 << (w % 32)) == 0 {
                    return Err((l, w));
                }
            }
        }
        Ok(())
    }
}

#[cfg(all(test, not(loom), not(shuttle)))]
mod tests {
    use super::*;

    #[test]
    fn closed_form_levels_match_the_layout() {
        for n in (1u32..5000).chain([
            1 << 10,
            (1 << 10) + 1,
            1 << 20,
            (1 << 20) + 1,
            1 << 25,
            (1 << 25) + 1,
            1 << 30,
            (1 << 30) + 1,
            u32::MAX,
        ]) {
            let hb = Hb { section: MetaSection32::Buddy, off: 0, n };
            let mut w = n as u64;
            let mut depth = 0;
            let mut total = 0;
            loop {
                let len = w.div_ceil(32).max(1);
                assert_eq!(level_len(n, depth) as u64, len, "n {n} level {depth}");
                total += len;
                depth += 1;
                if len == 1 {
                    break;
                }
                w = len;
            }
            assert_eq!(hb.depth(), depth, "n {n}");
            assert_eq!(hb.level_off(depth - 1) as u64 + 1, total, "n {n}");
            assert_eq!(hb_words(n as u64), total, "n {n}");
        }
    }
}
