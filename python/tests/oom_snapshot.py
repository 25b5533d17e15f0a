"""A hand-made snapshot dict with a recorded OOM (the one of the Rust tests in explain.rs).

Two 20 MiB segments recorded from empty: S1 holds A (8 MiB), B (4 MiB, freed) and C (8 MiB); S2
holds D (14 MiB) and a 6 MiB free tail. Then an ``oom`` of ``request`` bytes with ``device_free``.
At the OOM, by hand: reserved 40 MiB, allocated 30 MiB, holes 4 + 6 = 10 MiB, the largest 6 MiB.
"""

from __future__ import annotations

MIB = 1 << 20
S1 = 0x7F00_0000_0000
S2 = 0x7F00_1000_0000


def _frame(name: str, filename: str, line: int) -> dict:
    return {"name": name, "filename": filename, "line": line}


def _event(action: str, addr: int, size: int, frames: list | None = None) -> dict:
    return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": frames or []}


def oom_snapshot(request: int, device_free: int) -> dict:
    user = [
        _frame("malloc", "CUDACachingAllocator.cpp", 0),
        _frame("forward", "torch/nn/modules/linear.py", 125),
        _frame("train_step", "train.py", 42),
        _frame("main", "train.py", 90),
    ]
    events = [
        _event("segment_alloc", S1, 20 * MIB),
        _event("alloc", S1, 8 * MIB, user),
        _event("alloc", S1 + 8 * MIB, 4 * MIB),
        _event("alloc", S1 + 12 * MIB, 8 * MIB),
        _event("free_requested", S1 + 8 * MIB, 4 * MIB),
        _event("free_completed", S1 + 8 * MIB, 4 * MIB),
        _event("segment_alloc", S2, 20 * MIB),
        _event("alloc", S2, 14 * MIB, [_frame("load", "data/loader.py", 7)]),
        {"action": "oom", "size": request, "device_free": device_free, "stream": 0, "frames": []},
    ]
    return {"segments": [], "device_traces": [events]}
