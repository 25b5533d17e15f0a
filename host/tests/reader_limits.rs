//! The readers' limits (module `gpuheap::trace::limits`): the memo-bomb family, small pickles whose memo
//! references multiply into far more values than the file holds, stops with a typed error naming the
//! limit, within a stated memory bound (peak RSS measured in a child process, `VmHWM` of
//! `/proc/self/status`) and time.
//!
//! Each member runs in a child process (this test binary run again on one test, `GPUHEAP_BOMB` naming the
//! member), so that its peak RSS is its own; the parent checks the child's report.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use gpuheap::trace::{read_frames, read_trace, TraceError};

/// The stated bound on the peak RSS of reading one member (files under 1 MB): the walk's memory floor
/// (`limits::BYTES_FLOOR`, 64 MiB) and the decoder's nodes, with room for the test binary itself.
const MAX_RSS_KIB: u64 = 256 << 10;
/// The stated bound on the time of reading one member (generous: a shared, slow build machine; without
/// the limits each member runs for minutes or until memory runs out).
const MAX_TIME: Duration = Duration::from_secs(30);

/// `SHORT_BINUNICODE` of `s`.
fn s(x: &str) -> Vec<u8> {
    let mut v = vec![0x8c, u8::try_from(x.len()).unwrap()];
    v.extend_from_slice(x.as_bytes());
    v
}
/// `BINUNICODE` of `s` (any length).
fn long_s(x: &str) -> Vec<u8> {
    let mut v = vec![b'X'];
    v.extend_from_slice(&u32::try_from(x.len()).unwrap().to_le_bytes());
    v.extend_from_slice(x.as_bytes());
    v
}
const fn put(i: u8) -> [u8; 2] {
    [b'q', i]
}
const fn get(i: u8) -> [u8; 2] {
    [b'h', i]
}
/// `n` memo references to `i`.
fn gets(i: u8, n: usize) -> Vec<u8> {
    get(i).repeat(n)
}

/// `{key: [L] * k}` with `L = [item] * k`: `k²` items from `4k` bytes.
fn square(key: &str, item: &[u8], k: usize) -> Vec<u8> {
    let mut v = b"\x80\x04}(".to_vec();
    v.extend(s(key));
    v.extend(b"]");
    v.extend(put(0));
    v.extend(b"(]");
    v.extend(put(1));
    v.extend(b"(");
    v.extend(item);
    v.extend(put(2));
    v.extend(gets(2, k - 1));
    v.extend(b"e");
    v.extend(gets(1, k - 1));
    v.extend(b"eu.");
    v
}

fn dict(pairs: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut v = b"}(".to_vec();
    for (k, val) in pairs {
        v.extend(s(k));
        v.extend(val);
    }
    v.push(b'u');
    v
}

/// The family: name, pickle bytes.
fn family() -> Vec<(&'static str, Vec<u8>)> {
    let k = 38_000;
    let alloc = dict(&[("action", s("alloc")), ("addr", b"K\x00".to_vec()), ("size", b"K\x01".to_vec())]);
    // Blocks without addresses (the PyTorch 2.0 layout) of size 0: each is valid where the one before ends.
    let block = dict(&[("size", b"K\x00".to_vec()), ("state", s("inactive"))]);
    let mut segments = b"\x80\x04}(".to_vec();
    segments.extend(s("segments"));
    segments.extend(b"](");
    let seg_head = dict(&[
        ("device", b"K\x00".to_vec()),
        ("address", b"K\x00".to_vec()),
        ("total_size", b"J\x00\x00\x00\x01".to_vec()),
    ]);
    // The segment dict with its `blocks` set after: `{...}` MEMO, then `blocks: [B] * k`.
    segments.extend(&seg_head[..seg_head.len() - 1]);
    segments.extend(s("blocks"));
    segments.extend(b"](");
    segments.extend(&block);
    segments.extend(put(1));
    segments.extend(gets(1, k - 1));
    segments.extend(b"eu");
    segments.extend(put(0));
    segments.extend(gets(0, k - 1));
    segments.extend(b"eu.");
    // segment_free entries sharing one frames list of `k` references to one frame: `k²` frames scanned.
    let frame = dict(&[("name", long_s(&"f".repeat(64))), ("filename", s("x.py")), ("line", b"K\x01".to_vec())]);
    let mut frames = b"\x80\x04}(".to_vec();
    frames.extend(s("device_traces"));
    frames.extend(b"](](");
    let mut ev = dict(&[("action", s("segment_free")), ("addr", b"K\x00".to_vec()), ("size", b"K\x01".to_vec())]);
    ev.pop();
    ev.extend(s("frames"));
    ev.extend(b"](");
    ev.extend(&frame);
    ev.extend(put(1));
    ev.extend(gets(1, k - 1));
    ev.extend(b"eu");
    frames.extend(&ev);
    frames.extend(put(0));
    frames.extend(gets(0, k - 1));
    frames.extend(b"eeu.");
    // Nesting: a million MARKs, then a list.
    let mut nesting = b"\x80\x04".to_vec();
    nesting.extend(vec![b'('; 1 << 20]);
    nesting.extend(b"].");
    vec![
        ("events", square("device_traces", &alloc, k)),
        // Twice as long: the bound does not grow with the blow-up (k⁴ events).
        ("events-2x", square("device_traces", &alloc, 2 * k)),
        ("segments", segments),
        ("frames", frames),
        ("nesting", nesting),
    ]
}

fn temp(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpuheap-reader-limits-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// Peak RSS of this process, KiB.
fn vm_hwm_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM in /proc/self/status");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The child: reads the member named by `GPUHEAP_BOMB` (and, for `frames`, the frames of every event as
/// `explain` reads them), prints `RESULT <error or ok>` and `VMHWM <KiB>`.
#[test]
fn memo_bomb_child() {
    let Ok(name) = std::env::var("GPUHEAP_BOMB") else { return };
    let (_, bytes) = family().into_iter().find(|(n, _)| *n == name).expect("a member of the family");
    let path = temp(&format!("{name}.pickle"), &bytes);
    let r = read_trace(&path).map(|_| ());
    println!("RESULT parse {}", r.map_or_else(|e| describe(&e), |()| "ok".into()));
    if name == "frames" {
        let events: Vec<usize> = (0..40_000).collect();
        let r = read_frames(&path, &bytes, 0, &events, &[]).map(|_| ());
        println!("RESULT frames {}", r.map_or_else(|e| describe(&e), |()| "ok".into()));
    }
    std::fs::remove_file(&path).ok();
    println!("VMHWM {}", vm_hwm_kib());
}

fn describe(e: &TraceError) -> String {
    let kind = if matches!(e, TraceError::Limit { .. }) { "limit" } else { "other" };
    format!("{kind} {e}")
}

#[test]
fn the_memo_bomb_family_stays_within_its_memory_and_time_bounds() {
    if !Path::new("/proc/self/status").exists() {
        println!("skipped: no /proc/self/status to measure peak RSS on this system");
        return;
    }
    for (name, bytes) in family() {
        let start = Instant::now();
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "memo_bomb_child", "--nocapture", "--test-threads=1"])
            .env("GPUHEAP_BOMB", name)
            .output()
            .unwrap();
        let took = start.elapsed();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{name}: the child failed: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        let hwm: u64 = stdout
            .lines()
            .find_map(|l| l.find("VMHWM ").map(|i| &l[i + 6..]))
            .unwrap_or_else(|| panic!("{name}: no VMHWM in {stdout}"))
            .parse()
            .unwrap();
        println!("{name}: {} B of pickle, peak RSS {} MiB, {:.2} s", bytes.len(), hwm >> 10, took.as_secs_f64());
        // libtest may print its "test ... " prefix on the same line.
        let results: Vec<&str> = stdout.lines().filter_map(|l| l.find("RESULT ").map(|i| &l[i..])).collect();
        assert!(!results.is_empty(), "{name}: no RESULT in {stdout}");
        for line in results {
            println!("  {line}");
            // Every member that multiplies values is stopped by a limit, with the file's name, where, and a
            // message of one line; the nesting member is refused as a malformed pickle (no list to close).
            if name != "nesting" {
                assert!(line.contains(" limit ") && line.contains("passes a reading limit"), "{name}: {line}");
            }
        }
        assert!(hwm < MAX_RSS_KIB, "{name}: peak RSS {hwm} KiB, over the bound of {MAX_RSS_KIB} KiB");
        assert!(took < MAX_TIME, "{name}: {took:?}, over the bound of {MAX_TIME:?}");
    }
}
