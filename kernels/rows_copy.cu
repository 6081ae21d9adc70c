/* rows_copy — mf_rows_copy_cuda (mapflow_kernels_cuda.h; spec: mf_rows_copy_ref): n device
 * byte ranges copied in one launch, for the source's put path (a layer's rows from the
 * exporter's buffer into a put region of the daemon's GPU arena: one launch instead of one
 * copy call per row).
 *
 * Grid (n, y): CTA (x, c) copies the 16-byte words c·256 + t, c·256 + t + y·256, … of row x
 * (16-byte loads and stores when both addresses are 16-aligned, as rows are; bytes
 * otherwise); y grows with the largest row so a big prob row is not one CTA's work. The
 * [n][dst, src, size] table goes through this launcher's cached scratch (dev_cache.cuh).
 * Any thread; calls on different streams of one device are ordered on the device. */
#include <mutex>

#include "dev_cache.cuh"
#include "mf_cuda_common.cuh"

using namespace mfc;

namespace {

#define RC_THREADS 256
#define RC_WORDS_PER_CTA (RC_THREADS * 8) /* a CTA's share of a row before y grows: 32 KiB */

__global__ void __launch_bounds__(RC_THREADS) rows_copy_kernel(const uint64_t *tab)
{
    const uint64_t *e = tab + 3 * (size_t)blockIdx.x;
    uint8_t *d = reinterpret_cast<uint8_t *>(e[0]);
    const uint8_t *s = reinterpret_cast<const uint8_t *>(e[1]);
    uint64_t len = e[2];
    uint64_t first = (uint64_t)blockIdx.y * RC_THREADS + threadIdx.x,
             step = (uint64_t)gridDim.y * RC_THREADS;
    uint64_t words = ((reinterpret_cast<uintptr_t>(d) | reinterpret_cast<uintptr_t>(s)) & 15)
                         ? 0
                         : len / 16;
    for (uint64_t w = first; w < words; w += step)
        reinterpret_cast<uint4 *>(d)[w] = __ldg(reinterpret_cast<const uint4 *>(s) + w);
    for (uint64_t b = words * 16 + first; b < len; b += step)
        d[b] = s[b];
}

dev_cache g_cache[MAX_CACHED_DEVICES];

} /* namespace */

extern "C" mf_status_t mf_rows_copy_cuda(void *const *dst, const void *const *src,
                                         const size_t *sizes, uint32_t n,
                                         mf_cuda_stream_t stream, const char **why)
{
    const char *dummy;
    if (!why)
        why = &dummy;
    *why = "";
    size_t mx = 0;
    mf_status_t st = mf_rows_copy_check(dst, src, sizes, n, &mx, why);
    if (st != MF_OK || n == 0 || mx == 0)
        return st;
    cudaStream_t s = stream;
    size_t bytes = (size_t)n * 3 * sizeof(uint64_t);
    uint64_t per_cta = (uint64_t)RC_WORDS_PER_CTA * 16;
    uint32_t y = (uint32_t)((mx + per_cta - 1) / per_cta);
    if (y > 65535)
        y = 65535; /* gridDim.y's limit: the CTAs then stride further */
    dev_cache *cache = dev_cache_of(g_cache, true);
    std::unique_lock<std::mutex> lock;
    if (cache)
        lock = std::unique_lock<std::mutex>(cache->mu);
    call_scratch cs;
    st = scratch_get(&cs, cache, bytes, bytes, s, why);
    if (st == MF_OK) {
        uint64_t *t = reinterpret_cast<uint64_t *>(cs.host);
        for (uint32_t x = 0; x < n; x++) {
            t[3 * x] = (uint64_t)(uintptr_t)dst[x];
            t[3 * x + 1] = (uint64_t)(uintptr_t)src[x];
            t[3 * x + 2] = sizes[x];
        }
        st = scratch_upload(&cs, bytes, s, why);
    }
    if (st == MF_OK) {
        rows_copy_kernel<<<dim3(n, y), RC_THREADS, 0, s>>>(
            reinterpret_cast<const uint64_t *>(cs.dev));
        st = cuda_status(cudaGetLastError(), why);
    }
    scratch_put(&cs, s);
    return st;
}
