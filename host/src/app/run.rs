//! The four commands over a [`Snapshot`]: the device and its notes, the backends, the composition of
//! the library's layers, and the output in every form.

use super::{Observer, Options, Output, Snapshot};
use crate::backend::{Backend, BackendChoice};
use crate::explain::{self, tune};
use crate::facts;
use crate::html::{pages, HtmlReport};
use crate::reference::StrategyKind;
use crate::replay::compare::{compare, CompareOptions, Contender};
use crate::replay::{self, CompactPolicy, Refusal, ReplayError};
use crate::trace::DeviceTrace;
use crate::Error;

/// What a refused configuration of a host strategy should change, in the command line's flags.
const FLAG_ADVICE: &str = "choose another strategy with --strategy, or a larger --capacity";

/// The device `opts` names (else [`facts::choose_device`]'s), with the notes a person should see
/// first: the file's devices when it has others, and the settings the model does not replay.
fn device<'s>(snap: &'s Snapshot, opts: &Options, obs: &dyn Observer) -> Result<&'s DeviceTrace, Error> {
    let trace = snap.trace();
    let devices = facts::summarize(trace);
    let choice = facts::choose_device(trace, &devices, opts.device)?;
    if !choice.others.is_empty() {
        obs.note(&explain::devices_text(&devices, &choice));
    }
    let dev = &trace.devices[choice.index];
    let warnings = explain::settings_warnings_text(dev);
    if !warnings.is_empty() {
        obs.note(&warnings);
    }
    Ok(dev)
}

/// Without a given capacity, checks once that one can be derived from the trace (BL-23: a buffer larger
/// than any device is refused naming its line), so that every row does not repeat the error.
fn check_capacity(snap: &Snapshot, dev: &DeviceTrace, opts: &Options) -> Result<(), Error> {
    if opts.capacity.is_none() {
        replay::default_capacity(snap.trace(), dev)?;
    }
    Ok(())
}

/// The backend selected by `choice` (an error for `gpu` without a usable GPU: a run-time failure; an
/// invalid `GPUHEAP_CPU_WARPS` or `GPUHEAP_CPU_SEED`: bad input, exit code 2).
fn select(choice: BackendChoice) -> Result<Backend, Error> {
    Backend::select(choice).map_err(Error::from)
}

/// The backend for compaction measurements: none when the policy never compacts, unless a GPU was asked
/// for explicitly (so that asking for a GPU that is not there is an error rather than ignored).
fn measuring_backend(opts: &Options) -> Result<Option<Backend>, Error> {
    if opts.policy == CompactPolicy::Never && opts.backend != BackendChoice::Gpu {
        return Ok(None);
    }
    select(opts.backend).map(Some)
}

/// A host strategy's replay error, with the advice on the command line's flags when `opts` asks for it.
fn advised(e: ReplayError, opts: &Options) -> ReplayError {
    if opts.flag_advice {
        e.with_advice(FLAG_ADVICE)
    } else {
        e
    }
}

fn to_json(v: &impl serde::Serialize) -> Result<String, Error> {
    serde_json::to_string_pretty(v).map_err(|e| Error::internal(format!("cannot serialise the report: {e}")))
}

fn to_html(page: Option<HtmlReport>) -> Result<Option<String>, Error> {
    page.map(|p| p.render().map_err(|e| Error::internal(format!("cannot render the HTML report: {e}")))).transpose()
}

/// `gpuheap replay`: one strategy ([`Options::strategy`], else the format's own) over the device of the
/// trace ([`Options::device`]), with compactions measured on [`Options::backend`] when
/// [`Options::policy`] compacts.
///
/// # Errors
/// [`ErrorKind::Input`](crate::ErrorKind::Input) for a device the trace lacks, a capacity that cannot be derived or that the
/// strategy cannot use, tiers for another strategy than the tiered one; [`ErrorKind::Runtime`](crate::ErrorKind::Runtime) for a
/// backend that cannot be had, a failed compaction or check.
pub fn run_replay(snap: &Snapshot, opts: &Options, obs: &dyn Observer) -> Result<Output, Error> {
    let trace = snap.trace();
    let dev = device(snap, opts, obs)?;
    check_capacity(snap, dev, opts)?;
    let backend = measuring_backend(opts)?;
    let strategy = opts.strategy.unwrap_or_else(|| replay::default_strategy(trace));
    if opts.tiers.is_some() && strategy != StrategyKind::Tiered {
        return Err(if opts.flag_advice {
            Error::input(format!("--tiers applies to --strategy tiered, not {strategy}"))
        } else {
            ReplayError::from(Refusal::TiersNotTiered(strategy)).into()
        });
    }
    obs.replay_started(strategy.as_str(), dev.events.len() as u64);
    let r = replay::replay(trace, dev, &opts.replay_options(strategy), backend.as_ref(), &mut |n| {
        obs.replay_progress(n as u64)
    });
    obs.finished();
    let report = r.map_err(|e| advised(e, opts))?;
    let note = match (opts.strategy, opts.flag_advice) {
        (Some(_), _) => String::new(),
        (None, true) => format!(" (the default for a {}; choose another with --strategy)", trace.format),
        (None, false) => format!(" (the default for a {})", trace.format),
    };
    let title = format!("{} — {strategy}", snap.file_name());
    Ok(Output {
        json: to_json(&report)?,
        text: report.render_text(&note),
        html: to_html(opts.html.then(|| pages::replay_page(&title, &report)))?,
        title,
        tune_table: None,
        replays: vec![report],
    })
}

/// `gpuheap compare`: every host strategy, then the device allocator (on [`Options::backend`], scaled
/// above [`Options::device_heap_limit`]), over the same device; a contender that cannot take the options
/// is listed as not run, with the reason.
///
/// # Errors
/// As [`run_replay`]; [`ErrorKind::Input`](crate::ErrorKind::Input) also when no contender can run.
pub fn run_compare(snap: &Snapshot, opts: &Options, obs: &dyn Observer) -> Result<Output, Error> {
    let trace = snap.trace();
    let dev = device(snap, opts, obs)?;
    check_capacity(snap, dev, opts)?;
    let backend = measuring_backend(opts)?;
    // The device row always runs on a backend, whatever the compaction policy.
    let owned;
    let device_backend = match &backend {
        Some(b) => b,
        None => {
            owned = select(opts.backend)?;
            &owned
        }
    };
    // Built for tiered so that the tiers are kept; each row sets its own strategy.
    let copts = CompareOptions::new(opts.replay_options(StrategyKind::Tiered), opts.device_heap_limit);
    let events = dev.events.len() as u64;
    let cmp = compare(trace, dev, |c| {
        obs.replay_started(&c.name(), events);
        let mut progress = |n: usize| obs.replay_progress(n as u64);
        let r = c.replay(trace, dev, &copts, backend.as_ref(), device_backend, &mut progress);
        match c {
            Contender::Host(_) => r.map_err(|e| advised(e, opts)),
            Contender::Device => r,
        }
    });
    obs.finished();
    let cmp = cmp?;
    let demand = facts::demand_peak(dev).1;
    let title = format!("{} — all strategies", snap.file_name());
    let (json, text) = (to_json(&cmp)?, cmp.render_text(demand, opts.verbose));
    let html = to_html(opts.html.then(|| pages::compare_page(&title, &cmp, demand)))?;
    Ok(Output { title, json, text, html, tune_table: None, replays: cmp.strategies })
}

/// `gpuheap explain`: the answer page for the device of the trace ([`explain::explain_with_bytes`], the
/// stack frames read from the snapshot's bytes when kept), with the settings search when
/// [`Options::tune`] asks for it, and the what-if of [`Options::without`] when it names patterns.
///
/// # Errors
/// [`ErrorKind::Input`](crate::ErrorKind::Input) for a device the trace lacks, a capacity outside the range the strategies model,
/// sums that cannot be represented; [`ErrorKind::Runtime`](crate::ErrorKind::Runtime) when a replay fails at run time.
pub fn run_explain(snap: &Snapshot, opts: &Options, obs: &dyn Observer) -> Result<Output, Error> {
    let trace = snap.trace();
    let mut page = explain::explain_with_bytes(trace, snap.bytes(), opts.device, opts.capacity)?;
    if opts.tune {
        let dev = &trace.devices[page.device.index];
        obs.search_started();
        let t = tune::tune_cancellable(trace, dev, &page.capacity, &|| obs.search_step(), &opts.cancel);
        obs.finished();
        page.tune = Some(t?);
    }
    if !opts.without.is_empty() {
        page.without = Some(explain::what_if_without(trace, snap.bytes(), &page, &opts.without)?);
    }
    let title = format!("{} — explain", snap.file_name());
    let html = opts.html.then(|| pages::explain_page(&title, trace, &page)).transpose()?;
    Ok(Output {
        json: to_json(&page)?,
        text: page.render_text(),
        html: to_html(html)?,
        tune_table: page.tune.as_ref().map(|t| t.render_table(!page.ooms.is_empty())),
        title,
        replays: Vec::new(),
    })
}

/// `gpuheap tune`: the settings search over the device of the trace ([`tune::tune_page`]), keeping the
/// rows [`Options::settings`] names.
///
/// # Errors
/// As [`run_explain`]; [`ErrorKind::Input`](crate::ErrorKind::Input) also for a setting that is no row of the grid.
pub fn run_tune(snap: &Snapshot, opts: &Options, obs: &dyn Observer) -> Result<Output, Error> {
    let trace = snap.trace();
    obs.search_started();
    let page = tune::tune_page_cancellable(trace, opts.device, opts.capacity, &|| obs.search_step(), &opts.cancel);
    obs.finished();
    let mut page = page?;
    if let Some(s) = &opts.settings {
        page.tune.retain_settings(s)?;
    }
    let title = format!("{} — tune", snap.file_name());
    let dev = &trace.devices[page.device.index];
    let html = opts.html.then(|| pages::tune_page(&title, trace, dev, &page.tune, &page.tune.capacity)).transpose()?;
    Ok(Output {
        json: to_json(&page)?,
        text: page.render_text(),
        html: to_html(html)?,
        title,
        tune_table: None,
        replays: Vec::new(),
    })
}
