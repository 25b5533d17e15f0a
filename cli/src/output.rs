//! Output files and stdout: every output path (`--html`, `--plot`, `trace repeat OUT`, `bench alloc
//! --out`) is checked before any work (exit 2 with one line: [`check_output`], [`check_output_path`]),
//! and written through a temporary file in the same folder, renamed into place at the end
//! ([`write_atomically`]), so that an output never replaces the input, another output of the run, a
//! device, a link's node or a read-only file, and no error or signal leaves a partial file.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::plot::{self, PlotFormat};
use gpuheap::replay::ReplayReport;
use gpuheap::Error;
use gpuheap::Output;

/// A `--plot` to write: its path and format.
pub(crate) struct Plot {
    path: PathBuf,
    format: PlotFormat,
}

impl Plot {
    /// Plots the replays of `out` under its title; a note (the plot has no text) goes to stderr.
    pub fn write(&self, out: &Output) -> Result<(), Error> {
        let reports: Vec<&ReplayReport> = out.replays.iter().collect();
        let mut note = None;
        write_atomically(&self.path, |tmp, _| {
            note = plot::write_timeline(tmp, self.format, &out.title, &reports)
                .map_err(|e| Error::runtime(format!("{}: {e}", self.path.display())))?;
            Ok(())
        })?;
        if let Some(n) = note {
            super::stdout::err(format_args!("gpuheap: note: {n}\n"));
        }
        Ok(())
    }
}

/// Validates the plot path before any work: the extension, then [`check_output`].
pub(crate) fn check_plot(p: &Path, trace: &Path) -> Result<Plot, Error> {
    let format = PlotFormat::of(p).map_err(Error::input)?;
    check_output(p, trace)?;
    Ok(Plot { path: p.to_path_buf(), format })
}

/// [`check_output_path`], and the path is not the trace being read: the files are compared, not the
/// names (device and inode), so another spelling of the input, a symbolic or hard link to it, or
/// `/dev/stdout` redirected to it is refused too.
///
/// # Errors
/// Bad input (exit 2) naming the path.
pub(crate) fn check_output(p: &Path, trace: &Path) -> Result<(), Error> {
    if let (Ok(out), Ok(input)) = (std::fs::metadata(p), std::fs::metadata(trace)) {
        if file_id(&out) == file_id(&input) {
            return Err(Error::input(format!(
                "{}: is the trace being read (the same file as {}); writing the report there would replace it \
                 (choose another file)",
                p.display(),
                trace.display()
            )));
        }
    }
    check_output_path(p)
}

/// A file's identity: its device and inode.
fn file_id(m: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (m.dev(), m.ino())
}

/// An output of this run: its identity when it exists, and its path with the folder resolved.
struct Claim {
    path: PathBuf,
    id: Option<(u64, u64)>,
    resolved: Option<PathBuf>,
}

/// The outputs of this run so far ([`check_output_path`] refuses a second one naming the same file).
static CLAIMED: Mutex<Vec<Claim>> = Mutex::new(Vec::new());
/// The temporary files being written, removed by the SIGINT/SIGTERM handler ([`write_atomically`]).
static TEMPORARIES: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Checks an output path before any work:
///
/// * its folder exists and takes a new file (probed by creating and removing a temporary file there,
///   so an unwritable folder is reported here, with exit code 2, rather than after the work);
/// * it is not a folder nor another non-regular file (a device such as /dev/null, a terminal, a pipe:
///   the write renames a temporary file onto the path, which would replace the node or link);
/// * an existing file is one the user may write (`access(2)`, as the shell's `>` would: a file of mode
///   0444 is refused, except for root, whom the shell lets write it too);
/// * no other output of the same run names the same file (by identity, or by the path with its folder
///   resolved for a file still to be made).
///
/// Replacing an existing regular file is the convention of every output flag, as the shell's `>` is
/// (`docs/src/inputs-and-outputs.md`).
///
/// # Errors
/// Bad input (exit 2) naming the path.
pub(crate) fn check_output_path(p: &Path) -> Result<(), Error> {
    let dir = folder(p);
    if !dir.is_dir() {
        return Err(Error::input(format!("{}: folder {} does not exist", p.display(), dir.display())));
    }
    if p.is_dir() {
        return Err(Error::input(format!("{}: is a directory", p.display())));
    }
    let existing = std::fs::metadata(p).ok();
    if let Some(m) = &existing {
        if !m.is_file() {
            return Err(Error::input(format!(
                "{}: is not a regular file (a device, terminal, pipe or socket): the report is written to a \
                 temporary file renamed into place, which would replace it; give a file path",
                p.display()
            )));
        }
        if !may_write(p) {
            return Err(Error::input(format!(
                "{}: is read-only (mode {:o}); the shell would refuse to write it too (remove it or make it \
                 writable)",
                p.display(),
                std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777
            )));
        }
    }
    if let Err(e) = tempfile::Builder::new().prefix(".gpuheap-probe.").tempfile_in(dir) {
        return Err(Error::input(format!("{}: cannot write in folder {}: {e}", p.display(), dir.display())));
    }
    let claim = Claim {
        path: p.to_path_buf(),
        id: existing.as_ref().map(file_id),
        resolved: dir.canonicalize().ok().zip(p.file_name()).map(|(d, n)| d.join(n)),
    };
    let mut claimed = CLAIMED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(other) = claimed
        .iter()
        .find(|c| (c.id.is_some() && c.id == claim.id) || (c.resolved.is_some() && c.resolved == claim.resolved))
    {
        return Err(Error::input(format!(
            "{}: names the same file as the output {}; one would be lost (give each output its own file)",
            p.display(),
            other.path.display()
        )));
    }
    claimed.push(claim);
    Ok(())
}

/// The folder of the output `p` (`.` for a bare name).
fn folder(p: &Path) -> &Path {
    p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// Whether this process may write the existing file `p`, by the rules the kernel applies (`access(2)`).
fn may_write(p: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(p.as_os_str().as_bytes()) else { return false };
    // SAFETY: `c` is a NUL-terminated string that lives across the call; access(2) only reads it.
    unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
}

/// Installs, once, the SIGINT/SIGTERM handler that removes the temporary files being written and ends
/// the process with status 130 (128 + SIGINT, as a shell reports an interrupted program).
fn remove_temporaries_on_signals() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // A handler that cannot be installed (another one already is) leaves the default behaviour.
        let _ = ctrlc::set_handler(|| {
            let temps = TEMPORARIES.lock().unwrap_or_else(|e| e.into_inner());
            for t in temps.iter() {
                let _ = std::fs::remove_file(t);
            }
            std::process::exit(130);
        });
    });
}

/// Writes a file through a temporary file in the same folder, renamed onto `path` at the end. `write`
/// gets the temporary file open for writing (write through it where possible) and its path (for a
/// writer that opens files by name, such as plotters).
///
/// The temporary file has an unpredictable name (`.NAME.XXXXXXXXXXXX.partial.EXT`, keeping the
/// extension: plotters picks the image format from it) and is created with `O_CREAT|O_EXCL` (the
/// `tempfile` crate), so a link planted at any name is never followed; it is `fsync`ed, and renamed onto
/// `path` only if `path` is (still) absent or a regular file the user may write. It is removed on every
/// exit path: an error, a panic (its drop), SIGINT and SIGTERM (a handler).
///
/// # Errors
/// Those of `write`; a failed sync or rename, or a target that changed into something else since it was
/// checked, is a run-time failure naming `path`.
pub(crate) fn write_atomically(
    path: &Path,
    write: impl FnOnce(&Path, &std::fs::File) -> Result<(), Error>,
) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
    remove_temporaries_on_signals();
    let cannot = |e: &dyn std::fmt::Display| Error::runtime(format!("{}: cannot write: {e}", path.display()));
    // A symbolic link is written through, as the shell's `>` does (`/dev/stdout` redirected to a file is
    // that file): the rename replaces the file it names, never the link.
    let resolved = match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => path.canonicalize().ok(),
        _ => None,
    };
    let path = resolved.as_deref().unwrap_or(path);
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("out");
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("tmp");
    // The mode of the file replaced, else that of a new file (0666 less the umask), as `>` leaves it.
    let mode = std::fs::metadata(path).map_or(0o666, |m| m.permissions().mode() & 0o7777);
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(&format!(".partial.{ext}"))
        .rand_bytes(12)
        .permissions(std::fs::Permissions::from_mode(mode))
        .tempfile_in(folder(path))
        .map_err(|e| cannot(&e))?;
    TEMPORARIES.lock().unwrap_or_else(|e| e.into_inner()).push(tmp.path().to_path_buf());
    let r = write(tmp.path(), tmp.as_file()).and_then(|()| {
        tmp.as_file().sync_all().map_err(|e| cannot(&e))?;
        if let Ok(m) = std::fs::symlink_metadata(path) {
            let target = std::fs::metadata(path).ok();
            if !(m.is_file() || target.as_ref().is_some_and(|t| t.is_file())) || !may_write(path) {
                return Err(cannot(&"it is no longer a regular file this user may write"));
            }
        }
        Ok(())
    });
    let temp_path = tmp.path().to_path_buf();
    let r = r.and_then(|()| tmp.persist(path).map(|_| ()).map_err(|e| cannot(&e.error)));
    TEMPORARIES.lock().unwrap_or_else(|e| e.into_inner()).retain(|t| *t != temp_path);
    r
}

/// Writes `bytes` to `path` atomically.
///
/// # Errors
/// A run-time failure naming `path`; nothing is left behind.
pub(crate) fn write_file(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    use std::io::Write;
    write_atomically(path, |_, mut file| {
        file.write_all(bytes).map_err(|e| Error::runtime(format!("{}: cannot write: {e}", path.display())))
    })
}

/// Writes the HTML page of `out` to `html` (when given), then prints the JSON (`json`) or the text page.
pub(crate) fn finish(html: Option<&Path>, json: bool, out: &Output) -> Result<(), Error> {
    if let (Some(p), Some(page)) = (html, &out.html) {
        write_file(p, page.as_bytes())?;
    }
    if json {
        super::stdout::line(&out.json)?;
    } else {
        super::stdout::text(&out.text)?;
    }
    Ok(())
}
