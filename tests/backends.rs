//! The foundation kernels end to end on every backend: fill/verify and the
//! warp-aggregated bump allocator; backend selection and errors.

mod common;

use std::collections::HashSet;

use gpuheap::backend::{Backend, BackendChoice, BackendError, LaunchConfig};
use gpuheap::ops;
use gpuheap_kernels::fill::pattern;

#[test]
fn fill_then_verify_matches_host_pattern() {
    for b in common::backends("fill_then_verify_matches_host_pattern") {
        let buf = b.alloc_zeroed(4 * 10_007).unwrap();
        ops::fill(&b, &buf, 42).unwrap();
        let words: Vec<u32> = buf.read().unwrap();
        for (i, w) in words.iter().enumerate() {
            assert_eq!(*w, pattern(42, i as u64), "{b:?}: word {i}");
        }
        let (r, _) = ops::verify(&b, &buf, 42).unwrap();
        assert_eq!(r, ops::VerifyReport { mismatches: 0, first_bad: None }, "{b:?}");
    }
}

#[test]
fn verify_reports_corrupted_words() {
    for b in common::backends("verify_reports_corrupted_words") {
        let mut buf = b.alloc_zeroed(4 * 5000).unwrap();
        ops::fill(&b, &buf, 7).unwrap();
        buf.write_at(4 * 1234, &[0xde, 0xad, 0xbe, 0xef]).unwrap();
        buf.write_at(4 * 4000, &[1, 2, 3, 4]).unwrap();
        let (r, _) = ops::verify(&b, &buf, 7).unwrap();
        assert_eq!(r, ops::VerifyReport { mismatches: 2, first_bad: Some(1234) }, "{b:?}");
        let (r, _) = ops::verify(&b, &buf, 8).unwrap();
        assert!(r.mismatches > 4900, "{b:?}: another seed must mismatch almost everywhere");
    }
}

#[test]
fn bump_allocations_are_disjoint_aligned_and_dense() {
    for b in common::backends("bump_allocations_are_disjoint_aligned_and_dense") {
        // 1000 threads (not a multiple of the block or warp size).
        let run = ops::bump_alloc(&b, 1000, 24, 1 << 20).unwrap();
        let offs: Vec<u64> = run.offsets.iter().map(|o| o.expect("arena is large enough")).collect();
        assert_eq!(run.cursor, 1000 * 32, "{b:?}: 24 B rounds to 32 B, nothing else is taken");
        let mut sorted = offs.clone();
        sorted.sort_unstable();
        for (i, o) in sorted.iter().enumerate() {
            assert_eq!(*o, i as u64 * 32, "{b:?}: offsets tile the arena without gaps or overlaps");
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
            assert!(common::is_no_gpu(&e), "unexpected error: {e}");
            assert!(!e.to_string().is_empty());
            // `auto` falls back to the CPU.
            assert!(!Backend::select(BackendChoice::Auto).unwrap().is_gpu());
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
