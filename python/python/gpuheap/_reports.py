"""Report objects: read-only views of the JSON reports the command line prints with ``--json``.

Each wraps the same JSON object the CLI prints for the same input and options, its text page and its
HTML page (the Rust library's front door computes all three once for both interfaces), so
``report.to_dict()`` equals ``json.loads`` of the CLI's output apart from run-time measurements
(``replay_ns``, ``events_per_s``, kernel times), and ``str(report)`` is the CLI's page.
Byte figures are ``int`` bytes; fractions are ``float`` in [0, 1].
"""

from __future__ import annotations

import copy
import html
from typing import Any, Iterator, Optional

from ._gpuheap import fmt_bytes

__all__ = ["Report", "ReplayReport", "Comparison"]


def _html(title: str, text: str, page: Optional[str]) -> str:
    """The notebook view: the CLI's ``--html`` page in a sandboxed ``iframe`` (its script and element ids
    stay inside it, whatever else the notebook shows), else the text page."""
    if page:
        return (
            f'<iframe title="{html.escape(title)}" sandbox="allow-scripts" srcdoc="{html.escape(page, quote=True)}" '
            'style="width:100%;height:720px;border:0"></iframe>'
        )
    return f"<div><p><b>{html.escape(title)}</b></p><pre>{html.escape(text)}</pre></div>"


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
    """One strategy replayed over one device of a trace (``gpuheap replay --json``); ``str()`` is the
    CLI's page."""

    __slots__ = ("_text", "_page")

    def __init__(self, data: dict, text: Optional[str] = None, page: Optional[str] = None) -> None:
        """``text``: the page the library rendered; ``page``: the HTML page of ``gpuheap replay --html``
        (both ``None`` for a row of a :class:`Comparison`)."""
        super().__init__(data)
        self._text = text
        self._page = page

    @property
    def html(self) -> Optional[str]:
        """The self-contained HTML page of ``gpuheap replay --html`` (``None`` for a row of a
        :class:`Comparison`, whose :attr:`Comparison.html` has every row)."""
        return self._page

    @property
    def strategy(self) -> str:
        """The strategy's name (e.g. ``best-fit``; ``device heap`` for the device allocator)."""
        return self._data["strategy"]

    @property
    def format(self) -> str:
        """The trace's format, as the CLI names it (e.g. ``PyTorch memory snapshot``)."""
        return self._data["format"]

    @property
    def capacity(self) -> int:
        """Managed capacity, bytes."""
        return self._data["capacity"]["bytes"]

    @property
    def align(self) -> int:
        """Alignment of the requests, bytes (given, else the format's own)."""
        return self._data["align"]

    @property
    def policy(self) -> str:
        """The compaction policy: ``never``, ``on-oom`` or ``threshold=F``."""
        return self._data["policy"]

    @property
    def events(self) -> int:
        """Allocation and free events replayed."""
        return self._data["events"]

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
        rounding / rejected), ``free`` and ``largest_free`` (bytes) at the failure."""
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

    def __str__(self) -> str:
        """The CLI's ``gpuheap replay`` page (the one-line summary for a row of a :class:`Comparison`)."""
        return self._text if self._text is not None else self.summary()

    def __repr__(self) -> str:
        return f"<gpuheap.ReplayReport {self.summary()}>"

    def _repr_html_(self) -> str:
        return _html("gpuheap replay", str(self), self._page)


class Comparison(_TraceReport):
    """Every strategy over the same trace, side by side (``gpuheap compare --json``); ``str()`` is the
    CLI's table."""

    __slots__ = ("_text", "_page")

    def __init__(self, data: dict, text: str = "", page: Optional[str] = None) -> None:
        """``text``: the table the library rendered; ``page``: the HTML page of ``gpuheap compare --html``."""
        super().__init__(data)
        self._text = text
        self._page = page

    @property
    def html(self) -> Optional[str]:
        """The self-contained HTML page of ``gpuheap compare --html``."""
        return self._page

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
        """The comparison as the CLI prints it (every column, PyTorch's own row, the compactions)."""
        return self._text

    def __str__(self) -> str:
        return self._text

    def __repr__(self) -> str:
        return f"<gpuheap.Comparison {self.trace!r}, device {self.device}>\n{self.table()}"

    def _repr_html_(self) -> str:
        return _html("gpuheap compare", self._text, self._page)
