/* A stand-in CUDA driver library (libcuda.so.1), for PyTorch releases that open the driver with
 * dlopen("libcuda.so.1") and dlsym (c10's DriverAPI up to 2.5; later ones ask the runtime,
 * cudaGetDriverEntryPointByVersion). Each function forwards to the stand-in runtime's own (cudart.c, which
 * says why C), so the device memory they count is one: a cuMemCreate and a cudaMalloc draw on the same
 * capacity. No CUDA header: the parameters are spelled as the integers and pointers they are (CUdeviceptr and
 * handles are 64-bit, enums int). */
#include <stddef.h>
#include <stdio.h>

#define CUDA_ERROR_NOT_SUPPORTED 801
void *gpuheap_standin_driver_symbol(const char *name);

#define FORWARD(name, params, args)                                                                              \
    int name params {                                                                                            \
        int(*f) params = (int(*) params)gpuheap_standin_driver_symbol(#name);                                    \
        return f args;                                                                                           \
    }
FORWARD(cuDeviceGet, (int *d, int ordinal), (d, ordinal))
FORWARD(cuDeviceGetAttribute, (int *v, int attr, int dev), (v, attr, dev))
FORWARD(cuMemGetAllocationGranularity, (size_t *g, const void *prop, int flags), (g, prop, flags))
FORWARD(cuMemAddressReserve, (unsigned long long *p, size_t n, size_t align, unsigned long long addr, unsigned long long fl),
        (p, n, align, addr, fl))
FORWARD(cuMemAddressFree, (unsigned long long p, size_t n), (p, n))
FORWARD(cuMemCreate, (unsigned long long *h, size_t n, const void *prop, unsigned long long fl), (h, n, prop, fl))
FORWARD(cuMemRelease, (unsigned long long h), (h))
FORWARD(cuMemMap, (unsigned long long p, size_t n, size_t off, unsigned long long h, unsigned long long fl),
        (p, n, off, h, fl))
FORWARD(cuMemUnmap, (unsigned long long p, size_t n), (p, n))
FORWARD(cuMemSetAccess, (unsigned long long p, size_t n, const void *desc, size_t count), (p, n, desc, count))
FORWARD(cuGetErrorString, (int e, const char **s), (e, s))

#define UNMODELLED(name)                                                                                         \
    int name(void) {                                                                                             \
        fprintf(stderr, "[standin] not modelled: %s\n", #name);                                                  \
        return CUDA_ERROR_NOT_SUPPORTED;                                                                         \
    }
UNMODELLED(cuMemExportToShareableHandle)
UNMODELLED(cuMemImportFromShareableHandle)
UNMODELLED(cuMulticastAddDevice)
UNMODELLED(cuMulticastBindMem)
UNMODELLED(cuMulticastCreate)
