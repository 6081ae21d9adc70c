/* demo_model — synthetic source/target pair for the demo (see demo_model.h). */
#include "demo_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <stdio.h>

#include "mapflow.h"
#include "synth.h"

struct mf_channel *demo_connect(const char *daemon, const char *ns, const char *role)
{
    mf_channel_params_t cp = { .field_mask = MF_CHANNEL_PARAM_NS | MF_CHANNEL_PARAM_CLIENT_NAME |
                                             MF_CHANNEL_PARAM_WANT_ARENA,
                               .ns = ns, .client_name = role, .want_arena = 1 };
    mf_channel_t *ch = NULL;
    mf_status_t st = mf_channel_open(daemon, &cp, &ch);
    if (st == MF_OK)
        return ch;
    fprintf(stderr, "%s: cannot reach mapflowd at %s: %s (%s)\n", role, daemon,
            mf_status_name(st), ch ? mf_channel_last_error(ch) : "");
    mf_channel_close(ch);
    return NULL;
}

void demo_tokens(const demo_shape_t *s, uint32_t *tokens)
{
    mf_rng_t r;
    mf_rng_seed(&r, s->seed * 1000003u + 17u);
    for (uint32_t i = 0; i < s->n_tokens; i++)
        tokens[i] = (uint32_t)(mf_rng_u64(&r) % 32000u);
}

static uint64_t layer_seed(const demo_shape_t *s, uint32_t layer)
{
    return s->seed * 0x9e3779b97f4a7c15ull + layer * 7919u + 1u;
}

mf_status_t demo_source_qkv(const demo_shape_t *s, uint32_t layer, float *q, float *k, float *v)
{
    /* Deeper layers look further back, as real models' later layers do. */
    mf_synth_opts_t o = { .seed = layer_seed(s, layer), .n_tokens = s->n_tokens,
                          .n_q_heads = s->src_heads, .n_kv_heads = s->src_heads,
                          .head_dim = s->head_dim, .window = 48.0f * (float)(1u << (layer % 3)),
                          .sink = 4.0f, .noise = 1.0f };
    return mf_synth_qkv(&o, q, k, v);
}

void demo_target_pair(const demo_shape_t *s, uint32_t layer, uint32_t t, uint32_t *a, uint32_t *b)
{
    *a = (t * 3u + layer) % s->src_heads;
    /* Every other target head is a single source head; the rest average two. */
    *b = (t % 2u) ? (*a + 1u) % s->src_heads : *a;
}

/* Random orthogonal d×d matrix (Gram–Schmidt on Gaussian columns). */
static void orthogonal(mf_rng_t *r, uint32_t d, double *m)
{
    for (uint32_t i = 0; i < d * d; i++)
        m[i] = mf_rng_normal(r);
    for (uint32_t c = 0; c < d; c++) {
        for (uint32_t p = 0; p < c; p++) {
            double dot = 0;
            for (uint32_t i = 0; i < d; i++)
                dot += m[i * d + c] * m[i * d + p];
            for (uint32_t i = 0; i < d; i++)
                m[i * d + c] -= dot * m[i * d + p];
        }
        double nrm = 0;
        for (uint32_t i = 0; i < d; i++)
            nrm += m[i * d + c] * m[i * d + c];
        nrm = sqrt(nrm);
        for (uint32_t i = 0; i < d; i++)
            m[i * d + c] /= nrm;
    }
}

mf_status_t demo_target_qkv(const demo_shape_t *s, uint32_t layer, float *q, float *k, float *v)
{
    uint32_t n = s->n_tokens, hs = s->src_heads, ht = s->tgt_heads, d = s->head_dim, dt = 2 * d;
    size_t src_elems = (size_t)n * hs * d;
    /* The source's V is drawn too: synth's random stream depends on it, and the target must
     * see exactly the source's Q/K. */
    float *sq = malloc(sizeof(float) * src_elems), *sk = malloc(sizeof(float) * src_elems),
          *sv = malloc(sizeof(float) * src_elems);
    double *rot = malloc(sizeof(double) * dt * dt), *xq = malloc(sizeof(double) * dt),
           *xk = malloc(sizeof(double) * dt);
    mf_status_t st = MF_RESOURCE_EXHAUSTED;
    if (!sq || !sk || !sv || !rot || !xq || !xk)
        goto out_free;
    st = demo_source_qkv(s, layer, sq, sk, sv);
    if (st != MF_OK)
        goto out_free;
    mf_rng_t r;
    mf_rng_seed(&r, layer_seed(s, layer) ^ 0x5bd1e995u);
    /* Target logits = (L_a + L_b)/2 + its own content term: q_t = [q_a; q_b]/sqrt(2) + e_q,
     * k_t = [k_a; k_b] + e_k, with 1/sqrt(2d) as the target's softmax scale. */
    const double half = 1.0 / sqrt(2.0), own = 0.1;
    for (uint32_t t = 0; t < ht; t++) {
        uint32_t a, b;
        demo_target_pair(s, layer, t, &a, &b);
        orthogonal(&r, dt, rot);
        for (uint32_t i = 0; i < n; i++) {
            const float *qa = sq + ((size_t)i * hs + a) * d, *qb = sq + ((size_t)i * hs + b) * d;
            const float *ka = sk + ((size_t)i * hs + a) * d, *kb = sk + ((size_t)i * hs + b) * d;
            for (uint32_t c = 0; c < d; c++) {
                xq[c] = qa[c] * half;
                xq[d + c] = qb[c] * half;
                xk[c] = ka[c];
                xk[d + c] = kb[c];
            }
            for (uint32_t c = 0; c < dt; c++) {
                xq[c] += own * mf_rng_normal(&r);
                xk[c] += own * mf_rng_normal(&r);
            }
            float *oq = q + ((size_t)i * ht + t) * dt, *ok = k + ((size_t)i * ht + t) * dt;
            for (uint32_t row = 0; row < dt; row++) {
                double aq = 0, ak = 0;
                for (uint32_t c = 0; c < dt; c++) {
                    aq += rot[row * dt + c] * xq[c];
                    ak += rot[row * dt + c] * xk[c];
                }
                oq[row] = (float)aq;
                ok[row] = (float)ak;
            }
        }
    }
    for (size_t i = 0; i < (size_t)n * ht * dt; i++)
        v[i] = (float)mf_rng_normal(&r);
    st = MF_OK;
out_free:
    free(sq);
    free(sk);
    free(sv);
    free(rot);
    free(xq);
    free(xk);
    return st;
}
