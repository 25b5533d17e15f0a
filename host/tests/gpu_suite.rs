//! `scripts/gpu-suite run --dry-run` with a stand-in `nvidia-smi`: the plan runs its steps in the
//! order the GPU run needs (machine facts, the module, the self-check, the tests with the GPU
//! required, the rows of kernel authors' first questions (sizes 16 B to 1 MiB, an out-of-memory on
//! a 1 GiB heap and under churn, recovery after it), the out-of-memory probe, the benchmarks, the
//! launch-limit probe, then repeats), and every step of it, the benchmarks included, ends inside
//! the default budget even if each runs to its limit; and `scripts/glibc-check` reads the glibc
//! symbol versions a binary needs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// A folder holding a stand-in `nvidia-smi` that reports an H200.
fn stand_in_nvidia_smi() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpuheap-suite-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let smi = dir.join("nvidia-smi");
    std::fs::write(
        &smi,
        "#!/bin/sh\ncase \"$*\" in\n*query-gpu=name*) echo 'NVIDIA H200' ;;\n*driver_version*) echo '570.124.06' ;;\n\
         *) echo 'stand-in nvidia-smi' ;;\nesac\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

fn dry_run(path: &str, args: &[&str]) -> (String, Output) {
    let out = Command::new("bash")
        .arg(workspace().join("scripts/gpu-suite"))
        .args(["run", "--dry-run"])
        .args(args)
        .env("PATH", path)
        .env_remove("GPUHEAP_SUITE_BUDGET_S")
        .env_remove("GPUHEAP_SUITE_MIN_STEP_S")
        .output()
        .expect("bash runs");
    (String::from_utf8_lossy(&out.stdout).into_owned(), out)
}

/// The number in `line` right before `word` (`"… ends by 395 s of the 420 s budget"`).
fn number_before(line: &str, word: &str) -> u64 {
    let head = &line[..line.find(word).unwrap_or_else(|| panic!("{word:?} in {line:?}"))];
    head.split_whitespace().last().unwrap().parse().unwrap_or_else(|_| panic!("a number before {word:?} in {line:?}"))
}

#[test]
fn the_dry_run_orders_the_steps_and_fits_the_benchmarks_in_the_default_budget() {
    let fake = stand_in_nvidia_smi();
    let path = format!("{}:{}", fake.display(), std::env::var("PATH").unwrap_or_default());
    let (text, out) = dry_run(&path, &[]);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("NVIDIA H200 (driver 570.124.06); budget 420 s"), "{text}");
    // The order of the GPU run.
    let order = [
        "nvidia-smi -q",
        "machine: host, glibc, driver",
        "gpuheap info --kernels",
        "gpuheap check",
        "test device_bug_scenarios",
        "test device_heap",
        "test heap_compaction",
        "test compaction",
        "test backends",
        "test growable",
        "row sizes 16 B to 1 MiB",
        "row oom on a 1 GiB heap",
        "row oom under churn",
        "row recovery after oom",
        "gpuheap bench oom",
        "gpuheap bench alloc --quick",
        "gpuheap bench compact",
        "gpuheap bench launch-limit",
        "repeat",
    ];
    let at: Vec<usize> =
        order.iter().map(|s| text.find(s).unwrap_or_else(|| panic!("{s:?} missing:\n{text}"))).collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "steps out of order ({order:?} at {at:?}):\n{text}");
    // Every test binary, and each row's test, runs on the GPU alone, with the GPU required.
    let tests: Vec<&str> = text.lines().filter(|l| l.contains("/tests/")).collect();
    assert_eq!(tests.len(), 6 + 4, "{text}");
    let rows: Vec<&str> = tests.iter().copied().filter(|l| l.contains("/tests/gpu_rows\" row_")).collect();
    assert_eq!(rows.len(), 4, "each row is one test of gpu_rows: {text}");
    assert!(rows.iter().all(|l| l.contains("--exact --nocapture")), "{text}");
    assert!(tests.iter().all(|l| l.contains("GPUHEAP_TEST_BACKENDS=gpu GPUHEAP_REQUIRE_GPU=1")), "{text}");
    assert!(text.contains("bench launch-limit --blocks 256,768,1024"), "{text}");
    // The benchmarks, and every planned step, end inside the budget in the worst case.
    let bench = text.lines().find(|l| l.starts_with("benchmarks end by")).expect("the benchmarks' line");
    assert!(number_before(bench, "s of the") <= 420 && bench.ends_with(": inside"), "{bench}");
    let all = text.lines().find(|l| l.starts_with("every planned step ends by")).expect("the plan's line");
    assert!(number_before(all, "s of the") <= 420 && all.ends_with(": inside"), "{all}");
    // Each step's "ends by" is the running sum of the limits.
    let mut sum = 0;
    for l in text.lines().filter(|l| l.trim_start().chars().next().is_some_and(|c| c.is_ascii_digit())) {
        let f: Vec<&str> = l.split_whitespace().collect();
        sum += f[2].trim_end_matches('s').parse::<u64>().unwrap();
        assert_eq!(f[3].trim_end_matches('s').parse::<u64>().unwrap(), sum, "{l}");
    }
    assert_eq!(sum, number_before(all, "s of the"));

    // A budget too small for the plan says so (and still only plans).
    let (small, out) = dry_run(&path, &["--budget", "200"]);
    assert!(out.status.success(), "{small}");
    assert!(small.contains("(past the budget: cut or skipped)") && small.contains(": OUTSIDE"), "{small}");
    let (_, out) = dry_run(&path, &["--budget", "lots"]);
    assert_eq!(out.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(fake);
}

#[test]
fn without_a_gpu_the_dry_run_plans_the_cpu_counterparts() {
    // A PATH without any nvidia-smi.
    let empty = std::env::temp_dir().join(format!("gpuheap-suite-nosmi-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let path = format!("{}:/usr/bin:/bin", empty.display());
    let (text, out) = dry_run(&path, &[]);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("no GPU found"), "{text}");
    assert!(!text.contains("nvidia-smi -q") && !text.contains("launch-limit"), "{text}");
    assert!(text.contains("GPUHEAP_TEST_BACKENDS=independent") && !text.contains("GPUHEAP_REQUIRE_GPU"), "{text}");
    assert!(text.contains("bench compact --quick"), "{text}");
    let _ = std::fs::remove_dir_all(empty);
}

#[test]
fn glibc_check_reports_the_newest_symbol_version_and_fails_past_the_limit() {
    let check = workspace().join("scripts/glibc-check");
    // This test binary, built natively: it needs some GLIBC_2.x.
    let me = std::env::current_exe().unwrap();
    let run = |max: &str| Command::new("bash").arg(&check).args(["--max", max]).arg(&me).output().unwrap();
    let ok = run("99.0");
    let text = String::from_utf8_lossy(&ok.stdout).into_owned();
    if ok.status.code() == Some(2) && String::from_utf8_lossy(&ok.stderr).contains("objdump") {
        eprintln!("glibc-check part skipped: objdump is not installed");
        return;
    }
    assert!(ok.status.success(), "{text}");
    let last = text.lines().last().unwrap();
    assert!(last.starts_with("newest glibc needed: 2."), "{text}");
    let needed = last["newest glibc needed: ".len()..].split_whitespace().next().unwrap().to_string();
    // The same binary against a limit just below what it needs fails and names the symbols.
    let (major, minor) = needed.split_once('.').unwrap();
    let below = format!("{major}.{}", minor.split('.').next().unwrap().parse::<u32>().unwrap() - 1);
    let bad = run(&below);
    assert_eq!(bad.status.code(), Some(1), "{}", String::from_utf8_lossy(&bad.stdout));
    assert!(String::from_utf8_lossy(&bad.stdout).contains(&format!("NEWER than {below}")));
    let none = Command::new("bash").arg(&check).arg(workspace().join("README.md")).output().unwrap();
    assert_eq!(none.status.code(), Some(2));
}
