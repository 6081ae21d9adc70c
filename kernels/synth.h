/*
 * synth — deterministic, structured random Q/K/V for tests, benchmarks and
 * mapflow-synth: every head attends to a local window (rotary-like position features)
 * plus a sink at token 0, on top of random content noise, so block maps look like real
 * ones (mass concentrated near the diagonal and on block 0) and Top-P actually prunes.
 *
 * Same seed, same shape → same bytes on every machine (splitmix64, no libc rand).
 * Ownership: the caller owns the output arrays. Thread safety: pure; any thread.
 */
#ifndef MF_SYNTH_H
#define MF_SYNTH_H

#include <stdint.h>

#include "mf_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mf_synth_opts {
    uint64_t seed;
    uint32_t n_tokens, n_q_heads, n_kv_heads, head_dim;
    float window;          /* local attention width in tokens (0: 64) */
    float sink;            /* sink logit at token 0 (0: 4.0) */
    float noise;           /* std of the content logits (0: 1.0) */
} mf_synth_opts_t;

/* Deterministic generator (splitmix64) with a uniform and a normal draw. */
typedef struct mf_rng {
    uint64_t s;
} mf_rng_t;

void mf_rng_seed(mf_rng_t *r, uint64_t seed);
uint64_t mf_rng_u64(mf_rng_t *r);
double mf_rng_uniform(mf_rng_t *r);   /* [0, 1) */
double mf_rng_normal(mf_rng_t *r);    /* N(0, 1) */

/*
 * Fills q [N, Hq, d] and k [N, Hkv, d] (and v [N, Hkv, d] unless NULL) as float32.
 * MF_INVALID_ARGUMENT if the shape is empty, d < 8 or Hkv does not divide Hq.
 */
mf_status_t mf_synth_qkv(const mf_synth_opts_t *o, float *q, float *k, float *v);

#ifdef __cplusplus
}
#endif
#endif /* MF_SYNTH_H */
