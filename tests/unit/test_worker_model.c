/*
 * mapflow-worker's model pieces against PyTorch: the committed small pair's full-prefill
 * logits equal the fixture train_small.py wrote from the same fp16 weights; the C
 * tokenizer encodes the fixture text to the Python trainer's ids and decodes it back; the
 * safetensors reader refuses malformed files with a status, never a crash.
 * Models come from $MFW_MODELS (default bench/models, run from the repository root).
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
#include "npy.h"
#include "safetensors.h"
#include "tokenizer.h"

static const char *models_dir(void)
{
    const char *d = getenv("MFW_MODELS");
    return d ? d : "bench/models";
}

static void path_of(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", models_dir(), name);
}

static void check_logits(const char *model_name, const char *fixture_name)
{
    char path[512], err[512] = "";
    mfw_gpt_t *m = NULL;
    path_of(path, sizeof path, model_name);
    mf_status_t st = mfw_gpt_load(path, &m, err, sizeof err);
    if (st != MF_OK)
        print_error("%s\n", err);
    assert_int_equal(st, MF_OK);
    mf_npy_t toks, want;
    path_of(path, sizeof path, "fixture/tokens.npy");
    assert_int_equal(mf_npy_read(path, 1u << 20, &toks, err, sizeof err), MF_OK);
    path_of(path, sizeof path, fixture_name);
    assert_int_equal(mf_npy_read(path, 1u << 26, &want, err, sizeof err), MF_OK);
    uint32_t n = (uint32_t)toks.hdr.n_elems, V = mfw_gpt_cfg(m)->vocab;
    assert_true(n >= 8);
    assert_int_equal(want.hdr.ndim, 2);
    assert_int_equal(want.hdr.shape[0], n);
    assert_int_equal(want.hdr.shape[1], V);
    uint32_t *ids = malloc(sizeof(uint32_t) * n);
    float *got = malloc(sizeof(float) * (size_t)n * V);
    for (uint32_t i = 0; i < n; i++)
        ids[i] = (uint32_t)toks.data[i];
    mfw_run_t *run = NULL;
    assert_int_equal(mfw_run_create(m, n, &run), MF_OK);
    /* In two calls (a prefill, then decode steps through the KV cache) so both paths are
     * checked against one PyTorch forward over the whole input. */
    uint32_t half = n / 2;
    assert_int_equal(mfw_gpt_forward(m, run, ids, half, NULL, NULL, 0, got), MF_OK);
    for (uint32_t i = half; i < n; i++)
        assert_int_equal(mfw_gpt_forward(m, run, ids + i, 1, NULL, NULL, 0, got + (size_t)i * V),
                         MF_OK);
    double worst = 0, scale = 0;
    uint32_t argmax_same = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t a = 0, b = 0;
        for (uint32_t v = 0; v < V; v++) {
            size_t k = (size_t)i * V + v;
            double d = fabs((double)got[k] - want.data[k]);
            worst = d > worst ? d : worst;
            scale = fabs(want.data[k]) > scale ? fabs(want.data[k]) : scale;
            a = got[k] > got[(size_t)i * V + a] ? v : a;
            b = want.data[k] > want.data[(size_t)i * V + b] ? v : b;
        }
        argmax_same += a == b;
    }
    print_message("%s: max |logit diff| %.2e (max |logit| %.2f), argmax equal %u/%u\n",
                  model_name, worst, scale, argmax_same, n);
    assert_true(scale > 1.0);          /* the fixture is not all zeros */
    assert_true(worst < 2e-3 * scale); /* float32 vs PyTorch's float32, other sum order */
    assert_int_equal(argmax_same, n);
    /* past the run's capacity: a status, nothing written */
    assert_int_equal(mfw_gpt_forward(m, run, ids, 1, NULL, NULL, 0, NULL), MF_OUT_OF_RANGE);
    mfw_run_free(run);
    free(ids);
    free(got);
    mf_npy_free(&toks);
    mf_npy_free(&want);
    mfw_gpt_free(m);
}

static void test_source_logits(void **state)
{
    (void)state;
    check_logits("source.safetensors", "fixture/source_logits.npy");
}

static void test_target_logits(void **state)
{
    (void)state;
    check_logits("target.safetensors", "fixture/target_logits.npy");
}

static void test_tokenizer_matches_python(void **state)
{
    (void)state;
    char path[512], err[512] = "", text[4096];
    mfw_tok_t *tok = NULL;
    path_of(path, sizeof path, "tokenizer.txt");
    assert_int_equal(mfw_tok_load(path, &tok, err, sizeof err), MF_OK);
    assert_true(mfw_tok_vocab(tok) >= 4096);
    path_of(path, sizeof path, "fixture/tok_text.txt");
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    mf_npy_t want;
    path_of(path, sizeof path, "fixture/tok_ids.npy");
    assert_int_equal(mf_npy_read(path, 1u << 20, &want, err, sizeof err), MF_OK);
    uint32_t ids[4096];
    size_t n = 0;
    assert_int_equal(mfw_tok_encode(tok, text, len, ids, 4096, &n), MF_OK);
    assert_int_equal(n, want.hdr.n_elems);
    assert_true(n < len); /* merges happened */
    char back[4096];
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(ids[i], (uint32_t)want.data[i]);
        size_t l;
        const char *b = mfw_tok_bytes(tok, ids[i], &l);
        memcpy(back + at, b, l);
        at += l;
    }
    assert_int_equal(at, len);
    assert_memory_equal(back, text, len);
    /* a buffer too small: a status and the ids that fit */
    assert_int_equal(mfw_tok_encode(tok, text, len, ids, 3, &n), MF_RESOURCE_EXHAUSTED);
    assert_int_equal(n, 3);
    size_t l;
    assert_null(mfw_tok_bytes(tok, mfw_tok_vocab(tok), &l));
    mf_npy_free(&want);
    mfw_tok_free(tok);
}

/* A valid one-tensor file, then corruptions of it. */
static size_t make_st(uint8_t *buf, const char *header, size_t data_len)
{
    size_t h = strlen(header);
    for (int k = 0; k < 8; k++)
        buf[k] = (uint8_t)((uint64_t)h >> (8 * k));
    memcpy(buf + 8, header, h);
    for (size_t i = 0; i < data_len; i++)
        buf[8 + h + i] = (uint8_t)(i * 37 + 11);
    return 8 + h + data_len;
}

static void test_safetensors_rejects(void **state)
{
    (void)state;
    uint8_t buf[1024];
    char err[256];
    mfw_st_t *st = NULL;
    size_t n = make_st(buf, "{\"__metadata__\":{\"a\":\"1\"},\"w\":{\"dtype\":\"F16\",\"shape\":[2,3],"
                            "\"data_offsets\":[0,12]}}", 12);
    assert_int_equal(mfw_st_parse(buf, n, "ok", &st, err, sizeof err), MF_OK);
    assert_string_equal(mfw_st_meta(st, "a"), "1");
    float *w = NULL;
    uint64_t shape[2] = { 2, 3 }, bad[2] = { 3, 2 };
    assert_int_equal(mfw_st_tensor(st, "w", 2, shape, &w, err, sizeof err), MF_OK);
    assert_true(w[0] != 0 || w[1] != 0);
    free(w);
    assert_int_equal(mfw_st_tensor(st, "w", 2, bad, &w, err, sizeof err), MF_INVALID_ARGUMENT);
    assert_int_equal(mfw_st_tensor(st, "x", 2, shape, &w, err, sizeof err), MF_NOT_FOUND);
    mfw_st_close(st);
    static const char *const bad_headers[] = {
        "{\"w\":{\"dtype\":\"F16\",\"shape\":[2,3],\"data_offsets\":[0,10]}}", /* size */
        "{\"w\":{\"dtype\":\"F16\",\"shape\":[2,3],\"data_offsets\":[4,16]}}", /* past end */
        "{\"w\":{\"dtype\":\"I64\",\"shape\":[2,3],\"data_offsets\":[0,12]}}", /* dtype */
        "{\"w\":{\"dtype\":\"F16\",\"shape\":[2,3]}}",                         /* no offsets */
        "{\"w\":{\"dtype\":\"F16\",\"shape\":[1,1,1,1,1,1,1,1,6],\"data_offsets\":[0,12]}}",
        "{\"w\":{\"dtype\":\"F16\",\"shape\":[99999999999999999999],\"data_offsets\":[0,12]}}",
        "{\"w\":{\"dtype\":\"F16\",\"shape\":[2,3],\"data_offsets\":[0,12]}",  /* unclosed */
        "{\"w\":{\"dtype\":\"F16\",\"shape\":[2,3],\"data_offsets\":[0,12]}}x",
        "{\"w",
    };
    for (size_t i = 0; i < sizeof bad_headers / sizeof *bad_headers; i++) {
        n = make_st(buf, bad_headers[i], 12);
        err[0] = 0;
        assert_int_equal(mfw_st_parse(buf, n, "bad", &st, err, sizeof err), MF_INVALID_ARGUMENT);
        assert_null(st);
        assert_true(strlen(err) > 0);
    }
    /* header length past the file, and a file too short */
    n = make_st(buf, "{}", 0);
    buf[0] = 200;
    assert_int_equal(mfw_st_parse(buf, n, "bad", &st, err, sizeof err), MF_INVALID_ARGUMENT);
    assert_int_equal(mfw_st_parse(buf, 5, "bad", &st, err, sizeof err), MF_INVALID_ARGUMENT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_source_logits),
        cmocka_unit_test(test_target_logits),
        cmocka_unit_test(test_tokenizer_matches_python),
        cmocka_unit_test(test_safetensors_rejects),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
