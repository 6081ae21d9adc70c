/* mf_cudrv — dlopen'ed CUDA driver table (see mf_cudrv.h). */
#include "mf_cudrv.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static mf_cudrv_t g_tab;
static const mf_cudrv_t *g_ok;
static char g_why[512];

/* Table slot ← exported symbol (the versioned names libcuda exports). */
#define SYMS(X)                                                                          \
    X(cuInit, "cuInit")                                                                  \
    X(cuDeviceGetCount, "cuDeviceGetCount")                                              \
    X(cuDeviceGet, "cuDeviceGet")                                                        \
    X(cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId")                                        \
    X(cuDeviceGetUuid, "cuDeviceGetUuid_v2")                                             \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain")                              \
    X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2")                         \
    X(cuCtxSetCurrent, "cuCtxSetCurrent")                                                \
    X(cuCtxGetCurrent, "cuCtxGetCurrent")                                                \
    X(cuCtxGetDevice, "cuCtxGetDevice")                                                  \
    X(cuMemAlloc, "cuMemAlloc_v2")                                                       \
    X(cuMemFree, "cuMemFree_v2")                                                         \
    X(cuMemGetInfo, "cuMemGetInfo_v2")                                                   \
    X(cuIpcGetMemHandle, "cuIpcGetMemHandle")                                            \
    X(cuIpcOpenMemHandle, "cuIpcOpenMemHandle_v2")                                       \
    X(cuIpcCloseMemHandle, "cuIpcCloseMemHandle")                                        \
    X(cuMemcpyHtoD, "cuMemcpyHtoD_v2")                                                   \
    X(cuMemcpyDtoH, "cuMemcpyDtoH_v2")                                                   \
    X(cuMemcpyDtoD, "cuMemcpyDtoD_v2")                                                   \
    X(cuMemcpyPeer, "cuMemcpyPeer")                                                      \
    X(cuDeviceCanAccessPeer, "cuDeviceCanAccessPeer")                                    \
    X(cuPointerGetAttribute, "cuPointerGetAttribute")                                    \
    X(cuGetErrorString, "cuGetErrorString")                                              \
    X(cuCtxSynchronize, "cuCtxSynchronize")                                              \
    X(cuStreamCreate, "cuStreamCreate")                                                  \
    X(cuStreamDestroy, "cuStreamDestroy_v2")                                             \
    X(cuStreamSynchronize, "cuStreamSynchronize")                                        \
    X(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2")                                         \
    X(cuMemsetD8Async, "cuMemsetD8Async")                                                \
    X(cuMemAllocHost, "cuMemAllocHost_v2")                                               \
    X(cuMemFreeHost, "cuMemFreeHost")                                                    \
    X(cuMemHostRegister, "cuMemHostRegister_v2")                                         \
    X(cuMemHostUnregister, "cuMemHostUnregister")                                        \
    X(cuModuleLoadData, "cuModuleLoadData")                                              \
    X(cuModuleUnload, "cuModuleUnload")                                                  \
    X(cuModuleGetFunction, "cuModuleGetFunction")                                        \
    X(cuLaunchKernel, "cuLaunchKernel")

static void load(void)
{
    const char *path = getenv("MF_CUDA_DRIVER");
    if (!path || !*path)
        path = "libcuda.so.1";
    /* Never dlclose'd: the driver keeps threads and state for the process's lifetime. */
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(g_why, sizeof(g_why), "no CUDA driver (%s)", e ? e : path);
        return;
    }
    mf_cudrv_t t;
    memset(&t, 0, sizeof(t));
#define LOAD_(field, name)                                                               \
    *(void **)&t.field = dlsym(h, name);                                                 \
    if (!t.field) {                                                                      \
        snprintf(g_why, sizeof(g_why), "CUDA driver %s lacks %s", path, name);           \
        return;                                                                          \
    }
    SYMS(LOAD_)
#undef LOAD_
    mf_cu_result_t r = t.cuInit(0);
    if (r != MF_CUDA_SUCCESS) {
        const char *s = NULL;
        if (t.cuGetErrorString(r, &s) != MF_CUDA_SUCCESS)
            s = NULL;
        snprintf(g_why, sizeof(g_why), "cuInit failed: %s (%d)", s ? s : "?", r);
        return;
    }
    int n = 0;
    if (t.cuDeviceGetCount(&n) != MF_CUDA_SUCCESS || n < 1) {
        snprintf(g_why, sizeof(g_why), "no CUDA device visible");
        return;
    }
    g_tab = t;
    g_ok = &g_tab;
}

mf_status_t mf_cudrv_get(const mf_cudrv_t **out, const char **why)
{
    pthread_once(&g_once, load);
    if (out)
        *out = g_ok;
    if (!g_ok) {
        if (why)
            *why = g_why;
        return MF_UNAVAILABLE;
    }
    return MF_OK;
}

const char *mf_cudrv_strerror(int cu_result)
{
    static __thread char buf[160];
    const char *s = NULL;
    pthread_once(&g_once, load);
    if (!g_ok || g_ok->cuGetErrorString(cu_result, &s) != MF_CUDA_SUCCESS || !s)
        s = "unknown CUDA error";
    snprintf(buf, sizeof(buf), "%s (CUresult %d)", s, cu_result);
    return buf;
}
