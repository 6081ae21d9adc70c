/*
 * Helpers shared by the kernel tests (test_kernels_*.c): seeded random tensors, row
 * buffers for a whole extract, and float64 comparisons. Header-only, test code only.
 */
#ifndef TEST_KERNELS_UTIL_H
#define TEST_KERNELS_UTIL_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mapflow_kernels.h"
#include "synth.h"

/* Gaussian tensor with std `sd` (never all zeros). */
static inline float *tk_randn(mf_rng_t *r, size_t n, double sd)
{
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(sd * mf_rng_normal(r));
    return x;
}

/* Rows of one extract call, each in its own 16-byte-aligned buffer of the bound size. */
typedef struct tk_rows {
    uint32_t n;
    void **buf;
    size_t *cap, *size;
    mf_row_view_t *view;
    const mf_row_view_t **ptr; /* ptr[i] = &view[i], for mf_apply_args_t */
} tk_rows_t;

static inline mf_status_t tk_extract(const mf_extract_args_t *a, tk_rows_t *rows)
{
    uint32_t n = a->i1 - a->i0;
    rows->n = n;
    rows->buf = calloc(n, sizeof(void *));
    rows->cap = calloc(n, sizeof(size_t));
    rows->size = calloc(n, sizeof(size_t));
    rows->view = calloc(n, sizeof(mf_row_view_t));
    rows->ptr = calloc(n, sizeof(void *));
    for (uint32_t k = 0; k < n; k++) {
        rows->cap[k] = mf_extract_row_bound(a->codec, a->block_size, a->src.n_q_heads,
                                            a->i0 + k, strlen(a->model));
        rows->buf[k] = aligned_alloc(16, (rows->cap[k] + 15) & ~(size_t)15);
    }
    const char *why;
    uint32_t failed;
    mf_status_t st = mf_extract_ref(a, rows->buf, rows->cap, rows->size, &failed, &why);
    if (st != MF_OK)
        return st;
    for (uint32_t k = 0; k < n; k++) {
        st = mf_row_decode(rows->buf[k], rows->size[k], 0, &rows->view[k], &why);
        if (st != MF_OK)
            return st;
        rows->ptr[k] = &rows->view[k];
    }
    return MF_OK;
}

static inline void tk_rows_free(tk_rows_t *rows)
{
    for (uint32_t k = 0; k < rows->n; k++)
        free(rows->buf[k]);
    free(rows->buf);
    free(rows->cap);
    free(rows->size);
    free(rows->view);
    free(rows->ptr);
}

/* Largest relative L2 error over the [d]-vectors of o against ref (n vectors). */
static inline double tk_max_rel(const float *o, const double *ref, size_t n, uint32_t d)
{
    double worst = 0;
    for (size_t v = 0; v < n; v++) {
        double num = 0, den = 0;
        for (uint32_t x = 0; x < d; x++) {
            double e = o[v * d + x] - ref[v * d + x];
            num += e * e;
            den += ref[v * d + x] * ref[v * d + x];
        }
        double r = sqrt(num / (den > 0 ? den : 1e-300));
        if (r > worst)
            worst = r;
    }
    return worst;
}

/* Block masses of (head h, block i) from the dense float64 probabilities, in the same
 * summation order as the reference extract. mass has i + 1 entries. */
static inline void tk_block_mass(const mf_qkv_t *t, uint32_t h, uint32_t i, uint32_t b,
                                 double *mass)
{
    double *p = malloc(((size_t)i + 1) * b * sizeof(double));
    memset(mass, 0, ((size_t)i + 1) * sizeof(double));
    for (uint32_t q = 0; q < b; q++) {
        uint32_t r = i * b + q;
        mf_attention_row_ref(t, h, r, p, NULL);
        for (uint32_t k = 0; k <= r; k++)
            mass[k / b] += p[k];
    }
    for (uint32_t j = 0; j <= i; j++)
        mass[j] /= b;
    free(p);
}

#endif /* TEST_KERNELS_UTIL_H */
