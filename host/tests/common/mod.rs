//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod pickle;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gpuheap::backend::{Backend, BackendError};
use gpuheap::compaction::{oracle, LiveBlock};
use gpuheap::reference::{plan_slide, CompactionPlan};

/// `true` when `GPUHEAP_REQUIRE_GPU=1`: every "GPU part skipped" is a failure instead
/// (`scripts/gpu-suite run` sets it, so a test that cannot create the GPU backend fails
/// rather than passing without having launched anything).
pub fn gpu_required() -> bool {
    std::env::var("GPUHEAP_REQUIRE_GPU").is_ok_and(|v| v.trim() == "1")
}

/// The GPU backend, or `None` after printing why the GPU half of a test is
/// skipped (no driver, no device, or a build without PTX).
///
/// # Panics
/// Instead of skipping, when [`gpu_required`]; always when the driver refuses
/// gpuheap's PTX (a JIT failure on a GPU is a failure, not a missing GPU).
pub fn gpu_or_skip(test: &str) -> Option<Backend> {
    let usable = Backend::gpu().and_then(|b| match &b {
        Backend::Gpu(g) => g.builtin().map(|_| ()).map(|()| b),
        Backend::Cpu(_) => unreachable!("Backend::gpu returned a CPU backend"),
    });
    match usable {
        Ok(b) => Some(b),
        Err(e) if gpu_required() || !is_no_gpu(&e) => {
            panic!("{test}: the GPU backend is not usable (GPUHEAP_REQUIRE_GPU={}): {e}", gpu_required() as u8)
        }
        Err(e) => {
            eprintln!("{test}: GPU part skipped: {e}");
            None
        }
    }
}

/// A file the tests read from the project's `data/` folder, found without the build machine's
/// path: `GPUHEAP_DATA_DIR`, else `data/` of the crate's workspace when cargo runs the test
/// (`CARGO_MANIFEST_DIR` at run time), else a `data/` folder beside the test binary or one level
/// up (the GPU bundle: `tests/NAME` and `data/`).
///
/// # Panics
/// When the file is in none of them (a test whose input is missing must not pass).
pub fn data_file(name: &str) -> PathBuf {
    let mut dirs: Vec<PathBuf> = Vec::new();
    dirs.extend(std::env::var_os("GPUHEAP_DATA_DIR").map(PathBuf::from));
    dirs.extend(std::env::var_os("CARGO_MANIFEST_DIR").map(|d| Path::new(&d).join("../data")));
    if let Ok(exe) = std::env::current_exe() {
        dirs.extend(exe.ancestors().skip(1).take(2).map(|d| d.join("data")));
    }
    dirs.iter().map(|d| d.join(name)).find(|p| p.is_file()).unwrap_or_else(|| {
        panic!("data file {name} not found in {dirs:?} (set GPUHEAP_DATA_DIR to the folder that holds it)")
    })
}

/// Seeds of the independent-thread-scheduling backends of [`backends`]:
/// `GPUHEAP_ITS_SEEDS` as `N` (seeds `0..N`) or `A..B`; default `0..1`.
/// `scripts/test` runs the device tests over many seeds; a failure names its
/// seed, and `GPUHEAP_ITS_SEEDS=S..S+1` replays it.
pub fn its_seeds() -> std::ops::Range<u64> {
    let v = std::env::var("GPUHEAP_ITS_SEEDS").unwrap_or_default();
    let parse = |s: &str| s.trim().parse::<u64>().unwrap_or_else(|_| panic!("GPUHEAP_ITS_SEEDS={v:?}"));
    match v.split_once("..") {
        _ if v.trim().is_empty() => 0..1,
        Some((a, b)) => parse(a)..parse(b),
        None => 0..parse(&v),
    }
}

/// The names `GPUHEAP_TEST_BACKENDS` takes.
pub const BACKEND_NAMES: [&str; 4] = ["sequential", "lockstep", "independent", "gpu"];

/// Every backend to run a test on: the CPU in sequential and lockstep mode,
/// in independent-thread-scheduling mode once per seed of [`its_seeds`],
/// and the GPU when usable.
///
/// `GPUHEAP_TEST_BACKENDS` (a comma-separated subset of `sequential`,
/// `lockstep`, `independent`, `gpu`) keeps only those: `scripts/test` runs
/// the device tests once more with `independent` alone over many seeds.
pub fn backends(test: &str) -> Vec<Backend> {
    let only = std::env::var("GPUHEAP_TEST_BACKENDS").unwrap_or_default();
    let want = |name: &str| only.trim().is_empty() || only.split(',').any(|s| s.trim() == name);
    if let Some(bad) = only.split(',').map(str::trim).find(|s| !s.is_empty() && !BACKEND_NAMES.contains(s)) {
        panic!("GPUHEAP_TEST_BACKENDS={only:?}: {bad:?} is not one of {BACKEND_NAMES:?}");
    }
    let mut v = Vec::new();
    if want("sequential") {
        v.push(Backend::cpu());
    }
    if want("lockstep") {
        v.push(Backend::cpu_lockstep());
    }
    if want("independent") {
        v.extend(its_seeds().map(Backend::cpu_independent));
    }
    if want("gpu") {
        v.extend(gpu_or_skip(test));
    }
    v
}

/// `true` for the CPU modes whose warps have 32 lanes, one OS thread each
/// (lockstep and independent): tests keep their launches small there.
pub fn has_thread_per_lane(b: &Backend) -> bool {
    matches!(b, Backend::Cpu(c) if c.mode().warp_lanes() > 1)
}

/// `true` when `e` is one of the "no GPU here" errors.
pub fn is_no_gpu(e: &BackendError) -> bool {
    matches!(e, BackendError::NoDriver | BackendError::NoDevice(_) | BackendError::NoPtx { .. })
}

/// The compaction oracle: `plan_slide` of `layout` in a region of `capacity`
/// bytes, as new offsets in layout order, and the plan itself.
pub fn slide(layout: &[LiveBlock], capacity: u64) -> (Vec<u64>, CompactionPlan) {
    let plan = plan_slide(&oracle::slide_layout(layout, capacity)).expect("plan_slide rejects the layout");
    let mut dst = vec![u64::MAX; layout.len()];
    for m in &plan.moves {
        let b = &layout[m.id as usize];
        assert_eq!((m.src, m.len), (b.offset, b.size), "plan_slide lost a block");
        dst[m.id as usize] = m.dst;
    }
    assert!(dst.iter().all(|&d| d != u64::MAX), "plan_slide dropped a block");
    (dst, plan)
}

/// The workspace root (the parent of `host/`).
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Runs the built `gpuheap` binary with `args` in the workspace root, on the CPU backend. Only the
/// tests of the `gpuheap-cli` package (`cli/tests`, which include this module) have the binary.
pub fn gpuheap(args: &[&str]) -> Output {
    let bin = option_env!("CARGO_BIN_EXE_gpuheap").expect("the gpuheap binary: a test of the gpuheap-cli package");
    Command::new(bin).args(args).current_dir(workspace()).env("GPUHEAP_BACKEND", "cpu").output().expect("runs")
}

/// The project's shared folder: `$GPUHEAP_SHARED`, else `shared/` beside the checkout (the parent of
/// the workspace whose `host/` cargo names in the run-time `CARGO_MANIFEST_DIR`; a test binary run
/// outside cargo, as in the GPU bundle, has none and needs `GPUHEAP_SHARED`). It holds real snapshots
/// (`traces/`) and bug-report inputs (`cases/inputs/`) that are test inputs but not shipped (their
/// licences; `traces/SOURCES.md`).
pub fn shared_dir() -> PathBuf {
    std::env::var_os("GPUHEAP_SHARED").map(PathBuf::from).unwrap_or_else(|| {
        let manifest = std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(PathBuf::new, PathBuf::from);
        manifest.join("../../shared")
    })
}

/// `true` when a missing shared input must fail the test (`GPUHEAP_REQUIRE_SHARED=1`; `.ci/run` sets it).
pub fn shared_required() -> bool {
    std::env::var("GPUHEAP_REQUIRE_SHARED").is_ok_and(|v| v == "1")
}

/// Says that `what` is absent: a panic under [`shared_required`], else a printed "skipped" line.
fn shared_absent(what: &Path) {
    assert!(
        !shared_required(),
        "GPUHEAP_REQUIRE_SHARED=1 but {} is absent (set GPUHEAP_SHARED to the shared folder)",
        what.display()
    );
    println!("skipped: {} is absent (GPUHEAP_SHARED names the shared folder)", what.display());
}

/// The shared input `rel` (e.g. `traces/memory_ctx512_fullstep_.pickle`, `cases/inputs/bl23_huge.csv`):
/// `Some(path)` when present; when absent, `None` after printing that the part is skipped, or a panic
/// when [`shared_required`].
pub fn shared(rel: &str) -> Option<PathBuf> {
    let p = shared_dir().join(rel);
    if p.exists() {
        Some(p)
    } else {
        shared_absent(&p);
        None
    }
}

/// The files of the shared folder's `dir` (e.g. `traces`) whose extension is one of `exts`, sorted;
/// empty after printing that they are skipped (a panic when [`shared_required`]) when it is absent.
pub fn shared_files(dir: &str, exts: &[&str]) -> Vec<PathBuf> {
    let d = shared_dir().join(dir);
    let Ok(rd) = std::fs::read_dir(&d) else {
        shared_absent(&d);
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().and_then(|x| x.to_str()).is_some_and(|x| exts.contains(&x)))
        .collect();
    v.sort();
    v
}
