//! A closed or full standard output ends a command without a panic: a closed pipe (`gpuheap explain F |
//! head -1`) quietly with status 141 (128 + SIGPIPE, as the shell reports a program that SIGPIPE ended),
//! a full disk (`/dev/full`) with one error line on stderr and exit code 1.

use std::process::{Command, Stdio};

#[path = "../../host/tests/common/mod.rs"]
mod common;

const SNAP: &str = "data/decomfl_opt_zo_federated_memory.pickle";

fn gpuheap(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpuheap"));
    c.args(args).current_dir(common::workspace()).env("GPUHEAP_BACKEND", "cpu").env("RUST_BACKTRACE", "0");
    c
}

const COMMANDS: &[&[&str]] = &[
    &["explain", "--no-tune", SNAP],
    &["explain", "--no-tune", "--json", SNAP],
    &["replay", SNAP],
    &["compare", "--json", SNAP],
];

#[test]
fn a_closed_pipe_ends_the_command_quietly() {
    for args in COMMANDS {
        // The reader end closed before the command writes anything.
        let mut child = gpuheap(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(141), "{args:?}: {err}");
        assert!(!err.contains("panicked") && !err.contains("error"), "{args:?}: quiet, not {err:?}");
    }
    // The user's pipeline: `head -1` reads one line and exits.
    let bin = env!("CARGO_BIN_EXE_gpuheap");
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("'{bin}' explain --no-tune {SNAP} | head -1; echo \"status ${{PIPESTATUS:-?}}\""))
        .current_dir(common::workspace())
        .env("GPUHEAP_BACKEND", "cpu")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(stdout.starts_with("trace data/decomfl"), "{stdout}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn a_full_disk_is_one_line_and_exit_1() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        println!("skipped: no /dev/full on this system");
        return;
    };
    for args in COMMANDS {
        let out = gpuheap(args).stdout(full.try_clone().unwrap()).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        // Warnings about the snapshot may come first; the error is one line, the last.
        let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("gpuheap: error")).collect();
        assert_eq!(errors.len(), 1, "{args:?}: {err}");
        assert!(err.trim_end().ends_with(errors[0]), "{args:?}: {err}");
        assert!(errors[0].contains("cannot write standard output"), "{args:?}: {err}");
    }
}
