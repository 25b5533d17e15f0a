/*
 * gpuheap.cuh: gpuheap's device heap for CUDA C/C++ kernels.
 *
 * The functions below are defined by gpuheap's relocatable device library
 * (gpuheap_device.ptx: PTX with `.visible .func` exports, `.target sm_80`,
 * for sm_80 and later; `scripts/device-library DIR` writes it beside this
 * header, and the Rust crate embeds it as gpuheap::ptx::DEVICE_LIBRARY_PTX).
 * Compile the kernel as relocatable device code and link the library as a
 * PTX input, e.g. with NVRTC and nvJitLink:
 *
 *   nvrtcCompileProgram(prog, {"-rdc=true", "-arch=compute_90", "-I<dir>"})
 *   nvJitLinkCreate(&h, {"-arch=sm_90"})
 *   nvJitLinkAddData(h, NVJITLINK_INPUT_PTX, <the kernel's PTX>)
 *   nvJitLinkAddData(h, NVJITLINK_INPUT_PTX, <gpuheap_device.ptx>)
 *   nvJitLinkComplete(h); nvJitLinkGetLinkedCubin(h, cubin)
 *
 * examples/cuda-cpp/ does exactly this for sm_80 and sm_90 (checked in CI).
 * Other linkers of relocatable device code that take PTX inputs (the
 * driver's cuLinkAddData with CU_JIT_INPUT_PTX; ptxas -c then nvlink) are
 * the same recipe but are not exercised by the project's tests.
 *
 * THE HEAP. The host creates it (Rust: gpuheap::device_heap::DeviceHeap::new
 * on the GPU backend) and passes its descriptor, DeviceHeap::handle() (the
 * #[repr(C)] struct gpuheap_kernels::heap::Heap, 152 bytes), to the kernel as
 * a by-value argument or inside a by-value parameter struct; the kernel hands
 * its address to these functions, which only read it. A descriptor is valid
 * while its DeviceHeap lives, on the device and context that created it. Its
 * words are the allocator's business: never build or change one.
 *
 * NULL. gpuheap_malloc returns null when size is 0 or the request cannot be
 * met, after a bounded amount of work (no thread waits for another); a null
 * for a nonzero size is counted (DeviceHeap::stats().failed_requests). A
 * slab-sized request (1..4096 bytes) returns null only when no page of its
 * size class had a free slot and the buddy allocator had no free page
 * (except for memory freed concurrently, and heavy churn: see
 * gpuheap_kernels::heap). Nothing is ever written into the heap's data by a
 * failing call.
 *
 * ALIGNMENT. Every pointer is 16-byte aligned (uint4/float4 loads and stores
 * are fine); blocks larger than 4096 bytes are 4096-byte aligned. Sizes
 * 1..4096 round up to a power of two of at least 16 bytes, larger ones to a
 * power of two of 4096-byte units.
 *
 * WARPS. gpuheap_malloc and gpuheap_handle_alloc are warp-collective over the
 * lanes active at the call (__activemask()): every active lane of the warp
 * calls them together, lanes that need nothing with size 0. Lanes may have
 * diverged before the call (each group of lanes that reaches it together is
 * served together). The other functions are not collective.
 *
 * REGISTERS. Linked as relocatable code, a kernel that calls these functions
 * uses at least the allocator's register count per thread (nvlink gives a
 * kernel the largest count in its call graph), which bounds the threads per
 * block it can be launched with (65536 registers per block on sm_80 and
 * sm_90, a warp's registers allocated in units of 256 and a block's warps
 * rounded up to the SM's 4 register sub-partitions: CUDA's occupancy rule,
 * which gpuheap's launch check applies too; a launch with more threads fails with
 * CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES). The figures of this version, measured
 * on a kernel that calls all five functions, linked by nvJitLink 12.9, and
 * checked against every build by examples/cuda-cpp/link.py (scripts/test),
 * which also rewrites them (--update-header):
 */
#define GPUHEAP_REGISTERS_SM80 125
#define GPUHEAP_MAX_BLOCK_THREADS_SM80 512
#define GPUHEAP_REGISTERS_SM90 118
#define GPUHEAP_MAX_BLOCK_THREADS_SM90 512
/*
 * gpuheap_malloc is the largest of the five. To launch larger blocks, cap the
 * registers at link time (nvJitLink or nvcc -maxrregcount=N): the allocator
 * then spills to local memory (ptxas 12.9, sm_80, device functions capped at
 * 64 registers: 120 bytes of spills in gpuheap_malloc).
 *
 * The Rust kernels that inline the same allocator use 52 to 59 registers,
 * and the same PTX compiled as a kernel entry takes 56: the difference is
 * the relocatable function. In its SASS the divergent fallbacks of the warp
 * collectives call external runtime helpers (__cuda_sm70_shflsync_idx and
 * others) under the full calling convention, where an entry calls
 * module-local copies; values live across such calls take more registers.
 *
 * MOVABLE BLOCKS. A heap created with DeviceHeap::with_movable also has a
 * movable region, whose blocks are named by handles (0 is never a handle)
 * and defragmented by the host's compaction (gpuheap::compaction). Resolve a
 * handle in the kernel that uses the pointer, and never keep a resolved
 * pointer across a compaction (kernels never run during one). See
 * gpuheap_kernels::compact::movable.
 */
#ifndef GPUHEAP_CUH
#define GPUHEAP_CUH

/* Words of a heap descriptor (152 bytes: the size of gpuheap_kernels::heap::Heap). */
#define GPUHEAP_HEAP_WORDS 19

/* A heap descriptor, from DeviceHeap::handle() on the host; opaque here. */
typedef struct gpuheap_heap {
    unsigned long long words[GPUHEAP_HEAP_WORDS];
} gpuheap_heap;

/* A movable block's handle: generation << 32 | table index; 0 is never valid. */
typedef unsigned long long gpuheap_handle;

#ifdef __cplusplus
extern "C" {
#endif

/* A block of `size` bytes from `heap`, 16-byte aligned, or null (size 0, or
 * the request cannot be met). Warp-collective over the active lanes. */
__device__ void *gpuheap_malloc(const gpuheap_heap *heap, unsigned long long size);

/* Frees `ptr`, a block from gpuheap_malloc on the same heap (any thread, any
 * later kernel); null is ignored. Nobody may use the block afterwards. Double
 * and foreign frees are undefined; the ones the allocator can see cheaply are
 * ignored (and counted with the host feature debug-free). Not collective. */
__device__ void gpuheap_free(const gpuheap_heap *heap, void *ptr);

/* A movable block of `size` bytes (rounded up to 16, 16-byte aligned) and its
 * handle, or 0: size 0, a heap without a movable region, or its span or handle
 * table exhausted (bounded time, no loop). Warp-collective over the active
 * lanes. */
__device__ gpuheap_handle gpuheap_handle_alloc(const gpuheap_heap *heap, unsigned long long size);

/* The current address of the block named by `handle` (valid for its size
 * rounded up to 16 bytes until the kernel ends), or null when the handle is
 * not live (0, freed, stale). Not collective. */
__device__ void *gpuheap_handle_resolve(const gpuheap_heap *heap, gpuheap_handle handle);

/* Frees the block of `handle`: 1 when freed (the handle stops resolving at
 * once; the bytes are reclaimed by the next compaction), 0, changing nothing,
 * when the handle is not live or its block is pinned. Not collective. */
__device__ int gpuheap_handle_free(const gpuheap_heap *heap, gpuheap_handle handle);

#ifdef __cplusplus
}
#endif

#endif /* GPUHEAP_CUH */
