//! The `gpuheap` command-line tool. See `gpuheap --help` and README.md.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
