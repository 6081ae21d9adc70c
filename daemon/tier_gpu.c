/* tier_gpu — cuMemAlloc arenas per device, IPC handles, synchronous copies (see tier_gpu.h). */
#include "tier_gpu.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Parses "all" or "0,2,3" into ordinals (each < count, no repeats). */
static mf_status_t parse_devices(const char *spec, int count, int *out, size_t *n, char *why,
                                 size_t whylen)
{
    *n = 0;
    if (!spec || !*spec || strcmp(spec, "all") == 0) {
        for (int i = 0; i < count && *n < MFD_GPU_MAX_ARENAS; i++)
            out[(*n)++] = i;
        return MF_OK;
    }
    const char *p = spec;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 1023 || (*end && *end != ',')) {
            snprintf(why, whylen, "gpu_devices '%s' is not \"all\" or a comma list of ordinals",
                     spec);
            return MF_INVALID_ARGUMENT;
        }
        if (v >= count) {
            snprintf(why, whylen, "gpu_devices names device %ld; %d CUDA device%s visible", v,
                     count, count == 1 ? "" : "s");
            return MF_UNAVAILABLE;
        }
        for (size_t i = 0; i < *n; i++)
            if (out[i] == (int)v) {
                snprintf(why, whylen, "gpu_devices names device %ld twice", v);
                return MF_INVALID_ARGUMENT;
            }
        if (*n == MFD_GPU_MAX_ARENAS) {
            snprintf(why, whylen, "gpu_devices names more than %d devices", MFD_GPU_MAX_ARENAS);
            return MF_INVALID_ARGUMENT;
        }
        out[(*n)++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (!*n) {
        snprintf(why, whylen, "gpu_devices is empty");
        return MF_INVALID_ARGUMENT;
    }
    return MF_OK;
}

static mf_status_t set_ctx(const mfd_gpu_t *g, const mfd_gpu_arena_t *a)
{
    mf_cu_result_t r = g->cu->cuCtxSetCurrent(a->ctx);
    if (r != MF_CUDA_SUCCESS) {
        mfd_error("gpu %d: cuCtxSetCurrent: %s", a->ordinal, mf_cudrv_strerror(r));
        return MF_INTERNAL;
    }
    return MF_OK;
}

/* Frees what arena a holds (any stage of opening). */
static void arena_close(const mfd_gpu_t *g, mfd_gpu_arena_t *a)
{
    if (a->base && set_ctx(g, a) == MF_OK)
        g->cu->cuMemFree(a->base);
    if (a->ctx)
        g->cu->cuDevicePrimaryCtxRelease(a->dev);
    mfd_oalloc_destroy(a->alloc);
    memset(a, 0, sizeof(*a));
}

static mf_status_t arena_open(mfd_gpu_t *g, mfd_gpu_arena_t *a, int ordinal, uint64_t bytes,
                              char *why, size_t whylen)
{
    const mf_cudrv_t *cu = g->cu;
    mf_cu_result_t r;
    const char *step = "cuDeviceGet";
    a->ordinal = ordinal;
    a->bytes = bytes;
    if ((r = cu->cuDeviceGet(&a->dev, ordinal)) != MF_CUDA_SUCCESS)
        goto fail;
    step = "cuDeviceGetPCIBusId";
    if ((r = cu->cuDeviceGetPCIBusId(a->pci, sizeof(a->pci), a->dev)) != MF_CUDA_SUCCESS)
        goto fail;
    mf_cu_uuid_t u;
    step = "cuDeviceGetUuid";
    if ((r = cu->cuDeviceGetUuid(&u, a->dev)) != MF_CUDA_SUCCESS)
        goto fail;
    memcpy(a->uuid, u.bytes, 16);
    step = "cuDevicePrimaryCtxRetain";
    if ((r = cu->cuDevicePrimaryCtxRetain(&a->ctx, a->dev)) != MF_CUDA_SUCCESS) {
        a->ctx = NULL;
        goto fail;
    }
    step = "cuCtxSetCurrent";
    if ((r = cu->cuCtxSetCurrent(a->ctx)) != MF_CUDA_SUCCESS)
        goto fail;
    step = "cuMemAlloc";
    if ((r = cu->cuMemAlloc(&a->base, bytes)) != MF_CUDA_SUCCESS) {
        a->base = 0;
        goto fail;
    }
    step = "cuIpcGetMemHandle";
    if ((r = cu->cuIpcGetMemHandle(&a->ipc, a->base)) != MF_CUDA_SUCCESS)
        goto fail;
    if (mfd_oalloc_create(bytes, &a->alloc) != MF_OK) {
        snprintf(why, whylen, "gpu %d: out of host memory", ordinal);
        return MF_RESOURCE_EXHAUSTED;
    }
    return MF_OK;
fail:
    snprintf(why, whylen, "gpu %d (%s): %s of %llu bytes failed: %s", ordinal,
             a->pci[0] ? a->pci : "?", step, (unsigned long long)bytes, mf_cudrv_strerror(r));
    return MF_UNAVAILABLE;
}

mf_status_t mfd_gpu_open(uint64_t gpu_bytes, const char *devices, mfd_gpu_t **out,
                         char *why, size_t whylen)
{
    *out = NULL;
    if (gpu_bytes == 0) {
        snprintf(why, whylen, "gpu_bytes is 0");
        return MF_UNAVAILABLE;
    }
    const mf_cudrv_t *cu;
    const char *w = NULL;
    if (mf_cudrv_get(&cu, &w) != MF_OK) {
        snprintf(why, whylen, "%s", w ? w : "CUDA driver unavailable");
        return MF_UNAVAILABLE;
    }
    int count = 0;
    mf_cu_result_t r = cu->cuDeviceGetCount(&count);
    if (r != MF_CUDA_SUCCESS || count < 1) {
        snprintf(why, whylen, "no CUDA device visible");
        return MF_UNAVAILABLE;
    }
    int ords[MFD_GPU_MAX_ARENAS];
    size_t n;
    mf_status_t st = parse_devices(devices, count, ords, &n, why, whylen);
    if (st != MF_OK)
        return st;
    mfd_gpu_t *g = calloc(1, sizeof(*g));
    if (!g) {
        snprintf(why, whylen, "out of memory");
        return MF_RESOURCE_EXHAUSTED;
    }
    g->cu = cu;
    for (size_t i = 0; i < n; i++) {
        mfd_gpu_arena_t *a = &g->a[i];
        a->index = (uint32_t)i;
        st = arena_open(g, a, ords[i], mfd_arena_round(gpu_bytes), why, whylen);
        g->n = i + 1;
        if (st != MF_OK) {
            mfd_gpu_close(g);
            return st == MF_RESOURCE_EXHAUSTED ? st : MF_UNAVAILABLE;
        }
    }
    *out = g;
    return MF_OK;
}

void mfd_gpu_close(mfd_gpu_t *g)
{
    if (!g)
        return;
    for (size_t i = 0; i < g->n; i++)
        arena_close(g, &g->a[i]);
    g->cu->cuCtxSetCurrent(NULL);
    free(g);
}

mf_status_t mfd_gpu_alloc(mfd_gpu_t *g, uint32_t arena, uint64_t size, mfd_ablock_t **blk)
{
    if (arena >= g->n)
        return MF_INVALID_ARGUMENT;
    return mfd_oalloc_alloc(g->a[arena].alloc, size, blk);
}

void mfd_gpu_free(mfd_gpu_t *g, uint32_t arena, mfd_ablock_t *blk)
{
    if (blk && arena < g->n)
        mfd_oalloc_free(g->a[arena].alloc, blk);
}

mf_status_t mfd_gpu_write(mfd_gpu_t *g, uint32_t arena, const mfd_ablock_t *blk,
                          const void *src, size_t n)
{
    mfd_gpu_arena_t *a = &g->a[arena];
    if (n > mfd_ablock_size(blk) || set_ctx(g, a) != MF_OK)
        return MF_INTERNAL;
    mf_cu_result_t r = g->cu->cuMemcpyHtoD(a->base + mfd_ablock_offset(blk), src, n);
    /* A pageable HtoD returns before the DMA lands: synchronize, so a client reading the
     * row through its IPC mapping right after (a lease) sees these bytes. */
    if (r == MF_CUDA_SUCCESS)
        r = g->cu->cuCtxSynchronize();
    if (r != MF_CUDA_SUCCESS) {
        mfd_error("gpu %d: cuMemcpyHtoD of %zu bytes: %s", a->ordinal, n, mf_cudrv_strerror(r));
        return MF_INTERNAL;
    }
    return MF_OK;
}

mf_status_t mfd_gpu_read(mfd_gpu_t *g, uint32_t arena, const mfd_ablock_t *blk, void *dst,
                         size_t n)
{
    mfd_gpu_arena_t *a = &g->a[arena];
    if (n > mfd_ablock_size(blk) || set_ctx(g, a) != MF_OK)
        return MF_INTERNAL;
    mf_cu_result_t r = g->cu->cuMemcpyDtoH(dst, a->base + mfd_ablock_offset(blk), n);
    if (r != MF_CUDA_SUCCESS) {
        mfd_error("gpu %d: cuMemcpyDtoH of %zu bytes: %s", a->ordinal, n, mf_cudrv_strerror(r));
        return MF_INTERNAL;
    }
    return MF_OK;
}

uint64_t mfd_gpu_used(const mfd_gpu_t *g)
{
    uint64_t u = 0;
    for (size_t i = 0; g && i < g->n; i++)
        u += mfd_oalloc_used(g->a[i].alloc);
    return u;
}

uint64_t mfd_gpu_capacity(const mfd_gpu_t *g)
{
    uint64_t c = 0;
    for (size_t i = 0; g && i < g->n; i++)
        c += g->a[i].bytes;
    return c;
}
