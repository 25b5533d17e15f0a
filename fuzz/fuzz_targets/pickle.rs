//! Fuzzes the PyTorch snapshot reader (pickle decoder + schema walk + seeding/validation).
//! Invariants: never panics; an error message is one line; a trace it accepts validates.
#![no_main]

use std::path::Path;

use gpuheap::trace::{pytorch, validate};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match pytorch::parse(Path::new("fuzz.pickle"), data) {
        Ok(trace) => {
            for d in &trace.devices {
                validate(d, trace.addresses).expect("an accepted trace validates");
            }
        }
        Err(e) => assert!(!e.to_string().contains('\n'), "multi-line error: {e}"),
    }
});
