/*
 * ref_util — small inline helpers shared by the reference kernels (*_ref.c): double
 * accumulating dot products and the tensor staging they read. Internal to kernels/.
 * Pure functions on caller memory; any thread.
 */
#ifndef MF_REF_UTIL_H
#define MF_REF_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "mapflow_kernels.h"

/* Σ a[x]·b[x] in double; four independent sums so the loop is not latency-bound. */
static inline double ref_dot(const float *a, const float *b, size_t n)
{
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t x = 0;
    for (; x + 4 <= n; x += 4) {
        s0 += (double)a[x] * b[x];
        s1 += (double)a[x + 1] * b[x + 1];
        s2 += (double)a[x + 2] * b[x + 2];
        s3 += (double)a[x + 3] * b[x + 3];
    }
    for (; x < n; x++)
        s0 += (double)a[x] * b[x];
    return (s0 + s1) + (s2 + s3);
}

/* acc[x] += w · v[x] */
static inline void ref_axpy(double *acc, double w, const float *v, size_t n)
{
    for (size_t x = 0; x < n; x++)
        acc[x] += w * v[x];
}

/*
 * A layer's Q, K, V as float32 (converted once per call when the dtype is not f32;
 * otherwise the caller's pointers), with the derived GQA group and scale.
 */
typedef struct mf__staged {
    const float *q, *k, *v;
    float *own;            /* conversion buffer, freed by mf__unstage */
    uint32_t n, hq, hkv, d, group;
    double scale;
} mf__staged_t;

mf_status_t mf__stage(const mf_qkv_t *t, int need_v, mf__staged_t *s, const char **why);
void mf__unstage(mf__staged_t *s);

/*
 * Exact attention of query row r, head h, over the keys k ≤ r whose block k / B has
 * keep[k / B] != 0 (keep NULL: all keys). Writes out[d] (double); scratch holds r + 1
 * doubles. Returns the row's natural-log LSE over the keys used.
 */
double mf__attend_row(const mf__staged_t *s, uint32_t h, uint32_t r, const uint8_t *keep,
                      uint32_t block_size, double *scratch, double *out);

#endif /* MF_REF_UTIL_H */
