//! `gpuheap._gpuheap.cli_main`: the `gpuheap` command that pip installs (feature `cli`: the crate `gpuheap-cli`).
//!
//! The wheel's console script `gpuheap` (and `python -m gpuheap`) is `gpuheap.__main__:main`, which
//! calls [`cli_main`] with its arguments: the command line of `gpuheap-cli` ([`gpuheap_cli::main`]) runs
//! in this process, so every command, its `--help`, its output and its exit code are those of the
//! binary built from source. `gpuheap.__main__` restores the default Ctrl-C (SIGINT ends the process,
//! as it ends the binary); Rust's standard library and CPython both ignore SIGPIPE, so a closed pipe
//! is the same error in both.

use std::ffi::OsString;
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::ExitCode;

use pyo3::prelude::*;

/// The exit status of a panic, as a Rust binary's (the panic hook has printed the message on stderr).
const PANIC_EXIT: i32 = 101;

/// Runs the command line `argv` (the program name first: `["gpuheap", "explain", "snap.pickle"]`)
/// without the GIL and returns its exit code: 0 success, 1 a run-time failure, 2 bad input or usage
/// (clap's usage errors too), 101 a panic. Output goes to the process's stdout and stderr (file
/// descriptors 1 and 2, not `sys.stdout`), flushed before the return. Never raises; arguments that
/// are not valid UTF-8 arrive as Python decoded them (`os.fsencode` gives the bytes back).
#[pyfunction]
pub fn cli_main(py: Python<'_>, argv: Vec<OsString>) -> i32 {
    py.detach(move || {
        let code = catch_unwind(AssertUnwindSafe(|| gpuheap_cli::main(argv)));
        // A Rust binary flushes its (line-buffered) stdout at exit; here the process goes on.
        let _ = std::io::stdout().flush();
        code.map_or(PANIC_EXIT, exit_status)
    })
}

/// The status that `code` exits with. `ExitCode` has no accessor; on Unix it is one byte, so exactly
/// one `ExitCode::from(n)` equals it.
fn exit_status(code: ExitCode) -> i32 {
    (0..=u8::MAX).find(|&n| ExitCode::from(n) == code).map_or(1, i32::from)
}
