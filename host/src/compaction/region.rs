//! [`HandleRegion`]: the one set of verbs over a region of relocatable blocks.

use gpuheap_kernels::compact::handle::{DeviceHandleTable, HandleEntry};
use gpuheap_kernels::compact::{LiveBlock, GRANULE};

use super::{BlockInfo, CompactTuning, CompactionReport, Handle, Result};
use crate::analysis::Fragmentation;
use crate::backend::{Backend, BackendError};

/// A region of device memory whose blocks are named by [`Handle`]s and which compacts in place: the
/// handle model of `gpuheap_kernels::compact` ([what moves, what never moves, what a kernel must not
/// do](gpuheap_kernels::compact#handle-model)), behind one set of verbs.
///
/// Two regions implement it, with different allocators behind the same verbs:
///
/// | | [`CompactHeap`](super::CompactHeap) | [`MovableRegion`](crate::device_heap::MovableRegion) |
/// |---|---|---|
/// | memory | a buffer of its own | the movable region of a [`DeviceHeap`](crate::device_heap::DeviceHeap)'s data region |
/// | allocator | first fit over a host map of free ranges | the device's bump cursor and index pool (kernels allocate too) |
/// | handle table | mirrored on the host, uploaded when changed | on the device only (every query reads it back) |
///
/// Both are made on a backend and keep it ([`backend`](Self::backend)): no verb takes a `&Backend`
/// (the owner rule of [`crate::backend`]). Offsets are bytes from [`base`](Self::base); a block
/// occupies its requested size rounded up to [`GRANULE`] (16 bytes).
///
/// Errors of every verb: [`CompactionError::InvalidHandle`](super::CompactionError::InvalidHandle)
/// for a handle that is not live in this region (never allocated, freed, stale, of another region),
/// and backend errors of the read-backs and launches; each verb lists the others.
pub trait HandleRegion {
    /// The backend the region was made on (its memory's owner).
    #[doc(hidden)]
    fn backend(&self) -> &Backend;

    /// Bytes of the region.
    fn capacity(&self) -> u64;

    /// Entries of the handle table: at most this many blocks are live at once.
    #[doc(hidden)]
    fn max_handles(&self) -> u32;

    /// Device address of the region's first byte (block offsets are relative to it).
    #[doc(hidden)]
    fn base(&self) -> u64;

    /// The compaction tuning (tile size, launch geometry).
    #[doc(hidden)]
    fn tuning(&self) -> CompactTuning;

    /// Replaces the compaction tuning (checked when the next compaction runs).
    #[doc(hidden)]
    fn set_tuning(&mut self, tuning: CompactTuning);

    /// Allocates a block of `size` bytes. Never moves anything.
    ///
    /// # Errors
    /// [`ZeroSize`](super::CompactionError::ZeroSize);
    /// [`OutOfMemory`](super::CompactionError::OutOfMemory) when no free range holds the request
    /// (compacting may make room when `total_free ≥ requested`);
    /// [`TooManyHandles`](super::CompactionError::TooManyHandles) when no table entry is available.
    fn alloc(&mut self, size: u64) -> Result<Handle>;

    /// Frees the block of `h`: `h` stops resolving at once.
    ///
    /// # Errors
    /// [`Pinned`](super::CompactionError::Pinned) for a pinned block.
    fn free(&mut self, h: Handle) -> Result<()>;

    /// Pins the block of `h`: it never moves (and cannot be freed) until unpinned as many times.
    ///
    /// # Errors
    /// `InvalidArgument` past 2^24 − 1 nested pins.
    fn pin(&mut self, h: Handle) -> Result<()>;

    /// Undoes one [`pin`](Self::pin).
    ///
    /// # Errors
    /// [`NotPinned`](super::CompactionError::NotPinned).
    fn unpin(&mut self, h: Handle) -> Result<()>;

    /// Where the block of `h` is now (the host side of the device `resolve`).
    fn resolve(&self, h: Handle) -> Result<BlockInfo>;

    /// The device address of the block of `h` now: valid until the next compaction only, unless the
    /// block is pinned.
    #[doc(hidden)]
    fn device_ptr(&self, h: Handle) -> Result<u64> {
        Ok(self.base() + self.resolve(h)?.offset)
    }

    /// The handle table for kernel parameters (`gpuheap_kernels::compact::handle::resolve`), up to
    /// date with every host change.
    #[doc(hidden)]
    fn device_table(&mut self) -> Result<DeviceHandleTable>;

    /// The device handle table read back: one entry per table index (flags: live, pinned, and in the
    /// device heap the pin count in bits 8..).
    #[doc(hidden)]
    fn read_table(&mut self) -> Result<Vec<HandleEntry>>;

    /// The live blocks in address order, as the compaction kernels take them (sizes rounded up to
    /// [`GRANULE`], `handle` = table index, the pinned flag).
    #[doc(hidden)]
    fn layout(&self) -> Result<Vec<LiveBlock>>;

    /// The handle of the live block whose table index is `index` (`None` when that entry is not
    /// live).
    #[doc(hidden)]
    fn handle_of(&self, index: u32) -> Result<Option<Handle>>;

    /// Free ranges `(offset, len)` in address order: every byte not in a live block (in the device
    /// heap freed blocks count as free: the next compaction reclaims them).
    #[doc(hidden)]
    fn free_ranges(&self) -> Result<Vec<(u64, u64)>>;

    /// Fragmentation of the region now ([`region_fragmentation`](super::region_fragmentation) over
    /// [`free_ranges`](Self::free_ranges)).
    fn fragmentation(&self) -> Result<Fragmentation>;

    /// The block of `h` (its size rounded up to [`GRANULE`]), read back.
    fn read(&self, h: Handle) -> Result<Vec<u8>>;

    /// Writes `data` into the block of `h` at byte `at`.
    ///
    /// # Errors
    /// `InvalidArgument` past the block's rounded size.
    fn write(&mut self, h: Handle, at: u64, data: &[u8]) -> Result<()>;

    /// Compacts the region in place: every live, unpinned block slides towards the start of its
    /// segment (pinned blocks split the region into segments), the device handle table is rewritten
    /// by the plan kernel and the allocator's state rebuilt, so that afterwards each segment's free
    /// space is one range at its end. Returns at once, launching nothing, when no block would move.
    ///
    /// # Errors
    /// [`InvalidTuning`](super::CompactionError::InvalidTuning);
    /// [`InvalidLayout`](super::CompactionError::InvalidLayout) when the device heap's table read
    /// back is not a valid layout (a kernel wrote it outside the API).
    fn compact(&mut self) -> Result<CompactionReport>;
}

/// `size` rounded up to [`GRANULE`]: the bytes a block occupies.
pub(crate) fn occupied(size: u64) -> u64 {
    size.div_ceil(GRANULE) * GRANULE
}

/// The offset in the region of bytes `at .. at + len` of `block`.
///
/// # Errors
/// `InvalidArgument` when they pass the block's rounded size.
pub(crate) fn block_bytes(block: BlockInfo, at: u64, len: usize) -> Result<u64> {
    if at.checked_add(len as u64).is_none_or(|e| e > occupied(block.size)) {
        return Err(BackendError::InvalidArgument(format!(
            "bytes {at}..+{len} of a {}-byte block (it occupies {})",
            block.size,
            occupied(block.size)
        ))
        .into());
    }
    Ok(block.offset + at)
}
