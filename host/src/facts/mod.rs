//! What a trace records, for every caller: computed from the trace itself, with no model of an
//! allocator. The replay, the answers (`explain`, `tune`), the HTML pages and every front end take
//! these facts from here, so each has one definition.
//!
//! * `devices`: per device, events, peaks and recorded OOMs ([`summarize`]), and the device a report
//!   is about ([`choose_device`]);
//! * `peaks`: the demand and reserved peaks ([`peaks()`]) and PyTorch's own reserved bytes
//!   over the trace ([`pytorch_series`]), in one walk with one arithmetic;
//! * `capacity`: the GPU's memory from the evidence ([`Capacity`] with its typed [`CapacitySource`]);
//! * `history`: how complete each device's history is, what that costs, and the ratios that must
//!   not be computed from what is missing;
//! * `state`: PyTorch's allocator state at one moment (segments, live blocks, holes; per memory pool);
//! * `bounds`: which requests a state would have served, per memory pool.
//!
//! This layer sits on `trace` and on the rules of `reference` it quotes (PyTorch's block rounding, the
//! largest device modelled); `replay` and everything above it use it, never the reverse.
//!
//! ```
//! let trace = gpuheap::trace::read_trace(concat!(env!("CARGO_MANIFEST_DIR"), "/../data/equivariant-posteriors_oom_snapshot_new.pickle"))?;
//! let p = gpuheap::facts::peaks(&trace.devices[0]);
//! assert!(p.reserved >= p.allocated, "PyTorch reserves at least what it allocates");
//! # Ok::<(), gpuheap::trace::TraceError>(())
//! ```

pub(crate) mod bounds;
pub(crate) mod capacity;
pub(crate) mod devices;
pub(crate) mod history;
pub(crate) mod peaks;
pub(crate) mod state;

pub use bounds::{request_bounds, usable_holes, RequestBounds};
pub use capacity::{
    capacity_from_evidence, check_capacity, gpu_capacity_at_oom, oom_capacity, Capacity, CapacityRangeError,
    CapacitySource, MIN_CAPACITY,
};
pub use devices::{choose_device, summarize, DeviceChoice, DeviceError, DeviceReason, DeviceSummary};
pub use history::{
    blocks_outside_segments, history_completeness, pytorch_ratios, BlockOutsideSegments, History, HistoryCompleteness,
    HistoryCost,
};
pub use peaks::{demand_peak, peaks, pytorch_series, Peaks, PytorchReserved};
pub use state::{final_state, state_after, HeapState, Hole, PoolState, SegmentView, SnapshotBlock, StateError};
