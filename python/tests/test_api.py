"""The package's namespace is its API, and every report is a typed object whose attributes are the
fields of the CLI's ``--json`` object."""

from __future__ import annotations

import inspect
from pathlib import Path

import gpuheap
from conftest import DATA

K = DATA / "K.1048576.csv"
SNAPSHOT = DATA / "equivariant-posteriors_oom_snapshot_new.pickle"


def test_dir_lists_only_the_api() -> None:
    assert dir(gpuheap) == sorted([*gpuheap.__all__, "__version__", "torch"])
    for helper in ("os", "json", "Optional", "Union", "Sequence", "Tuple", "annotations", "_gpuheap", "_api"):
        assert helper not in dir(gpuheap), helper
    assert inspect.ismodule(gpuheap.torch) and callable(gpuheap.torch.install_oom_observer)


def test_every_name_of_all_is_gpuheaps_own() -> None:
    assert len(set(gpuheap.__all__)) == len(gpuheap.__all__)
    for name in gpuheap.__all__:
        obj = getattr(gpuheap, name)
        assert callable(obj), name
        assert obj.__module__.startswith("gpuheap"), (name, obj.__module__)
        assert obj.__doc__, f"gpuheap.{name} has no docstring"
    star: dict = {}
    exec("from gpuheap import *", star)  # noqa: S102
    assert sorted(k for k in star if k != "__builtins__") == sorted(gpuheap.__all__)


def _check_replay_report(r: gpuheap.ReplayReport, d: dict) -> None:
    """Every attribute is its JSON field, of the JSON type."""
    assert isinstance(r, gpuheap.ReplayReport)
    for attr, value in [
        ("trace", d["trace"]),
        ("format", d["format"]),
        ("device", d["device"]),
        ("strategy", d["strategy"]),
        ("capacity", d["capacity"]["bytes"]),
        ("capacity_source", d["capacity"]["source"]),
        ("align", d["align"]),
        ("policy", d["policy"]),
        ("events", d["events"]),
        ("peak_allocated", d["peak_allocated"]),
        ("peak_reserved", d["peak_reserved"]),
        ("utilisation", d["utilisation"]),
        ("johnstone_wilson", d["johnstone_wilson"]),
        ("failed", d["failed"]),
        ("at_peak", d["at_peak"]),
        ("at_end", d["at_end"]),
        ("compactions", d["compactions"]),
        ("pytorch", d.get("pytorch")),
    ]:
        assert getattr(r, attr) == value, attr
    assert isinstance(r.capacity, int) and isinstance(r.peak_reserved, int) and isinstance(r.utilisation, float)
    assert r.strategy in r.summary() and r.strategy in repr(r)


def test_replay_report_attributes() -> None:
    r = gpuheap.replay(K, "best-fit", compact="on-oom", backend="cpu")
    d = r.to_dict()
    _check_replay_report(r, d)
    assert (r.format, r.policy, r.align, r.capacity) == ("buffer-lifetime CSV (id,lower,upper,size)", "on-oom", 1, 1 << 20)
    assert r.events == d["allocs"] + d["frees"] > 0
    assert r.html and str(r) != r.summary()  # the CLI's page, not the one-line summary


def test_comparison_attributes() -> None:
    c = gpuheap.compare(SNAPSHOT, backend="cpu")
    d = c.to_dict()
    assert isinstance(c, gpuheap.Comparison)
    assert (c.trace, c.device, c.pytorch, c.not_run) == (d["trace"], d["device"], d["pytorch"], d["not_run"])
    assert c.pytorch is not None  # a PyTorch snapshot: PyTorch's own reserved bytes
    names = [r.strategy for r in c.strategies]
    assert names == [r["strategy"] for r in d["strategies"]] and "caching" in names
    for row, rd in zip(c.strategies, d["strategies"]):
        _check_replay_report(row, rd)
        assert c[row.strategy].to_dict() == rd  # by name
    assert c["not_run"] == d["not_run"]  # else a top-level key
    assert str(c) == c.table() and c.html
