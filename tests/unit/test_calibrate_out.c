/* Calibration's OUTPUTS objective (calibrate.h, calibrate_out.c): a planted mixture is
 * recovered under both objectives, through both feeds; a case where the two objectives
 * pick different W (keys with identical values); bad arguments. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "calibrate.h"
#include "mf_profile.h"
#include "synth.h"
#include "test_calibrate_util.h"

enum { D = 8 };
static const size_t NN = (size_t)TC_N * TC_N, ND = (size_t)TC_N * D;

/* Random values [layers, kv, N, D] (normal, never zero), plus a per-layer offset: the
 * common part every mixture reproduces, which the centred error must not reward. */
static float *random_values(mf_rng_t *r, uint32_t layers, uint32_t kv)
{
    float *v = malloc((size_t)layers * kv * ND * sizeof(float));
    for (size_t x = 0; x < (size_t)layers * kv * ND; x++)
        v[x] = (float)(mf_rng_normal(r) + 2.0 * ((x % D) == 0));
    return v;
}

/* out [N, D] = m [N, N] · v [N, D] over k ≤ q (the test's own product). */
static void product(const float *m, const float *v, float *out)
{
    for (uint32_t q = 0; q < TC_N; q++)
        for (uint32_t j = 0; j < D; j++) {
            double s = 0;
            for (uint32_t k = 0; k <= q; k++)
                s += (double)m[q * TC_N + k] * v[k * D + j];
            out[q * D + j] = (float)s;
        }
}

/* The relative output error sqrt(Σ‖(T − Σ w_s S_s)·V‖² / Σ‖T·V − mean‖²) of one head,
 * computed directly from maps (one sequence per entry of src/tgt). */
static double output_error(float *const *tgt_maps, float *const *src_maps, float *const *vals,
                           int seqs, const double *w, uint32_t hs)
{
    double resid = 0, scale = 0;
    float *mix = malloc(NN * sizeof(float)), *o = malloc(ND * sizeof(float)),
          *ot = malloc(ND * sizeof(float));
    for (int q = 0; q < seqs; q++) {
        for (size_t x = 0; x < NN; x++) {
            double s = 0;
            for (uint32_t k = 0; k < hs; k++)
                s += w[k] * src_maps[q][k * NN + x];
            mix[x] = (float)s;
        }
        product(mix, vals[q], o);
        product(tgt_maps[q], vals[q], ot);
        double mean[D] = { 0 };
        for (size_t x = 0; x < ND; x++) {
            resid += (double)(o[x] - ot[x]) * (o[x] - ot[x]);
            scale += (double)ot[x] * ot[x];
            mean[x % D] += ot[x];
        }
        for (int j = 0; j < D; j++)
            scale -= mean[j] * mean[j] / TC_N;
    }
    free(mix);
    free(o);
    free(ot);
    return sqrt(resid / scale);
}

/* An exact mixture: W recovered and error ≈ 0 under both objectives; add_v and
 * add_outputs (products computed here) give the same fit; GQA grouping (kv = 1, 3). */
static void test_planted_both_objectives(void **state)
{
    (void)state;
    for (uint32_t kv = 1; kv <= TC_HT; kv += TC_HT - 1) {
        tc_planted_t pl;
        tc_planted_init(&pl, 41 + kv, 0.0);
        mf_rng_t r;
        mf_rng_seed(&r, 7 + kv);
        float *v[TC_SEQS];
        mf_calib_t *a, *b;
        assert_int_equal(mf_calib_create(TC_LS, TC_HS, TC_LT, TC_HT, &a), MF_OK);
        assert_int_equal(mf_calib_create(TC_LS, TC_HS, TC_LT, TC_HT, &b), MF_OK);
        float *os = malloc(kv * TC_HS * ND * sizeof(float)), *ot = malloc(TC_HT * ND * 4);
        for (int q = 0; q < TC_SEQS; q++) {
            v[q] = random_values(&r, TC_LT, kv);
            assert_int_equal(mf_calib_add_v(a, pl.src[q], pl.tgt[q], v[q], TC_N, kv, D), MF_OK);
            assert_int_equal(mf_calib_add(b, pl.src[q], pl.tgt[q], TC_N), MF_OK);
            for (uint32_t t = 0; t < TC_LT; t++) {
                const float *vt = v[q] + (size_t)t * kv * ND;
                for (uint32_t h = 0; h < TC_HT; h++)
                    product(pl.tgt[q] + (t * TC_HT + h) * NN, vt + h / (TC_HT / kv) * ND,
                            ot + h * ND);
                for (uint32_t l = 0; l < TC_LS; l++) {
                    for (uint32_t g = 0; g < kv; g++)
                        for (uint32_t s = 0; s < TC_HS; s++)
                            product(pl.src[q] + (l * TC_HS + s) * NN, vt + g * ND,
                                    os + (g * TC_HS + s) * ND);
                    assert_int_equal(mf_calib_add_outputs(b, t, l, os, ot, TC_N, kv, D), MF_OK);
                }
            }
        }
        free(os);
        free(ot);
        for (int obj = MF_CALIB_MAPS; obj <= MF_CALIB_OUTPUTS; obj++) {
            mf_calib_opts_t o = { .max_error = 0.3, .min_l0 = 1, .block_size = 16,
                                  .objective = obj };
            assert_int_equal(mf_calib_fit(a, &o), MF_OK);
            assert_int_equal(mf_calib_fit(b, &o), MF_OK);
            for (uint32_t t = 1; t < TC_LT; t++) {
                mf_calib_layer_t ra, rb;
                assert_int_equal(mf_calib_layer(a, t, &ra), MF_OK);
                assert_int_equal(mf_calib_layer(b, t, &rb), MF_OK);
                assert_int_equal(ra.source_layer, tc_planted_layer[t]);
                assert_int_equal(rb.source_layer, ra.source_layer);
                assert_true(ra.error < 1e-3);
                for (uint32_t x = 0; x < TC_HT * TC_HS; x++) {
                    assert_true(fabs(ra.w[x] - pl.w[t][x]) < 0.02);
                    assert_true(fabs(ra.w[x] - rb.w[x]) < 1e-6);
                }
                for (uint32_t h = 0; h < TC_HT; h++) {
                    assert_true(ra.head_error[h] < 1e-3);
                    assert_int_equal(ra.mode[h], MF_HEAD_PROB);
                }
                /* the planted source layer stands out under this objective too */
                for (uint32_t l = 0; l < TC_LS; l++)
                    if (l != ra.source_layer)
                        assert_true(ra.source_errors[l] > 0.3);
            }
        }
        for (int q = 0; q < TC_SEQS; q++)
            free(v[q]);
        mf_calib_destroy(a);
        mf_calib_destroy(b);
        tc_planted_free(&pl);
    }
}

/*
 * Values of paired keys identical (V[2j+1] = V[2j]): source head 0 is the target's map
 * with each odd key's mass moved onto its even twin (the same output, a far map), head 1
 * the target's map with multiplicative noise (a near map, a different output). The map
 * objective leans on head 1; the output objective picks head 0, and its output error
 * (checked against a direct computation) is far lower.
 */
static void test_objectives_disagree(void **state)
{
    (void)state;
    enum { SEQS = 2 };
    mf_rng_t r;
    mf_rng_seed(&r, 77);
    float *src[SEQS], *tgt[SEQS], *v[SEQS];
    mf_calib_t *c;
    assert_int_equal(mf_calib_create(1, 2, 1, 1, &c), MF_OK);
    for (int q = 0; q < SEQS; q++) {
        tgt[q] = malloc(NN * sizeof(float));
        src[q] = calloc(2 * NN, sizeof(float));
        v[q] = random_values(&r, 1, 1);
        for (uint32_t k = 1; k < TC_N; k += 2)
            memcpy(v[q] + k * D, v[q] + (k - 1) * D, D * sizeof(float));
        tc_random_map(&r, tgt[q]);
        for (uint32_t a = 0; a < TC_N; a++) {
            double sum = 0;
            for (uint32_t k = 0; k <= a; k++) {
                float m = tgt[q][a * TC_N + k];
                src[q][a * TC_N + (k & ~1u)] += m;
                sum += src[q][NN + a * TC_N + k] = (float)(m * exp(0.4 * mf_rng_normal(&r)));
            }
            for (uint32_t k = 0; k <= a; k++)
                src[q][NN + a * TC_N + k] = (float)(src[q][NN + a * TC_N + k] / sum);
        }
        assert_int_equal(mf_calib_add_v(c, src[q], tgt[q], v[q], TC_N, 1, D), MF_OK);
    }
    mf_calib_layer_t rm, ro;
    double wm[2], wo[2];
    mf_calib_opts_t o = { .block_size = 16, .prob_max_error = 0.05 };
    assert_int_equal(mf_calib_fit(c, &o), MF_OK);
    assert_int_equal(mf_calib_layer(c, 0, &rm), MF_OK);
    memcpy(wm, rm.w, sizeof wm);
    double map_err = rm.head_error[0];
    o.objective = MF_CALIB_OUTPUTS;
    assert_int_equal(mf_calib_fit(c, &o), MF_OK);
    assert_int_equal(mf_calib_layer(c, 0, &ro), MF_OK);
    memcpy(wo, ro.w, sizeof wo);
    assert_true(wm[0] < 0.5);
    assert_true(wo[0] > 0.98);
    double em = output_error(tgt, src, v, SEQS, wm, 2), eo = output_error(tgt, src, v, SEQS, wo, 2);
    assert_true(fabs(ro.head_error[0] - eo) < 1e-3 + 1e-3 * eo); /* the reported error */
    assert_true(eo < 0.01);
    assert_true(em > 0.05 && em > 10 * eo);
    assert_true(map_err > 0.05);             /* the map objective saw a poor fit... */
    assert_int_equal(ro.mode[0], MF_HEAD_PROB); /* ...the output objective a prob head */
    Mapflow__V1__MappingProfile *p;
    assert_int_equal(mf_calib_profile(c, &o, 0, &p), MF_OK);
    assert_non_null(strstr(p->created_by, "output objective"));
    assert_int_equal(p->layers[0]->heads[0]->mode, MF_HEAD_PROB);
    mf_profile_free(p);
    for (int q = 0; q < SEQS; q++) {
        free(src[q]);
        free(tgt[q]);
        free(v[q]);
    }
    mf_calib_destroy(c);
}

/* Bad arguments: statuses, never a crash; an OUTPUTS fit needs every pair fed. */
static void test_output_bad_args(void **state)
{
    (void)state;
    tc_planted_t pl;
    tc_planted_init(&pl, 51, 0.01);
    mf_rng_t r;
    mf_rng_seed(&r, 52);
    float *v = random_values(&r, TC_LT, 1), buf[ND * TC_HS];
    mf_calib_t *c;
    mf_calib_opts_t o = { .block_size = 16, .objective = MF_CALIB_OUTPUTS };
    assert_int_equal(mf_calib_create(TC_LS, TC_HS, TC_LT, TC_HT, &c), MF_OK);
    assert_int_equal(mf_calib_add(c, pl.src[0], pl.tgt[0], TC_N), MF_OK);
    assert_int_equal(mf_calib_fit(c, &o), MF_FAILED_PRECONDITION); /* no V at all */
    o.objective = 7;
    assert_int_equal(mf_calib_fit(c, &o), MF_INVALID_ARGUMENT);
    o.objective = MF_CALIB_MAPS;
    assert_int_equal(mf_calib_fit(c, &o), MF_OK);
    assert_int_equal(mf_calib_add_v(NULL, pl.src[1], pl.tgt[1], v, TC_N, 1, D),
                     MF_INVALID_ARGUMENT);
    assert_int_equal(mf_calib_add_v(c, pl.src[1], pl.tgt[1], NULL, TC_N, 1, D),
                     MF_INVALID_ARGUMENT);
    assert_int_equal(mf_calib_add_v(c, pl.src[1], pl.tgt[1], v, 0, 1, D), MF_INVALID_ARGUMENT);
    assert_int_equal(mf_calib_add_v(c, pl.src[1], pl.tgt[1], v, TC_N, 2, D),
                     MF_INVALID_ARGUMENT); /* 2 kv heads do not divide 3 */
    assert_int_equal(mf_calib_add_v(c, pl.src[1], pl.tgt[1], v, TC_N, 0, D),
                     MF_INVALID_ARGUMENT);
    assert_int_equal(mf_calib_add_v(c, pl.src[1], pl.tgt[1], v, TC_N, 1, 0),
                     MF_INVALID_ARGUMENT);
    assert_int_equal(mf_calib_add_v(c, pl.src[1], pl.tgt[1], v, TC_N, 1, 4096),
                     MF_INVALID_ARGUMENT);
    assert_int_equal(mf_calib_add_outputs(c, TC_LT, 0, buf, buf, TC_N, 1, D),
                     MF_INVALID_ARGUMENT);
    assert_int_equal(mf_calib_add_outputs(c, 0, TC_LS, buf, buf, TC_N, 1, D),
                     MF_INVALID_ARGUMENT);
    assert_int_equal(mf_calib_add_outputs(c, 0, 0, NULL, buf, TC_N, 1, D), MF_INVALID_ARGUMENT);
    /* one good V sequence: sequence 0 had no V, so the counts differ */
    assert_int_equal(mf_calib_add_v(c, pl.src[1], pl.tgt[1], v, TC_N, 1, D), MF_OK);
    o.objective = MF_CALIB_OUTPUTS;
    assert_int_equal(mf_calib_fit(c, &o), MF_FAILED_PRECONDITION);
    /* the first feed fixed kv heads and head_dim */
    assert_int_equal(mf_calib_add_v(c, pl.src[1], pl.tgt[1], v, TC_N, 3, D),
                     MF_INVALID_ARGUMENT);
    assert_int_equal(mf_calib_add_v(c, pl.src[1], pl.tgt[1], v, TC_N, 1, D / 2),
                     MF_INVALID_ARGUMENT);
    mf_calib_destroy(c);
    /* a fresh one with V on every sequence fits */
    assert_int_equal(mf_calib_create(TC_LS, TC_HS, TC_LT, TC_HT, &c), MF_OK);
    for (int q = 0; q < TC_SEQS; q++)
        assert_int_equal(mf_calib_add_v(c, pl.src[q], pl.tgt[q], v, TC_N, 1, D), MF_OK);
    assert_int_equal(mf_calib_fit(c, &o), MF_OK);
    mf_calib_destroy(c);
    free(v);
    tc_planted_free(&pl);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_planted_both_objectives),
        cmocka_unit_test(test_objectives_disagree),
        cmocka_unit_test(test_output_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
