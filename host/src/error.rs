//! The one error type of the front door ([`crate::app`], the command line, the Python package):
//! [`Error`], of an [`ErrorKind`] every front end maps once, with the layer's own error kept as its
//! source.
//!
//! `Display` is the layer's message, one line, with every control character escaped
//! ([`escape_controls`]): a NUL, an escape sequence or a newline in a file name or an option's value is
//! printed as `\0`, `\u{1b}`, `\n`, never raw, whichever layer put the value in its message.

use std::borrow::Cow;
use std::fmt;

use crate::backend::BackendError;
use crate::explain::ExplainError;
use crate::facts::{CapacityRangeError, DeviceError};
use crate::replay::{PolicyError, ReplayError};
use crate::trace::TraceError;
use crate::units::ParseError;

/// What kind of failure an [`Error`] is (see there).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Bad input (exit code 2).
    Input,
    /// A run-time failure (exit code 1).
    Runtime,
    /// A bug in gpuheap (exit code 1).
    Internal,
    /// The caller cancelled the command ([`crate::Cancel`]; exit code 130, as after Ctrl-C).
    Cancelled,
}

/// A failure at the front door: its [`ErrorKind`] and the error of the layer that failed. `Display` is
/// the layer's message, one line.
///
/// | kind | means | command line | Python |
/// |---|---|---|---|
/// | [`ErrorKind::Input`] | bad input: a trace that cannot be read, an option that does not fit it | exit code 2 | `gpuheap.TraceError` (the trace, [`Error::is_trace`]) or `gpuheap.ConfigError` |
/// | [`ErrorKind::Runtime`] | a run-time failure: a kernel, the driver, a failed check of a result | exit code 1 | `gpuheap.BackendError` |
/// | [`ErrorKind::Internal`] | a bug in gpuheap (a report that cannot be serialised) | exit code 1 | `gpuheap.InternalError` |
/// | [`ErrorKind::Cancelled`] | the caller cancelled the command ([`crate::Cancel`]) | exit code 130 | `KeyboardInterrupt` (Ctrl-C) |
#[derive(Debug)]
#[non_exhaustive]
pub struct Error {
    kind: ErrorKind,
    source: Box<dyn std::error::Error + Send + Sync + 'static>,
}

impl Error {
    /// An error of `kind` with `source` (any error, or a message).
    #[doc(hidden)]
    pub fn new(kind: ErrorKind, source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        Error { kind, source: source.into() }
    }

    /// Bad input.
    #[doc(hidden)]
    pub fn input(source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        Error::new(ErrorKind::Input, source)
    }

    /// A run-time failure.
    #[doc(hidden)]
    pub fn runtime(source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        Error::new(ErrorKind::Runtime, source)
    }

    /// A bug in gpuheap.
    #[doc(hidden)]
    pub fn internal(source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        Error::new(ErrorKind::Internal, source)
    }

    /// Its kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The command line's exit code: 2 for bad input, 130 when cancelled (as after Ctrl-C), 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self.kind {
            ErrorKind::Input => 2,
            ErrorKind::Cancelled => 130,
            ErrorKind::Runtime | ErrorKind::Internal => 1,
        }
    }

    /// `true` when the trace itself cannot be read or used, rather than an option not fitting it: a
    /// [`TraceError`], or a trace that records nothing to report
    /// ([`DeviceError::NothingToReport`]: no device has allocation events or live blocks, whatever the
    /// options).
    #[doc(hidden)]
    pub fn is_trace(&self) -> bool {
        let nothing = |e: &DeviceError| matches!(e, DeviceError::NothingToReport { .. });
        let s = &*self.source;
        s.is::<TraceError>()
            || s.downcast_ref::<DeviceError>().is_some_and(nothing)
            || s.downcast_ref::<ExplainError>().is_some_and(|e| match e {
                ExplainError::Trace(_) => true,
                ExplainError::Device(d) => nothing(d),
                _ => false,
            })
    }

    /// The layer's error.
    #[doc(hidden)]
    pub fn get_ref(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.source
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&escape_controls(&self.source.to_string()))
    }
}

/// `s` with every control character (C0, DEL and C1: `char::is_control`) written as Rust writes it
/// in a string literal (`\0`, `\t`, `\n`, `\u{1b}`), the rest unchanged: what a user gave (a path,
/// an option's value, a key of the trace) cannot hide text, move the cursor or end the line of the
/// message that names it.
pub(crate) fn escape_controls(s: &str) -> Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

impl std::error::Error for Error {
    /// The cause of the layer's error (its message is this error's).
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.source()
    }
}

impl From<TraceError> for Error {
    fn from(e: TraceError) -> Self {
        Error::input(e)
    }
}

impl From<ReplayError> for Error {
    fn from(e: ReplayError) -> Self {
        let kind = match e {
            ReplayError::Cancelled => ErrorKind::Cancelled,
            ref e if e.is_input() => ErrorKind::Input,
            _ => ErrorKind::Runtime,
        };
        Error::new(kind, e)
    }
}

impl From<ExplainError> for Error {
    fn from(e: ExplainError) -> Self {
        match e {
            ExplainError::Trace(t) => Error::input(t),
            ExplainError::Replay(r) => r.into(),
            e if e.is_input() => Error::input(e),
            e => Error::runtime(e),
        }
    }
}

impl From<BackendError> for Error {
    /// An invalid argument (a size, count or tuning that the options gave) is bad input; anything else
    /// a run-time failure.
    fn from(e: BackendError) -> Self {
        match e {
            BackendError::InvalidArgument(_) => Error::input(e),
            e => Error::runtime(e),
        }
    }
}

macro_rules! input_errors {
    ($($t:ty),*) => {$(
        impl From<$t> for Error {
            fn from(e: $t) -> Self {
                Error::input(e)
            }
        }
    )*};
}

input_errors!(
    DeviceError,
    CapacityRangeError,
    ParseError,
    PolicyError,
    crate::reference::UnknownStrategy,
    crate::trace::repeat::RepeatError,
    crate::app::OptionError
);

#[cfg(test)]
mod tests {
    use super::*;

    /// Every control character of a message is escaped (NUL, ESC, BEL, newline, tab, DEL, a C1), from
    /// any layer's error; other characters (quotes, backslashes, non-ASCII) are kept.
    #[test]
    fn messages_escape_every_control_character() {
        let given = "a\0b\x1b[31mc\x07d\ne\tf\x7fg\u{85}h \"é\\";
        let e = Error::input(format!("cannot read {given}: no such file"));
        assert_eq!(e.to_string(), "cannot read a\\0b\\u{1b}[31mc\\u{7}d\\ne\\tf\\u{7f}g\\u{85}h \"é\\: no such file");
        let e: Error = ParseError::NotANumber("8\0GiB".into()).into();
        assert_eq!(e.to_string(), "`8\\0GiB` is not a byte count (e.g. 80GiB, 1.5e9, 1048576)");
        assert!(matches!(escape_controls("plain ü"), Cow::Borrowed("plain ü")));
    }
}
