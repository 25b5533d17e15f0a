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

/// The distinct request sizes of `dev` (its `alloc` events and the blocks alive before the first),
/// ascending; sizes the model cannot represent are left out.
fn request_sizes(dev: &DeviceTrace) -> Vec<u64> {
    let mut sizes: Vec<u64> = dev
        .events
        .iter()
        .filter(|e| e.kind == EventKind::Alloc)
        .map(|e| e.size)
        .chain(dev.initial_blocks.iter().map(|b| b.size))
        .filter(|&s| s <= MAX_BYTES)
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

/// [`request_sizes`] as `cfg` rounds them (PyTorch's `round_size`: the block size that
/// `get_free_block` and `should_split` compare), distinct, ascending.
fn rounded_request_sizes(dev: &DeviceTrace, cfg: &CachingConfig) -> Vec<u64> {
    let mut sizes: Vec<u64> = request_sizes(dev).into_iter().filter_map(|s| cfg.round_size(s)).collect();
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

/// `max_split_size_mb` values where the setting changes a decision for the requests of `dev`, each
/// with why it was tried: PyTorch treats a block of `max_split_size` bytes or more as oversize
/// (`c10/cuda/CUDACachingAllocator.cpp`: `should_split` splits no such block, `get_free_block` gives one
/// to no request below `max_split_size` and to a larger request only within `kLargeBuffer`, 20 MiB, of
/// its size). A value at a request size, in whole MiB rounded down, makes that request oversize; one
/// MiB above it would not. The values are taken at the quartiles (25, 50, 75, 100 %) of the distinct
/// rounded request sizes of 21 MiB and more (PyTorch refuses values ≤ 20, `kLargeBuffer`,
/// `c10/cuda/CUDAAllocatorConfig.cpp`), without duplicates, ascending.
pub(crate) fn max_split_reasons(dev: &DeviceTrace, cfg: &CachingConfig) -> Vec<(u64, String)> {
    let mib = 1u64 << 20;
    let sizes: Vec<u64> = rounded_request_sizes(dev, cfg).into_iter().filter(|&s| s >= 21 * mib).collect();
    let mut v: Vec<(u64, String)> = Vec::new();
    for (q, name) in [(1usize, "first quartile"), (2, "median"), (3, "third quartile"), (4, "largest")] {
        let Some(&s) = (sizes.len() * q).div_ceil(4).checked_sub(1).and_then(|i| sizes.get(i)) else { continue };
        let mb = s / mib;
        if v.iter().any(|(m, _)| *m == mb) {
            continue;
        }
        let at = if sizes.len() == 1 {
            "at the only distinct request size of 21 MiB and more".to_string()
        } else {
            format!("at the {name} of the {} distinct request sizes of 21 MiB and more", sizes.len())
        };
        v.push((
            mb,
            format!(
                "{at} ({}): requests of {mb} MiB and more become oversize (PyTorch splits no such block and gives \
                 one only to a request within 20 MiB of its size)",
                crate::units::fmt_bytes(s)
            ),
        ));
    }
    v.sort_by_key(|x| x.0);
    v
}

/// `max_split_size_mb` values where the setting changes a decision for the requests of `dev` under its
/// own settings: at the quartiles of the distinct request sizes of 21 MiB and more, in whole MiB rounded
/// down (a block of `max_split_size` bytes or more is oversize in PyTorch's `get_free_block` and
/// `should_split`), without duplicates, ascending.
#[doc(hidden)]
pub fn max_split_candidates(dev: &DeviceTrace) -> Vec<u64> {
    let own = dev.allocator_settings.clone().unwrap_or_default();
    max_split_reasons(dev, &base_config(&own)).into_iter().map(|x| x.0).collect()
}

/// Why `cfg`'s rounding was tried against `base`'s: how many of the distinct request sizes of `dev` it
/// moves into another block size (PyTorch's `round_size`, `roundup_power2_next_division`), with the
/// largest such move; `None` when it moves none (the row would replay the snapshot's own decisions).
fn roundup_reason(dev: &DeviceTrace, base: &CachingConfig, cfg: &CachingConfig) -> Option<String> {
    let sizes = request_sizes(dev);
    let moved: Vec<(u64, u64, u64)> = sizes
        .iter()
        .filter_map(|&s| match (base.round_size(s), cfg.round_size(s)) {
            (Some(a), Some(b)) if a != b => Some((s, a, b)),
            _ => None,
        })
        .collect();
    let &(req, from, to) = moved.iter().max_by_key(|(_, a, b)| a.abs_diff(*b))?;
    Some(format!(
        "moves {} of the {} distinct request sizes into another block size (e.g. a {} request gets a {} block \
         instead of {})",
        moved.len(),
        sizes.len(),
        crate::units::fmt_bytes(req),
        crate::units::fmt_bytes(to),
        crate::units::fmt_bytes(from)
    ))
}

/// The settings of the search for `dev` (see the module docs), PyTorch rows first, the snapshot's own
/// first of all. Every other PyTorch row is the snapshot's configuration ([`CachingConfig::from_settings`])
/// changed with the [`CachingConfig`] builders; its `env` is [`CachingConfig::to_env`] of the result, and
/// its replay reads exactly that string back. Rows whose configuration equals an earlier one, and
/// rounding rows that move no request into another block size, are left out.
pub fn grid(dev: &DeviceTrace) -> Vec<Setting> {
    grid_with_reasons(dev).into_iter().map(|x| x.0).collect()
}

/// [`grid`] with why each row was tried (the pages print it; `None` for the snapshot's own row and
/// gpuheap's own strategies).
pub(crate) fn grid_with_reasons(dev: &DeviceTrace) -> Vec<(Setting, Option<String>)> {
    let own = dev.allocator_settings.clone().unwrap_or_default();
    let base = base_config(&own);
    let mut out = vec![(Setting::Pytorch { env: base.to_env(), settings: own }, None)];
    let mut push = |cfg: CachingConfig, why: String| {
        let env = cfg.to_env();
        if !out.iter().any(|s| matches!(&s.0, Setting::Pytorch { env: e, .. } if *e == env)) {
            out.push((Setting::Pytorch { env, settings: settings_of(&cfg) }, Some(why)));
        }
    };
    let gc = |c: CachingConfig, t: f64| c.gc_threshold(t).memory_fraction(Some(GC_MEMORY_FRACTION));
    push(
        base.expandable(true),
        "one segment per pool and stream that grows and shrinks in pages (ExpandableSegment): no hole is \
         stranded between segments"
            .into(),
    );
    let splits = max_split_reasons(dev, &base);
    for (mb, why) in &splits {
        push(base.max_split(mb << 20), why.clone());
    }
    for d in [1u64, 2, 4, 8, 16] {
        let cfg = base.roundup_divisions(d);
        if let Some(why) = roundup_reason(dev, &base, &cfg) {
            push(cfg, why);
        }
    }
    // `[256:1,512:2,1024:4,>:8]`, the example of PyTorch's documentation, as PyTorch parses it (the
    // first interval also fills those below it; `>` fills from the last named interval inclusive).
    let mut list = [1u64; ROUNDUP_INTERVALS];
    list[9] = 2;
    list[10..].iter_mut().for_each(|d| *d = 8);
    let cfg = base.roundup_divisions_per_interval(list);
    if let Some(why) = roundup_reason(dev, &base, &cfg) {
        push(cfg, format!("the example of PyTorch's documentation; {why}"));
    }
    for t in [60u32, 80] {
        push(
            gc(base, f64::from(t) / 100.0),
            format!(
                "returns the cached blocks unused the longest once reserved bytes pass {t} % of the GPU (with a \
                 memory fraction, without which PyTorch never collects)"
            ),
        );
    }
    push(gc(base.expandable(true), 0.8), "expandable segments and the 80 % collection together".into());
    if let Some((mb, _)) = splits.get(splits.len() / 2) {
        push(gc(base.max_split(mb << 20), 0.8), format!("max_split_size_mb:{mb} and the 80 % collection together"));
    }
    out.push((Setting::CompactingCaching, None));
    out.extend(StrategyKind::ALL.iter().filter(|&&k| k != StrategyKind::Caching).map(|&k| (Setting::Host(k), None)));
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
