//! What holds the memory at the moment an [`super::Explanation`] describes (the recorded OOM, else the
//! peak or the dumped state): the live bytes grouped by the code that allocated them ([`Site`]) and by
//! what they are ([`Kind`]), with their share of the GPU's memory, and for a failed request the bytes
//! that must go for it to fit ([`Breakdown`]).
//!
//! # Sites
//! A tensor's site is the innermost *user* frame of its allocation's stack ([`Frame::is_user`], on the
//! normalised path of [`Frame::path`], whatever layout the snapshot recorded: Python
//! files outside PyTorch, site-packages libraries, the standard library and `<frozen …>` files), as
//! `FILE:LINE FUNCTION`. A stack without one (PyTorch's autograd thread, a library's own call) is named
//! by its innermost Python frame of a library, else by the innermost C++ function that is not
//! allocation machinery ([`cpp_site`]: `at::native::slice_backward`, the cuBLAS workspace's
//! `at::cuda::getNewWorkspace`), else "(no frames recorded)".
//!
//! # Kinds
//! Inferred from the frames of the whole stack, the first rule that matches:
//!
//! 1. **library workspaces**: the innermost C++ function ([`cpp_site`]) is a workspace or plan of a
//!    library: a name with `Workspace`/`workspace` (`at::cuda::getNewWorkspace`, cuBLAS's and cuBLASLt's
//!    workspace from `getCurrentCUDABlasHandle`), `cudnn`, `cufft`, NCCL (`nccl`, `ProcessGroupNCCL`), or the
//!    staging buffer of `at::native::gpu_reduce_kernel`;
//! 2. **optimizer state**: a frame in `torch/optim/` (`Adam.step` → `_init_group` creates `exp_avg`,
//!    `exp_avg_sq`; the `_multi_tensor_*`/`_fused_*` steps) or in a library's optimizer
//!    (a path with an `optim` folder or an `optim*.py` file: `bitsandbytes/optim/`, `transformers/optimization.py`);
//! 3. **gradients**: an autograd frame: the Python `backward` (`torch/_tensor.py`, `torch/autograd/__init__.py`,
//!    `_engine_run_backward` in `torch/autograd/graph.py`, any function named `backward`), the C++ engine
//!    (`torch::autograd::Engine::…`, `torch::autograd::AccumulateGrad`, the generated `…Backward0` nodes) or an
//!    ATen backward kernel (`at::native::…_backward`, as PyTorch names the derivative formulas of
//!    `tools/autograd/derivatives.yaml`);
//! 4. **parameters and buffers**: an `nn.Module`'s placement or loading (`_apply`, `to`, `cuda`, `to_empty`,
//!    `load_state_dict`, `_load_from_state_dict`, `register_parameter`, `register_buffer`, or a module's
//!    `__init__`, in `torch/nn/modules/`), `torch/nn/parameter.py`, `torch/nn/init.py`, `torch.load`
//!    (`torch/serialization.py`), and the loaders of libraries (`from_pretrained`, `_load_state_dict_into_*`,
//!    accelerate's `set_module_tensor_to_device`, `dispatch_model`), and a program's own loader: a Python
//!    function whose name speaks of weights or parameters (`init_weight`, `load_weights`, `init_params`);
//! 5. **activations**: a module's forward (`_call_impl`/`_wrapped_call_impl` of `torch/nn/modules/module.py`,
//!    or any function named `forward`): the outputs and intermediates autograd saves for backward (the
//!    frames cannot tell grad mode, so under `torch.no_grad` these are the forward's live intermediates);
//! 6. **temporaries**: any other stack with frames (tensors the program makes outside those: inputs,
//!    losses, ad-hoc operations);
//! 7. **unknown**: no frames recorded (history recorded without stacks, or none at all).
//!
//! Bytes are block bytes (PyTorch's `allocated_bytes`, rounding included); shares are of the capacity
//! of the explanation ([`crate::facts::Capacity`]).

use std::collections::HashMap;

use serde::Serialize;

use crate::trace::pytorch::{FileOrigin, Frame};

/// What a live tensor is, inferred from its allocation's frames (see the module docs for the rules).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Kind {
    /// Model weights and buffers: placed or loaded by `nn.Module` (`_apply`, `to`, `cuda`, `load_state_dict`).
    ParametersAndBuffers,
    /// Allocated by autograd's backward (parameter `.grad`s and the gradients of intermediates).
    Gradients,
    /// Allocated by an optimizer (`torch/optim/*.py` `step`).
    OptimizerState,
    /// Allocated inside a module's forward: activations autograd saves for backward.
    Activations,
    /// Other tensors the program makes.
    Temporaries,
    /// Workspaces and plans of libraries (cuBLAS, cuDNN, cuFFT, NCCL, reductions).
    LibraryWorkspaces,
    /// No frames recorded.
    Unknown,
}

impl Kind {
    /// Every kind, in the order pages list them.
    #[doc(hidden)]
    pub const ALL: [Kind; 7] = [
        Kind::ParametersAndBuffers,
        Kind::Gradients,
        Kind::OptimizerState,
        Kind::Activations,
        Kind::Temporaries,
        Kind::LibraryWorkspaces,
        Kind::Unknown,
    ];

    /// The kind in words, as pages print it.
    #[doc(hidden)]
    pub fn label(self) -> &'static str {
        match self {
            Kind::ParametersAndBuffers => "parameters and buffers",
            Kind::Gradients => "gradients",
            Kind::OptimizerState => "optimizer state",
            Kind::Activations => "activations (saved for backward)",
            Kind::Temporaries => "temporaries",
            Kind::LibraryWorkspaces => "library workspaces",
            Kind::Unknown => "unknown (no frames recorded)",
        }
    }
}

/// Where a site's name comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
#[doc(hidden)]
pub enum SiteOrigin {
    /// The innermost user frame.
    User,
    /// No user frame: the innermost Python frame of a library (PyTorch's included).
    Library,
    /// No Python frame: the innermost C++ function that is not allocation machinery ([`cpp_site`]).
    Cpp,
    /// No frames recorded.
    None,
}

/// The code that allocated a tensor.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[doc(hidden)]
pub struct Site {
    /// `FILE:LINE FUNCTION` for a Python frame, the function for a C++ one, `(no frames recorded)`.
    pub label: String,
    /// Where the label comes from.
    pub origin: SiteOrigin,
}

/// The label of a stack without frames.
#[doc(hidden)]
pub const NO_FRAMES: &str = "(no frames recorded)";

/// A Python frame as `FILE:LINE FUNCTION`, `FILE` its normalised path ([`Frame::path`]: the same label
/// whether the snapshot recorded an absolute POSIX or Windows path or a shortened one).
#[doc(hidden)]
pub fn frame_label(f: &Frame) -> String {
    format!("{}:{} {}", f.path().path, f.line, f.name)
}

/// Frames of the allocation machinery a C++ stack passes through before the function that asked for
/// memory: the traceback, the caching allocator, ATen's tensor factories and the dispatcher.
pub(crate) fn is_machinery(function: &str) -> bool {
    const PARTS: &[&str] = &[
        "unwind",
        "CapturedTraceback",
        "gather_with_cpp",
        "CachingAllocator",
        "c10::cuda::",
        "at::detail::",
        "c10::impl::",
        "c10::Dispatcher",
        "c10::callUnboxedKernelFunction",
        "c10::KernelFunction",
        "c10::BoxedKernel",
        "TensorIterator",
        "at::meta::",
        "set_output",
        "create_out",
        "resize_",
    ];
    if PARTS.iter().any(|p| function.contains(p)) {
        return true;
    }
    // A factory (`at::_ops::empty_memory_format::call`, `at::native::zeros_symint`, `wrapper_CUDA_memory_format_empty`):
    // its caller is the one that wanted the tensor.
    let last = function.trim_end_matches("::call").trim_end_matches("::redispatch");
    let last = last.rsplit("::").next().unwrap_or(last);
    // `wrapper_{dispatch key}_{op}` / `wrapper_{dispatch key}__{op}` (the registration's wrappers).
    let last = last
        .strip_prefix("wrapper_")
        .map_or(last, |w| w.split_once('_').map_or(w, |(_, op)| op.trim_start_matches('_')));
    const FACTORIES: &[&str] = &["empty", "_empty", "zeros", "ones", "full", "new_empty", "new_zeros", "new_full"];
    FACTORIES.iter().any(|f| last.starts_with(f)) || last.ends_with("_empty") || last == "memory_format_empty"
}

/// The innermost C++ function of `frames` (innermost first, as PyTorch records them) that is not
/// allocation machinery (the traceback, the caching allocator, ATen's factories and dispatch, the
/// Python interpreter's C frames are passed over): what asked for the memory. `None` when every C++
/// frame is machinery, or a Python frame comes first.
#[doc(hidden)]
pub fn cpp_site(frames: &[Frame]) -> Option<String> {
    for f in frames {
        if f.is_python() {
            return None;
        }
        let function = f.function();
        // The interpreter's own frames (`_PyEval_EvalFrameDefault`, `cfunction_call`) and PyTorch's Python
        // bindings: the op was inner.
        if function.starts_with("_Py") || function.starts_with("Py") || function.contains("THPVariable") {
            return None;
        }
        if !function.is_empty() && function != "??" && !is_machinery(&function) {
            return Some(function);
        }
    }
    None
}

/// The site of a stack (innermost first): see the module docs.
#[doc(hidden)]
pub fn site_of(frames: &[Frame]) -> Site {
    if let Some(f) = frames.iter().find(|f| f.is_user()) {
        return Site { label: frame_label(f), origin: SiteOrigin::User };
    }
    if let Some(f) = frames.iter().find(|f| f.is_python() && f.path().origin != FileOrigin::Pseudo) {
        return Site { label: frame_label(f), origin: SiteOrigin::Library };
    }
    // Only C++ frames (or Python ones after C++ frames that name the op).
    let cpp: Vec<Frame> = frames.iter().take_while(|f| !f.is_python()).cloned().collect();
    if let Some(c) = cpp_site(&cpp) {
        return Site { label: c, origin: SiteOrigin::Cpp };
    }
    match frames.first() {
        Some(f) => Site { label: f.function(), origin: SiteOrigin::Cpp },
        None => Site { label: NO_FRAMES.into(), origin: SiteOrigin::None },
    }
}

/// The kind of a stack (innermost first): the rules of the module docs, in order.
#[doc(hidden)]
pub fn kind_of(frames: &[Frame]) -> Kind {
    if frames.is_empty() {
        return Kind::Unknown;
    }
    if let Some(c) = cpp_site(frames) {
        let l = c.to_ascii_lowercase();
        if l.contains("workspace")
            || l.contains("cudnn")
            || l.contains("cufft")
            || l.contains("nccl")
            || l.contains("gpu_reduce_kernel")
        {
            return Kind::LibraryWorkspaces;
        }
    }
    let py = |f: &&Frame| f.is_python();
    let optim = frames.iter().filter(py).any(|f| {
        let path = f.path();
        let file = path.path.as_ref();
        file.starts_with("torch/optim/")
            || file.contains("/optim/")
            || file.rsplit('/').next().is_some_and(|b| b.starts_with("optim"))
    });
    if optim {
        return Kind::OptimizerState;
    }
    let grad = frames.iter().any(|f| {
        if f.is_python() {
            f.name == "backward" || f.name == "_engine_run_backward"
        } else {
            let n = f.function();
            n.starts_with("torch::autograd::Engine")
                || n.contains("AccumulateGrad")
                || n.starts_with("torch::autograd::generated::")
                || (n.starts_with("at::native::") && n.ends_with("_backward"))
        }
    });
    if grad {
        return Kind::Gradients;
    }
    let params = frames.iter().filter(py).any(|f| {
        let path = f.path();
        let (file, name) = (path.path.as_ref(), f.name.as_str());
        (file.starts_with("torch/nn/modules/")
            && matches!(
                name,
                "_apply"
                    | "to"
                    | "cuda"
                    | "to_empty"
                    | "load_state_dict"
                    | "_load_from_state_dict"
                    | "register_parameter"
                    | "register_buffer"
                    | "__init__"
            ))
            || file == "torch/nn/parameter.py"
            || file == "torch/nn/init.py"
            || (file == "torch/serialization.py" && name == "load")
            || name == "from_pretrained"
            || name.starts_with("_load_state_dict_into")
            || name == "set_module_tensor_to_device"
            || name == "dispatch_model"
            || name.to_ascii_lowercase().contains("weight")
            || name.to_ascii_lowercase().contains("param")
    });
    if params {
        return Kind::ParametersAndBuffers;
    }
    let forward = frames.iter().filter(py).any(|f| {
        f.name == "forward"
            || (f.path().path == "torch/nn/modules/module.py"
                && matches!(f.name.as_str(), "_call_impl" | "_wrapped_call_impl"))
    });
    if forward {
        return Kind::Activations;
    }
    Kind::Temporaries
}

/// The live bytes of one site (or one kind). Bytes.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
#[doc(hidden)]
pub struct Group {
    /// The site's label ([`Site::label`]) or the kind's ([`Kind::label`]).
    pub label: String,
    /// For a site, where its label comes from; `None` for a kind.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub origin: Option<SiteOrigin>,
    /// For a kind, the kind; for a site, the kind holding most of its bytes.
    pub kind: Kind,
    /// Live tensors (blocks).
    pub tensors: usize,
    /// Their block bytes.
    pub bytes: u64,
    /// `bytes` over the capacity, in percent.
    pub share_of_capacity: f64,
}

/// The live bytes at the moment by site and by kind ([`super::Explanation::breakdown`]). Bytes.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Breakdown {
    /// The capacity the shares are of.
    pub capacity: u64,
    /// Live tensors at the moment.
    pub tensors: usize,
    /// Their block bytes (the explanation's `allocated`).
    pub bytes: u64,
    /// Tensors whose allocation's frames are recorded.
    pub tensors_with_frames: usize,
    /// Sites by bytes, largest first (at most [`TOP_SITES`]).
    pub by_site: Vec<Group>,
    /// The sites after [`TOP_SITES`]: how many, and their tensors and bytes.
    pub other_sites: usize,
    /// Tensors of `other_sites`.
    pub other_tensors: usize,
    /// Bytes of `other_sites`.
    pub other_bytes: u64,
    /// Every kind that holds bytes, largest first.
    pub by_kind: Vec<Group>,
    /// The first recorded OOM's request, when one is explained.
    pub request: Option<u64>,
    /// For that request: the live bytes that must be freed (and their memory returned to the driver) for
    /// it to fit: its shortfall after every cached byte is released (0 when the bytes were there, in pieces).
    pub must_free: Option<u64>,
}

/// How many sites a [`Breakdown`] lists.
#[doc(hidden)]
pub const TOP_SITES: usize = 10;

/// The breakdown of `tensors` (each a block's bytes and its allocation's frames, innermost first) at a
/// capacity of `capacity` bytes; `request` and `shortfall` of the first explained OOM.
#[doc(hidden)]
pub fn breakdown(
    tensors: &[(u64, &[Frame])],
    capacity: u64,
    request: Option<u64>,
    shortfall: Option<u64>,
) -> Breakdown {
    let share = |b: u64| if capacity == 0 { 0.0 } else { b as f64 * 100.0 / capacity as f64 };
    let mut sites: HashMap<Site, (usize, u64, HashMap<Kind, u64>)> = HashMap::new();
    let mut kinds: HashMap<Kind, (usize, u64)> = HashMap::new();
    let mut total = 0u64;
    for &(bytes, frames) in tensors {
        let kind = kind_of(frames);
        total = total.saturating_add(bytes);
        let s = sites.entry(site_of(frames)).or_default();
        s.0 += 1;
        s.1 = s.1.saturating_add(bytes);
        *s.2.entry(kind).or_default() += bytes;
        let k = kinds.entry(kind).or_default();
        k.0 += 1;
        k.1 = k.1.saturating_add(bytes);
    }
    let mut by_site: Vec<Group> = sites
        .into_iter()
        .map(|(site, (n, bytes, ks))| {
            let kind = ks.into_iter().max_by_key(|&(k, b)| (b, std::cmp::Reverse(k))).map_or(Kind::Unknown, |x| x.0);
            Group {
                label: site.label,
                origin: Some(site.origin),
                kind,
                tensors: n,
                bytes,
                share_of_capacity: share(bytes),
            }
        })
        .collect();
    by_site.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.label.cmp(&b.label)));
    let rest = by_site.split_off(by_site.len().min(TOP_SITES));
    let mut by_kind: Vec<Group> = kinds
        .into_iter()
        .map(|(kind, (n, bytes))| Group {
            label: kind.label().into(),
            origin: None,
            kind,
            tensors: n,
            bytes,
            share_of_capacity: share(bytes),
        })
        .collect();
    by_kind.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.kind.cmp(&b.kind)));
    Breakdown {
        capacity,
        tensors: tensors.len(),
        bytes: total,
        tensors_with_frames: tensors.iter().filter(|t| !t.1.is_empty()).count(),
        other_sites: rest.len(),
        other_tensors: rest.iter().map(|g| g.tensors).sum(),
        other_bytes: rest.iter().map(|g| g.bytes).sum(),
        by_site,
        by_kind,
        request,
        must_free: request.and(shortfall),
    }
}
