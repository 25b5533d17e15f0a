//! `--html FILE` of `replay`, `compare`, `explain` and `tune`: the page ([`gpuheap::html::pages`]) is
//! written to the file.
//!
//! The path is checked before any work ([`super::replay::check_output`]: exit 2 with one line); the page is
//! written through a temporary file renamed into place ([`super::replay::write_atomically`]), so a failure
//! never leaves a partial file.

use std::path::Path;

use gpuheap::html::HtmlReport;

use super::CliError;

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
