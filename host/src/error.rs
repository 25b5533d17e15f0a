//! The one error type of the front door ([`crate::app`], the command line, the Python package):
//! [`Error`], of an [`ErrorKind`] every front end maps once, with the layer's own error kept as its
//! source.
//!
//! `Display` is the layer's message, one line.

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
}

/// A failure at the front door: its [`ErrorKind`] and the error of the layer that failed. `Display` is
/// the layer's message, one line.
///
/// | kind | means | command line | Python |
/// |---|---|---|---|
/// | [`ErrorKind::Input`] | bad input: a trace that cannot be read, an option that does not fit it | exit code 2 | `gpuheap.TraceError` (the trace, [`Error::is_trace`]) or `gpuheap.ConfigError` |
/// | [`ErrorKind::Runtime`] | a run-time failure: a kernel, the driver, a failed check of a result | exit code 1 | `gpuheap.BackendError` |
/// | [`ErrorKind::Internal`] | a bug in gpuheap (a report that cannot be serialised) | exit code 1 | `gpuheap.InternalError` |
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

    /// The command line's exit code: 2 for bad input, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self.kind {
            ErrorKind::Input => 2,
            ErrorKind::Runtime | ErrorKind::Internal => 1,
        }
    }

    /// `true` when the trace itself cannot be read or used ([`TraceError`]), rather than an option not
    /// fitting it.
    #[doc(hidden)]
    pub fn is_trace(&self) -> bool {
        self.source.is::<TraceError>()
    }

    /// The layer's error.
    #[doc(hidden)]
    pub fn get_ref(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.source
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.source.fmt(f)
    }
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
        let kind = if e.is_input() { ErrorKind::Input } else { ErrorKind::Runtime };
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
