//! The `gpuheap` command-line tool: [`gpuheap_cli::main`]. See `gpuheap --help` and README.md.

fn main() -> std::process::ExitCode {
    gpuheap_cli::main(std::env::args_os())
}
