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
 * The secret (192 bytes) is a kernel parameter filled by the host from xxhash.h, so no
 * module global has to be set. Self-contained: no runtime API, no headers beyond stdint.
 */
#include <stdint.h>

#define P32_1 0x9E3779B1ull
#define P32_2 0x85EBCA77ull
#define P32_3 0xC2B2AE3Dull
#define P64_1 0x9E3779B185EBCA87ull
#define P64_2 0xC2B2AE3D27D4EB4Full
#define P64_3 0x165667B19E3779F9ull
#define P64_4 0x85EBCA77C2B2AE63ull
#define P64_5 0x27D4EB2F165667C5ull

struct mfd_xxh3_secret {
    uint64_t w[24]; /* XXH3_kSecret, little-endian words */
};

__device__ __forceinline__ uint64_t mul32(uint64_t x)
{
    return (uint64_t)(uint32_t)x * (uint64_t)(uint32_t)(x >> 32);
}

/* Secret bytes at an unaligned offset, little-endian. */
__device__ __forceinline__ uint64_t sec_at(const mfd_xxh3_secret &s, uint32_t off)
{
    uint64_t v = 0;
    for (int x = 7; x >= 0; x--)
        v = (v << 8) | (uint8_t)(s.w[(off + x) >> 3] >> (8 * ((off + x) & 7)));
    return v;
}

/* Row word w (8 bytes), the checksum field read as zero. */
__device__ __forceinline__ uint64_t row_word(const uint64_t *row, uint64_t w)
{
    return w == 1 ? 0 : row[w];
}

/* Lane a = lane % 8 gets Σ self over the lanes of its a, plus Σ data of lanes a ^ 1. */
__device__ __forceinline__ uint64_t lane_reduce(uint64_t self, uint64_t other)
{
    self += __shfl_xor_sync(0xffffffffu, self, 8);
    self += __shfl_xor_sync(0xffffffffu, self, 16);
    other += __shfl_xor_sync(0xffffffffu, other, 8);
    other += __shfl_xor_sync(0xffffffffu, other, 16);
    return self + __shfl_xor_sync(0xffffffffu, other, 1);
}

/* delta[n][8]: block n's accumulator increments (its 16 stripes), n < nblk. 256 threads. */
extern "C" __global__ void __launch_bounds__(256)
mfd_verify_blocks(const uint64_t *row, uint64_t nblk, mfd_xxh3_secret s, uint64_t *delta)
{
    uint64_t n = (uint64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (n >= nblk)
        return; /* whole warps only: n is uniform within a warp */
    int lane = threadIdx.x & 31, a = lane & 7;
    uint64_t self = 0, other = 0;
#pragma unroll
    for (int m = 0; m < 4; m++) {
        uint32_t w = lane + 32 * m; /* stripe w / 8, word a of it */
        uint64_t d = row_word(row, n * 128 + w);
        self += mul32(d ^ s.w[(w >> 3) + a]);
        other += d;
    }
    uint64_t r = lane_reduce(self, other);
    if (lane < 8)
        delta[n * 8 + a] = r;
}

/* The checksum of the whole row (len > 240) into *out. One warp. */
extern "C" __global__ void __launch_bounds__(32)
mfd_verify_final(const uint64_t *row, uint64_t len, uint64_t nblk, mfd_xxh3_secret s,
                 const uint64_t *delta, uint64_t *out)
{
    int lane = threadIdx.x, a = lane & 7;
    const uint64_t init[8] = {P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1};
    uint64_t acc = init[a];
    const uint64_t key = s.w[16 + a]; /* scramble key: the secret's last 64 bytes */
    uint64_t n = 0;
    for (; n + 8 <= nblk; n += 8) { /* loads of 8 blocks ahead of their serial use */
        uint64_t d[8];
#pragma unroll
        for (int x = 0; x < 8; x++)
            d[x] = delta[(n + x) * 8 + a];
#pragma unroll
        for (int x = 0; x < 8; x++) {
            acc += d[x];
            acc ^= acc >> 47;
            acc ^= key;
            acc *= P32_1;
        }
    }
    for (; n < nblk; n++) {
        acc += delta[n * 8 + a];
        acc ^= acc >> 47;
        acc ^= key;
        acc *= P32_1;
    }
    /* The partial last block: whole stripes before the last byte. */
    uint64_t words = ((len - 1) - 1024 * nblk) / 64 * 8, self = 0, other = 0;
    for (uint64_t wd = lane; wd < words; wd += 32) {
        uint64_t v = row_word(row, nblk * 128 + wd);
        self += mul32(v ^ s.w[(wd >> 3) + a]);
        other += v;
    }
    acc += lane_reduce(self, other);
    /* The last stripe (its 64 bytes end at len; byte loads: len need not be 8-aligned). */
    {
        const uint8_t *p = reinterpret_cast<const uint8_t *>(row) + len - 64 + 8 * a;
        uint64_t v = 0;
        for (int x = 7; x >= 0; x--)
            v = (v << 8) | p[x];
        uint64_t k = v ^ sec_at(s, 192 - 64 - 7 + 8 * a);
        acc += mul32(k) + __shfl_xor_sync(0xffffffffu, v, 1);
    }
    uint64_t all[8];
#pragma unroll
    for (int x = 0; x < 8; x++)
        all[x] = __shfl_sync(0xffffffffu, acc, x);
    if (lane == 0) {
        uint64_t r = len * P64_1;
        for (int x = 0; x < 4; x++) {
            uint64_t lhs = all[2 * x] ^ sec_at(s, 11 + 16 * x);
            uint64_t rhs = all[2 * x + 1] ^ sec_at(s, 11 + 16 * x + 8);
            r += (lhs * rhs) ^ __umul64hi(lhs, rhs);
        }
        r ^= r >> 37;
        r *= 0x165667919E3779F9ull;
        r ^= r >> 32;
        *out = r;
    }
}
