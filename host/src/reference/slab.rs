//! Slab allocation: size classes over pages taken from a backing strategy.
//!
//! Requests up to the largest class are rounded to a size class (powers of two and the midpoints 1.5·2^k,
//! so the rounding waste is at most 50 % and usually below 25 %) and served from a slot of a *page* of that
//! class. Pages are `page_size` bytes, page-aligned, allocated from the backing strategy on demand, and
//! returned to it as soon as their last slot is freed (an empty page is never kept formatted for one class,
//! the fault in mallocMC#256). Larger requests go straight to the backing strategy.
//!
//! # Invariants
//! - Every page is a live block of the backing strategy of exactly `page_size` bytes, aligned to it; a
//!   page's slots are `class` bytes, slot `i` at `page + i * class`; its bitmap has bit `i` set iff slot `i`
//!   is live, and `used` counts the set bits (`0 < used`: empty pages are released at once).
//! - A page is in its class's partial list iff `used < slots`.
//! - `live` holds one record per live object (slot or pass-through block), named by its handle: its page
//!   (`NIL` for a pass-through block), sizes, and the backing allocation's handle.
//!
//! # Time complexity
//! `alloc`: O(slots / 64) for the bitmap scan plus the backing strategy's cost when a page is taken;
//! `free` by handle: O(1) plus the backing cost when a page empties (the page and the backing handle come
//! from the record, no offset lookup). `page_of` (pages by offset) serves only the error path.

use super::compact::{CompactionLayout, CompactionPlan};
use super::live_slots::LiveSlots;
use super::{
    check_request, offset_map, oom, AllocError, AllocatedBlock, Allocation, Handle, OffsetMap, Stats, SubAllocator,
    MAX_BYTES,
};

/// Slab geometry. All values are bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlabConfig {
    /// Page size taken from the backing strategy (a power of two).
    pub page_size: u64,
    /// Smallest size class (a power of two, at most `max_class`).
    pub min_class: u64,
    /// Largest size class; larger requests go to the backing strategy. At most `page_size`.
    pub max_class: u64,
}

impl SlabConfig {
    /// Defaults scaled to a backing of `capacity` bytes: 2 MiB pages (smaller for small capacities),
    /// classes from 64 B up to 64 KiB or `page_size / 8`.
    #[doc(hidden)]
    pub fn for_capacity(capacity: u64) -> Self {
        let page = (capacity / 64).clamp(4096, 2 << 20);
        let page = 1u64 << (63 - page.leading_zeros());
        SlabConfig { page_size: page, min_class: 64, max_class: (64 << 10).min(page / 8) }
    }
}

const NIL: u32 = u32::MAX;

/// A live object: a slot of page `page`, or (`page == NIL`) a block passed through to the backing.
#[derive(Clone, Copy, Debug)]
struct Object {
    /// Requested bytes.
    requested: u64,
    /// Reserved bytes (the class size, or the backing block's size).
    size: u64,
    page: u32,
    /// The backing block's handle (pass-through blocks only).
    backing: Handle,
}

#[derive(Debug)]
struct Page {
    offset: u64,
    /// The page's block in the backing strategy.
    backing: Handle,
    class: u8,
    used: u32,
    partial_pos: u32,
    bitmap: Vec<u64>,
}

/// Slab allocator over a backing strategy. See the module docs.
pub struct Slab {
    backing: Box<dyn SubAllocator + Send>,
    config: SlabConfig,
    classes: Vec<u64>,
    pages: Vec<Page>,
    spare_pages: Vec<u32>,
    page_of: OffsetMap<u32>,
    partial: Vec<Vec<u32>>,
    live: LiveSlots<Object>,
    allocated: u64,
    reserved_in_use: u64,
    name: &'static str,
}

impl std::fmt::Debug for Slab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slab")
            .field("backing", &self.backing.name())
            .field("config", &self.config)
            .field("pages", &self.page_of.len())
            .field("objects", &self.live.len())
            .finish()
    }
}

impl Slab {
    /// Slab over `backing` with [`SlabConfig::for_capacity`] of the backing's capacity.
    ///
    /// # Errors
    /// As [`Slab::new`].
    #[doc(hidden)]
    pub fn with_backing(backing: Box<dyn SubAllocator + Send>) -> Result<Self, AllocError> {
        let config = SlabConfig::for_capacity(backing.capacity());
        Self::new(backing, config)
    }

    /// Slab over `backing` (which should be empty: its live blocks are not known to the slab).
    ///
    /// # Errors
    /// [`AllocError::InvalidConfig`] if the page size or classes are not powers of two, `min_class >
    /// max_class`, or `max_class > page_size`.
    pub fn new(backing: Box<dyn SubAllocator + Send>, config: SlabConfig) -> Result<Self, AllocError> {
        Self::named(backing, config, "slab")
    }

    pub(crate) fn named(
        backing: Box<dyn SubAllocator + Send>,
        config: SlabConfig,
        name: &'static str,
    ) -> Result<Self, AllocError> {
        let SlabConfig { page_size, min_class, max_class } = config;
        if !page_size.is_power_of_two() || page_size > MAX_BYTES || !min_class.is_power_of_two() {
            return Err(AllocError::InvalidConfig("page size and minimum class must be powers of two"));
        }
        if min_class > max_class || max_class > page_size {
            return Err(AllocError::InvalidConfig("need min_class <= max_class <= page_size"));
        }
        let mut classes = Vec::new();
        let mut c = min_class;
        while c <= max_class && classes.len() < 255 {
            classes.push(c);
            let mid = c + c / 2;
            if mid <= max_class && mid > c {
                classes.push(mid);
            }
            c *= 2;
        }
        Ok(Slab {
            backing,
            config,
            partial: vec![Vec::new(); classes.len()],
            classes,
            pages: Vec::new(),
            spare_pages: Vec::new(),
            page_of: offset_map(),
            live: LiveSlots::default(),
            allocated: 0,
            reserved_in_use: 0,
            name,
        })
    }

    /// The size classes in bytes, ascending.
    #[doc(hidden)]
    pub fn classes(&self) -> &[u64] {
        &self.classes
    }

    /// The geometry.
    #[doc(hidden)]
    pub fn config(&self) -> SlabConfig {
        self.config
    }

    /// Number of pages currently taken from the backing strategy.
    #[doc(hidden)]
    pub fn pages(&self) -> usize {
        self.page_of.len()
    }

    /// The backing strategy.
    #[doc(hidden)]
    pub fn backing(&self) -> &dyn SubAllocator {
        &*self.backing
    }

    fn slots(&self, class: usize) -> u32 {
        (self.config.page_size / self.classes[class]) as u32
    }

    fn oom(&self, size: u64) -> AllocError {
        let s = self.backing.stats();
        oom(size, s.free, s.largest_free)
    }

    fn remove_partial(&mut self, p: u32) {
        let Page { class, partial_pos, .. } = self.pages[p as usize];
        let list = &mut self.partial[class as usize];
        list.swap_remove(partial_pos as usize);
        if let Some(&moved) = list.get(partial_pos as usize) {
            self.pages[moved as usize].partial_pos = partial_pos;
        }
        self.pages[p as usize].partial_pos = NIL;
    }

    fn push_partial(&mut self, p: u32) {
        let class = self.pages[p as usize].class as usize;
        self.pages[p as usize].partial_pos = self.partial[class].len() as u32;
        self.partial[class].push(p);
    }

    fn new_page(&mut self, class: usize, size: u64) -> Result<u32, AllocError> {
        let page = match self.backing.alloc(self.config.page_size, self.config.page_size) {
            Ok(a) => a,
            Err(AllocError::OutOfMemory { .. }) => return Err(self.oom(size)),
            Err(e) => return Err(e),
        };
        let words = (self.slots(class) as usize).div_ceil(64);
        let page = Page {
            offset: page.offset,
            backing: page.handle,
            class: class as u8,
            used: 0,
            partial_pos: NIL,
            bitmap: vec![0; words],
        };
        let p = if let Some(p) = self.spare_pages.pop() {
            self.pages[p as usize] = page;
            p
        } else {
            self.pages.push(page);
            (self.pages.len() - 1) as u32
        };
        self.page_of.insert(self.pages[p as usize].offset, p);
        self.push_partial(p);
        Ok(p)
    }

    /// Frees the object at `offset` whose record was just taken.
    #[inline]
    fn release(&mut self, offset: u64, obj: Object) {
        self.allocated -= obj.requested;
        self.reserved_in_use -= obj.size;
        if obj.page == NIL {
            let a = Allocation { offset, size: obj.size, handle: obj.backing };
            self.backing.free(a).expect("a pass-through block is a live backing block");
            return;
        }
        let p = obj.page;
        let class = self.pages[p as usize].class as usize;
        let slots = self.slots(class);
        let page = &mut self.pages[p as usize];
        let slot = ((offset - page.offset) / obj.size) as usize;
        page.bitmap[slot / 64] &= !(1 << (slot % 64));
        let was_full = page.used == slots;
        page.used -= 1;
        if page.used == 0 {
            let a = Allocation { offset: page.offset, size: self.config.page_size, handle: page.backing };
            if !was_full {
                self.remove_partial(p);
            }
            self.page_of.remove(&a.offset);
            self.spare_pages.push(p);
            self.pages[p as usize].bitmap = Vec::new();
            self.backing.free(a).expect("a page is a live backing block");
        } else if was_full {
            self.push_partial(p);
        }
    }

    /// Error path: a free slot of a live page, or free backing memory, is a double free; a live object at
    /// `offset` under another handle is a stale handle.
    fn classify_bad_free(&self, offset: u64, by_handle: bool) -> AllocError {
        let base = offset & !(self.config.page_size - 1);
        let in_free = match self.page_of.get(&base) {
            Some(&p) => {
                let page = &self.pages[p as usize];
                let csize = self.classes[page.class as usize];
                let slot = (offset - base) / csize;
                slot < self.slots(page.class as usize) as u64
                    && page.bitmap[slot as usize / 64] & (1 << (slot % 64)) == 0
            }
            None => self.backing.free_blocks().any(|(o, l)| offset >= o && offset - o < l),
        };
        if in_free {
            AllocError::DoubleFree { offset }
        } else if by_handle && self.live.contains_offset(offset) {
            AllocError::StaleHandle { offset }
        } else {
            AllocError::InvalidFree { offset }
        }
    }
}

impl SubAllocator for Slab {
    fn name(&self) -> &'static str {
        self.name
    }

    fn capacity(&self) -> u64 {
        self.backing.capacity()
    }

    fn alloc(&mut self, size: u64, align: u64) -> Result<Allocation, AllocError> {
        check_request(size, align, 1)?;
        let class = if align <= self.config.page_size {
            self.classes.iter().position(|&c| c >= size && c % align == 0)
        } else {
            None
        };
        let Some(class) = class else {
            let a = match self.backing.alloc(size, align) {
                Ok(a) => a,
                Err(AllocError::OutOfMemory { .. }) => return Err(self.oom(size)),
                Err(e) => return Err(e),
            };
            let handle =
                self.live.insert(a.offset, Object { requested: size, size: a.size, page: NIL, backing: a.handle });
            self.allocated += size;
            self.reserved_in_use += a.size;
            return Ok(Allocation { handle, ..a });
        };
        let p = match self.partial[class].last() {
            Some(&p) => p,
            None => self.new_page(class, size)?,
        };
        let slots = self.slots(class);
        let page = &mut self.pages[p as usize];
        let (w, word) = page.bitmap.iter().enumerate().find(|(_, w)| **w != u64::MAX).expect("partial page has a slot");
        let slot = w as u32 * 64 + (!word).trailing_zeros();
        debug_assert!(slot < slots);
        page.bitmap[w] |= 1 << (slot % 64);
        page.used += 1;
        let csize = self.classes[class];
        let offset = page.offset + slot as u64 * csize;
        if page.used == slots {
            self.remove_partial(p);
        }
        let handle = self.live.insert(offset, Object { requested: size, size: csize, page: p, backing: Handle::NONE });
        self.allocated += size;
        self.reserved_in_use += csize;
        Ok(Allocation { offset, size: csize, handle })
    }

    #[inline]
    fn free(&mut self, a: Allocation) -> Result<(), AllocError> {
        match self.live.take(a.handle, a.offset) {
            Some(obj) => {
                self.release(a.offset, obj);
                Ok(())
            }
            None => Err(self.classify_bad_free(a.offset, true)),
        }
    }

    fn free_at(&mut self, offset: u64) -> Result<(), AllocError> {
        match self.live.handle_at(offset).and_then(|h| self.live.take(h, offset)) {
            Some(obj) => {
                self.release(offset, obj);
                Ok(())
            }
            None => Err(self.classify_bad_free(offset, false)),
        }
    }

    fn stats(&self) -> Stats {
        let b = self.backing.stats();
        Stats {
            capacity: b.capacity,
            allocated: self.allocated,
            reserved_in_use: self.reserved_in_use,
            reserved: b.reserved_in_use,
            free: b.free,
            largest_free: b.largest_free,
            stranded: b.capacity.saturating_sub(self.reserved_in_use + b.free),
            free_blocks: b.free_blocks,
            live_blocks: self.live.len(),
        }
    }

    fn free_blocks(&self) -> Box<dyn Iterator<Item = (u64, u64)> + '_> {
        self.backing.free_blocks()
    }

    fn live_blocks(&self) -> Vec<AllocatedBlock> {
        let mut v: Vec<AllocatedBlock> = self
            .live
            .iter()
            .map(|(offset, o, _)| AllocatedBlock { offset, size: o.size, requested: o.requested })
            .collect();
        v.sort_unstable();
        v
    }

    fn reset(&mut self) {
        self.backing.reset();
        self.pages.clear();
        self.spare_pages.clear();
        self.page_of.clear();
        self.partial.iter_mut().for_each(Vec::clear);
        self.live.clear();
        self.allocated = 0;
        self.reserved_in_use = 0;
    }

    fn release_cached(&mut self) -> u64 {
        self.backing.release_cached()
    }

    /// Units are the backing strategy's: whole pages (objects move with their page) and direct blocks.
    fn compaction_layout(&self) -> CompactionLayout {
        self.backing.compaction_layout()
    }

    /// Pages and pass-through blocks move in the backing strategy, which keeps their handles; objects keep
    /// theirs.
    fn apply_relocation(&mut self, plan: &CompactionPlan) -> Result<(), AllocError> {
        self.backing.apply_relocation(plan)?;
        let t = |o: u64| plan.translate(o).expect("every page and direct block is a unit of the plan");
        for p in self.page_of.values() {
            let page = &mut self.pages[*p as usize];
            page.offset = t(page.offset);
        }
        self.page_of = self.page_of.values().map(|&p| (self.pages[p as usize].offset, p)).collect();
        self.live.relocate(|o, _| t(o));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::BestFit;

    fn slab() -> Slab {
        let cfg = SlabConfig { page_size: 4096, min_class: 64, max_class: 1024 };
        Slab::new(Box::new(BestFit::with_granule(2 * 4096, 256).unwrap()), cfg).unwrap()
    }

    #[test]
    fn empty_pages_return_to_the_backing() {
        // BL-09's kind: pages formatted for 16-byte-class objects must become available to other classes.
        let mut s = slab();
        assert_eq!(s.classes(), &[64, 96, 128, 192, 256, 384, 512, 768, 1024]);
        let small: Vec<Allocation> = (0..128).map(|_| s.alloc(16, 1).unwrap()).collect();
        assert_eq!(s.pages(), 2);
        assert!(s.alloc(1000, 1).is_err(), "both pages are formatted for 64 B");
        for (i, a) in small.into_iter().enumerate() {
            if i % 2 == 0 {
                s.free(a).unwrap();
            } else {
                s.free_at(a.offset).unwrap();
            }
        }
        assert_eq!(s.pages(), 0);
        assert_eq!(s.free_blocks().collect::<Vec<_>>(), vec![(0, 8192)]);
        let big = s.alloc(1000, 1).unwrap();
        assert_eq!(big.size, 1024);
        let direct = s.alloc(4096, 1).unwrap();
        assert_eq!(s.stats().live_blocks, 2);
        assert_eq!(s.free_at(big.offset + 64), Err(AllocError::InvalidFree { offset: big.offset + 64 }));
        let other = s.alloc(1000, 1).unwrap();
        s.free(other).unwrap();
        assert_eq!(s.free(other), Err(AllocError::DoubleFree { offset: other.offset }));
        assert_eq!(s.free_at(other.offset), Err(AllocError::DoubleFree { offset: other.offset }));
        s.free(direct).unwrap();
        assert_eq!(s.free(direct), Err(AllocError::DoubleFree { offset: direct.offset }));
        assert_eq!(
            s.free(Allocation { handle: Handle::NONE, ..big }),
            Err(AllocError::StaleHandle { offset: big.offset })
        );
        s.free(big).unwrap();
        assert_eq!(s.stats().reserved, 0);
    }
}
