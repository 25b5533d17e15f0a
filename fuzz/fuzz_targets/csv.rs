//! Fuzzes the CSV readers. The first byte picks the header put in front of the rest, so that the
//! fuzzer spends its time on rows: even = `id,lower,upper,size`, odd = RMM's
//! `Thread,Time,Action,Pointer,Size,Stream`. The raw input also goes through format detection.
//! Invariants: never panics; an error message is one line; a trace it accepts validates.
#![no_main]

use std::path::Path;

use gpuheap::trace::{csv_lifetime, parse_trace, rmm, validate, Trace, TraceError};
use libfuzzer_sys::fuzz_target;

fn check(r: Result<Trace, TraceError>) {
    match r {
        Ok(trace) => {
            for d in &trace.devices {
                validate(d, trace.addresses).expect("an accepted trace validates");
            }
        }
        Err(e) => assert!(!e.to_string().contains('\n'), "multi-line error: {e}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else { return };
    let path = Path::new("fuzz.csv");
    if sel % 2 == 0 {
        let mut v = b"id,lower,upper,size\n".to_vec();
        v.extend_from_slice(rest);
        check(csv_lifetime::parse(path, &v));
    } else {
        let mut v = b"Thread,Time,Action,Pointer,Size,Stream\n".to_vec();
        v.extend_from_slice(rest);
        check(rmm::parse(path, &v));
    }
    check(parse_trace(path, data));
});
