/* The error bounds documented in proto/mf_codec.h, checked on random probability tiles
 * through the per-tile codecs (mf_tile_encode / mf_tile_decode) the kernels use. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mf_codec.h"
#include "mf_row.h"
#include "synth.h"

/* A B×B tile of causal-softmax-like probabilities: rows of softmax(σ·z) over B·C keys,
 * of which this tile sees B, so values span many orders of magnitude (never all zero). */
static void random_tile(mf_rng_t *r, uint32_t b, float *t, float *max)
{
    double sd = 0.5 + 8.0 * mf_rng_uniform(r);
    uint32_t others = 1 + (uint32_t)(mf_rng_u64(r) % 8);
    *max = 0;
    for (uint32_t q = 0; q < b; q++) {
        double z[256], mx = -INFINITY, sum = 0;
        for (uint32_t k = 0; k < b; k++) {
            z[k] = sd * mf_rng_normal(r);
            mx = z[k] > mx ? z[k] : mx;
        }
        for (uint32_t k = 0; k < b; k++)
            sum += exp(z[k] - mx);
        sum += others * b * exp(sd * mf_rng_normal(r) - mx) / 4; /* mass elsewhere */
        for (uint32_t k = 0; k < b; k++) {
            t[q * b + k] = (float)(exp(z[k] - mx) / sum);
            if (mf_rng_uniform(r) < 0.02)
                t[q * b + k] = 0.0f; /* exact zeros (causal padding) occur too */
            *max = t[q * b + k] > *max ? t[q * b + k] : *max;
        }
    }
}

static double bound(mf_codec_t c, double p, double m)
{
    switch (c) {
    case MF_CODEC_FP16:
        return p >= 0x1p-14 ? p * 0x1p-11 : 0x1p-25;
    case MF_CODEC_BF16:
        return p * 0x1p-8;
    case MF_CODEC_FP8_E4M3:
        return 0x1p-4 * p + 0x1p-10 * m / 448.0;
    default:
        return 0.0219 * p + m * exp2(-16.875);
    }
}

static void test_tile_bounds(void **state)
{
    (void)state;
    static const uint32_t sizes[] = { 8, 16, 64, 128 };
    mf_rng_t r;
    mf_rng_seed(&r, 61);
    float *src = malloc(128 * 128 * sizeof(float)), *dst = malloc(128 * 128 * sizeof(float));
    uint8_t *enc = malloc(128 * 128 * 2);
    for (int c = MF_CODEC_FP16; c <= MF_CODEC_U8_LOG; c++) {
        double worst_ratio = 0; /* largest error / bound seen: must stay ≤ 1 */
        for (int it = 0; it < 40; it++) {
            uint32_t b = sizes[it % 4];
            float m;
            random_tile(&r, b, src, &m);
            float scale = mf_tile_encode((mf_codec_t)c, b, src, enc);
            if (c == MF_CODEC_FP8_E4M3 || c == MF_CODEC_U8_LOG)
                assert_true(scale == m);
            else
                assert_true(scale == 0.0f);
            mf_tile_decode((mf_codec_t)c, b, enc, scale, dst);
            for (uint32_t x = 0; x < b * b; x++) {
                double p = src[x], e = fabs((double)dst[x] - p);
                double bd = bound((mf_codec_t)c, p, m) * (1 + 1e-6) + 1e-12 * m;
                if (p == 0.0)
                    assert_true(dst[x] == 0.0f);
                if (e > bd)
                    fail_msg("codec %s, B %u: p %.9g decoded %.9g (bound %.3g)",
                             mf_codec_name((mf_codec_t)c), b, p, (double)dst[x], bd);
                if (p > 0 && e / bd > worst_ratio)
                    worst_ratio = e / bd;
            }
        }
        /* The bounds are tight enough to mean something: errors reach a fair share. */
        assert_true(worst_ratio > 0.2);
    }
    free(src);
    free(dst);
    free(enc);
}

static void test_mass_byte(void **state)
{
    (void)state;
    mf_rng_t r;
    mf_rng_seed(&r, 62);
    for (int it = 0; it < 100000; it++) {
        double m = it == 0 ? 0.0 : it == 1 ? 1.0 : pow(mf_rng_uniform(&r), 1 + it % 5);
        double got = mf_mass_decode(mf_mass_encode((float)m));
        assert_true(fabs(got - m) <= sqrt(m) / 255.0 + 1.0 / (255.0 * 255.0) + 1e-7);
    }
    assert_true(mf_mass_decode(mf_mass_encode(0.0f)) == 0.0f);
    assert_true(mf_mass_decode(mf_mass_encode(1.0f)) == 1.0f);
}

/* Every finite e4m3 code survives decode → encode; all-zero tiles stay zero. */
static void test_e4m3_codes_and_zero_tiles(void **state)
{
    (void)state;
    for (int code = 0; code < 256; code++) {
        if ((code & 0x7f) == 0x7f)
            continue; /* NaN */
        float f = mf_e4m3_to_f32((uint8_t)code);
        assert_int_equal(mf_f32_to_e4m3(f), code);
    }
    assert_true(mf_e4m3_to_f32(mf_f32_to_e4m3(1e6f)) == 448.0f);
    float z[64] = { 0 }, out[64];
    uint8_t enc[128];
    for (int c = MF_CODEC_FP16; c <= MF_CODEC_U8_LOG; c++) {
        float s = mf_tile_encode((mf_codec_t)c, 8, z, enc);
        assert_true(s == 0.0f);
        for (int k = 0; k < 64; k++)
            out[k] = 1.0f;
        mf_tile_decode((mf_codec_t)c, 8, enc, s, out);
        for (int k = 0; k < 64; k++)
            assert_true(out[k] == 0.0f);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tile_bounds),
        cmocka_unit_test(test_mass_byte),
        cmocka_unit_test(test_e4m3_codes_and_zero_tiles),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
