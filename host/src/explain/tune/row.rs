//! The replay of one row of the search, shared by the search itself and by the pages that draw a row's
//! timeline ([`crate::html::pages`]): the recorded OOM requests tried where they failed
//! ([`crate::explain::with_oom_requests`]), events numbered as in the file through the returned map, and
//! for PyTorch rows the row's settings in place of the snapshot's.

use super::Setting;
use crate::reference::StrategyKind;
use crate::replay::{self, CompactPolicy, ReplayError, ReplayOptions, ReplayReport};
use crate::trace::{DeviceTrace, Trace};

/// The trace one row of the search replays: the recorded OOM requests tried where they failed
/// ([`crate::explain::with_oom_requests`]), events numbered as in the file through [`RowTrace::map`],
/// and for PyTorch rows the row's settings in place of the snapshot's.
#[derive(Clone, Debug)]
pub struct RowTrace {
    /// The device's trace with the OOM requests tried, and the row's settings for a PyTorch row.
    pub dev: DeviceTrace,
    /// Per event of `dev`, the index of the event of the file's trace it comes from (an inserted free
    /// maps to its `oom` event).
    pub map: Vec<usize>,
}

impl RowTrace {
    /// The trace `setting` replays of `dev`.
    pub fn new(dev: &DeviceTrace, setting: &Setting) -> Self {
        let (mut d, map) = crate::explain::with_oom_requests(dev);
        if let Setting::Pytorch { settings, .. } = setting {
            d.allocator_settings = Some(settings.clone());
        }
        RowTrace { dev: d, map }
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
        let (strategy, policy) = match setting {
            Setting::Pytorch { .. } => (StrategyKind::Caching, CompactPolicy::Never),
            Setting::CompactingCaching => (StrategyKind::Caching, CompactPolicy::OnOom),
            Setting::Host(k) => (*k, CompactPolicy::Never),
        };
        let mut opts = ReplayOptions::new(strategy);
        opts.capacity = Some(capacity);
        opts.policy = policy;
        opts.timeline_points = timeline_points;
        replay::replay(trace, &self.dev, &opts, None, &mut |_| {})
    }
}
