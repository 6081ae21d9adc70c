/* mapflow-synth end to end: rows decode, hashes are the DESIGN §4 prefix hashes,
 * output is deterministic per seed, bad input gives the documented exit codes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <sys/stat.h>

#include "test_kernels_util.h"

enum { NTOK = 200, BS = 16, NBLK = NTOK / BS };

typedef struct env {
    char dir[64], tokens[128], out[128], err[128], tool[256];
    uint32_t tok[NTOK];
} env_t;

static int setup(void **state)
{
    env_t *e = calloc(1, sizeof(*e));
    strcpy(e->dir, "/tmp/mf_synth_XXXXXX");
    if (!mkdtemp(e->dir))
        return -1;
    snprintf(e->tokens, sizeof e->tokens, "%s/tokens.bin", e->dir);
    snprintf(e->out, sizeof e->out, "%s/stdout", e->dir);
    snprintf(e->err, sizeof e->err, "%s/stderr", e->dir);
    tk_tool("mapflow-synth", e->tool, sizeof e->tool);
    mf_rng_t r;
    mf_rng_seed(&r, 41);
    for (int i = 0; i < NTOK; i++)
        e->tok[i] = (uint32_t)(mf_rng_u64(&r) % 100000);
    FILE *f = fopen(e->tokens, "wb");
    fwrite(e->tok, 4, NTOK, f);
    fclose(f);
    *state = e;
    return 0;
}

static int teardown(void **state)
{
    env_t *e = *state;
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", e->dir);
    int rc = system(cmd);
    free(e);
    return rc == 0 ? 0 : -1;
}

static int synth(env_t *e, const char *codec, const char *seed, const char *ns,
                 const char *outdir)
{
    char *argv[32];
    int n = 0;
    char *fixed[] = { e->tool, "--model", "m1", "--layer", "7", "--block", "16", "--heads",
                      "4", "--tokens", e->tokens, "--codec", (char *)codec, "--top-p", "0.9",
                      "--seed", (char *)seed, "--out", (char *)outdir, "--dim", "32" };
    for (size_t k = 0; k < sizeof fixed / sizeof fixed[0]; k++)
        argv[n++] = fixed[k];
    if (ns) {
        argv[n++] = "--ns";
        argv[n++] = (char *)ns;
    }
    argv[n] = NULL;
    return tk_run(argv, e->out, e->err);
}

static void check_rows(env_t *e, const char *outdir, const char *ns, mf_codec_t codec,
                       size_t *entries)
{
    mf_hash128_t h[NBLK];
    size_t nh;
    assert_int_equal(mf_hash_prefix(ns, "m1", BS, e->tok, NTOK, h, NBLK, &nh), MF_OK);
    mf_hash128_t root = mf_hash_root(BS, ns, strlen(ns), "m1", 2);
    *entries = 0;
    for (uint32_t i = 0; i <= NBLK; i++) {
        char path[256];
        size_t len = 0;
        snprintf(path, sizeof path, "%s/row-%u.bin", outdir, i);
        char *buf = tk_slurp(path, &len);
        if (i == NBLK) { /* the 8 tokens past the last full block make no row */
            assert_null(buf);
            break;
        }
        assert_non_null(buf);
        mf_row_view_t v;
        const char *why;
        assert_int_equal(mf_row_decode(buf, len, 0, &v, &why), MF_OK);
        assert_int_equal(v.block_index, i);
        assert_int_equal(v.layer, 7);
        assert_int_equal(v.n_heads, 4);
        assert_int_equal(v.codec, codec);
        assert_true(fabsf(v.top_p - 0.9f) < 1e-7f);
        assert_true(mf_hash_eq(v.hash, h[i]));
        assert_true(mf_hash_eq(v.parent, i ? h[i - 1] : root));
        assert_memory_equal(v.tokens, e->tok + i * BS, BS * 4);
        *entries += v.n_entries;
        free(buf);
    }
}

static void test_synth_rows(void **state)
{
    env_t *e = *state;
    char d1[128], d2[128], d3[128];
    size_t ent;
    snprintf(d1, sizeof d1, "%s/a", e->dir);
    snprintf(d2, sizeof d2, "%s/b", e->dir);
    snprintf(d3, sizeof d3, "%s/c", e->dir);
    assert_int_equal(synth(e, "fp8", "5", "tenant-x", d1), 0);
    char *msg = tk_slurp(e->out, NULL);
    assert_non_null(strstr(msg, "wrote 12 rows"));
    free(msg);
    check_rows(e, d1, "tenant-x", MF_CODEC_FP8_E4M3, &ent);
    /* Top-P 0.9 on window + sink maps keeps fewer than all (head, block) pairs. */
    assert_true(ent < 4u * NBLK * (NBLK + 1) / 2);
    /* Same seed: same bytes. Another seed: other maps. Default namespace. */
    assert_int_equal(synth(e, "fp8", "5", "tenant-x", d2), 0);
    assert_int_equal(synth(e, "u8log", "6", NULL, d3), 0);
    check_rows(e, d3, "default", MF_CODEC_U8_LOG, &ent);
    int differ = 0;
    for (uint32_t i = 0; i < NBLK; i++) {
        char p1[256], p2[256];
        size_t l1 = 0, l2 = 0;
        snprintf(p1, sizeof p1, "%s/row-%u.bin", d1, i);
        snprintf(p2, sizeof p2, "%s/row-%u.bin", d2, i);
        char *a = tk_slurp(p1, &l1), *b = tk_slurp(p2, &l2);
        assert_int_equal(l1, l2);
        assert_memory_equal(a, b, l1);
        free(a);
        free(b);
        snprintf(p2, sizeof p2, "%s/row-%u.bin", d3, i);
        a = tk_slurp(p1, &l1);
        b = tk_slurp(p2, &l2);
        differ += l1 != l2 || memcmp(a, b, l1 < l2 ? l1 : l2) != 0;
        free(a);
        free(b);
    }
    assert_true(differ > NBLK / 2);
}

static void test_synth_bad_input(void **state)
{
    env_t *e = *state;
    char d[128];
    snprintf(d, sizeof d, "%s/bad", e->dir);
    assert_int_equal(synth(e, "zstd", "5", NULL, d), 2);
    char *msg = tk_slurp(e->err, NULL);
    assert_non_null(strstr(msg, "--codec"));
    free(msg);
    char *missing[] = { e->tool, "--model", "m", "--layer", "1", NULL };
    assert_int_equal(tk_run(missing, e->out, e->err), 2);
    /* a token file that is not whole u32s, then one shorter than a block */
    FILE *f = fopen(e->tokens, "wb");
    fwrite(e->tok, 1, 7, f);
    fclose(f);
    assert_int_equal(synth(e, "mask", "5", NULL, d), 1);
    f = fopen(e->tokens, "wb");
    fwrite(e->tok, 4, 10, f);
    fclose(f);
    assert_int_equal(synth(e, "mask", "5", NULL, d), 1);
    msg = tk_slurp(e->err, NULL);
    assert_non_null(strstr(msg, "fewer than one block"));
    free(msg);
    f = fopen(e->tokens, "wb"); /* restore for other tests */
    fwrite(e->tok, 4, NTOK, f);
    fclose(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_synth_rows),
        cmocka_unit_test(test_synth_bad_input),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
