/*
 * mf_cuda_common — device helpers shared by extract.cu and apply.cu: tensor-core tile
 * products (mma.sync m16n8k16, ldmatrix, cp.async), the map-row layout read in place,
 * the row codecs on the device, and host-side checks and scratch. Internal to kernels/.
 *
 * One CTA works on one query block of B rows: B / 16 warps, warp w owns rows 16w..16w+15.
 * Shared tiles are [B][D + 8] elements: the 16-byte pad puts the 8 rows an ldmatrix reads
 * in different banks. Fragment layouts are PTX's m16n8k16 ones (g = lane / 4, u = lane % 4).
 */
#ifndef MF_CUDA_COMMON_CUH
#define MF_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mapflow_kernels_cuda.h"

#define MF_LOG2E 1.4426950408889634f
#define MF_LN2 0.6931471805599453f

namespace mfc {

/* ---- element types ---------------------------------------------------------------- */

template <typename T> struct elem;
template <> struct elem<__half> {
    static __device__ __forceinline__ uint32_t pack(float a, float b)
    {
        __half2 h = __floats2half2_rn(a, b);
        return *reinterpret_cast<uint32_t *>(&h);
    }
};
template <> struct elem<__nv_bfloat16> {
    static __device__ __forceinline__ uint32_t pack(float a, float b)
    {
        __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
        return *reinterpret_cast<uint32_t *>(&h);
    }
};

template <typename T>
__device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma<__half>(float c[4], const uint32_t a[4], uint32_t b0,
                                            uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma<__nv_bfloat16>(float c[4], const uint32_t a[4], uint32_t b0,
                                                   uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* The dynamic shared memory aligned to `align` bytes (1024: the 128-byte swizzle's atom) by
 * adding an offset to the __shared__ array itself. Rounding through an integer loses the
 * address space: every access through the result then compiles to a generic ld / st, which
 * waits on the long scoreboard and may alias global memory, so the compiler cannot reorder
 * around it (the prob producer's serial chain, issue 19: ncu stall samples). */
__device__ __forceinline__ uint8_t *smem_align(uint8_t *raw, uint32_t align)
{
    return raw + ((align - (smem_addr(raw) & (align - 1))) & (align - 1));
}

__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

/* 16-byte async copy; src_bytes 0 zero-fills (rows past N). */
__device__ __forceinline__ void cp16(void *dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)),
                 "l"(src), "r"(src_bytes));
}
/* 8- and 4-byte async copies (through L1; .cg takes 16 bytes only). */
__device__ __forceinline__ void cp8(void *dst, const void *src)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(smem_addr(dst)), "l"(src));
}
__device__ __forceinline__ void cp4(void *dst, const void *src)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(dst)), "l"(src));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* Shape of one CTA's problem: block size B, head dim D, element type T. */
template <int B_, int D_, typename T_> struct shape {
    static constexpr int B = B_, D = D_, WARPS = B_ / 16, THREADS = B_ / 16 * 32;
    static constexpr int LD = D_ + 8; /* padded row, elements */
    static constexpr int TILE = B_ * LD; /* elements of one [B][D] shared tile */
    typedef T_ T;
};

/* Global [N][H][D] tensor: B rows from row0 (head h) into a shared [B][LD] tile. Rows
 * ≥ n are zero-filled. Called by the nthr threads tid = 0..nthr−1 (default: the whole
 * CTA of S::THREADS); caller commits. */
template <class S>
__device__ __forceinline__ void load_tile(typename S::T *dst, const typename S::T *src,
                                          uint32_t row0, uint32_t n, uint32_t heads,
                                          uint32_t h, int tid = -1, int nthr = S::THREADS)
{
    constexpr int CH = S::D / 8; /* 16-byte chunks per row */
    for (int x = tid < 0 ? (int)threadIdx.x : tid; x < S::B * CH; x += nthr) {
        int r = x / CH, c = x % CH;
        uint32_t gr = row0 + r;
        bool ok = gr < n;
        const typename S::T *p = src + ((size_t)(ok ? gr : 0) * heads + h) * S::D + c * 8;
        cp16(dst + r * S::LD + c * 8, p, ok ? 16 : 0);
    }
}

/* Q fragments of this warp's 16 rows (A operand, all D / 16 k-steps). */
template <class S>
__device__ __forceinline__ void load_q_frags(uint32_t qf[][4], const typename S::T *qs)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int row = w * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int ks = 0; ks < S::D / 16; ks++)
        ldsm_x4(qf[ks], qs + row * S::LD + ks * 16 + (lane >> 4) * 8);
}

/* s[nt][4] = Q·Kᵀ for this warp's rows against the B keys of the shared K tile. */
template <class S>
__device__ __forceinline__ void qk(float s[][4], const uint32_t qf[][4],
                                   const typename S::T *ks)
{
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int nt = 0; nt < S::B / 8; nt++)
        s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int nt = 0; nt < S::B / 8; nt += 2) {
        int key = nt * 8 + (lane & 7) + (lane >> 4) * 8;
#pragma unroll
        for (int kk = 0; kk < S::D / 16; kk++) {
            uint32_t r[4];
            ldsm_x4(r, ks + key * S::LD + kk * 16 + ((lane >> 3) & 1) * 8);
            mma<typename S::T>(s[nt], qf[kk], r[0], r[1]);
            mma<typename S::T>(s[nt + 1], qf[kk], r[2], r[3]);
        }
    }
}

/* o[dt][4] += P·V: p[kk][4] A fragments over the B keys (k-step kk), V from the shared
 * tile. perm: key order of the prob path (see apply.cu), else natural. */
template <class S, bool PERM>
__device__ __forceinline__ void pv_kstep(float o[][4], const uint32_t p[4],
                                         const typename S::T *vs, int kk)
{
    int lane = threadIdx.x & 31;
    int pos = (lane & 7) + ((lane >> 3) & 1) * 8; /* position within the k-step */
    int key;
    if (PERM) {
        /* position p of k-step kk ↔ key 32·(kk/2) + 8·((p%8)/2) + 4·(kk%2) + 2·(p/8) + p%2 */
        key = 32 * (kk >> 1) + 8 * ((pos & 7) >> 1) + 4 * (kk & 1) + 2 * (pos >> 3) + (pos & 1);
    } else {
        key = kk * 16 + pos;
    }
#pragma unroll
    for (int dt = 0; dt < S::D / 8; dt += 2) {
        uint32_t r[4];
        ldsm_x4_t(r, vs + key * S::LD + dt * 8 + (lane >> 4) * 8);
        mma<typename S::T>(o[dt], p, r[0], r[1]);
        mma<typename S::T>(o[dt + 1], p, r[2], r[3]);
    }
}
template <class S, bool PERM>
__device__ __forceinline__ void pv(float o[][4], const uint32_t p[][4],
                                   const typename S::T *vs)
{
#pragma unroll
    for (int kk = 0; kk < S::B / 16; kk++)
        pv_kstep<S, PERM>(o, p[kk], vs, kk);
}

/* Streams the K (and V) tiles of `count` key blocks jf(0..count−1) through two shared
 * stages with cp.async, calling body(k_tile, v_tile, j, x) once each is resident. Every
 * thread of the CTA calls it; body may use __syncthreads. */
template <class S, bool WITH_V, class JF, class BODY>
__device__ __forceinline__ void kv_loop(typename S::T *ks, typename S::T *vs,
                                        const typename S::T *K, const typename S::T *V,
                                        uint32_t n, uint32_t hkv, uint32_t kvh, int count,
                                        JF jf, BODY body)
{
    if (count <= 0)
        return;
    load_tile<S>(ks, K, jf(0) * S::B, n, hkv, kvh);
    if (WITH_V)
        load_tile<S>(vs, V, jf(0) * S::B, n, hkv, kvh);
    cp_commit();
    for (int x = 0; x < count; x++) {
        int st = x & 1;
        if (x + 1 < count) {
            uint32_t jn = jf(x + 1);
            load_tile<S>(ks + (st ^ 1) * S::TILE, K, jn * S::B, n, hkv, kvh);
            if (WITH_V)
                load_tile<S>(vs + (st ^ 1) * S::TILE, V, jn * S::B, n, hkv, kvh);
            cp_commit();
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        body(ks + st * S::TILE, vs + st * S::TILE, jf(x), x);
        __syncthreads();
    }
}

/* Largest / sum over the 4 lanes of a quad (one row's values in C fragments). */
__device__ __forceinline__ float quad_max(float x)
{
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x)
{
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/* The O store, the one copy every attention epilogue uses (apply's v2, the sm_90a core
 * for mf_apply_cuda, mf_export_cuda, mf_attention_*_cuda): this thread's D / 4 values of
 * one O row, the pairs (v[4x], v[4x + 1]) at columns 8x + 2u (x < D / 8; the m16n8 and
 * wgmma accumulator layout, v = the row's first value, stride 4), times inv (1 / the row
 * sum), into element `at` of o: float (o_t = 0), or T (o_t = 1: the model's dtype, so it
 * needs no fp32 O and no cast), rounded once to nearest from the same fp32 products, so
 * O in T is rn(fp32 O) bit for bit. A quad writes 32 (float) or 16 (T) contiguous bytes. */
template <typename T, int D>
__device__ __forceinline__ void store_o_row(void *o, uint32_t o_t, size_t at, const float *v,
                                            float inv)
{
    if (o_t) {
        T *dst = static_cast<T *>(o) + at;
#pragma unroll
        for (int x = 0; x < D / 8; x++)
            *reinterpret_cast<uint32_t *>(dst + 8 * x) =
                elem<T>::pack(v[4 * x] * inv, v[4 * x + 1] * inv);
    } else {
        float *dst = static_cast<float *>(o) + at;
#pragma unroll
        for (int x = 0; x < D / 8; x++)
            *reinterpret_cast<float2 *>(dst + 8 * x) =
                make_float2(v[4 * x] * inv, v[4 * x + 1] * inv);
    }
}

/* Scaled (log2) scores of this warp's rows against the K tile of key block j, with the
 * keys above the diagonal (j == i, key > row) at −inf. */
template <class S>
__device__ __forceinline__ void scores(float s[][4], const uint32_t qf[][4],
                                       const typename S::T *ks, uint32_t i, uint32_t j,
                                       float sl2)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    qk<S>(s, qf, ks);
#pragma unroll
    for (int nt = 0; nt < S::B / 8; nt++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            int q = w * 16 + (lane >> 2) + (c >> 1) * 8, kk = nt * 8 + (lane & 3) * 2 + (c & 1);
            s[nt][c] = (j == i && kk > q) ? -INFINITY : s[nt][c] * sl2;
        }
}

/* Online softmax over one key block: s becomes exp2(s − new max) in place; m, l (this
 * thread's rows g, g + 8; l a per-thread partial sum) are updated; alpha rescales the
 * earlier accumulators. */
template <class S>
__device__ __forceinline__ void softmax_step(float s[][4], float m[2], float l[2],
                                             float alpha[2])
{
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < S::B / 8; nt++)
            mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
        float mn = fmaxf(m[r], quad_max(mx));
        float base = mn == -INFINITY ? 0.0f : mn, sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < S::B / 8; nt++) {
            s[nt][2 * r] = exp2f(s[nt][2 * r] - base);
            s[nt][2 * r + 1] = exp2f(s[nt][2 * r + 1] - base);
            sum += s[nt][2 * r] + s[nt][2 * r + 1];
        }
        alpha[r] = exp2f(m[r] - base);
        l[r] = l[r] * alpha[r] + sum;
        m[r] = mn;
    }
}

/* Barrier over a group of nthr threads: named barrier bar (1..15), or the CTA (bar 0). */
__device__ __forceinline__ void group_sync(int bar, int nthr)
{
    if (bar == 0)
        __syncthreads();
    else
        asm volatile("bar.sync %0, %1;\n" ::"r"(bar), "r"(nthr) : "memory");
}

/*
 * Top-P over candidates (mf_topp_select's rule): cm[x], cj[x] for x < n are the
 * candidates other than blocks 0 and i; acc0 the mass of {0, i}; target = top_p × total.
 * Sorts them (largest mass first, ties to the lower j) and returns how many of the sorted
 * items are kept. cm / cj hold ≥ pow2(n) slots. Every thread of the group calls (default:
 * the whole CTA; else threads tid = 0..nthr−1 that share named barrier bar); result to all.
 */
__device__ __forceinline__ int topp_sorted(double *cm, uint32_t *cj, int n, double acc0,
                                           double target, int *result, int tid = -1,
                                           int nthr = -1, int bar = 0)
{
    if (tid < 0) {
        tid = threadIdx.x;
        nthr = blockDim.x;
    }
    int p2 = 1;
    while (p2 < n)
        p2 <<= 1;
    for (int x = n + tid; x < p2; x += nthr) {
        cm[x] = -1.0;
        cj[x] = 0xffffffffu;
    }
    group_sync(bar, nthr);
    for (int k = 2; k <= p2; k <<= 1)
        for (int jj = k >> 1; jj > 0; jj >>= 1) {
            for (int x = tid; x < p2; x += nthr) {
                int y = x ^ jj;
                if (y <= x)
                    continue;
                double mx = cm[x], my = cm[y];
                uint32_t jx = cj[x], jy = cj[y];
                bool y_first = my > mx || (my == mx && jy < jx);
                bool x_first = mx > my || (mx == my && jx < jy);
                if ((x & k) == 0 ? y_first : x_first) {
                    cm[x] = my;
                    cm[y] = mx;
                    cj[x] = jy;
                    cj[y] = jx;
                }
            }
            group_sync(bar, nthr);
        }
    if (tid == 0) {
        int kept = 0;
        double acc = acc0;
        while (kept < n && acc < target)
            acc += cm[kept++];
        *result = kept;
    }
    group_sync(bar, nthr);
    return *result;
}

/* ---- map rows in place (proto/mf_row.h) ------------------------------------------- */

struct row_dev {
    const uint8_t *base;
    uint32_t n_cols, n_entries, block_index, block_size, n_heads, codec, total;
    const uint32_t *cols, *col_off;
    const uint64_t *head_mask;
    const uint8_t *mass;
    const float *scales;
    const uint8_t *tiles;
    uint32_t tile_bytes;
};

__host__ __device__ __forceinline__ uint64_t align16(uint64_t x) { return (x + 15) & ~15ull; }
__host__ __device__ __forceinline__ uint32_t codec_elem(uint32_t c)
{
    return c == MF_CODEC_MASK ? 0 : (c == MF_CODEC_FP16 || c == MF_CODEC_BF16) ? 2 : 1;
}
__host__ __device__ __forceinline__ bool codec_scales(uint32_t c)
{
    return c == MF_CODEC_FP8_E4M3 || c == MF_CODEC_U8_LOG;
}

/* Section offsets exactly as mf_row_layout() computes them. */
struct row_offsets {
    uint64_t model, tokens, cols, col_off, head_mask, mass, scales, tiles, total, tile_bytes;
};
__host__ __device__ __forceinline__ row_offsets row_layout(uint32_t codec, uint32_t b,
                                                           uint32_t n_cols, uint32_t e,
                                                           uint32_t model_len)
{
    row_offsets o;
    uint64_t off = MF_ROW_HEADER;
    o.model = off;
    off = align16(off + model_len);
    o.tokens = off;
    off = align16(off + 4ull * b);
    o.cols = off;
    off = align16(off + 4ull * n_cols);
    o.col_off = off;
    off = align16(off + 4ull * n_cols);
    o.head_mask = off;
    off = align16(off + 8ull * n_cols);
    o.mass = off;
    off = align16(off + (uint64_t)e);
    o.scales = off;
    if (codec_scales(codec))
        off = align16(off + 4ull * e);
    o.tile_bytes = (uint64_t)b * b * codec_elem(codec);
    o.tiles = off;
    o.total = off + (uint64_t)e * o.tile_bytes;
    return o;
}

/* Reads the header of a row (validated earlier by the daemon / the writer). */
__device__ __forceinline__ row_dev row_open(const uint8_t *p)
{
    const mf_row_header_t *h = reinterpret_cast<const mf_row_header_t *>(p);
    row_dev r;
    r.base = p;
    r.codec = h->codec;
    r.n_cols = h->n_cols;
    r.n_entries = h->n_entries;
    r.block_index = h->block_index;
    r.block_size = h->block_size;
    r.n_heads = h->n_heads;
    r.total = h->total_size;
    row_offsets o = row_layout(r.codec, r.block_size, r.n_cols, r.n_entries, h->model_len);
    r.cols = reinterpret_cast<const uint32_t *>(p + o.cols);
    r.col_off = reinterpret_cast<const uint32_t *>(p + o.col_off);
    r.head_mask = reinterpret_cast<const uint64_t *>(p + o.head_mask);
    r.mass = p + o.mass;
    r.scales = codec_scales(r.codec) ? reinterpret_cast<const float *>(p + o.scales) : nullptr;
    r.tiles = p + o.tiles;
    r.tile_bytes = (uint32_t)o.tile_bytes;
    return r;
}

/* Entry of (column c with mask m, head h): col_off + popcount of the heads below h. */
__device__ __forceinline__ uint32_t entry_of(uint32_t col_off, uint64_t m, uint32_t h)
{
    return col_off + __popcll(h ? (m & (~0ull >> (64 - h))) : 0ull);
}

/* mf_mass_decode / mf_mass_encode, bit-exact (IEEE division, sqrt, round-to-even). */
__device__ __forceinline__ float mass_decode(uint8_t q)
{
    float s = (float)q / 255.0f;
    return s * s;
}
__device__ __forceinline__ uint8_t mass_encode(float m)
{
    if (!(m > 0.0f))
        return 0;
    if (m >= 1.0f)
        return 255;
    return (uint8_t)__float2int_rn(sqrtf(m) * 255.0f);
}

/* ---- host side -------------------------------------------------------------------- */

/* A cudaError_t as a status and a message. */
mf_status_t cuda_status(cudaError_t e, const char **why);

/* A (bench) switch from the environment: the index of its value in names[0..n), -1 when
 * unset or empty, -2 when set to anything else. */
static inline int env_choice(const char *var, const char *const *names, int n)
{
    const char *e = getenv(var);
    if (!e || !*e)
        return -1;
    for (int x = 0; x < n; x++)
        if (!strcmp(e, names[x]))
            return x;
    return -2;
}

/* Stream-ordered scratch: one allocation, carved into 256-byte aligned pieces. */
struct scratch {
    uint8_t *base = nullptr;
    size_t used = 0;
    size_t take(size_t bytes)
    {
        size_t off = used;
        used += (bytes + 255) & ~(size_t)255;
        return off;
    }
};

} /* namespace mfc */

#endif /* MF_CUDA_COMMON_CUH */
