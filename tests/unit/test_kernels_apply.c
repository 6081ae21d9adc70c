/* Reference apply: prob / mask / compute heads, recompute rows, GQA, errors; and the
 * float64 dense attention it is compared with, checked against a hand computation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_kernels_util.h"

enum { N = 256, B = 16, NB = N / B, HS = 4, HT = 4, DS = 32, DT = 24 };

typedef struct pair {
    float *sq, *sk;            /* source Q [N,HS,DS], K [N,1,DS]: GQA 4:1 */
    float *tq, *tk, *tv;       /* target Q [N,HT,DT], K, V [N,1,DT]: GQA 4:1 */
    uint32_t tokens[N];
    float w[HT * HS];
    mf_extract_args_t ex;
    mf_qkv_t tgt;
} pair_t;

static void pair_init(pair_t *p, uint64_t seed)
{
    mf_synth_opts_t so = { .seed = seed, .n_tokens = N, .n_q_heads = HS, .n_kv_heads = 1,
                           .head_dim = DS, .window = 20 };
    mf_synth_opts_t to = { .seed = seed + 100, .n_tokens = N, .n_q_heads = HT,
                           .n_kv_heads = 1, .head_dim = DT, .window = 28 };
    p->sq = malloc((size_t)N * HS * DS * sizeof(float));
    p->sk = malloc((size_t)N * DS * sizeof(float));
    p->tq = malloc((size_t)N * HT * DT * sizeof(float));
    p->tk = malloc((size_t)N * DT * sizeof(float));
    p->tv = malloc((size_t)N * DT * sizeof(float));
    assert_int_equal(mf_synth_qkv(&so, p->sq, p->sk, NULL), MF_OK);
    assert_int_equal(mf_synth_qkv(&to, p->tq, p->tk, p->tv), MF_OK);
    mf_rng_t r;
    mf_rng_seed(&r, seed + 7);
    for (int t = 0; t < N; t++)
        p->tokens[t] = (uint32_t)(mf_rng_u64(&r) & 0xffff);
    for (int t = 0; t < HT; t++) { /* random rows on the simplex */
        double sum = 0, e[HS];
        for (int s = 0; s < HS; s++)
            sum += e[s] = -log(1.0 - mf_rng_uniform(&r));
        for (int s = 0; s < HS; s++)
            p->w[t * HS + s] = (float)(e[s] / sum);
    }
    p->ex = (mf_extract_args_t){
        .src = { .q = p->sq, .k = p->sk, .dtype = MF_DTYPE_F32, .n_tokens = N,
                 .n_q_heads = HS, .n_kv_heads = 1, .head_dim = DS },
        .block_size = B, .top_p = 1.0f, .codec = MF_CODEC_FP16, .i0 = 0, .i1 = NB,
        .model = "small", .ns = "default", .layer = 1, .tokens = p->tokens,
    };
    p->tgt = (mf_qkv_t){ .q = p->tq, .k = p->tk, .v = p->tv, .dtype = MF_DTYPE_F32,
                         .n_tokens = N, .n_q_heads = HT, .n_kv_heads = 1, .head_dim = DT };
}

static void pair_free(pair_t *p)
{
    free(p->sq);
    free(p->sk);
    free(p->tq);
    free(p->tk);
    free(p->tv);
}

static mf_apply_args_t apply_args(pair_t *p, tk_rows_t *rows, mf_layer_map_t *m, float *o)
{
    return (mf_apply_args_t){ .rows = rows->ptr, .n_rows = rows->n, .map = m, .tgt = p->tgt,
                              .block_size = B, .o = o };
}

/* Float64 prob-mode reference of head t, row r: dense source P mixed by W, times V. */
static void prob_reference(pair_t *p, uint32_t t, uint32_t r, double *out)
{
    double ps[HS][N], m[N], sum = 0;
    for (uint32_t s = 0; s < HS; s++)
        mf_attention_row_ref(&p->ex.src, s, r, ps[s], NULL);
    memset(out, 0, DT * sizeof(double));
    for (uint32_t k = 0; k <= r; k++) {
        m[k] = 0;
        for (uint32_t s = 0; s < HS; s++)
            m[k] += (double)p->w[t * HS + s] * ps[s][k];
        sum += m[k];
        for (uint32_t x = 0; x < DT; x++)
            out[x] += m[k] * p->tv[(size_t)k * DT + x];
    }
    for (uint32_t x = 0; x < DT; x++)
        out[x] /= sum;
}

/* Top-P = 1, FP16 tiles: prob mode equals attention with the mixed map (rel 1e-3). */
static void test_prob_topp1_fp16(void **state)
{
    (void)state;
    pair_t p;
    tk_rows_t rows;
    pair_init(&p, 21);
    assert_int_equal(tk_extract(&p.ex, &rows), MF_OK);
    uint8_t mode[HT] = { MF_HEAD_PROB, MF_HEAD_PROB, MF_HEAD_PROB, MF_HEAD_PROB };
    mf_layer_map_t m = { HT, HS, p.w, mode, NULL };
    float *o = malloc((size_t)N * HT * DT * sizeof(float));
    mf_apply_args_t a = apply_args(&p, &rows, &m, o);
    mf_apply_stats_t st;
    const char *why;
    assert_int_equal(mf_apply_ref(&a, &st, &why), MF_OK);
    assert_int_equal(st.exact_blocks, 0);
    assert_int_equal(st.prob_tiles, (uint64_t)HT * NB * (NB + 1) / 2);
    double ref[DT], worst = 0;
    for (uint32_t r = 0; r < N; r += 3)
        for (uint32_t t = 0; t < HT; t++) {
            prob_reference(&p, t, r, ref);
            double e = tk_max_rel(o + ((size_t)r * HT + t) * DT, ref, 1, DT);
            worst = e > worst ? e : worst;
        }
    assert_true(worst < 1e-3);
    assert_true(worst > 0); /* fp16 tiles: exactly zero error would mean no tiles were read */
    free(o);
    tk_rows_free(&rows);
    pair_free(&p);
}

/* Top-P = 1, mask mode: exact target attention (rel 1e-5). */
static void test_mask_topp1_exact(void **state)
{
    (void)state;
    pair_t p;
    tk_rows_t rows;
    pair_init(&p, 22);
    p.ex.codec = MF_CODEC_MASK;
    assert_int_equal(tk_extract(&p.ex, &rows), MF_OK);
    uint8_t mode[HT] = { MF_HEAD_MASK, MF_HEAD_MASK, MF_HEAD_MASK, MF_HEAD_MASK };
    float tp[HT] = { 1, 1, 1, 1 };
    mf_layer_map_t m = { HT, HS, p.w, mode, tp };
    float *o = malloc((size_t)N * HT * DT * sizeof(float));
    double *ref = malloc((size_t)N * HT * DT * sizeof(double));
    mf_apply_args_t a = apply_args(&p, &rows, &m, o);
    mf_apply_stats_t st;
    assert_int_equal(mf_apply_ref(&a, &st, NULL), MF_OK);
    assert_int_equal(st.mask_blocks, st.mask_candidates);
    assert_int_equal(mf_attention_dense_ref(&p.tgt, ref, NULL), MF_OK);
    assert_true(tk_max_rel(o, ref, (size_t)N * HT, DT) < 1e-5);
    free(o);
    free(ref);
    tk_rows_free(&rows);
    pair_free(&p);
}

/* One call, four heads, three modes (prob, mask, compute, prob), Top-P < 1, FP8 tiles.
 * Every head is checked against a float64 computation built here from the decoded row. */
static void test_mixed_modes(void **state)
{
    (void)state;
    pair_t p;
    tk_rows_t rows;
    pair_init(&p, 23);
    p.ex.codec = MF_CODEC_FP8_E4M3;
    p.ex.top_p = 0.9f;
    assert_int_equal(tk_extract(&p.ex, &rows), MF_OK);
    uint8_t mode[HT] = { MF_HEAD_PROB, MF_HEAD_MASK, MF_HEAD_COMPUTE, MF_HEAD_PROB };
    float tp[HT] = { 1, 0.8f, 1, 1 };
    mf_layer_map_t m = { HT, HS, p.w, mode, tp };
    float *o = malloc((size_t)N * HT * DT * sizeof(float));
    double *dense = malloc((size_t)N * HT * DT * sizeof(double));
    mf_apply_args_t a = apply_args(&p, &rows, &m, o);
    mf_apply_stats_t st;
    assert_int_equal(mf_apply_ref(&a, &st, NULL), MF_OK);
    assert_int_equal(mf_attention_dense_ref(&p.tgt, dense, NULL), MF_OK);
    assert_true(st.mask_blocks < st.mask_candidates);
    for (uint32_t i = 0; i < NB; i++) {
        const mf_row_view_t *v = &rows.view[i];
        /* mask head 1: mixed masses → Top-P → attention restricted to the kept blocks */
        double mass[NB] = { 0 };
        uint8_t cand[NB] = { 0 }, keep[NB];
        uint32_t kept;
        for (uint32_t c = 0; c < v->n_cols; c++)
            for (uint32_t s = 0; s < HS; s++) {
                int64_t e = mf_row_entry(v, c, s);
                if (e >= 0) {
                    mass[v->cols[c]] += p.w[1 * HS + s] * mf_row_mass(v, (uint32_t)e);
                    cand[v->cols[c]] = 1;
                }
            }
        assert_int_equal(mf_topp_select(mass, cand, i + 1, 0.8, keep, &kept), MF_OK);
        for (uint32_t q = 0; q < B; q++) {
            uint32_t r = i * B + q;
            double sc[N], mx = -INFINITY, sum = 0, want[DT] = { 0 };
            for (uint32_t k = 0; k <= r; k++) {
                if (!keep[k / B])
                    continue;
                double dot = 0;
                for (uint32_t x = 0; x < DT; x++)
                    dot += (double)p.tq[((size_t)r * HT + 1) * DT + x] * p.tk[(size_t)k * DT + x];
                sc[k] = dot / sqrt((double)DT);
                mx = sc[k] > mx ? sc[k] : mx;
            }
            for (uint32_t k = 0; k <= r; k++)
                if (keep[k / B]) {
                    double e = exp(sc[k] - mx);
                    sum += e;
                    for (uint32_t x = 0; x < DT; x++)
                        want[x] += e * p.tv[(size_t)k * DT + x];
                }
            for (uint32_t x = 0; x < DT; x++)
                want[x] /= sum;
            assert_true(tk_max_rel(o + ((size_t)r * HT + 1) * DT, want, 1, DT) < 1e-5);
            /* compute head 2: dense */
            assert_true(tk_max_rel(o + ((size_t)r * HT + 2) * DT,
                                   dense + ((size_t)r * HT + 2) * DT, 1, DT) < 1e-5);
            /* prob heads 0 and 3: decoded tiles mixed by W, renormalised by kept mass */
            for (uint32_t t = 0; t < HT; t += 3) {
                double pw[DT] = { 0 }, km = 0;
                for (uint32_t c = 0; c < v->n_cols; c++)
                    for (uint32_t s = 0; s < HS; s++) {
                        int64_t e = mf_row_entry(v, c, s);
                        if (e < 0)
                            continue;
                        for (uint32_t kk = 0; kk < B; kk++) {
                            uint32_t k = v->cols[c] * B + kk;
                            if (k > r)
                                break;
                            double val = p.w[t * HS + s] *
                                         (double)mf_row_tile_value(v, (uint32_t)e, q, kk);
                            km += val;
                            for (uint32_t x = 0; x < DT; x++)
                                pw[x] += val * p.tv[(size_t)k * DT + x];
                        }
                    }
                for (uint32_t x = 0; x < DT; x++)
                    pw[x] /= km;
                assert_true(tk_max_rel(o + ((size_t)r * HT + t) * DT, pw, 1, DT) < 1e-5);
                /* ...which is a convex combination of V rows k ≤ r */
                for (uint32_t x = 0; x < DT; x++) {
                    double lo = INFINITY, hi = -INFINITY;
                    for (uint32_t k = 0; k <= r; k++) {
                        double vv = p.tv[(size_t)k * DT + x];
                        lo = vv < lo ? vv : lo;
                        hi = vv > hi ? vv : hi;
                    }
                    float ov = o[((size_t)r * HT + t) * DT + x];
                    assert_true(ov >= lo - 1e-5 && ov <= hi + 1e-5);
                }
            }
        }
    }
    free(o);
    free(dense);
    tk_rows_free(&rows);
    pair_free(&p);
}

/* Recompute rows are exact: flagged blocks, the first F / last R, a missing row, blocks
 * past the rows given, and the partial tail block (N not a multiple of B). */
static void test_recompute_exact(void **state)
{
    (void)state;
    pair_t p;
    tk_rows_t rows;
    pair_init(&p, 24);
    p.ex.codec = MF_CODEC_U8_LOG;
    p.ex.top_p = 0.85f;
    assert_int_equal(tk_extract(&p.ex, &rows), MF_OK);
    const uint32_t n = N - 6, full = n / B; /* 15 full blocks + 10 tail tokens */
    uint8_t mode[HT] = { MF_HEAD_PROB, MF_HEAD_PROB, MF_HEAD_MASK, MF_HEAD_PROB };
    float tp[HT] = { 1, 1, 0.7f, 1 };
    mf_layer_map_t m = { HT, HS, p.w, mode, tp };
    uint8_t exact[NB] = { 0 };
    exact[2] = 1;
    rows.ptr[5] = NULL;
    float *o = malloc((size_t)n * HT * DT * sizeof(float));
    double *dense = malloc((size_t)n * HT * DT * sizeof(double));
    mf_apply_args_t a = apply_args(&p, &rows, &m, o);
    a.tgt.n_tokens = n;
    a.n_rows = 14;
    a.exact = exact;
    a.exact_first = 1;
    a.exact_last = 2;
    mf_apply_stats_t st;
    assert_int_equal(mf_apply_ref(&a, &st, NULL), MF_OK);
    mf_qkv_t t = p.tgt;
    t.n_tokens = n;
    assert_int_equal(mf_attention_dense_ref(&t, dense, NULL), MF_OK);
    const uint8_t want_exact[NB] = { [0] = 1, [2] = 1, [5] = 1, [13] = 1, [14] = 1, [15] = 1 };
    assert_int_equal(st.exact_blocks, 6 * HT);
    double worst_mapped = 0;
    for (uint32_t i = 0; i <= full; i++) {
        uint32_t r0 = i * B, r1 = r0 + B < n ? r0 + B : n;
        double e = tk_max_rel(o + (size_t)r0 * HT * DT, dense + (size_t)r0 * HT * DT,
                              (size_t)(r1 - r0) * HT, DT);
        if (want_exact[i])
            assert_true(e < 1e-5);
        else if (e > worst_mapped)
            worst_mapped = e;
    }
    assert_true(worst_mapped > 1e-3); /* mapped blocks really differ from dense */
    free(o);
    free(dense);
    tk_rows_free(&rows);
    pair_free(&p);
}

/* Bad input: clear statuses, never a crash. */
static void test_apply_errors(void **state)
{
    (void)state;
    pair_t p;
    tk_rows_t rows;
    pair_init(&p, 25);
    p.ex.codec = MF_CODEC_MASK;
    p.ex.i1 = 4;
    assert_int_equal(tk_extract(&p.ex, &rows), MF_OK);
    uint8_t mode[HT] = { MF_HEAD_PROB, MF_HEAD_MASK, MF_HEAD_MASK, MF_HEAD_MASK };
    mf_layer_map_t m = { HT, HS, p.w, mode, NULL };
    float *o = malloc((size_t)N * HT * DT * sizeof(float));
    mf_apply_args_t a = apply_args(&p, &rows, &m, o);
    const char *why;
    assert_int_equal(mf_apply_ref(&a, NULL, &why), MF_FAILED_PRECONDITION);
    assert_non_null(strstr(why, "tiles"));
    mode[0] = MF_HEAD_MASK;
    assert_int_equal(mf_apply_ref(&a, NULL, &why), MF_OK);
    p.w[3] = -0.1f;
    assert_int_equal(mf_apply_ref(&a, NULL, &why), MF_INVALID_ARGUMENT);
    p.w[3] = 0.1f;
    m.n_source_heads = 2;
    assert_int_equal(mf_apply_ref(&a, NULL, &why), MF_INVALID_ARGUMENT);
    m.n_source_heads = HS;
    mode[2] = 7;
    assert_int_equal(mf_apply_ref(&a, NULL, &why), MF_INVALID_ARGUMENT);
    mode[2] = MF_HEAD_MASK;
    const mf_row_view_t *swapped[2] = { rows.ptr[1], rows.ptr[0] };
    a.rows = swapped;
    a.n_rows = 2;
    assert_int_equal(mf_apply_ref(&a, NULL, &why), MF_INVALID_ARGUMENT);
    a.rows = rows.ptr;
    a.block_size = 32;
    assert_int_equal(mf_apply_ref(&a, NULL, &why), MF_INVALID_ARGUMENT);
    a.block_size = B;
    a.tgt.v = NULL;
    assert_int_equal(mf_apply_ref(&a, NULL, &why), MF_INVALID_ARGUMENT);
    free(o);
    tk_rows_free(&rows);
    pair_free(&p);
}

/* The float64 dense reference against a hand computation, GQA 2:1, odd N and d. */
static void test_dense_reference(void **state)
{
    (void)state;
    enum { n = 37, hq = 4, hkv = 2, d = 13 };
    mf_rng_t r;
    mf_rng_seed(&r, 26);
    float *q = tk_randn(&r, (size_t)n * hq * d, 1.5), *k = tk_randn(&r, (size_t)n * hkv * d, 1.5);
    float *v = tk_randn(&r, (size_t)n * hkv * d, 1.0);
    mf_qkv_t t = { q, k, v, MF_DTYPE_F32, n, hq, hkv, d };
    double o[n * hq * d], lse[hq * n];
    assert_int_equal(mf_attention_dense_ref(&t, o, lse), MF_OK);
    for (int row = 0; row < n; row++)
        for (int h = 0; h < hq; h++) {
            double s[n], sum = 0, want[d] = { 0 };
            for (int j = 0; j <= row; j++) {
                s[j] = 0;
                for (int x = 0; x < d; x++)
                    s[j] += (double)q[(row * hq + h) * d + x] * k[(j * hkv + h / 2) * d + x];
                s[j] /= sqrt((double)d);
                sum += exp(s[j]);
            }
            for (int j = 0; j <= row; j++)
                for (int x = 0; x < d; x++)
                    want[x] += exp(s[j]) / sum * v[(j * hkv + h / 2) * d + x];
            for (int x = 0; x < d; x++)
                assert_true(fabs(o[(row * hq + h) * d + x] - want[x]) < 1e-12);
            assert_true(fabs(lse[h * n + row] - log(sum)) < 1e-12);
        }
    t.n_kv_heads = 3;
    assert_int_equal(mf_attention_dense_ref(&t, o, NULL), MF_INVALID_ARGUMENT);
    free(q);
    free(k);
    free(v);
}

/* A query-block range computes only its blocks, bit-identical to a full call there, and
 * leaves O elsewhere untouched. */
static void test_block_range(void **state)
{
    (void)state;
    pair_t p;
    tk_rows_t rows;
    pair_init(&p, 27);
    p.ex.codec = MF_CODEC_BF16;
    p.ex.top_p = 0.9f;
    assert_int_equal(tk_extract(&p.ex, &rows), MF_OK);
    uint8_t mode[HT] = { MF_HEAD_PROB, MF_HEAD_MASK, MF_HEAD_COMPUTE, MF_HEAD_MASK };
    mf_layer_map_t m = { HT, HS, p.w, mode, NULL };
    size_t no = (size_t)N * HT * DT;
    float *full = malloc(no * sizeof(float)), *part = malloc(no * sizeof(float));
    mf_apply_args_t a = apply_args(&p, &rows, &m, full);
    assert_int_equal(mf_apply_ref(&a, NULL, NULL), MF_OK);
    for (size_t x = 0; x < no; x++)
        part[x] = 1234.5f;
    a.o = part;
    a.q0 = 3;
    a.q1 = 6;
    assert_int_equal(mf_apply_ref(&a, NULL, NULL), MF_OK);
    size_t lo = (size_t)3 * B * HT * DT, hi = (size_t)6 * B * HT * DT;
    for (size_t x = 0; x < no; x++)
        if (x >= lo && x < hi)
            assert_true(part[x] == full[x]);
        else
            assert_true(part[x] == 1234.5f);
    a.q0 = 6;
    assert_int_equal(mf_apply_ref(&a, NULL, NULL), MF_INVALID_ARGUMENT);
    a.q0 = 0;
    a.q1 = NB + 1;
    assert_int_equal(mf_apply_ref(&a, NULL, NULL), MF_INVALID_ARGUMENT);
    free(full);
    free(part);
    tk_rows_free(&rows);
    pair_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prob_topp1_fp16), cmocka_unit_test(test_mask_topp1_exact),
        cmocka_unit_test(test_mixed_modes),     cmocka_unit_test(test_recompute_exact),
        cmocka_unit_test(test_apply_errors),    cmocka_unit_test(test_dense_reference),
        cmocka_unit_test(test_block_range),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
