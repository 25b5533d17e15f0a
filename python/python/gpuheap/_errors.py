"""The exceptions of gpuheap: every error it raises is a subclass of :class:`Error`.

The native module raises these classes too (it imports them from here), so the hierarchy is one.
"""

from __future__ import annotations

__all__ = ["Error", "TraceError", "ConfigError", "BackendError", "TorchError", "InternalError"]


class Error(Exception):
    """Base class of every exception gpuheap raises."""


class TraceError(Error, ValueError):
    """The input cannot be read as a trace.

    Raised for a missing or unreadable file, an unknown format, a truncated or corrupt pickle, a
    pickle that asks to run code (refused unread: gpuheap decodes data only), a value of the wrong
    type or out of range, an inconsistent event stream, or a trace that records nothing to report
    (no device has allocation events or live blocks: an idle process's snapshot). The message is one line that names the
    source (file path, ``<bytes>`` or ``<dict>``) and where: the byte, line, event, segment or key.
    The command line exits with code 2 for the same inputs.
    """


class ConfigError(Error, ValueError):
    """An option does not fit: an unknown strategy or compaction policy, a byte count that cannot be
    parsed, a device that is not in the trace, or a capacity the strategy cannot use (e.g. the
    caching model below 2 MiB). The command line exits with code 2 for the same options."""


class BackendError(Error, RuntimeError):
    """A run-time failure: a kernel launch or the GPU driver failed, ``backend="gpu"`` without a
    usable GPU, or a compaction whose result failed its check against the reference plan. The
    command line exits with code 1 for these."""


class TorchError(Error, ImportError):
    """:mod:`gpuheap.torch` needs PyTorch: torch cannot be imported, or it lacks the hook
    (``torch._C._cuda_attach_out_of_memory_observer``, present in CUDA builds of PyTorch 2.0.0 and
    later), or CUDA cannot be initialised."""


class InternalError(Error, RuntimeError):
    """A bug in gpuheap: the Rust code panicked. The panic was caught (the interpreter keeps
    running); please report it with the input that caused it."""
