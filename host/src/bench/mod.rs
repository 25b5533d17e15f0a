//! Benchmarks run by `gpuheap bench …` (one file per benchmark).

pub mod compact;
