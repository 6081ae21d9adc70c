/*
 * mapflow-bench-kernels — CPU baseline of the reference kernels, the numbers the GPU
 * kernels must beat. For each N, d and source Top-P it times, on sampled query blocks
 * spread evenly over the context (cost grows linearly with the block index, so the mean
 * over evenly spaced blocks × the block count estimates a whole prefill):
 *   extract (MASK rows and U8_LOG rows), apply in prob mode (U8_LOG rows), apply in mask
 *   mode (MASK rows, target Top-P 0.95) and dense causal attention (compute mode),
 * and reports time per token per head, bytes per row and the kept-block density.
 *
 *   mapflow-bench-kernels [--quick] [--samples S]
 *
 * Structured synthetic Q/K/V (kernels/synth.h), B = 64, 2 query heads, 2 KV heads.
 * Not part of `make test` (it is timed).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mapflow_kernels.h"
#include "synth.h"

enum { B = 64, H = 2 };

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct result {
    double extract_mask, extract_u8, apply_prob, apply_mask, dense; /* s per block */
    double bytes_mask, bytes_u8, density, mask_density;
} result_t;

static int run_config(uint32_t n, uint32_t d, float top_p, uint32_t samples, result_t *res)
{
    size_t nq = (size_t)n * H * d;
    float *q = malloc(nq * 4), *k = malloc(nq * 4), *v = malloc(nq * 4), *o = malloc(nq * 4);
    uint32_t *tok = malloc((size_t)n * 4), nb = n / B;
    mf_row_view_t *views = calloc(nb, sizeof(*views));
    const mf_row_view_t **ptrs = calloc(nb, sizeof(*ptrs));
    size_t cap = mf_extract_row_bound(MF_CODEC_U8_LOG, B, H, nb - 1, 5);
    void *row_m = aligned_alloc(16, cap), *row_u = aligned_alloc(16, cap);
    if (!q || !k || !v || !o || !tok || !views || !ptrs || !row_m || !row_u)
        return 0;
    mf_synth_opts_t so = { .seed = 7, .n_tokens = n, .n_q_heads = H, .n_kv_heads = H,
                           .head_dim = d, .window = 128 };
    mf_synth_qkv(&so, q, k, v);
    for (uint32_t t = 0; t < n; t++)
        tok[t] = t * 2654435761u;
    mf_extract_args_t ea = {
        .src = { q, k, NULL, MF_DTYPE_F32, n, H, H, d }, .block_size = B, .top_p = top_p,
        .model = "bench", .ns = "default", .layer = 0, .tokens = tok,
    };
    float w[H * H] = { 0.75f, 0.25f, 0.25f, 0.75f }, tp[H] = { 0.95f, 0.95f };
    uint8_t m_prob[H] = { MF_HEAD_PROB, MF_HEAD_PROB }, m_mask[H] = { MF_HEAD_MASK, MF_HEAD_MASK };
    uint8_t m_dense[H] = { MF_HEAD_COMPUTE, MF_HEAD_COMPUTE };
    mf_layer_map_t map = { H, H, w, m_prob, tp };
    mf_apply_args_t aa = { .rows = ptrs, .n_rows = nb, .map = &map,
                           .tgt = { q, k, v, MF_DTYPE_F32, n, H, H, d }, .block_size = B,
                           .o = o };
    memset(res, 0, sizeof(*res));
    uint64_t entries = 0, cand = 0;
    mf_apply_stats_t st;
    for (uint32_t s = 0; s < samples; s++) {
        uint32_t i = (uint32_t)(((uint64_t)(2 * s + 1) * nb) / (2 * samples));
        size_t size_m, size_u;
        const char *why;
        ea.i0 = i;
        ea.i1 = i + 1;
        ea.codec = MF_CODEC_MASK;
        double t0 = now();
        if (mf_extract_ref(&ea, &row_m, &cap, &size_m, NULL, &why) != MF_OK)
            return 0;
        double t1 = now();
        ea.codec = MF_CODEC_U8_LOG;
        if (mf_extract_ref(&ea, &row_u, &cap, &size_u, NULL, &why) != MF_OK)
            return 0;
        double t2 = now();
        res->extract_mask += t1 - t0;
        res->extract_u8 += t2 - t1;
        res->bytes_mask += (double)size_m;
        res->bytes_u8 += (double)size_u;
        mf_row_view_t vm, vu;
        mf_row_decode(row_m, size_m, 0, &vm, &why);
        mf_row_decode(row_u, size_u, 0, &vu, &why);
        entries += vu.n_entries;
        cand += (uint64_t)H * (i + 1);
        aa.q0 = i;
        aa.q1 = i + 1;
        ptrs[i] = &vu;
        map.mode = m_prob;
        t0 = now();
        mf_apply_ref(&aa, &st, &why);
        t1 = now();
        ptrs[i] = &vm;
        map.mode = m_mask;
        mf_apply_ref(&aa, &st, &why);
        t2 = now();
        res->mask_density += (double)st.mask_blocks / (double)st.mask_candidates;
        map.mode = m_dense;
        mf_apply_ref(&aa, &st, &why);
        double t3 = now();
        ptrs[i] = NULL;
        res->apply_prob += t1 - t0;
        res->apply_mask += t2 - t1;
        res->dense += t3 - t2;
    }
    double inv = 1.0 / samples;
    res->extract_mask *= inv;
    res->extract_u8 *= inv;
    res->apply_prob *= inv;
    res->apply_mask *= inv;
    res->dense *= inv;
    res->bytes_mask *= inv;
    res->bytes_u8 *= inv;
    res->mask_density *= inv;
    res->density = (double)entries / (double)cand;
    free(q);
    free(k);
    free(v);
    free(o);
    free(tok);
    free(views);
    free(ptrs);
    free(row_m);
    free(row_u);
    return 1;
}

int main(int argc, char **argv)
{
    int quick = 0;
    uint32_t samples = 6;
    for (int a = 1; a < argc; a++) {
        if (strcmp(argv[a], "--quick") == 0)
            quick = 1;
        else if (strcmp(argv[a], "--samples") == 0 && a + 1 < argc)
            samples = (uint32_t)atoi(argv[++a]);
        else {
            fprintf(stderr, "usage: mapflow-bench-kernels [--quick] [--samples S]\n");
            return 2;
        }
    }
    if (samples < 1 || samples > 64)
        samples = 6;
    static const uint32_t ns[] = { 1024, 2048, 4096, 8192 }, ds[] = { 64, 128 };
    static const float tps[] = { 0.8f, 0.95f };
    printf("# MapFlow reference kernels on CPU (1 thread, float64 accumulation)\n");
    printf("# B = %d, Hq = Hkv = %d, %u sampled query blocks per config; times are per token "
           "per head, averaged over the whole causal prefill (us)\n", B, H, samples);
    printf("| N | d | src top-p | density | extract mask | extract u8log | apply prob | "
           "apply mask (tgt 0.95) | mask density | dense | row bytes mask | "
           "row bytes u8log |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (size_t x = 0; x < (quick ? 1 : 4); x++)
        for (size_t y = 0; y < 2; y++)
            for (size_t z = 0; z < 2; z++) {
                result_t r;
                uint32_t n = ns[x], d = ds[y];
                if (!run_config(n, d, tps[z], samples, &r)) {
                    fprintf(stderr, "bench: config N=%u d=%u failed\n", n, d);
                    return 1;
                }
                double per = 1e6 / ((double)B * H); /* s per block → us per token-head */
                printf("| %u | %u | %.2f | %.3f | %.2f | %.2f | %.2f | %.2f | %.3f | %.2f | "
                       "%.0f | %.0f |\n", n, d, tps[z], r.density, r.extract_mask * per,
                       r.extract_u8 * per, r.apply_prob * per, r.apply_mask * per,
                       r.mask_density, r.dense * per, r.bytes_mask, r.bytes_u8);
                fflush(stdout);
            }
    return 0;
}
