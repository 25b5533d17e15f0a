//! Output files never destroy anything they were not asked to write (`cli/src/output.rs`): for
//! `--html`, `--plot` and `trace repeat OUT`, the input is never replaced (same path, hard link, symbolic
//! link, `/dev/stdout` redirected to it), two outputs naming one file and a missing folder are refused
//! before any work, a read-only target is refused where the shell would refuse it, a link planted at the
//! temporary file's former (predictable) name is not followed, and no temporary file survives SIGINT or
//! SIGTERM.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

#[path = "../../host/tests/common/mod.rs"]
mod common;

const SNAP: &str = "data/equivariant-posteriors_oom_snapshot_new.pickle";
const LONG: &str = "data/decomfl_opt_zo_federated_memory.pickle";

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpuheap-outputs-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn gpuheap(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpuheap"));
    c.args(args).env("GPUHEAP_BACKEND", "cpu").stdin(Stdio::null());
    c
}

fn run(args: &[&str]) -> Output {
    gpuheap(args).output().unwrap()
}

fn names(d: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(d).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

/// A copy of the snapshot in `d`, and its bytes.
fn input(d: &Path) -> (PathBuf, Vec<u8>) {
    let p = d.join("in.pickle");
    std::fs::copy(common::workspace().join(SNAP), &p).unwrap();
    let bytes = std::fs::read(&p).unwrap();
    (p, bytes)
}

fn refused(out: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.lines().last().is_some_and(|l| l.contains(needle)), "{needle:?} in {err}");
}

#[test]
fn the_input_is_never_replaced() {
    let d = dir("input");
    let (inp, original) = input(&d);
    let i = inp.to_str().unwrap();
    std::os::unix::fs::symlink(&inp, d.join("sym.pickle")).unwrap();
    std::fs::hard_link(&inp, d.join("hard.pickle")).unwrap();
    // Another spelling of the same path.
    let dotted = format!("{}/./in.pickle", d.display());
    for target in [i, d.join("sym.pickle").to_str().unwrap(), d.join("hard.pickle").to_str().unwrap(), &dotted] {
        for flag in ["--html", "--plot"] {
            let target = if flag == "--plot" { format!("{target}.svg") } else { target.to_string() };
            if flag == "--plot" {
                // A plot needs an image extension: the link of that name to the input.
                let _ = std::fs::remove_file(&target);
                std::fs::hard_link(&inp, &target).unwrap();
            }
            refused(&run(&["replay", i, flag, &target]), "is the trace being read");
            if flag == "--plot" {
                std::fs::remove_file(&target).unwrap();
            }
        }
        refused(&run(&["trace", "repeat", "--steps", "2", i, target]), "is the trace being read");
        assert_eq!(std::fs::read(&inp).unwrap(), original, "{target}");
    }
    // `/dev/stdout` redirected to the input (the shell's `1<>in.pickle`, which does not truncate).
    let fd = std::fs::OpenOptions::new().read(true).write(true).open(d.join("hard.pickle")).unwrap();
    let out = gpuheap(&["replay", i, "--html", "/dev/stdout"]).stdout(fd).output().unwrap();
    refused(&out, "is the trace being read");
    assert_eq!(std::fs::read(&inp).unwrap(), original);
    assert!(std::fs::symlink_metadata("/dev/stdout").unwrap().file_type().is_symlink(), "/dev/stdout is a link still");
    assert_eq!(names(&d), ["hard.pickle", "in.pickle", "sym.pickle"], "no temporary file left");
}

#[test]
fn outputs_are_checked_before_any_work() {
    let d = dir("before");
    let (inp, _) = input(&d);
    let i = inp.to_str().unwrap();
    let both = d.join("both.svg");
    let both = both.to_str().unwrap();
    refused(&run(&["replay", i, "--plot", both, "--html", both]), "names the same file as the output");
    // The same file through another spelling.
    let other = format!("{}/./both.svg", d.display());
    refused(&run(&["compare", i, "--plot", both, "--html", &other]), "names the same file as the output");
    let missing = d.join("newdir/report.html");
    refused(&run(&["explain", i, "--html", missing.to_str().unwrap()]), "does not exist");
    refused(&run(&["explain", i, "--html", d.to_str().unwrap()]), "is a directory");
    refused(&run(&["explain", i, "--html", "/dev/null"]), "is not a regular file");
    assert_eq!(names(&d), ["in.pickle"], "nothing written");
}

#[test]
fn a_read_only_target_is_refused_as_the_shell_would() {
    use std::os::unix::fs::PermissionsExt;
    let d = dir("readonly");
    let (inp, _) = input(&d);
    let ro = d.join("ro.html");
    std::fs::write(&ro, "keep").unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o444)).unwrap();
    // The shell's own answer: can `sh -c ': > ro.html'` write it?
    let shell_may = Command::new("sh").arg("-c").arg(format!("exec 3>>'{}'", ro.display())).status().unwrap().success();
    let out = run(&["replay", inp.to_str().unwrap(), "--html", ro.to_str().unwrap()]);
    if shell_may {
        // Root: the shell writes a file of mode 0444, and so does gpuheap; the mode is kept.
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        assert_ne!(std::fs::read_to_string(&ro).unwrap(), "keep");
        assert_eq!(std::fs::metadata(&ro).unwrap().permissions().mode() & 0o777, 0o444);
    } else {
        refused(&out, "is read-only");
        assert_eq!(std::fs::read_to_string(&ro).unwrap(), "keep");
    }
}

/// `trace repeat` of the long snapshot into `d/out.pickle`, interrupted by `signal` after `after`.
fn interrupted(d: &Path, signal: i32, after: Duration) -> std::process::ExitStatus {
    let mut child = gpuheap(&["trace", "repeat", "--steps", "60", LONG, d.join("out.pickle").to_str().unwrap()])
        .current_dir(common::workspace())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The name the temporary file had before (`.NAME.PID.partial.EXT`), planted as a link to a victim.
    let victim = d.join("victim");
    std::fs::write(&victim, "victim").unwrap();
    let old = d.join(format!(".out.pickle.{}.partial.pickle", child.id()));
    std::os::unix::fs::symlink(&victim, &old).unwrap();
    let start = Instant::now();
    let mut saw_temporary = false;
    while start.elapsed() < after {
        saw_temporary |= names(d)
            .iter()
            .any(|n| n.starts_with(".out.pickle.") && n.ends_with(".partial.pickle") && d.join(n) != old);
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: kill(2) on the child's pid, which this test owns and has not reaped.
    unsafe { libc::kill(child.id() as i32, signal) };
    let status = child.wait().unwrap();
    assert!(saw_temporary || status.success(), "the write had started before the signal");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "victim", "the planted link was not followed");
    std::fs::remove_file(&old).unwrap();
    std::fs::remove_file(&victim).unwrap();
    status
}

#[test]
fn no_temporary_file_survives_sigint_or_sigterm() {
    for (signal, name) in [(libc::SIGINT, "sigint"), (libc::SIGTERM, "sigterm")] {
        let d = dir(name);
        let status = interrupted(&d, signal, Duration::from_millis(1500));
        let left = names(&d);
        println!("{name}: {status:?}, left {left:?}");
        if status.success() {
            // The machine finished before the signal: the output, and nothing else.
            assert_eq!(left, ["out.pickle"], "{name}");
        } else {
            assert_eq!(status.code(), Some(130), "{name}: {status:?}");
            assert!(left.is_empty(), "{name}: left {left:?}");
        }
    }
}
