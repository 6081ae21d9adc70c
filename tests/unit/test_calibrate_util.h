/*
 * Planted calibration data for test_calibrate*.c: source maps are random causal softmax
 * maps (local bias + sink + noise); target layer 0 is unrelated; target layers 1 and 2
 * are known convex mixtures of the heads of source layers 2 and 0, plus small noise.
 * Header-only, test code only.
 */
#ifndef TEST_CALIBRATE_UTIL_H
#define TEST_CALIBRATE_UTIL_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "synth.h"

enum { TC_LS = 3, TC_HS = 4, TC_LT = 3, TC_HT = 3, TC_N = 48, TC_SEQS = 3 };

static const uint32_t tc_planted_layer[TC_LT] = { 0, 2, 0 }; /* [0] unused: noise */

typedef struct tc_planted {
    float *src[TC_SEQS];   /* [LS, HS, N, N] */
    float *tgt[TC_SEQS];   /* [LT, HT, N, N] */
    double w[TC_LT][TC_HT * TC_HS];
} tc_planted_t;

/* One random causal softmax map [N, N] (zeros above the diagonal). */
static inline void tc_random_map(mf_rng_t *r, float *m)
{
    double rate = 0.05 + 0.5 * mf_rng_uniform(r), sink = 3.0 * mf_rng_uniform(r);
    for (uint32_t q = 0; q < TC_N; q++) {
        double lg[TC_N], mx = -INFINITY, sum = 0;
        for (uint32_t k = 0; k <= q; k++) {
            lg[k] = -rate * (q - k) + (k == 0 ? sink : 0) + 1.5 * mf_rng_normal(r);
            mx = lg[k] > mx ? lg[k] : mx;
        }
        for (uint32_t k = 0; k <= q; k++)
            sum += lg[k] = exp(lg[k] - mx);
        for (uint32_t k = 0; k < TC_N; k++)
            m[q * TC_N + k] = k <= q ? (float)(lg[k] / sum) : 0.0f;
    }
}

static inline void tc_planted_init(tc_planted_t *p, uint64_t seed, double noise)
{
    mf_rng_t r;
    mf_rng_seed(&r, seed);
    const size_t nn = (size_t)TC_N * TC_N;
    memset(p->w, 0, sizeof p->w);
    for (uint32_t t = 1; t < TC_LT; t++)
        for (uint32_t h = 0; h < TC_HT; h++) {
            double sum = 0, *w = p->w[t] + h * TC_HS;
            uint32_t zero = (uint32_t)(mf_rng_u64(&r) % TC_HS); /* one weight on the bound */
            for (uint32_t s = 0; s < TC_HS; s++)
                sum += w[s] = s == zero ? 0.0 : 0.2 + mf_rng_uniform(&r);
            for (uint32_t s = 0; s < TC_HS; s++)
                w[s] /= sum;
        }
    for (int q = 0; q < TC_SEQS; q++) {
        p->src[q] = malloc(TC_LS * TC_HS * nn * sizeof(float));
        p->tgt[q] = calloc(TC_LT * TC_HT * nn, sizeof(float));
        for (uint32_t x = 0; x < TC_LS * TC_HS; x++)
            tc_random_map(&r, p->src[q] + x * nn);
        for (uint32_t h = 0; h < TC_HT; h++)
            tc_random_map(&r, p->tgt[q] + h * nn);
        for (uint32_t t = 1; t < TC_LT; t++)
            for (uint32_t h = 0; h < TC_HT; h++) {
                float *dst = p->tgt[q] + (t * TC_HT + h) * nn;
                const float *sl = p->src[q] + (size_t)tc_planted_layer[t] * TC_HS * nn;
                for (uint32_t a = 0; a < TC_N; a++)
                    for (uint32_t b = 0; b <= a; b++) {
                        double v = 0;
                        for (uint32_t s = 0; s < TC_HS; s++)
                            v += p->w[t][h * TC_HS + s] * sl[s * nn + a * TC_N + b];
                        dst[a * TC_N + b] = (float)(v + noise * mf_rng_normal(&r));
                    }
            }
    }
}

static inline void tc_planted_free(tc_planted_t *p)
{
    for (int q = 0; q < TC_SEQS; q++) {
        free(p->src[q]);
        free(p->tgt[q]);
    }
}

#endif /* TEST_CALIBRATE_UTIL_H */
