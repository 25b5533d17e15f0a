//! Tells the build script of a dependent crate where this crate's sources are
//! (`DEP_GPUHEAP_KERNELS_MANIFEST_DIR`, through `links = "gpuheap_kernels"`):
//! `gpuheap`'s `build.rs` builds this very copy to PTX, whether it comes from
//! a path or from a registry.

fn main() {
    println!("cargo:manifest_dir={}", env!("CARGO_MANIFEST_DIR"));
    println!("cargo:rerun-if-changed=build.rs");
}
