//! Output files and stdout: every output path (`--html`, `--plot`, `bench alloc --out`) is checked
//! before any work (exit 2 with one line), and written through a temporary file in the same folder,
//! renamed into place at the end, so an error never leaves a partial file.

use std::path::{Path, PathBuf};

use crate::plot::{self, PlotFormat};
use gpuheap::app::Output;
use gpuheap::replay::ReplayReport;
use gpuheap::Error;

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
        write_atomically(&self.path, |tmp| {
            note = plot::write_timeline(tmp, self.format, &out.title, &reports)
                .map_err(|e| Error::runtime(format!("{}: {e}", self.path.display())))?;
            Ok(())
        })?;
        if let Some(n) = note {
            eprintln!("gpuheap: note: {n}");
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

/// [`check_output_path`], and the path is not the trace being read (writing there would replace the
/// input).
///
/// # Errors
/// Bad input (exit 2) naming the path.
pub(crate) fn check_output(p: &Path, trace: &Path) -> Result<(), Error> {
    if let (Ok(out), Ok(input)) = (p.canonicalize(), trace.canonicalize()) {
        if out == input {
            return Err(Error::input(format!(
                "{}: is the trace being read; writing the report there would replace it (choose another file)",
                p.display()
            )));
        }
    }
    check_output_path(p)
}

/// Checks an output path before any work: its folder exists and takes a new file, and it is not a folder
/// nor another non-regular file (a device such as /dev/null, a pipe).
///
/// The folder is probed by creating and removing the temporary file that [`write_atomically`] writes,
/// so an unwritable folder is reported here, with exit code 2, rather than after the work.
///
/// # Errors
/// Bad input (exit 2) naming the path.
pub(crate) fn check_output_path(p: &Path) -> Result<(), Error> {
    let dir = p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !dir.is_dir() {
        return Err(Error::input(format!("{}: folder {} does not exist", p.display(), dir.display())));
    }
    if p.is_dir() {
        return Err(Error::input(format!("{}: is a directory", p.display())));
    }
    // The write renames a temporary file onto `p`: onto /dev/null or /dev/stdout (as root) that would
    // replace the device node or link, so only a regular file (or a new path) is taken.
    if let Ok(m) = std::fs::metadata(p) {
        if !m.is_file() {
            return Err(Error::input(format!(
                "{}: is not a regular file (a device, pipe or socket): the report is written to a temporary \
                 file renamed into place, which would replace it; give a file path",
                p.display()
            )));
        }
    }
    let tmp = temp_path(p);
    match std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp) {
        Ok(_) => {
            let _ = std::fs::remove_file(&tmp);
            Ok(())
        }
        Err(e) => Err(Error::input(format!("{}: cannot write in folder {}: {e}", p.display(), dir.display()))),
    }
}

/// The temporary file [`write_atomically`] writes before renaming it to `path`: in the same folder,
/// keeping the extension (plotters picks the image format from it).
fn temp_path(path: &Path) -> PathBuf {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("out");
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("tmp");
    dir.join(format!(".{name}.{}.partial.{ext}", std::process::id()))
}

/// Writes a file through a temporary file in the same folder, renamed into place at the end (removed on
/// error). The temporary name keeps the extension.
///
/// # Errors
/// Those of `write`; a failed rename is a run-time failure naming `path`.
pub(crate) fn write_atomically(path: &Path, write: impl FnOnce(&Path) -> Result<(), Error>) -> Result<(), Error> {
    let tmp = temp_path(path);
    let r = write(&tmp).and_then(|()| {
        std::fs::rename(&tmp, path).map_err(|e| Error::runtime(format!("{}: cannot write: {e}", path.display())))
    });
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

/// Writes `bytes` to `path` atomically.
///
/// # Errors
/// A run-time failure naming `path`; nothing is left behind.
pub(crate) fn write_file(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    write_atomically(path, |tmp| {
        std::fs::write(tmp, bytes).map_err(|e| Error::runtime(format!("{}: cannot write: {e}", path.display())))
    })
}

/// Writes the HTML page of `out` to `html` (when given), then prints the JSON (`json`) or the text page.
pub(crate) fn finish(html: Option<&Path>, json: bool, out: &Output) -> Result<(), Error> {
    if let (Some(p), Some(page)) = (html, &out.html) {
        write_file(p, page.as_bytes())?;
    }
    if json {
        println!("{}", out.json);
    } else {
        print!("{}", out.text);
    }
    Ok(())
}
