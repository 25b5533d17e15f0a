//! The tokenizer and the parser of each key of [`super::OPTIONS`]: PyTorch's `ConfigTokenizer` and one
//! `parseX` per key (`c10/core/AllocatorConfig.cpp`, `c10/cuda/CUDAAllocatorConfig.cpp`), with the same
//! checks. A parser gets the tokens and the index of the key's first value token, sets its field of the
//! [`CachingConfig`], and returns the index of the value's last token and, for a value the model reads but
//! does not follow, the reason to warn with.

use crate::reference::caching::config::{CachingConfig, ConfigError, LARGE_BUFFER, MIB, ROUNDUP_INTERVALS};

/// What a parser returns: the index of the value's last token and a reason to warn with, or the error.
pub(super) type Parsed = Result<(usize, Option<&'static str>), ConfigError>;

/// `ConfigTokenizer` (`lexArgs` before 2.9): `,` `:` `[` `]` are tokens of their own, spaces are dropped.
pub(in crate::reference::caching) fn lex(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut buf = String::new();
    for c in s.chars() {
        if matches!(c, ',' | ':' | '[' | ']') {
            if !buf.is_empty() {
                out.push(std::mem::take(&mut buf));
            }
            out.push(c.to_string());
        } else if c != ' ' {
            buf.push(c);
        }
    }
    if !buf.is_empty() {
        out.push(buf);
    }
    out
}

/// `ConfigTokenizer::skipKey`: the index of the last token of the value at `i` (a single token, or a
/// `[`…`]` list).
pub(in crate::reference::caching) fn value_end(toks: &[String], i: usize) -> Result<usize, ConfigError> {
    let key = key_of(toks, i);
    match toks.get(i).map(String::as_str) {
        None => Err(ConfigError(format!("`{key}` has no value"))),
        Some("[") => {
            (i..toks.len()).find(|&k| toks[k] == "]").ok_or_else(|| ConfigError(format!("`{key}`: missing `]`")))
        }
        Some(_) => Ok(i),
    }
}

/// The key of the value at `i` (two tokens before it: `key` `:` `value`).
fn key_of(toks: &[String], i: usize) -> &str {
    i.checked_sub(2).and_then(|k| toks.get(k)).map_or("", String::as_str)
}

/// The key of the value at `i` and the single-token value.
fn single(toks: &[String], i: usize) -> Result<(&str, &str), ConfigError> {
    let key = key_of(toks, i);
    let v = toks.get(i).ok_or_else(|| ConfigError(format!("`{key}` has no value")))?;
    Ok((key, v))
}

/// A whole number of MiB ≥ 20 (`kLargeBuffer`), in bytes (clamped as PyTorch clamps it).
fn mb(toks: &[String], i: usize) -> Result<u64, ConfigError> {
    let (key, v) = single(toks, i)?;
    let n: u64 = v.parse().map_err(|_| ConfigError(format!("`{key}` = `{v}` is not a whole number of MB")))?;
    if n < LARGE_BUFFER / MIB {
        return Err(ConfigError(format!("`{key}` = {n} is too small, must be >= 20")));
    }
    Ok(n.min(u64::MAX / MIB) * MIB)
}

/// `ConfigTokenizer::toBool`: `True` or `False`.
fn boolean(toks: &[String], i: usize) -> Result<bool, ConfigError> {
    match single(toks, i)? {
        (_, "True") => Ok(true),
        (_, "False") => Ok(false),
        (key, v) => Err(ConfigError(format!("`{key}` expects True or False, got `{v}`"))),
    }
}

/// A number (`ConfigTokenizer::toDouble`).
fn number(toks: &[String], i: usize) -> Result<f64, ConfigError> {
    let (key, v) = single(toks, i)?;
    v.parse().map_err(|_| ConfigError(format!("`{key}` = `{v}` is not a number")))
}

/// A whole number (`ConfigTokenizer::toSizeT`).
fn whole(toks: &[String], i: usize) -> Result<u64, ConfigError> {
    let (key, v) = single(toks, i)?;
    v.parse().map_err(|_| ConfigError(format!("`{key}` = `{v}` is not a whole number")))
}

pub(super) fn parse_max_split_size(t: &[String], i: usize, c: &mut CachingConfig) -> Parsed {
    c.max_split_size = mb(t, i)?;
    Ok((i, None))
}

pub(super) fn parse_max_non_split_rounding(t: &[String], i: usize, c: &mut CachingConfig) -> Parsed {
    c.max_non_split_rounding = mb(t, i)?;
    Ok((i, None))
}

/// In `(0, 1)`.
pub(super) fn parse_garbage_collection_threshold(t: &[String], i: usize, c: &mut CachingConfig) -> Parsed {
    let f = number(t, i)?;
    if !(f > 0.0 && f < 1.0) {
        return Err(ConfigError(format!("`garbage_collection_threshold` = {} is not in (0.0, 1.0)", t[i])));
    }
    c.garbage_collection_threshold = f;
    Ok((i, None))
}

/// In `[0, 1]`, as `CUDAAllocatorConfig::parsePerProcessMemoryFraction` (c10/cuda/CUDAAllocatorConfig.cpp)
/// and `torch.cuda.set_per_process_memory_fraction` check it; at 0.0 every `cudaMalloc` of the allocator
/// fails (the allowed maximum is 0 bytes).
pub(super) fn parse_per_process_memory_fraction(t: &[String], i: usize, c: &mut CachingConfig) -> Parsed {
    let f = number(t, i)?;
    if !(0.0..=1.0).contains(&f) {
        return Err(ConfigError(format!("`per_process_memory_fraction` = {} is not in [0.0, 1.0]", t[i])));
    }
    c.memory_fraction = Some(f);
    Ok((i, None))
}

pub(super) fn parse_expandable_segments(t: &[String], i: usize, c: &mut CachingConfig) -> Parsed {
    c.expandable_segments = boolean(t, i)?;
    Ok((i, None))
}

/// KiB in `[0, 16]`.
pub(super) fn parse_base_addr_aligned_kb(t: &[String], i: usize, c: &mut CachingConfig) -> Parsed {
    let kb = whole(t, i)?;
    if kb > 16 {
        return Err(ConfigError(format!("`base_addr_aligned_kb` = {kb} is above 16")));
    }
    c.base_addr_align = kb << 10;
    Ok((i, None))
}

/// `native` (the allocator modelled) or `cudaMallocAsync` (not modelled).
pub(super) fn parse_backend(t: &[String], i: usize, _: &mut CachingConfig) -> Parsed {
    match single(t, i)?.1 {
        "native" => Ok((i, Some("the native caching allocator is the one modelled"))),
        "cudaMallocAsync" => {
            Ok((i, Some("cudaMallocAsync is not modelled: the replay uses the native caching allocator")))
        }
        v => Err(ConfigError(format!("unknown allocator backend `{v}` (native or cudaMallocAsync)"))),
    }
}

/// `True` or `False`, for a key the model does not implement.
pub(super) fn parse_flag(t: &[String], i: usize, _: &mut CachingConfig) -> Parsed {
    boolean(t, i)?;
    Ok((i, None))
}

/// A power of two up to 128 (`pinned_max_register_threads`).
pub(super) fn parse_pinned_num_register_threads(t: &[String], i: usize, _: &mut CachingConfig) -> Parsed {
    let n = whole(t, i)?;
    if !n.is_power_of_two() || n > 128 {
        return Err(ConfigError(format!("`pinned_num_register_threads` = {n} is not a power of two up to 128")));
    }
    Ok((i, None))
}

/// A whole number above 0.
pub(super) fn parse_positive(t: &[String], i: usize, _: &mut CachingConfig) -> Parsed {
    if whole(t, i)? == 0 {
        return Err(ConfigError(format!("`{}` must be above 0", key_of(t, i))));
    }
    Ok((i, None))
}

/// Any value, a single token or a `[`…`]` list (PyTorch keeps its default for a value it cannot read).
pub(super) fn parse_value(t: &[String], i: usize, _: &mut CachingConfig) -> Parsed {
    Ok((value_end(t, i)?, None))
}

/// `parseRoundUpPower2Divisions` from token `i` (the value); returns the index of the last token used.
/// Quirks kept: the first `interval:div` also fills every interval below it, and `>` fills from the last
/// named interval *inclusive* (`[256:1,512:2,>:4]` sets 512 MiB to 4).
pub(super) fn parse_roundup_power2_divisions(toks: &[String], mut i: usize, cfg: &mut CachingConfig) -> Parsed {
    let d = &mut cfg.roundup_power2_divisions;
    let bad = |m: &str| ConfigError(format!("roundup_power2_divisions: {m}"));
    let num = |t: Option<&String>| -> Result<u64, ConfigError> {
        let t = t.ok_or_else(|| bad("missing value"))?;
        t.parse::<u64>().map_err(|_| bad(&format!("`{t}` is not a whole number")))
    };
    if toks.get(i).map(String::as_str) != Some("[") {
        let v = num(toks.get(i))?;
        if !v.is_power_of_two() {
            return Err(bad(&format!("divisions {v} is not a power of two")));
        }
        *d = [v; ROUNDUP_INTERVALS];
        return Ok((i, None));
    }
    let (mut first, mut last_index) = (true, 0usize);
    loop {
        i += 1;
        match toks.get(i).map(String::as_str) {
            None => return Err(bad("missing `]`")),
            Some("]") => return Ok((i, None)),
            _ => {}
        }
        let key = toks[i].clone();
        if toks.get(i + 1).map(String::as_str) != Some(":") {
            return Err(bad(&format!("expected `:` after `{key}`")));
        }
        i += 2;
        let v = num(toks.get(i))?;
        if v != 0 && !v.is_power_of_two() {
            return Err(bad(&format!("divisions {v} is not a power of two or 0")));
        }
        if key == ">" {
            d[last_index..].iter_mut().for_each(|x| *x = v);
        } else {
            let mb: u64 = key.parse().map_err(|_| bad(&format!("interval `{key}` is not a number")))?;
            if !mb.is_power_of_two() {
                return Err(bad(&format!("interval {mb} is not a power of two")));
            }
            let idx = ((63 - mb.leading_zeros()) as usize).min(ROUNDUP_INTERVALS - 1);
            if first {
                d[..idx].iter_mut().for_each(|x| *x = v);
                first = false;
            }
            d[idx] = v;
            last_index = idx;
        }
        match toks.get(i + 1).map(String::as_str) {
            Some("]") => {}
            Some(",") => i += 1,
            _ => return Err(bad("expected `,` or `]`")),
        }
    }
}

/// The shortest form that [`parse_roundup_power2_divisions`] reads back as `d`.
pub(super) fn divisions_to_env(d: &[u64; ROUNDUP_INTERVALS]) -> String {
    if d.iter().all(|&x| x == d[0]) {
        return d[0].to_string();
    }
    let lead_end = d.iter().position(|&x| x != d[0]).unwrap_or(ROUNDUP_INTERVALS) - 1;
    let tail_start = (0..ROUNDUP_INTERVALS).rev().take_while(|&i| d[i] == d[ROUNDUP_INTERVALS - 1]).last().unwrap_or(0);
    let mut items: Vec<String> = (lead_end..tail_start).map(|i| format!("{}:{}", 1u64 << i, d[i])).collect();
    items.push(format!("{}:{}", 1u64 << tail_start, d[tail_start]));
    if tail_start < ROUNDUP_INTERVALS - 1 {
        items.push(format!(">:{}", d[tail_start]));
    }
    format!("[{}]", items.join(","))
}
