/* extract — the CUDA mf_extract (mapflow_kernels_cuda.h; spec: mf_extract_ref).
 *
 * Six stream-ordered launches, each over (query block i, head h) or one row:
 *   lse      only when no LSE is given: online max / sum of the scaled scores;
 *   mass     mass[h][i][j] = mean over the block's rows of Σ exp(s − LSE) in key block j
 *            (sampled_mass with MF_EXTRACT_SAMPLE: the block's sampled rows only);
 *   select   Top-P per (h, i) (sorted in shared memory), head bits OR-ed into hm[i][j];
 *   layout   per row: union columns, col_off, masks, masses, header, model, tokens;
 *   tiles    per (h, i): P recomputed on the kept blocks only, per-tile max, encoded
 *            straight into the row (prob codecs);
 *   checksum per row: XXH3-64 by one warp (kernels/xxh3.cuh, the daemon's verifier's too).
 * mf_export_cuda runs the fused forward (attn_core.cu: O, LSE and the masses in one pass)
 * and then the same select / layout / tiles / checksum launches on its masses.
 * Nothing N×N is stored: scratch is Hq·nq·i1 masses, nq·i1 masks and entry offsets. */
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "attn_core.cuh"
#include "dev_cache.cuh"
#include "mf_cuda_common.cuh"
#include "mf_hash.h"
#include "xxh3.cuh"

using namespace mfc;

namespace {

struct ext_params {
    const void *q, *k;
    float *lse;            /* LSE used (given or computed) */
    float *mass;           /* mass[h][k][j] at mass + h·mass_hs + k·mass_rs + j, k = i − i0 */
    size_t mass_hs, mass_rs;
    unsigned long long *hm; /* [nq][i1] head bits */
    uint32_t *ceoff;       /* [nq][i1] col_off of the column holding j */
    uint8_t *const *rows;  /* [nq] */
    const uint64_t *caps;  /* [nq] */
    uint64_t *sizes;       /* [nq] */
    uint32_t *failed;
    uint8_t *rowok;        /* [nq] */
    const uint8_t *hashes; /* [nq][32]: parent, hash (LE) */
    const uint32_t *tokens; /* [nq][B] */
    const char *model;
    uint32_t model_len, layer, codec, bsz;
    uint32_t n, hq, hkv, i0, i1;
    uint32_t stride, offset; /* the query row sample (MF_EXTRACT_SAMPLE); 1, 0 = every row */
    float top_p, scale_log2;
};

__constant__ uint64_t c_secret[XXH_SECRET_DEFAULT_SIZE / 8];

__device__ __forceinline__ void block_of(const ext_params &p, uint32_t &i, uint32_t &h)
{
    uint32_t nq = p.i1 - p.i0;
    i = p.i0 + (nq - 1 - blockIdx.x / p.hq); /* largest blocks first */
    h = blockIdx.x % p.hq;
}

template <class S> __device__ __forceinline__ typename S::T *smem_tiles()
{
    extern __shared__ __align__(16) uint8_t smem[];
    return reinterpret_cast<typename S::T *>(smem);
}

/* Block masses of (head h, query block i0 + k), indexed by key block j. */
__device__ __forceinline__ float *mass_row(const ext_params &p, uint32_t h, uint32_t k)
{
    return p.mass + (size_t)h * p.mass_hs + (size_t)k * p.mass_rs;
}

/* Q tile of (block i, head h) into shared memory and this warp's fragments. */
template <class S>
__device__ __forceinline__ void q_setup(const ext_params &p, typename S::T *qs, uint32_t i,
                                        uint32_t h, uint32_t qf[][4])
{
    load_tile<S>(qs, static_cast<const typename S::T *>(p.q), i * S::B, p.n, p.hq, h);
    cp_commit();
    cp_wait<0>();
    __syncthreads();
    load_q_frags<S>(qf, qs);
}

template <class S> __global__ void __launch_bounds__(S::THREADS) lse_kernel(ext_params p)
{
    typedef typename S::T T;
    T *qs = smem_tiles<S>(), *ks = qs + S::TILE;
    uint32_t i, h, qf[S::D / 16][4];
    block_of(p, i, h);
    q_setup<S>(p, qs, i, h, qf);
    float m[2] = { -INFINITY, -INFINITY }, l[2] = { 0.0f, 0.0f };
    kv_loop<S, false>(ks, nullptr, static_cast<const T *>(p.k), nullptr, p.n, p.hkv,
                      h / (p.hq / p.hkv), (int)i + 1, [](int x) { return (uint32_t)x; },
                      [&](const T *kt, const T *, uint32_t j, int) {
                          float s[S::B / 8][4], alpha[2];
                          scores<S>(s, qf, kt, i, j, p.scale_log2);
                          softmax_step<S>(s, m, l, alpha);
                      });
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float lt = quad_sum(l[r]);
        uint32_t row = i * S::B + w * 16 + (lane >> 2) + r * 8;
        if ((lane & 3) == 0)
            p.lse[(size_t)h * p.n + row] = (m[r] + log2f(lt)) * MF_LN2;
    }
}

/* This thread's two rows' LSE, in log2 units. */
template <class S>
__device__ __forceinline__ void row_lse2(const ext_params &p, uint32_t i, uint32_t h,
                                         float l2[2])
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int r = 0; r < 2; r++)
        l2[r] = p.lse[(size_t)h * p.n + i * S::B + w * 16 + (lane >> 2) + r * 8] * MF_LOG2E;
}

template <class S> __global__ void __launch_bounds__(S::THREADS) mass_kernel(ext_params p)
{
    typedef typename S::T T;
    __shared__ float part[S::WARPS];
    T *qs = smem_tiles<S>(), *ks = qs + S::TILE;
    uint32_t i, h, qf[S::D / 16][4];
    block_of(p, i, h);
    q_setup<S>(p, qs, i, h, qf);
    float l2[2];
    row_lse2<S>(p, i, h, l2);
    float *out = mass_row(p, h, i - p.i0);
    kv_loop<S, false>(ks, nullptr, static_cast<const T *>(p.k), nullptr, p.n, p.hkv,
                      h / (p.hq / p.hkv), (int)i + 1, [](int x) { return (uint32_t)x; },
                      [&](const T *kt, const T *, uint32_t j, int) {
                          float s[S::B / 8][4], sum = 0.0f;
                          scores<S>(s, qf, kt, i, j, p.scale_log2);
#pragma unroll
                          for (int nt = 0; nt < S::B / 8; nt++)
#pragma unroll
                              for (int c = 0; c < 4; c++)
                                  sum += exp2f(s[nt][c] - l2[c >> 1]);
                          for (int o = 16; o > 0; o >>= 1)
                              sum += __shfl_xor_sync(0xffffffffu, sum, o);
                          if ((threadIdx.x & 31) == 0)
                              part[threadIdx.x >> 5] = sum;
                          __syncthreads();
                          if (threadIdx.x == 0) {
                              float t = 0.0f;
                              for (int x = 0; x < S::WARPS; x++)
                                  t += part[x];
                              out[j] = t / S::B;
                          }
                      });
}

/* mass_kernel over a strided sample of query rows (MF_EXTRACT_SAMPLE, stride > 1): one CTA
 * gathers the R = B / stride sampled rows of `stride` consecutive query blocks into one
 * B-row Q tile (tile row x ↔ query block c0 + x / R, row offset + (x % R)·stride), so the
 * grid, and with it the score work, shrinks by the stride. Per key block each row's sum
 * goes to shared memory and is reduced, in row order, over the rows of its own block. */
template <class S>
__global__ void __launch_bounds__(S::THREADS) sampled_mass_kernel(ext_params p)
{
    typedef typename S::T T;
    constexpr int CH = S::D / 8; /* 16-byte chunks per row */
    __shared__ float rsum[S::B];
    T *qs = smem_tiles<S>(), *ks = qs + S::TILE;
    const uint32_t st = p.stride, R = S::B / st, ncta = (p.i1 - p.i0 + st - 1) / st;
    const uint32_t c = ncta - 1 - blockIdx.x / p.hq, h = blockIdx.x % p.hq; /* largest first */
    const uint32_t b0 = p.i0 + c * st, bl = min(p.i1, b0 + st) - 1; /* this CTA's blocks */
    const T *Q = static_cast<const T *>(p.q);
    for (int x = threadIdx.x; x < S::B * CH; x += S::THREADS) {
        uint32_t r = x / CH, blk = b0 + r / R;
        bool ok = blk <= bl; /* the last CTA may have fewer than `stride` blocks */
        uint32_t gr = ok ? blk * S::B + p.offset + (r % R) * st : 0;
        cp16(qs + r * S::LD + (x % CH) * 8, Q + ((size_t)gr * p.hq + h) * S::D + (x % CH) * 8,
             ok ? 16 : 0);
    }
    cp_commit();
    cp_wait<0>();
    __syncthreads();
    uint32_t qf[S::D / 16][4];
    load_q_frags<S>(qf, qs);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float l2[2];
    uint32_t grow[2];
    bool valid[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        uint32_t x = w * 16 + (lane >> 2) + r * 8, blk = b0 + x / R;
        valid[r] = blk <= bl;
        grow[r] = blk * S::B + p.offset + (x % R) * st;
        l2[r] = valid[r] ? p.lse[(size_t)h * p.n + grow[r]] * MF_LOG2E : 0.0f;
    }
    /* keys past the warp's last query block are all above the diagonal: skip their MMAs */
    const uint32_t wlast = min(bl, b0 + (uint32_t)(w * 16 + 15) / R);
    kv_loop<S, false>(
        ks, nullptr, static_cast<const T *>(p.k), nullptr, p.n, p.hkv, h / (p.hq / p.hkv),
        (int)bl + 1, [](int x) { return (uint32_t)x; },
        [&](const T *kt, const T *, uint32_t j, int) {
            float sum[2] = { 0.0f, 0.0f };
            if (j <= wlast) { /* warp-uniform */
                float s[S::B / 8][4];
                qk<S>(s, qf, kt);
#pragma unroll
                for (int nt = 0; nt < S::B / 8; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        uint32_t key = j * S::B + nt * 8 + (lane & 3) * 2 + (e & 1);
                        int r = e >> 1;
                        if (valid[r] && key <= grow[r])
                            sum[r] += exp2f(s[nt][e] * p.scale_log2 - l2[r]);
                    }
            }
#pragma unroll
            for (int r = 0; r < 2; r++) {
                float t = quad_sum(sum[r]);
                if ((lane & 3) == 0)
                    rsum[w * 16 + (lane >> 2) + r * 8] = t;
            }
            __syncthreads();
            uint32_t blk = b0 + threadIdx.x;
            if (threadIdx.x < st && blk <= bl && j <= blk) {
                float t = 0.0f;
                for (uint32_t m = 0; m < R; m++)
                    t += rsum[threadIdx.x * R + m];
                mass_row(p, h, blk - p.i0)[j] = t / R;
            }
        });
}

/* Top-P per (head, query block): head bit h into hm[i][j] for every kept j. */
__global__ void select_kernel(ext_params p)
{
    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ double s_total;
    __shared__ int s_kept;
    uint32_t i, h;
    block_of(p, i, h);
    uint32_t k = i - p.i0;
    const float *mass = mass_row(p, h, k);
    unsigned long long *hm = p.hm + (size_t)k * p.i1, bit = 1ull << h;
    double *cm = reinterpret_cast<double *>(smem);
    uint32_t *cj = reinterpret_cast<uint32_t *>(cm + MF_CUDA_MAX_BLOCKS);
    int n = i > 0 ? (int)i - 1 : 0; /* candidates other than 0 and i */
    for (int x = threadIdx.x; x < n; x += blockDim.x) {
        cm[x] = (double)mass[x + 1];
        cj[x] = x + 1;
    }
    if (threadIdx.x == 0) {
        double t = 0.0; /* in j order, as the reference sums */
        for (uint32_t j = 0; j <= i; j++)
            t += (double)mass[j];
        s_total = t;
        atomicOr(&hm[0], bit);
        if (i > 0)
            atomicOr(&hm[i], bit);
    }
    __syncthreads();
    double acc0 = (double)mass[0] + (i > 0 ? (double)mass[i] : 0.0);
    if (p.top_p >= 1.0f) {
        for (int x = threadIdx.x; x < n; x += blockDim.x)
            atomicOr(&hm[cj[x]], bit);
        return;
    }
    if (n == 0)
        return;
    int kept = topp_sorted(cm, cj, n, acc0, (double)p.top_p * s_total, &s_kept);
    for (int x = threadIdx.x; x < kept; x += blockDim.x)
        atomicOr(&hm[cj[x]], bit);
}

/* Per row: structure, masses, header; zeroes everything before the tiles. */
__global__ void __launch_bounds__(256) layout_kernel(ext_params p)
{
    __shared__ uint32_t s_cols[257], s_ents[257];
    uint32_t k = blockIdx.x, i = p.i0 + k, nb = i + 1;
    const unsigned long long *hm = p.hm + (size_t)k * p.i1;
    int t = threadIdx.x;
    uint32_t per = (nb + 255) / 256, j0 = min(nb, t * per), j1 = min(nb, j0 + per);
    uint32_t nc = 0, ne = 0;
    for (uint32_t j = j0; j < j1; j++)
        if (hm[j]) {
            nc++;
            ne += __popcll(hm[j]);
        }
    s_cols[t + 1] = nc;
    s_ents[t + 1] = ne;
    __syncthreads();
    if (t == 0) { /* inclusive scan into [1..256]; [0] = 0 */
        s_cols[0] = s_ents[0] = 0;
        for (int x = 1; x <= 256; x++) {
            s_cols[x] += s_cols[x - 1];
            s_ents[x] += s_ents[x - 1];
        }
    }
    __syncthreads();
    uint32_t n_cols = s_cols[256], n_ent = s_ents[256];
    row_offsets lo = row_layout(p.codec, p.bsz, n_cols, n_ent, p.model_len);
    p.sizes[k] = lo.total;
    if (lo.total > p.caps[k] || lo.total > MF_ROW_MAX_BYTES) {
        if (t == 0) {
            atomicMin(p.failed, i);
            p.rowok[k] = 0;
        }
        return;
    }
    if (t == 0)
        p.rowok[k] = 1;
    uint8_t *row = p.rows[k];
    /* Zero header, padding, masses and scales (16-byte stores; offsets are 16-aligned). */
    for (uint64_t x = t; x < lo.tiles / 16; x += blockDim.x)
        reinterpret_cast<uint4 *>(row)[x] = make_uint4(0, 0, 0, 0);
    __syncthreads();
    uint32_t *cols = reinterpret_cast<uint32_t *>(row + lo.cols);
    uint32_t *coff = reinterpret_cast<uint32_t *>(row + lo.col_off);
    unsigned long long *hmask = reinterpret_cast<unsigned long long *>(row + lo.head_mask);
    uint8_t *mass_b = row + lo.mass;
    uint32_t c = s_cols[t], e = s_ents[t];
    for (uint32_t j = j0; j < j1; j++) {
        unsigned long long m = hm[j];
        if (!m)
            continue;
        cols[c] = j;
        coff[c] = e;
        hmask[c] = m;
        p.ceoff[(size_t)k * p.i1 + j] = e;
        for (unsigned long long r = m; r; r &= r - 1) {
            uint32_t h = __ffsll((long long)r) - 1;
            float ms = mass_row(p, h, k)[j];
            mass_b[e++] = mass_encode(fminf(fmaxf(ms, 0.0f), 1.0f));
        }
        c++;
    }
    for (uint32_t x = t; x < p.bsz; x += blockDim.x)
        reinterpret_cast<uint32_t *>(row + lo.tokens)[x] = p.tokens[(size_t)k * p.bsz + x];
    for (uint32_t x = t; x < p.model_len; x += blockDim.x)
        row[lo.model + x] = (uint8_t)p.model[x];
    if (t < 32)
        row[offsetof(mf_row_header_t, parent) + t] = p.hashes[(size_t)k * 32 + t];
    if (t == 0) {
        mf_row_header_t *hd = reinterpret_cast<mf_row_header_t *>(row);
        hd->magic = MF_ROW_MAGIC;
        hd->version = MF_ROW_VERSION;
        hd->codec = (uint8_t)p.codec;
        hd->model_len = (uint8_t)p.model_len;
        hd->checksum = 0;
        hd->total_size = (uint32_t)lo.total;
        hd->layer = p.layer;
        hd->block_index = i;
        hd->block_size = (uint16_t)p.bsz;
        hd->n_heads = (uint16_t)p.hq;
        hd->n_cols = n_cols;
        hd->n_entries = n_ent;
        hd->top_p = p.top_p;
        hd->flags = 0;
    }
}

/* Codec of one probability (mf_tile_encode's per-element rule); m = tile max. */
__device__ __forceinline__ uint8_t enc8(uint32_t codec, float x, float m)
{
    if (!(m > 0.0f) || !(x > 0.0f))
        return 0;
    if (codec == MF_CODEC_FP8_E4M3)
        return (uint8_t)__nv_cvt_float_to_fp8(x * (448.0f / m), __NV_SATFINITE, __NV_E4M3);
    if (x < 0.5f * (m * exp2f(-254.0f / 16.0f)))
        return 0;
    float q = rintf(255.0f + 16.0f * log2f(x / m));
    return (uint8_t)fminf(fmaxf(q, 1.0f), 255.0f);
}

/* Per (head, query block): recompute P on the kept blocks and encode the tiles. */
template <class S> __global__ void __launch_bounds__(S::THREADS) tile_kernel(ext_params p)
{
    typedef typename S::T T;
    __shared__ uint16_t s_list[MF_CUDA_MAX_BLOCKS];
    __shared__ float s_max[S::WARPS];
    __shared__ int s_cnt;
    T *qs = smem_tiles<S>(), *ks = qs + S::TILE;
    uint32_t i, h, qf[S::D / 16][4];
    block_of(p, i, h);
    uint32_t k = i - p.i0;
    if (!p.rowok[k])
        return;
    const unsigned long long *hm = p.hm + (size_t)k * p.i1;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (w == 0) { /* compact the kept j of head h, in order, with ballots */
        int cnt = 0;
        for (uint32_t base = 0; base <= i; base += 32) {
            uint32_t j = base + lane;
            bool kept = j <= i && ((hm[j] >> h) & 1ull);
            uint32_t bal = __ballot_sync(0xffffffffu, kept);
            if (kept)
                s_list[cnt + __popc(bal & ((1u << lane) - 1))] = (uint16_t)j;
            cnt += __popc(bal);
        }
        if (lane == 0)
            s_cnt = cnt;
    }
    q_setup<S>(p, qs, i, h, qf); /* has a barrier: s_list / s_cnt visible after it */
    float l2[2];
    row_lse2<S>(p, i, h, l2);
    uint8_t *row = p.rows[k];
    const mf_row_header_t *hd = reinterpret_cast<const mf_row_header_t *>(row);
    row_offsets lo = row_layout(p.codec, S::B, hd->n_cols, hd->n_entries, p.model_len);
    float *scales = reinterpret_cast<float *>(row + lo.scales);
    kv_loop<S, false>(
        ks, nullptr, static_cast<const T *>(p.k), nullptr, p.n, p.hkv, h / (p.hq / p.hkv),
        s_cnt, [&](int x) { return (uint32_t)s_list[x]; },
        [&](const T *kt, const T *, uint32_t j, int) {
            float s[S::B / 8][4], mx = 0.0f;
            scores<S>(s, qf, kt, i, j, p.scale_log2);
#pragma unroll
            for (int nt = 0; nt < S::B / 8; nt++)
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    s[nt][c] = fminf(exp2f(s[nt][c] - l2[c >> 1]), 1.0f);
                    mx = fmaxf(mx, s[nt][c]);
                }
            uint32_t e = p.ceoff[(size_t)k * p.i1 + j];
            e += __popcll(h ? (hm[j] & (~0ull >> (64 - h))) : 0ull);
            uint8_t *tile = row + lo.tiles + (uint64_t)e * lo.tile_bytes;
            if (codec_scales(p.codec)) {
                for (int o = 16; o > 0; o >>= 1)
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
                if (lane == 0)
                    s_max[w] = mx;
                __syncthreads();
                mx = 0.0f;
                for (int x = 0; x < S::WARPS; x++)
                    mx = fmaxf(mx, s_max[x]);
                if (threadIdx.x == 0)
                    scales[e] = mx;
            }
#pragma unroll
            for (int nt = 0; nt < S::B / 8; nt++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    int q = w * 16 + (lane >> 2) + r * 8, kk = nt * 8 + (lane & 3) * 2;
                    size_t at = (size_t)q * S::B + kk;
                    float a = s[nt][2 * r], b2 = s[nt][2 * r + 1];
                    if (p.codec == MF_CODEC_FP16) {
                        __half2 v = __floats2half2_rn(a, b2);
                        reinterpret_cast<__half2 *>(tile)[at / 2] = v;
                    } else if (p.codec == MF_CODEC_BF16) {
                        __nv_bfloat162 v = __floats2bfloat162_rn(a, b2);
                        reinterpret_cast<__nv_bfloat162 *>(tile)[at / 2] = v;
                    } else {
                        uint16_t v = (uint16_t)(enc8(p.codec, a, mx) |
                                                (enc8(p.codec, b2, mx) << 8));
                        reinterpret_cast<uint16_t *>(tile)[at / 2] = v;
                    }
                }
        });
}

/* ---- the seal: XXH3-64 of the row (kernels/xxh3.cuh), one warp a row -------------- */

struct const_secret { /* xxh3.cuh's secret accessor over c_secret */
    __device__ __forceinline__ uint64_t word(uint32_t i) const { return c_secret[i]; }
};

#define CK_RING 16 /* 1 KiB blocks in flight per row: the scrambles are serial, loads not */

/* Rows are > 240 bytes (header, tokens and one column alone are 288), so XXH3's long path
 * is the only one; their checksum field is already zero (layout_kernel). */
__global__ void __launch_bounds__(32) checksum_kernel(ext_params p)
{
    using namespace mfxxh3;
    __shared__ __align__(16) uint64_t ring[CK_RING][128];
    uint32_t k = blockIdx.x;
    if (!p.rowok[k])
        return;
    const uint8_t *row = p.rows[k];
    const uint64_t len = p.sizes[k];
    const uint64_t *w64 = reinterpret_cast<const uint64_t *>(row);
    const const_secret sec;
    int lane = threadIdx.x;
    uint64_t acc = xxh3_acc_init();
    uint64_t nblk = xxh3_full_blocks(len);
    auto issue = [&](uint64_t n) {
        if (n < nblk)
            for (int x = 0; x < 2; x++)
                cp16(&ring[n % CK_RING][(lane + 32 * x) * 2], row + n * 1024 + (lane + 32 * x) * 16,
                     16);
        cp_commit(); /* empty groups too: the wait count stays uniform */
    };
    for (uint64_t n = 0; n < CK_RING - 1; n++)
        issue(n);
    for (uint64_t n = 0; n < nblk; n++) {
        issue(n + CK_RING - 1);
        cp_wait<CK_RING - 1>();
        __syncwarp();
        const uint64_t *blk = ring[n % CK_RING];
        uint64_t delta = xxh3_block(sec, [&](uint32_t w) { return blk[w]; });
        __syncwarp();
        acc = xxh3_scramble(sec, acc + delta);
    }
    cp_wait<0>();
    acc += xxh3_partial(sec, [&](uint64_t wd) { return w64[nblk * 128 + wd]; },
                        xxh3_partial_words(len));
    acc += xxh3_last_stripe(sec, w64[(len - 64) / 8 + (lane & 7)]); /* len is 16-aligned */
    uint64_t r = xxh3_merge(sec, acc, len);
    if (lane == 0)
        reinterpret_cast<mf_row_header_t *>(p.rows[k])->checksum = r;
}

/* What the launches start from: masses (and the LSE) computed here from Q and K, or
 * given by the fused forward (mf_export_cuda). */
enum ext_from { FROM_QK, FROM_QK_LSE, FROM_MASSES };

template <class S> mf_status_t launch_qk(const ext_params &p, ext_from from, cudaStream_t st)
{
    size_t sm = 3 * S::TILE * sizeof(typename S::T);
    uint32_t grid = (p.i1 - p.i0) * p.hq;
    if (from == FROM_QK) {
        cudaFuncSetAttribute(lse_kernel<S>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
        lse_kernel<S><<<grid, S::THREADS, sm, st>>>(p);
    }
    if (from != FROM_MASSES && p.stride > 1) {
        uint32_t sgrid = (p.i1 - p.i0 + p.stride - 1) / p.stride * p.hq;
        cudaFuncSetAttribute(sampled_mass_kernel<S>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)sm);
        sampled_mass_kernel<S><<<sgrid, S::THREADS, sm, st>>>(p);
    } else if (from != FROM_MASSES) {
        cudaFuncSetAttribute(mass_kernel<S>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)sm);
        mass_kernel<S><<<grid, S::THREADS, sm, st>>>(p);
    }
    size_t sel = MF_CUDA_MAX_BLOCKS * (sizeof(double) + sizeof(uint32_t));
    cudaFuncSetAttribute(select_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sel);
    select_kernel<<<grid, 256, sel, st>>>(p);
    layout_kernel<<<p.i1 - p.i0, 256, 0, st>>>(p);
    if (p.codec != MF_CODEC_MASK) {
        cudaFuncSetAttribute(tile_kernel<S>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
        tile_kernel<S><<<grid, S::THREADS, sm, st>>>(p);
    }
    checksum_kernel<<<p.i1 - p.i0, 32, 0, st>>>(p);
    return MF_OK;
}

template <typename T> mf_status_t launch_t(const ext_params &p, ext_from from, uint32_t d,
                                           cudaStream_t st)
{
    switch (p.bsz * 1000 + d) {
    case 32064: return launch_qk<shape<32, 64, T>>(p, from, st);
    case 32128: return launch_qk<shape<32, 128, T>>(p, from, st);
    case 64064: return launch_qk<shape<64, 64, T>>(p, from, st);
    case 64128: return launch_qk<shape<64, 128, T>>(p, from, st);
    case 128064: return launch_qk<shape<128, 64, T>>(p, from, st);
    case 128128: return launch_qk<shape<128, 128, T>>(p, from, st);
    default: return MF_UNIMPLEMENTED;
    }
}

} /* namespace */

mf_status_t mfc::cuda_status(cudaError_t e, const char **why)
{
    if (e == cudaSuccess)
        return MF_OK;
    *why = cudaGetErrorString(e);
    return e == cudaErrorMemoryAllocation ? MF_RESOURCE_EXHAUSTED : MF_INTERNAL;
}

extern "C" mf_status_t mf_cuda_supported(uint32_t b, uint32_t d, mf_dtype_t dt, uint32_t n,
                                         const char **why)
{
    const char *dummy;
    if (!why)
        why = &dummy;
    *why = "";
    if (b != 32 && b != 64 && b != 128) {
        *why = "CUDA kernels support block sizes 32, 64 and 128";
        return MF_UNIMPLEMENTED;
    }
    if (d != 64 && d != 128) {
        *why = "CUDA kernels support head dims 64 and 128";
        return MF_UNIMPLEMENTED;
    }
    if (dt != MF_DTYPE_F16 && dt != MF_DTYPE_BF16) {
        *why = "CUDA kernels take F16 or BF16 tensors";
        return MF_UNIMPLEMENTED;
    }
    if (n < 1 || (n + b - 1) / b > MF_CUDA_MAX_BLOCKS) {
        *why = "CUDA kernels support at most 2048 query blocks";
        return MF_UNIMPLEMENTED;
    }
    return MF_OK;
}

/* The argument checks of mf_extract_cuda; *stride, *offset: the effective row sample. */
static mf_status_t ext_check(const mf_extract_cuda_args_t *a, uint32_t *stride,
                             uint32_t *offset, const char **why)
{
    mf_status_t st = mf_qkv_check(&a->src, 0, why);
    if (st != MF_OK)
        return st;
    st = mf_cuda_supported(a->block_size, a->src.head_dim, a->src.dtype, a->src.n_tokens, why);
    if (st != MF_OK)
        return st;
    if (!(a->top_p > 0.0f && a->top_p <= 1.0f)) {
        *why = "top_p must be in (0, 1]";
        return MF_INVALID_ARGUMENT;
    }
    if ((unsigned)a->codec >= MF_CODEC_COUNT) {
        *why = "unknown codec";
        return MF_INVALID_ARGUMENT;
    }
    if (a->i0 >= a->i1 || a->i1 > a->src.n_tokens / a->block_size) {
        *why = "block range must satisfy i0 < i1 <= N / B (full blocks only)";
        return MF_INVALID_ARGUMENT;
    }
    if (!a->model || !a->ns || !a->tokens || !a->rows || !a->caps || !a->sizes ||
        !a->failed_block) {
        *why = "model, namespace, tokens, row buffers, sizes and failed_block are required";
        return MF_INVALID_ARGUMENT;
    }
    size_t ml = strlen(a->model);
    if (ml < 1 || ml > MF_ROW_MAX_MODEL) {
        *why = "model id must be 1..255 bytes";
        return MF_INVALID_ARGUMENT;
    }
    for (uint32_t k = 0; k < a->i1 - a->i0; k++)
        if (!a->rows[k] || ((uintptr_t)a->rows[k] & (MF_ROW_ALIGN - 1))) {
            *why = "every row buffer must be present and 16-byte aligned";
            return MF_INVALID_ARGUMENT;
        }
    return mf_extract_options(a->fields, a->sample_stride, a->sample_offset, a->block_size,
                              stride, offset, why);
}

/* Masses and LSE the fused forward already computed (mf_export_cuda): device [Hq][N] LSE
 * and masses mass[h][i][j] at mass + h·hs + i·rs + j (absolute query block i). */
struct given_masses {
    float *lse, *mass;
    size_t hs, rs;
};

/* extract_run's scratch (constants, head masks, offsets; LSE and masses when computed
 * here): this launcher's table of dev_cache.cuh (MF_EXTRACT_CACHE=0: per call, as before). */
static dev_cache g_ext_cache[MAX_CACHED_DEVICES];

/* mf_extract_cuda's work after the argument checks; from the masses in g when given, else
 * from Q and K (and a->lse). The one selection / union / encoding / seal path. */
static mf_status_t extract_run(const mf_extract_cuda_args_t *a, const given_masses *g,
                               uint32_t stride, uint32_t offset, cudaStream_t s,
                               const char **why)
{
    static bool secret_set = false; /* same bytes every time: a benign race */
    mf_status_t st;
    if (!secret_set) {
        st = cuda_status(cudaMemcpyToSymbol(c_secret, XXH3_kSecret, sizeof(c_secret)), why);
        if (st != MF_OK)
            return st;
        secret_set = true;
    }
    const mf_qkv_t &q = a->src;
    uint32_t b = a->block_size, nq = a->i1 - a->i0, i1 = a->i1;
    size_t ml = strlen(a->model);
    /* Host-built constants: row pointers, caps, hashes, tokens, model; one copy. */
    scratch sc;
    size_t o_rows = sc.take(nq * sizeof(void *)), o_caps = sc.take(nq * 8),
           o_hash = sc.take(nq * 32), o_tok = sc.take((size_t)nq * b * 4), o_model = sc.take(ml);
    size_t host_bytes = sc.used;
    size_t o_lse = a->lse || g ? 0 : sc.take((size_t)q.n_q_heads * q.n_tokens * 4);
    size_t o_mass = a->mass_out || g ? 0 : sc.take((size_t)q.n_q_heads * nq * i1 * 4);
    size_t o_hm = sc.take((size_t)nq * i1 * 8), o_ce = sc.take((size_t)nq * i1 * 4),
           o_ok = sc.take(nq);
    static const char *const off[] = { "0" };
    int c = env_choice("MF_EXTRACT_CACHE", off, 1);
    if (c == -2) {
        *why = "MF_EXTRACT_CACHE must be 0 (or unset)";
        return MF_INVALID_ARGUMENT;
    }
    dev_cache *cache = dev_cache_of(g_ext_cache, c != 0);
    std::unique_lock<std::mutex> lock;
    if (cache)
        lock = std::unique_lock<std::mutex>(cache->mu);
    call_scratch cs;
    st = scratch_get(&cs, cache, sc.used, host_bytes, s, why);
    if (st != MF_OK)
        goto out;
    sc.base = cs.dev;
    {
        uint8_t *host = cs.host;
        for (uint32_t k = 0; k < nq; k++) {
            ((void **)(host + o_rows))[k] = a->rows[k];
            ((uint64_t *)(host + o_caps))[k] = a->caps[k];
        }
        mf_hash128_t hsh = mf_hash_root(b, a->ns, strlen(a->ns), a->model, ml);
        for (uint32_t x = 0; x < i1; x++) {
            mf_hash128_t next = mf_hash_next(hsh, a->tokens + (size_t)x * b, b);
            if (x >= a->i0) {
                mf_hash_to_le(hsh, host + o_hash + (size_t)(x - a->i0) * 32);
                mf_hash_to_le(next, host + o_hash + (size_t)(x - a->i0) * 32 + 16);
            }
            hsh = next;
        }
        memcpy(host + o_tok, a->tokens + (size_t)a->i0 * b, (size_t)nq * b * 4);
        memcpy(host + o_model, a->model, ml);
    }
    st = scratch_upload(&cs, host_bytes, s, why);
    if (st != MF_OK)
        goto out;
    {
        ext_params p;
        memset(&p, 0, sizeof(p));
        p.q = q.q;
        p.k = q.k;
        if (g) {
            p.lse = g->lse;
            p.mass = g->mass + (size_t)a->i0 * g->rs;
            p.mass_hs = g->hs;
            p.mass_rs = g->rs;
        } else {
            p.lse = a->lse ? (float *)a->lse : (float *)(sc.base + o_lse);
            p.mass = a->mass_out ? a->mass_out : (float *)(sc.base + o_mass);
            p.mass_hs = (size_t)nq * i1;
            p.mass_rs = i1;
        }
        p.hm = (unsigned long long *)(sc.base + o_hm);
        p.ceoff = (uint32_t *)(sc.base + o_ce);
        p.rows = (uint8_t *const *)(sc.base + o_rows);
        p.caps = (const uint64_t *)(sc.base + o_caps);
        p.sizes = a->sizes;
        p.failed = a->failed_block;
        p.rowok = sc.base + o_ok;
        p.hashes = sc.base + o_hash;
        p.tokens = (const uint32_t *)(sc.base + o_tok);
        p.model = (const char *)(sc.base + o_model);
        p.model_len = (uint32_t)ml;
        p.layer = a->layer;
        p.codec = a->codec;
        p.bsz = b;
        p.n = q.n_tokens;
        p.hq = q.n_q_heads;
        p.hkv = q.n_kv_heads;
        p.i0 = a->i0;
        p.i1 = i1;
        p.stride = stride;
        p.offset = offset;
        p.top_p = a->top_p;
        p.scale_log2 = MF_LOG2E / sqrtf((float)q.head_dim);
        if (!g) /* mass_kernel writes j ≤ i only; mass_out promises 0 above the diagonal */
            cudaMemsetAsync(p.mass, 0, (size_t)q.n_q_heads * nq * i1 * 4, s);
        cudaMemsetAsync(p.hm, 0, (size_t)nq * i1 * 8, s);
        cudaMemsetAsync(a->failed_block, 0xff, 4, s);
        ext_from from = g ? FROM_MASSES : a->lse ? FROM_QK_LSE : FROM_QK;
        st = q.dtype == MF_DTYPE_F16 ? launch_t<__half>(p, from, q.head_dim, s)
                                     : launch_t<__nv_bfloat16>(p, from, q.head_dim, s);
        if (st == MF_OK)
            st = cuda_status(cudaGetLastError(), why);
    }
out:
    scratch_put(&cs, s);
    return st;
}

extern "C" mf_status_t mf_extract_cuda(const mf_extract_cuda_args_t *a, mf_cuda_stream_t stream,
                                       const char **why)
{
    const char *dummy;
    if (!why)
        why = &dummy;
    *why = "";
    if (!a) {
        *why = "null arguments";
        return MF_INVALID_ARGUMENT;
    }
    uint32_t stride, offset;
    mf_status_t st = ext_check(a, &stride, &offset, why);
    if (st != MF_OK)
        return st;
    return extract_run(a, nullptr, stride, offset, stream, why);
}

extern "C" mf_status_t mf_export_cuda(const mf_export_cuda_args_t *a, mf_cuda_stream_t stream,
                                      const char **why)
{
    const char *dummy;
    if (!why)
        why = &dummy;
    *why = "";
    if (!a || !a->o) {
        *why = "arguments and the output O are required";
        return MF_INVALID_ARGUMENT;
    }
    const mf_extract_cuda_args_t *x = &a->ex;
    if (x->lse || x->mass_out) {
        *why = "export computes the LSE and masses itself: ex.lse and ex.mass_out must be NULL "
               "(use lse and mass)";
        return MF_INVALID_ARGUMENT;
    }
    uint32_t stride, offset;
    mf_status_t st = ext_check(x, &stride, &offset, why);
    if (st != MF_OK)
        return st;
    if (stride != 1) {
        *why = "the fused export computes exact masses: a sample stride other than 1 is refused";
        return MF_INVALID_ARGUMENT;
    }
    if (x->block_size != 64) {
        *why = "the fused export computes block masses for B = 64 only";
        return MF_UNIMPLEMENTED;
    }
    if (!x->src.v) {
        *why = "the fused export runs the layer's attention: V is required";
        return MF_INVALID_ARGUMENT;
    }
    if (a->o_dtype != MF_DTYPE_F32 && a->o_dtype != x->src.dtype) {
        *why = "o_dtype must be MF_DTYPE_F32 or the inputs' dtype";
        return MF_INVALID_ARGUMENT;
    }
    const mf_qkv_t &q = x->src;
    size_t nbm = q.n_tokens / 64, lse_n = (size_t)q.n_q_heads * q.n_tokens,
           mass_n = (size_t)q.n_q_heads * nbm * nbm;
    cudaStream_t s = stream;
    scratch sc;
    size_t o_lse = a->lse ? 0 : sc.take(lse_n * 4), o_mass = a->mass ? 0 : sc.take(mass_n * 4),
           core_n = a->scratch ? 0 : mf_attention_masses_scratch(q.n_tokens),
           o_core = sc.take(core_n);
    if (sc.used > 0) {
        st = cuda_status(cudaMallocAsync((void **)&sc.base, sc.used, s), why);
        if (st != MF_OK)
            return st;
    }
    given_masses g;
    g.lse = a->lse ? a->lse : (float *)(sc.base + o_lse);
    g.mass = a->mass ? a->mass : (float *)(sc.base + o_mass);
    g.hs = nbm * nbm;
    g.rs = nbm;
    /* one pass: O, LSE and the exact block masses; then the rows from those masses */
    /* the caller's scratch (checked there), else ours; core_n = 0 without a caller's
     * scratch: the device cannot be queried, and the call says why */
    void *core_scr = a->scratch ? a->scratch : core_n ? sc.base + o_core : NULL;
    size_t core_bytes = a->scratch ? a->scratch_bytes : core_n ? sc.used - o_core : 0;
    st = masses_run(&q, 64, a->o, a->o_dtype != MF_DTYPE_F32, g.lse, g.mass, core_scr,
                    core_bytes, stream, why);
    /* rows_stream: the rows' launches wait for the forward there, and `stream` is free
     * for the layer's next work at once (our scratch is then freed in the rows' order) */
    cudaStream_t rs = a->rows_stream ? (cudaStream_t)a->rows_stream : s;
    if (st == MF_OK && rs != s) {
        cudaEvent_t fwd;
        st = cuda_status(cudaEventCreateWithFlags(&fwd, cudaEventDisableTiming), why);
        if (st == MF_OK) {
            st = cuda_status(cudaEventRecord(fwd, s), why);
            if (st == MF_OK)
                st = cuda_status(cudaStreamWaitEvent(rs, fwd, 0), why);
            cudaEventDestroy(fwd); /* released once the wait is past it */
        }
    }
    if (st == MF_OK)
        st = extract_run(x, &g, 1, 0, rs, why);
    if (sc.base)
        cudaFreeAsync(sc.base, st == MF_OK ? rs : s);
    return st;
}
