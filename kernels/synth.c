/* synth — structured random Q/K/V (see synth.h).
 *
 * Layout of a head's d dimensions: [0, 2F) position features (cos, sin of r·ω_f), then
 * one sink dimension, then content noise. q_r·k_k = A·Σ_f cos((r−k)·ω_f) + sink·[k = 0]
 * + noise, so after the 1/sqrt(d) scale the logits peak on the diagonal, decay over the
 * window and give token 0 a constant boost. */
#include "synth.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

void mf_rng_seed(mf_rng_t *r, uint64_t seed)
{
    r->s = seed ^ 0x6a09e667f3bcc909ull;
}

uint64_t mf_rng_u64(mf_rng_t *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double mf_rng_uniform(mf_rng_t *r)
{
    return (double)(mf_rng_u64(r) >> 11) * 0x1.0p-53;
}

double mf_rng_normal(mf_rng_t *r)
{
    double u1 = mf_rng_uniform(r), u2 = mf_rng_uniform(r);
    return sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2);
}

mf_status_t mf_synth_qkv(const mf_synth_opts_t *o, float *q, float *k, float *v)
{
    if (!o || !q || !k || o->n_tokens < 1 || o->n_q_heads < 1 || o->n_kv_heads < 1 ||
        o->n_q_heads % o->n_kv_heads || o->head_dim < 8)
        return MF_INVALID_ARGUMENT;
    uint32_t n = o->n_tokens, hq = o->n_q_heads, hkv = o->n_kv_heads, d = o->head_dim;
    uint32_t group = hq / hkv;
    uint32_t nf = d >= 32 ? 4 : (d - 2) / 4;   /* frequency pairs, leave room for content */
    uint32_t pos_dims = 2 * nf, sink_dim = pos_dims, content = d - pos_dims - 1;
    double window = o->window > 0 ? o->window : 64.0;
    double sink = o->sink > 0 ? o->sink : 4.0;
    double noise = o->noise > 0 ? o->noise : 1.0;
    double sq = sqrt(sqrt((double)d));        /* logits are divided by sqrt(d) */
    mf_rng_t rng;
    mf_rng_seed(&rng, o->seed);

    /* Per head: its own window (0.5..2× the nominal one) and peak logit (4..8). */
    double w_head[64], peak[64];
    for (uint32_t h = 0; h < hq && h < 64; h++) {
        w_head[h] = window * pow(2.0, 2.0 * mf_rng_uniform(&rng) - 1.0);
        peak[h] = 4.0 + 4.0 * mf_rng_uniform(&rng);
    }
    double cnoise = sqrt(noise) * sqrt(sqrt((double)d / (content ? content : 1)));
    for (uint32_t r = 0; r < n; r++) {
        for (uint32_t h = 0; h < hq; h++) {
            float *qv = q + ((size_t)r * hq + h) * d;
            double hh = h < 64 ? h : 63;
            double a = sqrt(peak[(size_t)hh] / nf) * sq;
            for (uint32_t f = 0; f < nf; f++) {
                double om = M_PI / (w_head[(size_t)hh] * pow(2.0, f));
                qv[2 * f] = (float)(a * cos(r * om));
                qv[2 * f + 1] = (float)(a * sin(r * om));
            }
            qv[sink_dim] = (float)(sqrt(sink) * sq);
            for (uint32_t x = sink_dim + 1; x < d; x++)
                qv[x] = (float)(cnoise * mf_rng_normal(&rng));
        }
        for (uint32_t g = 0; g < hkv; g++) {
            float *kv = k + ((size_t)r * hkv + g) * d;
            /* GQA: a KV head serves a group; it uses its first query head's geometry. */
            double hh = g * group < 64 ? g * group : 63;
            double a = sqrt(peak[(size_t)hh] / nf) * sq;
            for (uint32_t f = 0; f < nf; f++) {
                double om = M_PI / (w_head[(size_t)hh] * pow(2.0, f));
                kv[2 * f] = (float)(a * cos(r * om));
                kv[2 * f + 1] = (float)(a * sin(r * om));
            }
            kv[sink_dim] = r == 0 ? (float)(sqrt(sink) * sq) : 0.0f;
            for (uint32_t x = sink_dim + 1; x < d; x++)
                kv[x] = (float)(cnoise * mf_rng_normal(&rng));
            if (v)
                for (uint32_t x = 0; x < d; x++)
                    v[((size_t)r * hkv + g) * d + x] = (float)mf_rng_normal(&rng);
        }
    }
    return MF_OK;
}
