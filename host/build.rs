//! Builds the `gpuheap-kernels` dependency to PTX twice with `gpuheap-builder`:
//!
//! * gpuheap's own module (every kernel entry), `GPUHEAP_PTX_PATH`, and when
//!   it could not be built, why (`GPUHEAP_PTX_MISSING`);
//! * the relocatable device library for CUDA C/C++ (feature
//!   `device-library`: the C ABI functions as `.visible .func`, no entry),
//!   `GPUHEAP_DEVICE_LIBRARY_PATH`, and its header `include/gpuheap.cuh`,
//!   `GPUHEAP_CUDA_HEADER_PATH`.
//!
//! The kernels crate's sources are found through its `links` metadata
//! (`DEP_GPUHEAP_KERNELS_MANIFEST_DIR`), so the PTX is built from the copy
//! cargo compiles: this workspace's, or the packaged one from a registry.

fn main() {
    let kernels = std::env::var("DEP_GPUHEAP_KERNELS_MANIFEST_DIR")
        .expect("gpuheap-kernels (links = \"gpuheap_kernels\") tells its sources' folder to this build script");
    let debug_free = std::env::var_os("CARGO_FEATURE_DEBUG_FREE").is_some();
    let with_features = |mut b: gpuheap_builder::PtxBuilder| {
        if debug_free {
            b = b.feature("debug-free");
        }
        b
    };
    let ptx = with_features(gpuheap_builder::PtxBuilder::new(&kernels)).build_in_build_script();
    println!("cargo:rustc-env=GPUHEAP_PTX_PATH={}", ptx.path().display());
    let reason = ptx.missing_reason().unwrap_or("").lines().next().unwrap_or("").to_string();
    println!("cargo:rustc-env=GPUHEAP_PTX_MISSING={reason}");
    // The device library: same sources and toolchain, so its build reuses the first one's `core`
    // and costs one more compile of the kernels crate.
    let lib = with_features(gpuheap_builder::PtxBuilder::new(&kernels))
        .feature("device-library")
        .output_name("gpuheap_device")
        .build_in_build_script();
    println!("cargo:rustc-env=GPUHEAP_DEVICE_LIBRARY_PATH={}", lib.path().display());
    let header = std::path::Path::new(&kernels).join("include/gpuheap.cuh");
    println!("cargo:rustc-env=GPUHEAP_CUDA_HEADER_PATH={}", header.display());
    println!("cargo:rerun-if-changed={}", header.display());
    println!("cargo:rerun-if-changed=build.rs");
}
