/* Calibration (planted mixing recovered), simplex projection, the .npy reader and the
 * mapping-profile loader. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "calibrate.h"
#include "mf_profile.h"
#include "npy.h"
#include "synth.h"
#include "test_calibrate_util.h"

/* ---- planted mixing --------------------------------------------------------------- */

static void test_planted_mixing(void **state)
{
    (void)state;
    tc_planted_t pl;
    tc_planted_init(&pl, 31, 0.002);
    mf_calib_t *c;
    assert_int_equal(mf_calib_create(TC_LS, TC_HS, TC_LT, TC_HT, &c), MF_OK);
    for (int q = 0; q < TC_SEQS; q++)
        assert_int_equal(mf_calib_add(c, pl.src[q], pl.tgt[q], TC_N), MF_OK);
    /* min_l0 = 1: with 3 blocks of 16 every block is forced (0 and the diagonal), so
     * mask recall is 1 everywhere here; test_mask_by_recall covers the recall rule. */
    mf_calib_opts_t o = { .max_error = 0.3, .min_l0 = 1, .block_size = 16 };
    assert_int_equal(mf_calib_fit(c, &o), MF_OK);
    assert_int_equal(mf_calib_l0(c), 1);
    for (uint32_t t = 0; t < TC_LT; t++) {
        mf_calib_layer_t r;
        assert_int_equal(mf_calib_layer(c, t, &r), MF_OK);
        if (t == 0) { /* target layer 0 is unrelated noise: never prob */
            assert_true(r.error > 0.3);
            for (uint32_t h = 0; h < TC_HT; h++)
                assert_int_not_equal(r.mode[h], MF_HEAD_PROB);
            continue;
        }
        assert_int_equal(r.source_layer, tc_planted_layer[t]);
        double worst = 0;
        for (uint32_t x = 0; x < TC_HT * TC_HS; x++) {
            double e = fabs(r.w[x] - pl.w[t][x]);
            worst = e > worst ? e : worst;
        }
        assert_true(worst <= 0.05);
        assert_true(r.error < 0.05);
        assert_true(r.base_error > r.error); /* one head cannot explain a mixture */
        for (uint32_t h = 0; h < TC_HT; h++) {
            double sum = 0;
            for (uint32_t s = 0; s < TC_HS; s++) {
                assert_true(r.w[h * TC_HS + s] >= 0);
                sum += r.w[h * TC_HS + s];
                assert_true(r.base_w[h * TC_HS + s] == 0.0 || r.base_w[h * TC_HS + s] == 1.0);
            }
            assert_true(fabs(sum - 1) < 1e-9);
            assert_int_equal(r.mode[h], MF_HEAD_PROB);
        }
        /* the planted source layer is clearly better than the others */
        for (uint32_t l = 0; l < TC_LS; l++)
            if (l != r.source_layer)
                assert_true(r.source_errors[l] > 2 * r.error);
    }
    /* The profile holds layers ≥ L0 and survives the validating decoder. */
    Mapflow__V1__MappingProfile *p;
    assert_int_equal(mf_calib_profile(c, &o, 0, &p), MF_OK);
    assert_int_equal(p->l0, 1);
    assert_int_equal(p->n_layers, TC_LT - 1);
    assert_int_equal(p->block_size, 16);
    assert_null(mf_profile_layer(p, 0));
    const Mapflow__V1__LayerMap *lm = mf_profile_layer(p, 2);
    assert_non_null(lm);
    assert_int_equal(lm->source_layer, tc_planted_layer[2]);
    mf_profile_free(p);
    mf_calib_destroy(c);
    tc_planted_free(&pl);
}

/* Mode thresholds per head: noisier heads move from prob to mask to compute. */
static void test_mode_thresholds(void **state)
{
    (void)state;
    tc_planted_t pl;
    tc_planted_init(&pl, 32, 0.002);
    /* Head 2 of target layer 1 gets heavy noise; its error rises, others stay low. */
    mf_rng_t r;
    mf_rng_seed(&r, 99);
    for (int q = 0; q < TC_SEQS; q++)
        for (uint32_t a = 0; a < TC_N; a++)
            for (uint32_t b = 0; b <= a; b++)
                pl.tgt[q][((size_t)(1 * TC_HT + 2) * TC_N + a) * TC_N + b] +=
                    (float)(0.3 * fabs(mf_rng_normal(&r)) / (a + 1));
    mf_calib_t *c;
    assert_int_equal(mf_calib_create(TC_LS, TC_HS, TC_LT, TC_HT, &c), MF_OK);
    for (int q = 0; q < TC_SEQS; q++)
        assert_int_equal(mf_calib_add(c, pl.src[q], pl.tgt[q], TC_N), MF_OK);
    mf_calib_layer_t l1;
    mf_calib_opts_t o = { .max_error = 0.9, .min_l0 = 0, .block_size = 16 };
    assert_int_equal(mf_calib_fit(c, &o), MF_OK);
    assert_int_equal(mf_calib_layer(c, 1, &l1), MF_OK);
    double noisy = l1.head_error[2], clean = l1.head_error[0];
    assert_true(noisy > 4 * clean);
    o.prob_max_error = (clean + noisy) / 2;
    o.mask_max_error = noisy * 2;
    assert_int_equal(mf_calib_fit(c, &o), MF_OK);
    assert_int_equal(mf_calib_layer(c, 1, &l1), MF_OK);
    assert_int_equal(l1.mode[0], MF_HEAD_PROB);
    assert_int_equal(l1.mode[2], MF_HEAD_MASK);
    o.mask_max_error = (clean + noisy) / 2 + 1e-9;
    assert_int_equal(mf_calib_fit(c, &o), MF_OK);
    assert_int_equal(mf_calib_layer(c, 1, &l1), MF_OK);
    assert_int_equal(l1.mode[2], MF_HEAD_COMPUTE);
    mf_calib_destroy(c);
    tc_planted_free(&pl);
}

/* ---- mask recall decides mask vs compute ------------------------------------------ */

enum { RC_N = 512, RC_B = 16, RC_NB = RC_N / RC_B, RC_HS = 2, RC_LT = 2, RC_HT = 2,
       RC_SEQS = 2 };

/*
 * Maps by block pattern: query block i attends to key blocks j ≤ i with (j − i − shift)
 * mod 3 == cls. Source head s (one source layer) has class s, spread over the keys of
 * its blocks with random weights. Target "sharp" heads have class 0 like source head 0
 * but put each block's mass on one random key (so the dense-map L2 error of any mixing
 * is large while the block masses match); "elsewhere" heads have class 2, which no
 * source head covers. Target layer 0 = {elsewhere, elsewhere}, layer 1 = {sharp,
 * elsewhere}.
 */
static void rc_map(mf_rng_t *r, float *m, uint32_t cls, uint32_t shift, int sharp)
{
    memset(m, 0, (size_t)RC_N * RC_N * sizeof(float));
    for (uint32_t q = 0; q < RC_N; q++) {
        uint32_t i = q / RC_B;
        double sum = 0;
        for (uint32_t j = 0; j <= i; j++) {
            if ((j + 3 * RC_NB - i - shift) % 3 != cls)
                continue;
            uint32_t kend = j == i ? q + 1 : (j + 1) * RC_B;
            if (sharp) {
                uint32_t k = j * RC_B + (uint32_t)(mf_rng_u64(r) % (kend - j * RC_B));
                sum += m[(size_t)q * RC_N + k] = (float)(0.5 + mf_rng_uniform(r));
                continue;
            }
            for (uint32_t k = j * RC_B; k < kend; k++)
                sum += m[(size_t)q * RC_N + k] = (float)(0.2 + mf_rng_uniform(r));
        }
        if (sum == 0) /* no key of this class yet: attend to the query itself */
            sum = m[(size_t)q * RC_N + q] = 1.0f;
        for (uint32_t k = 0; k <= q; k++)
            m[(size_t)q * RC_N + k] = (float)(m[(size_t)q * RC_N + k] / sum);
    }
}

static mf_calib_t *rc_calib(void)
{
    const size_t nn = (size_t)RC_N * RC_N;
    float *src = malloc(RC_HS * nn * sizeof(float)), *tgt = malloc(RC_LT * RC_HT * nn * 4);
    mf_calib_t *c;
    mf_rng_t r;
    mf_rng_seed(&r, 41);
    assert_non_null(src);
    assert_non_null(tgt);
    assert_int_equal(mf_calib_create(1, RC_HS, RC_LT, RC_HT, &c), MF_OK);
    for (int q = 0; q < RC_SEQS; q++) {
        uint32_t shift = (uint32_t)(mf_rng_u64(&r) % 3);
        for (uint32_t s = 0; s < RC_HS; s++)
            rc_map(&r, src + s * nn, s, shift, 0);
        rc_map(&r, tgt + 0 * nn, 2, shift, 0);
        rc_map(&r, tgt + 1 * nn, 2, shift, 1);
        rc_map(&r, tgt + 2 * nn, 0, shift, 1);
        rc_map(&r, tgt + 3 * nn, 2, shift, 0);
        assert_int_equal(mf_calib_add(c, src, tgt, RC_N), MF_OK);
    }
    free(src);
    free(tgt);
    return c;
}

static void test_mask_by_recall(void **state)
{
    (void)state;
    mf_calib_t *c = rc_calib();
    mf_calib_layer_t l0, l1;
    mf_calib_opts_t o = { .min_l0 = 0, .block_size = RC_B, .mask_min_recall = 0.9 };
    assert_int_equal(mf_calib_fit(c, &o), MF_OK);
    assert_int_equal(mf_calib_layer(c, 0, &l0), MF_OK);
    assert_int_equal(mf_calib_layer(c, 1, &l1), MF_OK);
    /* The sharp head: L2 error far above round 1's mask limit (0.9), recall high. */
    assert_true(l1.head_error[0] > 0.9);
    assert_true(l1.w[0] > 0.9); /* mixed onto source head 0, the one with its blocks */
    assert_true(l1.recall[0] >= 0.9);
    assert_int_equal(l1.mode[0], MF_HEAD_MASK);
    assert_true(l1.top_p[0] == 0.95);
    /* Heads whose blocks no source head keeps: low recall → compute, so layer 0 is all
     * compute and L0 = 1 even with min_l0 = 0. */
    for (uint32_t h = 0; h < RC_HT; h++) {
        assert_true(l0.recall[h] < 0.6);
        assert_int_equal(l0.mode[h], MF_HEAD_COMPUTE);
    }
    assert_true(l1.recall[1] < 0.6);
    assert_true(l1.head_error[1] < 0.9); /* round 1's L2 rule would have said mask */
    assert_int_equal(l1.mode[1], MF_HEAD_COMPUTE);
    assert_int_equal(mf_calib_l0(c), 1);
    /* The profile stores the head's target Top-P and its mode. */
    Mapflow__V1__MappingProfile *p;
    assert_int_equal(mf_calib_profile(c, &o, 0, &p), MF_OK);
    assert_int_equal(p->l0, 1);
    const Mapflow__V1__LayerMap *lm = mf_profile_layer(p, 1);
    assert_non_null(lm);
    assert_int_equal(lm->heads[0]->mode, MAPFLOW__V1__HEAD_MODE__HEAD_MASK);
    assert_true(fabsf(lm->heads[0]->top_p - 0.95f) < 1e-6f);
    mf_profile_free(p);

    /* A recall threshold above what the sharp head reaches sends it to compute too;
     * then no layer is mapped (L0 = Lt). */
    o.mask_min_recall = fmin(1.0, l1.recall[0] + 1e-3);
    double reached = l1.recall[0];
    assert_int_equal(mf_calib_fit(c, &o), MF_OK);
    assert_int_equal(mf_calib_layer(c, 1, &l1), MF_OK);
    if (reached < 0.999) {
        assert_int_equal(l1.mode[0], MF_HEAD_COMPUTE);
        assert_int_equal(mf_calib_l0(c), RC_LT);
    }

    /* Round 1's L2 gate, still available as an extra condition, rejects the sharp head. */
    o.mask_min_recall = 0.9;
    o.mask_max_error = 0.9;
    assert_int_equal(mf_calib_fit(c, &o), MF_OK);
    assert_int_equal(mf_calib_layer(c, 1, &l1), MF_OK);
    assert_int_equal(l1.mode[0], MF_HEAD_COMPUTE);
    mf_calib_destroy(c);
}

/* Per-head Top-P: the smallest grid value reaching the recall, monotone in the recall. */
static void test_per_head_top_p(void **state)
{
    (void)state;
    mf_calib_t *c = rc_calib();
    mf_calib_layer_t l1;
    double prev = 0;
    const double want[] = { 0.5, 0.7, 0.9, 0.95 };
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        mf_calib_opts_t o = { .min_l0 = 0, .block_size = RC_B, .mask_min_recall = want[k],
                              .per_head_top_p = 1 };
        assert_int_equal(mf_calib_fit(c, &o), MF_OK);
        assert_int_equal(mf_calib_layer(c, 1, &l1), MF_OK);
        assert_int_equal(l1.mode[0], MF_HEAD_MASK);
        assert_true(l1.recall[0] >= want[k]);
        assert_true(l1.top_p[0] >= prev);
        assert_true(l1.top_p[0] > 0 && l1.top_p[0] <= 1.0);
        prev = l1.top_p[0];
        /* the uncovered head stays compute even at Top-P 1 (all candidates) */
        assert_int_equal(l1.mode[1], MF_HEAD_COMPUTE);
        assert_true(l1.top_p[1] == 1.0);
    }
    assert_true(prev > 0.5); /* recall 0.95 needs more than the smallest grid value */
    /* block sizes that are not a power of two ≥ 8 are refused */
    mf_calib_opts_t bad = { .block_size = 12 };
    assert_int_equal(mf_calib_fit(c, &bad), MF_INVALID_ARGUMENT);
    bad.block_size = 4;
    assert_int_equal(mf_calib_fit(c, &bad), MF_INVALID_ARGUMENT);
    mf_calib_destroy(c);
}

static void test_simplex_projection(void **state)
{
    (void)state;
    mf_rng_t r;
    mf_rng_seed(&r, 33);
    for (int it = 0; it < 200; it++) {
        uint32_t n = 1 + (uint32_t)(mf_rng_u64(&r) % 12);
        double v[12], p[12], sum = 0;
        for (uint32_t i = 0; i < n; i++)
            p[i] = v[i] = 2.0 * mf_rng_normal(&r);
        mf_simplex_project(p, n);
        for (uint32_t i = 0; i < n; i++) {
            assert_true(p[i] >= 0);
            sum += p[i];
        }
        assert_true(fabs(sum - 1) < 1e-12);
        /* optimality (KKT): p − v is −θ on the support and ≥ −θ off it */
        double theta = NAN;
        for (uint32_t i = 0; i < n; i++)
            if (p[i] > 0) {
                if (isnan(theta))
                    theta = v[i] - p[i];
                assert_true(fabs(v[i] - p[i] - theta) < 1e-9);
            }
        for (uint32_t i = 0; i < n; i++)
            if (p[i] == 0)
                assert_true(v[i] <= theta + 1e-9);
    }
}

/* ---- .npy reader ------------------------------------------------------------------- */

static void write_raw(const char *path, const void *a, size_t n, const void *b, size_t m)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(a, 1, n, f), n);
    if (m)
        assert_int_equal(fwrite(b, 1, m, f), m);
    fclose(f);
}

/* A v1 file with this header text (padded, '\n') and `data` bytes of payload. */
static void write_npy_text(const char *path, const char *dict, size_t data)
{
    char buf[512];
    size_t dl = strlen(dict), hl = dl + 1;
    hl += (64 - (10 + hl) % 64) % 64;
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (char)(hl & 0xff);
    buf[9] = (char)(hl >> 8);
    memcpy(buf + 10, dict, dl);
    memset(buf + 10 + dl, ' ', hl - dl - 1);
    buf[10 + hl - 1] = '\n';
    void *z = calloc(1, data + 1);
    write_raw(path, buf, 10 + hl, z, data);
    free(z);
}

static void test_npy_roundtrip(void **state)
{
    (void)state;
    char dir[] = "/tmp/mf_npy_XXXXXX", path[256];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/a.npy", dir);
    mf_rng_t r;
    mf_rng_seed(&r, 34);
    uint64_t shape[4] = { 2, 3, 5, 5 };
    float data[150];
    for (int i = 0; i < 150; i++)
        data[i] = (float)mf_rng_normal(&r);
    for (int dt = MF_NPY_F32; dt <= MF_NPY_F16; dt++) {
        mf_npy_t a;
        char err[256];
        assert_int_equal(mf_npy_write(path, (mf_npy_dtype_t)dt, data, 4, shape), MF_OK);
        assert_int_equal(mf_npy_read(path, 1000, &a, err, sizeof err), MF_OK);
        assert_int_equal(a.hdr.ndim, 4);
        assert_memory_equal(a.hdr.shape, shape, sizeof shape);
        assert_int_equal(a.hdr.n_elems, 150);
        assert_int_equal(a.hdr.data_offset % 64, 0);
        for (int i = 0; i < 150; i++)
            assert_true(fabs(a.data[i] - data[i]) <= (dt ? 0x1p-11 * fabs(data[i]) + 1e-7 : 0));
        mf_npy_free(&a);
        /* the element limit applies before any allocation */
        assert_int_equal(mf_npy_read(path, 149, &a, err, sizeof err), MF_OUT_OF_RANGE);
        assert_null(a.data);
    }
    uint64_t one[1] = { 3 };
    mf_npy_t a;
    assert_int_equal(mf_npy_write(path, MF_NPY_F32, data, 1, one), MF_OK);
    assert_int_equal(mf_npy_read(path, 10, &a, NULL, 0), MF_OK);
    assert_int_equal(a.hdr.ndim, 1);
    assert_int_equal(a.hdr.shape[0], 3);
    mf_npy_free(&a);
    unlink(path);
    rmdir(dir);
}

static void test_npy_malformed(void **state)
{
    (void)state;
    char dir[] = "/tmp/mf_npy_XXXXXX", path[256], err[256];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/bad.npy", dir);
    const struct {
        const char *dict;
        size_t data;
        mf_status_t want;
        const char *msg;
    } cases[] = {
        { "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", 8, MF_INVALID_ARGUMENT,
          "'>f4' not supported" },
        { "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", 16, MF_INVALID_ARGUMENT,
          "'<f8' not supported" },
        { "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 16,
          MF_INVALID_ARGUMENT, "fortran_order" },
        { "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", 12, MF_DATA_LOSS,
          "header says" },
        { "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", 20,
          MF_INVALID_ARGUMENT, "header says" },
        { "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999), }",
          0, MF_OUT_OF_RANGE, "limit" },
        { "{'descr': '<f4', 'fortran_order': False, 'shape': (2, -2), }", 0,
          MF_INVALID_ARGUMENT, "shape" },
        { "{'descr': '<f4', 'fortran_order': False, }", 0, MF_INVALID_ARGUMENT, "lacks" },
        { "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}", 4,
          MF_INVALID_ARGUMENT, "unknown key" },
        { "[1, 2]", 0, MF_INVALID_ARGUMENT, "not a dict" },
        { "{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }", 4,
          MF_INVALID_ARGUMENT, "dimensions" },
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        mf_npy_t a;
        write_npy_text(path, cases[k].dict, cases[k].data);
        mf_status_t st = mf_npy_read(path, 1u << 20, &a, err, sizeof err);
        if (st != cases[k].want || !strstr(err, cases[k].msg))
            fail_msg("case %zu: status %d, message '%s'", k, st, err);
        assert_null(a.data);
    }
    /* header length pointing past the end, bad magic, bad version, missing file */
    write_raw(path, "\x93NUMPY\x01\x00\xff\x00{", 11, NULL, 0);
    mf_npy_t a;
    assert_int_equal(mf_npy_read(path, 100, &a, err, sizeof err), MF_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "truncated"));
    write_raw(path, "PK\x03\x04 not numpy at all", 22, NULL, 0);
    assert_int_equal(mf_npy_read(path, 100, &a, err, sizeof err), MF_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "magic"));
    write_raw(path, "\x93NUMPY\x09\x00\x10\x00{}              ", 26, NULL, 0);
    assert_int_equal(mf_npy_read(path, 100, &a, err, sizeof err), MF_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "version"));
    unlink(path);
    assert_int_equal(mf_npy_read(path, 100, &a, err, sizeof err), MF_NOT_FOUND);
    rmdir(dir);
}

/* ---- profiles ---------------------------------------------------------------------- */

static void test_profile_roundtrip(void **state)
{
    (void)state;
    tc_planted_t pl;
    tc_planted_init(&pl, 35, 0.002);
    mf_calib_t *c;
    assert_int_equal(mf_calib_create(TC_LS, TC_HS, TC_LT, TC_HT, &c), MF_OK);
    assert_int_equal(mf_calib_fit(c, &(mf_calib_opts_t){ 0 }), MF_FAILED_PRECONDITION);
    for (int q = 0; q < TC_SEQS; q++)
        assert_int_equal(mf_calib_add(c, pl.src[q], pl.tgt[q], TC_N), MF_OK);
    mf_calib_opts_t o = { .max_error = 0.3, .source_model = "small", .target_model = "big",
                          .recompute_last = 2, .mask_top_p = 0.9 };
    assert_int_equal(mf_calib_fit(c, &o), MF_OK);
    Mapflow__V1__MappingProfile *p, *q;
    assert_int_equal(mf_calib_profile(c, &o, 1, &p), MF_OK);
    char dir[] = "/tmp/mf_prof_XXXXXX", path[256], err[256];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/p.bin", dir);
    assert_int_equal(mf_profile_save(path, p), MF_OK);
    assert_int_equal(mf_profile_load(path, &q), MF_OK);
    assert_string_equal(q->source_model, "small");
    assert_string_equal(q->target_model, "big");
    assert_int_equal(q->recompute->last_blocks, 2);
    assert_int_equal(q->n_layers, p->n_layers);
    assert_int_equal(q->l0, 1);
    for (size_t k = 0; k < q->n_layers; k++) {
        assert_memory_equal(q->layers[k]->w, p->layers[k]->w, p->layers[k]->n_w * 4);
        mf_layer_map_t m;
        uint8_t modes[TC_HT];
        float tp[TC_HT];
        assert_int_equal(mf_layer_map_from_proto(q->layers[k], &m, modes, tp), MF_OK);
        assert_int_equal(m.n_target_heads, TC_HT);
        assert_int_equal(m.n_source_heads, TC_HS);
        for (int h = 0; h < TC_HT; h++) {
            assert_int_equal(modes[h], q->layers[k]->heads[h]->mode);
            assert_true(fabsf(tp[h] - 0.9f) < 1e-6f);
        }
    }
    /* Invalid profiles are refused with a reason. */
    const char *why;
    float saved = q->layers[0]->w[0];
    q->layers[0]->w[0] = saved + 0.5f;
    assert_int_equal(mf_profile_validate(q, &why), MF_INVALID_ARGUMENT);
    assert_non_null(strstr(why, "sum to 1"));
    assert_int_equal(mf_profile_save(path, q), MF_INVALID_ARGUMENT);
    q->layers[0]->w[0] = -0.25f;
    assert_int_equal(mf_profile_validate(q, &why), MF_INVALID_ARGUMENT);
    q->layers[0]->w[0] = saved;
    q->layers[0]->target_layer = 0;
    assert_int_equal(mf_profile_validate(q, &why), MF_INVALID_ARGUMENT);
    assert_non_null(strstr(why, "below l0"));
    q->layers[0]->target_layer = 1;
    q->block_size = 48;
    assert_int_equal(mf_profile_validate(q, &why), MF_INVALID_ARGUMENT);
    q->block_size = 64;
    assert_int_equal(mf_profile_validate(q, &why), MF_OK);
    /* Garbage and missing files. */
    mf_rng_t r;
    mf_rng_seed(&r, 36);
    uint8_t junk[300];
    for (size_t k = 0; k < sizeof junk; k++)
        junk[k] = (uint8_t)mf_rng_u64(&r);
    write_raw(path, junk, sizeof junk, NULL, 0);
    mf_profile_free(q);
    assert_int_equal(mf_profile_read(path, &q, err, sizeof err), MF_INVALID_ARGUMENT);
    assert_null(q);
    assert_non_null(strstr(err, path));
    unlink(path);
    Mapflow__V1__MappingProfile *none = (void *)1;
    assert_int_equal(mf_profile_load(path, &none), MF_NOT_FOUND);
    assert_null(none);
    rmdir(dir);
    mf_profile_free(p);
    mf_calib_destroy(c);
    tc_planted_free(&pl);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_planted_mixing),  cmocka_unit_test(test_mode_thresholds),
        cmocka_unit_test(test_mask_by_recall),  cmocka_unit_test(test_per_head_top_p),
        cmocka_unit_test(test_simplex_projection), cmocka_unit_test(test_npy_roundtrip),
        cmocka_unit_test(test_npy_malformed),   cmocka_unit_test(test_profile_roundtrip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
