"""The OOM observer's wiring, against a stand-in ``torch`` module.

The stand-in records the callback registered through ``torch._C._cuda_attach_out_of_memory_observer``
and calls it as PyTorch's caching allocator does (device, requested bytes, device total bytes,
driver free bytes); its ``torch.cuda.memory._snapshot()`` returns a real snapshot dict. A CUDA build
of PyTorch and a GPU were not available: the real hook is not exercised here.
"""

from __future__ import annotations

import logging
import sys
import types
from pathlib import Path

import pytest

import gpuheap
import gpuheap.torch
from conftest import load_plain

SNAPSHOT = Path(__file__).resolve().parents[2] / "data" / "1.3b_snapshot.pickle"


def fake_torch(snapshot=None, hook: bool = True, cuda_init=None) -> types.ModuleType:  # noqa: ANN001
    torch = types.ModuleType("torch")
    torch.__version__ = "0.0-stand-in"
    torch.observers = []
    torch._C = types.SimpleNamespace()
    if hook:

        def attach(observer) -> None:  # noqa: ANN001
            torch.calls.append("attach")
            torch.observers.append(observer)

        torch._C._cuda_attach_out_of_memory_observer = attach

    def _snapshot():  # noqa: ANN202
        if isinstance(snapshot, Exception):
            raise snapshot
        return snapshot

    def init() -> None:  # torch.cuda.init(): recorded, to check that it runs before the hook
        if isinstance(cuda_init, Exception):
            raise cuda_init
        torch.calls.append("cuda.init")

    torch.calls = []
    torch.cuda = types.SimpleNamespace(init=init, memory=types.SimpleNamespace(_snapshot=_snapshot))
    return torch


def test_observer_writes_the_snapshot_and_explains(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    snap = load_plain(SNAPSHOT)
    torch = fake_torch(snap)
    monkeypatch.setitem(sys.modules, "torch", torch)
    logged: list[str] = []
    obs = gpuheap.torch.install_oom_observer(str(tmp_path / "oom-{device}.pickle"), log=logged.append)
    assert torch.observers == [obs]
    # As CUDACachingAllocator calls it: device, alloc_size, device_total, device_free.
    torch.observers[0](0, 2 << 30, 80 << 30, 100 << 20)
    assert obs.last_error is None, obs.last_error
    written = tmp_path / "oom-0.pickle"
    assert obs.last_path == str(written) and written.is_file()
    assert not list(tmp_path.glob("*.partial"))
    # The file holds the snapshot taken at the OOM: it reads back to the same dict and numbers.
    assert load_plain(written) == snap
    a = gpuheap.replay(written, "caching", capacity=80 << 30).to_dict()
    b = gpuheap.replay(SNAPSHOT, "caching", capacity=80 << 30).to_dict()
    assert a["peak_reserved"] == b["peak_reserved"] and a["at_end"] == b["at_end"]
    assert len(logged) == 1 and logged[0] == obs.last_report
    assert "CUDA out of memory on device 0: 2.00 GiB requested, 100.00 MiB free on the device of 80.00 GiB" in logged[0]
    assert f"snapshot written to {written}" in logged[0]
    assert obs.calls == 1


def test_observer_to_a_logger_without_path(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    torch = fake_torch(load_plain(SNAPSHOT))
    monkeypatch.setitem(sys.modules, "torch", torch)
    log = logging.getLogger("gpuheap-test")
    obs = gpuheap.torch.install_oom_observer(log=log)
    with caplog.at_level(logging.ERROR, logger="gpuheap-test"):
        torch.observers[0](0, 1 << 20, 8 << 30, 0)
    assert obs.last_path is None and obs.last_error is None
    assert caplog.records and "CUDA out of memory on device 0" in caplog.records[0].getMessage()


def test_observer_prints_to_stderr_by_default(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    torch = fake_torch(load_plain(SNAPSHOT))
    monkeypatch.setitem(sys.modules, "torch", torch)
    gpuheap.torch.install_oom_observer(explain=False)
    torch.observers[0](1, 512, 1 << 30, 0)
    err = capsys.readouterr().err
    assert "CUDA out of memory on device 1: 512 B requested" in err


def test_observer_never_raises_into_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = fake_torch(RuntimeError("CUDA error: an illegal memory access"))
    monkeypatch.setitem(sys.modules, "torch", torch)
    logged: list[str] = []
    obs = gpuheap.torch.install_oom_observer(log=logged.append)
    torch.observers[0](0, 1, 2, 3)  # must not raise
    assert isinstance(obs.last_error, RuntimeError)
    assert "the OOM observer failed: RuntimeError: CUDA error" in logged[0]
    # A snapshot dict that is not plain data is reported the same way.
    torch2 = fake_torch({"device_traces": []})
    monkeypatch.setitem(sys.modules, "torch", torch2)
    obs2 = gpuheap.torch.install_oom_observer(log=logged.append)
    torch2.observers[0](0, 1, 2, 3)
    assert isinstance(obs2.last_error, gpuheap.TraceError) and "segments" in str(obs2.last_error)


def test_missing_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    with pytest.raises(gpuheap.TorchError, match="needs PyTorch"):
        gpuheap.torch.install_oom_observer()


def test_torch_without_the_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", fake_torch(hook=False))
    with pytest.raises(gpuheap.TorchError, match=r"0.0-stand-in.*_cuda_attach_out_of_memory_observer"):
        gpuheap.torch.install_oom_observer()


def test_observer_explains_the_device_that_ran_out(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two GPUs, device 0 with an earlier (caught) OOM recorded, device 1 running out now: the observer
    # explained the first device with a recorded OOM, device 0, at device 1's total bytes.
    mib = 1 << 20
    a, b = 0x7F00_0000_0000, 0x7F00_6400_0000

    def ev(action: str, addr: int, size: int) -> dict:
        return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": 1}

    def oom(size: int, free: int) -> dict:
        return {"action": "oom", "size": size, "device_free": free, "stream": 0, "time_us": 2}

    snap = {
        "segments": [],
        "device_traces": [
            [ev("segment_alloc", a, 20 * mib), ev("alloc", a, 4 * mib), oom(64 * mib, 8 * mib)],
            [ev("segment_alloc", b, 40 * mib), ev("alloc", b, 30 * mib), oom(32 * mib, 2 * mib)],
        ],
    }
    monkeypatch.setitem(sys.modules, "torch", fake_torch(snap))
    obs = gpuheap.torch.install_oom_observer(log=lambda _: None)
    obs(1, 32 * mib, 42 * mib, 2 * mib)
    assert obs.last_error is None, obs.last_error
    assert "device 1 is reported" in obs.last_report, obs.last_report
    assert "device 0 is reported" not in obs.last_report


def test_cuda_is_initialised_before_the_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    """PyTorch 2.0.x's hook crashes on an uninitialised allocator: torch.cuda.init() runs first."""
    torch = fake_torch(load_plain(SNAPSHOT))
    monkeypatch.setitem(sys.modules, "torch", torch)
    gpuheap.torch.install_oom_observer(log=lambda _: None)
    assert torch.calls == ["cuda.init", "attach"]


def test_cuda_that_cannot_be_initialised_is_torch_error(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = fake_torch(cuda_init=RuntimeError("Found no NVIDIA driver on your system"))
    monkeypatch.setitem(sys.modules, "torch", torch)
    with pytest.raises(gpuheap.TorchError, match="CUDA cannot be initialised: Found no NVIDIA driver"):
        gpuheap.torch.install_oom_observer()
    assert torch.observers == []
