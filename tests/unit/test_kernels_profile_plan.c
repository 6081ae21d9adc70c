/*
 * mf_profile_export_plan on random profiles: random layer maps (source layers drawn with
 * repeats, random head counts, W and modes), checked against a recomputation that walks
 * the source layers in order and scans every map for each; plus its error paths (invalid
 * profile, a prob codec without tiles, a plan larger than the output, null arguments).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "mf_profile.h"
#include "synth.h"

#define MAX_MAPS 40
#define MAX_HEADS 8
#define MAX_SRC 16 /* source layers drawn from [0, MAX_SRC) so that maps share them */

typedef struct rprof {
    Mapflow__V1__MappingProfile p;
    Mapflow__V1__LayerMap lm[MAX_MAPS], *lp[MAX_MAPS];
    Mapflow__V1__HeadProfile hp[MAX_MAPS][MAX_HEADS], *hpp[MAX_MAPS][MAX_HEADS];
    float w[MAX_MAPS][MAX_HEADS * MAX_HEADS];
} rprof_t;

/* p_compute / p_prob: each head's chance of those modes (mask otherwise). */
static void random_profile(mf_rng_t *r, rprof_t *f, double p_compute, double p_prob)
{
    memset(f, 0, sizeof *f);
    mapflow__v1__mapping_profile__init(&f->p);
    f->p.block_size = 32;
    f->p.l0 = (uint32_t)(mf_rng_u64(r) % 4);
    f->p.n_layers = 1 + mf_rng_u64(r) % MAX_MAPS;
    f->p.layers = f->lp;
    uint32_t tl = f->p.l0;
    for (size_t i = 0; i < f->p.n_layers; i++) {
        Mapflow__V1__LayerMap *lm = &f->lm[i];
        mapflow__v1__layer_map__init(lm);
        f->lp[i] = lm;
        lm->target_layer = tl;
        tl += 1 + (uint32_t)(mf_rng_u64(r) % 3);
        lm->source_layer = (uint32_t)(mf_rng_u64(r) % MAX_SRC);
        lm->target_heads = 1 + (uint32_t)(mf_rng_u64(r) % MAX_HEADS);
        lm->source_heads = 1 + (uint32_t)(mf_rng_u64(r) % MAX_HEADS);
        lm->n_w = (size_t)lm->target_heads * lm->source_heads;
        lm->w = f->w[i];
        for (uint32_t t = 0; t < lm->target_heads; t++) {
            double sum = 0;
            for (uint32_t s = 0; s < lm->source_heads; s++)
                sum += lm->w[t * lm->source_heads + s] = (float)(0.05 + mf_rng_uniform(r));
            for (uint32_t s = 0; s < lm->source_heads; s++)
                lm->w[t * lm->source_heads + s] /= (float)sum;
        }
        lm->n_heads = lm->target_heads;
        lm->heads = f->hpp[i];
        for (uint32_t t = 0; t < lm->target_heads; t++) {
            Mapflow__V1__HeadProfile *hp = &f->hp[i][t];
            mapflow__v1__head_profile__init(hp);
            double u = mf_rng_uniform(r);
            hp->mode = u < p_compute ? MAPFLOW__V1__HEAD_MODE__HEAD_COMPUTE
                       : u < p_compute + p_prob ? MAPFLOW__V1__HEAD_MODE__HEAD_PROB
                                                : MAPFLOW__V1__HEAD_MODE__HEAD_MASK;
            hp->top_p = (float)mf_rng_uniform(r);
            f->hpp[i][t] = hp;
        }
    }
}

/* The expected plan, source layer by source layer: a layer is in it when some map reading
 * it has a non-compute head; prob when one of those heads is in prob mode. */
static uint32_t expected_plan(const rprof_t *f, mf_codec_t prob_codec, mf_export_layer_t *out)
{
    uint32_t n = 0;
    for (uint32_t s = 0; s < MAX_SRC; s++) {
        int any_prob = 0, any_mask = 0;
        for (size_t i = 0; i < f->p.n_layers; i++) {
            if (f->lm[i].source_layer != s)
                continue;
            for (uint32_t t = 0; t < f->lm[i].target_heads; t++) {
                any_prob |= f->hp[i][t].mode == MAPFLOW__V1__HEAD_MODE__HEAD_PROB;
                any_mask |= f->hp[i][t].mode == MAPFLOW__V1__HEAD_MODE__HEAD_MASK;
            }
        }
        if (any_prob || any_mask) {
            out[n].source_layer = s;
            out[n++].codec = any_prob ? prob_codec : MF_CODEC_MASK;
        }
    }
    return n;
}

static void test_random_profiles_match_recomputation(void **state)
{
    (void)state;
    static rprof_t f;
    mf_rng_t r;
    mf_rng_seed(&r, 2020);
    static const mf_codec_t prob_codecs[] = { MF_CODEC_FP16, MF_CODEC_BF16, MF_CODEC_FP8_E4M3,
                                              MF_CODEC_U8_LOG };
    /* mode mixes: the evaluation's (no prob), a few prob heads, mostly compute, anything */
    static const double mix[][2] = { { 0.3, 0.0 }, { 0.2, 0.05 }, { 0.9, 0.05 }, { 0.33, 0.33 } };
    uint32_t saw_prob = 0, saw_mask = 0, saw_left_out = 0;
    for (int it = 0; it < 400; it++) {
        random_profile(&r, &f, mix[it % 4][0], mix[it % 4][1]);
        mf_codec_t pc = prob_codecs[mf_rng_u64(&r) % 4];
        mf_export_layer_t want[MAX_SRC], got[MAX_SRC];
        uint32_t nw = expected_plan(&f, pc, want), n = 99;
        const char *why = "";
        assert_int_equal(mf_profile_export_plan(&f.p, pc, got, MAX_SRC, &n, &why), MF_OK);
        assert_int_equal(n, nw);
        for (uint32_t k = 0; k < n; k++) {
            assert_int_equal(got[k].source_layer, want[k].source_layer);
            assert_int_equal(got[k].codec, want[k].codec);
            saw_prob += got[k].codec != MF_CODEC_MASK;
            saw_mask += got[k].codec == MF_CODEC_MASK;
        }
        /* a source layer some map reads but the plan leaves out: compute heads only */
        for (size_t i = 0; i < f.p.n_layers; i++) {
            int in = 0;
            for (uint32_t k = 0; k < n; k++)
                in |= got[k].source_layer == f.lm[i].source_layer;
            saw_left_out += !in;
        }
        /* exactly the plan's length fits; one less is refused, not truncated */
        assert_int_equal(mf_profile_export_plan(&f.p, pc, got, nw, &n, &why), MF_OK);
        assert_int_equal(n, nw);
        if (nw) {
            assert_int_equal(mf_profile_export_plan(&f.p, pc, got, nw - 1, &n, &why),
                             MF_RESOURCE_EXHAUSTED);
            assert_int_equal(n, 0);
            assert_true(strlen(why) > 0);
        }
    }
    assert_true(saw_prob > 0 && saw_mask > 0 && saw_left_out > 0);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    static rprof_t f;
    mf_rng_t r;
    mf_rng_seed(&r, 7);
    random_profile(&r, &f, 0.2, 0.2);
    mf_export_layer_t out[MAX_SRC];
    uint32_t n = 5;
    const char *why = "";
    /* a prob codec without tiles, or none at all */
    assert_int_equal(mf_profile_export_plan(&f.p, MF_CODEC_MASK, out, MAX_SRC, &n, &why),
                     MF_INVALID_ARGUMENT);
    assert_int_equal(n, 0);
    assert_non_null(strstr(why, "prob codec"));
    assert_int_equal(mf_profile_export_plan(&f.p, (mf_codec_t)MF_CODEC_COUNT, out, MAX_SRC, &n,
                                            NULL), MF_INVALID_ARGUMENT);
    /* null arguments */
    assert_int_equal(mf_profile_export_plan(NULL, MF_CODEC_FP16, out, MAX_SRC, &n, &why),
                     MF_INVALID_ARGUMENT);
    assert_int_equal(mf_profile_export_plan(&f.p, MF_CODEC_FP16, out, MAX_SRC, NULL, &why),
                     MF_INVALID_ARGUMENT);
    assert_int_equal(mf_profile_export_plan(&f.p, MF_CODEC_FP16, NULL, 1, &n, &why),
                     MF_INVALID_ARGUMENT);
    /* an invalid profile: a W row that does not sum to 1, an unknown mode */
    f.lm[0].w[0] += 0.5f;
    assert_int_equal(mf_profile_export_plan(&f.p, MF_CODEC_FP16, out, MAX_SRC, &n, &why),
                     MF_INVALID_ARGUMENT);
    assert_non_null(strstr(why, "sum to 1"));
    f.lm[0].w[0] -= 0.5f;
    assert_int_equal(mf_profile_export_plan(&f.p, MF_CODEC_FP16, out, MAX_SRC, &n, &why), MF_OK);
    f.hp[0][0].mode = (Mapflow__V1__HeadMode)7;
    assert_int_equal(mf_profile_export_plan(&f.p, MF_CODEC_FP16, out, MAX_SRC, &n, &why),
                     MF_INVALID_ARGUMENT);
    assert_int_equal(n, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_profiles_match_recomputation),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
