//! Fuzzes the PyTorch snapshot reader (pickle decoder + schema walk + seeding/validation + stack frames):
//! [`gpuheap::testing::fuzz_pickle`], whose invariants the bounded run of the test suite
//! (`host/tests/fuzz_readers.rs`) checks too.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| gpuheap::testing::fuzz_pickle(data));
