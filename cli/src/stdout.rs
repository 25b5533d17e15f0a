//! Standard output and standard error of the command line, whose write errors end the command instead
//! of panicking (`print!` panics on any error: `gpuheap explain F | head -1` exited 101 with a backtrace).
//!
//! * A closed pipe (`EPIPE`: the reader, such as `head`, has exited) ends the command quietly with
//!   status 141, the status a shell reports for a program ended by `SIGPIPE` as most Unix tools are
//!   (Rust ignores `SIGPIPE`, so the error arrives as `EPIPE` instead of the signal).
//! * Any other write error of standard output (`ENOSPC` on a full disk, `EBADF` on a closed descriptor)
//!   is a run-time failure: one line on standard error, exit code 1.
//! * Messages on standard error are written when they can be, never with a panic.

use std::fmt::Display;
use std::io::Write;

use gpuheap::Error;

/// A write to standard output that failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot write standard output: {0}")]
pub(crate) struct StdoutError(pub(crate) std::io::Error);

/// The exit status of a command whose standard output was closed by its reader (128 + `SIGPIPE`).
pub(crate) const BROKEN_PIPE_STATUS: u8 = 141;

/// Writes `text` to standard output and flushes it.
///
/// # Errors
/// A runtime [`Error`] holding a [`StdoutError`].
pub(crate) fn text(text: impl Display) -> Result<(), Error> {
    let mut out = std::io::stdout().lock();
    write!(out, "{text}").and_then(|()| out.flush()).map_err(|e| Error::runtime(StdoutError(e)))
}

/// Writes `line` and a newline to standard output ([`text`]).
///
/// # Errors
/// As [`text`].
pub(crate) fn line(line: impl Display) -> Result<(), Error> {
    text(format_args!("{line}\n"))
}

/// Writes `message` to standard error; a failure is ignored (there is nowhere left to report it).
pub(crate) fn err(message: impl Display) {
    let _ = write!(std::io::stderr().lock(), "{message}");
}

/// Whether `e` is a closed standard output ([module docs](self)): the command ends quietly.
pub(crate) fn is_broken_pipe(e: &Error) -> bool {
    e.get_ref().downcast_ref::<StdoutError>().is_some_and(|s| s.0.kind() == std::io::ErrorKind::BrokenPipe)
}
