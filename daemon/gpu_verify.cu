/*
 * gpu_verify — the daemon's row-checksum kernels, compiled to PTX at build time (nvcc -ptx)
 * and embedded in mapflowd (gpu_verify_ptx.c); tier_gpu loads them per arena context with
 * cuModuleLoadData and runs them on a committed row in place, so a GPU row is validated
 * without copying its tiles to the host.
 *
 * The checksum is the row's (proto/mf_row.c row_checksum): XXH3-64, default secret, of the
 * row with its checksum field (bytes 8..15) read as zero. Rows checked here are long
 * (> 240 bytes; tier_gpu sends only rows with ≥ 16 KiB of tiles), so only XXH3's long
 * path is needed. Its accumulation is additive within a 1 KiB block (16 stripes), and
 * only the scramble between blocks is serial, so it runs in two launches:
 *   mfd_verify_blocks  one warp per 1 KiB block: the block's 8 accumulator increments;
 *   mfd_verify_final   one warp: acc = scramble(acc + Δ[n]) over the blocks, the partial
 *                      last block, the last stripe, the merge → *out.
 * A put region's rows go in one launch of each for all of them: mfd_verify_rows_blocks
 * (one warp per block of any row) and mfd_verify_rows_final (one warp per row).
 * The XXH3 pieces are kernels/xxh3.cuh's, shared with extract's seal (one implementation).
 * The secret (192 bytes) is a kernel parameter filled by the host from xxhash.h, so no
 * module global has to be set. Self-contained: no runtime API, no headers beyond stdint
 * and xxh3.cuh.
 */
#include <stdint.h>

#include "../kernels/xxh3.cuh"

using namespace mfxxh3;

struct mfd_xxh3_secret {
    uint64_t w[24]; /* XXH3_kSecret, little-endian words */
};

/* xxh3.cuh's secret accessor over the kernel parameter. */
struct param_secret {
    const mfd_xxh3_secret &s;
    __device__ __forceinline__ uint64_t word(uint32_t i) const { return s.w[i]; }
};

/* Row word w (8 bytes), the checksum field read as zero. */
__device__ __forceinline__ uint64_t row_word(const uint64_t *row, uint64_t w)
{
    return w == 1 ? 0 : row[w];
}

/* delta[n][8]: block n's accumulator increments (its 16 stripes), n < nblk. 256 threads. */
extern "C" __global__ void __launch_bounds__(256)
mfd_verify_blocks(const uint64_t *row, uint64_t nblk, mfd_xxh3_secret s, uint64_t *delta)
{
    uint64_t n = (uint64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (n >= nblk)
        return; /* whole warps only: n is uniform within a warp */
    const param_secret sec{s};
    uint64_t r = xxh3_block(sec, [&](uint32_t w) { return row_word(row, n * 128 + w); });
    if ((threadIdx.x & 31) < 8)
        delta[n * 8 + acc_lane()] = r;
}

/* The checksum of the row [row, row + len) (len > 240) from its blocks' increments
 * delta[0 .. nblk): the serial fold, the partial last block, the last stripe, the merge.
 * One whole warp; every lane returns the result. */
__device__ __forceinline__ uint64_t row_sum(const param_secret &sec, const uint64_t *row,
                                            uint64_t len, uint64_t nblk,
                                            const uint64_t *delta)
{
    int a = acc_lane();
    uint64_t acc = xxh3_acc_init();
    uint64_t n = 0;
    for (; n + 8 <= nblk; n += 8) { /* loads of 8 blocks ahead of their serial use */
        uint64_t d[8];
#pragma unroll
        for (int x = 0; x < 8; x++)
            d[x] = delta[(n + x) * 8 + a];
#pragma unroll
        for (int x = 0; x < 8; x++)
            acc = xxh3_scramble(sec, acc + d[x]);
    }
    for (; n < nblk; n++)
        acc = xxh3_scramble(sec, acc + delta[n * 8 + a]);
    acc += xxh3_partial(sec, [&](uint64_t wd) { return row_word(row, nblk * 128 + wd); },
                        xxh3_partial_words(len));
    /* The last stripe (its 64 bytes end at len; byte loads: len need not be 8-aligned). */
    {
        const uint8_t *p = reinterpret_cast<const uint8_t *>(row) + len - 64 + 8 * a;
        uint64_t v = 0;
        for (int x = 7; x >= 0; x--)
            v = (v << 8) | p[x];
        acc += xxh3_last_stripe(sec, v);
    }
    return xxh3_merge(sec, acc, len);
}

/* The checksum of the whole row (len > 240) into *out. One warp. */
extern "C" __global__ void __launch_bounds__(32)
mfd_verify_final(const uint64_t *row, uint64_t len, uint64_t nblk, mfd_xxh3_secret s,
                 const uint64_t *delta, uint64_t *out)
{
    const param_secret sec{s};
    uint64_t r = row_sum(sec, row, len, nblk, delta);
    if (threadIdx.x == 0)
        *out = r;
}

/* ---- a put region's rows in one launch each (tier_gpu mfd_gpu_check_rows) ---------------
 * tab[3 r], tab[3 r + 1], tab[3 r + 2]: row r's byte offset from base (8-aligned), its
 * length (> 240) and the index of its first block among all rows' blocks (ascending);
 * delta holds 8 words per block, out one checksum per row. */

/* One warp per block g < total_blk of all rows: its row by binary search. 256 threads. */
extern "C" __global__ void __launch_bounds__(256)
mfd_verify_rows_blocks(const uint8_t *base, const uint64_t *tab, uint32_t nrows,
                       uint64_t total_blk, mfd_xxh3_secret s, uint64_t *delta)
{
    uint64_t g = (uint64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (g >= total_blk || nrows == 0)
        return; /* whole warps only: g is uniform within a warp */
    uint32_t lo = 0, hi = nrows - 1; /* the last row whose first block is ≤ g */
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo + 1) / 2;
        if (tab[3 * mid + 2] <= g)
            lo = mid;
        else
            hi = mid - 1;
    }
    const uint64_t *row = reinterpret_cast<const uint64_t *>(base + tab[3 * lo]);
    uint64_t n = g - tab[3 * lo + 2];
    const param_secret sec{s};
    uint64_t r = xxh3_block(sec, [&](uint32_t w) { return row_word(row, n * 128 + w); });
    if ((threadIdx.x & 31) < 8)
        delta[g * 8 + acc_lane()] = r;
}

/* One warp (block) per row r < gridDim.x: out[r]. 32 threads. */
extern "C" __global__ void __launch_bounds__(32)
mfd_verify_rows_final(const uint8_t *base, const uint64_t *tab, mfd_xxh3_secret s,
                      const uint64_t *delta, uint64_t *out)
{
    uint32_t r = blockIdx.x;
    const uint64_t *row = reinterpret_cast<const uint64_t *>(base + tab[3 * r]);
    uint64_t len = tab[3 * r + 1];
    const param_secret sec{s};
    uint64_t v = row_sum(sec, row, len, (len - 1) / 1024, delta + tab[3 * r + 2] * 8);
    if (threadIdx.x == 0)
        out[r] = v;
}
