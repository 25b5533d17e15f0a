//! The transit counter: "no free memory was hidden from this search".
//!
//! Some operations *hide* free memory for a moment: a buddy split (a block
//! claimed at level `j` is free again only once its halves are set), a merge
//! (the buddy is taken before the parent is set), a page between its buddy
//! claim and its format, a page between its retirement and its buddy free, a
//! scavenge, an available bit cleared and re-checked, and a summary bit
//! cleared and re-checked ([`super::bitmap`]). A search that ran during such
//! a window could see nothing and return null while memory is free (BL-10(a):
//! 17 threads, 16 blocks, one top block being split). So every hiding
//! operation is bracketed: `begin` (`+1`, low half: in flight) before it
//! hides anything, then `end` (`+2^32 - 1`, high half: completions) once
//! the memory is published again, or `cancel` (`-1`) when it turned out to
//! hide nothing (a failed claim, a re-check that found the word empty). A
//! search that found nothing is trusted only if a `snapshot` before it and
//! one after it are `quiet`: nothing in flight at the end, no completion in
//! between. Marks are held only around the operation that hides: a request
//! that fails in an exhausted heap makes no claim (every top word it reads
//! is zero), holds no mark, and so does not make concurrent failing requests
//! retry. Its null costs one search.
//!
//! # Shards
//!
//! The counter is [`TRANSIT_SHARDS`] words, each on its own 128-byte line;
//! an operation uses the shard of its SM, read **once** (`shard`) and
//! carried to its `begin` and its `end` or `cancel`: the PTX ISA allows
//! `%smid` to change during a thread's life (after a preemption), and a mark
//! that began on one shard and ended on another would leave the first "in
//! flight" for ever (every later null would then run its scan bound). An
//! allocation reads it once per call (`super::slab::acquire`'s slot, from
//! which the shard is derived), a free once per operation. A snapshot reads
//! every shard and keeps one `u32`: the sum of the completion halves, with
//! bit 32 set when some shard has an operation in flight. The sum changes
//! when any shard's completions do (wrapping would need 2^32 completions
//! inside one search).
//!
//! # Memory ordering (the one operation that carries each edge)
//!
//! * **Hiding, then seen hidden.** `begin` is an `Acquire` RMW, so every
//!   write its operation makes afterwards (the hiding ones) is ordered after
//!   it. A snapshot is a `fence(AcqRel)` then one `Relaxed` RMW (`fetch_or
//!   0`: an RMW reads the latest value, a load need not) per shard. If a
//!   search observed a hiding write W and the snapshot's RMW R of that shard
//!   came before the `begin` B in the shard's modification order, B would
//!   read from the release sequence R heads (every write of the counter is
//!   an RMW), so the fence before R would synchronise with B and the
//!   search's loads would happen before W: they could not have observed it.
//!   So R comes after B and sees the operation in flight, or its
//!   completion.
//! * **Completed, then searched.** `end` is a `Release` RMW after the
//!   republishing writes; the snapshot's second `fence(AcqRel)` after its
//!   RMWs is the acquire: a search that starts from a snapshot that read an
//!   `end` sees what that operation published.
//! * `cancel` is `Relaxed`: its operation published nothing.
//!
//! The loom models fail when the quiet check ignores operations in flight,
//! or when a split, a format or a retirement hides memory outside its
//! mark. They cannot fail when the snapshot's first fence is removed: the
//! outcome that fence excludes (the search's load reading a write made
//! after the `begin` that the snapshot's RMW precedes) is load buffering,
//! which loom does not explore; the argument above is the C11 one.
//!
//! Searches read bitmap words with `Relaxed` loads: the two fences of the
//! snapshot carry the ordering for the whole search, instead of one
//! acquire (an L1 invalidation) per word.

use super::layout::{HeapMem, MetaSection, CTRL_TRANSIT, TRANSIT_SHARDS, TRANSIT_STRIDE};

const _: () = assert!(super::layout::CURRENT_SLOTS.is_multiple_of(TRANSIT_SHARDS));
use crate::arch::atomic::{fence, GlobalU64, Ordering};
use crate::arch::nonuniform_one;

const BEGIN: u64 = 1;
const END: u64 = (1 << 32) - 1;

/// Shard `s` of the counter.
#[inline(always)]
fn shard_word<M: HeapMem>(m: &M, s: u32) -> &GlobalU64 {
    m.word(MetaSection::Ctrl, (CTRL_TRANSIT + s as usize * TRANSIT_STRIDE) as u64)
}

/// The shard of this SM (`%smid % TRANSIT_SHARDS`; 0 in the model
/// checkers), read once by the caller and passed to the `begin` and the
/// `end` or `cancel` of the same mark.
#[inline(always)]
pub(crate) fn shard() -> u32 {
    #[cfg(not(any(loom, shuttle)))]
    return shard_of(crate::arch::index::sm_id());
    #[cfg(any(loom, shuttle))]
    return 0;
}

/// The shard for an SM index or anything derived from it by a remainder
/// that [`TRANSIT_SHARDS`] divides (a current-page slot).
#[inline(always)]
pub(crate) const fn shard_of(sm_or_slot: u32) -> u32 {
    sm_or_slot % TRANSIT_SHARDS
}

/// Marks the start of an operation that may hide free memory, on shard `s`
/// ([`shard`]); every write it makes afterwards is ordered after the mark.
#[inline(always)]
pub(crate) fn begin<M: HeapMem>(m: &M, s: u32) {
    shard_word(m, s).fetch_add(BEGIN * nonuniform_one() as u64, Ordering::Acquire);
}

/// Marks the end of a hiding operation whose memory is published again
/// (every write before it is released), on the shard its `begin` used.
#[inline(always)]
pub(crate) fn end<M: HeapMem>(m: &M, s: u32) {
    shard_word(m, s).fetch_add(END * nonuniform_one() as u64, Ordering::Release);
}

/// Withdraws a `begin` on shard `s` whose operation hid nothing.
#[inline(always)]
pub(crate) fn cancel<M: HeapMem>(m: &M, s: u32) {
    shard_word(m, s).fetch_sub(BEGIN * nonuniform_one() as u64, Ordering::Relaxed);
}

/// Where the counter stands: the sum of the shards' completions (low 32
/// bits), bit 32 set when an operation is in flight. Take one before a
/// search and one after it; see `quiet`.
#[inline(always)]
pub(crate) fn snapshot<M: HeapMem>(m: &M) -> u64 {
    fence(Ordering::AcqRel);
    let mut done = 0u32;
    let mut busy = 0u32;
    let mut s = 0;
    while s < TRANSIT_SHARDS {
        let v = shard_word(m, s).fetch_or(0, Ordering::Relaxed);
        done = done.wrapping_add((v >> 32) as u32);
        busy |= v as u32;
        s += 1;
    }
    fence(Ordering::AcqRel);
    ((busy != 0) as u64) << 32 | done as u64
}

/// A `t0` for a search that took no snapshot before it (a large request's
/// first search, which snapshots only if it fails): never [`quiet`].
pub(crate) const NO_SNAPSHOT: u64 = 1 << 33;

/// `true` when, between snapshots `t0` (before a search) and `t1` (after
/// it), no hiding operation completed and none was in flight at the end: a
/// search that found nothing in between may be trusted. Never with `t0 =`
/// [`NO_SNAPSHOT`].
#[inline(always)]
pub(crate) fn quiet(t0: u64, t1: u64) -> bool {
    t1 >> 32 == 0 && t0 >> 33 == 0 && t1 as u32 == t0 as u32
}

/// Host-side: operations in flight over all shards (a relaxed snapshot).
#[cfg(not(target_arch = "nvptx64"))]
#[cfg_attr(not(test), allow(dead_code))] // used by the tests
pub(crate) fn in_flight<M: HeapMem>(m: &M) -> u64 {
    (0..TRANSIT_SHARDS).map(|s| shard_word(m, s).load(Ordering::Relaxed) & 0xFFFF_FFFF).sum()
}
