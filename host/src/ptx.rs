//! gpuheap's own PTX module and the device library for CUDA C/C++, embedded at
//! build time by `host/build.rs`.

use crate::backend::BackendError;

/// The PTX text of `gpuheap-kernels` (`.target sm_80`, loads on Ampere and
/// Hopper), or an empty string when the build had no nvptx toolchain.
pub const KERNELS_PTX: &str = include_str!(env!("GPUHEAP_PTX_PATH"));

/// Why [`KERNELS_PTX`] is empty (empty when it was built).
#[doc(hidden)]
pub const PTX_MISSING_REASON: &str = env!("GPUHEAP_PTX_MISSING");

/// The relocatable device library for CUDA C/C++ kernels: `gpuheap-kernels`
/// built with its feature `device-library`, a PTX module (`.target sm_80`)
/// whose only symbols are the `.visible .func`s `gpuheap_malloc`,
/// `gpuheap_free`, `gpuheap_handle_alloc`, `gpuheap_handle_resolve` and
/// `gpuheap_handle_free` (`gpuheap_kernels::capi`). Link it as a PTX input
/// with a kernel compiled with `-rdc=true` (nvJitLink, `cuLinkAddData`, or
/// `ptxas -c` and nvlink); [`CUDA_HEADER`] declares the functions. Empty when
/// the build had no nvptx toolchain (as [`KERNELS_PTX`]).
pub const DEVICE_LIBRARY_PTX: &str = include_str!(env!("GPUHEAP_DEVICE_LIBRARY_PATH"));

/// `gpuheap.cuh`, the CUDA C/C++ header of [`DEVICE_LIBRARY_PTX`]: the
/// functions, their contract and the heap descriptor `gpuheap_heap` (the
/// bytes of [`crate::device_heap::DeviceHeap::handle`]).
pub const CUDA_HEADER: &str = include_str!(env!("GPUHEAP_CUDA_HEADER_PATH"));

/// The rustup command that installs the nvptx kernel toolchain (the same as
/// `gpuheap_builder::INSTALL_COMMAND`, which is a build dependency only).
#[doc(hidden)]
pub const INSTALL_COMMAND: &str = "rustup component add rust-src llvm-tools llvm-bitcode-linker";

/// The PTX, or [`BackendError::NoPtx`] naming the reason and the install command.
pub fn kernels_ptx() -> Result<&'static str, BackendError> {
    if KERNELS_PTX.is_empty() {
        Err(BackendError::NoPtx {
            reason: if PTX_MISSING_REASON.is_empty() { "unknown".into() } else { PTX_MISSING_REASON.into() },
            install: INSTALL_COMMAND,
        })
    } else {
        Ok(KERNELS_PTX)
    }
}

/// The warp collectives counted per entry by [`audit`], in report order:
/// `activemask`, `match.any.sync`, `vote.sync`, `shfl.sync`, `bar.warp.sync`.
#[doc(hidden)]
pub const COLLECTIVES: [&str; 5] = ["activemask", "match.any.sync", "vote.sync", "shfl.sync", "bar.warp.sync"];

/// What the static checks of `host/tests/ptx_check.rs` read off one
/// function (`.entry` or `.func`) of a PTX module: the facts a GPU would
/// show only as wrong results or slow code.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[doc(hidden)]
pub struct FunctionAudit {
    /// The function's name.
    pub name: String,
    /// `true` for a kernel entry, `false` for a `.func`.
    pub entry: bool,
    /// Occurrences of each of [`COLLECTIVES`], in that order: a compiler
    /// that duplicates a collective (no `convergent` attribute in this
    /// rustc) changes these counts.
    pub collectives: [u32; 5],
    /// `atom`/`red` instructions without explicit semantics
    /// (`.relaxed`/`.acquire`/`.release`/`.acq_rel`) or without `.gpu`
    /// scope, and `ld`/`st` with semantics but another scope: what
    /// `core::sync::atomic` emits on nvptx (rust-lang/rust#136480).
    pub weak_atomics: Vec<String>,
    /// Non-coherent loads (`ld.global.nc`, `ld.nc`): wrong for data another
    /// thread of the same kernel may write.
    pub nc_loads: Vec<String>,
    /// Plain (weak) `ld`/`st` whose address derives from the kernel
    /// parameter bytes named in [`audit`]'s `metadata` (the device heap's
    /// metadata pointer): such an access races with the heap's atomics.
    pub plain_metadata_accesses: Vec<String>,
    /// Collectives whose member mask does not derive, in this function,
    /// from `activemask` or the launch mask (`%tid.x`, `%ntid.x` and
    /// constants), directly or through a `match.any.sync` over such a mask.
    pub foreign_masks: Vec<String>,
}

/// The functions of `ptx`, each with the facts of [`FunctionAudit`].
/// `metadata(entry)` gives, for a kernel entry, the byte offsets in its
/// parameter block that hold a device-heap metadata pointer (its plain
/// loads and stores must not address that memory), or none.
///
/// A def-use scan over PTX virtual registers, flow-insensitive (a register
/// assigned in several places has the union of what its definitions derive
/// from): enough for the SSA-like PTX that LLVM writes.
#[doc(hidden)]
pub fn audit(ptx: &str, metadata: impl Fn(&str) -> Vec<u64>) -> Vec<FunctionAudit> {
    split_functions(ptx)
        .into_iter()
        .map(|(name, entry, body)| {
            let meta = if entry { metadata(&name) } else { Vec::new() };
            audit_function(name, entry, &body, &meta)
        })
        .collect()
}

/// `(name, is_entry, instructions)` of every function of `ptx`, each
/// instruction one `;`-terminated statement with inline-asm braces removed.
fn split_functions(ptx: &str) -> Vec<(String, bool, Vec<String>)> {
    let mut out = Vec::new();
    let mut current: Option<(String, bool, Vec<String>)> = None;
    let mut depth = 0i32;
    let mut pending_header: Option<(String, bool)> = None;
    for line in ptx.lines() {
        let t = line.trim();
        if current.is_none() {
            if let Some(rest) = t.strip_prefix(".visible .entry ").or_else(|| t.strip_prefix(".entry ")) {
                pending_header = Some((ident(rest), true));
            } else if let Some(rest) = t.strip_prefix(".visible .func ").or_else(|| t.strip_prefix(".func ")) {
                // `.func (.param .b64 func_retval0) name(` or `.func name(`.
                let rest = if rest.starts_with('(') { rest.split_once(')').map_or(rest, |x| x.1).trim() } else { rest };
                pending_header = Some((ident(rest), false));
            }
            if t.starts_with('{') {
                if let Some((name, entry)) = pending_header.take() {
                    current = Some((name, entry, Vec::new()));
                    depth = 1;
                }
            }
            continue;
        }
        // Inside a function body: `{`/`}` of inline-asm blocks and scopes.
        let code = t.split("//").next().unwrap_or("").trim();
        for stmt in code.split(';') {
            let s = stmt.trim().trim_start_matches('{').trim_end_matches('}').trim();
            let opens = stmt.matches('{').count() as i32;
            let closes = stmt.matches('}').count() as i32;
            depth += opens - closes;
            if !s.is_empty() && !s.starts_with('.') && !s.starts_with('$') {
                current.as_mut().expect("inside a function").2.push(s.to_string());
            }
        }
        if depth <= 0 {
            out.push(current.take().expect("inside a function"));
            depth = 0;
        }
    }
    out
}

fn ident(s: &str) -> String {
    s.chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '$').collect()
}

/// The `%`-registers of an operand list, in order.
fn registers(s: &str) -> Vec<&str> {
    let mut v = Vec::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let j = s[i + 1..]
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.'))
                .map_or(s.len(), |k| i + 1 + k);
            v.push(s[i..j].trim_end_matches('.'));
            i = j;
        } else {
            i += 1;
        }
    }
    v
}

fn audit_function(name: String, entry: bool, body: &[String], meta_offsets: &[u64]) -> FunctionAudit {
    use std::collections::HashSet;
    let mut a = FunctionAudit { name: name.clone(), entry, ..Default::default() };
    let split = |s: &str| -> (String, String) {
        let s = s.trim_start_matches(['@', '!']);
        // A guard `@%p bra ...`: drop it.
        let s = if s.starts_with('%') { s.split_once(char::is_whitespace).map_or("", |x| x.1).trim() } else { s };
        let (op, rest) = s.split_once(char::is_whitespace).unwrap_or((s, ""));
        (op.to_string(), rest.trim().to_string())
    };
    let is_plain_mem = |op: &str| {
        (op.starts_with("ld.") || op.starts_with("st.") || op == "ld" || op == "st")
            && ![".param", ".local", ".const", ".shared", ".relaxed", ".acquire", ".release", ".volatile"]
                .iter()
                .any(|q| op.contains(q))
    };
    // Taint of the metadata pointer and mask origins: fixpoints over defs.
    let mut meta: HashSet<String> = HashSet::new();
    let mut masks: HashSet<String> = HashSet::new();
    // Values computed from immediates alone (they may take part in a mask's
    // computation, but are not a mask by themselves).
    let mut consts: HashSet<String> = HashSet::new();
    let mut changed = true;
    while changed {
        changed = false;
        for stmt in body {
            let (op, rest) = split(stmt);
            let regs = registers(&rest);
            let Some(&dst) = regs.first() else { continue };
            if op.starts_with("st") || op.starts_with("red") || op.starts_with("bar") || op.starts_with("bra") {
                continue;
            }
            let srcs = &regs[1..];
            // Metadata pointer: loaded from the named parameter bytes, or
            // computed from such a value (not loaded through it).
            let from_param = op.starts_with("ld.param")
                && meta_offsets.iter().any(|o| {
                    let want = format!("_param_0+{o}]");
                    rest.contains(&want) || (*o == 0 && rest.ends_with("_param_0]"))
                });
            let derived = !op.starts_with("ld") && !op.starts_with("atom") && srcs.iter().any(|s| meta.contains(*s));
            if (from_param || derived) && meta.insert(dst.to_string()) {
                changed = true;
            }
            // Mask origins.
            let computed = !op.starts_with("ld") && !op.starts_with("atom") && !op.contains(".sync");
            if computed && srcs.iter().all(|s| consts.contains(*s)) && consts.insert(dst.to_string()) {
                changed = true;
            }
            let origin = op.starts_with("activemask")
                || (op.starts_with("mov") && (rest.contains("%tid.x") || rest.contains("%ntid.x")))
                || (op.starts_with("match.any.sync") && regs.last().is_some_and(|m| masks.contains(*m)))
                || (computed
                    && srcs.iter().any(|s| masks.contains(*s))
                    && srcs.iter().all(|s| masks.contains(*s) || consts.contains(*s)));
            if origin && masks.insert(dst.to_string()) {
                changed = true;
            }
        }
    }
    for stmt in body {
        let (op, rest) = split(stmt);
        let text = format!("{op} {rest}");
        for (k, c) in COLLECTIVES.iter().enumerate() {
            if op.starts_with(c) {
                a.collectives[k] += 1;
            }
        }
        if op.starts_with("atom") || op.starts_with("red") {
            let sem = [".relaxed", ".acquire", ".release", ".acq_rel"].iter().any(|q| op.contains(q));
            if !sem || !op.contains(".gpu") {
                a.weak_atomics.push(text.clone());
            }
        } else if (op.starts_with("ld.") || op.starts_with("st."))
            && [".relaxed", ".acquire", ".release"].iter().any(|q| op.contains(q))
            && !op.contains(".gpu")
        {
            a.weak_atomics.push(text.clone());
        }
        if (op.starts_with("ld") && op.contains(".nc")) || op.starts_with("ldu") {
            a.nc_loads.push(text.clone());
        }
        if is_plain_mem(&op) {
            let addr = rest.split_once('[').and_then(|x| x.1.split_once(']')).map_or("", |x| x.0);
            if registers(addr).iter().any(|r| meta.contains(*r)) {
                a.plain_metadata_accesses.push(text.clone());
            }
        }
        if op.contains(".sync")
            && (op.starts_with("match")
                || op.starts_with("vote")
                || op.starts_with("shfl")
                || op.starts_with("bar.warp"))
        {
            // The member mask is the last operand; an immediate is foreign too.
            let last = rest.rsplit(',').next().unwrap_or(&rest).trim();
            if !masks.contains(last) {
                a.foreign_masks.push(text.clone());
            }
        }
    }
    a
}

/// Per-function counts in the SASS that `nvdisasm -c` prints for a cubin:
/// instructions, `MEMBAR`s (each release and each fence), `CCTL.IVALL`s
/// (each acquire invalidates the SM's L1) and `ATOMS.CAST.SPIN` (the
/// shared-memory emulation a generic-address atomic carries).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[doc(hidden)]
pub struct SassCounts {
    /// Instructions (the padding `NOP`s after the end are not counted).
    pub instructions: u32,
    /// `MEMBAR` instructions.
    pub membar: u32,
    /// `CCTL.IVALL` instructions.
    pub cctl_ivall: u32,
    /// `ATOMS.CAST.SPIN` instructions.
    pub atoms_cast_spin: u32,
}

/// [`SassCounts`] per function (`.text.<name>` section) of an `nvdisasm -c`
/// listing.
#[doc(hidden)]
pub fn sass_counts(sass: &str) -> std::collections::BTreeMap<String, SassCounts> {
    let mut out = std::collections::BTreeMap::new();
    let mut current: Option<(String, SassCounts, u32)> = None;
    let finish = |c: Option<(String, SassCounts, u32)>, out: &mut std::collections::BTreeMap<String, SassCounts>| {
        if let Some((name, mut counts, trailing_nops)) = c {
            counts.instructions -= trailing_nops;
            out.insert(name, counts);
        }
    };
    for line in sass.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix(".section\t.text.").or_else(|| t.strip_prefix(".section .text.")) {
            finish(current.take(), &mut out);
            current = Some((rest.split(',').next().unwrap_or("").trim().to_string(), SassCounts::default(), 0));
            continue;
        }
        let Some((name, c, nops)) = current.as_mut() else { continue };
        let _ = name;
        // `/*0a30*/   @P0 MEMBAR.ALL.GPU ;`
        let Some(rest) = t.strip_prefix("/*").and_then(|r| r.split_once("*/")).map(|x| x.1.trim()) else { continue };
        let insn = rest.split(';').next().unwrap_or("").trim();
        let insn =
            if insn.starts_with('@') { insn.split_once(char::is_whitespace).map_or("", |x| x.1).trim() } else { insn };
        if insn.is_empty() {
            continue;
        }
        c.instructions += 1;
        let op = insn.split_whitespace().next().unwrap_or("");
        if op == "NOP" {
            *nops += 1;
        } else {
            *nops = 0;
        }
        if op.starts_with("MEMBAR") {
            c.membar += 1;
        }
        if op.starts_with("CCTL.IVALL") {
            c.cctl_ivall += 1;
        }
        if op.starts_with("ATOMS.CAST.SPIN") {
            c.atoms_cast_spin += 1;
        }
    }
    finish(current.take(), &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const PTX: &str = "
.version 7.0
.target sm_80
.extern .func free
(
	.param .b64 free_param_0
)
;
.visible .entry k(
	.param .align 8 .b8 k_param_0[64]
)
{
	.reg .b64 	%rd<20>;
	.reg .b32 	%r<20>;
	ld.param.b64 	%rd1, [k_param_0+16];
	ld.param.b64 	%rd2, [k_param_0+8];
	add.s64 	%rd3, %rd1, 64;
	// begin inline asm
	{ .reg .b64 %g; cvta.to.global.u64 %g, %rd3; atom.relaxed.gpu.global.add.u64 %rd4, [%g], 1; }
	// end inline asm
	ld.u64 	%rd5, [%rd3];
	st.u64 	[%rd2], %rd4;
	atom.global.add.u64 	%rd6, [%rd2], 1;
	ld.global.nc.u32 	%r9, [%rd2];
	// begin inline asm
	activemask.b32 %r1;
	// end inline asm
	mov.u32 	%r2, %tid.x;
	mov.b32 	%r3, -1;
	and.b32 	%r4, %r2, %r3;
	match.any.sync.b32 %r5, %r9, %r1;
	shfl.sync.idx.b32 %r6, %r9, 0, 31, %r5;
	vote.sync.ballot.b32 %r7, %p1, %r4;
	ld.u32 	%r8, [%rd2];
	bar.warp.sync %r8;
	bar.warp.sync %r3;
	ret;
}
";

    #[test]
    fn audit_finds_weak_atomics_nc_loads_metadata_accesses_and_foreign_masks() {
        let fns = audit(PTX, |name| if name == "k" { vec![16] } else { vec![] });
        assert_eq!(fns.len(), 1, "the .extern declaration has no body");
        let k = &fns[0];
        assert!(k.entry);
        assert_eq!(k.collectives, [1, 1, 1, 1, 2]);
        assert_eq!(k.weak_atomics, ["atom.global.add.u64 %rd6, [%rd2], 1"]);
        assert_eq!(k.nc_loads, ["ld.global.nc.u32 %r9, [%rd2]"]);
        // The plain load through the metadata pointer; not the atomic
        // (inside its asm block), not the store through the other pointer.
        assert_eq!(k.plain_metadata_accesses, ["ld.u64 %rd5, [%rd3]"]);
        // A mask loaded from memory, and a constant mask, are foreign; masks
        // from activemask, from a match.any over it, and from %tid.x with a
        // constant are not.
        assert_eq!(k.foreign_masks, ["bar.warp.sync %r8", "bar.warp.sync %r3"]);
    }

    #[test]
    fn sass_counts_per_function_without_trailing_padding() {
        let sass = "
	.section	.text.f,\"ax\",@progbits
        /*0000*/                   MEMBAR.ALL.GPU ;
        /*0010*/               @P0 ATOMS.CAST.SPIN.64 P0, [R2], R4, R6 ;
        /*0020*/                   CCTL.IVALL ;
        /*0030*/                   EXIT ;
        /*0040*/                   BRA `(.L_x_0) ;
        /*0050*/                   NOP ;
        /*0060*/                   NOP ;
	.section	.text.g,\"ax\",@progbits
        /*0000*/                   EXIT ;
";
        let c = sass_counts(sass);
        assert_eq!(c["f"], SassCounts { instructions: 5, membar: 1, cctl_ivall: 1, atoms_cast_spin: 1 });
        assert_eq!(c["g"].instructions, 1);
    }
}
