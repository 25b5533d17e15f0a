//! `trace repeat`: a snapshot's history repeated as a run of N steps records it.
//!
//! Checked on the real snapshots: `--steps 1` writes the input's bytes; a 3-step repeat reads back, passes
//! the reader's validation, starts and ends in the input's state, and the caching model replays it with the
//! fidelity the repetition implies (the same peak, end and segment count, and three times the placement
//! differences, invented failures and OOMs of one step: zero on every snapshot). Hand-made snapshots check
//! each rule of `gpuheap::trace::repeat` (steady blocks, segments reserved by the step, segments released
//! at its start, OOMs, what is refused), and the CLI's exit codes and atomic writes.

#[path = "../../host/tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};

use common::pickle::{pickle, V};
use gpuheap::facts::pytorch_series;
use gpuheap::reference::caching::{capacity_at_oom, config_for_trace, fidelity, Fidelity};
use gpuheap::trace::repeat::{Repeat, RepeatError, RepeatOptions};
use gpuheap::trace::{parse_trace, read_trace_and_bytes, validate, AddressKind, DeviceTrace, EventKind, Trace};

const GIB: u64 = 1 << 30;
const MIB: i128 = 1 << 20;

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpuheap-repeat-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The repeated snapshot's bytes, or the refusal.
fn repeat_bytes(trace: &Trace, bytes: &[u8], steps: u32) -> Result<Vec<u8>, RepeatError> {
    let plan = Repeat::new(trace, bytes, RepeatOptions::new(steps, 1000))?;
    let out = plan.write_to(Vec::new()).expect("writes to memory");
    plan.verify(Path::new("repeated.pickle"), &out).expect("the written file checks out");
    Ok(out)
}

fn parse(bytes: &[u8]) -> Trace {
    parse_trace(Path::new("repeated.pickle"), bytes).unwrap_or_else(|e| panic!("{e}"))
}

/// The capacity of a fidelity replay (as tests/caching_model.rs): the OOM evidence, else PyTorch's peak
/// reserved rounded up to a GiB.
fn capacity(dev: &DeviceTrace) -> u64 {
    capacity_at_oom(dev).unwrap_or_else(|| {
        let s = pytorch_series(dev);
        s.peak.max(s.snapshot_reserved.unwrap_or(0)).div_ceil(GIB).max(1) * GIB
    })
}

fn fidelity_with(dev: &DeviceTrace, cap: u64) -> Fidelity {
    fidelity(dev, config_for_trace(dev, cap).0).expect("replays")
}

/// What a 3-step repeat of a snapshot must show against the snapshot, device by device.
fn check_three_steps(name: &str, original: &Trace, repeated: &Trace) -> Vec<String> {
    let mut rows = Vec::new();
    assert_eq!(original.devices.len(), repeated.devices.len(), "{name}");
    for (a, b) in original.devices.iter().zip(&repeated.devices) {
        validate(b, AddressKind::Device).unwrap_or_else(|e| panic!("{name}: the reader's validation: {e}"));
        assert_eq!(b.initial_blocks, a.initial_blocks, "{name}: same state before the first event");
        assert_eq!(b.initial_segments, a.initial_segments, "{name}");
        assert_eq!(b.final_state, a.final_state, "{name}: the state after 3 steps is the state after one");
        let cap = capacity(a);
        let (f1, f3) = (fidelity_with(a, cap), fidelity_with(b, cap));
        let n = |v: &Vec<usize>| v.len();
        // One step's figures, and what three steps of the same step give.
        assert_eq!((f3.pytorch_initial, f3.model_initial), (f1.pytorch_initial, f1.model_initial), "{name}: start");
        assert_eq!((f3.pytorch_peak, f3.model_peak), (f1.pytorch_peak, f1.model_peak), "{name}: peak reserved");
        assert_eq!((f3.pytorch_end, f3.model_end), (f1.pytorch_end, f1.model_end), "{name}: reserved at the end");
        assert_eq!(
            (f3.pytorch_segments, f3.model_segments),
            (f1.pytorch_segments, f1.model_segments),
            "{name}: segments"
        );
        assert_eq!(f3.max_deviation, f1.max_deviation, "{name}: largest model-PyTorch difference");
        assert_eq!(f3.placement_mismatches, 3 * f1.placement_mismatches, "{name}: blocks placed elsewhere");
        assert_eq!(n(&f3.invented_failures), 3 * n(&f1.invented_failures), "{name}: invented failures");
        assert_eq!(
            (n(&f3.recorded_ooms), f3.reproduced_ooms),
            (3 * n(&f1.recorded_ooms), 3 * f1.reproduced_ooms),
            "{name}"
        );
        rows.push(format!(
            "| {name} (device {}) | {} → {} | {} / {} | {} / {} | {} / {} | {} / {} |",
            a.device,
            f1.events,
            f3.events,
            f1.pytorch_end,
            f3.model_end,
            f1.pytorch_segments.unwrap_or(0),
            f3.model_segments,
            f1.placement_mismatches,
            f3.placement_mismatches,
            f1.max_deviation,
            f3.max_deviation
        ));
    }
    rows
}

/// Every shipped snapshot and every shared one (those skipped with a message when absent).
fn snapshots() -> Vec<PathBuf> {
    let mut v = common::shared_files("traces", &["pickle", "pkl"]);
    let mut shipped: Vec<PathBuf> = std::fs::read_dir(common::workspace().join("data"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "pickle"))
        .collect();
    shipped.sort();
    v.extend(shipped);
    v
}

/// The outcome `trace repeat` must have on each real snapshot (a name not listed here fails the test, so
/// a new snapshot gets a decision).
fn expected(name: &str) -> Result<(), &'static str> {
    match name {
        "decomfl_opt_zo_federated_memory.pickle"
        | "memory_ctx512_fullstep_.pickle"
        | "medium_512_inference_memory_snapshot.pickle"
        | "eor_nn_vae_latent_counterfactual.pickle"
        | "ftcourse_tinyllama_qlora_fwd_bwd.pickle"
        | "octree_nca_peso_slide_inference.pickle"
        | "select_n_llama7b_offload_multistream.pickle"
        | "cs336_naive_attention_fwd_bwd_512mib_scores.pickle"
        | "mlsys_linear_profile_grad_from_empty.pickle"
        | "tomi_toy_mlp_sgd_17_steps.pickle" => Ok(()),
        // Gradients of the previous step freed and the new ones placed elsewhere; a layer's weights freed
        // and the next layer's loaded at another address; one input tensor freed: histories that do not
        // end in the state they started from.
        "cs336_bcrafton_memory_snapshot.pickle"
        | "sqattn_qwen2_layerwise_calibration.pickle"
        | "memory_snapshot_forward.pickle" => Err("SeedBlockNotRestored"),
        "memsnapdump_npu_resnet_expandable_empty_cache.pickle" | "qwen3_train_oom.pickle" => Err("ExpandableSegments"),
        "1.3b_snapshot.pickle"
        | "oom_snapshot.pickle"
        | "blockzero_moe_validator_after_eval.pickle"
        | "equivariant-posteriors_oom_snapshot_new.pickle"
        | "thesis-text-to-sql_dump_snapshot_expandable.pickle"
        | "triton-unfold_memory_max_split_512.pickle"
        | "verl_mem_private_pools.pickle"
        | "layoutediting_sd_guided_diffusion.pickle"
        | "layoutediting_memory_snapshot_list.pkl"
        | "attention_sd_img2img_vit_guidance_fragmented.pickle"
        | "diffusion_course_ddpm_sprites_windows.pickle"
        | "docubox_minilm_embeddings_after_empty_cache.pickle"
        | "sam2_ppo_ddp_empty_expandable_4dev.pickle"
        | "sketchkv2_llama2_7b_sketch_kv_cache_prefill.pickle"
        | "voxelflex_3dcnn_rmsf_after_empty_cache.pickle" => Err("NoHistory"),
        other => panic!("{other}: no expected outcome for `trace repeat`; add one"),
    }
}

fn kind(e: &RepeatError) -> &'static str {
    match e {
        RepeatError::NoHistory { .. } => "NoHistory",
        RepeatError::SeedBlockNotRestored { .. } => "SeedBlockNotRestored",
        RepeatError::SeedBlockPending { .. } => "SeedBlockPending",
        RepeatError::ExpandableSegments { .. } => "ExpandableSegments",
        RepeatError::SeedSegmentUsed { .. } => "SeedSegmentUsed",
        RepeatError::BlockInReleasedSegment { .. } => "BlockInReleasedSegment",
        RepeatError::OomNotRepeatable { .. } => "OomNotRepeatable",
        RepeatError::Read(_) => "Read",
        RepeatError::NotASnapshot { .. } => "NotASnapshot",
        RepeatError::InvalidSteps => "InvalidSteps",
        RepeatError::TooLong { .. } => "TooLong",
        RepeatError::Uncopyable { .. } => "Uncopyable",
        _ => "another kind",
    }
}

#[test]
fn every_real_snapshot_repeats_with_the_fidelity_of_one_step_or_is_refused_by_name() {
    println!("| snapshot | events 1 → 3 steps | reserved at end (B) PyTorch / model | segments PyTorch / model | blocks placed elsewhere 1 / 3 steps | max deviation (B) 1 / 3 steps |");
    println!("|---|---:|---:|---:|---:|---:|");
    let mut accepted = 0;
    for p in snapshots() {
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let (trace, bytes) = read_trace_and_bytes(&p).unwrap_or_else(|e| panic!("{e}"));
        match (repeat_bytes(&trace, &bytes, 3), expected(&name)) {
            (Ok(out), Ok(())) => {
                for row in check_three_steps(&name, &trace, &parse(&out)) {
                    println!("{row}");
                }
                // One step writes the input's bytes (PyTorch pickles with CPython's pickler; so does the writer).
                assert!(repeat_bytes(&trace, &bytes, 1).unwrap() == bytes, "{name}: --steps 1 writes the input");
                accepted += 1;
            }
            (Err(e), Err(want)) => {
                assert_eq!(kind(&e), want, "{name}: {e}");
                let msg = e.to_string();
                assert!(msg.contains(&name) && msg.contains("cannot repeat") && !msg.contains('\n'), "{msg}");
                println!("refused: {msg}");
            }
            (Ok(_), Err(want)) => panic!("{name}: repeated, but expected to be refused ({want})"),
            (Err(e), Ok(())) => panic!("{name}: refused: {e}"),
        }
    }
    assert!(accepted >= 1, "the shipped training snapshot repeats");
}

#[test]
fn one_step_reproduces_the_input_and_many_steps_shift_time() {
    let p = common::workspace().join("data/decomfl_opt_zo_federated_memory.pickle");
    let (trace, bytes) = read_trace_and_bytes(&p).unwrap();
    let one = repeat_bytes(&trace, &bytes, 1).unwrap();
    assert!(one == bytes, "--steps 1: the input's bytes");
    let again = parse(&one);
    assert_eq!(again.devices, trace.devices, "--steps 1: the input's events and final state");

    let five = parse(&repeat_bytes(&trace, &bytes, 5).unwrap());
    let (a, b) = (&trace.devices[0], &five.devices[0]);
    let t = |e: &gpuheap::trace::Event| e.time_us.unwrap();
    let (first, last) = (t(&a.events[0]), t(a.events.last().unwrap()));
    let period = last - first + 1000;
    // No block from before the trace here: the step leaves allocs − frees blocks allocated, all of them
    // active (each requested free is completed).
    assert!(a.initial_blocks.is_empty() && a.count(EventKind::FreeRequested) == a.count(EventKind::Free));
    let boundary = a.count(EventKind::Alloc) - a.count(EventKind::Free);
    let segments = a.count(EventKind::SegmentAlloc); // the step's segments, all still reserved at its end
    assert_eq!(b.events.len(), a.events.len() + 4 * (a.events.len() + 2 * boundary + segments));
    // Step 4 is step 0 shifted by 4 periods, event for event, after the events between steps.
    let step4 = &b.events[b.events.len() - a.events.len()..];
    for (x, y) in a.events.iter().zip(step4) {
        assert_eq!((y.kind, y.addr, y.size, y.stream, t(y)), (x.kind, x.addr, x.size, x.stream, t(x) + 4 * period));
    }
    // The events between steps 3 and 4 lie in the gap, halfway.
    let gap_events =
        &b.events[b.events.len() - a.events.len() - 2 * boundary - segments..b.events.len() - a.events.len()];
    assert!(gap_events.iter().all(|e| t(e) == last + 3 * period + 500));
    assert!(b.events.windows(2).all(|w| t(&w[0]) <= t(&w[1])), "times never decrease");
}

#[test]
fn python_loads_the_repeated_file() {
    // CPython's own unpickler (every global refused) reads the 3-step repeat: three times the events, the
    // input's other keys, times in order.
    let p = common::workspace().join("data/decomfl_opt_zo_federated_memory.pickle");
    let (trace, bytes) = read_trace_and_bytes(&p).unwrap();
    let dir = temp_dir("python");
    let out = dir.join("three.pickle");
    std::fs::write(&out, repeat_bytes(&trace, &bytes, 3).unwrap()).unwrap();
    let script = "import pickle,sys\n\
        class R(pickle.Unpickler):\n    def find_class(self, m, n): raise RuntimeError(m + '.' + n)\n\
        d = R(open(sys.argv[1], 'rb')).load()\n\
        t = d['device_traces'][0]\n\
        ts = [e['time_us'] for e in t]\n\
        print(sorted(d), len(t), len(d['segments']), len(d['external_annotations']), all(a <= b for a, b in zip(ts, ts[1:])))\n";
    let o = std::process::Command::new("python3").arg("-c").arg(script).arg(&out).output().expect("python3 runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let n = Repeat::new(&trace, &bytes, RepeatOptions::new(3, 1000)).unwrap().devices().next().unwrap().events_out;
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        format!("['allocator_settings', 'device_traces', 'external_annotations', 'segments'] {n} 61 24 True")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- Hand-made snapshots: one rule each. ----

const SEG: i128 = 0x7f00_0000_0000;
const SEG2: i128 = 0x7f10_0000_0000;

fn ev<'a>(action: &'a str, addr: i128, size: i128, time: i128) -> V<'a> {
    V::Dict(vec![
        ("action", V::Str(action)),
        ("addr", V::Int(addr)),
        ("size", V::Int(size)),
        ("stream", V::Int(0)),
        ("time_us", V::Int(time)),
        (
            "frames",
            V::List(vec![V::Dict(vec![
                ("name", V::Str("step")),
                ("filename", V::Str("train.py")),
                ("line", V::Int(7)),
            ])]),
        ),
    ])
}

fn blk<'a>(addr: i128, size: i128, requested: i128, state: &'a str) -> V<'a> {
    common::pickle::block(addr, size, requested, state)
}

fn seg<'a>(addr: i128, size: i128, blocks: Vec<V<'a>>) -> V<'a> {
    V::Dict(vec![
        ("device", V::Int(0)),
        ("address", V::Int(addr)),
        ("total_size", V::Int(size)),
        ("stream", V::Int(0)),
        ("segment_type", V::Str("large")),
        ("blocks", V::List(blocks)),
    ])
}

fn snapshot(segments: Vec<V>, events: Vec<V>) -> (Trace, Vec<u8>) {
    let bytes =
        pickle(&V::Dict(vec![("segments", V::List(segments)), ("device_traces", V::List(vec![V::List(events)]))]));
    (parse_trace(Path::new("hand-made.pickle"), &bytes).unwrap_or_else(|e| panic!("{e}")), bytes)
}

fn kinds(dev: &DeviceTrace) -> Vec<(EventKind, u64)> {
    dev.events.iter().map(|e| (e.kind, e.addr)).collect()
}

#[test]
fn a_steady_step_repeats_without_events_between_steps() {
    // A 20 MiB segment from before the trace holds a 4 MiB block (the previous step's gradient); the step
    // frees it and allocates the next one at the same address, plus a temporary that it frees.
    let (t, b) = snapshot(
        vec![seg(
            SEG,
            20 * MIB,
            vec![blk(SEG, 4 * MIB, 4 * MIB, "active_allocated"), blk(SEG + 4 * MIB, 16 * MIB, 0, "inactive")],
        )],
        vec![
            ev("free_requested", SEG, 4 * MIB, 10),
            ev("free_completed", SEG, 4 * MIB, 11),
            ev("alloc", SEG + 4 * MIB, 2 * MIB, 12),
            ev("alloc", SEG, 4 * MIB, 13),
            ev("free_requested", SEG + 4 * MIB, 2 * MIB, 14),
            ev("free_completed", SEG + 4 * MIB, 2 * MIB, 15),
        ],
    );
    let plan = Repeat::new(&t, &b, RepeatOptions::new(3, 10)).unwrap();
    let d = plan.devices().next().unwrap();
    assert_eq!((d.boundary.len(), d.steady_blocks, d.dropped, d.events_out), (0, 1, 0, 18));
    let r = parse(&repeat_bytes(&t, &b, 3).unwrap());
    assert_eq!(kinds(&r.devices[0])[6..12], kinds(&t.devices[0])[..]);
    // Times: step 1 starts a period (duration 5 µs + gap 1000 µs) after step 0.
    assert_eq!(r.devices[0].events[6].time_us, Some(10 + 1005));
}

#[test]
fn what_a_step_leaves_is_freed_between_steps_and_its_segments_released() {
    // The step reserves a segment, allocates two blocks in it, frees one and requests the other's free
    // (still pending at the end: another stream uses it), and allocates a block in a segment from before.
    let (t, b) = snapshot(
        vec![
            seg(
                SEG,
                20 * MIB,
                vec![blk(SEG, 2 * MIB, 2 * MIB, "active_allocated"), blk(SEG + 2 * MIB, 18 * MIB, 0, "inactive")],
            ),
            seg(
                SEG2,
                20 * MIB,
                vec![blk(SEG2, 8 * MIB, 8 * MIB, "active_pending_free"), blk(SEG2 + 8 * MIB, 12 * MIB, 0, "inactive")],
            ),
        ],
        vec![
            ev("segment_alloc", SEG2, 20 * MIB, 100),
            ev("alloc", SEG2, 8 * MIB, 101),
            ev("alloc", SEG2 + 8 * MIB, 4 * MIB, 102),
            ev("free_requested", SEG2 + 8 * MIB, 4 * MIB, 103),
            ev("free_completed", SEG2 + 8 * MIB, 4 * MIB, 104),
            ev("alloc", SEG, 2 * MIB, 105),
            ev("free_requested", SEG2, 8 * MIB, 106),
        ],
    );
    let plan = Repeat::new(&t, &b, RepeatOptions::new(2, 1000)).unwrap();
    let d = plan.devices().next().unwrap();
    let k = |e: &gpuheap::trace::repeat::BoundaryEvent| (e.kind, e.addr as i128);
    assert_eq!(
        d.boundary.iter().map(k).collect::<Vec<_>>(),
        [
            (EventKind::Free, SEG2), // its free was requested: only the completion
            (EventKind::FreeRequested, SEG),
            (EventKind::Free, SEG),
            (EventKind::SegmentFree, SEG2),
        ]
    );
    let r = parse(&repeat_bytes(&t, &b, 2).unwrap());
    let dev = &r.devices[0];
    assert_eq!(dev.events.len(), 7 + 4 + 7);
    assert!(dev.events[7..11].iter().all(|e| e.time_us == Some(106 + 500)));
    // The step's segment is re-mapped at its own address by the second step.
    assert_eq!((dev.events[11].kind, dev.events[11].addr as i128), (EventKind::SegmentAlloc, SEG2));
    assert_eq!(dev.count(EventKind::SegmentFree), 1);
}

#[test]
fn a_release_of_segments_from_before_the_trace_is_in_the_first_step_only() {
    // `empty_cache()` at the start of the step releases an unused segment from before the trace; the step
    // then reserves one and leaves it. Step 2 releases the step's segment instead.
    let (t, b) = snapshot(
        vec![seg(SEG2, 20 * MIB, vec![blk(SEG2, 20 * MIB, 20 * MIB, "active_allocated")])],
        vec![
            ev("segment_free", SEG, 20 * MIB, 1),
            ev("segment_alloc", SEG2, 20 * MIB, 2),
            ev("alloc", SEG2, 20 * MIB, 3),
        ],
    );
    let r = parse(&repeat_bytes(&t, &b, 3).unwrap());
    let got: Vec<(EventKind, i128)> = r.devices[0].events.iter().map(|e| (e.kind, e.addr as i128)).collect();
    use EventKind::*;
    let step = [(SegmentAlloc, SEG2), (Alloc, SEG2)];
    let between = [(FreeRequested, SEG2), (Free, SEG2), (SegmentFree, SEG2)];
    let want: Vec<(EventKind, i128)> = [&[(SegmentFree, SEG)][..], &step, &between, &step, &between, &step].concat();
    assert_eq!(got, want);
    assert_eq!(r.devices[0].initial_segments, t.devices[0].initial_segments);
}

#[test]
fn a_segment_from_before_the_trace_used_then_released_is_refused() {
    let (t, b) = snapshot(
        vec![],
        vec![
            ev("alloc", SEG, 2 * MIB, 1),
            ev("free_requested", SEG, 2 * MIB, 2),
            ev("free_completed", SEG, 2 * MIB, 3),
            ev("segment_free", SEG, 20 * MIB, 4),
        ],
    );
    let e = Repeat::new(&t, &b, RepeatOptions::new(2, 0)).err().unwrap();
    assert!(matches!(e, RepeatError::SeedSegmentUsed { event: 0, released: 3, .. }), "{e}");
}

#[test]
fn a_partial_history_is_refused_naming_the_block() {
    // The step frees a block from before the trace and leaves nothing in its place.
    let (t, b) = snapshot(
        vec![seg(SEG, 20 * MIB, vec![blk(SEG, 20 * MIB, 0, "inactive")])],
        vec![
            ev("alloc", SEG + 4 * MIB, 2 * MIB, 1),
            ev("free_requested", SEG, 4 * MIB, 2),
            ev("free_completed", SEG, 4 * MIB, 3),
        ],
    );
    let e = Repeat::new(&t, &b, RepeatOptions::new(2, 0)).err().unwrap();
    match &e {
        RepeatError::SeedBlockNotRestored { addr, event: 1, count: 1, .. } => assert_eq!(*addr as i128, SEG),
        other => panic!("{other}"),
    }
    assert!(e.to_string().contains("partial history"), "{e}");
    // Left allocated in its place (same size), it is a steady step.
    let (t, b) = snapshot(
        vec![seg(
            SEG,
            20 * MIB,
            vec![blk(SEG, 4 * MIB, 4 * MIB, "active_allocated"), blk(SEG + 4 * MIB, 16 * MIB, 0, "inactive")],
        )],
        vec![
            ev("free_requested", SEG, 4 * MIB, 2),
            ev("free_completed", SEG, 4 * MIB, 3),
            ev("alloc", SEG, 4 * MIB, 4),
        ],
    );
    assert!(Repeat::new(&t, &b, RepeatOptions::new(2, 0)).is_ok());
    // Of another size, it is not.
    let (t, b) = snapshot(
        vec![seg(
            SEG,
            20 * MIB,
            vec![blk(SEG, 4 * MIB, 3 * MIB, "active_allocated"), blk(SEG + 4 * MIB, 16 * MIB, 0, "inactive")],
        )],
        vec![
            ev("free_requested", SEG, 4 * MIB, 2),
            ev("free_completed", SEG, 4 * MIB, 3),
            ev("alloc", SEG, 3 * MIB, 4),
        ],
    );
    assert!(matches!(Repeat::new(&t, &b, RepeatOptions::new(2, 0)), Err(RepeatError::SeedBlockNotRestored { .. })));
}

#[test]
fn ooms_recur_in_every_step_unless_the_history_released_segments_from_before() {
    let oom = || {
        V::Dict(vec![
            ("action", V::Str("oom")),
            ("size", V::Int(40 * MIB)),
            ("stream", V::Int(0)),
            ("device_free", V::Int(MIB)),
            ("time_us", V::Int(3)),
        ])
    };
    let segs = || vec![seg(SEG, 20 * MIB, vec![blk(SEG, 20 * MIB, 0, "inactive")])];
    let (t, b) = snapshot(
        segs(),
        vec![
            ev("alloc", SEG, 2 * MIB, 1),
            ev("free_requested", SEG, 2 * MIB, 2),
            ev("free_completed", SEG, 2 * MIB, 2),
            oom(),
        ],
    );
    let r = parse(&repeat_bytes(&t, &b, 3).unwrap());
    assert_eq!(r.devices[0].count(EventKind::Oom), 3);
    assert_eq!(r.devices[0].ooms.iter().map(|o| o.device_free).collect::<Vec<_>>(), [Some(MIB as u64); 3]);
    let (t, b) = snapshot(segs(), vec![ev("segment_free", SEG2, 20 * MIB, 0), ev("alloc", SEG, 2 * MIB, 1), oom()]);
    assert!(matches!(
        Repeat::new(&t, &b, RepeatOptions::new(2, 0)),
        Err(RepeatError::OomNotRepeatable { event: 2, .. })
    ));
}

#[test]
fn no_history_and_expandable_segments_are_refused() {
    let (t, b) = snapshot(vec![seg(SEG, 20 * MIB, vec![blk(SEG, 20 * MIB, 20 * MIB, "active_allocated")])], vec![]);
    assert!(matches!(Repeat::new(&t, &b, RepeatOptions::new(2, 0)), Err(RepeatError::NoHistory { events: 0, .. })));
    let (t, b) = snapshot(vec![], vec![ev("segment_map", SEG, 20 * MIB, 1), ev("alloc", SEG, 2 * MIB, 2)]);
    assert!(matches!(
        Repeat::new(&t, &b, RepeatOptions::new(2, 0)),
        Err(RepeatError::ExpandableSegments { device: 0, .. })
    ));
    let (t, b) = snapshot(vec![], vec![ev("alloc", SEG, 2 * MIB, 2)]);
    assert!(matches!(Repeat::new(&t, &b, RepeatOptions::new(0, 0)), Err(RepeatError::InvalidSteps)));
    // Times that would pass 2^63 µs.
    let (t, b) = snapshot(vec![], vec![ev("alloc", SEG, 2 * MIB, 0), ev("free_completed", SEG, 2 * MIB, 1 << 61)]);
    assert!(matches!(Repeat::new(&t, &b, RepeatOptions::new(5, 0)), Err(RepeatError::TooLong { .. })));
}

// ---- The command. ----

#[test]
fn cli_writes_atomically_and_refuses_with_exit_code_2() {
    let dir = temp_dir("cli");
    let input = common::workspace().join("data/decomfl_opt_zo_federated_memory.pickle");
    let out = dir.join("long.pickle");
    let run = |args: &[&str]| common::gpuheap(&[&["trace", "repeat"], args].concat());
    let o = run(&[input.to_str().unwrap(), out.to_str().unwrap(), "--steps", "2"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("2 steps") && stdout.contains("23105 →"), "{stdout}");
    let written = std::fs::read(&out).unwrap();
    assert_eq!(parse(&written).devices[0].events.len(), 23105 * 2 + 794 + 61);

    // Refused inputs: exit 2, one line, nothing written, no temporary file left.
    let no_history = common::workspace().join("data/equivariant-posteriors_oom_snapshot_new.pickle");
    let csv = common::workspace().join("data/K.1048576.csv");
    let fresh = dir.join("never.pickle");
    for (args, says) in [
        (vec![no_history.to_str().unwrap(), fresh.to_str().unwrap(), "--steps", "2"], "no history"),
        (vec![csv.to_str().unwrap(), fresh.to_str().unwrap(), "--steps", "2"], "not a PyTorch memory snapshot"),
        (vec![input.to_str().unwrap(), fresh.to_str().unwrap(), "--steps", "0"], "--steps"),
        (vec![input.to_str().unwrap(), input.to_str().unwrap(), "--steps", "2"], "is the trace being read"),
        (
            vec![input.to_str().unwrap(), dir.join("no/such/dir.pickle").to_str().unwrap(), "--steps", "2"],
            "does not exist",
        ),
    ] {
        let o = run(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!fresh.exists());
    }
    assert!(std::fs::read(&input).unwrap().len() == 2_053_137, "the input is untouched");
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(left, ["long.pickle"], "no temporary file is left");
    let _ = std::fs::remove_dir_all(&dir);
}
