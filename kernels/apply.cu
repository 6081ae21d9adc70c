/* apply — the CUDA mf_apply (mapflow_kernels_cuda.h; spec: mf_apply_ref).
 *
 * One launch per layer, one CTA per (query block i, target head t), largest i first. The
 * CTA's mode is its head's (prob / mask / compute), or compute when block i is exact:
 *  - prob: the row's columns whose head mask meets {s : W[t,s] > 0} are walked once;
 *    each warp reads its 16 rows of every present source tile straight from the row
 *    (8 or 16 bytes a load), decodes and mixes them with W in registers (the mixed tile
 *    is never stored), and multiplies by V (tensor cores). The 8 consecutive keys a thread
 *    loads are spread over the A fragment's positions; V is read with the same key
 *    permutation (pv<S, true>), so no shuffle is needed. Output / kept mixed mass.
 *  - mask: mixed masses per column in double (bit-exact with the reference), Top-P
 *    sorted in shared memory, then attention over the kept blocks (online softmax).
 *  - compute: the same attention loop over every block j ≤ i.
 * Rows whose header disagrees are counted in bad_rows and computed exactly.
 * O is stored as float or, with o_dtype, in the target's dtype, by every path through the
 * one store (store_o_row; the core's epilogue uses it too): rn of the same fp32 value.
 * With the core (MF_APPLY_IMPL_CORE, sm_90, B ∈ {64, 128}) this kernel runs prob blocks only
 * (p.core): prepass_kernel decides each (query block, head)'s mode the same way, writes the
 * mask / compute blocks' key-block bitmaps for the sm_90a core (attn_core.cu) and counts the
 * bad rows; in a layer with both, v2 runs on an internal per-device stream forked from the
 * caller's and joined back before the call's work ends on the caller's stream. At B = 64
 * (unless MF_APPLY_PROB=v2) the prob blocks run on the core's prob kernel (attn_prob.cuh)
 * on that stream first, and this kernel then computes only what it left (p.pstate: rows
 * of kept mass 0 exactly, blocks whose row is too long for its list), walking that
 * kernel's work list (p.wl). A layer of prob heads only with no exact block runs neither
 * the pre-pass nor the core: the prob kernel and this kernel's follow-up (the blocks of
 * bad rows are on the work list then, and counted here). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <mutex>

#include "apply_internal.cuh"
#include "attn_core.cuh"
#include "dev_cache.cuh"

using namespace mfc;

namespace {

/* Shared memory: Q tile | work area (K, V stages, or the selection arrays) | lists. */
#define META_BYTES (MF_CUDA_MAX_BLOCKS * (sizeof(uint64_t) + sizeof(uint32_t)))
template <class S> struct smem_plan {
    static constexpr size_t tiles = 4 * S::TILE * sizeof(typename S::T);
    /* prob: 2 V stages + per-column metadata; mask: selection arrays; attention: 4 tiles */
    static constexpr size_t meta = 2 * S::TILE * sizeof(typename S::T);
    static constexpr size_t work = cmax(cmax(tiles, SEL_BYTES), meta + META_BYTES);
    static constexpr size_t q = S::TILE * sizeof(typename S::T);
    static constexpr size_t lists = MF_CUDA_MAX_BLOCKS * (2 * sizeof(uint16_t) + 1);
    static constexpr size_t total = q + work + lists;
};

/* Attention of this CTA's rows over key blocks jf(0..count−1); stores rows < N where
 * store[r] (this thread's rows g and g + 8). */
template <class S, class JF>
__device__ void attend(const app_params &p, uint8_t *sm, uint32_t i, uint32_t t, int count,
                       JF jf, const bool store[2])
{
    typedef typename S::T T;
    T *qs = reinterpret_cast<T *>(sm), *ks = qs + S::TILE, *vs = ks + 2 * S::TILE;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    uint32_t kvh = t / (p.ht / p.hkv), qf[S::D / 16][4];
    load_tile<S>(qs, static_cast<const T *>(p.q), i * S::B, p.n, p.ht, t);
    cp_commit();
    cp_wait<0>();
    __syncthreads();
    load_q_frags<S>(qf, qs);
    float m[2] = { -INFINITY, -INFINITY }, l[2] = { 0.0f, 0.0f }, o[S::D / 8][4];
#pragma unroll
    for (int dt = 0; dt < S::D / 8; dt++)
        o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
    kv_loop<S, true>(
        ks, vs, static_cast<const T *>(p.k), static_cast<const T *>(p.v), p.n, p.hkv, kvh,
        count, jf, [&](const T *kt, const T *vt, uint32_t j, int) {
            float s[S::B / 8][4], alpha[2];
            scores<S>(s, qf, kt, i, j, p.scale_log2);
            softmax_step<S>(s, m, l, alpha);
#pragma unroll
            for (int dt = 0; dt < S::D / 8; dt++) {
                o[dt][0] *= alpha[0];
                o[dt][1] *= alpha[0];
                o[dt][2] *= alpha[1];
                o[dt][3] *= alpha[1];
            }
            uint32_t pf[S::B / 16][4];
#pragma unroll
            for (int kk = 0; kk < S::B / 16; kk++) {
                pf[kk][0] = elem<T>::pack(s[2 * kk][0], s[2 * kk][1]);
                pf[kk][1] = elem<T>::pack(s[2 * kk][2], s[2 * kk][3]);
                pf[kk][2] = elem<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                pf[kk][3] = elem<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
            }
            pv<S, false>(o, pf, vt);
        });
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float lt = quad_sum(l[r]), inv = 1.0f / lt;
        uint32_t row = i * S::B + w * 16 + (lane >> 2) + r * 8;
        if (!store[r] || row >= p.n)
            continue;
        store_o_row<T, S::D>(p.o, p.o_t, ((size_t)row * p.ht + t) * S::D + (lane & 3) * 2,
                             &o[0][0] + 2 * r, inv);
    }
}

/* One source tile's slice for this thread: rows g and g + 8, keys 32·kp + 8u .. + 7. */
template <int CODEC, int B> struct tile_regs {
    static constexpr bool WIDE = tile_piece<CODEC>::WIDE;
    typedef typename tile_piece<CODEC>::raw_t raw_t;
    raw_t r[B / 32][2];
    float w, scale;

    __device__ __forceinline__ void load(const uint8_t *tile, int row0)
    {
        int u = threadIdx.x & 3;
#pragma unroll
        for (int kp = 0; kp < B / 32; kp++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                size_t at = (size_t)(row0 + 8 * h) * B + kp * 32 + 8 * u;
                r[kp][h] = __ldg(reinterpret_cast<const raw_t *>(tile + (WIDE ? 2 : 1) * at));
            }
    }

    /* mix[kp][h][x] += W·P̂ */
    __device__ __forceinline__ void mix(float m[][2][8]) const
    {
#pragma unroll
        for (int kp = 0; kp < B / 32; kp++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                tile_piece<CODEC>::mix(m[kp][h], r[kp][h], w, scale);
    }
};

/* Prob mode over the listed columns (metadata s_hm / s_coff in shared memory); returns
 * this thread's rows' kept mass. The tiles of the first NPF relevant heads of column x + 1
 * are loaded while column x is mixed and multiplied (one column of loads in flight). */
#define NPF 2
template <class S, int CODEC>
__device__ void prob_path(const app_params &p, uint8_t *sm, const row_dev &row, uint32_t i,
                          uint32_t t, int count, const uint16_t *s_j,
                          const unsigned long long *s_hm, const uint32_t *s_coff,
                          const float *s_w, unsigned long long wmask, float kmass[2])
{
    typedef typename S::T T;
    typedef tile_regs<CODEC, S::B> regs_t;
    T *vs = reinterpret_cast<T *>(sm) + S::TILE;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, row0 = w * 16 + (lane >> 2);
    float o[S::D / 8][4];
#pragma unroll
    for (int dt = 0; dt < S::D / 8; dt++)
        o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
    kmass[0] = kmass[1] = 0.0f;
    regs_t cur[NPF], nxt[NPF];
    /* Loads the first NPF relevant heads of column x into rg (w = 0: absent). */
    auto fetch = [&](regs_t *rg, int x) {
        unsigned long long hm = s_hm[x], rel = hm & wmask;
#pragma unroll
        for (int z = 0; z < NPF; z++) {
            rg[z].w = 0.0f;
            if (!rel)
                continue;
            uint32_t s = __ffsll((long long)rel) - 1, e = entry_of(s_coff[x], hm, s);
            rel &= rel - 1;
            rg[z].w = s_w[s];
            rg[z].scale = row.scales ? __ldg(row.scales + e) : 1.0f;
            rg[z].load(row.tiles + (size_t)e * row.tile_bytes, row0);
        }
    };
    if (count > 0)
        fetch(cur, 0);
    kv_loop<S, false>(
        vs, nullptr, static_cast<const T *>(p.v), nullptr, p.n, p.hkv, t / (p.ht / p.hkv),
        count, [&](int x) { return (uint32_t)s_j[x]; },
        [&](const T *vt, const T *, uint32_t j, int x) {
            if (x + 1 < count)
                fetch(nxt, x + 1);
            float mix[S::B / 32][2][8];
#pragma unroll
            for (int a = 0; a < S::B / 32; a++)
#pragma unroll
                for (int r = 0; r < 2; r++)
#pragma unroll
                    for (int y = 0; y < 8; y++)
                        mix[a][r][y] = 0.0f;
#pragma unroll
            for (int z = 0; z < NPF; z++)
                if (cur[z].w != 0.0f)
                    cur[z].mix(mix);
            /* heads past the first NPF: loaded here, not prefetched */
            unsigned long long hm = s_hm[x], rel = hm & wmask;
            for (int z = 0; z < NPF && rel; z++)
                rel &= rel - 1;
            for (; rel; rel &= rel - 1) {
                uint32_t s = __ffsll((long long)rel) - 1, e = entry_of(s_coff[x], hm, s);
                regs_t one;
                one.w = s_w[s];
                one.scale = row.scales ? __ldg(row.scales + e) : 1.0f;
                one.load(row.tiles + (size_t)e * row.tile_bytes, row0);
                one.mix(mix);
            }
            uint32_t pf[S::B / 16][4];
#pragma unroll
            for (int kp = 0; kp < S::B / 32; kp++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
#pragma unroll
                    for (int y = 0; y < 8; y++) {
                        int key = kp * 32 + 8 * (lane & 3) + y;
                        if (j == i && key > row0 + 8 * r) /* causality, whatever the tile holds */
                            mix[kp][r][y] = 0.0f;
                        kmass[r] += mix[kp][r][y];
                    }
#pragma unroll
                    for (int hh = 0; hh < 2; hh++) {
                        pf[2 * kp + hh][r] =
                            elem<T>::pack(mix[kp][r][4 * hh], mix[kp][r][4 * hh + 1]);
                        pf[2 * kp + hh][2 + r] =
                            elem<T>::pack(mix[kp][r][4 * hh + 2], mix[kp][r][4 * hh + 3]);
                    }
                }
            pv<S, true>(o, pf, vt);
#pragma unroll
            for (int z = 0; z < NPF; z++)
                cur[z] = nxt[z];
        });
#pragma unroll
    for (int r = 0; r < 2; r++) {
        kmass[r] = quad_sum(kmass[r]);
        uint32_t rr = i * S::B + row0 + 8 * r;
        if (!(kmass[r] > 0.0f) || rr >= p.n)
            continue;
        store_o_row<T, S::D>(p.o, p.o_t, ((size_t)rr * p.ht + t) * S::D + (lane & 3) * 2,
                             &o[0][0] + 2 * r, 1.0f / kmass[r]);
    }
}

/* Block i of head t (the CTA's shared memory: sm, and the three statics of apply_kernel).
 * Every thread of the CTA calls; every return is the CTA's. */
template <class S>
__device__ __forceinline__ void apply_block(const app_params &p, uint32_t i, uint32_t t,
                                            uint8_t *sm, float *s_w, int &s_cnt,
                                            sel_shared &s_sel)
{
    uint8_t *work = sm + smem_plan<S>::q;
    uint16_t *s_col = reinterpret_cast<uint16_t *>(work + smem_plan<S>::work);
    uint16_t *s_j = s_col + MF_CUDA_MAX_BLOCKS;
    uint8_t *s_keep = reinterpret_cast<uint8_t *>(s_j + MF_CUDA_MAX_BLOCKS);
    if (p.mode[t] == MF_HEAD_SKIP)
        return;
    uint32_t mode = p.exact[i] ? MF_HEAD_COMPUTE : p.mode[t];
    row_dev row;
    bool all[2] = { true, true };
    if (mode != MF_HEAD_COMPUTE) {
        row = row_open(p.rows[i]);
        if (!row_usable(row, i, S::B, p.hs, mode)) {
            if (threadIdx.x == 0 && p.bad && !p.core) /* the core's pre-pass counts them */
                atomicAdd(p.bad, 1u);
            mode = MF_HEAD_COMPUTE;
        }
    }
    if (p.core && mode != MF_HEAD_PROB)
        return; /* the attention core has it */
    if (p.pstate && mode == MF_HEAD_PROB) { /* after the core's prob kernel: what it left */
        size_t at = (size_t)t * p.nb_all + i;
        uint8_t pst = p.pstate[at];
        if (pst == 0)
            return;
        if (pst == 1) { /* rows of kept mass 0: exact, as the reference (S::B = 64 here) */
            unsigned long long z = p.pzero[at];
            int q = (int)(threadIdx.x >> 5) * 16 + (int)((threadIdx.x & 31) >> 2);
            bool need[2] = { ((z >> q) & 1ull) != 0, ((z >> (q + 8)) & 1ull) != 0 };
            attend<S>(p, sm, i, t, (int)i + 1, [](int x) { return (uint32_t)x; }, need);
            return;
        }
        /* 2: a row the core's kernel does not take: the whole block below */
    }
    if (mode == MF_HEAD_COMPUTE) {
        attend<S>(p, sm, i, t, (int)i + 1, [](int x) { return (uint32_t)x; }, all);
        return;
    }
    unsigned long long wmask = load_w(p, t, s_w);
    if (mode == MF_HEAD_PROB) {
        unsigned long long *s_hm =
            reinterpret_cast<unsigned long long *>(work + smem_plan<S>::meta);
        uint32_t *s_coff = reinterpret_cast<uint32_t *>(s_hm + MF_CUDA_MAX_BLOCKS);
        list_columns(
            row, s_col, s_j, &s_cnt,
            [&](uint32_t c) { return (row.head_mask[c] & wmask) != 0; }, s_hm, s_coff);
        float km[2];
        switch (row.codec) {
        case MF_CODEC_FP16:
            prob_path<S, MF_CODEC_FP16>(p, sm, row, i, t, s_cnt, s_j, s_hm, s_coff, s_w, wmask, km);
            break;
        case MF_CODEC_BF16:
            prob_path<S, MF_CODEC_BF16>(p, sm, row, i, t, s_cnt, s_j, s_hm, s_coff, s_w, wmask, km);
            break;
        case MF_CODEC_FP8_E4M3:
            prob_path<S, MF_CODEC_FP8_E4M3>(p, sm, row, i, t, s_cnt, s_j, s_hm, s_coff, s_w, wmask, km);
            break;
        default:
            prob_path<S, MF_CODEC_U8_LOG>(p, sm, row, i, t, s_cnt, s_j, s_hm, s_coff, s_w, wmask, km);
            break;
        }
        bool need[2] = { !(km[0] > 0.0f), !(km[1] > 0.0f) };
        if (__syncthreads_or(need[0] || need[1])) /* everything quantised away: exact */
            attend<S>(p, sm, i, t, (int)i + 1, [](int x) { return (uint32_t)x; }, need);
        return;
    }
    mask_select(row, i, p.top_p ? (double)p.top_p[t] : 1.0, s_w, wmask, work,
                MF_CUDA_MAX_BLOCKS, s_keep, &s_sel);
    /* blocks 0 and i are always attended, candidates or not */
    list_columns(row, s_col, s_j, &s_cnt, [&](uint32_t c) {
        uint32_t j = row.cols[c];
        return s_keep[c] || j == 0 || j == i;
    });
    if (threadIdx.x == 0) {
        int cnt = s_cnt;
        if (row.cols[0] != 0) { /* not in the row: prepend (the list stays ascending) */
            for (int x = cnt; x > 0; x--)
                s_j[x] = s_j[x - 1];
            s_j[0] = 0;
            cnt++;
        }
        if (i > 0 && row.cols[row.n_cols - 1] != i)
            s_j[cnt++] = (uint16_t)i;
        s_cnt = cnt;
    }
    __syncthreads();
    attend<S>(p, sm, i, t, s_cnt, [&](int x) { return (uint32_t)s_j[x]; }, all);
}

/* One CTA a (block, head) of the grid; with p.wl (after the core's prob kernel) a grid-stride
 * walk of the work list instead: only the blocks that kernel left, not a CTA for each prob
 * block that mostly returns at once (a 32k layer: 16k CTAs, ≈ 0.07 ms). */
template <class S> __global__ void __launch_bounds__(S::THREADS) apply_kernel(app_params p)
{
    extern __shared__ __align__(16) uint8_t sm[];
    __shared__ float s_w[MF_ROW_MAX_HEADS];
    __shared__ int s_cnt;
    __shared__ sel_shared s_sel;
    const uint32_t nw = p.wl ? *p.wl_n : gridDim.x;
    for (uint32_t x = blockIdx.x; x < nw; x += gridDim.x) {
        uint32_t i, t;
        if (p.wl) {
            const uint32_t e = p.wl[x];
            i = e % p.nb_all;
            t = e / p.nb_all;
        } else {
            i = p.nb_all - 1 - x / p.nh;
            t = p.heads ? p.heads[x % p.nh] : x % p.nh;
        }
        apply_block<S>(p, i, t, sm, s_w, s_cnt, s_sel);
        if (x + gridDim.x < nw)
            __syncthreads(); /* the shared memory, before the next block reuses it */
    }
}

/* The core's pre-pass, one CTA per (query block i, target head t): the block's effective
 * mode as v2 decides it (exact blocks, missing or disagreeing rows: compute), then its
 * key-block bitmap keep[(t·nb + i)·words ..]: compute → every j ≤ i; mask → mask_select's
 * kept columns plus blocks 0 and i; prob → empty (v2 computes it); skipped heads → empty.
 * Shared memory is sized for cap = pow2(nb) columns, not MF_CUDA_MAX_BLOCKS (43 KB: 5 CTAs
 * an SM for a latency-bound kernel; 11 KB at nb = 512: 16), and the largest i go first (the
 * longest CTAs; the tail is then short ones). v1 = 1 (MF_APPLY_PREPASS=v1, bench A/B): the
 * pre-pass of before — full-size shared memory, i ascending, the ordered loop over every
 * column. */
__global__ void __launch_bounds__(128) prepass_kernel(app_params p, uint32_t b,
                                                      uint32_t *keep, uint32_t words,
                                                      uint32_t cap, uint32_t v1)
{
    extern __shared__ __align__(16) uint8_t work[];
    __shared__ float s_w[MF_ROW_MAX_HEADS];
    __shared__ sel_shared s_sel;
    __shared__ uint32_t s_bits[MF_CUDA_MAX_BLOCKS / 32];
    uint8_t *s_keep = work + SEL_BYTES_FOR(cap);
    uint32_t i = v1 ? blockIdx.x / p.ht : p.nb_all - 1 - blockIdx.x / p.ht, t = blockIdx.x % p.ht;
    uint32_t mode = p.mode[t] == MF_HEAD_SKIP ? MF_HEAD_SKIP
                    : p.exact[i]              ? MF_HEAD_COMPUTE
                                              : p.mode[t];
    uint32_t *dst = keep + ((size_t)t * p.nb_all + i) * words;
    row_dev row;
    if (mode != MF_HEAD_COMPUTE && mode != MF_HEAD_SKIP) {
        row = row_open(p.rows[i]);
        if (!row_usable(row, i, b, p.hs, mode)) {
            if (threadIdx.x == 0 && p.bad)
                atomicAdd(p.bad, 1u);
            mode = MF_HEAD_COMPUTE;
        }
    }
    if (mode != MF_HEAD_MASK) {
        for (uint32_t w = threadIdx.x; w < words; w += blockDim.x) {
            uint32_t lo = 32 * w, v = 0;
            if (mode == MF_HEAD_COMPUTE && lo <= i)
                v = i - lo >= 31 ? 0xffffffffu : (2u << (i - lo)) - 1u;
            dst[w] = v;
        }
        return;
    }
    unsigned long long wmask = load_w(p, t, s_w);
    for (uint32_t w = threadIdx.x; w < words; w += blockDim.x)
        s_bits[w] = 0;
    mask_select(row, i, p.top_p ? (double)p.top_p[t] : 1.0, s_w, wmask, work, cap, s_keep,
                &s_sel, v1 != 0);
    for (uint32_t c = threadIdx.x; c < row.n_cols; c += blockDim.x)
        if (s_keep[c]) {
            uint32_t j = row.cols[c];
            atomicOr(&s_bits[j / 32], 1u << (j % 32));
        }
    if (threadIdx.x == 0) { /* always attended, candidates or not */
        atomicOr(&s_bits[0], 1u);
        atomicOr(&s_bits[i / 32], 1u << (i % 32));
    }
    __syncthreads();
    for (uint32_t w = threadIdx.x; w < words; w += blockDim.x)
        dst[w] = s_bits[w];
}

template <class S> mf_status_t launch(const app_params &p, cudaStream_t st, const char **why)
{
    static std::atomic<uint64_t> raised; /* per instantiation: bit = device */
    size_t sm = smem_plan<S>::total;
    if (smem_limit_once((const void *)apply_kernel<S>, (int)sm, &raised) != cudaSuccess)
        return MF_INTERNAL;
    uint32_t grid = p.nb_all * p.nh;
    if (p.wl) { /* the work list's length is on the device: a grid that fills the GPU once */
        static std::atomic<int> per_sm; /* CTAs an SM (0: not asked yet); per instantiation */
        int per = per_sm.load();
        if (per == 0) {
            if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, apply_kernel<S>, S::THREADS,
                                                              sm) != cudaSuccess) {
                *why = "could not size v2's follow-up grid (occupancy query failed)";
                return MF_INTERNAL;
            }
            per = per > 0 ? per : 1;
            per_sm.store(per);
        }
        uint32_t sms;
        mf_status_t st_sm = sm_count(&sms, why);
        if (st_sm != MF_OK)
            return st_sm;
        uint32_t fill = sms * (uint32_t)per;
        grid = grid < fill ? grid : fill;
    }
    apply_kernel<S><<<grid, S::THREADS, sm, st>>>(p);
    return MF_OK;
}

template <typename T> mf_status_t launch_t(const app_params &p, uint32_t b, uint32_t d,
                                           cudaStream_t st, const char **why)
{
    switch (b * 1000 + d) {
    case 32064: return launch<shape<32, 64, T>>(p, st, why);
    case 32128: return launch<shape<32, 128, T>>(p, st, why);
    case 64064: return launch<shape<64, 64, T>>(p, st, why);
    case 64128: return launch<shape<64, 128, T>>(p, st, why);
    case 128064: return launch<shape<128, 64, T>>(p, st, why);
    case 128128: return launch<shape<128, 128, T>>(p, st, why);
    default: return MF_UNIMPLEMENTED;
    }
}

/* app_params.fp8_pre: 2^k with max_t Σ_s W[t,s] · 2^k in [8192, 16384] (1 for a W of
 * zeros). W is finite and ≥ 0 (check_map). */
float fp8_prescale(const float *w, uint32_t ht, uint32_t hs)
{
    float top = 0.0f;
    for (uint32_t t = 0; t < ht; t++) {
        float sum = 0.0f;
        for (uint32_t x = 0; x < hs; x++)
            sum += w[(size_t)t * hs + x];
        top = sum > top ? sum : top;
    }
    if (!(top > 0.0f) || !isfinite(top))
        return 1.0f;
    int e;
    (void)frexpf(top, &e); /* top = m · 2^e, m in [0.5, 1) */
    int k = 14 - e;
    k = k > 100 ? 100 : k < -100 ? -100 : k;
    return ldexpf(1.0f, k);
}

mf_status_t check_map(const mf_layer_map_t *m, uint32_t ht, const char **why)
{
    if (!m || !m->w || !m->mode) {
        *why = "layer map with W and modes is required";
        return MF_INVALID_ARGUMENT;
    }
    if (m->n_target_heads != ht) {
        *why = "layer map target heads differ from the target's Hq";
        return MF_INVALID_ARGUMENT;
    }
    if (m->n_source_heads < 1 || m->n_source_heads > MF_ROW_MAX_HEADS) {
        *why = "layer map source heads out of range (1..64)";
        return MF_INVALID_ARGUMENT;
    }
    for (uint32_t t = 0; t < ht; t++) {
        if (m->mode[t] > MF_HEAD_MASK) {
            *why = "unknown head mode";
            return MF_INVALID_ARGUMENT;
        }
        if (m->top_p && !(m->top_p[t] > 0.0f && m->top_p[t] <= 1.0f)) {
            *why = "target top_p outside (0, 1]";
            return MF_INVALID_ARGUMENT;
        }
        for (uint32_t s = 0; s < m->n_source_heads; s++) {
            float x = m->w[(size_t)t * m->n_source_heads + s];
            if (!(x >= 0.0f && isfinite(x))) {
                *why = "W has a negative or non-finite weight";
                return MF_INVALID_ARGUMENT;
            }
        }
    }
    return MF_OK;
}

/* DEFAULT → MF_APPLY_IMPL (core | v2) from the environment, else the built-in default. */
mf_status_t resolve_impl(mf_apply_impl_t *impl, const char **why)
{
    if (*impl == MF_APPLY_IMPL_V2 || *impl == MF_APPLY_IMPL_CORE)
        return MF_OK;
    if (*impl == MF_APPLY_IMPL_V3) {
        *why = "the v3 apply kernel was removed (slower than v2; bench/gpu/NOTES.md): use "
               "core or v2";
        return MF_INVALID_ARGUMENT;
    }
    if (*impl != MF_APPLY_IMPL_DEFAULT) {
        *why = "unknown apply implementation";
        return MF_INVALID_ARGUMENT;
    }
    static const char *const names[] = { "core", "v2" };
    static const mf_apply_impl_t impls[] = { MF_APPLY_IMPL_CORE, MF_APPLY_IMPL_V2 };
    int x = env_choice("MF_APPLY_IMPL", names, 2);
    if (x == -2) {
        *why = "MF_APPLY_IMPL must be core or v2 (v3 was removed)";
        return MF_INVALID_ARGUMENT;
    }
    *impl = x < 0 ? MF_APPLY_IMPL_BUILTIN : impls[x];
    return MF_OK;
}

/* The bench-only switches (mapflow_kernels_cuda.h lists them; bench/gpu/core_bench.py sets
 * them): which launches run (MF_APPLY_PHASE), which heads (MF_APPLY_ONLY), whether the
 * per-device scratch cache is used (MF_APPLY_CACHE=0: the per-call allocation of before),
 * and which pre-pass (MF_APPLY_PREPASS=v1: the one of before). */
enum { PHASE_ALL = -1, PHASE_PREPASS = 0, PHASE_CORE = 1, PHASE_NONE = 2 };
struct bench_switches {
    int phase, only; /* only: −1 every head, else the one mode (MF_HEAD_*) that runs */
    bool cache;
    uint32_t prepass_v1; /* MF_APPLY_PREPASS=v1: the pre-pass of before (prepass_kernel) */
    bool prob_v2;        /* MF_APPLY_PROB=v2: prob blocks on v2 under the core, as before */
};
mf_status_t read_switches(bench_switches *b, const char **why)
{
    static const char *const phases[] = { "prepass", "core", "none" };
    static const char *const modes[] = { "compute", "prob", "mask" }; /* = MF_HEAD_* */
    static const char *const off[] = { "0" }, *const v1[] = { "v1" };
    b->phase = env_choice("MF_APPLY_PHASE", phases, 3);
    b->only = env_choice("MF_APPLY_ONLY", modes, 3);
    static const char *const probs[] = { "core", "v2" };
    int c = env_choice("MF_APPLY_CACHE", off, 1), pp = env_choice("MF_APPLY_PREPASS", v1, 1);
    int pr = env_choice("MF_APPLY_PROB", probs, 2);
    b->cache = c != 0;
    b->prepass_v1 = pp == 0;
    b->prob_v2 = pr == 1;
    if (b->phase == -2 || b->only == -2 || c == -2 || pp == -2 || pr == -2) {
        *why = "MF_APPLY_PHASE must be prepass, core or none; MF_APPLY_ONLY compute, prob or "
               "mask; MF_APPLY_CACHE 0; MF_APPLY_PREPASS v1; MF_APPLY_PROB core or v2 (or "
               "unset)";
        return MF_INVALID_ARGUMENT;
    }
    return MF_OK;
}

/* The scratch of one call (device constants | keep bitmaps, and the host image of the
 * constants): this launcher's table of dev_cache.cuh. */
dev_cache g_cache[MAX_CACHED_DEVICES];


/* A layer with prob heads and core heads: v2 (prob blocks) runs on a side stream, forked
 * from and joined back to the caller's, so it fills the SMs the core's last wave leaves
 * idle (the two write disjoint blocks of O; v2 reads only the constants). One per device,
 * used under that device's g_cache mutex. */
struct side_stream {
    cudaStream_t side = nullptr;
    cudaEvent_t fork = nullptr, join = nullptr;
    bool failed = false; /* creation failed once: run in sequence from then on */
};
side_stream g_side[MAX_CACHED_DEVICES];

/* The side stream of cache c's device, made on first use (c's mutex held); NULL when there
 * is no cache or it cannot be had (the call then runs v2 after the core on its stream). */
side_stream *side_of(dev_cache *c)
{
    if (!c)
        return nullptr;
    side_stream *x = &g_side[c - g_cache];
    if (x->failed)
        return nullptr;
    if (x->side)
        return x;
    if (cudaStreamCreateWithFlags(&x->side, cudaStreamNonBlocking) == cudaSuccess &&
        cudaEventCreateWithFlags(&x->fork, cudaEventDisableTiming) == cudaSuccess &&
        cudaEventCreateWithFlags(&x->join, cudaEventDisableTiming) == cudaSuccess)
        return x;
    if (x->join)
        cudaEventDestroy(x->join);
    if (x->fork)
        cudaEventDestroy(x->fork);
    if (x->side)
        cudaStreamDestroy(x->side);
    x->side = nullptr;
    x->fork = x->join = nullptr;
    x->failed = true;
    (void)cudaGetLastError();
    return nullptr;
}

} /* namespace */

extern "C" mf_status_t mf_apply_cuda(const mf_apply_cuda_args_t *a, mf_cuda_stream_t stream,
                                     const char **why)
{
    return mf_apply_cuda_impl(a, MF_APPLY_IMPL_DEFAULT, stream, why);
}

extern "C" mf_status_t mf_apply_cuda_impl(const mf_apply_cuda_args_t *a, mf_apply_impl_t impl,
                                          mf_cuda_stream_t stream, const char **why)
{
    const char *dummy;
    if (!why)
        why = &dummy;
    *why = "";
    mf_status_t st0 = resolve_impl(&impl, why);
    if (st0 != MF_OK)
        return st0;
    bench_switches bs;
    st0 = read_switches(&bs, why);
    if (st0 != MF_OK)
        return st0;
    if (!a || !a->o) {
        *why = "arguments and output O are required";
        return MF_INVALID_ARGUMENT;
    }
    uint32_t b = a->block_size;
    mf_status_t st = mf_qkv_check(&a->tgt, 1, why);
    if (st != MF_OK)
        return st;
    st = mf_cuda_supported(b, a->tgt.head_dim, a->tgt.dtype, a->tgt.n_tokens, why);
    if (st != MF_OK)
        return st;
    if (a->o_dtype != MF_DTYPE_F32 && a->o_dtype != a->tgt.dtype) {
        *why = "o_dtype must be MF_DTYPE_F32 or the inputs' dtype";
        return MF_INVALID_ARGUMENT;
    }
    st = check_map(a->map, a->tgt.n_q_heads, why);
    if (st != MF_OK)
        return st;
    uint32_t n = a->tgt.n_tokens, full = n / b, all = (n + b - 1) / b;
    uint32_t ht = a->tgt.n_q_heads, hs = a->map->n_source_heads;
    if (a->n_rows > full || (a->n_rows && !a->rows)) {
        *why = "n_rows exceeds the full query blocks, or no row array";
        return MF_INVALID_ARGUMENT;
    }
    scratch sc;
    size_t o_rows = sc.take(all * sizeof(void *)), o_w = sc.take((size_t)ht * hs * 4),
           o_tp = sc.take(ht * 4), o_mode = sc.take(ht), o_ex = sc.take(all),
           o_heads = sc.take(ht * sizeof(uint16_t));
    /* The core where it covers the shape (else v2 does every block): keep bitmaps after
     * the constants, written by the pre-pass (never copied from the host). */
    const char *no_core = "";
    bool use_core = impl == MF_APPLY_IMPL_CORE && (b == 64 || b == 128) &&
                    core_supported(a->tgt.head_dim, a->tgt.dtype, &no_core) == MF_OK &&
                    !(((uintptr_t)a->tgt.q | (uintptr_t)a->tgt.k | (uintptr_t)a->tgt.v) & 15);
    /* Prob heads on the core's prob kernel (B = 64; MF_APPLY_PROB=v2: on v2 as before):
     * its item counter and v2's work-list length in the constants (zeroed by their
     * upload, no memset); its per-(head, block) state and the work list after them. */
    bool prob_core = use_core && b == 64 && !bs.prob_v2;
    if (prob_core) {
        bool any = false;
        for (uint32_t t = 0; t < ht; t++)
            any |= a->map->mode[t] == MF_HEAD_PROB && (bs.only < 0 || bs.only == MF_HEAD_PROB);
        prob_core = any;
    }
    size_t o_pctr = prob_core ? sc.take(2 * sizeof(uint32_t)) : 0;
    uint32_t words = (all + 31) / 32;
    size_t host_used = sc.used, o_keep = use_core ? sc.take((size_t)ht * all * words * 4) : 0;
    size_t o_ctr = use_core ? sc.take(sizeof(uint32_t)) : 0; /* the core's tile counter */
    size_t o_pst = prob_core ? sc.take((size_t)ht * all) : 0;
    size_t o_pz = prob_core ? sc.take((size_t)ht * all * sizeof(unsigned long long)) : 0;
    size_t o_wl = prob_core ? sc.take((size_t)ht * all * sizeof(uint32_t)) : 0;
    cudaStream_t s = stream;
    dev_cache *cache = dev_cache_of(g_cache, bs.cache);
    std::unique_lock<std::mutex> lock;
    if (cache)
        lock = std::unique_lock<std::mutex>(cache->mu);
    call_scratch cs;
    st = scratch_get(&cs, cache, sc.used, host_used, s, why);
    if (st == MF_OK) {
        uint8_t *host = cs.host;
        for (uint32_t i = 0; i < all; i++) {
            const void *r = i < a->n_rows ? a->rows[i] : NULL;
            ((const void **)(host + o_rows))[i] = r;
            host[o_ex + i] = (uint8_t)(i >= full || !r || (a->exact && a->exact[i]) ||
                                       i < a->exact_first || (uint64_t)i + a->exact_last >= full);
        }
        memcpy(host + o_w, a->map->w, (size_t)ht * hs * 4);
        if (prob_core)
            memset(host + o_pctr, 0, 2 * sizeof(uint32_t));
        bool any_prob = false, any_other = false, any_exact = false;
        uint32_t n_prob = 0;
        for (uint32_t t = 0; t < ht; t++) {
            uint8_t md = a->map->mode[t];
            ((float *)(host + o_tp))[t] = a->map->top_p ? a->map->top_p[t] : 1.0f;
            if (bs.only >= 0 && md != bs.only)
                md = MF_HEAD_SKIP;
            host[o_mode + t] = md;
            if (md == MF_HEAD_PROB) /* v2's grid under the core: these heads only */
                ((uint16_t *)(host + o_heads))[n_prob++] = (uint16_t)t;
            any_prob |= md == MF_HEAD_PROB;
            any_other |= md == MF_HEAD_MASK || md == MF_HEAD_COMPUTE;
        }
        for (uint32_t i = 0; i < all; i++)
            any_exact |= host[o_ex + i] != 0;
        /* Prob heads alone and no exact block: no pre-pass and no grid of empty core tiles
         * (≈ 0.17 ms at 32k). Prob blocks on v2: v2 does it all (it computes a block whose
         * row turns out unusable itself); on the core's prob kernel: v2 takes what it
         * leaves, the blocks of bad rows included (its work list). */
        if (!any_other && !(any_prob && any_exact))
            use_core = false;
        st = scratch_upload(&cs, host_used, s, why);
        if (st == MF_OK) {
            app_params p;
            memset(&p, 0, sizeof(p));
            p.q = a->tgt.q;
            p.k = a->tgt.k;
            p.v = a->tgt.v;
            p.o = a->o;
            p.o_t = a->o_dtype != MF_DTYPE_F32;
            p.rows = (const uint8_t *const *)(cs.dev + o_rows);
            p.w = (const float *)(cs.dev + o_w);
            p.top_p = (const float *)(cs.dev + o_tp);
            p.mode = cs.dev + o_mode;
            p.exact = cs.dev + o_ex;
            p.nh = ht;
            p.bad = a->bad_rows;
            p.n = n;
            p.ht = ht;
            p.hkv = a->tgt.n_kv_heads;
            p.hs = hs;
            p.n_rows = a->n_rows;
            p.nb_all = all;
            p.scale_log2 = MF_LOG2E / sqrtf((float)a->tgt.head_dim);
            if (prob_core) /* only the core's prob kernel reads it */
                p.fp8_pre = fp8_prescale(a->map->w, ht, hs);
            bool v2_needed = any_prob || (!use_core && any_other);
            /* v2 beside the core: on the cache's side stream, after the constants' copy */
            cudaStream_t v2s = s;
            side_stream *ss = use_core && any_prob && bs.phase == PHASE_ALL ? side_of(cache)
                                                                             : nullptr;
            if (ss && cudaEventRecord(ss->fork, s) == cudaSuccess &&
                cudaStreamWaitEvent(ss->side, ss->fork, 0) == cudaSuccess)
                v2s = ss->side;
            (void)cudaGetLastError();
            if (use_core) {
                uint32_t *keep = (uint32_t *)(cs.dev + o_keep);
                if (bs.phase == PHASE_ALL || bs.phase == PHASE_PREPASS) {
                    uint32_t cap = 32; /* pow2 ≥ all, ≥ a warp */
                    while (cap < all)
                        cap <<= 1;
                    if (bs.prepass_v1)
                        cap = MF_CUDA_MAX_BLOCKS;
                    prepass_kernel<<<all * ht, 128, SEL_BYTES_FOR(cap) + cap, s>>>(
                        p, b, keep, words, cap, bs.prepass_v1);
                    st = cuda_status(cudaGetLastError(), why);
                }
                core_args ca = core_args_of(&a->tgt, a->o, NULL);
                ca.o_t = p.o_t; /* the core's epilogue stores O as v2 does */
                ca.keep = keep;
                ca.block = b;
                ca.nb = all;
                ca.words = words;
                ca.tile_ctr = (uint32_t *)(cs.dev + o_ctr);
                if (st == MF_OK && (bs.phase == PHASE_ALL || bs.phase == PHASE_CORE))
                    st = core_launch(ca, s, why);
                p.core = 1;
            }
            if (use_core || prob_core) { /* v2 and the prob kernel: the prob heads only */
                p.heads = (const uint16_t *)(cs.dev + o_heads);
                p.nh = n_prob;
            }
            /* the core's prob kernel, then v2 for what it left (same stream: v2 reads its
             * state) */
            if (st == MF_OK && prob_core && bs.phase == PHASE_ALL) {
                p.pstate = cs.dev + o_pst;
                p.pzero = (unsigned long long *)(cs.dev + o_pz);
                p.prob_ctr = (uint32_t *)(cs.dev + o_pctr);
                p.wl_n = p.prob_ctr + 1;
                p.wl = (uint32_t *)(cs.dev + o_wl);
                st = prob_core_launch(p, a->tgt.dtype, a->tgt.head_dim, v2s, why);
            }
            /* v2: every block, or the prob heads' only with the core (or, after the core's
             * prob kernel, the rows and blocks it left) */
            if (st == MF_OK && v2_needed && bs.phase == PHASE_ALL) {
                if (a->tgt.dtype == MF_DTYPE_F16)
                    st = launch_t<__half>(p, b, a->tgt.head_dim, v2s, why);
                else
                    st = launch_t<__nv_bfloat16>(p, b, a->tgt.head_dim, v2s, why);
            }
            if (v2s != s) { /* join, whatever happened: s must not run ahead of side */
                mf_status_t sj = cuda_status(cudaEventRecord(ss->join, v2s), why);
                if (sj == MF_OK)
                    sj = cuda_status(cudaStreamWaitEvent(s, ss->join, 0), why);
                if (st == MF_OK)
                    st = sj;
            }
            if (st == MF_INTERNAL && !**why)
                *why = "could not raise the kernel's shared-memory limit";
            if (st == MF_OK)
                st = cuda_status(cudaGetLastError(), why);
        }
    }
    scratch_put(&cs, s);
    return st;
}
