/*
 * fakecuda — a CPU stand-in for the CUDA driver API, exporting the symbols proto/mf_cudrv.c
 * looks up, so CI (no GPU) runs the daemon's and the client's GPU code paths for real:
 * tests set MF_CUDA_DRIVER=<this .so>.
 *
 * "Device memory" is memfd-backed shared memory mapped in the process, so a CUdeviceptr is
 * a host address (tests can memcmp it). cuIpcGetMemHandle encodes (magic, pid, fd, offset,
 * size, device) in the 64 bytes; cuIpcOpenMemHandle opens /proc/<pid>/fd/<fd> and maps it,
 * so a second process sees the same bytes. Copies are memcpy, after checking that every
 * device range lies inside one allocation or opened IPC mapping (CUDA_ERROR_INVALID_VALUE
 * otherwise), so a bad offset fails as it would on a GPU instead of scribbling.
 *
 * Behaviour copied from the real driver: calls before cuInit are NOT_INITIALIZED; memory
 * calls need a current context; opening an IPC handle in the process that exported it is
 * CUDA_ERROR_INVALID_CONTEXT; cuDeviceCanAccessPeer(d, d) is 0. Copies *into* device
 * memory (cuMemcpyHtoD from pageable memory, cuMemcpyDtoD) return before the bytes land,
 * as on a GPU: they are queued on the context's legacy stream and land at the next copy,
 * cuCtxSynchronize / cuStreamSynchronize, cuMemFree or cuIpcCloseMemHandle in this process
 * (or FAKECUDA_LAND_MS, default 500, after they were issued, at any later call), so a
 * process that hands device bytes to another (PutCommit after a copy into the daemon's
 * arena) without synchronizing first is caught on CPU. Modules: cuModuleLoadData answers
 * CUDA_ERROR_NOT_SUPPORTED (no PTX JIT here) unless FAKECUDA_MODULES=1 (see cuModuleLoadData:
 * mapflowd's checksum kernels run on the CPU); streams are the legacy stream's queue.
 *
 * Environment: FAKECUDA_DEVICES=n (default 1; 0 = cuInit fails with NO_DEVICE),
 * FAKECUDA_NO_PEER=1 (cuDeviceCanAccessPeer answers 0 and an IPC open of another device's
 * memory fails with CUDA_ERROR_PEER_ACCESS_UNSUPPORTED), FAKECUDA_MEM_BYTES (per device
 * total, default 1 GiB; cuMemAlloc beyond it is OUT_OF_MEMORY).
 * Host registration (cuMemHostRegister): the range must be mapped; registrations are kept
 * (fakecuda_host_registered answers for in-process tests) and, when FAKECUDA_HOSTREG_LOG
 * names a file, appended to it as "register <pid> <bytes> <flags>" / "unregister <pid>
 * <bytes>" lines so a test can check what a child (mapflowd) registered;
 * FAKECUDA_HOSTREG_FAIL=1 makes every registration fail with NOT_SUPPORTED.
 *
 * Thread safety: any thread; the allocation table has a mutex, the current context is
 * thread-local as in CUDA.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define XXH_INLINE_ALL
#include <xxhash.h>
#include <unistd.h>
#include "mf_clock.h"

#define EXPORT __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct {
    char reserved[64];
} CUipcMemHandle;
typedef struct {
    char bytes[16];
} CUuuid;

enum {
    OK = 0,
    E_INVALID_VALUE = 1,
    E_OUT_OF_MEMORY = 2,
    E_NOT_INITIALIZED = 3,
    E_NO_DEVICE = 100,
    E_INVALID_DEVICE = 101,
    E_INVALID_CONTEXT = 201,
    E_MAP_FAILED = 205,
    E_PEER_ACCESS_UNSUPPORTED = 217,
    E_INVALID_HANDLE = 400,
    E_HOST_MEMORY_ALREADY_REGISTERED = 712,
    E_HOST_MEMORY_NOT_REGISTERED = 713,
    E_NOT_FOUND = 500,
    E_NOT_SUPPORTED = 801,
};

#define MAX_DEV 16
#define HANDLE_MAGIC 0x4144554345414b46ull /* "FAKECUDA" */

/* A copy into device memory issued but not landed yet (the bytes are snapshotted). */
typedef struct pend {
    uint8_t *dst;
    uint8_t *bytes;
    size_t n;
    double due;
    struct pend *next;
} pend_t;

typedef struct fake_ctx {
    int dev;
    int refs;
    pend_t *head, **tail; /* the legacy stream's queue of copies not landed */
} fake_ctx_t;

/* One mapping of device memory in this process: an allocation or an opened IPC handle. */
typedef struct region {
    uint8_t *base;
    size_t size;
    int fd;          /* allocations: the memfd (kept open: IPC handles name it) */
    int dev;
    int ipc;         /* opened through cuIpcOpenMemHandle */
    struct region *next;
} region_t;

typedef struct ipc_payload {
    uint64_t magic;
    int32_t pid, fd;
    uint64_t offset, size;
    int32_t dev;
} ipc_payload_t;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_init, g_ndev, g_no_peer;
static size_t g_mem_bytes;
static size_t g_used[MAX_DEV];
static fake_ctx_t g_ctx[MAX_DEV];
static region_t *g_regions;
static __thread fake_ctx_t *t_cur;
static double g_land_s = 0.5;
static int g_pending; /* copies queued in any context */

/* Lands ctx's queued copies (all, or only those due) in issue order. Caller holds g_mu. */
static void land_locked(fake_ctx_t *c, int all)
{
    double t = all ? 0 : mf_now_s();
    while (c->head && (all || c->head->due <= t)) {
        pend_t *p = c->head;
        c->head = p->next;
        memcpy(p->dst, p->bytes, p->n);
        free(p->bytes);
        free(p);
        g_pending--;
    }
    if (!c->head)
        c->tail = &c->head;
}

/* The current context's stream: every queued copy lands (stream order / synchronize). */
static void land_current(void)
{
    pthread_mutex_lock(&g_mu);
    if (t_cur)
        land_locked(t_cur, 1);
    pthread_mutex_unlock(&g_mu);
}

/* Every context's copies land (before memory is unmapped). */
static void land_all(void)
{
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < MAX_DEV; i++)
        if (g_ctx[i].tail)
            land_locked(&g_ctx[i], 1);
    pthread_mutex_unlock(&g_mu);
}

/* Copies older than FAKECUDA_LAND_MS land (a GPU's DMA finishes on its own). */
static void land_due(void)
{
    if (!__atomic_load_n(&g_pending, __ATOMIC_RELAXED))
        return;
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < MAX_DEV; i++)
        if (g_ctx[i].tail)
            land_locked(&g_ctx[i], 0);
    pthread_mutex_unlock(&g_mu);
}

/* Queues a copy of n bytes (snapshotted now) to dst on the current context's stream. */
static int enqueue(void *dst, const void *src, size_t n)
{
    pend_t *p = malloc(sizeof(*p));
    uint8_t *b = p ? malloc(n) : NULL;
    if (!b) {
        free(p);
        return -1;
    }
    memcpy(b, src, n);
    *p = (pend_t){dst, b, n, mf_now_s() + g_land_s, NULL};
    pthread_mutex_lock(&g_mu);
    *t_cur->tail = p;
    t_cur->tail = &p->next;
    g_pending++;
    pthread_mutex_unlock(&g_mu);
    return 0;
}

static int env_int(const char *name, int def)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : def;
}

EXPORT CUresult cuInit(unsigned flags)
{
    if (flags)
        return E_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    g_ndev = env_int("FAKECUDA_DEVICES", 1);
    if (g_ndev > MAX_DEV)
        g_ndev = MAX_DEV;
    g_no_peer = env_int("FAKECUDA_NO_PEER", 0);
    const char *m = getenv("FAKECUDA_MEM_BYTES");
    g_mem_bytes = m && *m ? (size_t)strtoull(m, NULL, 0) : (size_t)1 << 30;
    const char *land = getenv("FAKECUDA_LAND_MS");
    g_land_s = (land && *land ? atof(land) : 500.0) / 1000.0;
    for (int i = 0; i < MAX_DEV; i++) {
        g_ctx[i].dev = i;
        if (!g_ctx[i].tail) {
            g_ctx[i].head = NULL;
            g_ctx[i].tail = &g_ctx[i].head;
        }
    }
    g_init = g_ndev > 0;
    pthread_mutex_unlock(&g_mu);
    return g_ndev > 0 ? OK : E_NO_DEVICE;
}

#define NEED_INIT()                                                                      \
    do {                                                                                 \
        if (!g_init)                                                                     \
            return E_NOT_INITIALIZED;                                                    \
        land_due();                                                                      \
    } while (0)
#define NEED_CTX()                                                                       \
    do {                                                                                 \
        NEED_INIT();                                                                     \
        if (!t_cur)                                                                      \
            return E_INVALID_CONTEXT;                                                    \
    } while (0)

EXPORT CUresult cuDeviceGetCount(int *count)
{
    NEED_INIT();
    if (!count)
        return E_INVALID_VALUE;
    *count = g_ndev;
    return OK;
}

EXPORT CUresult cuDeviceGet(CUdevice *dev, int ordinal)
{
    NEED_INIT();
    if (!dev)
        return E_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= g_ndev)
        return E_INVALID_DEVICE;
    *dev = ordinal;
    return OK;
}

static int dev_ok(CUdevice d)
{
    return d >= 0 && d < g_ndev;
}

EXPORT CUresult cuDeviceGetPCIBusId(char *bus, int len, CUdevice dev)
{
    NEED_INIT();
    if (!dev_ok(dev))
        return E_INVALID_DEVICE;
    if (!bus || len < 13)
        return E_INVALID_VALUE;
    snprintf(bus, (size_t)len, "0000:%02x:00.0", 0x18 + dev * 0x10);
    return OK;
}

EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice dev)
{
    NEED_INIT();
    if (!dev_ok(dev))
        return E_INVALID_DEVICE;
    if (!u)
        return E_INVALID_VALUE;
    for (int i = 0; i < 16; i++)
        u->bytes[i] = (char)(0xf0 ^ (i * 7) ^ dev);
    return OK;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(fake_ctx_t **ctx, CUdevice dev)
{
    NEED_INIT();
    if (!dev_ok(dev))
        return E_INVALID_DEVICE;
    if (!ctx)
        return E_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    g_ctx[dev].refs++;
    pthread_mutex_unlock(&g_mu);
    *ctx = &g_ctx[dev];
    return OK;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    NEED_INIT();
    if (!dev_ok(dev))
        return E_INVALID_DEVICE;
    pthread_mutex_lock(&g_mu);
    if (g_ctx[dev].refs > 0)
        g_ctx[dev].refs--;
    pthread_mutex_unlock(&g_mu);
    return OK;
}

EXPORT CUresult cuCtxSetCurrent(fake_ctx_t *ctx)
{
    NEED_INIT();
    if (ctx && (ctx < g_ctx || ctx >= g_ctx + g_ndev))
        return E_INVALID_CONTEXT;
    t_cur = ctx;
    return OK;
}

EXPORT CUresult cuCtxGetCurrent(fake_ctx_t **ctx)
{
    NEED_INIT();
    if (!ctx)
        return E_INVALID_VALUE;
    *ctx = t_cur;
    return OK;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *dev)
{
    NEED_CTX();
    if (!dev)
        return E_INVALID_VALUE;
    *dev = t_cur->dev;
    return OK;
}

/* The region holding [p, p + n), or NULL (caller holds g_mu). */
static region_t *find_region(CUdeviceptr p, size_t n)
{
    uintptr_t a = (uintptr_t)p;
    for (region_t *r = g_regions; r; r = r->next) {
        uintptr_t b = (uintptr_t)r->base;
        if (a >= b && a - b <= r->size && n <= r->size - (a - b))
            return r;
    }
    return NULL;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes)
{
    NEED_CTX();
    if (!dptr || bytes == 0)
        return E_INVALID_VALUE;
    int dev = t_cur->dev;
    pthread_mutex_lock(&g_mu);
    CUresult r = E_OUT_OF_MEMORY;
    region_t *reg = NULL;
    if (bytes > g_mem_bytes - g_used[dev])
        goto out;
    reg = calloc(1, sizeof(*reg));
    if (!reg)
        goto out;
    char name[32];
    snprintf(name, sizeof(name), "fakecuda-dev%d", dev);
    reg->fd = memfd_create(name, MFD_CLOEXEC);
    if (reg->fd < 0 || ftruncate(reg->fd, (off_t)bytes) != 0)
        goto fail;
    reg->base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, reg->fd, 0);
    if (reg->base == MAP_FAILED)
        goto fail;
    reg->size = bytes;
    reg->dev = dev;
    reg->next = g_regions;
    g_regions = reg;
    g_used[dev] += bytes;
    *dptr = (CUdeviceptr)(uintptr_t)reg->base;
    r = OK;
    goto out;
fail:
    if (reg->fd >= 0)
        close(reg->fd);
    free(reg);
out:
    pthread_mutex_unlock(&g_mu);
    return r;
}

/* Unlinks and unmaps the region based exactly at p of the given kind. */
static CUresult drop_region(CUdeviceptr p, int ipc)
{
    pthread_mutex_lock(&g_mu);
    region_t **pp = &g_regions;
    while (*pp && ((*pp)->base != (uint8_t *)(uintptr_t)p || (*pp)->ipc != ipc))
        pp = &(*pp)->next;
    region_t *r = *pp;
    if (r) {
        *pp = r->next;
        if (!ipc)
            g_used[r->dev] -= r->size;
    }
    pthread_mutex_unlock(&g_mu);
    if (!r)
        return E_INVALID_VALUE;
    munmap(r->base, r->size);
    if (r->fd >= 0)
        close(r->fd);
    free(r);
    return OK;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    NEED_CTX();
    land_all(); /* cuMemFree synchronizes the device */
    return drop_region(dptr, 0);
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
    NEED_CTX();
    if (!free_bytes || !total)
        return E_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    *total = g_mem_bytes;
    *free_bytes = g_mem_bytes - g_used[t_cur->dev];
    pthread_mutex_unlock(&g_mu);
    return OK;
}

EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr dptr)
{
    NEED_CTX();
    if (!h)
        return E_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    region_t *r = find_region(dptr, 1);
    ipc_payload_t p = {0};
    if (r && !r->ipc)
        p = (ipc_payload_t){HANDLE_MAGIC, (int32_t)getpid(), r->fd,
                            (uint64_t)((uint8_t *)(uintptr_t)dptr - r->base),
                            (uint64_t)r->size, r->dev};
    pthread_mutex_unlock(&g_mu);
    if (!p.magic)
        return E_INVALID_VALUE;
    memset(h, 0, sizeof(*h));
    memcpy(h->reserved, &p, sizeof(p));
    return OK;
}

EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *dptr, CUipcMemHandle h, unsigned flags)
{
    NEED_CTX();
    ipc_payload_t p;
    memcpy(&p, h.reserved, sizeof(p));
    if (!dptr || p.magic != HANDLE_MAGIC || p.offset >= p.size || flags > 1)
        return E_INVALID_VALUE;
    if (p.pid == (int32_t)getpid())
        return E_INVALID_CONTEXT; /* as CUDA: not in the exporting process */
    if (p.dev != t_cur->dev && g_no_peer)
        return E_PEER_ACCESS_UNSUPPORTED;
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)p.pid, (int)p.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return E_INVALID_HANDLE;
    region_t *r = calloc(1, sizeof(*r));
    void *base = r ? mmap(NULL, p.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    close(fd);
    if (base == MAP_FAILED) {
        free(r);
        return E_MAP_FAILED;
    }
    r->base = base;
    r->size = p.size;
    r->fd = -1;
    r->dev = p.dev;
    r->ipc = 1;
    pthread_mutex_lock(&g_mu);
    r->next = g_regions;
    g_regions = r;
    pthread_mutex_unlock(&g_mu);
    *dptr = (CUdeviceptr)(uintptr_t)(r->base + p.offset);
    return OK;
}

EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    NEED_CTX();
    /* The handle maps the whole allocation; dptr is base + the exported offset. */
    pthread_mutex_lock(&g_mu);
    region_t *r = find_region(dptr, 1);
    CUdeviceptr base = r && r->ipc ? (CUdeviceptr)(uintptr_t)r->base : 0;
    pthread_mutex_unlock(&g_mu);
    land_all();
    return base ? drop_region(base, 1) : E_INVALID_VALUE;
}

static int range_ok(CUdeviceptr p, size_t n)
{
    pthread_mutex_lock(&g_mu);
    int ok = find_region(p, n) != NULL;
    pthread_mutex_unlock(&g_mu);
    return ok;
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
    NEED_CTX();
    if (!n)
        return OK;
    if (!src || !range_ok(dst, n))
        return E_INVALID_VALUE;
    land_current(); /* the stream's earlier work first */
    return enqueue((void *)(uintptr_t)dst, src, n) ? E_OUT_OF_MEMORY : OK;
}

EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
    NEED_CTX();
    if (!n)
        return OK;
    if (!dst || !range_ok(src, n))
        return E_INVALID_VALUE;
    land_current(); /* synchronous: after the stream's earlier work */
    memcpy(dst, (const void *)(uintptr_t)src, n);
    return OK;
}

EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    NEED_CTX();
    if (!n)
        return OK;
    if (!range_ok(dst, n) || !range_ok(src, n))
        return E_INVALID_VALUE;
    land_current();
    return enqueue((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n) ? E_OUT_OF_MEMORY
                                                                             : OK;
}

EXPORT CUresult cuMemcpyPeer(CUdeviceptr dst, fake_ctx_t *dctx, CUdeviceptr src,
                             fake_ctx_t *sctx, size_t n)
{
    NEED_INIT();
    if (!dctx || !sctx)
        return E_INVALID_CONTEXT;
    if (!n)
        return OK;
    if (!range_ok(dst, n) || !range_ok(src, n))
        return E_INVALID_VALUE;
    land_all(); /* synchronous with both contexts */
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return OK;
}

EXPORT CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer)
{
    NEED_INIT();
    if (!can)
        return E_INVALID_VALUE;
    if (!dev_ok(dev) || !dev_ok(peer))
        return E_INVALID_DEVICE;
    *can = dev != peer && !g_no_peer;
    return OK;
}

EXPORT CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr)
{
    NEED_INIT();
    if (!data)
        return E_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    region_t *r = find_region(ptr, 1);
    int dev = r ? r->dev : -1;
    pthread_mutex_unlock(&g_mu);
    if (dev < 0)
        return E_INVALID_VALUE;
    switch (attribute) {
    case 1: /* CONTEXT */
        *(fake_ctx_t **)data = &g_ctx[dev];
        return OK;
    case 2: /* MEMORY_TYPE: device */
        *(unsigned *)data = 2;
        return OK;
    case 9: /* DEVICE_ORDINAL */
        *(int *)data = dev;
        return OK;
    default:
        return E_INVALID_VALUE;
    }
}

EXPORT CUresult cuGetErrorString(CUresult r, const char **str)
{
    if (!str)
        return E_INVALID_VALUE;
    switch (r) {
    case OK: *str = "no error"; break;
    case E_INVALID_VALUE: *str = "invalid argument"; break;
    case E_OUT_OF_MEMORY: *str = "out of memory"; break;
    case E_NOT_INITIALIZED: *str = "initialization error"; break;
    case E_NO_DEVICE: *str = "no CUDA-capable device is detected"; break;
    case E_INVALID_DEVICE: *str = "invalid device ordinal"; break;
    case E_INVALID_CONTEXT: *str = "invalid device context"; break;
    case E_MAP_FAILED: *str = "mapping of buffer object failed"; break;
    case E_PEER_ACCESS_UNSUPPORTED: *str = "peer access is not supported between these two devices"; break;
    case E_INVALID_HANDLE: *str = "invalid resource handle"; break;
    case E_NOT_FOUND: *str = "named symbol not found"; break;
    case E_NOT_SUPPORTED: *str = "operation not supported"; break;
    case E_HOST_MEMORY_ALREADY_REGISTERED: *str = "part or all of the requested memory range is already mapped"; break;
    case E_HOST_MEMORY_NOT_REGISTERED: *str = "pointer does not correspond to a registered memory region"; break;
    default: *str = NULL; return E_INVALID_VALUE;
    }
    return OK;
}

/* ---- synchronization, streams, pinned memory, modules ----------------------------------- */

EXPORT CUresult cuCtxSynchronize(void)
{
    NEED_CTX();
    land_current();
    return OK;
}

/* Streams are the legacy stream: a stream handle is a tag; work on it runs in order with
 * the context's other copies. */
static char g_stream_tag;

EXPORT CUresult cuStreamCreate(void **s, unsigned flags)
{
    NEED_CTX();
    if (!s || flags > 1)
        return E_INVALID_VALUE;
    *s = &g_stream_tag;
    return OK;
}

EXPORT CUresult cuStreamDestroy_v2(void *s)
{
    NEED_INIT();
    return s == &g_stream_tag ? OK : E_INVALID_HANDLE;
}

EXPORT CUresult cuStreamSynchronize(void *s)
{
    NEED_CTX();
    if (s && s != &g_stream_tag)
        return E_INVALID_HANDLE;
    land_current();
    return OK;
}

EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, void *s)
{
    NEED_CTX();
    if (s && s != &g_stream_tag)
        return E_INVALID_HANDLE;
    return cuMemcpyDtoH_v2(dst, src, n);
}

EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, void *s)
{
    NEED_CTX();
    if (s && s != &g_stream_tag)
        return E_INVALID_HANDLE;
    if (!n)
        return OK;
    if (!range_ok(dst, n))
        return E_INVALID_VALUE;
    land_current();
    memset((void *)(uintptr_t)dst, v, n);
    return OK;
}

EXPORT CUresult cuMemAllocHost_v2(void **p, size_t bytes)
{
    NEED_CTX();
    if (!p || !bytes)
        return E_INVALID_VALUE;
    *p = aligned_alloc(4096, (bytes + 4095) & ~(size_t)4095);
    return *p ? OK : E_OUT_OF_MEMORY;
}

EXPORT CUresult cuMemFreeHost(void *p)
{
    NEED_INIT();
    free(p);
    return OK;
}

/* Host memory registrations (page-locked ranges) of this process. */
#define MAX_HOSTREG 64
static struct {
    uint8_t *p;
    size_t n;
    unsigned flags;
} g_hostreg[MAX_HOSTREG];

static void hostreg_log(const char *what, size_t n, unsigned flags)
{
    const char *path = getenv("FAKECUDA_HOSTREG_LOG");
    if (!path || !*path)
        return;
    FILE *f = fopen(path, "a");
    if (!f)
        return;
    fprintf(f, "%s %d %zu %u\n", what, (int)getpid(), n, flags);
    fclose(f);
}

EXPORT CUresult cuMemHostRegister_v2(void *p, size_t bytes, unsigned flags)
{
    NEED_CTX();
    if (!p || !bytes || (flags & ~0xfu))
        return E_INVALID_VALUE;
    if (env_int("FAKECUDA_HOSTREG_FAIL", 0))
        return E_NOT_SUPPORTED;
    /* The whole range must be mapped (msync fails with ENOMEM on a hole). */
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)4095;
    if (msync((void *)a, (uintptr_t)p + bytes - a, MS_ASYNC) != 0)
        return E_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    int slot = -1;
    for (int i = 0; i < MAX_HOSTREG; i++) {
        uint8_t *q = g_hostreg[i].p;
        if (q && q < (uint8_t *)p + bytes && (uint8_t *)p < q + g_hostreg[i].n) {
            pthread_mutex_unlock(&g_mu);
            return E_HOST_MEMORY_ALREADY_REGISTERED;
        }
        if (!q && slot < 0)
            slot = i;
    }
    if (slot >= 0)
        g_hostreg[slot].p = p, g_hostreg[slot].n = bytes, g_hostreg[slot].flags = flags;
    pthread_mutex_unlock(&g_mu);
    if (slot < 0)
        return E_OUT_OF_MEMORY;
    hostreg_log("register", bytes, flags);
    return OK;
}

EXPORT CUresult cuMemHostUnregister(void *p)
{
    NEED_INIT();
    size_t n = 0;
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < MAX_HOSTREG; i++)
        if (p && g_hostreg[i].p == p) {
            n = g_hostreg[i].n;
            g_hostreg[i].p = NULL;
            break;
        }
    pthread_mutex_unlock(&g_mu);
    if (!n)
        return E_HOST_MEMORY_NOT_REGISTERED;
    hostreg_log("unregister", n, 0);
    return OK;
}

/* Not a CUDA symbol: 1 with the registration's size and flags when [p, p + n) lies inside
 * one registered range of this process (tests). */
EXPORT int fakecuda_host_registered(const void *p, size_t n, size_t *size, unsigned *flags)
{
    int found = 0;
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < MAX_HOSTREG && !found; i++) {
        const uint8_t *q = g_hostreg[i].p;
        if (q && (const uint8_t *)p >= q && (const uint8_t *)p + n <= q + g_hostreg[i].n) {
            found = 1;
            if (size)
                *size = g_hostreg[i].n;
            if (flags)
                *flags = g_hostreg[i].flags;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return found;
}

/* Modules. By default there is no PTX JIT on a CPU: cuModuleLoadData answers NOT_SUPPORTED
 * and callers take their fallback path. FAKECUDA_MODULES=1 accepts the image of mapflowd's
 * row-checksum kernels (daemon/gpu_verify.cu: it must name both entry points) and runs
 * them on the CPU with the same parameters: mfd_verify_blocks(row, nblk, secret, delta)
 * leaves delta alone, mfd_verify_final(row, len, nblk, secret, delta, out) writes the
 * row's XXH3-64 (checksum field read as zero) to *out. So CPU tests cover the daemon's
 * GPU-validation path (launch shapes, parameters, result copy, prefix decode); the kernels'
 * own arithmetic is checked on a GPU. The batched region kernels likewise:
 * mfd_verify_rows_blocks(base, tab, nrows, total_blk, secret, delta) checks its shape,
 * mfd_verify_rows_final(base, tab, secret, delta, out) writes out[r] for each of its
 * blocks r (tab[3 r]: the row's offset from base, tab[3 r + 1]: its length). */
static char g_module_tag;
static char g_fn_blocks, g_fn_final, g_fn_rows_blocks, g_fn_rows_final;

/* XXH3-64 of a row with its checksum field (bytes 8..15) read as zero, as the kernels do. */
static uint64_t row_sum(const uint8_t *p, uint64_t len)
{
    static const uint8_t zero[8];
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, p, 8);
    XXH3_64bits_update(&st, zero, 8);
    XXH3_64bits_update(&st, p + 16, len - 16);
    return XXH3_64bits_digest(&st);
}

EXPORT CUresult cuModuleLoadData(void **m, const void *image)
{
    NEED_CTX();
    if (!m || !image)
        return E_INVALID_VALUE;
    if (!env_int("FAKECUDA_MODULES", 0))
        return E_NOT_SUPPORTED;
    if (!strstr(image, ".entry mfd_verify_blocks(") || !strstr(image, ".entry mfd_verify_final("))
        return 218; /* CUDA_ERROR_INVALID_PTX */
    *m = &g_module_tag;
    return OK;
}

EXPORT CUresult cuModuleUnload(void *m)
{
    NEED_INIT();
    return m == &g_module_tag ? OK : E_INVALID_HANDLE;
}

EXPORT CUresult cuModuleGetFunction(void **f, void *m, const char *name)
{
    NEED_INIT();
    if (!f || !name)
        return E_INVALID_VALUE;
    if (m != &g_module_tag)
        return E_INVALID_HANDLE;
    if (!strcmp(name, "mfd_verify_blocks"))
        *f = &g_fn_blocks;
    else if (!strcmp(name, "mfd_verify_final"))
        *f = &g_fn_final;
    else if (!strcmp(name, "mfd_verify_rows_blocks"))
        *f = &g_fn_rows_blocks;
    else if (!strcmp(name, "mfd_verify_rows_final"))
        *f = &g_fn_rows_final;
    else
        return E_NOT_FOUND;
    return OK;
}

EXPORT CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned smem, void *s, void **params,
                               void **extra)
{
    NEED_CTX();
    if (s && s != &g_stream_tag)
        return E_INVALID_HANDLE;
    if (!params || extra || gy != 1 || gz != 1 || by != 1 || bz != 1 || smem)
        return E_INVALID_VALUE;
    land_current(); /* stream order */
    CUdeviceptr row = *(CUdeviceptr *)params[0];
    if (f == &g_fn_rows_blocks) { /* (base, tab, nrows, total_blk, secret, delta) */
        CUdeviceptr tab = *(CUdeviceptr *)params[1];
        uint32_t nrows = *(uint32_t *)params[2];
        uint64_t total = *(uint64_t *)params[3];
        CUdeviceptr delta = *(CUdeviceptr *)params[5];
        if (bx != 256 || gx != (total + 7) / 8 || !total || !nrows ||
            !range_ok(tab, (size_t)nrows * 24) || !range_ok(delta, total * 64))
            return E_INVALID_VALUE;
        return OK;
    }
    if (f == &g_fn_rows_final) { /* (base, tab, secret, delta, out): one row per block */
        const uint64_t *tab = (const uint64_t *)(uintptr_t)*(CUdeviceptr *)params[1];
        CUdeviceptr out = *(CUdeviceptr *)params[4];
        if (bx != 32 || !gx || !range_ok((CUdeviceptr)(uintptr_t)tab, (size_t)gx * 24) ||
            !range_ok(out, (size_t)gx * 8))
            return E_INVALID_VALUE;
        for (unsigned r = 0; r < gx; r++) {
            if (tab[3 * r + 1] <= 240 || !range_ok(row + tab[3 * r], tab[3 * r + 1]))
                return E_INVALID_VALUE;
            const uint8_t *p = (const uint8_t *)(uintptr_t)(row + tab[3 * r]);
            uint64_t sum = row_sum(p, tab[3 * r + 1]);
            memcpy((uint8_t *)(uintptr_t)out + 8 * r, &sum, 8);
        }
        return OK;
    }
    if (f == &g_fn_blocks) {
        uint64_t nblk = *(uint64_t *)params[1];
        CUdeviceptr delta = *(CUdeviceptr *)params[3];
        if (bx != 256 || gx != (nblk + 7) / 8 || !nblk || !range_ok(row, nblk * 1024) ||
            !range_ok(delta, nblk * 64))
            return E_INVALID_VALUE;
        return OK;
    }
    if (f != &g_fn_final)
        return E_INVALID_HANDLE;
    uint64_t len = *(uint64_t *)params[1], nblk = *(uint64_t *)params[2];
    CUdeviceptr out = *(CUdeviceptr *)params[5];
    if (bx != 32 || gx != 1 || len <= 240 || nblk != (len - 1) / 1024 || !range_ok(row, len) ||
        !range_ok(out, 8))
        return E_INVALID_VALUE;
    uint64_t sum = row_sum((const uint8_t *)(uintptr_t)row, len);
    memcpy((void *)(uintptr_t)out, &sum, 8);
    return OK;
}
