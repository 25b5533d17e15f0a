//! The device handle table: handle → (offset, size, pinned), and
//! [`resolve`] for user kernels.
//!
//! The table is an array of [`HandleEntry`] in device memory, rewritten by
//! the compaction plan kernel (new offsets). Two owners use it:
//!
//! * a host-managed region (`gpuheap::compaction::CompactHeap`): the host
//!   allocates, frees, pins and unpins handles and uploads the table before
//!   launches that use it;
//! * the device heap's movable region ([`super::movable`]): kernels allocate
//!   and free handles themselves (`handle_alloc`, `handle_free`), the host pins and
//!   unpins between launches.
//!
//! A user kernel receives a [`DeviceHandleTable`] by value in its parameters
//! and calls [`resolve`] when it runs (or, with the heap's `Heap` handle,
//! [`super::movable::resolve`], which also orders its reads after a concurrent
//! `handle_alloc` in the same launch).
//!
//! # Rules for kernels
//!
//! * Resolve a handle inside the kernel that uses it; **never keep a resolved
//!   pointer across a compaction** (not in memory, not in a later launch).
//! * Never run concurrently with a compaction of the same region (gpuheap
//!   launches everything on one stream, in order).
//! * A pointer is valid for the block's `size` bytes only.

use crate::arch::index::{global_thread_id, grid_threads};

/// [`HandleEntry::flags`] bit: the entry names a live block.
pub const ENTRY_LIVE: u32 = 1;
/// [`HandleEntry::flags`] bit: the block is pinned (never moved).
pub const ENTRY_PINNED: u32 = 2;

/// One handle-table entry (24 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct HandleEntry {
    /// Byte offset of the block in its region.
    pub offset: u64,
    /// Size of the block in bytes (as requested; the layout rounds it up to
    /// [`super::GRANULE`]).
    pub size: u64,
    /// [`ENTRY_LIVE`] | [`ENTRY_PINNED`].
    pub flags: u32,
    /// Generation of the entry: a handle is valid only while its high 32 bits
    /// equal it (so a freed and reused entry rejects stale handles).
    pub generation: u32,
}

/// What a kernel needs to resolve handles: passed by value in its parameter
/// struct.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct DeviceHandleTable {
    /// Device address of the `len` entries.
    pub entries: u64,
    /// Device address of the region the offsets are relative to.
    pub region: u64,
    /// Number of entries.
    pub len: u32,
    /// Zero.
    pub reserved: u32,
}

/// Splits a handle into (table index, generation).
#[inline(always)]
pub fn split_handle(handle: u64) -> (u32, u32) {
    (handle as u32, (handle >> 32) as u32)
}

/// Bits of a generation that count the reuses of one entry; the bits above
/// them are the region's tag ([`region_generation`]), so that a handle of one
/// region never names a live entry of another (it is `InvalidHandle` there).
pub const GEN_COUNTER_BITS: u32 = 20;
/// The reuse counter's mask in a generation.
pub const GEN_COUNTER_MASK: u32 = (1 << GEN_COUNTER_BITS) - 1;
/// Region tags: 1..=`REGION_TAGS`.
pub const REGION_TAGS: u32 = u32::MAX >> GEN_COUNTER_BITS;

/// The generation an entry of the region tagged `tag` (1..=[`REGION_TAGS`],
/// reduced modulo the tag space otherwise) holds before its first use.
#[inline(always)]
pub const fn region_generation(tag: u32) -> u32 {
    (tag % REGION_TAGS + 1) << GEN_COUNTER_BITS
}

/// The generation after `g` for the entry's next use: the region's tag (the
/// bits above [`GEN_COUNTER_BITS`]) is kept, the counter advances and skips
/// 0, so no generation is 0 and a stale handle is rejected until the counter
/// wraps (2^20 - 1 reuses of one entry).
#[inline(always)]
pub const fn next_generation(g: u32) -> u32 {
    let c = g.wrapping_add(1) & GEN_COUNTER_MASK;
    (g & !GEN_COUNTER_MASK) | if c == 0 { 1 } else { c }
}

/// The handle for table index `index` at `generation`.
#[inline(always)]
pub fn make_handle(index: u32, generation: u32) -> u64 {
    (generation as u64) << 32 | index as u64
}

/// The entry of a live `handle`, or `None` for an index out of range, a free
/// entry or a stale generation.
///
/// # Safety
/// `table.entries` addresses `table.len` readable entries that no one writes
/// during the call (no compaction runs concurrently).
#[inline(always)]
pub unsafe fn entry(table: &DeviceHandleTable, handle: u64) -> Option<HandleEntry> {
    let (i, gen) = split_handle(handle);
    if i >= table.len {
        return None;
    }
    // SAFETY: `i < len`; the caller vouches for the table.
    let e = unsafe { (table.entries as *const HandleEntry).add(i as usize).read() };
    (e.flags & ENTRY_LIVE != 0 && e.generation == gen).then_some(e)
}

/// The current address of the block named by `handle`, or null when the
/// handle is not live. Valid until the kernel ends; see the module rules.
///
/// # Safety
/// As for [`entry`]; `table.region` is the region's device address.
#[inline(always)]
pub unsafe fn resolve(table: &DeviceHandleTable, handle: u64) -> *mut u8 {
    // SAFETY: forwarded contract.
    match unsafe { entry(table, handle) } {
        Some(e) => (table.region + e.offset) as *mut u8,
        None => core::ptr::null_mut(),
    }
}

/// Parameters of [`HANDLE_FILL`].
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct HandleFillParams {
    /// The handle table.
    pub table: DeviceHandleTable,
    /// The block to fill.
    pub handle: u64,
    /// The byte value, repeated.
    pub value: u32,
    /// Zero.
    pub reserved: u32,
    /// Device address of a `u64` set to 1 when the handle did not resolve.
    pub failed: u64,
}

/// An example user kernel: resolves `handle` when it runs and writes `value`
/// into every byte of its block (grid-stride). Sets `*failed = 1` when the
/// handle is not live.
///
/// # Safety
/// `table` is a valid table of a live region (see [`resolve`]); `failed`
/// addresses a writable `u64`; no one else accesses the block meanwhile.
pub unsafe fn handle_fill(p: &HandleFillParams) {
    // SAFETY: forwarded contract.
    let Some(e) = (unsafe { entry(&p.table, p.handle) }) else {
        if global_thread_id() == 0 {
            // SAFETY: the caller provides `failed`.
            unsafe { (p.failed as *mut u64).write(1) };
        }
        return;
    };
    let base = (p.table.region + e.offset) as *mut u8;
    let mut i = global_thread_id();
    while i < e.size {
        // SAFETY: `i < size`, inside the block.
        unsafe { base.add(i as usize).write(p.value as u8) };
        i += grid_threads();
    }
}

crate::kernel_entry! {
    /// [`handle_fill`] as a kernel.
    pub static HANDLE_FILL: HandleFillParams = gpuheap_handle_fill => handle_fill;
}
