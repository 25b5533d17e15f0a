//! The grid of the settings search ([`grid`]): the snapshot's own `PYTORCH_CUDA_ALLOC_CONF` settings,
//! each PyTorch setting of the module docs of [`super`] applied on top of them, the caching model
//! compacting on OOM, and every host strategy.

use serde::Serialize;

use crate::reference::caching::config::{ConfigWarning, ROUNDUP_INTERVALS};
use crate::reference::caching::CachingConfig;
use crate::reference::{StrategyKind, MAX_BYTES};
use crate::trace::{AllocatorSettings, DeviceTrace, EventKind};

/// What a grid row replays.
#[derive(Clone, Debug, PartialEq)]
pub enum Setting {
    /// PyTorch's caching allocator with these settings; `env` is the `PYTORCH_CUDA_ALLOC_CONF` value
    /// that sets them ("" for the defaults).
    Pytorch {
        /// `PYTORCH_CUDA_ALLOC_CONF` value.
        env: String,
        /// The settings as the snapshot would record them.
        settings: AllocatorSettings,
    },
    /// The caching model with the snapshot's own settings, compacting (sliding blocks within their
    /// segments) when a request fails although the free bytes would hold it: what a compacting
    /// allocator would do.
    CompactingCaching,
    /// A host reference strategy over one flat range of the capacity.
    Host(StrategyKind),
}

/// The kind of a [`super::TuneRow`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
#[doc(hidden)]
pub enum RowKind {
    /// A `PYTORCH_CUDA_ALLOC_CONF` setting.
    Pytorch,
    /// The caching model with compaction on OOM.
    Compacting,
    /// A host reference strategy.
    Host,
}

impl Setting {
    /// The row label: the env value (or "defaults"/"snapshot's own"), "caching + compaction on OOM", or
    /// the strategy's name.
    #[doc(hidden)]
    pub fn label(&self) -> String {
        match self {
            Setting::Pytorch { env, .. } if env.is_empty() => "(defaults)".into(),
            Setting::Pytorch { env, .. } => env.clone(),
            Setting::CompactingCaching => "caching + compaction on OOM".into(),
            Setting::Host(k) => k.to_string(),
        }
    }

    pub(super) fn kind(&self) -> RowKind {
        match self {
            Setting::Pytorch { .. } => RowKind::Pytorch,
            Setting::CompactingCaching => RowKind::Compacting,
            Setting::Host(_) => RowKind::Host,
        }
    }
}

/// The per-process memory fraction the garbage-collection rows set: 1.0, the whole GPU. PyTorch's
/// `malloc` runs `garbage_collect_cached_blocks` only when `set_fraction &&
/// garbage_collection_threshold() > 0` (`c10/cuda/CUDACachingAllocator.cpp`; the threshold is read in
/// `c10/cuda/CUDAAllocatorConfig.cpp`, `parseGarbageCollectionThreshold`), and `set_fraction` becomes
/// true only through `setMemoryFraction` (`torch.cuda.set_per_process_memory_fraction`): without it a
/// threshold has no effect. With 1.0 the collector's limit (`threshold × allowed_memory_maximum`) is a
/// fraction of the whole GPU, and no memory is withheld.
#[doc(hidden)]
pub const GC_MEMORY_FRACTION: f64 = 1.0;

/// The configuration `settings` record (PyTorch's `CUDAAllocatorConfig` of the snapshot), for the
/// `PYTORCH_CUDA_ALLOC_CONF` strings of the grid. The device capacity is set by each replay.
pub(super) fn base_config(settings: &AllocatorSettings) -> CachingConfig {
    CachingConfig::from_settings(settings, 0).0
}

/// The snapshot's settings that [`CachingConfig::from_settings`] reads back as exactly `cfg`: the
/// `PYTORCH_CUDA_ALLOC_CONF` string alone ([`CachingConfig::to_env`]), no structured field.
fn settings_of(cfg: &CachingConfig) -> AllocatorSettings {
    AllocatorSettings { alloc_conf: Some(cfg.to_env()), ..AllocatorSettings::default() }
}

/// The `PYTORCH_CUDA_ALLOC_CONF` value of the snapshot's own settings ([`crate::explain::settings_env`]; empty
/// for PyTorch's defaults or when none are recorded).
#[doc(hidden)]
pub fn own_env(dev: &DeviceTrace) -> String {
    crate::explain::settings_env(dev).unwrap_or_default()
}

/// `max_split_size_mb` values derived from the request sizes of `dev`: the smallest whole MiB above the
/// quartiles (25, 50, 75, 100 %) of the distinct request sizes above 20 MiB (PyTorch refuses values
/// ≤ 20), without duplicates, ascending.
#[doc(hidden)]
pub fn max_split_candidates(dev: &DeviceTrace) -> Vec<u64> {
    let mib = 1u64 << 20;
    let mut sizes: Vec<u64> = dev
        .events
        .iter()
        .filter(|e| e.kind == EventKind::Alloc)
        .map(|e| e.size)
        .chain(dev.initial_blocks.iter().map(|b| b.size))
        .filter(|&s| s > 20 * mib && s <= MAX_BYTES)
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    if sizes.is_empty() {
        return Vec::new();
    }
    let mut v: Vec<u64> =
        [1usize, 2, 3, 4].iter().map(|q| sizes[(sizes.len() * q).div_ceil(4) - 1] / mib + 1).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The settings of the search for `dev` (see the module docs), PyTorch rows first, the snapshot's own
/// first of all. Every other PyTorch row is the snapshot's configuration ([`CachingConfig::from_settings`])
/// changed with the [`CachingConfig`] builders; its `env` is [`CachingConfig::to_env`] of the result, and
/// its replay reads exactly that string back. Rows whose configuration equals an earlier one are left out.
pub fn grid(dev: &DeviceTrace) -> Vec<Setting> {
    let own = dev.allocator_settings.clone().unwrap_or_default();
    let base = base_config(&own);
    let mut out = vec![Setting::Pytorch { env: base.to_env(), settings: own }];
    let mut push = |cfg: CachingConfig| {
        let env = cfg.to_env();
        if !out.iter().any(|s| matches!(s, Setting::Pytorch { env: e, .. } if *e == env)) {
            out.push(Setting::Pytorch { env, settings: settings_of(&cfg) });
        }
    };
    let gc = |c: CachingConfig, t: f64| c.gc_threshold(t).memory_fraction(Some(GC_MEMORY_FRACTION));
    push(base.expandable(true));
    let splits = max_split_candidates(dev);
    for &mb in &splits {
        push(base.max_split(mb << 20));
    }
    for d in [1u64, 2, 4, 8, 16] {
        push(base.roundup_divisions(d));
    }
    // `[256:1,512:2,1024:4,>:8]`, the example of PyTorch's documentation, as PyTorch parses it (the
    // first interval also fills those below it; `>` fills from the last named interval inclusive).
    let mut list = [1u64; ROUNDUP_INTERVALS];
    list[9] = 2;
    list[10..].iter_mut().for_each(|d| *d = 8);
    push(base.roundup_divisions_per_interval(list));
    for t in [0.6, 0.8] {
        push(gc(base, t));
    }
    push(gc(base.expandable(true), 0.8));
    if let Some(&mb) = splits.get(splits.len() / 2) {
        push(gc(base.max_split(mb << 20), 0.8));
    }
    out.push(Setting::CompactingCaching);
    out.extend(StrategyKind::ALL.iter().filter(|&&k| k != StrategyKind::Caching).map(|&k| Setting::Host(k)));
    out
}

/// The [`ConfigWarning`]s of a PyTorch row: options its settings name that the caching model does not
/// implement or that have no effect as set (a `garbage_collection_threshold` without a memory fraction).
/// Only the snapshot's own row can have any: the other rows are built from [`CachingConfig`].
#[doc(hidden)]
pub fn row_warnings(setting: &Setting) -> Vec<ConfigWarning> {
    match setting {
        Setting::Pytorch { settings, .. } => CachingConfig::from_settings(settings, 0).1,
        _ => Vec::new(),
    }
}
