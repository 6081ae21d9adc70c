/*
 * mf_cudrv — the CUDA *driver* API, reached through dlopen so that nothing in proto/,
 * daemon/ or client/ links against CUDA (the same binaries run on CI without a GPU and on
 * an H200). The library is `$MF_CUDA_DRIVER` when set (tests point it at the fake driver,
 * tests/fakecuda/), else "libcuda.so.1". It is loaded once per process (pthread_once) and
 * cuInit(0) is called; the table of function pointers is then constant.
 *
 * Our own typedefs stand in for cuda.h's (same sizes and values): CUdeviceptr is an
 * unsigned long long, CUipcMemHandle 64 bytes, CUuuid 16 bytes. Symbols are the versioned
 * names libcuda exports (cuMemAlloc_v2, cuMemcpyHtoD_v2, cuIpcOpenMemHandle_v2, ...): the
 * unversioned ones are the old 32-bit ABI.
 *
 * Ownership: the table and the strings returned are static; never freed.
 * Thread safety: every function here may be called from any thread; the CUDA calls
 * through the table follow CUDA's own rules (a context must be current on the thread).
 */
#ifndef MF_CUDRV_H
#define MF_CUDRV_H

#include <stddef.h>
#include <stdint.h>

#include "mf_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef int mf_cu_result_t;                 /* CUresult */
typedef int mf_cu_device_t;                 /* CUdevice */
typedef struct mf_cu_ctx_st *mf_cu_context_t; /* CUcontext */
typedef unsigned long long mf_cu_deviceptr_t; /* CUdeviceptr */
typedef struct mf_cu_stream_st *mf_cu_stream_t;   /* CUstream (NULL: the legacy stream) */
typedef struct mf_cu_mod_st *mf_cu_module_t;      /* CUmodule */
typedef struct mf_cu_func_st *mf_cu_function_t;   /* CUfunction */

#define MF_CU_IPC_HANDLE_SIZE 64
typedef struct mf_cu_ipc_mem_handle {
    char reserved[MF_CU_IPC_HANDLE_SIZE];
} mf_cu_ipc_mem_handle_t;                   /* CUipcMemHandle (passed by value) */

typedef struct mf_cu_uuid {
    char bytes[16];
} mf_cu_uuid_t;                             /* CUuuid */

/* The CUresult values MapFlow looks at (cuda.h numbers). */
enum {
    MF_CUDA_SUCCESS = 0,
    MF_CUDA_ERROR_INVALID_VALUE = 1,
    MF_CUDA_ERROR_OUT_OF_MEMORY = 2,
    MF_CUDA_ERROR_NOT_INITIALIZED = 3,
    MF_CUDA_ERROR_NO_DEVICE = 100,
    MF_CUDA_ERROR_INVALID_DEVICE = 101,
    MF_CUDA_ERROR_INVALID_CONTEXT = 201,
    MF_CUDA_ERROR_MAP_FAILED = 205,
    MF_CUDA_ERROR_PEER_ACCESS_UNSUPPORTED = 217,
    MF_CUDA_ERROR_INVALID_PTX = 218,
    MF_CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222,
    MF_CUDA_ERROR_INVALID_HANDLE = 400,
    MF_CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
    MF_CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
    MF_CUDA_ERROR_NOT_FOUND = 500,
    MF_CUDA_ERROR_NOT_SUPPORTED = 801,
};

/* cuStreamCreate flags. */
#define MF_CU_STREAM_NON_BLOCKING 0x1u

/* cuMemHostRegister flags: PORTABLE makes the pinning count in every context of the
 * process (one registration serves the copies of all devices). */
#define MF_CU_MEMHOSTREGISTER_PORTABLE 0x1u
#define MF_CU_MEMHOSTREGISTER_DEVICEMAP 0x2u

/* cuIpcOpenMemHandle flags, cuPointerGetAttribute attributes, CUmemorytype. */
#define MF_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 0x1u
#define MF_CU_POINTER_ATTRIBUTE_CONTEXT 1
#define MF_CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define MF_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define MF_CU_MEMORYTYPE_DEVICE 2

typedef struct mf_cudrv {
    mf_cu_result_t (*cuInit)(unsigned flags);
    mf_cu_result_t (*cuDeviceGetCount)(int *count);
    mf_cu_result_t (*cuDeviceGet)(mf_cu_device_t *dev, int ordinal);
    mf_cu_result_t (*cuDeviceGetPCIBusId)(char *bus_id, int len, mf_cu_device_t dev);
    mf_cu_result_t (*cuDeviceGetUuid)(mf_cu_uuid_t *uuid, mf_cu_device_t dev); /* _v2 */
    mf_cu_result_t (*cuDevicePrimaryCtxRetain)(mf_cu_context_t *ctx, mf_cu_device_t dev);
    mf_cu_result_t (*cuDevicePrimaryCtxRelease)(mf_cu_device_t dev);          /* _v2 */
    mf_cu_result_t (*cuCtxSetCurrent)(mf_cu_context_t ctx);
    mf_cu_result_t (*cuCtxGetCurrent)(mf_cu_context_t *ctx);
    mf_cu_result_t (*cuCtxGetDevice)(mf_cu_device_t *dev);
    mf_cu_result_t (*cuMemAlloc)(mf_cu_deviceptr_t *dptr, size_t bytes);      /* _v2 */
    mf_cu_result_t (*cuMemFree)(mf_cu_deviceptr_t dptr);                      /* _v2 */
    mf_cu_result_t (*cuMemGetInfo)(size_t *free_bytes, size_t *total);        /* _v2 */
    mf_cu_result_t (*cuIpcGetMemHandle)(mf_cu_ipc_mem_handle_t *h, mf_cu_deviceptr_t dptr);
    mf_cu_result_t (*cuIpcOpenMemHandle)(mf_cu_deviceptr_t *dptr, mf_cu_ipc_mem_handle_t h,
                                         unsigned flags);                    /* _v2 */
    mf_cu_result_t (*cuIpcCloseMemHandle)(mf_cu_deviceptr_t dptr);
    mf_cu_result_t (*cuMemcpyHtoD)(mf_cu_deviceptr_t dst, const void *src, size_t n); /* _v2 */
    mf_cu_result_t (*cuMemcpyDtoH)(void *dst, mf_cu_deviceptr_t src, size_t n);       /* _v2 */
    mf_cu_result_t (*cuMemcpyDtoD)(mf_cu_deviceptr_t dst, mf_cu_deviceptr_t src,
                                   size_t n);                                         /* _v2 */
    mf_cu_result_t (*cuMemcpyPeer)(mf_cu_deviceptr_t dst, mf_cu_context_t dst_ctx,
                                   mf_cu_deviceptr_t src, mf_cu_context_t src_ctx, size_t n);
    mf_cu_result_t (*cuDeviceCanAccessPeer)(int *can, mf_cu_device_t dev, mf_cu_device_t peer);
    mf_cu_result_t (*cuPointerGetAttribute)(void *data, int attribute, mf_cu_deviceptr_t ptr);
    mf_cu_result_t (*cuGetErrorString)(mf_cu_result_t r, const char **str);
    /* Ordering: a pageable cuMemcpyHtoD returns once the bytes are staged and a DtoD before
     * it completes, so another process (the daemon) sees them only after a synchronize. */
    mf_cu_result_t (*cuCtxSynchronize)(void);
    mf_cu_result_t (*cuStreamCreate)(mf_cu_stream_t *s, unsigned flags);
    mf_cu_result_t (*cuStreamDestroy)(mf_cu_stream_t s);                      /* _v2 */
    mf_cu_result_t (*cuStreamSynchronize)(mf_cu_stream_t s);
    mf_cu_result_t (*cuMemcpyDtoHAsync)(void *dst, mf_cu_deviceptr_t src, size_t n,
                                        mf_cu_stream_t s);                   /* _v2 */
    mf_cu_result_t (*cuMemsetD8Async)(mf_cu_deviceptr_t dst, unsigned char v, size_t n,
                                      mf_cu_stream_t s);
    mf_cu_result_t (*cuMemAllocHost)(void **p, size_t bytes);                 /* _v2 */
    mf_cu_result_t (*cuMemFreeHost)(void *p);
    /* Page-locks existing host memory (a mapped memfd arena) so copies to and from it are
     * DMA'd directly instead of through the driver's pageable bounce buffers. */
    mf_cu_result_t (*cuMemHostRegister)(void *p, size_t bytes, unsigned flags); /* _v2 */
    mf_cu_result_t (*cuMemHostUnregister)(void *p);
    /* Modules (the daemon's row-validation kernel, PTX embedded at build time). */
    mf_cu_result_t (*cuModuleLoadData)(mf_cu_module_t *m, const void *image);
    mf_cu_result_t (*cuModuleUnload)(mf_cu_module_t m);
    mf_cu_result_t (*cuModuleGetFunction)(mf_cu_function_t *f, mf_cu_module_t m,
                                          const char *name);
    mf_cu_result_t (*cuLaunchKernel)(mf_cu_function_t f, unsigned gx, unsigned gy, unsigned gz,
                                     unsigned bx, unsigned by, unsigned bz, unsigned smem,
                                     mf_cu_stream_t s, void **params, void **extra);
} mf_cudrv_t;

/*
 * The driver table, loaded and cuInit'ed on the first call. MF_UNAVAILABLE with *why
 * (static text: the library is missing, a symbol is missing, cuInit failed, no device)
 * when CUDA cannot be used; *out is then NULL. The answer never changes in a process.
 * why may be NULL.
 */
mf_status_t mf_cudrv_get(const mf_cudrv_t **out, const char **why);

/* "CUDA_ERROR_OUT_OF_MEMORY: out of memory"-like text for a CUresult (the driver's own
 * words when it is loaded); never NULL. Thread-local buffer: valid until the next call. */
const char *mf_cudrv_strerror(int cu_result);

#ifdef __cplusplus
}
#endif
#endif /* MF_CUDRV_H */
