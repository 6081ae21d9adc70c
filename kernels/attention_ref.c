/* attention_ref — float64 dense causal attention, Top-P selection and tensor staging
 * shared by the reference kernels (see mapflow_kernels.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mapflow_kernels.h"
#include "mf_codec.h"
#include "ref_util.h"

float mf_tensor_get(const void *t, mf_dtype_t dtype, size_t idx)
{
    switch (dtype) {
    case MF_DTYPE_F16:
        return mf_f16_to_f32(((const uint16_t *)t)[idx]);
    case MF_DTYPE_BF16:
        return mf_bf16_to_f32(((const uint16_t *)t)[idx]);
    default:
        return ((const float *)t)[idx];
    }
}

void mf_tensor_to_f32(const void *src, mf_dtype_t dtype, size_t n, float *dst)
{
    if (dtype == MF_DTYPE_F32) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    for (size_t x = 0; x < n; x++)
        dst[x] = mf_tensor_get(src, dtype, x);
}

mf_status_t mf_qkv_check(const mf_qkv_t *t, int need_v, const char **why)
{
    const char *dummy;
    if (!why)
        why = &dummy;
    if (!t || !t->q || !t->k || (need_v && !t->v)) {
        *why = "Q, K (and V) are required";
        return MF_INVALID_ARGUMENT;
    }
    if ((unsigned)t->dtype > MF_DTYPE_BF16) {
        *why = "unknown dtype";
        return MF_INVALID_ARGUMENT;
    }
    if (t->n_tokens < 1 || t->n_tokens > MF_KERNELS_MAX_TOKENS) {
        *why = "token count out of range (1..2^20)";
        return MF_INVALID_ARGUMENT;
    }
    if (t->head_dim < 1 || t->head_dim > MF_KERNELS_MAX_DIM) {
        *why = "head dim out of range (1..1024)";
        return MF_INVALID_ARGUMENT;
    }
    if (t->n_q_heads < 1 || t->n_q_heads > MF_ROW_MAX_HEADS || t->n_kv_heads < 1 ||
        t->n_q_heads % t->n_kv_heads != 0) {
        *why = "head counts: need 1 <= Hq <= 64 and Hkv dividing Hq";
        return MF_INVALID_ARGUMENT;
    }
    return MF_OK;
}

static const float *stage_one(const void *src, mf_dtype_t dt, size_t n, float **cursor)
{
    if (dt == MF_DTYPE_F32)
        return src;
    float *dst = *cursor;
    mf_tensor_to_f32(src, dt, n, dst);
    *cursor += n;
    return dst;
}

mf_status_t mf__stage(const mf_qkv_t *t, int need_v, mf__staged_t *s, const char **why)
{
    mf_status_t st = mf_qkv_check(t, need_v, why);
    if (st != MF_OK)
        return st;
    memset(s, 0, sizeof(*s));
    s->n = t->n_tokens;
    s->hq = t->n_q_heads;
    s->hkv = t->n_kv_heads;
    s->d = t->head_dim;
    s->group = s->hq / s->hkv;
    s->scale = 1.0 / sqrt((double)s->d);
    size_t nq = (size_t)s->n * s->hq * s->d, nk = (size_t)s->n * s->hkv * s->d;
    if (t->dtype != MF_DTYPE_F32) {
        s->own = malloc((nq + nk + (t->v ? nk : 0)) * sizeof(float));
        if (!s->own) {
            *why = "out of memory staging Q/K/V";
            return MF_RESOURCE_EXHAUSTED;
        }
    }
    float *cur = s->own;
    s->q = stage_one(t->q, t->dtype, nq, &cur);
    s->k = stage_one(t->k, t->dtype, nk, &cur);
    s->v = t->v ? stage_one(t->v, t->dtype, nk, &cur) : NULL;
    return MF_OK;
}

void mf__unstage(mf__staged_t *s)
{
    free(s->own);
    s->own = NULL;
}

double mf__attend_row(const mf__staged_t *s, uint32_t h, uint32_t r, const uint8_t *keep,
                      uint32_t block_size, double *scratch, double *out)
{
    const float *q = s->q + ((size_t)r * s->hq + h) * s->d;
    uint32_t kv = h / s->group;
    double mx = -INFINITY;
    for (uint32_t k = 0; k <= r; k++) {
        if (keep && !keep[k / block_size]) {
            scratch[k] = -INFINITY;
            continue;
        }
        scratch[k] = s->scale * ref_dot(q, s->k + ((size_t)k * s->hkv + kv) * s->d, s->d);
        if (scratch[k] > mx)
            mx = scratch[k];
    }
    double sum = 0;
    if (out)
        memset(out, 0, s->d * sizeof(double));
    for (uint32_t k = 0; k <= r; k++) {
        if (scratch[k] == -INFINITY) {
            scratch[k] = 0;
            continue;
        }
        double e = exp(scratch[k] - mx);
        scratch[k] = e;
        sum += e;
        if (out)
            ref_axpy(out, e, s->v + ((size_t)k * s->hkv + kv) * s->d, s->d);
    }
    if (out)
        for (uint32_t x = 0; x < s->d; x++)
            out[x] /= sum;
    for (uint32_t k = 0; k <= r; k++)
        scratch[k] /= sum;
    return mx + log(sum);
}

mf_status_t mf_attention_row_ref(const mf_qkv_t *t, uint32_t head, uint32_t row, double *p,
                                 double *lse)
{
    mf__staged_t s;
    const char *why;
    if (!p)
        return MF_INVALID_ARGUMENT;
    mf_status_t st = mf__stage(t, 0, &s, &why);
    if (st != MF_OK)
        return st;
    if (head >= s.hq || row >= s.n) {
        mf__unstage(&s);
        return MF_INVALID_ARGUMENT;
    }
    double l = mf__attend_row(&s, head, row, NULL, 1, p, NULL);
    if (lse)
        *lse = l;
    mf__unstage(&s);
    return MF_OK;
}

mf_status_t mf_attention_dense_ref(const mf_qkv_t *t, double *o, double *lse)
{
    mf__staged_t s;
    const char *why;
    if (!o)
        return MF_INVALID_ARGUMENT;
    mf_status_t st = mf__stage(t, 1, &s, &why);
    if (st != MF_OK)
        return st;
    double *scratch = malloc((size_t)s.n * sizeof(double));
    if (!scratch) {
        mf__unstage(&s);
        return MF_RESOURCE_EXHAUSTED;
    }
    for (uint32_t r = 0; r < s.n; r++)
        for (uint32_t h = 0; h < s.hq; h++) {
            double l = mf__attend_row(&s, h, r, NULL, 1, scratch,
                                      o + ((size_t)r * s.hq + h) * s.d);
            if (lse)
                lse[(size_t)h * s.n + r] = l;
        }
    free(scratch);
    mf__unstage(&s);
    return MF_OK;
}

typedef struct topp_item {
    double mass;
    uint32_t j;
} topp_item_t;

/* Largest mass first; ties to the lower block index (a total order: deterministic). */
static int topp_cmp(const void *a, const void *b)
{
    const topp_item_t *x = a, *y = b;
    if (x->mass != y->mass)
        return x->mass > y->mass ? -1 : 1;
    return x->j < y->j ? -1 : (x->j > y->j);
}

mf_status_t mf_topp_select(const double *mass, const uint8_t *cand, uint32_t n_blocks,
                           double top_p, uint8_t *keep, uint32_t *n_kept)
{
    if (!mass || !keep || !n_kept || n_blocks < 1 || !(top_p > 0.0))
        return MF_INVALID_ARGUMENT;
    uint32_t i = n_blocks - 1, kept = 0;
    double total = 0, acc = 0;
    for (uint32_t j = 0; j < n_blocks; j++) {
        int c = !cand || cand[j];
        keep[j] = (uint8_t)(j == 0 || j == i || (c && top_p >= 1.0));
        if (c)
            total += mass[j];
        if (keep[j]) {
            kept++;
            acc += mass[j];
        }
    }
    if (top_p < 1.0 && n_blocks > 2) {
        topp_item_t *items = malloc(n_blocks * sizeof(*items));
        if (!items)
            return MF_RESOURCE_EXHAUSTED;
        uint32_t n = 0;
        for (uint32_t j = 1; j < i; j++)
            if (!cand || cand[j])
                items[n++] = (topp_item_t){ mass[j], j };
        qsort(items, n, sizeof(*items), topp_cmp);
        double target = top_p * total;
        for (uint32_t x = 0; x < n && acc < target; x++) {
            keep[items[x].j] = 1;
            acc += items[x].mass;
            kept++;
        }
        free(items);
    }
    *n_kept = kept;
    return MF_OK;
}
