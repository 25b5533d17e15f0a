//! Entry points for the fuzz targets (`fuzz/`, cargo-fuzz on nightly) and for the bounded fuzz run of the
//! test suite (`host/tests/fuzz_readers.rs`, stable): each feeds one input to the readers and checks their
//! invariants, panicking on a violation (as a fuzzer expects). Not part of the API: hidden from the
//! documentation and free to change with the readers.
//!
//! The invariants: a reader never panics; an error message is one line; a trace it accepts validates;
//! the stack frames of an accepted snapshot can be read from the same bytes.

use std::path::Path;

use crate::trace::{csv_lifetime, parse_trace, pytorch, rmm, validate, Trace, TraceError};

fn check(r: Result<Trace, TraceError>) -> Option<Trace> {
    match r {
        Ok(trace) => {
            for d in &trace.devices {
                validate(d, trace.addresses).expect("an accepted trace validates");
            }
            Some(trace)
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(!msg.contains('\n') && !msg.contains('\r'), "multi-line error: {msg}");
            assert_eq!(e.exit_code(), 2, "{msg}");
            None
        }
    }
}

/// The PyTorch snapshot reader (pickle decoder, schema walk, seeding and validation) on `data`, then the
/// stack frames of the first events and blocks of each device of an accepted snapshot.
pub fn fuzz_pickle(data: &[u8]) {
    let path = Path::new("fuzz.pickle");
    if let Some(trace) = check(pytorch::parse(path, data)) {
        for d in &trace.devices {
            let events: Vec<usize> = (0..d.events.len().min(16)).collect();
            let blocks: Vec<u64> = d
                .final_state
                .iter()
                .flat_map(|s| s.segments.iter().flat_map(|seg| seg.blocks.iter().map(|b| b.addr)))
                .take(16)
                .collect();
            if let Err(e) = pytorch::read_frames(path, data, d.device, &events, &blocks) {
                assert!(!e.to_string().contains('\n'), "multi-line error: {e}");
            }
        }
    }
}

/// The CSV readers on `data`: the first byte picks the header put in front of the rest, so that a
/// fuzzer spends its time on rows (even: `id,lower,upper,size`; odd: RMM's
/// `Thread,Time,Action,Pointer,Size,Stream`); the raw input also goes through format detection.
pub fn fuzz_csv(data: &[u8]) {
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
}
