"""The out-of-memory observer: catch the next "CUDA out of memory" with its snapshot and explanation.

In a training script::

    import gpuheap.torch
    torch.cuda.memory._record_memory_history(max_entries=100_000)   # optional: events before the OOM
    gpuheap.torch.install_oom_observer("oom-{device}-{pid}.pickle")

When PyTorch's caching allocator fails a request, it calls the observer (before it raises
``torch.OutOfMemoryError``); the observer takes ``torch.cuda.memory._snapshot()`` (with the event
history when ``_record_memory_history`` is on), writes it to ``path`` if given (the same pickle
``torch.cuda.memory._dump_snapshot`` writes, so ``gpuheap`` and PyTorch's viewer read it), and
prints or logs the explanation.

Importing this module does not import torch; :func:`install_oom_observer` does.

PyTorch versions. The observer uses two private hooks of PyTorch's CUDA caching allocator:

* ``torch._C._cuda_attach_out_of_memory_observer`` (with ``torch.cuda.memory._snapshot()``'s
  ``device_traces``): added by pytorch/pytorch#86241 (October 2022), first released in PyTorch
  2.0.0; 1.13.1 lacks it (pytorch/pytorch#102957), and so does a CPU-only build. In 2.0.x the hook
  registers the observer with the current device's allocator only, and crashes the process when
  the CUDA allocator is not initialised yet (pytorch/pytorch#102796, #107330); pytorch/pytorch#107399
  (August 2023, PyTorch 2.1.0) initialises CUDA and registers it on every device.
  :func:`install_oom_observer` calls ``torch.cuda.init()`` first, so 2.0.x does not crash; there,
  set the training device (``torch.cuda.set_device``) before installing it.
* ``torch.cuda.memory._record_memory_history`` (optional: the events before the OOM): the form
  above (``max_entries=``) is PyTorch 2.1's and later's; PyTorch 2.0 takes
  ``_record_memory_history(True, trace_alloc_max_entries=100_000, trace_alloc_record_context=True)``
  (2.1 and later still take it: a ``bool`` first argument goes to ``_record_memory_history_legacy``).

PyTorch calls the observer as ``observer(device, requested bytes, device total bytes (or the limit
of set_per_process_memory_fraction), driver free bytes)`` (c10/cuda/CUDACachingAllocator.cpp,
``DeviceCachingAllocator::malloc``, before it raises).

What was tested: the wiring, against a stand-in ``torch`` module that records the registered
callback and calls it with a real snapshot dict (``python/tests/test_torch_observer.py``). Not
tested here: a CUDA build of PyTorch on a GPU (none was available to the project).
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
import time
from typing import Any, Callable, Optional, Union

from ._errors import TorchError

__all__ = ["install_oom_observer", "OomObserver"]

_HOOK = "_cuda_attach_out_of_memory_observer"

Log = Union[logging.Logger, Callable[[str], Any], None]


def _fmt(b: int) -> str:
    from ._gpuheap import fmt_bytes

    return fmt_bytes(int(b))


class OomObserver:
    """The callback registered with PyTorch (see :func:`install_oom_observer`).

    Attributes:
        calls: how many out-of-memory errors it has observed.
        last_path: the snapshot file written at the last one (``None`` without ``path``).
        last_report: the text printed or logged at the last one.
        last_error: the exception the last call caught, if any (the observer never raises into
            PyTorch's allocator; a failure is logged instead).
    """

    def __init__(self, torch_module: Any, path: Optional[str], explain: bool, tune: bool, log: Log) -> None:
        self._torch = torch_module
        self.path = path
        self.explain = explain
        self.tune = tune
        self._log = log
        self.calls = 0
        self.last_path: Optional[str] = None
        self.last_report: Optional[str] = None
        self.last_error: Optional[BaseException] = None

    def _emit(self, text: str) -> None:
        if isinstance(self._log, logging.Logger):
            self._log.error(text)
        elif self._log is not None:
            self._log(text)
        else:
            print(text, file=sys.stderr, flush=True)

    def _write(self, snapshot: dict, device: int) -> str:
        assert self.path is not None
        path = self.path.format(device=device, pid=os.getpid(), time=time.strftime("%Y%m%d-%H%M%S"))
        tmp = f"{path}.{os.getpid()}.partial"
        try:
            with open(tmp, "wb") as f:
                pickle.dump(snapshot, f, protocol=4)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        return path

    def __call__(self, device: int, alloc: int, device_total: int, device_free: int) -> None:
        """Called by PyTorch as ``observer(device, requested bytes, device total (or the limit set by
        set_per_process_memory_fraction) bytes, driver free bytes)``."""
        self.calls += 1
        self.last_error = None
        lines = [
            f"gpuheap: CUDA out of memory on device {device}: {_fmt(alloc)} requested, "
            f"{_fmt(device_free)} free on the device of {_fmt(device_total)}"
        ]
        try:
            snapshot = self._torch.cuda.memory._snapshot()
            if self.path is not None:
                self.last_path = self._write(snapshot, device)
                lines.append(f"gpuheap: snapshot written to {self.last_path}")
            if self.explain or self.tune:
                lines.extend(_analyse(snapshot, device, device_total, self.explain, self.tune))
        except Exception as e:  # never raise into the allocator's OOM path
            self.last_error = e
            lines.append(f"gpuheap: the OOM observer failed: {type(e).__name__}: {e}")
        self.last_report = "\n".join(lines)
        self._emit(self.last_report)


def _analyse(snapshot: dict, device: int, capacity: int, explain: bool, tune: bool) -> list[str]:
    """The report on ``device``, the GPU that ran out (``capacity``: its total bytes). Named explicitly:
    left to the default, a snapshot of several GPUs would be explained on the first device with a
    recorded OOM, which need not be this one."""
    import gpuheap

    snap = gpuheap.load(snapshot)
    try:
        if explain:
            return [str(gpuheap.explain(snap, capacity=capacity, device=device, tune=tune))]
        if tune:
            return [str(gpuheap.tune(snap, capacity=capacity, device=device))]
    except NotImplementedError as e:  # a build without the explain bindings
        return [f"gpuheap: {e}", gpuheap.replay(snap, "caching", capacity=capacity, device=device).summary()]
    return []


def install_oom_observer(
    path: Optional[Union[str, "os.PathLike[str]"]] = None,
    explain: bool = True,
    tune: bool = False,
    *,
    log: Log = None,
) -> OomObserver:
    """Registers an out-of-memory observer with PyTorch's CUDA caching allocator.

    Args:
        path: where to write the snapshot at an OOM (a pickle, as ``_dump_snapshot`` writes);
            ``{device}``, ``{pid}`` and ``{time}`` in it are replaced (one file per rank and OOM).
            ``None``: nothing is written.
        explain: print or log :func:`gpuheap.explain` of the snapshot, with the device's memory
            (bytes, as PyTorch reports it to the observer) as the capacity.
        tune: also print or log :func:`gpuheap.tune` (replays the trace under each candidate
            setting; takes longer).
        log: a :class:`logging.Logger` (the report goes to ``.error``) or a callable taking the
            text; ``None``: printed to stderr.

    Returns:
        The registered :class:`OomObserver` (PyTorch offers no way to remove it).

    Raises:
        TorchError: torch cannot be imported, it has no ``torch._C._cuda_attach_out_of_memory_observer``
            (a CPU-only build, or PyTorch older than 2.0.0), or CUDA cannot be initialised (no GPU or
            driver).
    """
    try:
        import torch
    except ImportError as e:
        raise TorchError(f"gpuheap.torch.install_oom_observer needs PyTorch: import torch failed: {e}") from e
    hook = getattr(getattr(torch, "_C", None), _HOOK, None)
    if hook is None:
        version = getattr(torch, "__version__", "unknown")
        raise TorchError(
            f"gpuheap.torch.install_oom_observer: this PyTorch ({version}) has no torch._C.{_HOOK} "
            "(it needs a CUDA build of PyTorch 2.0.0 or later)"
        )
    # PyTorch 2.0.x's hook dereferences the allocator without initialising it (a crash, not an
    # exception); 2.1.0 and later initialise it inside the hook. Initialising first is the same there.
    try:
        torch.cuda.init()
    except Exception as e:  # torch raises RuntimeError (or AssertionError in old builds) without a GPU
        raise TorchError(f"gpuheap.torch.install_oom_observer: CUDA cannot be initialised: {e}") from e
    observer = OomObserver(torch, None if path is None else os.fspath(path), explain, tune, log)
    hook(observer)
    return observer
