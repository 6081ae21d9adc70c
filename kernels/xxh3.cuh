/*
 * xxh3 — the one device implementation of XXH3-64 (default secret, seed 0, long inputs:
 * > 240 bytes) that MapFlow's kernels seal and check rows with: kernels/extract.cu's seal
 * and daemon/gpu_verify.cu's row checksum both call these pieces, so the two cannot drift
 * apart; both must equal the host's XXH3_64bits (proto/mf_row.c row_checksum), which
 * tests/gpu/gpu_check.c (extract's rows) and tests/gpu/tier_smoke.sh (the daemon) check.
 *
 * One warp hashes one input. XXH3's long path keeps 8 accumulators; here lane l works on
 * accumulator a = l % 8, and each 1 KiB block (16 stripes of 64 bytes) is 128 words, 4 per
 * lane. Accumulation is additive within a block, only the scramble between blocks is
 * serial, so a caller may compute block deltas in any order (gpu_verify: one warp per
 * block) and fold them afterwards. The pieces, in XXH3's order:
 *   xxh3_acc_init    the lane's initial accumulator;
 *   xxh3_block       a block's increment for the lane's accumulator (whole warp);
 *   xxh3_scramble    after every full block;
 *   xxh3_partial     the whole stripes of the last, partial block (whole warp);
 *   xxh3_last_stripe the increment of the 64 bytes that end the input (whole warp);
 *   xxh3_merge       the 64-bit result from the 8 accumulators (whole warp; every lane).
 * "Whole warp": all 32 lanes call it together (it shuffles). Word loads are the caller's
 * (a functor word(w) → little-endian 64-bit word w of the block or of the partial block),
 * so a caller may read through shared memory, read a field as zero, etc.
 *
 * The secret is given by an accessor with word(i) → little-endian word i (i < 24) of
 * XXH3_kSecret: __constant__ memory in extract, a kernel parameter in the daemon's PTX
 * (which is loaded with cuModuleLoadData and sets no module globals).
 * Self-contained: stdint only, no runtime API (the daemon builds it to PTX alone).
 * Device functions only; any thread of any kernel.
 */
#ifndef MF_XXH3_CUH
#define MF_XXH3_CUH

#include <stdint.h>

namespace mfxxh3 {

constexpr uint64_t kP32_1 = 0x9E3779B1ull, kP32_2 = 0x85EBCA77ull, kP32_3 = 0xC2B2AE3Dull;
constexpr uint64_t kP64_1 = 0x9E3779B185EBCA87ull, kP64_2 = 0xC2B2AE3D27D4EB4Full,
                   kP64_3 = 0x165667B19E3779F9ull, kP64_4 = 0x85EBCA77C2B2AE63ull,
                   kP64_5 = 0x27D4EB2F165667C5ull;
constexpr uint32_t kSecretBytes = 192; /* XXH_SECRET_DEFAULT_SIZE */
constexpr uint64_t kBlockBytes = 1024; /* 16 stripes of 64 bytes */

__device__ __forceinline__ int acc_lane() { return threadIdx.x & 7; }

__device__ __forceinline__ uint64_t mul32(uint64_t x)
{
    return (uint64_t)(uint32_t)x * (uint64_t)(uint32_t)(x >> 32);
}

/* Secret bytes [off, off + 8), little-endian, off < 184 (unaligned reads of the merge and
 * last-stripe keys). */
template <class Sec> __device__ __forceinline__ uint64_t secret_at(const Sec &sec, uint32_t off)
{
    uint32_t w = off >> 3, sh = (off & 7) * 8;
    uint64_t lo = sec.word(w);
    return sh ? (lo >> sh) | (sec.word(w + 1) << (64 - sh)) : lo;
}

/* Lane a = lane % 8 gets Σ self over the lanes of its a, plus Σ other of the lanes of a ^ 1
 * (XXH3 adds a stripe's word a into accumulator a ^ 1). */
__device__ __forceinline__ uint64_t lane_reduce(uint64_t self, uint64_t other)
{
    self += __shfl_xor_sync(0xffffffffu, self, 8);
    self += __shfl_xor_sync(0xffffffffu, self, 16);
    other += __shfl_xor_sync(0xffffffffu, other, 8);
    other += __shfl_xor_sync(0xffffffffu, other, 16);
    return self + __shfl_xor_sync(0xffffffffu, other, 1);
}

__device__ __forceinline__ uint64_t xxh3_acc_init()
{
    const uint64_t init[8] = { kP32_3, kP64_1, kP64_2, kP64_3, kP64_4, kP32_2, kP64_5, kP32_1 };
    return init[acc_lane()];
}

/* One full block: word(w), w < 128, is the block's word w; this lane reads words
 * lane + 32 m (stripe w / 8, word a of it, secret word w / 8 + a). */
template <class Sec, class Word>
__device__ __forceinline__ uint64_t xxh3_block(const Sec &sec, const Word &word)
{
    int lane = threadIdx.x & 31, a = lane & 7;
    uint64_t self = 0, other = 0;
#pragma unroll
    for (int m = 0; m < 4; m++) {
        uint32_t w = lane + 32 * m;
        uint64_t d = word(w);
        self += mul32(d ^ sec.word((w >> 3) + a));
        other += d;
    }
    return lane_reduce(self, other);
}

/* The scramble after each full block (key: the secret's last 64 bytes). */
template <class Sec> __device__ __forceinline__ uint64_t xxh3_scramble(const Sec &sec, uint64_t acc)
{
    acc ^= acc >> 47;
    acc ^= sec.word(16 + acc_lane());
    return acc * kP32_1;
}

/* Whole stripes of the last block before the input's last byte: `words` (a multiple of
 * 8, < 128) words from word(0). */
template <class Sec, class Word>
__device__ __forceinline__ uint64_t xxh3_partial(const Sec &sec, const Word &word, uint64_t words)
{
    int lane = threadIdx.x & 31, a = lane & 7;
    uint64_t self = 0, other = 0;
    for (uint64_t wd = lane; wd < words; wd += 32) {
        uint64_t v = word(wd);
        self += mul32(v ^ sec.word((uint32_t)(wd >> 3) + a));
        other += v;
    }
    return lane_reduce(self, other);
}

/* The last stripe: v = word a (this lane's acc_lane) of the 64 bytes ending the input. */
template <class Sec> __device__ __forceinline__ uint64_t xxh3_last_stripe(const Sec &sec, uint64_t v)
{
    uint64_t key = v ^ secret_at(sec, kSecretBytes - 64 - 7 + 8 * acc_lane());
    return mul32(key) + __shfl_xor_sync(0xffffffffu, v, 1);
}

/* Words and full blocks of an input of len bytes (len > 240): the last block is the one
 * holding byte len − 1, so an input of exactly n KiB has n − 1 full blocks. */
__device__ __forceinline__ uint64_t xxh3_full_blocks(uint64_t len) { return (len - 1) / kBlockBytes; }
__device__ __forceinline__ uint64_t xxh3_partial_words(uint64_t len)
{
    return ((len - 1) - kBlockBytes * xxh3_full_blocks(len)) / 64 * 8;
}

/* The result from the lanes' accumulators (lanes 0..7 hold acc 0..7); every lane gets it. */
template <class Sec> __device__ __forceinline__ uint64_t xxh3_merge(const Sec &sec, uint64_t acc, uint64_t len)
{
    uint64_t all[8];
#pragma unroll
    for (int x = 0; x < 8; x++)
        all[x] = __shfl_sync(0xffffffffu, acc, x);
    uint64_t r = len * kP64_1;
#pragma unroll
    for (int x = 0; x < 4; x++) {
        uint64_t lhs = all[2 * x] ^ secret_at(sec, 11 + 16 * x);
        uint64_t rhs = all[2 * x + 1] ^ secret_at(sec, 11 + 16 * x + 8);
        r += (lhs * rhs) ^ __umul64hi(lhs, rhs);
    }
    r ^= r >> 37;
    r *= 0x165667919E3779F9ull;
    return r ^ (r >> 32);
}

} /* namespace mfxxh3 */

#endif /* MF_XXH3_CUH */
