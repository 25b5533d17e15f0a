//! The segments by start address ([`SegIndex`]), for the lookups by offset.

use std::collections::VecDeque;

/// Every segment's start address (bytes) with its segment id, sorted by start: a flat ring buffer.
/// A lookup is one binary search; an insertion or removal moves the shorter side, so seeding segments in
/// address order appends, and a replay's segments, created and released mostly at the low end, move few
/// entries. Replaces a `BTreeMap<u64, u32>` (same answers).
#[derive(Debug, Default)]
pub(super) struct SegIndex {
    /// `(start, segment id)`, ascending by start, starts distinct.
    entries: VecDeque<(u64, u32)>,
}

impl SegIndex {
    /// Records segment `id` at `start` (replacing the id of a segment already recorded there).
    pub(super) fn insert(&mut self, start: u64, id: u32) {
        // Seeding in address order appends.
        if self.entries.back().is_none_or(|e| e.0 < start) {
            self.entries.push_back((start, id));
            return;
        }
        let i = self.entries.partition_point(|e| e.0 < start);
        match self.entries.get_mut(i) {
            Some(e) if e.0 == start => e.1 = id,
            _ => self.entries.insert(i, (start, id)),
        }
    }

    /// Forgets the segment at `start`, if any.
    pub(super) fn remove(&mut self, start: u64) {
        let i = self.entries.partition_point(|e| e.0 < start);
        if self.entries.get(i).is_some_and(|e| e.0 == start) {
            self.entries.remove(i);
        }
    }

    /// The id of the segment that starts at `start`.
    pub(super) fn get(&self, start: u64) -> Option<u32> {
        let i = self.entries.partition_point(|e| e.0 < start);
        self.entries.get(i).filter(|e| e.0 == start).map(|e| e.1)
    }

    /// The segment with the highest start at or below `offset`, as `(start, id)`.
    pub(super) fn at_or_before(&self, offset: u64) -> Option<(u64, u32)> {
        let i = self.entries.partition_point(|e| e.0 <= offset);
        i.checked_sub(1).map(|k| self.entries[k])
    }

    /// The segments whose start lies in `[from, to)`, ascending, as `(start, id)`.
    pub(super) fn starting_in(&self, from: u64, to: u64) -> impl Iterator<Item = (u64, u32)> + '_ {
        let i = self.entries.partition_point(|e| e.0 < from);
        self.entries.range(i..).copied().take_while(move |e| e.0 < to)
    }

    /// Every segment, ascending by start, as `(start, id)`.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.entries.iter().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::SegIndex;
    use std::collections::BTreeMap;

    /// Random insertions, removals and lookups answer as a `BTreeMap` does.
    #[test]
    fn seg_index_matches_a_btree_map() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut rnd = move |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        let (mut s, mut b) = (SegIndex::default(), BTreeMap::new());
        for step in 0..20_000u32 {
            let k = rnd(4000) * 512;
            match rnd(3) {
                0 => {
                    s.insert(k, step);
                    b.insert(k, step);
                }
                1 => {
                    s.remove(k);
                    b.remove(&k);
                }
                _ => {}
            }
            let q = rnd(4100 * 512);
            assert_eq!(s.get(k), b.get(&k).copied());
            assert_eq!(s.at_or_before(q), b.range(..=q).next_back().map(|(&a, &i)| (a, i)));
            let e = q + rnd(8) * 512;
            let want: Vec<(u64, u32)> = b.range(q..e).map(|(&a, &i)| (a, i)).collect();
            assert_eq!(s.starting_in(q, e).collect::<Vec<_>>(), want);
        }
        assert_eq!(s.iter().collect::<Vec<_>>(), b.into_iter().collect::<Vec<_>>());
    }
}
