//! Long snapshots made of real ones: a PyTorch memory snapshot whose history is repeated as a run of N
//! identical steps would record it (`gpuheap trace repeat IN OUT --steps N`).
//!
//! # What a run of N steps records
//!
//! PyTorch's caching allocator is deterministic: a step that starts from the same allocator state and
//! makes the same requests gets the same blocks at the same addresses, the same `cudaMalloc`s
//! (`segment_alloc`) and the same releases (`DeviceCachingAllocator::malloc` → `release_cached_blocks`
//! in `c10/cuda/CUDACachingAllocator.cpp`). So a recorded step can be repeated at its own addresses
//! exactly when every repeated step starts from the state the recorded one started from. The repeat
//! brings the state back between steps with events a run records at a step's end, and changes nothing
//! else:
//!
//! * **Blocks the step leaves allocated** (outputs, gradients, optimizer state it created) are freed at
//!   the end of each step but the last (`free_requested` and `free_completed`; only `free_completed` for
//!   one whose free was already requested), in the order they were allocated: the program drops what
//!   the step made before the next one.
//! * **Segments the step reserved and leaves reserved** are empty then, and are released
//!   (`segment_free`, as `torch.cuda.empty_cache()` between steps would); the next step's `segment_alloc`s
//!   re-map the same addresses, as they do for the segments the history itself allocates and frees.
//! * **Blocks allocated before the trace** that the step never frees stay allocated throughout. A step
//!   that frees one must leave a block of the same size, stream and state at the same address at its end
//!   (a steady step: the previous step's gradient is freed, the next one takes its place); a history that
//!   frees a block from before it and leaves nothing in its place covers part of a step (a ring buffer
//!   that dropped its start, recording started mid-step), and is refused: a second step would free a
//!   block that no longer exists.
//! * **Segments from before the trace that the history releases** (an `empty_cache()` at the start of the
//!   step, as the 3.26 MB training-step snapshot has) no longer exist in later steps, whose release frees
//!   the previous step's segments instead; their `segment_free` events are recorded in the first step only.
//!   Such a segment must not be used by the history before it is released (a later step would not have
//!   it).
//! * **OOM events** recur in every step (same state, same request); an OOM after the history released
//!   segments from before the trace is refused (later steps would have more memory free).
//! * Expandable segments (`segment_map`/`segment_unmap`) are refused: the ranges a step maps are not
//!   returned by the events above.
//!
//! The final state (`segments`) is the input's: the state after N steps is what the last step leaves,
//! the state after the recorded one. The state before the first event is the input's too.
//!
//! # The file
//!
//! Every key of the input is kept, in its order, with its values (`allocator_settings`, `segments` with
//! their frames, ...); `device_traces[d]` holds the N steps, each event with the keys and stack frames
//! the input gives it; `time_us` of step `k` is shifted by `k × (duration + gap)`, the duration being the
//! input's last event time minus its first (over all devices); the events between steps carry the time
//! halfway through the gap and no frames (as PyTorch records frees under `context='alloc'`), except the
//! segment releases, whose one frame is `torch/cuda/memory.py empty_cache`: a run returns to its start
//! state between steps by calling `torch.cuda.empty_cache()`, and a replay keeps program releases as
//! recorded.
//! `external_annotations` are repeated with their times shifted the same way (kept once when the events
//! have no times). The pickle is written by `PickleWriter` with CPython's opcodes and memo, so values
//! the input shares (frames, keys) are written once; `--steps 1` writes the input's bytes (for a file
//! CPython's pickler wrote, as every PyTorch snapshot is).
//!
//! [`Repeat::verify`] reads the written file back: it must read, start and end in the input's state, and
//! hold the planned events.

use std::collections::HashMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::pytorch::pickle::{self, Node, NodeId, Pickle};
use super::pytorch::pickle_write::{CopyError, MemoRef, NodeCopier, PickleWriter};
use super::{parse_trace, DeviceTrace, EventKind, Trace, TraceError, TraceFormat};

/// Options of [`Repeat::new`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RepeatOptions {
    /// Number of steps, at least 1 (1 writes the input again).
    pub steps: u32,
    /// Microseconds between the last event of a step and the first of the next, beyond the input's own
    /// duration.
    pub gap_us: u64,
}

impl RepeatOptions {
    /// `steps` steps, `gap_us` µs apart.
    pub fn new(steps: u32, gap_us: u64) -> Self {
        RepeatOptions { steps, gap_us }
    }
}

/// How a written repeat differs from its plan ([`Repeat::verify`]): a fault of this module, not of the
/// input. `Display` is one line.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
#[doc(hidden)]
pub enum VerifyError {
    /// The written file does not read back.
    #[error("the written file does not read back: {0}")]
    Unreadable(TraceError),
    /// Another number of devices was read than written.
    #[error("{written} devices written, {read} read")]
    Devices {
        /// Devices written.
        written: usize,
        /// Devices read back.
        read: usize,
    },
    /// A device's figure differs from the plan.
    #[error("device {device}: the written file differs from the plan: {what}")]
    Differs {
        /// Device ordinal.
        device: i64,
        /// What differs ("event count", "final state", ...).
        what: &'static str,
    },
}

/// Why a snapshot cannot be repeated. Every variant is a property of the input (exit code 2 from the
/// CLI, [`RepeatError::EXIT_CODE`]); `Display` is one line naming the file and, where it applies, the
/// device, address and event.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RepeatError {
    /// The input cannot be read as a trace.
    #[error(transparent)]
    Read(#[from] TraceError),
    /// The input is a trace of another format.
    #[error("{}: cannot repeat: a {format}, not a PyTorch memory snapshot", .path.display())]
    NotASnapshot {
        /// The file.
        path: PathBuf,
        /// Its format.
        format: TraceFormat,
    },
    /// `steps` is 0.
    #[error("--steps must be at least 1")]
    InvalidSteps,
    /// No device has an `alloc` event: the snapshot holds a state, not a history (history recording off,
    /// a one-entry ring buffer, a `memory_snapshot()` list).
    #[error(
        "{}: cannot repeat: no history (no device has an `alloc` event; events in the file: {events}): record it with \
         `torch.cuda.memory._record_memory_history(max_entries=...)` before the step",
        .path.display()
    )]
    NoHistory {
        /// The file.
        path: PathBuf,
        /// Events in the file, all devices.
        events: usize,
    },
    /// The device uses expandable segments.
    #[error(
        "{}: cannot repeat: device {device} uses expandable segments (`segment_map`/`segment_unmap`): repeating \
         them is not supported",
        .path.display()
    )]
    ExpandableSegments {
        /// The file.
        path: PathBuf,
        /// Device ordinal.
        device: i64,
    },
    /// The history frees a block allocated before it began and leaves no block in its place: it covers
    /// part of a step.
    #[error(
        "{}: cannot repeat: device {device}, event {event}: the history frees the block at {addr:#x} ({size} B), \
         allocated before the trace began, and leaves no block of that size and state at that address at its \
         end ({count} in all): a partial history (recording started mid-step, or the ring buffer dropped \
         its start), whose second step would free blocks that no longer exist",
        .path.display()
    )]
    SeedBlockNotRestored {
        /// The file.
        path: PathBuf,
        /// Device ordinal.
        device: i64,
        /// The first such block's address.
        addr: u64,
        /// Its requested size, bytes.
        size: u64,
        /// The event that frees it.
        event: usize,
        /// How many such blocks.
        count: usize,
    },
    /// The history requests the free of a block from before it and the free is still pending at its end.
    #[error(
        "{}: cannot repeat: device {device}, event {event}: the history requests the free of the block at \
         {addr:#x}, allocated before the trace began, and it is still pending at the end: a second step would \
         request it again",
        .path.display()
    )]
    SeedBlockPending {
        /// The file.
        path: PathBuf,
        /// Device ordinal.
        device: i64,
        /// The block's address.
        addr: u64,
        /// The `free_requested` event.
        event: usize,
    },
    /// A segment from before the trace is used by the history, then released.
    #[error(
        "{}: cannot repeat: device {device}, event {event}: a block event in the segment at {segment:#x}, which \
         existed before the trace and is released at event {released}: later steps do not have that segment",
        .path.display()
    )]
    SeedSegmentUsed {
        /// The file.
        path: PathBuf,
        /// Device ordinal.
        device: i64,
        /// The segment's address.
        segment: u64,
        /// The block event inside it.
        event: usize,
        /// The `segment_free` event.
        released: usize,
    },
    /// A block that stays allocated across steps lies in a segment that the history releases, or that
    /// is released between steps.
    #[error(
        "{}: cannot repeat: device {device}: the block at {addr:#x} stays allocated across steps but lies in the \
         segment at {segment:#x}, which {which}",
        .path.display()
    )]
    BlockInReleasedSegment {
        /// The file.
        path: PathBuf,
        /// Device ordinal.
        device: i64,
        /// The block's address.
        addr: u64,
        /// The segment's address.
        segment: u64,
        /// "the history releases" (a segment from before the trace) or "the step reserves and is released
        /// between steps".
        which: &'static str,
    },
    /// An OOM in a history that releases segments from before it.
    #[error(
        "{}: cannot repeat: device {device}, event {event}: an OOM in a history that releases segments from before \
         the trace: later steps, without those segments, would have more memory free and not fail there",
        .path.display()
    )]
    OomNotRepeatable {
        /// The file.
        path: PathBuf,
        /// Device ordinal.
        device: i64,
        /// The `oom` event.
        event: usize,
    },
    /// The output would not fit the file's or the reader's numbers.
    #[error("{}: cannot repeat {steps} times: {what}", .path.display())]
    TooLong {
        /// The file.
        path: PathBuf,
        /// Steps asked for.
        steps: u32,
        /// What overflows.
        what: String,
    },
    /// A value of the input cannot be written again.
    #[error("{}: cannot repeat: the snapshot cannot be written again: {what}", .path.display())]
    Uncopyable {
        /// The file.
        path: PathBuf,
        /// Why.
        what: String,
    },
}

impl RepeatError {
    /// Exit code a command-line tool should use for any `RepeatError` (bad input).
    #[doc(hidden)]
    pub const EXIT_CODE: i32 = 2;
}

/// One event written between steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[doc(hidden)]
pub struct BoundaryEvent {
    /// `FreeRequested`, `Free` or `SegmentFree`.
    pub kind: EventKind,
    /// Block or segment address, bytes.
    pub addr: u64,
    /// The block's requested size or the segment's size, bytes.
    pub size: u64,
    /// Stream.
    pub stream: i64,
}

/// How one device's history is repeated.
#[derive(Debug, Clone, PartialEq, Eq)]
#[doc(hidden)]
pub struct DeviceRepeat {
    /// Device ordinal.
    pub device: i64,
    /// Events of the input.
    pub events_in: usize,
    /// Events of the output: `events_in + (steps − 1) × (events_in − dropped + boundary.len())`.
    pub events_out: u64,
    /// Events written between two steps.
    pub boundary: Vec<BoundaryEvent>,
    /// Blocks allocated before the trace that the history frees and leaves in place again.
    pub steady_blocks: usize,
    /// `segment_free` events of segments from before the trace, written in the first step only.
    pub dropped: usize,
}

/// A planned repeat of one snapshot: checked by [`Repeat::new`], written by [`Repeat::write_to`].
pub struct Repeat<'t, 'a> {
    trace: &'t Trace,
    pickle: Pickle<'a>,
    steps: u32,
    /// `duration + gap`, µs; `None` when no event has a time.
    period: Option<i64>,
    /// Time of the events between step 0 and step 1 (later boundaries: plus `k × period`).
    boundary_time: i64,
    devices: Vec<DevicePlan>,
}

struct DevicePlan {
    summary: DeviceRepeat,
    /// Index of this device's list in `device_traces`.
    list: usize,
    /// The event dict nodes, one per event.
    events: Vec<NodeId>,
    /// Events written in the first step only.
    first_step_only: Vec<bool>,
    /// Template event (node) for each boundary kind: the first event of that action, else the first event.
    templates: [NodeId; 3],
}

/// The lists under the top-level `device_traces`.
fn device_trace_lists<'p>(p: &'p Pickle<'_>) -> Option<&'p [NodeId]> {
    let Node::Dict(root) = p.node(p.root) else { return None };
    let Node::List(lists) = p.node(p.get(root, "device_traces")?) else { return None };
    Some(lists)
}

fn kind_slot(kind: EventKind) -> usize {
    match kind {
        EventKind::FreeRequested => 0,
        EventKind::Free => 1,
        _ => 2,
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum St {
    Active,
    Pending,
    Dead,
}

impl<'t, 'a> Repeat<'t, 'a> {
    /// Plans `options.steps` repeats of `trace`, read from `bytes` (the file's content, as
    /// [`read_trace_and_bytes`](super::read_trace_and_bytes) returns them), and checks that the history can
    /// be repeated (see the module doc).
    ///
    /// # Errors
    /// A [`RepeatError`] naming why the snapshot cannot be repeated.
    pub fn new(trace: &'t Trace, bytes: &'a [u8], options: RepeatOptions) -> Result<Self, RepeatError> {
        let path = &trace.source;
        if options.steps == 0 {
            return Err(RepeatError::InvalidSteps);
        }
        if !matches!(trace.format, TraceFormat::PytorchSnapshot(_)) {
            return Err(RepeatError::NotASnapshot { path: path.clone(), format: trace.format });
        }
        let pickle = pickle::decode(bytes).map_err(|e| {
            RepeatError::Read(TraceError::PickleCorrupt {
                path: path.clone(),
                offset: e.offset,
                message: "the bytes are not the trace's (they do not decode)".into(),
            })
        })?;
        let no_history = || RepeatError::NoHistory { path: path.clone(), events: trace.event_count() };
        if !trace.devices.iter().any(|d| d.count(EventKind::Alloc) > 0) {
            return Err(no_history());
        }
        let lists = device_trace_lists(&pickle).ok_or_else(no_history)?;
        // Every value must be writable again: a dry run of the copy into nothing.
        let mut sink = PickleWriter::new(io::sink())
            .map_err(|e| RepeatError::Uncopyable { path: path.clone(), what: e.to_string() })?;
        NodeCopier::new(&pickle)
            .copy(&mut sink, pickle.root)
            .map_err(|e| RepeatError::Uncopyable { path: path.clone(), what: e.to_string() })?;

        let mut devices = Vec::new();
        let mut total: u64 = 0;
        for dev in trace.devices.iter().filter(|d| !d.events.is_empty()) {
            let list = usize::try_from(dev.device).ok().filter(|&l| l < lists.len()).ok_or_else(no_history)?;
            let Node::List(entries) = pickle.node(lists[list]) else { return Err(no_history()) };
            if entries.len() != dev.events.len() {
                return Err(no_history());
            }
            let plan = plan_device(path, dev, list, entries, options.steps)?;
            total = total.saturating_add(plan.summary.events_out);
            devices.push(plan);
        }
        if total > u64::from(u32::MAX) {
            return Err(RepeatError::TooLong {
                path: path.clone(),
                steps: options.steps,
                what: format!("{total} events; the reader numbers events below 2^32"),
            });
        }

        // Times: one period for all devices, so that they stay in step.
        let times = trace.devices.iter().flat_map(|d| d.events.iter().filter_map(|e| e.time_us));
        let (lo, hi) = times.fold((i64::MAX, i64::MIN), |(lo, hi), t| (lo.min(t), hi.max(t)));
        let too_long =
            |what: &str| RepeatError::TooLong { path: path.clone(), steps: options.steps, what: what.into() };
        let gap = i64::try_from(options.gap_us).map_err(|_| too_long("the gap does not fit in 64 bits"))?;
        let (period, boundary_time) = if lo <= hi {
            let period =
                hi.checked_sub(lo).and_then(|d| d.checked_add(gap)).ok_or_else(|| too_long("the period overflows"))?;
            // The last step's times (the times between steps lie below them).
            i64::from(options.steps - 1)
                .checked_mul(period)
                .and_then(|s| s.checked_add(hi))
                .ok_or_else(|| too_long("the last step's times do not fit in 64 bits"))?;
            let boundary = hi.checked_add(gap / 2).ok_or_else(|| too_long("the gap's times do not fit in 64 bits"))?;
            (Some(period), boundary)
        } else {
            (None, 0)
        };
        let r = Repeat { trace, pickle, steps: options.steps, period, boundary_time, devices };
        // Annotation times must fit too.
        if let (Some(p), Some(ann)) = (r.period, r.annotations()) {
            for &a in ann {
                if let Some(t) = r.time_of(a) {
                    if i64::from(options.steps - 1).checked_mul(p).and_then(|s| s.checked_add(t)).is_none() {
                        return Err(too_long("an annotation's time does not fit in 64 bits"));
                    }
                }
            }
        }
        Ok(r)
    }

    /// How each device with events is repeated.
    #[doc(hidden)]
    pub fn devices(&self) -> impl Iterator<Item = &DeviceRepeat> {
        self.devices.iter().map(|d| &d.summary)
    }

    /// Steps planned.
    #[doc(hidden)]
    pub fn steps(&self) -> u32 {
        self.steps
    }

    /// The shift of one step, µs (`None` when the events have no times).
    #[doc(hidden)]
    pub fn period_us(&self) -> Option<i64> {
        self.period
    }

    /// One line saying what was written: `output` (of `bytes` bytes) repeats `input` this many steps,
    /// with the step period and per device the events in and out and the frees written between steps.
    /// `gpuheap trace repeat` prints it.
    #[doc(hidden)]
    pub fn summary(&self, input: &Path, output: &Path, bytes: usize) -> String {
        let devices: Vec<String> = self
            .devices()
            .map(|d| {
                let frees = d.boundary.iter().filter(|b| b.kind != EventKind::SegmentFree).count();
                format!(
                    "device {}: {} → {} events, {} block and {} segment frees between steps{}",
                    d.device,
                    d.events_in,
                    d.events_out,
                    frees,
                    d.boundary.len() - frees,
                    if d.dropped > 0 {
                        format!(", {} segment frees in the first step only", d.dropped)
                    } else {
                        String::new()
                    }
                )
            })
            .collect();
        let period = self.period_us().map_or_else(|| "no times".to_string(), |p| format!("a step every {p} µs"));
        let steps = match self.steps() {
            1 => "1 step".to_string(),
            n => format!("{n} steps"),
        };
        format!(
            "{}: {steps} of {} ({period}; {}), {bytes} bytes",
            output.display(),
            input.display(),
            devices.join("; ")
        )
    }

    fn annotations(&self) -> Option<&[NodeId]> {
        let Node::Dict(root) = self.pickle.node(self.pickle.root) else { return None };
        match self.pickle.node(self.pickle.get(root, "external_annotations")?) {
            Node::List(l) => Some(l),
            _ => None,
        }
    }

    /// `time_us` of a dict node, if it is a number.
    fn time_of(&self, dict: NodeId) -> Option<i64> {
        let Node::Dict(d) = self.pickle.node(dict) else { return None };
        match self.pickle.node(self.pickle.get(d, "time_us")?) {
            Node::Int(v) => i64::try_from(v).ok(),
            Node::Float(f) if f.is_finite() => Some(f as i64),
            _ => None,
        }
    }

    /// Writes the repeated snapshot to `out` (a protocol-4 pickle; see the module doc) and returns `out`.
    ///
    /// # Errors
    /// The error of `out`.
    pub fn write_to<W: Write>(&self, out: W) -> io::Result<W> {
        let io_err = |e: CopyError| match e {
            CopyError::Io(kind, m) => io::Error::new(kind, m),
            // `new` copied every value once already.
            other => io::Error::other(other.to_string()),
        };
        let p = &self.pickle;
        let mut w = PickleWriter::new(out)?;
        let mut c = NodeCopier::new(p);
        let mut strs: HashMap<&'static str, MemoRef> = HashMap::new();
        let Node::Dict(root) = p.node(p.root) else { return Err(io::Error::other("not a dict")) };
        // The keys to write: each key's last pair (a key set twice has its last value, as in Python).
        let key = |k: NodeId| match p.node(k) {
            Node::Str(s) => Some(s),
            _ => None,
        };
        let keep: Vec<&(NodeId, NodeId)> = root
            .iter()
            .enumerate()
            .filter(|(i, (k, _))| key(*k).is_none() || !root[i + 1..].iter().any(|(k2, _)| key(*k2) == key(*k)))
            .map(|(_, pair)| pair)
            .collect();
        let m = w.begin_dict(keep.len())?;
        c.set_written(p.root, m);
        for &&(k, v) in &keep {
            c.copy(&mut w, k).map_err(io_err)?;
            match key(k) {
                Some(b"device_traces") => self.write_device_traces(&mut w, &mut c, &mut strs, v).map_err(io_err)?,
                Some(b"external_annotations") if self.period.is_some() && matches!(p.node(v), Node::List(_)) => {
                    self.write_annotations(&mut w, &mut c, v).map_err(io_err)?
                }
                _ => c.copy(&mut w, v).map_err(io_err)?,
            }
        }
        w.end()?;
        w.finish()
    }

    fn write_device_traces<W: Write>(
        &self,
        w: &mut PickleWriter<W>,
        c: &mut NodeCopier<'_, 'a>,
        strs: &mut HashMap<&'static str, MemoRef>,
        lists: NodeId,
    ) -> Result<(), CopyError> {
        let p = &self.pickle;
        let Node::List(lists_v) = p.node(lists) else { return c.copy(w, lists) };
        let m = w.begin_list(lists_v.len())?;
        c.set_written(lists, m);
        for (pos, &list) in lists_v.iter().enumerate() {
            let Some(plan) = self.devices.iter().find(|d| d.list == pos) else {
                c.copy(w, list)?;
                continue;
            };
            let m = w.begin_list(plan.summary.events_out as usize)?;
            c.set_written(list, m);
            for k in 0..self.steps {
                let shift = self.period.map_or(0, |p| i64::from(k) * p);
                if k > 0 {
                    let t = self.boundary_time + i64::from(k - 1) * self.period.unwrap_or(0);
                    for b in &plan.summary.boundary {
                        self.write_boundary(w, c, strs, plan.templates[kind_slot(b.kind)], b, t)?;
                    }
                }
                for (i, &e) in plan.events.iter().enumerate() {
                    if k > 0 && plan.first_step_only[i] {
                        continue;
                    }
                    self.write_shifted(w, c, e, shift)?;
                }
            }
            w.end()?;
        }
        w.end()?;
        Ok(())
    }

    fn write_annotations<W: Write>(
        &self,
        w: &mut PickleWriter<W>,
        c: &mut NodeCopier<'_, 'a>,
        list: NodeId,
    ) -> Result<(), CopyError> {
        let Node::List(items) = self.pickle.node(list) else { return c.copy(w, list) };
        let m = w.begin_list(items.len().saturating_mul(self.steps as usize))?;
        c.set_written(list, m);
        for k in 0..self.steps {
            let shift = i64::from(k) * self.period.unwrap_or(0);
            for &a in items {
                self.write_shifted(w, c, a, shift)?;
            }
        }
        w.end()?;
        Ok(())
    }

    /// Writes the dict `node` with its `time_us` plus `shift` (a dict written again for each step: not
    /// shared).
    fn write_shifted<W: Write>(
        &self,
        w: &mut PickleWriter<W>,
        c: &mut NodeCopier<'_, 'a>,
        node: NodeId,
        shift: i64,
    ) -> Result<(), CopyError> {
        let p = &self.pickle;
        let Node::Dict(pairs) = p.node(node) else { return c.copy(w, node) };
        w.begin_dict(pairs.len())?;
        for &(k, v) in pairs {
            c.copy(w, k)?;
            let is_time = matches!(p.node(k), Node::Str(s) if s == b"time_us");
            match p.node(v) {
                // Checked in `new`: the shifted times fit.
                Node::Int(t) if is_time => w.int(t + i128::from(shift))?,
                Node::Float(t) if is_time => w.float(t + shift as f64)?,
                _ => c.copy(w, v)?,
            }
        }
        w.end()?;
        Ok(())
    }

    /// Writes one boundary event with the keys of `template` (its `frames` empty, its own action, address,
    /// size, stream and time).
    fn write_boundary<W: Write>(
        &self,
        w: &mut PickleWriter<W>,
        c: &mut NodeCopier<'_, 'a>,
        strs: &mut HashMap<&'static str, MemoRef>,
        template: NodeId,
        b: &BoundaryEvent,
        time: i64,
    ) -> Result<(), CopyError> {
        let p = &self.pickle;
        let pairs: &[(NodeId, NodeId)] = match p.node(template) {
            Node::Dict(d) => d,
            _ => &[],
        };
        let name = |k: NodeId| match p.node(k) {
            Node::Str(s) => s,
            _ => b"",
        };
        let kept: Vec<(NodeId, NodeId)> = pairs.iter().copied().filter(|&(k, _)| name(k) != b"device_free").collect();
        let required = ["action", "addr", "size", "stream"];
        let missing: Vec<&'static str> =
            required.iter().copied().filter(|r| !kept.iter().any(|&(k, _)| name(k) == r.as_bytes())).collect();
        // A segment released between steps is the program's `torch.cuda.empty_cache()` (a run returns to
        // its start state only so): its one frame says so, so that a replay keeps it as recorded
        // (`reference::caching::releases`) instead of leaving it to the allocator model.
        let release = matches!(b.kind, EventKind::SegmentFree | EventKind::SegmentUnmap);
        let has_frames = kept.iter().any(|&(k, _)| name(k) == b"frames");
        let extra = usize::from(release && !has_frames);
        w.begin_dict(kept.len() + missing.len() + extra)?;
        let action = b.kind.pytorch_name();
        let mut str_of = |w: &mut PickleWriter<W>, s: &'static str| -> io::Result<()> {
            match strs.get(s) {
                Some(&m) => w.get(m),
                None => w.str(s).map(|m| {
                    strs.insert(s, m);
                }),
            }
        };
        let write_frames = |w: &mut PickleWriter<W>,
                            str_of: &mut dyn FnMut(&mut PickleWriter<W>, &'static str) -> io::Result<()>|
         -> io::Result<()> {
            if !release {
                w.begin_list(0)?;
                return w.end().map(drop);
            }
            w.begin_list(1)?;
            w.begin_dict(3)?;
            str_of(w, "filename")?;
            str_of(w, "torch/cuda/memory.py")?;
            str_of(w, "line")?;
            w.int(0)?;
            str_of(w, "name")?;
            str_of(w, "empty_cache")?;
            w.end()?;
            w.end().map(drop)
        };
        for (k, v) in kept {
            c.copy(w, k)?;
            match name(k) {
                b"action" if matches!(p.node(v), Node::Str(s) if s == action.as_bytes()) => c.copy(w, v)?,
                b"action" => str_of(w, action)?,
                b"addr" => w.int(i128::from(b.addr))?,
                b"size" => w.int(i128::from(b.size))?,
                b"stream" => w.int(i128::from(b.stream))?,
                b"time_us" if matches!(p.node(v), Node::Int(_)) => w.int(i128::from(time))?,
                b"time_us" if matches!(p.node(v), Node::Float(_)) => w.float(time as f64)?,
                b"frames" => write_frames(w, &mut str_of)?,
                _ => c.copy(w, v)?,
            }
        }
        if release && !has_frames {
            str_of(w, "frames")?;
            write_frames(w, &mut str_of)?;
        }
        for k in missing {
            str_of(w, k)?;
            match k {
                "action" => str_of(w, action)?,
                "addr" => w.int(i128::from(b.addr))?,
                "size" => w.int(i128::from(b.size))?,
                _ => w.int(i128::from(b.stream))?,
            }
        }
        w.end()?;
        Ok(())
    }

    /// Reads the written file back (`bytes`, the content of `path`) and checks it against the plan: it
    /// reads (the reader's alloc/free and final-state checks), every device starts and ends in the input's
    /// state, holds the planned events, and its times are in order where the input's are.
    ///
    /// # Errors
    /// A [`VerifyError`] saying what differs (a fault of this module, not of the input).
    #[doc(hidden)]
    pub fn verify(&self, path: &Path, bytes: &[u8]) -> Result<(), VerifyError> {
        let out = parse_trace(path, bytes).map_err(VerifyError::Unreadable)?;
        if out.devices.len() != self.trace.devices.len() {
            return Err(VerifyError::Devices { written: self.trace.devices.len(), read: out.devices.len() });
        }
        for (a, b) in self.trace.devices.iter().zip(&out.devices) {
            let d = a.device;
            let planned = self
                .devices
                .iter()
                .find(|p| p.summary.device == d)
                .map_or(a.events.len() as u64, |p| p.summary.events_out);
            let checks = [
                (b.device == d, "device ordinal"),
                (b.events.len() as u64 == planned, "event count"),
                (b.initial_blocks == a.initial_blocks, "blocks before the first event"),
                (b.initial_segments == a.initial_segments, "segments before the first event"),
                (b.final_state == a.final_state, "final state"),
                (b.allocator_settings == a.allocator_settings, "allocator settings"),
                (!in_order(a) || in_order(b), "event times in order"),
                (live_at_end(a) == live_at_end(b), "blocks allocated at the end"),
            ];
            if let Some((_, what)) = checks.iter().find(|(ok, _)| !ok) {
                return Err(VerifyError::Differs { device: d, what });
            }
        }
        Ok(())
    }
}

/// The event times of `dev` never decrease.
fn in_order(dev: &DeviceTrace) -> bool {
    let mut last = i64::MIN;
    dev.events.iter().filter_map(|e| e.time_us).all(|t| {
        let ok = t >= last;
        last = t;
        ok
    })
}

/// `(address, requested size, pending)` of every block allocated after the last event, sorted.
fn live_at_end(dev: &DeviceTrace) -> Vec<(u64, u64, bool)> {
    let mut live: Vec<Option<(u64, u64, bool)>> = vec![None; dev.block_ids as usize];
    for b in &dev.initial_blocks {
        if let Some(s) = live.get_mut(b.id as usize) {
            *s = Some((b.addr, b.size, b.pending_free));
        }
    }
    for e in &dev.events {
        let Some(s) = live.get_mut(e.id as usize) else { continue };
        match e.kind {
            EventKind::Alloc => *s = Some((e.addr, e.size, false)),
            EventKind::FreeRequested => {
                if let Some(b) = s {
                    b.2 = true;
                }
            }
            EventKind::Free => *s = None,
            _ => {}
        }
    }
    let mut v: Vec<_> = live.into_iter().flatten().collect();
    v.sort_unstable();
    v
}

/// Whether `addr` lies in one of the disjoint `ranges` (`(start, end)`, sorted by start); returns its start.
fn containing(ranges: &[(u64, u64)], addr: u64) -> Option<u64> {
    let i = ranges.partition_point(|r| r.0 <= addr);
    (i > 0 && addr < ranges[i - 1].1).then(|| ranges[i - 1].0)
}

fn plan_device(
    path: &Path,
    dev: &DeviceTrace,
    list: usize,
    entries: &[NodeId],
    steps: u32,
) -> Result<DevicePlan, RepeatError> {
    let device = dev.device;
    let path_buf = || path.to_path_buf();
    let expandable = dev.events.iter().any(|e| matches!(e.kind, EventKind::SegmentMap | EventKind::SegmentUnmap))
        || dev.final_state.as_ref().is_some_and(|s| s.segments.iter().any(|s| s.is_expandable));
    if expandable {
        return Err(RepeatError::ExpandableSegments { path: path_buf(), device });
    }
    let seeds = dev.initial_blocks.len();
    let seed_segs = dev.initial_segments.len();
    // Per block id: (address, requested size, stream), state at the end, first free event.
    let mut info: Vec<(u64, u64, i64)> = vec![(0, 0, 0); dev.block_ids as usize];
    let mut st: Vec<St> = vec![St::Active; dev.block_ids as usize];
    let mut first_free: Vec<Option<usize>> = vec![None; dev.block_ids as usize];
    for b in &dev.initial_blocks {
        info[b.id as usize] = (b.addr, b.size, b.stream);
        if b.pending_free {
            st[b.id as usize] = St::Pending;
        }
    }
    // Per segment id: (address, size, stream), reserved at the end, its `segment_free`.
    let mut seg: Vec<(u64, u64, i64)> = vec![(0, 0, 0); dev.segment_ids as usize];
    let mut seg_alive: Vec<bool> = vec![true; dev.segment_ids as usize];
    let mut seg_freed_at: Vec<Option<usize>> = vec![None; dev.segment_ids as usize];
    for s in &dev.initial_segments {
        seg[s.id as usize] = (s.addr, s.size, s.stream);
    }
    let mut first_oom = None;
    for (i, e) in dev.events.iter().enumerate() {
        let id = e.id as usize;
        match e.kind {
            EventKind::Alloc if id < st.len() => {
                info[id] = (e.addr, e.size, e.stream);
                st[id] = St::Active;
            }
            EventKind::FreeRequested if id < st.len() => {
                st[id] = St::Pending;
                first_free[id].get_or_insert(i);
            }
            EventKind::Free if id < st.len() => {
                st[id] = St::Dead;
                first_free[id].get_or_insert(i);
            }
            EventKind::SegmentAlloc if id < seg.len() => seg[id] = (e.addr, e.size, e.stream),
            EventKind::SegmentFree if id < seg.len() => {
                seg_alive[id] = false;
                seg_freed_at[id] = Some(i);
            }
            EventKind::Oom => {
                first_oom.get_or_insert(i);
            }
            _ => {}
        }
    }

    // Blocks from before the trace that the history frees must be back in place at its end.
    let survivors: HashMap<u64, usize> =
        (seeds..st.len()).filter(|&id| st[id] != St::Dead).map(|id| (info[id].0, id)).collect();
    let mut matched = vec![false; st.len()];
    let mut kept: Vec<u64> = Vec::new();
    let mut not_restored: Vec<usize> = Vec::new();
    for b in &dev.initial_blocks {
        let id = b.id as usize;
        let start = if b.pending_free { St::Pending } else { St::Active };
        match st[id] {
            s if s == start => kept.push(b.addr),
            St::Pending => {
                return Err(RepeatError::SeedBlockPending {
                    path: path_buf(),
                    device,
                    addr: b.addr,
                    event: first_free[id].unwrap_or(0),
                })
            }
            _ => match survivors.get(&b.addr) {
                Some(&a) if info[a] == info[id] && st[a] == start && !matched[a] => {
                    matched[a] = true;
                    kept.push(b.addr);
                }
                _ => not_restored.push(id),
            },
        }
    }
    if let Some(&id) = not_restored.iter().min_by_key(|&&id| first_free[id]) {
        return Err(RepeatError::SeedBlockNotRestored {
            path: path_buf(),
            device,
            addr: info[id].0,
            size: info[id].1,
            event: first_free[id].unwrap_or(0),
            count: not_restored.len(),
        });
    }

    // Segments from before the trace that the history releases (`released`), and the ones the history
    // reserves and keeps (`reserved`, released between steps).
    let mut released: Vec<(u64, u64)> = Vec::new();
    let mut released_at: Vec<(u64, usize)> = Vec::new();
    let mut first_step_only = vec![false; dev.events.len()];
    for id in 0..seed_segs {
        if let Some(i) = seg_freed_at[id] {
            let (a, s, _) = seg[id];
            released.push((a, a.saturating_add(s)));
            released_at.push((a, i));
            first_step_only[i] = true;
        }
    }
    released.sort_unstable();
    released_at.sort_unstable();
    let reserved_ids: Vec<usize> = (seed_segs..seg.len()).filter(|&id| seg_alive[id]).collect();
    let mut reserved: Vec<(u64, u64)> =
        reserved_ids.iter().map(|&id| (seg[id].0, seg[id].0.saturating_add(seg[id].1))).collect();
    reserved.sort_unstable();

    if !released.is_empty() {
        if let Some(i) = first_oom {
            return Err(RepeatError::OomNotRepeatable { path: path_buf(), device, event: i });
        }
        for (i, e) in dev.events.iter().enumerate().filter(|(_, e)| e.kind.is_block()) {
            if let Some(start) = containing(&released, e.addr) {
                let at = released_at[released_at.partition_point(|r| r.0 < start)].1;
                if i < at {
                    return Err(RepeatError::SeedSegmentUsed {
                        path: path_buf(),
                        device,
                        segment: start,
                        event: i,
                        released: at,
                    });
                }
            }
        }
    }
    for &addr in &kept {
        for (ranges, which) in
            [(&released, "the history releases"), (&reserved, "the step reserves and is released between steps")]
        {
            if let Some(segment) = containing(ranges, addr) {
                return Err(RepeatError::BlockInReleasedSegment { path: path_buf(), device, addr, segment, which });
            }
        }
    }

    // The events between two steps: the step's blocks still allocated, then its segments still reserved.
    let mut boundary = Vec::new();
    for id in seeds..st.len() {
        let (addr, size, stream) = info[id];
        match st[id] {
            St::Dead => {}
            _ if matched[id] => {}
            St::Active => {
                boundary.push(BoundaryEvent { kind: EventKind::FreeRequested, addr, size, stream });
                boundary.push(BoundaryEvent { kind: EventKind::Free, addr, size, stream });
            }
            St::Pending => boundary.push(BoundaryEvent { kind: EventKind::Free, addr, size, stream }),
        }
    }
    for &id in &reserved_ids {
        let (addr, size, stream) = seg[id];
        boundary.push(BoundaryEvent { kind: EventKind::SegmentFree, addr, size, stream });
    }

    let first_of = |k: EventKind| dev.events.iter().position(|e| e.kind == k);
    let templates = [
        entries[first_of(EventKind::FreeRequested).unwrap_or(0)],
        entries[first_of(EventKind::Free).unwrap_or(0)],
        entries[first_of(EventKind::SegmentFree).or_else(|| first_of(EventKind::SegmentAlloc)).unwrap_or(0)],
    ];
    let dropped = first_step_only.iter().filter(|&&d| d).count();
    let later = (dev.events.len() - dropped + boundary.len()) as u64;
    let events_out = (dev.events.len() as u64).saturating_add(u64::from(steps - 1).saturating_mul(later));
    Ok(DevicePlan {
        summary: DeviceRepeat {
            device,
            events_in: dev.events.len(),
            events_out,
            boundary,
            steady_blocks: matched.iter().filter(|&&m| m).count(),
            dropped,
        },
        list,
        events: entries.to_vec(),
        first_step_only,
        templates,
    })
}
