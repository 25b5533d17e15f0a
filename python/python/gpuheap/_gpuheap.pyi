"""Type stubs of the native module gpuheap._gpuheap (private: use the functions of `gpuheap`)."""

from typing import Optional, Tuple, Union

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

def fmt_bytes(b: int) -> str:
    """Bytes in the largest fitting binary unit, as every page prints them ("7.09 GiB")."""

Bytes = Union[int, float, str]

class Output:
    """What a command produced: the JSON of `--json`, the text page, the HTML page of `--html`, the
    page's title, and (explain with the search) the settings table alone."""

    @property
    def title(self) -> str: ...
    @property
    def json(self) -> str: ...
    @property
    def text(self) -> str: ...
    @property
    def html(self) -> Optional[str]: ...
    @property
    def tune_table(self) -> Optional[str]: ...

def replay(
    snapshot: Snapshot,
    strategy: str,
    *,
    capacity: Optional[Bytes] = None,
    align: Optional[Bytes] = None,
    tiers: Optional[Union[str, Tuple[Bytes, Bytes]]] = None,
    compact: str = "never",
    backend: Optional[str] = None,
    device: Optional[int] = None,
    materialize_limit: Optional[Bytes] = None,
) -> Output:
    """`gpuheap replay`. Raises gpuheap.ConfigError, TraceError, BackendError, InternalError."""

def compare(
    snapshot: Snapshot,
    *,
    capacity: Optional[Bytes] = None,
    align: Optional[Bytes] = None,
    tiers: Optional[Union[str, Tuple[Bytes, Bytes]]] = None,
    compact: str = "never",
    backend: Optional[str] = None,
    device: Optional[int] = None,
    materialize_limit: Optional[Bytes] = None,
    device_heap_limit: Optional[Bytes] = None,
    verbose: bool = False,
) -> Output:
    """`gpuheap compare`. Raises gpuheap.ConfigError, TraceError, BackendError, InternalError."""

def explain(
    snapshot: Snapshot,
    *,
    capacity: Optional[Bytes] = None,
    device: Optional[int] = None,
    tune: bool = True,
    without: Optional[list[str]] = None,
) -> Output:
    """`gpuheap explain` (`tune=False`: `--no-tune`; `without`: `--without SITE` per pattern). Raises
    TraceError, ConfigError (also for a `without` pattern nothing matches), BackendError."""

def tune(
    snapshot: Snapshot,
    *,
    capacity: Optional[Bytes] = None,
    device: Optional[int] = None,
    settings: Optional[list[str]] = None,
) -> Output:
    """`gpuheap tune`; `settings`: keep only these rows. Raises TraceError, ConfigError (also for an
    unknown row), BackendError."""

def option_table() -> list[tuple[str, str, Optional[str], bool, list[str]]]:
    """The option table of the commands: (key, help, value name or None for a switch, repeated, commands)."""

def strategies() -> list[str]:
    """The strategy names replay accepts."""

def cli_main(argv: list[str]) -> int:
    """Runs the `gpuheap` command line with `argv` (the program name first) on the process's stdout and
    stderr; returns its exit code (0, 1 run-time failure, 2 bad input or usage, 101 a panic). Present
    when the extension is built with the `cli` feature (every wheel is); used by `gpuheap.__main__`."""

def _panic_for_test() -> None:
    """Panics inside the guarded section (tests of the panic guard): raises gpuheap.InternalError."""
