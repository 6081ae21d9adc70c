/*
 * gpu_check — the CUDA kernels (mapflow_kernels_cuda.h) against the C reference
 * (mapflow_kernels.h) and a float64 computation, on fresh random inputs each run
 * (structured Q/K/V from mf_synth, seed printed; --seed S repeats a run). Outputs are
 * poisoned before each launch.
 *   extract: every GPU row decodes (structure + xxh3 checksum); block masses within 1e-3
 *            of float64; kept sets equal to the reference's, or a valid Top-P set within
 *            the 1e-3 mass tolerance; tiles within twice the codec bound; mass bytes ±1.
 *   dense:   the sm_90a core (mf_attention_dense_cuda): ‖O − O64‖ / ‖O64‖ ≤ 2e-3, LSE within
 *            1e-3, every element written; with MF_CORE_PVWAIT=1 O and LSE bit for bit.
 *   masses:  mf_attention_masses_cuda: O / LSE as dense; B = 64 block masses within 1e-4 of
 *            float64 (relative 1e-3 where ≥ 1e-4) and of mf_extract_cuda's mass_out; Top-P
 *            kept sets from them equal to the float64 masses' (near-ties within 1e-4
 *            counted apart); 0 above the diagonal; bad arguments refused. Each case runs
 *            every MF_MASS_VARIANT (v2 default, v3 – v6) with these checks, and each
 *            against v2: O / LSE bit for bit, masses bit for bit (v6: ≤ 4e-6), kept sets equal.
 *   apply:   ‖O − O_ref‖ / ‖O_ref‖ ≤ 2e-3 per head mode, every element written; every
 *            run also again with O in the inputs' dtype (o_dtype): bit for bit that run's
 *            fp32 O rounded to nearest, the same elements written; a bad o_dtype refused
 *            with O untouched; each case
 *            runs both implementations (core: the sm_90a core for mask / compute heads with
 *            the core's prob kernel for prob heads at B = 64, v2 at B = 128; v2 alone; at
 *            B = 64 also the core with MF_CORE_GATHER=0, with MF_CORE_PERSIST=1, on one CTA
 *            per SM, 3 CTAs and 1, and with MF_APPLY_PROB=v2; the core and the persistent
 *            runs again with MF_CORE_PVWAIT=1, bit for bit the core's O) and
 *            checks that the removed v3 is refused,
 *            with head modes mixed inside a KV group or uniform per group. The core path
 *            also runs with its bench switches (per-call scratch, the old pre-pass, each mode
 *            alone) and on two streams at once: outputs bit-identical to its own run's; a
 *            prob-only layer (B = 64: the prob kernel and v2 for what it leaves, the bad
 *            rows' blocks from its work list, no pre-pass or core; again on 2 CTAs, bit for
 *            bit; else v2 alone) with one wrong row and one not 16-byte aligned, vs the
 *            reference.
 *            Prob-kernel cases (wide W: heads reading every source head — a column's tiles
 *            over several ring stages — one, or three; blocks whose kept mass is 0, computed
 *            exactly by v2's follow-up) at FP8 / FP16 / U8_LOG / BF16.
 *            B = 64 unions on the core (gathered two list entries a 128-key tile): every pair
 *            of query blocks keeps different sets (2m + 1's diagonal block is its own); a
 *            last tile holding one query block (N = 805, 700, small 300) walks 0..2m, an odd
 *            count (the phantom half); mask-head pairs give either parity from Top-P.
 * One line per case, a summary table last; exit status 1 on any failure.
 *   export:  mf_export_cuda (the fused forward's masses → extract's selection, encoding and
 *            seal): rows as extract's are checked against mf_extract_ref (above), masses
 *            within 1e-4 of float64 and 0 above the diagonal, O / LSE as dense; a partial
 *            last block, a sub-range of rows, caller-given (poisoned) and self-allocated
 *            scratch; bad arguments refused with nothing written; O in the inputs' dtype
 *            (o_dtype): within float64 plus one rounding and bit-equal to the same call's
 *            fp32 O rounded to nearest; with rows_stream (the rows on a second stream) the
 *            same rows, byte for byte.
 *   rows copy: mf_rows_copy_cuda vs mf_rows_copy_ref on random sizes / offsets: the whole
 *            destination equal (nothing outside the rows written); bad arguments refused.
 *   sample:  mf_extract_cuda with MF_EXTRACT_SAMPLE (the strided query sample) as extract
 *            above against mf_extract_ref with the same sample, its masses against the
 *            float64 sampled definition; bad options refused (and by the export).
 * Usage: gpu_check [--small] [--masses] [--export] [--seed S]   (--small: one
 * tiny case each, for compute-sanitizer; --masses: the masses cases and two dense ones
 * only, with --small the tiny masses cases only; --export: the export cases only (with
 * --small the tiny one and the bad arguments).
 * Single-threaded tool; owns everything it allocates.
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mapflow_kernels.h"
#include "mapflow_kernels_cuda.h"
#include "mf_codec.h"
#include "synth.h"

#include "gpu_util.h"

#define MAX_RESULTS 1024
typedef struct result {
    char name[96];
    char metric[32];
    double value, limit;
    int pass;
} result_t;
static result_t g_res[MAX_RESULTS];
static int g_nres;
static int g_small; /* --small: the sanitizers' run */

static void report(const char *name, const char *metric, double value, double limit, int pass)
{
    printf("%-52s %-18s %.3e (limit %.1e) %s\n", name, metric, value, limit,
           pass ? "ok" : "FAIL");
    if (g_nres < MAX_RESULTS) {
        result_t *r = &g_res[g_nres++];
        snprintf(r->name, sizeof(r->name), "%s", name);
        snprintf(r->metric, sizeof(r->metric), "%s", metric);
        r->value = value;
        r->limit = limit;
        r->pass = pass;
    }
}

typedef struct tensors {
    uint16_t *q, *k, *v;  /* host, in dtype */
    float *qf, *kf, *vf;  /* the same values as float */
    void *dq, *dk, *dv;   /* device */
    mf_qkv_t host, dev;
} tensors_t;

static uint16_t to16(float x, mf_dtype_t dt)
{
    return dt == MF_DTYPE_F16 ? mf_f32_to_f16(x) : mf_f32_to_bf16(x);
}

static void *dup_dev(const void *src, size_t bytes)
{
    void *d;
    CK(cudaMalloc(&d, bytes));
    CK(cudaMemcpy(d, src, bytes, cudaMemcpyHostToDevice));
    return d;
}

static void tensors_make(tensors_t *t, uint64_t seed, mf_dtype_t dt, uint32_t n, uint32_t hq,
                         uint32_t hkv, uint32_t d)
{
    size_t nq = (size_t)n * hq * d, nk = (size_t)n * hkv * d;
    mf_synth_opts_t o = { .seed = seed, .n_tokens = n, .n_q_heads = hq, .n_kv_heads = hkv,
                          .head_dim = d, .window = 96, .sink = 3.0f, .noise = 1.0f };
    t->qf = malloc(nq * 4);
    t->kf = malloc(nk * 4);
    t->vf = malloc(nk * 4);
    t->q = malloc(nq * 2);
    t->k = malloc(nk * 2);
    t->v = malloc(nk * 2);
    if (!t->qf || !t->kf || !t->vf || !t->q || !t->k || !t->v ||
        mf_synth_qkv(&o, t->qf, t->kf, t->vf) != MF_OK) {
        fprintf(stderr, "synth failed\n");
        exit(2);
    }
    for (size_t x = 0; x < nq; x++) {
        t->q[x] = to16(t->qf[x], dt);
        t->qf[x] = mf_tensor_get(t->q, dt, x);
    }
    for (size_t x = 0; x < nk; x++) {
        t->k[x] = to16(t->kf[x], dt);
        t->kf[x] = mf_tensor_get(t->k, dt, x);
        t->v[x] = to16(t->vf[x], dt);
        t->vf[x] = mf_tensor_get(t->v, dt, x);
    }
    t->dq = dup_dev(t->q, nq * 2);
    t->dk = dup_dev(t->k, nk * 2);
    t->dv = dup_dev(t->v, nk * 2);
    mf_qkv_t h = { t->q, t->k, t->v, dt, n, hq, hkv, d };
    t->host = h;
    t->dev = h;
    t->dev.q = t->dq;
    t->dev.k = t->dk;
    t->dev.v = t->dv;
}

static void tensors_free(tensors_t *t)
{
    free(t->q);
    free(t->k);
    free(t->v);
    free(t->qf);
    free(t->kf);
    free(t->vf);
    cudaFree(t->dq);
    cudaFree(t->dk);
    cudaFree(t->dv);
}

/* Row buffers: one allocation, row k at off[k] with cap[k] bytes (16-byte aligned). */
typedef struct rowset {
    uint32_t nq;
    size_t *cap, *off, total;
    uint8_t *host;   /* total bytes */
    void **ptrs;     /* host pointers into host, or device pointers */
} rowset_t;

static void rowset_make(rowset_t *r, mf_codec_t codec, uint32_t b, uint32_t heads,
                        uint32_t i0, uint32_t i1, size_t model_len)
{
    r->nq = i1 - i0;
    r->cap = calloc(r->nq, sizeof(size_t));
    r->off = calloc(r->nq, sizeof(size_t));
    r->ptrs = calloc(r->nq, sizeof(void *));
    r->total = 0;
    for (uint32_t k = 0; k < r->nq; k++) {
        r->cap[k] = mf_extract_row_bound(codec, b, heads, i0 + k, model_len);
        r->off[k] = r->total;
        r->total += (r->cap[k] + 15) & ~(size_t)15;
    }
    r->host = aligned_alloc(64, (r->total + 63) & ~(size_t)63);
    if (!r->cap || !r->off || !r->ptrs || !r->host) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
}

static void rowset_free(rowset_t *r)
{
    free(r->cap);
    free(r->off);
    free(r->ptrs);
    free(r->host);
}

static double codec_bound(mf_codec_t c, double p, double m)
{
    switch (c) {
    case MF_CODEC_FP16: return ldexp(p, -11);
    case MF_CODEC_BF16: return ldexp(p, -8);
    case MF_CODEC_FP8_E4M3: return ldexp(p, -4) + ldexp(m / 448.0, -10);
    case MF_CODEC_U8_LOG: return 0.0219 * p + m * pow(2.0, -16.875);
    default: return 0;
    }
}

/* Float64 block masses from the float64 LSE: mass[h][i][j] for i < nb, averaged over the
 * rows q ≡ offset (mod stride) of each block (stride 1: every row). */
static double *masses64_sampled(const tensors_t *t, const double *lse, uint32_t b,
                                uint32_t nb, uint32_t stride, uint32_t offset)
{
    const mf_qkv_t *q = &t->host;
    uint32_t d = q->head_dim, g = q->n_q_heads / q->n_kv_heads;
    double scale = 1.0 / sqrt((double)d);
    double *m = calloc((size_t)q->n_q_heads * nb * nb, sizeof(double));
    for (uint32_t h = 0; h < q->n_q_heads; h++)
        for (uint32_t r = 0; r < nb * b; r++) {
            if (r % b % stride != offset)
                continue;
            const float *qv = t->qf + ((size_t)r * q->n_q_heads + h) * d;
            double *row = m + ((size_t)h * nb + r / b) * nb;
            for (uint32_t k = 0; k <= r; k++) {
                const float *kv = t->kf + ((size_t)k * q->n_kv_heads + h / g) * d;
                double s = 0;
                for (uint32_t x = 0; x < d; x++)
                    s += (double)qv[x] * kv[x];
                row[k / b] += exp(s * scale - lse[(size_t)h * q->n_tokens + r]) / (b / stride);
            }
        }
    return m;
}

static double *masses64(const tensors_t *t, const double *lse, uint32_t b, uint32_t nb)
{
    return masses64_sampled(t, lse, b, nb, 1, 0);
}

/* Is `keep` a Top-P set of the masses within tol: reaches the target, and dropping its
 * smallest optional block would fall short. */
static int topp_valid(const double *mass, const uint8_t *keep, uint32_t nb, double top_p,
                      double tol)
{
    uint32_t i = nb - 1;
    double total = 0, acc = 0, smallest = INFINITY;
    for (uint32_t j = 0; j < nb; j++) {
        total += mass[j];
        if (!keep[j])
            continue;
        acc += mass[j];
        if (j != 0 && j != i && mass[j] < smallest)
            smallest = mass[j];
    }
    if (!keep[0] || !keep[i])
        return 0;
    if (top_p >= 1.0)
        return acc >= total - tol;
    double target = top_p * total;
    return acc >= target - tol && (smallest == INFINITY || acc - smallest < target + tol);
}

typedef struct ext_case {
    mf_dtype_t dt;
    uint32_t b, d, n, hq, hkv;
    mf_codec_t codec;
    int lse_given;
    float top_p;
    int fused;            /* mf_export_cuda (the fused forward's masses) instead of extract */
    uint32_t skip0, skip1; /* rows for query blocks [skip0, nb − skip1) only */
    int own_scratch;      /* fused: the caller passes the forward's scratch (poisoned) */
    uint32_t stride, offset; /* > 1: the strided query sample (MF_EXTRACT_SAMPLE) */
    int o_t;              /* fused: O in the inputs' dtype (o_dtype), checked against the
                           * same call's fp32 O rounded (bit for bit) and float64 */
} ext_case_t;

/* O [N, Hq, d] and LSE [Hq, N] of a GPU forward against float64: rel err of O over the
 * finite elements, LSE max |err|, and how many O elements are not finite (unwritten). */
static void forward_err(const float *o, const float *lse, const double *o64, const double *lse64,
                        size_t on, size_t ln, double *rel, double *lerr, size_t *unwritten)
{
    double num = 0, den = 0;
    *lerr = 0;
    *unwritten = 0;
    for (size_t x = 0; x < on; x++) {
        if (!isfinite(o[x])) {
            (*unwritten)++;
            continue;
        }
        num += (o[x] - o64[x]) * (o[x] - o64[x]);
        den += o64[x] * o64[x];
    }
    for (size_t x = 0; x < ln; x++) {
        double e = isfinite(lse[x]) ? fabs(lse[x] - lse64[x]) : INFINITY;
        if (!(e <= *lerr))
            *lerr = e;
    }
    *rel = den > 0 ? sqrt(num / den) : INFINITY;
}

/* extract (mf_extract_cuda) or, with c->fused, the fused export (mf_export_cuda: O, LSE
 * and masses from the core's forward, then the same selection / encoding / seal) against
 * mf_extract_ref's rows; the export's O / LSE also against float64, its masses within 1e-4
 * and 0 above the diagonal. Skipped, and reported as such, where the export is
 * unimplemented (off sm_90). */
static int check_extract(const ext_case_t *c, uint64_t seed)
{
    char name[96], smp[24] = "";
    uint32_t fields = c->stride > 1 ? MF_EXTRACT_SAMPLE : 0;
    if (fields)
        snprintf(smp, sizeof(smp), " s%u+%u", c->stride, c->offset);
    snprintf(name, sizeof(name), "%s %s B%u d%u N%u H%u/%u %s lse=%s%s%s%s%s",
             c->fused ? "export" : "extract", c->dt == MF_DTYPE_F16 ? "f16" : "bf16", c->b,
             c->d, c->n, c->hq, c->hkv, mf_codec_name(c->codec),
             c->lse_given ? "given" : "computed", c->skip0 || c->skip1 ? " part" : "",
             c->own_scratch ? " scratch" : "", smp, c->o_t ? " O=T" : "");
    tensors_t t;
    tensors_make(&t, seed, c->dt, c->n, c->hq, c->hkv, c->d);
    uint32_t nb = c->n / c->b, i0 = c->skip0, i1 = nb - c->skip1;
    double *o64 = malloc((size_t)c->n * c->hq * c->d * sizeof(double));
    double *lse64 = malloc((size_t)c->hq * c->n * sizeof(double));
    float *lse32 = malloc((size_t)c->hq * c->n * sizeof(float));
    uint32_t *tokens = malloc(c->n * 4);
    mf_rng_t rng;
    mf_rng_seed(&rng, seed ^ 0x70c3);
    for (uint32_t x = 0; x < c->n; x++)
        tokens[x] = (uint32_t)(mf_rng_u64(&rng) % 50000);
    if (mf_attention_dense_ref(&t.host, o64, lse64) != MF_OK) {
        fprintf(stderr, "dense reference failed\n");
        exit(2);
    }
    for (size_t x = 0; x < (size_t)c->hq * c->n; x++)
        lse32[x] = (float)lse64[x];
    const char *model = "src-model", *ns = "gpu-check", *why = "";
    rowset_t ref, gpu;
    rowset_make(&ref, c->codec, c->b, c->hq, i0, i1, strlen(model));
    rowset_make(&gpu, c->codec, c->b, c->hq, i0, i1, strlen(model));
    size_t *ref_sizes = calloc(ref.nq, sizeof(size_t));
    for (uint32_t k = 0; k < ref.nq; k++)
        ref.ptrs[k] = ref.host + ref.off[k];
    mf_extract_args_t ra = { .src = t.host, .lse = c->lse_given ? lse32 : NULL,
                             .block_size = c->b, .top_p = c->top_p, .codec = c->codec,
                             .i0 = i0, .i1 = i1, .model = model, .ns = ns, .layer = 3,
                             .tokens = tokens, .fields = fields, .sample_stride = c->stride,
                             .sample_offset = c->offset };
    uint32_t failed = 0;
    mf_status_t st = mf_extract_ref(&ra, ref.ptrs, ref.cap, ref_sizes, &failed, &why);
    if (st != MF_OK) {
        fprintf(stderr, "%s: reference extract failed: %s\n", name, why);
        exit(2);
    }
    /* GPU */
    uint8_t *drows;
    float *dlse = NULL, *dmass, *d_lse = NULL;
    void *dscr = NULL, *d_o = NULL;
    size_t osz = c->fused && c->o_t ? 2 : 4; /* bytes of an O element */
    mf_export_cuda_args_t xa = { 0 };
    uint64_t *dsizes;
    uint32_t *dfailed;
    /* mass[h][i][j] at h·mhs + (i − mi0)·mrs + j: extract's mass_out [Hq][i1 − i0][i1], the
     * export's [Hq][N/64][N/64] */
    size_t mrs = c->fused ? nb : i1, mhs = c->fused ? (size_t)nb * nb : (size_t)ref.nq * i1,
           mi0 = c->fused ? 0 : i0, mass_n = (size_t)c->hq * mhs;
    size_t on = (size_t)c->n * c->hq * c->d, ln = (size_t)c->hq * c->n;
    CK(cudaMalloc((void **)&drows, gpu.total));
    CK(cudaMemset(drows, 0xa5, gpu.total)); /* poison */
    CK(cudaMalloc((void **)&dmass, mass_n * 4));
    CK(cudaMemset(dmass, 0xff, mass_n * 4));
    CK(cudaMalloc((void **)&dsizes, gpu.nq * 8));
    CK(cudaMalloc((void **)&dfailed, 4));
    if (c->lse_given && !c->fused)
        dlse = dup_dev(lse32, (size_t)c->hq * c->n * 4);
    for (uint32_t k = 0; k < gpu.nq; k++)
        gpu.ptrs[k] = drows + gpu.off[k];
    mf_extract_cuda_args_t ga = { .src = t.dev, .lse = dlse, .block_size = c->b,
                                  .top_p = c->top_p, .codec = c->codec, .i0 = i0, .i1 = i1,
                                  .model = model, .ns = ns, .layer = 3, .tokens = tokens,
                                  .rows = gpu.ptrs, .caps = gpu.cap, .sizes = dsizes,
                                  .failed_block = dfailed, .mass_out = dmass,
                                  .fields = fields, .sample_stride = c->stride,
                                  .sample_offset = c->offset };
    CK(cudaMemset(dsizes, 0xff, gpu.nq * 8));
    CK(cudaMemset(dfailed, 0, 4));
    if (c->fused) {
        CK(cudaMalloc(&d_o, on * osz));
        CK(cudaMalloc((void **)&d_lse, ln * 4));
        CK(cudaMemset(d_o, 0xff, on * osz)); /* NaN poison (fp32, f16 and bf16 alike) */
        CK(cudaMemset(d_lse, 0xff, ln * 4));
        xa.ex = ga;
        xa.o = d_o;
        xa.lse = d_lse;
        xa.mass = dmass;
        xa.o_dtype = c->o_t ? c->dt : MF_DTYPE_F32;
        if (c->own_scratch) {
            xa.scratch_bytes = mf_attention_masses_scratch(c->n);
            CK(cudaMalloc(&dscr, xa.scratch_bytes));
            CK(cudaMemset(dscr, 0xa5, xa.scratch_bytes)); /* the call must not rely on it */
            xa.scratch = dscr;
        }
        xa.ex.mass_out = NULL;
        st = mf_export_cuda(&xa, 0, &why);
    } else {
        st = mf_extract_cuda(&ga, 0, &why);
    }
    int ok = st == MF_OK, pass = 0;
    if (c->fused && st == MF_UNIMPLEMENTED) {
        printf("%s: skipped: %s\n", name, why);
        pass = 1;
        goto out;
    }
    if (!ok)
        printf("%s: %s: %s (%s)\n", name, c->fused ? "mf_export_cuda" : "mf_extract_cuda",
               mf_status_name(st), why);
    CK(cudaDeviceSynchronize());
    CK(cudaGetLastError());
    uint64_t *gsizes = calloc(gpu.nq, 8);
    float *gmass = malloc(mass_n * 4);
    CK(cudaMemcpy(gpu.host, drows, gpu.total, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gsizes, dsizes, gpu.nq * 8, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&failed, dfailed, 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gmass, dmass, mass_n * 4, cudaMemcpyDeviceToHost));
    ok &= failed == UINT32_MAX;
    /* masses vs float64 (the export's: every query block, 0 above the diagonal) */
    double *m64 = fields ? masses64_sampled(&t, lse64, c->b, nb, c->stride, c->offset)
                         : masses64(&t, lse64, c->b, nb),
           mass_err = 0;
    size_t above = 0;
    for (uint32_t h = 0; h < c->hq; h++)
        for (uint32_t i = c->fused ? 0 : i0; i < (c->fused ? nb : i1); i++)
            for (uint32_t j = 0; j < (c->fused ? nb : i + 1); j++) {
                float g = gmass[h * mhs + (i - mi0) * mrs + j];
                if (j > i) {
                    above += g != 0.0f; /* NaN poison counts too */
                    continue;
                }
                double e = fabs(g - m64[((size_t)h * nb + i) * nb + j]);
                if (!(e <= mass_err))
                    mass_err = isnan(e) ? INFINITY : e;
            }
    double mass_tol = c->fused ? 1e-4 : 1e-3;
    /* rows */
    int decode_fail = 0;
    uint32_t sets = 0, exact_sets = 0, tolerated = 0, bad_sets = 0;
    double tile_excess = 0; /* max of |Δ| / (2·bound + 1e-5) */
    int mass_byte = 0;
    uint8_t *kg = malloc(nb), *kr = malloc(nb);
    for (uint32_t k = 0; k < gpu.nq && ok; k++) {
        mf_row_view_t vg, vr;
        const char *w1 = "", *w2 = "";
        mf_status_t s1 = mf_row_decode(gpu.host + gpu.off[k], gsizes[k], 0, &vg, &w1);
        mf_status_t s2 = mf_row_decode(ref.host + ref.off[k], ref_sizes[k], 0, &vr, &w2);
        if (s1 != MF_OK || s2 != MF_OK) {
            printf("%s: row %u does not decode: gpu %s (%s), ref %s (%s)\n", name, k,
                   mf_status_name(s1), w1, mf_status_name(s2), w2);
            decode_fail++;
            continue;
        }
        uint32_t i = vr.block_index;
        for (uint32_t h = 0; h < c->hq; h++) {
            memset(kg, 0, nb);
            memset(kr, 0, nb);
            for (uint32_t cc = 0; cc < vg.n_cols; cc++)
                kg[vg.cols[cc]] = mf_row_entry(&vg, cc, h) >= 0;
            for (uint32_t cc = 0; cc < vr.n_cols; cc++)
                kr[vr.cols[cc]] = mf_row_entry(&vr, cc, h) >= 0;
            sets++;
            if (!memcmp(kg, kr, i + 1)) {
                exact_sets++;
            } else if (topp_valid(m64 + ((size_t)h * nb + i) * nb, kg, i + 1, c->top_p,
                                  mass_tol)) {
                tolerated++;
            } else {
                bad_sets++;
            }
            /* tiles and mass bytes of the entries both kept */
            for (uint32_t cg = 0; cg < vg.n_cols; cg++) {
                int64_t eg = mf_row_entry(&vg, cg, h);
                if (eg < 0)
                    continue;
                uint32_t j = vg.cols[cg];
                int64_t er = -1;
                for (uint32_t cr = 0; cr < vr.n_cols; cr++)
                    if (vr.cols[cr] == j)
                        er = mf_row_entry(&vr, cr, h);
                if (er < 0)
                    continue;
                int db = abs((int)vg.mass[eg] - (int)vr.mass[er]);
                if (db > mass_byte)
                    mass_byte = db;
                if (c->codec == MF_CODEC_MASK)
                    continue;
                float m = vr.scales ? vr.scales[er] : 1.0f;
                for (uint32_t qq = 0; qq < c->b; qq++)
                    for (uint32_t kk = 0; kk < c->b; kk++) {
                        double a = mf_row_tile_value(&vg, (uint32_t)eg, qq, kk);
                        double r = mf_row_tile_value(&vr, (uint32_t)er, qq, kk);
                        /* One code apart at a rounding boundary is allowed: twice the
                         * half-step bound, taken at the larger value, covers one step. */
                        double hi = fmax(fabs(a), fabs(r));
                        double x = fabs(a - r) / (2 * codec_bound(c->codec, hi, m) + 1e-5);
                        if (!(x <= tile_excess))
                            tile_excess = isnan(x) ? INFINITY : x;
                    }
            }
        }
    }
    char label[128];
    report(name, "rows decode+sum", decode_fail, 0, ok && decode_fail == 0);
    report(name, "mass max |err|", mass_err, mass_tol, mass_err <= mass_tol);
    snprintf(label, sizeof(label), "%s", name);
    report(label, "kept sets bad", bad_sets, 0, bad_sets == 0 && sets > 0);
    printf("    kept sets: %u total, %u identical, %u near-tie (valid Top-P within %.0e)\n",
           sets, exact_sets, tolerated, mass_tol);
    report(name, "tile err/2bound", tile_excess, 1.0, tile_excess <= 1.0);
    report(name, "mass byte diff", mass_byte, 1, mass_byte <= 1);
    pass = ok && decode_fail == 0 && mass_err <= mass_tol && bad_sets == 0 &&
           tile_excess <= 1.0 && mass_byte <= 1;
    if (c->fused) {
        float *o = malloc(on * 4), *lse = malloc(ln * 4);
        uint16_t *ot = c->o_t ? malloc(on * 2) : NULL;
        if (!o || !lse || (c->o_t && !ot)) {
            fprintf(stderr, "out of memory\n");
            exit(2);
        }
        if (c->o_t) {
            CK(cudaMemcpy(ot, d_o, on * 2, cudaMemcpyDeviceToHost));
            mf_tensor_to_f32(ot, c->dt, on, o);
        } else {
            CK(cudaMemcpy(o, d_o, on * 4, cudaMemcpyDeviceToHost));
        }
        CK(cudaMemcpy(lse, d_lse, ln * 4, cudaMemcpyDeviceToHost));
        double rel, lerr;
        size_t unwritten;
        forward_err(o, lse, o64, lse64, on, ln, &rel, &lerr, &unwritten);
        /* O in T: one more rounding (half an ulp, 2^-8 relative for bf16, 2^-11 for f16) */
        double otol = 2e-3 + (!c->o_t ? 0 : c->dt == MF_DTYPE_BF16 ? 1.0 / 256 : 1.0 / 2048);
        report(name, "unwritten O/mass", (double)(unwritten + above), 0,
               unwritten + above == 0);
        report(name, "rel err O", rel, otol, rel <= otol);
        report(name, "LSE max |err|", lerr, 1e-3, lerr <= 1e-3);
        pass &= unwritten + above == 0 && rel <= otol && lerr <= 1e-3;
        if (c->o_t) {
            /* the same call with an fp32 O, its rows on a second stream (rows_stream):
             * T must be the fp32 O rounded to nearest, the rows the same bytes */
            float *d_o32, *o32 = malloc(on * 4);
            uint8_t *rows2 = malloc(gpu.total);
            uint64_t *sizes2 = malloc(gpu.nq * 8);
            cudaStream_t rs;
            CK(cudaStreamCreateWithFlags(&rs, cudaStreamNonBlocking));
            CK(cudaMalloc((void **)&d_o32, on * 4));
            CK(cudaMemset(d_o32, 0xff, on * 4));
            CK(cudaMemset(drows, 0xa5, gpu.total));
            CK(cudaMemset(dsizes, 0xff, gpu.nq * 8));
            CK(cudaDeviceSynchronize());
            mf_export_cuda_args_t x32 = xa;
            x32.o = d_o32;
            x32.o_dtype = MF_DTYPE_F32;
            x32.rows_stream = (mf_cuda_stream_t)rs;
            st = mf_export_cuda(&x32, 0, &why);
            CK(cudaStreamSynchronize(rs)); /* the rows' launches and the free of scratch */
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(o32, d_o32, on * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(rows2, drows, gpu.total, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(sizes2, dsizes, gpu.nq * 8, cudaMemcpyDeviceToHost));
            size_t differ = st == MF_OK ? 0 : on, rdiff = st == MF_OK ? 0 : 1;
            for (size_t x = 0; x < on && st == MF_OK; x++)
                differ += to16(o32[x], c->dt) != ot[x];
            for (uint32_t k = 0; k < gpu.nq && st == MF_OK; k++)
                rdiff += sizes2[k] != gsizes[k] ||
                         memcmp(rows2 + gpu.off[k], gpu.host + gpu.off[k], gsizes[k]) != 0;
            report(name, "O=T vs rn(fp32 O)", (double)differ, 0, differ == 0);
            report(name, "rows_stream rows diff", (double)rdiff, 0, rdiff == 0);
            pass &= differ == 0 && rdiff == 0;
            CK(cudaStreamDestroy(rs));
            cudaFree(d_o32);
            free(o32);
            free(rows2);
            free(sizes2);
        }
        free(ot);
        free(o);
        free(lse);
    }
    free(kg);
    free(kr);
    free(m64);
    free(gsizes);
    free(gmass);
out:
    free(ref_sizes);
    free(o64);
    free(lse64);
    free(lse32);
    free(tokens);
    cudaFree(drows);
    cudaFree(dmass);
    cudaFree(dsizes);
    cudaFree(dfailed);
    cudaFree(dlse);
    cudaFree(d_o);
    cudaFree(d_lse);
    cudaFree(dscr);
    rowset_free(&ref);
    rowset_free(&gpu);
    tensors_free(&t);
    return pass;
}

/* mf_attention_dense_cuda (the sm_90a core's dense iterator) against float64: O and LSE.
 * Skipped, and reported as such, off an sm_90 device. */
static int check_dense(mf_dtype_t dt, uint32_t d, uint32_t n, uint32_t hq, uint32_t hkv,
                       uint64_t seed)
{
    char name[96];
    snprintf(name, sizeof(name), "dense core %s d%u N%u H%u/%u",
             dt == MF_DTYPE_F16 ? "f16" : "bf16", d, n, hq, hkv);
    tensors_t t;
    tensors_make(&t, seed, dt, n, hq, hkv, d);
    size_t on = (size_t)n * hq * d, ln = (size_t)hq * n;
    double *o64 = malloc(on * sizeof(double)), *lse64 = malloc(ln * sizeof(double));
    float *o = malloc(on * 4), *lse = malloc(ln * 4), *d_o, *d_lse;
    if (!o64 || !lse64 || !o || !lse || mf_attention_dense_ref(&t.host, o64, lse64) != MF_OK) {
        fprintf(stderr, "%s: dense reference failed\n", name);
        exit(2);
    }
    CK(cudaMalloc((void **)&d_o, on * 4));
    CK(cudaMalloc((void **)&d_lse, ln * 4));
    CK(cudaMemset(d_o, 0xff, on * 4)); /* NaN poison */
    CK(cudaMemset(d_lse, 0xff, ln * 4));
    const char *why = "";
    mf_status_t st = mf_attention_dense_cuda(&t.dev, d_o, d_lse, 0, &why);
    int pass = 1;
    if (st == MF_UNIMPLEMENTED) {
        printf("%s: skipped: %s\n", name, why);
    } else {
        if (st != MF_OK)
            printf("%s: mf_attention_dense_cuda: %s (%s)\n", name, mf_status_name(st), why);
        CK(cudaDeviceSynchronize());
        CK(cudaGetLastError());
        CK(cudaMemcpy(o, d_o, on * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(lse, d_lse, ln * 4, cudaMemcpyDeviceToHost));
        double rel, lerr;
        size_t unwritten;
        forward_err(o, lse, o64, lse64, on, ln, &rel, &lerr, &unwritten);
        pass = st == MF_OK && unwritten == 0;
        report(name, "unwritten", (double)unwritten, 0, pass);
        report(name, "rel err O", rel, 2e-3, rel <= 2e-3);
        report(name, "LSE max |err|", lerr, 1e-3, lerr <= 1e-3);
        pass &= rel <= 2e-3 && lerr <= 1e-3;
        /* MF_CORE_PVWAIT=1 (the P·V wait after the softmax): the same math in the same
         * order, so O and LSE bit for bit the default's */
        float *o2 = malloc(on * 4), *lse2 = malloc(ln * 4);
        if (!o2 || !lse2) {
            fprintf(stderr, "%s: out of memory\n", name);
            exit(2);
        }
        CK(cudaMemset(d_o, 0xff, on * 4));
        CK(cudaMemset(d_lse, 0xff, ln * 4));
        setenv("MF_CORE_PVWAIT", "1", 1);
        st = mf_attention_dense_cuda(&t.dev, d_o, d_lse, 0, &why);
        unsetenv("MF_CORE_PVWAIT");
        if (st != MF_OK)
            printf("%s: mf_attention_dense_cuda (pvwait): %s (%s)\n", name, mf_status_name(st),
                   why);
        CK(cudaDeviceSynchronize());
        CK(cudaGetLastError());
        CK(cudaMemcpy(o2, d_o, on * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(lse2, d_lse, ln * 4, cudaMemcpyDeviceToHost));
        size_t obits = 0, lbits = 0;
        for (size_t x = 0; x < on; x++)
            obits += memcmp(&o[x], &o2[x], 4) != 0;
        for (size_t x = 0; x < ln; x++)
            lbits += memcmp(&lse[x], &lse2[x], 4) != 0;
        if (st != MF_OK)
            obits = on;
        report(name, "pvwait O bits != default", (double)obits, 0, obits == 0);
        report(name, "pvwait LSE bits != default", (double)lbits, 0, lbits == 0);
        pass &= obits == 0 && lbits == 0;
        free(o2);
        free(lse2);
    }
    free(o64);
    free(lse64);
    free(o);
    free(lse);
    cudaFree(d_o);
    cudaFree(d_lse);
    tensors_free(&t);
    return pass;
}

/* Block masses of one layer as the current extract path gives them (mf_extract_cuda's
 * mass_out, LSE computed there), MASK codec, i0 = 0, i1 = nb. */
static void extract_masses(tensors_t *t, uint32_t nb, float *mass_host)
{
    const char *model = "src-model", *ns = "gpu-check", *why = "";
    uint32_t n = t->host.n_tokens, hq = t->host.n_q_heads, *tokens = malloc(n * 4);
    for (uint32_t x = 0; x < n; x++)
        tokens[x] = x * 2654435761u % 50000u;
    rowset_t rs;
    rowset_make(&rs, MF_CODEC_MASK, 64, hq, 0, nb, strlen(model));
    uint8_t *drows;
    float *dmass;
    uint64_t *dsizes;
    uint32_t *dfailed;
    size_t mass_n = (size_t)hq * nb * nb;
    CK(cudaMalloc((void **)&drows, rs.total));
    CK(cudaMalloc((void **)&dmass, mass_n * 4));
    CK(cudaMalloc((void **)&dsizes, nb * 8));
    CK(cudaMalloc((void **)&dfailed, 4));
    for (uint32_t k = 0; k < nb; k++)
        rs.ptrs[k] = drows + rs.off[k];
    mf_extract_cuda_args_t ga = { .src = t->dev, .lse = NULL, .block_size = 64, .top_p = 0.9f,
                                  .codec = MF_CODEC_MASK, .i0 = 0, .i1 = nb, .model = model,
                                  .ns = ns, .layer = 0, .tokens = tokens, .rows = rs.ptrs,
                                  .caps = rs.cap, .sizes = dsizes, .failed_block = dfailed,
                                  .mass_out = dmass };
    mf_status_t st = mf_extract_cuda(&ga, 0, &why);
    if (st != MF_OK) {
        fprintf(stderr, "mf_extract_cuda for masses: %s (%s)\n", mf_status_name(st), why);
        exit(2);
    }
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(mass_host, dmass, mass_n * 4, cudaMemcpyDeviceToHost));
    cudaFree(drows);
    cudaFree(dmass);
    cudaFree(dsizes);
    cudaFree(dfailed);
    rowset_free(&rs);
    free(tokens);
}

/* mf_attention_masses_cuda (the core's dense forward with block masses): O and LSE against
 * float64 as for the dense core; masses against float64 (the formula of mf_extract_ref's
 * block_masses) and against mf_extract_cuda's mass_out; the Top-P kept sets
 * (mf_topp_select, as mf_extract_ref selects) of the fused masses against those of the
 * float64 masses; every output written (NaN poison), 0 above the diagonal. own_scratch:
 * the caller passes the scratch (else the call allocates it). Every mass bookkeeping
 * (MF_MASS_VARIANT, attn_core.cu) runs the same checks, and against the default's (v2)
 * outputs: O and LSE bit for bit (the same math), the masses bit for bit (v3 – v5: the same
 * ℓ and epilogue) or within fp32 rounding (v6: the epilogue sums in another order), and
 * the kept sets identical to v2's. */
static int check_masses(mf_dtype_t dt, uint32_t d, uint32_t n, uint32_t hq, uint32_t hkv,
                        float top_p, int own_scratch, uint64_t seed)
{
    static const char *const variants[] = { NULL, "v3", "v4", "v5", "v6" };
    const int nv = (int)(sizeof(variants) / sizeof(variants[0]));
    char base[96], name[112];
    snprintf(base, sizeof(base), "masses core %s d%u N%u H%u/%u p%.2f%s",
             dt == MF_DTYPE_F16 ? "f16" : "bf16", d, n, hq, hkv, top_p,
             own_scratch ? " scratch" : "");
    tensors_t t;
    tensors_make(&t, seed, dt, n, hq, hkv, d);
    uint32_t nb = n / 64;
    size_t on = (size_t)n * hq * d, ln = (size_t)hq * n, mn = (size_t)hq * nb * nb;
    double *o64 = malloc(on * sizeof(double)), *lse64 = malloc(ln * sizeof(double));
    float *o = malloc(on * 4), *lse = malloc(ln * 4), *mass = malloc(mn * 4),
          *xmass = malloc(mn * 4), *o2 = malloc(on * 4), *lse2 = malloc(ln * 4),
          *mass2 = malloc(mn * 4), *d_o, *d_lse, *d_mass;
    uint8_t *kept2 = malloc(mn); /* v2's kept sets, [h][i][j ≤ i] */
    if (!o64 || !lse64 || !o || !lse || !mass || !xmass || !o2 || !lse2 || !mass2 || !kept2 ||
        mf_attention_dense_ref(&t.host, o64, lse64) != MF_OK) {
        fprintf(stderr, "%s: dense reference failed\n", base);
        exit(2);
    }
    CK(cudaMalloc((void **)&d_o, on * 4));
    CK(cudaMalloc((void **)&d_lse, ln * 4));
    CK(cudaMalloc((void **)&d_mass, mn * 4));
    void *scr = NULL;
    size_t scr_n = 0;
    if (own_scratch) {
        scr_n = mf_attention_masses_scratch(n);
        CK(cudaMalloc(&scr, scr_n));
    }
    extract_masses(&t, nb, xmass);
    double *m64 = masses64(&t, lse64, 64, nb);
    int pass = 1;
    for (int v = 0; v < nv; v++) {
        snprintf(name, sizeof(name), "%s%s%s", base, variants[v] ? " " : "",
                 variants[v] ? variants[v] : "");
        CK(cudaMemset(d_o, 0xff, on * 4)); /* NaN poison */
        CK(cudaMemset(d_lse, 0xff, ln * 4));
        CK(cudaMemset(d_mass, 0xff, mn * 4));
        if (scr)
            CK(cudaMemset(scr, 0xa5, scr_n)); /* the call must not rely on its contents */
        if (variants[v])
            setenv("MF_MASS_VARIANT", variants[v], 1);
        const char *why = "";
        mf_status_t st = mf_attention_masses_cuda(&t.dev, 64, d_o, d_lse, d_mass, scr, scr_n,
                                                  0, &why);
        unsetenv("MF_MASS_VARIANT");
        if (st == MF_UNIMPLEMENTED) {
            printf("%s: skipped: %s\n", name, why);
            break;
        }
        if (st != MF_OK)
            printf("%s: mf_attention_masses_cuda: %s (%s)\n", name, mf_status_name(st), why);
        CK(cudaDeviceSynchronize());
        CK(cudaGetLastError());
        CK(cudaMemcpy(o, d_o, on * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(lse, d_lse, ln * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(mass, d_mass, mn * 4, cudaMemcpyDeviceToHost));
        double rel, lerr;
        size_t unwritten;
        forward_err(o, lse, o64, lse64, on, ln, &rel, &lerr, &unwritten);
        double merr = 0, mrel = 0, xerr = 0, xref = 0, vdiff = 0;
        size_t above = 0, vbits = 0;
        for (uint32_t h = 0; h < hq; h++)
            for (uint32_t i = 0; i < nb; i++)
                for (uint32_t j = 0; j < nb; j++) {
                    size_t x = ((size_t)h * nb + i) * nb + j;
                    if (v > 0) { /* against v2's masses */
                        vbits += memcmp(&mass[x], &mass2[x], 4) != 0;
                        double e = fabs((double)mass[x] - mass2[x]);
                        if (!(e <= vdiff))
                            vdiff = isnan(e) ? INFINITY : e;
                    }
                    if (j > i) {
                        above += mass[x] != 0.0f; /* NaN poison counts too */
                        continue;
                    }
                    double e = fabs(mass[x] - m64[x]), r = e / fmax(m64[x], 1e-30);
                    if (!(e <= merr))
                        merr = isnan(e) ? INFINITY : e;
                    if (m64[x] >= 1e-4 && !(r <= mrel))
                        mrel = isnan(r) ? INFINITY : r;
                    e = fabs(mass[x] - (double)xmass[x]);
                    if (!(e <= xerr))
                        xerr = isnan(e) ? INFINITY : e;
                    e = fabs((double)xmass[x] - m64[x]);
                    if (!(e <= xref))
                        xref = isnan(e) ? INFINITY : e;
                }
        /* kept sets: the reference's selection on float64 masses vs on the fused ones */
        uint32_t sets = 0, same = 0, tolerated = 0, bad = 0, vsets = 0;
        double *md = malloc(nb * sizeof(double));
        uint8_t *kf = malloc(nb), *kr = malloc(nb);
        for (uint32_t h = 0; h < hq; h++)
            for (uint32_t i = 0; i < nb; i++) {
                const double *mr = m64 + ((size_t)h * nb + i) * nb;
                uint8_t *k2 = kept2 + ((size_t)h * nb + i) * nb;
                uint32_t kept;
                for (uint32_t j = 0; j <= i; j++)
                    md[j] = mass[((size_t)h * nb + i) * nb + j];
                if (mf_topp_select(md, NULL, i + 1, top_p, kf, &kept) != MF_OK ||
                    mf_topp_select(mr, NULL, i + 1, top_p, kr, &kept) != MF_OK) {
                    bad++;
                    continue;
                }
                sets++;
                if (v == 0)
                    memcpy(k2, kf, i + 1);
                else
                    vsets += memcmp(k2, kf, i + 1) != 0;
                if (!memcmp(kf, kr, i + 1))
                    same++;
                else if (topp_valid(mr, kf, i + 1, top_p, 1e-4))
                    tolerated++;
                else
                    bad++;
            }
        int ok = st == MF_OK && unwritten == 0 && above == 0;
        report(name, "unwritten O/mass", (double)(unwritten + above), 0, ok);
        report(name, "rel err O", rel, 2e-3, rel <= 2e-3);
        report(name, "LSE max |err|", lerr, 1e-3, lerr <= 1e-3);
        report(name, "mass max |err| f64", merr, 1e-4, merr <= 1e-4);
        report(name, "mass max rel f64", mrel, 1e-3, mrel <= 1e-3);
        report(name, "mass |fused-extract|", xerr, 1e-4, xerr <= 1e-4);
        printf("    extract_cuda's own mass max |err| vs f64: %.3e\n", xref);
        report(name, "kept sets bad", bad, 0, bad == 0 && sets > 0);
        printf("    kept sets: %u total, %u identical, %u near-tie (valid Top-P within 1e-4)\n",
               sets, same, tolerated);
        ok &= rel <= 2e-3 && lerr <= 1e-3 && merr <= 1e-4 && mrel <= 1e-3 && xerr <= 1e-4 &&
              bad == 0 && sets > 0;
        if (v == 0) { /* the default (v2): what the other variants must reproduce */
            memcpy(o2, o, on * 4);
            memcpy(lse2, lse, ln * 4);
            memcpy(mass2, mass, mn * 4);
        } else {
            size_t obits = 0, lbits = 0;
            for (size_t x = 0; x < on; x++)
                obits += memcmp(&o[x], &o2[x], 4) != 0;
            for (size_t x = 0; x < ln; x++)
                lbits += memcmp(&lse[x], &lse2[x], 4) != 0;
            /* v6: a 64-term sum of values ≤ 1 in another order, scaled by 1/64: ≤ 63 · 2^-24
             * apart in the worst case (4e-6); v3 – v5: the same bits */
            int exact = strcmp(variants[v], "v6") != 0;
            double vlim = exact ? 0.0 : 4e-6;
            report(name, "O bits != v2", (double)obits, 0, obits == 0);
            report(name, "LSE bits != v2", (double)lbits, 0, lbits == 0);
            if (exact)
                report(name, "mass bits != v2", (double)vbits, 0, vbits == 0);
            else
                printf("    masses differing from v2 in any bit: %zu of %zu\n", vbits, mn);
            report(name, "mass |x - v2|", vdiff, vlim, vdiff <= vlim);
            report(name, "kept sets != v2", (double)vsets, 0, vsets == 0);
            ok &= obits == 0 && lbits == 0 && (!exact || vbits == 0) && vdiff <= vlim &&
                  vsets == 0;
        }
        pass &= ok;
        free(md);
        free(kf);
        free(kr);
    }
    free(m64);
    free(o64);
    free(lse64);
    free(o);
    free(lse);
    free(mass);
    free(xmass);
    free(o2);
    free(lse2);
    free(mass2);
    free(kept2);
    cudaFree(d_o);
    cudaFree(d_lse);
    cudaFree(d_mass);
    cudaFree(scr);
    tensors_free(&t);
    return pass;
}

/* Bad arguments to mf_attention_masses_cuda: a status and a message, nothing queued. */
static int check_masses_args(void)
{
    tensors_t t;
    tensors_make(&t, 7, MF_DTYPE_BF16, 128, 2, 1, 64);
    float *d_o, *d_mass;
    CK(cudaMalloc((void **)&d_o, 128 * 2 * 64 * 4));
    CK(cudaMalloc((void **)&d_mass, 2 * 2 * 2 * 4));
    const char *why = "";
    int ok = 1;
    mf_status_t st = mf_attention_masses_cuda(&t.dev, 128, d_o, NULL, d_mass, NULL, 0, 0, &why);
    ok &= st == MF_UNIMPLEMENTED && *why;
    st = mf_attention_masses_cuda(&t.dev, 64, d_o, NULL, NULL, NULL, 0, 0, &why);
    ok &= st == MF_INVALID_ARGUMENT && *why;
    st = mf_attention_masses_cuda(&t.dev, 64, d_o, NULL, d_mass, d_o, 16, 0, &why);
    ok &= (st == MF_INVALID_ARGUMENT || st == MF_UNIMPLEMENTED) && *why;
    mf_qkv_t tiny = t.dev;
    tiny.n_tokens = 63;
    st = mf_attention_masses_cuda(&tiny, 64, d_o, NULL, d_mass, NULL, 0, 0, &why);
    ok &= (st == MF_INVALID_ARGUMENT || st == MF_UNIMPLEMENTED) && *why;
    setenv("MF_MASS_VARIANT", "v9", 1); /* not a mass bookkeeping */
    why = "";
    st = mf_attention_masses_cuda(&t.dev, 64, d_o, NULL, d_mass, NULL, 0, 0, &why);
    unsetenv("MF_MASS_VARIANT");
    ok &= (st == MF_INVALID_ARGUMENT || st == MF_UNIMPLEMENTED) && *why;
    CK(cudaDeviceSynchronize());
    report("masses bad arguments", "refused", ok ? 0 : 1, 0, ok);
    cudaFree(d_o);
    cudaFree(d_mass);
    tensors_free(&t);
    return ok;
}

/* Bad arguments to mf_export_cuda: a status and a message each, nothing written (O keeps
 * its poison, the rows theirs). */
static int check_export_args(void)
{
    tensors_t t;
    tensors_make(&t, 11, MF_DTYPE_BF16, 256, 2, 1, 64);
    const char *model = "m", *ns = "n", *why = "";
    uint32_t tokens[256];
    for (uint32_t x = 0; x < 256; x++)
        tokens[x] = x * 7 + 1;
    rowset_t rs;
    rowset_make(&rs, MF_CODEC_MASK, 128, 2, 0, 2, 1);
    uint8_t *drows;
    float *d_o, *d_lse;
    uint64_t *dsizes;
    uint32_t *dfailed;
    size_t on = 256 * 2 * 64 * 4;
    CK(cudaMalloc((void **)&drows, rs.total));
    CK(cudaMalloc((void **)&d_o, on));
    CK(cudaMalloc((void **)&d_lse, 2 * 256 * 4));
    CK(cudaMalloc((void **)&dsizes, 4 * 8));
    CK(cudaMalloc((void **)&dfailed, 4));
    CK(cudaMemset(drows, 0xa5, rs.total));
    CK(cudaMemset(d_o, 0xa5, on));
    for (uint32_t k = 0; k < rs.nq; k++)
        rs.ptrs[k] = drows + rs.off[k];
    mf_export_cuda_args_t good = {
        .ex = { .src = t.dev, .block_size = 64, .top_p = 0.9f, .codec = MF_CODEC_MASK,
                .i0 = 0, .i1 = 2, .model = model, .ns = ns, .tokens = tokens,
                .rows = rs.ptrs, .caps = rs.cap, .sizes = dsizes, .failed_block = dfailed },
        .o = d_o };
    int ok = 1, k = 0;
    mf_status_t want[10] = { MF_INVALID_ARGUMENT, MF_INVALID_ARGUMENT, MF_INVALID_ARGUMENT,
                             MF_UNIMPLEMENTED, MF_INVALID_ARGUMENT, MF_INVALID_ARGUMENT,
                             MF_INVALID_ARGUMENT, MF_INVALID_ARGUMENT, MF_INVALID_ARGUMENT,
                             MF_INVALID_ARGUMENT };
    for (k = 0; k < 10; k++) {
        mf_export_cuda_args_t a = good;
        switch (k) {
        case 0: a.o = NULL; break;
        case 1: a.ex.lse = d_lse; break;                 /* the export computes the LSE */
        case 2: a.ex.mass_out = d_lse; break;
        case 3: a.ex.block_size = 128; a.ex.i1 = 1; break; /* masses exist for B = 64 only */
        case 4: a.ex.src.v = NULL; break;
        case 5: a.ex.top_p = 0.0f; break;
        case 6: a.ex.i1 = 5; break;                      /* past N / B */
        case 7: a.scratch = d_lse; a.scratch_bytes = 16; break; /* the forward's check */
        case 8: a.o_dtype = MF_DTYPE_F16; break;         /* neither F32 nor the inputs' BF16 */
        case 9: a.o_dtype = (mf_dtype_t)7; break;
        }
        why = "";
        mf_status_t st = mf_export_cuda(&a, 0, &why);
        /* off sm_90 the forward refuses first (case 7 reaches its scratch check only there) */
        int fine = st == want[k] || (k == 7 && st == MF_UNIMPLEMENTED);
        if (!fine || !*why) {
            printf("export bad argument %d: %s (%s), want %s\n", k, mf_status_name(st), why,
                   mf_status_name(want[k]));
            ok = 0;
        }
    }
    CK(cudaDeviceSynchronize());
    uint8_t *ho = malloc(on), *hr = malloc(rs.total);
    CK(cudaMemcpy(ho, d_o, on, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hr, drows, rs.total, cudaMemcpyDeviceToHost));
    size_t touched = 0;
    for (size_t x = 0; x < on; x++)
        touched += ho[x] != 0xa5;
    for (size_t x = 0; x < rs.total; x++)
        touched += hr[x] != 0xa5;
    ok &= touched == 0;
    /* and the same arguments unchanged are accepted: each refusal was its field's */
    mf_status_t st = mf_export_cuda(&good, 0, &why);
    CK(cudaDeviceSynchronize());
    if (st != MF_OK && st != MF_UNIMPLEMENTED) {
        printf("export good arguments: %s (%s)\n", mf_status_name(st), why);
        ok = 0;
    }
    report("export bad arguments", "refused+untouched", ok ? 0 : 1, 0, ok);
    free(ho);
    free(hr);
    cudaFree(drows);
    cudaFree(d_o);
    cudaFree(d_lse);
    cudaFree(dsizes);
    cudaFree(dfailed);
    rowset_free(&rs);
    tensors_free(&t);
    return ok;
}

/* Bad sample options: mf_extract_cuda refuses them (status + message) and mf_export_cuda
 * refuses any stride but 1 (its masses are exact), with no row byte written. */
static int check_sample_args(void)
{
    tensors_t t;
    tensors_make(&t, 13, MF_DTYPE_F16, 256, 2, 1, 64);
    const char *model = "m", *ns = "n", *why = "";
    uint32_t tokens[256];
    for (uint32_t x = 0; x < 256; x++)
        tokens[x] = x * 5 + 3;
    rowset_t rs;
    rowset_make(&rs, MF_CODEC_MASK, 64, 2, 0, 4, 1);
    uint8_t *drows;
    float *d_o;
    uint64_t *dsizes;
    uint32_t *dfailed;
    CK(cudaMalloc((void **)&drows, rs.total));
    CK(cudaMalloc((void **)&d_o, 256 * 2 * 64 * 4));
    CK(cudaMalloc((void **)&dsizes, 4 * 8));
    CK(cudaMalloc((void **)&dfailed, 4));
    CK(cudaMemset(drows, 0xa5, rs.total));
    for (uint32_t k = 0; k < rs.nq; k++)
        rs.ptrs[k] = drows + rs.off[k];
    mf_extract_cuda_args_t good = { .src = t.dev, .block_size = 64, .top_p = 0.9f,
                                    .codec = MF_CODEC_MASK, .i0 = 0, .i1 = 4, .model = model,
                                    .ns = ns, .tokens = tokens, .rows = rs.ptrs,
                                    .caps = rs.cap, .sizes = dsizes, .failed_block = dfailed,
                                    .fields = MF_EXTRACT_SAMPLE };
    const uint32_t bad[][3] = { { MF_EXTRACT_SAMPLE, 0, 0 },  { MF_EXTRACT_SAMPLE, 6, 0 },
                                { MF_EXTRACT_SAMPLE, 128, 0 }, { MF_EXTRACT_SAMPLE, 8, 8 },
                                { 0x40, 1, 0 } };
    int ok = 1;
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        mf_extract_cuda_args_t a = good;
        a.fields = bad[k][0];
        a.sample_stride = bad[k][1];
        a.sample_offset = bad[k][2];
        why = "";
        mf_status_t st = mf_extract_cuda(&a, 0, &why);
        if (st != MF_INVALID_ARGUMENT || !*why) {
            printf("sample bad option %zu: %s (%s)\n", k, mf_status_name(st), why);
            ok = 0;
        }
    }
    mf_export_cuda_args_t x = { .ex = good, .o = d_o };
    x.ex.src.v = t.dev.v;
    x.ex.sample_stride = 4;
    why = "";
    mf_status_t st = mf_export_cuda(&x, 0, &why);
    if (st != MF_INVALID_ARGUMENT || !strstr(why, "stride")) {
        printf("export with a sample stride: %s (%s)\n", mf_status_name(st), why);
        ok = 0;
    }
    CK(cudaDeviceSynchronize());
    uint8_t *hr = malloc(rs.total);
    CK(cudaMemcpy(hr, drows, rs.total, cudaMemcpyDeviceToHost));
    size_t touched = 0;
    for (size_t k = 0; k < rs.total; k++)
        touched += hr[k] != 0xa5;
    ok &= touched == 0;
    report("extract sample bad options", "refused+untouched", ok ? 0 : 1, 0, ok);
    free(hr);
    cudaFree(drows);
    cudaFree(d_o);
    cudaFree(dsizes);
    cudaFree(dfailed);
    rowset_free(&rs);
    tensors_free(&t);
    return ok;
}

/* The strided-sample extract's cases (MF_EXTRACT_SAMPLE vs mf_extract_ref with the same
 * sample): the masses against the float64 sampled definition, kept sets, tiles of every
 * row (not only the sampled ones), at the CTA shapes the gather has: several blocks per
 * CTA (R = B / stride < 16), one block per CTA, one row per block, a partial last CTA. */
static int sample_cases(int small, uint64_t seed, int *cases)
{
    int fails = 0;
    if (small) {
        ext_case_t e = { MF_DTYPE_F16, 64, 64, 512, 4, 2, MF_CODEC_MASK, 1, 0.9f, 0, 0, 0, 0,
                         8, 3 };
        fails += !check_extract(&e, seed);
        fails += !check_sample_args();
        *cases += 2;
        return fails;
    }
    const ext_case_t cs[] = {
        { MF_DTYPE_BF16, 64, 128, 1024, 8, 2, MF_CODEC_MASK, 1, 0.9f, 0, 0, 0, 0, 4, 1 },
        { MF_DTYPE_F16, 64, 128, 1024, 8, 2, MF_CODEC_MASK, 1, 0.9f, 0, 0, 0, 0, 8, 0 },
        { MF_DTYPE_BF16, 64, 128, 1280, 8, 2, MF_CODEC_MASK, 1, 0.95f, 0, 1, 2, 0, 16, 7 },
        { MF_DTYPE_F16, 64, 64, 768, 4, 1, MF_CODEC_FP8_E4M3, 0, 0.9f, 0, 0, 0, 0, 8, 5 },
        { MF_DTYPE_BF16, 128, 128, 1024, 4, 4, MF_CODEC_U8_LOG, 1, 0.9f, 0, 0, 0, 0, 2, 1 },
        { MF_DTYPE_F16, 32, 64, 640, 6, 3, MF_CODEC_FP16, 1, 0.8f, 0, 0, 0, 0, 32, 31 },
    };
    for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++)
        fails += !check_extract(&cs[k], seed + k);
    fails += !check_sample_args();
    *cases += (int)(sizeof cs / sizeof cs[0]) + 1;
    return fails;
}

/* mf_rows_copy_cuda against mf_rows_copy_ref (the spec) on random rows: sizes 0 to 200 KB
 * (16-byte multiples and odd ones), source and destination at random gaps, some offsets
 * not 16-aligned (the byte path), destinations in a shuffled order; the whole destination
 * buffer (poisoned) must equal the reference's image: bytes copied, nothing outside
 * written. Then bad arguments refused with nothing written, on the case's own stream. */
static int check_rows_copy(uint64_t seed)
{
    mf_rng_t rng;
    mf_rng_seed(&rng, seed ^ 0xc0b1);
    uint32_t n = 40 + (uint32_t)(mf_rng_u64(&rng) % 160);
    size_t *sizes = malloc(n * sizeof(size_t)), *so = malloc(n * sizeof(size_t)),
           *dof = malloc(n * sizeof(size_t));
    uint32_t *perm = malloc(n * 4);
    size_t stot = 0, dtot = 0;
    for (uint32_t x = 0; x < n; x++) {
        uint64_t r = mf_rng_u64(&rng);
        size_t z = r % 7 == 0 ? 0 : r % 7 == 1 ? 1 + r % 100 : r % 7 == 2 ? 150000 + r % 60000
                                                                       : 16 * (1 + r % 4096);
        sizes[x] = z;
        perm[x] = x;
    }
    for (uint32_t x = n - 1; x > 0; x--) { /* destinations in a shuffled order */
        uint32_t y = (uint32_t)(mf_rng_u64(&rng) % (x + 1)), t = perm[x];
        perm[x] = perm[y];
        perm[y] = t;
    }
    for (uint32_t x = 0; x < n; x++) {
        uint64_t r = mf_rng_u64(&rng);
        /* gaps: 16-aligned mostly (rows are), an odd one every few rows */
        stot += (r % 5 == 0) ? 1 + r % 15 : 16 * (r % 4);
        so[x] = stot;
        stot += sizes[x];
    }
    for (uint32_t k = 0; k < n; k++) {
        uint32_t x = perm[k];
        uint64_t r = mf_rng_u64(&rng);
        dtot += (r % 6 == 0) ? 1 + r % 15 : 16 * (1 + r % 3);
        dof[x] = dtot;
        dtot += sizes[x];
    }
    dtot += 64;
    uint8_t *hs = malloc(stot + 1), *hd = malloc(dtot), *got = malloc(dtot);
    for (size_t x = 0; x < stot; x++)
        hs[x] = (uint8_t)mf_rng_u64(&rng);
    memset(hd, 0x5a, dtot);
    uint8_t *ds, *dd;
    CK(cudaMalloc((void **)&ds, stot + 1));
    CK(cudaMalloc((void **)&dd, dtot));
    CK(cudaMemcpy(ds, hs, stot, cudaMemcpyHostToDevice));
    CK(cudaMemset(dd, 0x5a, dtot));
    void **dp = malloc(n * sizeof(void *)), **hdp = malloc(n * sizeof(void *));
    const void **sp = malloc(n * sizeof(void *)), **hsp = malloc(n * sizeof(void *));
    for (uint32_t x = 0; x < n; x++) {
        dp[x] = dd + dof[x];
        sp[x] = ds + so[x];
        hdp[x] = hd + dof[x];
        hsp[x] = hs + so[x];
    }
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const char *why = "";
    mf_status_t s1 = mf_rows_copy_cuda(dp, sp, sizes, n, (mf_cuda_stream_t)st, &why);
    mf_status_t s2 = mf_rows_copy_ref(hdp, hsp, sizes, n, &why);
    CK(cudaStreamSynchronize(st));
    CK(cudaGetLastError());
    CK(cudaMemcpy(got, dd, dtot, cudaMemcpyDeviceToHost));
    size_t differ = 0;
    for (size_t x = 0; x < dtot; x++)
        differ += got[x] != hd[x];
    int ok = s1 == MF_OK && s2 == MF_OK && differ == 0;
    if (s1 != MF_OK || s2 != MF_OK)
        printf("rows copy: cuda %s, ref %s (%s)\n", mf_status_name(s1), mf_status_name(s2),
               why);
    char name[96];
    snprintf(name, sizeof(name), "rows copy n%u %zu bytes", n, stot);
    report(name, "bytes differing", (double)differ, 0, ok);
    /* bad arguments: a status and a message, nothing queued */
    CK(cudaMemset(dd, 0x5a, dtot));
    int bad_ok = 1;
    for (int k = 0; k < 5; k++) {
        void *d1[2] = { dd, dd + 4096 };
        const void *s1p[2] = { ds, ds + 16 };
        size_t z1[2] = { 64, 64 };
        uint32_t nn = 2;
        switch (k) {
        case 0: s1p[1] = dd + 4096 + 32; break; /* a row's src overlaps its dst */
        case 1: z1[0] = (size_t)MF_ROW_MAX_BYTES + 16; break;
        case 2: s1p[1] = NULL; break;
        case 3: nn = MF_ROWS_COPY_MAX + 1; break; /* the count checked before the arrays */
        case 4: d1[0] = (void *)(UINTPTR_MAX - 8); break; /* wraps */
        }
        why = "";
        mf_status_t sb = mf_rows_copy_cuda(d1, s1p, z1, nn, (mf_cuda_stream_t)st, &why);
        if (sb != MF_INVALID_ARGUMENT || !*why) {
            printf("rows copy bad argument %d: %s (%s)\n", k, mf_status_name(sb), why);
            bad_ok = 0;
        }
    }
    why = "";
    mf_status_t s0 = mf_rows_copy_cuda(NULL, NULL, NULL, 0, (mf_cuda_stream_t)st, &why);
    CK(cudaStreamSynchronize(st));
    CK(cudaMemcpy(got, dd, dtot, cudaMemcpyDeviceToHost));
    size_t touched = 0;
    for (size_t x = 0; x < dtot; x++)
        touched += got[x] != 0x5a;
    bad_ok &= touched == 0 && s0 == MF_OK;
    report("rows copy bad arguments", "refused+untouched", bad_ok ? 0 : 1, 0, bad_ok);
    CK(cudaStreamDestroy(st));
    cudaFree(ds);
    cudaFree(dd);
    free(dp);
    free(sp);
    free(hdp);
    free(hsp);
    free(hs);
    free(hd);
    free(got);
    free(sizes);
    free(so);
    free(dof);
    free(perm);
    return ok && bad_ok;
}

/* The fused export's cases (mf_export_cuda vs mf_extract_ref), all at B = 64. */
static int export_cases(int small, uint64_t seed, int *cases)
{
    int fails = 0;
    if (small) {
        ext_case_t e = { MF_DTYPE_F16, 64, 64, 256, 4, 2, MF_CODEC_FP8_E4M3, 0, 0.9f, 1, 0, 0, 1 };
        ext_case_t et = { MF_DTYPE_BF16, 64, 128, 256, 4, 2, MF_CODEC_MASK, 0, 0.9f, 1, 0, 0, 1,
                          .o_t = 1 };
        fails += !check_extract(&e, seed);
        fails += !check_extract(&et, seed + 1);
        fails += !check_export_args();
        fails += !check_rows_copy(seed + 2);
        *cases += 4;
        return fails;
    }
    const mf_codec_t codecs[] = { MF_CODEC_MASK, MF_CODEC_FP16, MF_CODEC_BF16,
                                  MF_CODEC_FP8_E4M3, MF_CODEC_U8_LOG };
    for (int ci = 0; ci < 5; ci++) {
        ext_case_t e = { ci & 1 ? MF_DTYPE_F16 : MF_DTYPE_BF16, 64, ci < 3 ? 128 : 64, 768, 8,
                         2, codecs[ci], ci & 1, 0.9f, 1, 0, 0, ci & 1 };
        fails += !check_extract(&e, seed + ci);
    }
    /* a partial last block (N = 800: 12 full blocks), rows for blocks [2, 9) only */
    ext_case_t p = { MF_DTYPE_BF16, 64, 128, 800, 8, 2, MF_CODEC_FP8_E4M3, 0, 0.95f, 1, 2, 3, 1 };
    ext_case_t g = { MF_DTYPE_F16, 64, 128, 640, 4, 4, MF_CODEC_MASK, 0, 1.0f, 1, 0, 1, 0 };
    fails += !check_extract(&p, seed + 5);
    fails += !check_extract(&g, seed + 6);
    /* O in the inputs' dtype (the source's own: no fp32 O, no cast): bf16 d 128 as the
     * hand-off's layers, f16 d 64 with a partial last block */
    ext_case_t tb = { MF_DTYPE_BF16, 64, 128, 768, 8, 2, MF_CODEC_MASK, 0, 0.9f, 1, 0, 0, 1,
                      .o_t = 1 };
    ext_case_t tf = { MF_DTYPE_F16, 64, 64, 800, 4, 2, MF_CODEC_FP8_E4M3, 0, 0.9f, 1, 0, 0, 0,
                      .o_t = 1 };
    fails += !check_extract(&tb, seed + 7);
    fails += !check_extract(&tf, seed + 8);
    fails += !check_export_args();
    fails += !check_rows_copy(seed + 9);
    *cases += 11;
    return fails;
}

typedef struct app_case {
    mf_dtype_t dt;
    uint32_t b, d, n, ht, hkv, hs;
    mf_codec_t codec;
    int grouped; /* modes uniform per KV group (else cycling within each group) */
    /* W patterns for the core's prob kernel: target heads t ≡ 0 (mod 3) read every source
     * head (a column's tiles of two rows fill more than one ring stage at FP16), t ≡ 1 only
     * source head 0, whose tiles are zeroed in the even blocks' rows (kept mass 0: those
     * blocks' rows computed exactly by v2's follow-up, the reference's rule), t ≡ 2 three */
    int wide;
} app_case_t;

/* Elements of the device output d (n·ht·d floats) that differ bitwise from want, counting
 * only heads with sel[t] (others must still hold the NaN poison). */
static size_t apply_diff(const float *d, const float *want, const int *sel, uint32_t n,
                         uint32_t ht, uint32_t hd)
{
    size_t on = (size_t)n * ht * hd, bad = 0;
    float *h = malloc(on * 4);
    CK(cudaMemcpy(h, d, on * 4, cudaMemcpyDeviceToHost));
    for (size_t x = 0; x < on; x++) {
        uint32_t t = (uint32_t)(x / hd % ht), poison = 0xffffffffu, got;
        memcpy(&got, &h[x], 4);
        bad += sel[t] ? memcmp(&h[x], &want[x], 4) != 0 : got != poison;
    }
    free(h);
    return bad;
}

/* O in the inputs' dtype (o_dtype = dt) from d_t (n·ht·d 16-bit elements, poisoned with
 * 0xffff before the call) against o32, the same path's fp32 O: elements that differ from
 * o32 rounded to nearest (mf_f32_to_bf16 / _f16), bit for bit; where o32 holds the NaN
 * poison d_t must hold its own (the same elements written). */
static size_t apply_t_diff(const void *d_t, const float *o32, size_t on, mf_dtype_t dt)
{
    uint16_t *h = malloc(on * 2);
    CK(cudaMemcpy(h, d_t, on * 2, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t x = 0; x < on; x++)
        bad += h[x] != (isnan(o32[x]) ? 0xffffu : to16(o32[x], dt));
    free(h);
    return bad;
}

/* ga's call again with O in tgt.dtype into d_t (poisoned first), under the environment
 * variable env = val when env is set and MF_CORE_PERSIST_CTAS = ctas when set; then
 * apply_t_diff against o32, reported as "O=T vs rn(fp32 O)". Returns 1 when it passes. */
static int check_apply_t(const char *name, const mf_apply_cuda_args_t *ga, mf_apply_impl_t impl,
                         const char *env, const char *val, const char *ctas, void *d_t,
                         const float *o32, size_t on)
{
    mf_apply_cuda_args_t gt = *ga;
    const char *why = "";
    gt.o = d_t;
    gt.o_dtype = ga->tgt.dtype;
    gt.bad_rows = NULL; /* the fp32 run counted them */
    CK(cudaMemset(d_t, 0xff, on * 2));
    if (env)
        setenv(env, val, 1);
    if (ctas)
        setenv("MF_CORE_PERSIST_CTAS", ctas, 1);
    mf_status_t st = mf_apply_cuda_impl(&gt, impl, 0, &why);
    if (env)
        unsetenv(env);
    unsetenv("MF_CORE_PERSIST_CTAS");
    if (st != MF_OK)
        printf("%s: mf_apply_cuda (O=T): %s (%s)\n", name, mf_status_name(st), why);
    CK(cudaDeviceSynchronize());
    CK(cudaGetLastError());
    size_t d = st == MF_OK ? apply_t_diff(d_t, o32, on, ga->tgt.dtype) : on;
    report(name, "O=T vs rn(fp32 O)", (double)d, 0, d == 0);
    return d == 0;
}

/* o_dtype neither F32 nor tgt.dtype (the other 16-bit type, an unknown value): refused
 * with MF_INVALID_ARGUMENT and a message naming o_dtype, before anything is queued (O
 * keeps its poison); F32 and tgt.dtype themselves are the runs above. */
static int check_apply_odtype_args(const char *base, const mf_apply_cuda_args_t *ga,
                                   size_t on)
{
    char name[160];
    snprintf(name, sizeof(name), "apply o_dtype refused %s", base);
    mf_dtype_t bad[2] = { ga->tgt.dtype == MF_DTYPE_F16 ? MF_DTYPE_BF16 : MF_DTYPE_F16,
                          (mf_dtype_t)7 };
    int ok = 1;
    CK(cudaMemset(ga->o, 0xa5, on * 4));
    for (int x = 0; x < 2; x++) {
        mf_apply_cuda_args_t g = *ga;
        const char *why = "";
        g.o_dtype = bad[x];
        mf_status_t st = mf_apply_cuda_impl(&g, MF_APPLY_IMPL_CORE, 0, &why);
        if (st != MF_INVALID_ARGUMENT || !strstr(why, "o_dtype")) {
            printf("%s: o_dtype %d: %s (%s), want MF_INVALID_ARGUMENT\n", name, (int)bad[x],
                   mf_status_name(st), why);
            ok = 0;
        }
    }
    CK(cudaDeviceSynchronize());
    uint8_t *h = malloc(on * 4);
    CK(cudaMemcpy(h, ga->o, on * 4, cudaMemcpyDeviceToHost));
    size_t touched = 0;
    for (size_t x = 0; x < on * 4; x++)
        touched += h[x] != 0xa5;
    free(h);
    ok &= touched == 0;
    report(name, "refused+untouched", ok ? 0 : 1, 0, ok);
    return ok;
}

/* The core path's bench switches and its cached scratch, against o_core (that call's
 * output): MF_APPLY_CACHE=0 (per-call scratch), MF_APPLY_PREPASS=v1 (the pre-pass of before)
 * and MF_APPLY_ONLY per mode (the three runs together) give o_core bit for bit; two calls on two streams without a sync between them,
 * the second with other constants (MF_APPLY_ONLY=mask), each give their own result (the
 * second call's constants copy must wait for the first call's kernels); a bad switch value
 * and the removed v3 are refused. */
static int check_apply_switches(const char *base, const mf_apply_cuda_args_t *ga0,
                                const uint8_t *mode, const float *o_core, uint32_t n,
                                uint32_t ht, uint32_t hd)
{
    char name[160];
    const char *why = "";
    size_t on = (size_t)n * ht * hd;
    int all[MF_ROW_MAX_HEADS * 4], masks[MF_ROW_MAX_HEADS * 4], ok = 1;
    if (ht > MF_ROW_MAX_HEADS * 4)
        return 1;
    for (uint32_t t = 0; t < ht; t++) {
        all[t] = 1;
        masks[t] = mode[t] == MF_HEAD_MASK;
    }
    mf_apply_cuda_args_t ga = *ga0;
    float *d_o2;
    CK(cudaMalloc((void **)&d_o2, on * 4));
    /* per-call scratch; the pre-pass of before */
    snprintf(name, sizeof(name), "apply core %s", base);
    static const char *const sw[][3] = { { "MF_APPLY_CACHE", "0", "MF_APPLY_CACHE=0 diff" },
                                         { "MF_APPLY_PREPASS", "v1", "PREPASS=v1 diff" } };
    mf_status_t st = MF_OK;
    size_t d = 0;
    for (int x = 0; x < 2; x++) {
        setenv(sw[x][0], sw[x][1], 1);
        CK(cudaMemset(ga.o, 0xff, on * 4));
        st = mf_apply_cuda_impl(&ga, MF_APPLY_IMPL_CORE, 0, &why);
        unsetenv(sw[x][0]);
        CK(cudaDeviceSynchronize());
        d = st == MF_OK ? apply_diff(ga.o, o_core, all, n, ht, hd) : on;
        report(name, sw[x][2], (double)d, 0, d == 0);
        ok &= d == 0;
    }
    /* each mode alone, into one poisoned output */
    CK(cudaMemset(ga.o, 0xff, on * 4));
    static const char *const only[] = { "compute", "prob", "mask" };
    st = MF_OK;
    for (int m = 0; m < 3 && st == MF_OK; m++) {
        setenv("MF_APPLY_ONLY", only[m], 1);
        st = mf_apply_cuda_impl(&ga, MF_APPLY_IMPL_CORE, 0, &why);
    }
    unsetenv("MF_APPLY_ONLY");
    CK(cudaDeviceSynchronize());
    d = st == MF_OK ? apply_diff(ga.o, o_core, all, n, ht, hd) : on;
    report(name, "ONLY parts diff", (double)d, 0, d == 0);
    ok &= d == 0;
    /* two streams, no sync between the calls */
    cudaStream_t s1, s2;
    CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    CK(cudaMemset(ga.o, 0xff, on * 4));
    CK(cudaMemset(d_o2, 0xff, on * 4));
    CK(cudaDeviceSynchronize());
    st = mf_apply_cuda_impl(&ga, MF_APPLY_IMPL_CORE, (mf_cuda_stream_t)s1, &why);
    mf_apply_cuda_args_t g2 = ga;
    g2.o = d_o2;
    setenv("MF_APPLY_ONLY", "mask", 1);
    mf_status_t st2 = mf_apply_cuda_impl(&g2, MF_APPLY_IMPL_CORE, (mf_cuda_stream_t)s2, &why);
    unsetenv("MF_APPLY_ONLY");
    CK(cudaDeviceSynchronize());
    d = st == MF_OK && st2 == MF_OK
            ? apply_diff(ga.o, o_core, all, n, ht, hd) + apply_diff(d_o2, o_core, masks, n, ht, hd)
            : 2 * on;
    report(name, "two streams diff", (double)d, 0, d == 0);
    ok &= d == 0;
    CK(cudaStreamDestroy(s1));
    CK(cudaStreamDestroy(s2));
    /* a bad switch value: refused, nothing queued */
    setenv("MF_APPLY_PHASE", "bogus", 1);
    why = "";
    st = mf_apply_cuda_impl(&ga, MF_APPLY_IMPL_CORE, 0, &why);
    unsetenv("MF_APPLY_PHASE");
    int refused = st == MF_INVALID_ARGUMENT && *why;
    report(name, "bad switch refused", refused ? 0 : 1, 0, refused);
    ok &= refused;
    why = "";
    st = mf_apply_cuda_impl(&ga, MF_APPLY_IMPL_V3, 0, &why); /* removed: refused */
    refused = st == MF_INVALID_ARGUMENT && *why;
    report(name, "v3 refused", refused ? 0 : 1, 0, refused);
    ok &= refused;
    cudaFree(d_o2);
    return ok;
}

static int check_apply(const app_case_t *c, uint64_t seed)
{
    char base[96];
    snprintf(base, sizeof(base), "%s B%u d%u N%u Ht%u/%u Hs%u %s %s",
             c->dt == MF_DTYPE_F16 ? "f16" : "bf16", c->b, c->d, c->n, c->ht, c->hkv, c->hs,
             mf_codec_name(c->codec), c->grouped ? "grp" : "mix");
    const char *name = base;
    /* source rows from the reference extract */
    tensors_t src, tgt;
    tensors_make(&src, seed, MF_DTYPE_F16, c->n, c->hs, c->hs / 2, 64);
    tensors_make(&tgt, seed * 7 + 1, c->dt, c->n, c->ht, c->hkv, c->d);
    uint32_t full = c->n / c->b, all = (c->n + c->b - 1) / c->b;
    uint32_t *tokens = calloc(c->n, 4);
    for (uint32_t x = 0; x < c->n; x++)
        tokens[x] = x * 31 + 7;
    rowset_t rs;
    rowset_make(&rs, c->codec, c->b, c->hs, 0, full, 3);
    size_t *sizes = calloc(full, sizeof(size_t));
    for (uint32_t k = 0; k < full; k++)
        rs.ptrs[k] = rs.host + rs.off[k];
    const char *why = "";
    mf_extract_args_t ra = { .src = src.host, .block_size = c->b, .top_p = 0.9f,
                             .codec = c->codec, .i0 = 0, .i1 = full, .model = "src",
                             .ns = "n", .tokens = tokens };
    uint32_t failed;
    if (mf_extract_ref(&ra, rs.ptrs, rs.cap, sizes, &failed, &why) != MF_OK) {
        fprintf(stderr, "%s: reference extract: %s\n", name, why);
        exit(2);
    }
    uint8_t *drows;
    CK(cudaMalloc((void **)&drows, rs.total));
    CK(cudaMemcpy(drows, rs.host, rs.total, cudaMemcpyHostToDevice));
    mf_row_view_t *views = calloc(full, sizeof(*views));
    const mf_row_view_t **vp = calloc(full, sizeof(*vp));
    const void **dptr = calloc(full, sizeof(*dptr));
    mf_rng_t rng;
    mf_rng_seed(&rng, seed ^ 0xa991);
    for (uint32_t k = 0; k < full; k++) {
        if (mf_row_decode(rs.host + rs.off[k], sizes[k], 0, &views[k], &why) != MF_OK) {
            fprintf(stderr, "%s: reference row %u: %s\n", name, k, why);
            exit(2);
        }
        int missing = k == 2 && full > 4; /* one block without a row: computed */
        vp[k] = missing ? NULL : &views[k];
        dptr[k] = missing ? NULL : drows + rs.off[k];
    }
    if (c->wide && c->codec != MF_CODEC_MASK) { /* source head 0's tiles: 0 in even blocks */
        for (uint32_t k = 0; k < full; k += 2)
            for (uint32_t col = 0; col < views[k].n_cols; col++) {
                int64_t e = mf_row_entry(&views[k], col, 0);
                if (e >= 0)
                    memset((uint8_t *)views[k].tiles + (size_t)e * views[k].tile_bytes, 0,
                           views[k].tile_bytes);
            }
        CK(cudaMemcpy(drows, rs.host, rs.total, cudaMemcpyHostToDevice));
    }
    /* the same rows 8 bytes off the 16-byte alignment rows must have (the prob-only
     * case's block 3: a bad row, as a wrong header is) */
    uint8_t *drows8;
    CK(cudaMalloc((void **)&drows8, rs.total + 16));
    CK(cudaMemcpy(drows8 + 8, rs.host, rs.total, cudaMemcpyHostToDevice));
    /* layer map: 1-3 source heads per target head, modes cycling prob / mask / compute */
    float *w = calloc((size_t)c->ht * c->hs, 4), *tp = calloc(c->ht, 4);
    uint8_t *mode = calloc(c->ht, 1), *exact = calloc(all, 1);
    for (uint32_t t = 0; t < c->ht; t++) {
        uint32_t nz = 1 + (uint32_t)(mf_rng_u64(&rng) % 3);
        if (c->wide)
            nz = t % 3 == 0 ? c->hs : t % 3 == 1 ? 1 : 3;
        float sum = 0;
        for (uint32_t z = 0; z < nz; z++) {
            uint32_t s = (uint32_t)(mf_rng_u64(&rng) % c->hs);
            if (c->wide) /* every head, head 0, or three distinct heads */
                s = t % 3 == 0 ? z : t % 3 == 1 ? 0 : (t + z + 1) % c->hs;
            float x = 0.2f + (float)mf_rng_uniform(&rng);
            w[(size_t)t * c->hs + s] += x;
            sum += x;
        }
        for (uint32_t s = 0; s < c->hs; s++)
            w[(size_t)t * c->hs + s] /= sum;
        /* 1 prob, 2 mask, 0 compute: per head, or per KV group; wide: prob but every
         * fourth head mask (W's patterns are for prob heads) */
        mode[t] = (uint8_t)(((c->grouped ? t / (c->ht / c->hkv) : t) + 1) % 3);
        if (c->wide)
            mode[t] = t % 4 == 3 ? MF_HEAD_MASK : MF_HEAD_PROB;
        if (c->codec == MF_CODEC_MASK && mode[t] == MF_HEAD_PROB)
            mode[t] = MF_HEAD_MASK;
        tp[t] = 0.8f + 0.19f * (float)mf_rng_uniform(&rng);
    }
    if (full > 5)
        exact[full - 3] = 1;
    mf_layer_map_t map = { c->ht, c->hs, w, mode, tp };
    size_t on = (size_t)c->n * c->ht * c->d;
    float *o_ref = malloc(on * 4), *o_gpu = malloc(on * 4), *o_core = malloc(on * 4), *d_o;
    mf_apply_args_t aa = { .rows = vp, .n_rows = full, .map = &map, .tgt = tgt.host,
                           .block_size = c->b, .exact = exact, .exact_first = 0,
                           .exact_last = 1, .o = o_ref };
    if (mf_apply_ref(&aa, NULL, &why) != MF_OK) {
        fprintf(stderr, "%s: reference apply: %s\n", name, why);
        exit(2);
    }
    uint32_t *dbad;
    void *d_t; /* O in the inputs' dtype (o_dtype) */
    CK(cudaMalloc((void **)&d_o, on * 4));
    CK(cudaMalloc(&d_t, on * 2));
    CK(cudaMalloc((void **)&dbad, 4));
    /* core BN64: MF_CORE_GATHER=0, block-64 lists on the 64-key-tile kernel instead of the
     * gathered 128-key tiles (the bench's A/B; not bit-identical: other summation order);
     * core persist: MF_CORE_PERSIST=1, the persistent gathered kernel, on one CTA per SM
     * and on 3 and 1 CTAs (MF_CORE_PERSIST_CTAS; 1 not under --small), so that a CTA walks
     * many tiles: both Q / list buffers reused, the K / V ring across tiles, the other
     * modes' empty tiles skipped; the runs in a row share the call's cached scratch, so a
     * tile counter left unzeroed by one shows in the next (tiles skipped: NaN poison left);
     * pvwait: the same with MF_CORE_PVWAIT=1 (the P·V wait after the softmax; the dense /
     * lists kernel for compute heads and B = 128, gathered or persistent at B = 64), bit for
     * bit the default core's O (under --small: core pvwait and persist3 pvwait) */
    static const struct {
        const char *label;
        mf_apply_impl_t impl;
        const char *env, *val, *ctas; /* B = 64 only when env is set */
        int same;                     /* 1: bit for bit the "core" run's O (same tile math) */
        int full_only;                /* 1: not under --small (the sanitizers' time) */
        int pvw;                      /* 1: with MF_CORE_PVWAIT=1 */
    } impls[] = {
        { "core", MF_APPLY_IMPL_CORE, NULL, NULL, NULL, 0, 0, 0 },
        { "core pvwait", MF_APPLY_IMPL_CORE, NULL, NULL, NULL, 1, 0, 1 },
        { "core BN64", MF_APPLY_IMPL_CORE, "MF_CORE_GATHER", "0", NULL, 0, 0, 0 },
        /* the default at B = 64 is the persistent kernel; core_kernel's gathered tiles */
        { "core gather", MF_APPLY_IMPL_CORE, "MF_CORE_PERSIST", "0", NULL, 1, 0, 0 },
        { "core persist", MF_APPLY_IMPL_CORE, "MF_CORE_PERSIST", "1", NULL, 1, 0, 0 },
        { "core persist3", MF_APPLY_IMPL_CORE, "MF_CORE_PERSIST", "1", "3", 1, 0, 0 },
        { "core persist1", MF_APPLY_IMPL_CORE, "MF_CORE_PERSIST", "1", "1", 1, 1, 0 },
        { "core persist pvwait", MF_APPLY_IMPL_CORE, "MF_CORE_PERSIST", "1", NULL, 1, 1, 1 },
        { "core persist3 pvwait", MF_APPLY_IMPL_CORE, "MF_CORE_PERSIST", "1", "3", 1, 0, 1 },
        { "core persist1 pvwait", MF_APPLY_IMPL_CORE, "MF_CORE_PERSIST", "1", "1", 1, 1, 1 },
        /* B = 64 prob heads on v2, as before the core's prob kernel (its A/B switch) */
        { "core probv2", MF_APPLY_IMPL_CORE, "MF_APPLY_PROB", "v2", NULL, 0, 0, 0 },
        { "v2", MF_APPLY_IMPL_V2, NULL, NULL, NULL, 0, 0, 0 },
    };
    int pass = 1;
    for (size_t v = 0; v < sizeof(impls) / sizeof(impls[0]); v++) {
        if ((impls[v].env && c->b != 64) || (impls[v].full_only && g_small))
            continue;
        char label[128];
        snprintf(label, sizeof(label), "apply %s %s", impls[v].label, base);
        name = label;
        uint32_t bad = 0;
        CK(cudaMemset(d_o, 0xff, on * 4)); /* NaN poison */
        CK(cudaMemset(dbad, 0, 4));
        mf_apply_cuda_args_t ga = { .rows = dptr, .n_rows = full, .map = &map, .tgt = tgt.dev,
                                    .block_size = c->b, .exact = exact, .exact_first = 0,
                                    .exact_last = 1, .o = d_o, .bad_rows = dbad };
        if (impls[v].env)
            setenv(impls[v].env, impls[v].val, 1);
        if (impls[v].ctas)
            setenv("MF_CORE_PERSIST_CTAS", impls[v].ctas, 1);
        if (impls[v].pvw)
            setenv("MF_CORE_PVWAIT", "1", 1);
        mf_status_t st = mf_apply_cuda_impl(&ga, impls[v].impl, 0, &why);
        if (impls[v].env)
            unsetenv(impls[v].env);
        unsetenv("MF_CORE_PERSIST_CTAS");
        unsetenv("MF_CORE_PVWAIT");
        if (st != MF_OK)
            printf("%s: mf_apply_cuda: %s (%s)\n", name, mf_status_name(st), why);
        CK(cudaDeviceSynchronize());
        CK(cudaGetLastError());
        CK(cudaMemcpy(o_gpu, d_o, on * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(&bad, dbad, 4, cudaMemcpyDeviceToHost));
        if (impls[v].impl == MF_APPLY_IMPL_CORE && !impls[v].env && !impls[v].pvw)
            memcpy(o_core, o_gpu, on * 4);
        /* error per mode (a head's rows in exact blocks count as compute) */
        double num[3] = { 0 }, den[3] = { 0 };
        size_t unwritten = 0;
        for (uint32_t r = 0; r < c->n; r++) {
            uint32_t i = r / c->b;
            int ex = i >= full || !vp[i] || exact[i] || i + 1 >= full;
            for (uint32_t t = 0; t < c->ht; t++) {
                int md = ex ? MF_HEAD_COMPUTE : mode[t];
                for (uint32_t x = 0; x < c->d; x++) {
                    size_t at = ((size_t)r * c->ht + t) * c->d + x;
                    if (!isfinite(o_gpu[at])) {
                        unwritten++;
                        continue;
                    }
                    double dd = (double)o_gpu[at] - o_ref[at];
                    num[md] += dd * dd;
                    den[md] += (double)o_ref[at] * o_ref[at];
                }
            }
        }
        static const char *mn[3] = { "compute", "prob", "mask" };
        int ok = st == MF_OK && unwritten == 0 && bad == 0;
        report(name, "unwritten/bad", (double)unwritten + bad, 0, ok);
        for (int md = 0; md < 3; md++) {
            if (den[md] == 0)
                continue;
            double rel = sqrt(num[md] / den[md]);
            char metric[32];
            snprintf(metric, sizeof(metric), "rel err %s", mn[md]);
            report(name, metric, rel, 2e-3, rel <= 2e-3);
            ok &= rel <= 2e-3;
        }
        if (impls[v].same) {
            size_t diff = 0;
            for (size_t x = 0; x < on; x++)
                diff += memcmp(&o_gpu[x], &o_core[x], 4) != 0;
            report(name, "bits vs core", (double)diff, 0, diff == 0);
            ok &= diff == 0;
        }
        /* the same path with O in the model's dtype: rn of this run's fp32 O */
        if (impls[v].pvw)
            setenv("MF_CORE_PVWAIT", "1", 1);
        ok &= check_apply_t(name, &ga, impls[v].impl, impls[v].env, impls[v].val,
                            impls[v].ctas, d_t, o_gpu, on);
        unsetenv("MF_CORE_PVWAIT");
        pass &= ok;
    }
    mf_apply_cuda_args_t ga = { .rows = dptr, .n_rows = full, .map = &map, .tgt = tgt.dev,
                                .block_size = c->b, .exact = exact, .exact_first = 0,
                                .exact_last = 1, .o = d_o, .bad_rows = NULL };
    pass &= check_apply_odtype_args(base, &ga, on);
    /* host-side paths, not new kernels: left out of --small, which the sanitizers run */
    if (!g_small)
        pass &= check_apply_switches(base, &ga, mode, o_core, c->n, c->ht, c->d);
    if (!g_small && c->codec != MF_CODEC_MASK && full >= 3) {
        /* Every head prob, no exact block, N = the full blocks: at B = 64 the core's prob
         * kernel, and v2 for the blocks it leaves (the bad rows' among them: no pre-pass,
         * no core in this launch), else v2 alone. Block 1's row
         * given for block 2 (the GPU must count it and compute block 2 exactly; the
         * reference gets no row there, which means the same); with ≥ 5 blocks block 3's
         * row 8 bytes off its 16-byte alignment (the same: counted, computed exactly). */
        uint8_t *pmode = malloc(c->ht);
        memset(pmode, MF_HEAD_PROB, c->ht);
        mf_layer_map_t pmap = { c->ht, c->hs, w, pmode, tp };
        const mf_row_view_t **vp2 = calloc(full, sizeof(*vp2));
        const void **dptr2 = calloc(full, sizeof(*dptr2));
        for (uint32_t k = 0; k < full; k++) {
            vp2[k] = k == 2 || (k == 3 && full >= 5) ? NULL : &views[k];
            dptr2[k] = drows + rs.off[k == 2 ? 1 : k];
            if (k == 3 && full >= 5)
                dptr2[k] = drows8 + 8 + rs.off[k];
        }
        uint32_t want_bad = (full >= 5 ? 2 : 1) * c->ht;
        mf_qkv_t th = tgt.host, td = tgt.dev;
        th.n_tokens = td.n_tokens = full * c->b;
        size_t pn = (size_t)full * c->b * c->ht * c->d;
        mf_apply_args_t ra2 = { .rows = vp2, .n_rows = full, .map = &pmap, .tgt = th,
                                .block_size = c->b, .o = o_ref };
        if (mf_apply_ref(&ra2, NULL, &why) != MF_OK) {
            fprintf(stderr, "%s: reference apply (prob only): %s\n", base, why);
            exit(2);
        }
        mf_apply_cuda_args_t g2 = { .rows = dptr2, .n_rows = full, .map = &pmap, .tgt = td,
                                    .block_size = c->b, .o = d_o, .bad_rows = dbad };
        uint32_t bad = 0;
        CK(cudaMemset(d_o, 0xff, pn * 4));
        CK(cudaMemset(dbad, 0, 4));
        mf_status_t st = mf_apply_cuda_impl(&g2, MF_APPLY_IMPL_CORE, 0, &why);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(o_gpu, d_o, pn * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(&bad, dbad, 4, cudaMemcpyDeviceToHost));
        double num = 0, den = 0;
        size_t unwritten = 0;
        for (size_t x = 0; x < pn; x++) {
            if (!isfinite(o_gpu[x])) {
                unwritten++;
                continue;
            }
            double dd = (double)o_gpu[x] - o_ref[x];
            num += dd * dd;
            den += (double)o_ref[x] * o_ref[x];
        }
        double rel = den > 0 ? sqrt(num / den) : 1.0;
        char label[160];
        snprintf(label, sizeof(label), "apply core prob-only %s", base);
        /* bad_rows counts per (row, head reading it): every head reads blocks 2's and 3's */
        int ok = st == MF_OK && unwritten == 0 && bad == want_bad;
        report(label, "unwritten, bad != want", (double)unwritten + (bad != want_bad), 0, ok);
        report(label, "rel err prob", rel, 2e-3, rel <= 2e-3);
        pass &= ok && rel <= 2e-3;
        if (c->b == 64) {
            /* the persistent prob kernel on 2 CTAs (each walks many items: both item
             * buffers reused, the ring across items): bit for bit the run above's O and
             * the same bad-row count (the follow-up's work list filled across CTAs) */
            float *o_p2 = malloc(pn * 4);
            uint32_t bad2 = 0;
            CK(cudaMemset(d_o, 0xff, pn * 4));
            CK(cudaMemset(dbad, 0, 4));
            setenv("MF_CORE_PERSIST_CTAS", "2", 1);
            mf_status_t st2 = mf_apply_cuda_impl(&g2, MF_APPLY_IMPL_CORE, 0, &why);
            unsetenv("MF_CORE_PERSIST_CTAS");
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(o_p2, d_o, pn * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(&bad2, dbad, 4, cudaMemcpyDeviceToHost));
            size_t differ = 0;
            for (size_t x = 0; x < pn; x++)
                differ += memcmp(&o_p2[x], &o_gpu[x], 4) != 0;
            int ok2 = st2 == MF_OK && differ == 0 && bad2 == want_bad;
            report(label, "2 CTAs: O differs, bad", (double)differ + (bad2 != want_bad), 0, ok2);
            pass &= ok2;
            free(o_p2);
        }
        /* O in T on v2 alone, the bad row's block recomputed: rn of the fp32 run's O */
        pass &= check_apply_t(label, &g2, MF_APPLY_IMPL_CORE, NULL, NULL, NULL, d_t, o_gpu, pn);
        free(pmode);
        free(vp2);
        free(dptr2);
    }
    free(o_core);
    free(o_ref);
    free(o_gpu);
    free(w);
    free(tp);
    free(mode);
    free(exact);
    free(views);
    free(vp);
    free(dptr);
    free(sizes);
    free(tokens);
    cudaFree(drows);
    cudaFree(drows8);
    cudaFree(d_o);
    cudaFree(d_t);
    cudaFree(dbad);
    rowset_free(&rs);
    tensors_free(&src);
    tensors_free(&tgt);
    return pass;
}

int main(int argc, char **argv)
{
    int small = 0, masses_only = 0, export_only = 0;
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);
    for (int x = 1; x < argc; x++) {
        if (!strcmp(argv[x], "--small"))
            small = g_small = 1;
        else if (!strcmp(argv[x], "--masses"))
            masses_only = 1;
        else if (!strcmp(argv[x], "--export"))
            export_only = 1;
        else if (!strcmp(argv[x], "--seed") && x + 1 < argc)
            seed = strtoull(argv[++x], NULL, 0);
        else {
            fprintf(stderr,
                    "usage: gpu_check [--small] [--masses] [--export] [--seed S]\n");
            return 2;
        }
    }
    printf("gpu_check seed %llu\n", (unsigned long long)seed);
    int fails = 0, cases = 0;
    const mf_codec_t codecs[] = { MF_CODEC_MASK, MF_CODEC_FP16, MF_CODEC_BF16,
                                  MF_CODEC_FP8_E4M3, MF_CODEC_U8_LOG };
    if (export_only) {
        fails += export_cases(small, seed + 60, &cases);
    } else if (small && masses_only) { /* for compute-sanitizer on the masses alone */
        fails += !check_masses(MF_DTYPE_BF16, 128, 320, 4, 2, 0.9f, 1, seed + 5);
        fails += !check_masses(MF_DTYPE_F16, 64, 200, 2, 1, 0.9f, 0, seed + 6);
        fails += !check_masses_args();
        cases = 3;
    } else if (small) {
        ext_case_t e = { MF_DTYPE_F16, 64, 64, 256, 4, 2, MF_CODEC_FP8_E4M3, 0, 0.9f };
        /* N 300: 5 blocks, the last 128-row tile block 4 alone (exact: union 0..4, odd) */
        app_case_t a = { MF_DTYPE_F16, 64, 64, 300, 4, 2, 4, MF_CODEC_FP8_E4M3, 0 };
        app_case_t a1 = { MF_DTYPE_BF16, 64, 128, 200, 8, 2, 4, MF_CODEC_FP16, 1, 1 };
        fails += !check_extract(&e, seed);
        fails += !check_apply(&a, seed + 1);
        fails += !check_apply(&a1, seed + 2);
        fails += !check_dense(MF_DTYPE_BF16, 128, 300, 4, 2, seed + 3);
        fails += !check_dense(MF_DTYPE_F16, 64, 200, 2, 1, seed + 4);
        fails += !check_masses(MF_DTYPE_BF16, 128, 320, 4, 2, 0.9f, 1, seed + 5);
        fails += !check_masses_args();
        cases = 7;
        fails += export_cases(1, seed + 60, &cases);
        fails += sample_cases(1, seed + 70, &cases);
    } else if (masses_only) {
        fails += !check_masses(MF_DTYPE_BF16, 128, 1024, 8, 2, 0.9f, 1, seed + 50);
        fails += !check_masses(MF_DTYPE_F16, 128, 2000, 4, 1, 0.95f, 0, seed + 51);
        fails += !check_masses(MF_DTYPE_BF16, 64, 1100, 6, 2, 0.8f, 1, seed + 52);
        fails += !check_masses(MF_DTYPE_F16, 64, 640, 4, 4, 0.9f, 0, seed + 53);
        fails += !check_masses_args();
        fails += !check_dense(MF_DTYPE_BF16, 128, 2500, 4, 1, seed + 40);
        fails += !check_dense(MF_DTYPE_F16, 64, 640, 6, 2, seed + 43);
        cases = 7;
    } else {
        for (int ci = 0; ci < 5; ci++) {
            ext_case_t e = { ci & 1 ? MF_DTYPE_BF16 : MF_DTYPE_F16, 64, ci < 3 ? 128 : 64,
                             768, 8, 2, codecs[ci], ci & 1, 0.9f };
            fails += !check_extract(&e, seed + ci);
            cases++;
        }
        ext_case_t e2 = { MF_DTYPE_F16, 128, 128, 768, 4, 4, MF_CODEC_U8_LOG, 1, 0.95f };
        ext_case_t e3 = { MF_DTYPE_BF16, 32, 64, 512, 6, 3, MF_CODEC_FP16, 0, 1.0f };
        fails += !check_extract(&e2, seed + 10);
        fails += !check_extract(&e3, seed + 11);
        cases += 2;
        for (int ci = 0; ci < 5; ci++) {
            app_case_t a = { ci & 1 ? MF_DTYPE_BF16 : MF_DTYPE_F16, 64, ci < 3 ? 128 : 64,
                             768 + 37, 8, 2, 8, codecs[ci], ci & 1 };
            fails += !check_apply(&a, seed + 20 + ci);
            cases++;
        }
        app_case_t a2 = { MF_DTYPE_F16, 128, 128, 900, 4, 1, 6, MF_CODEC_FP8_E4M3, 0 };
        app_case_t a3 = { MF_DTYPE_BF16, 32, 64, 520, 8, 4, 4, MF_CODEC_U8_LOG, 0 };
        /* 8 query heads a KV head: modes uniform per KV group (grp), or mixed inside it */
        app_case_t a4 = { MF_DTYPE_BF16, 64, 128, 640, 16, 2, 8, MF_CODEC_FP8_E4M3, 1 };
        app_case_t a5 = { MF_DTYPE_F16, 64, 128, 700, 16, 2, 8, MF_CODEC_BF16, 0 };
        app_case_t a6 = { MF_DTYPE_F16, 128, 64, 900, 8, 2, 8, MF_CODEC_FP16, 1 };
        app_case_t a7 = { MF_DTYPE_BF16, 32, 128, 520, 8, 2, 8, MF_CODEC_FP8_E4M3, 1 };
        fails += !check_apply(&a2, seed + 30);
        fails += !check_apply(&a3, seed + 31);
        fails += !check_apply(&a4, seed + 32);
        fails += !check_apply(&a5, seed + 33);
        fails += !check_apply(&a6, seed + 34);
        fails += !check_apply(&a7, seed + 35);
        cases += 6;
        /* the core's prob kernel (B = 64): W with 1 / all / 3 source heads, zero-mass
         * blocks, N not a multiple of 128, FP8 / FP16 / U8_LOG / BF16 rows */
        app_case_t p1 = { MF_DTYPE_BF16, 64, 128, 805, 9, 3, 6, MF_CODEC_FP8_E4M3, 0, 1 };
        app_case_t p2 = { MF_DTYPE_F16, 64, 128, 1000, 6, 2, 8, MF_CODEC_FP16, 1, 1 };
        app_case_t p3 = { MF_DTYPE_F16, 64, 64, 700, 6, 3, 6, MF_CODEC_U8_LOG, 0, 1 }; /* hs even: the source tensors have hs / 2 KV heads */
        app_case_t p4 = { MF_DTYPE_BF16, 64, 64, 1100, 3, 1, 4, MF_CODEC_BF16, 0, 1 };
        fails += !check_apply(&p1, seed + 36);
        fails += !check_apply(&p2, seed + 37);
        fails += !check_apply(&p3, seed + 38);
        fails += !check_apply(&p4, seed + 39);
        cases += 4;
        fails += !check_dense(MF_DTYPE_BF16, 128, 2500, 4, 1, seed + 40);
        fails += !check_dense(MF_DTYPE_F16, 128, 1000, 8, 2, seed + 41);
        fails += !check_dense(MF_DTYPE_BF16, 64, 1100, 4, 4, seed + 42);
        fails += !check_dense(MF_DTYPE_F16, 64, 640, 6, 2, seed + 43);
        cases += 4;
        fails += !check_masses(MF_DTYPE_BF16, 128, 1024, 8, 2, 0.9f, 1, seed + 50);
        fails += !check_masses(MF_DTYPE_F16, 128, 2000, 4, 1, 0.95f, 0, seed + 51);
        fails += !check_masses(MF_DTYPE_BF16, 64, 1100, 6, 2, 0.8f, 1, seed + 52);
        fails += !check_masses_args();
        cases += 4;
        fails += export_cases(0, seed + 60, &cases);
        fails += sample_cases(0, seed + 70, &cases);
    }
    printf("\n== gpu_check summary (seed %llu) ==\n", (unsigned long long)seed);
    printf("%-52s %-18s %-10s %-8s %s\n", "case", "metric", "value", "limit", "result");
    for (int x = 0; x < g_nres; x++)
        printf("%-52s %-18s %-10.3e %-8.1e %s\n", g_res[x].name, g_res[x].metric,
               g_res[x].value, g_res[x].limit, g_res[x].pass ? "ok" : "FAIL");
    printf("%d cases, %d failed\n", cases, fails);
    return fails ? 1 : 0;
}
