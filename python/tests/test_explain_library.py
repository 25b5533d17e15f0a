"""gpuheap.explain / gpuheap.tune return the library's report: the JSON numbers of the CLI's
``--json`` and the page the library renders for the CLI (no text code in Python), the snapshot's
settings warnings (BL-31), the garbage-collection rows of the grid, and the ``settings`` filter."""

from __future__ import annotations

import os
import pickle
import subprocess
from pathlib import Path

import pytest

import gpuheap
from conftest import strip_timing
from oom_snapshot import MIB, oom_snapshot


def _snapshot_with_settings(tmp_path: Path) -> Path:
    snap = oom_snapshot(8 * MIB, 0)
    snap["allocator_settings"] = {
        "PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync,garbage_collection_threshold:0.6",
        "garbage_collection_threshold": 0.6,
    }
    path = tmp_path / "settings.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=4))
    return path


def _text(cli: Path, *args: str) -> str:
    env = dict(os.environ, GPUHEAP_BACKEND="cpu")
    r = subprocess.run([str(cli), *args], capture_output=True, text=True, env=env, check=False)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_settings_warnings_named(tmp_path: Path, cli: Path, run_cli) -> None:
    path = _snapshot_with_settings(tmp_path)
    e = gpuheap.explain(path, tune=False)
    names = [w["option"] for w in e.to_dict()["warnings"]]
    assert names == ["backend", "garbage_collection_threshold"]
    assert e.to_dict()["warnings"] == run_cli("explain", str(path), "--no-tune")["warnings"]
    page = str(e)
    assert "warning: allocator option `backend` = cudaMallocAsync" in page
    assert page == _text(cli, "explain", str(path), "--no-tune")
    t = gpuheap.tune(path)
    assert [w["option"] for w in t["warnings"]] == names
    assert "warning: allocator option `garbage_collection_threshold` = 0.6: no effect" in str(t)


def test_gc_rows_and_filter_match_cli(cli: Path, run_cli, tmp_path: Path) -> None:
    path = tmp_path / "oom.pickle"
    path.write_bytes(pickle.dumps(oom_snapshot(8 * MIB, 0), protocol=4))
    full = gpuheap.tune(path)
    cli_rows = {r["setting"]: r for r in run_cli("tune", str(path))["rows"]}
    gc = [r for r in full.rows if "garbage_collection_threshold" in r["setting"]]
    assert len(gc) == 3
    for r in gc:
        # PyTorch collects only with a per-process memory fraction set: the row sets 1.0.
        assert r["memory_fraction"] == 1.0 and "per_process_memory_fraction:1" in r["env"]
    for r in full.rows:
        assert strip_timing(r) == strip_timing(cli_rows[r["setting"]])
    keep = ["expandable_segments:True", "(defaults)", "first-fit"]
    part = gpuheap.tune(path, settings=keep)
    assert sorted(r["setting"] for r in part.rows) == sorted(keep)
    # The kept rows are ranked among themselves, as `gpuheap tune --settings` ranks them.
    cli_kept = {r["setting"]: r for r in run_cli("tune", str(path), *[f"--settings={k}" for k in keep])["rows"]}
    for r in part.rows:
        assert strip_timing(r) == strip_timing(cli_kept[r["setting"]])
        without_rank = {k: v for k, v in strip_timing(r).items() if k != "rank"}
        assert without_rank == {k: v for k, v in strip_timing(cli_rows[r["setting"]]).items() if k != "rank"}
    assert part.best is not None and part.best["kind"] == "pytorch" and part.best_env == part.best["env"]
    assert part["replays"] == sum(r["replays"] for r in part.rows)
    # The page is the library's, rendered from the kept rows only.
    assert "first-fit" in str(part) and "best-fit" not in str(part)
    with pytest.raises(gpuheap.ConfigError, match="not rows of the grid"):
        gpuheap.tune(path, settings=["no such row"])
    with pytest.raises(gpuheap.ConfigError, match="settings"):
        gpuheap.tune(path, settings="(defaults)")


def test_explain_tune_table_is_the_cli_table(tmp_path: Path, cli: Path) -> None:
    path = tmp_path / "oom.pickle"
    path.write_bytes(pickle.dumps(oom_snapshot(8 * MIB, 0), protocol=4))
    e = gpuheap.explain(path)
    table = str(e.tune)
    assert table.startswith("Settings ranked by the least GPU memory")
    assert table in str(e) and str(e) == _text(cli, "explain", str(path))
