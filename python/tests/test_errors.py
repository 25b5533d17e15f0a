"""Bad inputs and bad options raise the documented exceptions (never a crash)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import gpuheap
from conftest import load_plain

DATA = Path(__file__).resolve().parents[2] / "data"
SNAPSHOT = DATA / "1.3b_snapshot.pickle"


def test_hierarchy() -> None:
    for cls in (gpuheap.TraceError, gpuheap.ConfigError, gpuheap.BackendError, gpuheap.TorchError, gpuheap.InternalError):
        assert issubclass(cls, gpuheap.Error)
    assert issubclass(gpuheap.TraceError, ValueError) and issubclass(gpuheap.ConfigError, ValueError)
    assert issubclass(gpuheap.BackendError, RuntimeError) and issubclass(gpuheap.TorchError, ImportError)


def test_import_never_imports_torch() -> None:
    code = "import sys, gpuheap, gpuheap.torch; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_truncated_pickle() -> None:
    data = SNAPSHOT.read_bytes()
    with pytest.raises(gpuheap.TraceError, match=r"<bytes>: truncated pickle"):
        gpuheap.load(data[: len(data) // 2])


def test_truncated_file(tmp_path: Path) -> None:
    p = tmp_path / "cut.pickle"
    p.write_bytes(SNAPSHOT.read_bytes()[:1000])
    with pytest.raises(gpuheap.TraceError, match="truncated pickle") as e:
        gpuheap.load(p)
    assert str(p) in str(e.value)


class _RunsCode:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204
        return (os.mkdir, (self.marker,))


def test_pickle_that_runs_code_is_refused_unrun(tmp_path: Path) -> None:
    marker = tmp_path / "was-run"
    payload = pickle.dumps({"segments": [], "x": _RunsCode(str(marker))}, protocol=4)
    with pytest.raises(gpuheap.TraceError, match=r"asks to run code \(global `(posix|os)\.mkdir`\)"):
        gpuheap.load(payload)
    assert not marker.exists()


def test_dict_holding_an_object_is_refused_unpickled(tmp_path: Path) -> None:
    marker = tmp_path / "was-run"
    snap = {"segments": [{"blocks": [{"frames": [_RunsCode(str(marker))]}]}]}
    with pytest.raises(gpuheap.TraceError, match=r"\['segments'\]\[0\]\['blocks'\]\[0\]\['frames'\]\[0\].*_RunsCode"):
        gpuheap.load(snap)
    assert not marker.exists()


def test_dict_missing_segments() -> None:
    with pytest.raises(gpuheap.TraceError, match="key `segments` is missing"):
        gpuheap.load({"device_traces": []})


def test_dict_with_wrong_types() -> None:
    with pytest.raises(gpuheap.TraceError, match="key `segments`: expected a list"):
        gpuheap.load({"segments": "all of them"})
    with pytest.raises(gpuheap.TraceError, match="key `device_traces`: expected a list"):
        gpuheap.load({"segments": [], "device_traces": {0: []}})
    # A wrong value inside a segment: the Rust reader names the segment and the field.
    snap = load_plain(SNAPSHOT)
    snap["segments"][3]["total_size"] = "two megabytes"
    with pytest.raises(gpuheap.TraceError, match=r"<dict>: segment 3.*total_size"):
        gpuheap.load(snap)
    snap = load_plain(SNAPSHOT)
    snap["segments"][0]["blocks"][0]["size"] = -5
    with pytest.raises(gpuheap.TraceError, match=r"<dict>: segment 0, block 0"):
        gpuheap.load(snap)


def test_not_a_dict_subclass() -> None:
    class D(dict):
        pass

    with pytest.raises(gpuheap.TraceError, match="is a dict"):
        gpuheap.load(D(segments=[]))

    class OrderedList(list):
        pass

    with pytest.raises(gpuheap.TraceError, match=r"key `segments`: expected a list, found .*OrderedList"):
        gpuheap.load({"segments": OrderedList()})
    with pytest.raises(gpuheap.TraceError, match=r"key `\['segments'\]\[0\]`: a value of type .*OrderedList"):
        gpuheap.load({"segments": [OrderedList()]})


def test_huge_keys_are_quoted_in_short() -> None:
    # A key of a megabyte used to be repeated whole in the message (as the Rust reader's values were).
    huge = "k" * 1_000_000
    with pytest.raises(gpuheap.TraceError) as e:
        gpuheap.load({"segments": [{huge: [object()]}]})
    assert len(str(e.value)) < 400 and "(1000002 characters)" in str(e.value)
    with pytest.raises(gpuheap.TraceError) as e:
        gpuheap.load({"segments": [{(huge,): 1}]})
    assert len(str(e.value)) < 400 and "keys must be str or int" in str(e.value)


def test_recursive_dict() -> None:
    snap: dict = {"segments": []}
    snap["segments"].append(snap)
    with pytest.raises(gpuheap.TraceError, match="contains itself"):
        gpuheap.load(snap)


def test_wrong_source_type() -> None:
    with pytest.raises(TypeError):
        gpuheap.load(42)  # type: ignore[arg-type]


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(gpuheap.TraceError, match="cannot read"):
        gpuheap.load(tmp_path / "nope.pickle")
    with pytest.raises(gpuheap.TraceError, match="is a directory"):
        gpuheap.load(tmp_path)
    (tmp_path / "empty.pickle").write_bytes(b"")
    with pytest.raises(gpuheap.TraceError, match="empty file"):
        gpuheap.load(tmp_path / "empty.pickle")
    with pytest.raises(gpuheap.TraceError, match="unknown trace format"):
        gpuheap.load(b"hello, world\n")


def test_bad_options() -> None:
    snap = gpuheap.load(SNAPSHOT)
    with pytest.raises(gpuheap.ConfigError, match="strategy"):
        gpuheap.replay(snap, "worst-fit")
    with pytest.raises(gpuheap.ConfigError, match="capacity: unknown unit"):
        gpuheap.replay(snap, "best-fit", capacity="12 parsecs")
    with pytest.raises(gpuheap.ConfigError, match="negative"):
        gpuheap.replay(snap, "best-fit", capacity=-1)
    with pytest.raises(gpuheap.ConfigError, match="capacity"):
        gpuheap.replay(snap, "best-fit", capacity=True)  # type: ignore[arg-type]
    with pytest.raises(gpuheap.ConfigError, match="compaction policy"):
        gpuheap.replay(snap, "best-fit", compact="sometimes")
    with pytest.raises(gpuheap.ConfigError, match="not a fraction"):
        gpuheap.replay(snap, "best-fit", compact="threshold=2")
    with pytest.raises(gpuheap.ConfigError, match=r"no device 7 in the trace \(device 0: \d+ events, \d+ allocations\)"):
        gpuheap.replay(snap, "best-fit", device=7)
    with pytest.raises(gpuheap.ConfigError, match="backend"):
        gpuheap.replay(snap, "best-fit", backend="tpu")
    with pytest.raises(gpuheap.ConfigError, match="device capacity must lie in"):
        gpuheap.replay(snap, "caching", capacity="1MiB")
    with pytest.raises(gpuheap.ConfigError, match="device_heap_limit"):
        gpuheap.compare(snap, device_heap_limit="lots")
    with pytest.raises(gpuheap.ConfigError, match="align: alignment 3000 B is not a power of two"):
        gpuheap.replay(snap, "best-fit", align=3000)
    with pytest.raises(gpuheap.ConfigError, match="tiers: .* is not SMALL_MAX,LARGE_MIN"):
        gpuheap.replay(snap, "tiered", tiers="1KiB")
    with pytest.raises(gpuheap.ConfigError, match="SMALL_MAX must be a power of two and below LARGE_MIN"):
        gpuheap.replay(snap, "tiered", tiers=(3000, 65536))
    with pytest.raises(gpuheap.ConfigError, match=r"tiers: expected \(SMALL_MAX, LARGE_MIN\)"):
        gpuheap.replay(snap, "tiered", tiers=(1024,))  # type: ignore[arg-type]
    with pytest.raises(gpuheap.ConfigError, match="tiers apply to the tiered strategy only"):
        gpuheap.replay(snap, "best-fit", tiers="1KiB,1MiB")
    with pytest.raises(gpuheap.ConfigError, match="LARGE_MIN is above the capacity"):
        gpuheap.replay(snap, "tiered", tiers="1KiB,1TiB")


def test_gpu_backend_without_gpu_is_backend_error() -> None:
    try:
        from gpuheap import _gpuheap  # noqa: F401
    except ImportError:  # pragma: no cover
        pytest.skip("no extension")
    k = gpuheap.load(DATA / "K.1048576.csv")
    try:
        gpuheap.replay(k, "best-fit", compact="on-oom", backend="gpu")
    except gpuheap.BackendError as e:
        assert str(e)
    else:
        pytest.skip("a usable GPU is present: backend='gpu' succeeded")


def test_panic_is_caught_as_internal_error() -> None:
    with pytest.raises(gpuheap.InternalError, match="test panic"):
        gpuheap._gpuheap._panic_for_test()
    # The interpreter and the module still work afterwards.
    assert gpuheap.replay(SNAPSHOT, "best-fit").peak_allocated > 0


def test_device_outside_int64_is_config_error() -> None:
    # Used to escape as OverflowError ("Python int too large to convert to C long"), naming no option.
    snap = gpuheap.load(SNAPSHOT)
    for d in (2**63, -(2**63) - 1, 2**64):
        with pytest.raises(gpuheap.ConfigError, match=rf"device: {d} does not fit in a signed 64-bit integer"):
            gpuheap.replay(snap, "best-fit", device=d)
        with pytest.raises(gpuheap.ConfigError, match="device"):
            gpuheap.explain(snap, device=d)


def test_explain_and_tune_refuse_a_capacity_outside_the_modelled_range() -> None:
    # explain/tune took 0 B, 1 B and 2^48 + 1 B (the CLI's --capacity refuses them, exit 2).
    snap = gpuheap.load(SNAPSHOT)
    for c in (0, 1, "4095", 2**48 + 1):
        with pytest.raises(gpuheap.ConfigError, match=r"capacity \d+ B is outside \[4096 B, 2\^48 B\]"):
            gpuheap.explain(snap, c, tune=False)
        with pytest.raises(gpuheap.ConfigError, match=r"is outside \[4096 B, 2\^48 B\]"):
            gpuheap.tune(snap, c)


def test_tune_settings_holding_a_non_str_names_it() -> None:
    # A list holding bytes or None was reported as "not one str".
    snap = gpuheap.load(SNAPSHOT)
    for bad in ([b"best-fit"], ["best-fit", None]):
        with pytest.raises(gpuheap.ConfigError, match=r"settings\[\d\]: expected a setting name \(str\), not (bytes|NoneType)"):
            gpuheap.tune(snap, settings=bad)


def test_replay_and_compare_pick_the_device_with_the_oom_as_the_cli_does(tmp_path: Path, run_cli) -> None:
    # Two devices, the OOM on device 1: the CLI (and explain) report device 1; replay and compare took
    # the first device with events, device 0, so their numbers differed from the CLI's for the same input.
    mib = 1 << 20
    a, b = 0x7F00_0000_0000, 0x7F00_6400_0000

    def ev(action: str, addr: int, size: int) -> dict:
        return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": 1}

    snap = {
        "segments": [],
        "device_traces": [
            [ev("segment_alloc", a, 20 * mib), ev("alloc", a, 4 * mib), ev("alloc", a + 4 * mib, 4 * mib)],
            [ev("segment_alloc", b, 20 * mib), ev("alloc", b, 4 * mib),
             {"action": "oom", "size": 30 * mib, "device_free": mib, "stream": 0, "time_us": 2}],
        ],
    }
    path = tmp_path / "oom_on_device_1.pickle"
    path.write_bytes(pickle.dumps(snap))
    assert gpuheap.replay(path, "best-fit", backend="cpu").device == 1
    assert gpuheap.compare(path, backend="cpu").device == 1
    assert run_cli("replay", str(path), "--strategy", "best-fit", "--backend", "cpu")["device"] == 1
    assert gpuheap.replay(path, "best-fit", backend="cpu", device=0).device == 0


def test_a_trace_with_nothing_to_report_is_trace_error_in_every_command() -> None:
    """No device has allocation events or live blocks: the trace is at fault, whatever the options, so
    ``TraceError`` (an input error, as the CLI's exit code 2), not ``ConfigError``."""
    for empty in ({"segments": [], "device_traces": []}, {"segments": [], "device_traces": [[], []]}):
        for f in (lambda: gpuheap.replay(empty, "best-fit"), lambda: gpuheap.compare(empty),
                  lambda: gpuheap.explain(empty, tune=False), lambda: gpuheap.explain(empty),
                  lambda: gpuheap.tune(empty)):
            with pytest.raises(gpuheap.TraceError, match="no device has allocation events or live blocks"):
                f()
    # A device the trace lacks stays an option that does not fit.
    with pytest.raises(gpuheap.ConfigError, match="no device 7"):
        gpuheap.replay(SNAPSHOT, "best-fit", device=7)


def test_large_ints_are_named_exactly_never_through_a_float() -> None:
    """A byte count outside 0..2^64 is named with all its digits (it was converted to a float first:
    ``18446744073709552000``)."""
    for v in (2**64, 2**64 + 1, 2**70 + 3, -(2**64) - 1, -1, 10**30 + 7):
        for kw in ({"capacity": v}, {"align": v}, {"materialize_limit": v}):
            with pytest.raises(gpuheap.ConfigError) as e:
                gpuheap.replay(SNAPSHOT, "best-fit", **kw)
            assert f"`{v}`" in str(e.value), (kw, str(e.value))
        with pytest.raises(gpuheap.ConfigError, match=f"`{v}`"):
            gpuheap.replay(SNAPSHOT, "tiered", tiers=(v, 2**20))


def test_pickles_of_every_protocol_load_from_bytes_and_path(tmp_path: Path) -> None:
    """``load(bytes)`` and ``load(path)`` read protocol 0 and 1 pickles (text opcodes, no PROTO header)
    as they read 2 to 5, to the same trace."""
    plain = load_plain(Path(SNAPSHOT))
    want = gpuheap.explain(SNAPSHOT, tune=False).to_dict()
    want.pop("trace")
    for protocol in range(0, pickle.HIGHEST_PROTOCOL + 1):
        data = pickle.dumps(plain, protocol=protocol)
        path = tmp_path / f"p{protocol}.pickle"
        path.write_bytes(data)
        for source in (data, path):
            snap = gpuheap.load(source)
            assert snap.format.startswith("PyTorch memory snapshot"), (protocol, snap)
            got = gpuheap.explain(snap, tune=False).to_dict()
            got.pop("trace")
            assert got == want, protocol


def test_control_characters_in_messages_are_escaped(tmp_path: Path) -> None:
    """A NUL, an escape sequence or a newline in a value the user gives is escaped in the message (the
    library's error type escapes every control character, for the CLI and Python alike)."""
    with pytest.raises(gpuheap.TraceError) as e:
        gpuheap.load(tmp_path / "a\x1b[31mb\nc\x07.pickle")
    assert r"a\u{1b}[31mb\nc\u{7}.pickle" in str(e.value)
    for bad in ("8\0GiB", "8\x1bGiB"):
        with pytest.raises(gpuheap.ConfigError) as e:
            gpuheap.replay(SNAPSHOT, "best-fit", capacity=bad)
        assert not any(ord(c) < 32 or ord(c) == 127 for c in str(e.value)), repr(str(e.value))


def test_a_path_given_as_bytes_is_refused_with_the_hint_to_pass_str() -> None:
    # load(b"/path/x.pickle") reads the bytes as content: the error only said "unknown trace format".
    with pytest.raises(gpuheap.TraceError, match=r"is a file: pass its path as str or pathlib.Path"):
        gpuheap.load(os.fsencode(SNAPSHOT))
    with pytest.raises(gpuheap.TraceError) as e:
        gpuheap.load(b"not a trace")
    assert "pass its path" not in str(e.value)
