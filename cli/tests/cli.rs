//! The `gpuheap replay` and `gpuheap compare` commands, run as the built binary: outputs on the shipped
//! traces, and every bad-input case of issue 6 (one line naming the file and the event, line or byte,
//! exit code 2, no panic, no output file left behind, partial or not).

use std::path::{Path, PathBuf};

#[path = "../../host/tests/common/mod.rs"]
mod common;
use common::pickle::{ev, snapshot, V};
use common::{gpuheap, workspace};

/// A fresh, empty folder for one test.
fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpuheap-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

/// Runs `replay` and `compare` with `--plot` and `--json` on the bad `content` (written as `name`
/// into a fresh folder, or `path_override`) and checks the contract.
fn bad_input(name: &str, content: Option<&[u8]>, needles: &[&str]) {
    let dir = temp_dir(name.trim_start_matches('.'));
    let trace = dir.join(name);
    match content {
        Some(c) => std::fs::write(&trace, c).unwrap(),
        None => std::fs::create_dir_all(&trace).unwrap(),
    }
    let before = listing(&dir);
    let t = trace.to_str().unwrap();
    for cmd in ["replay", "compare"] {
        for extra in [&["--plot"][..], &["--json", "--plot"][..]] {
            let plot = dir.join("out.svg");
            let mut args = vec![cmd, t, "--compact", "on-oom"];
            args.extend_from_slice(extra);
            args.push(plot.to_str().unwrap());
            let out = gpuheap(&args);
            let err = String::from_utf8_lossy(&out.stderr);
            println!("{cmd} {name}: {err}");
            assert_eq!(out.status.code(), Some(2), "{cmd} {name}: exit code 2, stderr {err}");
            assert!(out.stdout.is_empty(), "{cmd} {name}: nothing on stdout");
            assert_eq!(err.trim_end().lines().count(), 1, "{cmd} {name}: one line: {err:?}");
            assert!(!err.contains("panicked"), "{err}");
            assert!(err.contains(t), "{cmd} {name}: names the file: {err}");
            for n in needles {
                assert!(err.contains(n), "{cmd} {name}: {err:?} should contain {n:?}");
            }
            assert_eq!(listing(&dir), before, "{cmd} {name}: no output file left behind");
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_input_truncated_pickle() {
    let full = std::fs::read(workspace().join("data/1.3b_snapshot.pickle")).unwrap();
    bad_input("truncated.pickle", Some(&full[..full.len() / 2]), &["truncated pickle", "byte "]);
}

#[test]
fn bad_input_corrupt_pickle() {
    bad_input("corrupt.pickle", Some(b"\x80\x04}\x94(\xff."), &["byte 5", "corrupt pickle"]);
}

#[test]
fn bad_input_pickle_that_runs_code() {
    bad_input("evil.pickle", Some(b"cos\nsystem\n(S'echo hi'\ntR."), &["asks to run code", "byte 0"]);
}

#[test]
fn bad_input_wrong_type() {
    let p = snapshot(vec![ev("alloc", 0x100000, V::Int(512)), ev("free_completed", 0x100000, V::Str("512"))]);
    bad_input("wrongtype.pickle", Some(&p), &["device 0, event 1, field `size`", "expected an integer"]);
    bad_input("wrongtype.csv", Some(b"id,lower,upper,size\n0,0,10,16\n1,5,x7,16\n"), &["line 3", "column `upper`"]);
}

#[test]
fn bad_input_unknown_address_free() {
    let p = snapshot(vec![ev("alloc", 0x100000, V::Int(512)), ev("free_completed", 0x900000, V::Int(512))]);
    bad_input("unknown.pickle", Some(&p), &["device 0, event 1", "unknown address 0x900000"]);
}

#[test]
fn bad_input_double_free() {
    let p = snapshot(vec![
        ev("alloc", 0x100000, V::Int(512)),
        ev("free_requested", 0x100000, V::Int(512)),
        ev("free_completed", 0x100000, V::Int(512)),
        ev("free_completed", 0x100000, V::Int(512)),
    ]);
    bad_input("double.pickle", Some(&p), &["device 0, event 3", "double free"]);
}

#[test]
fn bad_input_negative_and_overflowing_sizes() {
    let p = snapshot(vec![ev("alloc", 0x100000, V::Int(-5))]);
    bad_input("negative.pickle", Some(&p), &["device 0, event 0, field `size`", "negative value -5"]);
    let p = snapshot(vec![ev("alloc", 0x100000, V::Int(1 << 64))]);
    bad_input("overflow.pickle", Some(&p), &["device 0, event 0, field `size`", "does not fit in 64 bits"]);
    bad_input("negative.csv", Some(b"id,lower,upper,size\n0,0,10,-16\n"), &["line 2", "negative value -16"]);
}

#[test]
fn bad_input_empty_file_and_directory() {
    bad_input("empty.pickle", Some(b""), &["empty file"]);
    bad_input("adir.pickle", None, &["is a directory"]);
}

#[test]
fn bad_options_exit_2() {
    let t = workspace().join("data/K.1048576.csv");
    let t = t.to_str().unwrap();
    for args in [
        vec!["replay", t, "--capacity", "lots"],
        vec!["replay", t, "--compact", "threshold=1.5"],
        vec!["replay", t, "--strategy", "worst-fit"],
        vec!["replay", t, "--device", "3"],
        vec!["replay", t, "--plot", "out.gif"],
        vec!["replay", t, "--capacity", "1"],
    ] {
        let out = gpuheap(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn replay_table_on_the_shipped_snapshot() {
    let out = gpuheap(&["replay", "data/1.3b_snapshot.pickle"]);
    let s = String::from_utf8_lossy(&out.stdout);
    println!("{s}");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for n in [
        "strategy       caching",
        "peak allocated",
        "external fragmentation",
        "caching model  at end 7.09 GiB in 257 segments",
    ] {
        assert!(s.contains(n), "{n:?} in\n{s}");
    }
    assert!(s.contains("+0.00 % reserved, +0.00 % segments vs the snapshot"), "{s}");
}

#[test]
fn compare_json_and_plots_on_the_shipped_csv() {
    let dir = temp_dir("compare");
    for ext in ["svg", "png"] {
        let plot = dir.join(format!("k.{ext}"));
        let out = gpuheap(&[
            "compare",
            "data/K.1048576.csv",
            "--compact",
            "on-oom",
            "--json",
            "--plot",
            plot.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
        let strategies = v["strategies"].as_array().unwrap();
        assert_eq!(
            strategies.len(),
            7,
            "every host strategy but the caching model (below its 2 MiB minimum), and the device heap"
        );
        assert_eq!(v["not_run"][0]["strategy"], "caching");
        let dh = strategies.iter().find(|s| s["strategy"] == "device heap").expect("the device allocator's row");
        assert_eq!(dh["device_heap"]["scaled_by"], 1);
        assert!(dh["compactions"].as_array().unwrap().is_empty(), "raw malloc blocks never move");
        let ff = strategies.iter().find(|s| s["strategy"] == "first-fit").unwrap();
        assert!(!ff["compactions"].as_array().unwrap().is_empty(), "first-fit compacts on OOM at capacity 1 MiB");
        let meta = std::fs::metadata(&plot).unwrap();
        assert!(meta.len() > 1000, "{ext} plot written");
    }
    let svg = std::fs::read_to_string(dir.join("k.svg")).unwrap();
    assert!(svg.starts_with("<svg") || svg.contains("<svg"), "an SVG document");
    let png = std::fs::read(dir.join("k.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(listing(&dir), vec!["k.png".to_string(), "k.svg".to_string()], "no temporary files left");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn compare_table_sums_up_compactions_unless_verbose() {
    let args = ["compare", "data/K.1048576.csv", "--compact", "on-oom"];
    let out = gpuheap(&args);
    let s = String::from_utf8_lossy(&out.stdout);
    println!("{s}");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(s.contains("compactions (one line per strategy"), "{s}");
    let summary: Vec<&str> = s.lines().filter(|l| l.contains(" compactions, ") && l.contains(" planned")).collect();
    assert_eq!(summary.len(), 6, "one summary line per host strategy that compacted:\n{s}");
    let ff = summary.iter().find(|l| l.trim_start().starts_with("first-fit")).unwrap();
    assert!(ff.contains("measured full size") && ff.contains("GB/s") && ff.contains("not measured 0"), "{ff}");
    let buddy = summary.iter().find(|l| l.trim_start().starts_with("buddy")).unwrap();
    assert!(buddy.contains("alignment gaps"), "the reason a compaction was not measured: {buddy}");
    assert!(!s.contains("    measured on"), "no per-compaction lines without --verbose");
    assert!(s.lines().count() < 40, "condensed: {} lines", s.lines().count());
    let device = s.lines().find(|l| l.starts_with("device heap ")).expect("device heap row");
    assert!(device.contains("n/a"), "compaction does not apply to raw malloc blocks: {device}");

    let out = gpuheap(&[&args[..], &["--verbose"]].concat());
    let v = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(v.contains("compactions of first-fit:") && v.contains("    measured on"), "--verbose lists each");
    let per_compaction = v.lines().filter(|l| l.trim_start().starts_with("event ")).count();
    assert!(per_compaction > 200, "every compaction listed: {per_compaction}");
}

#[test]
fn compare_has_the_device_heap_row_on_the_shipped_snapshot() {
    let out = gpuheap(&["compare", "data/1.3b_snapshot.pickle"]);
    let s = String::from_utf8_lossy(&out.stdout);
    println!("{s}");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let row = s.lines().find(|l| l.starts_with("device heap ")).expect("device heap row");
    assert!(row.contains("5.30 GiB") && row.contains("n/a"), "unscaled on the CPU (8 GiB heap): {row}");
    // A small limit scales the trace, and the row says so.
    let out = gpuheap(&["compare", "data/1.3b_snapshot.pickle", "--device-heap-limit", "1GiB"]);
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(s.lines().any(|l| l.starts_with("device heap (scaled 1/8)")), "{s}");
    assert!(s.contains("its byte figures are the scaled replay's"), "{s}");
    let out = gpuheap(&["compare", "data/1.3b_snapshot.pickle", "--device-heap-limit", "lots"]);
    assert_eq!(out.status.code(), Some(2));
}

/// An output path (`--html`, `--plot`) that is the trace itself, or in a folder that takes no new file, is
/// refused with exit code 2 before any work, and the trace is left as it was.
#[test]
fn output_paths_that_would_replace_the_trace_or_cannot_be_written_exit_2() {
    let dir = temp_dir("output-paths");
    let csv = dir.join("K.1048576.csv");
    let content = std::fs::read(workspace().join("data/K.1048576.csv")).unwrap();
    std::fs::write(&csv, &content).unwrap();
    let t = csv.to_str().unwrap();
    let svg = dir.join("trace.svg");
    std::fs::write(&svg, b"<svg/>").unwrap();
    for args in [
        vec!["replay", t, "--html", t],
        vec!["compare", t, "--html", t],
        vec!["explain", t, "--no-tune", "--html", t],
        vec!["tune", t, "--html", t],
    ] {
        let out = gpuheap(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("is the trace being read"), "{args:?}: {err}");
        assert_eq!(std::fs::read(&csv).unwrap(), content, "{args:?}: the trace is untouched");
    }
    // /proc takes no new file, even for root.
    for args in [vec!["replay", t, "--html", "/proc/gpuheap-report.html"], vec!["replay", t, "--plot", "/proc/p.png"]] {
        let out = gpuheap(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("cannot write in folder /proc"), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}: refused before any work");
    }
    // A link to /dev/null and a named pipe: the rename would replace them (as root, a link at
    // /dev/null itself would replace the device), so they are refused before any work.
    let null = dir.join("null.html");
    std::os::unix::fs::symlink("/dev/null", &null).unwrap();
    let fifo = dir.join("fifo.svg");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    for args in
        [vec!["replay", t, "--html", null.to_str().unwrap()], vec!["compare", t, "--plot", fifo.to_str().unwrap()]]
    {
        let out = gpuheap(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("is not a regular file"), "{args:?}: {err}");
    }
    assert!(std::fs::symlink_metadata(&null).unwrap().file_type().is_symlink(), "the link is untouched");
    assert_eq!(listing(&dir), ["K.1048576.csv", "fifo.svg", "null.html", "trace.svg"], "nothing left behind");
    std::fs::remove_dir_all(&dir).ok();
}

/// `--capacity` outside [4 KiB, 2^48 B] is refused by every command, exit code 2; a whole number near
/// 2^64 is read exactly, not rounded through a float.
#[test]
fn capacity_outside_the_modelled_range_exits_2_everywhere() {
    let t = workspace().join("data/1.3b_snapshot.pickle");
    let t = t.to_str().unwrap();
    for cmd in ["replay", "compare", "explain", "tune"] {
        for (cap, needle) in [
            ("0", "capacity 0 B is outside [4096 B, 2^48 B]"),
            ("3", "capacity 3 B is outside"),
            ("1e15", "capacity 1000000000000000 B is outside"),
            ("18446744073709551614", "capacity 18446744073709551614 B is outside"),
            ("18446744073709551616", "is negative or out of range"),
            ("16777216TiB", "is above 2^64 - 1"),
        ] {
            let out = gpuheap(&[cmd, t, "--capacity", cap]);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{cmd} --capacity {cap}: {err}");
            assert!(err.contains(needle), "{cmd} --capacity {cap}: {err:?} should contain {needle:?}");
            assert!(out.stdout.is_empty(), "{cmd} --capacity {cap}");
        }
    }
}

/// A minimalloc file name whose capacity no strategy models is refused naming the file name, not
/// silently raised to the 4 KiB minimum; `--capacity` overrides it.
#[test]
fn file_name_capacity_outside_the_modelled_range_exits_2() {
    let dir = temp_dir("name-capacity");
    for name in ["K.0.csv", "K.100.csv", "K.18446744073709551615.csv"] {
        let p = dir.join(name);
        std::fs::write(&p, b"id,lower,upper,size\n0,0,10,100\n").unwrap();
        let t = p.to_str().unwrap();
        for cmd in ["replay", "compare", "explain", "tune"] {
            let out = gpuheap(&[cmd, t]);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{cmd} {name}: {err}");
            assert!(err.contains(&format!("{t}: file name: capacity ")), "{cmd} {name}: {err}");
            assert!(err.contains("give --capacity"), "{cmd} {name}: {err}");
        }
        assert_eq!(gpuheap(&["replay", t, "--capacity", "1MiB"]).status.code(), Some(0), "{name}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `gpuheap --help` lists the commands in the order people use them: a snapshot's questions (`explain`,
/// `tune`, `compare`, `replay`) before the trace tools and the machine's checks and benchmarks.
#[test]
fn help_lists_the_snapshot_commands_first() {
    let out = gpuheap(&["--help"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let commands: Vec<&str> = text
        .lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(commands, ["explain", "tune", "compare", "replay", "trace", "info", "check", "bench", "help"]);
}

/// Every option of `replay`, `compare`, `explain` and `tune` is a row of the library's option table
/// (`gpuheap::options::OPTIONS`), and `--help` prints exactly the rows the command takes, each with the
/// row's help text (written only there): the flags besides them are the outputs and the global ones.
#[test]
fn help_lists_each_commands_rows_of_the_option_table_with_their_help() {
    use gpuheap::options::{options_of, Command};
    let outputs = ["--json", "--plot", "--html", "--max-memory", "--help"];
    for (name, command) in [
        ("replay", Command::Replay),
        ("compare", Command::Compare),
        ("explain", Command::Explain),
        ("tune", Command::Tune),
    ] {
        let out = gpuheap(&[name, "--help"]);
        assert!(out.status.success(), "{name}");
        let text = String::from_utf8(out.stdout).unwrap();
        let flags: Vec<&str> =
            text.lines().filter_map(|l| l.split_whitespace().next()).filter(|w| w.starts_with("--")).collect();
        let rows: Vec<_> = options_of(command).collect();
        let want: Vec<String> = rows.iter().map(|r| r.flag()).collect();
        let got: Vec<&str> = flags.iter().copied().filter(|f| !outputs.contains(f)).collect();
        assert_eq!(got, want, "{name}: the flags are the table's rows, in its order");
        for r in rows {
            let help = r.help.strip_suffix('.').unwrap_or(r.help);
            assert!(text.contains(help), "{name} {}: the row's help, as written in the table:\n{text}", r.flag());
        }
    }
}
