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

/// A large file of no known format is refused from its first bytes, not read whole (a 3 GB file used
/// 6.3 GB), and an endless pipe is refused at the input cap, not read until memory runs out: both exit 2
/// naming the input, with the peak RSS of the processes (`getrusage(RUSAGE_CHILDREN)`: the largest of
/// the test's children) far below the input's size.
#[test]
fn a_huge_file_or_an_endless_pipe_is_refused_without_reading_it_whole() {
    let dir = std::env::temp_dir().join(format!("gpuheap-cli-limits-huge-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A sparse 3 GiB file that starts with text: no disk space used, 3 GiB to read.
    let huge = dir.join("huge.bin");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&huge).unwrap();
        f.write_all(b"this is not a trace\n").unwrap();
        f.set_len(3 << 30).unwrap();
    }
    let out = Command::new(env!("CARGO_BIN_EXE_gpuheap"))
        .args(["explain", "--no-tune", huge.to_str().unwrap(), "--max-memory", "64GiB"])
        .env("GPUHEAP_BACKEND", "cpu")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("huge.bin"), "{err}");
    // An endless pipe (`yes` on stdin) under a 64 MiB ceiling: refused past a quarter of it.
    let mut yes = Command::new("yes").stdout(std::process::Stdio::piped()).spawn().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gpuheap"))
        .args(["explain", "--no-tune", "/dev/stdin", "--max-memory", "64MiB"])
        .env("GPUHEAP_BACKEND", "cpu")
        .stdin(yes.stdout.take().unwrap())
        .output()
        .unwrap();
    let _ = yes.kill();
    let _ = yes.wait();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("/dev/stdin"), "{err}");
    // Peak RSS of the children so far (the two runs and `yes`), KiB on Linux: far below 3 GiB.
    // SAFETY: getrusage(2) fills the zeroed struct it is given.
    let max_rss_kib = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut u);
        u.ru_maxrss
    };
    println!("peak RSS of the children: {max_rss_kib} KiB");
    assert!(max_rss_kib < 256 << 10, "peak RSS {max_rss_kib} KiB");
    std::fs::remove_dir_all(&dir).ok();
}
