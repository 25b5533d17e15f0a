//! The readers' limits through the command line (the library's side, with the whole memo-bomb family
//! and its measured memory and time, is `host/tests/reader_limits.rs`).

use std::path::PathBuf;
use std::process::Command;

#[path = "../../host/tests/common/mod.rs"]
mod common;

/// A memo bomb: `{"device_traces": [L] * k}` with `L = [event] * k`, `k²` events from `4k` bytes.
fn bomb(k: usize) -> Vec<u8> {
    let s = |x: &str| [&[0x8c, x.len() as u8][..], x.as_bytes()].concat();
    let mut event = b"}(".to_vec();
    for (key, v) in [("action", s("alloc")), ("addr", b"K\x00".to_vec()), ("size", b"K\x01".to_vec())] {
        event.extend(s(key));
        event.extend(v);
    }
    event.push(b'u');
    let mut v = b"\x80\x04}(".to_vec();
    v.extend(s("device_traces"));
    v.extend(b"]q\x00(]q\x01(");
    v.extend(event);
    v.extend(b"q\x02");
    v.extend(b"h\x02".repeat(k - 1));
    v.push(b'e');
    v.extend(b"h\x01".repeat(k - 1));
    v.extend(b"eu.");
    v
}

fn temp(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpuheap-cli-limits-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// Through the command line: a memo bomb exits 2 with the limit named; `--max-memory` (and
/// `GPUHEAP_MAX_MEMORY`) set the ceiling: a snapshot larger than a quarter of it is refused before it is
/// read, and a ceiling that is no byte count exits 2 naming the value.
#[test]
fn the_command_line_refuses_bombs_and_honours_max_memory() {
    let run = |args: &[&str], env: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_gpuheap"));
        c.args(args).env("GPUHEAP_BACKEND", "cpu").env_remove("GPUHEAP_MAX_MEMORY");
        if let Some(v) = env {
            c.env("GPUHEAP_MAX_MEMORY", v);
        }
        let out = c.output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let bomb = temp("cli-bomb.pickle", &bomb(38_000));
    let (code, err) = run(&["explain", "--no-tune", bomb.to_str().unwrap()], None);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("cli-bomb.pickle") && err.contains("passes a reading limit"), "{err}");

    let snap = common::workspace().join("data/equivariant-posteriors_oom_snapshot_new.pickle");
    let snap = snap.to_str().unwrap();
    let (code, err) = run(&["explain", "--no-tune", "--max-memory", "32KiB", snap], None);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("1 MiB"), "a ceiling below 1 MiB is refused: {err}");
    let (code, err) = run(&["explain", "--no-tune", "--max-memory", "1MiB", snap], None);
    assert_eq!(code, Some(0), "a 12 KB snapshot under a 1 MiB ceiling: {err}");
    // A quarter of 1 MiB is 256 KiB: the 2 MB `decomfl` snapshot is refused before it is read.
    let big = common::workspace().join("data/decomfl_opt_zo_federated_memory.pickle");
    let (code, err) = run(&["explain", "--no-tune", big.to_str().unwrap()], Some("1MiB"));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("input size") && err.contains("decomfl"), "{err}");
    let (code, err) = run(&["explain", "--no-tune", snap], Some("lots"));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("lots"), "names the value: {err}");
}
