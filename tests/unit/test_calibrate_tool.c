/* mapflow-calibrate end to end on .npy files written here (f32 source, f16 target):
 * the planted mixing and layer assignment come back in the profile file and in --json,
 * also under --objective outputs with the target's values (--values); bad directories
 * and files give exit 1 with the file named; bad usage gives 2. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <sys/stat.h>

#include "mf_profile.h"
#include "npy.h"
#include "test_calibrate_util.h"
#include "test_kernels_util.h"

typedef struct env {
    char dir[64], src[128], tgt[128], val[128], prof[128], base[128], out[128], err[128],
        tool[256];
    tc_planted_t pl;
} env_t;

static int setup(void **state)
{
    env_t *e = calloc(1, sizeof(*e));
    strcpy(e->dir, "/tmp/mf_calib_XXXXXX");
    if (!mkdtemp(e->dir))
        return -1;
    snprintf(e->src, sizeof e->src, "%s/src", e->dir);
    snprintf(e->tgt, sizeof e->tgt, "%s/tgt", e->dir);
    snprintf(e->val, sizeof e->val, "%s/val", e->dir);
    snprintf(e->prof, sizeof e->prof, "%s/profile.bin", e->dir);
    snprintf(e->base, sizeof e->base, "%s/baseline.bin", e->dir);
    snprintf(e->out, sizeof e->out, "%s/stdout", e->dir);
    snprintf(e->err, sizeof e->err, "%s/stderr", e->dir);
    tk_tool("mapflow-calibrate", e->tool, sizeof e->tool);
    mkdir(e->src, 0755);
    mkdir(e->tgt, 0755);
    mkdir(e->val, 0755);
    tc_planted_init(&e->pl, 51, 0.002);
    const uint64_t ss[4] = { TC_LS, TC_HS, TC_N, TC_N }, ts[4] = { TC_LT, TC_HT, TC_N, TC_N };
    const uint64_t vs[4] = { TC_LT, 1, TC_N, 8 }; /* one kv head for the three heads */
    float v[TC_LT * TC_N * 8];
    mf_rng_t r;
    mf_rng_seed(&r, 52);
    for (int q = 0; q < TC_SEQS; q++) {
        char p[256];
        for (size_t x = 0; x < sizeof v / sizeof v[0]; x++)
            v[x] = (float)mf_rng_normal(&r);
        snprintf(p, sizeof p, "%s/seq%d.npy", e->val, q);
        if (mf_npy_write(p, MF_NPY_F32, v, 4, vs) != MF_OK)
            return -1;
        snprintf(p, sizeof p, "%s/seq%d.npy", e->src, q);
        if (mf_npy_write(p, MF_NPY_F32, e->pl.src[q], 4, ss) != MF_OK)
            return -1;
        snprintf(p, sizeof p, "%s/seq%d.npy", e->tgt, q);
        if (mf_npy_write(p, MF_NPY_F16, e->pl.tgt[q], 4, ts) != MF_OK)
            return -1;
    }
    *state = e;
    return 0;
}

static int teardown(void **state)
{
    env_t *e = *state;
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", e->dir);
    int rc = system(cmd);
    tc_planted_free(&e->pl);
    free(e);
    return rc == 0 ? 0 : -1;
}

static int calibrate(env_t *e, const char *src, const char *tgt)
{
    char *argv[] = { e->tool, "--source", (char *)src, "--target", (char *)tgt, "--out",
                     e->prof, "--baseline-out", e->base, "--max-error", "0.3", "--min-l0",
                     "1", "--block", "16", "--json", "--mask-min-recall", "0.9",
                     "--per-head-top-p", NULL };
    return tk_run(argv, e->out, e->err);
}

static void test_tool_recovers_planted(void **state)
{
    env_t *e = *state;
    assert_int_equal(calibrate(e, e->src, e->tgt), 0);
    char *json = tk_slurp(e->out, NULL), *summary = tk_slurp(e->err, NULL);
    assert_non_null(json);
    assert_true(strncmp(json, "{\"L0\": 1, \"layers\": [{\"target_layer\": 1, "
                              "\"source_layer\": 2, ", 60) == 0);
    assert_non_null(strstr(json, "{\"target_layer\": 2, \"source_layer\": 0, "));
    assert_non_null(strstr(json, "\"heads\": [{\"mode\": \"prob\", \"error\": "));
    assert_non_null(strstr(json, ", \"recall\": 1, \"top_p\": 1}"));
    assert_non_null(strstr(summary, "L0 = 1"));
    free(json);
    free(summary);

    Mapflow__V1__MappingProfile *p, *b;
    assert_int_equal(mf_profile_load(e->prof, &p), MF_OK);
    assert_int_equal(mf_profile_load(e->base, &b), MF_OK);
    assert_int_equal(p->l0, 1);
    assert_int_equal(p->target_layers, TC_LT);
    assert_int_equal(p->block_size, 16);
    assert_int_equal(p->n_layers, 2);
    assert_int_equal(b->n_layers, 2);
    for (size_t k = 0; k < p->n_layers; k++) {
        const Mapflow__V1__LayerMap *lm = p->layers[k];
        uint32_t t = lm->target_layer;
        assert_int_equal(t, k + 1);
        assert_int_equal(lm->source_layer, tc_planted_layer[t]);
        assert_int_equal(b->layers[k]->source_layer, lm->source_layer);
        for (size_t x = 0; x < lm->n_w; x++)
            assert_true(fabs(lm->w[x] - e->pl.w[t][x]) <= 0.05);
        assert_true(lm->error < 0.05);
        assert_true(b->layers[k]->error > lm->error);
        for (size_t h = 0; h < lm->n_heads; h++)
            assert_int_equal(lm->heads[h]->mode, MAPFLOW__V1__HEAD_MODE__HEAD_PROB);
    }
    mf_profile_free(p);
    mf_profile_free(b);
}

static void test_tool_outputs_objective(void **state)
{
    env_t *e = *state;
    char *argv[] = { e->tool, "--source", e->src, "--target", e->tgt, "--out", e->prof,
                     "--values", e->val, "--objective", "outputs", "--max-error", "0.3",
                     "--min-l0", "1", "--block", "16", NULL };
    assert_int_equal(tk_run(argv, e->out, e->err), 0);
    Mapflow__V1__MappingProfile *p;
    assert_int_equal(mf_profile_load(e->prof, &p), MF_OK);
    assert_non_null(strstr(p->created_by, "output objective"));
    assert_int_equal(p->n_layers, 2);
    for (size_t k = 0; k < p->n_layers; k++) {
        const Mapflow__V1__LayerMap *lm = p->layers[k];
        assert_int_equal(lm->source_layer, tc_planted_layer[lm->target_layer]);
        for (size_t x = 0; x < lm->n_w; x++)
            assert_true(fabs(lm->w[x] - e->pl.w[lm->target_layer][x]) <= 0.05);
        for (size_t h = 0; h < lm->n_heads; h++)
            assert_int_equal(lm->heads[h]->mode, MAPFLOW__V1__HEAD_MODE__HEAD_PROB);
    }
    mf_profile_free(p);
    /* outputs without values, an unknown objective: usage */
    char *noval[] = { e->tool, "--source", e->src, "--target", e->tgt, "--out", e->prof,
                      "--objective", "outputs", NULL };
    assert_int_equal(tk_run(noval, e->out, e->err), 2);
    char *msg = tk_slurp(e->err, NULL);
    assert_non_null(strstr(msg, "needs --values"));
    free(msg);
    char *badobj[] = { e->tool, "--source", e->src, "--target", e->tgt, "--out", e->prof,
                       "--objective", "logits", NULL };
    assert_int_equal(tk_run(badobj, e->out, e->err), 2);
    /* values of the wrong shape (2 kv heads do not divide 3 heads), named */
    char path[256];
    snprintf(path, sizeof path, "%s/seq1.npy", e->val);
    const uint64_t bad[4] = { TC_LT, 2, TC_N, 4 };
    assert_int_equal(mf_npy_write(path, MF_NPY_F32, e->pl.tgt[0], 4, bad), MF_OK);
    assert_int_equal(tk_run(argv, e->out, e->err), 1);
    msg = tk_slurp(e->err, NULL);
    assert_non_null(strstr(msg, "seq1.npy: need values"));
    free(msg);
}

static void test_tool_bad_input(void **state)
{
    env_t *e = *state;
    char p[256], *msg;
    /* file names differ */
    snprintf(p, sizeof p, "%s/extra.npy", e->tgt);
    const uint64_t ts[4] = { TC_LT, TC_HT, TC_N, TC_N };
    assert_int_equal(mf_npy_write(p, MF_NPY_F32, e->pl.tgt[0], 4, ts), MF_OK);
    assert_int_equal(calibrate(e, e->src, e->tgt), 1);
    msg = tk_slurp(e->err, NULL);
    assert_non_null(strstr(msg, "same file names"));
    free(msg);
    unlink(p);
    /* a truncated target file is named in the message */
    snprintf(p, sizeof p, "%s/seq1.npy", e->tgt);
    assert_int_equal(truncate(p, 300), 0);
    assert_int_equal(calibrate(e, e->src, e->tgt), 1);
    msg = tk_slurp(e->err, NULL);
    assert_non_null(strstr(msg, "seq1.npy"));
    assert_non_null(strstr(msg, "header says"));
    free(msg);
    /* a 3-d array */
    const uint64_t s3[3] = { TC_LT * TC_HT, TC_N, TC_N };
    assert_int_equal(mf_npy_write(p, MF_NPY_F32, e->pl.tgt[1], 3, s3), MF_OK);
    assert_int_equal(calibrate(e, e->src, e->tgt), 1);
    msg = tk_slurp(e->err, NULL);
    assert_non_null(strstr(msg, "[L, H, N, N]"));
    free(msg);
    /* a missing directory; usage errors */
    assert_int_equal(calibrate(e, "/nonexistent/mapflow", e->tgt), 1);
    char *noout[] = { e->tool, "--source", e->src, "--target", e->tgt, NULL };
    assert_int_equal(tk_run(noout, e->out, e->err), 2);
    char *badnum[] = { e->tool, "--source", e->src, "--target", e->tgt, "--out", e->prof,
                       "--max-error", "abc", NULL };
    assert_int_equal(tk_run(badnum, e->out, e->err), 2);
    char *badrec[] = { e->tool, "--source", e->src, "--target", e->tgt, "--out", e->prof,
                       "--mask-min-recall", "1.5", NULL };
    assert_int_equal(tk_run(badrec, e->out, e->err), 2);
    msg = tk_slurp(e->err, NULL);
    assert_non_null(strstr(msg, "bad value for --mask-min-recall: '1.5'"));
    free(msg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tool_recovers_planted),
        cmocka_unit_test(test_tool_outputs_objective),
        cmocka_unit_test(test_tool_bad_input),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
