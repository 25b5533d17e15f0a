//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod pickle;

use gpuheap::backend::{Backend, BackendError};
use gpuheap::compaction::{reference, LiveBlock};
use gpuheap::reference::compact::{plan_slide, CompactionPlan};

/// The GPU backend, or `None` after printing why the GPU half of a test is
/// skipped (no driver, no device, or no PTX).
pub fn gpu_or_skip(test: &str) -> Option<Backend> {
    match Backend::gpu() {
        Ok(b) => Some(b),
        Err(e) => {
            eprintln!("{test}: GPU part skipped: {e}");
            None
        }
    }
}

/// Every backend to run a test on: the CPU in both modes, and the GPU when usable.
pub fn backends(test: &str) -> Vec<Backend> {
    let mut v = vec![Backend::cpu(), Backend::cpu_lockstep()];
    v.extend(gpu_or_skip(test));
    v
}

/// `true` when `e` is one of the "no GPU here" errors.
pub fn is_no_gpu(e: &BackendError) -> bool {
    matches!(e, BackendError::NoDriver | BackendError::NoDevice(_) | BackendError::NoPtx { .. })
}

/// The compaction oracle: `plan_slide` of `layout` in a region of `capacity`
/// bytes, as new offsets in layout order, and the plan itself.
pub fn slide(layout: &[LiveBlock], capacity: u64) -> (Vec<u64>, CompactionPlan) {
    let plan = plan_slide(&reference::slide_layout(layout, capacity)).expect("plan_slide rejects the layout");
    let mut dst = vec![u64::MAX; layout.len()];
    for m in &plan.moves {
        let b = &layout[m.id as usize];
        assert_eq!((m.src, m.len), (b.offset, b.size), "plan_slide lost a block");
        dst[m.id as usize] = m.dst;
    }
    assert!(dst.iter().all(|&d| d != u64::MAX), "plan_slide dropped a block");
    (dst, plan)
}
