//! `--html FILE` of `replay`, `compare`, `explain` and `tune`: the page ([`gpuheap::html::pages`]) is
//! written to the file.
//!
//! The path is checked before any work (its folder must exist and take a new file, it must be neither a
//! folder nor the trace being read: else exit 2 with one line); the page is written through a temporary file renamed into place
//! ([`super::replay::write_atomically`]), so a failure never leaves a partial file.

use std::path::Path;

use gpuheap::html::HtmlReport;

use super::CliError;

/// Checks an `--html` path before any work ([`check_output`]).
///
/// # Errors
/// [`CliError::Input`] (exit 2) naming the path.
pub(crate) fn check_path(p: &Path, trace: &Path) -> Result<(), CliError> {
    check_output(p, trace)
}

/// Checks an output path (`--html`, `--plot`) before any work: its folder exists and takes a new file,
/// it is not a folder nor another non-regular file (a device such as /dev/null, a pipe), and it is not
/// the trace being read (writing there would replace the input).
///
/// The folder is probed by creating and removing the temporary file that
/// [`super::replay::write_atomically`] writes, so an unwritable folder is reported here, with exit
/// code 2, rather than after the work.
///
/// # Errors
/// [`CliError::Input`] (exit 2) naming the path.
pub(crate) fn check_output(p: &Path, trace: &Path) -> Result<(), CliError> {
    let dir = p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !dir.is_dir() {
        return Err(CliError::Input(format!("{}: folder {} does not exist", p.display(), dir.display())));
    }
    if p.is_dir() {
        return Err(CliError::Input(format!("{}: is a directory", p.display())));
    }
    // The write renames a temporary file onto `p`: onto /dev/null or /dev/stdout (as root) that would
    // replace the device node or link, so only a regular file (or a new path) is taken.
    if let Ok(m) = std::fs::metadata(p) {
        if !m.is_file() {
            return Err(CliError::Input(format!(
                "{}: is not a regular file (a device, pipe or socket): the report is written to a temporary \
                 file renamed into place, which would replace it; give a file path",
                p.display()
            )));
        }
    }
    if let (Ok(out), Ok(input)) = (p.canonicalize(), trace.canonicalize()) {
        if out == input {
            return Err(CliError::Input(format!(
                "{}: is the trace being read; writing the report there would replace it (choose another file)",
                p.display()
            )));
        }
    }
    let tmp = super::replay::temp_path(p);
    match std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp) {
        Ok(_) => {
            let _ = std::fs::remove_file(&tmp);
            Ok(())
        }
        Err(e) => Err(CliError::Input(format!("{}: cannot write in folder {}: {e}", p.display(), dir.display()))),
    }
}

/// Renders `report` and writes it to `path` atomically.
///
/// # Errors
/// [`CliError::Runtime`] (exit 1) when the file cannot be written; nothing is left behind.
pub(crate) fn write(path: &Path, report: &HtmlReport) -> Result<(), CliError> {
    let page = report.render().map_err(|e| CliError::Runtime(format!("{}: {e}", path.display())))?;
    super::replay::write_atomically(path, |tmp| {
        std::fs::write(tmp, page.as_bytes()).map_err(|e| format!("{}: cannot write: {e}", path.display()))
    })
}
