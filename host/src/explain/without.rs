//! `explain --without SITE`: the what-if of a run without the tensors one piece of code allocates.
//!
//! The allocations whose stack has a frame matching a pattern ([`frame_matches`]) are taken out of the
//! device's trace with their frees (their events become [`EventKind::Other`], so that every other event
//! keeps its index; a block alive before the first event is taken out of
//! [`DeviceTrace::initial_blocks`]), and the rest is replayed through the caching model with the
//! snapshot's own settings, as `tune` replays its rows ([`super::tune::least_capacity`]): at the
//! explanation's capacity (does the OOM go away?) and in the minimum-capacity bisection, before and
//! after (how much GPU memory does the run need without them?). The recorded OOM requests are tried
//! where they failed ([`super::with_oom_requests`]), so "fits" means they are served too.

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use super::breakdown::{frame_label, is_machinery, site_of};
use super::tune::{self, RowTrace};
use super::{frames_of_block, read_frames, ExplainError, Explanation};
use crate::trace::pytorch::Frame;
use crate::trace::{DeviceTrace, EventKind, Trace, NO_ID};

/// What [`what_if_without`] reports. Bytes.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct WithoutReport {
    /// The patterns, as given.
    pub patterns: Vec<String>,
    /// Allocations taken out over the whole trace (`alloc` events, and blocks alive before the first event).
    pub allocations: usize,
    /// Their requested bytes.
    pub allocated_bytes: u64,
    /// The sites of those allocations ([`super::breakdown::site_of`]) with how many each, most first (at
    /// most [`MAX_SITES`]).
    pub sites: Vec<(String, usize)>,
    /// Of the live tensors at the explained moment, those taken out.
    pub live_tensors: usize,
    /// Their block bytes.
    pub live_bytes: u64,
    /// The capacity of the replay (the explanation's).
    pub capacity: u64,
    /// The least GPU memory that replays the whole trace as recorded (snapshot's own settings, bisection at
    /// [`tune::GRANULE`]); `None`: none up to 2^48 B.
    pub min_capacity_before: Option<u64>,
    /// The same without the allocations.
    pub min_capacity: Option<u64>,
    /// Requests that fail at `capacity` without the allocations (recorded OOM requests included).
    pub failed_at_capacity: usize,
    /// The first of them (event index in the file).
    pub first_failure: Option<usize>,
    /// `failed_at_capacity == 0`: the run fits on this GPU without them (and a recorded OOM goes away).
    pub fits: bool,
    /// The trace records an OOM.
    pub recorded_oom: bool,
}

/// How many sites a [`WithoutReport`] names.
pub const MAX_SITES: usize = 5;

/// Whether `pattern` names frame `f`: it occurs in the frame's `FILE:LINE FUNCTION` (a Python frame) or
/// in its function (a C++ frame that is not allocation machinery), and is not followed there by a digit
/// (`model.py:19` names line 19, not 195). Case-sensitive.
pub fn frame_matches(f: &Frame, pattern: &str) -> bool {
    if pattern.is_empty() {
        return false;
    }
    let label = if f.is_python() {
        frame_label(f)
    } else {
        let n = f.function();
        if is_machinery(&n) {
            return false;
        }
        n
    };
    label.match_indices(pattern).any(|(i, _)| {
        let next = label[i + pattern.len()..].chars().next();
        !next.is_some_and(|c| c.is_ascii_digit()) || !pattern.ends_with(|c: char| c.is_ascii_digit())
    })
}

/// Replays `page`'s device of `trace` without the allocations whose frames match any of `patterns`
/// (the module docs). `bytes` is the trace file's content (else it is read again, [`Trace::source`]).
///
/// # Errors
/// [`ExplainError::WithoutMatchesNothing`] (bad input) naming the first pattern no allocation matches;
/// [`ExplainError::Trace`] for a snapshot that cannot be read again; [`ExplainError::Replay`] when a
/// replay fails at run time.
pub fn what_if_without(
    trace: &Trace,
    bytes: Option<&[u8]>,
    page: &Explanation,
    patterns: &[String],
) -> Result<WithoutReport, ExplainError> {
    let dev = &trace.devices[page.device.index];
    let allocs: Vec<usize> =
        dev.events.iter().enumerate().filter(|(_, e)| e.kind == EventKind::Alloc).map(|(i, _)| i).collect();
    // The live tensors at the explained moment are among these (blocks alive before the first event, or
    // those of a dumped state, by address).
    let st_live = live_at(page, dev);
    let mut seeds: Vec<u64> = dev.initial_blocks.iter().map(|b| b.addr).collect();
    seeds.extend(st_live.iter().filter(|b| b.alloc_event.is_none()).map(|b| b.addr));
    seeds.sort_unstable();
    seeds.dedup();
    let frames = if allocs.is_empty() && seeds.is_empty() {
        Default::default()
    } else {
        read_frames(trace, bytes, dev, &allocs, &seeds)?
    };
    let matches = |f: &[Frame]| f.iter().any(|fr| patterns.iter().any(|p| frame_matches(fr, p)));
    for p in patterns {
        let hit = frames
            .events
            .iter()
            .map(|e| &e.1)
            .chain(frames.blocks.iter().map(|b| &b.1))
            .any(|f| f.iter().any(|fr| frame_matches(fr, p)));
        if !hit {
            let none = frames.events.is_empty() && frames.blocks.is_empty();
            return Err(ExplainError::WithoutMatchesNothing {
                pattern: p.clone(),
                device: dev.device,
                hint: if none { " (the file records no stack frames)" } else { "" },
            });
        }
    }
    let mut ids: HashSet<u32> = HashSet::new();
    let mut sites: HashMap<String, usize> = HashMap::new();
    let mut allocated: u128 = 0;
    for (i, f) in &frames.events {
        if matches(f) {
            let e = &dev.events[*i];
            ids.insert(e.id);
            allocated += u128::from(e.size);
            *sites.entry(site_of(f).label).or_default() += 1;
        }
    }
    let removed_seeds: HashSet<u64> = frames.blocks.iter().filter(|b| matches(&b.1)).map(|b| b.0).collect();
    for b in dev.initial_blocks.iter().filter(|b| removed_seeds.contains(&b.addr)) {
        ids.insert(b.id);
        allocated += u128::from(b.size);
        if let Some(f) = frames.blocks.iter().find(|x| x.0 == b.addr) {
            *sites.entry(site_of(&f.1).label).or_default() += 1;
        }
    }
    let without = without_blocks(dev, &ids);

    // The live tensors taken out at the explained moment.
    let (mut live_tensors, mut live_bytes) = (0usize, 0u64);
    for b in &st_live {
        if matches(frames_of_block(&frames, b)) {
            live_tensors += 1;
            live_bytes = live_bytes.saturating_add(b.size);
        }
    }

    let setting = tune::grid(dev).swap_remove(0);
    let least = |d: &DeviceTrace| -> Result<Option<u64>, ExplainError> {
        let row = RowTrace::new(d, &setting);
        let peak_live = crate::facts::peaks(d).allocated.min(crate::reference::MAX_BYTES as u128) as u64;
        Ok(tune::least_capacity(trace, &row, &setting, peak_live, page.capacity.bytes, &|| {})?.0)
    };
    let min_capacity_before = least(dev)?;
    let min_capacity = least(&without)?;
    let row = RowTrace::new(&without, &setting);
    let at = row.replay(trace, &setting, page.capacity.bytes, 1)?;
    let first_failure = at.failed.first().and_then(|f| f.event).map(|e| row.file_event(e));
    let mut sites: Vec<(String, usize)> = sites.into_iter().collect();
    sites.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    sites.truncate(MAX_SITES);
    Ok(WithoutReport {
        patterns: patterns.to_vec(),
        allocations: ids.len(),
        allocated_bytes: allocated.min(u128::from(u64::MAX)) as u64,
        sites,
        live_tensors,
        live_bytes,
        capacity: page.capacity.bytes,
        min_capacity_before,
        min_capacity,
        failed_at_capacity: at.failed.len(),
        first_failure,
        fits: at.failed.is_empty(),
        recorded_oom: !dev.ooms.is_empty(),
    })
}

/// The live blocks at `page`'s moment (none when its sums do not fit: the explanation then failed).
fn live_at(page: &Explanation, dev: &DeviceTrace) -> Vec<crate::facts::SnapshotBlock> {
    let st = match (page.moment, &dev.final_state) {
        (super::Moment::DumpedState, Some(f)) => crate::facts::final_state(f, None),
        (super::Moment::DumpedState, None) => crate::facts::state_after(dev, None),
        _ => crate::facts::state_after(dev, page.event),
    };
    st.map(|s| s.live).unwrap_or_default()
}

/// `dev` without the blocks `ids`: their events become [`EventKind::Other`] (every other event keeps its
/// index, which the recorded OOMs and releases name), they leave [`DeviceTrace::initial_blocks`], and the
/// remaining block ids are renumbered densely in their order (the replay indexes blocks by id, the
/// initial ones first).
fn without_blocks(dev: &DeviceTrace, ids: &HashSet<u32>) -> DeviceTrace {
    let mut out = dev.clone();
    let mut renumber: Vec<u32> = Vec::with_capacity(dev.block_ids as usize);
    let mut next = 0u32;
    for id in 0..dev.block_ids {
        renumber.push(if ids.contains(&id) {
            NO_ID
        } else {
            next += 1;
            next - 1
        });
    }
    let new_id = |id: u32| renumber.get(id as usize).copied().unwrap_or(NO_ID);
    for e in out.events.iter_mut().filter(|e| e.kind.is_block()) {
        e.id = new_id(e.id);
        if e.id == NO_ID {
            e.kind = EventKind::Other;
        }
    }
    out.initial_blocks.retain(|b| !ids.contains(&b.id));
    for b in out.initial_blocks.iter_mut() {
        b.id = new_id(b.id);
    }
    out.block_ids = next;
    out
}
