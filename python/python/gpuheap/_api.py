"""The functions of the package (re-exported by :mod:`gpuheap`, whose namespace holds only the API):
the type checks of their arguments, and the calls of the native module ``gpuheap._gpuheap``."""

from __future__ import annotations

import json
import os
from typing import Optional, Sequence, Tuple, Union

from . import _gpuheap
from ._convert import snapshot_dict_to_pickle, snapshot_list_to_pickle
from ._explain import Explanation, TuneResult
from ._errors import ConfigError, TraceError
from ._gpuheap import Snapshot
from ._reports import Comparison, ReplayReport

__all__ = ["load", "replay", "compare", "explain", "tune", "strategies"]

Source = Union[str, "os.PathLike[str]", bytes, bytearray, memoryview, dict, list, Snapshot]
Bytes = Union[int, float, str]

#: The help of every option, from the library's option table (``gpuheap::options::OPTIONS``): the text
#: ``gpuheap COMMAND --help`` prints, written once there.
_OPTION_HELP = {key: help for key, help, _value, _repeated, _commands in _gpuheap.option_table()}


def _documented(f):  # noqa: ANN001, ANN202
    """Fills the ``{key}`` fields of ``f``'s docstring with the option table's help of ``key``."""
    f.__doc__ = f.__doc__.format_map(_OPTION_HELP)
    return f


def load(source: Source) -> Snapshot:
    """Reads a trace: a PyTorch CUDA memory snapshot, a minimalloc CSV or an RMM log.

    Args:
        source: a file path (``str`` or path-like); the ``bytes`` of a snapshot pickle (or of a CSV
            file; a path given as ``bytes`` is read as content, and the error says so); or the dict
            that ``torch.cuda.memory._snapshot()`` returns (or the bare list of segments of
            ``torch.cuda.memory_snapshot()``), converted without executing anything (plain data
            only; see :mod:`gpuheap._convert`). A :class:`Snapshot` is returned as is.

    Returns:
        The :class:`Snapshot`, shared by every later call.

    Raises:
        TraceError: the file cannot be read, the format is unknown, the pickle is truncated or
            corrupt or asks to run code (it is refused unread), a value has the wrong type (the
            message names the key, event or segment), or the events are inconsistent.
        TypeError: ``source`` is none of the types above.
    """
    if isinstance(source, Snapshot):
        return source
    if isinstance(source, dict):
        return _gpuheap.load_bytes(snapshot_dict_to_pickle(source), "<dict>")
    if isinstance(source, list):
        return _gpuheap.load_bytes(snapshot_list_to_pickle(source), "<list>")
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        try:
            return _gpuheap.load_bytes(data, "<bytes>")
        except TraceError as e:
            # bytes are a file's content here, but os.fspath takes bytes paths too: say so when these
            # bytes name an existing file rather than leave "unknown trace format" unexplained.
            if len(data) < 4096 and b"\0" not in data and os.path.isfile(os.fsdecode(data)):
                raise TraceError(
                    f"{e} (bytes are read as a trace's content; {os.fsdecode(data)!r} is a file: pass its path "
                    "as str or pathlib.Path to read it)"
                ) from e
            raise
    if isinstance(source, (str, os.PathLike)):
        return _gpuheap.load_path(os.fspath(source))
    raise TypeError(
        f"gpuheap.load: expected a path, pickle bytes, a snapshot dict or a list of segments, not {type(source).__qualname__}"
    )


def _bytes_arg(name: str, v: Optional[Bytes]) -> Optional[Bytes]:
    """A byte count as the native module takes it (an int, a float or a str with a unit); the value is
    checked and parsed there, by the same rule as the CLI's."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ConfigError(f"{name}: expected bytes as int, float or str such as '80GiB', not {type(v).__qualname__}")
    return v


def _tiers_arg(v: object) -> Optional[Union[str, Tuple[Bytes, Bytes]]]:
    """``(SMALL_MAX, LARGE_MIN)`` (each as for ``capacity``) or the CLI's ``"SMALL_MAX,LARGE_MIN"``."""
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, (tuple, list)) and len(v) == 2:
        return (_bytes_arg("tiers", v[0]), _bytes_arg("tiers", v[1]))
    raise ConfigError(f"tiers: expected (SMALL_MAX, LARGE_MIN) or 'SMALL_MAX,LARGE_MIN', not {v!r}")


def _str_arg(name: str, v: object) -> str:
    if not isinstance(v, str):
        raise ConfigError(f"{name}: expected a str, not {type(v).__qualname__}")
    return v


def _str_list_arg(name: str, v: Optional[Sequence[str]], what: str) -> Optional[list[str]]:
    """``v`` as a list of str (``None`` stays ``None``); ConfigError naming ``name`` and the item for one
    str alone (a common slip for a one-item list) or an item that is no str."""
    if v is None:
        return None
    if isinstance(v, str):
        raise ConfigError(f"{name}: expected a list of {what}s (str), not one str")
    items = list(v)
    for i, x in enumerate(items):
        if not isinstance(x, str):
            raise ConfigError(f"{name}[{i}]: expected a {what} (str), not {type(x).__qualname__}")
    return items


def _device_arg(v: Optional[int]) -> Optional[int]:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"device: expected an int, not {type(v).__qualname__}")
    if not -(2**63) <= v < 2**63:
        # A CUDA device ordinal; the extension takes a signed 64-bit int (beyond it: OverflowError).
        raise ConfigError(f"device: {v} does not fit in a signed 64-bit integer")
    return v


def _replay_args(capacity, align, tiers, compact, backend, device, materialize_limit) -> dict:  # noqa: ANN001
    """The keyword arguments :func:`replay` and :func:`compare` share, type-checked for the native module."""
    return {
        "capacity": _bytes_arg("capacity", capacity),
        "align": _bytes_arg("align", align),
        "tiers": _tiers_arg(tiers),
        "compact": _str_arg("compact", compact),
        "backend": None if backend is None else _str_arg("backend", backend),
        "device": _device_arg(device),
        "materialize_limit": _bytes_arg("materialize_limit", materialize_limit),
    }


def strategies() -> list[str]:
    """The strategy names :func:`replay` accepts: ``first-fit``, ``best-fit``, ``buddy``, ``tlsf``,
    ``slab``, ``tiered`` and ``caching`` (the model of PyTorch's caching allocator)."""
    return list(_gpuheap.strategies())


@_documented
def replay(
    snapshot: Source,
    strategy: str = "caching",
    *,
    capacity: Optional[Bytes] = None,
    align: Optional[Bytes] = None,
    tiers: Optional[Union[str, Tuple[Bytes, Bytes]]] = None,
    compact: str = "never",
    backend: Optional[str] = None,
    device: Optional[int] = None,
    materialize_limit: Optional[Bytes] = None,
) -> ReplayReport:
    """Replays one device of a trace through one strategy: ``gpuheap replay TRACE --json``.

    Args:
        snapshot: a :class:`Snapshot` or anything :func:`load` takes.
        strategy: one of :func:`strategies`. {strategy}
        capacity: an int or float of bytes, or a str with a unit. {capacity}
        align: an int of bytes, or a str with a unit. {align}
        tiers: ``(SMALL_MAX, LARGE_MIN)`` in bytes, or a str ``"1KiB,1MiB"``. Only with
            ``strategy="tiered"``. {tiers}
        compact: a str. {compact}
        backend: a str; ``None``: the ``GPUHEAP_BACKEND`` environment variable, else ``"auto"``. {backend}
        device: an int. {device}
        materialize_limit: an int of bytes, or a str with a unit. {materialize_limit}

    Returns:
        The :class:`ReplayReport`.

    Raises:
        TraceError: ``snapshot`` cannot be loaded.
        ConfigError: an unknown strategy or policy, an unparsable byte count, a device not in the
            trace, a trace with no allocation events or live blocks, or a capacity the strategy cannot
            use.
        BackendError: a compaction kernel or its check failed, or ``backend="gpu"`` without a GPU.
    """
    common = _replay_args(capacity, align, tiers, compact, backend, device, materialize_limit)
    out = _gpuheap.replay(load(snapshot), _str_arg("strategy", strategy), **common)
    return ReplayReport(json.loads(out.json), out.text, out.html)


@_documented
def compare(
    snapshot: Source,
    *,
    capacity: Optional[Bytes] = None,
    align: Optional[Bytes] = None,
    tiers: Optional[Union[str, Tuple[Bytes, Bytes]]] = None,
    compact: str = "never",
    backend: Optional[str] = None,
    device: Optional[int] = None,
    materialize_limit: Optional[Bytes] = None,
    device_heap_limit: Optional[Bytes] = None,
    verbose: bool = False,
) -> Comparison:
    """Replays a trace through every strategy and the device allocator: ``gpuheap compare TRACE --json``.

    Arguments as for :func:`replay` (``tiers`` applies to the tiered row), plus ``device_heap_limit``
    (an int of bytes, or a str with a unit): {device_heap_limit} And ``verbose`` (a bool, for the text
    of :class:`Comparison`): {verbose} The device allocator's row always runs its kernels, on the CPU
    backend when there is no GPU.

    Returns:
        The :class:`Comparison`; a strategy that cannot take the options (e.g. the caching model
        below 2 MiB) is listed in ``not_run`` with the reason.

    Raises:
        TraceError, ConfigError, BackendError: as for :func:`replay`; ConfigError also when no
        strategy at all can run.
    """
    common = _replay_args(capacity, align, tiers, compact, backend, device, materialize_limit)
    if not isinstance(verbose, bool):
        raise ConfigError(f"verbose: expected a bool, not {type(verbose).__qualname__}")
    out = _gpuheap.compare(
        load(snapshot), **common, device_heap_limit=_bytes_arg("device_heap_limit", device_heap_limit), verbose=verbose
    )
    return Comparison(json.loads(out.json), out.text, out.html)


@_documented
def explain(
    snapshot: Source,
    capacity: Optional[Bytes] = None,
    *,
    device: Optional[int] = None,
    tune: bool = True,
    without: Optional[Sequence[str]] = None,
) -> Explanation:
    """Explains an out-of-memory error: ``gpuheap explain TRACE --json``.

    For the first recorded OOM: the request, PyTorch's reserved and allocated bytes, the holes, the
    driver's free bytes and the verdict (``capacity``: the GPU was full; ``fragmentation``: the
    bytes were free, in pieces; see :attr:`Explanation.verdict`). For a snapshot without an OOM
    (e.g. dumped by an OOM observer, or of a run that did not fail): the dumped state or the moment
    of peak reserved memory. Then the largest live tensors with the user code that allocated them,
    the segments with the most holes and, with ``tune``, the settings search and the recommended
    ``PYTORCH_CUDA_ALLOC_CONF`` (:attr:`Explanation.recommended_env`).

    Args:
        snapshot: a :class:`Snapshot` or anything :func:`load` takes.
        capacity: an int or float of bytes, or a str with a unit. {capacity}
        device: an int. {device}
        tune: run the settings search (:func:`tune`); ``False``: {no_tune}
        without: a list of str, one per SITE (:attr:`Explanation.without`). {without}

    Returns:
        The :class:`Explanation`: ``str()`` is the CLI's page, ``.to_dict()`` its JSON; a notebook
        shows the page.

    Raises:
        TraceError: ``snapshot`` cannot be loaded, or its sizes cannot be represented.
        ConfigError: a device the trace lacks, an unparsable capacity, a trace with no allocation, a
            ``without`` pattern that no allocation's frames match.
        BackendError: a replay of the search failed at run time.
    """
    snap = load(snapshot)
    if not isinstance(tune, bool):
        raise ConfigError(f"tune: expected a bool, not {type(tune).__qualname__}")
    without = _str_list_arg("without", without, "frame pattern")
    out = _gpuheap.explain(
        snap, capacity=_bytes_arg("capacity", capacity), device=_device_arg(device), tune=tune, without=without
    )
    return Explanation(json.loads(out.json), out.text, out.tune_table, out.html)


@_documented
def tune(
    snapshot: Source,
    capacity: Optional[Bytes] = None,
    settings: Optional[Sequence[str]] = None,
    *,
    device: Optional[int] = None,
) -> TuneResult:
    """Finds the allocator setting that would have avoided the OOM: ``gpuheap tune TRACE --json``.

    Replays the trace under a grid of ``PYTORCH_CUDA_ALLOC_CONF`` settings (the snapshot's own,
    expandable segments, ``max_split_size_mb`` values from the trace's request sizes,
    ``roundup_power2_divisions``, ``garbage_collection_threshold`` and combinations), under the
    caching model compacting on OOM and under every host strategy; for each, the peak reserved
    bytes, the requests that fail at ``capacity`` and the least GPU memory (bytes, a multiple of
    2 MiB) that replays the whole trace. Rows are ranked by that minimum.

    Args:
        snapshot: a :class:`Snapshot` or anything :func:`load` takes.
        capacity: the GPU's memory for the ``failed`` column: an int or float of bytes, or a str with
            a unit. {capacity}
        settings: a list of str; the ranking and :attr:`TuneResult.best_env` are then among them (the
            whole grid is still replayed). {settings}
        device: an int. {device}

    Returns:
        The :class:`TuneResult` (``.rows``, ``.best_env``).

    Raises:
        TraceError, ConfigError, BackendError: as for :func:`explain`; ConfigError also for a name
        in ``settings`` that is no row of the grid.
    """
    snap = load(snapshot)
    settings = _str_list_arg("settings", settings, "setting name")
    out = _gpuheap.tune(snap, capacity=_bytes_arg("capacity", capacity), device=_device_arg(device), settings=settings)
    return TuneResult(json.loads(out.json), out.text, out.html)

