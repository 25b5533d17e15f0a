//! The `PYTORCH_CUDA_ALLOC_CONF` keys of the caching model: one table, [`OPTIONS`], one row per key.
//!
//! PyTorch keeps one parser per key and one set of valid keys: `c10/core/AllocatorConfig.h`
//! (`AcceleratorAllocatorConfig`: `parseMaxSplitSize`, `parseMaxNonSplitRoundingSize`,
//! `parseGarbageCollectionThreshold`, `parseRoundUpPower2Divisions`, `parseExpandableSegments`,
//! `parsePinnedUseBackgroundThreads`, and the set `keys_`) and `c10/cuda/CUDAAllocatorConfig.cpp`
//! (`CUDAAllocatorConfig::parseArgs`, which parses the CUDA keys, `parsePerProcessMemoryFraction` among them,
//! and refuses a key in neither set: "Unrecognized key"). Before PyTorch 2.9 the common parsers lived in
//! `c10/cuda/CUDAAllocatorConfig.cpp` too (`CUDAAllocatorConfig::parseArgs`); the tokens are those of
//! `ConfigTokenizer` (`lexArgs` before): `,` `:` `[` `]` apart, spaces dropped.
//!
//! A row ([`AllocOption`]) is the key, its parser, its `to_env` (the `key:value` that sets a
//! [`CachingConfig`] back), whether the model implements it or why not ([`Support`]), which PyTorch
//! releases accept it ([`Accepted`]) and the PyTorch file and function that parse it.
//! [`CachingConfig::from_env`], [`CachingConfig::from_settings`] and [`CachingConfig::to_env`] go through
//! the table, and every [`ConfigWarning`](super::ConfigWarning) about an option takes its reason from its
//! row. A new key is one row and, if it is parsed, one function.
//!
//! Releases: [`Accepted::Since`] names a release that accepts the key, and every later one does. It is the
//! first such release where that is established: PyTorch 2.10.0's release notes list
//! `per_process_memory_fraction` as new (pytorch/pytorch#161035); `expandable_segments` was merged in
//! April 2023 (#96995), after 2.0's release, so 2.1 is its first. Otherwise it is a release known to have
//! the key (`first: false`): 2.0 for keys added in 1.x (every 2.x release has them), 2.6 for
//! `max_non_split_rounding_mb` (#136174, opened September 2024). Keys whose first release is not
//! established here are [`Accepted::Current`]: in PyTorch's current parser.

mod parsers;

use parsers::*;
pub(super) use parsers::{lex, value_end};

use super::config::{CachingConfig, LARGE_BUFFER, MIB};

/// Whether the model implements a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Support {
    /// A field of [`CachingConfig`] the model follows.
    Modelled,
    /// Read, checked as PyTorch checks it, and reported as a [`ConfigWarning`](super::ConfigWarning) with
    /// this reason.
    NotModelled(&'static str),
}

/// Which releases accept a key in `PYTORCH_CUDA_ALLOC_CONF`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Accepted {
    /// PyTorch `version` and every later release (see the [module docs](self) for how it is
    /// established). `pr`: the pytorch/pytorch pull request that added it.
    Since {
        /// A release, "2.10".
        version: &'static str,
        /// Whether `version` is the first release that accepts the key (earlier ones refuse it); else
        /// earlier releases may accept it too (keys added in 1.x are listed from 2.0).
        first: bool,
        /// The pull request, if known.
        pr: Option<u32>,
    },
    /// PyTorch's current parser (added by pytorch/pytorch `pr`); the first release is not established here.
    Current {
        /// The pull request, if known.
        pr: Option<u32>,
    },
    /// No PyTorch release: torch_npu's `PYTORCH_NPU_ALLOC_CONF` only (PyTorch refuses it).
    TorchNpuOnly,
}

/// A parser ([`parsers`]): the tokens and the index of the key's first value token; sets its field of the
/// configuration and returns the index of the last token of the value, and a reason to warn with for
/// this value (the row's [`Support::NotModelled`] reason otherwise).
type Parse = fn(&[String], usize, &mut CachingConfig) -> Parsed;

/// One `PYTORCH_CUDA_ALLOC_CONF` key of [`OPTIONS`].
#[derive(Clone, Copy, Debug)]
pub struct AllocOption {
    /// The key as PyTorch spells it.
    pub key: &'static str,
    /// Other spellings the parser accepts (ROCm's `hip` names).
    pub aliases: &'static [&'static str],
    /// Whether the model implements it.
    pub support: Support,
    /// The releases that accept it.
    pub accepted: Accepted,
    /// The file and function that parse it (PyTorch's, or torch_npu's for [`Accepted::TorchNpuOnly`]).
    pub parser: &'static str,
    /// How a release before [`Accepted::Since`] gets the same effect, for a value (`None`: no other way).
    older: Option<fn(&str) -> String>,
    parse: Parse,
    to_env: fn(&CachingConfig) -> Option<String>,
}

/// Every key, the modelled ones first in the order [`CachingConfig::to_env`] prints them.
pub static OPTIONS: &[AllocOption] = &[
    AllocOption {
        key: "expandable_segments",
        aliases: &[],
        support: Support::Modelled,
        accepted: Accepted::Since { version: "2.1", first: true, pr: Some(96995) },
        parser: "c10/core/AllocatorConfig.cpp, AcceleratorAllocatorConfig::parseExpandableSegments",
        older: None,
        parse: parse_expandable_segments,
        to_env: |c| c.expandable_segments.then(|| "expandable_segments:True".into()),
    },
    AllocOption {
        key: "max_split_size_mb",
        aliases: &[],
        support: Support::Modelled,
        accepted: Accepted::Since { version: "2.0", first: false, pr: Some(44742) },
        parser: "c10/core/AllocatorConfig.cpp, AcceleratorAllocatorConfig::parseMaxSplitSize",
        older: None,
        parse: parse_max_split_size,
        to_env: |c| (c.max_split_size != u64::MAX).then(|| format!("max_split_size_mb:{}", c.max_split_size / MIB)),
    },
    AllocOption {
        key: "max_non_split_rounding_mb",
        aliases: &[],
        support: Support::Modelled,
        accepted: Accepted::Since { version: "2.6", first: false, pr: Some(136174) },
        parser: "c10/core/AllocatorConfig.cpp, AcceleratorAllocatorConfig::parseMaxNonSplitRoundingSize",
        older: None,
        parse: parse_max_non_split_rounding,
        to_env: |c| {
            (c.max_non_split_rounding != LARGE_BUFFER)
                .then(|| format!("max_non_split_rounding_mb:{}", c.max_non_split_rounding / MIB))
        },
    },
    AllocOption {
        key: "roundup_power2_divisions",
        aliases: &[],
        support: Support::Modelled,
        // The single value (#74213, 2022); the per-interval list (#87290, 2022).
        accepted: Accepted::Since { version: "2.0", first: false, pr: Some(74213) },
        parser: "c10/core/AllocatorConfig.cpp, AcceleratorAllocatorConfig::parseRoundUpPower2Divisions",
        older: None,
        parse: parse_roundup_power2_divisions,
        to_env: |c| {
            let d = &c.roundup_power2_divisions;
            d.iter().any(|&x| x != 0).then(|| format!("roundup_power2_divisions:{}", divisions_to_env(d)))
        },
    },
    AllocOption {
        key: "garbage_collection_threshold",
        aliases: &[],
        support: Support::Modelled,
        accepted: Accepted::Since { version: "2.0", first: false, pr: Some(74261) },
        parser: "c10/core/AllocatorConfig.cpp, AcceleratorAllocatorConfig::parseGarbageCollectionThreshold",
        older: None,
        parse: parse_garbage_collection_threshold,
        to_env: |c| {
            (c.garbage_collection_threshold > 0.0)
                .then(|| format!("garbage_collection_threshold:{}", c.garbage_collection_threshold))
        },
    },
    AllocOption {
        key: "per_process_memory_fraction",
        aliases: &[],
        support: Support::Modelled,
        accepted: Accepted::Since { version: "2.10", first: true, pr: Some(161035) },
        parser: "c10/cuda/CUDAAllocatorConfig.cpp, CUDAAllocatorConfig::parsePerProcessMemoryFraction",
        // `torch.cuda.set_per_process_memory_fraction` (pytorch/pytorch#48172) raises a TypeError for
        // anything but a float (torch/cuda/memory.py): 1 is printed as 1.0.
        older: Some(|v| {
            let f = v.parse::<f64>().map_or_else(|_| v.to_string(), |f| format!("{f:?}"));
            format!("torch.cuda.set_per_process_memory_fraction({f})")
        }),
        parse: parse_per_process_memory_fraction,
        to_env: |c| c.memory_fraction.map(|f| format!("per_process_memory_fraction:{f}")),
    },
    AllocOption {
        key: "base_addr_aligned_kb",
        aliases: &[],
        support: Support::Modelled,
        accepted: Accepted::TorchNpuOnly,
        parser: "torch_npu/csrc/core/npu/NPUAllocatorConfig.cpp, NPUAllocatorConfig::parseAddrAlignSize",
        older: None,
        parse: parse_base_addr_aligned_kb,
        to_env: |c| (c.base_addr_align != 0).then(|| format!("base_addr_aligned_kb:{}", c.base_addr_align >> 10)),
    },
    AllocOption {
        key: "backend",
        aliases: &[],
        support: Support::Modelled,
        accepted: Accepted::Since { version: "2.0", first: false, pr: None },
        parser: "c10/cuda/CUDAAllocatorConfig.cpp, CUDAAllocatorConfig::parseAllocatorConfig",
        older: None,
        parse: parse_backend,
        to_env: |_| None,
    },
    AllocOption {
        key: "release_lock_on_cudamalloc",
        aliases: &["release_lock_on_hipmalloc"],
        support: Support::NotModelled("a locking detail: no effect on where memory goes"),
        accepted: Accepted::Current { pr: Some(108367) },
        parser: "c10/cuda/CUDAAllocatorConfig.cpp, CUDAAllocatorConfig::parseArgs",
        older: None,
        parse: parse_flag,
        to_env: |_| None,
    },
    AllocOption {
        key: "pinned_use_cuda_host_register",
        aliases: &["pinned_use_hip_host_register"],
        support: Support::NotModelled(HOST_PINNED),
        accepted: Accepted::Current { pr: None },
        parser: "c10/cuda/CUDAAllocatorConfig.cpp, CUDAAllocatorConfig::parsePinnedUseCudaHostRegister",
        older: None,
        parse: parse_flag,
        to_env: |_| None,
    },
    AllocOption {
        key: "pinned_num_register_threads",
        aliases: &[],
        support: Support::NotModelled(HOST_PINNED),
        accepted: Accepted::Current { pr: None },
        parser: "c10/cuda/CUDAAllocatorConfig.cpp, CUDAAllocatorConfig::parsePinnedNumRegisterThreads",
        older: None,
        parse: parse_pinned_num_register_threads,
        to_env: |_| None,
    },
    AllocOption {
        key: "pinned_use_background_threads",
        aliases: &[],
        support: Support::NotModelled(HOST_PINNED),
        accepted: Accepted::Current { pr: None },
        parser: "c10/core/AllocatorConfig.cpp, AcceleratorAllocatorConfig::parsePinnedUseBackgroundThreads",
        older: None,
        parse: parse_flag,
        to_env: |_| None,
    },
    AllocOption {
        key: "pinned_reserve_segment_size_mb",
        aliases: &[],
        support: Support::NotModelled(HOST_PINNED),
        accepted: Accepted::Current { pr: None },
        parser: "c10/cuda/CUDAAllocatorConfig.cpp, CUDAAllocatorConfig::parsePinnedReserveSegmentSize",
        older: None,
        parse: parse_positive,
        to_env: |_| None,
    },
    AllocOption {
        key: "pinned_free_catch_all",
        aliases: &[],
        support: Support::NotModelled(HOST_PINNED),
        accepted: Accepted::Current { pr: None },
        parser: "c10/cuda/CUDAAllocatorConfig.cpp, CUDAAllocatorConfig::parsePinnedFreeCatchAll",
        older: None,
        parse: parse_flag,
        to_env: |_| None,
    },
    AllocOption {
        key: "graph_capture_record_stream_reuse",
        aliases: &[],
        support: Support::NotModelled("CUDA graph capture is not modelled"),
        accepted: Accepted::Current { pr: Some(158352) },
        parser: "c10/cuda/CUDAAllocatorConfig.cpp, CUDAAllocatorConfig::parseGraphCaptureRecordStreamReuse",
        older: None,
        parse: parse_flag,
        to_env: |_| None,
    },
    AllocOption {
        key: "throw_on_cudamalloc_oom",
        aliases: &[],
        support: Support::NotModelled(
            "the out-of-memory error raised before a `cudaMalloc` likely to fail is not modelled",
        ),
        accepted: Accepted::Current { pr: None },
        parser: "c10/cuda/CUDAAllocatorConfig.cpp, CUDAAllocatorConfig::parseThrowOnCudaMallocOom",
        older: None,
        parse: parse_flag,
        to_env: |_| None,
    },
    AllocOption {
        key: "expandable_segments_reserve",
        aliases: &[],
        support: Support::NotModelled(RESERVE),
        accepted: Accepted::Current { pr: None },
        parser: "c10/cuda/CUDAAllocatorConfig.cpp, CUDAAllocatorConfig::parseExpandableSegmentsReserve",
        older: None,
        parse: parse_value,
        to_env: |_| None,
    },
    AllocOption {
        key: "expandable_segments_reserve_by_class",
        aliases: &[],
        support: Support::NotModelled(RESERVE),
        accepted: Accepted::Current { pr: None },
        parser: "c10/cuda/CUDAAllocatorConfig.cpp, CUDAAllocatorConfig::parseExpandableSegmentsReserveByClass",
        older: None,
        parse: parse_value,
        to_env: |_| None,
    },
];

const HOST_PINNED: &str = "host pinned memory: no effect on device memory";
const RESERVE: &str = "the virtual size of expandable reservations is not modelled (1⅛ × device memory)";
/// The reason given for a key no row names (PyTorch refuses it; torch_npu has keys of its own).
pub(super) const UNKNOWN: &str = "not modelled (unknown to the model)";

/// The row of `key` (or of one of its aliases).
pub fn find(key: &str) -> Option<&'static AllocOption> {
    OPTIONS.iter().find(|o| o.key == key || o.aliases.contains(&key))
}

impl AllocOption {
    /// Parses the value at `toks[i..]` into `cfg`: the index of the value's last token, and the reason to
    /// warn with (this row's [`Support::NotModelled`] reason, or one for this value), if any.
    pub(super) fn parse(&self, toks: &[String], i: usize, cfg: &mut CachingConfig) -> Parsed {
        let (last, note) = (self.parse)(toks, i, cfg)?;
        let reason = match self.support {
            Support::NotModelled(r) => Some(r),
            Support::Modelled => note,
        };
        Ok((last, reason))
    }

    /// This row's `key:value` for `cfg`, `None` where `cfg` has the default.
    pub(super) fn to_env(self, cfg: &CachingConfig) -> Option<String> {
        (self.to_env)(cfg)
    }

    /// Which PyTorch releases read `key:value` from `PYTORCH_CUDA_ALLOC_CONF`, with the parser, and what an
    /// older release needs instead; one sentence without a final stop, for the settings advice:
    /// "`per_process_memory_fraction:1` is read by PyTorch 2.10 and later (c10/cuda/…, …;
    /// pytorch/pytorch#161035); before 2.10, leave it out and call
    /// torch.cuda.set_per_process_memory_fraction(1.0)".
    pub fn pytorch_support(&self, value: &str) -> String {
        let what = format!("`{}:{value}`", self.key);
        match self.accepted {
            Accepted::Since { version, first, pr } => {
                let pr = pr.map_or_else(String::new, |n| format!("; pytorch/pytorch#{n}"));
                let older = match (first, self.older) {
                    (true, Some(route)) => format!("; before {version}, leave it out and call {}", route(value)),
                    (true, None) => "; earlier releases refuse the key".to_string(),
                    (false, _) => String::new(),
                };
                format!("{what} is read by PyTorch {version} and later ({}{pr}){older}", self.parser)
            }
            Accepted::Current { .. } => format!("{what} is read by PyTorch's current parser ({})", self.parser),
            Accepted::TorchNpuOnly => {
                format!("{what} is torch_npu's (PYTORCH_NPU_ALLOC_CONF, {}): PyTorch refuses it", self.parser)
            }
        }
    }
}

/// [`AllocOption::pytorch_support`] of `key:value`, `None` for a key no row names.
pub fn key_support(key: &str, value: &str) -> Option<String> {
    find(key).map(|o| o.pytorch_support(value))
}

/// [`AllocOption::pytorch_support`] of each key of a `PYTORCH_CUDA_ALLOC_CONF` value (such as
/// [`CachingConfig::to_env`]'s, or a `PYTORCH_CUDA_ALLOC_CONF=…` line), in order; keys no row names are
/// left out.
pub fn env_support(conf: &str) -> Vec<String> {
    let toks = lex(conf.strip_prefix("PYTORCH_CUDA_ALLOC_CONF=").unwrap_or(conf));
    let mut out = Vec::new();
    let mut i = 0;
    while toks.get(i + 1).is_some_and(|t| t == ":") {
        let Ok(end) = value_end(&toks, i + 2) else { break };
        if let Some(row) = find(&toks[i]) {
            out.push(row.pytorch_support(&toks[i + 2..=end].concat()));
        }
        i = end + 2;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One row per key, no key or alias twice; every modelled row but `backend` prints what it reads
    /// (`to_env` of a configuration its parser set is its own `key:value` back).
    #[test]
    fn one_row_per_key_and_modelled_rows_round_trip() {
        let mut names: Vec<&str> =
            OPTIONS.iter().flat_map(|o| std::iter::once(o.key).chain(o.aliases.iter().copied())).collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n, "a key is named twice");
        for (key, value) in [
            ("expandable_segments", "True"),
            ("max_split_size_mb", "128"),
            ("max_non_split_rounding_mb", "64"),
            ("roundup_power2_divisions", "[256:1,512:4,>:4]"),
            ("garbage_collection_threshold", "0.6"),
            ("per_process_memory_fraction", "0.5"),
            ("base_addr_aligned_kb", "16"),
        ] {
            let row = find(key).unwrap();
            assert_eq!(row.support, Support::Modelled);
            let mut cfg = CachingConfig::new(1 << 34);
            let toks = lex(value);
            let (last, note) = row.parse(&toks, 0, &mut cfg).unwrap();
            assert_eq!((last, note), (toks.len() - 1, None), "{key}");
            assert_eq!(row.to_env(&cfg), Some(format!("{key}:{value}")));
            assert_eq!(row.to_env(&CachingConfig::new(1 << 34)), None, "{key} at its default");
        }
        assert!(OPTIONS
            .iter()
            .filter(|o| o.support != Support::Modelled)
            .all(|o| o.to_env(&CachingConfig::new(1 << 34)).is_none()));
    }

    /// The advice for the memory fraction follows PyTorch's current parser (PR #161035, PyTorch 2.10) and
    /// names the call older releases need, with a float (`set_per_process_memory_fraction` refuses an int).
    #[test]
    fn support_sentences_follow_the_table() {
        let s = env_support("expandable_segments:True,max_split_size_mb:128,per_process_memory_fraction:1");
        assert_eq!(s.len(), 3);
        assert!(s[0]
            .starts_with("`expandable_segments:True` is read by PyTorch 2.1 and later (c10/core/AllocatorConfig.cpp"));
        let want = "PyTorch 2.10 and later (c10/cuda/CUDAAllocatorConfig.cpp, \
                    CUDAAllocatorConfig::parsePerProcessMemoryFraction; pytorch/pytorch#161035)";
        assert!(s[2].contains(want), "{}", s[2]);
        assert!(
            s[2].ends_with("before 2.10, leave it out and call torch.cuda.set_per_process_memory_fraction(1.0)"),
            "{}",
            s[2]
        );
        assert_eq!(env_support("roundup_power2_divisions:[256:1,>:8]").len(), 1);
        assert!(find("base_addr_aligned_kb").unwrap().pytorch_support("16").contains("PyTorch refuses it"));
        assert!(env_support("").is_empty());
        assert_eq!(env_support("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"), s[..1]);
        assert_eq!(key_support("per_process_memory_fraction", "1").as_ref(), Some(&s[2]));
    }
}
