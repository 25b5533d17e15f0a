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
            // No temporary file: nothing, or (a signal after the rename, while the output was read back)
            // the whole output, renamed into place complete.
            assert!(left.is_empty() || left == ["out.pickle"], "{name}: left {left:?}");
            if !left.is_empty() {
                gpuheap::trace::read_trace(d.join("out.pickle")).unwrap_or_else(|e| panic!("{name}: {e}"));
            }
        }
    }
}

/// One output of the table below: how a run writes `target` reading `input`.
struct Out {
    name: &'static str,
    /// The command line writing `target` (for `--json`: the command printing on stdout, which the case
    /// opens on `target`).
    args: fn(input: &str, target: &str) -> Vec<String>,
    /// The report goes to standard output (`--json` to a file) rather than to a path gpuheap writes.
    stdout: bool,
    /// The command reads a trace (`bench alloc` reads none: the input cases do not apply).
    reads: bool,
}

fn v(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

fn outs() -> Vec<Out> {
    vec![
        Out { name: "--html", args: |i, t| v(&["explain", i, "--html", t]), stdout: false, reads: true },
        Out { name: "--plot", args: |i, t| v(&["compare", i, "--plot", t]), stdout: false, reads: true },
        Out { name: "--json to a file", args: |i, _| v(&["explain", i, "--json"]), stdout: true, reads: true },
        Out {
            name: "trace repeat",
            args: |i, t| v(&["trace", "repeat", "--steps", "3", i, t]),
            stdout: false,
            reads: true,
        },
        Out {
            name: "bench --out",
            args: |_, t| v(&["bench", "alloc", "--quick", "--threads-log2", "2", "--iterations", "1", "--out", t]),
            stdout: false,
            reads: false,
        },
    ]
}

/// Runs `o` on `input` writing `target`: stdout to `stdout_to` when given (opened for reading and
/// writing, not truncated: the shell's `1<>`), else to nothing.
fn spawn(o: &Out, input: &Path, target: &str, stdout_to: Option<&Path>) -> std::process::Child {
    let args = (o.args)(input.to_str().unwrap(), target);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = match stdout_to {
        Some(p) => Stdio::from(std::fs::OpenOptions::new().read(true).write(true).open(p).unwrap()),
        None => Stdio::null(),
    };
    gpuheap(&args).stdout(out).stderr(Stdio::piped()).spawn().unwrap()
}

/// A copy of the long snapshot as `d/in.svg` (the readers go by content, so a plot's extension may
/// name the input too), and its bytes.
fn long_input(d: &Path) -> (PathBuf, Vec<u8>) {
    let p = d.join("in.svg");
    std::fs::copy(common::workspace().join(LONG), &p).unwrap();
    (p.clone(), std::fs::read(&p).unwrap())
}

fn temporaries(d: &Path) -> Vec<String> {
    names(d).into_iter().filter(|n| n.contains(".partial.") || n.starts_with(".gpuheap-probe.")).collect()
}

/// For each of the five outputs (`--html`, `--plot`, `--json` to a file, `trace repeat`, `bench --out`)
/// and each promise of `docs/src/inputs-and-outputs.md`: the input is never replaced (the same path, a
/// hard link, a symbolic link, another spelling, `/dev/stdout` on the input); a link planted at the
/// temporary file's former predictable name is not followed; a read-only target is refused (as the
/// shell would: root may write it); two outputs naming one file (standard output included) are refused
/// before any work; no temporary file survives SIGINT or SIGTERM at any moment of the run. Cases that
/// cannot apply are named in the table of the guide (`bench` reads no input; `--json` goes through
/// the shell's own open of standard output, so a read-only target or a temporary file is the shell's).
#[test]
fn every_output_keeps_every_promise() {
    for o in outs() {
        let d = dir(&format!("table-{}", o.name.replace(|c: char| !c.is_ascii_alphanumeric(), "")));
        let (inp, original) = long_input(&d);
        let tag = o.name;

        // The input is never replaced.
        if o.reads {
            std::os::unix::fs::symlink(&inp, d.join("sym.svg")).unwrap();
            std::fs::hard_link(&inp, d.join("hard.svg")).unwrap();
            let dotted = format!("{}/./in.svg", d.display());
            for t in [inp.clone(), d.join("sym.svg"), d.join("hard.svg"), PathBuf::from(&dotted)] {
                let ts = t.to_str().unwrap();
                let child = spawn(&o, &inp, ts, o.stdout.then_some(t.as_path()));
                let out = child.wait_with_output().unwrap();
                let err = String::from_utf8_lossy(&out.stderr);
                assert_eq!(out.status.code(), Some(2), "{tag} {ts}: {err}");
                assert_eq!(std::fs::read(&inp).unwrap(), original, "{tag} {ts}: the input changed");
            }
            // `/dev/stdout` redirected to the input.
            let out = spawn(&o, &inp, "/dev/stdout", Some(&inp)).wait_with_output().unwrap();
            assert_eq!(out.status.code(), Some(2), "{tag} /dev/stdout: {}", String::from_utf8_lossy(&out.stderr));
            assert_eq!(std::fs::read(&inp).unwrap(), original, "{tag} /dev/stdout: the input changed");
            for n in ["sym.svg", "hard.svg"] {
                std::fs::remove_file(d.join(n)).unwrap();
            }
        }

        // Two outputs naming one file: the target is also standard output (for `--json`: `--html` names
        // the file standard output is redirected to).
        let both = d.join("both.svg");
        std::fs::write(&both, "keep").unwrap();
        let b = both.to_str().unwrap();
        let child = if o.stdout {
            let args = ["explain", inp.to_str().unwrap(), "--json", "--html", b];
            let f = std::fs::OpenOptions::new().read(true).write(true).open(&both).unwrap();
            gpuheap(&args).stdout(f).stderr(Stdio::piped()).spawn().unwrap()
        } else {
            spawn(&o, &inp, b, Some(&both))
        };
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{tag} twice: {err}");
        assert!(err.contains("is standard output too"), "{tag} twice: {err}");
        assert_eq!(std::fs::read_to_string(&both).unwrap(), "keep", "{tag} twice: written");
        std::fs::remove_file(&both).unwrap();
        if o.name == "--plot" {
            // And two output flags on one file (`--plot F --html F`), refused before any work.
            refused(&run(&["compare", inp.to_str().unwrap(), "--plot", b, "--html", b]), "names the same file");
            assert!(!both.exists(), "{tag}: nothing written");
        }

        if !o.stdout {
            // A read-only target: refused, unless the shell may write it too (root).
            use std::os::unix::fs::PermissionsExt;
            let ro = d.join("ro.svg");
            std::fs::write(&ro, "keep").unwrap();
            std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o444)).unwrap();
            let shell_may =
                Command::new("sh").arg("-c").arg(format!("exec 3>>'{}'", ro.display())).status().unwrap().success();
            let out = spawn(&o, &inp, ro.to_str().unwrap(), None).wait_with_output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            if shell_may {
                assert_eq!(out.status.code(), Some(0), "{tag} read-only as root: {err}");
                assert_eq!(std::fs::metadata(&ro).unwrap().permissions().mode() & 0o777, 0o444, "{tag}: mode kept");
            } else {
                assert_eq!(out.status.code(), Some(2), "{tag} read-only: {err}");
                assert!(err.contains("is read-only"), "{tag}: {err}");
                assert_eq!(std::fs::read_to_string(&ro).unwrap(), "keep", "{tag} read-only: written");
            }
            std::fs::remove_file(&ro).unwrap();

            // A link planted at the temporary file's former name (`.NAME.PID.partial.EXT`) is not followed.
            let victim = d.join("victim");
            std::fs::write(&victim, "victim").unwrap();
            let target = d.join("out.svg");
            let mut child = spawn(&o, &inp, target.to_str().unwrap(), None);
            let old = d.join(format!(".out.svg.{}.partial.svg", child.id()));
            std::os::unix::fs::symlink(&victim, &old).unwrap();
            let status = child.wait().unwrap();
            assert!(status.success(), "{tag} planted: {status:?}");
            assert_eq!(std::fs::read_to_string(&victim).unwrap(), "victim", "{tag}: the planted link was followed");
            assert!(std::fs::symlink_metadata(&old).unwrap().file_type().is_symlink(), "{tag}: the link was replaced");
            assert!(std::fs::metadata(&target).unwrap().len() > 0, "{tag}: the output was written");
            for p in [&old, &victim, &target] {
                std::fs::remove_file(p).unwrap();
            }
        }

        // SIGINT and SIGTERM at several moments of the run: no temporary file is left, and the output is
        // either absent or whole (the run finished first).
        for (signal, after) in [(libc::SIGINT, 30), (libc::SIGTERM, 120), (libc::SIGINT, 300), (libc::SIGTERM, 600)] {
            let target = d.join("sig.svg");
            let stdout_file = d.join("stdout.json");
            std::fs::write(&stdout_file, "").unwrap();
            let mut child = spawn(&o, &inp, target.to_str().unwrap(), o.stdout.then_some(stdout_file.as_path()));
            std::thread::sleep(Duration::from_millis(after));
            // SAFETY: kill(2) on the child's pid, which this test owns and has not reaped.
            unsafe { libc::kill(child.id() as i32, signal) };
            let status = child.wait().unwrap();
            assert_eq!(temporaries(&d), Vec::<String>::new(), "{tag}: signal {signal} after {after} ms: {status:?}");
            if status.success() {
                assert!(o.stdout || std::fs::metadata(&target).unwrap().len() > 0, "{tag}: a whole output");
            } else if !o.stdout {
                assert!(!target.exists(), "{tag}: signal {signal} after {after} ms left {target:?} ({status:?})");
            }
            let _ = std::fs::remove_file(&target);
            std::fs::remove_file(&stdout_file).unwrap();
        }
        assert_eq!(std::fs::read(&inp).unwrap(), original, "{tag}: the input changed");
        assert_eq!(names(&d), ["in.svg"], "{tag}: only the input is left");
    }
}
