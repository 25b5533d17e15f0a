//! # gpuheap-builder
//!
//! Builds a `#![no_std]` Rust kernel crate to **one self-contained PTX file**
//! with rustc's own `nvptx64-nvidia-cuda` target, from a build script. It plays
//! the role of Rust-CUDA's `cuda_builder`, whose crates cannot be built with
//! current toolchains.
//!
//! ## Recipe (DESIGN.md §3.7)
//!
//! ```text
//! RUSTC_BOOTSTRAP=1 \
//! CARGO_ENCODED_RUSTFLAGS="-Zunstable-options -Cpanic=immediate-abort -Ctarget-cpu=sm_80 -Clinker=true" \
//! cargo rustc --manifest-path KERNELS/Cargo.toml --lib --release --crate-type cdylib \
//!   --target nvptx64-nvidia-cuda -Zbuild-std=core --target-dir SEPARATE_DIR \
//!   --config profile.release.lto="fat" --config profile.release.codegen-units=1 -- --emit=asm
//! ```
//!
//! * stable rustc with the rustup component `rust-src` (for `-Zbuild-std`);
//!   `RUSTC_BOOTSTRAP=1` is set for this nested build only;
//! * fat LTO pulls every used `core` function into the module, so the PTX has
//!   no `.extern` and `ptxas` accepts it;
//! * `-Clinker=true` stands in for `llvm-bitcode-linker`: rustc writes the
//!   `.s` (the PTX) before linking, and the "link" is a no-op;
//! * a separate target directory, so the nested cargo never waits for the
//!   outer build's lock.
//!
//! ## Target architecture
//!
//! The default is **`sm_80`**: one PTX (`.target sm_80`, `.version 7.0`) that
//! `ptxas` assembles, and the driver JIT-compiles, for Ampere *and* Hopper
//! (checked by the host crate's `ptx_check` test for sm_80 and sm_90). gpuheap
//! uses no Hopper-only instruction, so a second sm_90 PTX would add build time
//! and nothing else. Override with [`PtxBuilder::target_cpu`] or the
//! `GPUHEAP_PTX_ARCH` environment variable.
//!
//! ## Environment
//!
//! | variable | effect |
//! |---|---|
//! | `GPUHEAP_KERNEL_TOOLCHAIN` | build with this rustup toolchain (`nightly`, `1.95.0`, …) via `rustup run` instead of the one running the build script |
//! | `GPUHEAP_PTX_ARCH` | target CPU, e.g. `sm_90` |
//! | `GPUHEAP_REQUIRE_PTX=1` | a missing toolchain or a failed PTX build fails the build instead of warning |
//! | `DOCS_RS` | set by docs.rs: no PTX is built (an empty file and a reason, as for a missing toolchain; the docs need no CUDA and no nvptx toolchain) |
//!
//! ## Use from a build script
//!
//! ```no_run
//! // build.rs of a host crate whose kernels live in ../my-kernels
//! let ptx = gpuheap_builder::PtxBuilder::new("../my-kernels").build_in_build_script();
//! // ptx.path() is OUT_DIR/my_kernels.ptx: include_str! it (it is empty and
//! // ptx.missing_reason() says why when the toolchain is missing).
//! ```

use std::env;
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The rustup command that installs what the PTX build needs.
pub const INSTALL_COMMAND: &str = "rustup component add rust-src llvm-tools llvm-bitcode-linker";

/// Default `-Ctarget-cpu`: one PTX for Ampere and Hopper (see the crate docs).
pub const DEFAULT_TARGET_CPU: &str = "sm_80";

/// Why a PTX build did not produce a file.
#[derive(Debug)]
pub enum BuildError {
    /// The toolchain cannot build for nvptx (typically `rust-src` is missing).
    ToolchainMissing {
        /// What was looked for and not found.
        detail: String,
    },
    /// The kernel crate's manifest could not be read.
    BadCrate {
        /// The crate path given to [`PtxBuilder::new`].
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
    /// The nested `cargo rustc` failed; its stderr is included.
    CompileFailed {
        /// The command line that was run.
        command: String,
        /// Its standard error.
        stderr: String,
    },
    /// An I/O error while running cargo or copying the PTX.
    Io(std::io::Error),
    /// No build was attempted, on purpose (a docs.rs build: `DOCS_RS` is set).
    Skipped {
        /// Why.
        reason: String,
    },
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::ToolchainMissing { detail } => {
                write!(f, "the nvptx kernel toolchain is missing ({detail}); install it with: {INSTALL_COMMAND}")
            }
            BuildError::BadCrate { path, detail } => {
                write!(f, "kernel crate {}: {detail}", path.display())
            }
            BuildError::CompileFailed { command, stderr } => {
                write!(f, "`{command}` failed:\n{stderr}")
            }
            BuildError::Io(e) => write!(f, "I/O error during the PTX build: {e}"),
            BuildError::Skipped { reason } => write!(f, "no PTX build: {reason}"),
        }
    }
}

impl std::error::Error for BuildError {}

impl From<std::io::Error> for BuildError {
    fn from(e: std::io::Error) -> Self {
        BuildError::Io(e)
    }
}

/// What [`PtxBuilder::build_in_build_script`] produced.
#[derive(Debug, Clone)]
pub struct BuiltPtx {
    path: PathBuf,
    missing: Option<String>,
}

impl BuiltPtx {
    /// The PTX file in `OUT_DIR` (empty when the build was skipped).
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// Why there is no PTX, or `None` when it was built.
    pub fn missing_reason(&self) -> Option<&str> {
        self.missing.as_deref()
    }
}

/// Builds one kernel crate to PTX. See the crate docs for the recipe.
#[derive(Debug, Clone)]
pub struct PtxBuilder {
    crate_path: PathBuf,
    target_cpu: String,
    toolchain: Option<String>,
    target_dir: Option<PathBuf>,
    features: Vec<String>,
    output_name: Option<String>,
}

impl PtxBuilder {
    /// A builder for the kernel crate at `crate_path` (the folder holding its
    /// `Cargo.toml`; relative paths are taken from the current directory,
    /// which in a build script is the package's manifest directory).
    pub fn new(crate_path: impl AsRef<Path>) -> Self {
        Self {
            crate_path: crate_path.as_ref().to_path_buf(),
            target_cpu: env::var("GPUHEAP_PTX_ARCH").unwrap_or_else(|_| DEFAULT_TARGET_CPU.to_string()),
            toolchain: env::var("GPUHEAP_KERNEL_TOOLCHAIN").ok().filter(|s| !s.is_empty()),
            target_dir: None,
            features: Vec::new(),
            output_name: None,
        }
    }

    /// Sets `-Ctarget-cpu` (`sm_80`, `sm_90`, …).
    pub fn target_cpu(mut self, cpu: impl Into<String>) -> Self {
        self.target_cpu = cpu.into();
        self
    }

    /// Builds with this rustup toolchain (overrides `GPUHEAP_KERNEL_TOOLCHAIN`).
    pub fn toolchain(mut self, toolchain: impl Into<String>) -> Self {
        self.toolchain = Some(toolchain.into());
        self
    }

    /// Puts the nested build's artefacts here (default: `nvptx-kernels/` next
    /// to the outer build's profile folder, or `OUT_DIR/nvptx` otherwise).
    pub fn target_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.target_dir = Some(dir.into());
        self
    }

    /// Enables a cargo feature of the kernel crate.
    pub fn feature(mut self, feature: impl Into<String>) -> Self {
        self.features.push(feature.into());
        self
    }

    /// Names the file [`PtxBuilder::build_in_build_script`] writes
    /// `OUT_DIR/<name>.ptx` (default: the crate name with `_` for `-`), so
    /// one build script can build one crate twice, e.g. with different
    /// features.
    pub fn output_name(mut self, name: impl Into<String>) -> Self {
        self.output_name = Some(name.into());
        self
    }

    fn cargo(&self) -> Command {
        match &self.toolchain {
            Some(tc) => {
                let mut c = Command::new("rustup");
                c.args(["run", tc, "cargo"]);
                c
            }
            None => Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into())),
        }
    }

    fn rustc_sysroot(&self) -> Result<PathBuf, BuildError> {
        let mut c = match &self.toolchain {
            Some(tc) => {
                let mut c = Command::new("rustup");
                c.args(["run", tc, "rustc"]);
                c
            }
            None => Command::new(env::var_os("RUSTC").unwrap_or_else(|| "rustc".into())),
        };
        let out = c
            .args(["--print", "sysroot"])
            .output()
            .map_err(|e| BuildError::ToolchainMissing { detail: format!("cannot run rustc: {e}") })?;
        if !out.status.success() {
            return Err(BuildError::ToolchainMissing {
                detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    }

    /// Checks that the toolchain can build for nvptx (`rust-src` present).
    pub fn check_toolchain(&self) -> Result<(), BuildError> {
        let sysroot = self.rustc_sysroot()?;
        let core = sysroot.join("lib/rustlib/src/rust/library/core/Cargo.toml");
        if core.is_file() {
            Ok(())
        } else {
            Err(BuildError::ToolchainMissing { detail: format!("rust-src not found at {}", core.display()) })
        }
    }

    fn crate_name(&self) -> Result<String, BuildError> {
        let manifest = self.crate_path.join("Cargo.toml");
        let text = fs::read_to_string(&manifest).map_err(|e| BuildError::BadCrate {
            path: self.crate_path.clone(),
            detail: format!("cannot read {}: {e}", manifest.display()),
        })?;
        // The first `name = "..."` in [package]; enough for a kernel crate's
        // manifest (this crate has no TOML parser dependency on purpose).
        let mut in_package = false;
        for line in text.lines() {
            let t = line.trim();
            if t.starts_with('[') {
                in_package = t == "[package]";
            } else if in_package {
                if let Some(rest) = t.strip_prefix("name") {
                    if let Some(v) = rest.trim_start().strip_prefix('=') {
                        return Ok(v.trim().trim_matches('"').replace('-', "_"));
                    }
                }
            }
        }
        Err(BuildError::BadCrate { path: self.crate_path.clone(), detail: "no [package] name".into() })
    }

    /// Runs the nested build and copies the PTX to `out`.
    pub fn build_to(&self, out: &Path) -> Result<(), BuildError> {
        self.check_toolchain()?;
        let name = self.crate_name()?;
        let target_dir = match &self.target_dir {
            Some(d) => d.clone(),
            None => default_target_dir(),
        };
        let mut cmd = self.cargo();
        scrub_env(&mut cmd);
        cmd.arg("rustc")
            .arg("--manifest-path")
            .arg(self.crate_path.join("Cargo.toml"))
            .args([
                "--lib",
                "--release",
                "--crate-type",
                "cdylib",
                "--target",
                "nvptx64-nvidia-cuda",
                "-Zbuild-std=core",
            ])
            .arg("--target-dir")
            .arg(&target_dir)
            .args(["--config", "profile.release.lto=\"fat\"", "--config", "profile.release.codegen-units=1"])
            .args(["--config", "profile.release.panic=\"abort\"", "--config", "profile.release.debug=false"])
            .args(["--config", "profile.release.opt-level=3"]);
        if !self.features.is_empty() {
            cmd.arg("--features").arg(self.features.join(","));
        }
        cmd.args(["--", "--emit=asm"]);
        cmd.env("RUSTC_BOOTSTRAP", "1");
        let flags = [
            "-Zunstable-options",
            "-Cpanic=immediate-abort",
            &format!("-Ctarget-cpu={}", self.target_cpu),
            "-Clinker=true",
        ];
        cmd.env("CARGO_ENCODED_RUSTFLAGS", flags.join("\u{1f}"));
        let shown = format!("{cmd:?}");
        let output = cmd.output()?;
        if !output.status.success() {
            return Err(BuildError::CompileFailed {
                command: shown,
                stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            });
        }
        let ptx = target_dir.join("nvptx64-nvidia-cuda/release/deps").join(format!("{name}.s"));
        fs::copy(&ptx, out).map_err(|e| BuildError::BadCrate {
            path: self.crate_path.clone(),
            detail: format!("no PTX at {}: {e}", ptx.display()),
        })?;
        Ok(())
    }

    /// Builds from a build script: writes `OUT_DIR/<crate_name>.ptx`, prints
    /// the `rerun-if-changed` lines for the kernel crate, and on a missing
    /// toolchain prints a cargo warning with the install command, watches the
    /// sysroot's `lib/rustlib` (so the build reruns once the components are
    /// installed) and writes an empty file, unless `GPUHEAP_REQUIRE_PTX=1`, in which case it panics
    /// (a build-script panic is cargo's way to fail the build).
    pub fn build_in_build_script(&self) -> BuiltPtx {
        let out_dir = PathBuf::from(
            env::var_os("OUT_DIR").expect("build_in_build_script runs only inside a build script (OUT_DIR is unset)"),
        );
        let crate_name = self.crate_name().unwrap_or_else(|e| panic!("{e}"));
        let name = self.output_name.clone().unwrap_or(crate_name);
        let out = out_dir.join(format!("{name}.ptx"));
        for p in ["src", "Cargo.toml", "build.rs"] {
            println!("cargo:rerun-if-changed={}", self.crate_path.join(p).display());
        }
        for v in ["GPUHEAP_KERNEL_TOOLCHAIN", "GPUHEAP_PTX_ARCH", "GPUHEAP_REQUIRE_PTX", "DOCS_RS"] {
            println!("cargo:rerun-if-env-changed={v}");
        }
        let required = env::var("GPUHEAP_REQUIRE_PTX").is_ok_and(|v| v == "1");
        let built = if env::var_os("DOCS_RS").is_some() {
            Err(BuildError::Skipped { reason: "a docs.rs build (DOCS_RS is set) needs none".into() })
        } else {
            self.build_to(&out)
        };
        match built {
            Ok(()) => BuiltPtx { path: out, missing: None },
            Err(e) => {
                if required {
                    panic!("GPUHEAP_REQUIRE_PTX=1 and the PTX build failed: {e}");
                }
                if let (BuildError::ToolchainMissing { .. }, Ok(sysroot)) = (&e, self.rustc_sysroot()) {
                    // The components install under the sysroot's `lib/rustlib`: a build after
                    // `rustup component add` runs this script again and builds the PTX.
                    println!("cargo:rerun-if-changed={}", sysroot.join("lib/rustlib").display());
                }
                let reason = e.to_string();
                let first = reason.lines().next().unwrap_or_default();
                println!("cargo:warning=gpuheap: building {name} without PTX (GPU backend disabled): {first}");
                fs::write(&out, "").unwrap_or_else(|e| panic!("cannot write {}: {e}", out.display()));
                BuiltPtx { path: out, missing: Some(reason) }
            }
        }
    }
}

/// `target/nvptx-kernels` for a build script running under `target/<profile>/build/<pkg>/out`.
fn default_target_dir() -> PathBuf {
    let out = PathBuf::from(env::var_os("OUT_DIR").unwrap_or_else(|| "target".into()));
    // OUT_DIR = <target>/<profile>/build/<pkg-hash>/out (or with a <triple>/ level).
    out.ancestors()
        .find(|p| p.file_name().is_some_and(|n| n == "build"))
        .and_then(|b| b.parent())
        .and_then(|profile| profile.parent())
        .map(|t| t.join("nvptx-kernels"))
        .unwrap_or_else(|| out.join("nvptx"))
}

/// Removes what the outer cargo set for its own build script, so the nested
/// cargo starts clean (its own flags, target, profile and jobserver).
fn scrub_env(cmd: &mut Command) {
    for (k, _) in env::vars_os() {
        let Some(k) = k.to_str() else { continue };
        let outer = (k.starts_with("CARGO_") && k != "CARGO_HOME" && k != "CARGO_NET_OFFLINE")
            || k.starts_with("RUSTC")
            || k.starts_with("DEP_")
            || matches!(
                k,
                "RUSTFLAGS"
                    | "RUSTDOCFLAGS"
                    | "OUT_DIR"
                    | "TARGET"
                    | "HOST"
                    | "PROFILE"
                    | "OPT_LEVEL"
                    | "DEBUG"
                    | "NUM_JOBS"
                    | "MAKEFLAGS"
                    | "MFLAGS"
            );
        if outer {
            cmd.env_remove(k);
        }
    }
}
