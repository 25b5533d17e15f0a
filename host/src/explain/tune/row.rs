//! The replay of one row of the search, shared by the search itself and by the pages that draw a row's
//! timeline ([`crate::html::pages`]): the recorded OOM requests tried where they failed
//! ([`crate::explain::with_oom_requests`]), events numbered as in the file through the returned map, and
//! for PyTorch rows the row's settings in place of the snapshot's.

use super::Setting;
use crate::reference::caching::TraceScan;
use crate::reference::StrategyKind;
use crate::replay::{self, CompactPolicy, ReplayError, ReplayOptions, ReplayReport, SearchOutcome};
use crate::trace::{DeviceTrace, Trace};

/// The trace one row of the search replays: the recorded OOM requests tried where they failed
/// ([`crate::explain::with_oom_requests`]), events numbered as in the file through [`RowTrace::map`],
/// and for PyTorch rows the row's settings in place of the snapshot's.
#[derive(Clone, Debug)]
#[doc(hidden)]
pub struct RowTrace {
    /// The device's trace with the OOM requests tried, and the row's settings for a PyTorch row.
    pub dev: DeviceTrace,
    /// Per event of `dev`, the index of the event of the file's trace it comes from (an inserted free
    /// maps to its `oom` event).
    pub map: Vec<usize>,
    /// What every replay of the caching model reads from `dev`'s whole event list, made once for the
    /// row's replays ([`RowTrace::search`]).
    scan: TraceScan,
}

impl RowTrace {
    /// The trace `setting` replays of `dev`.
    pub fn new(dev: &DeviceTrace, setting: &Setting) -> Self {
        let (mut d, map) = crate::explain::with_oom_requests(dev);
        if let Setting::Pytorch { settings, .. } = setting {
            d.allocator_settings = Some(settings.clone());
        }
        let scan = TraceScan::new(&d);
        RowTrace { dev: d, map, scan }
    }

    /// The event of the file's trace that event `e` of the row trace comes from.
    pub fn file_event(&self, e: usize) -> usize {
        self.map.get(e).copied().unwrap_or(e)
    }

    /// One replay under `setting` (the one the row trace was made for) at `capacity` bytes, keeping at most
    /// `timeline_points` timeline samples (the search keeps 1; a page draws
    /// [`replay::DEFAULT_TIMELINE_POINTS`]).
    ///
    /// # Errors
    /// Those of [`replay::replay`].
    pub fn replay(
        &self,
        trace: &Trace,
        setting: &Setting,
        capacity: u64,
        timeline_points: usize,
    ) -> Result<ReplayReport, ReplayError> {
        let mut opts = Self::options(setting, capacity);
        opts.timeline_points = timeline_points;
        replay::replay(trace, &self.dev, &opts, None, &mut |_| {})
    }

    /// [`RowTrace::replay`] reduced to the peak reserved bytes and the failed requests (equal to the
    /// report's), stopping at the first failed request with `stop_at_failure`: the replays of the search.
    ///
    /// # Errors
    /// Those of [`replay::replay`].
    pub(crate) fn search(
        &self,
        trace: &Trace,
        setting: &Setting,
        capacity: u64,
        stop_at_failure: bool,
    ) -> Result<SearchOutcome, ReplayError> {
        replay::replay_search(trace, &self.dev, &Self::options(setting, capacity), &self.scan, stop_at_failure)
    }

    /// The replay options of `setting` at `capacity` bytes.
    fn options(setting: &Setting, capacity: u64) -> ReplayOptions {
        let (strategy, policy) = match setting {
            Setting::Pytorch { .. } => (StrategyKind::Caching, CompactPolicy::Never),
            Setting::CompactingCaching => (StrategyKind::Caching, CompactPolicy::OnOom),
            Setting::Host(k) => (*k, CompactPolicy::Never),
        };
        let mut opts = ReplayOptions::new(strategy);
        opts.capacity = Some(capacity);
        opts.policy = policy;
        opts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::explain::tune::{grid, GRANULE};
    use crate::trace::read_trace;

    /// The search's replays ([`RowTrace::search`]) report the peak reserved bytes and the failed requests
    /// of the full replay ([`RowTrace::replay`]) for every row of the grid, at the capacity that fails and
    /// at one that does not; stopped at the first failure, they fail exactly when the full replay does,
    /// at its first failed request.
    #[test]
    fn search_replays_report_what_the_full_replay_reports() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/decomfl_opt_zo_federated_memory.pickle");
        let trace = read_trace(&path).unwrap();
        let dev = &trace.devices[0];
        let peak = crate::facts::peaks(dev).allocated as u64;
        let mut failing = 0;
        for s in grid(dev) {
            let row = RowTrace::new(dev, &s);
            for capacity in [peak / GRANULE * GRANULE + GRANULE, 4 * peak / GRANULE * GRANULE] {
                let full = row.replay(&trace, &s, capacity, 1).unwrap();
                let lean = row.search(&trace, &s, capacity, false).unwrap();
                assert_eq!(lean.peak_reserved, full.peak_reserved, "{} at {capacity}", s.label());
                assert_eq!(lean.failed, full.failed, "{} at {capacity}", s.label());
                let stopped = row.search(&trace, &s, capacity, true).unwrap();
                assert_eq!(stopped.failed.first(), full.failed.first(), "{} at {capacity}", s.label());
                assert!(stopped.failed.len() <= 1);
                failing += usize::from(!full.failed.is_empty());
            }
        }
        assert!(failing > 0, "no row fails at the live peak: the stop at the first failure is not exercised");
    }
}
