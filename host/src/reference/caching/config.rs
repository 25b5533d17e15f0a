//! The options of the caching-allocator model: PyTorch's `CUDAAllocatorConfig`.
//!
//! A [`CachingConfig`] is built with [`CachingConfig::new`] and the builder methods, from a
//! `PYTORCH_CUDA_ALLOC_CONF` string ([`CachingConfig::from_env`]), or from the `allocator_settings` a
//! snapshot records ([`CachingConfig::from_settings`]); [`CachingConfig::to_env`] prints it back as the
//! `PYTORCH_CUDA_ALLOC_CONF` value that sets it. All three go through one table of the keys,
//! [`OPTIONS`] ([`super::options`]): one row per key with its parser (PyTorch's `parseX` of
//! `c10/core/AllocatorConfig.cpp` and `c10/cuda/CUDAAllocatorConfig.cpp`, with the same range checks), its
//! `to_env`, whether it is modelled or why not, and the PyTorch releases that accept it. Options the model
//! does not implement are never dropped silently: each is returned as a [`ConfigWarning`] whose reason is
//! its row's.

use std::fmt;

use super::options::{self, lex, value_end, AllocOption, Support, OPTIONS, UNKNOWN};
use crate::trace::AllocatorSettings;

/// Number of `roundup_power2_divisions` intervals: `[1 MiB, 2 MiB)`, `[2 MiB, 4 MiB)`, ..., the last
/// one `[32 GiB, ∞)` (`kRoundUpPowerOfTwoIntervals`).
#[doc(hidden)]
pub const ROUNDUP_INTERVALS: usize = 16;

pub(super) const MIB: u64 = 1 << 20;
/// `kLargeBuffer`, the default `max_non_split_rounding` and the smallest `max_split_size_mb`, bytes.
pub(super) const LARGE_BUFFER: u64 = 20 * MIB;

/// Options of [`super::CachingAllocator`] (bytes unless named otherwise).
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct CachingConfig {
    /// Device memory in bytes (`totalGlobalMem`).
    pub device_capacity: u64,
    /// `expandable_segments:True`.
    pub expandable_segments: bool,
    /// `max_split_size_mb` in bytes (`u64::MAX`: unlimited, the default).
    pub max_split_size: u64,
    /// `max_non_split_rounding_mb` in bytes (default 20 MiB, `kLargeBuffer`).
    pub max_non_split_rounding: u64,
    /// `roundup_power2_divisions` per interval (index `i`: requests in `[2^i MiB, 2^(i+1) MiB)`, the last
    /// interval open-ended); 0 = off (the default).
    pub roundup_power2_divisions: [u64; ROUNDUP_INTERVALS],
    /// `garbage_collection_threshold` in `(0, 1)`, 0 = off (the default). PyTorch applies it only when a
    /// per-process memory fraction is set ([`CachingConfig::memory_fraction`]).
    pub garbage_collection_threshold: f64,
    /// The per-process memory fraction `f` (`None`: not set, the default): the allocator may reserve at
    /// most `f × device_capacity` bytes (`allowed_memory_maximum`). Set by
    /// `torch.cuda.set_per_process_memory_fraction(f)` or, since PyTorch 2.10 (and in torch_npu),
    /// `per_process_memory_fraction:f` in `PYTORCH_CUDA_ALLOC_CONF`.
    pub memory_fraction: Option<f64>,
    /// Bytes added to every request before rounding: 0 in PyTorch; torch_npu's `round_size` adds
    /// `AddPadSize()` = 32 B (`torch_npu/csrc/core/npu/NPUCachingAllocator.cpp`). Not an environment
    /// option: a replay infers it from the snapshot's block sizes.
    pub request_pad: u64,
    /// torch_npu only (`base_addr_aligned_kb`, default 16 KiB, `kAlignRoundLarge`; 0 = off, PyTorch): with
    /// expandable segments, a block found for a request of 2 MiB or more starts at the next multiple of
    /// this many bytes, the bytes before it staying cached (`NPUCachingAllocator.cpp` `malloc`).
    pub base_addr_align: u64,
}

/// An option the model read but does not implement (or that has no effect as set), with the reason.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ConfigWarning {
    /// The option's name as PyTorch spells it (`backend`, `pinned_num_register_threads`, ...).
    pub option: String,
    /// Its value as given.
    pub value: String,
    /// Why it is not modelled, or why it has no effect.
    pub reason: String,
}

impl fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "allocator option `{}` = {}: {}", self.option, self.value, self.reason)
    }
}

/// A `PYTORCH_CUDA_ALLOC_CONF` string PyTorch itself would refuse (its `TORCH_CHECK` message, in our
/// words), naming the option.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("PYTORCH_CUDA_ALLOC_CONF: {0}")]
#[non_exhaustive]
pub struct ConfigError(pub String);

/// Host-side options every recent snapshot records in `allocator_settings` (torch/csrc/cuda/memory_snapshot.cpp,
/// `_memory_snapshot_pickled`), with the values that are PyTorch's defaults (c10/cuda/CUDAAllocatorConfig.h:
/// `m_pinned_num_register_threads(1)`, `m_release_lock_on_cudamalloc(false)`,
/// `m_pinned_use_cuda_host_register(false)`): recorded so, they are no setting of the user's and raise no
/// warning; another value does.
const ALWAYS_WRITTEN_DEFAULTS: &[(&str, &[&str])] = &[
    ("pinned_num_register_threads", &["1"]),
    ("release_lock_on_cudamalloc", &["False", "false", "0"]),
    ("pinned_use_cuda_host_register", &["False", "false", "0"]),
];

impl CachingConfig {
    /// PyTorch's defaults for a device of `device_capacity` bytes.
    pub fn new(device_capacity: u64) -> Self {
        CachingConfig {
            device_capacity,
            expandable_segments: false,
            max_split_size: u64::MAX,
            max_non_split_rounding: LARGE_BUFFER,
            roundup_power2_divisions: [0; ROUNDUP_INTERVALS],
            garbage_collection_threshold: 0.0,
            memory_fraction: None,
            request_pad: 0,
            base_addr_align: 0,
        }
    }

    /// torch_npu's allocator: the 32-byte request pad and 16 KiB base-address alignment of large blocks
    /// with expandable segments.
    #[doc(hidden)]
    pub fn torch_npu(mut self) -> Self {
        self.request_pad = 32;
        self.base_addr_align = 16 << 10;
        self
    }

    /// With `pad` bytes added to every request before rounding (torch_npu: 32).
    #[doc(hidden)]
    pub fn request_pad(mut self, pad: u64) -> Self {
        self.request_pad = pad;
        self
    }

    /// With expandable segments on or off.
    #[doc(hidden)]
    pub fn expandable(mut self, on: bool) -> Self {
        self.expandable_segments = on;
        self
    }

    /// With `max_split_size` bytes (`u64::MAX`: unlimited).
    #[doc(hidden)]
    pub fn max_split(mut self, bytes: u64) -> Self {
        self.max_split_size = bytes;
        self
    }

    /// With `max_non_split_rounding` bytes.
    #[doc(hidden)]
    pub fn max_non_split_rounding(mut self, bytes: u64) -> Self {
        self.max_non_split_rounding = bytes;
        self
    }

    /// With `divisions` in every interval (the single-value form `roundup_power2_divisions:N`).
    #[doc(hidden)]
    pub fn roundup_divisions(mut self, divisions: u64) -> Self {
        self.roundup_power2_divisions = [divisions; ROUNDUP_INTERVALS];
        self
    }

    /// With per-interval divisions (index `i`: requests in `[2^i MiB, 2^(i+1) MiB)`).
    #[doc(hidden)]
    pub fn roundup_divisions_per_interval(mut self, divisions: [u64; ROUNDUP_INTERVALS]) -> Self {
        self.roundup_power2_divisions = divisions;
        self
    }

    /// With `garbage_collection_threshold` (0 = off).
    #[doc(hidden)]
    pub fn gc_threshold(mut self, fraction: f64) -> Self {
        self.garbage_collection_threshold = fraction;
        self
    }

    /// With a per-process memory fraction (`torch.cuda.set_per_process_memory_fraction`).
    #[doc(hidden)]
    pub fn memory_fraction(mut self, fraction: Option<f64>) -> Self {
        self.memory_fraction = fraction;
        self
    }

    /// The divisions that apply to a request of `size` bytes: PyTorch's
    /// `AllocatorConfig::roundup_power2_divisions(size)` (interval `floor(log2(size)) − 20`, clamped to
    /// `[0, 15]`).
    #[doc(hidden)]
    pub fn divisions_for(&self, size: u64) -> u64 {
        let log = 63 - u64::from(size.max(1).leading_zeros());
        let idx = log.saturating_sub(20).min(ROUNDUP_INTERVALS as u64 - 1);
        self.roundup_power2_divisions[idx as usize]
    }

    /// Whether the garbage collector runs: PyTorch's `malloc` calls `garbage_collect_cached_blocks` only
    /// when `set_fraction && garbage_collection_threshold() > 0` (`c10/cuda/CUDACachingAllocator.cpp`).
    #[doc(hidden)]
    pub fn gc_active(&self) -> bool {
        self.memory_fraction.is_some() && self.garbage_collection_threshold > 0.0
    }

    /// `allowed_memory_maximum`: `fraction × device_capacity` with a memory fraction, else the capacity.
    #[doc(hidden)]
    pub fn allowed_memory_maximum(&self) -> u64 {
        match self.memory_fraction {
            Some(f) => (f * self.device_capacity as f64) as u64,
            None => self.device_capacity,
        }
    }

    /// Parses a `PYTORCH_CUDA_ALLOC_CONF` value for a device of `device_capacity` bytes, one key at a time
    /// through its row of [`OPTIONS`] (as `CUDAAllocatorConfig::parseArgs` does).
    ///
    /// Implemented: `max_split_size_mb`, `max_non_split_rounding_mb`, `garbage_collection_threshold`,
    /// `roundup_power2_divisions` (both forms), `expandable_segments`, `per_process_memory_fraction` (read by
    /// PyTorch since 2.10, and by torch_npu), torch_npu's `base_addr_aligned_kb`, `backend:native`. Read,
    /// checked and reported as warnings: the other keys of [`OPTIONS`] (`backend:cudaMallocAsync`,
    /// `release_lock_on_cudamalloc`, the `pinned_` keys, ...) and any other `key:value` (PyTorch refuses
    /// unknown keys; torch_npu has more, so an unknown key is a warning here, not an error).
    ///
    /// # Errors
    /// [`ConfigError`] for a value PyTorch refuses: `max_split_size_mb` or `max_non_split_rounding_mb`
    /// below 20, a threshold outside `(0, 1)`, divisions or intervals that are not powers of two, a
    /// malformed list, a boolean that is not `True`/`False`, an unknown backend, a missing `:`.
    pub fn from_env(conf: &str, device_capacity: u64) -> Result<(CachingConfig, Vec<ConfigWarning>), ConfigError> {
        let mut cfg = CachingConfig::new(device_capacity);
        let mut warnings = Vec::new();
        let toks = lex(conf);
        let mut i = 0;
        while i < toks.len() {
            let key = toks[i].clone();
            if toks.get(i + 1).map(String::as_str) != Some(":") {
                return Err(ConfigError(format!("expected `:` after `{key}`")));
            }
            let (last, reason) = match options::find(&key) {
                Some(row) => row.parse(&toks, i + 2, &mut cfg)?,
                None => (value_end(&toks, i + 2)?, Some(UNKNOWN)),
            };
            if let Some(reason) = reason {
                let value = toks[i + 2..=last].concat();
                warnings.push(ConfigWarning { option: key.clone(), value, reason: reason.into() });
            }
            i = last + 1;
            match toks.get(i).map(String::as_str) {
                None => {}
                Some(",") => i += 1,
                Some(t) => return Err(ConfigError(format!("expected `,` after `{key}`, found `{t}`"))),
            }
        }
        Ok((cfg, warnings))
    }

    /// The configuration a snapshot's `allocator_settings` records, for a device of `device_capacity`
    /// bytes, with a warning for every option the model does not implement and for settings that have no
    /// effect as recorded (a `garbage_collection_threshold` without a memory fraction).
    ///
    /// The recorded `PYTORCH_CUDA_ALLOC_CONF` string is parsed first ([`CachingConfig::from_env`], for
    /// options only it names, such as `max_non_split_rounding_mb`); the structured fields (`max_split_size`
    /// in bytes, −1 = unlimited; `garbage_collection_threshold`; `expandable_segments`;
    /// `roundup_power2_divisions` keyed by interval start in MiB) then take precedence, as they are what the
    /// allocator used. Every other recorded key goes through its row of [`OPTIONS`]: a modelled one is
    /// applied, the others are warnings with the row's reason.
    #[doc(hidden)]
    pub fn from_settings(s: &AllocatorSettings, device_capacity: u64) -> (CachingConfig, Vec<ConfigWarning>) {
        let mut warnings = Vec::new();
        let mut cfg = CachingConfig::new(device_capacity);
        if let Some(conf) = s.alloc_conf.as_deref().filter(|c| !c.trim().is_empty()) {
            match CachingConfig::from_env(conf, device_capacity) {
                Ok((c, w)) => {
                    cfg = c;
                    warnings.extend(w);
                }
                Err(e) => warnings.push(ConfigWarning {
                    option: "PYTORCH_CUDA_ALLOC_CONF".into(),
                    value: format!("{conf:?}"),
                    reason: format!("not parsed ({e}); the structured settings are used"),
                }),
            }
        }
        if let Some(m) = s.max_split_size {
            cfg.max_split_size = if m < 0 { u64::MAX } else { m as u64 };
        }
        if let Some(g) = s.garbage_collection_threshold {
            cfg.garbage_collection_threshold = g.max(0.0);
        }
        if let Some(e) = s.expandable_segments {
            cfg.expandable_segments = e;
        }
        if !s.roundup_power2_divisions.is_empty() {
            let mut d = [0u64; ROUNDUP_INTERVALS];
            for &(mb, div) in &s.roundup_power2_divisions {
                if mb.is_power_of_two() {
                    let idx = (63 - u64::from(mb.leading_zeros())).min(ROUNDUP_INTERVALS as u64 - 1);
                    d[idx as usize] = div;
                } else {
                    warnings.push(ConfigWarning {
                        option: "roundup_power2_divisions".into(),
                        value: format!("{mb}:{div}"),
                        reason: "interval is not a power of two MiB; ignored".into(),
                    });
                }
            }
            cfg.roundup_power2_divisions = d;
        }
        for (k, v) in &s.other {
            // Written by every recent snapshot (torch/csrc/cuda/memory_snapshot.cpp, `_memory_snapshot_pickled`)
            // whatever the user set: at its default (c10/cuda/CUDAAllocatorConfig.h) it says nothing.
            if ALWAYS_WRITTEN_DEFAULTS.iter().any(|(key, vals)| key == k && vals.contains(&v.as_str())) {
                continue;
            }
            let reason = match options::find(k) {
                Some(row) if row.support == Support::Modelled => {
                    let toks = lex(&format!("{k}:{v}"));
                    match row.parse(&toks, 2, &mut cfg) {
                        Ok((_, None)) => continue,
                        Ok((_, Some(r))) => r.to_string(),
                        Err(e) => format!("recorded in a form the model does not read ({e}): not applied"),
                    }
                }
                Some(AllocOption { support: Support::NotModelled(r), .. }) => r.to_string(),
                _ => UNKNOWN.to_string(),
            };
            if !warnings.iter().any(|w| &w.option == k) {
                warnings.push(ConfigWarning { option: k.clone(), value: v.clone(), reason });
            }
        }
        if cfg.garbage_collection_threshold > 0.0 && cfg.memory_fraction.is_none() {
            warnings.push(ConfigWarning {
                option: "garbage_collection_threshold".into(),
                value: cfg.garbage_collection_threshold.to_string(),
                reason: "no effect: PyTorch collects only when a per-process memory fraction is set \
                         (CUDACachingAllocator.cpp malloc: `set_fraction && garbage_collection_threshold() > 0`, \
                         pytorch/pytorch#106660); the snapshot does not record a fraction"
                    .into(),
            });
        }
        (cfg, warnings)
    }

    /// The `PYTORCH_CUDA_ALLOC_CONF` value that sets this configuration: each row of [`OPTIONS`] that is
    /// not at its default, in table order ("" for all defaults). A memory fraction is printed as
    /// `per_process_memory_fraction`, which PyTorch reads since 2.10 and torch_npu reads too (older PyTorch
    /// releases need `torch.cuda.set_per_process_memory_fraction`: [`AllocOption::pytorch_support`]).
    /// [`CachingConfig::from_env`] of the result gives `self` back.
    #[doc(hidden)]
    pub fn to_env(&self) -> String {
        OPTIONS.iter().filter_map(|o| o.to_env(self)).collect::<Vec<_>>().join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `per_process_memory_fraction` takes `[0, 1]` as PyTorch's parser does; at 0.0 the model builds
    /// and every request fails (nothing may be reserved), outside the range the value is refused.
    #[test]
    fn a_zero_memory_fraction_is_read_and_fails_every_request() {
        use crate::reference::{AllocError, SubAllocator};
        let (c, w) = CachingConfig::from_env("per_process_memory_fraction:0.0", 1 << 30).unwrap();
        assert!(w.is_empty(), "{w:?}");
        assert_eq!((c.memory_fraction, c.allowed_memory_maximum()), (Some(0.0), 0));
        let mut model = super::super::CachingAllocator::new(c).unwrap();
        assert!(matches!(model.alloc(512, 1), Err(AllocError::OutOfMemory { requested: 512, .. })));
        for bad in ["-0.1", "1.5", "nan"] {
            let e = CachingConfig::from_env(&format!("per_process_memory_fraction:{bad}"), 1 << 30).unwrap_err();
            assert!(e.to_string().contains("not in [0.0, 1.0]"), "{bad}: {e}");
        }
    }

    #[test]
    fn list_form_follows_pytorch_quirks_and_round_trips() {
        let (c, w) = CachingConfig::from_env("roundup_power2_divisions:[256:1,512:2,>:4]", 1 << 34).unwrap();
        assert!(w.is_empty());
        let mut want = [1u64; ROUNDUP_INTERVALS];
        want[9..].iter_mut().for_each(|x| *x = 4); // `>` fills from 512 MiB (index 9) inclusive
        assert_eq!(c.roundup_power2_divisions, want);
        assert_eq!(c.to_env(), "roundup_power2_divisions:[256:1,512:4,>:4]");
        assert_eq!(CachingConfig::from_env(&c.to_env(), 1 << 34).unwrap().0, c);
        let (c, _) = CachingConfig::from_env("roundup_power2_divisions:[1:2,2:8,64:16]", 1 << 34).unwrap();
        assert_eq!(&c.roundup_power2_divisions[..8], &[2, 8, 0, 0, 0, 0, 16, 0]);
        assert_eq!(CachingConfig::from_env(&c.to_env(), 1 << 34).unwrap().0, c);
        assert_eq!(c.divisions_for(100), 2);
        assert_eq!(c.divisions_for(3 << 20), 8);
        assert_eq!(c.divisions_for(65 << 20), 16);
    }

    #[test]
    fn env_options_errors_and_warnings() {
        let s = "expandable_segments:True, max_split_size_mb:128,garbage_collection_threshold:0.6,\
                 max_non_split_rounding_mb:64,roundup_power2_divisions:4,backend:native,pinned_num_register_threads:8";
        let (c, w) = CachingConfig::from_env(s, 1 << 34).unwrap();
        assert!(c.expandable_segments);
        assert_eq!((c.max_split_size, c.max_non_split_rounding), (128 * MIB, 64 * MIB));
        assert_eq!(c.roundup_power2_divisions, [4; ROUNDUP_INTERVALS]);
        assert_eq!(c.garbage_collection_threshold, 0.6);
        assert_eq!(w.iter().map(|w| w.option.as_str()).collect::<Vec<_>>(), ["backend", "pinned_num_register_threads"]);
        let back = c.to_env();
        assert_eq!(
            back,
            "expandable_segments:True,max_split_size_mb:128,max_non_split_rounding_mb:64,roundup_power2_divisions:4,\
             garbage_collection_threshold:0.6"
        );
        assert_eq!(CachingConfig::from_env(&back, 1 << 34).unwrap().0, c);
        for bad in [
            "max_split_size_mb:19",
            "garbage_collection_threshold:1.0",
            "roundup_power2_divisions:3",
            "roundup_power2_divisions:[3:2]",
            "roundup_power2_divisions:[256:2",
            "expandable_segments:true",
            "max_split_size_mb",
            "backend:magic",
        ] {
            assert!(CachingConfig::from_env(bad, 1 << 34).is_err(), "{bad}");
        }
        assert_eq!(CachingConfig::new(1 << 30).to_env(), "");
    }

    #[test]
    fn settings_warn_about_what_is_not_modelled() {
        let s = AllocatorSettings {
            alloc_conf: Some("roundup_power2_divisions:[>:1],garbage_collection_threshold:0.6".into()),
            max_split_size: Some(-1),
            garbage_collection_threshold: Some(0.6),
            expandable_segments: Some(false),
            roundup_power2_divisions: (0..16).map(|i| (1u64 << i, 1)).collect(),
            // Every recent snapshot records these three; at PyTorch's defaults they raise no warning.
            other: vec![
                ("release_lock_on_cudamalloc".into(), "False".into()),
                ("pinned_num_register_threads".into(), "1".into()),
                ("pinned_use_cuda_host_register".into(), "True".into()),
            ],
        };
        let (c, w) = CachingConfig::from_settings(&s, 1 << 34);
        assert_eq!(c.roundup_power2_divisions, [1; ROUNDUP_INTERVALS]);
        assert_eq!(c.max_split_size, u64::MAX);
        let names: Vec<&str> = w.iter().map(|w| w.option.as_str()).collect();
        assert_eq!(names, ["pinned_use_cuda_host_register", "garbage_collection_threshold"]);
        assert!(!c.gc_active());
        assert!(c.memory_fraction(Some(0.9)).gc_active());
        // A recorded key the model implements is applied through its row; one it does not, warned about.
        let s = AllocatorSettings {
            garbage_collection_threshold: Some(0.6),
            other: vec![
                ("per_process_memory_fraction".into(), "0.5".into()),
                ("graph_capture_record_stream_reuse".into(), "False".into()),
                ("some_future_key".into(), "1".into()),
            ],
            ..AllocatorSettings::default()
        };
        let (c, w) = CachingConfig::from_settings(&s, 1 << 34);
        assert_eq!(c.memory_fraction, Some(0.5));
        assert!(c.gc_active());
        let reasons: Vec<(&str, &str)> = w.iter().map(|w| (w.option.as_str(), w.reason.as_str())).collect();
        assert_eq!(
            reasons,
            [("graph_capture_record_stream_reuse", "CUDA graph capture is not modelled"), ("some_future_key", UNKNOWN)]
        );
    }

    /// Every key goes through its row: PyTorch's checks of keys the model does not implement, list values
    /// of any key, the memory fraction PyTorch reads since 2.10, and one reason per key whether it comes
    /// from the variable or from the snapshot's structured settings.
    #[test]
    fn env_keys_go_through_the_option_table() {
        let (c, w) = CachingConfig::from_env(
            "per_process_memory_fraction:0.5,expandable_segments_reserve_by_class:[a:0.5,b:40G],\
             graph_capture_record_stream_reuse:True,other_key:[1,2]",
            1 << 34,
        )
        .unwrap();
        assert_eq!(c.memory_fraction, Some(0.5));
        assert_eq!(c.to_env(), "per_process_memory_fraction:0.5");
        let got: Vec<(&str, &str)> = w.iter().map(|w| (w.option.as_str(), w.value.as_str())).collect();
        assert_eq!(
            got,
            [
                ("expandable_segments_reserve_by_class", "[a:0.5,b:40G]"),
                ("graph_capture_record_stream_reuse", "True"),
                ("other_key", "[1,2]")
            ]
        );
        assert_eq!(w[1].reason, "CUDA graph capture is not modelled");
        let (_, w) = CachingConfig::from_env("release_lock_on_hipmalloc:False", 1 << 34).unwrap();
        assert_eq!(w[0].reason, "a locking detail: no effect on where memory goes");
        // Any string of keys, values and separators parses or is refused, never panics.
        let alphabet = [
            "max_split_size_mb",
            "roundup_power2_divisions",
            "other_key",
            "backend",
            ":",
            ",",
            "[",
            "]",
            ">",
            "20",
            "True",
            "0.5",
        ];
        let mut rng = crate::testing::SplitMix64::new(7);
        for _ in 0..20_000 {
            let n = rng.next_u64() % 9;
            let s: String = (0..n).map(|_| alphabet[(rng.next_u64() % alphabet.len() as u64) as usize]).collect();
            let _ = CachingConfig::from_env(&s, 1 << 34);
        }
        for bad in [
            "release_lock_on_cudamalloc:1",
            "pinned_num_register_threads:3",
            "pinned_reserve_segment_size_mb:0",
            "per_process_memory_fraction:1.5",
            "per_process_memory_fraction",
            "other_key:[1,2",
        ] {
            assert!(CachingConfig::from_env(bad, 1 << 34).is_err(), "{bad}");
        }
    }
}
