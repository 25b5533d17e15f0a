//! `gpuheap check`, `gpuheap bench alloc` and `gpuheap bench compact`, run as the built binary on the
//! CPU backend with odd counts and sizes: an option the command cannot run with exits 2 with one line
//! naming the option (never a panic, also with overflow checks), and small but legitimate values run.

use std::path::Path;
use std::process::{Command, Output};

fn gpuheap(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpuheap"))
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
        .env("GPUHEAP_BACKEND", "cpu")
        .output()
        .expect("runs")
}

fn assert_bad_option(args: &[&str], needle: &str) {
    let out = gpuheap(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    assert_eq!(out.status.code(), Some(2), "{args:?}: exit code 2, stderr {err}");
    assert!(err.contains(needle), "{args:?}: {err:?} should name {needle:?}");
}

#[test]
fn check_with_a_thread_count_whose_bump_region_overflows_exits_2() {
    // 2^60 threads × 16 B overflowed the multiplication (a panic under overflow checks).
    assert_bad_option(&["check", "--bytes", "64", "--threads", "1152921504606846976"], "--threads");
    assert_bad_option(&["check", "--bytes", "64", "--threads", "18446744073709551615"], "--threads");
}

#[test]
fn check_with_a_buffer_too_large_exits_2() {
    assert_bad_option(&["check", "--bytes", "18446744073709551615", "--threads", "1"], "too large");
}

#[test]
fn check_with_zero_and_odd_sizes_runs() {
    for (bytes, threads) in [("0", "0"), ("1", "1"), ("7", "3")] {
        let out = gpuheap(&["check", "--bytes", bytes, "--threads", threads]);
        let (o, e) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.status.code(), Some(0), "--bytes {bytes} --threads {threads}: {e}");
        assert!(o.trim_end().ends_with("ok"), "{o}");
    }
}

#[test]
fn bench_alloc_with_threads_log2_past_32_exits_2() {
    // 64 overflowed the shift (a panic); 40 would launch 2^40 threads.
    for k in ["33", "40", "64"] {
        assert_bad_option(&["bench", "alloc", "--quick", "--threads-log2", k], "--threads-log2");
    }
}

#[test]
fn bench_alloc_with_fewer_than_32_threads_runs_and_prints_json() {
    // N = 1: the out-of-memory test's per-round thread count was clamped to [32, N] (a panic).
    let out = gpuheap(&["bench", "alloc", "--quick", "--threads-log2", "0", "--iterations", "1", "--json"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    let rows = v["rows"].as_array().expect("rows");
    let t6: Vec<_> = rows.iter().filter(|r| r["workload"] == "T6").collect();
    assert!(!t6.is_empty(), "T6 rows");
    for r in t6 {
        assert_eq!(r["threads"], 1, "{r}");
        let f = r["ratio"].as_f64().expect("usable fraction");
        assert!(f > 0.0 && f <= 1.0, "{r}");
    }
}

#[test]
fn bench_compact_with_a_tile_size_the_kernels_cannot_run_exits_2() {
    for t in ["0", "17"] {
        assert_bad_option(&["bench", "compact", "--quick", "--reps", "1", "--tile-bytes", t], "--tile-bytes");
    }
}

#[test]
fn bench_alloc_with_an_out_path_that_cannot_be_written_exits_2_before_the_run() {
    // A folder or a path in a missing folder failed after the whole run (exit 1), and the report,
    // printed after the write, was lost.
    let dir = std::env::temp_dir().join(format!("gpuheap-bench-out-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let missing = dir.join("no-such-folder").join("r.json");
    let bench =
        |out: &str| gpuheap(&["bench", "alloc", "--quick", "--threads-log2", "2", "--iterations", "1", "--out", out]);
    for out in [dir.to_str().unwrap(), missing.to_str().unwrap()] {
        let o = bench(out);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "--out {out}: {err}");
        assert!(err.contains(out), "names the path: {err}");
        assert!(!err.contains("bench alloc on"), "refused before the run: {err}");
    }
    let good = dir.join("r.json");
    let o = bench(good.to_str().unwrap());
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&good).unwrap()).expect("valid JSON");
    assert!(v["rows"].as_array().is_some_and(|r| !r.is_empty()));
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "no temporary file left behind");
    std::fs::remove_dir_all(&dir).ok();
}

/// Counts and repetitions have ceilings: a run that could not end (2^64 − 1 iterations, 10^9 repetitions)
/// is refused before it starts, naming the option (exit 2).
#[test]
fn counts_and_repetitions_past_their_ceilings_exit_2() {
    assert_bad_option(&["bench", "alloc", "--quick", "--iterations", "18446744073709551615"], "--iterations");
    assert_bad_option(&["bench", "alloc", "--quick", "--iterations", "0"], "--iterations");
    assert_bad_option(&["bench", "compact", "--quick", "--reps", "1000000000"], "--reps");
    assert_bad_option(&["bench", "oom", "--reps", "1000000000"], "--reps");
    assert_bad_option(&["bench", "oom", "--reps", "0"], "--reps");
}

/// `bench launch-limit` asks the CUDA driver: on the CPU backend (chosen, or the only one) it exits 2
/// saying that it needs a GPU, never "invalid argument" with exit code 1.
#[test]
fn bench_launch_limit_on_the_cpu_exits_2_saying_it_needs_a_gpu() {
    for args in [&["bench", "launch-limit"][..], &["bench", "launch-limit", "--backend", "cpu", "--json"]] {
        assert_bad_option(args, "bench launch-limit needs a GPU");
        let err = String::from_utf8_lossy(&gpuheap(args).stderr).into_owned();
        assert!(!err.contains("invalid argument"), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: one line: {err}");
    }
}
