/* calibrate_out — output statistics of the OUTPUTS objective (see calibrate_out.h). */
#include "calibrate_out.h"

#include <stdlib.h>
#include <string.h>

#include "mapflow_kernels.h"
#include "ref_util.h"

void mf_calib_out_destroy(mf_calib_out_t *o)
{
    if (!o)
        return;
    free(o->gram);
    free(o->cross);
    free(o->norm);
    free(o->cnorm);
    free(o->count);
    free(o);
}

mf_status_t mf_calib_out_create(uint32_t ls, uint32_t hs, uint32_t lt, uint32_t ht,
                                uint32_t hkv, uint32_t d, mf_calib_out_t **out)
{
    if (!out || ls < 1 || lt < 1 || ls > 1024 || lt > 1024 || hs < 1 || ht < 1 ||
        hs > MF_ROW_MAX_HEADS || ht > MF_ROW_MAX_HEADS || hkv < 1 || ht % hkv ||
        d < 1 || d > MF_CALIB_MAX_HEAD_DIM)
        return MF_INVALID_ARGUMENT;
    uint64_t grams = (uint64_t)lt * ls * hkv * hs * hs;
    if (grams > MF_CALIB_MAX_OUT_STATS)
        return MF_INVALID_ARGUMENT;
    mf_calib_out_t *o = calloc(1, sizeof(*o));
    if (!o)
        return MF_RESOURCE_EXHAUSTED;
    *o = (mf_calib_out_t){ .ls = ls, .hs = hs, .lt = lt, .ht = ht, .hkv = hkv, .d = d };
    size_t pairs = (size_t)lt * ls;
    o->gram = calloc(grams, sizeof(double));
    o->cross = calloc(pairs * ht * hs, sizeof(double));
    o->norm = calloc(pairs * ht, sizeof(double));
    o->cnorm = calloc(pairs * ht, sizeof(double));
    o->count = calloc(pairs, sizeof(uint64_t));
    if (!o->gram || !o->cross || !o->norm || !o->cnorm || !o->count) {
        mf_calib_out_destroy(o);
        return MF_RESOURCE_EXHAUSTED;
    }
    *out = o;
    return MF_OK;
}

/* Σ_q ‖x[q] − mean_q x‖² of one head's output x [n, d]: raw − n·‖mean‖². */
static double centred_norm(const float *x, uint32_t n, uint32_t d, double raw)
{
    double mean[MF_CALIB_MAX_HEAD_DIM] = { 0 }, m2 = 0;
    for (uint32_t q = 0; q < n; q++)
        for (uint32_t j = 0; j < d; j++)
            mean[j] += x[(size_t)q * d + j];
    for (uint32_t j = 0; j < d; j++)
        m2 += mean[j] * mean[j];
    double c = raw - m2 / n;
    return c > 0 ? c : 0.0; /* rounding can leave a tiny negative */
}

mf_status_t mf_calib_out_add(mf_calib_out_t *o, uint32_t t, uint32_t l, const float *o_src,
                             const float *o_tgt, uint32_t n)
{
    if (!o || !o_src || !o_tgt || n < 1 || t >= o->lt || l >= o->ls)
        return MF_INVALID_ARGUMENT;
    uint32_t hs = o->hs, ht = o->ht, grp = o->ht / o->hkv;
    size_t nd = (size_t)n * o->d, pair = (size_t)t * o->ls + l;
    for (uint32_t g = 0; g < o->hkv; g++) {
        double *gm = o->gram + (pair * o->hkv + g) * hs * hs;
        const float *og = o_src + (size_t)g * hs * nd;
        for (uint32_t a = 0; a < hs; a++)
            for (uint32_t b = a; b < hs; b++) {
                double x = ref_dot(og + a * nd, og + b * nd, nd);
                gm[(size_t)a * hs + b] += x;
                if (b != a)
                    gm[(size_t)b * hs + a] += x;
            }
    }
    for (uint32_t h = 0; h < ht; h++) {
        const float *th = o_tgt + h * nd, *og = o_src + (size_t)(h / grp) * hs * nd;
        double raw = ref_dot(th, th, nd);
        o->norm[pair * ht + h] += raw;
        o->cnorm[pair * ht + h] += centred_norm(th, n, o->d, raw);
        for (uint32_t s = 0; s < hs; s++)
            o->cross[(pair * ht + h) * hs + s] += ref_dot(og + s * nd, th, nd);
    }
    o->count[pair]++;
    return MF_OK;
}

/* out [n, d] = m [n, n] · v [n, d] over the causal entries (k ≤ q). */
static void causal_matmul(const float *m, const float *v, uint32_t n, uint32_t d, float *out)
{
    double acc[MF_CALIB_MAX_HEAD_DIM];
    for (uint32_t q = 0; q < n; q++) {
        memset(acc, 0, d * sizeof(double));
        for (uint32_t k = 0; k <= q; k++) {
            double a = m[(size_t)q * n + k];
            const float *vk = v + (size_t)k * d;
            for (uint32_t j = 0; j < d; j++)
                acc[j] += a * vk[j];
        }
        for (uint32_t j = 0; j < d; j++)
            out[(size_t)q * d + j] = (float)acc[j];
    }
}

mf_status_t mf_calib_out_add_v(mf_calib_out_t *o, const float *src, const float *tgt,
                               const float *v, uint32_t n)
{
    if (!o || !src || !tgt || !v || n < 1)
        return MF_INVALID_ARGUMENT;
    size_t nn = (size_t)n * n, nd = (size_t)n * o->d;
    uint32_t hs = o->hs, ht = o->ht, hkv = o->hkv, grp = ht / hkv;
    float *os = malloc((size_t)hkv * hs * nd * sizeof(float));
    float *ot = malloc((size_t)ht * nd * sizeof(float));
    mf_status_t st = os && ot ? MF_OK : MF_RESOURCE_EXHAUSTED;
    for (uint32_t t = 0; t < o->lt && st == MF_OK; t++) {
        const float *vt = v + (size_t)t * hkv * nd;
        for (uint32_t h = 0; h < ht; h++)
            causal_matmul(tgt + ((size_t)t * ht + h) * nn, vt + (size_t)(h / grp) * nd, n,
                          o->d, ot + h * nd);
        for (uint32_t l = 0; l < o->ls && st == MF_OK; l++) {
            for (uint32_t g = 0; g < hkv; g++)
                for (uint32_t s = 0; s < hs; s++)
                    causal_matmul(src + ((size_t)l * hs + s) * nn, vt + g * nd, n, o->d,
                                  os + ((size_t)g * hs + s) * nd);
            st = mf_calib_out_add(o, t, l, os, ot, n);
        }
    }
    free(os);
    free(ot);
    return st;
}
