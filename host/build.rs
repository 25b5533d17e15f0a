//! Builds `kernels/` to PTX with `gpuheap-builder` and tells the crate where
//! it is (`GPUHEAP_PTX_PATH`) and, when it could not be built, why
//! (`GPUHEAP_PTX_MISSING`).

fn main() {
    let mut builder = gpuheap_builder::PtxBuilder::new("../kernels");
    if std::env::var_os("CARGO_FEATURE_DEBUG_FREE").is_some() {
        builder = builder.feature("debug-free");
    }
    let ptx = builder.build_in_build_script();
    println!("cargo:rustc-env=GPUHEAP_PTX_PATH={}", ptx.path().display());
    let reason = ptx.missing_reason().unwrap_or("").lines().next().unwrap_or("").to_string();
    println!("cargo:rustc-env=GPUHEAP_PTX_MISSING={reason}");
    println!("cargo:rerun-if-changed=build.rs");
}
