//! How complete a device's recorded history is, and what that costs the answer
//! ([`history_completeness`]); the figures that must not be computed from what is missing
//! ([`pytorch_ratios`]); and live blocks the history contradicts (a block alive at its end that no segment
//! of the final state holds).
//!
//! PyTorch keeps the history (`device_traces`) in a ring buffer of `max_entries` entries
//! (`c10/cuda/CUDACachingAllocator.cpp`, `RingBuffer`; `torch/csrc/cuda/memory_snapshot.cpp`,
//! `_record_memory_history`). Its size is 1 unless recording was asked for with `enabled="all"`: the
//! current API sets `max_entries = (enabled == "all") ? max_entries : 1` (so `enabled="state"` keeps one),
//! and the legacy call `_record_memory_history(enabled=True)` passes `trace_alloc_max_entries`, whose
//! default is 1. Such a file holds the last action only: its one event says nothing of the run, and only
//! the dumped state (`segments`) is complete. A buffer that wrapped lost its oldest entries; since PyTorch
//! PR#179276 (2026) the snapshot says so (`allocator_settings`: `trace_alloc_overflowed`,
//! `trace_alloc_max_entries`), and older files show it only as a history exactly `max_entries` long. Since
//! PR#168183 (2025) actions can be left out (`skip_actions`). The segments are never affected: the
//! final state is always complete (`torch/utils/viz/process_alloc_data.js`).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::trace::{DeviceTrace, EventKind};

/// What the history of a device holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
#[doc(hidden)]
pub enum History {
    /// No entry: history was not recorded (or the file is a bare list of segments).
    None,
    /// One entry in a snapshot: a ring buffer of one entry (the legacy
    /// `_record_memory_history(enabled=True)`, or `enabled="state"`), which keeps the last action only.
    OneEntry,
    /// The ring buffer wrapped: entries before the first one kept are lost.
    Overflowed {
        /// The buffer's size in entries, when recorded.
        max_entries: Option<u64>,
        /// `true`: the file says so (`trace_alloc_overflowed`); `false`: inferred, the history being
        /// exactly `max_entries` long.
        recorded: bool,
    },
    /// Every entry since recording began, as far as the file says.
    Complete,
}

/// What a partial history costs the answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
#[doc(hidden)]
pub enum HistoryCost {
    /// Only the dumped state is known: no peak over time, no timeline, no replay of the run's requests;
    /// the answer describes the final state and which requests it would have served.
    OnlyFinalState,
    /// Only the last entries are known: peaks, OOMs and the timeline are those of the recorded window (a
    /// lower bound of the run's), and blocks and segments alive at its start come from the final state.
    RecordedWindowOnly,
    /// `alloc` or `free_completed` entries were skipped: live bytes over time are unknown (no demand peak,
    /// no utilisation, no replay of requests).
    LiveBytesUnknown,
    /// `segment_alloc`, `segment_free`, `segment_map` or `segment_unmap` entries were skipped: PyTorch's
    /// reserved bytes over time are unknown (only the final state's are).
    ReservedBytesUnknown,
    /// `oom` entries were skipped: an OOM may have happened unrecorded.
    OomsMayBeMissing,
}

/// A block the history leaves alive at its end that no segment of the final state holds: the history
/// and the final state disagree (bad input, or entries missing). Bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[doc(hidden)]
pub struct BlockOutsideSegments {
    /// Its address.
    pub addr: u64,
    /// Requested bytes.
    pub size: u64,
    /// The `alloc` event that created it (`None`: alive before the first event).
    pub alloc_event: Option<usize>,
}

impl std::fmt::Display for BlockOutsideSegments {
    /// One line naming the block: `block at 0x… (64.00 MiB, allocated at event 0) is live at the end of the
    /// history but lies in no segment of the snapshot's final state`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = self
            .alloc_event
            .map_or_else(|| "alive before the first event".into(), |e| format!("allocated at event {e}"));
        write!(
            f,
            "block at {:#x} ({}, {at}) is live at the end of the history but lies in no segment of the snapshot's \
             final state: the history and the final state disagree",
            self.addr,
            crate::units::fmt_bytes(self.size)
        )
    }
}

/// How complete one device's history is, and what it costs ([`history_completeness`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct HistoryCompleteness {
    /// Device ordinal.
    pub device: i64,
    /// Entries recorded.
    pub entries: usize,
    /// What they are.
    pub history: History,
    /// Actions the recording left out (`skip_actions`), as the file names them.
    pub skipped_actions: Vec<String>,
    /// What the answer cannot say because of it (empty: nothing).
    pub costs: Vec<HistoryCost>,
    /// Live blocks the history contradicts: alive at its end, in no segment of the final state.
    pub blocks_outside_segments: Vec<BlockOutsideSegments>,
}

impl HistoryCompleteness {
    /// Whether nothing is missing and nothing contradicts the final state.
    #[doc(hidden)]
    pub fn is_complete(&self) -> bool {
        self.history == History::Complete && self.costs.is_empty() && self.blocks_outside_segments.is_empty()
    }

    /// Whether the history holds no moment but the dumped state (no history, or one entry).
    #[doc(hidden)]
    pub fn only_final_state(&self) -> bool {
        self.costs.contains(&HistoryCost::OnlyFinalState)
    }

    /// Whether the history's moments can be described: not when it holds no moment but the dumped state,
    /// nor when allocs, frees or segment events were skipped (the state after an event would be computed
    /// from what is missing). Where not, only the final state is described.
    #[doc(hidden)]
    pub fn moments_known(&self) -> bool {
        !self.only_final_state() && self.live_bytes_known() && self.reserved_bytes_known()
    }

    /// Whether live bytes over time are known (figures from them may be computed).
    #[doc(hidden)]
    pub fn live_bytes_known(&self) -> bool {
        !self.costs.contains(&HistoryCost::LiveBytesUnknown)
    }

    /// Whether PyTorch's reserved bytes over time are known.
    #[doc(hidden)]
    pub fn reserved_bytes_known(&self) -> bool {
        !self.costs.contains(&HistoryCost::ReservedBytesUnknown)
    }
}

/// The actions whose absence leaves live bytes unknown, and reserved bytes unknown.
const LIVE_ACTIONS: [&str; 2] = ["alloc", "free_completed"];
const SEGMENT_ACTIONS: [&str; 4] = ["segment_alloc", "segment_free", "segment_map", "segment_unmap"];

/// How complete `dev`'s history is (see the module docs).
#[doc(hidden)]
pub fn history_completeness(dev: &DeviceTrace) -> HistoryCompleteness {
    let entries = dev.events.len();
    let rec = &dev.recording;
    let history = if entries == 0 {
        History::None
    } else if rec.overflowed == Some(true) {
        History::Overflowed { max_entries: rec.max_entries, recorded: true }
    } else if entries == 1 && dev.final_state.is_some() && rec.max_entries.is_none_or(|m| m <= 1) {
        // (Only a snapshot has a ring buffer and a dumped state; a one-line log is a history.)
        History::OneEntry
    } else if rec.overflowed.is_none() && rec.max_entries.is_some_and(|m| m > 1 && entries as u64 >= m) {
        History::Overflowed { max_entries: rec.max_entries, recorded: false }
    } else {
        History::Complete
    };
    let skipped_actions = rec.skip_actions.clone().unwrap_or_default();
    let mut costs = Vec::new();
    match history {
        History::None | History::OneEntry => costs.push(HistoryCost::OnlyFinalState),
        History::Overflowed { .. } => costs.push(HistoryCost::RecordedWindowOnly),
        History::Complete => {}
    }
    let skipped = |names: &[&str]| skipped_actions.iter().any(|a| names.contains(&a.as_str()));
    if entries > 1 {
        if skipped(&LIVE_ACTIONS) {
            costs.push(HistoryCost::LiveBytesUnknown);
        }
        if skipped(&SEGMENT_ACTIONS) {
            costs.push(HistoryCost::ReservedBytesUnknown);
        }
        if skipped(&["oom"]) {
            costs.push(HistoryCost::OomsMayBeMissing);
        }
    }
    HistoryCompleteness {
        device: dev.device,
        entries,
        history,
        skipped_actions,
        costs,
        blocks_outside_segments: blocks_outside_segments(dev),
    }
}

/// The blocks alive at the end of `dev`'s history that no segment of its final state holds (none
/// without a final state). Alive at the end: the blocks alive before the first event plus `alloc`, minus
/// `free_completed`.
#[doc(hidden)]
pub fn blocks_outside_segments(dev: &DeviceTrace) -> Vec<BlockOutsideSegments> {
    let Some(fin) = &dev.final_state else { return Vec::new() };
    let segs: BTreeMap<u64, u64> = fin.segments.iter().map(|s| (s.addr, s.addr.saturating_add(s.size))).collect();
    let held = |addr: u64| segs.range(..=addr).next_back().is_some_and(|(_, &end)| addr < end);
    let mut alive: Vec<Option<BlockOutsideSegments>> = vec![None; dev.block_ids as usize];
    for b in &dev.initial_blocks {
        if let Some(x) = alive.get_mut(b.id as usize) {
            *x = Some(BlockOutsideSegments { addr: b.addr, size: b.size, alloc_event: None });
        }
    }
    for (i, e) in dev.events.iter().enumerate() {
        match e.kind {
            EventKind::Alloc => {
                if let Some(x) = alive.get_mut(e.id as usize) {
                    *x = Some(BlockOutsideSegments { addr: e.addr, size: e.size, alloc_event: Some(i) });
                }
            }
            EventKind::Free => {
                if let Some(x) = alive.get_mut(e.id as usize) {
                    *x = None;
                }
            }
            _ => {}
        }
    }
    let mut out: Vec<BlockOutsideSegments> = alive.into_iter().flatten().filter(|b| !held(b.addr)).collect();
    out.sort_unstable_by_key(|b| b.addr);
    out
}

/// PyTorch's utilisation `demand / peak reserved` and Johnstone–Wilson #4 `(peak reserved − demand) /
/// demand` from a trace's demand peak and PyTorch's reserved peak (bytes), or `None` for each where it
/// would be computed from what is missing: no live bytes or no reserved bytes known (`history`), nothing
/// reserved or demanded, or a demand above the reserved bytes (PyTorch never holds more live bytes than it
/// reserved: such a pair shows entries are missing, and gave utilisation above 100 % and a negative
/// ratio).
#[doc(hidden)]
pub fn pytorch_ratios(demand: u64, reserved: u64, history: &HistoryCompleteness) -> (Option<f64>, Option<f64>) {
    if !history.live_bytes_known() || !history.reserved_bytes_known() || demand > reserved {
        return (None, None);
    }
    let util = (reserved > 0).then(|| demand as f64 / reserved as f64);
    let jw = (demand > 0).then(|| (reserved - demand) as f64 / demand as f64);
    (util, jw)
}
