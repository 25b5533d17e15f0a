"""Type stubs of the native module gpuheap._gpuheap (private: use the functions of `gpuheap`)."""

from typing import Optional

__version__: str

class Snapshot:
    """A trace read into memory (PyTorch snapshot, minimalloc CSV or RMM log); made by gpuheap.load."""

    @property
    def source(self) -> str:
        """Where it was read from: the file path, `<bytes>` or `<dict>`."""
    @property
    def format(self) -> str:
        """The format, as the CLI names it (e.g. "PyTorch memory snapshot")."""
    @property
    def devices(self) -> list[int]:
        """The device ordinals in the trace, ascending."""
    @property
    def event_count(self) -> int:
        """Number of events over all devices."""

def load_path(path: str) -> Snapshot:
    """Reads a trace file. Raises gpuheap.TraceError."""

def load_bytes(data: bytes, name: str) -> Snapshot:
    """Parses trace bytes; `name` stands for the file in messages. Raises gpuheap.TraceError."""

def parse_bytes(s: str) -> int:
    """A byte count as the CLI parses it ("80GiB", "1.5e9"). Raises gpuheap.ConfigError."""

def replay_json(
    snapshot: Snapshot,
    strategy: str,
    capacity: Optional[str],
    align: Optional[str],
    tiers: Optional[str],
    compact: str,
    backend: Optional[str],
    device: Optional[int],
    materialize_limit: Optional[str],
) -> str:
    """`gpuheap replay --json`. Raises gpuheap.ConfigError, TraceError, BackendError, InternalError."""

def compare_json(
    snapshot: Snapshot,
    capacity: Optional[str],
    align: Optional[str],
    tiers: Optional[str],
    compact: str,
    backend: Optional[str],
    device: Optional[int],
    materialize_limit: Optional[str],
    device_heap_limit: Optional[str],
) -> str:
    """`gpuheap compare --json`. Raises gpuheap.ConfigError, TraceError, BackendError, InternalError."""

def explain_json(
    snapshot: Snapshot, device: Optional[int], capacity: Optional[str], tune: bool
) -> tuple[str, str, Optional[str], str]:
    """`gpuheap explain --json` (`tune=False`: `--no-tune`): (JSON, the page, the settings table or None,
    the HTML page of `--html`).
    Raises TraceError, ConfigError, BackendError."""

def tune_json(
    snapshot: Snapshot, device: Optional[int], capacity: Optional[str], settings: Optional[list[str]]
) -> tuple[str, str, str]:
    """`gpuheap tune --json` plus the trace's `format`, the page and the HTML page of `--html`; `settings`: keep
    only these rows. Raises TraceError, ConfigError, BackendError (ConfigError for an unknown row)."""

def strategies() -> list[str]:
    """The strategy names replay accepts."""

def cli_main(argv: list[str]) -> int:
    """Runs the `gpuheap` command line with `argv` (the program name first) on the process's stdout and
    stderr; returns its exit code (0, 1 run-time failure, 2 bad input or usage, 101 a panic). Present
    when the extension is built with the `cli` feature (every wheel is); used by `gpuheap.__main__`."""

def _panic_for_test() -> None:
    """Panics inside the guarded section (tests of the panic guard): raises gpuheap.InternalError."""
