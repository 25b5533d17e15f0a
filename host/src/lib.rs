//! # gpuheap
//!
//! The host side of gpuheap (work in progress: see README.md).
#![warn(missing_docs)]

pub mod analysis;
pub mod reference;
pub mod trace;
