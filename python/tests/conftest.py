"""Shared fixtures: the traces (data/ and the shared traces folder) and the CLI binary.

* Traces: every file of ``data/`` that is a trace, and every trace in the shared traces folder
  (``traces/`` of ``$GPUHEAP_SHARED``, else of ``shared/`` beside the repository); the shared ones
  are skipped with a message when the folder is absent, and fail the run under
  ``GPUHEAP_REQUIRE_SHARED=1`` (``.ci/run`` sets it).
* The CLI: ``$GPUHEAP_CLI`` (scripts/test sets it to the binary it built; then a missing binary is
  an error, not a skip), else the newest ``target/{ci,release,debug}/gpuheap``; tests that compare
  with the CLI are skipped with a message when there is none.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
from pathlib import Path

import pytest

# The CPU backend runs a launch's blocks in parallel on rayon's pool, so where the device heap places a
# block (and every figure that follows from placement: footprint, fragmentation) can differ between two
# runs of one replay, as on a GPU. The two interfaces are compared on one worker thread, where a replay
# is deterministic; the CLI subprocesses inherit the setting.
os.environ["RAYON_NUM_THREADS"] = "1"

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data"
SHARED = Path(os.environ.get("GPUHEAP_SHARED", ROOT.parent / "shared")) / "traces"
TRACE_SUFFIXES = (".pickle", ".pkl", ".csv")

# Run-time measurements: they differ between two runs of the same replay.
TIMING_KEYS = {"replay_ns", "events_per_s", "kernel_ns", "plan_ns", "move_ns", "wall_ns", "wall_s", "gbps"}


def data_traces() -> list[Path]:
    return sorted(p for p in DATA.iterdir() if p.suffix in TRACE_SUFFIXES)


def _records_nothing(p: Path) -> bool:
    """A snapshot with no segment and no trace event on any device (an idle process's dump): every
    command refuses it as "nothing to report" (tested apart, in ``empty_traces``)."""
    if p.suffix == ".csv":
        return False
    try:
        d = load_plain(p)
    except pickle.UnpicklingError:
        return False
    return isinstance(d, dict) and not d.get("segments") and not any(d.get("device_traces") or [])


def shared_traces() -> list[Path]:
    if not SHARED.is_dir():
        return []
    return sorted(p for p in SHARED.iterdir() if p.suffix in TRACE_SUFFIXES and not _records_nothing(p))


def empty_traces() -> list[Path]:
    """The shared snapshots that record nothing (see ``_records_nothing``)."""
    if not SHARED.is_dir():
        return []
    return sorted(p for p in SHARED.iterdir() if p.suffix in TRACE_SUFFIXES and _records_nothing(p))


def all_traces() -> list:
    params = [pytest.param(p, id=f"data/{p.name}") for p in data_traces()]
    shared = shared_traces()
    if shared:
        params += [pytest.param(p, id=f"shared/{p.name}") for p in shared]
    elif os.environ.get("GPUHEAP_REQUIRE_SHARED") == "1":
        raise RuntimeError(f"GPUHEAP_REQUIRE_SHARED=1 but the shared traces folder {SHARED} is absent")
    else:
        params.append(
            pytest.param(
                None,
                id="shared-absent",
                marks=pytest.mark.skip(reason=f"shared traces folder {SHARED} is absent"),
            )
        )
    return params


def pickle_traces() -> list:
    return [p for p in all_traces() if p.values[0] is None or p.values[0].suffix != ".csv"]


class _PlainUnpickler(pickle.Unpickler):
    """Loads plain data only (as SOURCES.md describes how the shared pickles were opened)."""

    def find_class(self, module: str, name: str):  # noqa: ANN201
        raise pickle.UnpicklingError(f"refused global {module}.{name}")


def load_plain(path: Path) -> dict:
    with open(path, "rb") as f:
        return _PlainUnpickler(f).load()


def strip_timing(v):  # noqa: ANN001, ANN201
    if isinstance(v, dict):
        return {k: strip_timing(x) for k, x in v.items() if k not in TIMING_KEYS}
    if isinstance(v, list):
        return [strip_timing(x) for x in v]
    return v


def _find_cli() -> Path | None:
    env = os.environ.get("GPUHEAP_CLI")
    if env:
        p = Path(env)
        if not p.is_file():
            raise RuntimeError(f"GPUHEAP_CLI={env} is not a file")
        return p
    targets = [Path(os.environ["CARGO_TARGET_DIR"])] if "CARGO_TARGET_DIR" in os.environ else []
    targets.append(ROOT / "target")
    found = [t / prof / "gpuheap" for t in targets for prof in ("ci", "release", "debug")]
    found = [p for p in found if p.is_file()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


@pytest.fixture(scope="session")
def cli() -> Path:
    p = _find_cli()
    if p is None:
        pytest.skip("no gpuheap CLI binary (set GPUHEAP_CLI or build it with cargo build --release)")
    return p


@pytest.fixture(scope="session")
def run_cli(cli: Path):
    """Runs ``gpuheap ARGS --json`` and returns the parsed JSON (GPUHEAP_BACKEND=cpu for both sides)."""

    def run(*args: str) -> dict:
        env = dict(os.environ, GPUHEAP_BACKEND="cpu")
        r = subprocess.run([str(cli), *args, "--json"], capture_output=True, text=True, env=env, check=False)
        assert r.returncode == 0, f"gpuheap {' '.join(args)} exited {r.returncode}: {r.stderr}"
        return json.loads(r.stdout)

    return run
