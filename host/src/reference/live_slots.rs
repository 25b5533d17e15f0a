//! Records of live blocks named by [`Handle`]s, and the offset index built on demand for `free_at`.
//!
//! [`LiveSlots`] is a slot array with a LIFO list of spare slots: `insert` takes the most recently freed
//! slot (usually still in cache, since a free usually precedes the next allocation), `take` validates a
//! handle against the slot (live, same offset, and in debug builds the same generation) and frees it.
//! Both are O(1) with no hashing. [`OffsetIndex`] maps offsets to record indices; it is empty and costs
//! nothing until the first `free_at`, and is then kept up to date.
//!
//! # Invariants
//! - A slot is live iff its offset is not `SPARE`; the spare list holds exactly the other slots.
//! - In debug builds `generations[i]` counts the times slot `i` became live; a handle carries the count of
//!   its block.
//! - When built, the offset index maps exactly the live slots' offsets to their indices.

use super::offset_table::OffsetTable;
use super::Handle;

/// Offset of a spare slot (offsets are at most 2^48).
const SPARE: u64 = u64::MAX;

/// Offset → record index of the live blocks, built on first use.
#[derive(Clone, Debug, Default)]
pub(crate) struct OffsetIndex(Option<OffsetTable<u32>>);

impl OffsetIndex {
    /// Is the index built (and so to be kept up to date)?
    #[inline]
    pub(crate) fn is_built(&self) -> bool {
        self.0.is_some()
    }

    /// Builds the index from `live` (offset, record index) unless it exists.
    pub(crate) fn build(&mut self, live: impl Iterator<Item = (u64, u32)>) {
        if self.0.is_none() {
            let mut t = OffsetTable::new(0);
            live.for_each(|(o, i)| t.insert(o, i));
            self.0 = Some(t);
        }
    }

    /// Record index of the live block at `offset` (the index must be built).
    #[inline]
    pub(crate) fn get(&self, offset: u64) -> Option<u32> {
        self.0.as_ref().and_then(|t| t.get(offset))
    }

    /// Records a new live block (no-op until built).
    #[inline]
    pub(crate) fn insert(&mut self, offset: u64, index: u32) {
        if let Some(t) = &mut self.0 {
            t.insert(offset, index);
        }
    }

    /// Forgets a freed live block (no-op until built).
    #[inline]
    pub(crate) fn remove(&mut self, offset: u64) {
        if let Some(t) = &mut self.0 {
            t.remove(offset);
        }
    }

    /// Drops the index (it is rebuilt on the next use).
    pub(crate) fn clear(&mut self) {
        self.0 = None;
    }
}

/// Per-slot generation counters, kept in debug builds only.
#[derive(Clone, Debug, Default)]
pub(crate) struct Generations(#[cfg(debug_assertions)] Vec<u32>);

impl Generations {
    /// Starts a new generation of slot `i` (which may be one past the end) and returns it.
    #[inline]
    pub(crate) fn bump(&mut self, i: usize) -> u32 {
        #[cfg(debug_assertions)]
        {
            if i >= self.0.len() {
                self.0.resize(i + 1, 0);
            }
            self.0[i] = self.0[i].wrapping_add(1);
            self.0[i]
        }
        #[cfg(not(debug_assertions))]
        {
            let _ = i;
            0
        }
    }

    /// The current generation of slot `i` (0 in release builds).
    #[inline]
    pub(crate) fn current(&self, i: usize) -> u32 {
        #[cfg(debug_assertions)]
        {
            self.0.get(i).copied().unwrap_or(0)
        }
        #[cfg(not(debug_assertions))]
        {
            let _ = i;
            0
        }
    }

    /// Does `h` carry slot `h.index()`'s current generation? (Always true in release builds.)
    #[inline]
    pub(crate) fn matches(&self, h: Handle) -> bool {
        #[cfg(debug_assertions)]
        {
            self.0.get(h.index()) == Some(&h.generation())
        }
        #[cfg(not(debug_assertions))]
        {
            let _ = h;
            true
        }
    }
}

/// Live-block records `T` named by handles. See the [module docs](self).
#[derive(Clone, Debug)]
pub(crate) struct LiveSlots<T: Copy> {
    slots: Vec<(u64, T)>,
    spare: Vec<u32>,
    len: usize,
    generations: Generations,
    by_offset: OffsetIndex,
}

impl<T: Copy> Default for LiveSlots<T> {
    fn default() -> Self {
        LiveSlots {
            slots: Vec::new(),
            spare: Vec::new(),
            len: 0,
            generations: Generations::default(),
            by_offset: OffsetIndex::default(),
        }
    }
}

impl<T: Copy> LiveSlots<T> {
    /// Number of live records.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Records a live block at `offset` and returns its handle. O(1).
    #[inline]
    pub(crate) fn insert(&mut self, offset: u64, value: T) -> Handle {
        debug_assert_ne!(offset, SPARE);
        let i = match self.spare.pop() {
            Some(i) => {
                self.slots[i as usize] = (offset, value);
                i
            }
            None => {
                self.slots.push((offset, value));
                (self.slots.len() - 1) as u32
            }
        };
        self.len += 1;
        self.by_offset.insert(offset, i);
        Handle::new(i, self.generations.bump(i as usize))
    }

    /// The record of the live block named by `h` at `offset`, if `h` names it. O(1).
    #[inline]
    pub(crate) fn get(&self, h: Handle, offset: u64) -> Option<T> {
        match self.slots.get(h.index()) {
            Some(&(o, v)) if o == offset && offset != SPARE && self.generations.matches(h) => Some(v),
            _ => None,
        }
    }

    /// Removes and returns the record named by `h` at `offset`, if `h` names a live block there. O(1).
    #[inline]
    pub(crate) fn take(&mut self, h: Handle, offset: u64) -> Option<T> {
        let v = self.get(h, offset)?;
        self.slots[h.index()].0 = SPARE;
        self.spare.push(h.index() as u32);
        self.len -= 1;
        self.by_offset.remove(offset);
        Some(v)
    }

    /// The handle of the live block at `offset` (builds the offset index on first use).
    pub(crate) fn handle_at(&mut self, offset: u64) -> Option<Handle> {
        if !self.by_offset.is_built() {
            let live = self.slots.iter().enumerate().filter(|s| s.1 .0 != SPARE).map(|(i, s)| (s.0, i as u32));
            self.by_offset.build(live);
        }
        let i = self.by_offset.get(offset)?;
        Some(self.handle_of(i as usize))
    }

    /// Is a live block at `offset`? O(live) unless the offset index is built.
    pub(crate) fn contains_offset(&self, offset: u64) -> bool {
        if self.by_offset.is_built() {
            self.by_offset.get(offset).is_some()
        } else {
            offset != SPARE && self.slots.iter().any(|s| s.0 == offset)
        }
    }

    /// The current handle of slot `i`.
    #[inline]
    fn handle_of(&self, i: usize) -> Handle {
        Handle::new(i as u32, self.generations.current(i))
    }

    /// Every live `(offset, record, handle)`, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, T, Handle)> + '_ {
        self.slots.iter().enumerate().filter(|s| s.1 .0 != SPARE).map(|(i, &(o, v))| (o, v, self.handle_of(i)))
    }

    /// Moves every live record to `to(offset)` (compaction); handles stay valid.
    pub(crate) fn relocate(&mut self, mut to: impl FnMut(u64, &mut T) -> u64) {
        for s in &mut self.slots {
            if s.0 != SPARE {
                s.0 = to(s.0, &mut s.1);
            }
        }
        self.by_offset.clear();
    }

    /// Forgets every record (handles given out before stay invalid: generations are kept).
    pub(crate) fn clear(&mut self) {
        self.spare.clear();
        self.spare.extend((0..self.slots.len() as u32).rev());
        self.slots.iter_mut().for_each(|s| s.0 = SPARE);
        self.len = 0;
        self.by_offset.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_checked_and_slots_reused() {
        let mut s: LiveSlots<u32> = LiveSlots::default();
        let a = s.insert(100, 1);
        let b = s.insert(200, 2);
        assert_eq!(s.get(a, 100), Some(1));
        assert_eq!(s.get(a, 200), None, "handle of another offset");
        assert_eq!(s.take(a, 100), Some(1));
        assert_eq!(s.take(a, 100), None, "double take");
        let c = s.insert(100, 3);
        assert_eq!(c.index(), a.index(), "LIFO reuse of the freed slot");
        if cfg!(debug_assertions) {
            assert_eq!(s.get(a, 100), None, "stale generation");
        }
        assert_eq!(s.handle_at(200), Some(b));
        assert_eq!(s.handle_at(100), Some(c));
        assert_eq!(s.take(c, 100), Some(3));
        assert_eq!(s.handle_at(100), None);
        assert!(s.contains_offset(200) && !s.contains_offset(100));
        assert_eq!(s.len(), 1);
        s.relocate(|o, _| o - 50);
        assert_eq!((s.get(b, 150), s.handle_at(150)), (Some(2), Some(b)));
        s.clear();
        assert_eq!((s.len(), s.get(b, 150), s.get(Handle::NONE, 0)), (0, None, None));
    }
}
