/*
 * The pieces of mapflow-worker that its CUDA path shares with the CPU path, checked on the
 * CPU (the CUDA code itself runs only in tests/gpu/worker_check.sh):
 *   - mfw_gpt_view / mfw_gpt_layer_view, which gpt_cuda uploads: a one-token forward
 *     written here in float64 from the views alone reproduces mfw_gpt_forward's logits
 *     (so each view is the tensor its name says: a swapped pair would not);
 *   - mfw_extract_alloc with and without host buffers (the CUDA hook keeps rows on the
 *     device) and the hooks' entry count against the decoded rows;
 *   - mfw_reuse_layer, which decides for both devices which layers reuse rows.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpt.h"
#include "handoff.h"
#include "mf_profile.h"

static const char *models_dir(void)
{
    const char *d = getenv("MFW_MODELS");
    return d ? d : "bench/models";
}

static mfw_gpt_t *load_model(const char *name)
{
    char path[512], err[512] = "";
    mfw_gpt_t *m = NULL;
    snprintf(path, sizeof path, "%s/%s", models_dir(), name);
    assert_int_equal(mfw_gpt_load(path, &m, err, sizeof err), MF_OK);
    return m;
}

/* y[out] = w[out, in] · x[in] */
static void matvec(double *y, const float *w, const double *x, uint32_t in, uint32_t out)
{
    for (uint32_t o = 0; o < out; o++) {
        double s = 0;
        for (uint32_t i = 0; i < in; i++)
            s += (double)w[(size_t)o * in + i] * x[i];
        y[o] = s;
    }
}

static void layernorm(double *y, const double *x, const float *w, const float *b, uint32_t d)
{
    double mean = 0, var = 0;
    for (uint32_t i = 0; i < d; i++)
        mean += x[i];
    mean /= d;
    for (uint32_t i = 0; i < d; i++)
        var += (x[i] - mean) * (x[i] - mean);
    double inv = 1.0 / sqrt(var / d + 1e-5);
    for (uint32_t i = 0; i < d; i++)
        y[i] = (x[i] - mean) * inv * w[i] + b[i];
}

/* At position 0 RoPE is the identity and attention over one key returns its V, so one
 * token's forward needs nothing but the weights. */
static void test_views_reproduce_forward(void **state)
{
    (void)state;
    mfw_gpt_t *m = load_model("target.safetensors");
    const mfw_gpt_cfg_t *c = mfw_gpt_cfg(m);
    uint32_t D = c->d_model, V = c->vocab, tok = 1234 % V;
    double *x = calloc(D, sizeof *x), *xn = calloc(D, sizeof *xn), *y = calloc(4 * D, sizeof *y),
           *h = calloc(4 * D, sizeof *h), *want = calloc(V, sizeof *want);
    float *got = calloc(V, sizeof *got);
    assert_true(x && xn && y && h && want && got);
    mfw_gpt_view_t v;
    mfw_gpt_view(m, &v);
    for (uint32_t i = 0; i < D; i++)
        x[i] = v.emb[(size_t)tok * D + i];
    assert_true(v.rope_inv[0] == 1.0f && v.rope_inv[1] < 1.0f); /* 1 / 10000^(2i/d) */
    for (uint32_t l = 0; l < c->n_layer; l++) {
        mfw_gpt_layer_view_t lv;
        mfw_gpt_layer_view(m, l, &lv);
        layernorm(xn, x, lv.ln1_w, lv.ln1_b, D);
        matvec(y, lv.qkv, xn, D, 3 * D);                    /* q, k, v; o = v */
        matvec(h, lv.proj, y + 2 * D, D, D);
        for (uint32_t i = 0; i < D; i++)
            x[i] += h[i];
        layernorm(xn, x, lv.ln2_w, lv.ln2_b, D);
        matvec(y, lv.fc, xn, D, 4 * D);
        for (uint32_t i = 0; i < 4 * D; i++)
            y[i] = 0.5 * y[i] * (1.0 + erf(y[i] / sqrt(2.0)));
        matvec(h, lv.out, y, 4 * D, D);
        for (uint32_t i = 0; i < D; i++)
            x[i] += h[i];
    }
    layernorm(xn, x, v.lnf_w, v.lnf_b, D);
    matvec(want, v.emb, xn, D, V);

    mfw_run_t *run = NULL;
    assert_int_equal(mfw_run_create(m, 1, &run), MF_OK);
    assert_int_equal(mfw_gpt_forward(m, run, &tok, 1, NULL, NULL, 0, got), MF_OK);
    double worst = 0, scale = 0;
    for (uint32_t i = 0; i < V; i++) {
        worst = fmax(worst, fabs(got[i] - want[i]));
        scale = fmax(scale, fabs(want[i]));
    }
    assert_true(scale > 1.0);           /* real logits, not zeros */
    assert_true(worst < 1e-4 * scale);
    mfw_run_free(run);
    free(x), free(xn), free(y), free(h), free(want), free(got);
    mfw_gpt_free(m);
}

static void test_extract_alloc_and_entries(void **state)
{
    (void)state;
    enum { N = 96, B = 32 };
    mfw_gpt_t *m = load_model("source.safetensors");
    const mfw_gpt_cfg_t *c = mfw_gpt_cfg(m);
    uint32_t tokens[N];
    srand(7);
    for (uint32_t i = 0; i < N; i++)
        tokens[i] = (uint32_t)rand() % c->vocab;
    mfw_extract_t e = { .block_size = B, .top_p = 0.9f, .model = "test-src", .ns = "t",
                        .tokens = tokens };
    for (uint32_t l = 0; l < MFW_MAX_LAYERS; l++)
        e.codec[l] = MF_CODEC_MASK;
    size_t caps[N / B];

    /* without host buffers (the CUDA hook's case): sizes only, caps the row bounds */
    assert_int_equal(mfw_extract_alloc(&e, 2, N / B, c->n_head, caps, 0), MF_OK);
    assert_null(e.rows[2]);
    assert_non_null(e.sizes[2]);
    for (uint32_t i = 0; i < N / B; i++)
        assert_int_equal(caps[i], mf_extract_row_bound(MF_CODEC_MASK, B, c->n_head, i, 8));
    assert_true(caps[2] > caps[0]);
    /* with them: 16-byte aligned; a head count out of range has no bound */
    assert_int_equal(mfw_extract_alloc(&e, 2, N / B, c->n_head, caps, 1), MF_OK);
    for (uint32_t i = 0; i < N / B; i++)
        assert_int_equal((uintptr_t)e.rows[2][i] % 16, 0);
    assert_int_equal(mfw_extract_alloc(&e, 2, N / B, 65, caps, 1), MF_INVALID_ARGUMENT);
    mfw_extract_release(&e);
    assert_null(e.rows[2]);

    /* the hook: rows for wanted layers only, entries = Σ n_entries of the decoded rows */
    assert_false(mfw_extract_wants(&e, 1, 0, N));
    e.want[1] = e.want[3] = 1;
    assert_true(mfw_extract_wants(&e, 1, 0, N));
    assert_false(mfw_extract_wants(&e, 1, 5, N));    /* not a prefill from 0 */
    assert_false(mfw_extract_wants(&e, 1, 0, B - 1)); /* no full block */
    mfw_run_t *run = NULL;
    assert_int_equal(mfw_run_create(m, N, &run), MF_OK);
    assert_int_equal(mfw_gpt_forward(m, run, tokens, N, mfw_extract_hook, &e, N, NULL), MF_OK);
    uint64_t entries = 0;
    for (uint32_t l = 0; l < c->n_layer; l++) {
        if (!e.want[l]) {
            assert_null(e.rows[l]);
            continue;
        }
        for (uint32_t i = 0; i < N / B; i++) {
            mf_row_view_t rv;
            assert_int_equal(mf_row_decode(e.rows[l][i], e.sizes[l][i], 0, &rv, NULL), MF_OK);
            assert_int_equal(rv.layer, l);
            assert_int_equal(rv.block_index, i);
            assert_true(rv.n_entries >= 2 * c->n_head - (i == 0 ? c->n_head : 0)); /* sink + diag */
            entries += rv.n_entries;
        }
    }
    assert_true(entries > 0);
    assert_int_equal(e.entries, entries);
    mfw_run_free(run);
    mfw_extract_release(&e);
    mfw_gpt_free(m);
}

static void test_reuse_layer_choice(void **state)
{
    (void)state;
    char path[512], err[512] = "";
    Mapflow__V1__MappingProfile *p = NULL;
    snprintf(path, sizeof path, "%s/profile.pb", models_dir());
    assert_int_equal(mf_profile_read(path, &p, err, sizeof err), MF_OK);
    assert_true(p->n_layers > 0);
    const mf_row_view_t *none[1] = { NULL };
    mfw_reuse_t r = { .profile = p, .n_rows = 1 };
    uint32_t mapped = p->layers[0]->target_layer, src = p->layers[0]->source_layer;
    uint32_t heads = (uint32_t)p->layers[0]->n_heads;
    const Mapflow__V1__LayerMap *lm = NULL;
    mf_layer_map_t map;
    uint8_t modes[64];
    float tops[64];
    /* no rows for its source layer yet: computed normally */
    assert_int_equal(mfw_reuse_layer(&r, mapped, 0, heads, &lm, &map, modes, tops), MF_OK);
    assert_null(lm);
    r.rows[src] = none;
    assert_int_equal(mfw_reuse_layer(&r, mapped, 0, heads, &lm, &map, modes, tops), MF_OK);
    assert_non_null(lm);
    assert_int_equal(lm->source_layer, src);
    assert_int_equal(map.n_target_heads, heads);
    for (uint32_t t = 0; t < heads; t++) {
        double s = 0;
        for (uint32_t k = 0; k < map.n_source_heads; k++)
            s += map.w[t * map.n_source_heads + k];
        assert_true(fabs(s - 1.0) < 1e-3); /* W rows sum to 1 */
    }
    /* a decode step, a layer below L0, no hit: computed normally */
    assert_int_equal(mfw_reuse_layer(&r, mapped, 7, heads, &lm, &map, modes, tops), MF_OK);
    assert_null(lm);
    if (p->l0 > 0) {
        assert_int_equal(mfw_reuse_layer(&r, 0, 0, heads, &lm, &map, modes, tops), MF_OK);
        assert_null(lm);
    }
    r.n_rows = 0;
    assert_int_equal(mfw_reuse_layer(&r, mapped, 0, heads, &lm, &map, modes, tops), MF_OK);
    assert_null(lm);
    /* a target with other heads than the profile's fails, with a reason */
    r.n_rows = 1;
    assert_int_equal(mfw_reuse_layer(&r, mapped, 0, heads + 1, &lm, &map, modes, tops),
                     MF_FAILED_PRECONDITION);
    assert_non_null(r.why);
    mf_profile_free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_views_reproduce_forward),
        cmocka_unit_test(test_extract_alloc_and_entries),
        cmocka_unit_test(test_reuse_layer_choice),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
