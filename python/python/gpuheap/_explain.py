"""The reports of :func:`gpuheap.explain` and :func:`gpuheap.tune`.

Both wrap the JSON object the command line prints with ``--json`` (``gpuheap explain``,
``gpuheap tune``); their text (``str()``) is the page the Rust library renders for the command line
(``Explanation::render_text``, ``TunePage::render_text``), handed over by the native module: one
renderer for both interfaces. Byte figures are ``int`` bytes.
"""

from __future__ import annotations

import copy
from typing import Optional

from ._reports import Report, _html

__all__ = ["Explanation", "TuneResult"]


class TuneResult(Report):
    """The settings search (``gpuheap tune --json``): every setting's peak reserved bytes, failed
    requests at the capacity and the least GPU memory (bytes, a multiple of 2 MiB) that replays the
    whole trace, ranked (fitting rows first, then by minimum capacity)."""

    __slots__ = ("_text", "_page")

    def __init__(self, data: dict, text: str, page: Optional[str] = None) -> None:
        """``text``: the page (or, inside an :class:`Explanation`, the table) the library rendered;
        ``page``: the HTML page of ``gpuheap tune --html`` (``None`` inside an :class:`Explanation`)."""
        super().__init__(data)
        self._text = text
        self._page = page

    @property
    def html(self) -> Optional[str]:
        """The self-contained HTML page of ``gpuheap tune --html`` (``None`` inside an
        :class:`Explanation`, whose :attr:`Explanation.html` has the timeline)."""
        return self._page

    @property
    def rows(self) -> list[dict]:
        """The ranked rows: ``setting``, ``kind`` (pytorch / compacting / host), ``env``
        (``PYTORCH_CUDA_ALLOC_CONF=...``, PyTorch rows only), ``own``, ``peak_reserved`` (bytes),
        ``failed``, ``first_failure``, ``min_capacity`` (bytes or ``None``), ``fits``, ``note``."""
        return copy.deepcopy(self._data["rows"])

    @property
    def best_env(self) -> Optional[str]:
        """The best PyTorch setting as the line to set, ``PYTORCH_CUDA_ALLOC_CONF=...`` (``None`` when
        no PyTorch setting replays the trace on any device modelled)."""
        return self._data.get("best_env")

    @property
    def recommended_env(self) -> Optional[str]:
        """``PYTORCH_CUDA_ALLOC_CONF=...`` of the setting the page recommends: :attr:`best_env` when
        its least memory fits in :attr:`capacity`, else ``None`` (no setting of the grid fits)."""
        return self._data.get("conclusion", {}).get("recommended_env")

    @property
    def conclusion(self) -> str:
        """The sentence the pages (text, HTML) lead the search's conclusion with, word for word."""
        return self._data.get("conclusion", {}).get("headline", "")

    @property
    def best(self) -> Optional[dict]:
        """The row of :attr:`best_env`."""
        b = self._data.get("best")
        return None if b is None else dict(self._data["rows"][b])

    @property
    def capacity(self) -> int:
        """The capacity of the ``failed`` column, bytes."""
        return self._data["capacity"]["bytes"]

    def __str__(self) -> str:
        """The CLI's ``gpuheap tune`` page (only the table when part of an :class:`Explanation`)."""
        return self._text

    def __repr__(self) -> str:
        return f"<gpuheap.TuneResult recommended {self.recommended_env!r}: {self.conclusion}>\n{self}"

    def _repr_html_(self) -> str:
        return _html("gpuheap tune", str(self), self._page)


class Explanation(Report):
    """What happened at the out-of-memory error (``gpuheap explain --json``): the verdict, the
    numbers, the largest live tensors with the code that allocated them, the holes, and (with the
    settings search) the recommended ``PYTORCH_CUDA_ALLOC_CONF``. ``str()`` is the CLI's page."""

    __slots__ = ("_text", "_tune_text", "_page")

    def __init__(self, data: dict, text: str, tune_text: Optional[str] = None, page: Optional[str] = None) -> None:
        """``text``: the page the library rendered; ``tune_text``: its settings table (with the search);
        ``page``: the HTML page of ``gpuheap explain --html``."""
        super().__init__(data)
        self._text = text
        self._tune_text = tune_text
        self._page = page

    @property
    def html(self) -> Optional[str]:
        """The self-contained HTML page of ``gpuheap explain --html`` (timeline, tables, parameters):
        write it to a file, or let a notebook show it."""
        return self._page

    @property
    def verdict(self) -> Optional[str]:
        """Of the first recorded OOM: ``"capacity"`` (the GPU was full: no setting helps),
        ``"fragmentation"`` (the bytes were free, in pieces), ``"fits"`` (a PyTorch rule of its own)
        or ``"undetermined"`` (the driver's free bytes are not recorded); ``None`` when no OOM is
        recorded (the page then describes the dumped state or the peak)."""
        ooms = self._data["ooms"]
        return ooms[0]["verdict"] if ooms else None

    @property
    def moment(self) -> str:
        """What the numbers describe: ``recorded-oom``, ``dumped-state`` or ``peak-reserved``."""
        return self._data["moment"]

    @property
    def device(self) -> int:
        """The device reported."""
        return self._data["device"]["device"]

    @property
    def capacity(self) -> int:
        """The GPU's memory used for the verdict and the search, bytes (see ``to_dict()["capacity"]["source"]``)."""
        return self._data["capacity"]["bytes"]

    @property
    def reserved(self) -> int:
        """PyTorch's reserved bytes at the moment."""
        return self._data["reserved"]

    @property
    def allocated(self) -> int:
        """Allocated bytes at the moment."""
        return self._data["allocated"]

    @property
    def reserved_unallocated(self) -> int:
        """Reserved but unallocated bytes at the moment (the holes)."""
        return self._data["reserved_unallocated"]

    @property
    def largest_hole(self) -> int:
        """The largest hole, bytes."""
        return self._data["largest_hole"]

    @property
    def breakdown(self) -> dict:
        """The live bytes at the moment by site (``by_site``: innermost user frame) and by kind (``by_kind``:
        parameters and buffers, gradients, optimizer state, activations, temporaries, library workspaces,
        unknown), each with ``tensors``, ``bytes`` and ``share_of_capacity`` (percent); ``must_free``: the
        bytes that must go for the failed request to fit."""
        return self._data["breakdown"]

    @property
    def without(self) -> Optional[dict]:
        """The what-if of ``explain(..., without=[...])``: ``min_capacity`` without the matched allocations
        (``min_capacity_before`` with them), ``fits`` on this GPU, ``live_tensors``/``live_bytes`` taken out;
        ``None`` when not asked."""
        return self._data.get("without")

    @property
    def ooms(self) -> list[dict]:
        """The first 32 recorded OOMs: ``event``, ``request``, ``reserved``, ``allocated``, ``device_free``,
        ``largest_extent``, ``shortfall`` (bytes) and ``verdict``. Later ones are counted in
        :attr:`ooms_not_explained`."""
        return copy.deepcopy(self._data["ooms"])

    @property
    def ooms_not_explained(self) -> int:
        """Recorded OOMs after the first 32, not explained one by one (each would replay the trace)."""
        return int(self._data.get("ooms_not_explained", 0))

    @property
    def largest_tensors(self) -> list[dict]:
        """The largest live blocks: ``addr``, ``size``, ``requested`` (bytes), ``stream``,
        ``alloc_event`` and ``frames`` (``name``, ``filename``, ``line`` of the user code)."""
        return copy.deepcopy(self._data["largest_tensors"])

    @property
    def holes(self) -> list[dict]:
        """The segments with the most reserved-but-unallocated bytes: ``addr``, ``size``, ``pool``,
        ``expandable``, ``allocated`` and ``holes`` (``addr``, ``size``; largest first)."""
        return copy.deepcopy(self._data["segments_with_holes"])

    @property
    def recommended_env(self) -> Optional[str]:
        """``PYTORCH_CUDA_ALLOC_CONF=...`` of the setting the page recommends (``None`` without the
        search, or when no setting of the grid fits in the capacity: :attr:`TuneResult.conclusion`
        says why)."""
        t = self._data.get("tune")
        return None if t is None else t.get("conclusion", {}).get("recommended_env")

    @property
    def tune(self) -> Optional[TuneResult]:
        """The settings search (``None`` when it was not run)."""
        t = self._data.get("tune")
        return None if t is None else TuneResult(t, self._tune_text or "")

    def __str__(self) -> str:
        """The CLI's ``gpuheap explain`` page."""
        return self._text

    def __repr__(self) -> str:
        v = self.verdict or f"no OOM recorded ({self.moment})"
        if self.moment == "dumped-state":
            v += " (a dump without history: whether an OOM happened is not recorded)"
        t = self.tune
        if t is None:
            return f"<gpuheap.Explanation device {self.device}: {v}>"
        return f"<gpuheap.Explanation device {self.device}: {v}; recommended {self.recommended_env!r}: {t.conclusion}>"

    def _repr_html_(self) -> str:
        return _html("gpuheap explain", str(self), self._page)
