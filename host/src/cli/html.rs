//! `--html FILE` of `replay`, `compare`, `explain` and `tune`: the page ([`gpuheap::html::pages`]) is
//! written to the file.
//!
//! The path is checked before any work (its folder must exist, it must not be a folder: else exit 2
//! with one line); the page is written through a temporary file renamed into place
//! ([`super::replay::write_atomically`]), so a failure never leaves a partial file.

use std::path::Path;

use gpuheap::html::HtmlReport;

use super::CliError;

/// Checks an `--html` path before any work: its folder exists and it is not a folder.
///
/// # Errors
/// [`CliError::Input`] (exit 2) naming the path.
pub(crate) fn check_path(p: &Path) -> Result<(), CliError> {
    let dir = p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !dir.is_dir() {
        return Err(CliError::Input(format!("{}: folder {} does not exist", p.display(), dir.display())));
    }
    if p.is_dir() {
        return Err(CliError::Input(format!("{}: is a directory", p.display())));
    }
    Ok(())
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
