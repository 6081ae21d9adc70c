/*
 * Helpers shared by the kernel tests (test_kernels_*.c): seeded random tensors, row
 * buffers for a whole extract, and float64 comparisons. Header-only, test code only.
 */
#ifndef TEST_KERNELS_UTIL_H
#define TEST_KERNELS_UTIL_H

#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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

/* Path of a built tool: $MF_BIN/name (make test sets MF_BIN), else build/bin/name. */
static inline void tk_tool(const char *name, char *out, size_t cap)
{
    const char *bin = getenv("MF_BIN");
    snprintf(out, cap, "%s/%s", bin && *bin ? bin : "build/bin", name);
}

/* Runs argv (NULL-terminated) with stdout and stderr to the given files; exit status,
 * or -1 if it did not exit normally. */
static inline int tk_run(char *const argv[], const char *out_path, const char *err_path)
{
    pid_t pid = fork();
    if (pid == 0) {
        int o = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int e = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0)
            _exit(126);
        execv(argv[0], argv);
        _exit(127);
    }
    int st;
    if (pid < 0 || waitpid(pid, &st, 0) != pid)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Whole file into a NUL-terminated malloc'd buffer (NULL if missing); *len its size. */
static inline char *tk_slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = aligned_alloc(16, ((size_t)n + 16) & ~(size_t)15);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf)
        buf[n] = 0;
    if (len)
        *len = (size_t)n;
    return buf;
}

#endif /* TEST_KERNELS_UTIL_H */
