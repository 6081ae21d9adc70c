/* Prefix hash: golden vectors (from proto/README.md, produced by an independent Python
 * implementation) and the property that any change to an input changes every later hash. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "mf_hash.h"

struct golden {
    const char *ns, *model;
    uint32_t block;
    int rule, n_tokens;
    const char *root;
    const char *h[4];
};

static const struct golden golden[] = {
    { "default", "src-model", 64, 0, 256, "f2f918cfe489b2d99f74b64ea72b5004",
      { "40ac1d8ee57097d44c192c21ffc093bc", "5fa283d21ce1808f01dc047587bafdac",
        "83030b6cd754b0b5a1971510e8cb9736", "06993917ea9a1469a2e0214dbdac8b19" } },
    { "", "m", 16, 1, 48, "4c848fa5f1abcf7ba2a605b24bb1684d",
      { "6cfc41517019a09652e4baa2f64674d7", "f31b3b7148912b64b2fa46d86f6b519f",
        "835ca0d830c60d2ce0033f95cbcf16a0" } },
    { "tenant-a", "llama-3.1-70b", 128, 2, 273, "9c6de2fa74859d56b6ded19cd94782c6",
      { "bbf0d5b0861de6d44652e12478f315c4", "4cf1ad13927670a29b75f89919e3e3db" } },
    { "ns/\xc3\xbc", "\xe6\xa8\xa1\xe5\x9e\x8b", 32, 3, 64, "b187d61c36c95e5f78fc6102f0d574d8",
      { "d032c8ffd787221b712ecad19c297bba", "6ed37a191a2677eda340447530470e91" } },
};

static uint32_t rule_token(int rule, uint32_t k)
{
    switch (rule) {
    case 0: return k;
    case 1: return (uint32_t)((uint64_t)k * 2654435761u);
    case 2: return 50000 + k;
    default: return (7 * k) % 50257;
    }
}

static void test_golden_vectors(void **state)
{
    (void)state;
    for (size_t c = 0; c < sizeof golden / sizeof golden[0]; c++) {
        const struct golden *g = &golden[c];
        uint32_t toks[512];
        mf_hash128_t out[8];
        size_t n = 0;
        char hex[MF_HASH_HEX_LEN + 1];
        for (int k = 0; k < g->n_tokens; k++)
            toks[k] = rule_token(g->rule, (uint32_t)k);
        mf_hash_to_hex(mf_hash_root(g->block, g->ns, strlen(g->ns), g->model, strlen(g->model)), hex);
        assert_string_equal(hex, g->root);
        assert_int_equal(mf_hash_prefix(g->ns, g->model, g->block, toks, (size_t)g->n_tokens,
                                        out, 8, &n), MF_OK);
        assert_int_equal(n, (size_t)g->n_tokens / g->block);
        for (size_t i = 0; i < n; i++) {
            mf_hash_to_hex(out[i], hex);
            assert_string_equal(hex, g->h[i]);
            mf_hash128_t back;
            assert_int_equal(mf_hash_from_hex(hex, &back), MF_OK);
            assert_true(mf_hash_eq(back, out[i]));
        }
    }
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* Changing a token of block k changes h(k..end) and leaves h(0..k-1). Changing the
 * namespace, the model or B changes every hash. */
static void test_changes_propagate(void **state)
{
    (void)state;
    enum { B = 32, NB = 12 };
    uint32_t toks[B * NB], mod[B * NB];
    mf_hash128_t a[NB], b[NB];
    size_t n;
    for (int trial = 0; trial < 200; trial++) {
        for (int k = 0; k < B * NB; k++)
            toks[k] = rnd() % 128000;
        memcpy(mod, toks, sizeof toks);
        int pos = (int)(rnd() % (B * NB));
        mod[pos] ^= 1u << (rnd() % 32);
        assert_int_equal(mf_hash_prefix("ns", "model", B, toks, B * NB, a, NB, &n), MF_OK);
        assert_int_equal(mf_hash_prefix("ns", "model", B, mod, B * NB, b, NB, &n), MF_OK);
        for (int i = 0; i < NB; i++) {
            if (i < pos / B)
                assert_true(mf_hash_eq(a[i], b[i]));
            else
                assert_false(mf_hash_eq(a[i], b[i]));
        }
        const char *variants[][2] = { { "ns2", "model" }, { "ns", "model2" }, { "nsm", "odel" } };
        for (int v = 0; v < 3; v++) {
            assert_int_equal(mf_hash_prefix(variants[v][0], variants[v][1], B, toks, B * NB, b,
                                            NB, &n), MF_OK);
            for (int i = 0; i < NB; i++)
                assert_false(mf_hash_eq(a[i], b[i]));
        }
        /* Block size: B/2 yields twice as many blocks; none may equal a B-block hash. */
        mf_hash128_t c[2 * NB];
        assert_int_equal(mf_hash_prefix("ns", "model", B / 2, toks, B * NB, c, 2 * NB, &n), MF_OK);
        for (int i = 0; i < NB; i++)
            assert_false(mf_hash_eq(a[i], c[2 * i + 1]));
    }
}

static void test_bad_arguments(void **state)
{
    (void)state;
    uint32_t toks[64] = { 1 };
    mf_hash128_t out[1], h;
    size_t n;
    assert_int_equal(mf_hash_prefix("ns", "m", 0, toks, 64, out, 1, &n), MF_INVALID_ARGUMENT);
    assert_int_equal(mf_hash_prefix("ns", "m", 32, toks, 64, out, 1, &n), MF_INVALID_ARGUMENT);
    assert_int_equal(n, 2u);
    assert_int_equal(mf_hash_prefix("ns", "m", 32, toks, 31, NULL, 0, &n), MF_OK);
    assert_int_equal(n, 0u);
    assert_int_equal(mf_hash_from_hex("abc", &h), MF_INVALID_ARGUMENT);
    assert_int_equal(mf_hash_from_hex("0123456789abcdef0123456789abcdeg", &h), MF_INVALID_ARGUMENT);
    assert_int_equal(mf_hash_from_hex("0123456789ABCDEF0123456789abcdef", &h), MF_OK);
    assert_true(h.hi == 0x0123456789abcdefull && h.lo == 0x0123456789abcdefull);
    uint8_t le[16];
    mf_hash_to_le(h, le);
    assert_int_equal(le[0], 0xef);
    assert_int_equal(le[15], 0x01);
    assert_true(mf_hash_eq(mf_hash_from_le(le), h));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_vectors),
        cmocka_unit_test(test_changes_propagate),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
