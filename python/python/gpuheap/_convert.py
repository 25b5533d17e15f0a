"""The in-memory snapshot (the dict of ``torch.cuda.memory._snapshot()``, or the bare list of segments
of ``torch.cuda.memory_snapshot()`` and of PyTorch's oldest pickles) to pickle bytes, without running
code.

The dict is checked to hold plain data only (exactly ``dict``, ``list``, ``tuple``, ``str``,
``int``, ``float``, ``bool``, ``None``, ``bytes``; no subclasses, whose ``__reduce__`` could run
code), then pickled with protocol 4 and handed to the Rust data-only decoder, which reads the same
bytes as a file written by ``torch.cuda.memory._dump_snapshot``. ``pickle.dumps`` of plain data
calls no user code.
"""

from __future__ import annotations

import pickle
from typing import Any

from ._errors import TraceError

__all__ = ["snapshot_dict_to_pickle", "snapshot_list_to_pickle"]

_SCALARS = (str, int, float, bool, type(None), bytes)
_MAX_DEPTH = 64


_EXCERPT_CHARS = 40


def _short(x: Any) -> str:
    """``repr(x)`` cut to ``_EXCERPT_CHARS`` characters (a key of megabytes makes no message of megabytes),
    as the Rust reader quotes values."""
    r = repr(x)
    if len(r) <= _EXCERPT_CHARS:
        return r
    return f"{r[:_EXCERPT_CHARS]}… ({len(r)} characters)"


def _where(path: list[Any]) -> str:
    out = ""
    for p in path:
        out += f"[{_short(p)}]"
    return out


def _check(value: Any, path: list[Any], ancestors: set[int], seen: set[int], src: str = "<dict>") -> None:
    t = type(value)
    if t in _SCALARS:
        return
    if t not in (dict, list, tuple):
        raise TraceError(
            f"{src}: key `{_where(path)}`: a value of type {t.__module__}.{t.__qualname__} is not plain "
            "data (expected dict, list, tuple, str, int, float, bool, None or bytes)"
        )
    ident = id(value)
    if ident in ancestors:
        raise TraceError(f"{src}: key `{_where(path)}`: the structure contains itself")
    if ident in seen:  # shared (e.g. frame lists), already checked
        return
    if len(path) >= _MAX_DEPTH:
        raise TraceError(f"{src}: key `{_where(path)}`: nested deeper than {_MAX_DEPTH} levels")
    seen.add(ident)
    ancestors.add(ident)
    if t is dict:
        for k, v in value.items():
            if type(k) not in (str, int):
                raise TraceError(
                    f"{src}: key `{_where(path)}`: a key of type {type(k).__qualname__} ({_short(k)}); keys must be str or int"
                )
            path.append(k)
            _check(v, path, ancestors, seen, src)
            path.pop()
    else:
        for i, v in enumerate(value):
            path.append(i)
            _check(v, path, ancestors, seen, src)
            path.pop()
    ancestors.discard(ident)


def snapshot_dict_to_pickle(snapshot: dict) -> bytes:
    """Checks ``snapshot`` (the dict of ``torch.cuda.memory._snapshot()``) and pickles it.

    Raises:
        TraceError: it is not a dict, has no ``segments`` list, or holds a value that is not plain
            data; the message names the key (e.g. ``['segments'][3]['blocks']``).
    """
    if type(snapshot) is not dict:
        raise TraceError(
            f"<dict>: a memory snapshot is a dict (from torch.cuda.memory._snapshot()), not {type(snapshot).__qualname__}"
        )
    if "segments" not in snapshot:
        raise TraceError(
            "<dict>: key `segments` is missing (torch.cuda.memory._snapshot() always has it; "
            f"keys present: {sorted(map(str, snapshot))})"
        )
    for key in ("segments", "device_traces"):
        if key in snapshot and type(snapshot[key]) is not list:
            raise TraceError(f"<dict>: key `{key}`: expected a list, found {type(snapshot[key]).__qualname__}")
    _check(snapshot, [], set(), set())
    try:
        return pickle.dumps(snapshot, protocol=4)
    except RecursionError as e:  # pragma: no cover - depth is bounded by _check
        raise TraceError(f"<dict>: cannot be pickled: {e}") from None


def snapshot_list_to_pickle(segments: list) -> bytes:
    """Checks ``segments`` (the bare list of segment dicts that ``torch.cuda.memory_snapshot()``
    returns, the layout of PyTorch's oldest snapshot pickles) and pickles it.

    Raises:
        TraceError: an element is not a dict, or holds a value that is not plain data; the message
            names the element (e.g. ``<list>: key `[3]['blocks']` ...``).
    """
    for i, seg in enumerate(segments):
        if type(seg) is not dict:
            raise TraceError(f"<list>: element [{i}]: a segment is a dict, not {type(seg).__qualname__}")
    _check(segments, [], set(), set(), "<list>")
    try:
        return pickle.dumps(segments, protocol=4)
    except RecursionError as e:  # pragma: no cover - depth is bounded by _check
        raise TraceError(f"<list>: cannot be pickled: {e}") from None
