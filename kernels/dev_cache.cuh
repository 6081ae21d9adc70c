/*
 * dev_cache — the per-device cached scratch of a kernel launcher (device constants and
 * work buffers, plus pinned host staging for the constants), shared by apply.cu,
 * extract.cu and rows_copy.cu. Each launcher owns its own table (one dev_cache per device):
 * calls of one launcher are ordered on the device, calls of different launchers are not.
 *
 * Why: a per-call cudaMallocAsync gets memory the default pool trimmed at the last
 * synchronisation mapped again, on the host, before the first launch (bench/gpu/NOTES.md),
 * and pageable constants make cudaMemcpyAsync a synchronous staging copy.
 *
 * Protocol: lock c->mu for the whole host part of a call (dev_cache_of + a unique_lock),
 * scratch_get, fill cs.host, copy it to cs.dev on the call's stream and mark its staging
 * busy until that copy is done (scratch_upload), queue the launches, scratch_put. Each call's stream first waits
 * (on the device) for the previous call's launches, so calls sharing the scratch never
 * overlap on the GPU, whatever the streams. The constants go through a ring of
 * DEV_CACHE_PINS pinned staging buffers, each free again once its copy is done (a caller
 * whose stream waits on other work, e.g. mf_export_cuda's rows_stream, can be a few calls
 * ahead of the device); pageable memory when all are pending (whose copy may then wait for
 * the stream). Grown on demand, kept until the process ends. Internal to kernels/; any
 * thread (under c->mu).
 */
#ifndef MF_DEV_CACHE_CUH
#define MF_DEV_CACHE_CUH

#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include <mutex>

#include "mf_cuda_common.cuh"

namespace mfc {

#define DEV_CACHE_PINS 4
struct dev_cache {
    std::mutex mu;
    uint8_t *dev = nullptr, *pin[DEV_CACHE_PINS] = {};
    size_t dev_cap = 0, pin_cap[DEV_CACHE_PINS] = {};
    cudaEvent_t copied[DEV_CACHE_PINS] = {}; /* after the copy out of pin[k] */
    cudaEvent_t done = nullptr;              /* after the last call's launches */
    unsigned next = 0;                       /* the staging slot tried first */
    bool used = false;
};
#define MAX_CACHED_DEVICES 16 /* devices past this allocate per call */

/* The current device's entry of a launcher's table, or NULL (per-call allocation): when
 * use is false (a bench switch) or the device is past MAX_CACHED_DEVICES. */
static inline dev_cache *dev_cache_of(dev_cache *table, bool use)
{
    int dev = -1;
    dev_cache *c = nullptr;
    if (use && cudaGetDevice(&dev) == cudaSuccess && dev >= 0 && dev < MAX_CACHED_DEVICES)
        c = &table[dev];
    (void)cudaGetLastError();
    return c;
}

struct call_scratch {
    dev_cache *c = nullptr;   /* null: per-call allocation */
    uint8_t *dev = nullptr, *host = nullptr;
    int pin = -1;             /* the staging slot host is, or −1 (calloc'd) */
};

/* dev_bytes of device scratch and host_bytes of zeroed host staging for this call (c's
 * mutex held by the caller, or c NULL). */
static inline mf_status_t scratch_get(call_scratch *cs, dev_cache *c, size_t dev_bytes,
                                      size_t host_bytes, cudaStream_t s, const char **why)
{
    cs->c = c;
    if (!c) {
        cs->host = (uint8_t *)calloc(1, host_bytes ? host_bytes : 1);
        if (!cs->host) {
            *why = "out of host memory for kernel constants";
            return MF_RESOURCE_EXHAUSTED;
        }
        return cuda_status(cudaMallocAsync((void **)&cs->dev, dev_bytes, s), why);
    }
    mf_status_t st = MF_OK;
    if (!c->done) {
        for (int k = 0; k < DEV_CACHE_PINS && st == MF_OK; k++)
            st = cuda_status(cudaEventCreateWithFlags(&c->copied[k], cudaEventDisableTiming),
                             why);
        if (st == MF_OK)
            st = cuda_status(cudaEventCreateWithFlags(&c->done, cudaEventDisableTiming), why);
        if (st != MF_OK) {
            for (int k = 0; k < DEV_CACHE_PINS; k++) {
                if (c->copied[k])
                    cudaEventDestroy(c->copied[k]);
                c->copied[k] = nullptr;
            }
            c->done = nullptr;
            return st;
        }
    }
    if (c->used) /* also on the same stream: a destroyed stream's handle can come back */
        st = cuda_status(cudaStreamWaitEvent(s, c->done, 0), why);
    if (st == MF_OK && c->dev_cap < dev_bytes) { /* grow: the old one is freed in stream order */
        size_t cap = dev_bytes > 2 * c->dev_cap ? dev_bytes : 2 * c->dev_cap;
        cap = (cap + 65535) & ~(size_t)65535;
        if (c->dev)
            cudaFreeAsync(c->dev, s);
        c->dev = nullptr;
        c->dev_cap = 0;
        st = cuda_status(cudaMallocAsync((void **)&c->dev, cap, s), why);
        if (st == MF_OK)
            c->dev_cap = cap;
    }
    if (st != MF_OK)
        return st;
    cs->dev = c->dev;
    for (int x = 0; x < DEV_CACHE_PINS; x++) {
        int k = (int)((c->next + x) % DEV_CACHE_PINS);
        if (cudaEventQuery(c->copied[k]) != cudaSuccess) /* its copy pending */
            continue;
        if (c->pin_cap[k] < host_bytes) { /* free (or never used): grow */
            size_t cap = host_bytes > 2 * c->pin_cap[k] ? host_bytes : 2 * c->pin_cap[k];
            cap = (cap + 4095) & ~(size_t)4095;
            if (c->pin[k])
                cudaFreeHost(c->pin[k]);
            c->pin[k] = nullptr;
            c->pin_cap[k] = 0;
            if (cudaMallocHost((void **)&c->pin[k], cap) == cudaSuccess)
                c->pin_cap[k] = cap;
            else
                c->pin[k] = nullptr;
        }
        if (c->pin[k]) {
            cs->host = c->pin[k];
            cs->pin = k;
            c->next = (unsigned)(k + 1) % DEV_CACHE_PINS;
            memset(cs->host, 0, host_bytes);
            return MF_OK;
        }
        break; /* no pinned memory to be had: pageable */
    }
    (void)cudaGetLastError(); /* a pending query or a failed pinned allocation is not an error */
    cs->host = (uint8_t *)calloc(1, host_bytes ? host_bytes : 1);
    if (!cs->host) {
        *why = "out of host memory for kernel constants";
        return MF_RESOURCE_EXHAUSTED;
    }
    return MF_OK;
}

/* The call's constants are in cs->host: copy them to the device scratch on s (and mark the
 * staging busy until that copy is done). */
static inline mf_status_t scratch_upload(call_scratch *cs, size_t host_bytes, cudaStream_t s,
                                         const char **why)
{
    mf_status_t st =
        cuda_status(cudaMemcpyAsync(cs->dev, cs->host, host_bytes, cudaMemcpyHostToDevice, s),
                    why);
    if (st == MF_OK && cs->pin >= 0)
        st = cuda_status(cudaEventRecord(cs->c->copied[cs->pin], s), why);
    return st;
}

/* The call's launches are queued on s: hand the scratch back. */
static inline void scratch_put(call_scratch *cs, cudaStream_t s)
{
    if (!cs->c) {
        if (cs->dev)
            cudaFreeAsync(cs->dev, s);
    } else if (cs->dev) {
        cudaEventRecord(cs->c->done, s);
        cs->c->used = true;
    }
    if (cs->pin < 0)
        free(cs->host);
}

} /* namespace mfc */

#endif /* MF_DEV_CACHE_CUH */
