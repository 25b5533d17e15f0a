//! The seeded alloc/free workload and the allocator adapters shared by the `strategies` criterion bench and
//! the `strategies_icount` instruction-count harness (so both measure exactly the same operation stream).

use std::alloc::Layout;
use std::mem::MaybeUninit;
use std::ptr::NonNull;

use gpuheap::reference::caching::{CachingAllocator, CachingConfig};
use gpuheap::reference::{AllocError, Allocation, BestFit, Buddy, FirstFit, Handle, Slab, SubAllocator, Tiered, Tlsf};
use gpuheap::testing::SplitMix64;

pub const CAPACITY: u64 = 128 << 30;
pub const LIVE: usize = 100_000;
pub const STREAM: usize = 1 << 20;
pub const UNIT: u64 = 256;
pub const RLSF_UNIT: u64 = 1024;

pub struct Workload {
    pub prefill: Vec<u64>,
    pub victims: Vec<u32>,
    pub sizes: Vec<u64>,
}

/// A size of the workload's mix: log-uniform within three bands (70 % 64 B–64 KiB,
/// 29 % 64 KiB–1 MiB, 1 % 1–64 MiB).
fn size(rng: &mut SplitMix64) -> u64 {
    let band = rng.next_u64() % 100;
    let (lo, hi) = match band {
        0..70 => (6.0, 16.0),
        70..99 => (16.0, 20.0),
        _ => (20.0, 26.0),
    };
    2f64.powf(lo + (hi - lo) * rng.unit()) as u64
}

impl Workload {
    pub fn new() -> Self {
        let mut rng = SplitMix64::new(0x5eed_0f6a_110c);
        let prefill = (0..LIVE).map(|_| size(&mut rng)).collect();
        let victims = (0..STREAM).map(|_| (rng.next_u64() % LIVE as u64) as u32).collect();
        let sizes = (0..STREAM).map(|_| size(&mut rng)).collect();
        Workload { prefill, victims, sizes }
    }
}

/// One alloc+free pair at stream position `i` (taken modulo [`STREAM`]): frees the block in the victim's
/// slot, if any, and allocates the next size into it. Returns whether the request failed (the slot is then
/// left empty). The one step of every harness of this workload.
#[inline(always)]
pub fn pair<B: Bench>(b: &mut B, slots: &mut [Option<B::Handle>], w: &Workload, i: usize) -> bool {
    let i = i % STREAM;
    let v = w.victims[i] as usize;
    if let Some(h) = slots[v].take() {
        b.free(h);
    }
    let h = b.alloc(std::hint::black_box(w.sizes[i]));
    let failed = h.is_none();
    slots[v] = h;
    failed
}

/// Thread CPU time in nanoseconds (`CLOCK_THREAD_CPUTIME_ID`): on a shared build machine wall time also
/// counts the time the thread waits for a core.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable `timespec`; `clock_gettime` only writes it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "CLOCK_THREAD_CPUTIME_ID unavailable");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The minimal interface the benchmark drives.
pub trait Bench {
    type Handle: Copy;
    fn alloc(&mut self, size: u64) -> Option<Self::Handle>;
    fn free(&mut self, h: Self::Handle);
    /// The allocator's counters after the run, where it has them.
    fn report(&self) -> String {
        String::new()
    }
}

/// One of our strategies, keeping each live block's whole [`Allocation`] (`Option<Allocation>`: 24 bytes).
pub struct Ours<A>(pub A);

impl<A: SubAllocator> Bench for Ours<A> {
    type Handle = Allocation;
    #[inline]
    fn alloc(&mut self, size: u64) -> Option<Allocation> {
        self.0.alloc(size, 1).ok()
    }
    #[inline]
    fn free(&mut self, h: Allocation) {
        self.0.free(h).expect("live block");
    }
    fn report(&self) -> String {
        report_stats(&self.0)
    }
}

/// The end state of one of our strategies: live and free blocks, largest free block.
fn report_stats(a: &dyn SubAllocator) -> String {
    let s = a.stats();
    format!("{} live, {} free blocks, largest free {} B", s.live_blocks, s.free_blocks, s.largest_free)
}

/// Our block-list strategies (first-fit, best-fit, TLSF) freed by the handle alone, the 8 bytes a caller
/// needs to keep per live block (`Option<Handle>`: 8 bytes).
pub struct ByHandle<A>(pub A);

/// The strategies with a `free_handle`.
pub trait FreeHandle: SubAllocator {
    fn free_handle(&mut self, h: Handle) -> Result<(), AllocError>;
}

macro_rules! free_handle {
    ($($t:ty),*) => {$(
        impl FreeHandle for $t {
            #[inline]
            fn free_handle(&mut self, h: Handle) -> Result<(), AllocError> {
                <$t>::free_handle(self, h)
            }
        }
    )*};
}
free_handle!(BestFit, FirstFit, Tlsf);

impl<A: FreeHandle> Bench for ByHandle<A> {
    type Handle = Handle;
    #[inline]
    fn alloc(&mut self, size: u64) -> Option<Handle> {
        self.0.alloc(size, 1).ok().map(|a| a.handle)
    }
    #[inline]
    fn free(&mut self, h: Handle) {
        self.0.free_handle(h).expect("live block");
    }
    fn report(&self) -> String {
        report_stats(&self.0)
    }
}

pub struct OffsetAlloc(pub offset_allocator::Allocator<u32>);

impl Bench for OffsetAlloc {
    type Handle = offset_allocator::Allocation<u32>;
    #[inline]
    fn alloc(&mut self, size: u64) -> Option<Self::Handle> {
        self.0.allocate(size.div_ceil(UNIT) as u32)
    }
    #[inline]
    fn free(&mut self, h: Self::Handle) {
        self.0.free(h)
    }
}

pub struct BuddyFrames(pub buddy_system_allocator::FrameAllocator<33>);

impl Bench for BuddyFrames {
    type Handle = (usize, usize);
    #[inline]
    fn alloc(&mut self, size: u64) -> Option<(usize, usize)> {
        let count = size.div_ceil(UNIT) as usize;
        self.0.alloc(count).map(|start| (start, count))
    }
    #[inline]
    fn free(&mut self, (start, count): (usize, usize)) {
        self.0.dealloc(start, count)
    }
}

pub struct Rlsf(pub rlsf::Tlsf<'static, u32, u32, 24, 32>);

impl Bench for Rlsf {
    type Handle = NonNull<u8>;
    #[inline]
    fn alloc(&mut self, size: u64) -> Option<NonNull<u8>> {
        let layout = Layout::from_size_align(size.div_ceil(RLSF_UNIT) as usize, 1).ok()?;
        self.0.allocate(layout)
    }
    #[inline]
    fn free(&mut self, h: NonNull<u8>) {
        // SAFETY: `h` was returned by `allocate` on this same `Tlsf` with alignment 1 and is freed exactly once:
        // the benchmark takes it out of its slot before freeing.
        unsafe { self.0.deallocate(h, 1) }
    }
}

/// Receives each allocator of the comparison, freshly built.
pub trait Visitor {
    fn visit<B: Bench>(&mut self, name: &str, b: B);
}

/// Every allocator of the comparison, in report order: the three crates, then ours. `tlsf`, `best-fit` and
/// `first-fit` keep the 8-byte handle per live block and free by it; `best-fit-allocation` is best-fit
/// keeping the whole allocation, as the other rows of ours do.
pub const NAMES: [&str; 11] = [
    "offset-allocator",
    "rlsf",
    "buddy_system_allocator",
    "tlsf",
    "best-fit",
    "best-fit-allocation",
    "first-fit",
    "buddy",
    "slab",
    "tiered",
    "caching",
];

/// Builds the allocator called `name` (one of [`NAMES`]) and hands it to `v`. Returns false for an unknown name.
pub fn visit<V: Visitor>(name: &str, v: &mut V) -> bool {
    match name {
        "offset-allocator" => {
            v.visit(name, OffsetAlloc(offset_allocator::Allocator::with_max_allocs((CAPACITY / UNIT) as u32, 1 << 20)))
        }
        "rlsf" => {
            let pool: &'static mut [MaybeUninit<u8>] =
                Box::leak(vec![MaybeUninit::uninit(); (CAPACITY / RLSF_UNIT) as usize].into_boxed_slice());
            let mut t = rlsf::Tlsf::new();
            t.insert_free_block(pool);
            v.visit(name, Rlsf(t))
        }
        "buddy_system_allocator" => {
            let mut f = buddy_system_allocator::FrameAllocator::<33>::new();
            f.add_frame(0, (CAPACITY / UNIT) as usize);
            v.visit(name, BuddyFrames(f))
        }
        "tlsf" => v.visit(name, ByHandle(Tlsf::new(CAPACITY).unwrap())),
        "best-fit" => v.visit(name, ByHandle(BestFit::new(CAPACITY).unwrap())),
        "best-fit-allocation" => v.visit(name, Ours(BestFit::new(CAPACITY).unwrap())),
        "first-fit" => v.visit(name, ByHandle(FirstFit::new(CAPACITY).unwrap())),
        "buddy" => v.visit(name, Ours(Buddy::new(CAPACITY).unwrap())),
        "slab" => v.visit(name, Ours(Slab::with_backing(Box::new(BestFit::new(CAPACITY).unwrap())).unwrap())),
        "tiered" => v.visit(name, Ours(Tiered::new(CAPACITY).unwrap())),
        "caching" => v.visit(name, Ours(CachingAllocator::new(CachingConfig::new(CAPACITY)).unwrap())),
        _ => return false,
    }
    true
}
