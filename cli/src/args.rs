//! The arguments several commands share: [`CommandOptions`] (the flags of `replay`, `compare`,
//! `explain` and `tune`, built from the library's option table, [`gpuheap::options::OPTIONS`]: each
//! row's flag, help text and parser), [`ReplayArgs`] and [`TraceArgs`] (the outputs of `replay` and
//! `compare`, of `explain` and `tune`) and [`BackendArgs`] (the `bench`, `check` and `info` commands
//! that run kernels).

use std::path::{Path, PathBuf};

use super::output::{self, Plot};
use clap::{Arg, ArgAction, ArgMatches};
use gpuheap::backend::{Backend, BackendChoice};
use gpuheap::options::{self as table, Command, OptionRow};
use gpuheap::Error;
use gpuheap::{Options, Output};

/// The `--backend` of the commands outside the option table (`bench`, `check`): the table's row.
#[derive(clap::Args, Clone, Copy, Debug)]
pub(crate) struct BackendArgs {
    #[arg(long, value_enum, env = "GPUHEAP_BACKEND", default_value = "auto", help = backend_help())]
    pub backend: Choice,
}

/// The help of the option table's `backend` row.
fn backend_help() -> &'static str {
    table::option("backend").map_or("", |r| r.help)
}

/// `replay`, `compare`, `explain` and `tune` in [`CommandOptions`]' parameter.
pub(crate) const REPLAY: u8 = 0;
/// See [`REPLAY`].
pub(crate) const COMPARE: u8 = 1;
/// See [`REPLAY`].
pub(crate) const EXPLAIN: u8 = 2;
/// See [`REPLAY`].
pub(crate) const TUNE: u8 = 3;

/// The option table's command for [`CommandOptions`]' parameter.
const fn command(c: u8) -> Command {
    match c {
        REPLAY => Command::Replay,
        COMPARE => Command::Compare,
        EXPLAIN => Command::Explain,
        _ => Command::Tune,
    }
}

/// The flags of command `C` ([`REPLAY`] ...), one per row of the library's option table that the
/// command takes: `--KEY` (with `-` for `_`), the row's help, value name, environment variable and
/// values; a value is checked by the row's parser as clap reads it (a bad one: clap's usage error,
/// exit code 2) and then set into [`Options`]. The help text is the table's, written there only.
#[derive(Clone, Debug, Default)]
pub(crate) struct CommandOptions<const C: u8> {
    /// The options the flags set (the others at their defaults).
    pub options: Options,
}

/// The clap argument of row `r`.
fn arg_of(r: &'static OptionRow) -> Arg {
    let flag = r.flag();
    // clap's style: no period at the end of a flag's help.
    let mut a = Arg::new(r.key).long(flag[2..].to_owned()).help(r.help.strip_suffix('.').unwrap_or(r.help));
    a = match r.value {
        None => a.action(ArgAction::SetTrue),
        Some(v) => {
            let set = r.set;
            let check = move |s: &str| -> Result<String, String> {
                set(&mut Options::default(), s).map(|()| s.to_owned()).map_err(|e| e.to_string())
            };
            let a = a.value_name(v);
            let a = if r.choices.is_empty() {
                a.value_parser(check)
            } else {
                a.value_parser(clap::builder::PossibleValuesParser::new(r.choices.iter().copied()))
            };
            if r.repeated {
                a.action(ArgAction::Append)
            } else {
                a.action(ArgAction::Set)
            }
        }
    };
    if let Some(e) = r.env {
        a = a.env(e);
    }
    a
}

impl<const C: u8> clap::FromArgMatches for CommandOptions<C> {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let mut options = Options::default();
        for r in table::options_of(command(C)) {
            let values: Vec<&str> = match r.value {
                None if m.get_flag(r.key) => vec![""],
                None => Vec::new(),
                Some(_) => m.get_many::<String>(r.key).map(|v| v.map(String::as_str).collect()).unwrap_or_default(),
            };
            for v in values {
                // Checked by the same parser when clap read it.
                (r.set)(&mut options, v).map_err(|e| clap::Error::raw(clap::error::ErrorKind::ValueValidation, e))?;
            }
        }
        options.flag_advice = true;
        Ok(CommandOptions { options })
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl<const C: u8> clap::Args for CommandOptions<C> {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        table::options_of(command(C)).fold(cmd, |cmd, r| cmd.arg(arg_of(r)))
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

/// The clap mirror of [`BackendChoice`] (the library names no clap): the same values and help.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub(crate) enum Choice {
    /// The GPU when usable, else the CPU.
    Auto,
    /// The CPU backend.
    Cpu,
    /// The GPU backend (an error when no GPU is usable).
    Gpu,
}

impl From<Choice> for BackendChoice {
    fn from(c: Choice) -> Self {
        match c {
            Choice::Auto => BackendChoice::Auto,
            Choice::Cpu => BackendChoice::Cpu,
            Choice::Gpu => BackendChoice::Gpu,
        }
    }
}

impl BackendArgs {
    /// The selected backend (a run-time failure for `gpu` without a usable GPU; bad input for an invalid
    /// CPU mode or seed).
    pub fn select(&self) -> Result<Backend, Error> {
        // An invalid GPUHEAP_CPU_WARPS or GPUHEAP_CPU_SEED is bad input (exit 2), a missing GPU a run-time failure.
        Backend::select(self.backend.into()).map_err(Error::from)
    }
}

/// The outputs of `replay` and `compare`.
#[derive(Debug, clap::Args)]
pub(crate) struct ReplayArgs {
    /// Print a JSON report on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Write a timeline plot (.svg or .png).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Write a self-contained HTML report: interactive timeline, tables, parameters.
    #[arg(long)]
    pub html: Option<PathBuf>,
}

impl ReplayArgs {
    /// `options` with the HTML page asked for when `--html` is given.
    pub fn options(&self, options: &Options) -> Options {
        let mut o = options.clone();
        o.html = self.html.is_some();
        o
    }

    /// Checks the output paths before any work ([`output::check_output`]); returns the plot to write.
    pub fn check_outputs(&self, trace: &Path) -> Result<Option<Plot>, Error> {
        let plot = self.plot.as_deref().map(|p| output::check_plot(p, trace)).transpose()?;
        self.html.as_deref().map(|p| output::check_output(p, trace)).transpose()?;
        Ok(plot)
    }

    /// Writes the plot and the HTML page, then prints the JSON or the text.
    pub fn write(&self, plot: Option<Plot>, out: &Output) -> Result<(), Error> {
        if let Some(p) = plot {
            p.write(out)?;
        }
        output::finish(self.html.as_deref(), self.json, out)
    }
}

/// The arguments `gpuheap explain` and `gpuheap tune` share (flattened into each command's own).
#[derive(Debug, clap::Args)]
pub(crate) struct TraceArgs {
    /// PyTorch memory snapshot (`torch.cuda.memory._dump_snapshot`), or any trace `replay` reads.
    pub trace: PathBuf,
    /// Print a JSON report on stdout instead of the page.
    #[arg(long)]
    pub json: bool,
    /// Write a self-contained HTML report: interactive timeline, the tables, parameters.
    #[arg(long)]
    pub html: Option<PathBuf>,
}

impl TraceArgs {
    /// `options` with the HTML page asked for when `--html` is given.
    pub fn options(&self, options: &Options) -> Options {
        let mut o = options.clone();
        o.html = self.html.is_some();
        o
    }

    /// Checks the HTML path before any work ([`output::check_output`]).
    pub fn check_outputs(&self) -> Result<(), Error> {
        self.html.as_deref().map(|p| output::check_output(p, &self.trace)).transpose()?;
        Ok(())
    }

    /// Writes the HTML page, then prints the JSON or the text.
    pub fn write(&self, out: &Output) -> Result<(), Error> {
        output::finish(self.html.as_deref(), self.json, out)
    }
}
