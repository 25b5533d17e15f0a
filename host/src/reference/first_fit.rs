//! Address-ordered first-fit: the lowest-address free block that fits, O(log n).
//!
//! Free blocks are kept in a treap (randomised balanced search tree) keyed by offset and augmented with
//! the largest block size in each subtree. The search descends left whenever the left subtree's maximum is
//! large enough, so it finds the lowest fitting address without scanning. The same tree answers
//! "highest-address fit" for the [tiered](super::tiered) strategy's large tier.
//!
//! Blocks live in the shared block list: out-of-band 32-byte nodes in an address-ordered doubly linked
//! list (offset-allocator style), so merging with free neighbours on free is O(1) and immediate, and a split
//! or merge that keeps a free block's address order updates the index in place.
//!
//! # Invariants
//! - In-order traversal of the treap lists the free blocks by ascending offset; priorities are max-heap
//!   ordered; `x.max` of a node is the maximum size in its subtree.
//! - No two physically adjacent blocks are free.
//!
//! # Time complexity
//! Expected O(log n) for `alloc` and `free` (n = free blocks); `largest_free` is O(1) (the root's maximum).
//! With an alignment above the granule a candidate may not fit; the search then resumes after it, and
//! stops at the first block of length `size + align - granule` (which always fits).

use super::block_list::{block_list_strategy, BlockList, FreeIndex, Node, Placement, NIL};
use super::{fit_back, fit_front};

/// Max-augmented treap over free block-list nodes, keyed by offset. Requests of at least `high_threshold` bytes
/// are placed at the highest fitting address (carved from the back of the block); others at the lowest.
#[derive(Debug)]
pub(crate) struct AddressIndex {
    root: u32,
    /// Scratch stack for `update` and `remove`.
    path: Vec<u32>,
    rng: u64,
    high_threshold: u64,
}

/// Treap data of a free node: subtree maximum size (bytes) and heap priority.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TreapExtra {
    max: u64,
    prio: u32,
}

#[inline]
fn max_of(nodes: &[Node<TreapExtra>], t: u32) -> u64 {
    if t == NIL {
        0
    } else {
        nodes[t as usize].x.max
    }
}

#[inline]
fn update(nodes: &mut [Node<TreapExtra>], t: u32) {
    let n = nodes[t as usize];
    nodes[t as usize].x.max = n.size.max(max_of(nodes, n.a)).max(max_of(nodes, n.b));
}

/// Splits `t` into keys `< key` and keys `>= key`.
fn split(nodes: &mut [Node<TreapExtra>], t: u32, key: u64) -> (u32, u32) {
    if t == NIL {
        return (NIL, NIL);
    }
    if nodes[t as usize].offset < key {
        let (l, r) = split(nodes, nodes[t as usize].b, key);
        nodes[t as usize].b = l;
        update(nodes, t);
        (t, r)
    } else {
        let (l, r) = split(nodes, nodes[t as usize].a, key);
        nodes[t as usize].a = r;
        update(nodes, t);
        (l, t)
    }
}

/// Joins `l` and `r` where every key of `l` is below every key of `r`.
fn merge(nodes: &mut [Node<TreapExtra>], l: u32, r: u32) -> u32 {
    if l == NIL {
        return r;
    }
    if r == NIL {
        return l;
    }
    if nodes[l as usize].x.prio > nodes[r as usize].x.prio {
        let m = merge(nodes, nodes[l as usize].b, r);
        nodes[l as usize].b = m;
        update(nodes, l);
        l
    } else {
        let m = merge(nodes, l, nodes[r as usize].a);
        nodes[r as usize].a = m;
        update(nodes, r);
        r
    }
}

/// Inserts node `n` (priority and size set) into the treap rooted at `root`; returns the new root. One
/// descent to the first node of lower priority, raising the maxima on the way (the subtree gains `n`), then
/// a split of that subtree at `n`'s key.
fn insert(nodes: &mut [Node<TreapExtra>], root: u32, n: u32) -> u32 {
    let Node { offset: key, size, x: TreapExtra { prio, .. }, .. } = nodes[n as usize];
    let (mut parent, mut left, mut t) = (NIL, false, root);
    while t != NIL && nodes[t as usize].x.prio >= prio {
        let node = &mut nodes[t as usize];
        node.x.max = node.x.max.max(size);
        parent = t;
        left = key < node.offset;
        t = if left { node.a } else { node.b };
    }
    let (l, r) = split(nodes, t, key);
    nodes[n as usize].a = l;
    nodes[n as usize].b = r;
    update(nodes, n);
    if parent == NIL {
        return n;
    }
    if left {
        nodes[parent as usize].a = n;
    } else {
        nodes[parent as usize].b = n;
    }
    root
}

/// Removes the node keyed `key` from the treap rooted at `root`; returns the new root. One descent
/// (recorded in `path`), a merge of the node's children, then the maxima of the path are recomputed bottom-up
/// until one does not change (above it none can).
fn remove(nodes: &mut [Node<TreapExtra>], root: u32, key: u64, path: &mut Vec<u32>) -> u32 {
    path.clear();
    let mut t = root;
    while t != NIL && nodes[t as usize].offset != key {
        path.push(t);
        t = if key < nodes[t as usize].offset { nodes[t as usize].a } else { nodes[t as usize].b };
    }
    if t == NIL {
        debug_assert!(false, "treap remove of a missing key");
        return root;
    }
    let removed = nodes[t as usize].size;
    let m = merge(nodes, nodes[t as usize].a, nodes[t as usize].b);
    let Some(&p) = path.last() else { return m };
    if nodes[p as usize].a == t {
        nodes[p as usize].a = m;
    } else {
        nodes[p as usize].b = m;
    }
    for &p in path.iter().rev() {
        if nodes[p as usize].x.max > removed {
            break; // the maximum is another node, still there
        }
        update(nodes, p);
    }
    root
}

/// Lowest-offset node with `size >= need`: one iterative descent, O(depth). Invariant of the loop: the
/// subtree of `t` holds such a node (its maximum is at least `need`), so if neither its left subtree nor
/// `t` does, its right subtree does.
#[inline]
fn lowest_fit(nodes: &[Node<TreapExtra>], mut t: u32, need: u64) -> Option<u32> {
    if max_of(nodes, t) < need {
        return None;
    }
    loop {
        let n = &nodes[t as usize];
        if max_of(nodes, n.a) >= need {
            t = n.a;
        } else if n.size >= need {
            return Some(t);
        } else {
            t = n.b;
        }
    }
}

/// Highest-offset node with `size >= need` (the mirror of [`lowest_fit`]).
#[inline]
fn highest_fit(nodes: &[Node<TreapExtra>], mut t: u32, need: u64) -> Option<u32> {
    if max_of(nodes, t) < need {
        return None;
    }
    loop {
        let n = &nodes[t as usize];
        if max_of(nodes, n.b) >= need {
            t = n.b;
        } else if n.size >= need {
            return Some(t);
        } else {
            t = n.a;
        }
    }
}

/// Lowest-offset node with `offset >= lo` and `size >= need`.
fn find_first(nodes: &[Node<TreapExtra>], t: u32, lo: u64, need: u64) -> Option<u32> {
    if t == NIL || nodes[t as usize].x.max < need {
        return None;
    }
    let n = &nodes[t as usize];
    if n.offset < lo {
        return find_first(nodes, n.b, lo, need);
    }
    // Every key of the right subtree is >= lo; the left subtree may straddle lo.
    if let Some(x) = find_first(nodes, n.a, lo, need) {
        return Some(x);
    }
    if n.size >= need {
        return Some(t);
    }
    find_first(nodes, n.b, 0, need)
}

/// Highest-offset node with `offset < hi` and `size >= need`.
fn find_last(nodes: &[Node<TreapExtra>], t: u32, hi: u64, need: u64) -> Option<u32> {
    if t == NIL || nodes[t as usize].x.max < need {
        return None;
    }
    let n = &nodes[t as usize];
    if n.offset >= hi {
        return find_last(nodes, n.a, hi, need);
    }
    if let Some(x) = find_last(nodes, n.b, hi, need) {
        return Some(x);
    }
    if n.size >= need {
        return Some(t);
    }
    find_last(nodes, n.a, u64::MAX, need)
}

impl AddressIndex {
    pub(crate) fn new(high_threshold: u64) -> Self {
        AddressIndex { root: NIL, path: Vec::new(), rng: 0x853c_49e6_748f_ea9b, high_threshold }
    }

    #[inline]
    fn next_prio(&mut self) -> u32 {
        // xorshift64*: deterministic, so runs are reproducible.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        (self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as u32
    }
}

impl FreeIndex for AddressIndex {
    type Extra = TreapExtra;

    fn insert(&mut self, nodes: &mut [Node<TreapExtra>], n: u32) {
        let prio = self.next_prio();
        let node = &mut nodes[n as usize];
        node.a = NIL;
        node.b = NIL;
        node.x.max = node.size;
        node.x.prio = prio;
        self.root = insert(nodes, self.root, n);
    }

    fn remove(&mut self, nodes: &mut [Node<TreapExtra>], n: u32) {
        self.root = remove(nodes, self.root, nodes[n as usize].offset, &mut self.path);
    }

    /// The key changed without changing the order: walk the old key's path and refresh the maxima, O(log n).
    fn update(&mut self, nodes: &mut [Node<TreapExtra>], n: u32, old_offset: u64, _old_size: u64) {
        self.path.clear();
        let mut t = self.root;
        while t != NIL && t != n {
            self.path.push(t);
            t = if old_offset < nodes[t as usize].offset { nodes[t as usize].a } else { nodes[t as usize].b };
        }
        debug_assert_eq!(t, n, "updated node not found on its old key's path");
        if t == NIL {
            return;
        }
        update(nodes, n);
        for &p in self.path.iter().rev() {
            update(nodes, p);
        }
    }

    fn find(&mut self, nodes: &[Node<TreapExtra>], size: u64, align: u64, granule: u64) -> Option<(u32, Placement)> {
        let slack = align - granule.min(align);
        // The first block of this length always fits; no later candidate needs checking.
        let sure = size.checked_add(slack);
        if size >= self.high_threshold {
            if slack == 0 {
                return highest_fit(nodes, self.root, size).map(|c| (c, Placement::Back));
            }
            let stop = sure.and_then(|s| highest_fit(nodes, self.root, s)).map(|n| nodes[n as usize].offset);
            let mut hi = u64::MAX;
            while let Some(c) = find_last(nodes, self.root, hi, size) {
                let node = &nodes[c as usize];
                if fit_back(node.offset, node.size, size, align).is_some() {
                    return Some((c, Placement::Back));
                }
                if stop.is_some_and(|s| node.offset <= s) {
                    break;
                }
                hi = node.offset;
            }
            return None;
        }
        if slack == 0 {
            // Every block of `size` bytes fits: the first one is the answer.
            return lowest_fit(nodes, self.root, size).map(|c| (c, Placement::Front));
        }
        // Where to stop, computed only once the first candidate turned out misaligned.
        let mut stop: Option<Option<u64>> = None;
        let mut candidate = lowest_fit(nodes, self.root, size);
        while let Some(c) = candidate {
            let node = &nodes[c as usize];
            if fit_front(node.offset, node.size, size, align).is_some() {
                return Some((c, Placement::Front));
            }
            let stop = *stop.get_or_insert_with(|| {
                sure.and_then(|s| lowest_fit(nodes, self.root, s)).map(|n| nodes[n as usize].offset)
            });
            if stop.is_some_and(|s| node.offset >= s) {
                break;
            }
            candidate = find_first(nodes, self.root, node.offset + 1, size);
        }
        None
    }

    fn largest(&self, nodes: &[Node<TreapExtra>]) -> u64 {
        max_of(nodes, self.root)
    }

    fn clear(&mut self) {
        self.root = NIL;
    }
}

/// Address-ordered first-fit sub-allocator over `[0, capacity)`. See the [module docs](self).
#[derive(Debug)]
pub struct FirstFit(pub(crate) BlockList<AddressIndex>);

block_list_strategy!(FirstFit, "first-fit", |_| AddressIndex::new(u64::MAX));

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::SubAllocator;

    #[test]
    fn picks_the_lowest_fitting_hole() {
        let mut h = FirstFit::with_granule(100, 1).unwrap();
        let offs: Vec<u64> = [10, 12, 10, 30, 10, 12, 16].iter().map(|&s| h.alloc(s, 1).unwrap().offset).collect();
        for i in [1, 3, 5] {
            h.free_at(offs[i]).unwrap();
        }
        assert_eq!(h.alloc(13, 1).unwrap().offset, offs[3]);
        assert_eq!(h.alloc(5, 1).unwrap().offset, offs[1]);
        assert_eq!(h.alloc(8, 1).unwrap().offset, offs[3] + 13, "7 bytes left in the first hole");
        assert_eq!(h.alloc(7, 1).unwrap().offset, offs[1] + 5);
        h.0.check_invariants();
    }

    #[test]
    fn alignment_skips_misaligned_candidates() {
        let mut h = FirstFit::with_granule(1 << 16, 16).unwrap();
        let a = h.alloc(16, 1).unwrap(); // [0,16)
        let b = h.alloc(64, 1).unwrap(); // [16,80)
        let _c = h.alloc(16, 1).unwrap(); // [80,96)
        h.free(b).unwrap(); // hole [16,80): 64 long but no 64-aligned 64-byte start
        let d = h.alloc(64, 64).unwrap();
        assert_eq!(d.offset, 128);
        let e = h.alloc(32, 32).unwrap();
        assert_eq!(e.offset, 32);
        assert_eq!(a.offset, 0);
        h.0.check_invariants();
    }

    /// In-order keys ascending, priorities max-heap ordered, every `x.max` exact; returns (count, max).
    fn check_treap(nodes: &[Node<TreapExtra>], t: u32, lo: u64, hi: u64) -> (usize, u64) {
        if t == NIL {
            return (0, 0);
        }
        let n = nodes[t as usize];
        assert!(n.offset >= lo && n.offset < hi, "key order at node {t}");
        for c in [n.a, n.b] {
            assert!(c == NIL || nodes[c as usize].x.prio <= n.x.prio, "heap order at node {t}");
        }
        let (lc, lm) = check_treap(nodes, n.a, lo, n.offset);
        let (rc, rm) = check_treap(nodes, n.b, n.offset + 1, hi);
        assert_eq!(n.x.max, n.size.max(lm).max(rm), "subtree maximum at node {t}");
        (lc + rc + 1, n.x.max)
    }

    #[test]
    fn treap_invariants_hold_under_churn() {
        for threshold in [u64::MAX, 4096] {
            let mut h = BlockList::new(1 << 22, 64, AddressIndex::new(threshold)).unwrap();
            let mut live = Vec::new();
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            for _ in 0..3000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if !x.is_multiple_of(3) || live.is_empty() {
                    if let Ok(a) = h.alloc(1 + (x >> 8) % 20_000, 1 << ((x >> 40) % 9)) {
                        live.push(a);
                    }
                } else {
                    h.free(live.swap_remove((x >> 20) as usize % live.len())).unwrap();
                }
                let (count, max) = check_treap(h.nodes(), h.index.root, 0, u64::MAX);
                assert_eq!((count, max), (h.stats().free_blocks, h.stats().largest_free));
            }
        }
    }

    #[test]
    fn high_threshold_places_at_the_top() {
        let mut h = BlockList::new(1024, 16, AddressIndex::new(256)).unwrap();
        assert_eq!(h.alloc(16, 1).unwrap().offset, 0);
        assert_eq!(h.alloc(256, 1).unwrap().offset, 768);
        assert_eq!(h.alloc(300, 128).unwrap().offset, 384);
        h.check_invariants();
    }
}
