/*
 * mapflow-worker's hand-off hooks on the committed small pair, without a daemon: the source
 * prefills a held-out passage and extracts rows (Top-P = 1, FP16) for the layers the
 * profile maps; the target prefills the same tokens plus a continuation with those rows,
 * with W from the profile. Each mapped layer's reused output is checked against
 * independent float64 references:
 *   - every head in prob mode: rows with a map equal Σ_k m[r,k]·V_t[k] / Σ_k m[r,k],
 *     m = Σ_s W[t,s]·P_s[r,k] from the source's own dense probabilities (fp16 tiles: 2e-3);
 *   - every head in mask mode at Top-P 1: every block is kept, so the output is the
 *     target's own dense attention (1e-4);
 *   - the profile's own modes: the whole reuse pass equals mf_apply_ref called directly.
 *   Query blocks in the recompute policy and past the hit are exact in all three.
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
#include "tokenizer.h"

#define N_CTX 160 /* source tokens: 5 blocks of 32 */
#define N_ALL 200 /* target: + 40 of its own */

typedef struct fixture {
    mfw_gpt_t *src, *tgt;
    Mapflow__V1__MappingProfile *prof;
    uint32_t tokens[N_ALL];
    mfw_extract_t ex;
    float *src_q[MFW_MAX_LAYERS], *src_k[MFW_MAX_LAYERS]; /* captured [N_CTX, H, d] */
    mf_row_view_t *views[MFW_MAX_LAYERS];
    const mf_row_view_t *vptr[MFW_MAX_LAYERS][N_CTX / 32];
} fixture_t;

static fixture_t F;

static const char *models_dir(void)
{
    const char *d = getenv("MFW_MODELS");
    return d ? d : "bench/models";
}

static mf_status_t capture_hook(void *ctx, const mfw_attn_args_t *a)
{
    fixture_t *f = ctx;
    size_t n = (size_t)a->n * a->n_heads * a->head_dim;
    if (f->ex.want[a->layer]) {
        f->src_q[a->layer] = malloc(sizeof(float) * n);
        f->src_k[a->layer] = malloc(sizeof(float) * n);
        memcpy(f->src_q[a->layer], a->q, sizeof(float) * n);
        memcpy(f->src_k[a->layer], a->k, sizeof(float) * n);
    }
    return mfw_extract_hook(&f->ex, a);
}

static int setup(void **state)
{
    (void)state;
    char path[512], err[512] = "", text[1 << 16];
    mfw_tok_t *tok = NULL;
    snprintf(path, sizeof path, "%s/tokenizer.txt", models_dir());
    assert_int_equal(mfw_tok_load(path, &tok, err, sizeof err), MF_OK);
    snprintf(path, sizeof path, "%s/passage.txt", models_dir());
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    size_t len = fread(text, 1, sizeof text, fp), n = 0;
    fclose(fp);
    static uint32_t ids[1 << 16];
    mfw_tok_encode(tok, text, len, ids, 1 << 16, &n);
    assert_true(n >= N_ALL);
    memcpy(F.tokens, ids, sizeof F.tokens);
    mfw_tok_free(tok);
    snprintf(path, sizeof path, "%s/source.safetensors", models_dir());
    assert_int_equal(mfw_gpt_load(path, &F.src, err, sizeof err), MF_OK);
    snprintf(path, sizeof path, "%s/target.safetensors", models_dir());
    assert_int_equal(mfw_gpt_load(path, &F.tgt, err, sizeof err), MF_OK);
    snprintf(path, sizeof path, "%s/profile.pb", models_dir());
    assert_int_equal(mf_profile_read(path, &F.prof, err, sizeof err), MF_OK);
    assert_true(F.prof->n_layers > 0);
    assert_int_equal(F.prof->block_size, 32);

    /* every mapped source layer in FP16, whatever the profile's modes (the tests force
     * them), hence not mfw_extract_plan, which leaves out layers read by compute heads */
    uint32_t layers[MFW_MAX_LAYERS], nl = 0;
    for (size_t i = 0; i < F.prof->n_layers; i++) {
        uint32_t l = F.prof->layers[i]->source_layer;
        assert_true(l < MFW_MAX_LAYERS);
        if (!F.ex.want[l])
            layers[nl++] = l;
        F.ex.want[l] = 1;
        F.ex.codec[l] = MF_CODEC_FP16;
    }
    F.ex.block_size = 32;
    F.ex.top_p = 1.0f;
    F.ex.model = F.prof->source_model;
    F.ex.ns = "test";
    F.ex.tokens = F.tokens;
    mfw_run_t *run = NULL;
    assert_int_equal(mfw_run_create(F.src, N_CTX, &run), MF_OK);
    assert_int_equal(mfw_gpt_forward(F.src, run, F.tokens, N_CTX, capture_hook, &F, N_CTX, NULL), MF_OK);
    mfw_run_free(run);
    assert_int_equal(F.ex.n_blocks, N_CTX / 32);
    for (uint32_t i = 0; i < nl; i++) {
        uint32_t l = layers[i];
        F.views[l] = calloc(F.ex.n_blocks, sizeof(mf_row_view_t));
        for (uint32_t b = 0; b < F.ex.n_blocks; b++) {
            assert_int_equal(mf_row_decode(F.ex.rows[l][b], F.ex.sizes[l][b], 0, &F.views[l][b], NULL),
                             MF_OK);
            F.vptr[l][b] = &F.views[l][b];
        }
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    for (uint32_t l = 0; l < MFW_MAX_LAYERS; l++) {
        free(F.src_q[l]);
        free(F.src_k[l]);
        free(F.views[l]);
    }
    mfw_extract_release(&F.ex);
    mf_profile_free(F.prof);
    mfw_gpt_free(F.src);
    mfw_gpt_free(F.tgt);
    return 0;
}

typedef enum { CHECK_PROB, CHECK_MASK, CHECK_APPLY, CHECK_MIXED } check_t;

typedef struct target_ctx {
    mfw_reuse_t ru;
    check_t check;
    double worst;            /* worst relative error of a reused row */
    double worst_exact;      /* worst abs error of a row that must be exact */
    uint32_t layers_checked;
} target_ctx_t;

/* Dense attention of target head h at row r in float64 (the exact reference). */
static void dense_row(const mfw_attn_args_t *a, uint32_t h, uint32_t r, double *out)
{
    uint32_t H = a->n_heads, d = a->head_dim;
    double *p = malloc(sizeof(double) * (r + 1)), mx = -INFINITY, sum = 0;
    for (uint32_t j = 0; j <= r; j++) {
        double s = 0;
        for (uint32_t c = 0; c < d; c++)
            s += (double)a->q[((size_t)r * H + h) * d + c] * a->k[((size_t)j * H + h) * d + c];
        p[j] = s / sqrt((double)d);
        mx = p[j] > mx ? p[j] : mx;
    }
    for (uint32_t j = 0; j <= r; j++)
        sum += p[j] = exp(p[j] - mx);
    for (uint32_t c = 0; c < d; c++) {
        double o = 0;
        for (uint32_t j = 0; j <= r; j++)
            o += p[j] / sum * a->v[((size_t)j * H + h) * d + c];
        out[c] = o;
    }
    free(p);
}

/* Source head s's probabilities at row r (float64, from the captured Q and K). */
static void source_probs(uint32_t layer, uint32_t s, uint32_t r, double *p)
{
    const mfw_gpt_cfg_t *c = mfw_gpt_cfg(F.src);
    uint32_t H = c->n_head, d = c->head_dim;
    const float *q = F.src_q[layer], *k = F.src_k[layer];
    double mx = -INFINITY, sum = 0;
    for (uint32_t j = 0; j <= r; j++) {
        double x = 0;
        for (uint32_t e = 0; e < d; e++)
            x += (double)q[((size_t)r * H + s) * d + e] * k[((size_t)j * H + s) * d + e];
        p[j] = x / sqrt((double)d);
        mx = p[j] > mx ? p[j] : mx;
    }
    for (uint32_t j = 0; j <= r; j++)
        sum += p[j] = exp(p[j] - mx);
    for (uint32_t j = 0; j <= r; j++)
        p[j] /= sum;
}

static mf_status_t check_hook(void *ctx, const mfw_attn_args_t *a)
{
    target_ctx_t *t = ctx;
    const Mapflow__V1__LayerMap *lm = mf_profile_layer(F.prof, a->layer);
    mf_status_t st = mfw_reuse_hook(&t->ru, a);
    if (st != MF_OK || !lm || a->pos0 != 0)
        return st;
    uint32_t H = a->n_heads, d = a->head_dim, B = 32, hit = t->ru.n_rows;
    uint32_t last = F.prof->recompute ? F.prof->recompute->last_blocks : 0;
    uint32_t full_blocks = a->n / B, Hs = lm->source_heads;
    size_t tensor = (size_t)a->n * H * d;
    float *direct = NULL;
    if (t->check == CHECK_APPLY) {
        uint8_t modes[64];
        float tops[64];
        mf_layer_map_t map;
        assert_int_equal(mf_layer_map_from_proto(lm, &map, modes, tops), MF_OK);
        direct = calloc(tensor, sizeof(float));
        mf_apply_args_t aa = { .rows = F.vptr[lm->source_layer], .n_rows = hit, .map = &map,
                               .tgt = { a->q, a->k, a->v, MF_DTYPE_F32, a->n, H, H, d },
                               .block_size = B, .exact_last = last, .o = direct };
        const char *why = "";
        assert_int_equal(mf_apply_ref(&aa, NULL, &why), MF_OK);
        for (size_t i = 0; i < tensor; i++)
            assert_true(direct[i] == a->o[i]);
    }
    double *ref = malloc(sizeof(double) * d), *m = malloc(sizeof(double) * a->n),
           *ps = malloc(sizeof(double) * a->n);
    for (uint32_t r = 0; r < a->n; r++) {
        uint32_t blk = r / B;
        int exact = blk >= hit || blk >= full_blocks || blk + last >= full_blocks;
        for (uint32_t h = 0; h < H; h++) {
            const float *o = a->o + ((size_t)r * H + h) * d;
            check_t c = t->check != CHECK_MIXED ? t->check
                        : lm->heads[h]->mode == MAPFLOW__V1__HEAD_MODE__HEAD_PROB ? CHECK_PROB
                                                                                   : CHECK_MASK;
            if (exact || c == CHECK_MASK) {
                dense_row(a, h, r, ref);
            } else if (c == CHECK_PROB) {
                /* m[k] = Σ_s W[t,s]·P_s[r,k] over k ≤ r (every block kept at Top-P 1) */
                memset(m, 0, sizeof(double) * (r + 1));
                for (uint32_t s = 0; s < Hs; s++) {
                    double w = lm->w[h * Hs + s];
                    if (w == 0)
                        continue;
                    source_probs(lm->source_layer, s, r, ps);
                    for (uint32_t k = 0; k <= r; k++)
                        m[k] += w * ps[k];
                }
                double z = 0;
                for (uint32_t k = 0; k <= r; k++)
                    z += m[k];
                for (uint32_t c = 0; c < d; c++) {
                    double acc = 0;
                    for (uint32_t k = 0; k <= r; k++)
                        acc += m[k] * a->v[((size_t)k * H + h) * d + c];
                    ref[c] = acc / z;
                }
            } else {
                continue; /* CHECK_APPLY: compared with mf_apply_ref above */
            }
            double num = 0, den = 0, worst = 0;
            for (uint32_t c = 0; c < d; c++) {
                double e = o[c] - ref[c];
                num += e * e;
                den += ref[c] * ref[c];
                worst = fabs(e) > worst ? fabs(e) : worst;
            }
            if (exact)
                t->worst_exact = worst > t->worst_exact ? worst : t->worst_exact;
            else
                t->worst = sqrt(num / den) > t->worst ? sqrt(num / den) : t->worst;
        }
    }
    free(ref);
    free(m);
    free(ps);
    free(direct);
    t->layers_checked++;
    return MF_OK;
}

/* rows: by source layer, [N_CTX / 32] views or NULL (NULL rows: the fixture's FP16 rows) */
static void run_target_rows(check_t check, target_ctx_t *t, const mf_row_view_t *const *const *rows,
                            uint32_t mapped)
{
    memset(t, 0, sizeof *t);
    t->check = check;
    t->ru.profile = F.prof;
    t->ru.n_rows = N_CTX / 32;
    for (uint32_t l = 0; l < MFW_MAX_LAYERS; l++)
        t->ru.rows[l] = rows ? rows[l] : F.views[l] ? F.vptr[l] : NULL;
    mfw_run_t *run = NULL;
    assert_int_equal(mfw_run_create(F.tgt, N_ALL, &run), MF_OK);
    assert_int_equal(mfw_gpt_forward(F.tgt, run, F.tokens, N_ALL, check_hook, t, N_ALL, NULL), MF_OK);
    mfw_run_free(run);
    assert_int_equal(t->layers_checked, F.prof->n_layers);
    assert_int_equal(t->ru.layers_mapped, mapped);
    print_message("worst reused-row error %.2e, worst exact-row error %.2e\n", t->worst, t->worst_exact);
    assert_true(t->worst_exact < 1e-4);
}

static void run_target(check_t check, target_ctx_t *t)
{
    run_target_rows(check, t, NULL, (uint32_t)F.prof->n_layers);
}

/* The profile's head modes and Top-Ps, kept while a test forces others (force_modes) and
 * put back after it (restore_modes). */
typedef struct saved_modes {
    int mode[4096];
    float top_p[4096];
} saved_modes_t;

/* Every head of every mapped layer to one mode at Top-P 1; the old ones into sv. */
static void force_modes(Mapflow__V1__HeadMode mode, saved_modes_t *sv)
{
    size_t k = 0;
    for (size_t i = 0; i < F.prof->n_layers; i++)
        for (size_t h = 0; h < F.prof->layers[i]->n_heads && k < 4096; h++, k++) {
            Mapflow__V1__HeadProfile *hp = F.prof->layers[i]->heads[h];
            sv->mode[k] = hp->mode;
            sv->top_p[k] = hp->top_p;
            hp->mode = mode;
            hp->top_p = 1.0f;
        }
}

static void restore_modes(const saved_modes_t *sv)
{
    size_t k = 0;
    for (size_t i = 0; i < F.prof->n_layers; i++)
        for (size_t h = 0; h < F.prof->layers[i]->n_heads && k < 4096; h++, k++) {
            F.prof->layers[i]->heads[h]->mode = sv->mode[k];
            F.prof->layers[i]->heads[h]->top_p = sv->top_p[k];
        }
}

/* Runs the target with every head of every mapped layer forced to one mode at Top-P 1,
 * then puts the profile's own modes back. */
static void run_forced(Mapflow__V1__HeadMode mode, check_t check, target_ctx_t *t)
{
    static saved_modes_t sv;
    force_modes(mode, &sv);
    run_target(check, t);
    restore_modes(&sv);
}

static void test_prob_reproduces_mixed_source_maps(void **state)
{
    (void)state;
    target_ctx_t t;
    run_forced(MAPFLOW__V1__HEAD_MODE__HEAD_PROB, CHECK_PROB, &t);
    assert_true(t.ru.stats.prob_tiles > 0);
    assert_true(t.worst > 0);       /* the maps really came from the source (fp16 rounding) */
    assert_true(t.worst < 2e-3);
}

static void test_mask_at_top_p_one_is_exact(void **state)
{
    (void)state;
    target_ctx_t t;
    run_forced(MAPFLOW__V1__HEAD_MODE__HEAD_MASK, CHECK_MASK, &t);
    assert_true(t.ru.stats.mask_blocks > 0);
    assert_int_equal(t.ru.stats.mask_blocks, t.ru.stats.mask_candidates);
    assert_true(t.worst < 1e-4);
}

static void test_profile_modes_equal_apply_ref(void **state)
{
    (void)state;
    target_ctx_t t;
    run_target(CHECK_APPLY, &t);
    assert_true(t.ru.stats.exact_blocks > 0);
}

/* The export plan (issue 20): one random head of the first mapped layer in prob mode, every
 * other head in mask mode (Top-P 1). The plan's extract writes that source layer's rows in
 * FP16 and the others' as MASK rows (smaller than the fixture's FP16 rows of the same
 * layer); the target's reuse over these mixed rows still meets each head's reference. */
static void test_export_plan_mixed_codecs(void **state)
{
    (void)state;
    static saved_modes_t sv;
    force_modes(MAPFLOW__V1__HEAD_MODE__HEAD_MASK, &sv);
    srand(20);
    const Mapflow__V1__LayerMap *first = F.prof->layers[0];
    first->heads[(size_t)rand() % first->n_heads]->mode = MAPFLOW__V1__HEAD_MODE__HEAD_PROB;
    uint32_t prob_layer = first->source_layer, n_mask_layers = 0;

    mfw_extract_t ex = { .block_size = 32, .top_p = 1.0f, .model = F.prof->source_model,
                         .ns = "test", .tokens = F.tokens };
    mf_export_layer_t plan[MFW_MAX_LAYERS];
    uint32_t n = 0;
    const char *why = "";
    assert_int_equal(mfw_extract_plan(&ex, F.prof, MF_CODEC_FP16, NULL, mfw_gpt_cfg(F.src)->n_layer,
                                      plan, &n, &why), MF_OK);
    mfw_run_t *run = NULL;
    assert_int_equal(mfw_run_create(F.src, N_CTX, &run), MF_OK);
    assert_int_equal(mfw_gpt_forward(F.src, run, F.tokens, N_CTX, mfw_extract_hook, &ex, N_CTX, NULL),
                     MF_OK);
    mfw_run_free(run);

    static mf_row_view_t views[MFW_MAX_LAYERS][N_CTX / 32];
    static const mf_row_view_t *vp[MFW_MAX_LAYERS][N_CTX / 32];
    const mf_row_view_t *const *rows[MFW_MAX_LAYERS] = { 0 };
    for (uint32_t l = 0; l < MFW_MAX_LAYERS; l++) {
        assert_int_equal(ex.want[l] != 0, F.views[l] != NULL); /* every mapped layer: no compute */
        if (!ex.want[l])
            continue;
        mf_codec_t want = l == prob_layer ? MF_CODEC_FP16 : MF_CODEC_MASK;
        n_mask_layers += want == MF_CODEC_MASK;
        for (uint32_t b = 0; b < N_CTX / 32; b++) {
            assert_int_equal(mf_row_decode(ex.rows[l][b], ex.sizes[l][b], 0, &views[l][b], NULL), MF_OK);
            assert_int_equal(views[l][b].codec, want);
            if (want == MF_CODEC_MASK)
                assert_true(ex.sizes[l][b] < F.ex.sizes[l][b]);
            else
                assert_int_equal(ex.sizes[l][b], F.ex.sizes[l][b]); /* the same FP16 row */
            vp[l][b] = &views[l][b];
        }
        rows[l] = vp[l];
    }
    assert_true(n_mask_layers > 0); /* the pair maps more than one source layer */

    target_ctx_t t;
    run_target_rows(CHECK_MIXED, &t, rows, (uint32_t)F.prof->n_layers);
    assert_true(t.ru.stats.prob_tiles > 0);
    assert_true(t.ru.stats.mask_blocks > 0);
    assert_true(t.worst < 2e-3);
    mfw_extract_release(&ex);
    restore_modes(&sv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prob_reproduces_mixed_source_maps),
        cmocka_unit_test(test_mask_at_top_p_one_is_exact),
        cmocka_unit_test(test_profile_modes_equal_apply_ref),
        cmocka_unit_test(test_export_plan_mixed_codecs),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
