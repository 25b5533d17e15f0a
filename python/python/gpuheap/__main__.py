"""The ``gpuheap`` command: ``gpuheap explain snap.pickle`` after ``pip install``, or
``python -m gpuheap explain snap.pickle``.

It is the command line of the Rust library itself (``gpuheap._gpuheap.cli_main``, which runs
``gpuheap_cli::main``), so its commands, ``--help``, output and exit codes (0 success, 1 a run-time
failure, 2 bad input or usage) are those of the ``gpuheap`` binary built with cargo.
"""

from __future__ import annotations

import signal
import sys


def main() -> int:
    """Runs ``gpuheap`` with ``sys.argv[1:]`` and returns its exit code (the console script exits with it)."""
    from . import _gpuheap

    cli_main = getattr(_gpuheap, "cli_main", None)
    if cli_main is None:
        print("gpuheap: error: this build of the gpuheap package has no command line "
              "(its extension was built without the `cli` feature)", file=sys.stderr)
        return 1
    # The Rust code writes to file descriptors 1 and 2 directly: what Python buffered goes first.
    sys.stdout.flush()
    sys.stderr.flush()
    # Ctrl-C ends the command at once, as it ends the binary: Python's own handler would only raise
    # KeyboardInterrupt once the Rust code returned. Python installs that handler only where SIGINT was
    # not ignored; where it was (a background job of a script, nohup), it stays ignored, as for the binary.
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    # The program name as the binary's: clap prints it in usage lines ("Usage: gpuheap explain ...").
    return cli_main(["gpuheap", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
