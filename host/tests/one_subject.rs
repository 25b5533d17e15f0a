//! One device rule and one capacity rule for every command (`facts::choose_device`,
//! `facts::capacity_from_evidence`; docs/src/inputs-and-outputs.md): `replay`, `compare`, `explain` and
//! `tune`, with default options and with `--capacity`, report the same device and the same capacity in
//! bytes for the same file, over every shipped trace (`data/`) and every shared one (`traces/`).

mod common;

use std::path::PathBuf;

use common::{shared_files, workspace};
use gpuheap::{run_compare, run_explain, run_replay, run_tune, Options, Quiet, Snapshot};
use serde_json::Value;

/// Every trace of `data/` and of the shared `traces/` folder (skipped with a printed reason without it).
fn trace_files() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(workspace().join("data"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "pickle" || x == "csv"))
        .collect();
    v.sort();
    assert!(v.len() >= 6, "the shipped traces under data/: {v:?}");
    v.extend(shared_files("traces", &["pickle", "pkl", "csv"]));
    v
}

fn bytes(v: &Value, what: &str) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("{what}: not a byte count: {v}"))
}

/// (device ordinal, capacity bytes) each command reports; `None` for a file every command refuses alike.
fn subjects(snap: &Snapshot, opts: &Options) -> Option<Vec<(&'static str, i64, u64)>> {
    let json = |o: Result<gpuheap::Output, gpuheap::Error>| -> Result<Value, String> {
        o.map(|o| serde_json::from_str(&o.json).unwrap()).map_err(|e| e.to_string())
    };
    let runs = [
        ("replay", json(run_replay(snap, opts, &Quiet))),
        ("compare", json(run_compare(snap, opts, &Quiet))),
        ("explain", json(run_explain(snap, opts, &Quiet))),
        ("tune", json(run_tune(snap, opts, &Quiet))),
    ];
    if runs.iter().any(|(_, r)| r.is_err()) {
        // A file one command refuses (no capacity can be derived, nothing recorded) is refused by all,
        // with the same message.
        let errs: Vec<_> = runs.iter().map(|(c, r)| (c, r.as_ref().err())).collect();
        let first = errs[0].1;
        assert!(errs.iter().all(|(_, e)| e.is_some() && *e == first), "{}: {errs:?}", snap.file_name());
        return None;
    }
    let mut out = Vec::new();
    for (cmd, r) in runs {
        let v = r.unwrap();
        match cmd {
            "replay" => out.push((cmd, v["device"].as_i64().unwrap(), bytes(&v["capacity"]["bytes"], cmd))),
            "compare" => {
                let dev = v["device"].as_i64().unwrap();
                for s in v["strategies"].as_array().unwrap() {
                    let name = s["strategy"].as_str().unwrap();
                    // The device heap replays a scaled copy; its capacity says the factor.
                    if !name.starts_with("device heap") {
                        out.push((cmd, dev, bytes(&s["capacity"]["bytes"], name)));
                    }
                }
            }
            "explain" => out.push((cmd, v["device"]["device"].as_i64().unwrap(), bytes(&v["capacity"]["bytes"], cmd))),
            _ => out.push((cmd, v["device"].as_i64().unwrap(), bytes(&v["capacity"]["bytes"], cmd))),
        }
    }
    Some(out)
}

#[test]
fn replay_compare_explain_and_tune_report_the_same_device_and_capacity() {
    let mut checked = 0;
    for p in trace_files() {
        let snap = Snapshot::read(&p).unwrap();
        // The derived capacity on every file; a given one on the shipped files as well.
        let shipped = p.starts_with(workspace().join("data"));
        let capacities: &[Option<u64>] = if shipped { &[None, Some(96 << 30)] } else { &[None] };
        for &capacity in capacities {
            let mut opts = Options::default();
            opts.capacity = capacity;
            let Some(s) = subjects(&snap, &opts) else { continue };
            let (dev, cap) = (s[0].1, s[0].2);
            assert!(s.iter().all(|&(_, d, c)| (d, c) == (dev, cap)), "{} (capacity {capacity:?}): {s:?}", p.display());
            if let Some(c) = capacity {
                assert_eq!(cap, c, "{}: the given capacity", p.display());
            }
            checked += 1;
        }
    }
    assert!(checked >= 12, "files checked: {checked}");
}
