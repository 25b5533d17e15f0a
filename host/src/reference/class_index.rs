//! An exact-ordered index of free blocks by TLSF size class: per class, the blocks' packed `u128` keys
//! `(size - 1, offset, record)` in sorted chunks of at most [`CHUNK`] keys, and a two-level bitmap over the
//! non-empty classes. Used by the caching model ([`caching`](super::caching), one index per pool and
//! stream) and by best-fit for its blocks of a megabyte and more ([`best_fit`](super::best_fit), whose
//! smaller blocks are in exact-size buckets).
//!
//! A block of `size` bytes belongs to one size class `(fl, sl)` (the caller's [`size_class`] of its size,
//! 32 classes per power of two), and within the class the keys order exactly by `(size, offset)`, so the
//! first key at or above `key(size, 0, 0)` in the request's class, else the smallest key of the next
//! non-empty class, is the best fit (smallest block, then lowest offset) over all classes.
//!
//! A class keeps its keys in chunks of at most [`CHUNK`] keys (512 bytes) from a shared slab, behind a
//! directory of the chunks' smallest keys (no tree nodes), all in *descending* order: the class's smallest
//! key, the one a best-fit search takes, is the last key of the last chunk. A best fit takes that key far
//! more often than any other, and freed blocks go in near it (in the strategies benchmark, of best-fit's
//! insertions among more than 16 free blocks of the same size, 37 % went in below all of them and 73 %
//! among the lowest 16): so the last chunk is tried before any binary search, and taking or putting back
//! the smallest key moves no key. Elsewhere a lookup binary-searches the directory, then one chunk, and an
//! update moves keys inside one chunk. A full chunk splits in halves (a key below the whole class opens a
//! new last chunk instead); a removal that leaves two neighbouring chunks with at most `CHUNK / 2` keys
//! together merges them. Emptied chunks go back to the slab (`spare`), so splits and new classes do not
//! allocate in steady state.
//!
//! # Why chunks
//! Both users replaced a `BTreeSet`/`BTreeMap` per class with ascending chunks (callgrind, per alloc+free
//! pair at 100k live blocks, `host/benches/strategies_icount.rs`: best-fit 1300.6 → 1077.9 instructions,
//! the caching model 1472.3 → 1205.9; chunks of 16 and 64 keys measured worse than 32), see the 2026-12-01
//! files in `bench/results/`. The descending layout with its fast paths took the caching model from 964.4
//! to 820.2 instructions per pair and from 14.99 to 12.46 D1 misses, with the same placements, see
//! `bench/results/2026-12-01-9073b34-best-fit-index.md`.
//!
//! # Invariants
//! - A key is in the class the caller filed it under, once; `sl_bitmap[fl]` bit `sl` is set iff class
//!   `(fl, sl)` is non-empty, and `fl_bitmap` bit `fl` iff `sl_bitmap[fl] != 0`.
//! - In a class, every chunk holds 1 to [`CHUNK`] keys in descending order, every key of a chunk is above
//!   every key of the next chunk, a directory entry holds its chunk's length and smallest (last) key, and
//!   any two neighbouring chunks hold more than `CHUNK / 2` keys together (so a class of k keys has at most
//!   `4k / CHUNK + 1` chunks). A chunk of the slab is in one directory or in `spare`, never both.
//! - A [`Pos`] is valid until the next change to the index.
//!
//! # Time complexity (k keys in the class, n in the index)
//! - `insert`, `remove`: O(1) at the class's smallest keys (the last chunk); elsewhere O(log k) compares
//!   (directory and chunk binary searches) plus a move of at most [`CHUNK`] keys; a chunk split or merge
//!   moves O(k / [`CHUNK`]) directory entries (rare: only a full chunk splits, only two neighbours with at
//!   most `CHUNK / 2` keys together merge). `remove_at`: the same without the searches.
//! - `first_at_least`: O(1) when the class's smallest key is large enough (always in a class of one size),
//!   else one class lookup, O(log k); and O(1) to find the next non-empty class.
//! - `last` (the largest key): O(1). `class_from`, `class_first_where`, `keys`: O(1) per key visited
//!   (plus O(classes) for `keys`).

#[cfg(doc)]
use super::block_list::size_class;
use super::block_list::{first_class_at_or_above, FL_COUNT, SL_COUNT};

/// A free block as one ordered key: `size - 1` (48 bits), offset (48 bits), record (32 bits: the user's
/// node or block index), so keys order by `(size, offset)` with one comparison. Sizes are 1 to 2^48 bytes
/// and offsets below 2^48, so the fields fit.
#[inline]
pub(crate) fn key(size: u64, offset: u64, record: u32) -> u128 {
    debug_assert!((1..=1 << 48).contains(&size) && offset < 1 << 48);
    ((size - 1) as u128) << 80 | (offset as u128) << 32 | record as u128
}

/// The size in bytes of a [`key`].
#[inline]
pub(crate) fn key_size(k: u128) -> u64 {
    (k >> 80) as u64 + 1
}

/// The offset in bytes of a [`key`].
#[inline]
pub(crate) fn key_offset(k: u128) -> u64 {
    (k >> 32) as u64 & ((1 << 48) - 1)
}

/// The record (node or block index) of a [`key`].
#[inline]
pub(crate) fn key_record(k: u128) -> u32 {
    k as u32
}

/// Most keys in one chunk of a class: 32 keys of 16 bytes, 8 cache lines.
pub(crate) const CHUNK: usize = 32;

/// The keys of one chunk, in descending order in `0[..len]` (`len` is in the chunk's directory entry).
#[derive(Clone, Debug)]
struct Keys([u128; CHUNK]);

/// A chunk in its class's directory: its smallest key, its slot in the slab, its length.
#[derive(Clone, Copy, Debug)]
struct Entry {
    min: u128,
    id: u32,
    len: u32,
}

/// The chunk of a class directory `dir` (non-empty) that holds `k` or would hold it: the first whose
/// smallest key is at most `k`, else the last. The last chunk is tried before any binary search.
#[inline(always)]
fn chunk_of(dir: &[Entry], k: u128) -> usize {
    let n = dir.len();
    if n == 1 || dir[n - 2].min > k {
        n - 1
    } else {
        dir[..n - 1].partition_point(|e| e.min > k)
    }
}

/// Where a key lies in a [`ClassIndex`]: class `class` (`fl * SL_COUNT + sl`), chunk `chunk` of the class's
/// directory, entry `at` of the chunk. Valid until the next change to the index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pos {
    class: usize,
    chunk: usize,
    at: usize,
}

/// Free-block keys by TLSF size class (`FL_COUNT * SL_COUNT` classes), each class a directory of
/// descending chunks, with a two-level bitmap over the non-empty classes (see the [module docs](self) for
/// the invariants). The caller picks each key's class (`(fl, sl)`, from [`size_class`] of the block's size
/// in its own unit) and must remove a key from the class it filed it under.
#[derive(Debug)]
pub(crate) struct ClassIndex {
    fl_bitmap: u64,
    sl_bitmap: [u32; FL_COUNT],
    /// The directory of each class, by `fl * SL_COUNT + sl`: `dirs[c][0]` holds the class's largest keys.
    dirs: Vec<Vec<Entry>>,
    /// The chunk slab of all classes; `spare` lists the unused chunks.
    chunks: Vec<Keys>,
    spare: Vec<u32>,
}

impl Default for ClassIndex {
    fn default() -> Self {
        ClassIndex {
            fl_bitmap: 0,
            sl_bitmap: [0; FL_COUNT],
            dirs: (0..FL_COUNT * SL_COUNT).map(|_| Vec::new()).collect(),
            chunks: Vec::new(),
            spare: Vec::new(),
        }
    }
}

impl ClassIndex {
    /// True if the index holds no key (tests only).
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.fl_bitmap == 0
    }

    /// An unused chunk of the slab.
    #[inline(always)]
    fn new_chunk(&mut self) -> u32 {
        match self.spare.pop() {
            Some(id) => id,
            None => self.grow_slab(),
        }
    }

    #[cold]
    #[inline(never)]
    fn grow_slab(&mut self) -> u32 {
        self.chunks.push(Keys([0; CHUNK]));
        (self.chunks.len() - 1) as u32
    }

    /// Files `k` (not present) in class `(fl, sl)`.
    #[inline(always)]
    pub(crate) fn insert(&mut self, (fl, sl): (usize, usize), k: u128) {
        let class = fl * SL_COUNT + sl;
        let n = self.dirs[class].len();
        if n == 0 {
            let id = self.new_chunk();
            self.chunks[id as usize].0[0] = k;
            self.dirs[class].push(Entry { min: k, id, len: 1 });
            self.sl_bitmap[fl] |= 1 << sl;
            self.fl_bitmap |= 1 << fl;
            return;
        }
        let dir = &mut self.dirs[class];
        // Most insertions go into the last chunk (the class's smallest keys), at or near its end.
        if (n == 1 || dir[n - 2].min > k) && (dir[n - 1].len as usize) < CHUNK {
            let e = &mut dir[n - 1];
            let len = e.len as usize;
            let keys = &mut self.chunks[e.id as usize].0;
            e.len += 1;
            if e.min > k {
                keys[len] = k;
                e.min = k;
            } else {
                let i = keys[..len - 1].partition_point(|&x| x > k);
                keys.copy_within(i..len, i + 1);
                keys[i] = k;
            }
            return;
        }
        self.insert_slow(class, k);
    }

    /// [`ClassIndex::insert`] into a chunk other than the last, or into a full one.
    #[inline(never)]
    fn insert_slow(&mut self, class: usize, k: u128) {
        let dir = &mut self.dirs[class];
        let c = chunk_of(dir, k);
        let e = &mut dir[c];
        let len = e.len as usize;
        let keys = &mut self.chunks[e.id as usize].0;
        let i = keys[..len].partition_point(|&x| x > k);
        if len < CHUNK {
            keys.copy_within(i..len, i + 1);
            keys[i] = k;
            e.len += 1;
            if i == len {
                e.min = k;
            }
        } else {
            self.insert_split(class, c, i, k);
        }
    }

    /// Inserts `k` at entry `i` of the full chunk `c` of `class`: below the class's smallest key a new
    /// last chunk takes it; otherwise the chunk splits in halves and `k` goes into the half that covers it.
    #[cold]
    #[inline(never)]
    fn insert_split(&mut self, class: usize, c: usize, i: usize, k: u128) {
        let id = self.new_chunk();
        let dir = &mut self.dirs[class];
        if i == CHUNK {
            debug_assert_eq!(c, dir.len() - 1);
            self.chunks[id as usize].0[0] = k;
            dir.push(Entry { min: k, id, len: 1 });
            return;
        }
        let old = dir[c].id as usize;
        let (lo, hi) = if old < id as usize {
            let (a, b) = self.chunks.split_at_mut(id as usize);
            (&mut a[old].0, &mut b[0].0)
        } else {
            let (a, b) = self.chunks.split_at_mut(old);
            (&mut b[0].0, &mut a[id as usize].0)
        };
        // `lo` keeps the larger half, `hi` (the new chunk after it) takes the smaller.
        hi[..CHUNK / 2].copy_from_slice(&lo[CHUNK / 2..]);
        let (mut upper, mut lower) = (CHUNK / 2, CHUNK / 2);
        if i <= CHUNK / 2 {
            lo.copy_within(i..CHUNK / 2, i + 1);
            lo[i] = k;
            upper += 1;
        } else {
            let j = i - CHUNK / 2;
            hi.copy_within(j..CHUNK / 2, j + 1);
            hi[j] = k;
            lower += 1;
        }
        let (lo_min, hi_min) = (lo[upper - 1], hi[lower - 1]);
        dir[c].min = lo_min;
        dir[c].len = upper as u32;
        dir.insert(c + 1, Entry { min: hi_min, id, len: lower as u32 });
    }

    /// Removes `k` from class `(fl, sl)`; false (and no change) if it is not there.
    #[inline(always)]
    pub(crate) fn remove(&mut self, (fl, sl): (usize, usize), k: u128) -> bool {
        let class = fl * SL_COUNT + sl;
        let dir = &self.dirs[class];
        // Most removals take the class's smallest key: the last key of the last chunk.
        if let Some(e) = dir.last() {
            if e.min == k {
                let pos = Pos { class, chunk: dir.len() - 1, at: e.len as usize - 1 };
                self.remove_at(pos);
                return true;
            }
        }
        self.remove_slow(class, k)
    }

    /// [`ClassIndex::remove`] of a key other than the class's smallest.
    #[inline(never)]
    fn remove_slow(&mut self, class: usize, k: u128) -> bool {
        let dir = &self.dirs[class];
        if dir.is_empty() {
            return false;
        }
        let chunk = chunk_of(dir, k);
        let e = dir[chunk];
        let keys = &self.chunks[e.id as usize].0[..e.len as usize];
        match keys.binary_search_by(|x| k.cmp(x)) {
            Ok(at) => {
                self.remove_at(Pos { class, chunk, at });
                true
            }
            Err(_) => false,
        }
    }

    /// Removes the key at `pos` (from [`ClassIndex::first_at_least`], with no change to the index since).
    #[inline(always)]
    pub(crate) fn remove_at(&mut self, Pos { class, chunk, at }: Pos) {
        let dir = &mut self.dirs[class];
        let n = dir.len();
        let len = dir[chunk].len as usize - 1;
        if len == 0 && n == 1 {
            // The class empties.
            self.spare.push(dir[0].id);
            dir.clear();
            let (fl, sl) = (class / SL_COUNT, class % SL_COUNT);
            self.sl_bitmap[fl] &= !(1 << sl);
            if self.sl_bitmap[fl] == 0 {
                self.fl_bitmap &= !(1 << fl);
            }
            return;
        }
        // The chunk keeps keys and stays heavy enough with its neighbours: no merge.
        let stays = len != 0
            && (len >= CHUNK / 2
                || ((chunk + 1 == n || len + dir[chunk + 1].len as usize > CHUNK / 2)
                    && (chunk == 0 || dir[chunk - 1].len as usize + len > CHUNK / 2)));
        if stays {
            let e = &mut dir[chunk];
            let keys = &mut self.chunks[e.id as usize].0;
            e.len = len as u32;
            if at < len {
                keys.copy_within(at + 1..len + 1, at);
            } else {
                e.min = keys[len - 1];
            }
            return;
        }
        self.remove_at_slow(class, chunk, at);
    }

    /// [`ClassIndex::remove_at`] when the chunk empties (the class keeping others) or merges with a
    /// neighbour.
    #[inline(never)]
    fn remove_at_slow(&mut self, class: usize, chunk: usize, at: usize) {
        let dir = &mut self.dirs[class];
        let e = &mut dir[chunk];
        let len = e.len as usize - 1;
        let keys = &mut self.chunks[e.id as usize].0;
        keys.copy_within(at + 1..len + 1, at);
        e.len = len as u32;
        if len == 0 {
            self.spare.push(e.id);
            dir.remove(chunk);
            return;
        }
        if at == len {
            e.min = keys[len - 1];
        }
        // Keep any two neighbours above half a chunk together: merge with a light neighbour.
        if chunk + 1 < dir.len() && len + dir[chunk + 1].len as usize <= CHUNK / 2 {
            self.merge_next(class, chunk);
        } else if chunk > 0 && dir[chunk - 1].len as usize + len <= CHUNK / 2 {
            self.merge_next(class, chunk - 1);
        }
    }

    /// Appends chunk `c + 1` of `class` (smaller keys) to chunk `c` and drops it.
    fn merge_next(&mut self, class: usize, c: usize) {
        let dir = &mut self.dirs[class];
        let next = dir.remove(c + 1);
        let e = &mut dir[c];
        let (len, add) = (e.len as usize, next.len as usize);
        let moved = self.chunks[next.id as usize].0;
        self.chunks[e.id as usize].0[len..len + add].copy_from_slice(&moved[..add]);
        e.len = (len + add) as u32;
        e.min = next.min;
        self.spare.push(next.id);
    }

    /// The next non-empty class at or above `(fl, sl)` (in `(fl, sl)` order; `sl` may be `SL_COUNT`).
    #[inline]
    pub(crate) fn class_at_or_above(&self, fl: usize, sl: usize) -> Option<(usize, usize)> {
        first_class_at_or_above(self.fl_bitmap, &self.sl_bitmap, fl, sl)
    }

    /// The smallest key of the non-empty class `class` and its position.
    #[inline(always)]
    fn class_min(&self, class: usize) -> (u128, Pos) {
        let dir = &self.dirs[class];
        let chunk = dir.len() - 1;
        let e = dir[chunk];
        (e.min, Pos { class, chunk, at: e.len as usize - 1 })
    }

    /// The best fit for `from` filed in class `(fl, sl)`: the first key at or above `from` in that class,
    /// else the first key of the next non-empty class; with its position.
    #[inline(always)]
    pub(crate) fn first_at_least(&self, (fl, sl): (usize, usize), from: u128) -> Option<(u128, Pos)> {
        if self.sl_bitmap[fl] & (1 << sl) != 0 {
            let found = self.class_min(fl * SL_COUNT + sl);
            if from <= found.0 {
                return Some(found);
            }
        }
        self.first_at_least_slow(fl, sl, from)
    }

    /// [`ClassIndex::first_at_least`] when the class is empty or its smallest key is below `from`.
    #[inline(never)]
    fn first_at_least_slow(&self, fl: usize, sl: usize, from: u128) -> Option<(u128, Pos)> {
        if self.sl_bitmap[fl] & (1 << sl) != 0 {
            let class = fl * SL_COUNT + sl;
            let dir = &self.dirs[class];
            let chunk = chunk_of(dir, from);
            let e = dir[chunk];
            let keys = &self.chunks[e.id as usize].0[..e.len as usize];
            let j = keys.partition_point(|&x| x >= from);
            if j > 0 {
                return Some((keys[j - 1], Pos { class, chunk, at: j - 1 }));
            }
            if chunk > 0 {
                let p = dir[chunk - 1];
                return Some((p.min, Pos { class, chunk: chunk - 1, at: p.len as usize - 1 }));
            }
        }
        let (nfl, nsl) = self.class_at_or_above(fl, sl + 1)?;
        Some(self.class_min(nfl * SL_COUNT + nsl))
    }

    /// Where the keys of `class` at or above `from` start: the chunk that holds the smallest of them and
    /// how many keys of that chunk are at or above `from` (they come first in it).
    #[inline]
    fn start(&self, class: usize, from: u128) -> (usize, usize) {
        let dir = &self.dirs[class];
        if dir.is_empty() {
            return (0, 0);
        }
        let c = chunk_of(dir, from);
        let keys = &self.chunks[dir[c].id as usize].0[..dir[c].len as usize];
        (c, keys.partition_point(|&x| x >= from))
    }

    /// The keys of class `class` at or above `from`, in ascending order.
    fn from(&self, class: usize, from: u128) -> impl Iterator<Item = u128> + '_ {
        let dir = &self.dirs[class];
        let (c, j) = self.start(class, from);
        let head = dir.get(c).map_or(&[][..], |e| &self.chunks[e.id as usize].0[..j]);
        let rest = dir[..c.min(dir.len())]
            .iter()
            .rev()
            .flat_map(move |e| self.chunks[e.id as usize].0[..e.len as usize].iter().rev());
        head.iter().rev().chain(rest).copied()
    }

    /// The keys of class `(fl, sl)` at or above `from`, in order.
    #[inline]
    pub(crate) fn class_from(&self, (fl, sl): (usize, usize), from: u128) -> impl Iterator<Item = u128> + '_ {
        self.from(fl * SL_COUNT + sl, from)
    }

    /// The first key of class `(fl, sl)` at or above `from` that passes `pred` (a search that skips
    /// candidates for a reason the order does not capture, such as alignment).
    #[inline]
    pub(crate) fn class_first_where(
        &self,
        (fl, sl): (usize, usize),
        from: u128,
        mut pred: impl FnMut(u128) -> bool,
    ) -> Option<u128> {
        let class = fl * SL_COUNT + sl;
        let dir = &self.dirs[class];
        let (c, j) = self.start(class, from);
        let mut run = &self.chunks[dir.get(c)?.id as usize].0[..j];
        for e in dir[..c].iter().rev() {
            if let Some(&k) = run.iter().rev().find(|&&k| pred(k)) {
                return Some(k);
            }
            run = &self.chunks[e.id as usize].0[..e.len as usize];
        }
        run.iter().rev().copied().find(|&k| pred(k))
    }

    /// Every key, class by class in `(fl, sl)` order, each class in key order.
    ///
    /// Only the non-empty classes are visited (found by the bitmaps): the caching model walks one index
    /// per stream at every failed request (`release_blocks`), and visiting all `FL_COUNT * SL_COUNT`
    /// classes of each made a trace with thousands of streams take minutes.
    pub(crate) fn keys(&self) -> impl Iterator<Item = u128> + '_ {
        std::iter::successors(self.class_at_or_above(0, 0), move |&(fl, sl)| self.class_at_or_above(fl, sl + 1))
            .flat_map(move |(fl, sl)| self.from(fl * SL_COUNT + sl, 0))
    }

    /// The largest key of the highest non-empty class (the largest block), if any.
    #[inline]
    pub(crate) fn last(&self) -> Option<u128> {
        if self.fl_bitmap == 0 {
            return None;
        }
        let fl = 63 - self.fl_bitmap.leading_zeros() as usize;
        let sl = 31 - self.sl_bitmap[fl].leading_zeros() as usize;
        let e = self.dirs[fl * SL_COUNT + sl].first()?;
        Some(self.chunks[e.id as usize].0[0])
    }

    /// Removes every key (the slab's chunks are kept for reuse).
    pub(crate) fn clear(&mut self) {
        let mut at = self.class_at_or_above(0, 0);
        while let Some((fl, sl)) = at {
            self.dirs[fl * SL_COUNT + sl].clear();
            at = self.class_at_or_above(fl, sl + 1);
        }
        self.fl_bitmap = 0;
        self.sl_bitmap = [0; FL_COUNT];
        self.spare.clear();
        self.spare.extend((0..self.chunks.len() as u32).rev());
    }

    /// The number of chunks of the most crowded class (tests only).
    #[cfg(test)]
    pub(crate) fn most_chunks(&self) -> usize {
        self.dirs.iter().map(Vec::len).max().unwrap_or(0)
    }

    /// The number of chunks in all classes (tests only).
    #[cfg(test)]
    pub(crate) fn chunk_count(&self) -> usize {
        self.dirs.iter().map(Vec::len).sum()
    }

    /// Panics unless every class keeps the chunk invariants of the [module docs](self), the bitmaps mirror
    /// class emptiness, and `class_of(k)` is the class of every key `k`; returns the number of keys (tests
    /// only).
    #[cfg(test)]
    pub(crate) fn check(&self, class_of: impl Fn(u128) -> (usize, usize)) -> usize {
        let mut count = 0;
        let mut used = vec![false; self.chunks.len()];
        for &id in &self.spare {
            assert!(!std::mem::replace(&mut used[id as usize], true), "spare chunk {id} listed twice");
        }
        for (i, dir) in self.dirs.iter().enumerate() {
            for (c, e) in dir.iter().enumerate() {
                let len = e.len as usize;
                assert!(len > 0 && len <= CHUNK, "class {i}: chunk {c} of {len} keys");
                assert!(!std::mem::replace(&mut used[e.id as usize], true), "class {i}: chunk {c} shared");
                assert_eq!(e.min, self.chunks[e.id as usize].0[len - 1], "class {i}: directory of chunk {c}");
                if c > 0 {
                    assert!(dir[c - 1].len as usize + len > CHUNK / 2, "class {i}: light chunks {c}");
                }
            }
            let keys: Vec<u128> = self.from(i, 0).collect();
            assert!(keys.is_sorted_by(|a, b| a < b), "class {i}: unsorted");
            let (fl, sl) = (i / SL_COUNT, i % SL_COUNT);
            assert_eq!(keys.is_empty(), self.sl_bitmap[fl] & (1 << sl) == 0, "class {i}: bitmap");
            for k in keys {
                assert_eq!(class_of(k), (fl, sl), "class {i}: key {k:#x} in the wrong class");
                count += 1;
            }
        }
        assert!(used.iter().all(|&u| u), "a chunk is neither in a directory nor spare");
        for fl in 0..FL_COUNT {
            assert_eq!(self.sl_bitmap[fl] != 0, self.fl_bitmap & (1 << fl) != 0, "fl bitmap {fl}");
        }
        count
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::block_list::size_class;
    use std::collections::BTreeSet;

    fn class(k: u128) -> (usize, usize) {
        size_class(key_size(k))
    }

    /// A shadow model: random insertions and removals (by key and at a found position) in crowded classes,
    /// so chunks split, merge, empty and leave their class; after each step every best-fit answer agrees
    /// with one `BTreeSet` of `(size, offset)`, and at the end the full order and the largest key.
    #[test]
    fn chunks_keep_the_exact_order_of_a_btree_set() {
        let mut rng = crate::testing::SplitMix64::new(11);
        let mut index = ClassIndex::default();
        let mut reference = BTreeSet::new();
        let mut most_chunks = 0;
        for step in 0..20_000u32 {
            // Few sizes in few classes (so classes hold hundreds of keys), some of them exact single-size classes.
            let size =
                if rng.next_u64().is_multiple_of(4) { 1 + rng.next_u64() % 8 } else { 990 + rng.next_u64() % 50 };
            if !rng.next_u64().is_multiple_of(3) || reference.is_empty() {
                let off = rng.next_u64() % 100_000;
                if reference.insert((size, off)) {
                    index.insert(size_class(size), key(size, off, step));
                }
            } else {
                let &(z, o) = reference.range((size, 0)..).next().unwrap_or(reference.first().unwrap());
                reference.remove(&(z, o));
                let (k, at) = index.first_at_least(size_class(z), key(z, 0, 0)).unwrap();
                assert_eq!((key_size(k), key_offset(k)), (z, o), "step {step}");
                if step % 2 == 0 {
                    assert!(index.remove(size_class(z), k));
                    assert!(!index.remove(size_class(z), k), "step {step}: removed twice");
                } else {
                    index.remove_at(at);
                }
            }
            let want = reference.range((size, 0)..).next().copied();
            let got =
                index.first_at_least(size_class(size), key(size, 0, 0)).map(|(k, _)| (key_size(k), key_offset(k)));
            assert_eq!(got, want, "step {step}");
            if step % 97 == 0 {
                assert_eq!(index.check(class), reference.len(), "step {step}");
            }
            most_chunks = most_chunks.max(index.most_chunks());
        }
        assert!(most_chunks >= 4, "the most crowded class had {most_chunks} chunks");
        assert_eq!(index.check(class), reference.len());
        let got: Vec<_> = index.keys().map(|k| (key_size(k), key_offset(k))).collect();
        assert_eq!(got, reference.iter().copied().collect::<Vec<_>>());
        assert_eq!(index.last().map(key_size), reference.last().map(|x| x.0));
        let (z, o) = *reference.iter().nth(reference.len() / 2).unwrap();
        let from: Vec<_> =
            index.class_from(size_class(z), key(z, o, 0)).map(|k| (key_size(k), key_offset(k))).collect();
        let want: Vec<_> =
            reference.range((z, o)..).copied().filter(|&(s, _)| size_class(s) == size_class(z)).collect();
        assert_eq!(from, want);
        let odd = |k: u128| key_offset(k) % 2 == 1;
        let got = index.class_first_where(size_class(z), key(z, o, 0), odd).map(|k| (key_size(k), key_offset(k)));
        assert_eq!(got, want.iter().copied().find(|&(_, o)| o % 2 == 1));
        // Drain: every class empties, and the chunks go back to the spare list.
        for (z, o) in std::mem::take(&mut reference) {
            let (k, at) = index.first_at_least(size_class(z), key(z, o, 0)).unwrap();
            assert_eq!((key_size(k), key_offset(k)), (z, o));
            index.remove_at(at);
        }
        assert!(index.is_empty() && index.last().is_none() && index.chunk_count() == 0);
        assert_eq!(index.check(class), 0);
        index.insert((0, 1), key(1, 0, 0));
        index.clear();
        assert!(index.is_empty() && index.keys().next().is_none());
    }

    #[test]
    fn key_fields_round_trip() {
        for (size, off, rec) in [(1, 0, 0), (1 << 48, (1 << 48) - 1, u32::MAX), (4096, 123_456, 7)] {
            let k = key(size, off, rec);
            assert_eq!((key_size(k), key_offset(k), key_record(k)), (size, off, rec));
        }
        assert!(key(2, 0, 9) > key(1, 5, 0) && key(2, 1, 0) > key(2, 0, 9));
    }
}
