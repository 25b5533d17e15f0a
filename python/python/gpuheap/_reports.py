"""Report objects: read-only views of the JSON reports the command line prints with ``--json``.

Each wraps the same JSON object the CLI prints for the same input and options (the Rust library
serialises it once for both), so ``report.to_dict()`` equals ``json.loads`` of the CLI's output
apart from run-time measurements (``replay_ns``, ``events_per_s``, kernel times).
Byte figures are ``int`` bytes; fractions are ``float`` in [0, 1].
"""

from __future__ import annotations

import copy
import html
from typing import Any, Iterator, Optional

__all__ = ["fmt_bytes", "Report", "ReplayReport", "Comparison"]


def fmt_bytes(b: int) -> str:
    """Bytes in the largest fitting binary unit, as the CLI prints them (``7.09 GiB``)."""
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    v, i = float(b), 0
    while v >= 1024.0 and i < len(units) - 1:
        v /= 1024.0
        i += 1
    return f"{b} B" if i == 0 else f"{v:.2f} {units[i]}"


class Report:
    """Base class: a JSON object, read through properties, ``report["key"]`` or :meth:`to_dict`."""

    __slots__ = ("_data",)

    def __init__(self, data: dict) -> None:
        self._data = data

    def to_dict(self) -> dict:
        """The whole report as plain data (a deep copy): the CLI's ``--json`` object."""
        return copy.deepcopy(self._data)

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def keys(self) -> Iterator[str]:
        """The report's top-level keys."""
        return iter(self._data.keys())


class _TraceReport(Report):
    """Base class of the reports over one device of a trace: its source, device and PyTorch's figures."""

    __slots__ = ()

    @property
    def trace(self) -> str:
        """The trace's source (file path, ``<bytes>`` or ``<dict>``)."""
        return self._data["trace"]

    @property
    def device(self) -> int:
        """The device ordinal replayed."""
        return self._data["device"]

    @property
    def pytorch(self) -> Optional[dict]:
        """PyTorch's own reserved bytes from the snapshot's segments (initial, peak, end, the
        snapshot's final state; ``None`` for other formats)."""
        p = self._data.get("pytorch")
        return None if p is None else dict(p)


class ReplayReport(_TraceReport):
    """One strategy replayed over one device of a trace (``gpuheap replay --json``)."""

    __slots__ = ()

    @property
    def strategy(self) -> str:
        """The strategy's name (e.g. ``best-fit``; ``device heap`` for the device allocator)."""
        return self._data["strategy"]

    @property
    def capacity(self) -> int:
        """Managed capacity, bytes."""
        return self._data["capacity"]["bytes"]

    @property
    def capacity_source(self) -> str:
        """How the capacity was chosen (``given`` or the rule that derived it)."""
        return self._data["capacity"]["source"]

    @property
    def peak_allocated(self) -> int:
        """The most requested bytes live at once."""
        return self._data["peak_allocated"]

    @property
    def peak_reserved(self) -> int:
        """The strategy's highest footprint, bytes (reserved bytes for the caching model)."""
        return self._data["peak_reserved"]

    @property
    def utilisation(self) -> float:
        """peak allocated / peak reserved."""
        return self._data["utilisation"]

    @property
    def johnstone_wilson(self) -> float:
        """Johnstone–Wilson fragmentation #4: (peak reserved − peak allocated) / peak allocated."""
        return self._data["johnstone_wilson"]

    @property
    def failed(self) -> list[dict]:
        """Failed requests: ``event``, ``size`` (bytes), ``class`` (capacity / fragmentation /
        rejected), ``free`` and ``largest_free`` (bytes) at the failure."""
        return copy.deepcopy(self._data["failed"])

    @property
    def at_peak(self) -> dict:
        """Fragmentation at the demand peak: ``allocated``, ``footprint``, ``holes``, ... (bytes),
        ``external``, ``level``."""
        return dict(self._data["at_peak"])

    @property
    def at_end(self) -> dict:
        """The same figures after the last event."""
        return dict(self._data["at_end"])

    @property
    def compactions(self) -> list[dict]:
        """One record per compaction (event, bytes planned, kernel measurement)."""
        return copy.deepcopy(self._data["compactions"])

    def summary(self) -> str:
        """One line: peak allocated and reserved, utilisation, failures, compactions."""
        d = self._data
        return (
            f"{d['strategy']}: peak allocated {fmt_bytes(d['peak_allocated'])}, peak reserved "
            f"{fmt_bytes(d['peak_reserved'])}, utilisation {d['utilisation'] * 100:.1f} %, "
            f"{len(d['failed'])} failed, {len(d['compactions'])} compactions "
            f"(capacity {fmt_bytes(d['capacity']['bytes'])})"
        )

    def __repr__(self) -> str:
        return f"<gpuheap.ReplayReport {self.summary()}>"


_COLUMNS = ("strategy", "peak alloc", "peak resv", "util", "J-W #4", "failed cap/frag", "compactions")


def _row(r: dict) -> list[str]:
    cap = sum(1 for f in r["failed"] if f["class"] == "capacity")
    frag = sum(1 for f in r["failed"] if f["class"] == "fragmentation")
    return [
        r["strategy"],
        fmt_bytes(r["peak_allocated"]),
        fmt_bytes(r["peak_reserved"]),
        f"{r['utilisation'] * 100:.1f} %",
        f"{r['johnstone_wilson']:.3f}",
        f"{cap}/{frag}",
        "n/a" if r.get("device_heap") is not None else str(len(r["compactions"])),
    ]


class Comparison(_TraceReport):
    """Every strategy over the same trace, side by side (``gpuheap compare --json``)."""

    __slots__ = ()

    @property
    def strategies(self) -> list[ReplayReport]:
        """One report per strategy that ran, in the CLI's order (host strategies, then ``device heap``)."""
        return [ReplayReport(r) for r in self._data["strategies"]]

    @property
    def not_run(self) -> list[dict]:
        """Strategies that could not run with these options: ``strategy`` and ``reason``."""
        return copy.deepcopy(self._data["not_run"])

    def __getitem__(self, key: str) -> Any:
        """A strategy's report by name (``cmp["best-fit"]``), else a top-level key of the report."""
        for r in self._data["strategies"]:
            if r["strategy"] == key:
                return ReplayReport(r)
        return self._data[key]

    def table(self) -> str:
        """The comparison as a plain-text table (a subset of the CLI's columns)."""
        rows = [list(_COLUMNS)] + [_row(r) for r in self._data["strategies"]]
        widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
        lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
        for n in self._data["not_run"]:
            lines.append(f"{n['strategy']}: not run: {n['reason']}")
        p = self._data.get("pytorch")
        if p is not None:
            lines.append(f"PyTorch (snapshot): peak reserved {fmt_bytes(p['peak'])}, {p['ooms']} oom")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<gpuheap.Comparison {self.trace!r}, device {self.device}>\n{self.table()}"

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in _COLUMNS)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in _row(r)) + "</tr>" for r in self._data["strategies"]
        )
        extra = "".join(
            f"<p>{html.escape(n['strategy'])}: not run: {html.escape(n['reason'])}</p>" for n in self._data["not_run"]
        )
        return (
            f"<div><p>gpuheap compare: {html.escape(self.trace)}, device {self.device}</p>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{extra}</div>"
        )
