//! Fuzzes the CSV readers and format detection: [`gpuheap::testing::fuzz_csv`], whose invariants the
//! bounded run of the test suite (`host/tests/fuzz_readers.rs`) checks too.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| gpuheap::testing::fuzz_csv(data));
