/* A stand-in NVML (libnvidia-ml.so.1) beside the stand-in CUDA runtime (cudart.c, which says why C): PyTorch's
 * allocator asks NVML, through c10's DriverAPI, whether a device's memory can be shared over a fabric
 * (get_fabric_access, when expandable segments map memory; PyTorch >= 2.10) and which processes use the GPU
 * (the out-of-memory message). A stand-in device has no fabric and no other process: NVML starts, finds the
 * device, says "not supported" for its fabric info, as on a GPU without one, and lists no process. Everything else is reported by
 * name on stderr and fails (NVML_ERROR_NOT_SUPPORTED). */
#include <stdio.h>

#define NVML_SUCCESS 0
#define NVML_ERROR_NOT_SUPPORTED 3
typedef int nvmlReturn_t;

static nvmlReturn_t not_modelled(const char *name) {
    fprintf(stderr, "[standin] not modelled: %s\n", name);
    return NVML_ERROR_NOT_SUPPORTED;
}
nvmlReturn_t nvmlInit_v2(void) { return NVML_SUCCESS; }
nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pci, void **device) {
    (void)pci;
    static int handle;
    *device = &handle;
    return NVML_SUCCESS;
}
/* No fabric: what NVML answers on a GPU without one. */
nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(void *device, void *info) {
    (void)device, (void)info;
    return NVML_ERROR_NOT_SUPPORTED;
}
/* No process runs on a stand-in device (the driver's own allocations are not listed by NVML either). */
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(void *device, unsigned *count, void *infos) {
    (void)device, (void)infos;
    *count = 0;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(void *device, unsigned link, int *type) {
    (void)device, (void)link, (void)type;
    return not_modelled("nvmlDeviceGetNvLinkRemoteDeviceType");
}
nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(void *device, unsigned link, void *pci) {
    (void)device, (void)link, (void)pci;
    return not_modelled("nvmlDeviceGetNvLinkRemotePciInfo_v2");
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) {
    *v = 13020;
    return NVML_SUCCESS;
}
