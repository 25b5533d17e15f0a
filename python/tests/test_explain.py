"""gpuheap.explain and gpuheap.tune: the same JSON numbers and the same page as the CLI's
``gpuheap explain`` / ``gpuheap tune`` for the same input, on the shipped and shared snapshots and
on hand-made OOM snapshots whose verdicts were worked out by hand."""

from __future__ import annotations

import pickle
import subprocess
from pathlib import Path

import pytest

import gpuheap
from conftest import all_traces, strip_timing
from oom_snapshot import MIB, oom_snapshot

try:
    gpuheap.explain(oom_snapshot(8 * MIB, 0), tune=False)
    HAVE_EXPLAIN = True
except NotImplementedError:
    HAVE_EXPLAIN = False

pytestmark = pytest.mark.skipif(not HAVE_EXPLAIN, reason="gpuheap.explain is not in this build")


def _text(cli: Path, *args: str) -> str:
    r = subprocess.run([str(cli), *args], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    return r.stdout


# The settings search is the slow part (seconds per trace on one worker): each side runs it once per
# trace. Python's `explain` runs it (cached here for both tests); the CLI's `tune` runs the same search
# (the same grid at the same capacity from the evidence), and the CLI's explain page is taken without
# it (`--no-tune`), which leaves every other field unchanged.
_EXPLAINED: dict = {}


def _explained(trace: Path) -> gpuheap.Explanation:
    if trace not in _EXPLAINED:
        _EXPLAINED[trace] = gpuheap.explain(trace)
    return _EXPLAINED[trace]


@pytest.mark.parametrize("trace", all_traces())
def test_explain_matches_cli(trace: Path, cli: Path, run_cli) -> None:
    py = _explained(trace)
    d = strip_timing(py.to_dict())
    assert d.pop("tune") is not None
    cli_json = strip_timing(run_cli("explain", str(trace), "--no-tune"))
    assert cli_json.pop("tune") is None
    assert d == cli_json
    # The page: the CLI's page up to the search, then the settings table.
    page = str(py)
    assert page.startswith(_text(cli, "explain", str(trace), "--no-tune")) and page.endswith(str(py.tune))
    # One conclusion for every form: the page's words are the JSON's, and a setting is recommended only
    # when it fits in the capacity the page names.
    # A dump without history is said for what it is, in the page's words (issue 37).
    if py.moment == "dumped-state":
        assert py["dump_caveat"] in page and "Nothing in the file records an OOM" in py["dump_caveat"]
    t = py.tune
    assert t.conclusion and t.conclusion in page and t.conclusion in repr(py)
    assert py.recommended_env == t.recommended_env
    best = t.best
    assert py.recommended_env == (best["env"] if best is not None and best["fits"] else None)
    if py.recommended_env is None:
        assert "Best PyTorch setting" not in page


@pytest.mark.parametrize("trace", all_traces())
def test_tune_matches_cli(trace: Path, run_cli) -> None:
    py = _explained(trace).tune
    cli_json = strip_timing(run_cli("tune", str(trace)))
    for key in ("device", "capacity", "rows", "best", "best_env", "replays", "warnings", "conclusion"):
        assert strip_timing(py[key]) == cli_json[key], key


@pytest.mark.parametrize("trace", [p for p in all_traces() if str(p.id).startswith("data/")])
def test_tune_at_a_given_capacity_matches_cli(trace: Path, run_cli) -> None:
    py = gpuheap.tune(trace, capacity="80GiB")
    # The CLI's object, no key more (the Python package added `format`).
    assert strip_timing(py.to_dict()) == strip_timing(run_cli("tune", str(trace), "--capacity", "80GiB"))
    assert py.html is not None and "application/json" in py.html and "<iframe" in py._repr_html_()
    assert str(py).startswith(f"trace {trace} (") and py.best_env in (None, *[r["env"] for r in py.rows])


@pytest.mark.parametrize(
    ("request_bytes", "device_free", "verdict"),
    [
        (8 * MIB, 0, "fragmentation"),  # 10 MiB in holes >= 8 MiB > largest hole 6 MiB
        (12 * MIB, 1 * MIB, "capacity"),  # 1 + 10 MiB free < 12 MiB
        (5 * MIB, 0, "fits"),  # the largest hole (6 MiB) holds it: PyTorch's own rule failed it
    ],
)
def test_hand_worked_oom(tmp_path: Path, cli: Path, run_cli, request_bytes: int, device_free: int, verdict: str) -> None:
    snap = oom_snapshot(request_bytes, device_free)
    path = tmp_path / "oom.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=4))
    for source in (snap, path):
        e = gpuheap.explain(source)
        assert e.verdict == verdict and e.moment == "recorded-oom"
        assert (e.reserved, e.allocated, e.reserved_unallocated, e.largest_hole) == (40 * MIB, 30 * MIB, 10 * MIB, 6 * MIB)
        top = e.largest_tensors[0]
        assert top["size"] == 14 * MIB and top["frames"][0]["filename"] == "data/loader.py"
    # The dict gives the page of the file, but for the name of the source.
    cli_json = run_cli("explain", str(path))
    py = gpuheap.explain(snap).to_dict()
    assert py.pop("trace") == "<dict>" and cli_json.pop("trace") == str(path)
    assert strip_timing(py) == strip_timing(cli_json)
    page = gpuheap.explain(path, tune=False)
    assert str(page) == _text(cli, "explain", str(path), "--no-tune")
    assert f"Verdict: {verdict}" in str(page) or verdict == "fits"
    # The notebook shows the CLI's --html page (the same bytes), isolated in an iframe.
    out = tmp_path / "page.html"
    subprocess.run([str(cli), "explain", str(path), "--no-tune", "--html", str(out)], check=True, capture_output=True)
    assert page.html == out.read_text(encoding="utf-8")
    assert page._repr_html_().startswith("<iframe") and "srcdoc=" in page._repr_html_()
    assert "application/json" in page.html and "&lt;script" in page._repr_html_()


def test_explain_bad_options() -> None:
    snap = oom_snapshot(8 * MIB, 0)
    with pytest.raises(gpuheap.ConfigError, match="no device 3"):
        gpuheap.explain(snap, device=3)
    with pytest.raises(gpuheap.ConfigError, match="capacity"):
        gpuheap.explain(snap, capacity="a lot")
    with pytest.raises(gpuheap.TraceError):
        gpuheap.explain({"device_traces": []})


def test_frames_come_from_the_bytes_loaded(tmp_path: Path) -> None:
    # explain read the file again for the stack frames: a file rewritten after load gave the frames of
    # another snapshot (here none: the file is gone), and a pipe could not be read twice.
    path = tmp_path / "oom.pickle"
    path.write_bytes(pickle.dumps(oom_snapshot(8 * MIB, 0), protocol=4))
    snap = gpuheap.load(path)
    path.unlink()
    e = gpuheap.explain(snap, tune=False)
    assert e.largest_tensors[0]["frames"][0]["filename"] == "data/loader.py"


def test_many_ooms_first_32_explained_rest_counted() -> None:
    snap = oom_snapshot(12 * MIB, 1 * MIB)
    oom = snap["device_traces"][0][-1]
    snap["device_traces"][0].extend(dict(oom) for _ in range(39))
    e = gpuheap.explain(snap, tune=False)
    assert len(e.ooms) == 32 and e.ooms_not_explained == 8
    assert "8 more recorded OOM events are not explained one by one" in str(e)
