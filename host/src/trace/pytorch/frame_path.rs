//! The one normaliser of a stack frame's file name: every rule that reads a frame's file (which frames
//! are the user's, the kind of a tensor, the label of a site) reads [`FramePath`], never the raw
//! `filename`.
//!
//! PyTorch records a Python frame's `filename` as CPython's `co_filename`
//! (`torch/csrc/profiler/combined_traceback.cpp`, `CapturedTraceback::gatherPython` via
//! `torch/csrc/profiler/python/combined_traceback.cpp`): the absolute path the module was imported
//! from, such as `/opt/venv/lib/python3.10/site-packages/torch/nn/modules/linear.py` on Linux or
//! `C:\Python310\Lib\site-packages\torch\nn\modules\module.py` on Windows. The rules want the path
//! relative to the `sys.path` entry that holds it (`torch/nn/modules/linear.py`), which is what
//! [`normalise`] recovers:
//!
//! 1. `<…>` pseudo-files (`<frozen runpy>`, `<string>`) are kept as they are;
//! 2. backslashes become `/`, a drive letter (`C:`) and repeated or `./` separators are dropped;
//! 3. a file under a `site-packages` or `dist-packages` folder (pip, virtual environments, conda,
//!    Debian's `dist-packages`, a user's `~/.local/lib/python3.X/site-packages`) is the path after the
//!    last such folder: an installed package;
//! 4. a file under `lib/pythonX.Y/` (`lib64/`, any prefix: `/usr`, a venv's base, pyenv, conda's
//!    `envs/NAME`), or under the `Lib` folder of a Windows Python install or conda environment, is the
//!    standard library: `python-stdlib/REST`;
//! 5. an absolute path with a `torch` folder that holds further folders (a source build of PyTorch,
//!    `python setup.py develop`), or a library of [`super::LIBRARY_PACKAGES`] right under a `src`
//!    folder (an editable install, `pip install -e`), is that package's path;
//! 6. any other absolute path (the program's own files) keeps its last two components
//!    (`/home/alice/proj/train/model.py` is `train/model.py`), enough to tell a file on a page;
//! 7. a relative path is kept (a snapshot whose paths were already shortened, a script run as
//!    `python train.py`, a C++ frame's `CUDACachingAllocator.cpp`, `??`).
//!
//! A path of rule 6 or 7 is an installed package when its first component names one
//! (PyTorch's ecosystem, `torch…/`, or one of [`super::LIBRARY_PACKAGES`]), else the program's own.
//!
//! The snapshots under `../shared/traces` had their paths shortened by these rules (3, 4 and 6;
//! see its `SOURCES.md`), so a file as published and its shortened copy normalise alike.
//!
//! Own code rather than a crate: `std::path` parses only the host's own path syntax (a Linux build
//! does not split `C:\…` at backslashes), and no maintained crate knows Python's install layouts.

use std::borrow::Cow;

/// Where a frame's file comes from, by its normalised path ([`normalise`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[doc(hidden)]
pub enum FileOrigin {
    /// A `<…>` pseudo-file (`<frozen runpy>`, `<string>`).
    Pseudo,
    /// Under a `site-packages`/`dist-packages` folder, or a recognised source or editable install.
    Installed,
    /// Python's standard library (`python-stdlib/…`).
    Stdlib,
    /// Anything else: the program's own files, a C++ source, `??`.
    Other,
}

/// A frame's file name, normalised ([`normalise`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[doc(hidden)]
pub struct FramePath<'a> {
    /// The path relative to the `sys.path` entry that holds it, `/`-separated: `torch/nn/modules/linear.py`,
    /// `python-stdlib/contextlib.py`, `train/model.py`, `<frozen runpy>`, `??`.
    pub path: Cow<'a, str>,
    /// Where it comes from.
    pub origin: FileOrigin,
}

/// Libraries that an editable install (`pip install -e`, a `src/` layout) or a source build puts
/// outside `site-packages`: recognised by rule 5 of the module docs.
fn is_package_dir(name: &str) -> bool {
    super::LIBRARY_PACKAGES.contains(&name) && !name.contains('.')
}

/// Whether `c` is a `pythonX` or `pythonX.Y` folder (`python3.10`, `python3`), as under `lib/`.
fn is_python_version_dir(c: &str) -> bool {
    c.strip_prefix("python").is_some_and(|v| !v.is_empty() && v.chars().all(|ch| ch.is_ascii_digit() || ch == '.'))
}

/// Whether the folder holding a Windows `Lib` folder is a Python install or a conda environment
/// (`Python310`, `Python`, `python3.11`, uv's `cpython-3.10.19-windows-…`, `anaconda3`, `miniconda3`, `miniforge3`, `mambaforge`, `envs\NAME`,
/// a venv's `.venv`/`venv`/`env`).
fn is_python_root(parent: &str, grandparent: Option<&str>) -> bool {
    let p = parent.to_ascii_lowercase();
    p.starts_with("python")
        || p.starts_with("cpython-")
        || p.contains("conda")
        || p.contains("miniforge")
        || p.contains("mambaforge")
        || matches!(p.as_str(), ".venv" | "venv" | "env" | ".env")
        || grandparent.is_some_and(|g| g.eq_ignore_ascii_case("envs"))
}

/// Normalises a frame's recorded file name (see the module docs for the rules).
#[doc(hidden)]
pub fn normalise(filename: &str) -> FramePath<'_> {
    if filename.starts_with('<') {
        return FramePath { path: Cow::Borrowed(filename), origin: FileOrigin::Pseudo };
    }
    let windows = filename.contains('\\') || drive_letter(filename);
    let body = if drive_letter(filename) { &filename[2..] } else { filename };
    let absolute = body.starts_with(['/', '\\']) || body.starts_with('~');
    let parts: Vec<&str> = body.split(['/', '\\']).filter(|c| !c.is_empty() && *c != ".").collect();
    let join = |from: usize| parts[from..].join("/");
    // 3. Installed packages: after the last `site-packages` / `dist-packages`.
    if let Some(i) =
        parts.iter().rposition(|c| c.eq_ignore_ascii_case("site-packages") || c.eq_ignore_ascii_case("dist-packages"))
    {
        if i + 1 < parts.len() {
            return FramePath { path: Cow::Owned(join(i + 1)), origin: FileOrigin::Installed };
        }
    }
    // 4. The standard library.
    let stdlib = |from: usize| FramePath {
        path: Cow::Owned(format!("python-stdlib/{}", join(from))),
        origin: FileOrigin::Stdlib,
    };
    if let Some(i) = (0..parts.len().saturating_sub(2)).rev().find(|&i| {
        matches!(parts[i], "lib" | "lib64" | "Lib") && is_python_version_dir(&parts[i + 1].to_ascii_lowercase())
    }) {
        return stdlib(i + 2);
    }
    if windows {
        if let Some(i) = (1..parts.len().saturating_sub(1)).rev().find(|&i| {
            parts[i].eq_ignore_ascii_case("lib") && is_python_root(parts[i - 1], i.checked_sub(2).map(|g| parts[g]))
        }) {
            return stdlib(i + 1);
        }
    }
    if !absolute {
        let joined = join(0);
        let origin = if parts.first() == Some(&"python-stdlib") { FileOrigin::Stdlib } else { by_name(&joined) };
        let path = if joined == body { Cow::Borrowed(body) } else { Cow::Owned(joined) };
        return FramePath { path, origin };
    }
    // 5. A source build of PyTorch, an editable install of a library.
    let n = parts.len();
    if let Some(i) = (0..n.saturating_sub(2)).find(|&i| parts[i] == "torch") {
        return FramePath { path: Cow::Owned(join(i)), origin: FileOrigin::Installed };
    }
    if let Some(i) = (1..n.saturating_sub(1)).find(|&i| parts[i - 1] == "src" && is_package_dir(parts[i])) {
        return FramePath { path: Cow::Owned(join(i)), origin: FileOrigin::Installed };
    }
    // 6. The program's own files.
    let path = join(n.saturating_sub(2));
    FramePath { origin: by_name(&path), path: Cow::Owned(path) }
}

/// The origin of a path that names no install folder (rules 6 and 7): an installed package when its first
/// component is PyTorch's ecosystem (starts with `torch`, with a folder below) or one of
/// [`super::LIBRARY_PACKAGES`], else the program's own.
fn by_name(path: &str) -> FileOrigin {
    let top = path.split('/').next().unwrap_or("");
    if (top.starts_with("torch") && path.contains('/')) || super::LIBRARY_PACKAGES.contains(&top) {
        FileOrigin::Installed
    } else {
        FileOrigin::Other
    }
}

/// Whether `s` starts with a drive letter (`C:`).
fn drive_letter(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() >= 2 && b[0].is_ascii_alphabetic() && b[1] == b':'
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> (String, FileOrigin) {
        let p = normalise(s);
        (p.path.into_owned(), p.origin)
    }

    #[test]
    fn installed_packages_in_every_layout() {
        use FileOrigin::Installed;
        let linear = ("torch/nn/modules/linear.py".to_string(), Installed);
        for raw in [
            "/opt/venv/lib/python3.10/site-packages/torch/nn/modules/linear.py",
            "/usr/local/lib/python3.11/dist-packages/torch/nn/modules/linear.py",
            "/home/u/miniconda3/envs/train/lib/python3.10/site-packages/torch/nn/modules/linear.py",
            "/home/u/.local/lib/python3.12/site-packages/torch/nn/modules/linear.py",
            "/home/u/proj/.venv/lib64/python3.9/site-packages/torch/nn/modules/linear.py",
            r"C:\Python310\Lib\site-packages\torch\nn\modules\linear.py",
            r"C:\Users\u\anaconda3\envs\x\Lib\site-packages\torch\nn\modules\linear.py",
            r"D:\proj\.venv\Lib\Site-Packages\torch\nn\modules\linear.py",
            "C:/Python310/Lib/site-packages/torch/nn/modules/linear.py",
            "/home/u/pytorch/torch/nn/modules/linear.py",
            "torch/nn/modules/linear.py",
        ] {
            assert_eq!(n(raw), linear, "{raw}");
        }
        assert_eq!(
            n("/home/u/transformers/src/transformers/models/opt/modeling_opt.py"),
            ("transformers/models/opt/modeling_opt.py".into(), Installed)
        );
    }

    #[test]
    fn standard_library_in_every_layout() {
        let ctx = ("python-stdlib/contextlib.py".to_string(), FileOrigin::Stdlib);
        for raw in [
            "/usr/lib/python3.10/contextlib.py",
            "/opt/conda/envs/a/lib/python3.11/contextlib.py",
            "/home/u/.pyenv/versions/3.10.4/lib/python3.10/contextlib.py",
            r"C:\Python310\Lib\contextlib.py",
            r"C:\Users\u\miniconda3\envs\x\Lib\contextlib.py",
            r"C:\Users\u\miniconda3\Lib\contextlib.py",
            r"C:\Users\u\AppData\Roaming\uv\python\cpython-3.10.19-windows-x86_64-none\lib\contextlib.py",
            "python-stdlib/contextlib.py",
        ] {
            assert_eq!(n(raw), ctx, "{raw}");
        }
        assert_eq!(
            n("/usr/lib/python3.10/concurrent/futures/thread.py"),
            ("python-stdlib/concurrent/futures/thread.py".into(), FileOrigin::Stdlib)
        );
    }

    #[test]
    fn own_files_keep_two_components_and_others_are_kept() {
        use FileOrigin::{Other, Pseudo};
        assert_eq!(n("/home/alice/proj/flexgen/flex_opt.py"), ("flexgen/flex_opt.py".into(), Other));
        assert_eq!(n(r"C:\Users\alice\proj\train.py"), ("proj/train.py".into(), Other));
        assert_eq!(n(r"C:\Users\alice\lib\utils.py"), ("lib/utils.py".into(), Other), "a lib folder outside Python");
        assert_eq!(n("/home/alice/transformers/x.py"), ("transformers/x.py".into(), FileOrigin::Installed));
        assert_eq!(n("threading.py"), ("threading.py".into(), FileOrigin::Installed), "a library by its name");
        assert_eq!(n("/tmp/ipykernel_12/3.py"), ("ipykernel_12/3.py".into(), Other));
        assert_eq!(n("flexgen/flex_opt.py"), ("flexgen/flex_opt.py".into(), Other));
        assert_eq!(n("train.py"), ("train.py".into(), Other));
        assert_eq!(n("??"), ("??".into(), Other));
        assert_eq!(n(""), ("".into(), Other));
        assert_eq!(n("<frozen runpy>"), ("<frozen runpy>".into(), Pseudo));
        assert_eq!(n("/train.py"), ("train.py".into(), Other));
        assert_eq!(n("C:"), ("".into(), Other));
        assert_eq!(n("/site-packages/"), ("site-packages".into(), Other));
    }
}
