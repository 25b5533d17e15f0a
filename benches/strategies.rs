//! ns per alloc+free pair at a steady state of 100k live blocks, for every reference strategy and, in the
//! same run, `offset-allocator`, `rlsf` and `buddy_system_allocator` on the same seeded workload.
//!
//! Workload: sizes 64 B–64 MiB, log-uniform within three bands (70 % 64 B–64 KiB, 29 % 64 KiB–1 MiB,
//! 1 % 1–64 MiB; mean ≈ 200 KiB), 100 000 blocks allocated up front (not measured), then each measured
//! iteration frees a random live block and allocates the next size into its slot. The operation stream
//! (victims and sizes) is precomputed from a fixed seed and identical for every allocator. The range is
//! 128 GiB; allocators without byte granularity get the same sizes in 256-byte units (offset-allocator,
//! `FrameAllocator` frames). rlsf manages real memory, so it gets a 128 MiB pool and sizes in 1 KiB units
//! (its 32-byte granularity makes the smallest requests equal in size). Failed requests leave their slot
//! empty; their count is printed.
//!
//! Run: `cargo bench -p gpuheap --bench strategies -- --warm-up-time 1 --measurement-time 3`

use std::alloc::Layout;
use std::hint::black_box;
use std::mem::MaybeUninit;
use std::ptr::NonNull;

use criterion::{criterion_group, criterion_main, Criterion};
use gpuheap::reference::caching::{CachingAllocator, CachingConfig};
use gpuheap::reference::{BestFit, Buddy, FirstFit, Slab, SubAllocator, Tiered, Tlsf};

const CAPACITY: u64 = 128 << 30;
const LIVE: usize = 100_000;
const STREAM: usize = 1 << 20;
const UNIT: u64 = 256;
const RLSF_UNIT: u64 = 1024;

struct Workload {
    prefill: Vec<u64>,
    victims: Vec<u32>,
    sizes: Vec<u64>,
}

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn size(&mut self) -> u64 {
        let band = self.next() % 100;
        let (lo, hi) = match band {
            0..70 => (6.0, 16.0),
            70..99 => (16.0, 20.0),
            _ => (20.0, 26.0),
        };
        2f64.powf(lo + (hi - lo) * self.unit()) as u64
    }
}

impl Workload {
    fn new() -> Self {
        let mut rng = Rng(0x5eed_0f6a_110c);
        let prefill = (0..LIVE).map(|_| rng.size()).collect();
        let victims = (0..STREAM).map(|_| (rng.next() % LIVE as u64) as u32).collect();
        let sizes = (0..STREAM).map(|_| rng.size()).collect();
        Workload { prefill, victims, sizes }
    }
}

/// The minimal interface the benchmark drives.
trait Bench {
    type Handle: Copy;
    fn alloc(&mut self, size: u64) -> Option<Self::Handle>;
    fn free(&mut self, h: Self::Handle);
}

struct Ours<A>(A);

impl<A: SubAllocator> Bench for Ours<A> {
    type Handle = u64;
    #[inline]
    fn alloc(&mut self, size: u64) -> Option<u64> {
        self.0.alloc(size, 1).ok().map(|a| a.offset)
    }
    #[inline]
    fn free(&mut self, h: u64) {
        self.0.free(h).expect("live block");
    }
}

struct OffsetAlloc(offset_allocator::Allocator<u32>);

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

struct BuddyFrames(buddy_system_allocator::FrameAllocator<33>);

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

struct Rlsf(rlsf::Tlsf<'static, u32, u32, 24, 32>);

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

fn run<B: Bench>(
    c: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    w: &Workload,
    mut b: B,
) {
    let mut slots: Vec<Option<B::Handle>> = w.prefill.iter().map(|&s| b.alloc(s)).collect();
    let mut failed = slots.iter().filter(|s| s.is_none()).count();
    let mut i = 0usize;
    c.bench_function(name, |bench| {
        bench.iter(|| {
            let v = w.victims[i] as usize;
            if let Some(h) = slots[v].take() {
                b.free(h);
            }
            let h = b.alloc(black_box(w.sizes[i]));
            failed += usize::from(h.is_none());
            slots[v] = h;
            i = (i + 1) % STREAM;
        })
    });
    if failed > 0 {
        eprintln!("{name}: {failed} failed requests (slots left empty)");
    }
}

fn strategies(c: &mut Criterion) {
    let w = Workload::new();
    let mut g = c.benchmark_group("alloc_free_pair");
    run(
        &mut g,
        "offset-allocator",
        &w,
        OffsetAlloc(offset_allocator::Allocator::with_max_allocs((CAPACITY / UNIT) as u32, 1 << 20)),
    );
    {
        let pool: &'static mut [MaybeUninit<u8>] =
            Box::leak(vec![MaybeUninit::uninit(); (CAPACITY / RLSF_UNIT) as usize].into_boxed_slice());
        let mut t = rlsf::Tlsf::new();
        t.insert_free_block(pool);
        run(&mut g, "rlsf", &w, Rlsf(t));
    }
    {
        let mut f = buddy_system_allocator::FrameAllocator::<33>::new();
        f.add_frame(0, (CAPACITY / UNIT) as usize);
        run(&mut g, "buddy_system_allocator", &w, BuddyFrames(f));
    }
    run(&mut g, "tlsf", &w, Ours(Tlsf::new(CAPACITY).unwrap()));
    run(&mut g, "best-fit", &w, Ours(BestFit::new(CAPACITY).unwrap()));
    run(&mut g, "first-fit", &w, Ours(FirstFit::new(CAPACITY).unwrap()));
    run(&mut g, "buddy", &w, Ours(Buddy::new(CAPACITY).unwrap()));
    run(&mut g, "slab", &w, Ours(Slab::with_backing(Box::new(BestFit::new(CAPACITY).unwrap())).unwrap()));
    run(&mut g, "tiered", &w, Ours(Tiered::new(CAPACITY).unwrap()));
    run(&mut g, "caching", &w, Ours(CachingAllocator::new(CachingConfig::new(CAPACITY)).unwrap()));
    g.finish();
}

criterion_group!(benches, strategies);
criterion_main!(benches);
