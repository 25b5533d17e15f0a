//! The `gpuheap` command-line tool: [`gpuheap::cli::main`]. See `gpuheap --help` and README.md.

fn main() -> std::process::ExitCode {
    gpuheap::cli::main(std::env::args_os())
}
