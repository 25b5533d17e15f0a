"""The ``gpuheap`` command that the package installs (the console script, and ``python -m gpuheap``)
is the command line built from source: the same stdout, stderr and exit code, byte for byte, for
the README's main command, every ``--help``, usage errors and bad input; Ctrl-C ends it as it ends
the binary (and leaves it running where SIGINT was ignored, as the binary does)."""

from __future__ import annotations

import os
import pickle
import re
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from conftest import DATA

SCRIPT = Path(sysconfig.get_path("scripts")) / "gpuheap"
MAIN_SNAPSHOT = DATA / "equivariant-posteriors_oom_snapshot_new.pickle"
LAUNCHERS = {"console-script": [str(SCRIPT)], "python-m": [sys.executable, "-m", "gpuheap"]}


@pytest.fixture(params=sorted(LAUNCHERS), scope="module")
def command(request) -> list[str]:
    return LAUNCHERS[request.param]


def _run(argv: list, *args) -> subprocess.CompletedProcess:
    return subprocess.run([*argv, *args], capture_output=True, check=False, timeout=600)


def _same(command: list[str], cli: Path, *args) -> subprocess.CompletedProcess:
    """Runs `args` through the installed command and the binary; asserts the same outcome."""
    ours, binary = _run(command, *args), _run([str(cli)], *args)
    assert (ours.returncode, ours.stdout, ours.stderr) == (binary.returncode, binary.stdout, binary.stderr), args
    return binary


def test_console_script_is_installed() -> None:
    assert SCRIPT.is_file(), f"pip installed no `gpuheap` command in {SCRIPT.parent}"


def _subcommands(help_text: bytes) -> list[str]:
    """The names in the `Commands:` section of a clap help page (clap's own `help` left out)."""
    m = re.search(rb"\nCommands:\n((?:  .*\n)+)", help_text)
    names = [] if m is None else [line.split()[0].decode() for line in m.group(1).splitlines()]
    return [n for n in names if n != "help"]


def test_every_help_is_the_binarys(command: list[str], cli: Path) -> None:
    seen = []
    todo = [[]]
    while todo:
        path = todo.pop()
        page = _same(command, cli, *path, "--help")
        assert page.returncode == 0 and page.stdout, path
        seen.append(" ".join(path))
        todo += [[*path, sub] for sub in _subcommands(page.stdout)]
    # The walk reached the commands of the README and the nested `bench` ones.
    assert {"explain", "tune", "compare", "replay", "bench alloc", "bench compact"} <= set(seen)
    _same(command, cli, "--version")


def test_main_command_is_the_binarys(command: list[str], cli: Path) -> None:
    """The README's main command: `gpuheap explain data/equivariant-posteriors_oom_snapshot_new.pickle`."""
    r = _same(command, cli, "explain", str(MAIN_SNAPSHOT))
    assert r.returncode == 0 and b"PYTORCH_CUDA_ALLOC_CONF" in r.stdout
    _same(command, cli, "explain", str(MAIN_SNAPSHOT), "--no-tune", "--json")


def test_errors_are_the_binarys(command: list[str], cli: Path, tmp_path: Path) -> None:
    """Usage errors (clap's, exit 2) and bad input (exit 2, one line on stderr)."""
    truncated = tmp_path / "truncated.pickle"
    truncated.write_bytes(pickle.dumps({"segments": [], "device_traces": []}, protocol=4)[:-3])
    for args in [
        [],
        ["bogus"],
        ["explain"],
        ["explain", str(MAIN_SNAPSHOT), "--no-such-flag"],
        ["replay", str(MAIN_SNAPSHOT), "--strategy", "no-such-strategy"],
        ["explain", str(tmp_path / "missing.pickle")],
        ["explain", str(truncated)],
        ["explain", str(tmp_path)],
        # A path that is not UTF-8 reaches the library as the same bytes.
        ["explain", os.fsencode(str(tmp_path)) + b"/\xff.pickle"],
    ]:
        r = _same(command, cli, *args)
        assert r.returncode == 2 and r.stderr and not r.stdout, args


def _blocked_reading(p: subprocess.Popen, fifo: Path) -> bool:
    """Whether `p` has the FIFO open and sits in read(2) (Linux's /proc)."""
    try:
        opened = any(os.readlink(f) == str(fifo) for f in Path(f"/proc/{p.pid}/fd").iterdir())
        return opened and Path(f"/proc/{p.pid}/syscall").read_text().split()[0] == "0"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.skipif(not Path("/proc/self/syscall").exists(), reason="needs Linux's /proc/PID/syscall")
@pytest.mark.parametrize("ignored", [False, True], ids=["sigint-default", "sigint-ignored"])
def test_ctrl_c_is_the_binarys(command: list[str], cli: Path, tmp_path: Path, ignored: bool) -> None:
    """SIGINT while the command reads a FIFO: it ends the process at once (killed by SIGINT), or, where
    the parent ignored SIGINT, is ignored and the command goes on to read the end of the input."""
    fifo = tmp_path / "snapshot.pipe"
    os.mkfifo(fifo)
    disposition = signal.SIG_IGN if ignored else signal.SIG_DFL
    outcomes = []
    for argv in (command, [str(cli)]):
        writer = os.open(fifo, os.O_RDWR)  # a writer: the command's open succeeds and its read blocks
        p = subprocess.Popen(
            [*argv, "explain", str(fifo)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=lambda: signal.signal(signal.SIGINT, disposition),
        )
        try:
            deadline = time.monotonic() + 60
            while not _blocked_reading(p, fifo):
                assert p.poll() is None and time.monotonic() < deadline, f"{argv} never blocked reading {fifo}"
                time.sleep(0.02)
            p.send_signal(signal.SIGINT)
            if ignored:
                time.sleep(0.5)
                assert p.poll() is None, f"{argv} ended on an ignored SIGINT"
            os.close(writer)  # end of input: an empty trace, exit 2
            writer = -1
            out, err = p.communicate(timeout=60)
            outcomes.append((p.returncode, out, err))
        finally:
            if writer >= 0:
                os.close(writer)
            if p.poll() is None:
                p.kill()
                p.wait()
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0] == (2 if ignored else -signal.SIGINT)
