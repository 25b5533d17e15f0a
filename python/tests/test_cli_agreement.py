"""The Python functions give the same numbers as the CLI's --json for the same input and options."""

from __future__ import annotations

from pathlib import Path

import pytest

import gpuheap
import os
import subprocess

from conftest import all_traces, empty_traces, load_plain, pickle_traces, strip_timing

CLI_SUFFIX = " (choose another strategy with --strategy, or a larger --capacity)"


def _same_comparison(py: dict, cli: dict) -> None:
    assert [r["strategy"] for r in py["strategies"]] == [r["strategy"] for r in cli["strategies"]]
    assert strip_timing(py["strategies"]) == strip_timing(cli["strategies"])
    assert py["pytorch"] == cli["pytorch"]
    assert py["device"] == cli["device"] and py["trace"] == cli["trace"]
    # The CLI adds advice about its own flags to a not-run reason; the reason itself is the same.
    assert [(n["strategy"], n["reason"]) for n in py["not_run"]] == [
        (n["strategy"], n["reason"].removesuffix(CLI_SUFFIX))
        for n in cli["not_run"]
    ]


@pytest.mark.parametrize("trace", all_traces())
def test_compare_matches_cli(trace: Path, run_cli) -> None:
    cli = run_cli("compare", str(trace), "--backend", "cpu")
    py = gpuheap.compare(str(trace), backend="cpu")
    _same_comparison(py.to_dict(), cli)
    assert len(py.strategies) == len(cli["strategies"])


@pytest.mark.parametrize("trace", all_traces())
def test_replay_caching_matches_cli(trace: Path, run_cli) -> None:
    py = gpuheap.load(trace)
    try:
        report = gpuheap.replay(py, "caching", backend="cpu")
    except gpuheap.ConfigError as e:  # the caching model needs >= 2 MiB: the CLI refuses too
        assert "device capacity" in str(e)
        return
    cli = run_cli("replay", str(trace), "--strategy", "caching", "--backend", "cpu")
    assert strip_timing(report.to_dict()) == strip_timing(cli)


def test_replay_options_match_cli(run_cli) -> None:
    """Capacity with a unit, on-OOM compaction measured on the CPU backend, a threshold policy."""
    k = gpuheap.load(Path(__file__).resolve().parents[2] / "data" / "K.1048576.csv")
    for strategy, opts, args in [
        ("best-fit", {"compact": "on-oom"}, ["--compact", "on-oom"]),
        ("tlsf", {"capacity": "2MiB", "compact": "threshold=0.5"}, ["--capacity", "2MiB", "--compact", "threshold=0.5"]),
        ("first-fit", {"capacity": 1048576}, ["--capacity", "1048576"]),
        ("best-fit", {"align": "4KiB"}, ["--align", "4KiB"]),
        ("tiered", {"tiers": ("1KiB", 65536)}, ["--tiers", "1KiB,65536"]),
        ("tiered", {"tiers": "2KiB,128KiB", "align": 256}, ["--tiers", "2KiB,128KiB", "--align", "256"]),
    ]:
        py = gpuheap.replay(k, strategy, backend="cpu", **opts)
        cli = run_cli("replay", k.source, "--strategy", strategy, "--backend", "cpu", *args)
        assert strip_timing(py.to_dict()) == strip_timing(cli), (strategy, opts)
    # The options reached the replay: the report states them.
    assert gpuheap.replay(k, "best-fit", align="4KiB", backend="cpu").to_dict()["align"] == 4096
    tiered = gpuheap.replay(k, "tiered", tiers=("1KiB", 65536), backend="cpu").to_dict()
    assert tiered["tiers"] != gpuheap.replay(k, "tiered", backend="cpu").to_dict()["tiers"]
    # The tiers reach compare's tiered row only; the other rows are those of a plain compare.
    cmp = gpuheap.compare(k, tiers="1KiB,64KiB", backend="cpu").to_dict()
    cli = run_cli("compare", k.source, "--tiers", "1KiB,64KiB", "--backend", "cpu")
    _same_comparison(cmp, cli)
    # On-OOM compaction really ran (the K trace fails for fragmentation without it).
    assert len(gpuheap.replay(k, "best-fit", compact="on-oom", backend="cpu").compactions) > 0


@pytest.mark.parametrize("trace", pickle_traces())
def test_bytes_and_dict_give_the_same_numbers(trace: Path) -> None:
    """A snapshot loaded from its path, its bytes and its dict (as torch.cuda.memory._snapshot()
    returns it) replays to the same report, but for the name of the source."""
    by_path = gpuheap.replay(trace, "best-fit").to_dict()
    by_bytes = gpuheap.replay(trace.read_bytes(), "best-fit").to_dict()
    plain = load_plain(trace)
    by_dict = gpuheap.replay(plain, "best-fit").to_dict()
    # A bare list of segments (the oldest layout) is loaded as a list, the rest as a dict.
    for d, name in [(by_bytes, "<bytes>"), (by_dict, "<list>" if isinstance(plain, list) else "<dict>")]:
        assert d["trace"] == name
        d["trace"] = by_path["trace"]
        assert strip_timing(d) == strip_timing(by_path)


@pytest.mark.parametrize("trace", empty_traces())
def test_a_snapshot_that_records_nothing_is_refused_alike(trace: Path, cli: Path) -> None:
    """A dump with no segment and no event (``sam2_ppo_ddp_empty_expandable_4dev``: four empty device
    slots): the CLI exits 2 and Python raises ``TraceError`` (the trace is at fault), with the same message."""
    env = dict(os.environ, GPUHEAP_BACKEND="cpu")
    r = subprocess.run([str(cli), "compare", str(trace), "--json"], capture_output=True, text=True, env=env, check=False)
    assert r.returncode == 2 and "nothing to report" in r.stderr, r.stderr
    with pytest.raises(gpuheap.TraceError) as e:
        gpuheap.compare(gpuheap.load(trace))
    assert str(e.value) in r.stderr
