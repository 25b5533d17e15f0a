"""gpuheap: read PyTorch CUDA memory snapshots, replay them through allocation strategies, compare
the strategies, and explain an out-of-memory error.

Quick start (in a notebook)::

    import gpuheap
    snap = gpuheap.load("oom_snapshot.pickle")      # or gpuheap.load(torch.cuda.memory._snapshot())
    gpuheap.compare(snap)                           # every strategy side by side

The numbers are those of the command line ``gpuheap`` for the same input and options (the same
Rust library computes them). Byte figures are ``int`` bytes. Every report is a typed object
(:class:`ReplayReport`, :class:`Comparison`, :class:`Explanation`, :class:`TuneResult`) whose
``str()`` is the CLI's page and ``to_dict()`` its ``--json`` object. Every error is a subclass of
:class:`gpuheap.Error`. Long calls release the GIL. Importing gpuheap never imports torch; the OOM
observer is in :mod:`gpuheap.torch`.

This module is the facade: it holds the API and nothing else (``__all__``, and ``dir(gpuheap)``
lists exactly it, ``__version__`` and the :mod:`gpuheap.torch` submodule); the code is in the
private modules beside it.
"""

from . import _gpuheap, torch
from ._api import compare, explain, load, replay, strategies, tune
from ._errors import BackendError, ConfigError, Error, InternalError, TorchError, TraceError
from ._explain import Explanation, TuneResult
from ._gpuheap import Snapshot, fmt_bytes, parse_bytes
from ._reports import Comparison, ReplayReport

__version__: str = _gpuheap.__version__

__all__ = [
    "load",
    "replay",
    "compare",
    "explain",
    "tune",
    "strategies",
    "Snapshot",
    "ReplayReport",
    "Comparison",
    "Explanation",
    "TuneResult",
    "Error",
    "TraceError",
    "ConfigError",
    "BackendError",
    "TorchError",
    "InternalError",
    "fmt_bytes",
    "parse_bytes",
]


def __dir__() -> list[str]:
    """The API (PEP 562): what tab completion and ``dir(gpuheap)`` show; the private modules
    (``_api``, ``_gpuheap``, ...) stay reachable by name but are not listed."""
    return sorted([*__all__, "__version__", "torch"])
