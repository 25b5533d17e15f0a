//! Hierarchical bitmaps: "is there a set bit, and where" in a few loads.
//!
//! Used twice: every buddy level is one (bit = free block), and every size
//! class has one over pages (bit = the page may have free slots).
//!
//! # Layout
//!
//! For `n` bits, level 0 holds the bits themselves in `ceil(n / 64)` words;
//! level `l + 1` has one *summary* bit per word of level `l` (set: that word
//! is probably non-zero), up to a level of one word. Levels are stored
//! leaf-first, contiguously ([`super::layout::hb_words`] words in all). A
//! 2^21-bit level (an 8 GiB buddy level 0) is 4 levels deep, so finding a set
//! bit is four loads from the top, not a scan of 32 768 words (the linear scans
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
//! Memory ordering: all RMWs are `AcqRel`, the re-read is `Acquire`. The race
//! that matters is a setter S (word RMW, then parent RMW) against a clearer C
//! (parent RMW, then word re-read), the store-buffering shape. The parent
//! RMWs are totally ordered: if S's comes after C's, the bit ends set; if it
//! comes before, C's RMW reads from S's (or from a later RMW in its release
//! sequence), so S's word RMW happens-before C's re-read, which then sees the
//! word non-zero and sets the bit back. So in a quiescent state a non-zero
//! word always has its summary bit set: no free bit is ever hidden. The
//! converse can fail (a set summary bit over an empty word, when S's and C's
//! RMWs interleave the other way); searchers that meet such a stale bit clear
//! it with the same clear-then-recheck step and restart.
//!
//! All decisions are made on the current value of one word, never on a
//! remembered pointer, so there is no ABA problem to tag against.

use super::layout::{hb_words, HeapMem, MetaSection};
use crate::arch::atomic::{AtomicU64, Ordering};

/// Descents a search may restart (each restart follows a concurrent change
/// or cleans one stale summary bit), so every search is bounded.
pub const MAX_RESTARTS: u32 = 24;

/// A hierarchical bitmap of `n` bits at word offset `off` of metadata section `section`.
#[derive(Clone, Copy, Debug)]
pub struct Hb {
    /// Which metadata section holds it.
    pub section: MetaSection,
    /// Word offset of level 0 in the section.
    pub off: u64,
    /// Number of bits.
    pub n: u64,
}

#[inline(always)]
fn level_len(n: u64, l: u32) -> u64 {
    let mut w = n.div_ceil(64).max(1);
    let mut i = 0;
    while i < l {
        w = w.div_ceil(64).max(1);
        i += 1;
    }
    w
}

/// Picks a set bit of `v` (non-zero) at or cyclically after position `start`.
#[inline(always)]
fn pick(v: u64, start: u32) -> u32 {
    let s = start & 63;
    (v.rotate_right(s).trailing_zeros() + s) & 63
}

impl Hb {
    /// Number of levels (1 for up to 64 bits).
    #[inline(always)]
    pub fn depth(&self) -> u32 {
        let mut d = 1;
        let mut w = self.n.div_ceil(64).max(1);
        while w > 1 {
            w = w.div_ceil(64);
            d += 1;
        }
        d
    }

    /// Word offset (in the section) of level `l`.
    #[inline(always)]
    fn level_off(&self, l: u32) -> u64 {
        let mut off = self.off;
        let mut i = 0;
        while i < l {
            off += level_len(self.n, i);
            i += 1;
        }
        off
    }

    #[inline(always)]
    fn at<'m, M: HeapMem>(&self, m: &'m M, level_off: u64, w: u64) -> &'m AtomicU64 {
        m.word(self.section, level_off + w)
    }

    /// Total words (for tests and layout checks).
    pub fn words(&self) -> u64 {
        hb_words(self.n)
    }

    /// Reads bit `i` (a relaxed snapshot).
    #[allow(dead_code)] // host-side inspection (loom tests, debugging)
    pub(crate) fn get<M: HeapMem>(&self, m: &M, i: u64) -> bool {
        self.at(m, self.off, i / 64).load(Ordering::Relaxed) & (1 << (i % 64)) != 0
    }

    /// Sets bit `i`; returns whether it was already set.
    #[inline(always)]
    pub(crate) fn set<M: HeapMem>(&self, m: &M, i: u64) -> bool {
        let bit = 1u64 << (i % 64);
        let old = self.at(m, self.off, i / 64).fetch_or(bit, Ordering::AcqRel);
        if old == 0 {
            self.propagate_set(m, 0, self.off, i / 64);
        }
        old & bit != 0
    }

    /// Clears bit `i`; returns whether it was set.
    #[inline(always)]
    pub(crate) fn clear<M: HeapMem>(&self, m: &M, i: u64) -> bool {
        let bit = 1u64 << (i % 64);
        let old = self.at(m, self.off, i / 64).fetch_and(!bit, Ordering::AcqRel);
        if old == bit {
            self.propagate_empty(m, 0, self.off, i / 64);
        }
        old & bit != 0
    }

    /// Word `w` of level `l` (at word offset `loff`) became non-zero: set its
    /// summary bit, and continue while summary words turn non-zero.
    fn propagate_set<M: HeapMem>(&self, m: &M, mut l: u32, mut loff: u64, mut w: u64) {
        let depth = self.depth();
        while l + 1 < depth {
            let poff = loff + level_len(self.n, l);
            let old = self.at(m, poff, w / 64).fetch_or(1 << (w % 64), Ordering::AcqRel);
            if old != 0 {
                return;
            }
            l += 1;
            loff = poff;
            w /= 64;
        }
    }

    /// Word `w` of level `l` was seen empty (by the RMW that emptied it, or by
    /// a searcher over a stale summary bit): clear its summary bit, re-check
    /// the word, and continue upwards while summary words become empty.
    fn propagate_empty<M: HeapMem>(&self, m: &M, mut l: u32, mut loff: u64, mut w: u64) {
        let depth = self.depth();
        while l + 1 < depth {
            let poff = loff + level_len(self.n, l);
            let bit = 1u64 << (w % 64);
            let old = self.at(m, poff, w / 64).fetch_and(!bit, Ordering::AcqRel);
            if self.at(m, loff, w).load(Ordering::Acquire) != 0 {
                // Refilled meanwhile: put the summary bit back.
                self.propagate_set(m, l, loff, w);
                return;
            }
            if old != bit {
                return;
            }
            l += 1;
            loff = poff;
            w /= 64;
        }
    }

    /// Descends from the top to a leaf word with a set bit. At each level `l`
    /// the bit is chosen cyclically from the low 6 bits of `hint` rotated
    /// right by `6 * l` (so a hint of 0 walks lowest-first; hashes spread
    /// concurrent searchers). The hint is 32 bits: it is only a spread, and a
    /// 64-bit one held two registers through every restart loop.
    /// Returns the leaf word index and the value read, or `None` after a
    /// concurrent change or a stale summary bit (cleaned before returning).
    #[inline(always)]
    fn descend<M: HeapMem>(&self, m: &M, hint: u32) -> Option<(u64, u64)> {
        let depth = self.depth();
        let mut l = depth - 1;
        let mut loff = self.level_off(l);
        let mut w = 0u64;
        loop {
            let v = self.at(m, loff, w).load(Ordering::Acquire);
            if v == 0 {
                if l + 1 < depth {
                    self.propagate_empty(m, l, loff, w);
                }
                return None;
            }
            if l == 0 {
                return Some((w, v));
            }
            let b = pick(v, hint.rotate_right(6 * l));
            w = w * 64 + b as u64;
            l -= 1;
            loff = self.level_off(l);
        }
    }

    /// A set bit (not claimed), or `None` when none was found within
    /// [`MAX_RESTARTS`] descents. Only the low 32 bits of `hint` are used.
    #[inline(always)]
    pub(crate) fn find<M: HeapMem>(&self, m: &M, hint: u64) -> Option<u64> {
        let hint = hint as u32;
        let mut r = 0;
        while r < MAX_RESTARTS {
            if let Some((w, v)) = self.descend(m, hint.wrapping_add(r)) {
                return Some(w * 64 + pick(v, hint) as u64);
            }
            if self.is_empty(m) {
                return None;
            }
            r += 1;
        }
        None
    }

    /// Finds a set bit and clears it atomically: the caller owns that bit.
    /// `None` when the bitmap is (or stays, over [`MAX_RESTARTS`] tries) empty.
    /// Only the low 32 bits of `hint` are used.
    #[inline(always)]
    pub(crate) fn claim<M: HeapMem>(&self, m: &M, hint: u64) -> Option<u64> {
        let hint = hint as u32;
        let mut r = 0;
        while r < MAX_RESTARTS {
            if let Some((w, mut v)) = self.descend(m, hint.wrapping_add(r)) {
                let word = self.at(m, self.off, w);
                while v != 0 {
                    let bit = 1u64 << pick(v, hint);
                    let old = word.fetch_and(!bit, Ordering::AcqRel);
                    if old & bit != 0 {
                        if old == bit {
                            self.propagate_empty(m, 0, self.off, w);
                        }
                        return Some(w * 64 + bit.trailing_zeros() as u64);
                    }
                    v = old & !bit;
                }
                if self.depth() > 1 {
                    self.propagate_empty(m, 0, self.off, w);
                }
            } else if self.is_empty(m) {
                return None;
            }
            r += 1;
        }
        None
    }

    /// The buddy step: if the buddy of block `i` (bit `i ^ 1`, in the same
    /// word) is set, clear it and return `true` (the caller now owns both and
    /// merges them); otherwise set bit `i` and return `false`. One CAS decides
    /// between the two, so two buddies freed concurrently always merge: the
    /// second CAS sees the first one's bit.
    #[inline(always)]
    pub(crate) fn set_or_take_buddy<M: HeapMem>(&self, m: &M, i: u64) -> bool {
        let word = self.at(m, self.off, i / 64);
        let me = 1u64 << (i % 64);
        let buddy = 1u64 << ((i ^ 1) % 64);
        let mut v = word.load(Ordering::Relaxed);
        loop {
            let (new, took) = if v & buddy != 0 { (v & !buddy, true) } else { (v | me, false) };
            match word.compare_exchange(v, new, Ordering::AcqRel) {
                Ok(_) => {
                    if took && new == 0 {
                        self.propagate_empty(m, 0, self.off, i / 64);
                    } else if !took && v == 0 {
                        self.propagate_set(m, 0, self.off, i / 64);
                    }
                    return took;
                }
                Err(actual) => v = actual,
            }
        }
    }

    /// `true` when the top word is zero (then, at quiescence, no bit is set).
    #[inline(always)]
    pub(crate) fn is_empty<M: HeapMem>(&self, m: &M) -> bool {
        let top = self.depth() - 1;
        self.at(m, self.level_off(top), 0).load(Ordering::Acquire) == 0
    }

    /// Calls `f` with every set bit, in increasing order (host-side
    /// inspection; not atomic as a whole).
    #[cfg_attr(not(test), allow(dead_code))] // host-side inspection, used by the tests
    pub(crate) fn for_each_set<M: HeapMem>(&self, m: &M, mut f: impl FnMut(u64)) {
        for w in 0..self.n.div_ceil(64) {
            let mut v = self.at(m, self.off, w).load(Ordering::Relaxed);
            while v != 0 {
                let b = v.trailing_zeros() as u64;
                let i = w * 64 + b;
                if i < self.n {
                    f(i);
                }
                v &= v - 1;
            }
        }
    }

    /// Checks the quiescent invariant "non-zero word ⇒ summary bit set" at
    /// every level; returns the first violating `(level, word)`.
    #[cfg_attr(not(test), allow(dead_code))] // host-side inspection, used by the tests
    pub(crate) fn check_summary<M: HeapMem>(&self, m: &M) -> Result<(), (u32, u64)> {
        let depth = self.depth();
        for l in 0..depth.saturating_sub(1) {
            let loff = self.level_off(l);
            let poff = self.level_off(l + 1);
            for w in 0..level_len(self.n, l) {
                let v = self.at(m, loff, w).load(Ordering::Relaxed);
                let p = self.at(m, poff, w / 64).load(Ordering::Relaxed);
                if v != 0 && p & (1 << (w % 64)) == 0 {
                    return Err((l, w));
                }
            }
        }
        Ok(())
    }
}
