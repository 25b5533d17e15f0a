//! Bad input: every case yields a typed `TraceError` whose message is one line naming the file
//! and the byte, event or line at fault; nothing panics.

use std::path::{Path, PathBuf};

use gpuheap::trace::{read_trace, Location, TraceError, ValidationErrorKind};

mod common;
use common::pickle::{block, ev, pickle, snapshot, V};

use common::workspace;

/// Writes `content` to a fresh file `name` in a per-process temporary folder.
fn temp_file(name: &str, content: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpuheap-bad-input-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, content).unwrap();
    p
}

/// Reads `content` as file `name`, expects an error, and checks the common contract: one line,
/// names the file, exit code 2, and contains every `needle`.
fn read_err(name: &str, content: &[u8], needles: &[&str]) -> TraceError {
    let path = temp_file(name, content);
    let err = read_trace(&path).expect_err("bad input must be rejected");
    std::fs::remove_file(&path).ok();
    check_message(&err, &path, needles);
    err
}

fn check_message(err: &TraceError, path: &Path, needles: &[&str]) {
    let msg = err.to_string();
    println!("{msg}");
    assert!(!msg.contains('\n') && !msg.contains('\r'), "one line: {msg:?}");
    assert!(msg.starts_with(&format!("{}: ", path.display())), "names the file: {msg}");
    assert_eq!(err.path(), path);
    assert_eq!(err.exit_code(), 2);
    for n in needles {
        assert!(msg.contains(n), "{msg:?} should contain {n:?}");
    }
}

#[test]
fn well_formed_hand_made_snapshot_reads() {
    let ok = snapshot(vec![
        ev("alloc", 0x100000, V::Int(512)),
        ev("free_requested", 0x100000, V::Int(512)),
        ev("free_completed", 0x100000, V::Int(512)),
    ]);
    let path = temp_file("ok.pickle", &ok);
    let t = read_trace(&path).unwrap();
    std::fs::remove_file(&path).ok();
    assert_eq!(t.devices[0].events.len(), 3);
}

/// `time_us` is PyTorch's signed 64-bit count of µs: a value at or above 2^63 (here 2^64 − 1, which
/// wrapped to −1 and broke `trace repeat`'s read-back) is bad input naming the event and field.
#[test]
fn time_us_beyond_a_signed_64_bit_time_is_bad_input() {
    let timed = |t: i128| {
        let V::Dict(mut d) = ev("alloc", 0x100000, V::Int(512)) else { unreachable!() };
        d.push(("time_us", V::Int(t)));
        V::Dict(d)
    };
    for t in [1 << 63, u64::MAX as i128] {
        let bad = snapshot(vec![timed(t)]);
        read_err("time.pickle", &bad, &["time_us", &t.to_string(), "signed 64-bit time"]);
    }
    for (f, shown) in [(f64::NAN, "NaN"), (f64::INFINITY, "inf"), (f64::NEG_INFINITY, "-inf")] {
        let V::Dict(mut d) = ev("alloc", 0x100000, V::Int(512)) else { unreachable!() };
        d.push(("time_us", V::Float(f)));
        read_err("time-float.pickle", &snapshot(vec![V::Dict(d)]), &["time_us", shown, "not a time"]);
    }
    let ok = snapshot(vec![timed(i64::MAX as i128)]);
    let path = temp_file("time-ok.pickle", &ok);
    assert_eq!(read_trace(&path).unwrap().devices[0].events[0].time_us, Some(i64::MAX));
    std::fs::remove_file(&path).ok();
}

#[test]
fn truncated_pickle() {
    let full = std::fs::read(workspace().join("data/1.3b_snapshot.pickle")).unwrap();
    let err = read_err("truncated.pickle", &full[..full.len() / 2], &["truncated pickle", "byte "]);
    assert!(matches!(err, TraceError::PickleTruncated { .. }), "{err:?}");
}

#[test]
fn truncated_anywhere_is_an_error_never_a_panic() {
    let full = std::fs::read(workspace().join("data/1.3b_snapshot.pickle")).unwrap();
    let path = Path::new("cut.pickle");
    for cut in (0..full.len()).step_by(1499).chain([full.len() - 1]) {
        let err = gpuheap::trace::parse_trace(path, &full[..cut]).expect_err("a cut pickle is rejected");
        check_message(&err, path, &[]);
    }
}

#[test]
fn corrupt_pickle() {
    // An unknown opcode (0xff) where the first dict item should start.
    let err = read_err("corrupt.pickle", b"\x80\x04}\x94(\xff.", &["byte 5", "corrupt pickle", "unknown opcode 0xff"]);
    assert!(matches!(err, TraceError::PickleCorrupt { offset: 5, .. }), "{err:?}");
    // A structurally broken stream: APPEND with nothing to append to.
    let err = read_err("underflow.pickle", b"\x80\x04a.", &["byte 2", "corrupt pickle", "stack underflow"]);
    assert!(matches!(err, TraceError::PickleCorrupt { .. }));
    // Flipped bytes in the middle of the real file.
    let mut real = std::fs::read(workspace().join("data/1.3b_snapshot.pickle")).unwrap();
    let mid = real.len() / 3;
    real[mid..mid + 16].fill(0xfe);
    let err = read_err("flipped.pickle", &real, &["byte "]);
    assert!(matches!(err, TraceError::PickleCorrupt { .. } | TraceError::PickleTruncated { .. }), "{err:?}");
}

#[test]
fn pickle_that_asks_to_run_code() {
    // Protocol 0: GLOBAL os.system, then REDUCE with ('echo hi',).
    let err = read_err(
        "evil.pickle",
        b"cos\nsystem\n(S'echo hi'\ntR.",
        &["the pickle asks to run code (global `os.system`)", "byte 0"],
    );
    assert!(matches!(err, TraceError::PickleRunsCode { offset: 0, .. }));
    // Protocol 4: STACK_GLOBAL inside an otherwise valid snapshot dict.
    let mut p = b"\x80\x04}\x94(\x8c\x08segments\x94".to_vec();
    p.extend_from_slice(b"\x8c\x08builtins\x94\x8c\x04eval\x94\x93\x94\x8c\x05print\x94\x85R\x94u.");
    read_err("evil4.pickle", &p, &["the pickle asks to run code (global `builtins.eval`)"]);
    // A REDUCE on its own is refused too (the callable could come from anywhere).
    read_err("reduce.pickle", b"\x80\x04)R.", &["the pickle asks to run code (opcode REDUCE)", "byte 3"]);
    // BUILD (calls __setstate__) likewise.
    read_err("build.pickle", b"\x80\x04}}b.", &["opcode BUILD"]);
}

#[test]
fn wrong_type_where_a_number_belongs() {
    let p = snapshot(vec![ev("alloc", 0x100000, V::Int(512)), ev("free_completed", 0x100000, V::Str("512"))]);
    let err = read_err(
        "wrongtype.pickle",
        &p,
        &["device 0, event 1, field `size`", "expected an integer, found str \"512\""],
    );
    assert!(matches!(err, TraceError::Schema { at: Location::Event { device: 0, index: 1, field: Some("size") }, .. }));
    // In the segment list too.
    let seg = V::Dict(vec![("address", V::List(vec![])), ("total_size", V::Int(1))]);
    let p = pickle(&V::Dict(vec![("segments", V::List(vec![seg]))]));
    read_err("wrongtype_seg.pickle", &p, &["segment 0, field `address`", "expected an integer, found list"]);
    // And in the lifetime CSV.
    read_err("wrongtype.csv", b"id,lower,upper,size\n0,0,10,16\n1,5,x7,16\n", &["line 3", "column `upper`", "\"x7\""]);
}

#[test]
fn free_of_unknown_address() {
    // 0x900000 is in no segment and was never allocated.
    let p = snapshot(vec![ev("alloc", 0x100000, V::Int(512)), ev("free_completed", 0x900000, V::Int(512))]);
    let err = read_err("unknown.pickle", &p, &["device 0, event 1", "free_completed of unknown address 0x900000"]);
    let TraceError::Event { at: Location::Event { index: 1, .. }, source, .. } = &err else { panic!("{err:?}") };
    assert!(matches!(source.kind, ValidationErrorKind::UnknownAddress { addr: 0x900000, .. }));
    // RMM logs start with the adaptor, so any unknown free is an error; reported by line.
    let log = b"Thread,Time,Action,Pointer,Size,Stream\n1,10:00:00.000001,allocate,0x1000,64,0x0\n\
                1,10:00:00.000002,free,0x2000,64,0x0\n";
    // Named as RMM names it (`free`), not with PyTorch's `free_completed`.
    let err = read_err("unknown_free.rmm.csv", log, &["line 3", "free of unknown address 0x2000"]);
    assert!(!err.to_string().contains("free_completed"), "{err}");
}

#[test]
fn double_free() {
    let p = snapshot(vec![
        ev("alloc", 0x100000, V::Int(512)),
        ev("free_requested", 0x100000, V::Int(512)),
        ev("free_completed", 0x100000, V::Int(512)),
        ev("free_completed", 0x100000, V::Int(512)),
    ]);
    let err = read_err("double.pickle", &p, &["device 0, event 3", "double free", "already freed by event 2"]);
    let TraceError::Event { source, .. } = &err else { panic!("{err:?}") };
    assert_eq!(
        source.kind,
        ValidationErrorKind::DoubleFree { event: gpuheap::trace::EventKind::Free, addr: 0x100000, freed_at: 2 }
    );
    // Two free_requested for one alloc.
    let p = snapshot(vec![
        ev("alloc", 0x100000, V::Int(512)),
        ev("free_requested", 0x100000, V::Int(512)),
        ev("free_requested", 0x100000, V::Int(512)),
    ]);
    read_err("double_req.pickle", &p, &["device 0, event 2", "double free"]);
    // RMM.
    let log = b"Thread,Time,Action,Pointer,Size,Stream\n1,10:00:00.1,allocate,0x1000,64,0\n\
                1,10:00:00.2,free,0x1000,64,0\n1,10:00:00.3,free,0x1000,64,0\n";
    read_err("double.rmm.csv", log, &["line 4", "double free: free of 0x1000", "already freed by event 1"]);
    // Alloc of a live address.
    let p = snapshot(vec![ev("alloc", 0x100000, V::Int(512)), ev("alloc", 0x100000, V::Int(64))]);
    read_err("alloc_live.pickle", &p, &["device 0, event 1", "alloc at live address 0x100000 (allocated by event 0"]);
}

/// RMM's `deallocate` must be passed the size its `allocate` was: a log whose free names another size
/// records a caller bug, and replaying either size would model something that did not happen.
#[test]
fn rmm_free_with_another_size_than_its_allocation() {
    let log = b"Thread,Time,Action,Pointer,Size,Stream\n1,10:00:00.1,allocate,0x1000,64,0\n\
                1,10:00:00.2,allocate,0x2000,256,0\n1,10:00:00.3,free,0x2000,128,0\n";
    let err = read_err(
        "size_mismatch.rmm.csv",
        log,
        &["line 4", "free of 0x2000 names 128 bytes", "allocated with 256 bytes by event 1"],
    );
    let TraceError::Event { source, .. } = &err else { panic!("{err:?}") };
    assert_eq!(
        source.kind,
        ValidationErrorKind::FreeSizeMismatch { addr: 0x2000, allocated: 256, freed: 128, alloc_at: Some(1) }
    );
    // The same address reused with a new size: each free is checked against its own allocation.
    let log = b"Thread,Time,Action,Pointer,Size,Stream\n1,10:00:00.1,allocate,0x1000,64,0\n\
                1,10:00:00.2,free,0x1000,64,0\n1,10:00:00.3,allocate,0x1000,32,0\n1,10:00:00.4,free,0x1000,32,0\n";
    let path = temp_file("reuse.rmm.csv", log);
    let read = read_trace(&path);
    std::fs::remove_file(&path).ok();
    let trace = read.expect("a reused address with a new size reads");
    assert_eq!(trace.devices[0].events.iter().map(|e| e.size).collect::<Vec<_>>(), [64, 64, 32, 32]);
}

#[test]
fn negative_or_overflowing_size_in_pickle() {
    let p = snapshot(vec![ev("alloc", 0x100000, V::Int(-5))]);
    read_err("negative.pickle", &p, &["device 0, event 0, field `size`", "negative value -5"]);
    let p = snapshot(vec![ev("alloc", 0x100000, V::Int(1 << 64))]);
    read_err("overflow.pickle", &p, &["device 0, event 0, field `size`", "does not fit in 64 bits"]);
    // Beyond 128 bits (a 20-byte LONG1).
    let mut big =
        b"\x80\x04}(\x8c\x0ddevice_traces]]}(\x8c\x06action\x8c\x05alloc\x8c\x04addrK\x01\x8c\x04size\x8a\x14".to_vec();
    big.extend_from_slice(&[0x11; 19]);
    big.extend_from_slice(b"\x01uaau.");
    read_err("huge.pickle", &big, &["device 0, event 0, field `size`", "integer does not fit in 64 bits"]);
    // Fits, but addr + size passes 2^64.
    let p = snapshot(vec![ev("alloc", (1i128 << 64) - 16, V::Int(512))]);
    read_err("wrap.pickle", &p, &["device 0, event 0", "overflows 64 bits"]);
}

#[test]
fn negative_or_overflowing_size_in_csv() {
    read_err(
        "negative.csv",
        b"id,lower,upper,size\n0,0,10,16\n1,2,4,-5\n",
        &["line 3", "column `size`", "negative value -5"],
    );
    read_err(
        "overflow.csv",
        b"id,lower,upper,size\n0,0,10,18446744073709551616\n",
        &["line 2", "column `size`", "does not fit in 64 bits"],
    );
    read_err("overflow_time.csv", b"id,lower,upper,size\n0,0,9223372036854775808,1\n", &["line 2", "column `upper`"]);
    let log = b"Thread,Time,Action,Pointer,Size,Stream\n1,10:00:00.1,allocate,0x1000,-64,0\n";
    read_err("negative.rmm.csv", log, &["line 2", "column `Size`", "negative value -64"]);
    let log = b"Thread,Time,Action,Pointer,Size,Stream\n1,10:00:00.1,allocate,0xffffffffffffff00,4096,0\n";
    read_err("wrap.rmm.csv", log, &["line 2", "overflows 64 bits"]);
}

/// A lifetime CSV has no addresses (an event's `addr` is its row number), so its largest size is a
/// request like any other, on any row: it reads, and a replay reports it as rejected by the strategy. It
/// was refused as "address 0x1 + size ... overflows 64 bits" on the second row only, naming an address the
/// file does not contain.
#[test]
fn largest_size_in_a_lifetime_csv_is_a_request_on_every_row() {
    use gpuheap::analysis::FailureClass;
    use gpuheap::reference::StrategyKind;
    use gpuheap::replay::{self, ReplayOptions};
    for rows in ["0,0,10,18446744073709551615\n1,0,10,100\n", "0,0,10,100\n1,0,10,18446744073709551615\n"] {
        let path = temp_file("huge_row.csv", format!("id,lower,upper,size\n{rows}").as_bytes());
        let t = read_trace(&path).unwrap_or_else(|e| panic!("{rows:?}: {e}"));
        let opts = {
            let mut o = ReplayOptions::new(StrategyKind::BestFit);
            o.capacity = Some(1 << 20);
            o
        };
        let r = replay::replay(&t, &t.devices[0], &opts, None, &mut |_| {}).unwrap();
        let huge: Vec<_> = r.failed.iter().filter(|f| f.size == u64::MAX).collect();
        assert_eq!(huge.len(), 1, "{rows:?}: {:?}", r.failed);
        // Refused by the strategy (a size over its limit), never called fragmentation.
        assert_eq!(huge[0].class, FailureClass::Rejected, "{rows:?}");
    }
}

#[test]
fn other_csv_problems() {
    read_err("ragged.csv", b"id,lower,upper,size\n0,0,10\n", &["line 2", "expected 4 fields, found 3"]);
    read_err(
        "dup.csv",
        b"id,lower,upper,size\n7,0,10,1\n7,3,4,1\n",
        &["line 3", "duplicate id \"7\" (first on line 2)"],
    );
    read_err("empty_life.csv", b"id,lower,upper,size\n0,10,10,1\n", &["line 2", "empty lifetime"]);
    read_err(
        "action.rmm.csv",
        b"Thread,Time,Action,Pointer,Size,Stream\n1,10:00:00.1,steal,0x1,1,0\n",
        &["line 2", "unknown action \"steal\""],
    );
}

#[test]
fn empty_file() {
    let err = read_err("empty.pickle", b"", &["empty file"]);
    assert!(matches!(err, TraceError::Empty { .. }));
}

#[test]
fn unknown_format() {
    let err = read_err("notes.txt", b"hello, world\nthis is not a trace\n", &["unknown trace format", "hello, world"]);
    assert!(matches!(err, TraceError::UnknownFormat { .. }));
}

#[test]
fn directory_given_as_the_path() {
    let dir = std::env::temp_dir().join(format!("gpuheap-bad-input-dir-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let err = read_trace(&dir).unwrap_err();
    check_message(&err, &dir, &["is a directory"]);
    assert!(matches!(err, TraceError::IsDirectory { .. }));
    std::fs::remove_dir(&dir).ok();
}

/// `/dev/zero` never ends: reading it whole grew memory without bound until the process was killed.
#[cfg(unix)]
#[test]
fn device_given_as_the_path() {
    for dev in ["/dev/zero", "/dev/null"] {
        let p = Path::new(dev);
        if !p.exists() {
            continue;
        }
        let err = read_trace(p).unwrap_err();
        check_message(&err, p, &["is a device, not a trace file"]);
        assert!(matches!(err, TraceError::IsDevice { .. }));
    }
}

#[test]
fn missing_file() {
    let p = std::env::temp_dir().join("gpuheap-no-such-trace.pickle");
    let err = read_trace(&p).unwrap_err();
    check_message(&err, &p, &["cannot read"]);
}

/// A length that runs past the end of the data is reported at its opcode, and the message does not
/// claim the data ends there (the file is longer than the opcode's offset).
#[test]
fn length_past_the_end_names_the_opcode() {
    // BINUNICODE (`X`) at byte 2 announces 65535 bytes; 3 follow.
    let err = read_err(
        "long.pickle",
        b"\x80\x04X\xff\xff\x00\x00abc",
        &["truncated pickle: the opcode at byte 2 needs more bytes than the data holds"],
    );
    assert!(matches!(err, TraceError::PickleTruncated { offset: 2, .. }), "{err:?}");
}

/// A snapshot whose `segments` hold the given segments (device 0 unless a segment says otherwise).
fn segments_snapshot(segments: Vec<V>) -> Vec<u8> {
    pickle(&V::Dict(vec![("segments", V::List(segments)), ("device_traces", V::List(vec![]))]))
}

fn segment<'a>(addr: i128, size: i128, blocks: Vec<V<'a>>) -> V<'a> {
    V::Dict(vec![("address", V::Int(addr)), ("total_size", V::Int(size)), ("blocks", V::List(blocks))])
}

#[test]
fn final_state_layout_that_cannot_exist() {
    const M: i128 = 1 << 20;
    const A: i128 = 0x7f00_0000_0000;
    // A live block whose requested_size passes its size (2^64 - 1 panicked in `request_pad` with
    // overflow checks on). An inactive block may keep a larger stale request, as real snapshots do.
    let p = segments_snapshot(vec![segment(A, 2 * M, vec![block(A, 2 * M, (1 << 64) - 1, "active_allocated")])]);
    read_err("live_request.pickle", &p, &["segment 0, block 0", "requested_size", "more than its size"]);
    let p = segments_snapshot(vec![segment(A, 2 * M, vec![block(A, 2 * M, 1 << 40, "inactive")])]);
    let path = temp_file("stale_request.pickle", &p);
    read_trace(&path).expect("an inactive block with a stale larger request reads");
    // A block outside its segment, one past its end, and two overlapping blocks.
    let p = segments_snapshot(vec![segment(A, 2 * M, vec![block(0x1000, M, M, "active_allocated")])]);
    read_err("outside.pickle", &p, &["segment 0, block 0", "starts before"]);
    let p = segments_snapshot(vec![segment(A, 2 * M, vec![block(A, 3 * M, M, "active_allocated")])]);
    read_err("past_end.pickle", &p, &["segment 0, block 0", "ends past its segment's end"]);
    let p = segments_snapshot(vec![segment(
        A,
        2 * M,
        vec![block(A, M, M, "active_allocated"), block(A + 1, M, M, "active_allocated")],
    )]);
    read_err("overlap.pickle", &p, &["segment 0, block 1", "starts before the end of the previous block"]);
    // Two segments of one device sharing bytes (their sizes would be counted twice: three such
    // segments of 2^63 B made the reserved sum pass 2^64).
    let half = 1i128 << 63;
    let p = segments_snapshot(vec![segment(0, half, vec![]), segment(1, half, vec![]), segment(2, half, vec![])]);
    read_err("segments_overlap.pickle", &p, &["segment 1", "overlap"]);
    // Segments of distinct devices may share addresses.
    let mut other = segment(A, 2 * M, vec![]);
    if let V::Dict(d) = &mut other {
        d.push(("device", V::Int(1)));
    }
    let p = segments_snapshot(vec![segment(A, 2 * M, vec![]), other]);
    let path = temp_file("two_devices.pickle", &p);
    assert_eq!(read_trace(&path).expect("two devices read").devices.len(), 2);
}

/// A CSV whose lines end in a lone `\r` (classic Mac OS, some spreadsheet exports) was "unknown trace
/// format": the format was detected on the text before the first `\n`, that is the whole file.
#[test]
fn csv_with_cr_line_endings_reads() {
    for (name, text) in [
        ("cr.csv", "id,lower,upper,size\r0,0,10,16\r1,2,4,5\r"),
        ("crlf.csv", "id,lower,upper,size\r\n0,0,10,16\r\n1,2,4,5\r\n"),
        ("bom_cr.csv", "\u{feff}id,lower,upper,size\r0,0,10,16\r1,2,4,5\r"),
    ] {
        let path = temp_file(name, text.as_bytes());
        let t = read_trace(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(t.devices[0].events.iter().map(|e| e.size).collect::<Vec<_>>(), [16, 5, 5, 16], "{name}");
    }
    let path = temp_file("cr.rmm.csv", b"Thread,Time,Action,Pointer,Size,Stream\r1,10:00:00.1,allocate,0x1000,64,0\r");
    assert_eq!(read_trace(&path).expect("an RMM log with CR line ends").devices[0].events.len(), 1);
    // The error for a bad row still names its line.
    read_err("cr_bad.csv", b"id,lower,upper,size\r0,0,10,16\r1,2,4,x\r", &["line 3", "column `size`"]);
}

/// A value of megabytes quoted in a message (a CSV cell, a block state, a global's name) made a message
/// of megabytes; the message quotes its first 40 characters and gives its length.
#[test]
fn huge_values_are_quoted_in_short() {
    let long = "7".repeat(1 << 20);
    let err = read_err(
        "long_cell.csv",
        format!("id,lower,upper,size\n0,0,10,{long}\n").as_bytes(),
        &["line 2", "column `size`", "does not fit in 64 bits", "(1048576 bytes)"],
    );
    assert!(err.to_string().len() < 400, "{} bytes", err.to_string().len());
    let junk = "x".repeat(1 << 20);
    let log = format!("Thread,Time,Action,Pointer,Size,Stream\n1,10:00:00.1,{junk},0x1000,64,0\n");
    let err = read_err("long_action.rmm.csv", log.as_bytes(), &["line 2", "unknown action \"xxxx", "(1048576 bytes)"]);
    assert!(err.to_string().len() < 400);
    let p = pickle(&V::Dict(vec![(
        "segments",
        V::List(vec![segment(0x100000, 1 << 20, vec![block(0x100000, 1 << 20, 0, &junk)])]),
    )]));
    let err = read_err("long_state.pickle", &p, &["segment 0, block 0, field `state`", "(1048576 bytes)"]);
    assert!(err.to_string().len() < 400);
    let mut code = b"c".to_vec();
    code.extend_from_slice(junk.as_bytes());
    code.extend_from_slice(b"\nsystem\n.");
    let err = read_err("long_global.pickle", &code, &["asks to run code", "(1048583 bytes)"]);
    assert!(err.to_string().len() < 400);
}
