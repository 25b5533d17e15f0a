//! What holds the memory at a capacity OOM (issue 20, item 4): the stack frames of the PyTorch 2.0
//! layout, the site of C++-only stacks, the breakdown by site and kind, and `explain --without SITE`.
//!
//! The hand-made snapshot's figures are known by construction (each site allocates one tensor of a
//! size that PyTorch neither rounds nor segments differently: a multiple of 2 MiB above 10 MiB). The
//! figures of `data/1.3b_snapshot.pickle` come from a plain unpickler (every global refused) walking the
//! final state's blocks: 785 live blocks, 5,683,450,880 B; the innermost user frame of the history entry
//! at each block's address (blocks have no `address` in that layout: the sum of the sizes before it
//! within its segment) is `flexgen/pytorch_backend.py:195 allocate` for 778 of them, 5,674,860,544 B.

#[path = "../../host/tests/common/mod.rs"]
mod common;

use std::path::Path;

use common::pickle::{pickle, V};
use gpuheap::explain::breakdown::{kind_of, site_of};
use gpuheap::explain::{explain_with_bytes, what_if_without, Explanation, Kind, SiteOrigin};
use gpuheap::trace::parse_trace;
use gpuheap::trace::read_frames;
use gpuheap::{Options, Quiet, Snapshot};

const MIB: u64 = 1 << 20;

fn py<'a>(file: &'a str, name: &'a str, line: i128) -> V<'a> {
    V::Dict(vec![("filename", V::Str(file)), ("name", V::Str(name)), ("line", V::Int(line))])
}

fn cpp(name: &str) -> V<'_> {
    V::Dict(vec![("filename", V::Str("??")), ("name", V::Str(name)), ("line", V::Int(0))])
}

/// The allocation machinery every C++ stack starts with.
fn machinery() -> Vec<V<'static>> {
    vec![
        cpp("torch::unwind::unwind()"),
        cpp("torch::CapturedTraceback::gather(bool, bool, bool)"),
        cpp(
            "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(int, unsigned long, CUstream_st*)",
        ),
        cpp("c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long) const"),
    ]
}

/// (site's frames, bytes): parameters, optimizer state, a C++-only gradient, a C++-only cuBLAS
/// workspace, an activation.
fn sites() -> Vec<(Vec<V<'static>>, u64)> {
    let mut grad = machinery();
    grad.extend([
        cpp("at::TensorBase at::detail::_empty_generic<long>(c10::ArrayRef<long>, c10::Allocator*)"),
        cpp("at::_ops::empty_memory_format::call(c10::ArrayRef<c10::SymInt>)"),
        cpp("at::native::zeros_symint(c10::ArrayRef<c10::SymInt>)"),
        cpp("at::_ops::zeros::call(c10::ArrayRef<c10::SymInt>)"),
        cpp("at::native::slice_backward(at::Tensor const&, c10::ArrayRef<long>, long, long, long, long)"),
        cpp("torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)"),
    ]);
    let mut ws = machinery();
    ws.extend([
        cpp("at::cuda::getNewWorkspace()"),
        cpp("at::cuda::getCurrentCUDABlasHandle()"),
        cpp("void at::cuda::blas::gemm<float>(char, char, long)"),
    ]);
    vec![
        (
            vec![
                py("torch/nn/modules/module.py", "_apply", 900),
                py("torch/nn/modules/module.py", "cuda", 1000),
                py("train.py", "load_model", 10),
                py("train.py", "<module>", 50),
            ],
            40 * MIB,
        ),
        (
            vec![
                py("torch/optim/adam.py", "_init_group", 100),
                py("torch/optim/adam.py", "step", 200),
                py("train.py", "train_step", 20),
                py("train.py", "<module>", 52),
            ],
            24 * MIB,
        ),
        (grad, 12 * MIB),
        (ws, 12 * MIB),
        (
            vec![
                py("torch/nn/functional.py", "gelu", 1),
                py("torch/nn/modules/module.py", "_call_impl", 1500),
                py("model.py", "forward", 30),
                py("train.py", "train_step", 18),
            ],
            16 * MIB,
        ),
    ]
}

const BASE: u64 = 0x7f00_0000_0000;
/// The recorded OOM's request and the driver's free bytes then.
const REQUEST: u64 = 64 * MIB;
const DEVICE_FREE: u64 = 40 * MIB;

/// One segment per site (PyTorch's `segment_alloc` then `alloc`), then an OOM of [`REQUEST`] with
/// [`DEVICE_FREE`] free: reserved 104 MiB, capacity 144 MiB, 168 MiB needed.
fn snapshot() -> Vec<u8> {
    let (mut events, mut segments) = (Vec::new(), Vec::new());
    let mut addr = BASE;
    for (frames, size) in sites() {
        let int = |v: u64| V::Int(v as i128);
        let e = |action: &'static str, frames: Option<Vec<V<'static>>>| {
            let mut d =
                vec![("action", V::Str(action)), ("addr", int(addr)), ("size", int(size)), ("stream", V::Int(0))];
            if let Some(f) = frames {
                d.push(("frames", V::List(f)));
            }
            V::Dict(d)
        };
        events.push(e("segment_alloc", None));
        events.push(e("alloc", Some(frames)));
        segments.push(V::Dict(vec![
            ("device", V::Int(0)),
            ("address", int(addr)),
            ("total_size", int(size)),
            ("stream", V::Int(0)),
            ("segment_type", V::Str("large")),
            (
                "blocks",
                V::List(vec![V::Dict(vec![
                    ("address", int(addr)),
                    ("size", int(size)),
                    ("requested_size", int(size)),
                    ("state", V::Str("active_allocated")),
                ])]),
            ),
        ]));
        addr += size + 64 * MIB;
    }
    events.push(V::Dict(vec![
        ("action", V::Str("oom")),
        ("addr", V::Int(0)),
        ("size", V::Int(REQUEST as i128)),
        ("stream", V::Int(0)),
        ("device_free", V::Int(DEVICE_FREE as i128)),
    ]));
    pickle(&V::Dict(vec![("segments", V::List(segments)), ("device_traces", V::List(vec![V::List(events)]))]))
}

fn explain_bytes(bytes: &[u8]) -> (gpuheap::trace::Trace, Explanation) {
    let t = parse_trace(Path::new("synthetic.pickle"), bytes).unwrap_or_else(|e| panic!("{e}"));
    let x = explain_with_bytes(&t, Some(bytes), None, None).unwrap_or_else(|e| panic!("{e}"));
    (t, x)
}

#[test]
fn capacity_oom_breakdown_by_site_and_kind_of_a_hand_made_snapshot() {
    let bytes = snapshot();
    let (_, x) = explain_bytes(&bytes);
    let b = &x.breakdown;
    assert_eq!(x.capacity.bytes, 144 * MIB, "reserved 104 MiB + driver free 40 MiB");
    assert_eq!((b.tensors, b.bytes, b.tensors_with_frames), (5, 104 * MIB, 5));
    let kinds: Vec<(Kind, u64)> = b.by_kind.iter().map(|g| (g.kind, g.bytes)).collect();
    assert_eq!(
        kinds,
        vec![
            (Kind::ParametersAndBuffers, 40 * MIB),
            (Kind::OptimizerState, 24 * MIB),
            (Kind::Activations, 16 * MIB),
            (Kind::Gradients, 12 * MIB),
            (Kind::LibraryWorkspaces, 12 * MIB),
        ]
    );
    let sites: Vec<(&str, SiteOrigin, u64)> =
        b.by_site.iter().map(|g| (g.label.as_str(), g.origin.unwrap(), g.bytes)).collect();
    assert_eq!(
        sites,
        vec![
            ("train.py:10 load_model", SiteOrigin::User, 40 * MIB),
            ("train.py:20 train_step", SiteOrigin::User, 24 * MIB),
            ("model.py:30 forward", SiteOrigin::User, 16 * MIB),
            ("at::cuda::getNewWorkspace", SiteOrigin::Cpp, 12 * MIB),
            ("at::native::slice_backward", SiteOrigin::Cpp, 12 * MIB),
        ]
    );
    // 40 MiB of 144 MiB.
    assert!((b.by_site[0].share_of_capacity - 40.0 * 100.0 / 144.0).abs() < 1e-9);
    // Capacity verdict: free 40 MiB (driver) + 0 holes < 64 MiB: 24 MiB must go.
    assert_eq!((b.request, b.must_free), (Some(REQUEST), Some(REQUEST - DEVICE_FREE)));
    let text = x.render_text();
    assert!(text.contains("at least 24.00 MiB of these must go"), "{text}");
    assert!(text.contains("train.py:10 load_model [parameters and buffers]"), "{text}");
}

#[test]
fn cpp_only_stacks_name_the_function_that_allocated() {
    let bytes = snapshot();
    let (_, x) = explain_bytes(&bytes);
    let by_size = |s: u64| x.largest_tensors.iter().filter(|t| t.block.size == s).collect::<Vec<_>>();
    let twelve = by_size(12 * MIB);
    let labels: Vec<&str> = twelve.iter().map(|t| t.site.label.as_str()).collect();
    assert!(
        labels.contains(&"at::native::slice_backward") && labels.contains(&"at::cuda::getNewWorkspace"),
        "{labels:?}"
    );
    assert!(twelve.iter().all(|t| t.frames.is_empty() && t.site.origin == SiteOrigin::Cpp));
    let text = x.render_text();
    assert!(!text.contains("(no frames recorded)"), "{text}");
    assert!(text.contains("allocated by at::native::slice_backward (C++; no Python frame)"), "{text}");
}

#[test]
fn cpp_sites_of_real_snapshots() {
    // ftcourse: event 3702 allocates 127,872,000 B under `at::native::slice_backward` on the autograd
    // thread; eor: event 209 is cuBLAS's workspace (`at::cuda::getNewWorkspace`, 8,519,680 B); both stacks
    // hold no Python frame (found with the plain unpickler).
    for (file, event, function, kind) in [
        ("traces/ftcourse_tinyllama_qlora_fwd_bwd.pickle", 3702, "at::native::slice_backward", Kind::Gradients),
        ("traces/eor_nn_vae_latent_counterfactual.pickle", 209, "at::cuda::getNewWorkspace", Kind::LibraryWorkspaces),
    ] {
        let Some(p) = common::shared(file) else { continue };
        let bytes = std::fs::read(&p).unwrap();
        let f = read_frames(&p, &bytes, 0, &[event], &[]).unwrap();
        let frames = &f.events.first().unwrap_or_else(|| panic!("{file}: event {event} has frames")).1;
        assert!(frames.iter().all(|fr| !fr.is_python()), "{file}: a C++-only stack");
        let s = site_of(frames);
        assert_eq!((s.label.as_str(), s.origin, kind_of(frames)), (function, SiteOrigin::Cpp, kind), "{file}");
    }
}

#[test]
fn frames_of_the_pytorch_2_0_layout_are_shown() {
    let p = common::data_file("1.3b_snapshot.pickle");
    let snap = Snapshot::read(&p).unwrap();
    let x = explain_with_bytes(snap.trace(), snap.bytes(), None, None).unwrap();
    assert_eq!((x.breakdown.tensors, x.breakdown.tensors_with_frames), (785, 785));
    assert_eq!(x.breakdown.bytes, 5_683_450_880);
    assert!(x.largest_tensors.iter().all(|t| !t.frames.is_empty()), "every live block has frames");
    let top = &x.breakdown.by_site[0];
    assert_eq!(
        (top.label.as_str(), top.tensors, top.bytes),
        ("flexgen/pytorch_backend.py:195 allocate", 778, 5_674_860_544)
    );
    let text = x.render_text();
    assert!(!text.contains("(no frames recorded)"), "{text}");
    assert!(text.contains("flexgen/pytorch_backend.py:195 allocate"), "{text}");
}

#[test]
fn without_a_site_the_oom_goes_away() {
    let bytes = snapshot();
    let (t, x) = explain_bytes(&bytes);
    let w = what_if_without(&t, Some(&bytes), &x, &["train.py:10".to_string()]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((w.allocations, w.allocated_bytes, w.live_tensors, w.live_bytes), (1, 40 * MIB, 1, 40 * MIB));
    assert_eq!(w.sites, vec![("train.py:10 load_model".to_string(), 1)]);
    // With them: 104 MiB live + the 64 MiB request = 168 MiB; without: 128 MiB ≤ 144 MiB.
    assert_eq!((w.min_capacity_before, w.min_capacity), (Some(168 * MIB), Some(128 * MIB)));
    assert!(w.fits && w.recorded_oom && w.failed_at_capacity == 0);
    // `train.py:1` names line 1 only, not 10: nothing matches it.
    let e = what_if_without(&t, Some(&bytes), &x, &["train.py:1".to_string()]).unwrap_err();
    assert!(e.is_input() && e.to_string().contains("\"train.py:1\""), "{e}");
    // Without the 16 MiB activation the run still needs 152 MiB > 144 MiB.
    let w = what_if_without(&t, Some(&bytes), &x, &["model.py:30 forward".to_string()]).unwrap();
    assert_eq!(w.min_capacity, Some(152 * MIB));
    assert!(!w.fits && w.failed_at_capacity == 1 && w.first_failure == Some(10), "{w:?}");
}

#[test]
fn without_on_a_dumped_pytorch_2_0_state() {
    let p = common::data_file("1.3b_snapshot.pickle");
    let snap = Snapshot::read(&p).unwrap();
    let mut o = Options::default();
    o.tune = false;
    o.without = vec!["flexgen/pytorch_backend.py:195".into()];
    let out = gpuheap::run_explain(&snap, &o, &Quiet).unwrap();
    let v: serde_json::Value = serde_json::from_str(&out.json).unwrap();
    let w = &v["without"];
    assert_eq!((w["live_tensors"].as_u64(), w["live_bytes"].as_u64()), (Some(778), Some(5_674_860_544)));
    assert_eq!(w["fits"], serde_json::Value::Bool(true));
    // What is left: 785 − 778 blocks, 8,590,336 B, in fewer GPU bytes than with them.
    assert!(w["min_capacity"].as_u64().unwrap() < w["min_capacity_before"].as_u64().unwrap(), "{w}");
    assert!(
        out.text.contains("the 778 live tensors from flexgen/pytorch_backend.py:195 allocate hold 5.29 GiB"),
        "{}",
        out.text
    );
}

#[test]
fn without_a_pattern_that_matches_nothing_exits_2() {
    let dir = std::env::temp_dir().join(format!("gpuheap-without-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("oom.pickle");
    std::fs::write(&file, snapshot()).unwrap();
    let out = common::gpuheap(&["explain", file.to_str().unwrap(), "--no-tune", "--without", "nowhere.py:7"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("\"nowhere.py:7\""), "{err}");
    let ok = common::gpuheap(&["explain", file.to_str().unwrap(), "--no-tune", "--without", "train.py:10"]);
    let text = String::from_utf8_lossy(&ok.stdout);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    assert!(text.contains("fits on this GPU (144.00 MiB): the OOM goes away"), "{text}");
    std::fs::remove_dir_all(&dir).ok();
}

/// The absolute path PyTorch would have recorded for a frame file of a `../shared` snapshot, whose
/// paths were shortened (`traces/SOURCES.md`: text after `site-packages/` kept, `lib/python3.x/` made
/// `python-stdlib/`, other absolute paths cut to their last two components): the inverse, in a POSIX
/// (a virtual environment) or a Windows (a conda environment, backslashes, drive letter) layout. A
/// one-component `.py` name stays relative (a script run as `python train.py`); C++ files get a build
/// folder; `??` and `<…>` stay.
fn unshortened(file: &str, windows: bool) -> String {
    let (site, stdlib, home, build) = if windows {
        (
            r"C:\Users\alice\miniconda3\envs\dl\Lib\site-packages\",
            r"C:\Users\alice\miniconda3\envs\dl\Lib\",
            r"C:\Users\alice\work\",
            r"C:\actions-runner\_work\pytorch\pytorch\",
        )
    } else {
        ("/opt/venv/lib/python3.10/site-packages/", "/usr/lib/python3.10/", "/home/alice/work/", "/opt/pytorch/")
    };
    let sep = |s: &str| if windows { s.replace('/', "\\") } else { s.to_string() };
    if file.is_empty() || file.starts_with('<') || file.contains('?') {
        return file.to_string();
    }
    if !file.ends_with(".py") {
        return format!("{build}{}", sep(file));
    }
    if let Some(rest) = file.strip_prefix("python-stdlib/") {
        return format!("{stdlib}{}", sep(rest));
    }
    match file.split('/').count() {
        1 => file.to_string(),
        2 => format!("{home}{}", sep(file)),
        _ => format!("{site}{}", sep(file)),
    }
}

/// What a page says holds the memory: per site and per kind (label, kind, tensors, bytes), and the
/// largest tensors' sites and frames.
type Held = (Vec<(String, Kind, usize, u64)>, Vec<(String, Kind, usize, u64)>, Vec<(String, Vec<String>)>);

fn held(x: &Explanation) -> Held {
    let g = |v: &[gpuheap::explain::breakdown::Group]| {
        v.iter().map(|g| (g.label.clone(), g.kind, g.tensors, g.bytes)).collect::<Vec<_>>()
    };
    let tensors = x
        .largest_tensors
        .iter()
        .map(|t| (t.site.label.clone(), t.frames.iter().map(gpuheap::explain::breakdown::frame_label).collect()))
        .collect();
    (g(&x.breakdown.by_site), g(&x.breakdown.by_kind), tensors)
}

#[test]
fn absolute_posix_and_windows_paths_give_the_same_kinds_and_sites() {
    let files = common::shared_files("traces", &["pickle", "pkl"]);
    let mut compared = 0;
    let mut bad = Vec::new();
    for p in &files {
        let bytes = std::fs::read(p).unwrap();
        let Ok(t) = parse_trace(p, &bytes) else { continue };
        let Ok(x) = explain_with_bytes(&t, Some(&bytes), None, None) else { continue };
        let want = held(&x);
        for windows in [false, true] {
            let derived = gpuheap::trace::rewrite_frame_filenames(&bytes, &|f| unshortened(f, windows))
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            let t2 = parse_trace(p, &derived).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            let x2 =
                explain_with_bytes(&t2, Some(&derived), None, None).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            let got = held(&x2);
            if got != want {
                let diff: Vec<_> = got.0.iter().filter(|g| !want.0.contains(g)).collect();
                bad.push(format!("{} ({}): {diff:?}", p.display(), if windows { "Windows" } else { "POSIX" }));
            }
        }
        compared += 1;
    }
    assert!(bad.is_empty(), "kinds or sites differ:\n{}", bad.join("\n"));
    assert!(files.is_empty() || compared >= 20, "only {compared} of {} shared snapshots explained", files.len());
}

#[test]
fn the_published_paths_of_two_snapshots_name_parameters_and_pytorch_frames() {
    // As published (absolute paths). mlsys_linear_profile_grad_from_empty: the two `nn.Linear` weights
    // (1.86 GiB) are placed by `Module.to` (`torch/nn/modules/module.py` `_apply`), line 8 of the script;
    // diffusion_course_ddpm_sprites_windows (Windows): the 156 parameters of the UNet are placed from
    // `model.py:7` through PyTorch's own `module.py` `convert`, which is never the user's site.
    for (file, windows, site, tensors, held_bytes) in [
        (
            "traces/mlsys_linear_profile_grad_from_empty.pickle",
            false,
            "model_memory_usage/profile_grad.py:8 <module>",
            2,
            2_000_883_200,
        ),
        ("traces/diffusion_course_ddpm_sprites_windows.pickle", true, "joel/model.py:7 __init__", 156, 5_965_312),
    ] {
        let Some(p) = common::shared(file) else { continue };
        let bytes = std::fs::read(&p).unwrap();
        let derived = gpuheap::trace::rewrite_frame_filenames(&bytes, &|f| unshortened(f, windows)).unwrap();
        let t = parse_trace(&p, &derived).unwrap();
        let x = explain_with_bytes(&t, Some(&derived), None, None).unwrap();
        let b = &x.breakdown;
        let params = b.by_kind.iter().find(|g| g.kind == Kind::ParametersAndBuffers).map(|g| (g.tensors, g.bytes));
        assert_eq!(params, Some((tensors, held_bytes)), "{file}: {:?}", b.by_kind);
        let s = b.by_site.iter().find(|g| g.label == site).map(|g| (g.kind, g.tensors, g.bytes));
        assert_eq!(s, Some((Kind::ParametersAndBuffers, tensors, held_bytes)), "{file}: {:?}", b.by_site);
        assert!(
            b.by_site.iter().all(|g| !g.label.contains("torch/") && !g.label.contains('\\')),
            "{file}: {:?}",
            b.by_site
        );
    }
}
