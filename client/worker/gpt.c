/* gpt — see gpt.h. Layout follows PyTorch: a Linear weight is [out, in], y = x · Wᵀ. */
#include "gpt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

typedef struct layer {
    float *ln1_w, *ln1_b, *qkv, *proj, *ln2_w, *ln2_b, *fc, *out;
} layer_t;

struct mfw_gpt {
    mfw_gpt_cfg_t c;
    float *emb, *lnf_w, *lnf_b;
    layer_t *l;
    float *rope_inv;         /* [d / 2] inverse frequencies, as model.rope_tables */
};

struct mfw_run {
    const mfw_gpt_t *m;
    uint32_t len, max;
    float *k, *v;            /* [L][max][H][d] */
};

const mfw_gpt_cfg_t *mfw_gpt_cfg(const mfw_gpt_t *m)
{
    return &m->c;
}

void mfw_gpt_view(const mfw_gpt_t *m, mfw_gpt_view_t *v)
{
    *v = (mfw_gpt_view_t){ m->emb, m->lnf_w, m->lnf_b, m->rope_inv };
}

void mfw_gpt_layer_view(const mfw_gpt_t *m, uint32_t layer, mfw_gpt_layer_view_t *v)
{
    const layer_t *l = &m->l[layer];
    *v = (mfw_gpt_layer_view_t){ l->ln1_w, l->ln1_b, l->qkv, l->proj,
                                 l->ln2_w, l->ln2_b, l->fc, l->out };
}

void mfw_gpt_free(mfw_gpt_t *m)
{
    if (!m)
        return;
    for (uint32_t i = 0; m->l && i < m->c.n_layer; i++) {
        layer_t *l = &m->l[i];
        float *all[] = { l->ln1_w, l->ln1_b, l->qkv, l->proj, l->ln2_w, l->ln2_b, l->fc, l->out };
        for (size_t k = 0; k < sizeof all / sizeof *all; k++)
            free(all[k]);
    }
    free(m->l);
    free(m->emb);
    free(m->lnf_w);
    free(m->lnf_b);
    free(m->rope_inv);
    free(m);
}

static int meta_u32(const mfw_st_t *st, const char *key, uint32_t lo, uint32_t hi, uint32_t *out)
{
    const char *s = mfw_st_meta(st, key);
    char *end;
    unsigned long v = s ? strtoul(s, &end, 10) : 0;
    if (!s || *end || v < lo || v > hi)
        return 0;
    *out = (uint32_t)v;
    return 1;
}

mf_status_t mfw_gpt_load(const char *path, mfw_gpt_t **out, char *err, size_t errlen)
{
    *out = NULL;
    mfw_st_t *st = NULL;
    mf_status_t s = mfw_st_open(path, &st, err, errlen);
    if (s != MF_OK)
        return s;
    mfw_gpt_t *m = calloc(1, sizeof *m);
    if (!m) {
        s = MF_RESOURCE_EXHAUSTED;
        goto out_st;
    }
    mfw_gpt_cfg_t *c = &m->c;
    if (!meta_u32(st, "vocab", 2, 1u << 20, &c->vocab) ||
        !meta_u32(st, "n_layer", 1, 256, &c->n_layer) ||
        !meta_u32(st, "n_head", 1, 64, &c->n_head) ||
        !meta_u32(st, "d_model", 2, 8192, &c->d_model) ||
        !meta_u32(st, "ctx", 1, 1u << 20, &c->ctx) || c->d_model % c->n_head ||
        (c->d_model / c->n_head) % 2) {
        snprintf(err, errlen, "%s: __metadata__ needs vocab, n_layer (1..256), n_head (1..64), "
                 "d_model (a multiple of 2 * n_head, ≤ 8192) and ctx", path);
        s = MF_INVALID_ARGUMENT;
        goto out_model;
    }
    c->head_dim = c->d_model / c->n_head;
    uint64_t D = c->d_model, V = c->vocab;
    char name[64], why[200] = "";
    if (!(m->l = calloc(c->n_layer, sizeof(layer_t))) ||
        !(m->rope_inv = malloc(sizeof(float) * c->head_dim / 2))) {
        s = MF_RESOURCE_EXHAUSTED;
        goto out_model;
    }
#define LOAD(dst, nm, nd, ...)                                                       \
    do {                                                                           \
        uint64_t shp_[] = { __VA_ARGS__ };                                          \
        if (s == MF_OK)                                                             \
            s = mfw_st_tensor(st, nm, nd, shp_, &(dst), why, sizeof why);            \
    } while (0)
    s = MF_OK;
    LOAD(m->emb, "emb.weight", 2, V, D);
    LOAD(m->lnf_w, "lnf.weight", 1, D);
    LOAD(m->lnf_b, "lnf.bias", 1, D);
    for (uint32_t i = 0; i < c->n_layer && s == MF_OK; i++) {
        layer_t *l = &m->l[i];
        struct { float **dst; const char *nm; uint32_t nd; uint64_t a, b; } t[] = {
            { &l->ln1_w, "ln1.weight", 1, D, 0 }, { &l->ln1_b, "ln1.bias", 1, D, 0 },
            { &l->qkv, "qkv.weight", 2, 3 * D, D }, { &l->proj, "proj.weight", 2, D, D },
            { &l->ln2_w, "ln2.weight", 1, D, 0 }, { &l->ln2_b, "ln2.bias", 1, D, 0 },
            { &l->fc, "fc.weight", 2, 4 * D, D }, { &l->out, "out.weight", 2, D, 4 * D },
        };
        for (size_t k = 0; k < sizeof t / sizeof *t && s == MF_OK; k++) {
            snprintf(name, sizeof name, "blocks.%u.%s", i, t[k].nm);
            LOAD(*t[k].dst, name, t[k].nd, t[k].a, t[k].b);
        }
    }
#undef LOAD
    if (s != MF_OK) {
        snprintf(err, errlen, "%s: %s", path, why);
        goto out_model;
    }
    /* model.rope_tables: inv = 1 / base^(arange(0, d, 2) / d), in float32 */
    for (uint32_t i = 0; i < c->head_dim / 2; i++)
        m->rope_inv[i] = 1.0f / powf(10000.0f, (float)(2 * i) / (float)c->head_dim);
    *out = m;
    mfw_st_close(st);
    return MF_OK;
out_model:
    mfw_gpt_free(m);
out_st:
    mfw_st_close(st);
    return s;
}

mf_status_t mfw_run_create(const mfw_gpt_t *m, uint32_t max_tokens, mfw_run_t **out)
{
    *out = NULL;
    if (max_tokens == 0 || max_tokens > (1u << 20))
        return MF_INVALID_ARGUMENT;
    mfw_run_t *r = calloc(1, sizeof *r);
    size_t n = (size_t)m->c.n_layer * max_tokens * m->c.d_model;
    if (!r || !(r->k = malloc(sizeof(float) * n)) || !(r->v = malloc(sizeof(float) * n))) {
        mfw_run_free(r);
        return MF_RESOURCE_EXHAUSTED;
    }
    r->m = m;
    r->max = max_tokens;
    *out = r;
    return MF_OK;
}

void mfw_run_free(mfw_run_t *r)
{
    if (!r)
        return;
    free(r->k);
    free(r->v);
    free(r);
}

uint32_t mfw_run_len(const mfw_run_t *r)
{
    return r->len;
}

/* y[n, out] = x[n, in] · w[out, in]ᵀ; eight partial sums so the compiler can vectorise. */
static void matmul(float *y, const float *x, const float *w, uint32_t n, uint32_t in, uint32_t out)
{
    for (uint32_t t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * in;
        for (uint32_t o = 0; o < out; o++) {
            const float *wo = w + (size_t)o * in;
            float acc[8] = { 0 };
            uint32_t i = 0;
            for (; i + 8 <= in; i += 8)
                for (uint32_t j = 0; j < 8; j++)
                    acc[j] += xt[i + j] * wo[i + j];
            float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
            for (; i < in; i++)
                sum += xt[i] * wo[i];
            y[(size_t)t * out + o] = sum;
        }
    }
}

static void layernorm(float *y, const float *x, const float *w, const float *b, uint32_t n,
                      uint32_t d)
{
    for (uint32_t t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * d;
        double mean = 0, var = 0;
        for (uint32_t i = 0; i < d; i++)
            mean += xt[i];
        mean /= d;
        for (uint32_t i = 0; i < d; i++)
            var += (xt[i] - mean) * (xt[i] - mean);
        float inv = (float)(1.0 / sqrt(var / d + 1e-5));
        for (uint32_t i = 0; i < d; i++)
            y[(size_t)t * d + i] = ((float)(xt[i] - mean)) * inv * w[i] + b[i];
    }
}

/* model.rope: pairs (i, i + d/2) of every head rotated by angle pos · inv[i]. */
static void rope(const mfw_gpt_t *m, float *x, uint32_t pos)
{
    uint32_t h2 = m->c.head_dim / 2;
    for (uint32_t i = 0; i < h2; i++) {
        float ang = (float)pos * m->rope_inv[i], c = cosf(ang), s = sinf(ang);
        for (uint32_t h = 0; h < m->c.n_head; h++) {
            float *xh = x + (size_t)h * m->c.head_dim;
            float x1 = xh[i], x2 = xh[i + h2];
            xh[i] = x1 * c - x2 * s;
            xh[i + h2] = x1 * s + x2 * c;
        }
    }
}

mf_status_t mfw_attention(const mfw_attn_args_t *a)
{
    uint32_t H = a->n_heads, d = a->head_dim, total = a->pos0 + a->n;
    float *p = malloc(sizeof(float) * total);
    if (!p)
        return MF_RESOURCE_EXHAUSTED;
    float scale = 1.0f / sqrtf((float)d);
    for (uint32_t r = 0; r < a->n; r++) {
        uint32_t keys = a->pos0 + r + 1;
        for (uint32_t h = 0; h < H; h++) {
            const float *q = a->q + ((size_t)r * H + h) * d;
            float mx = -INFINITY;
            for (uint32_t j = 0; j < keys; j++) {
                const float *k = a->k + ((size_t)j * H + h) * d;
                float s = 0;
                for (uint32_t c = 0; c < d; c++)
                    s += q[c] * k[c];
                p[j] = s * scale;
                mx = p[j] > mx ? p[j] : mx;
            }
            double sum = 0;
            for (uint32_t j = 0; j < keys; j++)
                sum += p[j] = expf(p[j] - mx);
            float *o = a->o + ((size_t)r * H + h) * d;
            memset(o, 0, sizeof(float) * d);
            for (uint32_t j = 0; j < keys; j++) {
                const float *v = a->v + ((size_t)j * H + h) * d;
                float w = (float)(p[j] / sum);
                for (uint32_t c = 0; c < d; c++)
                    o[c] += w * v[c];
            }
        }
    }
    free(p);
    return MF_OK;
}

mf_status_t mfw_gpt_forward(const mfw_gpt_t *m, mfw_run_t *r, const uint32_t *tokens,
                            uint32_t n, mfw_attn_fn attn, void *ctx, uint32_t logits_from,
                            float *logits)
{
    const mfw_gpt_cfg_t *c = &m->c;
    uint32_t D = c->d_model, pos0 = r->len;
    if (n == 0 || n > r->max - r->len || logits_from > n)
        return MF_OUT_OF_RANGE;
    for (uint32_t t = 0; t < n; t++)
        if (tokens[t] >= c->vocab)
            return MF_INVALID_ARGUMENT;
    mf_status_t st = MF_RESOURCE_EXHAUSTED;
    float *x = malloc(sizeof(float) * n * D), *xn = malloc(sizeof(float) * n * D),
          *qkv = malloc(sizeof(float) * n * 3 * D), *q = malloc(sizeof(float) * n * D),
          *o = malloc(sizeof(float) * n * D), *h = malloc(sizeof(float) * n * 4 * D);
    if (!x || !xn || !qkv || !q || !o || !h)
        goto out;
    for (uint32_t t = 0; t < n; t++)
        memcpy(x + (size_t)t * D, m->emb + (size_t)tokens[t] * D, sizeof(float) * D);
    for (uint32_t l = 0; l < c->n_layer; l++) {
        const layer_t *ly = &m->l[l];
        float *kc = r->k + (size_t)l * r->max * D, *vc = r->v + (size_t)l * r->max * D;
        layernorm(xn, x, ly->ln1_w, ly->ln1_b, n, D);
        matmul(qkv, xn, ly->qkv, n, D, 3 * D);
        for (uint32_t t = 0; t < n; t++) {
            const float *row = qkv + (size_t)t * 3 * D;
            float *qt = q + (size_t)t * D, *kt = kc + (size_t)(pos0 + t) * D;
            memcpy(qt, row, sizeof(float) * D);
            memcpy(kt, row + D, sizeof(float) * D);
            memcpy(vc + (size_t)(pos0 + t) * D, row + 2 * D, sizeof(float) * D);
            rope(m, qt, pos0 + t);
            rope(m, kt, pos0 + t);
        }
        mfw_attn_args_t aa = { .layer = l, .pos0 = pos0, .n = n, .n_heads = c->n_head,
                               .head_dim = c->head_dim, .q = q, .k = kc, .v = vc, .o = o };
        if ((st = attn ? attn(ctx, &aa) : mfw_attention(&aa)) != MF_OK)
            goto out;
        matmul(xn, o, ly->proj, n, D, D);
        for (size_t i = 0; i < (size_t)n * D; i++)
            x[i] += xn[i];
        layernorm(xn, x, ly->ln2_w, ly->ln2_b, n, D);
        matmul(h, xn, ly->fc, n, D, 4 * D);
        for (size_t i = 0; i < (size_t)n * 4 * D; i++)
            h[i] = 0.5f * h[i] * (1.0f + erff(h[i] * (float)M_SQRT1_2));
        matmul(xn, h, ly->out, n, 4 * D, D);
        for (size_t i = 0; i < (size_t)n * D; i++)
            x[i] += xn[i];
    }
    r->len += n;
    if (logits) {
        uint32_t k = n - logits_from;
        layernorm(xn, x + (size_t)logits_from * D, m->lnf_w, m->lnf_b, k, D);
        matmul(logits, xn, m->emb, k, D, c->vocab);
    }
    st = MF_OK;
out:
    free(x);
    free(xn);
    free(qkv);
    free(q);
    free(o);
    free(h);
    return st;
}
