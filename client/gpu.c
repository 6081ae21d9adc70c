/* gpu — the client's CUDA device and the daemon's GPU arenas (see gpu.h). */
#include "gpu.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Makes g's context current on this thread; *old receives what was current. */
static mf_cu_result_t ctx_push(const mf__gpu_t *g, mf_cu_context_t *old)
{
    *old = NULL;
    if (g->cu->cuCtxGetCurrent(old) != MF_CUDA_SUCCESS)
        *old = NULL;
    return *old == g->ctx ? MF_CUDA_SUCCESS : g->cu->cuCtxSetCurrent(g->ctx);
}

static void ctx_pop(const mf__gpu_t *g, mf_cu_context_t old)
{
    if (old != g->ctx)
        g->cu->cuCtxSetCurrent(old);
}

int mf__gpu_usable(const mf__gpu_t *g)
{
    return g && g->cu;
}

mf__gpu_t *mf__gpu_open(int ordinal)
{
    mf__gpu_t *g = calloc(1, sizeof(*g));
    if (!g)
        return NULL;
    g->ordinal = ordinal;
    const mf_cudrv_t *cu = NULL;
    const char *why = NULL;
    if (mf_cudrv_get(&cu, &why) != MF_OK) {
        snprintf(g->why, sizeof(g->why), "%s", why ? why : "no CUDA driver");
        return g;
    }
    int n = 0;
    if (cu->cuDeviceGetCount(&n) != MF_CUDA_SUCCESS)
        n = 0;
    if (ordinal >= n) {
        snprintf(g->why, sizeof(g->why), "gpu_device %d: this process sees %d CUDA device%s",
                 ordinal, n, n == 1 ? "" : "s");
        return g;
    }
    mf_cu_result_t r = cu->cuDeviceGet(&g->dev, ordinal);
    if (r == MF_CUDA_SUCCESS)
        r = cu->cuDevicePrimaryCtxRetain(&g->ctx, g->dev);
    if (r != MF_CUDA_SUCCESS) {
        snprintf(g->why, sizeof(g->why), "gpu_device %d: %s", ordinal, mf_cudrv_strerror(r));
        return g;
    }
    g->n_dev = n < MF__GPU_MAX_DEVICES ? n : MF__GPU_MAX_DEVICES;
    for (int i = 0; i < g->n_dev; i++) {
        mf_cu_device_t d;
        mf_cu_uuid_t u;
        if (cu->cuDeviceGet(&d, i) != MF_CUDA_SUCCESS)
            continue;
        if (cu->cuDeviceGetPCIBusId(g->pci[i], (int)sizeof(g->pci[i]), d) != MF_CUDA_SUCCESS)
            g->pci[i][0] = '\0';
        g->pci[i][sizeof(g->pci[i]) - 1] = '\0';
        if (cu->cuDeviceGetUuid(&u, d) == MF_CUDA_SUCCESS) {
            memcpy(g->uuid[i], u.bytes, 16);
            g->has_uuid[i] = 1;
        }
    }
    g->cu = cu;
    return g;
}

void mf__gpu_close(mf__gpu_t *g)
{
    if (!g)
        return;
    if (g->cu)
        g->cu->cuDevicePrimaryCtxRelease(g->dev);
    free(g);
}

/* ---- arenas ------------------------------------------------------------------------ */

static void arena_bad(mf__gpu_arena_t *a, const char *fmt, const char *what)
{
    a->valid = 0;
    snprintf(a->why, sizeof(a->why), fmt, what);
}

mf_status_t mf__gpu_set_parse(mf__gpu_set_t *s, const Mapflow__V1__HelloReply *hr)
{
    s->n = 0;
    s->a = NULL;
    size_t n = hr->n_gpu_arenas < MF__GPU_MAX_ARENAS ? hr->n_gpu_arenas : MF__GPU_MAX_ARENAS;
    if (n == 0)
        return MF_OK;
    s->a = calloc(n, sizeof(*s->a));
    if (!s->a)
        return MF_RESOURCE_EXHAUSTED;
    s->n = n;
    for (size_t i = 0; i < n; i++) {
        const Mapflow__V1__GpuArena *w = hr->gpu_arenas[i];
        mf__gpu_arena_t *a = &s->a[i];
        a->device = -1;
        a->valid = 1;
        a->index = w->index;
        a->bytes = w->bytes;
        const char *pci = w->pci_bus_id ? w->pci_bus_id : "";
        if (strlen(pci) >= sizeof(a->pci))
            arena_bad(a, "announced with a PCI bus id longer than %s bytes", "31");
        else
            snprintf(a->pci, sizeof(a->pci), "%s", pci);
        if (w->ipc_handle.len != MF_CU_IPC_HANDLE_SIZE)
            arena_bad(a, "announced with an IPC handle that is not %s bytes", "64");
        else
            memcpy(a->handle, w->ipc_handle.data, MF_CU_IPC_HANDLE_SIZE);
        if (w->uuid.len == 16) {
            memcpy(a->uuid, w->uuid.data, 16);
            a->has_uuid = 1;
        } else if (w->uuid.len != 0) {
            arena_bad(a, "announced with a UUID that is not %s bytes", "16");
        }
        if (a->bytes == 0 || a->bytes > MF__GPU_MAX_ARENA_BYTES)
            arena_bad(a, "announced with a size of 0 or more than %s", "16 TiB");
        for (size_t j = 0; j < i; j++)
            if (s->a[j].index == a->index)
                arena_bad(a, "%s", "announced twice with the same index");
        if (!a->has_uuid && !a->pci[0] && a->valid)
            arena_bad(a, "%s", "announced with neither UUID nor PCI bus id");
    }
    return MF_OK;
}

/* This process's ordinal of the arena's GPU: UUID first, then the PCI bus id. */
static int arena_device(const mf__gpu_t *g, const mf__gpu_arena_t *a)
{
    for (int i = 0; i < g->n_dev; i++)
        if (a->has_uuid && g->has_uuid[i] && !memcmp(a->uuid, g->uuid[i], 16))
            return i;
    for (int i = 0; i < g->n_dev; i++)
        if (a->pci[0] && !strcasecmp(a->pci, g->pci[i]))
            return i;
    return -1;
}

/* Takes a retired mapping of the same handle (and size) out of the pool: 0 if none. */
static mf_cu_deviceptr_t pool_take(mf__gpu_set_t *const *pool, size_t n_pool,
                                   const mf__gpu_arena_t *a)
{
    for (size_t p = 0; p < n_pool; p++)
        for (size_t i = 0; pool[p] && i < pool[p]->n; i++) {
            mf__gpu_arena_t *o = &pool[p]->a[i];
            if (o->base && o->bytes == a->bytes &&
                !memcmp(o->handle, a->handle, MF_CU_IPC_HANDLE_SIZE)) {
                mf_cu_deviceptr_t b = o->base;
                o->base = 0;
                return b;
            }
        }
    return 0;
}

static void arena_open(const mf__gpu_t *g, mf__gpu_arena_t *a, mf__gpu_set_t *const *pool,
                       size_t n_pool)
{
    a->device = arena_device(g, a);
    a->peer = a->device != g->ordinal;
    if ((a->base = pool_take(pool, n_pool, a)) != 0) {
        a->why[0] = '\0';
        return;
    }
    if (a->device >= 0 && a->peer) {
        mf_cu_device_t peer;
        int can = 0;
        if (g->cu->cuDeviceGet(&peer, a->device) != MF_CUDA_SUCCESS ||
            g->cu->cuDeviceCanAccessPeer(&can, g->dev, peer) != MF_CUDA_SUCCESS || !can) {
            snprintf(a->why, sizeof(a->why), "device %d cannot access device %d (%s) as a "
                     "peer", g->ordinal, a->device, a->pci);
            return;
        }
    }
    mf_cu_context_t old;
    mf_cu_result_t r = ctx_push(g, &old);
    mf_cu_ipc_mem_handle_t h;
    memcpy(h.reserved, a->handle, sizeof(h.reserved));
    mf_cu_deviceptr_t base = 0;
    if (r == MF_CUDA_SUCCESS)
        r = g->cu->cuIpcOpenMemHandle(&base, h, MF_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    ctx_pop(g, old);
    if (r != MF_CUDA_SUCCESS || !base) {
        snprintf(a->why, sizeof(a->why), "cuIpcOpenMemHandle%s: %s",
                 a->device < 0 ? " (its GPU is not visible here)" : "", mf_cudrv_strerror(r));
        return;
    }
    a->base = base;
    a->why[0] = '\0';
}

void mf__gpu_set_map(mf__gpu_t *g, mf__gpu_set_t *s, mf__gpu_set_t *const *pool, size_t n_pool)
{
    for (size_t i = 0; i < s->n; i++) {
        mf__gpu_arena_t *a = &s->a[i];
        if (!a->valid)
            continue;
        if (!mf__gpu_usable(g)) {
            snprintf(a->why, sizeof(a->why), "%s", g ? g->why : "no gpu_device");
            continue;
        }
        arena_open(g, a, pool, n_pool);
    }
}

void mf__gpu_set_free(mf__gpu_t *g, mf__gpu_set_t *s)
{
    if (mf__gpu_usable(g)) {
        mf_cu_context_t old;
        int pushed = 0;
        for (size_t i = 0; i < s->n; i++) {
            if (!s->a[i].base)
                continue;
            if (!pushed++)
                ctx_push(g, &old);
            g->cu->cuIpcCloseMemHandle(s->a[i].base);
        }
        if (pushed)
            ctx_pop(g, old);
    }
    free(s->a);
    s->a = NULL;
    s->n = 0;
}

const mf__gpu_arena_t *mf__gpu_find(const mf__gpu_set_t *s, uint32_t index)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->a[i].index == index)
            return s->a[i].base ? &s->a[i] : NULL;
    return NULL;
}

uint64_t mf__gpu_mask(const mf__gpu_set_t *s)
{
    uint64_t m = 0;
    for (size_t i = 0; i < s->n; i++)
        if (s->a[i].base && s->a[i].index < 64)
            m |= 1ull << s->a[i].index;
    return m;
}

uint32_t mf__gpu_preferred(const mf__gpu_t *g, const mf__gpu_set_t *s)
{
    uint32_t any = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (!s->a[i].base)
            continue;
        if (g && s->a[i].device == g->ordinal)
            return s->a[i].index + 1;
        if (!any)
            any = s->a[i].index + 1;
    }
    return any;
}

/* ---- copies ------------------------------------------------------------------------ */

mf_status_t mf__gpu_copy(const mf__gpu_t *g, int kind, uintptr_t dst, uintptr_t src, size_t n,
                         char *err, size_t errlen)
{
    if (!mf__gpu_usable(g)) {
        snprintf(err, errlen, "no usable CUDA device: %s", g ? g->why : "no gpu_device");
        return MF_FAILED_PRECONDITION;
    }
    if (n == 0)
        return MF_OK;
    mf_cu_context_t old;
    mf_cu_result_t r = ctx_push(g, &old);
    if (r == MF_CUDA_SUCCESS) {
        if (kind == MF__HTOD)
            r = g->cu->cuMemcpyHtoD((mf_cu_deviceptr_t)dst, (const void *)src, n);
        else if (kind == MF__DTOH)
            r = g->cu->cuMemcpyDtoH((void *)dst, (mf_cu_deviceptr_t)src, n);
        else
            r = g->cu->cuMemcpyDtoD((mf_cu_deviceptr_t)dst, (mf_cu_deviceptr_t)src, n);
    }
    ctx_pop(g, old);
    if (r != MF_CUDA_SUCCESS) {
        static const char *const names[] = {"cuMemcpyHtoD", "cuMemcpyDtoH", "cuMemcpyDtoD"};
        snprintf(err, errlen, "%s of %zu bytes: %s", names[kind], n, mf_cudrv_strerror(r));
        /* A bad device address is the caller's; anything else is the device's state. */
        return r == MF_CUDA_ERROR_INVALID_VALUE ? MF_INVALID_ARGUMENT : MF_INTERNAL;
    }
    return MF_OK;
}

mf_status_t mf__gpu_write_row(const mf__gpu_t *g, mf_cu_deviceptr_t dst, const void *src,
                              int src_on_device, size_t n, const uint8_t *head,
                              size_t head_len, char *err, size_t errlen)
{
    mf_status_t st = mf__gpu_copy(g, src_on_device ? MF__DTOD : MF__HTOD, (uintptr_t)dst,
                                  (uintptr_t)src, n, err, errlen);
    if (st != MF_OK)
        return st;
    uint8_t back[MF_ROW_HEADER];
    size_t k = head_len < sizeof(back) ? head_len : sizeof(back);
    if (k > n)
        k = n;
    st = mf__gpu_copy(g, MF__DTOH, (uintptr_t)back, (uintptr_t)dst, k, err, errlen);
    if (st == MF_OK && memcmp(back, head, k)) {
        snprintf(err, errlen, "the row's header read back from the GPU arena differs from "
                 "what was written");
        st = MF_INTERNAL;
    }
    return st;
}

/* ---- host arena pinning ------------------------------------------------------------ */

struct mf__gpu_pin {
    const mf__gpu_t *g;
    void *p;
    size_t n;
    pthread_t th;
    int started;
    atomic_int state;
};

static void *pin_main(void *arg)
{
    mf__gpu_pin_t *pin = arg;
    /* A fresh thread has no context: make the channel's device current for the call. */
    mf_cu_result_t r = pin->g->cu->cuCtxSetCurrent(pin->g->ctx);
    if (r == MF_CUDA_SUCCESS)
        r = pin->g->cu->cuMemHostRegister(pin->p, pin->n, MF_CU_MEMHOSTREGISTER_PORTABLE);
    atomic_store(&pin->state, r == MF_CUDA_SUCCESS ? 1 : -1);
    pin->g->cu->cuCtxSetCurrent(NULL);
    return NULL;
}

mf__gpu_pin_t *mf__gpu_pin_start(const mf__gpu_t *g, void *p, size_t n)
{
    if (!mf__gpu_usable(g) || !p || !n)
        return NULL;
    mf__gpu_pin_t *pin = calloc(1, sizeof(*pin));
    if (!pin)
        return NULL;
    pin->g = g;
    pin->p = p;
    pin->n = n;
    if (pthread_create(&pin->th, NULL, pin_main, pin) == 0)
        pin->started = 1;
    else
        pin_main(pin);
    return pin;
}

void mf__gpu_pin_end(mf__gpu_pin_t *pin)
{
    if (!pin)
        return;
    if (pin->started)
        pthread_join(pin->th, NULL);
    if (atomic_load(&pin->state) == 1) {
        mf_cu_context_t old;
        if (ctx_push(pin->g, &old) == MF_CUDA_SUCCESS)
            pin->g->cu->cuMemHostUnregister(pin->p);
        ctx_pop(pin->g, old);
    }
    free(pin);
}

int mf__gpu_pin_state(const mf__gpu_pin_t *pin)
{
    return pin ? atomic_load(&((mf__gpu_pin_t *)pin)->state) : 0;
}

void mf__gpu_info(const mf__gpu_t *g, int ordinal, const mf__gpu_set_t *s, mf_gpu_info_t *out)
{
    memset(out, 0, sizeof(*out));
    out->gpu_device = ordinal;
    out->driver = mf__gpu_usable(g);
    if (ordinal < 0)
        snprintf(out->why, sizeof(out->why), "no gpu_device given");
    else if (!out->driver)
        snprintf(out->why, sizeof(out->why), "%s", g ? g->why : "out of memory");
    out->n_announced = (uint32_t)s->n;
    for (size_t i = 0; i < s->n; i++) {
        const mf__gpu_arena_t *a = &s->a[i];
        if (a->base) {
            out->n_mapped++;
            out->n_peer += a->peer != 0;
        }
        if (i >= MF_GPU_MAX_ARENAS)
            continue;
        mf_gpu_arena_info_t *o = &out->arenas[i];
        o->index = a->index;
        o->bytes = a->bytes;
        o->mapped = a->base != 0;
        o->device = a->device;
        o->peer = a->base ? a->peer : 0;
        snprintf(o->pci_bus_id, sizeof(o->pci_bus_id), "%s", a->pci);
        snprintf(o->why, sizeof(o->why), "%s", a->base ? "" : a->why);
    }
}
