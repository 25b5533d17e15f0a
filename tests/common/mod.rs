//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod pickle;

use gpuheap::backend::{Backend, BackendError};

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
