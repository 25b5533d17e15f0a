//! Bad environment variables are bad input: an invalid `GPUHEAP_CPU_WARPS` or `GPUHEAP_CPU_SEED` exits 2
//! with one line naming the variable and the value as given, for every command that selects a backend.

use std::process::Command;

#[path = "../../host/tests/common/mod.rs"]
mod common;

#[test]
fn an_invalid_cpu_mode_or_seed_exits_2_naming_the_value() {
    let snap = common::workspace().join("data/equivariant-posteriors_oom_snapshot_new.pickle");
    let snap = snap.to_str().unwrap();
    for (var, value) in [("GPUHEAP_CPU_WARPS", "bogus"), ("GPUHEAP_CPU_SEED", "zz")] {
        let warps = if var == "GPUHEAP_CPU_SEED" { "independent" } else { value };
        // (`replay` of a host strategy runs no kernel and selects no backend.)
        for args in [&["check"][..], &["bench", "oom"], &["compare", snap], &["info"]] {
            let out = Command::new(env!("CARGO_BIN_EXE_gpuheap"))
                .args(args)
                .env("GPUHEAP_BACKEND", "cpu")
                .env("GPUHEAP_CPU_WARPS", warps)
                .env(var, value)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            if args == ["info"] && out.status.success() {
                continue; // `info` reports the backend it could select; it need not select the CPU's mode.
            }
            assert_eq!(out.status.code(), Some(2), "{var}={value} {args:?}: {err}");
            let last = err.trim_end().lines().last().unwrap_or("");
            assert!(last.contains(var) && last.contains(value), "{var}={value} {args:?}: {err}");
        }
    }
}
