"""The reports of :func:`gpuheap.explain` and :func:`gpuheap.tune`, and their text pages.

Both wrap the JSON object the command line prints with ``--json`` (``gpuheap explain``,
``gpuheap tune``); their text is the page the command line prints without ``--json``, built from
the same fields with the same wording (the tests compare the two).
Byte figures are ``int`` bytes.
"""

from __future__ import annotations

import copy
import html
from typing import Optional

from ._reports import Report, fmt_bytes

__all__ = ["Explanation", "TuneResult"]


def _pct(part: int, whole: int) -> str:
    return "0.0 %" if whole == 0 else f"{part * 100.0 / whole:.1f} %"


def _devices_text(devices: list[dict], choice: dict) -> str:
    def opt(v: Optional[int]) -> str:
        return "over 2^64 B" if v is None else fmt_bytes(v)

    s = ""
    for d in devices:
        mark = "*" if d["device"] == choice["device"] else " "
        n = d["recorded_ooms"]
        ooms = "no OOM recorded" if n == 0 else "1 OOM recorded" if n == 1 else f"{n} OOMs recorded"
        extra = (
            f" (no history: the state when dumped, {d['final_blocks']} live blocks)"
            if d["events"] == 0 and d["final_blocks"] > 0
            else ""
        )
        s += (
            f" {mark} device {d['device']}: {d['events']} events, {d['alloc_events']} allocations, peak allocated "
            f"{opt(d['peak_allocated'])}, peak reserved {opt(d['peak_reserved'])}, {ooms}{extra}\n"
        )
    why = {
        "given": "as asked",
        "recorded-oom": "it has a recorded OOM",
        "most-allocations": "it has the most allocation events",
        "final-state": "no device has events; it holds the most live blocks",
    }[choice["reason"]]
    others = ""
    if choice["others"]:
        others = f"; the file also has device {', '.join(str(o) for o in choice['others'])} (pick one with --device N)"
    s += f"device {choice['device']} is reported ({why}){others}\n"
    return s


def _capacity_text(c: dict) -> str:
    src = c["source"]
    kind = src["kind"]
    if kind == "recorded-oom":
        why = (
            f"the GPU's memory at the recorded OOM (event {src['event']}): PyTorch reserved {fmt_bytes(src['reserved'])}"
            f" + {fmt_bytes(src['device_free'])} the driver still had free"
        )
    elif kind == "given":
        why = "given with --capacity"
    elif kind == "peak-reserved":
        why = (
            "PyTorch's recorded peak reserved bytes: the least the GPU had (its real size is not recorded; "
            "give it with --capacity)"
        )
    elif kind == "file-name":
        why = "from the file name (minimalloc NAME.CAPACITY.csv)"
    else:
        why = "no reserved bytes recorded: twice the peak of live requested bytes, rounded up to 2 MiB"
    return f"capacity {fmt_bytes(c['bytes'])} ({c['bytes']} B): {why}"


def _oom_text(o: dict) -> str:
    s = f"OOM at event {o['event']}: a request of {fmt_bytes(o['request'])} failed.\n"
    if o.get("device_free") is not None and o.get("capacity") is not None:
        drv = f"; the driver had {fmt_bytes(o['device_free'])} free; the GPU's memory: {fmt_bytes(o['capacity'])}."
    else:
        drv = "; the driver's free bytes are not recorded."
    s += (
        f"  PyTorch had reserved {fmt_bytes(o['reserved'])} and allocated {fmt_bytes(o['allocated'])}: "
        f"{fmt_bytes(o['reserved_unallocated'])} reserved but unallocated (largest hole {fmt_bytes(o['largest_hole'])}){drv}\n"
    )
    free, largest = o.get("free_total") or 0, o.get("largest_extent") or 0
    device_free = o.get("device_free") or 0
    v = o["verdict"]
    if v == "capacity":
        verdict = (
            f"capacity: the GPU was full. Even with every cached byte released and compacted, only {fmt_bytes(free)} "
            f"would be free (driver {fmt_bytes(device_free)} + holes {fmt_bytes(o['reserved_unallocated'])}), "
            f"{fmt_bytes(o['shortfall'])} short of the {fmt_bytes(o['request'])} request. No allocator setting or "
            "defragmentation helps: the step needs less memory (smaller batch, activation checkpointing, lower "
            "precision) or a larger GPU."
        )
    elif v == "fragmentation":
        verdict = (
            f"fragmentation: the memory was there, but in pieces. {fmt_bytes(free)} was free in total (driver "
            f"{fmt_bytes(device_free)} + holes {fmt_bytes(o['reserved_unallocated'])}) >= the {fmt_bytes(o['request'])} "
            f"request > the largest free extent {fmt_bytes(largest)}. Releasing or compacting the cached holes "
            "(expandable segments, max_split_size_mb, a compacting allocator) would have served it."
        )
    elif v == "fits":
        verdict = (
            f"the request ({fmt_bytes(o['request'])}) is no larger than the largest free extent ({fmt_bytes(largest)}); "
            f"PyTorch still failed: it asks the driver for a whole segment of {fmt_bytes(o['segment_request'])} when no "
            "cached block of the request's pool fits."
        )
    else:
        verdict = (
            "undetermined: the driver's free bytes are not recorded (give the GPU's memory with --capacity); the "
            f"cached holes alone hold {fmt_bytes(o['reserved_unallocated'])}, the largest {fmt_bytes(o['largest_hole'])}."
        )
    return s + f"  Verdict: {verdict}\n"


def _tune_table(t: dict, oom: bool) -> str:
    s = (
        "Settings ranked by the least GPU memory that replays the whole trace without a failed request "
        f"(bisection at 2 MiB); failed = requests that fail at {fmt_bytes(t['capacity']['bytes'])}:\n"
    )
    s += f"{'rank':>4}  {'setting':<64} {'peak resv':>11} {'failed':>7} {'min capacity':>13}\n"
    for i, r in enumerate(t["rows"]):
        kind = {
            "pytorch": " [snapshot's own]" if r["own"] else "",
            "compacting": " [a compacting allocator]",
            "host": " [host strategy]",
        }[r["kind"]]
        label = f"{r['setting']}{kind}"
        mn = "none" if r["min_capacity"] is None else fmt_bytes(r["min_capacity"])
        if r.get("note") is not None:
            mark = f"  not run: {r['note']}"
        elif r["fits"]:
            mark = "  would have avoided the OOM" if oom else "  fits"
        else:
            mark = ""
        s += f"{i + 1:>4}  {label:<64} {fmt_bytes(r['peak_reserved']):>11} {r['failed']:>7} {mn:>13}{mark}\n"
    best, env = t.get("best"), t.get("best_env")
    if best is not None and env is not None:
        r = t["rows"][best]
        need = "" if r["min_capacity"] is None else fmt_bytes(r["min_capacity"])
        s += f"\nBest PyTorch setting (least memory needed: {need}):\n"
        s += f"  {env}\n"
        own = next((o for o in t["rows"] if o["own"]), None)
        if own is not None and own.get("env") != env:
            o_need = "more than any device modelled" if own["min_capacity"] is None else fmt_bytes(own["min_capacity"])
            s += f"  (the snapshot's own settings need {o_need})\n"
        else:
            s += "  (that is the snapshot's own setting: no PyTorch setting of the grid needs less)\n"
    else:
        s += "\nNo PyTorch setting of the grid replays the whole trace on any device modelled.\n"
    return s


def _html(title: str, text: str) -> str:
    return f"<div><p><b>{html.escape(title)}</b></p><pre>{html.escape(text)}</pre></div>"


class TuneResult(Report):
    """The settings search (``gpuheap tune --json``): every setting's peak reserved bytes, failed
    requests at the capacity and the least GPU memory (bytes, a multiple of 2 MiB) that replays the
    whole trace, ranked (fitting rows first, then by minimum capacity)."""

    __slots__ = ("_oom",)

    def __init__(self, data: dict, oom: bool = False) -> None:
        """``oom``: whether the trace records an OOM (rows that fit then read "would have avoided the OOM")."""
        super().__init__(data)
        self._oom = oom

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
        t = self._data
        if "trace" not in t:
            return _tune_table(t, self._oom)
        s = f"trace {t['trace']} ({t['format']})\n" if "format" in t else f"trace {t['trace']}\n"
        s += _devices_text(t["devices"], t["device_choice"])
        s += _capacity_text(t["capacity"])
        s += f"\n{len(t['rows'])} settings, {t['replays']} replays in {t['wall_s']:.1f} s\n\n"
        return s + _tune_table(t, t["recorded_ooms"] > 0)

    def __repr__(self) -> str:
        return f"<gpuheap.TuneResult best {self.best_env!r}>\n{self}"

    def _repr_html_(self) -> str:
        return _html("gpuheap tune", str(self))


class Explanation(Report):
    """What happened at the out-of-memory error (``gpuheap explain --json``): the verdict, the
    numbers, the largest live tensors with the code that allocated them, the holes, and (with the
    settings search) the recommended ``PYTORCH_CUDA_ALLOC_CONF``. ``str()`` is the CLI's page."""

    __slots__ = ()

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
    def ooms(self) -> list[dict]:
        """Every recorded OOM: ``event``, ``request``, ``reserved``, ``allocated``, ``device_free``,
        ``largest_extent``, ``shortfall`` (bytes) and ``verdict``."""
        return copy.deepcopy(self._data["ooms"])

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
        """``PYTORCH_CUDA_ALLOC_CONF=...`` of the best setting found (``None`` without the search or
        when no setting replays the trace)."""
        t = self._data.get("tune")
        return None if t is None else t.get("best_env")

    @property
    def tune(self) -> Optional[TuneResult]:
        """The settings search (``None`` when it was not run)."""
        t = self._data.get("tune")
        return None if t is None else TuneResult(t, self._oom_marks())

    def _oom_marks(self) -> bool:
        return bool(self._data["ooms"])

    def __str__(self) -> str:
        p = self._data
        s = f"trace {p['trace']} ({p['format']})\n"
        s += _devices_text(p["devices"], p["device"])
        settings = p.get("allocator_settings")
        if settings == "":
            s += "allocator settings: PyTorch's defaults (PYTORCH_CUDA_ALLOC_CONF unset)\n"
        elif settings is not None:
            s += f"allocator settings: PYTORCH_CUDA_ALLOC_CONF={settings}\n"
        s += _capacity_text(p["capacity"]) + "\n\n"
        for o in p["ooms"]:
            s += _oom_text(o)
        d = p["device"]["device"]
        if p["moment"] == "recorded-oom":
            moment = f"At the OOM (event {p['event'] or 0}):"
        elif p["moment"] == "dumped-state":
            s += (
                f"The snapshot has no history on device {d}: only the allocator state when it was dumped (an OOM "
                "observer's dump records no request and no driver free bytes).\n"
            )
            moment = "In that state:"
        else:
            at = "before the first event" if p["event"] is None else f"after event {p['event']}"
            s += f"No OOM is recorded on device {d}; below, the moment of peak reserved memory ({at}).\n"
            moment = "At that moment:"
        s += (
            f"{moment} PyTorch reserved {fmt_bytes(p['reserved'])} in {p['segments']} segments and allocated "
            f"{fmt_bytes(p['allocated'])} in {p['live_blocks']} blocks; {fmt_bytes(p['reserved_unallocated'])} "
            f"({_pct(p['reserved_unallocated'], p['reserved'])} of reserved) reserved but unallocated, the largest "
            f"hole {fmt_bytes(p['largest_hole'])}.\n"
        )
        b = p.get("request_bounds")
        if b is not None:
            s += (
                f"With {fmt_bytes(b['capacity'])} of GPU memory ({fmt_bytes(b['device_free'])} free on the device): a "
                f"request up to {fmt_bytes(b['fits_up_to'])} fits; one up to {fmt_bytes(b['fragmentation_up_to'])} "
                "fails for fragmentation (the bytes are there, in pieces); a larger one fails for capacity.\n"
            )
        if p["largest_tensors"]:
            s += "\nLargest live tensors:\n"
            s += f"  {'block':>12} {'requested':>12}  {'allocated at':<14} top user frames\n"
            for t in p["largest_tensors"]:
                at = "before trace" if t["alloc_event"] is None else f"event {t['alloc_event']}"
                frames = (
                    " < ".join(f"{f['filename']}:{f['line']} {f['name']}" for f in t["frames"])
                    if t["frames"]
                    else "(no frames recorded)"
                )
                s += f"  {fmt_bytes(t['size']):>12} {fmt_bytes(t['requested']):>12}  {at:<14} {frames}\n"
        if p["segments_with_holes"]:
            s += "\nWhere the reserved-but-unallocated bytes sit (segments with the most):\n"
            for g in p["segments_with_holes"]:
                holes = [fmt_bytes(h["size"]) for h in g["holes"][:4]]
                if len(g["holes"]) > 4:
                    holes.append("...")
                n = len(g["holes"])
                count = "1 hole" if n == 1 else f"{n} holes"
                free = sum(h["size"] for h in g["holes"])
                s += (
                    f"  segment {g['addr']:#x} ({g['pool']} pool{', expandable' if g['expandable'] else ''}, "
                    f"{fmt_bytes(g['size'])}): {fmt_bytes(free)} free in {count} ({', '.join(holes)})\n"
                )
        if p.get("tune") is not None:
            s += "\n"
            if p["moment"] == "dumped-state":
                s += (
                    'The dump records no request: below, a setting "fits" when it holds the dumped live tensors in the '
                    "capacity, and its minimum capacity is what they need under it; the difference to PyTorch's "
                    "reserved bytes is headroom the failed request would have had.\n"
                )
            s += _tune_table(p["tune"], self._oom_marks())
        return s

    def __repr__(self) -> str:
        v = self.verdict or f"no OOM recorded ({self.moment})"
        return f"<gpuheap.Explanation device {self.device}: {v}; recommended {self.recommended_env!r}>"

    def _repr_html_(self) -> str:
        return _html("gpuheap explain", str(self))
