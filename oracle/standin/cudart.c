/* A stand-in CUDA runtime (libcudart.so.12 / libcudart.so.13) for running PyTorch's own caching allocator
 * (libc10_cuda.so of a torch wheel) on a machine with no GPU and no driver. See oracle/README.md.
 *
 * Why C, and our own: it must be a shared library with the soname and the symbol version of the real runtime
 * (`cudaMalloc@libcudart.so.13`), compiled against the CUDA headers of the wheel's CUDA major so every struct
 * (cudaDeviceProp, CUmemAllocationProp) has the layout libc10_cuda.so was built with; a C file with a linker
 * version script (cudart.map) does that in one compiler call, where a Rust cdylib would need those headers'
 * types transcribed per CUDA release. No library offers a fake CUDA runtime (the real one needs a driver).
 *
 * What it models (everything else PyTorch calls is reported by name on stderr, "[standin] not modelled: NAME",
 * and fails with cudaErrorNotSupported / CUDA_ERROR_NOT_SUPPORTED, so no result silently depends on it):
 * - devices: GPUHEAP_STANDIN_DEVICES (default 1), each of GPUHEAP_STANDIN_CAPACITY bytes (default 80 GiB);
 *   compute capability 9.0;
 * - memory: physical memory is counted in whole 2 MiB pages (a cudaMalloc of n bytes takes n rounded up to
 *   2 MiB, as the driver does); cudaMalloc fails with cudaErrorMemoryAllocation when that would exceed the
 *   capacity; cudaMemGetInfo reports capacity minus used. Virtual addresses are handed out, 2 MiB aligned, lowest
 *   unused range first, from a 1 TiB range per device, reused once freed, and never touched (nothing is read or
 *   written);
 * - the driver's virtual memory API that expandable segments reach through cudaGetDriverEntryPointByVersion:
 *   cuMemAddressReserve/Free (virtual ranges, no memory), cuMemCreate/Release (physical memory, counted
 *   against the capacity; CUDA_ERROR_OUT_OF_MEMORY past it), cuMemMap/Unmap, cuMemSetAccess,
 *   cuMemGetAllocationGranularity (2 MiB), cuDeviceGet, cuDeviceGetAttribute (virtual memory management
 *   supported), cuGetErrorString;
 * - streams (created, always idle) and events: an event recorded on a stream stays pending until the caller
 *   completes it (gpuheap_standin_complete_events(), exported for the oracle's driver) or something
 *   synchronises (cudaEventSynchronize, cudaStreamSynchronize, cudaDeviceSynchronize complete the events they
 *   wait for). So a `record_stream` free stays pending, as on a GPU whose kernels have not finished;
 * - stream capture: never capturing (cudaStreamIsCapturing says None); graph capture itself is not modelled.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PAGE (2ull << 20)
#define MAX_DEVICES 16

static void not_modelled(const char *name) { fprintf(stderr, "[standin] not modelled: %s\n", name); }

/* ---- devices and memory ---- */
static int ndev = 0, cur_dev = 0;
static unsigned long long cap[MAX_DEVICES], used[MAX_DEVICES];

static void init(void) {
    if (ndev) return;
    const char *d = getenv("GPUHEAP_STANDIN_DEVICES"), *c = getenv("GPUHEAP_STANDIN_CAPACITY");
    ndev = d ? atoi(d) : 1;
    if (ndev < 1 || ndev > MAX_DEVICES) {
        fprintf(stderr, "[standin] GPUHEAP_STANDIN_DEVICES=%s: not in 1..%d\n", d, MAX_DEVICES);
        abort();
    }
    unsigned long long bytes = c ? strtoull(c, 0, 10) : (80ull << 30);
    for (int i = 0; i < ndev; i++) cap[i] = bytes;
}
static unsigned long long pages(unsigned long long n) { return (n + PAGE - 1) / PAGE * PAGE; }

/* Unused virtual ranges per device, sorted by start, merged: a new range is the lowest that fits (first fit),
 * a freed one returns, so addresses are reused as a driver reuses them. The order of addresses matters: PyTorch
 * breaks ties between equal-size cached blocks by address (BlockComparatorSize). gpuheap's caching model places
 * segments by the same rule (host/src/reference/caching/vspace.rs, `va_alloc`), so the two see the same
 * addresses, relative to the range's base. */
typedef struct {
    unsigned long long start, len;
} range_t;
static range_t *holes[MAX_DEVICES];
static size_t nholes[MAX_DEVICES], capholes[MAX_DEVICES];
static unsigned long long va_base(int dev) { return 0x7f0000000000ull + ((unsigned long long)dev << 40); }
static void holes_insert(int dev, size_t at, range_t r) {
    if (nholes[dev] == capholes[dev]) {
        capholes[dev] = capholes[dev] ? 2 * capholes[dev] : 64;
        holes[dev] = realloc(holes[dev], capholes[dev] * sizeof(range_t));
        if (!holes[dev]) abort();
    }
    memmove(&holes[dev][at + 1], &holes[dev][at], (nholes[dev] - at) * sizeof(range_t));
    holes[dev][at] = r;
    nholes[dev]++;
}
static void holes_remove(int dev, size_t at) {
    memmove(&holes[dev][at], &holes[dev][at + 1], (nholes[dev] - at - 1) * sizeof(range_t));
    nholes[dev]--;
}
/* The lowest unused range of n bytes (rounded up to 2 MiB); 0 when none. */
static unsigned long long take_va(int dev, unsigned long long n) {
    n = pages(n ? n : 1);
    if (nholes[dev] == 0 && capholes[dev] == 0) holes_insert(dev, 0, (range_t){va_base(dev), 1ull << 40});
    for (size_t k = 0; k < nholes[dev]; k++)
        if (holes[dev][k].len >= n) {
            unsigned long long a = holes[dev][k].start;
            holes[dev][k].start += n;
            holes[dev][k].len -= n;
            if (!holes[dev][k].len) holes_remove(dev, k);
            return a;
        }
    return 0;
}
static void give_va(int dev, unsigned long long a, unsigned long long n) {
    n = pages(n ? n : 1);
    size_t i = 0;
    while (i < nholes[dev] && holes[dev][i].start < a) i++;
    int prev = i > 0 && holes[dev][i - 1].start + holes[dev][i - 1].len == a;
    int next = i < nholes[dev] && holes[dev][i].start == a + n;
    if (prev && next) {
        holes[dev][i - 1].len += n + holes[dev][i].len;
        holes_remove(dev, i);
    } else if (prev) {
        holes[dev][i - 1].len += n;
    } else if (next) {
        holes[dev][i].start = a;
        holes[dev][i].len += n;
    } else {
        holes_insert(dev, i, (range_t){a, n});
    }
}

/* Live cudaMalloc blocks and cuMemCreate handles: (start or handle, bytes counted, device). */
typedef struct {
    unsigned long long key, bytes;
    int dev;
} rec_t;
typedef struct {
    rec_t *v;
    size_t n, cap;
} recs_t;
static recs_t mallocs, handles;
static void rec_add(recs_t *r, unsigned long long key, unsigned long long bytes, int dev) {
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 256;
        r->v = realloc(r->v, r->cap * sizeof *r->v);
        if (!r->v) abort();
    }
    r->v[r->n++] = (rec_t){key, bytes, dev};
}
static int rec_take(recs_t *r, unsigned long long key, rec_t *out) {
    for (size_t i = r->n; i-- > 0;)
        if (r->v[i].key == key) {
            *out = r->v[i];
            r->v[i] = r->v[--r->n];
            return 1;
        }
    return 0;
}

cudaError_t cudaGetDeviceCount(int *c) { init(); *c = ndev; return cudaSuccess; }
cudaError_t cudaGetDevice(int *d) { init(); *d = cur_dev; return cudaSuccess; }
cudaError_t cudaSetDevice(int d) {
    init();
    if (d < 0 || d >= ndev) return cudaErrorInvalidDevice;
    cur_dev = d;
    return cudaSuccess;
}
/* CUDA 12's header names this cudaGetDeviceProperties_v2 (a macro); CUDA 13's has no suffix. */
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d) {
    init();
    if (d < 0 || d >= ndev) return cudaErrorInvalidDevice;
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "gpuheap stand-in %d", d);
    p->totalGlobalMem = cap[d];
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 132;
    p->warpSize = 32;
    p->pciDeviceID = d;
    return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int *v) { *v = CUDART_VERSION; return cudaSuccess; }
cudaError_t cudaRuntimeGetVersion(int *v) { *v = CUDART_VERSION; return cudaSuccess; }

cudaError_t cudaMalloc(void **ptr, size_t n) {
    init();
    unsigned long long b = pages(n);
    if (used[cur_dev] + b > cap[cur_dev]) {
        *ptr = 0;
        return cudaErrorMemoryAllocation;
    }
    unsigned long long a = take_va(cur_dev, n);
    if (!a) {
        *ptr = 0;
        return cudaErrorMemoryAllocation;
    }
    rec_add(&mallocs, a, b, cur_dev);
    used[cur_dev] += b;
    *ptr = (void *)(uintptr_t)a;
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
    rec_t r;
    if (!p) return cudaSuccess;
    if (!rec_take(&mallocs, (uintptr_t)p, &r)) return cudaErrorInvalidValue;
    used[r.dev] -= r.bytes;
    give_va(r.dev, (uintptr_t)p, r.bytes);
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t *f, size_t *t) {
    init();
    *f = cap[cur_dev] - used[cur_dev];
    *t = cap[cur_dev];
    return cudaSuccess;
}
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaPeekAtLastError(void) { return cudaSuccess; }
const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorNotSupported: return "operation not supported (gpuheap stand-in runtime)";
    default: return "error (gpuheap stand-in runtime)";
    }
}
const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    default: return "cudaErrorUnknown";
    }
}

/* ---- streams and events ---- */
typedef struct {
    int dev, pending;
    cudaStream_t stream;
} event_t;
static int next_stream = 0;
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned f, int p) {
    (void)f, (void)p;
    /* Even, as real handles (pointers) are: c10 tells an external stream from its own ids by the low bit. */
    *s = (cudaStream_t)(uintptr_t)(0x10000 + 16 * (++next_stream));
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithPriority(s, 0, 0); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned f) { return cudaStreamCreateWithPriority(s, f, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t s) { (void)s; return cudaSuccess; }
cudaError_t cudaDeviceGetStreamPriorityRange(int *l, int *g) { *l = 0; *g = -5; return cudaSuccess; }
cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *c) {
    (void)s;
    *c = cudaStreamCaptureStatusNone;
    return cudaSuccess;
}
cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *m) { (void)m; return cudaSuccess; }
cudaError_t cudaStreamQuery(cudaStream_t s) { (void)s; return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned f) { (void)s, (void)e, (void)f; return cudaSuccess; }

static event_t **events;
static size_t nevents, capevents;
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned f) {
    (void)f;
    event_t *ev = calloc(1, sizeof *ev);
    if (!ev) return cudaErrorMemoryAllocation;
    if (nevents == capevents) {
        capevents = capevents ? 2 * capevents : 256;
        events = realloc(events, capevents * sizeof *events);
        if (!events) abort();
    }
    ev->dev = cur_dev;
    events[nevents++] = ev;
    *e = (cudaEvent_t)ev;
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    for (size_t i = 0; i < nevents; i++)
        if (events[i] == (event_t *)e) {
            free(events[i]);
            events[i] = events[--nevents];
            return cudaSuccess;
        }
    return cudaErrorInvalidResourceHandle;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    event_t *ev = (event_t *)e;
    ev->pending = 1;
    ev->stream = s;
    return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) { return ((event_t *)e)->pending ? cudaErrorNotReady : cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t e) { ((event_t *)e)->pending = 0; return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    (void)a, (void)b;
    not_modelled("cudaEventElapsedTime");
    *ms = 0;
    return cudaErrorNotSupported;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    for (size_t i = 0; i < nevents; i++)
        if (events[i]->stream == s) events[i]->pending = 0;
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
    for (size_t i = 0; i < nevents; i++)
        if (events[i]->dev == cur_dev) events[i]->pending = 0;
    return cudaSuccess;
}
/* The GPU finishes its work: every recorded event completes. Returns how many were pending. */
__attribute__((visibility("default"))) int gpuheap_standin_complete_events(void) {
    int n = 0;
    for (size_t i = 0; i < nevents; i++) {
        n += events[i]->pending;
        events[i]->pending = 0;
    }
    return n;
}
/* Bytes of physical memory in use on DEV (cudaMalloc and cuMemCreate), for the oracle's checks. */
__attribute__((visibility("default"))) unsigned long long gpuheap_standin_used(int dev) {
    init();
    return dev >= 0 && dev < ndev ? used[dev] : 0;
}

/* ---- the driver's virtual memory API (expandable segments) ---- */
static int ctx_dev(void) { return cur_dev; }
static CUresult d_cuDeviceGet(CUdevice *d, int ordinal) {
    init();
    if (ordinal < 0 || ordinal >= ndev) return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}
static CUresult d_cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d) {
    (void)d;
    switch (a) {
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *v = 1; return CUDA_SUCCESS;
    /* No memory is shared with other processes or NICs: these decide only which handle types cuMemCreate is
     * asked for, not how much memory it takes. */
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED: *v = 0; return CUDA_SUCCESS;
    default:
        fprintf(stderr, "[standin] not modelled: cuDeviceGetAttribute(%d)\n", (int)a);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
}
static CUresult d_cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *p, CUmemAllocationGranularity_flags f) {
    (void)p, (void)f;
    *g = PAGE;
    return CUDA_SUCCESS;
}
static CUresult d_cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr, unsigned long long f) {
    (void)align, (void)addr, (void)f;
    init();
    *ptr = take_va(ctx_dev(), size);
    return *ptr ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
static CUresult d_cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    for (int d = 0; d < ndev; d++)
        if (ptr >= va_base(d) && ptr < va_base(d) + (1ull << 40)) {
            give_va(d, ptr, size);
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_INVALID_VALUE;
}
static unsigned long long next_handle = 1;
static CUresult d_cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *p, unsigned long long f) {
    (void)f;
    init();
    int dev = p->location.id;
    if (dev < 0 || dev >= ndev) return CUDA_ERROR_INVALID_DEVICE;
    unsigned long long b = pages(size);
    if (used[dev] + b > cap[dev]) return CUDA_ERROR_OUT_OF_MEMORY;
    used[dev] += b;
    *h = next_handle++;
    rec_add(&handles, *h, b, dev);
    return CUDA_SUCCESS;
}
static CUresult d_cuMemRelease(CUmemGenericAllocationHandle h) {
    rec_t r;
    if (!rec_take(&handles, h, &r)) return CUDA_ERROR_INVALID_VALUE;
    used[r.dev] -= r.bytes;
    return CUDA_SUCCESS;
}
static CUresult d_cuMemMap(CUdeviceptr ptr, size_t size, size_t off, CUmemGenericAllocationHandle h, unsigned long long f) {
    (void)ptr, (void)size, (void)off, (void)h, (void)f;
    return CUDA_SUCCESS;
}
static CUresult d_cuMemUnmap(CUdeviceptr ptr, size_t size) { (void)ptr, (void)size; return CUDA_SUCCESS; }
static CUresult d_cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *d, size_t n) {
    (void)ptr, (void)size, (void)d, (void)n;
    return CUDA_SUCCESS;
}
static CUresult d_cuGetErrorString(CUresult e, const char **s) {
    *s = e == CUDA_ERROR_OUT_OF_MEMORY ? "out of memory" : "error (gpuheap stand-in driver)";
    return CUDA_SUCCESS;
}

/* Driver entry points PyTorch resolves but the allocator's results do not depend on: each returns
 * CUDA_ERROR_NOT_SUPPORTED and says its name when called. */
#define UNMODELLED_DRIVER(_)                                                                                     \
    _(cuMemGetAddressRange) _(cuMemExportToShareableHandle) _(cuMemImportFromShareableHandle)                     \
    _(cuMemRetainAllocationHandle) _(cuMemGetAllocationPropertiesFromHandle) _(cuMemsetD32Async)                  \
    _(cuStreamWriteValue32) _(cuMulticastAddDevice) _(cuMulticastBindMem) _(cuMulticastCreate) _(cuMulticastUnbind) \
    _(cuCtxFromGreenCtx) _(cuCtxGetCurrent) _(cuCtxPopCurrent) _(cuCtxPushCurrent) _(cuCtxSetCurrent)               \
    _(cuGreenCtxCreate) _(cuGreenCtxDestroy) _(cuGreenCtxStreamCreate) _(cuDevSmResourceSplitByCount)              \
    _(cuDeviceGetDevResource) _(cuDevResourceGenerateDesc) _(cuLogsRegisterCallback) _(cuLogsUnregisterCallback)
#define STUB(name)                                                                                               \
    static CUresult stub_##name(void) {                                                                          \
        not_modelled(#name);                                                                                     \
        return CUDA_ERROR_NOT_SUPPORTED;                                                                         \
    }
UNMODELLED_DRIVER(STUB)

static void *driver_symbol(const char *sym) {
#define MODELLED(name)                                                                                           \
    if (!strcmp(sym, #name)) return (void *)d_##name;
    MODELLED(cuDeviceGet) MODELLED(cuDeviceGetAttribute) MODELLED(cuMemGetAllocationGranularity)
    MODELLED(cuMemAddressReserve) MODELLED(cuMemAddressFree) MODELLED(cuMemCreate) MODELLED(cuMemRelease)
    MODELLED(cuMemMap) MODELLED(cuMemUnmap) MODELLED(cuMemSetAccess) MODELLED(cuGetErrorString)
#define STUBBED(name)                                                                                            \
    if (!strcmp(sym, #name)) return (void *)stub_##name;
    UNMODELLED_DRIVER(STUBBED)
    return 0;
}
/* For the stand-in libcuda.so.1 (cuda.c): the modelled driver function NAME; a function that reports NAME as not
 * modelled and fails for the others. */
static CUresult unknown_driver_symbol(void) {
    not_modelled("a driver function (see the line above)");
    return CUDA_ERROR_NOT_SUPPORTED;
}
__attribute__((visibility("default"))) void *gpuheap_standin_driver_symbol(const char *name) {
    void *f = driver_symbol(name);
    if (!f) fprintf(stderr, "[standin] not modelled: driver function %s\n", name);
    return f ? f : (void *)unknown_driver_symbol;
}
cudaError_t cudaGetDriverEntryPointByVersion(const char *sym, void **f, unsigned int v, unsigned long long fl,
                                             enum cudaDriverEntryPointQueryResult *q) {
    (void)v, (void)fl;
    *f = driver_symbol(sym);
    if (!*f) fprintf(stderr, "[standin] not modelled: driver entry point %s\n", sym);
    if (q) *q = *f ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    return *f ? cudaSuccess : cudaErrorSymbolNotFound;
}
#if CUDART_VERSION < 13000
cudaError_t cudaGetDriverEntryPoint(const char *sym, void **f, unsigned long long fl,
                                    enum cudaDriverEntryPointQueryResult *q) {
    return cudaGetDriverEntryPointByVersion(sym, f, 12000, fl, q);
}
#endif

/* ---- not modelled: said by name, and failing ---- */
#define UNSUP(name, ...)                                                                                         \
    cudaError_t name(__VA_ARGS__) {                                                                              \
        not_modelled(#name);                                                                                     \
        return cudaErrorNotSupported;                                                                            \
    }
UNSUP(cudaDeviceCanAccessPeer, int *a, int b, int c)
UNSUP(cudaDeviceEnablePeerAccess, int a, unsigned b)
UNSUP(cudaDeviceGetDefaultMemPool, cudaMemPool_t *p, int d)
UNSUP(cudaDeviceGetGraphMemAttribute, int d, enum cudaGraphMemAttributeType a, void *v)
UNSUP(cudaDeviceSetGraphMemAttribute, int d, enum cudaGraphMemAttributeType a, void *v)
UNSUP(cudaFreeAsync, void *p, cudaStream_t s)
UNSUP(cudaMallocAsync, void **p, size_t n, cudaStream_t s)
UNSUP(cudaIpcCloseMemHandle, void *p)
UNSUP(cudaIpcGetMemHandle, cudaIpcMemHandle_t *h, void *p)
UNSUP(cudaIpcOpenMemHandle, void **p, cudaIpcMemHandle_t h, unsigned f)
UNSUP(cudaMemPoolGetAttribute, cudaMemPool_t p, enum cudaMemPoolAttr a, void *v)
UNSUP(cudaMemPoolSetAccess, cudaMemPool_t p, const struct cudaMemAccessDesc *d, size_t c)
UNSUP(cudaMemPoolSetAttribute, cudaMemPool_t p, enum cudaMemPoolAttr a, void *v)
UNSUP(cudaMemPoolTrimTo, cudaMemPool_t p, size_t n)
UNSUP(cudaMemcpy, void *d, const void *s, size_t n, enum cudaMemcpyKind k)
UNSUP(cudaMemcpyAsync, void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st)
UNSUP(cudaMemcpyPeerAsync, void *d, int dd, const void *s, int sd, size_t n, cudaStream_t st)
#if CUDART_VERSION >= 13000
UNSUP(cudaGraphNodeGetDependencies, cudaGraphNode_t n, cudaGraphNode_t *d, cudaGraphEdgeData *e, size_t *c)
UNSUP(cudaStreamGetCaptureInfo, cudaStream_t s, enum cudaStreamCaptureStatus *c, unsigned long long *id,
      cudaGraph_t *g, const cudaGraphNode_t **d, const cudaGraphEdgeData **e, size_t *n)
#endif
