//! Consistency checks of an event stream, block ids, and seeding of the state that existed before
//! recording began.

use std::collections::{BTreeMap, HashMap};

/// The address-keyed maps of the validation: foldhash (seeded per process, so a crafted file cannot
/// choose collisions) instead of SipHash, which took about 5 % of reading a 10^6-event snapshot.
type AddrMap<V> = HashMap<u64, V, foldhash::fast::RandomState>;
use std::fmt;

use super::{
    AddressKind, BlockSeed, BlockStatus, DeviceTrace, Event, EventKind, Pool, SegmentSeed, TraceFormat, NO_ID,
};

/// An inconsistency in an event stream, at event `index`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
#[doc(hidden)]
pub struct ValidationError {
    /// Index of the offending event in [`DeviceTrace::events`].
    pub index: usize,
    /// What is wrong.
    pub kind: ValidationErrorKind,
}

/// What is wrong with an event (addresses in bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
#[doc(hidden)]
pub enum ValidationErrorKind {
    /// An alloc (or segment alloc) at an address that is still allocated.
    AllocOfLiveAddress {
        /// "block" or "segment".
        what: &'static str,
        /// The address.
        addr: u64,
        /// Index of the event that allocated it; `None` if it was live before the trace began.
        since: Option<usize>,
    },
    /// A free of an address that no block (or segment) ever had.
    UnknownAddress {
        /// The event kind.
        event: EventKind,
        /// The address.
        addr: u64,
    },
    /// A free of an address that an earlier event already freed.
    DoubleFree {
        /// The event kind.
        event: EventKind,
        /// The address.
        addr: u64,
        /// Index of the earlier free.
        freed_at: usize,
    },
    /// `addr + size` does not fit in 64 bits.
    AddressOverflow {
        /// The address.
        addr: u64,
        /// The size, bytes.
        size: u64,
    },
    /// The event's id is not the one the alloc/free matching gives.
    IdMismatch {
        /// The id the matching gives.
        expected: u32,
        /// The id the event carries.
        found: u32,
    },
    /// Two initial blocks (or segments) share an address; `index` is the seed's position.
    DuplicateSeed {
        /// The address.
        addr: u64,
    },
    /// A free names a size other than its block's: an RMM `deallocate` must pass the size its `allocate`
    /// returned (`rmm::mr::device_memory_resource::deallocate`), so a different size is a caller bug, and a
    /// replay that used either size would model something that did not happen.
    FreeSizeMismatch {
        /// The block's address.
        addr: u64,
        /// The size its alloc requested, bytes.
        allocated: u64,
        /// The size the free names, bytes.
        freed: u64,
        /// Index of the alloc; `None` if the block was live before the trace began.
        alloc_at: Option<usize>,
    },
    /// The snapshot's final state lists the block (or segment) at `addr` as allocated, but event
    /// `index` freed it and no later event allocates it again.
    FinalStateConflict {
        /// "block" or "segment".
        what: &'static str,
        /// The address.
        addr: u64,
    },
}

impl ValidationErrorKind {
    /// The message, naming events as files of `format` name them (PyTorch's
    /// `free_completed` is RMM's `free`); the plain [`Display`](fmt::Display) uses PyTorch's names.
    pub fn display_in(&self, format: TraceFormat) -> impl fmt::Display + '_ {
        DisplayIn { kind: self, format }
    }
}

struct DisplayIn<'a> {
    kind: &'a ValidationErrorKind,
    format: TraceFormat,
}

impl fmt::Display for DisplayIn<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = |e: EventKind| e.name_in(self.format);
        match *self.kind {
            ValidationErrorKind::AllocOfLiveAddress { what, addr, since: Some(i) } => {
                write!(f, "{what} alloc at live address {addr:#x} (allocated by event {i} and not freed since)")
            }
            ValidationErrorKind::AllocOfLiveAddress { what, addr, since: None } => {
                write!(f, "{what} alloc at live address {addr:#x} (allocated before the trace began)")
            }
            ValidationErrorKind::UnknownAddress { event, addr } => {
                write!(f, "{} of unknown address {addr:#x} (never allocated, not in any known segment)", name(event))
            }
            ValidationErrorKind::DoubleFree { event, addr, freed_at } => {
                write!(f, "double free: {} of {addr:#x}, already freed by event {freed_at}", name(event))
            }
            ValidationErrorKind::AddressOverflow { addr, size } => {
                write!(f, "address {addr:#x} + size {size} overflows 64 bits")
            }
            ValidationErrorKind::IdMismatch { expected, found } => {
                write!(f, "event carries id {found}, but alloc/free matching gives {expected}")
            }
            ValidationErrorKind::DuplicateSeed { addr } => write!(f, "two initial blocks at address {addr:#x}"),
            ValidationErrorKind::FreeSizeMismatch { addr, allocated, freed, alloc_at } => {
                write!(f, "{} of {addr:#x} names {freed} bytes, but the block ", name(EventKind::Free))?;
                match alloc_at {
                    Some(i) => write!(f, "was allocated with {allocated} bytes by event {i}"),
                    None => write!(f, "has {allocated} bytes (allocated before the trace began)"),
                }
            }
            ValidationErrorKind::FinalStateConflict { what, addr } => write!(
                f,
                "the snapshot's final state has the {what} at {addr:#x} allocated, but this event freed it and no later \
                 event allocates it"
            ),
        }
    }
}

impl fmt::Display for ValidationErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.display_in(TraceFormat::PytorchSnapshot(super::SnapshotLayout::Recent)).fmt(f)
    }
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "event {}: {}", self.index, self.kind)
    }
}

impl std::error::Error for ValidationError {}

fn err(index: usize, kind: ValidationErrorKind) -> ValidationError {
    ValidationError { index, kind }
}

/// `addr + size` fits in 64 bits. Only for real addresses ([`AddressKind::Device`]): a
/// [`AddressKind::Handle`] (a lifetime CSV's row number) is no address, so a huge size there is a request
/// the replay reports as failing, not a range that overflows.
fn check_range(kind: AddressKind, i: usize, e: &Event) -> Result<(), ValidationError> {
    if kind == AddressKind::Device && e.addr.checked_add(e.size).is_none() {
        return Err(err(i, ValidationErrorKind::AddressOverflow { addr: e.addr, size: e.size }));
    }
    Ok(())
}

#[derive(Clone, Copy)]
struct Live {
    id: u32,
    pending: bool,
    since: Option<usize>,
}

/// Runs the alloc/free matching over `trace` starting from its initial blocks and segments
/// (seed `n` has id `n`). With `assign`, returns the id of every event; otherwise checks that the
/// ids the seeds and events carry are the ones the matching gives, and returns `None`.
fn walk(trace: &DeviceTrace, addresses: AddressKind, assign: bool) -> Result<Option<Vec<u32>>, ValidationError> {
    let mut blocks: AddrMap<Live> =
        AddrMap::with_capacity_and_hasher(trace.initial_blocks.len() + 1024, Default::default());
    let mut freed: AddrMap<usize> = AddrMap::default();
    let mut segs: AddrMap<Live> =
        AddrMap::with_capacity_and_hasher(trace.initial_segments.len() + 64, Default::default());
    let mut seg_freed: AddrMap<usize> = AddrMap::default();
    for (n, s) in trace.initial_segments.iter().enumerate() {
        let id = n as u32;
        if !assign && s.id != id {
            return Err(err(n, ValidationErrorKind::IdMismatch { expected: id, found: s.id }));
        }
        if segs.insert(s.addr, Live { id, pending: false, since: None }).is_some() {
            return Err(err(n, ValidationErrorKind::DuplicateSeed { addr: s.addr }));
        }
    }
    for (n, b) in trace.initial_blocks.iter().enumerate() {
        let id = n as u32;
        if !assign && b.id != id {
            return Err(err(n, ValidationErrorKind::IdMismatch { expected: id, found: b.id }));
        }
        if blocks.insert(b.addr, Live { id, pending: b.pending_free, since: None }).is_some() {
            return Err(err(n, ValidationErrorKind::DuplicateSeed { addr: b.addr }));
        }
    }
    let mut next_block = trace.initial_blocks.len() as u32;
    let mut next_seg = trace.initial_segments.len() as u32;
    let mut ids = if assign { Vec::with_capacity(trace.events.len()) } else { Vec::new() };
    for (i, e) in trace.events.iter().enumerate() {
        let expected = match e.kind {
            EventKind::Alloc | EventKind::SegmentAlloc => {
                check_range(addresses, i, e)?;
                let (live, gone, next, what) = if e.kind == EventKind::Alloc {
                    (&mut blocks, &mut freed, &mut next_block, "block")
                } else {
                    (&mut segs, &mut seg_freed, &mut next_seg, "segment")
                };
                if let Some(l) = live.get(&e.addr) {
                    return Err(err(i, ValidationErrorKind::AllocOfLiveAddress { what, addr: e.addr, since: l.since }));
                }
                let id = *next;
                // At most one id per event, and events are indexed by usize: 2^32 - 1 ids suffice
                // for any trace below 4 G events; beyond that the ids would wrap into NO_ID.
                *next = next.saturating_add(1);
                live.insert(e.addr, Live { id, pending: false, since: Some(i) });
                gone.remove(&e.addr);
                id
            }
            EventKind::FreeRequested | EventKind::Free | EventKind::SegmentFree => {
                let (live, gone) = if e.kind == EventKind::SegmentFree {
                    (&mut segs, &mut seg_freed)
                } else {
                    (&mut blocks, &mut freed)
                };
                let Some(l) = live.get_mut(&e.addr) else {
                    let kind = match gone.get(&e.addr) {
                        Some(&freed_at) => ValidationErrorKind::DoubleFree { event: e.kind, addr: e.addr, freed_at },
                        None => ValidationErrorKind::UnknownAddress { event: e.kind, addr: e.addr },
                    };
                    return Err(err(i, kind));
                };
                let id = l.id;
                if e.kind == EventKind::FreeRequested {
                    if l.pending {
                        let freed_at = l.since.unwrap_or(0);
                        return Err(err(i, ValidationErrorKind::DoubleFree { event: e.kind, addr: e.addr, freed_at }));
                    }
                    l.pending = true;
                    l.since = Some(i);
                } else {
                    live.remove(&e.addr);
                    gone.insert(e.addr, i);
                }
                id
            }
            EventKind::SegmentMap | EventKind::SegmentUnmap => {
                check_range(addresses, i, e)?;
                NO_ID
            }
            EventKind::Oom | EventKind::Snapshot | EventKind::Other => NO_ID,
        };
        if assign {
            ids.push(expected);
        } else if e.id != expected {
            return Err(err(i, ValidationErrorKind::IdMismatch { expected, found: e.id }));
        }
    }
    Ok(assign.then_some(ids))
}

/// Checks `trace`'s event stream, starting from its initial blocks and segments: no alloc at a
/// live address, no free of an unknown address, no double free (a second `free_requested`
/// without an alloc in between counts as one), no `addr + size` past 2^64 when `addresses` are
/// [`AddressKind::Device`] (the trace's [`Trace::addresses`](super::Trace::addresses)), and event ids equal
/// to the ones alloc/free matching gives (seed `n` has id `n`). Returns the first problem, with
/// its event index (for a problem with a seed, the seed's index in its list).
#[doc(hidden)]
pub fn validate(trace: &DeviceTrace, addresses: AddressKind) -> Result<(), ValidationError> {
    walk(trace, addresses, false).map(|_| ())
}

/// Assigns block and segment ids (seed `n` gets `n`, then one per alloc) and validates; used by
/// the readers.
pub(crate) fn assign_ids(trace: &mut DeviceTrace, addresses: AddressKind) -> Result<(), ValidationError> {
    let ids = walk(trace, addresses, true)?.unwrap_or_default();
    for (e, id) in trace.events.iter_mut().zip(ids) {
        e.id = id;
    }
    for (n, s) in trace.initial_segments.iter_mut().enumerate() {
        s.id = n as u32;
    }
    for (n, b) in trace.initial_blocks.iter_mut().enumerate() {
        b.id = n as u32;
    }
    trace.segment_ids = (trace.initial_segments.len() + trace.count(EventKind::SegmentAlloc)) as u32;
    trace.block_ids = (trace.initial_blocks.len() + trace.count(EventKind::Alloc)) as u32;
    Ok(())
}

/// Checks that every [`EventKind::Free`] of `trace` names its block's size (ids assigned, as
/// [`assign_ids`] leaves them): for formats whose frees must repeat the allocated size (RMM). Returns
/// the first mismatch, at the free's index.
pub(crate) fn check_free_sizes(trace: &DeviceTrace) -> Result<(), ValidationError> {
    let mut sizes: Vec<(u64, Option<usize>)> = vec![(0, None); trace.block_ids as usize];
    for (b, slot) in trace.initial_blocks.iter().zip(sizes.iter_mut()) {
        *slot = (b.size, None);
    }
    for (i, e) in trace.events.iter().enumerate() {
        let Some(slot) = sizes.get_mut(e.id as usize) else { continue };
        match e.kind {
            EventKind::Alloc => *slot = (e.size, Some(i)),
            EventKind::Free if e.size != slot.0 => {
                let (allocated, alloc_at) = *slot;
                return Err(err(
                    i,
                    ValidationErrorKind::FreeSizeMismatch { addr: e.addr, allocated, freed: e.size, alloc_at },
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Finds the blocks and segments that existed before the first event of `trace` and stores them
/// as its initial state:
///
/// * a `segment_free` of a segment the trace never allocated, and a `free_requested` or
///   `free_completed` of a block the trace never allocated, name something that existed before
///   recording began (the block must lie in a segment that is live at that event, unless the
///   device uses expandable segments, whose mapped ranges are not tracked);
/// * segments of the final state that no `segment_alloc` created, and active blocks of the final
///   state that no `alloc` created, existed before too.
///
/// Then assigns ids and validates.
pub(crate) fn seed_and_link(trace: &mut DeviceTrace) -> Result<(), ValidationError> {
    let expandable = trace.events.iter().any(|e| matches!(e.kind, EventKind::SegmentMap | EventKind::SegmentUnmap))
        || trace.final_state.as_ref().is_some_and(|s| s.segments.iter().any(|s| s.is_expandable));

    // 1. Segments.
    let mut seg_seeds: Vec<SegmentSeed> = Vec::new();
    let mut live: AddrMap<usize> = AddrMap::default();
    let mut gone: AddrMap<usize> = AddrMap::default();
    for (i, e) in trace.events.iter().enumerate() {
        match e.kind {
            EventKind::SegmentAlloc => {
                check_range(AddressKind::Device, i, e)?;
                if let Some(&since) = live.get(&e.addr) {
                    let kind =
                        ValidationErrorKind::AllocOfLiveAddress { what: "segment", addr: e.addr, since: Some(since) };
                    return Err(err(i, kind));
                }
                live.insert(e.addr, i);
                gone.remove(&e.addr);
            }
            EventKind::SegmentFree => {
                check_range(AddressKind::Device, i, e)?;
                if live.remove(&e.addr).is_none() {
                    if let Some(&freed_at) = gone.get(&e.addr) {
                        return Err(err(i, ValidationErrorKind::DoubleFree { event: e.kind, addr: e.addr, freed_at }));
                    }
                    seg_seeds.push(SegmentSeed {
                        id: NO_ID,
                        addr: e.addr,
                        size: e.size,
                        stream: e.stream,
                        pool: Pool::Unknown,
                        mempool: 0,
                        is_expandable: false,
                    });
                }
                gone.insert(e.addr, i);
            }
            _ => {}
        }
    }
    if let Some(fin) = &trace.final_state {
        // Expandable segments: their mapped ranges before the first event are worked out below.
        for s in fin.segments.iter().filter(|s| !s.is_expandable) {
            if live.contains_key(&s.addr) {
                continue;
            }
            if let Some(&freed_at) = gone.get(&s.addr) {
                return Err(err(freed_at, ValidationErrorKind::FinalStateConflict { what: "segment", addr: s.addr }));
            }
            seg_seeds.push(SegmentSeed {
                id: NO_ID,
                addr: s.addr,
                size: s.size,
                stream: s.stream,
                pool: s.pool,
                mempool: 0,
                is_expandable: s.is_expandable,
            });
        }
    }

    if expandable {
        seg_seeds.extend(super::expandable_initial_ranges(trace));
    }

    // 2. Blocks, with the live segment ranges alongside for the containment check.
    let mut ranges: BTreeMap<u64, u64> = seg_seeds.iter().map(|s| (s.addr, s.addr.saturating_add(s.size))).collect();
    let in_segment = |ranges: &BTreeMap<u64, u64>, addr: u64| {
        expandable || ranges.range(..=addr).next_back().is_some_and(|(_, &end)| addr < end)
    };
    let mut block_seeds: Vec<BlockSeed> = Vec::new();
    let mut live: AddrMap<(usize, bool)> = AddrMap::default();
    let mut gone: AddrMap<usize> = AddrMap::default();
    for (i, e) in trace.events.iter().enumerate() {
        match e.kind {
            EventKind::SegmentAlloc => {
                ranges.insert(e.addr, e.addr.saturating_add(e.size));
            }
            EventKind::SegmentFree => {
                ranges.remove(&e.addr);
            }
            EventKind::Alloc => {
                check_range(AddressKind::Device, i, e)?;
                if let Some(&(since, _)) = live.get(&e.addr) {
                    let kind =
                        ValidationErrorKind::AllocOfLiveAddress { what: "block", addr: e.addr, since: Some(since) };
                    return Err(err(i, kind));
                }
                live.insert(e.addr, (i, false));
                gone.remove(&e.addr);
            }
            EventKind::FreeRequested | EventKind::Free => {
                check_range(AddressKind::Device, i, e)?;
                let requested = e.kind == EventKind::FreeRequested;
                match live.get_mut(&e.addr) {
                    Some((since, pending)) => {
                        if requested {
                            if *pending {
                                let freed_at = *since;
                                return Err(err(
                                    i,
                                    ValidationErrorKind::DoubleFree { event: e.kind, addr: e.addr, freed_at },
                                ));
                            }
                            *pending = true;
                            *since = i;
                        } else {
                            live.remove(&e.addr);
                            gone.insert(e.addr, i);
                        }
                    }
                    None => {
                        if let Some(&freed_at) = gone.get(&e.addr) {
                            return Err(err(
                                i,
                                ValidationErrorKind::DoubleFree { event: e.kind, addr: e.addr, freed_at },
                            ));
                        }
                        if !in_segment(&ranges, e.addr) {
                            return Err(err(i, ValidationErrorKind::UnknownAddress { event: e.kind, addr: e.addr }));
                        }
                        // A free_completed with no free_requested in the trace: the request came
                        // before recording began.
                        block_seeds.push(BlockSeed {
                            id: NO_ID,
                            addr: e.addr,
                            size: e.size,
                            stream: e.stream,
                            pending_free: !requested,
                        });
                        if requested {
                            live.insert(e.addr, (i, true));
                        } else {
                            gone.insert(e.addr, i);
                        }
                    }
                }
            }
            _ => {}
        }
    }
    if let Some(fin) = &trace.final_state {
        for s in &fin.segments {
            for b in s.blocks.iter().filter(|b| b.state != BlockStatus::Inactive) {
                if live.contains_key(&b.addr) {
                    continue;
                }
                if let Some(&freed_at) = gone.get(&b.addr) {
                    return Err(err(freed_at, ValidationErrorKind::FinalStateConflict { what: "block", addr: b.addr }));
                }
                block_seeds.push(BlockSeed {
                    id: NO_ID,
                    addr: b.addr,
                    size: b.requested_size,
                    stream: s.stream,
                    pending_free: b.state == BlockStatus::ActivePendingFree,
                });
            }
        }
    }
    trace.initial_segments = seg_seeds;
    trace.initial_blocks = block_seeds;
    assign_ids(trace, AddressKind::Device)
}
