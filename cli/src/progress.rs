//! What the command line shows on stderr while a command runs ([`Progress`], the front door's
//! [`Observer`]): the notes before the answer, and a progress bar (indicatif) for a long replay or a
//! spinner for a settings search, hidden under `--json` or when stderr is not a terminal.

use std::io::IsTerminal;
use std::sync::Mutex;

use indicatif::{ProgressBar, ProgressStyle};

use gpuheap::Observer;

/// Replays shorter than this many events draw no bar (they finish before it is seen).
const MIN_BAR_EVENTS: u64 = 200_000;

/// The stderr [`Observer`] of the command line.
pub(crate) struct Progress {
    hidden: bool,
    bar: Mutex<Option<ProgressBar>>,
}

impl Progress {
    /// Bars hidden under `--json` (`json`) or when stderr is not a terminal; notes are written anyway.
    pub fn new(json: bool) -> Self {
        Progress { hidden: json || !std::io::stderr().is_terminal(), bar: Mutex::new(None) }
    }

    /// Runs `read` (reading `path`) under a spinner that names the file (a 10^6-event snapshot takes
    /// about a second to read), cleared when it returns.
    pub fn reading<T>(&self, path: &std::path::Path, read: impl FnOnce() -> T) -> T {
        if self.hidden {
            return read();
        }
        let pb = ProgressBar::new_spinner();
        if let Ok(style) = ProgressStyle::with_template("{spinner} reading {msg} {elapsed}") {
            pb.set_style(style);
        }
        pb.set_message(path.display().to_string());
        pb.enable_steady_tick(std::time::Duration::from_millis(100));
        let r = read();
        pb.finish_and_clear();
        r
    }

    fn with_bar(&self, f: impl FnOnce(&ProgressBar)) {
        if let Some(b) = self.bar.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            f(b);
        }
    }

    fn set_bar(&self, make: impl FnOnce() -> ProgressBar) {
        let mut b = self.bar.lock().unwrap_or_else(|p| p.into_inner());
        if b.is_none() {
            *b = Some(if self.hidden { ProgressBar::hidden() } else { make() });
        }
    }
}

impl Observer for Progress {
    fn note(&self, lines: &str) {
        super::stdout::err(lines);
    }

    fn replay_started(&self, label: &str, events: u64) {
        self.set_bar(|| {
            if events < MIN_BAR_EVENTS {
                return ProgressBar::hidden();
            }
            let pb = ProgressBar::new(events);
            if let Ok(style) = ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} events ({per_sec})") {
                pb.set_style(style.progress_chars("=> "));
            }
            pb
        });
        self.with_bar(|b| {
            b.set_length(events);
            b.set_message(label.to_string());
            b.set_position(0);
        });
    }

    fn replay_progress(&self, done: u64) {
        self.with_bar(|b| b.set_position(done));
    }

    fn search_started(&self) {
        self.set_bar(|| {
            let pb = ProgressBar::new_spinner();
            if let Ok(style) = ProgressStyle::with_template("{spinner} tune: {pos} replays ({per_sec}) {elapsed}") {
                pb.set_style(style);
            }
            pb
        });
    }

    fn search_step(&self) {
        self.with_bar(|b| b.inc(1));
    }

    fn finished(&self) {
        if let Some(b) = self.bar.lock().unwrap_or_else(|p| p.into_inner()).take() {
            b.finish_and_clear();
        }
    }
}
