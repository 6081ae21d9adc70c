/* tier_gpu — cuMemAlloc arenas per device, IPC handles, synchronous copies (see tier_gpu.h). */
#include "tier_gpu.h"
#include "mf_clock.h"
#include "log.h"
#include "mf_row.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

/* The kernels' secret parameter (gpu_verify.cu struct mfd_xxh3_secret): XXH3's default. */
typedef struct verify_secret {
    uint64_t w[24];
} verify_secret_t;
_Static_assert(sizeof(XXH3_kSecret) == sizeof(verify_secret_t), "XXH3 default secret size");

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

/* Unloads arena a's validation module, stream and scratch (context current). */
static void verify_close(const mfd_gpu_t *g, mfd_gpu_arena_t *a)
{
    if (a->scratch)
        g->cu->cuMemFree(a->scratch);
    if (a->stream)
        g->cu->cuStreamDestroy(a->stream);
    if (a->mod)
        g->cu->cuModuleUnload(a->mod);
    a->scratch = 0;
    a->scratch_cap = 0;
    a->stream = NULL;
    a->mod = NULL;
    a->f_blocks = a->f_final = NULL;
}

/* Frees what arena a holds (any stage of opening). */
static void arena_close(const mfd_gpu_t *g, mfd_gpu_arena_t *a)
{
    if (a->ctx && set_ctx(g, a) == MF_OK)
        verify_close(g, a);
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

/* Loads the validation kernels in every arena's context; on any failure none stays loaded
 * and verify_why says why rows are validated on the host. */
static void verify_open(mfd_gpu_t *g)
{
    const mf_cudrv_t *cu = g->cu;
    size_t len;
    const char *ptx = mfd_gpu_verify_ptx(&len);
    const char *env = getenv("MFD_GPU_VERIFY");
    g->verify_gpu = 0;
    if (set_ctx(g, &g->a[0]) != MF_OK ||
        cu->cuMemAllocHost((void **)&g->out, sizeof(uint64_t)) != MF_CUDA_SUCCESS) {
        g->out = NULL;
        snprintf(g->verify_why, sizeof(g->verify_why), "no pinned memory for the result");
        return;
    }
    /* Host by default: on the H200 a pinned DtoH + CPU xxh3 took 84 us per 2 MiB row
     * against 234 us for the kernels, whose launches in the daemon's context also
     * time-slice the GPU with the workers' contexts (their copies slowed 10x meanwhile;
     * bench/results/handoff.md). MFD_GPU_VERIFY=gpu opts in. */
    if (!env || strcmp(env, "gpu") != 0) {
        snprintf(g->verify_why, sizeof(g->verify_why), "%s",
                 env ? "MFD_GPU_VERIFY is not 'gpu'"
                     : "the default; MFD_GPU_VERIFY=gpu runs the checksum kernels");
        return;
    }
    if (!ptx) {
        snprintf(g->verify_why, sizeof(g->verify_why),
                 "no PTX built in (mapflowd was built without nvcc)");
        return;
    }
    for (size_t i = 0; i < g->n; i++) {
        mfd_gpu_arena_t *a = &g->a[i];
        const char *step = "cuCtxSetCurrent";
        mf_cu_result_t r = cu->cuCtxSetCurrent(a->ctx);
        if (r == MF_CUDA_SUCCESS && (step = "cuModuleLoadData",
                                     r = cu->cuModuleLoadData(&a->mod, ptx)) != MF_CUDA_SUCCESS)
            a->mod = NULL;
        if (r == MF_CUDA_SUCCESS)
            step = "cuModuleGetFunction", r = cu->cuModuleGetFunction(&a->f_blocks, a->mod,
                                                                      "mfd_verify_blocks");
        if (r == MF_CUDA_SUCCESS)
            r = cu->cuModuleGetFunction(&a->f_final, a->mod, "mfd_verify_final");
        if (r == MF_CUDA_SUCCESS && (step = "cuStreamCreate",
                                     r = cu->cuStreamCreate(&a->stream,
                                                            MF_CU_STREAM_NON_BLOCKING)) !=
                                        MF_CUDA_SUCCESS)
            a->stream = NULL;
        if (r != MF_CUDA_SUCCESS) {
            snprintf(g->verify_why, sizeof(g->verify_why), "gpu %d: %s: %s", a->ordinal, step,
                     mf_cudrv_strerror(r));
            for (size_t k = 0; k <= i; k++)
                if (set_ctx(g, &g->a[k]) == MF_OK)
                    verify_close(g, &g->a[k]);
            return;
        }
    }
    g->verify_gpu = 1;
    snprintf(g->verify_why, sizeof(g->verify_why), "checksum kernels, %zu bytes of PTX", len);
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
    verify_open(g);
    *out = g;
    return MF_OK;
}

static void stage_free(mfd_gpu_t *g)
{
    if (g->stage_pinned)
        g->cu->cuMemFreeHost(g->stage);
    else
        free(g->stage);
    g->stage = NULL;
    g->stage_cap = 0;
    g->stage_pinned = 0;
}

static void *pin_main(void *arg)
{
    mfd_gpu_t *g = arg;
    double t0 = mf_now_s();
    /* Any arena's context will do: PORTABLE pins the range for all of them. */
    mf_cu_result_t r = g->cu->cuCtxSetCurrent(g->a[0].ctx);
    if (r == MF_CUDA_SUCCESS)
        r = g->cu->cuMemHostRegister(g->pin_base, g->pin_bytes, MF_CU_MEMHOSTREGISTER_PORTABLE);
    double dt = mf_now_s() - t0;
    if (r == MF_CUDA_SUCCESS) {
        atomic_store(&g->host_pinned, 1);
        mfd_info("host arena pinned for CUDA (cuMemHostRegister, portable): %zu bytes in "
                 "%.2f s; GPU<->host tier copies are direct DMA",
                 g->pin_bytes, dt);
    } else {
        atomic_store(&g->host_pinned, -1);
        mfd_warn("host arena NOT pinned for CUDA (cuMemHostRegister of %zu bytes failed "
                 "after %.2f s: %s); GPU<->host tier copies stay pageable",
                 g->pin_bytes, dt, mf_cudrv_strerror(r));
    }
    g->cu->cuCtxSetCurrent(NULL);
    return NULL;
}

void mfd_gpu_pin_host(mfd_gpu_t *g, void *base, size_t bytes)
{
    if (!g || !g->n || g->pin_base || !base || !bytes)
        return;
    g->pin_base = base;
    g->pin_bytes = bytes;
    mfd_info("host arena: pinning %zu bytes for CUDA in the background (host_pin on)", bytes);
    if (pthread_create(&g->pin_thread, NULL, pin_main, g) == 0)
        g->pin_started = 1;
    else
        pin_main(g); /* no thread: pin now, at the cost of a slower start */
}

/* Joins the pinning thread and undoes its registration (before the arena is unmapped). */
static void pin_undo(mfd_gpu_t *g)
{
    if (g->pin_started)
        pthread_join(g->pin_thread, NULL);
    g->pin_started = 0;
    if (atomic_load(&g->host_pinned) == 1 && set_ctx(g, &g->a[0]) == MF_OK) {
        mf_cu_result_t r = g->cu->cuMemHostUnregister(g->pin_base);
        if (r != MF_CUDA_SUCCESS)
            mfd_warn("host arena: cuMemHostUnregister: %s", mf_cudrv_strerror(r));
    }
    atomic_store(&g->host_pinned, 0);
    g->pin_base = NULL;
}

void mfd_gpu_close(mfd_gpu_t *g)
{
    if (!g)
        return;
    pin_undo(g);
    if (g->n && set_ctx(g, &g->a[0]) == MF_OK) {
        stage_free(g);
        if (g->out)
            g->cu->cuMemFreeHost(g->out);
    }
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

/* ---- commit validation ----------------------------------------------------------------- */

/* The staging buffer holding at least n bytes, its first `keep` bytes preserved. */
static uint8_t *stage_get(mfd_gpu_t *g, size_t n, size_t keep)
{
    if (n <= g->stage_cap)
        return g->stage;
    size_t cap = (size_t)1 << 20;
    while (cap < n)
        cap <<= 1;
    uint8_t *b = NULL;
    int pinned = set_ctx(g, &g->a[0]) == MF_OK &&
                 g->cu->cuMemAllocHost((void **)&b, cap) == MF_CUDA_SUCCESS;
    if (!pinned && !(b = aligned_alloc(64, cap)))
        return NULL;
    if (keep)
        memcpy(b, g->stage, keep);
    stage_free(g);
    g->stage = b;
    g->stage_cap = cap;
    g->stage_pinned = pinned;
    return b;
}

/* Copies [from, to) of the row at dptr into the staging buffer (same offsets). */
static mf_status_t stage_read(mfd_gpu_t *g, const mfd_gpu_arena_t *a, mf_cu_deviceptr_t dptr,
                              size_t from, size_t to)
{
    if (!stage_get(g, to, from))
        return MF_RESOURCE_EXHAUSTED;
    if (set_ctx(g, a) != MF_OK)
        return MF_INTERNAL;
    mf_cu_result_t r = g->cu->cuMemcpyDtoH(g->stage + from, dptr + from, to - from);
    if (r != MF_CUDA_SUCCESS) {
        mfd_error("gpu %d: cuMemcpyDtoH of %zu bytes: %s", a->ordinal, to - from,
                  mf_cudrv_strerror(r));
        return MF_INTERNAL;
    }
    return MF_OK;
}

/* Runs the checksum kernels on [dptr, dptr + size) and copies [from, to) of the row into
 * the staging buffer on the same stream; *sum the checksum. */
static mf_status_t verify_run(mfd_gpu_t *g, mfd_gpu_arena_t *a, mf_cu_deviceptr_t dptr,
                              uint64_t size, size_t from, size_t to, uint64_t *sum)
{
    const mf_cudrv_t *cu = g->cu;
    const char *step = "";
    uint64_t nblk = (size - 1) / 1024, need = 64 + nblk * 64;
    mf_cu_result_t r = MF_CUDA_SUCCESS;
    if (!stage_get(g, to, from))
        return MF_RESOURCE_EXHAUSTED;
    if (set_ctx(g, a) != MF_OK)
        return MF_INTERNAL;
    if (need > a->scratch_cap) {
        uint64_t cap = (uint64_t)1 << 16;
        while (cap < need)
            cap <<= 1;
        if (a->scratch)
            cu->cuMemFree(a->scratch);
        a->scratch = 0;
        a->scratch_cap = 0;
        step = "cuMemAlloc (scratch)";
        if ((r = cu->cuMemAlloc(&a->scratch, cap)) != MF_CUDA_SUCCESS)
            goto fail;
        a->scratch_cap = cap;
    }
    verify_secret_t sec;
    memcpy(sec.w, XXH3_kSecret, sizeof(sec));
    mf_cu_deviceptr_t out = a->scratch, delta = a->scratch + 64;
    if (nblk) {
        void *pb[] = {&dptr, &nblk, &sec, &delta};
        step = "cuLaunchKernel (blocks)";
        r = cu->cuLaunchKernel(a->f_blocks, (unsigned)((nblk + 7) / 8), 1, 1, 256, 1, 1, 0,
                               a->stream, pb, NULL);
        if (r != MF_CUDA_SUCCESS)
            goto fail;
    }
    void *pf[] = {&dptr, &size, &nblk, &sec, &delta, &out};
    step = "cuLaunchKernel (final)";
    if ((r = cu->cuLaunchKernel(a->f_final, 1, 1, 1, 32, 1, 1, 0, a->stream, pf, NULL)) !=
        MF_CUDA_SUCCESS)
        goto fail;
    step = "cuMemcpyDtoHAsync";
    if (to > from &&
        (r = cu->cuMemcpyDtoHAsync(g->stage + from, dptr + from, to - from, a->stream)) !=
            MF_CUDA_SUCCESS)
        goto fail;
    if ((r = cu->cuMemcpyDtoHAsync(g->out, out, sizeof(uint64_t), a->stream)) !=
        MF_CUDA_SUCCESS)
        goto fail;
    step = "cuStreamSynchronize";
    if ((r = cu->cuStreamSynchronize(a->stream)) != MF_CUDA_SUCCESS)
        goto fail;
    *sum = *g->out;
    return MF_OK;
fail:
    /* A kernel that cannot run here once will not later: validate on the host from now. */
    mfd_error("gpu %d: %s: %s; rows are validated on the host from now on", a->ordinal, step,
              mf_cudrv_strerror(r));
    snprintf(g->verify_why, sizeof(g->verify_why), "gpu %d: %s failed: %s", a->ordinal, step,
             mf_cudrv_strerror(r));
    g->verify_gpu = 0;
    return MF_UNAVAILABLE;
}

/* First bytes copied with the kernels on the GPU path: a row's prefix up to its tiles
 * (header, model, tokens, column tables, masses, scales) fits in these for the row shapes
 * MapFlow writes, so one stream synchronize per commit covers kernels and prefix. */
#define VERIFY_FIRST (64u << 10)

mf_status_t mfd_gpu_check_row(mfd_gpu_t *g, uint32_t arena, const mfd_ablock_t *blk,
                              uint64_t size, const uint8_t **bytes, size_t *have,
                              uint64_t *gpu_sum, int *gpu_sum_valid)
{
    mfd_gpu_arena_t *a = &g->a[arena];
    mf_cu_deviceptr_t dptr = a->base + mfd_ablock_offset(blk);
    *gpu_sum_valid = 0;
    *have = 0;
    if (size > mfd_ablock_size(blk))
        return MF_INTERNAL;
    mf_status_t st;
    if (g->verify_gpu && size >= MF_ROW_HEADER + MFD_GPU_VERIFY_MIN_TILES) {
        /* The kernels need only `size` (from PutBegin), not the header: launch them with
         * the copy of the row's first bytes, then one synchronize. A header that does not
         * describe `size` bytes is refused by the decoder from those bytes. */
        size_t first = size < VERIFY_FIRST ? (size_t)size : VERIFY_FIRST;
        st = verify_run(g, a, dptr, size, 0, first, gpu_sum);
        if (st == MF_OK) {
            *bytes = g->stage;
            *have = first;
            const mf_row_header_t *h = (const mf_row_header_t *)g->stage;
            mf_row_layout_t l;
            if (h->magic == MF_ROW_MAGIC && h->total_size == size &&
                mf_row_layout((mf_codec_t)h->codec, h->block_size, h->n_heads, h->n_cols,
                              h->n_entries, h->model_len, &l) == MF_OK &&
                l.total == size && l.tiles > first) {
                /* A longer prefix than usual: the rest of it (the decoder reads it). */
                if ((st = stage_read(g, a, dptr, first, l.tiles)) != MF_OK)
                    return st;
                *bytes = g->stage;
                *have = l.tiles;
            }
            *gpu_sum_valid = 1;
            return MF_OK;
        }
        if (st != MF_UNAVAILABLE)
            return st;
        /* MF_UNAVAILABLE: the kernels failed; this row (and later ones) on the host */
    }
    if ((st = stage_read(g, a, dptr, 0, size)) == MF_OK) {
        *bytes = g->stage;
        *have = size;
    }
    return st;
}
