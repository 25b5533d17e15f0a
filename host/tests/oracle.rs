//! The caching model against PyTorch's own allocator, request by request.
//!
//! `oracle/` builds PyTorch's real `CUDACachingAllocator` (`libc10_cuda.so` of a torch wheel from PyPI) over
//! a stand-in CUDA runtime, and a driver that replays a request sequence through it (oracle/README.md). These
//! tests replay seeded workloads over the settings `tune` searches, and every shared trace with history, through
//! the real allocator of every built torch version and through [`CachingAllocator`] with the same
//! `PYTORCH_CUDA_ALLOC_CONF` and capacity, and compare after every request: whether it failed (out of memory),
//! the block's address (the stand-in hands out addresses by the model's rule, lowest unused range first, so
//! PyTorch's address minus the stand-in's base is the model's offset) and the reserved bytes (PyTorch's
//! `reserved_bytes.all.current`, the model's [`CachingAllocator::reserved_bytes`]). Each mismatch names the
//! version, the case's seed and settings, and the request; the mismatches already explained ([`KNOWN`]: version
//! rules the model does not hold yet) are printed, every other one fails the test.
//!
//! The versions are those `oracle/build` built under `target/oracle/` (GPUHEAP_ORACLE_VERSIONS, default
//! `2.15.0 2.8.0`). Without them the tests skip with the reason, unless `GPUHEAP_REQUIRE_ORACLE=1` (CI), when
//! they fail. The sample is GPUHEAP_ORACLE_CASES cases (default 12) of GPUHEAP_ORACLE_REQUESTS requests
//! (default 400) per version; the benchmark run (bench/results) sets both higher.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use gpuheap::reference::caching::{CachingAllocator, CachingConfig};
use gpuheap::reference::{AllocError, Allocation, SubAllocator};
use gpuheap::trace::{read_trace, EventKind};

mod common;
use common::workspace;

const MIB: u64 = 1 << 20;
/// The stand-in runtime's first virtual address on device 0 (`va_base` in oracle/standin/cudart.c).
const STANDIN_BASE: u64 = 0x7f00_0000_0000;

/// After one request: whether it failed, the reserved bytes, and the block's address (allocations).
type Outcome = (bool, u64, Option<u64>);

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(default)
}

/// The built drivers, `(version, path)`; empty after printing why, or a panic under GPUHEAP_REQUIRE_ORACLE=1.
fn drivers() -> Vec<(String, PathBuf)> {
    let versions = std::env::var("GPUHEAP_ORACLE_VERSIONS").unwrap_or_else(|_| "2.15.0 2.8.0".into());
    let required = std::env::var("GPUHEAP_REQUIRE_ORACLE").is_ok_and(|v| v.trim() == "1");
    let mut out = Vec::new();
    for v in versions.split_whitespace() {
        let p = workspace().join(format!("target/oracle/torch-{v}/driver"));
        if p.is_file() {
            out.push((v.to_string(), p));
        } else if required {
            panic!("GPUHEAP_REQUIRE_ORACLE=1 but {} is missing (oracle/fetch {v} && oracle/build {v})", p.display());
        } else {
            eprintln!("oracle: torch {v} skipped: {} not built (oracle/fetch {v} && oracle/build {v})", p.display());
        }
    }
    out
}

/// xorshift64*: the workloads are a function of their seed alone.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The settings `tune` searches, and the device's capacity, of case `seed`.
const CONFS: &[&str] = &[
    "",
    "expandable_segments:True",
    "max_split_size_mb:64",
    "max_split_size_mb:200",
    "roundup_power2_divisions:4",
    "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
    "garbage_collection_threshold:0.6",
    "expandable_segments:True,roundup_power2_divisions:8",
    "max_split_size_mb:128,garbage_collection_threshold:0.8",
];

#[derive(Clone, Debug)]
enum Req {
    Alloc { id: u64, size: u64, stream: u64 },
    Free { id: u64 },
    EmptyCache,
}

struct Case {
    seed: u64,
    conf: String,
    capacity: u64,
    fraction: Option<f64>,
    reqs: Vec<Req>,
}

/// A workload: tensors of small (< 1 MiB), medium (1–10 MiB) and large sizes on up to three streams, freed
/// in random order, now and then `empty_cache`; the capacity is small enough that some requests fail.
fn case(seed: u64, n: usize) -> Case {
    let mut r = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let conf = CONFS[(seed % CONFS.len() as u64) as usize].to_string();
    let capacity = (256 + r.below(1792)) * MIB;
    let fraction = conf.contains("garbage_collection_threshold").then(|| 0.5 + r.below(40) as f64 / 100.0);
    let mut live: Vec<u64> = Vec::new();
    let mut reqs = Vec::with_capacity(n);
    let mut next_id = 0;
    while reqs.len() < n {
        let k = r.below(100);
        if k < 55 || live.is_empty() {
            let size = match r.below(10) {
                0..=4 => 1 + r.below(MIB),
                5..=7 => MIB + r.below(9 * MIB),
                _ => 10 * MIB + r.below(150 * MIB),
            };
            reqs.push(Req::Alloc { id: next_id, size, stream: if r.below(4) == 0 { 1 + r.below(2) } else { 0 } });
            live.push(next_id);
            next_id += 1;
        } else if k < 99 {
            let id = live.swap_remove(r.below(live.len() as u64) as usize);
            reqs.push(Req::Free { id });
        } else {
            reqs.push(Req::EmptyCache);
        }
    }
    Case { seed, conf, capacity, fraction, reqs }
}

fn request_text(c: &Case) -> String {
    let mut s = String::new();
    if let Some(f) = c.fraction {
        s += &format!("fraction {f}\n");
    }
    for q in &c.reqs {
        match q {
            Req::Alloc { id, size, stream } => s += &format!("alloc {id} {size} {stream}\n"),
            Req::Free { id } => s += &format!("free {id}\n"),
            Req::EmptyCache => s += "empty_cache\n",
        }
    }
    s
}

/// What PyTorch did after each request: `(failed, reserved bytes)`.
fn run_pytorch(driver: &PathBuf, c: &Case) -> Vec<Outcome> {
    let mut child = Command::new(driver)
        .env("PYTORCH_CUDA_ALLOC_CONF", &c.conf)
        .env("GPUHEAP_STANDIN_CAPACITY", c.capacity.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the oracle driver starts");
    let text = request_text(c);
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(text.as_bytes()));
    let out = child.wait_with_output().expect("the oracle driver runs");
    writer.join().unwrap().expect("requests written");
    assert!(
        out.status.success(),
        "oracle driver {} failed on case {}: {}",
        driver.display(),
        c.seed,
        String::from_utf8_lossy(&out.stderr)
    );
    let mut v = Vec::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let j: serde_json::Value = serde_json::from_str(line).expect("the driver prints JSON");
        if j.get("snapshot").is_some() || j["op"] == "fraction" {
            continue;
        }
        // The block's address, relative to the stand-in's first device address (the model's offset 0).
        let at = j["addr"].as_u64().map(|a| a - STANDIN_BASE);
        v.push((j.get("oom").is_some(), j["reserved"].as_u64().unwrap(), at));
    }
    v
}

/// What the model does after each request.
fn run_model(c: &Case) -> Vec<Outcome> {
    let (cfg, _) = CachingConfig::from_env(&c.conf, c.capacity).expect("a setting PyTorch accepts");
    let mut m = CachingAllocator::new(cfg.memory_fraction(c.fraction)).expect("a valid model");
    let mut live: std::collections::HashMap<u64, Allocation> = Default::default();
    let mut v = Vec::with_capacity(c.reqs.len());
    for q in &c.reqs {
        let (failed, at) = match q {
            Req::Alloc { id, size, stream } => match m.alloc_on(*size, *stream as i64) {
                Ok(a) => {
                    live.insert(*id, a);
                    (false, Some(a.offset))
                }
                Err(AllocError::OutOfMemory { .. }) => (true, None),
                Err(e) => panic!("case {}: the model refused a request: {e}", c.seed),
            },
            Req::Free { id } => {
                // A request that failed has nothing to free, in PyTorch as here.
                if let Some(a) = live.remove(id) {
                    m.free(a).expect("frees a live block");
                }
                (false, None)
            }
            Req::EmptyCache => {
                m.empty_cache();
                (false, None)
            }
        };
        v.push((failed, m.reserved_bytes(), at));
    }
    v
}

/// A mismatch explained, and kept visible: the run prints each occurrence; any mismatch not listed here fails.
struct Known {
    name: &'static str,
    /// Whether the first mismatch of a case (`version`, settings, PyTorch's and the model's outcome) is this one.
    matches: fn(&str, &str, Outcome, Outcome) -> bool,
}

const KNOWN: &[Known] = &[
    Known {
        // The model rounds a request up to the next power of two when its interval has 1 division (as the BL-31
        // snapshot records, from an older release); PyTorch 2.5.1, 2.8.0 and 2.15.0 leave it at 512-byte
        // granularity (`round_size` only rounds for `divisions > 1`). A version rule the model does not hold yet.
        name: "roundup_power2_divisions of 1: no power-of-two rounding in PyTorch 2.5.1-2.15.0 (round_size)",
        // Once one request is rounded differently, every later address and segment may differ: a case with a
        // 1-division interval is only checked up to its first difference.
        matches: |_, conf, _, _| conf.contains(":1,") || conf.contains(":1]") || conf.ends_with("divisions:1"),
    },
    Known {
        // PyTorch 2.15.0 serves a request from a different one of two equal-size cached blocks of the same stream
        // than 2.8.0, 2.5.1 and the model (best fit by `(stream, size, address)`, `BlockComparatorSize`): the
        // block of the older segment, not the lower address; same reserved bytes at that request. A version rule
        // the model does not hold yet (the guide's oracle page has the evidence).
        name: "torch 2.15.0 breaks ties between equal-size cached blocks by age (BlockComparatorSize)",
        matches: |v, _, pt, model| v == "2.15.0" && pt.0 == model.0 && pt.1 == model.1 && pt.2 != model.2,
    },
];

/// The first request where the model and PyTorch differ: its index and what each did.
fn first_mismatch(pt: &[Outcome], model: &[Outcome]) -> Option<usize> {
    assert_eq!(pt.len(), model.len(), "one outcome per request from each");
    (0..pt.len()).find(|&i| pt[i] != model[i])
}

fn served(o: Outcome) -> String {
    match o {
        (true, ..) => "failed".into(),
        (false, _, Some(at)) => format!("served it at offset {at:#x}"),
        (false, _, None) => "did it".into(),
    }
}

#[test]
fn the_model_matches_pytorchs_allocator_request_by_request() {
    let drivers = drivers();
    if drivers.is_empty() {
        return;
    }
    let cases = env_or("GPUHEAP_ORACLE_CASES", 12);
    let n = env_or("GPUHEAP_ORACLE_REQUESTS", 400) as usize;
    // Server-side knobs of the stand-in's device (sizes only): the driver reads no other environment.
    let mut report = Vec::new();
    let mut known_seen = vec![0usize; KNOWN.len()];
    let mut ooms = 0;
    for (v, driver) in &drivers {
        let (mut unexplained, mut explained) = (0, 0);
        for seed in 0..cases {
            let c = case(seed, n);
            let pt = run_pytorch(driver, &c);
            ooms += pt.iter().filter(|r| r.0).count();
            let model = run_model(&c);
            let Some(i) = first_mismatch(&pt, &model) else { continue };
            // GPUHEAP_ORACLE_DUMP=DIR keeps the request file of each mismatch, for oracle/run.
            if let Some(dir) = std::env::var_os("GPUHEAP_ORACLE_DUMP") {
                let f = PathBuf::from(dir).join(format!("torch-{v}-case-{seed}.txt"));
                let text =
                    format!("# PYTORCH_CUDA_ALLOC_CONF={} capacity {}\n{}", c.conf, c.capacity, request_text(&c));
                std::fs::write(&f, text).expect("writes the dump");
            }
            let what = format!(
                "torch {v}, case {seed} (PYTORCH_CUDA_ALLOC_CONF={:?}, capacity {} MiB, fraction {:?}): request {i} \
                 ({:?}): PyTorch {} with {} B reserved, the model {} with {} B",
                c.conf,
                c.capacity / MIB,
                c.fraction,
                c.reqs[i],
                served(pt[i]),
                pt[i].1,
                served(model[i]),
                model[i].1
            );
            match KNOWN.iter().position(|k| (k.matches)(v, &c.conf, pt[i], model[i])) {
                Some(k) => {
                    known_seen[k] += 1;
                    explained += 1;
                    println!("known ({}): {what}", KNOWN[k].name);
                }
                None => {
                    unexplained += 1;
                    report.push(what);
                }
            }
        }
        println!(
            "oracle: torch {v}: {cases} cases of {n} requests: {unexplained} mismatches, {explained} known (listed above; \
             by kind {known_seen:?})"
        );
        known_seen.iter_mut().for_each(|k| *k = 0);
    }
    assert!(ooms > 0, "the workloads never reach an out-of-memory: the failure paths went untested");
    assert!(report.is_empty(), "{} mismatches:\n{}", report.len(), report.join("\n"));
}

/// A trace's request sequence (device 0): the blocks its history frees but never allocates were live before it
/// and are allocated first, then every allocation and completed free in order; streams numbered by first use.
fn requests_of(path: &std::path::Path) -> Option<(String, Vec<Req>)> {
    let t = read_trace(path).expect("a trace gpuheap reads");
    let d = t.devices.first()?;
    let conf = d.allocator_settings.as_ref().and_then(|s| s.alloc_conf.clone()).unwrap_or_default();
    let mut streams: Vec<i64> = vec![0];
    let mut stream_index = |s: i64| match streams.iter().position(|&x| x == s) {
        Some(i) => i as u64,
        None => {
            streams.push(s);
            streams.len() as u64 - 1
        }
    };
    let allocated: std::collections::HashSet<u32> =
        d.events.iter().filter(|e| e.kind == EventKind::Alloc).map(|e| e.id).collect();
    let mut reqs = Vec::new();
    let mut before: Vec<&gpuheap::trace::Event> =
        d.events.iter().filter(|e| e.kind == EventKind::Free && !allocated.contains(&e.id)).collect();
    before.sort_by_key(|e| e.addr);
    for e in before {
        reqs.push(Req::Alloc { id: e.id as u64, size: e.size, stream: stream_index(e.stream) });
    }
    for e in &d.events {
        match e.kind {
            EventKind::Alloc => reqs.push(Req::Alloc { id: e.id as u64, size: e.size, stream: stream_index(e.stream) }),
            EventKind::Free => reqs.push(Req::Free { id: e.id as u64 }),
            _ => {}
        }
    }
    (!reqs.is_empty()).then_some((conf, reqs))
}

#[test]
fn every_shared_trace_replays_alike_through_pytorch_and_the_model() {
    let drivers = drivers();
    if drivers.is_empty() {
        return;
    }
    let traces = common::shared_files("traces", &["pickle", "pkl"]);
    let mut report = Vec::new();
    for (v, driver) in &drivers {
        let (mut compared, mut mismatched, mut known) = (0, 0, 0);
        for p in &traces {
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            let Some((conf, reqs)) = requests_of(p) else {
                println!("{name}: no history, nothing to replay");
                continue;
            };
            // A GPU of 80 GiB, as the traces' largest devices; the settings the snapshot records.
            let c = Case { seed: 0, conf, capacity: 80 << 30, fraction: None, reqs };
            if CachingConfig::from_env(&c.conf, c.capacity).is_err() {
                println!("{name}: settings {:?} not for PyTorch's CUDA allocator, skipped", c.conf);
                continue;
            }
            let pt = run_pytorch(driver, &c);
            let model = run_model(&c);
            compared += 1;
            let Some(i) = first_mismatch(&pt, &model) else { continue };
            let what = format!(
                "torch {v}, {name} (PYTORCH_CUDA_ALLOC_CONF={:?}, {} requests): request {i} ({:?}): PyTorch {} with {} B \
                 reserved, the model {} with {} B",
                c.conf,
                c.reqs.len(),
                c.reqs[i],
                served(pt[i]),
                pt[i].1,
                served(model[i]),
                model[i].1
            );
            match KNOWN.iter().position(|k| (k.matches)(v, &c.conf, pt[i], model[i])) {
                Some(k) => {
                    known += 1;
                    println!("known ({}): {what}", KNOWN[k].name);
                }
                None => {
                    mismatched += 1;
                    report.push(what);
                }
            }
        }
        println!("oracle: torch {v}: {compared} shared traces: {mismatched} mismatches, {known} known");
    }
    assert!(report.is_empty(), "{} mismatches:\n{}", report.len(), report.join("\n"));
}

/// The version rule of [`KNOWN`]'s second entry, on `oracle/demo/equal_size_tie.txt`: two cached 1 MiB blocks, the
/// older segment's at the higher address. PyTorch before 2.15 and the model take the lower address; 2.15.0 takes
/// the older block.
#[test]
fn equal_size_ties_go_to_the_lower_address_before_2_15_and_to_the_older_block_in_2_15() {
    let text = std::fs::read_to_string(workspace().join("oracle/demo/equal_size_tie.txt")).expect("the demo file");
    let mut reqs = Vec::new();
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        let w: Vec<&str> = l.split_whitespace().collect();
        reqs.push(match w[0] {
            "alloc" => {
                Req::Alloc { id: w[1].parse().unwrap(), size: w[2].parse().unwrap(), stream: w[3].parse().unwrap() }
            }
            "free" => Req::Free { id: w[1].parse().unwrap() },
            _ => Req::EmptyCache,
        });
    }
    let c = Case { seed: 0, conf: String::new(), capacity: 2 << 30, fraction: None, reqs };
    let last = |o: Vec<Outcome>| o.last().and_then(|o| o.2);
    assert_eq!(last(run_model(&c)), Some(0), "the model: the lower address");
    for (v, driver) in drivers() {
        let want = if v == "2.15.0" { 2 * MIB } else { 0 };
        assert_eq!(last(run_pytorch(&driver, &c)), Some(want), "torch {v}");
    }
}
