//! Builds the example's kernel crate to PTX with the reusable builder.

fn main() {
    let ptx = gpuheap_builder::PtxBuilder::new("../kernels").build_in_build_script();
    println!("cargo:rustc-env=GROWABLE_ARRAYS_PTX={}", ptx.path().display());
    println!("cargo:rerun-if-changed=build.rs");
}
