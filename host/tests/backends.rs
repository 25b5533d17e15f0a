//! The foundation kernels end to end on every backend: fill/verify and the
//! warp-aggregated bump allocator; backend selection and errors; the
//! independent-thread-scheduling (ITS) mode of the CPU backend
//! (`CpuMode::Independent`, `GPUHEAP_CPU_WARPS=independent`) itself: mask
//! shapes, exact-mask collectives, errors instead of hangs, replay from a
//! seed.

mod common;

use std::collections::HashSet;

use gpuheap::backend::{Backend, BackendChoice, BackendError, LaunchConfig};
use gpuheap::ops;
use gpuheap_kernels::fill::pattern;

#[test]
fn fill_then_verify_matches_host_pattern() {
    for b in common::backends("fill_then_verify_matches_host_pattern") {
        let mut buf = b.alloc_zeroed(4 * 10_007).unwrap();
        ops::fill(&b, &mut buf, 42).unwrap();
        let words: Vec<u32> = buf.read().unwrap();
        for (i, w) in words.iter().enumerate() {
            assert_eq!(*w, pattern(42, i as u64), "{b:?}: word {i}");
        }
        let (r, _) = ops::verify(&b, &buf, 42).unwrap();
        assert_eq!((r.mismatches, r.first_bad), (0, None), "{b:?}");
    }
}

#[test]
fn verify_reports_corrupted_words() {
    for b in common::backends("verify_reports_corrupted_words") {
        let mut buf = b.alloc_zeroed(4 * 5000).unwrap();
        ops::fill(&b, &mut buf, 7).unwrap();
        buf.write_at(4 * 1234, &[0xde, 0xad, 0xbe, 0xef]).unwrap();
        buf.write_at(4 * 4000, &[1, 2, 3, 4]).unwrap();
        let (r, _) = ops::verify(&b, &buf, 7).unwrap();
        assert_eq!((r.mismatches, r.first_bad), (2, Some(1234)), "{b:?}");
        let (r, _) = ops::verify(&b, &buf, 8).unwrap();
        assert!(r.mismatches > 4900, "{b:?}: another seed must mismatch almost everywhere");
    }
}

#[test]
fn bump_allocations_are_disjoint_aligned_and_dense() {
    for b in common::backends("bump_allocations_are_disjoint_aligned_and_dense") {
        // 1000 threads (not a multiple of the block or warp size).
        let run = ops::bump_alloc(&b, 1000, 24, 1 << 20).unwrap();
        let offs: Vec<u64> = run.offsets.iter().map(|o| o.expect("buffer is large enough")).collect();
        assert_eq!(run.cursor, 1000 * 32, "{b:?}: 24 B rounds to 32 B, nothing else is taken");
        let mut sorted = offs.clone();
        sorted.sort_unstable();
        for (i, o) in sorted.iter().enumerate() {
            assert_eq!(*o, i as u64 * 32, "{b:?}: offsets tile the buffer without gaps or overlaps");
        }
    }
}

#[test]
fn bump_exhaustion_fails_exactly_the_overflowing_requests() {
    for b in common::backends("bump_exhaustion_fails_exactly_the_overflowing_requests") {
        let run = ops::bump_alloc(&b, 300, 100, 112 * 200).unwrap();
        let ok: Vec<u64> = run.offsets.iter().flatten().copied().collect();
        assert_eq!(ok.len(), 200, "{b:?}: exactly capacity / 112 requests succeed");
        assert_eq!(ok.iter().collect::<HashSet<_>>().len(), 200);
        assert!(ok.iter().all(|o| o % 16 == 0 && o + 112 <= 112 * 200));
        // Zero-byte requests fail and take nothing.
        let run = ops::bump_alloc(&b, 64, 0, 1 << 10).unwrap();
        assert!(run.offsets.iter().all(Option::is_none) && run.cursor == 0, "{b:?}");
    }
}

#[test]
fn lockstep_bump_uses_one_atomic_per_warp() {
    // In lockstep mode a warp's 32 lanes share one fetch_add, so the offsets
    // of the lanes of one warp are consecutive.
    let b = Backend::cpu_lockstep();
    let run = ops::bump_alloc(&b, 128, 16, 1 << 20).unwrap();
    for warp in run.offsets.chunks(32) {
        let base = warp[0].unwrap();
        for (lane, o) in warp.iter().enumerate() {
            assert_eq!(o.unwrap(), base + 16 * lane as u64, "lanes of a warp are ranked in lane order");
        }
    }
}

#[test]
fn backend_choice_parses_and_rejects_unknown_names() {
    assert_eq!("CPU".parse::<BackendChoice>().unwrap(), BackendChoice::Cpu);
    assert_eq!("gpu".parse::<BackendChoice>().unwrap(), BackendChoice::Gpu);
    assert_eq!("auto".parse::<BackendChoice>().unwrap(), BackendChoice::Auto);
    assert!(matches!("tpu".parse::<BackendChoice>(), Err(BackendError::UnknownBackend(s)) if s == "tpu"));
    assert!(!Backend::select(BackendChoice::Cpu).unwrap().is_gpu());
}

#[test]
fn gpu_backend_without_a_gpu_is_an_error_not_a_panic() {
    match Backend::gpu() {
        Ok(b) => eprintln!("a GPU is present ({}): nothing to check here", b.describe()),
        Err(e) => {
            assert!(!common::gpu_required(), "GPUHEAP_REQUIRE_GPU=1 but there is no usable GPU: {e}");
            assert!(common::is_no_gpu(&e), "unexpected error: {e}");
            assert!(!e.to_string().is_empty());
            // `auto` falls back to the CPU.
            assert!(!Backend::select(BackendChoice::Auto).unwrap().is_gpu());
        }
    }
}

/// On a GPU: every kernel's largest block as the driver reports it after the JIT equals the
/// occupancy arithmetic's figure for the registers it reports, and a launch over a kernel's limit
/// is refused by name before the driver sees it (the arithmetic itself is unit-tested in
/// `backend::limits`).
#[test]
fn gpu_kernel_limits_follow_the_registers_and_oversized_launches_are_refused() {
    let Some(b) = common::backends("gpu_kernel_limits").into_iter().find(Backend::is_gpu) else { return };
    let Backend::Gpu(g) = &b else { unreachable!() };
    let arch = g.arch().unwrap();
    let module = g.builtin().unwrap();
    for k in module.kernels() {
        assert_eq!(arch.max_block_threads(k.registers), k.max_threads_per_block, "{k:?} on {arch:?}");
        assert_eq!(k.local_bytes, 0, "{}: spills or stack after the driver's JIT", k.name);
    }
    let malloc = module.kernel("gpuheap_heap_malloc").unwrap();
    let heap = gpuheap::device_heap::DeviceHeap::new(&b, 1 << 20).unwrap();
    // An empty request (no thread takes part): only the launch itself is tested.
    let p = gpuheap_kernels::heap::kernels::MallocParams {
        heap: heap.handle(),
        sizes: 0,
        size: 16,
        threads: 0,
        out: 0,
        warp_mode: 0,
    };
    let k = &gpuheap_kernels::heap::kernels::HEAP_MALLOC;
    let fits = LaunchConfig { grid: 1, block: malloc.max_threads_per_block, shared_bytes: 0 };
    // SAFETY: no thread takes part (`threads` is 0), so no address is used.
    unsafe { b.launch(k, fits, &p) }.unwrap();
    if malloc.max_threads_per_block < 1024 {
        let over = LaunchConfig { block: 1024, ..fits };
        // SAFETY: as above.
        match unsafe { b.launch(k, over, &p) } {
            Err(BackendError::LaunchLimit { kernel, requested, limit, .. }) => {
                assert_eq!(
                    (kernel.as_str(), requested, limit),
                    ("gpuheap_heap_malloc", 1024, malloc.max_threads_per_block as u64)
                )
            }
            r => panic!("a 1024-thread malloc launch: {r:?}"),
        }
    }
}

#[test]
fn invalid_launches_and_copies_are_errors() {
    let b = Backend::cpu();
    let mut buf = b.alloc_zeroed(16).unwrap();
    assert!(matches!(buf.write_at(10, &[0; 8]), Err(BackendError::InvalidArgument(_))));
    assert!(matches!(buf.read::<[u8; 3]>(), Err(BackendError::InvalidArgument(_))));
    assert!(matches!(buf.device_ptr_at(17), Err(BackendError::InvalidArgument(_))));
    let p = gpuheap_kernels::fill::FillParams { data: buf.device_ptr(), words: 4, seed: 0 };
    let bad = LaunchConfig { grid: 1, block: 2048, shared_bytes: 0 };
    // SAFETY: the launch is rejected before the kernel runs.
    let r = unsafe { b.launch(&gpuheap_kernels::fill::FILL, bad, &p) };
    assert!(matches!(r, Err(BackendError::InvalidArgument(_))));
}

// ---- The independent-thread-scheduling emulator ----

use gpuheap::backend::DeviceBuffer;
use gpuheap_kernels::arch::atomic::{AtomicU64, Ordering};
use gpuheap_kernels::arch::index::{global_thread_id, lane_id};
use gpuheap_kernels::arch::warp::{active_mask, ballot, shfl, sync_warp};

/// Parameters of the probe kernels: an output array and a counter.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Probe {
    out: u64,
    counter: u64,
}

/// Records, per thread, the active mask at one call site and the ticket
/// order of an atomic counter (thread `i` writes `out[2i]`, `out[2i+1]`).
///
/// # Safety
/// `out` holds 2 `u64` per thread, `counter` one `u64`.
unsafe fn probe_masks(p: &Probe) {
    let i = global_thread_id();
    let m = active_mask();
    // A warp-aggregated step over the mask, as the allocator does.
    // SAFETY: `m` holds the lanes that executed the `active_mask` above
    // together, this one among them, and each of them executes this ballot
    // next (no branch, no return in between).
    let votes = unsafe { ballot(m, true) };
    // SAFETY: the counter is a live u64 accessed atomically only.
    let ticket = unsafe { AtomicU64::from_ptr(p.counter as *mut u64) }.fetch_add(1, Ordering::AcqRel);
    // SAFETY: `out` holds 2 u64 per thread.
    unsafe {
        (p.out as *mut u64).add(2 * i as usize).write(m as u64 | (votes as u64) << 32);
        (p.out as *mut u64).add(2 * i as usize + 1).write(ticket);
    }
}
gpuheap_kernels::kernel_entry! {
    static PROBE_MASKS: Probe = its_probe_masks => probe_masks;
}

/// Even lanes return at once; odd lanes then call a ballot naming the whole
/// warp: undefined behaviour on a GPU, an error here.
///
/// # Safety
/// None (touches no memory).
unsafe fn ballot_names_exited_lanes(_: &Probe) {
    if lane_id().is_multiple_of(2) {
        return;
    }
    // SAFETY: deliberately NOT upheld (the mask names the even lanes, which
    // have returned): this kernel runs only on the CPU backend's
    // independent-thread-scheduling mode, which detects the violation and
    // fails the launch instead of behaving undefinedly; never on a GPU.
    unsafe { ballot(u32::MAX, true) };
}
gpuheap_kernels::kernel_entry! {
    static BALLOT_EXITED: Probe = its_ballot_exited => ballot_names_exited_lanes;
}

/// Lanes 0 and 1 meet in a `sync_warp` whose masks disagree (lane 0 names
/// lanes 0-1, lane 1 names lanes 0-2, lane 2 waits in a shuffle with lane
/// 0): a deadlock on a GPU, an error here.
///
/// # Safety
/// None (touches no memory).
unsafe fn disagreeing_masks(_: &Probe) {
    // SAFETY: deliberately NOT upheld (the masks disagree): this kernel
    // runs only on the CPU backend's independent-thread-scheduling mode,
    // which reports the deadlock as an error; never on a GPU.
    unsafe {
        match lane_id() {
            0 => sync_warp(0b011),
            1 => sync_warp(0b111),
            2 => {
                shfl(0b101, 7, 0);
            }
            _ => {}
        }
    }
}
gpuheap_kernels::kernel_entry! {
    static DISAGREEING: Probe = its_disagreeing => disagreeing_masks;
}

fn run_probe(b: &Backend, threads: u32) -> Vec<u64> {
    let out = b.alloc_zeroed(16 * threads as usize).unwrap();
    let counter = b.alloc_zeroed(8).unwrap();
    let p = Probe { out: out.device_ptr(), counter: counter.device_ptr() };
    // SAFETY: `out` holds 2 u64 per thread, `counter` one.
    unsafe { b.launch(&PROBE_MASKS, LaunchConfig { grid: 1, block: threads, shared_bytes: 0 }, &p) }.unwrap();
    read_u64s(&out)
}

fn read_u64s(b: &DeviceBuffer) -> Vec<u64> {
    b.read::<u64>().unwrap()
}

#[test]
fn active_mask_takes_every_shape_and_ballots_meet_exactly_their_mask() {
    let (mut lone, mut partial, mut full) = (0, 0, 0);
    for seed in 0..40 {
        let b = Backend::cpu_independent(seed);
        let out = run_probe(&b, 64);
        for warp in 0..2 {
            let lanes: Vec<u64> = (0..32).map(|l| out[2 * (warp * 32 + l)]).collect();
            for (l, &v) in lanes.iter().enumerate() {
                let (m, votes) = (v as u32, (v >> 32) as u32);
                assert!(m & (1 << l) != 0, "seed {seed}: lane {l} not in its own mask {m:#x}");
                assert_eq!(votes, m, "seed {seed}: the ballot over the mask met other lanes");
                // Every lane of a group saw the same group.
                for (o, &other) in lanes.iter().enumerate() {
                    if m & (1 << o) != 0 {
                        assert_eq!(other as u32, m, "seed {seed}: lanes {l} and {o} disagree on their group");
                    }
                }
                match m.count_ones() {
                    1 => lone += 1,
                    32 => full += 1,
                    _ => partial += 1,
                }
            }
        }
        let mut tickets: Vec<u64> = (0..64).map(|i| out[2 * i + 1]).collect();
        tickets.sort_unstable();
        assert_eq!(tickets, (0..64).collect::<Vec<_>>(), "seed {seed}: every atomic ticket once");
    }
    assert!(lone > 0 && partial > 0 && full > 0, "mask shapes: {lone} lone, {partial} partial, {full} full lanes");
}

#[test]
fn a_schedule_replays_from_its_seed() {
    let a = run_probe(&Backend::cpu_independent(7), 96);
    let b = run_probe(&Backend::cpu_independent(7), 96);
    assert_eq!(a, b, "same seed, same schedule");
    let differs = (8..16).any(|s| run_probe(&Backend::cpu_independent(s), 96) != a);
    assert!(differs, "other seeds give other schedules");
}

fn expect_error(k: &gpuheap_kernels::Kernel<Probe>, threads: u32, needles: &[&str]) {
    let b = Backend::cpu_independent(3);
    let p = Probe { out: 0, counter: 0 };
    // SAFETY: the kernels touch no memory.
    let r = unsafe { b.launch(k, LaunchConfig { grid: 1, block: threads, shared_bytes: 0 }, &p) };
    match r {
        Err(BackendError::KernelPanic { kernel, message }) => {
            assert_eq!(kernel, k.name());
            for n in needles {
                assert!(message.contains(n), "{message:?} lacks {n:?}");
            }
        }
        other => panic!("{}: expected a reported error, got {other:?}", k.name()),
    }
}

#[test]
fn a_collective_naming_exited_lanes_is_reported_not_hung() {
    expect_error(&BALLOT_EXITED, 32, &["Ballot", "backends.rs", "0xffffffff", "exited", "seed"]);
}

#[test]
fn disagreeing_masks_are_a_reported_deadlock() {
    expect_error(&DISAGREEING, 32, &["backends.rs", "deadlock"]);
}
