//! Launch limits and occupancy: what a kernel's resources (registers per thread, static shared
//! memory) allow on a GPU architecture, as pure arithmetic, and the check the GPU backend makes
//! before every launch.
//!
//! The arithmetic is that of CUDA's occupancy calculator (`cuda_occupancy.h`:
//! `cudaOccMaxBlocksPerSMRegsLimit`, `cudaOccMaxBlocksPerSMSmemLimit`,
//! `cudaOccMaxBlocksPerSMWarpsLimit`), for compute capability 8.x and 9.0:
//!
//! * **Registers** are allocated per warp: `registers per thread × 32`, rounded up to the
//!   allocation unit of 256 registers. A block launches only if its warps, *rounded up to the
//!   SM's 4 sub-partitions*, fit the 65,536 registers of a block (the hardware check, "the
//!   verification logic assumes register allocations are made to all partitions
//!   simultaneously"), and if its warps themselves fit (the software check). Resident warps per
//!   SM: `4 × floor(16,384 / registers per warp)`.
//! * **Shared memory**: static plus dynamic bytes plus the 1 KiB the driver reserves per block
//!   (compute capability ≥ 8), rounded up to 128 bytes, against the SM's shared memory; a block
//!   may use at most 48 KiB without the `cuFuncSetAttribute` opt-in.
//! * **Warps and blocks**: at most `max_threads_per_sm / 32` warps and `max_blocks_per_sm`
//!   blocks per SM.
//!
//! So `gpuheap_heap_malloc` at 54 registers (sm_90, ptxas 12.9) is allocated 56 per thread, 1,792
//! per warp: a block of 32 warps (1,024 threads) needs 57,344 registers and launches, and an SM
//! holds 36 of its warps (9 per sub-partition). A kernel at 93 registers is allocated 96, 3,072 per
//! warp: a block of 21 warps (672 threads) rounds up to 24 warps, 73,728 registers, and is refused;
//! 640 threads (20 warps) is its largest block. A GPU reports the same figure for each
//! //! kernel as `CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK`, which the GPU backend reads at module load
//! and checks before each launch ([`KernelInfo::check`]), so an oversized launch fails with a
//! [`BackendError::LaunchLimit`] naming the kernel, the limit and the request instead of the
//! driver's bare `CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES`.

use super::{BackendError, LaunchConfig, Result};

/// Threads per warp.
pub const WARP: u32 = 32;

/// Per-SM and per-block resources of one GPU architecture, and the allocation units of the
/// occupancy arithmetic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arch {
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// Registers per SM (65,536).
    pub regs_per_sm: u32,
    /// Registers a block may use (65,536).
    pub regs_per_block: u32,
    /// Registers are allocated per warp in units of this many (256).
    pub reg_alloc_unit: u32,
    /// Most registers one thread may use.
    pub max_regs_per_thread: u32,
    /// Register-file sub-partitions per SM (4): a block's warps are rounded up to a multiple of
    /// this in the per-block register check.
    pub sub_partitions: u32,
    /// Threads per block (1,024).
    pub max_threads_per_block: u32,
    /// Resident threads per SM (2,048 on sm_80 and sm_90, 1,536 on sm_86 and sm_89).
    pub max_threads_per_sm: u32,
    /// Resident blocks per SM.
    pub max_blocks_per_sm: u32,
    /// Shared memory per SM at the largest carveout, bytes.
    pub shared_per_sm: u32,
    /// Shared memory a block may use without the opt-in attribute, bytes (48 KiB).
    pub shared_per_block: u32,
    /// Shared memory the driver reserves per block, bytes (1 KiB from compute capability 8.0).
    pub shared_reserved_per_block: u32,
    /// Shared memory is allocated in units of this many bytes (128).
    pub shared_alloc_unit: u32,
}

impl Arch {
    /// Ampere A100 (compute capability 8.0).
    #[doc(hidden)]
    pub const SM80: Arch = Arch {
        compute_capability: (8, 0),
        regs_per_sm: 65536,
        regs_per_block: 65536,
        reg_alloc_unit: 256,
        max_regs_per_thread: 255,
        sub_partitions: 4,
        max_threads_per_block: 1024,
        max_threads_per_sm: 2048,
        max_blocks_per_sm: 32,
        shared_per_sm: 164 << 10,
        shared_per_block: 48 << 10,
        shared_reserved_per_block: 1 << 10,
        shared_alloc_unit: 128,
    };

    /// Hopper H100 / H200 (compute capability 9.0).
    #[doc(hidden)]
    pub const SM90: Arch = Arch { compute_capability: (9, 0), shared_per_sm: 228 << 10, ..Arch::SM80 };

    /// The architecture of compute capability `major.minor`, when it is one of 8.0, 8.6, 8.7, 8.9
    /// and 9.0 (the GPUs the PTX targets); `None` otherwise.
    #[doc(hidden)]
    pub fn for_compute_capability(major: u32, minor: u32) -> Option<Arch> {
        let a = match (major, minor) {
            (8, 0) => Arch::SM80,
            (8, 6) => Arch { max_threads_per_sm: 1536, max_blocks_per_sm: 16, shared_per_sm: 100 << 10, ..Arch::SM80 },
            (8, 7) => Arch { shared_per_sm: 164 << 10, ..Arch::SM80 },
            (8, 9) => Arch { max_threads_per_sm: 1536, max_blocks_per_sm: 24, shared_per_sm: 100 << 10, ..Arch::SM80 },
            (9, 0) => Arch::SM90,
            _ => return None,
        };
        Some(Arch { compute_capability: (major, minor), ..a })
    }

    /// Registers allocated to one warp of a kernel using `regs` registers per thread.
    #[doc(hidden)]
    pub fn regs_per_warp(&self, regs: u32) -> u32 {
        (regs.max(1) * WARP).div_ceil(self.reg_alloc_unit) * self.reg_alloc_unit
    }

    /// `true` when a block of `warps` warps of a kernel using `regs` registers per thread passes
    /// the per-block register checks (hardware: warps rounded up to the sub-partitions; software:
    /// the warps themselves).
    #[doc(hidden)]
    pub fn block_fits_registers(&self, regs: u32, warps: u32) -> bool {
        let per_warp = self.regs_per_warp(regs) as u64;
        let assumed = per_warp * warps.div_ceil(self.sub_partitions) as u64 * self.sub_partitions as u64;
        regs <= self.max_regs_per_thread
            && assumed <= self.regs_per_block as u64
            && per_warp * warps as u64 <= self.regs_per_block as u64
    }

    /// The largest block (threads, a multiple of 32) of a kernel using `regs` registers per thread
    /// that the registers allow; 0 when not even one warp fits.
    #[doc(hidden)]
    pub fn max_block_threads(&self, regs: u32) -> u32 {
        let mut warps = self.max_threads_per_block / WARP;
        while warps > 0 && !self.block_fits_registers(regs, warps) {
            warps -= 1;
        }
        warps * WARP
    }

    /// Resident blocks per SM of a kernel using `regs` registers per thread and `static_shared`
    /// bytes of static shared memory, launched with `block` threads and `dynamic_shared` bytes,
    /// and the resource that limits it.
    #[doc(hidden)]
    pub fn occupancy(&self, regs: u32, static_shared: u32, block: u32, dynamic_shared: u32) -> Occupancy {
        let warps = block.div_ceil(WARP).max(1);
        let by_warps = if block > self.max_threads_per_block { 0 } else { self.max_threads_per_sm / WARP / warps };
        let by_regs = if self.block_fits_registers(regs, warps) {
            let per_partition = self.regs_per_sm / self.sub_partitions / self.regs_per_warp(regs);
            per_partition * self.sub_partitions / warps
        } else {
            0
        };
        let shared = static_shared as u64 + dynamic_shared as u64 + self.shared_reserved_per_block as u64;
        let shared = shared.div_ceil(self.shared_alloc_unit as u64) * self.shared_alloc_unit as u64;
        let limit = self.shared_per_block as u64 + self.shared_reserved_per_block as u64;
        let by_shared =
            if shared > limit { 0 } else { (self.shared_per_sm as u64 / shared).min(u32::MAX as u64) as u32 };
        let candidates = [
            (by_regs, Limiter::Registers),
            (by_shared, Limiter::SharedMemory),
            (by_warps, Limiter::Warps),
            (self.max_blocks_per_sm, Limiter::Blocks),
        ];
        let (blocks, limited_by) = candidates.into_iter().min_by_key(|&(n, _)| n).expect("four candidates");
        Occupancy { blocks_per_sm: blocks, warps_per_sm: blocks * warps, limited_by }
    }
}

/// What limits the resident blocks per SM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
#[doc(hidden)]
pub enum Limiter {
    /// The register file.
    Registers,
    /// Shared memory.
    SharedMemory,
    /// Resident warps per SM.
    Warps,
    /// Resident blocks per SM.
    Blocks,
}

/// Resident blocks and warps per SM at one launch geometry ([`Arch::occupancy`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[doc(hidden)]
pub struct Occupancy {
    /// Blocks per SM.
    pub blocks_per_sm: u32,
    /// Warps per SM (`blocks_per_sm ×` warps per block).
    pub warps_per_sm: u32,
    /// The resource that limits it (the first of registers, shared memory, warps, blocks that
    /// gives the minimum).
    pub limited_by: Limiter,
}

/// One kernel's resources as the driver reports them after the JIT (`cuFuncGetAttribute`), or as
/// `ptxas -v` reports them, and the launch limits that follow.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[doc(hidden)]
pub struct KernelInfo {
    /// Entry name in the PTX.
    pub name: String,
    /// Registers per thread (`CU_FUNC_ATTRIBUTE_NUM_REGS`).
    pub registers: u32,
    /// Local memory per thread, bytes (spills and stack: `LOCAL_SIZE_BYTES`).
    pub local_bytes: u32,
    /// Static shared memory per block, bytes (`SHARED_SIZE_BYTES`).
    pub static_shared_bytes: u32,
    /// Constant memory, bytes (`CONST_SIZE_BYTES`).
    pub const_bytes: u32,
    /// The largest block that launches, threads (`MAX_THREADS_PER_BLOCK`: the driver's figure,
    /// which depends on the registers; [`Arch::max_block_threads`] computes it).
    pub max_threads_per_block: u32,
    /// The most dynamic shared memory a launch may ask, bytes (`MAX_DYNAMIC_SHARED_SIZE_BYTES`).
    pub max_dynamic_shared_bytes: u32,
}

impl KernelInfo {
    /// The limits of kernel `name` using `registers` registers per thread and `static_shared`
    /// bytes of static shared memory on `arch`, computed ([`Arch::max_block_threads`]; the
    /// driver's figures are used on a GPU).
    pub fn computed(name: &str, arch: &Arch, registers: u32, static_shared: u32) -> Self {
        KernelInfo {
            name: name.to_string(),
            registers,
            local_bytes: 0,
            static_shared_bytes: static_shared,
            const_bytes: 0,
            max_threads_per_block: arch.max_block_threads(registers),
            max_dynamic_shared_bytes: arch.shared_per_block.saturating_sub(static_shared),
        }
    }

    /// Checks that `cfg` fits the kernel: at most [`max_threads_per_block`](Self::max_threads_per_block)
    /// threads and [`max_dynamic_shared_bytes`](Self::max_dynamic_shared_bytes) bytes per block.
    ///
    /// # Errors
    /// [`BackendError::LaunchLimit`] naming the kernel, the resource, the limit and the request.
    pub fn check(&self, cfg: &LaunchConfig) -> Result<()> {
        if cfg.block > self.max_threads_per_block {
            return Err(BackendError::LaunchLimit {
                kernel: self.name.clone(),
                resource: "threads per block",
                requested: cfg.block as u64,
                limit: self.max_threads_per_block as u64,
                reason: format!(
                    "{} registers per thread; a block's warps, rounded up to the SM's 4 register sub-partitions, \
                     must fit its 65536 registers",
                    self.registers
                ),
            });
        }
        if cfg.shared_bytes > self.max_dynamic_shared_bytes {
            return Err(BackendError::LaunchLimit {
                kernel: self.name.clone(),
                resource: "bytes of dynamic shared memory per block",
                requested: cfg.shared_bytes as u64,
                limit: self.max_dynamic_shared_bytes as u64,
                reason: format!(
                    "{} bytes of static shared memory; more needs the cuFuncSetAttribute opt-in",
                    self.static_shared_bytes
                ),
            });
        }
        Ok(())
    }
}

/// The `.entry` names of a PTX module, in order.
pub fn ptx_entries(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            if l.starts_with("//") {
                return None;
            }
            let rest = l.split_once(".entry")?.1;
            let name: String = rest
                .trim_start()
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '.'))
                .collect();
            (!name.is_empty()).then_some(name)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Register figures of ptxas 12.9 for the project's kernels (the PTX check's table, and those
    /// of the nested heap design before, 90 / 93) and the largest block CUDA's occupancy
    /// arithmetic gives for each.
    /// The CUDA C++ header promises, per target, the largest block of a kernel that calls the
    /// device library; it must be what the launch check allows at the header's register count
    /// (it promised 544 at 118 registers, where the rule gives 512 and a 544-thread launch fails).
    #[test]
    fn the_cuda_header_states_the_launch_checks_largest_block() {
        let header = include_str!("../../../kernels/include/gpuheap.cuh");
        let define = |name: &str| -> u32 {
            let line = header.lines().find(|l| l.starts_with(&format!("#define {name} "))).unwrap();
            line.rsplit(' ').next().unwrap().parse().unwrap()
        };
        for (arch, nn) in [(Arch::SM80, 80), (Arch::SM90, 90)] {
            let regs = define(&format!("GPUHEAP_REGISTERS_SM{nn}"));
            let threads = define(&format!("GPUHEAP_MAX_BLOCK_THREADS_SM{nn}"));
            assert_eq!(threads, arch.max_block_threads(regs), "sm_{nn}: {regs} registers");
        }
    }

    #[test]
    fn largest_block_follows_the_register_allocation() {
        for arch in [Arch::SM80, Arch::SM90] {
            // 93 registers: 96 per thread, 3072 per warp; 21 warps round up to 24 = 73728 > 65536.
            assert_eq!(arch.regs_per_warp(93), 3072);
            assert!(!arch.block_fits_registers(93, 21));
            assert!(arch.block_fits_registers(93, 20));
            assert_eq!(arch.max_block_threads(93), 640);
            assert_eq!(arch.max_block_threads(90), 640);
            assert_eq!(arch.max_block_threads(110), 512); // 112 × 32 = 3584: 16 warps
            assert_eq!(arch.max_block_threads(104), 512); // 3328: 19 warps round up to 20 = 66560
            assert_eq!(arch.max_block_threads(96), 640); // compact_move on sm_80
            assert_eq!(arch.max_block_threads(80), 768); // 2560: 24 warps = 61440
            assert_eq!(arch.max_block_threads(64), 1024); // 2048: 32 warps = 65536 exactly
            assert_eq!(arch.max_block_threads(65), 896); // 2304 (72 rounded): 28 warps = 64512
                                                         // malloc (52 / 54), churn (59 / 57), loop (54): 1792 or 2048 per warp, 32 warps fit.
            assert_eq!(arch.regs_per_warp(54), 1792);
            assert_eq!(arch.regs_per_warp(59), 2048);
            for regs in [52, 54, 57, 59] {
                assert_eq!(arch.max_block_threads(regs), 1024, "{regs} registers");
            }
            assert_eq!(arch.max_block_threads(56), 1024);
            assert_eq!(arch.max_block_threads(39), 1024);
            assert_eq!(arch.max_block_threads(255), 256); // 8192 per warp: 8 warps
            assert_eq!(arch.max_block_threads(256), 0); // over the per-thread limit
            assert_eq!(arch.max_block_threads(0), 1024);
        }
    }

    #[test]
    fn occupancy_matches_the_audit_figures_on_an_h200() {
        let a = Arch::SM90;
        // malloc (54 registers) at 256 threads: 9 warps per sub-partition, 36 per SM, 4 blocks of
        // 8 warps; the nested design's 93: 5 per sub-partition, 20 per SM, 2 blocks.
        let o = a.occupancy(54, 0, 256, 0);
        assert_eq!((o.blocks_per_sm, o.warps_per_sm, o.limited_by), (4, 32, Limiter::Registers));
        let o = a.occupancy(93, 0, 256, 0);
        assert_eq!((o.blocks_per_sm, o.warps_per_sm, o.limited_by), (2, 16, Limiter::Registers));
        // malloc at 1024 threads: one block of 32 warps.
        assert_eq!(a.occupancy(54, 0, 1024, 0).blocks_per_sm, 1);
        // free: 40 registers, 12 warps per sub-partition, 48 per SM: 6 blocks.
        assert_eq!(a.occupancy(39, 0, 256, 0).warps_per_sm, 48);
        // compact_move: 80 registers and 32 KiB: registers allow 3 blocks, shared memory 6.
        let o = a.occupancy(80, 0, 256, 32 << 10);
        assert_eq!((o.blocks_per_sm, o.limited_by), (3, Limiter::Registers));
        // compact_plan: 56 registers: 9 warps per sub-partition, 36 per SM, 4 blocks.
        assert_eq!(a.occupancy(56, 0, 256, 0).blocks_per_sm, 4);
        // Few registers: the warp limit (64 warps = 8 blocks of 256).
        let o = a.occupancy(18, 0, 256, 0);
        assert_eq!((o.blocks_per_sm, o.limited_by), (8, Limiter::Warps));
        // Tiny blocks: the block limit.
        let o = a.occupancy(18, 0, 32, 0);
        assert_eq!((o.blocks_per_sm, o.limited_by), (32, Limiter::Blocks));
        // Shared memory: 40 KiB + 1 KiB reserved = 41 KiB: 5 per 228 KiB (sm_90), 4 per 164 KiB (sm_80).
        let o = a.occupancy(18, 0, 64, 40 << 10);
        assert_eq!((o.blocks_per_sm, o.limited_by), (5, Limiter::SharedMemory));
        assert_eq!(Arch::SM80.occupancy(18, 0, 64, 40 << 10).blocks_per_sm, 4);
        // 48 KiB is the most without the opt-in; one byte more, or a block over the register
        // limit, and nothing resides.
        assert_eq!(a.occupancy(18, 0, 64, 48 << 10).blocks_per_sm, 4);
        assert_eq!(a.occupancy(18, 1, 64, 48 << 10).blocks_per_sm, 0);
        assert_eq!(a.occupancy(93, 0, 1024, 0).blocks_per_sm, 0);
        assert_eq!(a.occupancy(18, 0, 2048, 0).blocks_per_sm, 0);
    }

    #[test]
    fn other_ampere_parts_have_fewer_resident_threads() {
        let a = Arch::for_compute_capability(8, 6).unwrap();
        assert_eq!(a.compute_capability, (8, 6));
        assert_eq!(a.occupancy(18, 0, 256, 0).blocks_per_sm, 6); // 48 warps
        assert_eq!(a.max_block_threads(93), 640); // the same register file
        assert_eq!(Arch::for_compute_capability(9, 0), Some(Arch::SM90));
        assert_eq!(Arch::for_compute_capability(7, 5), None);
    }

    #[test]
    fn an_oversized_launch_is_refused_naming_kernel_limit_and_request() {
        let cfg = |block, shared_bytes| LaunchConfig { grid: 4, block, shared_bytes };
        // malloc at 54 registers launches at every block size up to 1,024 threads.
        let k = KernelInfo::computed("gpuheap_heap_malloc", &Arch::SM90, 54, 0);
        assert_eq!(k.max_threads_per_block, 1024);
        for block in [256, 768, 1024] {
            assert!(k.check(&cfg(block, 0)).is_ok(), "{block} threads");
        }
        assert!(matches!(k.check(&cfg(1056, 0)), Err(BackendError::LaunchLimit { limit: 1024, .. })));
        // A kernel at 96 registers (compact_move on sm_80; the nested malloc's 93 likewise): 640.
        let k = KernelInfo::computed("gpuheap_compact_move", &Arch::SM80, 96, 0);
        assert_eq!(k.max_threads_per_block, 640);
        assert!(k.check(&cfg(256, 0)).is_ok());
        assert!(k.check(&cfg(640, 0)).is_ok());
        for block in [672, 768, 1024] {
            match k.check(&cfg(block, 0)) {
                Err(e @ BackendError::LaunchLimit { .. }) => {
                    let BackendError::LaunchLimit { ref kernel, requested, limit, .. } = e else { unreachable!() };
                    assert_eq!((kernel.as_str(), requested, limit), ("gpuheap_compact_move", block as u64, 640));
                    let m = e.to_string();
                    assert!(m.contains("gpuheap_compact_move") && m.contains(&block.to_string()), "{m}");
                    assert!(m.contains("at most 640") && m.contains("96 registers"), "{m}");
                }
                r => panic!("{block} threads: {r:?}"),
            }
        }
        let m = KernelInfo::computed("gpuheap_compact_move", &Arch::SM90, 80, 0);
        assert!(m.check(&cfg(256, 48 << 10)).is_ok());
        let e = m.check(&cfg(256, (48 << 10) + 16)).unwrap_err();
        assert!(e.to_string().contains("dynamic shared memory") && e.to_string().contains("49152"), "{e}");
    }

    #[test]
    fn entries_are_read_from_the_ptx_text() {
        let ptx = "// .entry commented_out(\n.version 7.0\n.visible .entry gpuheap_heap_malloc(\n\t.param .align 8 .b8 p[192]\n)\n\
                   .visible .func  (.param .b64 r) helper(\n.entry  bare_entry (\n.weak .entry w$1()\n";
        assert_eq!(ptx_entries(ptx), ["gpuheap_heap_malloc", "bare_entry", "w$1"]);
        assert!(ptx_entries("").is_empty());
    }
}
