/* gpt_cuda — see gpt_cuda.h. Layouts as gpt.c: a Linear weight is [out, in], y = x · Wᵀ. */
#include "gpt_cuda.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

namespace {

using namespace nvcuda;

/* ---- kernels ----------------------------------------------------------------------- */

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, ≤ 1024); every thread gets it. */
__device__ float block_sum(float v, float *red)
{
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    v = warp_sum(v);
    __syncthreads(); /* red may still be read from the previous call */
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.0f;
    return warp_sum(v);
}

__global__ void embed_kernel(const uint32_t *tok, const __half *emb, float *x, uint32_t d)
{
    const __half *e = emb + (size_t)tok[blockIdx.x] * d;
    for (uint32_t i = threadIdx.x; i < d; i += blockDim.x)
        x[(size_t)blockIdx.x * d + i] = __half2float(e[i]);
}

/* One block per row; two passes (mean, then variance) in float32, eps 1e-5 as PyTorch. */
__global__ void layernorm_kernel(const float *x, const float *w, const float *b, float *y,
                                 uint32_t d)
{
    __shared__ float red[32];
    const float *xr = x + (size_t)blockIdx.x * d;
    float s = 0;
    for (uint32_t i = threadIdx.x; i < d; i += blockDim.x)
        s += xr[i];
    float mean = block_sum(s, red) / (float)d;
    s = 0;
    for (uint32_t i = threadIdx.x; i < d; i += blockDim.x)
        s += (xr[i] - mean) * (xr[i] - mean);
    float inv = rsqrtf(block_sum(s, red) / (float)d + 1e-5f);
    for (uint32_t i = threadIdx.x; i < d; i += blockDim.x)
        y[(size_t)blockIdx.x * d + i] = (xr[i] - mean) * inv * w[i] + b[i];
}

/* qkv [n, 3D] → q [n, H, d] and this call's cache rows k, v [pos0 + t] (fp16), RoPE on
 * (i, i + d/2) of each head of q and k at angle pos · inv[i] (as gpt.c's rope). */
__global__ void qkv_rope_kernel(const float *qkv, __half *q, __half *kc, __half *vc,
                                const float *inv, uint32_t pos0, uint32_t heads, uint32_t hd)
{
    uint32_t t = blockIdx.x, D = heads * hd, h2 = hd / 2, pos = pos0 + t;
    const float *row = qkv + (size_t)t * 3 * D;
    __half *qt = q + (size_t)t * D, *kt = kc + (size_t)pos * D, *vt = vc + (size_t)pos * D;
    for (uint32_t e = threadIdx.x; e < D / 2; e += blockDim.x) {
        uint32_t h = e / h2, i = e % h2, a = h * hd + i, b = a + h2;
        float ang = (float)pos * inv[i], c = cosf(ang), s = sinf(ang);
        float q1 = row[a], q2 = row[b], k1 = row[D + a], k2 = row[D + b];
        qt[a] = __float2half(q1 * c - q2 * s);
        qt[b] = __float2half(q1 * s + q2 * c);
        kt[a] = __float2half(k1 * c - k2 * s);
        kt[b] = __float2half(k1 * s + k2 * c);
    }
    for (uint32_t e = threadIdx.x; e < D; e += blockDim.x)
        vt[e] = __float2half(row[2 * D + e]);
}

/* Causal attention of query rows pos0 + r against the cache: one warp per (r, h), each lane
 * holding d / 32 (≤ 4) dimensions; online softmax (running max and sum) in float32. */
__global__ void attn_rows_kernel(const __half *q, const __half *k, const __half *v, float *o,
                                 uint32_t pos0, uint32_t n, uint32_t heads, uint32_t hd,
                                 float scale)
{
    uint32_t w = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (w >= n * heads)
        return;
    uint32_t r = w / heads, h = w % heads, per = hd / 32, D = heads * hd;
    float qv[4] = { 0 }, acc[4] = { 0 }, mx = -INFINITY, sum = 0;
    for (uint32_t c = 0; c < per; c++)
        qv[c] = __half2float(q[(size_t)r * D + h * hd + lane + 32 * c]) * scale;
    for (uint32_t j = 0; j <= pos0 + r; j++) {
        const __half *kj = k + (size_t)j * D + h * hd, *vj = v + (size_t)j * D + h * hd;
        float s = 0;
        for (uint32_t c = 0; c < per; c++)
            s += qv[c] * __half2float(kj[lane + 32 * c]);
        s = warp_sum(s);
        float m2 = fmaxf(mx, s), corr = expf(mx - m2), p = expf(s - m2);
        sum = sum * corr + p;
        for (uint32_t c = 0; c < per; c++)
            acc[c] = acc[c] * corr + p * __half2float(vj[lane + 32 * c]);
        mx = m2;
    }
    for (uint32_t c = 0; c < per; c++)
        o[(size_t)r * D + h * hd + lane + 32 * c] = acc[c] / sum;
}

/* y[m, nout] (=, +=, = GELU of) a[m, kin] · w[nout, kin]ᵀ. A 64 × 64 tile per block of four
 * warps (32 × 32 each, 2 × 2 WMMA fragments); a (float32) and w (fp16) are staged through
 * shared memory 32 columns at a time, zero-padded at the edges, a rounded to fp16 there. */
enum { EPI_STORE, EPI_ADD, EPI_GELU };
constexpr int GM = 64, GN = 64, GK = 32, LDH = GK + 8, LDC = GN + 4, GEMM_THREADS = 128;

template <int EPI>
__global__ void __launch_bounds__(GEMM_THREADS)
gemm_kernel(const float *__restrict__ a, const __half *__restrict__ w, float *__restrict__ y,
            int m, int nout, int kin)
{
    __shared__ __align__(32) __half sa[GM * LDH];
    __shared__ __align__(32) __half sb[GN * LDH];
    __shared__ __align__(32) float sc[GM * LDC];
    int m0 = blockIdx.y * GM, n0 = blockIdx.x * GN, warp = threadIdx.x / 32;
    int wm = (warp / 2) * 32, wn = (warp % 2) * 32;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            wmma::fill_fragment(acc[i][j], 0.0f);
    for (int k0 = 0; k0 < kin; k0 += GK) {
        for (int e = threadIdx.x; e < GM * GK; e += GEMM_THREADS) {
            int r = e / GK, c = e % GK, gk = k0 + c, gm = m0 + r, gn = n0 + r;
            sa[r * LDH + c] = __float2half(gm < m && gk < kin ? a[(size_t)gm * kin + gk] : 0.0f);
            sb[r * LDH + c] = gn < nout && gk < kin ? w[(size_t)gn * kin + gk] : __float2half(0.0f);
        }
        __syncthreads();
        for (int kk = 0; kk < GK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb[2];
            for (int i = 0; i < 2; i++)
                wmma::load_matrix_sync(fa[i], sa + (wm + 16 * i) * LDH + kk, LDH);
            for (int j = 0; j < 2; j++) /* column n of Wᵀ is row n of w: col-major, ld LDH */
                wmma::load_matrix_sync(fb[j], sb + (wn + 16 * j) * LDH + kk, LDH);
            for (int i = 0; i < 2; i++)
                for (int j = 0; j < 2; j++)
                    wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        __syncthreads();
    }
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            wmma::store_matrix_sync(sc + (wm + 16 * i) * LDC + wn + 16 * j, acc[i][j], LDC,
                                    wmma::mem_row_major);
    __syncthreads();
    for (int e = threadIdx.x; e < GM * GN; e += GEMM_THREADS) {
        int r = e / GN, c = e % GN, gm = m0 + r, gn = n0 + c;
        if (gm >= m || gn >= nout)
            continue;
        float v = sc[r * LDC + c], *p = y + (size_t)gm * nout + gn;
        if (EPI == EPI_ADD)
            *p += v;
        else if (EPI == EPI_GELU)
            *p = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
        else
            *p = v;
    }
}

template <int EPI>
void gemm(cudaStream_t s, const float *a, const __half *w, float *y, uint32_t m, uint32_t nout,
          uint32_t kin)
{
    dim3 grid((nout + GN - 1) / GN, (m + GM - 1) / GM);
    gemm_kernel<EPI><<<grid, GEMM_THREADS, 0, s>>>(a, w, y, (int)m, (int)nout, (int)kin);
}

/* ---- host side --------------------------------------------------------------------- */

struct dlayer {
    float *ln1_w, *ln1_b, *ln2_w, *ln2_b;
    __half *qkv, *proj, *fc, *out;
};

} /* namespace */

struct mfw_gpt_cuda {
    mfw_gpt_cfg_t c;
    __half *emb;
    float *lnf_w, *lnf_b, *rope_inv;
    dlayer *l;
};

struct mfw_run_cuda {
    const mfw_gpt_cuda_t *g;
    uint32_t len, max, cap;  /* cap: tokens the scratch below holds */
    cudaStream_t s;
    __half *k, *v;           /* [L][max][H][d] */
    float *x, *xn, *wide, *o, *logits; /* [cap, D], [cap, D], [cap, 4D], [cap, D], [cap, V] */
    __half *q;               /* [cap, D] */
    uint32_t *tok;           /* [cap] */
    const char *why;
};

static mf_status_t cuda_fail(cudaError_t e, const char **why)
{
    if (e == cudaSuccess)
        return MF_OK;
    *why = cudaGetErrorString(e);
    return e == cudaErrorMemoryAllocation ? MF_RESOURCE_EXHAUSTED : MF_INTERNAL;
}

extern "C" int mfw_cuda_usable(char *why, size_t whylen)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        /* cudart says "driver version is insufficient" when there is no driver at all. */
        snprintf(why, whylen, "%s",
                 e == cudaErrorInsufficientDriver ? "no CUDA driver, or one older than this "
                                                    "build's runtime (CUDA 13)"
                 : e != cudaSuccess               ? cudaGetErrorString(e)
                                                  : "no CUDA device");
        cudaGetLastError(); /* clear it: the CPU path goes on */
        return 0;
    }
    return 1;
}

/* Uploads n floats as float32 (f16 = 0) or rounded to fp16. */
static cudaError_t upload(void **dst, const float *src, size_t n, int f16)
{
    size_t bytes = n * (f16 ? sizeof(__half) : sizeof(float));
    void *host = malloc(bytes);
    if (!host)
        return cudaErrorMemoryAllocation;
    if (f16)
        for (size_t i = 0; i < n; i++)
            ((__half *)host)[i] = __float2half(src[i]);
    else
        memcpy(host, src, bytes);
    cudaError_t e = cudaMalloc(dst, bytes);
    if (e == cudaSuccess)
        e = cudaMemcpy(*dst, host, bytes, cudaMemcpyHostToDevice);
    free(host);
    return e;
}

extern "C" void mfw_gpt_cuda_free(mfw_gpt_cuda_t *g)
{
    if (!g)
        return;
    for (uint32_t i = 0; g->l && i < g->c.n_layer; i++) {
        dlayer *l = &g->l[i];
        void *all[] = { l->ln1_w, l->ln1_b, l->ln2_w, l->ln2_b, l->qkv, l->proj, l->fc, l->out };
        for (size_t k = 0; k < sizeof all / sizeof *all; k++)
            cudaFree(all[k]);
    }
    free(g->l);
    cudaFree(g->emb);
    cudaFree(g->lnf_w);
    cudaFree(g->lnf_b);
    cudaFree(g->rope_inv);
    free(g);
}

extern "C" mf_status_t mfw_gpt_cuda_load(const mfw_gpt_t *m, mfw_gpt_cuda_t **out,
                                         int *device, char *name, size_t namelen, char *err,
                                         size_t errlen)
{
    *out = NULL;
    const mfw_gpt_cfg_t *c = mfw_gpt_cfg(m);
    const char *why = "";
    if (mf_cuda_supported(64, c->head_dim, MF_DTYPE_F16, 1, &why) != MF_OK || c->head_dim > 128) {
        snprintf(err, errlen, "the CUDA path needs head dim 64 or 128 (this model: %u)", c->head_dim);
        return MF_UNIMPLEMENTED;
    }
    int dev = 0;
    cudaDeviceProp prop;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        e = cudaGetDeviceProperties(&prop, dev);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "CUDA device: %s", cudaGetErrorString(e));
        return MF_UNAVAILABLE;
    }
    *device = dev;
    snprintf(name, namelen, "%s", prop.name);
    mfw_gpt_cuda_t *g = (mfw_gpt_cuda_t *)calloc(1, sizeof *g);
    if (!g || !(g->l = (dlayer *)calloc(c->n_layer, sizeof(dlayer)))) {
        free(g);
        return MF_RESOURCE_EXHAUSTED;
    }
    g->c = *c;
    size_t D = c->d_model;
    mfw_gpt_view_t v;
    mfw_gpt_view(m, &v);
    e = upload((void **)&g->emb, v.emb, (size_t)c->vocab * D, 1);
    if (e == cudaSuccess)
        e = upload((void **)&g->lnf_w, v.lnf_w, D, 0);
    if (e == cudaSuccess)
        e = upload((void **)&g->lnf_b, v.lnf_b, D, 0);
    if (e == cudaSuccess)
        e = upload((void **)&g->rope_inv, v.rope_inv, c->head_dim / 2, 0);
    for (uint32_t i = 0; i < c->n_layer && e == cudaSuccess; i++) {
        mfw_gpt_layer_view_t lv;
        mfw_gpt_layer_view(m, i, &lv);
        dlayer *l = &g->l[i];
        struct { void **dst; const float *src; size_t n; int f16; } t[] = {
            { (void **)&l->ln1_w, lv.ln1_w, D, 0 }, { (void **)&l->ln1_b, lv.ln1_b, D, 0 },
            { (void **)&l->ln2_w, lv.ln2_w, D, 0 }, { (void **)&l->ln2_b, lv.ln2_b, D, 0 },
            { (void **)&l->qkv, lv.qkv, 3 * D * D, 1 }, { (void **)&l->proj, lv.proj, D * D, 1 },
            { (void **)&l->fc, lv.fc, 4 * D * D, 1 }, { (void **)&l->out, lv.out, 4 * D * D, 1 },
        };
        for (size_t k = 0; k < sizeof t / sizeof *t && e == cudaSuccess; k++)
            e = upload(t[k].dst, t[k].src, t[k].n, t[k].f16);
    }
    /* cudaMemcpy from pageable memory may return before its DMA lands, and the runs'
     * streams do not wait for the legacy stream: finish here. */
    if (e == cudaSuccess)
        e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        snprintf(err, errlen, "uploading the weights: %s", cudaGetErrorString(e));
        mfw_gpt_cuda_free(g);
        return e == cudaErrorMemoryAllocation ? MF_RESOURCE_EXHAUSTED : MF_INTERNAL;
    }
    *out = g;
    return MF_OK;
}

static void free_scratch(mfw_run_cuda_t *r)
{
    void *all[] = { r->x, r->xn, r->wide, r->o, r->logits, r->q, r->tok };
    for (size_t k = 0; k < sizeof all / sizeof *all; k++)
        cudaFree(all[k]);
    r->x = r->xn = r->wide = r->o = r->logits = NULL;
    r->q = NULL;
    r->tok = NULL;
    r->cap = 0;
}

/* Scratch for n tokens (grown, never shrunk). */
static cudaError_t ensure_scratch(mfw_run_cuda_t *r, uint32_t n)
{
    if (n <= r->cap)
        return cudaSuccess;
    free_scratch(r);
    size_t D = r->g->c.d_model, V = r->g->c.vocab;
    cudaError_t e = cudaMalloc((void **)&r->x, sizeof(float) * n * D);
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&r->xn, sizeof(float) * n * D);
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&r->wide, sizeof(float) * n * 4 * D);
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&r->o, sizeof(float) * n * D);
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&r->logits, sizeof(float) * n * V);
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&r->q, sizeof(__half) * n * D);
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&r->tok, sizeof(uint32_t) * n);
    if (e != cudaSuccess)
        free_scratch(r);
    else
        r->cap = n;
    return e;
}

extern "C" void mfw_run_cuda_free(mfw_run_cuda_t *r)
{
    if (!r)
        return;
    free_scratch(r);
    cudaFree(r->k);
    cudaFree(r->v);
    if (r->s)
        cudaStreamDestroy(r->s);
    free(r);
}

extern "C" mf_status_t mfw_run_cuda_create(const mfw_gpt_cuda_t *g, uint32_t max_tokens,
                                           mfw_run_cuda_t **out)
{
    *out = NULL;
    if (max_tokens == 0 || max_tokens > (1u << 20))
        return MF_INVALID_ARGUMENT;
    mfw_run_cuda_t *r = (mfw_run_cuda_t *)calloc(1, sizeof *r);
    if (!r)
        return MF_RESOURCE_EXHAUSTED;
    r->g = g;
    r->max = max_tokens;
    r->why = "";
    size_t n = (size_t)g->c.n_layer * max_tokens * g->c.d_model * sizeof(__half);
    cudaError_t e = cudaStreamCreateWithFlags(&r->s, cudaStreamNonBlocking);
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&r->k, n);
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&r->v, n);
    /* scratch for a typical prefill now, so the first (timed) forward call does not pay
     * for the allocations; longer calls grow it */
    if (e == cudaSuccess)
        e = ensure_scratch(r, max_tokens < 8192 ? max_tokens : 8192);
    if (e != cudaSuccess) {
        mfw_run_cuda_free(r);
        return e == cudaErrorMemoryAllocation ? MF_RESOURCE_EXHAUSTED : MF_INTERNAL;
    }
    *out = r;
    return MF_OK;
}

extern "C" const char *mfw_run_cuda_error(const mfw_run_cuda_t *r)
{
    return r->why;
}

extern "C" mf_status_t mfw_cuda_attention(const mfw_cuda_attn_args_t *a, const char **why)
{
    cudaStream_t s = (cudaStream_t)a->stream;
    if (a->pos0 == 0) {
        /* Every head in compute mode: mf_apply_cuda's dense causal attention. W and the
         * source-head count only have to be valid; no rows are read. */
        static const float ones[64] = { 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                        1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                        1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                        1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1 };
        static const uint8_t compute[64] = { 0 }; /* MF_HEAD_COMPUTE */
        mf_layer_map_t map = { a->n_heads, 1, ones, compute, NULL };
        mf_apply_cuda_args_t aa;
        memset(&aa, 0, sizeof aa);
        aa.map = &map;
        aa.tgt = { a->q, a->k, a->v, MF_DTYPE_F16, a->n, a->n_heads, a->n_heads, a->head_dim };
        aa.block_size = 64;
        aa.o = a->o;
        return mf_apply_cuda(&aa, a->stream, why);
    }
    if (a->head_dim % 32 || a->head_dim > 128) {
        *why = "decode attention needs a head dim that is a multiple of 32, at most 128";
        return MF_UNIMPLEMENTED;
    }
    uint32_t warps = a->n * a->n_heads, per_block = 4;
    attn_rows_kernel<<<(warps + per_block - 1) / per_block, 32 * per_block, 0, s>>>(
        (const __half *)a->q, (const __half *)a->k, (const __half *)a->v, a->o, a->pos0, a->n,
        a->n_heads, a->head_dim, 1.0f / sqrtf((float)a->head_dim));
    return cuda_fail(cudaGetLastError(), why);
}

extern "C" mf_status_t mfw_gpt_cuda_forward(const mfw_gpt_cuda_t *g, mfw_run_cuda_t *r,
                                            const uint32_t *tokens, uint32_t n,
                                            mfw_cuda_attn_fn attn, void *ctx,
                                            uint32_t logits_from, float *logits)
{
    const mfw_gpt_cfg_t *c = &g->c;
    uint32_t D = c->d_model, pos0 = r->len, th = D < 1024 ? (D + 31) / 32 * 32 : 1024;
    r->why = "";
    if (n == 0 || n > r->max - r->len || logits_from > n)
        return MF_OUT_OF_RANGE;
    for (uint32_t t = 0; t < n; t++)
        if (tokens[t] >= c->vocab)
            return MF_INVALID_ARGUMENT;
    cudaStream_t s = r->s;
    mf_status_t st = cuda_fail(ensure_scratch(r, n), &r->why);
    if (st == MF_OK)
        st = cuda_fail(cudaMemcpyAsync(r->tok, tokens, sizeof(uint32_t) * n,
                                       cudaMemcpyHostToDevice, s), &r->why);
    if (st != MF_OK)
        return st;
    embed_kernel<<<n, th, 0, s>>>(r->tok, g->emb, r->x, D);
    for (uint32_t l = 0; l < c->n_layer && st == MF_OK; l++) {
        const dlayer *ly = &g->l[l];
        __half *kc = r->k + (size_t)l * r->max * D, *vc = r->v + (size_t)l * r->max * D;
        layernorm_kernel<<<n, th, 0, s>>>(r->x, ly->ln1_w, ly->ln1_b, r->xn, D);
        gemm<EPI_STORE>(s, r->xn, ly->qkv, r->wide, n, 3 * D, D);
        qkv_rope_kernel<<<n, th, 0, s>>>(r->wide, r->q, kc, vc, g->rope_inv, pos0, c->n_head,
                                         c->head_dim);
        mfw_cuda_attn_args_t aa = { l, pos0, n, c->n_head, c->head_dim, r->q, kc, vc, r->o,
                                    (mf_cuda_stream_t)s };
        if ((st = cuda_fail(cudaGetLastError(), &r->why)) != MF_OK ||
            (st = attn ? attn(ctx, &aa) : mfw_cuda_attention(&aa, &r->why)) != MF_OK)
            break;
        gemm<EPI_ADD>(s, r->o, ly->proj, r->x, n, D, D);
        layernorm_kernel<<<n, th, 0, s>>>(r->x, ly->ln2_w, ly->ln2_b, r->xn, D);
        gemm<EPI_GELU>(s, r->xn, ly->fc, r->wide, n, 4 * D, D);
        gemm<EPI_ADD>(s, r->wide, ly->out, r->x, n, D, 4 * D);
    }
    uint32_t k = n - logits_from;
    if (st == MF_OK && logits && k) {
        layernorm_kernel<<<k, th, 0, s>>>(r->x + (size_t)logits_from * D, g->lnf_w, g->lnf_b,
                                          r->xn, D);
        gemm<EPI_STORE>(s, r->xn, g->emb, r->logits, k, c->vocab, D);
        st = cuda_fail(cudaMemcpyAsync(logits, r->logits, sizeof(float) * k * c->vocab,
                                       cudaMemcpyDeviceToHost, s), &r->why);
    }
    /* Synchronous, so the caller's timings and buffers are final; errors of any queued
     * kernel surface here. */
    cudaError_t e = cudaStreamSynchronize(s);
    if (st == MF_OK && (st = cuda_fail(e, &r->why)) == MF_OK)
        st = cuda_fail(cudaGetLastError(), &r->why);
    if (st == MF_OK)
        r->len += n;
    return st;
}
