#!/usr/bin/env python3
"""Drives the gpuheap CLI with bad input and reports what breaks the bad-input rule.

The rule (DESIGN.md §2.7, §2.9): bad input never panics, never hangs, and exits with code 2 and one
line that names the file. This script writes mutated inputs to a temporary folder and runs
`replay`, `compare --json`, `explain --no-tune` and `tune --json` on each, under a time limit:

* structural mutations of a snapshot (a real one given with --snapshot, else a hand-made one): a
  random value of a segment, block, event or setting replaced by an odd one (negative, 2^64,
  NaN, None, a string, an empty list...) or deleted, an event duplicated elsewhere;
* byte flips and truncations of the same pickle.

Each finding is printed as `KIND command file: message` (KIND: PANIC, EXIT=<code>, TIMEOUT, or
UNNAMED for an exit 2 whose message does not name the file); the mutated files stay in the folder
printed at the end so that a finding can be replayed. Exit status 1 when anything was found.

With --legit, the script instead writes unusual but legitimate snapshots (no device_traces, empty
traces, only segments on device 3, expandable segments mapped and unmapped 2,000 times, the OOM on
device 1, stream ids of 2^63 - 1 and 2^64 - 1, zero-size allocations, one address reused 20,000
times, time_us missing or decreasing, a wrapped history that frees blocks allocated before it,
snapshot/user_defined events among the allocations) and checks that every command answers them
(exit 0; REFUSED otherwise) with strict JSON (BADJSON: NaN, Infinity or unparsable).

With --families, the script instead runs one case of each family of hostile use, each a kind that more
inputs of the same kind would repeat, and reports what breaks the rules of docs/src/inputs-and-outputs.md:

* memo bombs (events, segment blocks, stack frames): exit 2 within the time limit and under 1 GiB of
  peak RSS (MEMORY otherwise);
* special files as the input: a directory, /dev/zero, /dev/null, an endless pipe on /dev/stdin;
* outputs that name the input: the same path, a symbolic link to it, a hard link to it (the equivalent
  of a bind mount), `--html /dev/stdout` with stdout redirected to the input (DESTROYED when the input
  changed);
* a read-only target the shell could not write (REPLACED when it changed);
* two outputs naming one file (`--plot F --html F`: exit 2 expected);
* a closed stdout (`explain F | head -1`): no panic;
* SIGINT and SIGTERM while the output is written: no temporary file left (LEFTOVER).

Usage: scripts/fuzz-cli-bad-input.py [--bin target/ci/gpuheap] [--snapshot FILE] [--count N]
       [--seed S] [--timeout SECONDS] [--legit | --families]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import pickle
import random
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MIB = 1 << 20
ODD = [0, 1, -1, 511, 2**48 + 1, 2**63, 2**64 - 1, 2**64, -(2**63), float("nan"), float("inf"), 1e300,
       None, "", "x", True, [], {}, "active_allocated", "inactive", "free_completed", "oom"]
COMMANDS = [["replay"], ["compare", "--json"], ["explain", "--no-tune"], ["tune", "--json"]]


def hand_made() -> dict:
    """One segment with live and free blocks, an event history that matches it, an OOM, settings."""
    a = 0x7F00_0000_0000
    block = lambda off, size, state: {"address": a + off, "size": size, "requested_size": size, "state": state}  # noqa: E731
    ev = lambda action, off, size: {"action": action, "addr": a + off, "size": size, "stream": 0, "time_us": 1}  # noqa: E731
    return {
        "segments": [{"device": 0, "address": a, "total_size": 20 * MIB, "stream": 0, "segment_type": "large",
                      "is_expandable": False,
                      "blocks": [block(0, 4 * MIB, "active_allocated"), block(4 * MIB, 8 * MIB, "active_allocated"),
                                 block(12 * MIB, 8 * MIB, "inactive")]}],
        "device_traces": [[ev("segment_alloc", 0, 20 * MIB), ev("alloc", 0, 4 * MIB), ev("alloc", 4 * MIB, 8 * MIB),
                           ev("alloc", 12 * MIB, 8 * MIB), ev("free_requested", 12 * MIB, 8 * MIB),
                           ev("free_completed", 12 * MIB, 8 * MIB),
                           {"action": "oom", "size": 30 * MIB, "device_free": MIB, "stream": 0}]],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                               "garbage_collection_threshold": 0.0, "expandable_segments": False,
                               "roundup_power2_divisions": {"1": 0}},
    }


def legit() -> dict:
    """Unusual but legitimate snapshots, by name: every command must answer them."""
    a = 0x7F00_0000_0000
    b = a + 100 * MIB

    def ev(action, addr, size, stream=0, t=1):
        return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": t}

    def seg(addr, live, total=20 * MIB, device=0):
        return {"device": device, "address": addr, "total_size": total, "stream": 0, "segment_type": "large",
                "is_expandable": False,
                "blocks": [{"address": addr, "size": live, "requested_size": live, "state": "active_allocated"},
                           {"address": addr + live, "size": total - live, "requested_size": 0,
                            "state": "inactive"}]}

    def life(addr, size, t=1):
        return [ev("alloc", addr, size, t=t), ev("free_requested", addr, size, t=t),
                ev("free_completed", addr, size, t=t)]

    expandable = []
    for i in range(2000):
        expandable += [ev("segment_map", a, 2 * MIB, t=i), *life(a, 2 * MIB, i), ev("segment_unmap", a, 2 * MIB, t=i)]
    reuse = [ev("segment_alloc", a, 2 * MIB)]
    for i in range(20000):
        reuse += life(a, 512, i)
    oom = {"action": "oom", "size": 30 * MIB, "device_free": 4 * MIB, "stream": 0, "time_us": 5}
    return {
        "no_device_traces": {"segments": [seg(a, 4 * MIB)]},
        "empty_device_traces": {"segments": [seg(a, 4 * MIB)], "device_traces": []},
        "empty_trace_list": {"segments": [seg(a, 4 * MIB)], "device_traces": [[]]},
        "segments_only_device_3": {"segments": [seg(a, 4 * MIB, device=3)]},
        "expandable_map_unmap": {"segments": [], "device_traces": [expandable]},
        "oom_on_device_1": {
            "segments": [seg(a, 4 * MIB), seg(b, 4 * MIB, device=1)],
            "device_traces": [[ev("segment_alloc", a, 20 * MIB), ev("alloc", a, 4 * MIB)],
                              [ev("segment_alloc", b, 20 * MIB), ev("alloc", b, 4 * MIB), oom]]},
        "huge_stream_ids": {"segments": [], "device_traces": [
            [ev("segment_alloc", a, 20 * MIB, stream=2**63 - 1), *[dict(e, stream=2**63 - 1) for e in life(a, MIB)],
             ev("alloc", a + MIB, MIB, stream=2**64 - 1)]]},
        "zero_size_allocs": {"segments": [], "device_traces": [
            [ev("segment_alloc", a, 2 * MIB)] + [ev("alloc", a + 512 * i, 0) for i in range(10)]
            + [ev("free_completed", a + 512 * i, 0) for i in range(5)]]},
        "address_reused": {"segments": [], "device_traces": [reuse]},
        "time_us_missing": {"segments": [], "device_traces": [
            [{k: v for k, v in e.items() if k != "time_us"} for e in [ev("alloc", a, MIB), *life(a + MIB, MIB)]]]},
        "time_us_decreasing": {"segments": [], "device_traces": [
            [ev("alloc", a, MIB, t=100), ev("alloc", a + MIB, MIB, t=50), ev("free_completed", a, MIB, t=1)]]},
        "wrapped_history": {"segments": [seg(b, MIB)], "device_traces": [
            [ev("free_requested", a, 4 * MIB), ev("free_completed", a, 4 * MIB), ev("segment_free", a, 20 * MIB),
             ev("segment_alloc", b, 20 * MIB), ev("alloc", b, MIB)]]},
        "other_event_kinds": {"segments": [], "device_traces": [
            [ev("snapshot", 0, 0), ev("segment_alloc", a, 2 * MIB), ev("alloc", a, MIB),
             {"action": "user_defined", "addr": 0, "size": 0, "stream": 0, "time_us": 2, "user_metadata": "step"},
             ev("free_requested", a, MIB), ev("free_completed", a, MIB)]]},
    }


LEGIT_COMMANDS = [["replay", "--json"], ["replay", "--strategy", "best-fit", "--compact", "on-oom", "--json"],
                  ["compare", "--json"], ["explain", "--no-tune", "--json"], ["tune", "--json"]]


def invoke(binary: str, cmd: list, f: Path, timeout: float) -> tuple[subprocess.CompletedProcess | None, str, str]:
    """Runs `binary cmd f` on the CPU backend: (the process or None on a timeout, its stderr, the finding
    every check shares: a timeout or a panic, else "")."""
    try:
        r = subprocess.run([binary, *cmd, str(f)], capture_output=True, timeout=timeout,
                           env={**os.environ, "GPUHEAP_BACKEND": "cpu"})
    except subprocess.TimeoutExpired:
        return None, "", "TIMEOUT"
    err = r.stderr.decode("utf-8", "replace")
    last = err.strip().splitlines()[-1] if err.strip() else ""
    if r.returncode == 101 or "panicked" in err:
        return r, last, f"PANIC: {last}"
    return r, last, ""


def run_legit(binary: str, cmd: list, f: Path, timeout: float) -> str | None:
    """None when `cmd` answers `f` with strict JSON, else the finding."""
    r, last, finding = invoke(binary, cmd, f, timeout)
    if r is None or finding:
        return finding
    if r.returncode != 0:
        return f"REFUSED (exit {r.returncode}): {last}"

    def strict(c):
        raise ValueError(f"{c} in JSON")

    try:
        json.loads(r.stdout, parse_constant=strict)
    except ValueError as e:
        return f"BADJSON: {e}"
    return None


def paths(o, p=()):
    """Every (container path, key) of `o` except stack frames."""
    items = o.items() if isinstance(o, dict) else enumerate(o) if isinstance(o, list) else []
    for k, v in items:
        if k == "frames":
            continue
        yield p + (k,)
        yield from paths(v, p + (k,))


def mutate(snap: dict, rng: random.Random, all_paths: list) -> dict:
    s = copy.deepcopy(snap)
    for _ in range(rng.randint(1, 2)):
        p = rng.choice(all_paths)
        try:
            parent = s
            for k in p[:-1]:
                parent = parent[k]
            r = rng.random()
            if r < 0.75:
                parent[p[-1]] = rng.choice(ODD)
            elif r < 0.9:
                del parent[p[-1]]
            elif snap.get("device_traces") and snap["device_traces"][0]:
                parent[p[-1]] = copy.deepcopy(rng.choice(snap["device_traces"][0]))
        except (KeyError, IndexError, TypeError):
            pass  # an earlier mutation changed the shape
    return s


def run(binary: str, cmd: list, f: Path, timeout: float) -> str | None:
    """None when `cmd` answers `f` or refuses it with exit 2 naming the file, else the finding."""
    r, last, finding = invoke(binary, cmd, f, timeout)
    if r is None or finding:
        return finding
    if r.returncode not in (0, 2):
        return f"EXIT={r.returncode}: {last}"
    if r.returncode == 2 and f.name not in last:
        return f"UNNAMED: {last}"
    return None


def check_all(files: list, commands: list, check, a: argparse.Namespace, what: str, out: Path) -> int:
    """Runs `check` on every file with every command, prints each finding and a summary; 1 if any."""
    found = 0
    for f in files:
        for cmd in commands:
            finding = check(a.bin, cmd, f, a.timeout)
            if finding:
                found += 1
                print(f"{finding.split(':')[0]} {' '.join(cmd)} {f}: {finding}", flush=True)
    print(f"{len(files)} {what} x {len(commands)} commands, {found} findings; files in {out}")
    return 1 if found else 0


def memo_bombs(k: int = 38_000) -> dict:
    """Small pickles whose memo references multiply: name -> bytes (as host/tests/reader_limits.rs)."""
    def s(x: str) -> bytes:
        b = x.encode()
        return bytes([0x8C, len(b)]) + b if len(b) < 256 else b"X" + struct.pack("<I", len(b)) + b

    def d(pairs) -> bytes:
        return b"}(" + b"".join(s(k) + v for k, v in pairs) + b"u"

    def square(key: str, item: bytes) -> bytes:
        return (b"\x80\x04}(" + s(key) + b"]q\x00(]q\x01(" + item + b"q\x02" + b"h\x02" * (k - 1) + b"e"
                + b"h\x01" * (k - 1) + b"eu.")

    alloc = d([("action", s("alloc")), ("addr", b"K\x00"), ("size", b"K\x01")])
    block = d([("size", b"K\x00"), ("state", s("inactive"))])
    seg = d([("device", b"K\x00"), ("address", b"K\x00"), ("total_size", b"J\x00\x00\x00\x01")])[:-1]
    segments = (b"\x80\x04}(" + s("segments") + b"](" + seg + s("blocks") + b"](" + block + b"q\x01"
                + b"h\x01" * (k - 1) + b"eu" + b"q\x00" + b"h\x00" * (k - 1) + b"eu.")
    frame = d([("name", s("f" * 300)), ("filename", s("x.py")), ("line", b"K\x01")])
    ev = d([("action", s("segment_free")), ("addr", b"K\x00"), ("size", b"K\x01")])[:-1]
    ev += s("frames") + b"](" + frame + b"q\x01" + b"h\x01" * (k - 1) + b"eu"
    frames = b"\x80\x04}(" + s("device_traces") + b"](](" + ev + b"q\x00" + b"h\x00" * (k - 1) + b"eeu."
    return {"bomb_events": square("device_traces", alloc), "bomb_segments": segments, "bomb_frames": frames}


def families(a: argparse.Namespace) -> int:
    """Runs one case of each family (module docs); prints each finding; 1 if any."""
    out = Path(tempfile.mkdtemp(prefix="gpuheap-families-"))
    env = {**os.environ, "GPUHEAP_BACKEND": "cpu"}
    findings = []

    def note(kind: str, case: str, detail: str) -> None:
        findings.append(kind)
        print(f"{kind} {case}: {detail}", flush=True)

    def cli(args: list, case: str, timeout: float = a.timeout, **kw):
        """Runs the CLI; (exit code or None on a timeout, stderr's last line, peak RSS in KiB)."""
        start = time.monotonic()
        p = subprocess.Popen([a.bin, *map(str, args)], stdout=kw.get("stdout", subprocess.DEVNULL),
                             stderr=subprocess.PIPE, stdin=kw.get("stdin", subprocess.DEVNULL), env=env)
        while p.poll() is None and time.monotonic() - start < timeout:
            time.sleep(0.02)
        if p.poll() is None:
            p.kill()
            p.wait()
            note("TIMEOUT", case, f"{' '.join(map(str, args))} ran past {timeout} s")
            return None, "", 0
        err = p.stderr.read().decode("utf-8", "replace").strip()
        last = err.splitlines()[-1] if err else ""
        rss = 0
        if p.returncode == 101 or "panicked" in err:
            note("PANIC", case, last)
        return p.returncode, last, rss

    def peak_rss_kib(args: list) -> tuple:
        """Runs the CLI and measures its peak RSS through wait4: (exit code, KiB, seconds)."""
        start = time.monotonic()
        p = subprocess.Popen([a.bin, *map(str, args)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        return p.returncode, usage.ru_maxrss, time.monotonic() - start

    snap = out / "snap.pickle"
    snap.write_bytes(pickle.dumps(hand_made(), protocol=4))
    original = snap.read_bytes()

    for name, data in memo_bombs().items():
        f = out / f"{name}.pickle"
        f.write_bytes(data)
        code, kib, took = peak_rss_kib(["explain", "--no-tune", f])
        print(f"{name}: {len(data)} B, exit {code}, peak RSS {kib >> 10} MiB, {took:.2f} s")
        if code != 2:
            note(f"EXIT={code}", name, "a memo bomb must exit 2")
        if kib > 1 << 20:
            note("MEMORY", name, f"peak RSS {kib >> 10} MiB")
        if took > a.timeout:
            note("TIMEOUT", name, f"{took:.1f} s")

    folder = out / "a_folder"
    folder.mkdir()
    for case, path in [("directory", folder), ("dev_zero", "/dev/zero"), ("dev_null", "/dev/null")]:
        code, last, _ = cli(["explain", "--no-tune", path], case)
        if code not in (2, None):
            note(f"EXIT={code}", case, last)
    yes = subprocess.Popen(["yes", "x" * 1000], stdout=subprocess.PIPE)
    code, last, _ = cli(["explain", "--no-tune", "--max-memory", "64MiB", "/dev/stdin"], "endless_pipe",
                        stdin=yes.stdout)
    yes.kill()
    yes.wait()
    if code not in (2, None):
        note(f"EXIT={code}", "endless_pipe", last)

    def same_input(case: str, target, extra=()) -> None:
        code, last, _ = cli(["replay", snap, "--html", target, *extra], case)
        if snap.read_bytes() != original:
            note("DESTROYED", case, f"the input was replaced (exit {code}: {last})")
            snap.write_bytes(original)
        elif code == 0:
            note("EXIT=0", case, "writing over the input must be refused")

    same_input("same_path", snap)
    (out / "link.pickle").symlink_to(snap)
    same_input("symlink_to_input", out / "link.pickle")
    os.link(snap, out / "hard.pickle")
    same_input("hard_link_to_input", out / "hard.pickle")
    with open(out / "hard.pickle", "r+b") as fh:
        code, last, _ = cli(["replay", snap, "--html", "/dev/stdout"], "dev_stdout_is_input", stdout=fh)
    if snap.read_bytes() != original:
        note("DESTROYED", "dev_stdout_is_input", f"the input was replaced (exit {code}: {last})")
        snap.write_bytes(original)

    ro = out / "read_only.html"
    ro.write_text("keep")
    ro.chmod(0o444)
    writable = os.access(ro, os.W_OK)  # root may write it, as its shell would
    code, last, _ = cli(["replay", snap, "--html", ro], "read_only_target")
    if not writable and ro.read_text() != "keep":
        note("REPLACED", "read_only_target", f"a file the shell could not write was replaced (exit {code})")

    both = out / "both.out"
    code, last, _ = cli(["replay", snap, "--plot", both, "--html", both], "two_outputs_one_file")
    if code != 2:
        note(f"EXIT={code}", "two_outputs_one_file", f"--plot F --html F must be refused: {last}")

    p = subprocess.Popen([a.bin, "explain", "--no-tune", snap], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read().decode("utf-8", "replace")
    p.wait()
    if p.returncode == 101 or "panicked" in err:
        note("PANIC", "closed_stdout", err.strip().splitlines()[-1] if err.strip() else "")

    for sig in (signal.SIGINT, signal.SIGTERM):
        work = out / f"signal_{sig.name}"
        work.mkdir()
        big = work / "in.pickle"
        shutil.copy(a.snapshot or snap, big)
        p = subprocess.Popen([a.bin, "explain", big, "--html", work / "out.html", "--json", work / "out.json"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        time.sleep(0.3)
        p.send_signal(sig)
        p.wait()
        left = sorted(x.name for x in work.iterdir() if x.name not in ("in.pickle", "out.html", "out.json"))
        if left:
            note("LEFTOVER", f"signal_{sig.name}", f"left {left}")

    print(f"families: {len(findings)} findings; files in {out}")
    return 1 if findings else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="target/ci/gpuheap")
    ap.add_argument("--snapshot", type=Path)
    ap.add_argument("--count", type=int, default=100, help="structural mutants (and as many byte mutants)")
    ap.add_argument("--seed", type=int, default=6)
    ap.add_argument("--timeout", type=float, default=20.0)
    ap.add_argument("--legit", action="store_true", help="check unusual but legitimate snapshots instead")
    ap.add_argument("--families", action="store_true", help="run the families of hostile use instead")
    a = ap.parse_args()
    if a.families:
        return families(a)
    rng = random.Random(a.seed)
    if a.legit:
        out = Path(tempfile.mkdtemp(prefix="gpuheap-legit-"))
        files = []
        for name, snap in legit().items():
            f = out / f"{name}.pickle"
            f.write_bytes(pickle.dumps(snap, protocol=4))
            files.append(f)
        return check_all(files, LEGIT_COMMANDS, run_legit, a, "legitimate snapshots", out)
    if a.snapshot:
        # A real snapshot: plain data only is expected; refuse anything else rather than run it.
        class DataOnly(pickle.Unpickler):
            def find_class(self, module, name):
                raise pickle.UnpicklingError(f"refusing {module}.{name}")

        with open(a.snapshot, "rb") as fh:
            snap = DataOnly(fh).load()
    else:
        snap = hand_made()
    all_paths = [p for p in paths(snap) if not isinstance(p[-1], int) or rng.random() < 0.05]
    raw = pickle.dumps(snap, protocol=4)
    out = Path(tempfile.mkdtemp(prefix="gpuheap-fuzz-"))
    files = []
    for n in range(a.count):
        f = out / f"mut{n}.pickle"
        f.write_bytes(pickle.dumps(mutate(snap, rng, all_paths), protocol=4))
        files.append(f)
        b = bytearray(raw)
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(b))
            b[i] = rng.choice([0, 0x7F, 0x80, 0xFF, b[i] ^ 1, rng.randrange(256)])
        if rng.random() < 0.3:
            b = b[: rng.randrange(1, len(b))]
        f = out / f"byte{n}.pickle"
        f.write_bytes(bytes(b))
        files.append(f)
    return check_all(files, COMMANDS, run, a, "files", out)


if __name__ == "__main__":
    sys.exit(main())
