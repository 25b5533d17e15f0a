// Per-thread growable arrays on the gpuheap device heap, in CUDA C++: the
// kernel of examples/growable-arrays (Rust) written against gpuheap.cuh.
//
// Thread i pushes 1 + (i * 7919) % max_pushes u32 values into an array that
// starts with room for 4 and doubles when full: allocate the larger block,
// copy with 16-byte loads and stores (the heap's blocks are 16-byte aligned),
// free the old block. At the end it checks every element, stores a checksum
// (0: an allocation failed) and its final capacity, and frees the array.
//
// gpuheap_malloc is warp-collective, so the growth step is warp-uniform: in
// each iteration the warp votes whether any lane must grow, and if so every
// lane calls gpuheap_malloc (with 0 bytes when it needs nothing).
#include "gpuheap.cuh"

// The same layout as growable_arrays_kernels::GrowParams (Rust), so one host
// program launches either kernel and checks it with one model.
struct grow_params {
    gpuheap_heap heap;
    unsigned long long threads;
    unsigned long long max_pushes;
    unsigned long long *checksums;
    unsigned long long *capacities;
};
static_assert(sizeof(grow_params) == 8 * GPUHEAP_HEAP_WORDS + 32, "grow_params: the layout of GrowParams");

// gpuheap_kernels::fill::pattern: the 32-bit word at index i for seed.
__device__ static unsigned pattern(unsigned long long seed, unsigned long long i) {
    unsigned long long z = (seed * 0x9E3779B97F4A7C15ull) ^ (i + 0xD1B54A32D192ED03ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (unsigned)(z ^ (z >> 31));
}

extern "C" __global__ void gpuheap_example_grow(const grow_params p) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i >= p.threads) return;
    unsigned long long n = 1 + (i * 7919) % (p.max_pushes ? p.max_pushes : 1);
    unsigned mask = __activemask();
    unsigned long long cap = 4;
    unsigned *data = (unsigned *)gpuheap_malloc(&p.heap, cap * 4);
    bool ok = data != nullptr;
    // Warp-uniform loop: every lane runs until the longest array is done.
    for (unsigned long long r = 0; r < p.max_pushes; r++) {
        bool grow_me = ok && r < n && r == cap;
        if (__ballot_sync(mask, grow_me)) {
            unsigned *bigger = (unsigned *)gpuheap_malloc(&p.heap, grow_me ? cap * 8 : 0);
            if (grow_me) {
                if (bigger == nullptr) {
                    ok = false;
                } else {
                    for (unsigned long long k = 0; k < cap / 4; k++)
                        ((uint4 *)bigger)[k] = ((const uint4 *)data)[k];
                    gpuheap_free(&p.heap, data);
                    data = bigger;
                    cap *= 2;
                }
            }
        }
        if (ok && r < n) data[r] = pattern(i, r);
    }
    unsigned long long sum = 0;
    if (ok) {
        unsigned long long s = n;
        for (unsigned long long k = 0; k < n; k++) s = s * 31 + data[k];
        sum = s | 1;
    }
    gpuheap_free(&p.heap, data);  // null is ignored
    p.checksums[i] = sum;
    p.capacities[i] = cap;
}
