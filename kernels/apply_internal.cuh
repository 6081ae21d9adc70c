/*
 * apply_internal — the pieces of apply.cu (the v2 kernel, the core's mask pre-pass, the host
 * entry): the launch parameters, the row check, mask-mode selection, the column lister and
 * the tile-piece decoder. Internal to kernels/; host and device code, no global state.
 */
#ifndef MF_APPLY_INTERNAL_CUH
#define MF_APPLY_INTERNAL_CUH

#include <type_traits>

#include "mf_cuda_common.cuh"

namespace mfc {

/* app_params.mode value of a head this launch leaves alone (MF_APPLY_ONLY, a bench switch:
 * its O is not written); never a user's mode (check_map refuses > MF_HEAD_MASK). */
#define MF_HEAD_SKIP 0xffu

struct app_params {
    const void *q, *k, *v;
    void *o;               /* [N][Ht][D]: float, or T when o_t (mf_apply_cuda_args_t.o_dtype) */
    uint32_t o_t;
    const uint8_t *const *rows; /* [n_rows] */
    const float *w;        /* [Ht][Hs] */
    const float *top_p;    /* [Ht] */
    const uint8_t *mode;   /* [Ht] */
    const uint8_t *exact;  /* [nb_all] */
    const uint16_t *heads; /* v2's heads, nh of them (grid nb_all × nh); NULL: 0..ht−1 */
    uint32_t nh;
    uint32_t *bad;
    uint32_t n, ht, hkv, hs, n_rows, nb_all;
    uint32_t core;         /* v2: the attention core does every block but prob ones (and
                            * heads lists only the prob heads) */
    /* The core's prob kernel (attn_core.cu, prob_core_launch) ran before this v2 launch:
     * per (head t, query block i) at [t·nb_all + i], pstate = 0 done there, 1 the rows of
     * pzero's bit mask (kept mass 0) to compute exactly, 2 the whole block is v2's (a row
     * the kernel does not take: more columns than its list holds). Written for every prob
     * block with a usable row; NULL: v2 does every prob block itself. */
    uint8_t *pstate;
    unsigned long long *pzero;
    /* The prob kernel's item counter (persistent grid; zeroed with the constants) and v2's
     * work list after it: wl[0 .. *wl_n) = t·nb_all + i of each block left to v2 (pstate
     * 1 / 2, or, with no attention core in the launch, a bad row's block). v2 with wl set
     * walks that list (a small grid) instead of every prob block. */
    uint32_t *prob_ctr, *wl, *wl_n;
    /* The prob kernel's FP8 prescale, a power of two: about 16384 / the largest Σ_s W[t,s]
     * of the layer (fp8_prescale), so mixed FP8 tiles (P̂ ≤ 1 a source head) stay below
     * 16384, a quarter of f16's range, and small probabilities stay normal */
    float fp8_pre;
    float scale_log2;
};

/* Mask-mode selection arrays of one head for up to cap columns (cap a power of two ≥ the
 * query blocks: the sort pads to one): masses, sort keys, sort columns. */
#define SEL_BYTES_FOR(cap) ((size_t)(cap) * (2 * sizeof(double) + sizeof(uint32_t)))
#define SEL_BYTES SEL_BYTES_FOR(MF_CUDA_MAX_BLOCKS)
static constexpr size_t cmax(size_t a, size_t b) { return a > b ? a : b; }

/* Scalars the mask selection shares across the CTA (in shared memory). */
struct sel_shared {
    int cnt, kept;
    double acc0, target;
};

/* A row usable for (query block i, mode): 16-byte aligned as rows must be (v2's 16-byte
 * tile loads and the core's bulk copies rely on it) and its header agrees with the launch;
 * else the block is computed exactly (and counted in bad_rows). */
__device__ __forceinline__ bool row_usable(const row_dev &row, uint32_t i, uint32_t b,
                                           uint32_t hs, uint32_t mode)
{
    return !((uintptr_t)row.base & 15) && row.block_index == i && row.block_size == b &&
           row.n_heads == hs &&
           row.n_cols >= 1 && row.n_cols <= i + 1 &&
           !(mode == MF_HEAD_PROB && row.codec == MF_CODEC_MASK);
}

/* The mask of the heads s < hs with w[s] > 0 (w: a W row, in shared or global memory): a
 * ballot per 32 heads, not hs dependent reads. Every lane of the warp calls. */
__device__ __forceinline__ unsigned long long w_row_mask(const float *w, uint32_t hs)
{
    unsigned long long m = 0;
#pragma unroll
    for (uint32_t base = 0; base < MF_ROW_MAX_HEADS; base += 32) {
        const uint32_t s = base + (threadIdx.x & 31);
        m |= (unsigned long long)__ballot_sync(0xffffffffu, s < hs && w[s] > 0.0f) << base;
    }
    return m;
}

/* Target head t's W row into s_w (0 past hs); returns the mask of its source heads with
 * W > 0. Every thread of the CTA calls (one barrier; the CTA is whole warps). */
__device__ __forceinline__ unsigned long long load_w(const app_params &p, uint32_t t, float *s_w)
{
    for (uint32_t s = threadIdx.x; s < MF_ROW_MAX_HEADS; s += blockDim.x)
        s_w[s] = s < p.hs ? p.w[(size_t)t * p.hs + s] : 0.0f;
    __syncthreads();
    return w_row_mask(s_w, p.hs);
}

/* Mask mode's selection for query block i (mf_apply_ref): mixed masses in double, source
 * heads ascending as the reference sums, then mf_topp_select's rule over the candidates
 * (columns with a head in wmask). s_keep[c] = 1 for the kept columns c < n_cols; blocks 0
 * and i are attended whether kept or not (the caller adds them). work: SEL_BYTES_FOR(cap)
 * of shared memory, cap a power of two ≥ i + 1. The ordered sums (total, and the candidate
 * list the sort takes) are one thread's, in column order as the reference's; warp 0 first
 * lists the candidates (ballots), so that loop walks the head's candidates, not the row's
 * union over every source head (serial_all: every column, the pre-pass of before, for the
 * bench's A/B). Every thread of the CTA calls; ends with a CTA barrier. */
__device__ __forceinline__ void mask_select(const row_dev &row, uint32_t i, double tp,
                                            const float *s_w, unsigned long long wmask,
                                            uint8_t *work, uint32_t cap, uint8_t *s_keep,
                                            sel_shared *ss, bool serial_all = false)
{
    double *mall = reinterpret_cast<double *>(work);
    double *cm = mall + cap;
    uint32_t *cj = reinterpret_cast<uint32_t *>(cm + cap);
    for (uint32_t c = threadIdx.x; c < row.n_cols; c += blockDim.x) {
        unsigned long long hm = row.head_mask[c], rel = hm & wmask;
        double mm = 0.0;
        for (; rel; rel &= rel - 1) {
            uint32_t s = __ffsll((long long)rel) - 1;
            mm += (double)s_w[s] * (double)mass_decode(row.mass[entry_of(row.col_off[c], hm, s)]);
        }
        mall[c] = mm;
        s_keep[c] = (hm & wmask) ? 1 : 0; /* candidate */
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        /* cj[0..nc) = the columns the loop below walks, ascending */
        uint32_t lane = threadIdx.x, nc = 0;
        for (uint32_t base = 0; base < row.n_cols; base += 32) {
            uint32_t c = base + lane;
            bool in = c < row.n_cols && (serial_all || s_keep[c]);
            uint32_t bal = __ballot_sync(0xffffffffu, in);
            if (in)
                cj[nc + __popc(bal & ((1u << lane) - 1))] = c;
            nc += __popc(bal);
        }
        __syncwarp();
        if (lane == 0) {
            double total = 0.0, acc0 = 0.0;
            int n = 0;
            for (uint32_t x = 0; x < nc; x++) {
                uint32_t c = cj[x], j = row.cols[c];
                if (!s_keep[c])
                    continue;
                total += mall[c];
                if (j == 0 || j == i)
                    continue;
                cm[n] = mall[c];
                cj[n++] = c; /* in place (n ≤ x); ties go to the lower c, i.e. the lower j */
            }
            if (row.cols[0] == 0 && s_keep[0])
                acc0 += mall[0];
            if (i > 0 && row.cols[row.n_cols - 1] == i && s_keep[row.n_cols - 1])
                acc0 += mall[row.n_cols - 1];
            ss->cnt = n;
            ss->acc0 = acc0;
            ss->target = tp * total;
        }
    }
    __syncthreads();
    int n = ss->cnt;
    if (tp < 1.0 && i + 1 > 2) {
        for (uint32_t c = threadIdx.x; c < row.n_cols; c += blockDim.x) {
            uint32_t j = row.cols[c];
            if (j != 0 && j != i)
                s_keep[c] = 0;
        }
        int kept = topp_sorted(cm, cj, n, ss->acc0, ss->target, &ss->kept);
        for (int x = threadIdx.x; x < kept; x += blockDim.x)
            s_keep[cj[x]] = 1;
    }
    __syncthreads();
}

/* Warp 0 lists the columns c < n_cols with pred(c), in order: s_j[x] = j (s_col[x] = c,
 * s_hm, s_coff copied when given). Then the whole CTA syncs. */
template <class PRED>
__device__ __forceinline__ void list_columns(const row_dev &row, uint16_t *s_col,
                                             uint16_t *s_j, int *s_cnt, PRED pred,
                                             unsigned long long *s_hm = nullptr,
                                             uint32_t *s_coff = nullptr)
{
    int lane = threadIdx.x & 31;
    if (threadIdx.x < 32) {
        int cnt = 0;
        for (uint32_t base = 0; base < row.n_cols; base += 32) {
            uint32_t c = base + lane;
            bool ok = c < row.n_cols && pred(c);
            uint32_t bal = __ballot_sync(0xffffffffu, ok);
            if (ok) {
                int at = cnt + __popc(bal & ((1u << lane) - 1));
                if (s_col)
                    s_col[at] = (uint16_t)c;
                s_j[at] = (uint16_t)row.cols[c];
                if (s_hm) {
                    s_hm[at] = row.head_mask[c];
                    s_coff[at] = row.col_off[c];
                }
            }
            cnt += __popc(bal);
        }
        if (lane == 0)
            *s_cnt = cnt;
    }
    __syncthreads();
}

/* A source tile's decoding, two consecutive keys at a time (the unit of the m16n8k16 /
 * wgmma A fragment): coef(w, scale) folds W[t,s] and the tile's scale once a tile;
 * add(m0, m1, raw, coef) adds W·P̂ of the two keys in raw's low 16 bits (FP8 / U8_LOG) or
 * all 32 (FP16 / BF16) to m0, m1. tile_piece (v2) and the core's prob kernel both decode
 * with it, so they round alike. */
template <int CODEC> struct pair_codec {
    static __device__ __forceinline__ float coef(float w, float scale)
    {
        if (CODEC == MF_CODEC_FP8_E4M3)
            return w * scale * (1.0f / 448.0f); /* a product: no division a tile */
        if (CODEC == MF_CODEC_U8_LOG) /* m·2^((q−255)/16), q = 0 → 0; W folded in */
            return log2f(w * scale) - 255.0f / 16.0f;
        return w;
    }
    /* SET: m0, m1 = the pair's W·P̂ (a first tile: no zeroed accumulator to add to; the
     * same values, as an FFMA into 0 rounds as the product) */
    template <bool SET = false>
    static __device__ __forceinline__ void add(float &m0, float &m1, uint32_t raw, float c)
    {
        if (CODEC == MF_CODEC_FP16 || CODEC == MF_CODEC_BF16) {
            float2 f;
            if (CODEC == MF_CODEC_FP16)
                f = __half22float2(*reinterpret_cast<const __half2 *>(&raw));
            else
                f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&raw));
            m0 = SET ? c * f.x : fmaf(c, f.x, m0);
            m1 = SET ? c * f.y : fmaf(c, f.y, m1);
        } else if (CODEC == MF_CODEC_FP8_E4M3) {
            __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)raw, __NV_E4M3);
            float2 f = __half22float2(*reinterpret_cast<__half2 *>(&hr));
            /* fmaf: written as m0 + c·f the second tile of a stage compiled to a product
             * and a separate add (ncu: 32 FADD more a tile) */
            m0 = SET ? c * f.x : fmaf(c, f.x, m0);
            m1 = SET ? c * f.y : fmaf(c, f.y, m1);
        } else {
            uint32_t q0 = raw & 0xffu, q1 = (raw >> 8) & 0xffu;
            const float e0 = q0 ? exp2f(fmaf((float)q0, 1.0f / 16.0f, c)) : 0.0f;
            const float e1 = q1 ? exp2f(fmaf((float)q1, 1.0f / 16.0f, c)) : 0.0f;
            m0 = SET ? e0 : m0 + e0;
            m1 = SET ? e1 : m1 + e1;
        }
    }
};

/* One thread's piece of a source tile: 8 consecutive keys of one row, 16 bytes (FP16 /
 * BF16) or 8 bytes (FP8 / U8_LOG). m[x] += W·P̂ for the 8 keys. */
template <int CODEC> struct tile_piece {
    static constexpr bool WIDE = CODEC == MF_CODEC_FP16 || CODEC == MF_CODEC_BF16;
    typedef typename std::conditional<WIDE, uint4, uint2>::type raw_t;
    static constexpr int BYTES = WIDE ? 16 : 8;

    static __device__ __forceinline__ void mix(float m[8], const raw_t &raw, float w,
                                               float scale)
    {
        typedef pair_codec<CODEC> pc;
        float c = pc::coef(w, scale);
        if (WIDE) {
            const uint4 &q4 = reinterpret_cast<const uint4 &>(raw);
            const uint32_t wd[4] = { q4.x, q4.y, q4.z, q4.w };
#pragma unroll
            for (int x = 0; x < 4; x++)
                pc::add(m[2 * x], m[2 * x + 1], wd[x], c);
        } else {
            const uint2 &q2 = reinterpret_cast<const uint2 &>(raw);
            const uint32_t wd[2] = { q2.x, q2.y };
#pragma unroll
            for (int x = 0; x < 4; x++)
                pc::add(m[2 * x], m[2 * x + 1], (wd[x >> 1] >> (16 * (x & 1))) & 0xffffu, c);
        }
    }
};

} /* namespace mfc */

#endif /* MF_APPLY_INTERNAL_CUH */
