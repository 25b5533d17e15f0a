//! `gpuheap info`, run as the built binary: it runs without a GPU (the CPU backend, or no driver), takes
//! `--backend` like the other commands, and where a GPU is present prints used / total as a percentage
//! that agrees with the bytes it prints.

use std::path::Path;
use std::process::{Command, Output};

fn info(args: &[&str], backend_env: Option<&str>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpuheap"));
    c.arg("info").args(args).current_dir(Path::new(env!("CARGO_MANIFEST_DIR")));
    match backend_env {
        Some(b) => c.env("GPUHEAP_BACKEND", b),
        None => c.env_remove("GPUHEAP_BACKEND"),
    };
    c.output().expect("runs")
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// Checks a `memory:` line: the percentage is used / total of the exact bytes printed, and
/// used + free ≤ total (NVML may count reserved bytes in neither).
fn check_memory_line(out: &str) {
    let line = out.lines().find(|l| l.trim_start().starts_with("memory:")).unwrap_or_else(|| panic!("{out}"));
    let num_before = |suffix: &str| -> u64 {
        let i = line.find(suffix).unwrap_or_else(|| panic!("{suffix:?} in {line}"));
        let head = &line[..i];
        let start = head.rfind(|c: char| !c.is_ascii_digit()).map_or(0, |j| j + 1);
        head[start..].parse().unwrap_or_else(|_| panic!("number before {suffix:?} in {line}"))
    };
    let (used, total, free) = (num_before(" B used"), num_before(" B total"), num_before(" B free"));
    assert!(total > 0 && used <= total && used.saturating_add(free) <= total, "{line}");
    let i = line.find(" % occupied").unwrap();
    let head = &line[..i];
    let pct: f64 = head[head.rfind('(').unwrap() + 1..].parse().unwrap();
    let want = used as f64 / total as f64 * 100.0;
    assert!((pct - want).abs() <= 0.05 + 1e-9, "{pct} % printed, {want} % from the bytes: {line}");
}

#[test]
fn info_on_the_cpu_backend_needs_no_gpu() {
    for (args, env) in [(&["--backend", "cpu"][..], None), (&[][..], Some("cpu"))] {
        let o = info(args, env);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{args:?}: {err}");
        assert!(out.starts_with("PTX kernels: "), "{out}");
        assert!(out.lines().any(|l| l.starts_with("backend cpu: ")), "{out}");
        assert!(!out.contains("memory:"), "the CPU backend does not touch the GPU: {out}");
    }
}

#[test]
fn info_reports_occupancy_or_that_there_is_no_driver() {
    let o = info(&["--backend", "auto"], None);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    if out.contains("no NVIDIA driver found") {
        // No GPU here: `--backend gpu` is the same error as in every other command (exit 1, one line).
        let g = info(&["--backend", "gpu"], None);
        let (gout, gerr) = text(&g);
        assert_eq!(g.status.code(), Some(1), "{gout}{gerr}");
        assert_eq!(gerr.trim_end().lines().count(), 1, "{gerr:?}");
        assert!(gerr.starts_with("gpuheap: error: "), "{gerr}");
    } else if out.contains("GPU backend unavailable") {
        eprintln!("info: a driver without a usable device: {out}");
    } else {
        check_memory_line(&out);
        assert!(!out.contains("utilisation: gpu"), "utilisation rates are not labelled as occupancy: {out}");
    }
    let bad = info(&["--backend", "tpu"], None);
    assert_eq!(bad.status.code(), Some(2), "an unknown backend is a usage error");
}
