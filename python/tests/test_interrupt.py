"""Ctrl-C stops a long call: SIGINT sent during ``tune``, ``explain`` or ``compare`` raises
``KeyboardInterrupt`` within a second of the signal (the native module polls for the signal while the
work runs without the GIL and sets the command's cancellation flag, which the replays check every
16,384 events; ``python/src/lib.rs``), and the interpreter stays usable afterwards.

The trace is generated (seeded): 120,000 requests of sizes from 512 B to 260 MiB, freed in random order,
which ``tune`` takes several seconds over (its duration is checked first, so that a fast machine cannot
make the test pass without interrupting anything). ``replay`` runs the same engine as ``compare``'s rows
and checks the same flag; it takes 0.1 s on this trace, too short to interrupt reliably.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import pytest

import gpuheap

MIB = 1 << 20
# The signal is sent this long after the call starts; the call must outlast it by far.
DELAY = 0.5
# KeyboardInterrupt must come within this many seconds of the signal.
BOUND = 1.0


def _long_snapshot(requests: int, seed: int = 1) -> dict:
    """A snapshot dict of ``requests`` allocations (PyTorch's event names), about 45 % of steps a free of
    a random live block, at most 200 live blocks."""
    r = random.Random(seed)
    live: list[tuple[int, int]] = []
    events = []
    addr = 0x7F00_0000_0000
    sizes = [512, 4096, 1 * MIB, 3 * MIB, 25 * MIB, 40 * MIB, 70 * MIB, 130 * MIB]
    while requests:
        if live and (len(live) > 200 or r.random() < 0.45):
            a, s = live.pop(r.randrange(len(live)))
            for action in ("free_requested", "free_completed"):
                events.append({"action": action, "addr": a, "size": s, "stream": 0, "frames": []})
        else:
            s = r.choice(sizes)
            s += r.randrange(0, s) // 512 * 512
            events.append({"action": "alloc", "addr": addr, "size": s, "stream": 0, "frames": []})
            live.append((addr, s))
            addr += s + MIB
            requests -= 1
    return {"segments": [], "device_traces": [events]}


@pytest.fixture(scope="module")
def long_snapshot() -> gpuheap.Snapshot:
    return gpuheap.load(_long_snapshot(120_000))


def _interrupted_after(call, delay: float) -> tuple[float, float]:
    """Runs ``call()`` on the main thread with SIGINT sent to it ``delay`` s after the start; returns
    (seconds from the signal to the KeyboardInterrupt, seconds the call ran). Fails if the call
    returns or raises anything else."""
    main = threading.get_ident()
    sent: list[float] = []

    def send() -> None:
        sent.append(time.monotonic())
        signal.pthread_kill(main, signal.SIGINT)

    timer = threading.Timer(delay, send)
    start = time.monotonic()
    timer.start()
    try:
        call()
    except KeyboardInterrupt:
        raised = time.monotonic()
    else:
        pytest.fail(f"the call returned after {time.monotonic() - start:.2f} s without KeyboardInterrupt")
    finally:
        timer.cancel()
    assert sent, "KeyboardInterrupt raised before the signal was sent"
    return raised - sent[0], raised - start


@pytest.fixture
def python_sigint_handler():  # noqa: ANN201
    """Python's own Ctrl-C handler during the test, as an interactive session has it, restored after it:
    a process started in the background of a non-interactive shell (as CI may start the suite) inherits
    SIGINT ignored, and Python then installs no handler of its own."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals reach the main thread only")
@pytest.mark.parametrize(
    "name,call",
    [
        ("tune", lambda s: gpuheap.tune(s)),
        ("explain", lambda s: gpuheap.explain(s)),
        ("compare", lambda s: gpuheap.compare(s, backend="cpu")),
    ],
)
def test_sigint_raises_keyboard_interrupt_within_a_second(long_snapshot, python_sigint_handler, name, call) -> None:
    if name == "tune":
        # The uninterrupted call outlasts the signal's delay by far: else nothing would be interrupted.
        t = time.monotonic()
        gpuheap.tune(long_snapshot)
        full = time.monotonic() - t
        assert full > 4 * DELAY, f"tune took {full:.2f} s: the generated trace is too short to interrupt"
    latency, ran = _interrupted_after(lambda: call(long_snapshot), DELAY)
    print(f"{name}: KeyboardInterrupt {latency * 1000:.0f} ms after SIGINT (the call ran {ran:.2f} s)")
    assert latency < BOUND, f"{name}: KeyboardInterrupt {latency:.2f} s after SIGINT (bound {BOUND} s)"
    # The interpreter and the package still work: the same call, uninterrupted, on a small trace.
    small = gpuheap.load(_long_snapshot(200))
    assert call(small) is not None
