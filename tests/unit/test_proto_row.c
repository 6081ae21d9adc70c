/* Map rows: round trip for every codec on random shapes, and rejection of every
 * malformed-row class of DESIGN §5 (run under ASan by `make asan`: no out-of-bounds read). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "mf_codec.h"
#include "mf_row.h"

static uint64_t rng = 0x243f6a8885a308d3ull;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}
static float frand(void) { return (float)(rnd() & 0xffffff) / 16777216.0f; }

typedef struct gen_row {
    mf_row_spec_t spec;
    uint32_t tokens[256];
    uint32_t n_cols, cols[64];
    uint64_t mask[64];
    uint32_t n_entries;
    float *mass, *tiles;
    uint8_t *buf;
    size_t size;
} gen_row_t;

/* Values the codec stores exactly, so the round trip is byte-exact where it must be. */
static float exact_value(mf_codec_t c)
{
    float p = 0.001f + 0.999f * frand();
    if (c == MF_CODEC_FP16)
        return mf_f16_to_f32(mf_f32_to_f16(p));
    if (c == MF_CODEC_BF16)
        return mf_bf16_to_f32(mf_f32_to_bf16(p));
    return p;
}

static void gen(gen_row_t *g, mf_codec_t codec, uint32_t max_entries)
{
    static const uint32_t blocks[] = { 16, 32, 64, 128 };
    memset(g, 0, sizeof *g);
    g->spec.model = "source-model-7b";
    g->spec.layer = rnd() % 80;
    g->spec.block_index = rnd() % 2048;
    g->spec.block_size = blocks[rnd() % 4];
    g->spec.n_heads = 1 + rnd() % 64;
    g->spec.codec = codec;
    g->spec.top_p = 0.5f + 0.5f * frand();
    g->spec.parent = (mf_hash128_t){ ((uint64_t)rnd() << 32) | rnd(), rnd() };
    g->spec.hash = (mf_hash128_t){ rnd(), ((uint64_t)rnd() << 32) | rnd() };
    for (uint32_t t = 0; t < g->spec.block_size; t++)
        g->tokens[t] = rnd();
    g->spec.tokens = g->tokens;
    uint32_t i = g->spec.block_index, h = g->spec.n_heads;
    uint64_t all = h == 64 ? ~0ull : (1ull << h) - 1;
    /* Sorted random columns in (0, i), then the sink and the diagonal. */
    uint32_t want = 1 + rnd() % 12;
    g->cols[g->n_cols++] = 0;
    if (i > 1) {
        uint32_t j = 0;
        for (uint32_t k = 0; k < want; k++) {
            j += 1 + rnd() % (1 + (i - 1) / want);
            if (j >= i)
                break;
            g->cols[g->n_cols++] = j;
        }
    }
    if (i > 0)
        g->cols[g->n_cols++] = i;
    for (uint32_t c = 0; c < g->n_cols; c++) {
        int edge = c == 0 || c == g->n_cols - 1;
        g->mask[c] = edge ? all : (((uint64_t)rnd() << 32 | rnd()) & all);
        if (!g->mask[c])
            g->mask[c] = 1;
        g->n_entries += (uint32_t)__builtin_popcountll(g->mask[c]);
    }
    /* Keep prob rows small enough for a fast test: trim heads if needed. */
    if (codec != MF_CODEC_MASK && g->n_entries > max_entries) {
        g->spec.n_heads = h = 1 + rnd() % 3;
        all = (1ull << h) - 1;
        g->n_entries = 0;
        for (uint32_t c = 0; c < g->n_cols; c++) {
            g->mask[c] &= all;
            if (c == 0 || c == g->n_cols - 1 || !g->mask[c])
                g->mask[c] = all;
            g->n_entries += (uint32_t)__builtin_popcountll(g->mask[c]);
        }
    }
    size_t bb = (size_t)g->spec.block_size * g->spec.block_size;
    g->mass = malloc(sizeof(float) * g->n_entries);
    g->tiles = codec == MF_CODEC_MASK ? NULL : malloc(sizeof(float) * bb * g->n_entries);
    for (uint32_t e = 0; e < g->n_entries; e++) {
        g->mass[e] = mf_mass_decode((uint8_t)(1 + rnd() % 255));
        for (size_t k = 0; g->tiles && k < bb; k++)
            g->tiles[e * bb + k] = exact_value(codec);
    }
    assert_int_equal(mf_row_size(&g->spec, g->n_cols, g->mask, &g->size), MF_OK);
    g->buf = aligned_alloc(16, (g->size + 15) & ~(size_t)15);
    size_t written = 0;
    const char *why = NULL;
    assert_int_equal(mf_row_build(NULL, 0, &g->spec, g->n_cols, g->cols, g->mask, g->mass,
                                  g->tiles, &written, &why), MF_RESOURCE_EXHAUSTED);
    assert_int_equal(written, g->size);
    mf_status_t st = mf_row_build(g->buf, g->size, &g->spec, g->n_cols, g->cols, g->mask,
                                  g->mass, g->tiles, &written, &why);
    if (st != MF_OK)
        fail_msg("build: %s", why);
    assert_int_equal(written, g->size);
}

static void gen_free(gen_row_t *g)
{
    free(g->mass);
    free(g->tiles);
    free(g->buf);
}

static void check_roundtrip(mf_codec_t codec)
{
    for (int trial = 0; trial < 60; trial++) {
        gen_row_t g;
        gen(&g, codec, 96);
        mf_row_view_t v;
        const char *why = NULL;
        mf_status_t st = mf_row_decode(g.buf, g.size, 0, &v, &why);
        if (st != MF_OK)
            fail_msg("decode: %s", why);
        assert_int_equal(v.codec, codec);
        assert_int_equal(v.layer, g.spec.layer);
        assert_int_equal(v.block_index, g.spec.block_index);
        assert_int_equal(v.block_size, g.spec.block_size);
        assert_int_equal(v.n_heads, g.spec.n_heads);
        assert_int_equal(v.n_cols, g.n_cols);
        assert_int_equal(v.n_entries, g.n_entries);
        assert_true(v.top_p == g.spec.top_p);
        assert_int_equal(v.model_len, strlen(g.spec.model));
        assert_memory_equal(v.model, g.spec.model, v.model_len);
        assert_true(mf_hash_eq(v.parent, g.spec.parent) && mf_hash_eq(v.hash, g.spec.hash));
        assert_memory_equal(v.tokens, g.tokens, 4 * g.spec.block_size);
        assert_memory_equal(v.cols, g.cols, 4 * g.n_cols);
        assert_memory_equal(v.head_mask, g.mask, 8 * g.n_cols);
        /* Every section is 16-byte aligned for in-place GPU reads. */
        assert_int_equal(((uintptr_t)v.tokens | (uintptr_t)v.cols | (uintptr_t)v.col_off |
                          (uintptr_t)v.head_mask | (uintptr_t)v.mass) & 15, 0);
        if (v.tiles)
            assert_int_equal((uintptr_t)v.tiles & 15, 0);
        /* Walk entries through mf_row_entry, as the kernels do. */
        uint32_t e = 0;
        size_t bb = (size_t)v.block_size * v.block_size;
        for (uint32_t c = 0; c < v.n_cols; c++)
            for (uint32_t h = 0; h < v.n_heads; h++) {
                int64_t got = mf_row_entry(&v, c, h);
                if (!((g.mask[c] >> h) & 1)) {
                    assert_true(got < 0);
                    continue;
                }
                assert_int_equal(got, e);
                assert_true(mf_row_mass(&v, e) == g.mass[e]); /* byte-exact masses */
                for (uint32_t q = 0; q < v.block_size && g.tiles; q += 1 + q / 4)
                    for (uint32_t k = 0; k < v.block_size; k += 1 + k / 3) {
                        float p = g.tiles[e * bb + (size_t)q * v.block_size + k];
                        float d = mf_row_tile_value(&v, e, q, k);
                        float m = v.scales ? v.scales[e] : 0.0f;
                        switch (codec) {
                        case MF_CODEC_FP16:
                        case MF_CODEC_BF16:
                            assert_true(d == p);
                            break;
                        case MF_CODEC_FP8_E4M3:
                            assert_true(fabsf(d - p) <= 0.0625f * p + ldexpf(m, -10) / 448.0f + 1e-7f);
                            break;
                        default:
                            assert_true(fabsf(d - p) <= 0.0219f * p + m * exp2f(-16.875f) + 1e-7f);
                        }
                    }
                e++;
            }
        assert_int_equal(e, v.n_entries);
        /* Re-encoding the decoded row yields the same bytes (byte-exact codecs). */
        if (codec == MF_CODEC_MASK || codec == MF_CODEC_FP16 || codec == MF_CODEC_BF16) {
            float *m2 = malloc(sizeof(float) * (v.n_entries + 1));
            float *t2 = g.tiles ? malloc(sizeof(float) * bb * v.n_entries) : NULL;
            for (uint32_t k = 0; k < v.n_entries; k++) {
                m2[k] = mf_row_mass(&v, k);
                if (t2)
                    mf_tile_decode(codec, v.block_size,
                                   (const uint8_t *)v.tiles + k * v.tile_bytes, 0.0f, t2 + k * bb);
            }
            uint8_t *b2 = aligned_alloc(16, (g.size + 15) & ~(size_t)15);
            size_t n2;
            assert_int_equal(mf_row_build(b2, g.size, &g.spec, g.n_cols, g.cols, g.mask, m2, t2,
                                          &n2, &why), MF_OK);
            assert_int_equal(n2, g.size);
            assert_memory_equal(b2, g.buf, g.size);
            free(b2);
            free(m2);
            free(t2);
        }
        gen_free(&g);
    }
}

static void test_roundtrip_mask(void **s) { (void)s; check_roundtrip(MF_CODEC_MASK); }
static void test_roundtrip_fp16(void **s) { (void)s; check_roundtrip(MF_CODEC_FP16); }
static void test_roundtrip_bf16(void **s) { (void)s; check_roundtrip(MF_CODEC_BF16); }
static void test_roundtrip_fp8(void **s) { (void)s; check_roundtrip(MF_CODEC_FP8_E4M3); }
static void test_roundtrip_u8log(void **s) { (void)s; check_roundtrip(MF_CODEC_U8_LOG); }

/* A valid FP8 row with at least four columns and fewer than 64 heads. */
static void gen_rich(gen_row_t *g)
{
    for (;;) {
        gen(g, MF_CODEC_FP8_E4M3, 64);
        if (g->n_cols >= 4 && g->spec.n_heads < 64)
            return;
        gen_free(g);
    }
}

static mf_status_t decode_copy(const gen_row_t *g, const uint8_t *bytes, size_t len,
                               int reseal, const char **why)
{
    uint8_t *b = aligned_alloc(16, (len + 15) & ~(size_t)15);
    memcpy(b, bytes, len);
    if (reseal)
        mf_row_seal(b, len);
    mf_row_view_t v;
    mf_status_t st = mf_row_decode(b, len, 0, &v, why);
    free(b);
    (void)g;
    return st;
}

static void expect(const gen_row_t *g, const uint8_t *bytes, size_t len, int reseal,
                   mf_status_t want, const char *why_part)
{
    const char *why = "";
    mf_status_t st = decode_copy(g, bytes, len, reseal, &why);
    if (st != want || !strstr(why, why_part))
        fail_msg("want %s (%s), got %s (%s)", mf_status_name(want), why_part,
                 mf_status_name(st), why);
}

static void test_malformed_classes(void **s)
{
    (void)s;
    for (int trial = 0; trial < 20; trial++) {
        gen_row_t g;
        gen_rich(&g);
        mf_row_view_t v;
        assert_int_equal(mf_row_decode(g.buf, g.size, 0, &v, NULL), MF_OK);
        uint8_t *b = malloc(g.size);
        size_t off_cols = (size_t)((const uint8_t *)v.cols - g.buf);
        size_t off_mask = (size_t)((const uint8_t *)v.head_mask - g.buf);
        mf_row_header_t *h = (mf_row_header_t *)b;
        uint32_t *cols = (uint32_t *)(b + off_cols);
        uint64_t *mask = (uint64_t *)(b + off_mask);
        uint32_t n = g.n_cols;

#define RESET() memcpy(b, g.buf, g.size)
        RESET(); h->magic ^= 1;
        expect(&g, b, g.size, 0, MF_INVALID_ARGUMENT, "magic");
        RESET(); h->version = 2;
        expect(&g, b, g.size, 1, MF_UNIMPLEMENTED, "version");
        RESET(); h->codec = 9;
        expect(&g, b, g.size, 1, MF_INVALID_ARGUMENT, "codec");
        RESET(); cols[n - 1] = g.spec.block_index + 1 + rnd() % 5;
        expect(&g, b, g.size, 1, MF_INVALID_ARGUMENT, "j > i");
        RESET(); { uint32_t t = cols[1]; cols[1] = cols[2]; cols[2] = t; }
        expect(&g, b, g.size, 1, MF_INVALID_ARGUMENT, "unsorted or duplicated");
        RESET(); cols[2] = cols[1];
        expect(&g, b, g.size, 1, MF_INVALID_ARGUMENT, "unsorted or duplicated");
        RESET(); mask[1] |= 1ull << (g.spec.n_heads + rnd() % (64 - g.spec.n_heads));
        expect(&g, b, g.size, 1, MF_INVALID_ARGUMENT, "bit >= n_heads");
        RESET(); mask[1] = 0;
        expect(&g, b, g.size, 1, MF_INVALID_ARGUMENT, "no head");
        RESET(); h->n_entries += 1; /* sizes disagree, or more entries than columns x heads */
        expect(&g, b, g.size, 1, MF_INVALID_ARGUMENT, "");
        RESET(); h->n_cols -= 1;
        expect(&g, b, g.size, 1, MF_INVALID_ARGUMENT, ""); /* sizes, or the lost diagonal */
        RESET();
        expect(&g, b, g.size - 16, 0, MF_INVALID_ARGUMENT, "size in header disagrees");
        RESET(); h->total_size -= 16;
        expect(&g, b, g.size - 16, 1, MF_INVALID_ARGUMENT, "section sizes disagree");
        RESET(); b[g.size - 1 - rnd() % 64] ^= (uint8_t)(1 + rnd() % 255);
        expect(&g, b, g.size, 0, MF_DATA_LOSS, "checksum");
        RESET(); b[20 + rnd() % 8] ^= 0x10; /* layer / block index */
        expect(&g, b, g.size, 0, MF_DATA_LOSS, "checksum");
        RESET(); h->block_size = 48;
        expect(&g, b, g.size, 1, MF_INVALID_ARGUMENT, "power of two");
        RESET(); h->n_heads = 0;
        expect(&g, b, g.size, 1, MF_INVALID_ARGUMENT, "head count");
        RESET(); h->top_p = NAN;
        expect(&g, b, g.size, 1, MF_INVALID_ARGUMENT, "top_p");
        RESET(); ((float *)(b + ((const uint8_t *)v.scales - g.buf)))[0] = 3.0f;
        expect(&g, b, g.size, 1, MF_INVALID_ARGUMENT, "scale");
        RESET(); ((uint32_t *)(b + ((const uint8_t *)v.col_off - g.buf)))[1] += 1;
        expect(&g, b, g.size, 1, MF_INVALID_ARGUMENT, "offsets");
        RESET(); mask[0] &= ~1ull;
        expect(&g, b, g.size, 1, MF_INVALID_ARGUMENT, mask[0] ? "sink" : "no head");
        RESET(); mask[n - 1] &= ~(1ull << (g.spec.n_heads - 1));
        expect(&g, b, g.size, 1, MF_INVALID_ARGUMENT, mask[n - 1] ? "diagonal" : "no head");
        /* Every truncation fails cleanly (ASan would flag a read past len). */
        for (size_t len = 0; len < g.size; len += 1 + len / 7) {
            RESET();
            const char *why;
            assert_int_not_equal(decode_copy(&g, b, len, 0, &why), MF_OK);
        }
#undef RESET
        free(b);
        gen_free(&g);
    }
}

/* Random corruption with a valid checksum: any status, never a crash or bad read. */
static void test_random_corruption(void **s)
{
    (void)s;
    int ok = 0, bad = 0;
    for (int trial = 0; trial < 300; trial++) {
        gen_row_t g;
        gen(&g, (mf_codec_t)(rnd() % MF_CODEC_COUNT), 16);
        uint8_t *b = aligned_alloc(16, (g.size + 15) & ~(size_t)15);
        memcpy(b, g.buf, g.size);
        size_t meta = g.size < 512 ? g.size : 512;
        for (int k = 0; k < 1 + (int)(rnd() % 4); k++)
            b[rnd() % meta] ^= (uint8_t)(1u << (rnd() % 8));
        mf_row_seal(b, g.size);
        mf_row_view_t v;
        if (mf_row_decode(b, g.size, 0, &v, NULL) == MF_OK) {
            ok++;
            assert_true(v.n_cols <= v.block_index + 1);
            assert_true(v.cols[v.n_cols - 1] == v.block_index);
        } else {
            bad++;
        }
        free(b);
        gen_free(&g);
    }
    assert_true(bad > 0);
    print_message("random corruption: %d rejected, %d still valid (payload bits)\n", bad, ok);
}

static void test_builder_rejects(void **s)
{
    (void)s;
    uint32_t toks[16] = { 1, 2, 3 };
    mf_row_spec_t sp = { .model = "m", .layer = 0, .block_index = 3, .block_size = 16,
                         .n_heads = 2, .codec = MF_CODEC_MASK, .top_p = 0.9f, .tokens = toks };
    uint32_t cols[2] = { 0, 3 };
    uint64_t mask[2] = { 3, 3 };
    float mass[4] = { 0.5f, 0.4f, 0.3f, 0.2f };
    _Alignas(16) uint8_t buf[1024];
    size_t n;
    const char *why;
    assert_int_equal(mf_row_build(buf, sizeof buf, &sp, 2, cols, mask, mass, NULL, &n, &why), MF_OK);
    mask[1] = 1;
    assert_int_equal(mf_row_build(buf, sizeof buf, &sp, 2, cols, mask, mass, NULL, &n, &why),
                     MF_INVALID_ARGUMENT);
    assert_non_null(strstr(why, "diagonal"));
    mask[1] = 3;
    sp.top_p = 0.0f;
    assert_int_equal(mf_row_build(buf, sizeof buf, &sp, 2, cols, mask, mass, NULL, &n, &why),
                     MF_INVALID_ARGUMENT);
    sp.top_p = 1.0f;
    sp.codec = MF_CODEC_FP16;
    assert_int_equal(mf_row_build(buf, sizeof buf, &sp, 2, cols, mask, mass, NULL, &n, &why),
                     MF_RESOURCE_EXHAUSTED); /* 4 tiles of 16x16 fp16 do not fit in 1 KiB */
    assert_true(n > sizeof buf);
    assert_int_equal(mf_row_decode(buf + 1, 100, 0, &(mf_row_view_t){ 0 }, &why), MF_INVALID_ARGUMENT);
}

/* mf_row_peek sees the header decode sees; mf_row_match accepts the row's own fields and
 * names the one field that was changed in the request. */
static void test_peek_and_match(void **s)
{
    (void)s;
    for (int trial = 0; trial < 40; trial++) {
        gen_row_t g;
        gen(&g, MF_CODEC_MASK, 96);
        mf_row_view_t d, p;
        const char *why = NULL;
        assert_int_equal(mf_row_decode(g.buf, g.size, 0, &d, &why), MF_OK);
        assert_int_equal(mf_row_peek(g.buf, g.size, &p, &why), MF_OK);
        assert_int_equal(p.layer, d.layer);
        assert_int_equal(p.block_index, d.block_index);
        assert_int_equal(p.block_size, d.block_size);
        assert_int_equal(p.model_len, d.model_len);
        assert_ptr_equal(p.model, d.model);
        assert_ptr_equal(p.tokens, d.tokens);
        assert_true(mf_hash_eq(p.parent, d.parent) && mf_hash_eq(p.hash, d.hash));
        assert_null(p.cols);
        /* a truncated length or a damaged magic is DATA_LOSS */
        assert_int_equal(mf_row_peek(g.buf, g.size - 16, &p, &why), MF_DATA_LOSS);
        g.buf[rnd() % 4] ^= (uint8_t)(1u << (rnd() % 8));
        assert_int_equal(mf_row_peek(g.buf, g.size, &p, &why), MF_DATA_LOSS);

        uint32_t tok[256];
        memcpy(tok, g.tokens, sizeof(tok));
        mf_row_want_t w = {.fields = MF_MATCH_MODEL | MF_MATCH_LAYER | MF_MATCH_BLOCK |
                                     MF_MATCH_PARENT | MF_MATCH_HASH | MF_MATCH_TOKENS,
                           .model = g.spec.model, .model_len = strlen(g.spec.model),
                           .layer = g.spec.layer, .block_index = g.spec.block_index,
                           .block_size = g.spec.block_size, .parent = g.spec.parent,
                           .hash = g.spec.hash, .tokens = tok};
        assert_true(mf_row_match(&d, &w, &why));
        static const char *const field[] = {"model", "layer", "block index", "block size",
                                            "parent", "hash", "tokens"};
        int k = (int)(rnd() % 7);
        mf_row_want_t bad = w;
        switch (k) {
        case 0: bad.model_len--; break;
        case 1: bad.layer ^= 1u + rnd() % 7; break;
        case 2: bad.block_index += 1 + rnd() % 9; break;
        case 3: bad.block_size *= 2; break;
        case 4: bad.parent.lo ^= 1ull << (rnd() % 64); break;
        case 5: bad.hash.hi ^= 1ull << (rnd() % 64); break;
        default: tok[rnd() % g.spec.block_size] ^= 1u + rnd() % 1000; break;
        }
        why = NULL;
        assert_false(mf_row_match(&d, &bad, &why));
        assert_non_null(strstr(why, field[k]));
        /* a field left out of `fields` is not compared */
        bad.fields &= k == 6 ? ~(MF_MATCH_TOKENS & ~MF_MATCH_BLOCK_SIZE)
                             : ~(1u << (k < 6 ? k : 0));
        if (k != 3)
            assert_true(mf_row_match(&d, &bad, &why));
        gen_free(&g);
    }
    for (uint32_t b = 0; b < 600; b++)
        assert_int_equal(mf_row_block_size_ok(b),
                         b >= 8 && b <= 256 && (b & (b - 1)) == 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_mask),
        cmocka_unit_test(test_roundtrip_fp16),
        cmocka_unit_test(test_roundtrip_bf16),
        cmocka_unit_test(test_roundtrip_fp8),
        cmocka_unit_test(test_roundtrip_u8log),
        cmocka_unit_test(test_malformed_classes),
        cmocka_unit_test(test_random_corruption),
        cmocka_unit_test(test_builder_rejects),
        cmocka_unit_test(test_peek_and_match),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
