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
    a->f_blocks = a->f_final = a->f_rows_blocks = a->f_rows_final = NULL;
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

static mf_cu_result_t scratch_get(mfd_gpu_t *g, mfd_gpu_arena_t *a, uint64_t need);
static mf_cu_result_t rows_launch(mfd_gpu_t *g, mfd_gpu_arena_t *a, mf_cu_deviceptr_t base,
                                  mf_cu_deviceptr_t tab, uint32_t nrows, uint64_t total_blk,
                                  mf_cu_deviceptr_t delta, mf_cu_deviceptr_t out,
                                  const char **step);

/* The batched region kernels of arena a (its context current, the per-row ones loaded),
 * kept only if they agree with the host's XXH3 on three rows of random bytes (4100, 9000
 * and 70001 bytes: few and many blocks, a length not 8-aligned). 1 when kept. */
static int rows_kernels_open(mfd_gpu_t *g, mfd_gpu_arena_t *a)
{
    const mf_cudrv_t *cu = g->cu;
    static const uint64_t lens[3] = {4100, 9000, 70001};
    a->f_rows_blocks = a->f_rows_final = NULL;
    mf_cu_function_t fb = NULL, ff = NULL;
    if (!g->rc_tab || !g->rc_out || set_ctx(g, a) != MF_OK ||
        cu->cuModuleGetFunction(&fb, a->mod, "mfd_verify_rows_blocks") != MF_CUDA_SUCCESS ||
        cu->cuModuleGetFunction(&ff, a->mod, "mfd_verify_rows_final") != MF_CUDA_SUCCESS)
        return 0;
    a->f_rows_blocks = fb; /* rows_launch launches these; kept only if the test passes */
    a->f_rows_final = ff;
    uint64_t at = 0, blk = 0;
    for (int r = 0; r < 3; r++) {
        g->rc_tab[3 * r] = at;
        g->rc_tab[3 * r + 1] = lens[r];
        g->rc_tab[3 * r + 2] = blk;
        at += mfd_arena_round(lens[r]);
        blk += (lens[r] - 1) / 1024;
    }
    /* scratch: [0, 64) sums, [64, 256) table, rows from 256, then the block increments */
    uint8_t *rows = malloc(at);
    const char *step = "cuMemAlloc (scratch)";
    mf_cu_result_t r = rows ? scratch_get(g, a, 256 + at + blk * 64) : MF_CUDA_SUCCESS;
    int ok = 0;
    if (rows && r == MF_CUDA_SUCCESS) {
        uint64_t x = 0x9e3779b97f4a7c15ull;
        for (uint64_t i = 0; i < at; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            rows[i] = (uint8_t)x;
        }
        step = "cuMemcpyHtoD";
        if ((r = cu->cuMemcpyHtoD(a->scratch + 256, rows, at)) == MF_CUDA_SUCCESS &&
            (r = cu->cuMemcpyHtoD(a->scratch + 64, g->rc_tab, 9 * sizeof(uint64_t))) ==
                MF_CUDA_SUCCESS &&
            (r = cu->cuCtxSynchronize()) == MF_CUDA_SUCCESS)
            r = rows_launch(g, a, a->scratch + 256, a->scratch + 64, 3, blk,
                            a->scratch + 256 + at, a->scratch, &step);
        if (r == MF_CUDA_SUCCESS && (step = "cuMemcpyDtoHAsync",
                                     r = cu->cuMemcpyDtoHAsync(g->rc_out, a->scratch, 24,
                                                               a->stream)) == MF_CUDA_SUCCESS)
            step = "cuStreamSynchronize", r = cu->cuStreamSynchronize(a->stream);
        ok = r == MF_CUDA_SUCCESS;
        for (int k = 0; ok && k < 3; k++) {
            static const uint8_t zero[8];
            const uint8_t *p = rows + g->rc_tab[3 * k];
            XXH3_state_t st;
            XXH3_64bits_reset(&st);
            XXH3_64bits_update(&st, p, 8);
            XXH3_64bits_update(&st, zero, 8);
            XXH3_64bits_update(&st, p + 16, lens[k] - 16);
            ok = XXH3_64bits_digest(&st) == g->rc_out[k];
        }
    }
    free(rows);
    if (!ok && r != MF_CUDA_SUCCESS)
        mfd_warn("gpu %d: batched region kernels off: %s: %s", a->ordinal, step,
                 mf_cudrv_strerror(r));
    else if (!ok)
        mfd_warn("gpu %d: batched region kernels off: their sums differ from the host's "
                 "XXH3 (per-row launches instead)", a->ordinal);
    if (!ok)
        a->f_rows_blocks = a->f_rows_final = NULL;
    return ok;
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
        snprintf(g->region_why, sizeof(g->region_why), "%s", g->verify_why);
        return;
    }
    if (cu->cuMemAllocHost((void **)&g->rc_out, MFD_GPU_RC_ROWS * sizeof(uint64_t)) !=
        MF_CUDA_SUCCESS) {
        g->rc_out = NULL;
        snprintf(g->region_why, sizeof(g->region_why), "no pinned memory for region sums");
    }
    if (cu->cuMemAllocHost((void **)&g->rc_tab, MFD_GPU_RC_ROWS * 3 * sizeof(uint64_t)) !=
        MF_CUDA_SUCCESS)
        g->rc_tab = NULL; /* per-row launches */
    /* Single-row puts: host by default. On the H200 a pinned DtoH + CPU xxh3 took 84 us
     * per 2 MiB row against 234 us for the kernels, whose launches in the daemon's context
     * also time-slice the GPU with the workers' contexts (their copies slowed 10x
     * meanwhile; bench/results/handoff.md). MFD_GPU_VERIFY=gpu opts in. Put regions use
     * the kernels whenever they load (no payload copy), unless MFD_GPU_VERIFY=host. */
    int host_only = env && strcmp(env, "host") == 0;
    snprintf(g->verify_why, sizeof(g->verify_why), "%s",
             env && strcmp(env, "gpu") != 0 ? "MFD_GPU_VERIFY is not 'gpu'"
                                             : "the default; MFD_GPU_VERIFY=gpu runs the "
                                               "checksum kernels");
    if (host_only) {
        snprintf(g->region_why, sizeof(g->region_why), "MFD_GPU_VERIFY=host");
        return;
    }
    if (!ptx) {
        snprintf(g->region_why, sizeof(g->region_why),
                 "no PTX built in (mapflowd was built without nvcc)");
        if (env && strcmp(env, "gpu") == 0)
            snprintf(g->verify_why, sizeof(g->verify_why), "%s", g->region_why);
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
            snprintf(g->region_why, sizeof(g->region_why), "gpu %d: %s: %s", a->ordinal,
                     step, mf_cudrv_strerror(r));
            if (env && strcmp(env, "gpu") == 0)
                snprintf(g->verify_why, sizeof(g->verify_why), "%s", g->region_why);
            for (size_t k = 0; k <= i; k++)
                if (set_ctx(g, &g->a[k]) == MF_OK)
                    verify_close(g, &g->a[k]);
            return;
        }
    }
    g->kernels = 1;
    /* MFD_REGION_BATCHED=0: per-row launches (how tests reach that path on the fake). */
    const char *b = getenv("MFD_REGION_BATCHED");
    int batched = !(b && strcmp(b, "0") == 0);
    for (size_t i = 0; batched && i < g->n; i++)
        batched &= rows_kernels_open(g, &g->a[i]);
    for (size_t i = 0; !batched && i < g->n; i++)
        g->a[i].f_rows_blocks = g->a[i].f_rows_final = NULL;
    snprintf(g->region_why, sizeof(g->region_why), "checksum kernels, %zu bytes of PTX; %s",
             len, batched ? "one launch of each per region chunk"
                          : "per-row launches (MFD_REGION_BATCHED=0, or the batched kernels "
                            "are missing or failed their self-test)");
    if (env && strcmp(env, "gpu") == 0) {
        g->verify_gpu = 1;
        snprintf(g->verify_why, sizeof(g->verify_why), "checksum kernels, %zu bytes of PTX",
                 len);
    }
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
        if (g->rc_out)
            g->cu->cuMemFreeHost(g->rc_out);
        if (g->rc_tab)
            g->cu->cuMemFreeHost(g->rc_tab);
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

mf_status_t mfd_gpu_split(mfd_gpu_t *g, uint32_t arena, mfd_ablock_t *blk, uint64_t at,
                          mfd_ablock_t **rest)
{
    return arena < g->n ? mfd_oalloc_split(g->a[arena].alloc, blk, at, rest)
                        : MF_INVALID_ARGUMENT;
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

/* Arena a's device scratch of at least `need` bytes (its context current). */
static mf_cu_result_t scratch_get(mfd_gpu_t *g, mfd_gpu_arena_t *a, uint64_t need)
{
    if (need <= a->scratch_cap)
        return MF_CUDA_SUCCESS;
    uint64_t cap = (uint64_t)1 << 16;
    while (cap < need)
        cap <<= 1;
    if (a->scratch)
        g->cu->cuMemFree(a->scratch);
    a->scratch = 0;
    a->scratch_cap = 0;
    mf_cu_result_t r = g->cu->cuMemAlloc(&a->scratch, cap);
    if (r == MF_CUDA_SUCCESS)
        a->scratch_cap = cap;
    return r;
}

/* Queues both checksum kernels for the row [dptr, dptr + size) (size > 240) on a's stream:
 * delta (nblk × 64 bytes of scratch) for the per-block sums, the checksum to *out. */
static mf_cu_result_t sum_launch(mfd_gpu_t *g, mfd_gpu_arena_t *a, mf_cu_deviceptr_t dptr,
                                 uint64_t size, mf_cu_deviceptr_t delta, mf_cu_deviceptr_t out,
                                 const char **step)
{
    static verify_secret_t sec; /* XXH3's default secret, copied once */
    if (!sec.w[0])
        memcpy(sec.w, XXH3_kSecret, sizeof(sec));
    uint64_t nblk = (size - 1) / 1024;
    mf_cu_result_t r;
    if (nblk) {
        void *pb[] = {&dptr, &nblk, &sec, &delta};
        *step = "cuLaunchKernel (blocks)";
        r = g->cu->cuLaunchKernel(a->f_blocks, (unsigned)((nblk + 7) / 8), 1, 1, 256, 1, 1, 0,
                                  a->stream, pb, NULL);
        if (r != MF_CUDA_SUCCESS)
            return r;
    }
    void *pf[] = {&dptr, &size, &nblk, &sec, &delta, &out};
    *step = "cuLaunchKernel (final)";
    return g->cu->cuLaunchKernel(a->f_final, 1, 1, 1, 32, 1, 1, 0, a->stream, pf, NULL);
}

/* Queues the batched kernels for nrows rows of the table tab (device) on a's stream. */
static mf_cu_result_t rows_launch(mfd_gpu_t *g, mfd_gpu_arena_t *a, mf_cu_deviceptr_t base,
                                  mf_cu_deviceptr_t tab, uint32_t nrows, uint64_t total_blk,
                                  mf_cu_deviceptr_t delta, mf_cu_deviceptr_t out,
                                  const char **step)
{
    static verify_secret_t sec;
    if (!sec.w[0])
        memcpy(sec.w, XXH3_kSecret, sizeof(sec));
    mf_cu_result_t r = MF_CUDA_SUCCESS;
    if (total_blk) {
        void *pb[] = {&base, &tab, &nrows, &total_blk, &sec, &delta};
        *step = "cuLaunchKernel (rows blocks)";
        r = g->cu->cuLaunchKernel(a->f_rows_blocks, (unsigned)((total_blk + 7) / 8), 1, 1, 256,
                                  1, 1, 0, a->stream, pb, NULL);
    }
    if (r == MF_CUDA_SUCCESS && nrows) {
        void *pf[] = {&base, &tab, &sec, &delta, &out};
        *step = "cuLaunchKernel (rows final)";
        r = g->cu->cuLaunchKernel(a->f_rows_final, nrows, 1, 1, 32, 1, 1, 0, a->stream, pf,
                                  NULL);
    }
    return r;
}

/* A kernel that cannot run here once will not later: validate on the host from now. */
static mf_status_t kernels_failed(mfd_gpu_t *g, const mfd_gpu_arena_t *a, const char *step,
                                  mf_cu_result_t r)
{
    mfd_error("gpu %d: %s: %s; rows are validated on the host from now on", a->ordinal, step,
              mf_cudrv_strerror(r));
    snprintf(g->verify_why, sizeof(g->verify_why), "gpu %d: %s failed: %s", a->ordinal, step,
             mf_cudrv_strerror(r));
    g->verify_gpu = 0;
    g->kernels = 0;
    snprintf(g->region_why, sizeof(g->region_why), "%s", g->verify_why);
    return MF_UNAVAILABLE;
}

/* Runs the checksum kernels on [dptr, dptr + size) and copies [from, to) of the row into
 * the staging buffer on the same stream; *sum the checksum. */
static mf_status_t verify_run(mfd_gpu_t *g, mfd_gpu_arena_t *a, mf_cu_deviceptr_t dptr,
                              uint64_t size, size_t from, size_t to, uint64_t *sum)
{
    const mf_cudrv_t *cu = g->cu;
    const char *step = "cuMemAlloc (scratch)";
    uint64_t nblk = (size - 1) / 1024;
    mf_cu_result_t r;
    if (!stage_get(g, to, from))
        return MF_RESOURCE_EXHAUSTED;
    if (set_ctx(g, a) != MF_OK)
        return MF_INTERNAL;
    if ((r = scratch_get(g, a, 64 + nblk * 64)) != MF_CUDA_SUCCESS)
        return kernels_failed(g, a, step, r);
    mf_cu_deviceptr_t out = a->scratch, delta = a->scratch + 64;
    if ((r = sum_launch(g, a, dptr, size, delta, out, &step)) != MF_CUDA_SUCCESS)
        return kernels_failed(g, a, step, r);
    step = "cuMemcpyDtoHAsync";
    if (to > from &&
        (r = cu->cuMemcpyDtoHAsync(g->stage + from, dptr + from, to - from, a->stream)) !=
            MF_CUDA_SUCCESS)
        return kernels_failed(g, a, step, r);
    if ((r = cu->cuMemcpyDtoHAsync(g->out, out, sizeof(uint64_t), a->stream)) !=
        MF_CUDA_SUCCESS)
        return kernels_failed(g, a, step, r);
    step = "cuStreamSynchronize";
    if ((r = cu->cuStreamSynchronize(a->stream)) != MF_CUDA_SUCCESS)
        return kernels_failed(g, a, step, r);
    *sum = *g->out;
    return MF_OK;
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

/* ---- put regions ------------------------------------------------------------------------ */

static const char k_copy_why[] = "cannot copy the row out of the GPU arena";

/* A pending device → staging copy, grown while the next piece is adjacent on both sides
 * (consecutive rows of a region copied whole go in one copy). */
typedef struct copy_run {
    mf_cu_deviceptr_t dev;
    size_t soff, n;
} copy_run_t;

static mf_cu_result_t run_flush(mfd_gpu_t *g, const mfd_gpu_arena_t *a, copy_run_t *r,
                                int async)
{
    mf_cu_result_t x = MF_CUDA_SUCCESS;
    if (r->n)
        x = async ? g->cu->cuMemcpyDtoHAsync(g->stage + r->soff, r->dev, r->n, a->stream)
                  : g->cu->cuMemcpyDtoH(g->stage + r->soff, r->dev, r->n);
    r->n = 0;
    return x;
}

static mf_cu_result_t run_add(mfd_gpu_t *g, const mfd_gpu_arena_t *a, copy_run_t *r,
                              mf_cu_deviceptr_t dev, size_t soff, size_t n, int async)
{
    if (r->n && r->dev + r->n == dev && r->soff + r->n == soff) {
        r->n += n;
        return MF_CUDA_SUCCESS;
    }
    mf_cu_result_t x = run_flush(g, a, r, async);
    *r = (copy_run_t){dev, soff, n};
    return x;
}

/* The length of a row's prefix up to its tiles (what the decoder reads without the
 * checksum), from its first `have` bytes; 0 when its header does not describe `size`
 * bytes (the decoder then refuses it from those bytes). */
static size_t row_prefix(const uint8_t *p, size_t have, uint64_t size)
{
    mf_row_header_t h;
    mf_row_layout_t l;
    if (have < MF_ROW_HEADER)
        return 0;
    memcpy(&h, p, sizeof(h));
    if (h.magic != MF_ROW_MAGIC || h.total_size != size ||
        mf_row_layout((mf_codec_t)h.codec, h.block_size, h.n_heads, h.n_cols, h.n_entries,
                      h.model_len, &l) != MF_OK ||
        l.total != size)
        return 0;
    return l.tiles;
}

/* Every row of rows[0..m) failed to copy. */
static size_t rows_failed(mfd_gpu_rowcheck_t *rows, size_t m, mf_status_t st)
{
    for (size_t i = 0; i < m; i++) {
        rows[i].st = st;
        rows[i].why = st == MF_RESOURCE_EXHAUSTED ? "no staging memory" : k_copy_why;
        rows[i].have = 0;
        rows[i].sum_valid = 0;
    }
    return m;
}

/* Without the kernels: rows copied whole (adjacent ones in one copy), checked on the host. */
static size_t check_rows_host(mfd_gpu_t *g, mfd_gpu_arena_t *a, mfd_gpu_rowcheck_t *rows,
                              size_t n)
{
    size_t m = 0;
    uint64_t need = 0;
    for (; m < n && m < MFD_GPU_RC_ROWS; m++) {
        uint64_t r = mfd_arena_round(rows[m].size);
        if (m && need + r > MFD_GPU_RC_BYTES)
            break;
        need += r;
    }
    if (!stage_get(g, need, 0))
        return rows_failed(rows, m, MF_RESOURCE_EXHAUSTED);
    if (set_ctx(g, a) != MF_OK)
        return rows_failed(rows, m, MF_INTERNAL);
    copy_run_t run = {0, 0, 0};
    mf_cu_result_t r = MF_CUDA_SUCCESS;
    size_t soff = 0;
    for (size_t i = 0; i < m && r == MF_CUDA_SUCCESS; i++) {
        r = run_add(g, a, &run, a->base + rows[i].off, soff, (size_t)rows[i].size, 0);
        soff += mfd_arena_round(rows[i].size);
    }
    if (r == MF_CUDA_SUCCESS)
        r = run_flush(g, a, &run, 0);
    if (r != MF_CUDA_SUCCESS) {
        mfd_error("gpu %d: cuMemcpyDtoH of a region's rows: %s", a->ordinal,
                  mf_cudrv_strerror(r));
        return rows_failed(rows, m, MF_INTERNAL);
    }
    soff = 0;
    for (size_t i = 0; i < m; i++) {
        rows[i].st = MF_OK;
        rows[i].bytes = g->stage + soff;
        rows[i].have = (size_t)rows[i].size;
        rows[i].sum_valid = 0;
        soff += mfd_arena_round(rows[i].size);
    }
    return m;
}

size_t mfd_gpu_check_rows(mfd_gpu_t *g, uint32_t arena, mfd_gpu_rowcheck_t *rows, size_t n)
{
    mfd_gpu_arena_t *a = &g->a[arena];
    if (!n)
        return 0;
    if (!g->kernels || !g->rc_out || !a->stream)
        return check_rows_host(g, a, rows, n);
    const mf_cudrv_t *cu = g->cu;
    /* Phase 1: the kernels of every row and a copy of its first MFD_GPU_RC_HEAD bytes. */
    size_t m = 0;
    uint64_t scratch = 0;
    for (; m < n && m < MFD_GPU_RC_ROWS; m++) {
        uint64_t d = rows[m].size > MFD_GPU_RC_HEAD ? (rows[m].size - 1) / 1024 * 64 : 0;
        if (m && scratch + d > MFD_GPU_RC_BYTES)
            break;
        scratch += d;
    }
    /* scratch: a sum per row, the batched kernels' table, the blocks' increments */
    uint64_t outs = mfd_arena_round(m * sizeof(uint64_t)), tabs = mfd_arena_round(m * 24);
    int batched = a->f_rows_blocks && a->f_rows_final;
    if (!stage_get(g, m * MFD_GPU_RC_HEAD, 0))
        return rows_failed(rows, m, MF_RESOURCE_EXHAUSTED);
    if (set_ctx(g, a) != MF_OK)
        return rows_failed(rows, m, MF_INTERNAL);
    const char *step = "cuMemAlloc (scratch)";
    mf_cu_result_t r = scratch_get(g, a, outs + tabs + scratch);
    copy_run_t run = {0, 0, 0};
    mf_cu_deviceptr_t delta = a->scratch + outs + tabs;
    uint32_t nk = 0; /* batched: the kernel rows, in the table; their sums out[k] */
    uint64_t blk = 0;
    for (size_t i = 0; batched && r == MF_CUDA_SUCCESS && i < m; i++) {
        if (rows[i].size <= MFD_GPU_RC_HEAD)
            continue;
        g->rc_tab[3 * nk] = rows[i].off;
        g->rc_tab[3 * nk + 1] = rows[i].size;
        g->rc_tab[3 * nk + 2] = blk;
        blk += (rows[i].size - 1) / 1024;
        nk++;
    }
    if (batched && r == MF_CUDA_SUCCESS && nk) {
        step = "cuMemcpyHtoD (table)"; /* pinned: done when it returns */
        r = cu->cuMemcpyHtoD(a->scratch + outs, g->rc_tab, nk * 24);
        /* pinned for arena 0's context only (not PORTABLE): make sure it landed before the
         * non-blocking stream reads it */
        if (r == MF_CUDA_SUCCESS)
            step = "cuCtxSynchronize", r = cu->cuCtxSynchronize();
        if (r == MF_CUDA_SUCCESS)
            r = rows_launch(g, a, a->base, a->scratch + outs, nk, blk, delta, a->scratch,
                            &step);
    }
    for (size_t i = 0; i < m && r == MF_CUDA_SUCCESS; i++) {
        mf_cu_deviceptr_t dptr = a->base + rows[i].off;
        if (!batched && rows[i].size > MFD_GPU_RC_HEAD) {
            r = sum_launch(g, a, dptr, rows[i].size, delta, a->scratch + 8 * i, &step);
            delta += (rows[i].size - 1) / 1024 * 64;
        }
        if (r == MF_CUDA_SUCCESS) {
            step = "cuMemcpyDtoHAsync";
            size_t h = rows[i].size < MFD_GPU_RC_HEAD ? (size_t)rows[i].size : MFD_GPU_RC_HEAD;
            r = run_add(g, a, &run, dptr, i * MFD_GPU_RC_HEAD, h, 1);
        }
    }
    if (r == MF_CUDA_SUCCESS)
        r = run_flush(g, a, &run, 1);
    if (r == MF_CUDA_SUCCESS)
        r = cu->cuMemcpyDtoHAsync(g->rc_out, a->scratch, m * sizeof(uint64_t), a->stream);
    if (r == MF_CUDA_SUCCESS && (step = "cuStreamSynchronize",
                                 r = cu->cuStreamSynchronize(a->stream)) == MF_CUDA_SUCCESS) {
        /* Phase 2: the rest of each prefix longer than the first bytes, laid out after
         * them; a chunk stops before the row whose prefix would overflow the staging. */
        size_t head_end = m * MFD_GPU_RC_HEAD, boff = head_end;
        size_t *pre = malloc(m * sizeof(*pre));
        if (!pre)
            return rows_failed(rows, m, MF_RESOURCE_EXHAUSTED);
        for (size_t i = 0; i < m; i++) {
            size_t h = rows[i].size < MFD_GPU_RC_HEAD ? (size_t)rows[i].size : MFD_GPU_RC_HEAD;
            pre[i] = row_prefix(g->stage + i * MFD_GPU_RC_HEAD, h, rows[i].size);
            if (pre[i] <= h) {
                pre[i] = 0; /* what the decoder reads is in the first bytes already */
                continue;
            }
            if (i && boff - head_end + mfd_arena_round(pre[i]) > MFD_GPU_RC_BYTES) {
                m = i;
                break;
            }
            boff += mfd_arena_round(pre[i]);
        }
        if (!stage_get(g, boff, head_end)) {
            free(pre);
            return rows_failed(rows, m, MF_RESOURCE_EXHAUSTED);
        }
        boff = head_end;
        int copies = 0;
        uint32_t k = 0;
        for (size_t i = 0; i < m && r == MF_CUDA_SUCCESS; i++) {
            size_t h = rows[i].size < MFD_GPU_RC_HEAD ? (size_t)rows[i].size : MFD_GPU_RC_HEAD;
            rows[i].st = MF_OK;
            rows[i].sum = !batched ? g->rc_out[i]
                          : rows[i].size > MFD_GPU_RC_HEAD ? g->rc_out[k++] : 0;
            rows[i].sum_valid = rows[i].size > MFD_GPU_RC_HEAD;
            rows[i].bytes = g->stage + i * MFD_GPU_RC_HEAD;
            rows[i].have = h;
            if (pre[i]) {
                step = "cuMemcpyDtoHAsync";
                r = run_add(g, a, &run, a->base + rows[i].off, boff, pre[i], 1);
                rows[i].bytes = g->stage + boff;
                rows[i].have = pre[i];
                boff += mfd_arena_round(pre[i]);
                copies = 1;
            }
        }
        free(pre);
        if (r == MF_CUDA_SUCCESS)
            r = run_flush(g, a, &run, 1);
        if (r == MF_CUDA_SUCCESS && copies)
            step = "cuStreamSynchronize", r = cu->cuStreamSynchronize(a->stream);
        if (r == MF_CUDA_SUCCESS)
            return m;
    }
    kernels_failed(g, a, step, r);
    return check_rows_host(g, a, rows, n);
}
